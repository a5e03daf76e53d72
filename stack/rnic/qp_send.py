"""The send queue engine of a queue pair: posting, ORD and fences, outbound messages.

Work requests are processed in order (RFC 5040 §5.5 rule 13); a Read or atomic waits at
the head while ORD credits are used up (RDMAP-14), a fenced WR for every earlier Read and
atomic.  Payloads are memoryviews of registered memory read when the transport encodes
them; queued Read Responses are snapshotted before a later placement could show through.
"""

from __future__ import annotations

from collections.abc import Callable

from stack.constants import (
    ALL_ONES_32,
    ALL_ONES_64,
    DDP_TAGGED_HDR_LEN,
    DDP_UNTAGGED_HDR_LEN,
    TERM_RDMAP_CATASTROPHIC,
    AtomicOpcode,
)
from stack.errors import LocalError, RdmapError
from stack.rnic.chain_checks import check_deferred
from stack.rnic.chain_items import LocalAtomic
from stack.rnic.chains import Chain, ChainQueue
from stack.rnic.memory import (
    MemoryOpError,
    MemoryRegion,
    local_invalidate,
)
from stack.rnic.qp_base import (
    _CLOSING,
    _FAILED,
    _FENCE,
    _INLINE,
    _LOCAL_WRITE,
    _NEEDS_ORD,
    _READS,
    _RTS,
    _SENDING,
    _SOLICITED,
    QpBase,
    QpState,
    _imm_bytes,
    _LocalWrError,
    _OutItem,
    _SqEntry,
)
from stack.rnic.verbs import (
    MwBindInfo,
    RecvWR,
    SendFlags,
    SendWR,
    Sge,
    WcOpcode,
    WcStatus,
    WrOpcode,
)
from stack.rnic.windows import MemoryWindow, execute_bind, execute_reg_mr, post_type1_bind
from stack.wire.events import (
    AtomicRequest,
    ImmediateData,
    MessagePart,
    OutboundMessage,
    RdmapEvent,
    RdmapMessage,
    RdmaWrite,
    ReadRequest,
    ReadRequestReceived,
    ReadResponse,
    Send,
)

_WIDE_FIELDS = (
    WrOpcode.ATOMIC_FETCH_AND_ADD,
    WrOpcode.ATOMIC_CMP_AND_SWP,
    WrOpcode.SEND_WITH_INV,
)
"""Opcodes with operands beyond rkey and remote_addr that _check_wr checks at posting."""
_DATA_MESSAGES = (RdmaWrite, ReadResponse, Send)  # their payload counts against a limit
# Opcodes as module globals (an ``Enum.MEMBER`` lookup is slow, see qp_base._RTS).
_RDMA_WRITE = WrOpcode.RDMA_WRITE
_SENDS = (WrOpcode.SEND, WrOpcode.SEND_WITH_INV)
_SEND_WITH_INV = WrOpcode.SEND_WITH_INV
_SEND_IMM = WrOpcode.SEND_IMM
_RDMA_WRITE_WITH_IMM = WrOpcode.RDMA_WRITE_WITH_IMM
_ATOMICS = (WrOpcode.ATOMIC_FETCH_AND_ADD, WrOpcode.ATOMIC_CMP_AND_SWP)
_FETCH_AND_ADD = WrOpcode.ATOMIC_FETCH_AND_ADD
_AOP_FETCH_ADD = AtomicOpcode.FETCH_ADD
_LOCAL_INV = WrOpcode.LOCAL_INV
_BIND_MW = WrOpcode.BIND_MW
_REG_MR = WrOpcode.REG_MR


