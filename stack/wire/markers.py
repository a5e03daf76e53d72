"""Where markers fall: the one FPDU geometry of MPA (RFC 5044 §4.2, §4.3, §4.5).

With markers on in a direction, a 4-byte marker ``RESERVED(16)=0 | FPDUPTR(16)`` sits at
every stream offset that is a multiple of 512 from SeqStart (MPA-07).  FPDUs start 4-aligned
relative to SeqStart and are 4-aligned in length, so a marker lands only right before an
FPDU (FPDUPTR 0; it belongs to that FPDU and is covered by its CRC), inside the ULPDU or PAD,
or between the PAD and the CRC.  :func:`fpdu_layout` says where, for an FPDU at any offset;
the framer and deframer of :mod:`stack.wire.framing` build their tables from it, and the
capture decoder and the Scapy marker helpers call it.
"""

from __future__ import annotations

import struct

from stack.buffers import Buffer
from stack.constants import (
    MPA_CRC_LEN,
    MPA_LENGTH_LEN,
    MPA_MARKER_INTERVAL,
    MPA_MARKER_LEN,
    MULPDU_MAX,
    MULPDU_MIN,
)
from stack.errors import LocalError

__all__ = [
    "MARKER_DATA",
    "fpdu_layout",
    "fpdu_wire_length",
    "lead_and_first",
    "mark_fpdu",
    "marker_count",
    "mulpdu_for",
    "stream_offset",
    "unmarked_body",
]

MARKER_DATA = MPA_MARKER_INTERVAL - MPA_MARKER_LEN
"""Data bytes between two markers: 508."""
_SEQ_MOD = 1 << 32
_U16 = struct.Struct(">H")
_MARKER = struct.Struct(">HH")
_MAX_LENGTH_FIELD = 0xFFFF


# Marker writes and checks never build per-marker objects.  The FPDUPTR of the k-th marker
# in an FPDU is first + 512k (``first``: distance from the length field, 4..508, a multiple of
# 4), so for every ``first`` the markers of the largest FPDU are precomputed once:
# ``MARKER_TABLES[first >> 2]`` holds them back to back (RESERVED 0, MPA-06).  Entry 0 (no
# FPDU has first == 0) is a leading marker (FPDUPTR 0) followed by the markers of an FPDU
# that starts right after it (first == 508).  The framer and the deframer of
# :mod:`stack.wire.framing` share them.
_MAX_MARKERS = 2 + ((MPA_LENGTH_LEN + _MAX_LENGTH_FIELD + 3) & ~3) // MARKER_DATA


def _marker_table(first: int) -> bytes:
    pointers = [first + MPA_MARKER_INTERVAL * k for k in range(_MAX_MARKERS)]
    if not first:
        pointers = [0] + [p + MARKER_DATA for p in pointers[:-1]]
    return b"".join(_MARKER.pack(0, p & 0xFFFF) for p in pointers)


MARKER_TABLES = tuple(
    _marker_table(first) for first in range(0, MPA_MARKER_INTERVAL, MPA_MARKER_LEN)
)
"""The markers of the largest FPDU, back to back, per ``first >> 2`` (see above)."""


# ======================================================================================
# FPDU geometry with markers (RFC 5044 §4.2, §4.3): the one definition
# ======================================================================================


def lead_and_first(phase: int) -> tuple[int, int]:
    """For an FPDU whose first byte is ``phase`` (mod 512, a multiple of 4) bytes after
    SeqStart: the leading marker's length (4 when the FPDU starts on a marker position,
    FPDUPTR 0, MPA-07) and the distance from the length field to the first inner marker."""
    lead = 0 if phase else MPA_MARKER_LEN
    return lead, MPA_MARKER_INTERVAL - (phase + lead)


def marker_count(first: int, body: int) -> int:
    """Markers inside an FPDU body (length field through PAD) of ``body`` bytes whose first
    inner marker would be ``first`` bytes after the length field; a marker exactly at the
    end sits between PAD and CRC and counts (it is covered by the CRC, MPA-12)."""
    return 0 if body < first else 1 + (body - first) // MARKER_DATA


