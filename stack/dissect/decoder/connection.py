"""One TCP connection: MPA state of both directions, startup frames, FPDU records."""

from __future__ import annotations

import struct
from typing import TYPE_CHECKING

from stack.constants import (
    MPA_FPDUPTR_MASK,
    MPA_FRAME_HEADER_LEN,
    MPA_RESERVED_MASK,
    MULPDU_MAX,
    TERM_LLP_CRC_ERROR,
    TERM_LLP_INVALID_STARTUP,
    TERM_LLP_MARKER_MISMATCH,
    TERM_LLP_NO_MATCHING_RTR,
    MpaFlag,
    Opcode,
    RtrType,
)
from stack.dissect.decoder.common import _U32, _endpoint
from stack.dissect.decoder.modes import Cause, Mode
from stack.dissect.decoder.records import Note, PduRecord, SegmentView, StreamInfo
from stack.dissect.decoder.walker import DirectionDecoder
from stack.dissect.tcp import (
    Connection,
    Gap,
    OverlapConflict,
    Retransmission,
    StreamData,
    StreamEnd,
    StreamEvent,
)
from stack.errors import MpaError, ProtocolError
from stack.wire.checker import Checker, Finding
from stack.wire.events import (
    MpaFrame,
    ReadRequest,
)
from stack.wire.mpa_frames import decode_frame
from stack.wire.mpa_rules import StartupContext, check_startup_frame

if TYPE_CHECKING:
    from stack.dissect.decoder.dissector import Dissector


# ======================================================================================
# Per-connection tracker
# ======================================================================================


