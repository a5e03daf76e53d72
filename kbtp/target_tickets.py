"""The target's free-block flow: blocks back to rings, waiting tickets, DIRECT_ALLOC tickets
and the Ticket Timeout (draft §3.3, §3.4; docs/kbtp.md §6.7).

Part of :class:`~kbtp.target_core.TargetCore` (see :mod:`kbtp.target_state`).  A block
freed into a ring may fill the slot a ticket waits for: :meth:`TicketOps._wake` resumes the
ALLOC_STORE holding that ticket, or reclaims the block of an abandoned one.  Direct tickets
(an initiator's own FetchAdds on Head) are accounted for whenever the core looks
(``observe``); one not bound within the Ticket Timeout is abandoned: the session's Ring and
Partition STags are invalidated first, then the abandoned blocks are reclaimed.
"""

from __future__ import annotations

from kbtp.constants import Status
from kbtp.messages import Request
from kbtp.ring import CounterCorrupt
from kbtp.target_actions import Action, InvalidateStag
from kbtp.target_state import (
    OVER_QUOTA,
    RECLAIM,
    CoreState,
    InitiatorState,
    OpKind,
    PendingOp,
    SessionState,
)


class TicketOps(CoreState):
    """Blocks returning to rings, waiting tickets, abandoned direct tickets (draft §3.4)."""

    # ----------------------------------------------------------------------------------
    # blocks back to their ring, tickets waiting for a slot (draft §3.3, §6.4)
    # ----------------------------------------------------------------------------------
    def _return_block(self, rid: int, block: int, out: list[Action], now: float) -> None:
        """§6.4 step 3: clear the block if it may change trust domain, then free it."""
        ring = self._rings[rid]
        if ring.clear_on_free:
            self._write_block(block, bytes(self.config.block_size))
        outcome = ring.free(block)
        self._wake(rid, outcome.ready, out, now)

    def _wake(self, rid: int, ready: tuple[int, ...], out: list[Action], now: float) -> None:
        """Tickets whose slots were just filled: resume their waiting allocation or reclaim."""
        work = list(ready)
        while work:
            ticket = work.pop()
            waiter = self._waiters.pop((rid, ticket), None)
            if waiter is None:
                continue
            if waiter == RECLAIM:
                work.extend(self._reclaim_now(rid, ticket, out, now))
                continue
            op = self._ops[waiter]
            assert op.request is not None
            if self._alloc_got_block(waiter, now, out):
                self._release(op.request.handle, now, out)

    def _reclaim(self, rid: int, ticket: int, out: list[Action], now: float) -> None:
        """Reclaim an abandoned ticket's block now, or as soon as its slot is filled."""
        if self._rings[rid].ready_block(ticket) is None:
            self._waiters[(rid, ticket)] = RECLAIM
            return
        self._wake(rid, self._reclaim_now(rid, ticket, out, now), out, now)

    def _reclaim_now(self, rid: int, ticket: int, out: list[Action], now: float) -> tuple[int, ...]:
        """Consume the abandoned ticket's slot and free its block with a new ticket (§3.4)."""
        ring = self._rings[rid]
        block, ready = ring.consume(ticket)
        if ring.clear_on_free:
            self._write_block(block, bytes(self.config.block_size))
        outcome = ring.free(block)
        return ready + outcome.ready

    # ----------------------------------------------------------------------------------
    # DIRECT_ALLOC tickets and the Ticket Timeout (draft §3.4)
    # ----------------------------------------------------------------------------------
    def _direct_violation(self, ini: InitiatorState, now: float) -> str | None:
        """Account for direct tickets taken since the last look at the partition Head; why
        the session must close (docs/kbtp.md §6.7), or None.

        Two reasons: tickets beyond the quota (draft §3.4), or a Head that holds no counter
        value (the initiator changed it other than by the masked FetchAdd of draft §3.3; a
        Head moved backwards counts as tickets beyond the quota).
        """
        if not ini.config.direct_alloc:
            return None
        limit = ini.config.quota
        try:
            found = self._rings[ini.ring].observe(now, limit=limit)
        except CounterCorrupt as exc:
            return f"partition {exc}"
        if found > limit or self.usage(ini.config.identity) > limit:
            return OVER_QUOTA
        return None

    def _over_quota(
        self,
        session: int,
        req: Request,
        generation: int,
        now: float,
        out: list[Action],
        reason: str = OVER_QUOTA,
    ) -> bool:
        """Draft §3.4: an allocation beyond the quota gets NO_SPACE; this target also closes
        the session (the partition ring is then rebuilt).  The request is finished."""
        self._complete(out, session, req, Status.NO_SPACE, generation)
        self._close(session, now, Status.NO_SPACE, reason, out)
        return True

    def _check_tickets(
        self, session: int, sess: SessionState, now: float, out: list[Action]
    ) -> None:
        assert sess.identity is not None
        ini = self._initiators[sess.identity]
        violation = self._direct_violation(ini, now)
        if violation is not None:
            self._close(session, now, Status.NO_SPACE, violation, out)
            return
        ring = self._rings[ini.ring]
        expired = ring.expired(now, self.config.ticket_timeout)
        if not expired:
            return
        for ticket in expired:
            ring.abandon(ticket)
        if sess.direct_alloc:
            # Before any block is reclaimed, no RDMA Write of the initiator may reach it:
            # invalidate the Partition STag (the Head STag, so no new tickets appear, and the
            # Ring STag: DIRECT_ALLOC ends for the session).
            sess.direct_alloc = False
            for stag in (sess.partition_stag, sess.head_stag, sess.ring_stag):
                op_id = self._new_op(PendingOp(OpKind.INVALIDATE, session, None, ring=ini.ring))
                sess.invalidating.add(op_id)
                out.append(InvalidateStag(op_id, session, stag))
        elif not sess.invalidating:
            self._reclaim_abandoned(ini, out, now)

    def _invalidated(self, op_id: int, op: PendingOp, now: float, out: list[Action]) -> None:
        sess = self._sessions.get(op.session)
        if sess is None:
            return
        sess.invalidating.discard(op_id)
        if sess.invalidating or sess.identity is None:
            return
        ini = self._initiators[sess.identity]
        # The Ring STag is invalid now: Head is final; account for the last direct tickets.
        violation = self._direct_violation(ini, now)
        if violation is not None:
            self._close(op.session, now, Status.NO_SPACE, violation, out)
        else:
            self._reclaim_abandoned(ini, out, now)

    def _reclaim_abandoned(self, ini: InitiatorState, out: list[Action], now: float) -> None:
        ring = self._rings[ini.ring]
        for ticket in sorted(t for t, o in ring.outstanding.items() if o.abandoned):
            if (ini.ring, ticket) not in self._waiters:
                self._reclaim(ini.ring, ticket, out, now)
