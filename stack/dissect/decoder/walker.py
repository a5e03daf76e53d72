"""One direction of a connection: startup frame, then FPDUs (the per-direction walker)."""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING

from stack.constants import (
    DDP_TAGGED_HDR_LEN,
    DDP_UNTAGGED_HDR_LEN,
    MPA_CRC_LEN,
    MPA_FRAME_HEADER_LEN,
    MPA_KEY_LEN,
    MPA_KEY_REP,
    MPA_KEY_REQ,
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
from stack.dissect.decoder.checks import DirectionChecks, _plausible_ulpdu
from stack.dissect.decoder.common import (
    _CTRL_TAGGED_LAST,
    _CTRL_UNTAGGED_LAST,
    _FAST_INVALIDATE_OPS,
    _FAST_SEND_OPS,
    _FAST_TAGGED,
    _FAST_TAGGED_OPS,
    _FAST_UNTAGGED,
    _HOLD_LIMIT,
    _LAYOUTS,
    _LE32,
    _MARKER_UNPACK,
    _MPA_HDR,
    _TAGGED_UNPACK,
    _U32,
    _UNTAGGED_UNPACK,
    _ZEROS,
)
from stack.dissect.decoder.modes import Cause, Mode, next_mode
from stack.dissect.decoder.records import DirectionInfo, PduRecord, SegmentView
from stack.dissect.decoder.resync import Resync
from stack.errors import ProtocolError
from stack.wire.checker import Finding
from stack.wire.framing import fpdu_layout, unmarked_body

if TYPE_CHECKING:
    from stack.dissect.decoder.connection import ConnectionDecoder

_LE32_UNPACK = _LE32.unpack_from
_BE32_UNPACK = _U32.unpack_from
_PAD_MASKS = (0, 0xFF, 0xFFFF, 0xFFFFFF)
"""The PAD bytes of a big-endian word ending where the PAD ends, by PAD length (MPA-04)."""
_FPDU = Mode.FPDU  # module globals: an Enum class attribute costs several times more
_DEAD = Mode.DEAD


# ======================================================================================
# Per-direction decoder
# ======================================================================================


class DirectionDecoder(Resync):
    """One direction's byte stream: startup frame, then FPDUs (see module docstring)."""

    bulk = True
    """Use :meth:`walk_plain` in Full Operation (tests turn it off to compare both paths)."""

    def __init__(self, conn: ConnectionDecoder, side: int) -> None:
        self.conn = conn
        self.side = side
        self.mode = Mode.START
        self.chunks: list[bytes | bytearray | memoryview] = []
        self.buffered = 0
        self.need = MPA_KEY_LEN
        self.base = 0  # stream offset of the first buffered byte
        self.ends: deque[tuple[int, int, float]] = deque()  # (end offset, frame, ts)
        self.crc: bool | None = None
        self.markers: bool | None = None
        self.seq_start = 0
        self.aligned = False  # FPDU starts are known to be 4-aligned to seq_start
        self.seq = DirectionChecks(known=False)  # True once Full Operation starts in view
        self.searched = 0
        self._scan_base = -1
        self._bulk: tuple | None = None  # walk_plain's per-direction constants
        self._scan: dict[tuple[bool, bool], set[int] | int] = {}
        self._cut_upto: dict[int, int] = {}
        self.candidates_tried = 0
        self._tries_left = 0
        self._wants = 0
        self._phase_wake: dict[bool, list[tuple[int, int]]] = {}
        self._phase_found: dict[bool, dict[int, int]] = {}
        self._early: dict[tuple[bool, int], list] = {}
        self._grow: bytearray | None = None
        """The searched bytes, appended to in place while a search waits for more."""
        self.sent_request = False
        self.info = DirectionInfo()

    def enter(self, cause: Cause) -> None:
        """Change mode by the transition table (:data:`~.modes.TRANSITIONS`)."""
        self.mode = next_mode(self.mode, cause)

    # ---- buffering ------------------------------------------------------------------
    def push(
        self, data: bytes | bytearray | memoryview, offset: int, frame: int, ts: float
    ) -> None:
        chunks = self.chunks
        if not chunks:
            self.base = offset
            chunks.append(data)
        elif chunks[0] is self._grow and len(chunks) == 1:
            try:  # a waiting search's bytes: appended in place, no object per segment
                chunks[0] += data
            except BufferError:  # pragma: no cover - a view of them is still held
                chunks.append(data)
        else:
            chunks.append(data)
        self.buffered += len(data)
        self.ends.append((offset + len(data), frame, ts))
        if self.mode is _DEAD:
            self.info.undecoded_bytes += len(data)
            self._drop_all()
            return
        if self.buffered >= self.need:
            if self.mode is _FPDU and self.bulk:
                # the waiting partial FPDU is now complete: walk the joined bytes in bulk
                joined = self._joined()
                base = self.base
                self.chunks = []
                self.buffered = 0
                self.ends.clear()
                self.walk_plain(joined, base, frame, ts)
                return
            self.run(False)

    def _joined(self) -> memoryview:
        chunks = self.chunks
        if len(chunks) == 1:
            buf = chunks[0]
            return buf if isinstance(buf, memoryview) else memoryview(buf)
        if self.mode is Mode.SEARCH:
            # a search waiting for more bytes: the new ones are appended to the searched
            # ones in place (joining them all again per segment is quadratic in tiny ones)
            grow = self._grow
            if grow is not None and chunks[0] is grow:
                try:
                    for chunk in chunks[1:]:
                        grow += chunk
                except BufferError:  # a view of it is still held: copy it once
                    grow = None
            if grow is None or chunks[0] is not grow:
                grow = self._grow = bytearray().join(chunks)
            self.chunks = [grow]
            return memoryview(grow)
        joined = b"".join(chunks)
        self.chunks = [joined]
        return memoryview(joined)

    def _consume(self, n: int) -> None:
        """Drop the first ``n`` buffered bytes."""
        if not n:
            return
        if n == self.buffered:
            self._drop_all()
            return
        buf = self._joined()
        rest = buf[n:]
        self.chunks = [rest] if len(rest) else []
        self.buffered -= n
        self.base += n
        ends = self.ends
        while ends and ends[0][0] <= self.base:
            ends.popleft()

    def _drop_all(self) -> None:
        self.base += self.buffered
        if self.chunks:
            self.chunks = []
            self._grow = None
        self.buffered = 0
        if self.ends:
            self.ends.clear()

    def _frame_at(self, end: int) -> tuple[int, float]:
        ends = self.ends
        if len(ends) == 1:
            e, frame, ts = ends[0]
            if e >= end:
                return frame, ts
        for e, frame, ts in ends:
            if e >= end:
                return frame, ts
        last = self.ends[-1] if self.ends else (0, self.conn.last_frame, 0.0)
        return last[1], last[2]

    # ---- gaps -----------------------------------------------------------------------
    def gap(self, offset: int, length: int, frame: int) -> None:
        self.info.gap_bytes += length
        lost = self.buffered
        self._drop_all()
        self.base = offset + length
        what = f"TCP gap: {length} bytes never captured at offset {offset}"
        if lost:
            what += f"; {lost} buffered bytes of a partial PDU dropped"
        self.conn.note(self.side, frame, "gap", what, offset)
        if self.mode in (Mode.FPDU, Mode.SEARCH):
            if self.mode is Mode.FPDU:
                self.conn.pending_findings[self.side].append(Finding("TCP-GAP", what))
            self.enter(Cause.GAP)
            self.searched = 0
            self.seq.forget()
            self.need = 1
        elif self.mode in (Mode.START, Mode.HOLD):
            self.enter(Cause.GAP)
            self.aligned = False
            self.searched = 0
            self.seq.forget()
            self.need = 1

    def finish(self, frame: int) -> None:
        if self.buffered and self.mode is not Mode.DEAD:
            self.run(True)
        if self.buffered:
            if self.mode is not Mode.DEAD:
                self.conn.note(
                    self.side,
                    frame,
                    "trailing",
                    f"{self.buffered} bytes at the end of the stream do not complete a PDU",
                    self.base,
                )
            self.info.undecoded_bytes += self.buffered
            self._drop_all()

    # ---- main loop ------------------------------------------------------------------
    def run(self, final: bool) -> None:
        while self.buffered:
            mode = self.mode
            if mode is _FPDU:
                if not self._walk():
                    return
            elif mode is Mode.START:
                if not self._startup(final):
                    return
            elif mode is Mode.SEARCH:
                if not self._search(final):
                    return
            elif mode is Mode.HOLD and self.buffered >= _HOLD_LIMIT:
                self._no_reply()
            else:  # hold, dead
                return

    def hold(self) -> None:
        """This direction sent its MPA Request: what follows waits for the Reply's settings
        (HOLD), copied into one buffer as it arrives, up to :data:`_HOLD_LIMIT` bytes."""
        self.enter(Cause.REQUEST)
        self.seq_start = self.base
        grow = self._grow = bytearray(self._joined()) if self.buffered else bytearray()
        self.chunks = [grow]
        self.need = _HOLD_LIMIT

    def _no_reply(self) -> None:
        """The held bytes reached :data:`_HOLD_LIMIT` and no Reply is in view: stop waiting
        for its settings and search for the FPDUs, which begin at SeqStart (RFC 5044
        §7.1.2), detecting markers (and CRC unless the Request asked for it)."""
        conn = self.conn
        conn.note(
            self.side,
            self._frame_at(self.base + 1)[0],  # where the held bytes begin
            "no_reply",
            f"{self.buffered} bytes after the MPA Request and no Reply in view: "
            "searching for FPDUs without its settings",
            self.base,
        )
        self.enter(Cause.NO_REPLY)
        req = conn.request if conn.initiator == self.side else None
        if conn.opts.crc is None and req is not None and req.crc:
            self.crc = True  # asked for by the Request, so negotiated (RFC 5044 §7.1.1)
        self.aligned = True  # the first FPDU starts at the base, SeqStart
        self.searched = 0
        self.need = 1

    def late_reply(self, crc: bool, markers: bool) -> None:
        """The MPA Reply came after this direction's held bytes went to the search
        (:meth:`_no_reply`): its settings (RFC 5044 §7.1.1, M and C) apply from where the
        direction stands.  A search still at SeqStart frames the held bytes from there,
        as if the Reply had come in time (§7.1.2); one past it (bytes given up, a gap)
        searches with the known settings only; FPDUs already found are checked with the
        negotiated CRC setting from now on (their framing stays as found)."""
        self.crc = crc
        self.info.crc = crc
        if self.mode is not Mode.SEARCH:
            return
        self.markers = markers
        self.info.markers = markers
        self.conn.dissector.searching.discard(self)
        if self.aligned and self.base == self.seq_start:
            self.enter(Cause.FULL_OPERATION)
            self.info.seq_start = self.seq_start
            self.seq.known = True
            self.need = MPA_MARKER_LEN + 2 if markers else 2
        if self.buffered:
            self.run(False)

    # ---- startup frames -------------------------------------------------------------
    def _startup(self, final: bool) -> bool:
        conn = self.conn
        if self.base != 0 or not conn.tcp.halves[self.side].syn_seen:
            return self._begin_midstream()
        buf = self._joined()
        if len(buf) < MPA_KEY_LEN:
            self.need = MPA_KEY_LEN
            return False
        key = bytes(buf[:MPA_KEY_LEN])
        if key not in (MPA_KEY_REQ, MPA_KEY_REP):
            if conn.opts.mid_stream:
                return self._begin_midstream()
            if conn.request is not None and conn.initiator != self.side:
                why = "the answer to the MPA Request is not an MPA Reply (MPA-18)"
            else:
                why = "the connection does not start with an MPA Request"
            conn.not_iwarp(self, why, both=True)
            return False
        if len(buf) < MPA_FRAME_HEADER_LEN:
            self.need = MPA_FRAME_HEADER_LEN
            return False
        _, flags, rev, pd_len = _MPA_HDR.unpack_from(buf)
        total = MPA_FRAME_HEADER_LEN + pd_len
        if len(buf) < total:
            if pd_len > conn.opts.max_private_data and not final:
                # malformed: a receiver would close now; still show what arrived
                pass
            self.need = total
            if not final:
                return False
            total = len(buf)
        frame_no, ts = self._frame_at(self.base + total)
        raw = bytes(buf[:total])
        offset = self.base
        self._consume(total)
        conn.startup_frame(self, key == MPA_KEY_REP, raw, offset, flags, rev, pd_len, frame_no, ts)
        return True

    def _begin_midstream(self) -> bool:
        self.enter(Cause.MIDSTREAM)
        self.seq.forget()
        self.conn.midstream(self)
        self.need = 1
        return True

    def enter_fpdu(self, crc: bool, markers: bool) -> None:
        """Full Operation starts at the current base (RFC 5044 §7.1.2)."""
        self.crc = crc
        self.markers = markers
        self.seq_start = self.base
        self.aligned = True
        self.info.crc = crc
        self.info.markers = markers
        self.info.seq_start = self.base
        self.enter(Cause.FULL_OPERATION)
        self.seq.known = True
        self.need = MPA_MARKER_LEN + 2 if markers else 2

    # ---- FPDU walk ------------------------------------------------------------------
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
                self,
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