class ConnectionDecoder:
    """MPA state of one TCP connection and its two directions."""

    def __init__(self, dissector: Dissector, tcp: Connection) -> None:
        self.dissector = dissector
        self.emit = dissector._out.append
        self.tcp = tcp
        self.opts = dissector.options
        self.rfc7306 = self.opts.rfc7306
        self.siw_layout = self.opts.siw_layout
        self.stream = tcp.stream
        self.halves = (DirectionDecoder(self, 0), DirectionDecoder(self, 1))
        self.initiator: int | None = None  # side that sent the Request
        self.request: MpaFrame | None = None
        self.request_word = 0
        self.reply: MpaFrame | None = None
        self.reply_word = 0
        self.last_frame = tcp.first_frame
        self.first_fpdu_frame: list[int | None] = [None, None]
        self.pending_findings: tuple[list[Finding], list[Finding]] = ([], [])
        self.names = [_endpoint(*tcp.endpoints[0]), _endpoint(*tcp.endpoints[1])]
        self.info = StreamInfo(self.stream, (self.names[0], self.names[1]))
        self._synced = [False, False]
        for side in (0, 1):
            self.halves[side].info.src = self.names[side]
            self.halves[side].info.dst = self.names[1 - side]

    # ---- naming ---------------------------------------------------------------------
    def initiator_side(self) -> int:
        if self.initiator is not None:
            return self.initiator
        hint = self.opts.initiator
        if hint is not None:
            for side in (0, 1):
                if self.tcp.endpoints[side] == hint:
                    return side
        return 0

    def direction(self, side: int) -> str:
        return "i2r" if side == (self.initiator if self.initiator is not None else
                                 self.initiator_side()) else "r2i"  # fmt: skip

    def stated_markers(self, side: int) -> bool | None:
        return self.opts.markers_i2r if self.direction(side) == "i2r" else self.opts.markers_r2i

    def ever_synced(self, side: int) -> bool:
        return self._synced[side]

    def note(self, side: int, frame: int, kind: str, detail: str, offset: int = 0) -> None:
        self.emit(Note(self.stream, frame, self.direction(side), kind, detail, offset))

    def not_iwarp(self, half: DirectionDecoder, why: str, both: bool = False) -> None:
        """Stop decoding ``half`` (and its peer when ``both``): not MPA traffic."""
        for h in (half, self.halves[1 - half.side]) if both else (half,):
            h.enter(Cause.ENDED)
            h.info.undecoded_bytes += h.buffered
            h._drop_all()
        if self.info.state in ("start", "midstream") and not any(self._synced):
            self.info.state = "not_iwarp"
        self.note(half.side, self.last_frame, "not_iwarp", f"not iWARP: {why}", half.base)

    def midstream(self, half: DirectionDecoder) -> None:
        if self.info.state == "start":
            self.info.state = "midstream"

    # ---- startup --------------------------------------------------------------------
    def startup_frame(
        self,
        half: DirectionDecoder,
        is_reply: bool,
        raw: bytes,
        offset: int,
        flags: int,
        rev: int,
        pd_len: int,
        frame: int,
        ts: float,
    ) -> None:
        side = half.side
        findings: list[Finding] = []
        pd = bytes(raw[MPA_FRAME_HEADER_LEN:])
        decoded: tuple[MpaFrame, int] | None = None
        try:
            decoded = decode_frame(raw, max_private_data=0xFFFF)
        except MpaError as exc:
            findings.append(Finding(exc.rule, exc.detail, exc.term))
        if decoded is not None:
            mpa = decoded[0]
        else:  # malformed or cut short: show the fields as sent
            mpa = MpaFrame(
                reply=is_reply,
                markers=bool(flags & MpaFlag.MARKERS),
                crc=bool(flags & MpaFlag.CRC),
                reject=bool(flags & MpaFlag.REJECT),
                rev=rev,
                ird_ord=None,
                private_data=pd,
                reserved=flags & (MpaFlag.ENHANCED | MPA_RESERVED_MASK),
            )
        ird_ord = mpa.ird_ord
        enhanced = mpa.enhanced
        word = _U32.unpack_from(pd)[0] if enhanced else 0
        # --- MPA-18..26, ERC checks
        if pd_len > self.opts.max_private_data:
            findings.append(
                Finding(
                    "MPA-21",
                    f"PD_Length {pd_len} exceeds {self.opts.max_private_data}",
                    TERM_LLP_INVALID_STARTUP,
                )
            )
        if len(pd) < pd_len:
            findings.append(
                Finding(
                    "MPA-21",
                    f"PD_Length {pd_len} but only {len(pd)} bytes follow",
                    TERM_LLP_INVALID_STARTUP,
                )
            )
        # the startup rule tables of the MPA engine, run leniently
        if is_reply:
            expect = "request" if self.request is None or self.initiator == side else None
        else:
            expect = "reply" if self.initiator is not None and self.initiator != side else None
        chk = Checker(False)
        chk.findings = findings
        answered = self.request if is_reply and expect is None else None
        check_startup_frame(StartupContext(mpa, expect=expect, request=answered), chk)
        if not is_reply:
            if self.request is None:
                self.initiator = side
                self.request = mpa
                self.request_word = word
                self.info.rev = rev
                self.info.enhanced = enhanced
            half.sent_request = True
            self._emit_startup(
                half, mpa, "mpa_req", raw, offset, flags, rev, pd_len, pd, findings, frame, ts
            )
            half.hold()
            return
        # a Reply
        if expect is not None and self.initiator is None:
            self.initiator = 1 - side
        self.reply = mpa
        self.reply_word = word
        self._emit_startup(
            half, mpa, "mpa_rep", raw, offset, flags, rev, pd_len, pd, findings, frame, ts
        )
        req = self.request
        ini = self.halves[self.initiator] if self.initiator is not None else self.halves[1 - side]
        if mpa.reject:
            self.info.state = "rejected"
            for h in (half, ini):
                h.enter(Cause.ENDED)
                h.info.undecoded_bytes += h.buffered
                h._drop_all()
            self.note(side, frame, "rejected", "connection rejected (R=1); MPA ends here")
            return
        crc = (
            self.opts.crc
            if self.opts.crc is not None
            else (mpa.crc or (req.crc if req is not None else False))
        )
        self.info.state = "fpdu"
        if req is not None and req.ird_ord is not None and ird_ord is not None:
            self.info.p2p = req.ird_ord.p2p and ird_ord.p2p
            self.info.rtr = req.ird_ord.rtr & ird_ord.rtr if self.info.p2p else RtrType.NONE
        # r2i markers were requested by the initiator (Request M); i2r by the responder (Reply M)
        half.enter_fpdu(crc, req.markers if req is not None else False)
        self._synced[side] = True
        if ini is not half and ini.mode in (Mode.HOLD, Mode.START):
            held_base = ini.seq_start if ini.mode is Mode.HOLD else ini.base
            ini.enter(Cause.FULL_OPERATION)
            ini.crc = crc
            ini.markers = mpa.markers
            ini.seq_start = held_base
            ini.aligned = True
            ini.info.crc = crc
            ini.info.markers = mpa.markers
            ini.info.seq_start = held_base
            ini.seq.known = True
            ini.need = 2
            self._synced[ini.side] = True
            if ini.buffered:
                ini.run(False)
            else:
                ini._drop_all()  # the empty hold buffer
        elif ini is not half and ini.sent_request and ini.mode in (Mode.SEARCH, Mode.FPDU):
            self._synced[ini.side] = True
            ini.late_reply(crc, mpa.markers)

    def _emit_startup(
        self,
        half: DirectionDecoder,
        mpa: MpaFrame,
        kind: str,
        raw: bytes,
        offset: int,
        flags: int,
        rev: int,
        pd_len: int,
        pd: bytes,
        findings: list[Finding],
        frame: int,
        ts: float,
    ) -> None:
        side = half.side
        rec = PduRecord(
            self.stream,
            frame,
            ts,
            self.direction(side),
            self.names[side],
            self.names[1 - side],
            kind,
            offset,
            len(raw),
            findings,
            mpa=mpa,
            mpa_flags=flags,
            rev=rev,
            pd_len=pd_len,
            private_data=pd,
        )
        half.info.pdus += 1
        half.info.wire_bytes += len(raw)
        self.last_frame = max(self.last_frame, frame)
        self.emit(rec)

    # ---- FPDUs ----------------------------------------------------------------------
    def fpdu(
        self,
        half: DirectionDecoder,
        offset: int,
        wire: int,
        ulen: int,
        crc_ok: bool | None,
        crc_field: int,
        crc_value: int,
        pad: bytes,
        buf: memoryview,
        pos: int,
        lead: int,
        marks: tuple[int, ...],
        ulpdu: bytes | memoryview,
        frame: int,
        ts: float,
    ) -> None:
        side = half.side
        self._synced[side] = True
        pending = self.pending_findings[side]
        findings: list[Finding] = pending[:] if pending else []
        if pending:
            pending.clear()
        if crc_ok is False:
            findings.append(
                Finding(
                    "MPA-12",
                    f"CRC 0x{crc_field:08X} on the wire, computed 0x{crc_value:08X}",
                    TERM_LLP_CRC_ERROR,
                )
            )
        ptrs: tuple[int, ...] = ()
        offsets: tuple[int, ...] = ()
        reserved: tuple[int, ...] = ()
        if marks:
            ptr_list = []
            res_list = []
            for m in marks:
                res, ptr = struct.unpack_from(">HH", buf, pos + m)
                ptr_list.append(ptr)
                res_list.append(res)
                want = 0 if (m == 0 and lead) else m - lead
                if res:
                    findings.append(Finding("MPA-06", f"marker RESERVED 0x{res:04X} is not 0"))
                if ptr & 3:
                    findings.append(Finding("MPA-06", f"FPDUPTR 0x{ptr:04X} has low bits set"))
                if ptr & MPA_FPDUPTR_MASK != want:
                    findings.append(
                        Finding(
                            "MPA-08",
                            f"marker at offset {offset + m} has FPDUPTR {ptr}, expected {want}",
                            TERM_LLP_MARKER_MISMATCH,
                        )
                    )
            ptrs = tuple(ptr_list)
            reserved = tuple(res_list)
            offsets = tuple(offset + m for m in marks)
        if pad and any(pad):
            findings.append(Finding("MPA-04", f"PAD bytes {pad.hex()} are not zero"))
        if ulen > MULPDU_MAX:
            findings.append(Finding("MPA-02", f"ULPDU_Length {ulen} exceeds {MULPDU_MAX}"))
        segment: SegmentView | None
        try:
            segment = SegmentView(ulpdu, self.rfc7306, self.siw_layout)
        except ProtocolError as exc:
            segment = None
            findings.append(Finding(exc.rule, exc.detail, exc.term))
        seq = half.seq
        if segment is not None:
            if segment.findings:
                findings.extend(segment.findings)
            seq.check(segment, findings, self.halves[1 - side].seq)
            if self.first_fpdu_frame[side] is None:
                self._first_fpdu_checks(side, segment, frame, findings)
            half.info.payload_bytes += len(segment.payload)
        rec = PduRecord(
            self.stream,
            frame,
            ts,
            self.direction(side),
            self.names[side],
            self.names[1 - side],
            "fpdu",
            offset,
            wire,
            findings,
            None,
            0,
            0,
            0,
            b"",
            ulen,
            crc_ok,
            crc_field,
            crc_value,
            pad,
            offsets,
            ptrs,
            reserved,
            segment,
            ulpdu,
        )  # positional: keyword calls cost several times more on this hot path
        info = half.info
        info.pdus += 1
        info.fpdus += 1
        info.wire_bytes += wire
        info.ulpdu_bytes += ulen
        if frame > self.last_frame:
            self.last_frame = frame
        self.emit(rec)

    def _first_fpdu_checks(
        self, side: int, seg: SegmentView, frame: int, findings: list[Finding]
    ) -> None:
        """MPA-25 (responder waits for the initiator's first FPDU) and ERC-09 (RTR)."""
        if self.first_fpdu_frame[side] is not None:
            return
        self.first_fpdu_frame[side] = frame
        if self.request is None or self.reply is None or self.initiator is None:
            return
        if side != self.initiator:
            if self.first_fpdu_frame[self.initiator] is None:
                findings.append(
                    Finding("MPA-25", "responder sent an FPDU before the initiator's first FPDU")
                )
            return
        if not self.info.p2p:
            return
        rtr = self.info.rtr
        op = seg.opcode
        if op == Opcode.TERMINATE and not rtr:
            return  # no RTR in common: a Terminate is the initiator's required answer (ERC-09)
        zero = seg.ulpdu_len - seg.ddp_header_len == 0
        ok = (
            (op == Opcode.SEND and zero and rtr & RtrType.SEND)
            or (op == Opcode.RDMA_WRITE and zero and rtr & RtrType.WRITE)
            or (
                op == Opcode.RDMA_READ_REQUEST
                and isinstance(seg.header, ReadRequest)
                and seg.header.size == 0
                and rtr & RtrType.READ
            )
        )
        if not ok:
            findings.append(
                Finding(
                    "ERC-09",
                    f"first FPDU of a P2P connection is not a negotiated RTR ({rtr!r})",
                    TERM_LLP_NO_MATCHING_RTR,
                )
            )

    # ---- TCP events -----------------------------------------------------------------
    def events(self, side: int, events: list[StreamEvent], ts: float) -> None:
        half = self.halves[side]
        if len(events) == 1 and type(events[0]) is StreamData:  # the common case
            one = events[0]
            if one.frame > self.last_frame:
                self.last_frame = one.frame
            half.push(one.data, one.offset, one.frame, ts)
            return
        ended = False
        for ev in events:
            if type(ev) is StreamData:
                if ev.frame > self.last_frame:
                    self.last_frame = ev.frame
                half.push(ev.data, ev.offset, ev.frame, ts)
            elif type(ev) is Gap:
                half.gap(ev.offset, ev.length, ev.frame)
            elif type(ev) is Retransmission:
                half.info.retransmitted_bytes += ev.length
            elif type(ev) is OverlapConflict:
                half.info.retransmitted_bytes += ev.length
                self.note(
                    side,
                    ev.frame,
                    "conflict",
                    f"retransmitted bytes at offset {ev.offset} (+{ev.length}) differ from the "
                    "first copy (kept)",
                    ev.offset,
                )
            elif type(ev) is StreamEnd:
                half.finish(ev.frame)
                ended = True
        if ended and self.tcp.finished:
            self.release()

    def release(self) -> None:
        """Both directions ended (FIN reached or RST, RFC 793 §3.5) and every byte is
        decoded: the dissector keeps only a :class:`FinishedConnection` (the statistics)
        and the TCP halves free their rings."""
        tcp = self.tcp
        if any(h._pending for h in tcp.halves) or any(
            h.buffered or h in self.dissector.searching for h in self.halves
        ):
            return
        for tcp_half in tcp.halves:
            tcp_half.release()
        self.dissector.retire(self, FinishedConnection(self))

    def finish(self, frame: int) -> None:
        for half in self.halves:
            if half.mode is Mode.HOLD:
                # a Request never answered: its sender's later bytes cannot be framed
                if half.buffered:
                    self.note(
                        half.side,
                        frame,
                        "trailing",
                        f"{half.buffered} bytes after an unanswered MPA Request",
                        half.base,
                    )
                    half.info.undecoded_bytes += half.buffered
                    half._drop_all()
                continue
            half.finish(frame)
        self._settle()

    def _settle(self) -> None:
        """Put each direction's counters into the stream's statistics."""
        for side in (0, 1):
            info = self.halves[side].info
            info.retransmitted_bytes = max(
                info.retransmitted_bytes, self.tcp.halves[side].retransmitted_bytes
            )
            self.info.directions[self.direction(side)] = info


