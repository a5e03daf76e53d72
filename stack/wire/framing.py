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
form (:func:`_markers_in`) lets both directions compute an FPDU's wire length up front,
so the receiver waits for whole FPDUs and never re-parses partial input.

Copies.  :meth:`FpduFramer.frame` copies the payload once (``bytes.join``) and runs
CRC32c over it once; with markers the payload is cut into 508-byte pieces in C
(:mod:`struct`) and joined with zero markers whose FPDUPTR bytes are then written with
two strided slice assignments.  :class:`FpduDeframer` keeps immutable ``bytes`` chunks,
joins only as many as the next FPDU needs (so input is not re-copied per FPDU, wsproto's
``Buffer`` idea), checks the CRC over the contiguous wire bytes in one call and hands out
``memoryview`` slices; without markers a ULPDU inside one received ``bytes`` chunk is not
copied at all.  With markers, the FPDU is copied once into a 32-bit word array and every
marker (one word each, 4-aligned) is removed by one strided deletion.
"""

from __future__ import annotations

import struct
from array import array
from collections import deque
from collections.abc import Iterator

from stack.constants import (
    MPA_CRC_LEN,
    MPA_FPDUPTR_MASK,
    MPA_LENGTH_LEN,
    MPA_MARKER_INTERVAL,
    MPA_MARKER_LEN,
    MULPDU_MAX,
    MULPDU_MIN,
    TERM_LLP_CRC_ERROR,
    TERM_LLP_MARKER_MISMATCH,
)
from stack.crc import crc32c
from stack.errors import LocalError, MpaError

Buffer = bytes | bytearray | memoryview

__all__ = [
    "FpduDeframer",
    "FpduFramer",
    "RX_ULPDU_SLACK",
    "fpdu_wire_length",
    "mulpdu_for",
    "stream_offset",
]

RX_ULPDU_SLACK = 512
"""Receive tolerance above MULPDU_MAX for peers that size FPDUs past the DDP limit."""

_SEQ_MOD = 1 << 32
_MARKER_DATA = MPA_MARKER_INTERVAL - MPA_MARKER_LEN  # data bytes between two markers: 508
_U16 = struct.Struct(">H")
_LE32 = struct.Struct("<I")
_ZERO_MARKER = bytes(MPA_MARKER_LEN)
_PADS = (b"", b"\0", b"\0\0", b"\0\0\0")
_MAX_LENGTH_FIELD = 0xFFFF

# Marker checks and writes use strided byte slices: the FPDUPTR of the k-th marker in an FPDU
# is first + 512k, so its low byte is constant and its high byte grows by 2 (mod 256) per
# marker.  An FPDU holds at most ~130 markers; the ramp covers far more.
_RAMP = bytes((2 * k) & 0xFF for k in range(1024))
_LOW2_CLEAR = bytes(i & (MPA_FPDUPTR_MASK & 0xFF) for i in range(256))
_SHIFT_TABLES: dict[int, bytes] = {}


def _shift_table(delta: int) -> bytes:
    """Translation table adding ``delta`` (mod 256) to every byte."""
    delta &= 0xFF
    table = _SHIFT_TABLES.get(delta)
    if table is None:
        table = _SHIFT_TABLES[delta] = bytes((i + delta) & 0xFF for i in range(256))
    return table


def _fpduptr_high_bytes(first: int, count: int) -> bytes:
    """High FPDUPTR bytes of ``count`` markers, the first one ``first`` bytes into the FPDU."""
    if count <= len(_RAMP):
        return _RAMP[:count].translate(_shift_table(first >> 8))
    return bytes(((first + MPA_MARKER_INTERVAL * k) >> 8) & 0xFF for k in range(count))


_SPLIT_STRUCTS: dict[int, struct.Struct] = {}
_WORD = next(code for code in "IHLB" if array(code).itemsize == MPA_MARKER_LEN)
_WORDS_PER_INTERVAL = MPA_MARKER_INTERVAL // MPA_MARKER_LEN


def _split_struct(count: int) -> struct.Struct:
    """``count`` consecutive 508-byte fields (payload cut for marker insertion)."""
    s = _SPLIT_STRUCTS.get(count)
    if s is None:
        s = _SPLIT_STRUCTS[count] = struct.Struct(f"{_MARKER_DATA}s" * count)
    return s


def mulpdu_for(emss: int, markers: bool) -> int:
    """MULPDU for an EMSS (MPA-13, RFC 5044 §4.5, digest §2.6), clamped to 128..64768.

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