class QpSend(QpBase):
    """Posting and the send queue engine (see :class:`stack.rnic.qp.QueuePair`)."""

    # ------------------------------------------------------------------ state
    def set_rts(self) -> None:
        """The stream entered RDMA mode (connection established)."""
        if self.state is QpState.IDLE:
            self.state = QpState.RTS
            self._progress_sq()

    def release_ord_reservation(self) -> None:
        """The connection's own Read (the RTR) was answered: its ORD credit is free."""
        if self.ord_reserved:
            self.ord_reserved -= 1
            if self.state in _SENDING:
                self._progress_sq()

    # ------------------------------------------------------------------ posting
    def post_recv(self, wr: RecvWR | list[RecvWR]) -> None:
        """Post receive WRs (``ibv_post_recv``); flushed at once when the QP is in error."""
        if self.srq is not None:
            raise LocalError("QP uses an SRQ: post receives to the SRQ")
        wrs = wr if isinstance(wr, list) else [wr]
        for one in wrs:
            if len(one.sg_list) > self.cap.max_recv_sge:
                raise LocalError(f"receive WR {one.wr_id} has more than max_recv_sge SGEs")
        if self.state in _FAILED or self._peer_closed:
            for one in wrs:
                self._complete_recv(one, WcStatus.WR_FLUSH_ERR, WcOpcode.RECV)
            return
        if len(self._rq) + len(wrs) > self.cap.max_recv_wr:
            raise LocalError(f"receive queue full ({self.cap.max_recv_wr} WRs)")
        self._rq.extend(wrs)

    def post_send(self, wr: SendWR | list[SendWR]) -> None:
        """Post send WRs (``ibv_post_send``); a list is a post list, processed in order."""
        wrs = wr if isinstance(wr, list) else [wr]
        max_sge = self.cap.max_send_sge
        entries = []
        for one in wrs:
            flags = int(one.send_flags)
            if (
                len(one.sg_list) > max_sge
                or flags & _INLINE
                or not 0 <= one.rkey <= ALL_ONES_32
                or not 0 <= one.remote_addr <= ALL_ONES_64
                or one.opcode in _WIDE_FIELDS
            ):
                self._check_wr(one)  # only WRs that may break a capacity or a field width
            entries.append(_SqEntry(one, flags))
        if self.state in _FAILED:  # TERMINATE as IBV_QPS_SQE, ERROR as IBV_QPS_ERR: flushed
            for entry in entries:
                self._push_wc(self.send_cq, self._wc(entry, WcStatus.WR_FLUSH_ERR))
            return
        if self.state is _CLOSING:
            raise LocalError(f"QP {self.qp_num} is closing: no new work requests")
        if len(self._pending) + len(self._inflight) + len(wrs) > self.cap.max_send_wr:
            raise LocalError(f"send queue full ({self.cap.max_send_wr} WRs)")
        self._pending.extend(entries)
        if self.state is _RTS:
            self._progress_sq()

    def _check_wr(self, wr: SendWR) -> None:
        """A send WR against the QP's capacities and the widths of the wire fields it fills
        (STags 32 bits, TOs and atomic operands 64, RFC 5040 §4, RFC 7306 §4): LocalError
        at posting, as ``ibv_post_send`` refuses a bad WR, not an encoding error later."""
        if (
            0 <= wr.rkey <= ALL_ONES_32
            and 0 <= wr.remote_addr <= ALL_ONES_64
            and 0 <= wr.invalidate_rkey <= ALL_ONES_32
            and 0 <= wr.compare_add <= ALL_ONES_64
            and 0 <= (wr.compare_add_mask or 0) <= ALL_ONES_64
            and 0 <= wr.swap <= ALL_ONES_64
            and 0 <= wr.swap_mask <= ALL_ONES_64
            and len(wr.sg_list) <= self.cap.max_send_sge
            and not int(wr.send_flags) & _INLINE
        ):
            return  # the usual WR (an atomic's operands), in one test
        for name, value, mask in (
            ("rkey", wr.rkey, ALL_ONES_32),
            ("remote_addr", wr.remote_addr, ALL_ONES_64),
            ("invalidate_rkey", wr.invalidate_rkey, ALL_ONES_32),
            ("compare_add", wr.compare_add, ALL_ONES_64),
            ("compare_add_mask", wr.compare_add_mask or 0, ALL_ONES_64),
            ("swap", wr.swap, ALL_ONES_64),
            ("swap_mask", wr.swap_mask, ALL_ONES_64),
        ):
            if not 0 <= value <= mask:
                raise LocalError(f"send WR {wr.wr_id}: {name} {value:#x} does not fit its field")
        if len(wr.sg_list) > self.cap.max_send_sge:
            raise LocalError(f"send WR {wr.wr_id} has more than max_send_sge SGEs")
        if int(wr.send_flags) & _INLINE:
            size = len(wr.inline_data or b"") or sum(s.length for s in wr.sg_list)
            if size > self.cap.max_inline_data:
                raise LocalError(f"inline data of WR {wr.wr_id} exceeds max_inline_data")

    def post_chain(self, chain: Chain) -> None:
        """Post a WAIT/ENABLE chain with execution-time patches (:mod:`stack.rnic.chains`)."""
        if self.state in _FAILED or self.state is QpState.CLOSING:
            raise LocalError(f"QP {self.qp_num} takes no chains in state {self.state.value}")
        if self.chains is None:
            self.chains = ChainQueue(self)
        self.chains.post(chain)

    def post_deferred(self, item: LocalAtomic) -> None:
        """Run ``item`` once every receive the chain queue has taken by now has been
        examined (a deferred LocalAtomic posted by the application, :mod:`stack.rnic.chains`);
        LocalError if the QP has no chain queue or the item cannot run."""
        if self.chains is None:
            raise LocalError(f"QP {self.qp_num} has no chain queue to defer to")
        check_deferred(item)
        self.chains.defer(item)

    def enable_chains(self, count: int | None = None) -> None:
        """ENABLE: resume the chain queue after a fallback, release ``count`` held chains."""
        if self.chains is not None:
            self.chains.enable(count)

    def _enqueue(self, entries: list[_SqEntry]) -> None:
        """A triggered chain's WRs join the send queue (they hold their own SQ slots)."""
        self._pending.extend(entries)
        if self.state in _SENDING:
            self._progress_sq()

    def bind_mw(
        self,
        mw: MemoryWindow,
        bind_info: MwBindInfo,
        *,
        wr_id: int = 0,
        send_flags: SendFlags = SendFlags.SIGNALED,
    ) -> int:
        """Bind type 1 window ``mw`` (``ibv_bind_mw``, SEC-05): the bind runs in send-queue
        order and completes as ``BIND_MW``; returns the window's new rkey at once."""
        return post_type1_bind(self.post_send, mw, bind_info, wr_id, send_flags)

    # ------------------------------------------------------------------ SQ engine
    def _progress_sq(self) -> None:
        """Turn pending WRs into outbound messages, in order, honouring ORD and fences.

        The transport hears of them once, when all are queued: a post list (or the WRs an
        ORD credit or RTS released) becomes one encode pass and one send."""
        outer, self._batching = self._batching, True
        pending = self._pending
        inflight = self._inflight.append
        try:
            while pending and self.state in _SENDING:
                entry = pending[0]
                wr = entry.wr
                if wr.opcode in _NEEDS_ORD and self.outstanding_remote >= self.ord:
                    break
                if entry.flags & _FENCE and self.outstanding_remote:
                    break
                pending.popleft()
                inflight(entry)
                try:
                    if entry.chain is not None:
                        entry.chain.resolve(entry)  # execution-time patches, checked by _start
                    self._start(entry)
                except (_LocalWrError, MemoryOpError) as exc:
                    entry.status = exc.status
                    entry.done = True
                    self._reap_sq()
                    self.fatal(
                        RdmapError("RDMAP-12", f"WR {wr.wr_id}: {exc}", TERM_RDMAP_CATASTROPHIC),
                        send_terminate=True,
                    )
                    break
            else:  # nothing left, or the QP stopped sending: not held by ORD or a fence
                self._reap_sq()
        finally:
            self._batching = outer
        if not outer and self._output_deferred:
            self._output_deferred = False
            self._notify_output()

    def _start(self, entry: _SqEntry) -> None:
        wr = entry.wr
        op = wr.opcode
        if op is _RDMA_WRITE:  # the most frequent small message first
            sg_list = wr.sg_list
            data: bytes | memoryview
            if len(sg_list) == 1 and wr.inline_data is None and not entry.flags & _INLINE:
                data = self._local(sg_list[0], 0)[1]  # _gather's one-SGE case, one call less
            else:
                data = self._gather(wr)
            entry.byte_len = len(data)
            entry.payload = data
            out = self._out
            out.append(entry)  # its one message, queued as the entry itself (_OutItem)
            if len(out) == 1:
                self._notify_output()
            return
        solicited = bool(entry.flags & _SOLICITED)
        if op in _SENDS:
            data = self._gather(wr)
            entry.byte_len = len(data)
            inval = wr.invalidate_rkey if op is _SEND_WITH_INV else None
            self._emit(entry, [Send(data, solicited, inval)])
        elif op is _SEND_IMM:
            self._emit(entry, [ImmediateData(_imm_bytes(wr.imm_data), solicited)])
        elif op is _RDMA_WRITE_WITH_IMM:
            data = self._gather(wr)
            entry.byte_len = len(data)
            msgs: list[RdmapMessage] = [
                RdmaWrite(wr.rkey, wr.remote_addr, data),
                ImmediateData(_imm_bytes(wr.imm_data), solicited),
            ]
            self._emit(entry, msgs)
        elif op in _READS:
            if len(wr.sg_list) != 1:
                raise _LocalWrError(WcStatus.LOC_QP_OP_ERR, "RDMA Read needs exactly one SGE")
            sge = wr.sg_list[0]
            mr, view = self._local(sge, _LOCAL_WRITE)
            entry.sink, entry.sink_stag, entry.sink_to = view, mr.stag, sge.addr
            self._requests.read_request(mr.stag, sge.addr, sge.length, entry)
            req = ReadRequest(mr.stag, sge.addr, sge.length, wr.rkey, wr.remote_addr)
            self._emit(entry, [req], completes=False)
        elif op in _ATOMICS:
            if len(wr.sg_list) != 1 or wr.sg_list[0].length != 8:
                raise _LocalWrError(WcStatus.LOC_LEN_ERR, "atomics need one 8-byte SGE")
            _mr, view = self._local(wr.sg_list[0], _LOCAL_WRITE)
            entry.sink, entry.byte_len = view, 8
            entry.req_id = self._next_req_id
            self._next_req_id = (self._next_req_id + 1) & 0xFFFFFFFF
            if op is _FETCH_AND_ADD:
                atomic = AtomicRequest(
                    _AOP_FETCH_ADD,
                    entry.req_id,
                    wr.rkey,
                    wr.remote_addr,
                    wr.compare_add,
                    0 if wr.compare_add_mask is None else wr.compare_add_mask,
                )
            else:
                atomic = AtomicRequest.cmp_swap(
                    entry.req_id,
                    wr.rkey,
                    wr.remote_addr,
                    compare=wr.compare_add,
                    swap=wr.swap,
                    compare_mask=(1 << 64) - 1
                    if wr.compare_add_mask is None
                    else wr.compare_add_mask,
                    swap_mask=wr.swap_mask,
                )
            self._requests.atomic_request(entry.req_id, entry)
            self._emit(entry, [atomic], completes=False)
        elif op is _LOCAL_INV:
            local_invalidate(self.table, self.pd, wr.invalidate_rkey)
            entry.done = True
        elif op is _BIND_MW:
            execute_bind(wr.bind_mw, self.pd, self)
            entry.done = True
        elif op is _REG_MR:
            execute_reg_mr(wr.reg_mr, self.pd)
            entry.done = True
        else:  # pragma: no cover - enum is closed
            raise _LocalWrError(WcStatus.LOC_QP_OP_ERR, f"unsupported opcode {op}")

    def _emit(self, entry: _SqEntry, msgs: list[RdmapMessage], completes: bool = True) -> None:
        entry.messages_left = len(msgs) if completes else 0
        was_empty = not self._out
        out = self._out
        express = self.express_send
        if not completes and was_empty and express is not None and express(msgs[0]):
            # A Read or atomic Request with nothing queued ahead, framed at once (it
            # completes with its answer, so nothing waits for it to be taken).
            self._notify_output()
            return
        for msg in msgs:
            out.append(_OutItem(msg, entry) if completes else _OutItem(msg, None, False, entry))
        if was_empty:
            self._notify_output()

    def _local(self, sge: Sge, need: int) -> tuple[MemoryRegion, memoryview]:
        """Validate a local SGE (lkey, PD, rights, bounds) and return its bytes."""
        mr = self.table.lookup(sge.lkey)
        if not isinstance(mr, MemoryRegion) or not mr.valid or mr.pd is not self.pd:
            raise _LocalWrError(WcStatus.LOC_PROT_ERR, f"invalid lkey 0x{sge.lkey:08x}")
        if need & _LOCAL_WRITE and not mr.access_bits & _LOCAL_WRITE:
            raise _LocalWrError(WcStatus.LOC_PROT_ERR, "SGE needs LOCAL_WRITE")
        if sge.length < 0 or sge.addr < mr.base or sge.addr + sge.length > mr.base + mr.length:
            raise _LocalWrError(WcStatus.LOC_PROT_ERR, "SGE outside its memory region")
        return mr, mr.view(sge.addr, sge.length)

    def _gather(self, wr: SendWR) -> bytes | memoryview:
        if wr.inline_data is not None:
            return bytes(wr.inline_data)
        sg_list = wr.sg_list
        if len(sg_list) == 1 and not int(wr.send_flags) & _INLINE:
            return self._local(sg_list[0], 0)[1]
        views = [self._local(sge, 0)[1] for sge in sg_list]
        if int(wr.send_flags) & _INLINE:
            return b"".join(views)
        if len(views) == 1:
            return views[0]
        return b"".join(views)

    # ------------------------------------------------------------------ transport side
    @property
    def has_outgoing(self) -> bool:
        return bool(self._out)

    def take_outgoing(
        self, limit: int, part_mulpdu: Callable[[], int] | None = None
    ) -> list[OutboundMessage]:
        """Take outbound messages, in order, up to about ``limit`` payload bytes (at least
        one; 64 bytes counted per message): the transport encodes and sends them.  A WR
        whose last message is taken completes (in submit order, RFC 5040 §5.5 rule 15).
        The Write of a Write WR comes as its fields
        (:data:`~stack.wire.events.WriteFields`), no message object made for it.

        With ``part_mulpdu`` (the MULPDU to cut for, asked only for such a message; 0
        takes it whole), a Write, Read Response or Send of more than ``limit`` bytes is
        taken in parts of whole segments (:class:`~stack.wire.events.MessagePart`), one
        per call, so the transport never holds more than about ``limit`` bytes of it; the
        rest stays queued as it was (its WR completes with its last part, a Read
        Response's rest is still snapshotted before a placement could show through)."""
        out = self._out
        taken: list[OutboundMessage] = []
        budget = limit
        reap = False
        while out and budget > 0:
            item = out.popleft()
            if isinstance(item, _SqEntry):  # a Write WR's one message (_start)
                data = item.payload
                item.payload = None
                wr = item.wr
                n = len(data)  # type: ignore[arg-type]
                if n > limit and part_mulpdu is not None:
                    # Queued as its message from now on, taken in parts (or whole, for a
                    # send_message hook) as such (below).
                    item.messages_left = 1
                    out.appendleft(_OutItem(RdmaWrite(wr.rkey, wr.remote_addr, data), item))  # type: ignore[arg-type]
                    continue
                taken.append((wr.rkey, wr.remote_addr, data))  # type: ignore[arg-type]
                budget -= n + 64
                item.done = reap = True
                continue
            message = item.message
            if type(message) in _DATA_MESSAGES:
                n = len(message.data)  # type: ignore[union-attr]
                if (
                    n > limit
                    and part_mulpdu is not None
                    and (mulpdu := part_mulpdu())
                    and self._take_message_part(item, budget, mulpdu, taken)
                ):
                    out.appendleft(item)  # the rest, for the next pass
                    break
                budget -= n + 64
                # The rest of a message taken in parts is its last part.
                taken.append(MessagePart(message, item.offset, True) if item.offset else message)  # type: ignore[arg-type]
            else:
                budget -= 64
                taken.append(message)
            if item.inbound_response:
                self._inbound_pending -= 1
                if self._lazy and self._lazy[0] is item:
                    self._lazy.popleft()
                elif item.copied:
                    self._snapshot_held -= item.copied
            entry = item.entry
            if entry is not None:
                entry.messages_left -= 1
                if entry.messages_left == 0:
                    entry.done = reap = True
        if reap:
            self._reap_sq()
        return taken

    def _take_message_part(
        self, item: _OutItem, budget: int, mulpdu: int, taken: list[OutboundMessage]
    ) -> bool:
        """Take the next part of a queued Write, Read Response or Send message: whole
        segments up to ``budget`` bytes (at least one when nothing else was taken, else
        none: the message starts the next pass).  The rest replaces it on the queue (a
        tagged rest starts at its own TO, DDP-03).  False when no part can be cut off (the
        rest is not longer than a segment): the caller takes it whole."""
        message = item.message
        untagged = type(message) is Send
        room = mulpdu - (DDP_UNTAGGED_HDR_LEN if untagged else DDP_TAGGED_HDR_LEN)
        size = budget // room * room
        if not size:
            if taken:
                return True
            size = room
        data = message.data  # type: ignore[union-attr]
        if size >= len(data):
            return False
        view = data if type(data) is memoryview else memoryview(data)
        head: RdmaWrite | ReadResponse | Send
        if isinstance(message, Send):
            head = Send(view[:size], message.solicited, message.invalidate_stag)
            item.message = Send(view[size:], message.solicited, message.invalidate_stag)
        else:
            assert isinstance(message, RdmaWrite | ReadResponse)
            kind = type(message)
            head = kind(message.stag, message.to, view[:size])
            item.message = kind(message.stag, (message.to + size) & ALL_ONES_64, view[size:])
        taken.append(MessagePart(head, item.offset, False))
        item.offset += size
        if item.copied:  # a snapshot going out: no longer counted (must_wait)
            self._snapshot_held -= item.copied
            item.copied = 0
        return True

    def release_answered(self) -> None:
        """The transport drained its output: the IRD slots of the responses the express
        path framed are free (SEC-10, RDMAP-14), as :meth:`take_outgoing` frees a queued
        response's."""
        self._inbound_pending -= self._answered_early
        self._answered_early = 0

    def must_wait(self, event: RdmapEvent) -> bool:
        """Whether applying ``event`` now would make the copies of queued Read Response
        data more than :attr:`max_snapshot_bytes` in all (the responses still view memory,
        and a later placement must not show through them, RFC 5040 §5.5; copies an earlier
        snapshot made and not yet sent count too).  The driver then lets the responses go
        out first: a peer that asks for many large Reads, each followed by a Write, and
        does not read its socket makes this connection hold at most that many bytes, not
        the sum of every Read.  A response already going out in parts does not count: its
        rest is copied, as the transport copies what the socket has not taken, since two
        ends that both wait for their responses to go out would wait for ever."""
        if not self._lazy or type(event) is ReadRequestReceived:
            return False
        queued = self._snapshot_held
        for item in self._lazy:
            if item.offset:  # going out in parts
                continue
            message = item.message
            assert isinstance(message, ReadResponse)
            queued += len(message.data)
            if queued > self.max_snapshot_bytes:
                return True
        return False

    def _queue_response(self, msg: RdmapMessage) -> None:
        was_empty = not self._out
        express = self.express_send
        if was_empty and express is not None and express(msg):
            # Framed at once, nothing queued ahead: no later placement can show through
            # it (RFC 5040 §5.5), and its IRD slot is held until the transport drains the
            # output, as a queued response's is (release_answered).
            self._answered_early += 1
            self._notify_output()
            return
        item = _OutItem(msg, None, inbound_response=True)
        if isinstance(msg, ReadResponse) and msg.data:
            self._lazy.append(item)
        self._out.append(item)
        if was_empty:
            self._notify_output()

    def _snapshot_reads(self) -> None:
        """Copy the source bytes of queued Read Responses before memory changes.

        Read Responses normally reference registered memory and are read when encoded
        (zero copy).  A later inbound Write, Send or atomic must not show through an
        earlier Read (requests are processed in order, RFC 5040 §5.5), so before placing
        anything while responses are queued, their bytes are taken.
        """
        while self._lazy:
            item = self._lazy.popleft()
            msg = item.message
            assert isinstance(msg, ReadResponse)
            item.message = ReadResponse(msg.stag, msg.to, bytes(msg.data))
            # The rest of a response going out in parts is the transport's, as what the
            # socket has not taken is: not counted against max_snapshot_bytes (must_wait).
            if not item.offset:
                item.copied = len(msg.data)
                self._snapshot_held += item.copied

    def close(self) -> None:
        """Orderly close requested by the ULP (RFC 5040 §6.2, DDP-13): no new WRs; what was
        posted before is still sent, then the transport sends FIN (:attr:`has_pending`)."""
        if self.state is _RTS:
            self.state = _CLOSING
            self._progress_sq()
            if not self._inflight and not self._pending:
                self._sq_drained()

    @property
    def has_pending(self) -> bool:
        """Posted send WRs not yet turned into messages (ORD or a fence holds them)."""
        return bool(self._pending)
