"""The target's requests: LOAD, STORE, ALLOC_STORE, FREE and BIND (draft §6; docs/kbtp.md §6).

Part of :class:`~kbtp.target_core.TargetCore` (see :mod:`kbtp.target_state`).  A request
runs with its handle locked (docs/kbtp.md §6.0); its checks run in the order of the draft's
steps and the first failing one completes it without changing anything.  A request that
needs an RDMA operation returns False and is finished when the binding reports it: the
table changes only after the data has moved.
"""

from __future__ import annotations

from collections import deque

from kbtp.constants import (
    GENERATION_ANY,
    TABLE_ENTRY_LEN,
    Capability,
    RequestFlag,
    Status,
    TableFlag,
    next_generation,
)
from kbtp.layout import (
    TableEntry,
    read_entry,
    read_entry_values,
    write_entry,
    write_entry_values,
)
from kbtp.messages import AllocStore, Bind, Free, Load, Request, Store
from kbtp.ring import CounterCorrupt, RingRecord, TicketOwner
from kbtp.target_actions import Action, ReadFromInitiator, WriteToInitiator
from kbtp.target_state import (
    HOLD,
    SHARED_RING,
    CoreState,
    InitiatorState,
    OpKind,
    PendingOp,
    SessionState,
)
from stack.errors import LocalError
from stack.fastinit import maker

_RECORD = int(RequestFlag.RECORD)  # int tests make no Flag object per request
_SEAL = int(RequestFlag.SEAL)
_ALLOW_UNSEALED = int(RequestFlag.ALLOW_UNSEALED)
_SEALED = int(TableFlag.SEALED)
_BOUND = {False: int(TableFlag.VALID), True: int(TableFlag.VALID | TableFlag.SEALED)}
"""The Flags of an entry ALLOC_STORE or BIND writes, by SEAL."""
_make_write = maker(WriteToInitiator)
_make_read = maker(ReadFromInitiator)


