"""The queue pair's state, work-request records, completions and failure paths.

:class:`QpBase` holds what both directions of a queue pair share: its state (RFC 5040 §6),
the send-queue records, completion reporting in submit order (RFC 5040 §5.5 rule 15),
the error path that flushes every outstanding WR (Terminate, RFC 5040 §6.2.1), the
peer's half-close (DDP-13) and the asynchronous events.  The send queue engine is in
:mod:`stack.rnic.qp_send`, the receive side in :mod:`stack.rnic.qp`.
"""

from __future__ import annotations

import struct
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING

from stack.constants import (
    IMMEDIATE_DATA_LEN,
    TERM_RDMAP_CATASTROPHIC_STREAM,
    TermCode,
    TermLayer,
)
from stack.errors import LocalError, ProtocolError, RdmapError
from stack.rnic.cq import CompletionQueue, CqOverflow
from stack.rnic.events import AsyncEvent, AsyncEventQueue, AsyncEventType, event_type_for_cause
from stack.rnic.memory import (
    Access,
    ProtectionDomain,
)
from stack.rnic.verbs import (
    RecvWR,
    SendFlags,
    SendWR,
    WcFlags,
    WcOpcode,
    WcStatus,
    WorkCompletion,
    WrOpcode,
)
from stack.wire.checker import Checker
from stack.wire.events import (
    RdmapMessage,
    Terminate,
)
from stack.wire.sequence import RequestTracker

if TYPE_CHECKING:
    from stack.rnic.chains import ChainQueue, ChainRun

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
"""Default bound of :attr:`QueuePair.max_snapshot_bytes`: the copies of queued Read Responses
one QP holds at once, in total."""
MAX_STALLED_SNAPSHOT_BYTES = 64 << 20
"""Default of :attr:`QueuePair.max_stalled_snapshot_bytes`: the copies a QP makes anyway once
a placement has waited for its queued Read Responses while none of its output moved
(:meth:`~stack.rnic.endpoint.QpEndpoint.stall_released`)."""


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
# Enum members for the hot paths: ``Enum.MEMBER`` is a slow class attribute lookup (the
# enum metaclass defines ``__getattr__``), a module global is not.
_RTS = QpState.RTS
_CLOSING = QpState.CLOSING
_SUCCESS = WcStatus.SUCCESS


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
_WC_OPCODE_BY_VALUE = {op._value_: wc for op, wc in _WC_OPCODE.items()}
"""_WC_OPCODE by the WR opcode's value: an Enum's own hash is a Python-level call."""
# Tuples, not sets: membership is an identity test, without the Python-level Enum hash.
_READS = (WrOpcode.RDMA_READ, WrOpcode.RDMA_READ_WITH_INV)
_NEEDS_ORD = (*_READS, WrOpcode.ATOMIC_FETCH_AND_ADD, WrOpcode.ATOMIC_CMP_AND_SWP)


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
    chain: ChainRun | None = None  # the chain that posted it (stack.rnic.chains)
    payload: bytes | memoryview | None = None  # a Write's data, while it is queued to go out


@dataclass(slots=True)
class _OutItem:
    """An outbound message on the QP's queue (``_out``).  A Write WR's one message is
    queued as its :class:`_SqEntry` itself, the data in ``payload``: no item, no message
    object (:meth:`~stack.rnic.qp_send.QpSend.take_outgoing` hands it out as its fields)."""

    message: RdmapMessage
    entry: _SqEntry | None = None  # the WR this message completes (Sends, Writes)
    inbound_response: bool = False
    request: _SqEntry | None = None  # the WR of a Read or Atomic Request
    copied: int = 0  # bytes of a Read Response's data copied by a snapshot (still queued)
    offset: int = 0  # bytes of a large message taken in parts so far (take_outgoing)


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


