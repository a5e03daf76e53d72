"""FPDU framing of MPA Full Operation (RFC 5044 §4-§6): length, pad, CRC32c and markers.

Theory of operation
-------------------
An FPDU on the wire is ``ULPDU_Length(2) | ULPDU | PAD(0..3) | CRC(4)`` (MPA-01, MPA-04,
MPA-05).  When the receiver of a direction asked for markers, a 4-byte marker
``RESERVED(16)=0 | FPDUPTR(16)`` is inserted at every stream offset that is a multiple of
512 from *SeqStart* (the first byte of Full Operation in that direction, MPA-07).  Both
classes here count that offset themselves (``offset``), so positions never depend on TCP
sequence numbers; :func:`stream_offset` converts a sequence number (mod 2^32, MPA-08) for
callers that have one, such as the dissector.

Because FPDUs start 4-aligned relative to SeqStart and are 4-aligned in length, a marker
lands only (a) right before an FPDU (FPDUPTR 0; it belongs to that FPDU and is covered by
its CRC), (b) inside the ULPDU/PAD, or (c) between the PAD and the CRC.  With ``r`` the
offset of the length field modulo 512, the first marker inside an FPDU sits ``512 - r``
bytes after the length field and the following ones every 508 data bytes.  That closed
form (:func:`fpdu_layout`, the one geometry every marker user shares) lets both directions
compute an FPDU's wire length up front, so the receiver waits for whole FPDUs and never
re-parses partial input.

Copies.  :meth:`FpduFramer.frame` copies the payload once (``bytes.join``) and runs
CRC32c over it once; :meth:`FpduFramer.frame_parts_split` does not copy it at all (the
length field + header and the PAD + CRC around the caller's view, for a scatter-gather
send).  With markers no Python object is made per marker or per 508-byte
piece: the body is copied into a per-framer staging buffer placed so that marker positions
fall on fixed offsets, and one ``join`` over fixed memoryviews of it (a marker as the
separator) lays out the FPDU; one strided slice assignment from a precomputed table then
completes the FPDUPTRs.  :class:`FpduDeframer` keeps immutable ``bytes`` chunks, or
borrows the caller's buffer (``feed(view, borrow=True)``, the driver's ``recv_into``
buffer) until :meth:`~FpduDeframer.settle` copies the unread rest once, and hands out
``memoryview`` slices; without markers a ULPDU inside one chunk is not copied at all, and
only an FPDU that straddles chunks is joined (input is never re-copied per FPDU, wsproto's
``Buffer`` idea).  With markers the FPDU is checked where it lies too: the CRC over the
view; an FPDU with a marker inside is copied once into a word array, whose marker words
(one every 128, 4-aligned) one strided slice reads for a comparison with a precomputed
table in one go and one strided ``del`` removes (a C loop of memmoves, no object per run);
an FPDU with no marker inside is not copied.
"""

from __future__ import annotations

import struct
from array import array
from collections import deque
from collections.abc import Iterator
from typing import Literal

from stack.constants import (
    MPA_CRC_LEN,
    MPA_CRC_RESIDUE,
    MPA_FPDUPTR_MASK,
    MPA_LENGTH_LEN,
    MPA_MARKER_INTERVAL,
    MPA_MARKER_LEN,
    MULPDU_MAX,
    TERM_LLP_CRC_ERROR,
    TERM_LLP_MARKER_MISMATCH,
)
from stack.crc import crc32c
from stack.errors import LocalError, MpaError
from stack.wire.markers import (
    MARKER_DATA,
    fpdu_layout,
    fpdu_wire_length,
    lead_and_first,
    mark_fpdu,
    marker_count,
    mulpdu_for,
    stream_offset,
    unmarked_body,
)

Buffer = bytes | bytearray | memoryview

__all__ = [
    "FpduDeframer",
    "FpduFramer",
    "RX_ULPDU_SLACK",
    "fpdu_layout",
    "fpdu_wire_length",
    "mark_fpdu",
    "mulpdu_for",
    "stream_offset",
    "unmarked_body",
]

RX_ULPDU_SLACK = 512
"""Receive tolerance above MULPDU_MAX for peers that size FPDUs past the DDP limit."""

