"""FPDU streams and markers (RFC 5044 §4.2-4.4): split runs of FPDUs, insert and strip markers.

Markers belong to the TCP stream, not to an FPDU: they sit every 512 bytes from SeqStart
(MPA-07), so :func:`insert_markers` and :func:`strip_markers` take the position of the
data in the stream.  Marker placement is the wire core's geometry
(:func:`stack.wire.framing.mark_fpdu`, the framer's own), never a second copy; the CRC of
a marked FPDU covers its markers (MPA-12), which :func:`split_marked_fpdus` checks.
:class:`FpduSplitter` follows one direction across TCP segments: it keeps the partial FPDU
of a segment until the next completes it (MPA-16: an FPDU is whole before it goes up).
"""

from __future__ import annotations

import struct
from bisect import bisect_left, bisect_right
from collections.abc import Iterable
from dataclasses import dataclass

from scapy.packet import Packet

from stack.constants import (
    MPA_CRC_LEN,
    MPA_LENGTH_LEN,
    MPA_MARKER_INTERVAL,
    MPA_MARKER_LEN,
)
from stack.crc import crc32c
from stack.dissect.scapy.mpa import _BE16, _LE32, MPA_FPDU, MPA_FPDU_NoCRC, MPA_Marker, _pad_len
from stack.wire.framing import fpdu_layout, mark_fpdu, unmarked_body

__all__ = [
    "FpduSplitter",
    "MarkedFpdu",
    "insert_markers",
    "split_fpdus",
    "split_marked_fpdus",
    "strip_markers",
    "take_fpdu",
]

_MARKER = struct.Struct(">HH")


def _as_bytes(fpdus: bytes | bytearray | Packet | Iterable[bytes | Packet]) -> bytes:
    if isinstance(fpdus, bytes | bytearray):
        return bytes(fpdus)
    if isinstance(fpdus, Packet):
        return bytes(fpdus)
    return b"".join(bytes(f) for f in fpdus)


def _fpdu_spans(clean: bytes) -> list[tuple[int, int, int]]:
    """(start, crc_start, end) of each FPDU in a marker-free stream, by ULPDU_Length.

    The last span may be cut short; a tail shorter than the length field is skipped.
    """
    spans = []
    at = 0
    while len(clean) - at >= MPA_LENGTH_LEN:
        length = _BE16.unpack_from(clean, at)[0]
        crc_start = min(len(clean), at + MPA_LENGTH_LEN + length + _pad_len(length))
        end = min(len(clean), crc_start + MPA_CRC_LEN)
        spans.append((at, crc_start, end))
        at = end
    return spans


def split_fpdus(data: bytes, *, crc: bool = True) -> list[Packet]:
    """Dissect a marker-free run of back-to-back FPDUs (e.g. one TCP payload) into packets.

    A run that ends mid-FPDU gives a last FPDU with ``is_truncated()`` true (and its
    ``truncated`` field, summary and ``iwarp_error`` saying so); :class:`FpduSplitter`
    completes it from the next segment instead.
    """
    cls = MPA_FPDU if crc else MPA_FPDU_NoCRC
    return [cls(data[start:end]) for start, _, end in _fpdu_spans(data)]