class QpBase:
    """The shared state of one RC queue pair (see :class:`stack.rnic.qp.QueuePair`)."""

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
        for cq in self.cqs:
            cq.queue_pairs += 1
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
        self._out: deque[_OutItem | _SqEntry] = deque()
        self._lazy: deque[_OutItem] = deque()  # queued Read Responses still viewing memory
        self.max_snapshot_bytes = MAX_SNAPSHOT_BYTES
        self.max_stalled_snapshot_bytes = MAX_STALLED_SNAPSHOT_BYTES
        """The bound of :attr:`max_snapshot_bytes` once a stall has lasted with no output
        moving: two ends that both wait for their responses to go out would otherwise wait
        for each other for ever (0: never copy more)."""
        self._snapshot_held = 0  # bytes of snapshot copies still queued (bounded by the max)
        """Queued Read Response bytes copied at most before a placement (:meth:`must_wait`)."""
        self._rq: deque[RecvWR] = deque()
        self._recv: _RecvInProgress | None = None
        self._inbound_pending = 0  # Read/Atomic Requests whose response is not drained yet
        self._next_req_id = 1
        self.terminate_pending: ProtocolError | None = None
        """A local error the transport must still send a Terminate for."""
        self.on_output: Callable[[], None] | None = None
        """Called when the outbound queue becomes non-empty, or a closing send queue has
        drained (the transport's wake-up); once per post list (:meth:`_notify_output`)."""
        self.express_send: Callable[[RdmapMessage], bool] | None = None
        """The transport's express path (:meth:`QpEndpoint.express_send
        <stack.rnic.endpoint.QpEndpoint.express_send>`): frames a one-segment message
        (a Read or atomic Request, a small Read Response, an atomic Response) at once and
        returns True, or returns False, having changed nothing, to have it queued.  Called
        only when nothing is queued ahead of the message (:attr:`has_outgoing` False)."""
        self._answered_early = 0
        """Responses the express path framed whose IRD slots the transport has not freed
        yet (:meth:`~stack.rnic.qp_send.QpSend.release_answered`)."""
        self.on_remote_write: Callable[[], None] | None = None
        """Called after each RDMA Write segment lands in this QP's memory (a software-RNIC
        extension: a Write leaves no completion at its target, RFC 5040 §5.1, so a waiter
        for its data can sleep on this instead of spinning on the memory)."""
        self._batching = False  # a post list is being processed: on_output waits for it
        self._output_deferred = False  # on_output was due while batching
        self.async_events = async_events
        """Where this QP's asynchronous events go (its RNIC's queue; None: nowhere)."""
        self._peer_closed = False  # the peer's FIN arrived: nothing more will be received
        self._drained_reported = False
        self._last_wqe_reported = False
        self.chains: ChainQueue | None = None
        """The chain queue (:mod:`stack.rnic.chains`), from the first ``post_chain``."""

    # ------------------------------------------------------------------ state
    def __repr__(self) -> str:
        return f"<QueuePair {self.qp_num} {self.state.value}>"

    @property
    def cqs(self) -> tuple[CompletionQueue, ...]:
        """The CQs this QP reports to, each once (its send CQ, and its receive CQ when
        that is another)."""
        if self.recv_cq is self.send_cq:
            return (self.send_cq,)
        return (self.send_cq, self.recv_cq)

    @property
    def ird_full(self) -> bool:
        """Every IRD slot holds a Read or Atomic Request whose response is not drained:
        one more is beyond IRD (SEC-10, RDMAP-14)."""
        return self._inbound_pending >= self.ird

    @property
    def outstanding_remote(self) -> int:
        """Reads and atomics sent and not yet answered, plus ORD credits the connection holds
        (a zero-length Read RTR, RFC 6581 §9.2): what ORD bounds (RDMAP-14)."""
        return len(self._requests) + self.ord_reserved

    # ------------------------------------------------------------------ completions
    def _wc(self, entry: _SqEntry, status: WcStatus) -> WorkCompletion:
        wr = entry.wr
        return WorkCompletion(
            wr.wr_id,
            status,
            _WC_OPCODE_BY_VALUE[wr.opcode._value_],
            self.qp_num,
            entry.byte_len if status is _SUCCESS else 0,
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
        inflight = self._inflight  # the same deque throughout (a failure clears it)
        sig_all = self.sq_sig_all
        while inflight and inflight[0].done:
            entry = inflight.popleft()
            if entry.chain is not None:
                entry.chain.wr_done(entry)
            if sig_all or entry.flags & _SIGNALED or entry.status is not _SUCCESS:
                self._push_wc(self.send_cq, self._wc(entry, entry.status))
        if self.state is _CLOSING and not inflight and not self._pending:
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
        if self.chains is not None and status is _SUCCESS:
            if self.chains.take_recv(wr, wc):
                return  # held for a chain that waits on receives
        self._push_wc(self.recv_cq, wc)

    def _deliver_recv(self, wc: WorkCompletion) -> None:
        """A receive a chain held and did not consume goes to the application."""
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
        self._snapshot_held = 0
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
        if self.chains is not None:
            self.chains.fail()
        self._flush_receives()
        self._last_wqe()

    def _flush_receives(self) -> None:
        """Flush the receive in progress and every posted receive (not an SRQ's: shared)."""
        if self._recv is not None:
            self._complete_recv(self._recv.wr, WcStatus.WR_FLUSH_ERR, WcOpcode.RECV)
            self._recv = None
        while self._rq:
            self._complete_recv(self._rq.popleft(), WcStatus.WR_FLUSH_ERR, WcOpcode.RECV)

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
                if (
                    id(item) not in ids
                    if isinstance(item, _SqEntry)
                    else id(item.entry or item.request) not in ids or item.inbound_response
                )
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

    def _notify_output(self) -> None:
        """Tell the transport there is output (:attr:`on_output`), after the post list
        being processed, if any, is all queued."""
        if self._batching:
            self._output_deferred = True
        elif self.on_output is not None:
            self.on_output()

    def _sq_drained(self) -> None:
        """A closing QP has nothing left to send: SQ_DRAINED, and wake the transport."""
        if not self._drained_reported:
            self._drained_reported = True
            self._raise_event(AsyncEventType.SQ_DRAINED)
            self._notify_output()

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