_U16 = struct.Struct(">H")
_LE32 = struct.Struct("<I")
_ZERO_MARKER = bytes(MPA_MARKER_LEN)
_PADS = (b"", b"\0", b"\0\0", b"\0\0\0")
_MAX_LENGTH_FIELD = 0xFFFF

# Marker writes and checks never build per-marker objects.  The FPDUPTR of the k-th marker
# in an FPDU is first + 512k (``first``: distance from the length field, 4..508, a multiple of
# 4), so for every ``first`` the markers of the largest FPDU are precomputed once:
# ``_MARKERS[first >> 2]`` holds them back to back (RESERVED 0, MPA-06).  Entry 0 (no FPDU
# has first == 0) is a leading marker (FPDUPTR 0) followed by the markers of an FPDU that
# starts right after it (first == 508).
_MAX_MARKERS = 2 + ((MPA_LENGTH_LEN + _MAX_LENGTH_FIELD + 3) & ~3) // MARKER_DATA


def _marker_table(first: int) -> bytes:
    pointers = [first + MPA_MARKER_INTERVAL * k for k in range(_MAX_MARKERS)]
    if not first:
        pointers = [0] + [p + MARKER_DATA for p in pointers[:-1]]
    return b"".join(struct.pack(">HH", 0, p & 0xFFFF) for p in pointers)


_MARKERS = tuple(_marker_table(first) for first in range(0, MPA_MARKER_INTERVAL, MPA_MARKER_LEN))
# For framing: the FPDUPTR low byte is that of ``first`` for all markers of an FPDU, so the
# markers ``join`` puts between the pieces carry it already (_SEPARATORS), and only the
# high bytes are written afterwards (_PTR_HIGH; bytearray: no conversion when assigned).
_SEPARATORS = tuple(bytearray(3) + table[3:4] for table in _MARKERS)
_PTR_HIGH = tuple(bytearray(table[2::MPA_MARKER_LEN]) for table in _MARKERS)
_FPDUPTR_LOW_MASK = MPA_FPDUPTR_MASK & 0xFF
_PAD_AND_CRC = struct.Struct(f"{3 + MPA_CRC_LEN + 1}x")  # zeroes PAD, CRC slot and slack


_MARKER = struct.Struct(">HH")
# Receive geometry per stream offset mod 512 (index ``offset % 512 >> 2``): leading marker
# length, distance from the length field to the first inner marker, and the _MARKERS entry
# (0 when there is a leading marker).
_RX_GEOMETRY = tuple(
    (lead, first, first >> 2 if lead == 0 else 0)
    for lead, first in map(lead_and_first, range(0, MPA_MARKER_INTERVAL, MPA_MARKER_LEN))
)
_STAGE_SLACK = MPA_MARKER_INTERVAL + _PAD_AND_CRC.size  # stage bytes beyond a ULPDU
_TxGeometry = tuple[int, int, memoryview, bytearray, int, bytearray]  # FpduFramer._grow_stage
_WORD: Literal["I", "L"] = "I" if array("I").itemsize == MPA_MARKER_LEN else "L"
_WORDS_PER_INTERVAL = MPA_MARKER_INTERVAL // MPA_MARKER_LEN