class FinishedConnection:
    """What the dissector keeps of a connection once both directions ended and every byte
    was decoded: its statistics (``info``).  Segments that still come are counted (a
    resend, a gap); bytes after the end are counted and noted, not decoded."""

    __slots__ = ("info", "stream", "tcp", "emit", "names", "infos")

    def __init__(self, conn: ConnectionDecoder) -> None:
        conn._settle()
        self.info = conn.info
        self.stream = conn.stream
        self.tcp = conn.tcp
        self.emit = conn.emit
        self.names = (conn.direction(0), conn.direction(1))
        self.infos = (conn.halves[0].info, conn.halves[1].info)

    def events(self, side: int, events: list[StreamEvent], ts: float) -> None:
        info = self.infos[side]
        for ev in events:
            if type(ev) is StreamData:
                size = len(ev.data)
                info.undecoded_bytes += size
                detail = f"{size} bytes after the connection ended, not decoded"
                self._note(side, ev.frame, "after_end", detail, ev.offset)
            elif type(ev) is Gap:
                info.gap_bytes += ev.length
                detail = f"TCP gap: {ev.length} bytes never captured at offset {ev.offset}"
                self._note(side, ev.frame, "gap", detail, ev.offset)
            elif type(ev) is Retransmission:
                info.retransmitted_bytes += ev.length
            elif type(ev) is OverlapConflict:
                info.retransmitted_bytes += ev.length
                detail = (f"retransmitted bytes at offset {ev.offset} (+{ev.length}) differ "
                          "from the first copy (kept)")  # fmt: skip
                self._note(side, ev.frame, "conflict", detail, ev.offset)

    def _note(self, side: int, frame: int, kind: str, detail: str, offset: int) -> None:
        self.emit(Note(self.stream, frame, self.names[side], kind, detail, offset))

    def finish(self, frame: int) -> None:
        for side in (0, 1):
            info = self.infos[side]
            info.retransmitted_bytes = max(
                info.retransmitted_bytes, self.tcp.halves[side].retransmitted_bytes
            )
