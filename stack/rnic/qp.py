"""Reliable-connected queue pairs: the RDMAP consumer side of the software RNIC.

Theory of operation.  A :class:`QueuePair` is a synchronous engine (no I/O):

* Work requests go in with :meth:`post_send` / :meth:`post_recv`.  The send queue is
  processed in order (RFC 5040 §5.5 rule 13): each WR becomes one or more RDMAP messages
  on the *outbound queue*.  A Read or atomic waits at the head while ORD credits are used
  up (RDMAP-14), and a fenced WR waits for every earlier Read and atomic to finish.
* The transport drains the outbound queue with :meth:`pop_outgoing` and encodes the
  messages.  Payloads are memoryviews of registered memory, read when the message is
  encoded, as an RNIC reads memory when it transmits.  A Send or Write completes when it
  has been handed to the transport (rule 14); a Read when its response is delivered (rule
  19); an atomic when its response arrives.  Completions of one send queue are reported in
  submit order (rule 15), signalled ones only (selective signalling).
* Inbound RDMAP events (already validated in form by :class:`stack.wire.stream.RdmapStream`)
  go in with :meth:`handle_event`.  Every protection check happens here, before any byte
  is placed (RFC 5042 §6.1-6.2, DDP-10); a failure raises a :class:`ProtocolError` carrying the
  Terminate cause, and the caller sends the Terminate and calls :meth:`fatal`, which moves
  the QP to TERMINATE and flushes every outstanding WR (WR_FLUSH_ERR); a Terminate from the
  peer does the same.  The QP reaches ERROR when the stream closes (:meth:`stream_closed`).
* Orderly close (RFC 5040 §6.2, DDP-13): :meth:`close` (ours) keeps sending what was posted
  before it, then the transport sends FIN; :meth:`peer_closed` (the peer's FIN) keeps what
  arrived before it and sends what can still complete, and flushes, in submit order, the
  WRs that needed an answer from the peer and every WR after them.  Both are CLOSING.
* State changes that the application must hear of raise asynchronous events
  (:mod:`stack.rnic.events`) on the RNIC's queue, naming the QP and the Terminate's cause.
* Inbound Read Requests and Atomic Requests occupy an IRD slot until their response has been
  drained by the transport; one more than IRD is a Terminate 0/2/0x07 (SEC-10).
"""

from __future__ import annotations

import struct
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from stack.constants import (
    IMMEDIATE_DATA_LEN,
    SOLICITED_OPCODES,
    TERM_DDP_U_NO_BUFFER,
    TERM_DDP_U_TOO_LONG,
    TERM_RDMAP_CATASTROPHIC,
    TERM_RDMAP_CATASTROPHIC_STREAM,
    AtomicOpcode,
    TermCode,
    TermLayer,
)
from stack.errors import DdpError, LocalError, ProtocolError, RdmapError
from stack.rnic.cq import CompletionQueue, CqOverflow
from stack.rnic.events import AsyncEvent, AsyncEventQueue, AsyncEventType, event_type_for_cause
from stack.rnic.memory import (
    DDP_TAGGED_CODES,
    RDMAP_REMOTE_CODES,
    Access,
    MemoryOpError,
    MemoryRegion,
    ProtectionDomain,
    check_remote_access,
    local_invalidate,
    remote_invalidate,
)
from stack.rnic.verbs import (
    MwBindInfo,
    RecvWR,
    SendFlags,
    SendWR,
    Sge,
    WcFlags,
    WcOpcode,
    WcStatus,
    WorkCompletion,
    WrOpcode,
)
from stack.rnic.windows import MemoryWindow, execute_bind, execute_reg_mr, post_type1_bind
from stack.wire.checker import Checker
from stack.wire.events import (
    AtomicRequest,
    AtomicRequestReceived,
    AtomicResponse,
    AtomicResponseReceived,
    ImmediateData,
    ImmediateDataReceived,
    RdmapEvent,
    RdmapMessage,
    RdmaWrite,
    ReadRequest,
    ReadRequestReceived,
    ReadResponse,
    ReadResponseSegment,
    Send,
    SendSegment,
    Terminate,
    TerminateReceived,
    WriteSegment,
)
from stack.wire.sequence import RequestTracker

_LE64 = struct.Struct("<Q")
# Plain ints for the hot path: IntFlag operators cost several microseconds per WR.
_FENCE = int(SendFlags.FENCE)
_SIGNALED = int(SendFlags.SIGNALED)
_SOLICITED = int(SendFlags.SOLICITED)
_INLINE = int(SendFlags.INLINE)
_LOCAL_WRITE = int(Access.LOCAL_WRITE)
_REMOTE_WRITE = int(Access.REMOTE_WRITE)
_REMOTE_READ = int(Access.REMOTE_READ)
_REMOTE_ATOMIC = int(Access.REMOTE_ATOMIC)