class FpduFramer:
    """Transmit side: frames one ULPDU per FPDU (MPA-01), with CRC and markers as negotiated.

    Fields: ``crc`` (compute the CRC; otherwise the field is sent as 0, as siw does,
    MPA-05), ``markers`` (insert markers, MPA-07/09), ``offset`` (stream bytes sent since
    SeqStart; advanced by every FPDU), ``max_ulpdu`` (largest ULPDU accepted, MPA-02).
    """

    __slots__ = (
        "crc",
        "markers",
        "offset",
        "max_ulpdu",
        "_stage",
        "_stage_view",
        "_stage_runs",
        "_stage_pieces",
        "_geometry",
    )

    def __init__(
        self,
        *,
        crc: bool = True,
        markers: bool = False,
        offset: int = 0,
        max_ulpdu: int = MULPDU_MAX,
    ) -> None:
        if offset < 0 or offset % 4:
            raise LocalError(f"stream offset must be a non-negative multiple of 4: {offset}")
        self.crc = crc
        self.markers = markers
        self.offset = offset
        self.max_ulpdu = min(max_ulpdu, _MAX_LENGTH_FIELD)
        # Marker framing only: the staging buffer and its fixed 508-byte runs (_grow_stage).
        self._stage = bytearray()
        self._stage_view = memoryview(self._stage)
        self._stage_runs: tuple[memoryview, ...] = ()
        self._stage_pieces: dict[int, list[memoryview]] = {}  # join input per marker count
        self._geometry: tuple[_TxGeometry, ...] = ()

    def frame(self, ulpdu: Buffer) -> bytes | bytearray:
        """Return the wire bytes of one FPDU carrying ``ulpdu`` and advance ``offset``."""
        n = len(ulpdu)
        if n > self.max_ulpdu:
            raise LocalError(f"ULPDU of {n} bytes exceeds the maximum {self.max_ulpdu} (MPA-02)")
        if self.markers:
            return self._frame_markers(ulpdu, n)
        header = _U16.pack(n)
        pad = _PADS[-(MPA_LENGTH_LEN + n) & 3]
        if self.crc:
            c = crc32c(ulpdu, crc32c(header))
            trailer = pad + _LE32.pack(crc32c(pad, c) if pad else c)
        else:
            trailer = pad + _ZERO_MARKER
        out = b"".join((header, ulpdu, trailer))
        self.offset += len(out)
        return out

    def frame_into(self, out: bytearray, ulpdu: Buffer) -> int:
        """Append the FPDU for ``ulpdu`` to ``out``; return the number of bytes appended."""
        n = len(ulpdu)
        if self.markers or n > self.max_ulpdu:
            fpdu = self.frame(ulpdu)
            out += fpdu
            return len(fpdu)
        header = _U16.pack(n)
        pad = _PADS[-(MPA_LENGTH_LEN + n) & 3]
        if self.crc:
            c = crc32c(ulpdu, crc32c(header))
            trailer = pad + _LE32.pack(crc32c(pad, c) if pad else c)
        else:
            trailer = pad + _ZERO_MARKER
        out += header
        out += ulpdu
        out += trailer
        size = MPA_LENGTH_LEN + n + len(trailer)
        self.offset += size
        return size

    def frame_parts_into(self, out: bytearray, header: Buffer, payload: Buffer) -> int:
        """Append the FPDU of the ULPDU ``header + payload`` to ``out`` (one copy of each).

        The CRC is chained over the length field, header, payload and pad, so the ULPDU is
        never joined first.  With markers the pieces are joined and framed as usual.
        """
        n = len(header) + len(payload)
        if n > self.max_ulpdu:
            raise LocalError(f"ULPDU of {n} bytes exceeds the maximum {self.max_ulpdu} (MPA-02)")
        if self.markers:
            fpdu = self._frame_markers(header, n, payload)
            out += fpdu
            return len(fpdu)
        lead = _U16.pack(n) + header  # the length field and the DDP header, joined once
        pad = _PADS[-(MPA_LENGTH_LEN + n) & 3]
        if self.crc:
            c = crc32c(payload, crc32c(lead))
            trailer = pad + _LE32.pack(crc32c(pad, c) if pad else c)
        else:
            trailer = pad + _ZERO_MARKER
        out += lead
        out += payload
        out += trailer
        size = MPA_LENGTH_LEN + n + len(trailer)
        self.offset += size
        return size

    def frame_parts_split(
        self, header: Buffer, payload: Buffer
    ) -> tuple[bytes | bytearray, Buffer, bytes | bytearray]:
        """The FPDU of the ULPDU ``header + payload`` as (prefix, body, suffix) for a
        scatter-gather send (MPA-01): without markers ``payload`` itself is the body (not
        copied; the caller sends it before the memory changes) between the length field +
        header and the PAD + CRC; with markers the whole FPDU is the body.  Advances
        ``offset`` like :meth:`frame_parts_into`, whose bytes the three pieces join to.
        """
        n = len(header) + len(payload)
        if n > self.max_ulpdu:
            raise LocalError(f"ULPDU of {n} bytes exceeds the maximum {self.max_ulpdu} (MPA-02)")
        if self.markers:
            fpdu = self._frame_markers(header, n, payload)
            return b"", fpdu, b""
        length = _U16.pack(n)
        pad = _PADS[-(MPA_LENGTH_LEN + n) & 3]
        if self.crc:
            c = crc32c(payload, crc32c(header, crc32c(length)))
            trailer = pad + _LE32.pack(crc32c(pad, c) if pad else c)
        else:
            trailer = pad + _ZERO_MARKER
        self.offset += MPA_LENGTH_LEN + n + len(trailer)
        return length + header, payload, trailer

    def _frame_markers(self, ulpdu: Buffer, n: int, payload: Buffer = b"") -> bytearray:
        """Frame with markers (MPA-07): leading marker, inner markers, marker before CRC.

        The body (length, ULPDU, PAD) and a zero CRC slot are copied into the staging buffer
        at the length field's stream offset mod 512 (4 if that is a marker position), so the
        FPDU's marker positions fall on ``4 + 508k`` there whatever the offset.  The runs
        between them are fixed memoryviews made once per framer, and one ``join`` lays out
        the whole FPDU with no per-marker Python objects (``payload``, when given, follows
        ``ulpdu`` in the ULPDU: parts are staged without being joined first); its separator
        is a marker with RESERVED 0 (MPA-06) and the FPDUPTR low byte, which is the same for
        all markers of the FPDU, and one strided slice assignment writes the high bytes
        (MPA-08).  Then the CRC over it all.  ``stage[0:4]`` is never written: it is the
        leading marker (FPDUPTR 0) when there is one.
        """
        stage = self._stage
        if len(stage) < n + _STAGE_SLACK:
            stage = self._grow_stage(n + _STAGE_SLACK)
        at, start, head, separator, high_at, high = self._geometry[
            (self.offset % MPA_MARKER_INTERVAL) >> 2
        ]
        end = at + MPA_LENGTH_LEN + n
        body_end = (end + 3) & ~3  # ``at`` is a multiple of 4, so this adds the PAD
        view = self._stage_view
        _U16.pack_into(stage, at, n)
        split = end - len(payload)
        for lo, hi, piece in ((at + MPA_LENGTH_LEN, split, ulpdu), (split, end, payload)):
            try:
                view[lo:hi] = piece  # one copy (bytearray slicing makes two)
            except (TypeError, ValueError):  # a buffer of another format
                stage[lo:hi] = piece
        _PAD_AND_CRC.pack_into(stage, end)  # zero PAD and CRC slot (and up to 4 bytes more)
        # A marker position at body_end sits between PAD and CRC and is covered by the CRC.
        count = (body_end - MPA_MARKER_LEN) // MARKER_DATA
        if count:
            pieces = self._stage_pieces.get(count)
            if pieces is None:
                pieces = self._stage_pieces[count] = [head, *self._stage_runs[: count - 1], head]
            pieces[0] = head
            pieces[-1] = view[MPA_MARKER_LEN + MARKER_DATA * count : body_end + MPA_CRC_LEN]
            out = separator.join(pieces)
            # Exactly ``count`` marker positions lie in out[high_at - 2:], as fewer than 512
            # bytes follow the last one.
            out[high_at::MPA_MARKER_INTERVAL] = high[:count]
        else:
            out = stage[start : body_end + MPA_CRC_LEN]
        if self.crc:
            _LE32.pack_into(out, len(out) - MPA_CRC_LEN, crc32c(memoryview(out)[:-MPA_CRC_LEN]))
        self.offset += len(out)
        return out

    def _grow_stage(self, size: int) -> bytearray:
        """(Re)allocate the staging buffer and its fixed views.

        Size: ``size``, or twice the old size up to what ``max_ulpdu`` needs, so it grows
        with the FPDUs actually framed.  Views: the 508-byte runs between marker positions,
        and per stream offset mod 512 (index ``offset % 512 >> 2``) the FPDU geometry:
        where the length field goes in the stage, where the FPDU starts there, the first
        ``join`` piece (up to the first marker position), the ``join`` separator, and the
        offset in the FPDU of the first marker's FPDUPTR high byte with the table of high
        bytes.
        """
        size = max(size, min(2 * len(self._stage), self.max_ulpdu + _STAGE_SLACK))
        self._stage_pieces.clear()
        stage = self._stage = bytearray(size)
        view = self._stage_view = memoryview(stage)
        self._stage_runs = tuple(
            view[k : k + MARKER_DATA]
            for k in range(MPA_MARKER_INTERVAL, size - MARKER_DATA + 1, MARKER_DATA)
        )
        geometry = []
        for r in range(0, MPA_MARKER_INTERVAL, MPA_MARKER_LEN):
            lead, first = lead_and_first(r)  # first: length field -> first inner marker
            at = r + lead
            start = r  # with a leading marker: stage[0:4], always zero
            mark = at - start + first  # first inner marker in the FPDU
            index = first >> 2
            geometry.append(
                (
                    at,
                    start,
                    view[start:MPA_MARKER_INTERVAL],
                    _SEPARATORS[index],
                    mark + 2,
                    _PTR_HIGH[index],
                )
            )
        self._geometry = tuple(geometry)
        return stage


