"""The software RNIC: one STag space, one asynchronous event queue, and factories for PDs,
CQs, QPs and SRQs."""

from __future__ import annotations

import itertools

from stack.rnic.cq import CompletionQueue
from stack.rnic.events import AsyncEvent, AsyncEventQueue
from stack.rnic.memory import ProtectionDomain, StagTable
from stack.rnic.qp import QpCap, QueuePair, SharedReceiveQueue


class Rnic:
    """A software RNIC (``ibv_context``): everything created from it shares its STag table.

    Atomics are executed by this object's single-threaded engine, so they are atomic with
    respect to every other operation of every QP of the RNIC (EXT-07).  Its QPs raise
    asynchronous events (QP_FATAL, QP_ACCESS_ERR, ...) on :attr:`async_events`.
    """

    def __init__(self, name: str = "iwarp0", *, max_ird: int = 128, max_ord: int = 128) -> None:
        self.name = name
        self.max_ird = max_ird
        self.max_ord = max_ord
        self.table = StagTable()
        self._qp_nums = itertools.count(1)
        self.qps: dict[int, QueuePair] = {}
        self.async_events = AsyncEventQueue()
        """Asynchronous events of every QP and CQ of this RNIC (``ibv_get_async_event``)."""

    async def get_async_event(self) -> AsyncEvent:
        """Wait for the next asynchronous event (``ibv_get_async_event``)."""
        return await self.async_events.get()

    def poll_async_event(self) -> AsyncEvent | None:
        """The next asynchronous event, or None at once when there is none."""
        return self.async_events.poll()

    def alloc_pd(self) -> ProtectionDomain:
        """Allocate a protection domain (``ibv_alloc_pd``)."""
        return ProtectionDomain(self.table)

    def create_cq(self, capacity: int = 4096) -> CompletionQueue:
        """Create a completion queue (``ibv_create_cq``)."""
        return CompletionQueue(capacity)

    def create_srq(self, pd: ProtectionDomain, max_wr: int = 1024) -> SharedReceiveQueue:
        """Create a shared receive queue (``ibv_create_srq``)."""
        return SharedReceiveQueue(pd, max_wr)

    def create_qp(
        self,
        pd: ProtectionDomain,
        send_cq: CompletionQueue,
        recv_cq: CompletionQueue | None = None,
        *,
        cap: QpCap | None = None,
        srq: SharedReceiveQueue | None = None,
        sq_sig_all: bool = False,
        ird: int = 16,
        ord: int = 16,
    ) -> QueuePair:
        """Create an RC queue pair (``ibv_create_qp``); IRD/ORD are capped by the device."""
        qp = QueuePair(
            pd,
            send_cq,
            recv_cq,
            qp_num=next(self._qp_nums),
            cap=cap,
            srq=srq,
            sq_sig_all=sq_sig_all,
            ird=min(ird, self.max_ird),
            ord=min(ord, self.max_ord),
            async_events=self.async_events,
        )
        self.qps[qp.qp_num] = qp
        return qp

    def destroy_qp(self, qp: QueuePair) -> None:
        if self.qps.pop(qp.qp_num, None) is not None:
            for cq in qp.cqs:
                cq.queue_pairs -= 1
