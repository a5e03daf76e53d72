"""Synchronous verbs objects (pyverbs' shape) over an RNIC that progresses on its own thread.

``Context`` (``ibv_context``) starts the RNIC thread (:mod:`stack.verbs_sync.portal`); ``PD``,
``MR``, ``CompChannel``, ``CQ``, ``SRQ`` and ``QP`` are built from it as pyverbs builds them.  Every
call that changes RNIC state (register, create, post) is handed to the RNIC thread and
returns once done there, so its errors (:class:`~stack.errors.LocalError`, say) are raised
in the caller.  :meth:`CQ.poll` does not leave the calling thread: the CQ is guarded by a
lock, so any number of threads may poll it, busy-poll it or wait on it while the RNIC thread
pushes completions.  Work requests and completions are :mod:`stack.rnic.verbs`'s.
"""

from __future__ import annotations

import time
import weakref
from types import TracebackType
from typing import Any, Self

from stack.rnic.cq import CompletionQueue
from stack.rnic.device import Rnic
from stack.rnic.memory import Access, MemoryRegion, ProtectionDomain
from stack.rnic.qp import QpCap, QpState, QueuePair, SharedReceiveQueue
from stack.rnic.verbs import RecvWR, SendWR, Sge, WorkCompletion
from stack.transport.cm import TapFactory
from stack.verbs_sync.mailbox import Mailbox, RnicClosed, Signal
from stack.verbs_sync.portal import CALL_TIMEOUT, STOP_TIMEOUT, RnicThread
from stack.wire.events import Terminate


class Closing:
    """Context-manager support: ``with X(...) as x:`` closes ``x`` on the way out."""

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


class Context(Closing):
    """A software RNIC progressed by its own thread (``ibv_context``; pyverbs ``Context``).

    ``tap_factory`` records connections into a capture
    (:func:`~stack.transport.tap.pcap_tap_factory`).  :meth:`close` (or leaving a ``with``
    block) tears every connection down, flushing outstanding work requests, and stops the
    thread; completions already in a CQ can still be polled afterwards.
    """

    def __init__(
        self,
        name: str = "iwarp0",
        *,
        max_ird: int = 128,
        max_ord: int = 128,
        tap_factory: TapFactory | None = None,
    ) -> None:
        self.rnic = Rnic(name, max_ird=max_ird, max_ord=max_ord)
        self.thread = RnicThread(self.rnic, tap_factory=tap_factory)
        """The RNIC thread; ``thread.run`` / ``thread.run_sync`` run your own trio code or
        functions there (the trio objects behind these wrappers are not thread safe)."""
        # A context nobody closed stops its thread once unreachable (or at exit).
        weakref.finalize(self, self.thread.stop, wait=False)

    @property
    def name(self) -> str:
        return self.rnic.name

    @property
    def closed(self) -> bool:
        return not self.thread.running

    def close(self, timeout: float = STOP_TIMEOUT) -> None:
        """Stop the RNIC thread (idempotent); raises :class:`TimeoutError` if it hangs."""
        self.thread.stop(timeout)

    def __repr__(self) -> str:
        return f"<Context {self.name} {'closed' if self.closed else 'running'}>"


class PD(Closing):
    """A protection domain (``ibv_alloc_pd``; pyverbs ``PD(ctx)``)."""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.pd: ProtectionDomain = ctx.thread.run_sync(ctx.rnic.alloc_pd)

    def reg_mr(self, buffer: Any, access: Access = Access.LOCAL_WRITE) -> MR:
        """Register ``buffer`` (see :class:`MR`)."""
        return MR(self, buffer, access)

    def close(self) -> None:
        """Nothing to release: a PD lives as long as its MRs and QPs."""

    def __repr__(self) -> str:
        return f"<PD {self.pd.handle} of {self.ctx.name}>"


