"""The offloaded target's side of the binding (docs/kbtp.md §8.1): arming a session's
chain, the scratch memory the chain writes, the core's view of what the chains ran, and
the hold of an ALLOW_UNSEALED LOAD behind another session's offloaded STORE (§6.0).

:class:`OffloadBinding` is a part of :class:`~kbtp.target.KbtpTarget`, kept apart so that
the software target's binding reads on its own.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import trio

from kbtp.target_config import TargetConfig
from kbtp.target_core import TargetCore
from kbtp.target_offload import (
    StoreMarks,
    arm,
    session_chain,
    unsealed_load_handle,
)
from kbtp.target_offload_alloc import (
    AllocLog,
    alloc_store_branches,
    free_branches,
    partition_ring,
)
from kbtp.target_offload_credits import CreditCount
from kbtp.target_session import TargetSession
from stack.rnic import Access, Chain, MemoryRegion

if TYPE_CHECKING:
    from collections.abc import Callable

    from kbtp.target_actions import Action

__all__ = ["STORE_POLL_SECONDS", "OffloadBinding"]

STORE_POLL_SECONDS = 0.0002
"""How often an ALLOW_UNSEALED LOAD held behind an offloaded STORE looks again (§8.1)."""


class OffloadBinding:
    """The chain side of :class:`~kbtp.target.KbtpTarget` (which provides the attributes
    and the two methods declared here)."""

    core: TargetCore
    config: TargetConfig
    sessions: dict[int, TargetSession]
    _nursery: trio.Nursery | None

    if TYPE_CHECKING:

        def _apply(self, actions: list[Action]) -> None: ...

        def _guarded(
            self, sess: TargetSession, call: Callable[..., list[Action]], *args: object
        ) -> list[Action]: ...

    def _arm(self, sess: TargetSession) -> None:
        """(Re)post the session's chain after a request the core took."""
        sess.chained = arm(sess.qp, lambda: self._chain(sess), sess.chained)

    def _chain(self, sess: TargetSession) -> Chain:
        """The session's offload chain (docs/kbtp.md §8): LOAD, and mapped STORE unless
        every seal must reach the pool file first (``pool_sync``, §12.4)."""
        ini = next((i for i in self.config.initiators if i.identity == sess.identity), None)
        stores = self.core.persist is None
        layout, lkey = self.core.layout, sess.local_mr.lkey
        ring = partition_ring(self.core, ini) if stores else None
        if sess.credits is None:
            sess.credits = CreditCount(self._scratch(sess, CreditCount.SIZE))
            sess.credits.publish(self.core.credits_left(sess.sid))
        if stores and ini is not None and ini.handle_count and sess.marks is None:
            sess.marks = StoreMarks(self._scratch(sess, ini.handle_count), ini)
        if ring is None or ini is None:
            return session_chain(layout, lkey, ini, stores, credits=sess.credits, marks=sess.marks)
        if sess.alloc_log is None:
            sess.alloc_log = AllocLog(self._scratch(sess, AllocLog.SIZE))
        part = next(p for p in layout.partitions if p.ring == ring)
        more = alloc_store_branches(layout, lkey, ini, ring, sess.alloc_log)
        more += free_branches(layout, lkey, ini, part, sess.alloc_log)
        return session_chain(layout, lkey, ini, stores, more, sess.credits, sess.marks)

    @staticmethod
    def _scratch(sess: TargetSession, size: int) -> MemoryRegion:
        """``size`` octets of zeroed memory for the session's chain, registered for local
        writes in its protection domain and deregistered with the session."""
        mr = sess.pd.reg_mr(bytearray(size), Access.LOCAL_WRITE)
        sess.regions.append(mr)
        return mr

    def _offloaded(self, sess: TargetSession, now: float) -> None:
        """Before a core call for ``sess``: the core accounts the ALLOC_STOREs its chain
        ran since the last look (docs/kbtp.md §8.1, the budget rule)."""
        if sess.alloc_log is not None and (records := sess.alloc_log.take()):
            call = self.core.offloaded_ring_ops
            self._apply(self._guarded(sess, call, sess.sid, records, now))

    def _hold_behind_store(self, sess: TargetSession, message: bytes) -> None:
        """Before the core takes ``message`` of ``sess``: an ALLOW_UNSEALED LOAD of a handle
        that another session's offloaded STORE has mid-Read locks the handle in the core
        until the STORE is over, so the LOAD queues behind it as behind a software STORE
        (docs/kbtp.md §6.0, §8.1); the session's other requests go on."""
        handle = unsealed_load_handle(message)
        if handle is None or self._nursery is None:
            return
        for other in self.sessions.values():
            marks = other.marks
            if other is not sess and marks is not None and marks.busy(handle):
                if self.core.hold_handle(handle):
                    self._nursery.start_soon(self._release_after_store, marks, handle)
                return

    async def _release_after_store(self, marks: StoreMarks, handle: int) -> None:
        """Wait until the STORE's entry write has cleared its mark, or its session ended
        (its chain flushed: the STORE never completes); then release the handle."""
        try:
            while any(s.marks is marks for s in self.sessions.values()) and marks.busy(handle):
                await trio.sleep(STORE_POLL_SECONDS)
        finally:
            self._apply(self.core.release_handle(handle, trio.current_time()))
