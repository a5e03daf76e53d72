"""Full Operation: walking a direction's FPDUs (RFC 5044 §4, §5, §7.1.2).

:class:`FpduWalk` is the part of :class:`~stack.dissect.decoder.walker.DirectionDecoder`
that frames FPDUs from ULPDU_Length once the direction is in the ``fpdu`` mode: the
general :meth:`FpduWalk._walk` over the buffered bytes, and the bulk
:meth:`FpduWalk.walk_plain` straight over a segment's bytes (with its per-direction
constants, :meth:`FpduWalk.bulk_context`, shared with the fused path of :mod:`~.bulk`).
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING

from stack.constants import (
    DDP_TAGGED_HDR_LEN,
    DDP_UNTAGGED_HDR_LEN,
    MPA_CRC_LEN,
    MPA_MARKER_INTERVAL,
    MPA_MARKER_LEN,
    MULPDU_MAX,
    RDMAP_OPCODE_MASK,
)
from stack.crc import crc32c

try:  # the C function itself, without stack.crc's wrapper call, on the bulk path
    from crc32c import crc32c as _crc32c
except ImportError:  # pragma: no cover - crcmod backend
    _crc32c = crc32c
from stack.dissect.decoder.checks import _plausible_ulpdu
from stack.dissect.decoder.common import (
    _CTRL_TAGGED_LAST,
    _CTRL_UNTAGGED_LAST,
    _FAST_INVALIDATE_OPS,
    _FAST_SEND_OPS,
    _FAST_TAGGED,
    _FAST_TAGGED_OPS,
    _FAST_UNTAGGED,
    _LAYOUTS,
    _LE32,
    _MARKER_UNPACK,
    _TAGGED_UNPACK,
    _U32,
    _UNTAGGED_UNPACK,
    _ZEROS,
)
from stack.dissect.decoder.modes import Mode
from stack.dissect.decoder.records import PduRecord, SegmentView
from stack.errors import ProtocolError
from stack.wire.checker import Finding
from stack.wire.framing import fpdu_layout, unmarked_body

if TYPE_CHECKING:
    from stack.dissect.decoder.checks import DirectionChecks
    from stack.dissect.decoder.connection import ConnectionDecoder
    from stack.dissect.decoder.records import DirectionInfo

_LE32_UNPACK = _LE32.unpack_from
_BE32_UNPACK = _U32.unpack_from
_PAD_MASKS = (0, 0xFF, 0xFFFF, 0xFFFFFF)
"""The PAD bytes of a big-endian word ending where the PAD ends, by PAD length (MPA-04)."""


class FpduWalk:
    """The FPDU walk of a :class:`~stack.dissect.decoder.walker.DirectionDecoder` in Full
    Operation (the ``fpdu`` mode)."""

    # The direction's state, kept by DirectionDecoder (declared here for the type checker).
    conn: ConnectionDecoder
    side: int
    mode: Mode
    chunks: list[bytes | bytearray | memoryview]
    buffered: int
    need: int
    base: int
    ends: deque[tuple[int, int, float]]
    crc: bool | None
    markers: bool | None
    seq_start: int
    seq: DirectionChecks
    info: DirectionInfo
    _bulk: tuple | None

    if TYPE_CHECKING:

        def run(self, final: bool) -> None: ...
        def _joined(self) -> memoryview: ...
        def _consume(self, n: int) -> None: ...
        def _frame_at(self, end: int) -> tuple[int, float]: ...
        def _next_plausible(self, buf: memoryview, pos: int) -> bool: ...
        def _lose_sync(self) -> None: ...

    def _walk(self) -> bool:
        buf = self._joined()
        n = len(buf)
        pos = 0
        markers = self.markers
        crc_on = self.crc
        base = self.base
        seq_start = self.seq_start
        while True:
            if markers:
                rel = base + pos - seq_start
                lead = MPA_MARKER_LEN if rel % MPA_MARKER_INTERVAL == 0 else 0
                if pos + lead + 2 > n:
                    self.need = pos + lead + 2 - pos
                    break
                ulen = (buf[pos + lead] << 8) | buf[pos + lead + 1]
                lead, wire, marks = fpdu_layout(rel, ulen, True)
            else:
                if pos + 2 > n:
                    self.need = 2
                    break
                ulen = (buf[pos] << 8) | buf[pos + 1]
                lead = 0
                wire = ((ulen + 5) & ~3) + MPA_CRC_LEN
                marks = ()
            if pos + wire > n:
                self.need = wire
                break
            end_body = pos + wire - MPA_CRC_LEN
            crc_field = _LE32.unpack_from(buf, end_body)[0]
            crc_value = crc32c(buf[pos:end_body])
            if marks:
                body = unmarked_body(buf, pos, lead, end_body, marks)
                ulpdu: bytes | memoryview = body[2 : 2 + ulen]
                pad = body[2 + ulen :]
            else:
                ulpdu = buf[pos + 2 : pos + 2 + ulen]
                pad = bytes(buf[pos + 2 + ulen : end_body]) if end_body - pos - 2 - ulen else b""
            good = crc_value == crc_field
            if (
                crc_on
                and not good
                and not _plausible_ulpdu(ulpdu, self.conn.opts.rfc7306)
                and not self._next_plausible(buf, pos + wire)
            ):
                # bad CRC, a header that makes no sense and no FPDU where the length points:
                # the framing is lost (MPA-16); a corrupted FPDU alone is shown with MPA-12
                self._consume(pos)
                self.conn.note(
                    self.side,
                    self._frame_at(self.base + 1)[0],
                    "lost_sync",
                    f"FPDU framing lost at offset {self.base} (bad CRC, implausible header); "
                    "searching for the next FPDU",
                    self.base,
                )
                self._lose_sync()
                return True
            ends = self.ends
            while len(ends) > 1 and ends[0][0] <= base + pos:
                ends.popleft()  # segments before this FPDU (_consume drops them too)
            if len(ends) == 1 and ends[0][0] >= base + pos + wire:
                _, frame_no, ts = ends[0]
            else:
                frame_no, ts = self._frame_at(base + pos + wire)
            self.conn.fpdu(
                self,  # type: ignore[arg-type]  # a DirectionDecoder (the mixin's host)
                base + pos,
                wire,
                ulen,
                good if crc_on else None,
                crc_field,
                crc_value,
                pad,
                buf,
                pos,
                lead,
                marks,
                ulpdu,
                frame_no,
                ts,
            )
            pos += wire
            if self.mode is not Mode.FPDU:
                break
        self._consume(pos)
        return self.mode is not Mode.FPDU and bool(self.buffered)

    def walk_plain(self, data: memoryview, offset: int, frame: int, ts: float) -> None:
        """The bulk path of :meth:`push` + :meth:`_walk` for an empty buffer.

        Every FPDU that ``data`` completes is decoded straight from the capture bytes
        (markers checked and cut out when the direction has them); a partial FPDU at the
        end is buffered for :meth:`push`.  Anything unusual (bad CRC, a marker that is
        not as expected, non-zero PAD, an undecodable ULPDU, the first FPDU of a direction,
        a pending gap finding) goes through the general :meth:`_walk` / :meth:`Conn.fpdu`.
        The caller has counted ``frame`` in the connection's ``last_frame``.
        """
        ctx = self._bulk
        if ctx is None or ctx[0] != self.conn.initiator:
            ctx = self.bulk_context()
        (_, emit, stream, direction, src, dst, check, check_tagged, check_untagged, peer, info,
         rfc7306, siw, pending, route, brief, first_frames) = ctx  # fmt: skip
        n = len(data)
        pos = 0
        crc_on = self.crc
        verdict = True if crc_on else None
        fpdus = ulpdu_bytes = payload_bytes = 0  # wire bytes: pos, every FPDU counted
        markers = self.markers
        seq_start = self.seq_start
        # the first FPDU of a direction and a pending gap finding take the general path
        general = pending or first_frames[self.side] is None
        ptrs: tuple[int, ...] = ()
        offsets: tuple[int, ...] = ()
        reserved: tuple[int, ...] = ()
        nmarks = 0
        pad: bytes | None
        while pos + 2 <= n:
            if markers:
                phase = (offset + pos - seq_start) % MPA_MARKER_INTERVAL
                lead = 0 if phase else MPA_MARKER_LEN
                if pos + lead + 2 > n:
                    break
                ulen = (data[pos + lead] << 8) | data[pos + lead + 1]
                layout = _LAYOUTS.get((phase, ulen))
                if layout is None:
                    layout = fpdu_layout(phase, ulen, True)
                    if len(_LAYOUTS) < 65536:
                        _LAYOUTS[(phase, ulen)] = layout
                lead, wire, marks = layout
            else:
                ulen = (data[pos] << 8) | data[pos + 1]
                wire = ((ulen + 5) & ~3) + MPA_CRC_LEN
            end = pos + wire
            if end > n:
                break
            end_body = end - MPA_CRC_LEN
            crc_field = _LE32_UNPACK(data, end_body)[0]
            crc_value = _crc32c(data[pos:end_body])
            odd = False
            if markers:
                found = []
                for m in marks:
                    res, ptr = _MARKER_UNPACK(data, pos + m)
                    if res or ptr != (0 if (m == 0 and lead) else m - lead):
                        odd = True
                        break
                    found.append(ptr)
                body = unmarked_body(data, pos, lead, end_body, marks)
                ulpdu: bytes | memoryview | None = body[2 : 2 + ulen]
                hbuf: bytes | memoryview = body
                hat = 2
                nmarks = len(marks)
                body_pad = body[2 + ulen :]
                pad_len = len(body_pad)
                odd_pad = pad_len and any(body_pad)
                pad = body_pad
                ptrs = tuple(found)
                at = offset + pos
                offsets = tuple([at + m for m in marks])
                reserved = _ZEROS[len(marks)] if len(marks) < 64 else (0,) * len(marks)
            else:
                pad_len = end_body - pos - 2 - ulen
                # PAD (0-3 bytes) ends the 4-byte word before the CRC: tested in place
                odd_pad = pad_len and _BE32_UNPACK(data, end_body - 4)[0] & _PAD_MASKS[pad_len]
                pad = None  # made below when a record needs it
                ulpdu = None
                hbuf = data  # the DDP header is read in place
                hat = pos + 2
            segment = None
            flagged: list[Finding] | None = None
            if not (
                odd
                or (crc_on and crc_value != crc_field)
                or general
                or odd_pad
                or ulen > MULPDU_MAX
            ):
                if brief and ulen >= DDP_UNTAGGED_HDR_LEN:
                    # a canonical Write / Read Response / Send-family header (SegmentView's
                    # fast cases) without findings becomes a BriefFpdu tuple, no objects
                    ctrl = hbuf[hat]
                    uc = hbuf[hat + 1]
                    size = -1
                    if ctrl in _FAST_TAGGED and uc in _FAST_TAGGED_OPS:
                        _, _, stag, to = _TAGGED_UNPACK(hbuf, hat)
                        size = ulen - DDP_TAGGED_HDR_LEN
                        last = ctrl == _CTRL_TAGGED_LAST
                        op = uc & RDMAP_OPCODE_MASK
                        flagged = []
                        check_tagged(op, stag, to, size, last, flagged, peer)
                        if not flagged:
                            emit((frame, ts, route, op, True, stag, to, None, None, size, last,
                                  verdict, nmarks, None, wire))  # fmt: skip
                    elif ctrl in _FAST_UNTAGGED and uc in _FAST_SEND_OPS:
                        _, _, inval, qn, msn, mo = _UNTAGGED_UNPACK(hbuf, hat)
                        if qn == 0 and (not inval or uc in _FAST_INVALIDATE_OPS):
                            size = ulen - DDP_UNTAGGED_HDR_LEN
                            last = ctrl == _CTRL_UNTAGGED_LAST
                            op = uc & RDMAP_OPCODE_MASK
                            flagged = []
                            check_untagged(qn, msn, mo, uc, inval, size, last, flagged)
                            if not flagged:
                                emit((frame, ts, route, op, False, qn, msn, mo, inval, size, last,
                                      verdict, nmarks,
                                      hbuf[hat + DDP_UNTAGGED_HDR_LEN : hat + ulen],
                                      wire))  # fmt: skip
                    if size >= 0 and not flagged:
                        payload_bytes += size
                        fpdus += 1
                        ulpdu_bytes += ulen
                        pos = end
                        continue
                if ulpdu is None:
                    ulpdu = data[pos + 2 : pos + 2 + ulen]
                try:
                    segment = SegmentView(ulpdu, rfc7306, siw)
                except ProtocolError:
                    pass
            if segment is None:
                # the general path (findings, first-FPDU checks, lost framing, bad ULPDU)
                self._count(fpdus, pos, ulpdu_bytes, payload_bytes)
                self._hold_rest(data, pos, offset, frame, ts)
                self.run(False)
                return
            if pad is None:
                pad = bytes(data[end_body - pad_len : end_body]) if pad_len else b""
            assert ulpdu is not None
            if flagged is None:
                findings: list[Finding] = list(segment.findings) if segment.findings else []
                check(segment, findings, peer)
            else:  # checked on the brief path already
                findings = flagged
            payload_bytes += len(segment.payload)
            emit(
                PduRecord(stream, frame, ts, direction, src, dst, "fpdu", offset + pos, wire,
                            findings, None, 0, 0, 0, b"", ulen, verdict, crc_field, crc_value,
                            pad, offsets, ptrs, reserved, segment, ulpdu)
            )  # fmt: skip
            fpdus += 1
            ulpdu_bytes += ulen
            pos = end
        if fpdus:  # as _count, written out: one call less per segment
            info.pdus += fpdus
            info.fpdus += fpdus
            info.wire_bytes += pos
            info.ulpdu_bytes += ulpdu_bytes
            info.payload_bytes += payload_bytes
        if pos < n:
            self._hold_rest(data, pos, offset, frame, ts)
            left = n - pos
            if markers:
                rel = offset + pos - seq_start
                lead = MPA_MARKER_LEN if rel % MPA_MARKER_INTERVAL == 0 else 0
                if left >= lead + 2:
                    ulen = (data[pos + lead] << 8) | data[pos + lead + 1]
                    self.need = fpdu_layout(rel, ulen, True)[1]
                else:
                    self.need = lead + 2
            elif left >= 2:
                self.need = ((((data[pos] << 8) | data[pos + 1]) + 5) & ~3) + MPA_CRC_LEN
            else:
                self.need = 2
        else:
            self.base = offset + n

    def bulk_context(self) -> tuple:
        """The per-direction constants of :meth:`walk_plain` and the fused path of
        :mod:`~.bulk` (made again when the initiator, hence the direction name, changes)."""
        conn = self.conn
        side = self.side
        seq = self.seq
        route = (conn.stream, conn.direction(side), conn.names[side], conn.names[1 - side])
        ctx = self._bulk = (
            conn.initiator,
            conn.emit,
            *route,
            seq.check,
            seq.tagged,
            seq.untagged,
            conn.halves[1 - side].seq,
            self.info,
            conn.rfc7306,
            conn.siw_layout,
            conn.pending_findings[side],
            route,
            conn.dissector.brief,
            conn.first_fpdu_frame,
        )
        return ctx

    def _hold_rest(self, data: memoryview, pos: int, offset: int, frame: int, ts: float) -> None:
        """Buffer ``data[pos:]`` (stream offset ``offset + pos``) for :meth:`push` / :meth:`run`."""
        n = len(data)
        self.base = offset + pos
        self.chunks = [data[pos:]]
        self.buffered = n - pos
        self.ends.append((offset + n, frame, ts))

    def _count(self, fpdus: int, wire_bytes: int, ulpdu_bytes: int, payload_bytes: int) -> None:
        if fpdus:
            info = self.info
            info.pdus += fpdus
            info.fpdus += fpdus
            info.wire_bytes += wire_bytes
            info.ulpdu_bytes += ulpdu_bytes
            info.payload_bytes += payload_bytes