class MR(Closing):
    """A memory region (``ibv_reg_mr``; pyverbs ``MR(pd, length, access)``).

    ``buffer`` is any writable contiguous buffer (bytearray, memoryview, mmap, a numpy
    array), registered in place: remote Writes land in it and Reads take from it.  An ``int``
    registers a new zeroed ``bytearray`` of that many bytes.
    """

    def __init__(self, pd: PD, buffer: Any, access: Access = Access.LOCAL_WRITE) -> None:
        if isinstance(buffer, int) and not isinstance(buffer, bool):
            if buffer < 0:
                raise ValueError("MR length must be >= 0")
            buffer = bytearray(buffer)
        self.pd = pd
        self.mr: MemoryRegion = pd.ctx.thread.run_sync(pd.pd.reg_mr, buffer, access)
        self._registered = True

    @property
    def buf(self) -> memoryview:
        """The registered bytes (a view of the buffer)."""
        return self.mr.buf

    @property
    def addr(self) -> int:
        return self.mr.addr

    @property
    def base(self) -> int:
        """The tagged offset of the first byte: ``addr``, or 0 for ``ZERO_BASED``."""
        return self.mr.base

    @property
    def length(self) -> int:
        return self.mr.length

    @property
    def lkey(self) -> int:
        return self.mr.lkey

    @property
    def rkey(self) -> int:
        return self.mr.rkey

    @property
    def valid(self) -> bool:
        """False once invalidated (Send with Invalidate, local invalidate) or deregistered."""
        return self.mr.valid

    def sge(self, offset: int = 0, length: int | None = None) -> Sge:
        """An SGE for ``length`` bytes (default: to the end) at ``offset`` of this MR."""
        if not 0 <= offset <= self.length:
            raise ValueError(f"offset {offset} outside the {self.length}-byte MR")
        n = self.length - offset if length is None else length
        if n < 0 or offset + n > self.length:
            raise ValueError(f"{n} bytes at offset {offset} exceed the {self.length}-byte MR")
        return Sge(self.base + offset, n, self.lkey)

    def read(self, length: int, offset: int = 0) -> bytes:
        """``length`` bytes at ``offset`` (pyverbs ``MR.read``)."""
        if offset < 0 or length < 0 or offset + length > self.length:
            raise ValueError(f"{length} bytes at offset {offset} exceed the MR")
        return bytes(self.buf[offset : offset + length])

    def write(self, data: bytes | bytearray | memoryview, offset: int = 0) -> None:
        """Copy ``data`` in at ``offset`` (pyverbs ``MR.write``)."""
        if offset < 0 or offset + len(data) > self.length:
            raise ValueError(f"{len(data)} bytes at offset {offset} exceed the MR")
        self.buf[offset : offset + len(data)] = data

    def close(self) -> None:
        """Deregister (``ibv_dereg_mr``): the STag stops working.  Idempotent."""
        if not self._registered:
            return
        self._registered = False
        try:
            self.pd.ctx.thread.run_sync(self.mr.dereg)
        except RnicClosed:  # the RNIC is gone, and its STag table with it
            self.mr.valid = False

    dereg = close

    def __repr__(self) -> str:
        return f"<MR rkey=0x{self.rkey:08x} len={self.length}>"


class CompChannel(Closing):
    """A completion channel (``ibv_create_comp_channel``; pyverbs ``CompChannel(ctx)``):
    the CQs created with it report their armed events here."""

    def __init__(self, ctx: Context, capacity: int = 4096) -> None:
        self.ctx = ctx
        self._events: Mailbox[CQ] = Mailbox(f"completion channel of {ctx.name}", capacity)
        ctx.thread.on_stop(self._events.close)

    def get_cq_event(self, timeout: float | None = None) -> CQ:
        """The CQ of the next event (``ibv_get_cq_event``), waiting up to ``timeout`` s;
        re-arm it with :meth:`CQ.req_notify`.  No ``ack`` is needed."""
        return self._events.get(timeout)

    async def wait_cq_event(self, timeout: float | None = None) -> CQ:
        """:meth:`get_cq_event` for asyncio: the event loop keeps running meanwhile."""
        return await self._events.aget(timeout)

    def close(self) -> None:
        self._events.close(RnicClosed("completion channel closed"))


class CQ(CompletionQueue, Closing):
    """A completion queue that any thread may poll (``ibv_create_cq``; pyverbs
    ``CQ(ctx, cqe, cq_context, channel)``).

    :meth:`poll` takes what is there without waiting (``ibv_poll_cq``), so a busy-poll
    loop works: the RNIC thread keeps progressing.  :meth:`wait` blocks for ``count``
    completions and :meth:`wait_async` awaits them from asyncio.  :meth:`req_notify` arms
    one event for the completion channel.  The trio methods it inherits (``next``,
    ``wait_for``, ``wait_event``) are for trio code running on the RNIC thread.
    """

    def __init__(
        self, ctx: Context, capacity: int = 4096, channel: CompChannel | None = None
    ) -> None:
        super().__init__(capacity)
        self.ctx = ctx
        self.channel = channel
        self._signal = Signal(f"CQ of {ctx.name}")
        if channel is not None:
            self.on_event = lambda cq: channel._events.put(self)
        ctx.thread.on_stop(self._signal.close)

    def push(self, wc: WorkCompletion) -> None:
        """Add a completion (the RNIC thread's QPs call this)."""
        with self._signal.lock:
            super().push(wc)
            self._signal.notify()

    def poll(self, n: int = 16) -> list[WorkCompletion]:
        """Take up to ``n`` completions, oldest first, without waiting (``ibv_poll_cq``).

        An empty poll yields the interpreter lock once: the RNIC is software, and a
        busy-polling thread would otherwise hold the lock until the interpreter's switch
        interval takes it away."""
        with self._signal.lock:
            out = super().poll(n)
        if not out:
            time.sleep(0)
        return out

    def _take(self, count: int) -> list[WorkCompletion] | None:
        return super().poll(count) if len(self) >= count else None

    def wait(self, count: int = 1, timeout: float | None = None) -> list[WorkCompletion]:
        """Wait until ``count`` completions are there and take them, up to ``timeout``
        seconds (None: until they come or the RNIC stops); on :class:`TimeoutError` nothing
        is taken."""
        if not 1 <= count <= self.capacity:
            raise ValueError(f"count must be 1..{self.capacity}")
        return self._signal.wait_until(lambda: self._take(count), timeout)

    async def wait_async(
        self, count: int = 1, timeout: float | None = None
    ) -> list[WorkCompletion]:
        """:meth:`wait` for asyncio."""
        if not 1 <= count <= self.capacity:
            raise ValueError(f"count must be 1..{self.capacity}")
        return await self._signal.await_until(lambda: self._take(count), timeout)

    def req_notify(self, solicited_only: bool = False) -> None:
        """Arm one event on the completion channel for the next (solicited) completion
        (``ibv_req_notify_cq``)."""
        if self.channel is None:
            raise ValueError("this CQ has no completion channel")
        with self._signal.lock:
            super().req_notify(solicited_only)

    def close(self) -> None:
        """Nothing to release; completions stay pollable."""

    def __repr__(self) -> str:
        return f"<CQ of {self.ctx.name}: {len(self)} completions>"