def fpdu_layout(offset: int, ulpdu_length: int, markers: bool) -> tuple[int, int, tuple[int, ...]]:
    """Where an FPDU's parts fall when its first byte is ``offset`` bytes after SeqStart.

    Returns ``(lead, wire_len, marks)``: the position of ULPDU_Length relative to the FPDU's
    first byte (4 when a marker leads it, else 0), the bytes it occupies through the CRC,
    and the positions (relative to the FPDU's first byte) of every marker it holds, the
    leading one included (MPA-07).  A marker at position ``m`` carries FPDUPTR
    ``m - lead``, the leading one 0 (MPA-08).  The framer, the deframer, the capture
    decoder and the Scapy marker helpers all place markers by this geometry.
    """
    body = (MPA_LENGTH_LEN + ulpdu_length + 3) & ~3
    if not markers:
        return 0, body + MPA_CRC_LEN, ()
    lead, first = lead_and_first(offset % MPA_MARKER_INTERVAL)
    count = marker_count(first, body)
    inner = tuple(lead + first + MPA_MARKER_INTERVAL * k for k in range(count))
    marks = (0, *inner) if lead else inner
    return lead, lead + body + MPA_MARKER_LEN * count + MPA_CRC_LEN, marks


def unmarked_body(
    buf: Buffer, start: int, lead: int, end_body: int, marks: tuple[int, ...]
) -> bytes:
    """The FPDU body at ``buf[start:]`` (length field through PAD) with its markers cut out
    (MPA-10); ``lead`` and ``marks`` as :func:`fpdu_layout` gives them, ``end_body`` the
    position of the CRC field in ``buf``."""
    view = memoryview(buf)
    pieces = []
    pos = start + lead
    for m in marks:
        at = start + m
        if at < pos:  # the leading marker
            continue
        pieces.append(view[pos:at])
        pos = at + MPA_MARKER_LEN
    pieces.append(view[pos:end_body])
    return b"".join(pieces)


def mark_fpdu(fpdu: Buffer, offset: int) -> bytearray:
    """An unmarked FPDU (length field through CRC) with markers inserted as a sender puts
    them when its first byte is ``offset`` bytes after SeqStart (MPA-07, MPA-08).

    The CRC field is copied as it is: recompute it over the marked bytes (MPA-12) if it
    must be valid.  A cut-short FPDU gets the markers that fall before its last byte.
    """
    data = bytes(fpdu)
    ulpdu_length = _U16.unpack_from(data)[0] if len(data) >= MPA_LENGTH_LEN else 0
    lead, _wire, marks = fpdu_layout(offset, ulpdu_length, True)
    out = bytearray()
    pos = 0
    for m in marks:
        take = m - len(out)
        if pos + take >= len(data):
            break  # no byte follows this marker position
        out += data[pos : pos + take]
        pos += take
        out += _MARKER.pack(0, 0 if (m == 0 and lead) else m - lead)
    out += data[pos:]
    return out


def mulpdu_for(emss: int, markers: bool) -> int:
    """MULPDU for an EMSS (MPA-13, RFC 5044 §4.5), clamped to 128..64768.

    No markers: ``EMSS - (6 + EMSS mod 4)``; markers: also minus 4 per possible marker,
    ``4 * ceil(EMSS / 512)``.
    """
    if emss <= 0:
        raise LocalError(f"EMSS must be positive, got {emss}")
    overhead = MPA_LENGTH_LEN + MPA_CRC_LEN + emss % 4
    if markers:
        overhead += MPA_MARKER_LEN * -(-emss // MPA_MARKER_INTERVAL)
    return max(MULPDU_MIN, min(MULPDU_MAX, emss - overhead))


def stream_offset(seq: int, seq_start: int) -> int:
    """Offset of TCP sequence number ``seq`` from ``seq_start``, with wrap (MPA-08)."""
    return (seq - seq_start) % _SEQ_MOD


def fpdu_wire_length(ulpdu_length: int, offset: int = 0, markers: bool = False) -> int:
    """Bytes an FPDU with this ULPDU_Length occupies on the wire starting at ``offset``
    (after SeqStart), leading and inner markers included (:func:`fpdu_layout`)."""
    return fpdu_layout(offset, ulpdu_length, markers)[1]
