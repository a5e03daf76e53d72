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
CRC32c over it once; :meth:`FpduFramer.frame_parts_iov` does not copy a large one at all (the
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
from collections.abc import Iterable

from stack.buffers import Buffer
from stack.constants import (
    IOV_MIN_PAYLOAD,
    MPA_CRC_LEN,
    MPA_LENGTH_LEN,
    MPA_MARKER_INTERVAL,
    MPA_MARKER_LEN,
    MULPDU_MAX,
)
from stack.crc import crc32c
from stack.errors import LocalError
from stack.wire.deframer import RX_ULPDU_SLACK, FpduDeframer
from stack.wire.markers import (
    MARKER_DATA,
    MARKER_TABLES,
    fpdu_layout,
    fpdu_wire_length,
    lead_and_first,
    mark_fpdu,
    mulpdu_for,
    stream_offset,
    unmarked_body,
)

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

_U16 = struct.Struct(">H")
_LE32 = struct.Struct("<I")
_ZERO_MARKER = bytes(MPA_MARKER_LEN)
_PADS = (b"", b"\0", b"\0\0", b"\0\0\0")
_MAX_LENGTH_FIELD = 0xFFFF

# For framing: the FPDUPTR low byte is that of ``first`` for all markers of an FPDU, so the
# markers ``join`` puts between the pieces carry it already (_SEPARATORS), and only the
# high bytes are written afterwards (_PTR_HIGH; bytearray: no conversion when assigned).
_SEPARATORS = tuple(bytearray(3) + table[3:4] for table in MARKER_TABLES)
_PTR_HIGH = tuple(bytearray(table[2::MPA_MARKER_LEN]) for table in MARKER_TABLES)
_PAD_AND_CRC = struct.Struct(f"{3 + MPA_CRC_LEN + 1}x")  # zeroes PAD, CRC slot and slack
_STAGE_SLACK = MPA_MARKER_INTERVAL + _PAD_AND_CRC.size  # stage bytes beyond a ULPDU
_TxGeometry = tuple[int, int, memoryview, bytearray, int, bytearray]  # FpduFramer._grow_stage


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
        """Append the FPDU of the ULPDU ``header + payload`` to ``out`` (one copy of each);
        return the number of bytes appended (:meth:`frame_parts_iov` without references)."""
        before = self.offset
        _, error = self.frame_parts_iov(((header, payload),), out, None)
        if error is not None:
            raise error
        return self.offset - before

    def frame_parts_iov(
        self,
        parts: Iterable[tuple[Buffer, Buffer]],
        out: bytearray,
        iov: list[Buffer] | None,
        min_ref: int = IOV_MIN_PAYLOAD,
    ) -> tuple[bytearray, LocalError | None]:
        """Frame each ULPDU ``header + payload`` of ``parts`` as one FPDU (MPA-01) after
        ``out``; returns the buffer that ends the output (the caller appends to it next),
        and the error that stopped framing at a ULPDU above ``max_ulpdu`` (MPA-02; the
        FPDUs before it are framed: the output stays whole).

        The CRC is chained over the length field, header, payload and pad, so the ULPDU is
        never joined first.  With ``iov`` and without markers a payload of ``min_ref`` bytes
        or more is not copied: ``out`` (ending with the length field and header) and the
        payload itself go to ``iov`` for a scatter-gather send (the caller sends them before
        that memory changes) and a new buffer starts with the PAD and CRC.  With markers
        each FPDU is laid out whole (a large one also goes to ``iov`` as it is).  Advances
        ``offset`` by the FPDUs' wire length.
        """
        max_ulpdu = self.max_ulpdu
        crc = self.crc
        markers = self.markers
        pack_length = _U16.pack
        pack_crc = _LE32.pack
        size = 0
        error = None
        for header, payload in parts:
            plen = len(payload)
            n = len(header) + plen
            if n > max_ulpdu:
                error = LocalError(f"ULPDU of {n} bytes exceeds the maximum {max_ulpdu} (MPA-02)")
                break
            if markers:
                fpdu = self._frame_markers(header, n, payload)  # advances offset itself
                if iov is not None and plen >= min_ref:
                    iov.append(out)
                    iov.append(fpdu)
                    out = bytearray()
                else:
                    out += fpdu
                continue
            lead = pack_length(n) + header  # the length field and the DDP header, joined once
            pad_len = -(MPA_LENGTH_LEN + n) & 3
            pad = _PADS[pad_len]
            if crc:
                c = crc32c(payload, crc32c(lead))
                trailer = pad + pack_crc(crc32c(pad, c) if pad_len else c)
            else:
                trailer = pad + _ZERO_MARKER
            size += MPA_LENGTH_LEN + n + pad_len + MPA_CRC_LEN
            out += lead
            if iov is not None and plen >= min_ref:
                iov.append(out)
                iov.append(payload)
                out = bytearray(trailer)
            else:
                out += payload
                out += trailer
        self.offset += size
        return out, error

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