class RequestOps(CoreState):
    """The operations of draft §6, executed by the target."""

    def _execute(self, session: int, req: Request, now: float, out: list[Action]) -> bool:
        """Run ``req`` (its handle is locked); True if it completed, False if pending."""
        sess = self._sessions[session]
        assert sess.identity is not None
        ini = self._initiators[sess.identity]
        if int(req.flags) & _RECORD:  # int tests: no Flag object made per request
            # RECORD_COMPLETION is never offered on the RDMAP binding (draft §6.5, §9.1).
            return self._fail(out, session, req, Status.NOT_OFFERED)
        if isinstance(req, Load):
            return self._load(session, req, out)
        if isinstance(req, Store):
            return self._store(session, ini, req, out)
        if isinstance(req, AllocStore):
            return self._alloc_store(session, ini, req, now, out)
        if isinstance(req, Free):
            return self._free(session, ini, req, now, out)
        return self._bind(session, sess, ini, req, now, out)

    def _entry_checks(
        self, req: Request, ini: InitiatorState | None
    ) -> tuple[Status, TableEntry | None]:
        """Handle range (initiator's, or the table's when ``ini`` is None) and Generation."""
        if not self.layout.serves(req.handle) or (
            ini is not None and not ini.config.owns(req.handle)
        ):
            return Status.HANDLE_OUT_OF_RANGE, None
        entry = read_entry(self.memory, self.layout.entry_offset(req.handle))  # served: above
        if req.generation != GENERATION_ANY and req.generation != entry.generation:
            return Status.WRONG_GENERATION, entry
        return Status.SUCCESS, entry

    # -- §6.1 Block Load -----------------------------------------------------------------
    def _load(self, session: int, req: Load, out: list[Action]) -> bool:
        status, entry = self._entry_checks(req, None)
        if status is not Status.SUCCESS or entry is None:
            return self._fail(out, session, req, status)
        if not entry.valid:
            return self._fail(out, session, req, Status.NOT_VALID)
        if not entry.sealed and not int(req.flags) & _ALLOW_UNSEALED:
            return self._fail(out, session, req, Status.NOT_SEALED)
        if entry.data_length > req.descriptor.length:
            return self._fail(out, session, req, Status.TOO_LONG_FOR_DESCRIPTOR)
        if entry.data_length == 0:
            self._complete(
                out, session, req, Status.SUCCESS, entry.generation, 0, entry.block_offset
            )
            return True
        op_id = self._new_op(PendingOp(OpKind.LOAD_WRITE, session, req, entry=entry))
        d = req.descriptor
        out.append(_make_write(op_id, session, entry.block_offset, entry.data_length, d.stag, d.to))
        return False

    # -- §6.2 Block Mapped Store ---------------------------------------------------------
    def _data_checks(self, req: Store | AllocStore) -> Status:
        if req.descriptor.length > self.config.block_size:
            return Status.TOO_LONG_FOR_BLOCK
        if req.inline:
            if len(req.data) > self.config.max_inline:
                return Status.INLINE_TOO_LONG
            if len(req.data) != req.descriptor.length:
                return Status.MALFORMED
        return Status.SUCCESS

    def _store(self, session: int, ini: InitiatorState, req: Store, out: list[Action]) -> bool:
        status, entry = self._entry_checks(req, ini)
        if status is not Status.SUCCESS or entry is None:
            return self._fail(out, session, req, status)
        if not entry.valid:
            return self._fail(out, session, req, Status.NOT_VALID)
        if entry.sealed:
            return self._fail(out, session, req, Status.SEALED)
        status = self._data_checks(req)
        if status is not Status.SUCCESS:
            return self._fail(out, session, req, status)
        if req.inline or req.descriptor.length == 0:
            self._write_block(entry.block_offset, req.data)
            self._finish_store(session, req, out)
            return True
        op_id = self._new_op(PendingOp(OpKind.STORE_READ, session, req))
        d = req.descriptor
        out.append(_make_read(op_id, session, d.stag, d.to, d.length, entry.block_offset))
        return False

    def _finish_store(self, session: int, req: Store, out: list[Action]) -> None:
        """§6.2 steps 3-4: Data Length (and SEALED) after the data is in the block."""
        at = self.layout.entry_offset(req.handle)
        flags, generation, _, block = read_entry_values(self.memory, at)
        length = req.descriptor.length
        seal = int(req.flags) & _SEAL
        if seal:
            flags |= _SEALED
            self._persist(self.layout.offset_of(block), length)
        write_entry_values(self.memory, at, flags, generation, length, block)
        if seal:
            self._persist(at, TABLE_ENTRY_LEN)
        self._complete(out, session, req, Status.SUCCESS, generation, length, block)

    # -- §6.3 Block Unmapped Store -------------------------------------------------------
    def _alloc_store(
        self, session: int, ini: InitiatorState, req: AllocStore, now: float, out: list[Action]
    ) -> bool:
        status, entry = self._entry_checks(req, ini)
        if status is not Status.SUCCESS or entry is None:
            return self._fail(out, session, req, status)
        if entry.valid:
            return self._fail(out, session, req, Status.ALREADY_VALID)
        status = self._data_checks(req)
        if status is not Status.SUCCESS:
            return self._fail(out, session, req, status)
        violation = self._direct_violation(ini, now)
        if violation is not None:
            return self._over_quota(session, req, entry.generation, now, out, violation)
        if self.usage(ini.config.identity) + 1 > ini.config.quota:
            return self._fail(out, session, req, Status.NO_SPACE)
        ring = self._rings[ini.ring]
        if ini.config.direct_alloc:
            try:  # an initiator's atomic on its Head may land just before ours
                ticket = ring.take(now, ini.config.quota)
            except CounterCorrupt as exc:
                return self._over_quota(
                    session, req, entry.generation, now, out, f"partition {exc}"
                )
        else:
            ticket = ring.take(now)
        ini.allocating += 1
        if self.usage(ini.config.identity) > ini.config.quota:
            # A direct FetchAdd raced ours and went over the quota (draft §3.4: NO_SPACE,
            # MAY terminate).  The ticket cannot be given back; closing resets the partition.
            ini.allocating -= 1
            return self._over_quota(session, req, entry.generation, now, out)
        op_id = self._new_op(
            PendingOp(OpKind.ALLOC_WAIT, session, req, ring=ini.ring, ticket=ticket)
        )
        block = ring.ready_block(ticket)
        if block is None:
            self._waiters[(ini.ring, ticket)] = op_id
            return False
        return self._alloc_got_block(op_id, now, out)

    def _alloc_got_block(self, op_id: int, now: float, out: list[Action]) -> bool:
        """§6.3 steps 2-3: consume the slot, then place the data into the block."""
        op = self._ops[op_id]
        req = op.request
        assert isinstance(req, AllocStore)
        block, ready = self._rings[op.ring].consume(op.ticket)
        op.block = block
        self._wake(op.ring, ready, out, now)
        if req.inline or req.descriptor.length == 0:
            del self._ops[op_id]
            self._write_block(block, req.data)
            self._finish_alloc(op.session, req, block, out)
            return True
        op.kind = OpKind.ALLOC_READ
        d = req.descriptor
        out.append(_make_read(op_id, op.session, d.stag, d.to, d.length, block))
        return False

    def _finish_alloc(
        self, session: int, req: AllocStore | Bind, block: int, out: list[Action]
    ) -> None:
        """§6.3 steps 4-5 (and BIND): entry written after the data; then complete."""
        sess = self._sessions[session]
        assert sess.identity is not None
        ini = self._initiators[sess.identity]
        at = self.layout.entry_offset(req.handle)
        old_generation = read_entry_values(self.memory, at)[1]
        seal = int(req.flags) & _SEAL
        alloc = isinstance(req, AllocStore)
        length = req.descriptor.length if isinstance(req, AllocStore) else req.data_length
        generation = next_generation(old_generation)
        if seal:  # the data is durable before the entry that seals it (§12.4)
            self._persist(self.layout.offset_of(block), length)
        write_entry_values(self.memory, at, _BOUND[bool(seal)], generation, length, block)
        if seal:
            self._persist(at, TABLE_ENTRY_LEN)
        self._bound_blocks[block] = req.handle
        ini.bound += 1
        if alloc:
            ini.allocating -= 1
        self._complete(out, session, req, Status.SUCCESS, generation, length, block)

    def offloaded_requests(self, session: int, out: int) -> None:
        """Before a message of ``session`` that fell back from its chain (docs/kbtp.md
        §8.1): ``out`` requests are held by the chain's runs or were answered, by the chain
        or by the core, after this one arrived (the binding's count).  It counts the core's
        answers too, so those since the last :meth:`receive_batch` are not added (§9.2)."""
        sess = self._sessions.get(session)
        if sess is not None:
            sess.offloaded = out
            sess.uncredited = 0

    def hold_handle(self, handle: int) -> bool:
        """An offloaded STORE of ``handle`` is mid-Read (docs/kbtp.md §8.1): lock the handle
        so that the requests that come next queue as behind one of the core's own (§6.0)
        until :meth:`release_handle`.  If one of the core's own operations has the handle,
        the hold queues behind it (and what queued before it), so the requests after it
        wait for both.  False if a hold is queued already (they queue behind that one)."""
        queue = self._busy.get(handle)
        if queue is None:
            self._busy[handle] = deque()
            return True
        if HOLD in queue:
            return False
        queue.append(HOLD)
        return True

    def release_handle(self, handle: int, now: float) -> list[Action]:
        """The offloaded STORE :meth:`hold_handle` waited for is over: drop the hold if it
        is still queued, else (it has the handle) run what queued behind it."""
        out: list[Action] = []
        queue = self._busy.get(handle)
        if queue is not None and HOLD in queue:
            queue.remove(HOLD)
            return out
        self._release(handle, now, out)
        return out

    def credits_left(self, session: int) -> int:
        """Request Credits minus the requests the core holds for ``session`` (§9.2)."""
        sess = self._sessions.get(session)
        return 0 if sess is None else self.config.request_credits - sess.inflight

    def offloaded_ring_ops(
        self, session: int, records: list[RingRecord], now: float
    ) -> list[Action]:
        """Account the ALLOC_STOREs and FREEs the session's chain ran on its partition ring
        (docs/kbtp.md §8.1), in the order they ran, as if the core had run them: usage,
        bound blocks, the ring's tickets, waiting allocations woken (§3.3, §3.4, §6.4)."""
        out: list[Action] = []
        sess = self._sessions.get(session)
        if not records or sess is None or sess.identity is None:
            return out
        ini = self._initiators[sess.identity]
        ring = self._rings[ini.ring]
        for record in records:
            if record.freed:
                self._bound_blocks.pop(record.block, None)
                ini.bound -= 1
                ready: tuple[int, ...] = (record.ticket,)
            else:
                ready = ring.consumed_by_rnic(record.ticket, now)
                self._bound_blocks[record.block] = record.handle
                ini.bound += 1
            self._wake(ini.ring, ready, out, now)
        self.note_activity(session, now)
        return out

    # -- §6.4 Block Free -----------------------------------------------------------------
    def _free(
        self, session: int, ini: InitiatorState, req: Free, now: float, out: list[Action]
    ) -> bool:
        status, entry = self._entry_checks(req, ini)
        if status is not Status.SUCCESS or entry is None:
            return self._fail(out, session, req, status)
        if not entry.valid:
            return self._fail(out, session, req, Status.NOT_VALID)
        at = self.layout.entry_offset(req.handle)
        generation = next_generation(entry.generation)
        write_entry(
            self.memory,
            at,
            TableEntry(TableFlag.NONE, generation, entry.data_length, entry.block_offset),
        )
        self._persist(at, TABLE_ENTRY_LEN)  # durable before the block can be reused (§12.4)
        self._bound_blocks.pop(entry.block_offset, None)
        ini.bound -= 1
        self._return_block(self._ring_of_block(entry.block_offset), entry.block_offset, out, now)
        self._complete(out, session, req, Status.SUCCESS, generation, 0, entry.block_offset)
        return True

    def _ring_of_block(self, block_offset: int) -> int:
        index = self.layout.block_index(block_offset)
        if index is None:
            raise LocalError(f"table names block offset 0x{block_offset:x} outside the pool")
        for rid, part in enumerate(self.layout.partitions):
            if part.first_block <= index < part.first_block + part.blocks:
                return rid
        return SHARED_RING

    # -- §6.6 BIND -------------------------------------------------------------------------
    def _bind(
        self,
        session: int,
        sess: SessionState,
        ini: InitiatorState,
        req: Bind,
        now: float,
        out: list[Action],
    ) -> bool:
        if not sess.capabilities & Capability.DIRECT_ALLOC:
            return self._fail(out, session, req, Status.NOT_OFFERED)
        status, entry = self._entry_checks(req, ini)
        if status is not Status.SUCCESS or entry is None:
            return self._fail(out, session, req, status)
        if entry.valid:
            return self._fail(out, session, req, Status.ALREADY_VALID)
        if req.data_length > self.config.block_size:
            return self._fail(out, session, req, Status.TOO_LONG_FOR_BLOCK)
        ring = self._rings[ini.ring]
        if req.ticket in ring.abandoned:
            return self._fail(out, session, req, Status.TICKET_ABANDONED)
        violation = self._direct_violation(ini, now)
        if violation is not None:
            return self._over_quota(session, req, entry.generation, now, out, violation)
        if not self._bindable(ini, req):
            return self._fail(out, session, req, Status.BAD_BIND)
        # Within quota: usage (which counts this ticket) was checked by _direct_violation.
        _, ready = ring.consume(req.ticket)
        self._wake(ini.ring, ready, out, now)
        self._finish_alloc(session, req, req.block_offset, out)
        return True

    def _bindable(self, ini: InitiatorState, req: Bind) -> bool:
        """BAD_BIND unless (docs/kbtp.md §6.6): the Block Offset is one of the initiator's
        partition blocks (in range, on a block boundary) that no handle has bound, and the
        ticket is an outstanding direct ticket of that ring whose slot holds exactly
        {Sequence ticket, that Block Offset}.  The slots are the target's own memory, but
        nothing an initiator sends is taken on trust: a forged offset never reaches the
        table, so no later FREE, STORE or LOAD can touch a block outside the partition."""
        lay = self.layout
        part = lay.partitions[ini.ring]
        index = lay.block_index(req.block_offset)
        if index is None or not part.first_block <= index < part.first_block + part.blocks:
            return False
        if req.block_offset in self._bound_blocks:
            return False
        ring = self._rings[ini.ring]
        held = ring.outstanding.get(req.ticket)
        if held is None or held.owner is not TicketOwner.DIRECT or held.abandoned:
            return False
        return ring.ready_block(req.ticket) == req.block_offset