MAX_SNAPSHOT_BYTES = 4 << 20
"""Default bound of :attr:`QueuePair.max_snapshot_bytes`."""


class QpState(Enum):
    """RDMAP stream states (RFC 5040 §6), as a QP reports them.

    IDLE until the stream is established, RTS in RDMA mode, CLOSING during an orderly close
    (ours or the peer's FIN), TERMINATE once a Terminate was sent or received (no more WRs
    are processed; posted ones are flushed), ERROR when the stream has closed after a
    Terminate, an abortive loss or an orderly close.  As ``IBV_QPS_*``: INIT, RTS, SQD, SQE,
    ERR (the mapping Linux siw reports).
    """

    IDLE = "idle"
    RTS = "rts"
    CLOSING = "closing"
    TERMINATE = "terminate"
    ERROR = "error"


_SENDING = (QpState.RTS, QpState.CLOSING)  # states in which the send queue is processed
_FAILED = (QpState.TERMINATE, QpState.ERROR)  # states in which posted WRs are flushed


@dataclass(frozen=True, slots=True)
class QpCap:
    """QP capacities (``ibv_qp_cap``)."""

    max_send_wr: int = 256
    max_recv_wr: int = 256
    max_send_sge: int = 16
    max_recv_sge: int = 16
    max_inline_data: int = 512


_WC_OPCODE = {
    WrOpcode.SEND: WcOpcode.SEND,
    WrOpcode.SEND_WITH_INV: WcOpcode.SEND,
    WrOpcode.SEND_IMM: WcOpcode.SEND,
    WrOpcode.RDMA_WRITE: WcOpcode.RDMA_WRITE,
    WrOpcode.RDMA_WRITE_WITH_IMM: WcOpcode.RDMA_WRITE,
    WrOpcode.RDMA_READ: WcOpcode.RDMA_READ,
    WrOpcode.ATOMIC_FETCH_AND_ADD: WcOpcode.FETCH_ADD,
    WrOpcode.ATOMIC_CMP_AND_SWP: WcOpcode.COMP_SWAP,
    WrOpcode.LOCAL_INV: WcOpcode.LOCAL_INV,
    WrOpcode.RDMA_READ_WITH_INV: WcOpcode.RDMA_READ,
    WrOpcode.BIND_MW: WcOpcode.BIND_MW,
    WrOpcode.REG_MR: WcOpcode.REG_MR,
}
_READS = frozenset({WrOpcode.RDMA_READ, WrOpcode.RDMA_READ_WITH_INV})
_NEEDS_ORD = _READS | {WrOpcode.ATOMIC_FETCH_AND_ADD, WrOpcode.ATOMIC_CMP_AND_SWP}


@dataclass(slots=True)
class _SqEntry:
    """A send WR from posting to completion."""

    wr: SendWR
    flags: int = 0
    byte_len: int = 0
    done: bool = False
    status: WcStatus = WcStatus.SUCCESS
    messages_left: int = 0
    # Read: where the response lands; atomic: where the original value lands.
    sink: memoryview | None = None
    sink_stag: int = 0
    sink_to: int = 0
    received: int = 0
    req_id: int = 0


@dataclass(slots=True)
class _OutItem:
    message: RdmapMessage
    entry: _SqEntry | None = None  # the WR this message completes (Sends, Writes)
    inbound_response: bool = False
    request: _SqEntry | None = None  # the WR of a Read or Atomic Request


@dataclass(slots=True)
class _RecvInProgress:
    msn: int
    wr: RecvWR
    views: list[memoryview] = field(default_factory=list)
    capacity: int = 0


class SharedReceiveQueue:
    """A shared receive queue (``ibv_srq``): QPs created with it take receives from it."""

    def __init__(self, pd: ProtectionDomain, max_wr: int = 1024) -> None:
        self.pd = pd
        self.max_wr = max_wr
        self._queue: deque[RecvWR] = deque()

    def post_recv(self, wr: RecvWR | list[RecvWR]) -> None:
        wrs = wr if isinstance(wr, list) else [wr]
        if len(self._queue) + len(wrs) > self.max_wr:
            raise LocalError(f"SRQ full ({self.max_wr} receive WRs)")
        self._queue.extend(wrs)

    def __len__(self) -> int:
        return len(self._queue)