def insert_markers(
    fpdus: bytes | bytearray | Packet | Iterable[bytes | Packet],
    seq_start_offset: int = 0,
    *,
    adjust_crc: bool = True,
) -> bytes:
    """Insert markers into back-to-back FPDUs, as a marked sender does (MPA-07/08).

    ``seq_start_offset`` is the TCP sequence number of the first FPDU byte minus SeqStart
    (mod 2^32); markers go where ``(seq_start_offset + position) % 512 == 0``, a marker
    just before an FPDU gets FPDUPTR 0, the others the distance back to their FPDU's
    ULPDU_Length (:func:`stack.wire.framing.mark_fpdu`, the framer's geometry).  With
    ``adjust_crc`` each CRC is recomputed to cover the markers (MPA-12) while keeping its
    error: a CRC that was wrong by some XOR stays wrong by it.  Pass ``adjust_crc=False``
    for CRC-off streams.
    """
    clean = _as_bytes(fpdus)
    out = bytearray()
    spans = _fpdu_spans(clean)
    for start, crc_start, end in spans:
        cov_start = len(out)
        out += mark_fpdu(clean[start:end], seq_start_offset + cov_start)
        if adjust_crc and end - crc_start == MPA_CRC_LEN:
            error = _LE32.unpack_from(clean, crc_start)[0] ^ crc32c(clean[start:crc_start])
            fixed = crc32c(bytes(out[cov_start:-MPA_CRC_LEN])) ^ error
            out[-MPA_CRC_LEN:] = _LE32.pack(fixed)
    tail = clean[spans[-1][2] if spans else 0 :]  # too short to hold a length field
    if tail and (seq_start_offset + len(out)) % MPA_MARKER_INTERVAL == 0:
        out += _MARKER.pack(0, 0)
    out += tail
    return bytes(out)


def strip_markers(data: bytes, seq_start_offset: int = 0) -> tuple[bytes, list[tuple[int, Packet]]]:
    """Remove the markers from a marked stream (MPA-10).

    ``seq_start_offset`` is ``data[0]``'s sequence number minus SeqStart (mod 2^32); every
    4 bytes at ``(seq_start_offset + position) % 512 == 0`` are removed.  Returns the clean
    bytes and ``(position in data, MPA_Marker)`` for each complete marker.
    """
    out = bytearray()
    markers: list[tuple[int, Packet]] = []
    i = 0
    pos = -seq_start_offset % MPA_MARKER_INTERVAL
    while pos < len(data):
        out.extend(data[i:pos])
        raw = data[pos : pos + MPA_MARKER_LEN]
        if len(raw) == MPA_MARKER_LEN:
            markers.append((pos, MPA_Marker(raw)))
        i = pos + MPA_MARKER_LEN
        pos += MPA_MARKER_INTERVAL
    out.extend(data[i:])
    return bytes(out), markers


@dataclass(frozen=True, slots=True)
class MarkedFpdu:
    """One FPDU from a marked stream.

    Fields: offset (position of its ULPDU_Length in the marked data), fpdu (the
    marker-free MPA_FPDU packet), markers (``(position, MPA_Marker)`` it owns, including
    an FPDUPTR-0 marker just before it), crc_ok (verdict over the covered bytes with
    markers, RFC 5044 §4.4; None when CRC is off).
    """

    offset: int
    fpdu: Packet
    markers: tuple[tuple[int, Packet], ...]
    crc_ok: bool | None


def split_marked_fpdus(
    data: bytes, seq_start_offset: int = 0, *, crc: bool = True
) -> list[MarkedFpdu]:
    """Strip markers, split the FPDUs and check each CRC over its marked bytes (MPA-12)."""
    clean, markers = strip_markers(data, seq_start_offset)
    # A marker removed before clean position q[j] shifts every later byte by 4.
    cleanpos = [pos - MPA_MARKER_LEN * j for j, (pos, _) in enumerate(markers)]

    def marked(c: int) -> int:
        return c + MPA_MARKER_LEN * bisect_right(cleanpos, c)

    cls = MPA_FPDU if crc else MPA_FPDU_NoCRC
    result = []
    for start, crc_start, end in _fpdu_spans(clean):
        fpdu = cls(clean[start:end])
        lo, hi = bisect_left(cleanpos, start), bisect_left(cleanpos, end)
        owned = tuple(markers[lo:hi])
        leading = lo < hi and cleanpos[lo] == start
        cov_start = marked(start) - (MPA_MARKER_LEN if leading else 0)
        verdict: bool | None = None
        if crc:
            covered = data[cov_start : marked(crc_start)]
            verdict = (
                end - crc_start == MPA_CRC_LEN
                and crc32c(covered) == _LE32.unpack(clean[crc_start:end])[0]
            )
        result.append(MarkedFpdu(marked(start), fpdu, owned, verdict))
    return result


# ======================================================================================
# One direction across segments (RFC 5044 §4.1, §4.3; MPA-07, MPA-16)
# ======================================================================================


