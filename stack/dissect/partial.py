"""What a snapshot-length-truncated frame still shows: the header fields it captured.

The decoder drops a PDU whose end was never captured (a TCP gap); :class:`SnapTracker`
remembers the frames the snapshot length cut (``TcpSegment.missing``) and, when the
gap note of such a frame comes, names the cause and decodes the header fields the
captured bytes hold: an MPA Request/Reply (RFC 5044 §7.1.1) or the start of an FPDU
(ULPDU_Length, RFC 5044 §4.1; DDP control and tagged/untagged header, RFC 5041 §4;
RDMAP control, RFC 5040 §4.1).  Bytes are read as the start of a PDU only when the
gap note says how many bytes of a partial PDU were dropped and this frame holds them
all; markers inside those bytes (RFC 5044 §4.3) are not removed.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from stack.constants import (
    DDP_DV_MASK,
    DDP_LAST,
    DDP_TAGGED,
    MPA_KEY_LEN,
    MPA_KEY_REP,
    MPA_KEY_REQ,
    RDMAP_OPCODE_MASK,
    RDMAP_RV_MASK,
)
from stack.dissect.fields import opcode_name

if TYPE_CHECKING:
    from stack.dissect.decoder import Note
    from stack.pcap import TcpSegment

__all__ = ["SnapTracker", "partial_fields"]

KEEP = 64
"""Captured payload bytes remembered per cut frame (more than any PDU header)."""
MAX_FRAMES = 4096
"""Cut frames remembered at once (the oldest are forgotten)."""
KEY_NAMES = {MPA_KEY_REQ[9:10]: "MPA Request", MPA_KEY_REP[9:10]: "MPA Reply"}
_DROPPED = re.compile(r"(\d+) buffered bytes of a partial PDU dropped")


def _u(data: bytes, at: int, size: int) -> int | None:
    return int.from_bytes(data[at : at + size], "big") if len(data) >= at + size else None


def partial_fields(data: bytes) -> str:
    """The header fields held by ``data``, the first captured bytes of a PDU."""
    key = data[:MPA_KEY_LEN]
    if len(key) >= 4 and (MPA_KEY_REQ.startswith(key) or MPA_KEY_REP.startswith(key)):
        shared = len(key) <= 9  # "MPA ID Re": both keys start so
        kind = "MPA Request or Reply" if shared else KEY_NAMES[key[9:10]]
        parts = [f"partial {kind}"]
        flags, rev, pd_len = _u(data, 16, 1), _u(data, 17, 1), _u(data, 18, 2)
        if flags is not None:
            parts.append(f"flags=0x{flags:02x}")
        if rev is not None:
            parts.append(f"rev={rev}")
        if pd_len is not None:
            parts.append(f"PD_Length={pd_len}")
        return " ".join(parts)
    parts = ["partial FPDU"]
    ulpdu_len = _u(data, 0, 2)
    if ulpdu_len is None:
        return "partial FPDU (no header field captured)"
    parts.append(f"ULPDU_Length={ulpdu_len}")
    ctrl, rdmap = _u(data, 2, 1), _u(data, 3, 1)
    if ctrl is None:
        return " ".join(parts)
    tagged = bool(ctrl & DDP_TAGGED)
    parts.append(
        f"DDP {'tagged' if tagged else 'untagged'} L={int(bool(ctrl & DDP_LAST))} "
        f"DV={ctrl & DDP_DV_MASK}"
    )
    if rdmap is not None:
        op = rdmap & RDMAP_OPCODE_MASK
        parts.append(f"RDMAP RV={(rdmap & RDMAP_RV_MASK) >> 6} {opcode_name(op)}")
    if tagged:
        stag, to = _u(data, 4, 4), _u(data, 8, 8)
        if stag is not None:
            parts.append(f"STag=0x{stag:08x}")
        if to is not None:
            parts.append(f"TO=0x{to:x}")
    else:
        for name, at in (("QN", 8), ("MSN", 12), ("MO", 16)):
            value = _u(data, at, 4)
            if value is None:
                break
            parts.append(f"{name}={value}")
    return " ".join(parts)


class SnapTracker:
    """Cut frames and the explanation of the gaps they cause."""

    def __init__(self) -> None:
        self.cut: dict[int, tuple[bytes, int, int]] = {}  # frame -> (tail, captured, missing)

    def add(self, seg: TcpSegment) -> None:
        """Remember a segment whose payload the snapshot length cut (``seg.missing``)."""
        payload = seg.payload
        if len(self.cut) >= MAX_FRAMES:
            del self.cut[next(iter(self.cut))]
        self.cut[seg.frame] = (bytes(payload[-KEEP:]), len(payload), seg.missing)

    def explain(self, note: Note) -> str | None:
        """Why the gap of ``note`` happened and what its frame still shows, or None."""
        if note.kind != "gap":
            return None
        entry = self.cut.get(note.frame)
        if entry is None:
            return None
        tail, captured, missing = entry
        text = (
            f"frame {note.frame} was cut by the capture's snapshot length "
            f"({captured} of {captured + missing} TCP payload bytes captured)"
        )
        m = _DROPPED.search(note.detail)
        if m is not None:
            lost = int(m.group(1))
            if lost <= min(captured, len(tail)):
                return f"{text}: {partial_fields(tail[len(tail) - lost :])}"
            return f"{text}; the partial PDU began in an earlier frame"
        return text