class QueuePair:
    """An RC queue pair on one RDMAP stream."""

    def __init__(
        self,
        pd: ProtectionDomain,
        send_cq: CompletionQueue,
        recv_cq: CompletionQueue | None = None,
        *,
        qp_num: int = 0,
        cap: QpCap | None = None,
        srq: SharedReceiveQueue | None = None,
        sq_sig_all: bool = False,
        ird: int = 16,
        ord: int = 16,
        async_events: AsyncEventQueue | None = None,
    ) -> None:
        self.pd = pd
        pd.streams.add(self)
        self.table = pd.table
        self.send_cq = send_cq
        self.recv_cq = recv_cq if recv_cq is not None else send_cq
        self.qp_num = qp_num
        self.cap = cap or QpCap()
        self.srq = srq
        self.sq_sig_all = sq_sig_all
        self.ird = ird
        self.ord = ord
        self.state = QpState.IDLE
        self.error: ProtocolError | None = None
        self.peer_terminate: Terminate | None = None
        self._pending: deque[_SqEntry] = deque()  # posted, not yet turned into messages
        self._inflight: deque[_SqEntry] = deque()  # turned into messages, not completed
        self._requests = RequestTracker()  # Reads and atomics awaiting responses, in order
        self.ord_reserved = 0
        """ORD credits taken by the connection itself (an unanswered Read RTR)."""
        self._checker = Checker(strict=True)
        self._out: deque[_OutItem] = deque()
        self._lazy: deque[_OutItem] = deque()  # queued Read Responses still viewing memory
        self.max_snapshot_bytes = MAX_SNAPSHOT_BYTES
        """Queued Read Response bytes copied at most before a placement (:meth:`must_wait`)."""
        self._rq: deque[RecvWR] = deque()
        self._recv: _RecvInProgress | None = None
        self._inbound_pending = 0  # Read/Atomic Requests whose response is not drained yet
        self._next_req_id = 1
        self.terminate_pending: ProtocolError | None = None
        """A local error the transport must still send a Terminate for."""
        self.on_output: Callable[[], None] | None = None
        """Called when the outbound queue becomes non-empty, or a closing send queue has
        drained (the transport's wake-up)."""
        self.async_events = async_events
        """Where this QP's asynchronous events go (its RNIC's queue; None: nowhere)."""
        self._peer_closed = False  # the peer's FIN arrived: nothing more will be received
        self._drained_reported = False
        self._last_wqe_reported = False

    # ------------------------------------------------------------------ state
    def __repr__(self) -> str:
        return f"<QueuePair {self.qp_num} {self.state.value}>"

    def set_rts(self) -> None:
        """The stream entered RDMA mode (connection established)."""
        if self.state is QpState.IDLE:
            self.state = QpState.RTS
            self._progress_sq()

    @property
    def outstanding_remote(self) -> int:
        """Reads and atomics sent and not yet answered, plus ORD credits the connection holds
        (a zero-length Read RTR, RFC 6581 §9.2): what ORD bounds (RDMAP-14)."""
        return len(self._requests) + self.ord_reserved

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
        for one in wrs:
            if len(one.sg_list) > self.cap.max_send_sge:
                raise LocalError(f"send WR {one.wr_id} has more than max_send_sge SGEs")
            if one.send_flags & _INLINE:
                size = len(one.inline_data or b"") or sum(s.length for s in one.sg_list)
                if size > self.cap.max_inline_data:
                    raise LocalError(f"inline data of WR {one.wr_id} exceeds max_inline_data")
        if self.state in _FAILED:  # TERMINATE as IBV_QPS_SQE, ERROR as IBV_QPS_ERR: flushed
            for one in wrs:
                self._push_wc(self.send_cq, self._wc(_SqEntry(one), WcStatus.WR_FLUSH_ERR))
            return
        if self.state is QpState.CLOSING:
            raise LocalError(f"QP {self.qp_num} is closing: no new work requests")
        if len(self._pending) + len(self._inflight) + len(wrs) > self.cap.max_send_wr:
            raise LocalError(f"send queue full ({self.cap.max_send_wr} WRs)")
        for one in wrs:
            self._pending.append(_SqEntry(one, int(one.send_flags)))
        if self.state is QpState.RTS:
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
        """Turn pending WRs into outbound messages, in order, honouring ORD and fences."""
        while self._pending and self.state in _SENDING:
            entry = self._pending[0]
            wr = entry.wr
            if wr.opcode in _NEEDS_ORD and self.outstanding_remote >= self.ord:
                return
            if entry.flags & _FENCE and self.outstanding_remote:
                return
            self._pending.popleft()
            self._inflight.append(entry)
            try:
                self._start(entry)
            except (_LocalWrError, MemoryOpError) as exc:
                entry.status = exc.status
                entry.done = True
                self._reap_sq()
                self.fatal(
                    RdmapError("RDMAP-12", f"WR {wr.wr_id}: {exc}", TERM_RDMAP_CATASTROPHIC),
                    send_terminate=True,
                )
                return
        self._reap_sq()

    def _start(self, entry: _SqEntry) -> None:
        wr = entry.wr
        op = wr.opcode
        solicited = bool(entry.flags & _SOLICITED)
        if op in (WrOpcode.SEND, WrOpcode.SEND_WITH_INV):
            data = self._gather(wr)
            entry.byte_len = len(data)
            inval = wr.invalidate_rkey if op is WrOpcode.SEND_WITH_INV else None
            self._emit(entry, [Send(data, solicited, inval)])
        elif op is WrOpcode.SEND_IMM:
            self._emit(entry, [ImmediateData(_imm_bytes(wr.imm_data), solicited)])
        elif op in (WrOpcode.RDMA_WRITE, WrOpcode.RDMA_WRITE_WITH_IMM):
            data = self._gather(wr)
            entry.byte_len = len(data)
            msgs: list[RdmapMessage] = [RdmaWrite(wr.rkey, wr.remote_addr, data)]
            if op is WrOpcode.RDMA_WRITE_WITH_IMM:
                msgs.append(ImmediateData(_imm_bytes(wr.imm_data), solicited))
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
        elif op in (WrOpcode.ATOMIC_FETCH_AND_ADD, WrOpcode.ATOMIC_CMP_AND_SWP):
            if len(wr.sg_list) != 1 or wr.sg_list[0].length != 8:
                raise _LocalWrError(WcStatus.LOC_LEN_ERR, "atomics need one 8-byte SGE")
            _mr, view = self._local(wr.sg_list[0], _LOCAL_WRITE)
            entry.sink, entry.byte_len = view, 8
            entry.req_id = self._next_req_id
            self._next_req_id = (self._next_req_id + 1) & 0xFFFFFFFF
            if op is WrOpcode.ATOMIC_FETCH_AND_ADD:
                atomic = AtomicRequest(
                    AtomicOpcode.FETCH_ADD,
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
        elif op is WrOpcode.LOCAL_INV:
            local_invalidate(self.table, self.pd, wr.invalidate_rkey)
            entry.done = True
        elif op is WrOpcode.BIND_MW:
            execute_bind(wr.bind_mw, self.pd, self)
            entry.done = True
        elif op is WrOpcode.REG_MR:
            execute_reg_mr(wr.reg_mr, self.pd)
            entry.done = True
        else:  # pragma: no cover - enum is closed
            raise _LocalWrError(WcStatus.LOC_QP_OP_ERR, f"unsupported opcode {op}")

    def _emit(self, entry: _SqEntry, msgs: list[RdmapMessage], completes: bool = True) -> None:
        entry.messages_left = len(msgs) if completes else 0
        was_empty = not self._out
        for msg in msgs:
            self._out.append(
                _OutItem(msg, entry) if completes else _OutItem(msg, None, False, entry)
            )
        if was_empty and self.on_output is not None:
            self.on_output()

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
        views = [self._local(sge, 0)[1] for sge in wr.sg_list]
        if wr.send_flags & _INLINE:
            return b"".join(views)
        if len(views) == 1:
            return views[0]
        return b"".join(views)

    # ------------------------------------------------------------------ transport side
    @property
    def has_outgoing(self) -> bool:
        return bool(self._out)

    def pop_outgoing(self) -> RdmapMessage | None:
        """Take the next outbound message (the transport encodes and sends it)."""
        if not self._out:
            return None
        item = self._out.popleft()
        if item.inbound_response:
            self._inbound_pending -= 1
            if self._lazy and self._lazy[0] is item:
                self._lazy.popleft()
        entry = item.entry
        if entry is not None:
            entry.messages_left -= 1
            if entry.messages_left == 0:
                entry.done = True
                self._reap_sq()
        return item.message

    def must_wait(self, event: RdmapEvent) -> bool:
        """Whether applying ``event`` now would copy more than :attr:`max_snapshot_bytes` of
        queued Read Response data (the responses still view memory, and a later placement
        must not show through them, RFC 5040 §5.5).  The driver then lets the responses go
        out first: a peer that asks for many large Reads and does not read its socket makes
        this connection hold at most that many bytes, not the sum of every Read."""
        if not self._lazy or type(event) is ReadRequestReceived:
            return False
        queued = 0
        for item in self._lazy:
            message = item.message
            assert isinstance(message, ReadResponse)
            queued += len(message.data)
            if queued > self.max_snapshot_bytes:
                return True
        return False

    def _queue_response(self, msg: RdmapMessage) -> None:
        was_empty = not self._out
        item = _OutItem(msg, None, inbound_response=True)
        if isinstance(msg, ReadResponse) and msg.data:
            self._lazy.append(item)
        self._out.append(item)
        if was_empty and self.on_output is not None:
            self.on_output()

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

    # ------------------------------------------------------------------ receive side
    def handle_event(self, event: RdmapEvent) -> None:
        """Apply one inbound RDMAP event.  Raises ProtocolError (with Terminate cause), which
        names the event's ULPDU (``ulpdu``) for the Terminate's header copies."""
        if self.state in _FAILED:
            return
        if self._lazy and type(event) is not ReadRequestReceived:
            self._snapshot_reads()
        try:
            _RECEIVE_HANDLERS[type(event)](self, event)
        except ProtocolError as exc:
            if exc.ulpdu is None and not isinstance(event, TerminateReceived):
                exc.ulpdu = event.ulpdu
            raise

    def _on_write_segment(self, seg: WriteSegment) -> None:
        if seg.data:
            view = check_remote_access(
                self.table, self.pd, seg.stag, seg.to, len(seg.data), _REMOTE_WRITE,
                DDP_TAGGED_CODES, self,
            )  # fmt: skip
            view[:] = seg.data

    def _on_read_request_received(self, event: ReadRequestReceived) -> None:
        self._take_ird("Read Request")
        self._on_read_request(event.request)

    def _on_atomic_request_received(self, event: AtomicRequestReceived) -> None:
        self._take_ird("Atomic Request")
        self._on_atomic_request(event.request)

    def _on_atomic_response_received(self, event: AtomicResponseReceived) -> None:
        self._on_atomic_response(event.response)

    def _on_immediate_data(self, event: ImmediateDataReceived) -> None:
        wr = self._take_recv()
        flags = WcFlags.WITH_IMM | (WcFlags.SOLICITED if event.solicited else WcFlags.NONE)
        self._complete_recv(
            wr, WcStatus.SUCCESS, WcOpcode.RECV_RDMA_WITH_IMM, imm=event.data, flags=flags
        )

    def _on_terminate(self, event: TerminateReceived) -> None:
        self.peer_terminate = event.terminate
        self.fatal(None, send_terminate=False)

    def _take_ird(self, what: str) -> None:
        if self._inbound_pending >= self.ird:
            raise RdmapError(
                "RDMAP-14",
                f"{what} beyond IRD {self.ird} (peer exceeded its ORD)",
                TERM_RDMAP_CATASTROPHIC_STREAM,
            )
        self._inbound_pending += 1

    def _take_recv(self) -> RecvWR:
        queue = self.srq._queue if self.srq is not None else self._rq
        if not queue:
            raise DdpError(
                "RDMAP-08", "untagged message with no receive posted", TERM_DDP_U_NO_BUFFER
            )
        return queue.popleft()

    def _on_send_segment(self, seg: SendSegment) -> None:
        recv = self._recv
        if recv is None or recv.msn != seg.msn:
            wr = self._take_recv()
            recv = _RecvInProgress(seg.msn, wr)
            try:
                for sge in wr.sg_list:
                    _mr, view = self._local(sge, _LOCAL_WRITE)
                    recv.views.append(view)
                    recv.capacity += sge.length
            except _LocalWrError as exc:
                self._complete_recv(wr, exc.status, WcOpcode.RECV)
                raise RdmapError("RDMAP-08", str(exc), TERM_RDMAP_CATASTROPHIC_STREAM) from None
            self._recv = recv
        end = seg.mo + len(seg.data)
        if end > recv.capacity:
            raise DdpError(
                "RDMAP-08",
                f"Send of at least {end} bytes exceeds the {recv.capacity}-byte receive buffer",
                TERM_DDP_U_TOO_LONG,
            )
        _scatter(recv.views, seg.mo, seg.data)
        if not seg.last:
            return
        flags = WcFlags.SOLICITED if seg.opcode in SOLICITED_OPCODES else WcFlags.NONE
        invalidated = None
        if seg.invalidate_stag is not None:  # refused: the receive is flushed with the rest
            remote_invalidate(self.table, self.pd, seg.invalidate_stag, self)
            invalidated = seg.invalidate_stag
            flags |= WcFlags.WITH_INV
        self._recv = None
        self._complete_recv(
            recv.wr, WcStatus.SUCCESS, WcOpcode.RECV, byte_len=end, flags=flags, inval=invalidated
        )

    def _on_read_request(self, req: ReadRequest) -> None:
        if req.size == 0:  # RDMAP-07: no validation, zero-length response
            self._queue_response(ReadResponse(req.sink_stag, req.sink_to, b""))
            return
        view = check_remote_access(
            self.table,
            self.pd,
            req.src_stag,
            req.src_to,
            req.size,
            _REMOTE_READ,
            RDMAP_REMOTE_CODES,
            self,
        )
        self._queue_response(ReadResponse(req.sink_stag, req.sink_to, view))

    def _on_read_response(self, seg: ReadResponseSegment) -> None:
        """Place a Read Response segment in its Read's sink (matched by the request tracker,
        RDMAP-04: Sink STag, continuing Sink TO, the requested size)."""
        size = len(seg.data)
        match = self._requests.read_response(seg.stag, seg.to, size, seg.last, self._checker)
        assert match is not None  # strict: no outstanding Read raises
        request, offset = match
        entry = request.context
        assert isinstance(entry, _SqEntry) and entry.sink is not None
        if size:
            entry.sink[offset : offset + size] = seg.data
            entry.received += size
        if seg.last:
            entry.byte_len = entry.received
            if entry.wr.opcode is WrOpcode.RDMA_READ_WITH_INV:
                try:  # the sink STag, invalidated locally once the Read completes
                    local_invalidate(self.table, self.pd, entry.sink_stag)
                except MemoryOpError as exc:  # the sink went away meanwhile
                    entry.status = exc.status
            entry.done = True
            self._reap_sq()
            self._progress_sq()

    def _on_atomic_request(self, req: AtomicRequest) -> None:
        view = check_remote_access(
            self.table,
            self.pd,
            req.stag,
            req.to,
            8,
            _REMOTE_ATOMIC,
            RDMAP_REMOTE_CODES,
            self,
        )
        del view  # validated; the MR's atomic engine does the access
        mr = self.table.lookup(req.stag)
        assert mr is not None
        self._queue_response(AtomicResponse(req.req_id, mr.atomic(req)))

    def _on_atomic_response(self, resp: AtomicResponse) -> None:
        """Return an atomic's original value to its WR (matched in order, EXT-03)."""
        _matched, entry = self._requests.atomic_response(resp.req_id, self._checker)
        assert isinstance(entry, _SqEntry) and entry.sink is not None
        entry.sink[:] = _LE64.pack(resp.orig_value)
        entry.done = True
        self._reap_sq()
        self._progress_sq()

    # ------------------------------------------------------------------ completions
    def _wc(self, entry: _SqEntry, status: WcStatus) -> WorkCompletion:
        return WorkCompletion(
            entry.wr.wr_id,
            status,
            _WC_OPCODE[entry.wr.opcode],
            self.qp_num,
            byte_len=entry.byte_len if status is WcStatus.SUCCESS else 0,
        )

    def _push_wc(self, cq: CompletionQueue, wc: WorkCompletion) -> None:
        try:
            cq.push(wc)
        except CqOverflow as exc:
            if self.state not in _FAILED:
                self._raise_event(AsyncEventType.CQ_ERR, cq=cq, detail=str(exc))
                self.fatal(
                    RdmapError("SEC-09", str(exc), TERM_RDMAP_CATASTROPHIC_STREAM),
                    send_terminate=True,
                )

    def _reap_sq(self) -> None:
        """Report completed send WRs in submit order (RFC 5040 §5.5 rule 15)."""
        while self._inflight and self._inflight[0].done:
            entry = self._inflight.popleft()
            signalled = self.sq_sig_all or entry.flags & _SIGNALED
            if signalled or entry.status is not WcStatus.SUCCESS:
                self._push_wc(self.send_cq, self._wc(entry, entry.status))
        if self.state is QpState.CLOSING and not self._inflight and not self._pending:
            self._sq_drained()

    def _complete_recv(
        self,
        wr: RecvWR,
        status: WcStatus,
        opcode: WcOpcode,
        *,
        byte_len: int = 0,
        imm: bytes | None = None,
        flags: WcFlags = WcFlags.NONE,
        inval: int | None = None,
    ) -> None:
        wc = WorkCompletion(wr.wr_id, status, opcode, self.qp_num, byte_len, imm, inval, flags)
        self._push_wc(self.recv_cq, wc)

    # ------------------------------------------------------------------ errors
    def fatal(
        self,
        error: ProtocolError | None,
        *,
        send_terminate: bool,
        terminate_sent: bool = False,
        detail: str = "",
    ) -> None:
        """The stream failed: record ``error``, fail the WR it hit, flush every other WR.

        With ``send_terminate`` the transport is expected to send a Terminate for
        ``error`` (it has the offending ULPDU to copy headers from); the QP itself only
        records the error.  A Terminate sent (``send_terminate``, ``terminate_sent``) or
        received (:attr:`peer_terminate`) puts the QP in TERMINATE until the stream closes
        (RFC 5040 §6.2.1); a failure without one in ERROR at once.  Either way the
        application hears of it as an asynchronous event (:mod:`stack.rnic.events`).
        """
        self._fail(error, send_terminate, terminate_sent, detail, report=True)

    def _fail(
        self,
        error: ProtocolError | None,
        send_terminate: bool,
        terminate_sent: bool,
        detail: str,
        *,
        report: bool,
    ) -> None:
        if self.state in _FAILED:
            return
        if error is not None and self.error is None:
            self.error = error
        if send_terminate and error is not None:
            self.terminate_pending = error
        remote = self.peer_terminate is not None
        terminated = remote or (error is not None and (send_terminate or terminate_sent))
        self.state = QpState.TERMINATE if terminated else QpState.ERROR
        if self.peer_terminate is not None:
            cause: TermCode | None = self.peer_terminate.cause
        else:
            cause = error.term if error is not None else None
        if report:
            self._raise_event(
                event_type_for_cause(cause),
                cause=cause,
                remote=remote,
                error=error,
                detail=detail or (str(error) if error is not None else ""),
            )
        remote_status = _status_for_terminate(self.peer_terminate)
        self._out.clear()
        self._lazy.clear()
        # Completions keep submit order on the error path too (RFC 5040 §5.5): once a WR
        # could not complete, every WR posted after it is flushed, even one whose message
        # was already handed to TCP (its completion was still queued behind).
        flushing = False
        for entry in list(self._inflight) + list(self._pending):
            if entry.done and not flushing:
                status = entry.status
                if status is WcStatus.SUCCESS and not (self.sq_sig_all or entry.flags & _SIGNALED):
                    continue
            elif not flushing and remote_status is not None:
                status, remote_status = remote_status, None
                flushing = True
            else:
                status = WcStatus.WR_FLUSH_ERR
                flushing = True
            self._push_wc(self.send_cq, self._wc(entry, status))
        self._inflight.clear()
        self._pending.clear()
        self._requests.reads.clear()
        self._requests.atomics.clear()
        self._flush_receives()
        self._last_wqe()

    def _flush_receives(self) -> None:
        """Flush the receive in progress and every posted receive (not an SRQ's: shared)."""
        if self._recv is not None:
            self._complete_recv(self._recv.wr, WcStatus.WR_FLUSH_ERR, WcOpcode.RECV)
            self._recv = None
        while self._rq:
            self._complete_recv(self._rq.popleft(), WcStatus.WR_FLUSH_ERR, WcOpcode.RECV)

    def close(self) -> None:
        """Orderly close requested by the ULP (RFC 5040 §6.2, DDP-13): no new WRs; what was
        posted before is still sent, then the transport sends FIN (:attr:`has_pending`)."""
        if self.state is QpState.RTS:
            self.state = QpState.CLOSING
            self._progress_sq()
            if not self._inflight and not self._pending:
                self._sq_drained()

    def peer_closed(self) -> None:
        """The peer closed its half (FIN, DDP-13): everything it sent before is applied
        already; nothing more will arrive.

        The QP enters CLOSING.  Queued Read Responses and Sends and Writes still go out (the
        other direction keeps working).  A Read or atomic awaiting its answer can never
        complete: it and every WR posted after it complete with WR_FLUSH_ERR, in submit
        order (RFC 5040 §5.5), and so do the posted receives.
        """
        self._peer_closed = True
        if self.state in _FAILED:
            return
        if self.state in (QpState.IDLE, QpState.RTS):
            self.state = QpState.CLOSING
        self._flush_receives()
        entries = list(self._inflight) + list(self._pending)
        first = next(
            (i for i, e in enumerate(entries) if not e.done and e.wr.opcode in _NEEDS_ORD), None
        )
        if first is not None:
            doomed = entries[first:]
            ids = {id(e) for e in doomed}
            self._out = deque(
                item
                for item in self._out
                if id(item.entry or item.request) not in ids or item.inbound_response
            )
            for entry in doomed:
                entry.status, entry.done = WcStatus.WR_FLUSH_ERR, True
            self._inflight.extend(self._pending)
            self._pending.clear()
            self._requests.reads.clear()
            self._requests.atomics.clear()
        self._reap_sq()

    def stream_closed(self, error: Exception | None = None) -> None:
        """The LLP stream is gone (RFC 5040 §6.2): enter ERROR and flush what is left.

        After a Terminate or an orderly close this is the last step and raises no error
        event; a stream lost while in RTS (``error``: why) raises ``QP_FATAL``."""
        if self.state is QpState.ERROR:
            return
        if self.state is QpState.TERMINATE:
            self.state = QpState.ERROR
            return
        lost = self.state is QpState.RTS and error is not None
        self._fail(None, False, False, f"stream lost: {error}", report=lost)

    @property
    def has_pending(self) -> bool:
        """Posted send WRs not yet turned into messages (ORD or a fence holds them)."""
        return bool(self._pending)

    # ------------------------------------------------------------------ events
    def _raise_event(
        self,
        event_type: AsyncEventType,
        *,
        cq: CompletionQueue | None = None,
        cause: TermCode | None = None,
        remote: bool = False,
        error: Exception | None = None,
        detail: str = "",
    ) -> None:
        if self.async_events is not None:
            self.async_events.post(
                AsyncEvent(event_type, self, self.qp_num, cq, cause, remote, error, detail)
            )

    def _sq_drained(self) -> None:
        """A closing QP has nothing left to send: SQ_DRAINED, and wake the transport."""
        if not self._drained_reported:
            self._drained_reported = True
            self._raise_event(AsyncEventType.SQ_DRAINED)
            if self.on_output is not None:
                self.on_output()

    def _last_wqe(self) -> None:
        """A QP with an SRQ takes no more receives from it: QP_LAST_WQE_REACHED, once."""
        if self.srq is not None and not self._last_wqe_reported:
            self._last_wqe_reported = True
            self._raise_event(AsyncEventType.QP_LAST_WQE_REACHED)


class _LocalWrError(Exception):
    def __init__(self, status: WcStatus, message: str) -> None:
        super().__init__(message)
        self.status = status


def _status_for_terminate(term: Terminate | None) -> WcStatus | None:
    """The completion status of the WR a peer's Terminate refers to."""
    if term is None:
        return None
    if term.layer == TermLayer.RDMAP:
        return WcStatus.REM_ACCESS_ERR if term.etype == 1 else WcStatus.REM_OP_ERR
    if term.layer == TermLayer.DDP:
        return WcStatus.REM_ACCESS_ERR if term.etype == 1 else WcStatus.REM_INV_REQ_ERR
    return WcStatus.FATAL_ERR


def _imm_bytes(imm: int | bytes | None) -> bytes:
    if imm is None:
        return bytes(IMMEDIATE_DATA_LEN)
    if isinstance(imm, int):
        return (imm & ((1 << 64) - 1)).to_bytes(IMMEDIATE_DATA_LEN, "big")
    data = bytes(imm)
    if len(data) > IMMEDIATE_DATA_LEN:
        raise LocalError("immediate data is at most 8 bytes")
    return data.rjust(IMMEDIATE_DATA_LEN, b"\0")


def _scatter(views: list[memoryview], offset: int, data: memoryview | bytes) -> None:
    """Copy ``data`` into the concatenation of ``views`` starting at ``offset``."""
    pos = 0
    for view in views:
        n = len(view)
        if offset >= n:
            offset -= n
            continue
        take = min(n - offset, len(data) - pos)
        view[offset : offset + take] = data[pos : pos + take]
        pos += take
        offset = 0
        if pos >= len(data):
            return


_RECEIVE_HANDLERS: dict[type, Callable[[QueuePair, Any], None]] = {
    WriteSegment: QueuePair._on_write_segment,
    SendSegment: QueuePair._on_send_segment,
    ReadResponseSegment: QueuePair._on_read_response,
    ReadRequestReceived: QueuePair._on_read_request_received,
    AtomicRequestReceived: QueuePair._on_atomic_request_received,
    AtomicResponseReceived: QueuePair._on_atomic_response_received,
    ImmediateDataReceived: QueuePair._on_immediate_data,
    TerminateReceived: QueuePair._on_terminate,
}
"""Receive dispatch by event type (every :data:`~stack.wire.events.RdmapEvent` kind)."""