def _markers_in(r: int, body: int) -> int:
    """Markers inside/after an FPDU body of ``body`` bytes whose length field is at ``r``.

    ``r`` is the length field's offset mod 512 (4..508); a marker exactly at the end of
    the body sits between PAD and CRC and counts (it is covered by the CRC).
    """
    first = MPA_MARKER_INTERVAL - r
    if body < first:
        return 0
    return 1 + (body - first) // _MARKER_DATA


def fpdu_wire_length(ulpdu_length: int, offset: int = 0, markers: bool = False) -> int:
    """Bytes an FPDU with this ULPDU_Length occupies on the wire starting at ``offset``.

    Includes a leading marker (when ``offset`` is a marker position) and inner markers.
    """
    body = (MPA_LENGTH_LEN + ulpdu_length + 3) & ~3
    if not markers:
        return body + MPA_CRC_LEN
    r = offset % MPA_MARKER_INTERVAL
    lead = MPA_MARKER_LEN if r == 0 else 0
    r += lead
    return lead + body + MPA_MARKER_LEN * _markers_in(r, body) + MPA_CRC_LEN


class FpduFramer:
    """Transmit side: frames one ULPDU per FPDU (MPA-01), with CRC and markers as negotiated.

    Fields: ``crc`` (compute the CRC; otherwise the field is sent as 0, as siw does,
    MPA-05), ``markers`` (insert markers, MPA-07/09), ``offset`` (stream bytes sent since
    SeqStart; advanced by every FPDU), ``max_ulpdu`` (largest ULPDU accepted, MPA-02).
    """

    __slots__ = ("crc", "markers", "offset", "max_ulpdu")

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

    def _frame_markers(self, ulpdu: Buffer, n: int) -> bytearray:
        """Frame with markers (MPA-07): leading marker, inner markers, marker before CRC."""
        r = self.offset % MPA_MARKER_INTERVAL
        lead = _ZERO_MARKER if r == 0 else b""
        r += len(lead)
        pad_len = -(MPA_LENGTH_LEN + n) & 3
        pad = _PADS[pad_len]
        body = MPA_LENGTH_LEN + n + pad_len
        first = MPA_MARKER_INTERVAL - r
        crc_slot = _ZERO_MARKER  # placeholder for the CRC field, written last
        header = _U16.pack(n)
        count = 0
        if body < first:
            out = bytearray(b"".join((lead, header, ulpdu, pad, crc_slot)))
        else:
            # Pieces between markers: the head (``first`` bytes from the length field),
            # full 508-byte pieces, then the remainder.  Joining them with zero markers puts
            # a marker between each pair, including one between PAD and CRC when the body
            # ends on a marker position.  The PAD always ends the last piece with data.
            data = ulpdu if isinstance(ulpdu, bytes) else memoryview(ulpdu)
            head_data = first - MPA_LENGTH_LEN
            full, rest = divmod(body - first, _MARKER_DATA)
            count = full + 1
            if rest:
                cut = head_data + full * _MARKER_DATA
                tail: tuple[Buffer, ...] = (b"".join((data[cut:], pad, crc_slot)),)
            elif not pad_len:
                tail = (crc_slot,)
            elif full:
                full -= 1
                cut = head_data + full * _MARKER_DATA
                tail = (b"".join((data[cut:], pad)), crc_slot)
            else:
                header = b"".join((header, data, pad))  # the whole body is the head
                head_data = 0
                tail = (crc_slot,)
            head = b"".join((lead, header, data[:head_data]))
            pieces = _split_struct(full).unpack_from(data, head_data) if full else ()
            out = bytearray(MPA_MARKER_LEN).join((head, *pieces, *tail))
            # FPDUPTR of marker k is first + 512k (MPA-08); RESERVED stays zero (MPA-06).
            at = len(lead) + first
            end = at + count * MPA_MARKER_INTERVAL
            out[at + 2 : end : MPA_MARKER_INTERVAL] = _fpduptr_high_bytes(first, count)
            out[at + 3 : end : MPA_MARKER_INTERVAL] = bytes((first & 0xFF,)) * count
        if self.crc:
            with memoryview(out) as view:
                c = crc32c(view[:-MPA_CRC_LEN])
            out[-MPA_CRC_LEN:] = _LE32.pack(c)
        self.offset += len(out)
        return out