class FpduDeframer:
    """Receive side: turns stream bytes into validated ULPDUs (MPA-10, MPA-15, MPA-16).

    Feed bytes with :meth:`feed` (any chunking), take ULPDUs with :meth:`next_ulpdu` or by
    iterating.  Checks the CRC when ``crc`` (MPA-12 -> Terminate 2/0/2), every marker's
    FPDUPTR when ``markers`` (MPA-08 -> 2/0/3, after the CRC so a corrupt FPDU reports the
    CRC), and ``ULPDU_Length <= max_ulpdu``.  After an error nothing more is delivered
    (MPA-28): every later call raises the same error.

    Borrowed input (``feed(view, borrow=True)``) is parsed in place, not copied: the
    caller keeps it unchanged until it calls :meth:`settle`, which copies what is left
    unread (a partial FPDU at the end, MPA-16) once, so the caller may reuse its buffer.

    Fields: ``offset`` (stream offset since SeqStart of the next unread byte),
    ``fpdu_offset`` / ``fpdu_wire_length`` (where the last delivered FPDU sat on the wire,
    markers included), ``error`` (the sticky :class:`MpaError` or None).
    """

    __slots__ = (
        "crc",
        "markers",
        "max_ulpdu",
        "offset",
        "fpdu_offset",
        "fpdu_wire_length",
        "error",
        "_buf",
        "_view",
        "_pos",
        "_more",
        "_more_len",
        "_more_pos",
        "_borrowed",
    )

    def __init__(
        self,
        *,
        crc: bool = True,
        markers: bool = False,
        offset: int = 0,
        max_ulpdu: int = MULPDU_MAX + RX_ULPDU_SLACK,
    ) -> None:
        if offset < 0 or offset % 4:
            raise LocalError(f"stream offset must be a non-negative multiple of 4: {offset}")
        self.crc = crc
        self.markers = markers
        self.max_ulpdu = max_ulpdu
        self.offset = offset
        self.fpdu_offset = offset
        self.fpdu_wire_length = 0
        self.error: MpaError | None = None
        self._buf: Buffer = b""  # the current chunk: bytes, or a borrowed memoryview
        self._view = memoryview(self._buf)
        self._pos = 0
        self._more: deque[Buffer] = deque()
        self._more_len = 0  # unread bytes in _more
        self._more_pos = 0  # bytes of _more[0] already consumed
        self._borrowed = False  # some chunk is a caller's buffer (until settle())

    @property
    def pending(self) -> int:
        """Bytes received but not yet delivered (a partial FPDU, or unread whole ones)."""
        return len(self._buf) - self._pos + self._more_len

    def feed(self, data: Buffer, *, borrow: bool = False) -> None:
        """Add received stream bytes: copied once unless they are ``bytes``, or ``borrow``
        (then parsed in place until :meth:`settle`)."""
        if not data:
            return
        if borrow:
            view = data if isinstance(data, memoryview) else memoryview(data)
            chunk: Buffer = view if view.format == "B" and view.ndim == 1 else view.cast("B")
            self._borrowed = True
        else:
            chunk = data if type(data) is bytes else bytes(data)
        self._more.append(chunk)
        self._more_len += len(chunk)

    def settle(self) -> None:
        """Stop borrowing: copy the unread part of borrowed input (once) into own memory.

        ULPDUs handed out before stay views of the caller's buffer.
        """
        if not self._borrowed:
            return
        self._borrowed = False
        if type(self._buf) is memoryview:
            self._buf = self._view[self._pos :].tobytes()
            self._view = memoryview(self._buf)
            self._pos = 0
        more = self._more
        if more and any(type(chunk) is memoryview for chunk in more):
            start = self._more_pos
            self._more = deque(
                chunk[start if k == 0 else 0 :].tobytes() if type(chunk) is memoryview else chunk
                for k, chunk in enumerate(more)
            )
            if type(more[0]) is memoryview:
                self._more_pos = 0

    def __iter__(self) -> Iterator[memoryview]:
        next_ulpdu = self.next_ulpdu
        while (ulpdu := next_ulpdu()) is not None:
            yield ulpdu

    def _ensure(self, n: int) -> bool:
        """Make ``_buf[_pos:]`` hold at least ``n`` bytes, if that many have arrived.

        Moving on to the next chunk costs nothing; an FPDU that straddles chunks is joined
        into a buffer of exactly ``n`` bytes and the rest of the last chunk is parsed in
        place afterwards, so each byte is copied at most once.
        """
        avail = len(self._buf) - self._pos
        if avail >= n:
            return True
        if avail + self._more_len < n:
            return False
        more = self._more
        if not avail:  # switch to the next chunk without copying
            chunk = more.popleft()
            start = self._more_pos
            self._more_pos = 0
            self._more_len -= len(chunk) - start
            self._buf = chunk
            self._view = memoryview(chunk)
            self._pos = start
            avail = len(chunk) - start
            if avail >= n:
                return True
        parts: list[Buffer] = [self._view[self._pos :]]
        while avail < n:
            chunk = more[0]
            start = self._more_pos
            take = min(len(chunk) - start, n - avail)
            parts.append(memoryview(chunk)[start : start + take])
            avail += take
            self._more_len -= take
            if start + take == len(chunk):
                more.popleft()
                self._more_pos = 0
            else:
                self._more_pos = start + take
        self._buf = b"".join(parts)
        self._view = memoryview(self._buf)
        self._pos = 0
        return True

    def _fail(self, error: MpaError) -> MpaError:
        self.error = error
        self._buf = b""
        self._view = memoryview(self._buf)
        self._pos = 0
        self._more.clear()
        self._more_len = 0
        self._more_pos = 0
        self._borrowed = False
        return error

    def next_ulpdu(self) -> memoryview | None:
        """The next validated ULPDU, or None until its FPDU has fully arrived (MPA-16)."""
        if self.error is not None:
            raise self.error
        if self.markers:
            return self._next_marked()
        # Fast path without markers: the length field is in the current chunk.
        buf = self._buf
        pos = self._pos
        avail = len(buf) - pos
        if not avail:
            if not self._more:
                return None
            buf = self._buf = self._more.popleft()  # next chunk, no copy
            self._view = memoryview(buf)
            pos = self._pos = self._more_pos
            self._more_pos = 0
            avail = len(buf) - pos
            self._more_len -= avail
        if avail >= MPA_LENGTH_LEN:
            n = (buf[pos] << 8) | buf[pos + 1]
            wire = ((MPA_LENGTH_LEN + n + 3) & ~3) + MPA_CRC_LEN
            if n > self.max_ulpdu:
                raise self._fail(self._length_error(n))
            if wire > avail:
                if wire > avail + self._more_len:
                    return None  # MPA-16: hold until the FPDU is complete
                self._ensure(wire)
                buf = self._buf
                pos = 0
            view = self._view
            # MPA-12: the CRC over the covered bytes and a correct CRC field is a constant.
            if self.crc and crc32c(view[pos : pos + wire]) != MPA_CRC_RESIDUE:
                crc_at = pos + wire - MPA_CRC_LEN
                raise self._fail(self._crc_error(view[pos:crc_at], buf[crc_at : crc_at + 4]))
            self.fpdu_offset = self.offset
            self.fpdu_wire_length = wire
            self.offset += wire
            self._pos = pos + wire
            return view[pos + MPA_LENGTH_LEN : pos + MPA_LENGTH_LEN + n]
        if not self._ensure(MPA_LENGTH_LEN):  # the length field straddles two chunks
            return None
        return self.next_ulpdu()

    def _next_marked(self) -> memoryview | None:
        """With markers (MPA-07..MPA-10): the FPDU, its leading marker if any, inner markers.

        The CRC is checked over the FPDU where it lies (an FPDU that straddles chunks is
        joined first, once; MPA-12: the CRC of covered bytes plus a correct CRC field is
        the constant MPA_CRC_RESIDUE).  The ULPDU is the view itself when no marker is
        inside it; else the FPDU is copied into a word array, its markers (one 32-bit word
        every 128 words) are read by one strided slice and compared in one go with the
        precomputed ones (a mismatch is re-checked marker by marker with RESERVED and the
        low FPDUPTR bits ignored, MPA-06/MPA-08), and one strided delete cuts them out
        (MPA-10).
        """
        geometry = (self.offset % MPA_MARKER_INTERVAL) >> 2
        lead, first, index = _RX_GEOMETRY[geometry]
        buf = self._buf
        pos = self._pos
        avail = len(buf) - pos
        if avail < lead + MPA_LENGTH_LEN:
            if not self._ensure(lead + MPA_LENGTH_LEN):
                return None
            buf = self._buf
            pos = self._pos
            avail = len(buf) - pos
        n = (buf[pos + lead] << 8) | buf[pos + lead + 1]
        if n > self.max_ulpdu:
            raise self._fail(self._length_error(n))
        body = (MPA_LENGTH_LEN + n + 3) & ~3
        count = marker_count(first, body)
        wire = lead + body + MPA_MARKER_LEN * count + MPA_CRC_LEN
        if wire > avail:
            if wire > avail + self._more_len:
                return None  # MPA-16: hold until the FPDU is complete
            self._ensure(wire)
            buf = self._buf
            pos = 0
        fpdu = self._view[pos : pos + wire]
        if self.crc and crc32c(fpdu) != MPA_CRC_RESIDUE:
            raise self._fail(self._crc_error(fpdu[:-MPA_CRC_LEN], fpdu[-MPA_CRC_LEN:]))
        start = lead + MPA_LENGTH_LEN
        if count:
            # Marker words sit at word ``index`` (0 for a leading marker, which is 508
            # bytes before the first inner one) and every 128 words after; fewer than 128
            # words follow the last one, the CRC word included.
            words = array(_WORD)
            words.frombytes(fpdu)
            marks = words[index::_WORDS_PER_INTERVAL].tobytes()
            if not _MARKERS[index].startswith(marks):
                self._check_markers(marks, index)
            # MPA-10: the markers cut out by one strided delete of their words (the
            # leading one, at word 0, is on the same stride).
            del words[index::_WORDS_PER_INTERVAL]
            ulpdu = memoryview(words).cast("B")
            start = MPA_LENGTH_LEN
        else:
            if lead and (buf[pos + 2] or buf[pos + 3] & _FPDUPTR_LOW_MASK):
                self._check_markers(bytes(fpdu[:MPA_MARKER_LEN]), 0)
            ulpdu = fpdu
        self.fpdu_offset = self.offset
        self.fpdu_wire_length = wire
        self.offset += wire
        self._pos = pos + wire
        return ulpdu[start : start + n]

    def _length_error(self, n: int) -> MpaError:
        return MpaError(
            "MPA-16",
            f"ULPDU_Length {n} exceeds {self.max_ulpdu} at stream offset {self.offset}",
            TERM_LLP_CRC_ERROR,
        )

    def _crc_error(self, covered: Buffer, field: Buffer) -> MpaError:
        computed = crc32c(covered)
        received = _LE32.unpack(field)[0]
        return MpaError(
            "MPA-12",
            f"CRC mismatch at stream offset {self.offset}: received "
            f"0x{received:08X}, computed 0x{computed:08X}",
            TERM_LLP_CRC_ERROR,
        )

    def _check_markers(self, marks: bytes, index: int) -> None:
        """Check the markers of one FPDU one by one, RESERVED and low two FPDUPTR bits
        ignored (MPA-06); the first wrong FPDUPTR is a marker mismatch (MPA-08)."""
        expected_marks = _MARKERS[index]
        for at in range(0, len(marks), MPA_MARKER_LEN):
            ptr = _U16.unpack_from(marks, at + 2)[0]
            expected = _U16.unpack_from(expected_marks, at + 2)[0]
            if ptr & MPA_FPDUPTR_MASK != expected:
                raise self._fail(self._marker_error(expected, ptr))

    def _marker_error(self, expected: int, ptr: int) -> MpaError:
        return MpaError(
            "MPA-08",
            f"marker FPDUPTR 0x{ptr:04X} does not point to the FPDU at stream offset "
            f"{self.offset} (expected 0x{expected:04X})",
            TERM_LLP_MARKER_MISMATCH,
        )
