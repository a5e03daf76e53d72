"""The receive side of MPA Full Operation (RFC 5044 §6, §7.2): bytes in, validated ULPDUs out.

:class:`FpduDeframer` finds each FPDU from the previous ULPDU_Length (MPA-16), waits for all
of it, checks its CRC (MPA-12) and, when the peer sends markers, every marker's FPDUPTR
(MPA-08), and hands out the ULPDU with the markers taken out.  How it avoids copies is told
in :mod:`stack.wire.framing`, whose framer builds what this parses; both count the stream
offset from SeqStart themselves and share the marker tables of :mod:`stack.wire.markers`.
"""

from __future__ import annotations

import struct
from array import array
from collections import deque
from collections.abc import Iterator
from typing import Literal

from stack.buffers import Buffer
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
from stack.wire.markers import MARKER_TABLES, lead_and_first, marker_count

__all__ = ["FpduDeframer", "RX_ULPDU_SLACK"]

RX_ULPDU_SLACK = 512
"""Receive tolerance above MULPDU_MAX for peers that size FPDUs past the DDP limit."""

_U16 = struct.Struct(">H")
_EMPTY_VIEW = memoryview(b"")  # the view of no input (_drop_input, every chunk's end)
_LE32 = struct.Struct("<I")
_MARKERS = MARKER_TABLES
_FPDUPTR_LOW_MASK = MPA_FPDUPTR_MASK & 0xFF
# Receive geometry per stream offset mod 512 (index ``offset % 512 >> 2``): leading marker
# length, distance from the length field to the first inner marker, and the _MARKERS entry
# (0 when there is a leading marker).
_RX_GEOMETRY = tuple(
    (lead, first, first >> 2 if lead == 0 else 0)
    for lead, first in map(lead_and_first, range(0, MPA_MARKER_INTERVAL, MPA_MARKER_LEN))
)
_WORD: Literal["I", "L"] = "I" if array("I").itemsize == MPA_MARKER_LEN else "L"
_WORDS_PER_INTERVAL = MPA_MARKER_INTERVAL // MPA_MARKER_LEN


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

    def release_tail(self) -> int:
        """:meth:`settle` without the copy when every unread byte lies at the end of the
        last borrowed chunk (a partial FPDU at the end of the caller's buffer, MPA-16):
        forget them and return their count; the caller feeds them again, followed by what
        comes next, in its next :meth:`feed` (the stream offset stays at their start).
        Otherwise :meth:`settle` and 0."""
        if not self._borrowed:
            return 0
        more = self._more
        last: Buffer
        if not more:
            last, start = self._buf, self._pos
        elif len(more) == 1 and self._pos == len(self._buf):
            last, start = more[0], self._more_pos
        else:
            self.settle()
            return 0
        if type(last) is not memoryview:
            self.settle()
            return 0
        unread = len(last) - start
        self._drop_input()
        return unread

    def take_whole(self, view: memoryview) -> memoryview | None:
        """The ULPDU of ``view`` when it is exactly one whole FPDU and nothing else is
        pending, without markers, its length and CRC valid (MPA-12, MPA-16): the offsets
        advance as :meth:`feed` and :meth:`next_ulpdu` would advance them, and the view is
        not kept.  Otherwise None, and nothing changes (feed it the usual way, which
        raises what is wrong).  The usual chunk of a request/response exchange, taken in
        one step; ``view`` is a byte view."""
        if self.markers or self.error is not None or self._more or self._pos != len(self._buf):
            return None
        if view.format != "B" or view.ndim != 1:
            return None
        wire = len(view)
        if wire < MPA_LENGTH_LEN:
            return None
        n = (view[0] << 8) | view[1]
        if (
            wire != ((MPA_LENGTH_LEN + n + 3) & ~3) + MPA_CRC_LEN
            or n > self.max_ulpdu
            or (self.crc and crc32c(view) != MPA_CRC_RESIDUE)
        ):
            return None
        self.fpdu_offset = self.offset
        self.fpdu_wire_length = wire
        self.offset += wire
        return view[MPA_LENGTH_LEN : MPA_LENGTH_LEN + n]

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

    def _drop_input(self) -> None:
        """Forget every unread byte (and any borrowed buffer); the offset stays."""
        self._buf = b""
        self._view = _EMPTY_VIEW
        self._pos = 0
        self._more.clear()
        self._more_len = 0
        self._more_pos = 0
        self._borrowed = False

    def _fail(self, error: MpaError) -> MpaError:
        self.error = error
        self._drop_input()
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