class FpduDeframer:
    """Receive side: turns stream bytes into validated ULPDUs (MPA-10, MPA-15, MPA-16).

    Feed bytes with :meth:`feed` (any chunking), take ULPDUs with :meth:`next_ulpdu` or by
    iterating.  Checks the CRC when ``crc`` (MPA-12 -> Terminate 2/0/2), every marker's
    FPDUPTR when ``markers`` (MPA-08 -> 2/0/3, after the CRC so a corrupt FPDU reports the
    CRC), and ``ULPDU_Length <= max_ulpdu``.  After an error nothing more is delivered
    (MPA-28): every later call raises the same error.

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
        self._buf = b""
        self._view = memoryview(self._buf)
        self._pos = 0
        self._more: deque[bytes] = deque()
        self._more_len = 0  # unread bytes in _more
        self._more_pos = 0  # bytes of _more[0] already consumed

    @property
    def pending(self) -> int:
        """Bytes received but not yet delivered (a partial FPDU, or unread whole ones)."""
        return len(self._buf) - self._pos + self._more_len

    def feed(self, data: Buffer) -> None:
        """Add received stream bytes (copied once unless they are already ``bytes``)."""
        if not data:
            return
        chunk = data if type(data) is bytes else bytes(data)
        self._more.append(chunk)
        self._more_len += len(chunk)

    def __iter__(self) -> Iterator[memoryview]:
        while (ulpdu := self.next_ulpdu()) is not None:
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
        return error

    def next_ulpdu(self) -> memoryview | None:
        """The next validated ULPDU, or None until its FPDU has fully arrived (MPA-16)."""
        if self.error is not None:
            raise self.error
        if not self.markers:
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
                if n <= self.max_ulpdu:
                    if wire > avail:
                        if wire > avail + self._more_len:
                            return None  # MPA-16: hold until the FPDU is complete
                        self._ensure(wire)
                        buf = self._buf
                        pos = 0
                    view = self._view
                    crc_at = pos + wire - MPA_CRC_LEN
                    if self.crc and crc32c(view[pos:crc_at]) != _LE32.unpack_from(buf, crc_at)[0]:
                        raise self._fail(self._crc_error(view[pos:crc_at], buf, crc_at))
                    self.fpdu_offset = self.offset
                    self.fpdu_wire_length = wire
                    self.offset += wire
                    self._pos = pos + wire
                    return view[pos + MPA_LENGTH_LEN : pos + MPA_LENGTH_LEN + n]
            elif not self._more_len:
                return None
        return self._next_ulpdu()

    def _crc_error(self, covered: Buffer, buf: bytes, crc_at: int) -> MpaError:
        computed = crc32c(covered)
        received = _LE32.unpack_from(buf, crc_at)[0]
        return MpaError(
            "MPA-12",
            f"CRC mismatch at stream offset {self.offset}: received "
            f"0x{received:08X}, computed 0x{computed:08X}",
            TERM_LLP_CRC_ERROR,
        )

    def _next_ulpdu(self) -> memoryview | None:
        """General path: markers, or an FPDU that spans chunks."""
        lead = 0
        if self.markers and self.offset % MPA_MARKER_INTERVAL == 0:
            lead = MPA_MARKER_LEN
        if not self._ensure(lead + MPA_LENGTH_LEN):
            return None
        pos = self._pos
        n = (self._buf[pos + lead] << 8) | self._buf[pos + lead + 1]
        if n > self.max_ulpdu:
            raise self._fail(
                MpaError(
                    "MPA-16",
                    f"ULPDU_Length {n} exceeds {self.max_ulpdu} at stream offset {self.offset}",
                    TERM_LLP_CRC_ERROR,
                )
            )
        body = (MPA_LENGTH_LEN + n + 3) & ~3
        if self.markers:
            r = (self.offset + lead) % MPA_MARKER_INTERVAL
            count = _markers_in(r, body)
            wire = lead + body + MPA_MARKER_LEN * count + MPA_CRC_LEN
        else:
            count = 0
            wire = body + MPA_CRC_LEN
        if not self._ensure(wire):
            return None
        pos = self._pos
        buf = self._buf
        view = self._view
        crc_at = pos + wire - MPA_CRC_LEN
        if self.crc and crc32c(view[pos:crc_at]) != _LE32.unpack_from(buf, crc_at)[0]:
            raise self._fail(self._crc_error(view[pos:crc_at], buf, crc_at))
        start = pos + lead  # the length field
        if lead and (_U16.unpack_from(buf, pos + 2)[0] & MPA_FPDUPTR_MASK) != 0:
            raise self._fail(self._marker_error(0, _U16.unpack_from(buf, pos + 2)[0]))
        if count:
            first = MPA_MARKER_INTERVAL - r
            at = start + first
            end = at + count * MPA_MARKER_INTERVAL
            self._check_markers(buf, at, end, first, count)
        self.fpdu_offset = self.offset
        self.fpdu_wire_length = wire
        self.offset += wire
        self._pos = pos + wire
        if not count:
            return view[start + MPA_LENGTH_LEN : start + MPA_LENGTH_LEN + n]
        # Strip markers: every marker is one 4-byte word at a 4-aligned distance from the
        # length field, so one strided deletion on a word array removes them all (MPA-10).
        words = array(_WORD)
        words.frombytes(view[start:crc_at])
        first_word = first // MPA_MARKER_LEN
        del words[first_word : first_word + count * _WORDS_PER_INTERVAL : _WORDS_PER_INTERVAL]
        return memoryview(words).cast("B")[MPA_LENGTH_LEN : MPA_LENGTH_LEN + n]

    def _check_markers(self, buf: bytes, at: int, end: int, first: int, count: int) -> None:
        """Verify FPDUPTR of ``count`` markers starting at ``at`` (MPA-06, MPA-08)."""
        low = buf[at + 3 : end : MPA_MARKER_INTERVAL].translate(_LOW2_CLEAR)
        high = buf[at + 2 : end : MPA_MARKER_INTERVAL]
        if low == bytes((first & 0xFF,)) * count and high == _fpduptr_high_bytes(first, count):
            return
        for k in range(count):
            ptr = _U16.unpack_from(buf, at + k * MPA_MARKER_INTERVAL + 2)[0]
            expected = (first + k * MPA_MARKER_INTERVAL) & 0xFFFF
            if ptr & MPA_FPDUPTR_MASK != expected:
                raise self._fail(self._marker_error(expected, ptr))
        raise AssertionError("unreachable: strided marker check disagreed")  # pragma: no cover

    def _marker_error(self, expected: int, ptr: int) -> MpaError:
        return MpaError(
            "MPA-08",
            f"marker FPDUPTR 0x{ptr:04X} does not point to the FPDU at stream offset "
            f"{self.offset} (expected 0x{expected:04X})",
            TERM_LLP_MARKER_MISMATCH,
        )