class SRQ(Closing):
    """A shared receive queue (``ibv_create_srq``; pyverbs ``SRQ(pd, attr)``): QPs created
    with it take their receives from it."""

    def __init__(self, pd: PD, max_wr: int = 1024) -> None:
        self.pd = pd
        self.srq: SharedReceiveQueue = pd.ctx.thread.run_sync(pd.ctx.rnic.create_srq, pd.pd, max_wr)

    def post_recv(self, wr: RecvWR | list[RecvWR], timeout: float | None = CALL_TIMEOUT) -> None:
        """Post receive work requests (``ibv_post_srq_recv``)."""
        self.pd.ctx.thread.run_sync(self.srq.post_recv, wr, timeout=timeout)

    def __len__(self) -> int:
        return len(self.srq)

    def close(self) -> None:
        """Nothing to release."""


class QP(Closing):
    """A reliable-connected queue pair (``ibv_create_qp``; pyverbs ``QP(pd, init_attr)``).

    Connect it with :class:`~stack.verbs_sync.cm.CMId`.  :meth:`post_send` and
    :meth:`post_recv` take one work request or a list (a post list) and return once the
    RNIC thread has queued them; receives and sends may be posted before the connection
    is up.
    """

    def __init__(
        self,
        pd: PD,
        send_cq: CQ,
        recv_cq: CQ | None = None,
        *,
        cap: QpCap | None = None,
        srq: SRQ | None = None,
        sq_sig_all: bool = False,
        ird: int = 16,
        ord: int = 16,
    ) -> None:
        ctx = pd.ctx
        if send_cq.ctx is not ctx or (recv_cq is not None and recv_cq.ctx is not ctx):
            raise ValueError("the CQs must belong to the PD's context")
        if srq is not None and srq.pd.ctx is not ctx:
            raise ValueError("the SRQ must belong to the PD's context")
        self.ctx = ctx
        self.pd = pd
        self.send_cq = send_cq
        self.recv_cq = recv_cq or send_cq
        self.qp: QueuePair = ctx.thread.run_sync(
            lambda: ctx.rnic.create_qp(
                pd.pd,
                send_cq,
                recv_cq,
                cap=cap,
                srq=None if srq is None else srq.srq,
                sq_sig_all=sq_sig_all,
                ird=ird,
                ord=ord,
            )
        )
        """The trio-side queue pair (touch it on the RNIC thread only)."""

    def post_send(self, wr: SendWR | list[SendWR], timeout: float | None = CALL_TIMEOUT) -> None:
        """Post send work requests (``ibv_post_send``)."""
        self.ctx.thread.run_sync(self.qp.post_send, wr, timeout=timeout)

    def post_recv(self, wr: RecvWR | list[RecvWR], timeout: float | None = CALL_TIMEOUT) -> None:
        """Post receive work requests (``ibv_post_recv``)."""
        self.ctx.thread.run_sync(self.qp.post_recv, wr, timeout=timeout)

    @property
    def qp_num(self) -> int:
        return self.qp.qp_num

    @property
    def state(self) -> QpState:
        """The RDMAP stream state (RFC 5040 §6)."""
        return self.qp.state

    @property
    def peer_terminate(self) -> Terminate | None:
        """The Terminate the peer sent, if it sent one."""
        return self.qp.peer_terminate

    @property
    def ird(self) -> int:
        return self.qp.ird

    @property
    def ord(self) -> int:
        return self.qp.ord

    def close(self) -> None:
        """Destroy the QP (``ibv_destroy_qp``); disconnect its connection first."""
        try:
            self.ctx.thread.run_sync(self.ctx.rnic.destroy_qp, self.qp)
        except RnicClosed:
            pass

    def __repr__(self) -> str:
        return f"<QP {self.qp_num} {self.state.value}>"