def take_fpdu(
    data: bytes | bytearray | memoryview,
    offset: int = 0,
    *,
    crc: bool = True,
    markers: bool = False,
) -> tuple[Packet, int] | None:
    """The whole FPDU at the start of ``data`` and the wire bytes it took, or None.

    ``offset`` is ``data[0]``'s position after SeqStart (markers only, MPA-07); the
    geometry is :func:`stack.wire.framing.fpdu_layout`.  A marked FPDU comes back
    marker-free, remembering its markers and the CRC input as sent
    (:meth:`~stack.dissect.scapy.mpa.MPA_FPDU.set_wire`), so ``crc_ok()`` judges the
    wire CRC (MPA-12).  None while the FPDU is not complete.
    """
    lead = fpdu_layout(offset, 0, markers)[0]
    if len(data) < lead + MPA_LENGTH_LEN:
        return None
    length = _BE16.unpack_from(data, lead)[0]
    lead, wire_len, marks = fpdu_layout(offset, length, markers)
    if len(data) < wire_len:
        return None
    cls = MPA_FPDU if crc else MPA_FPDU_NoCRC
    wire = bytes(data[:wire_len])
    if not marks:
        return cls(wire), wire_len
    crc_at = wire_len - MPA_CRC_LEN
    body = unmarked_body(wire, 0, lead, crc_at, marks)
    pkt = cls(body + wire[crc_at:])
    held = tuple((m, MPA_Marker(wire[m : m + MPA_MARKER_LEN])) for m in marks)
    pkt.set_wire(wire[:crc_at], held)
    return pkt, wire_len


class FpduSplitter:
    """Whole FPDUs from one direction's Full Operation bytes, fed segment by segment.

    ``FpduSplitter(crc=..., markers=..., offset=...)``: the negotiated CRC and markers of
    the direction and the stream position of the first byte fed, counted from SeqStart
    (markers only, MPA-07).  :meth:`feed` returns the FPDUs a segment completes and keeps
    the partial one (:attr:`pending` bytes) for the next; :meth:`flush` gives that partial
    one as a truncated FPDU (end of capture).  ``offset`` is the position of the next
    byte not yet returned.
    """

    def __init__(self, *, crc: bool = True, markers: bool = False, offset: int = 0) -> None:
        self.crc = crc
        self.markers = markers
        self.offset = offset
        self._buf = bytearray()

    @property
    def pending(self) -> int:
        """Bytes held: the start of an FPDU not yet complete."""
        return len(self._buf)

    def feed(self, data: bytes | bytearray | memoryview | Packet) -> list[Packet]:
        """Add the next bytes of the direction; return the FPDUs they complete."""
        self._buf += bytes(data)
        out = []
        at = 0
        view = memoryview(self._buf)
        try:
            while True:
                got = take_fpdu(view[at:], self.offset, crc=self.crc, markers=self.markers)
                if got is None:
                    break
                pkt, used = got
                out.append(pkt)
                at += used
                self.offset += used
        finally:
            view.release()
        del self._buf[:at]
        return out

    def flush(self) -> list[Packet]:
        """The partial FPDU still held, as a truncated FPDU (``is_truncated()``); empty
        when nothing is held.  Markers in it are cut out as far as they go."""
        if not self._buf:
            return []
        data = bytes(self._buf)
        self._buf.clear()
        lead = fpdu_layout(self.offset, 0, self.markers)[0]
        length = _BE16.unpack_from(data, lead)[0] if len(data) >= lead + MPA_LENGTH_LEN else 0
        lead, _, marks = fpdu_layout(self.offset, length, self.markers)
        held = tuple(m for m in marks if m + MPA_MARKER_LEN <= len(data))
        body = unmarked_body(data, 0, lead, len(data), held) if marks else data
        cls = MPA_FPDU if self.crc else MPA_FPDU_NoCRC
        pkt = cls(body)
        if held:
            pkt.set_wire(data, tuple((m, MPA_Marker(data[m : m + MPA_MARKER_LEN])) for m in held))
        self.offset += len(data)
        return [pkt]
