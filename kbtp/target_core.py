"""The KBTP target as a sans-IO engine (draft §3, §6; docs/kbtp.md §4, §6-§9).

Theory of operation
-------------------
:class:`TargetCore` owns one memory buffer holding the block table, the block pool and the
free-block rings (layouts of :mod:`kbtp.layout`, planned from a
:class:`~kbtp.target_config.TargetConfig`).  A binding to an RNIC registers that buffer,
then feeds the core what happens and carries out the actions (:mod:`kbtp.target_actions`)
it returns:

* ``open_session(sid)`` when an RDMAP stream is established; ``handle_message(sid, bytes,
  now)`` for every received Send; ``rdma_completed(op_id, now)`` / ``rdma_failed(op_id,
  now)`` when an RDMA Write, RDMA Read or local invalidation it asked for finishes;
  ``memory_registered(op_id, stag, now)`` when a region it asked for is registered;
  ``tick(now)`` periodically (Ticket Timeout); ``close_session(sid, now)`` when the
  connection is gone.
* Actions: :class:`SendMessage` (HELLO_ACK or COMPLETION as a Send, or a Send with
  Invalidate), :class:`WriteToInitiator` (RDMA Write of block octets),
  :class:`ReadFromInitiator` (RDMA Read of the initiator's buffer into a block),
  :class:`InvalidateStag` (local invalidation of a Partition or Ring STag),
  :class:`RegisterMemory` / :class:`DeregisterMemory` (the per-session regions of the
  direct modes, docs/kbtp.md §3.6), :class:`CloseSession`.

The core never blocks: a request that needs an RDMA operation stays pending until the
binding reports its completion, and the table is updated only then (a STORE's data is in
the block before Data Length changes; a LOAD's COMPLETION is sent after its Write).
Requests naming the same handle are executed one at a time in arrival order; requests on
different handles overlap freely (pipelining).  A HELLO granting a direct mode asks for
its session's regions to be registered; its HELLO_ACK goes out once every STag is known
(messages arriving meanwhile wait), and the regions are deregistered when the binding
reports the connection gone.  Time is an argument; the Ring FetchAdds go through an
injected atomic engine.

The engine is one class in parts: :mod:`kbtp.target_ops` (requests, draft §6),
:mod:`kbtp.target_tickets` (blocks back to rings, direct tickets, draft §3.4),
:mod:`kbtp.target_hello` (HELLO, its regions and HELLO_ACK, docs/kbtp.md §4.2), this module
(sessions, feedback), over the state of :mod:`kbtp.target_state`.
"""

from __future__ import annotations

from collections import deque

from kbtp.constants import Capability, CounterFormat, Status
from kbtp.layout import PartitionLayout, TargetLayout, init_table
from kbtp.messages import (
    AllocStore,
    Bind,
    Completion,
    Free,
    Hello,
    HelloAck,
    KbtpError,
    Load,
    Message,
    Store,
    decode_message,
)
from kbtp.ring import FetchAdd, FreeRing, make_local_fetch_add
from kbtp.session_rules import target_refusal
from kbtp.target_actions import Action, CloseSession, DeregisterMemory
from kbtp.target_config import TargetConfig, check_config, check_handle_ranges, plan_target_layout
from kbtp.target_hello import _STAG_OF as _STAG_OF
from kbtp.target_hello import HelloOps
from kbtp.target_ops import RequestOps
from kbtp.target_state import SHARED_RING, InitiatorState, OpKind, Persist, SessionState
from kbtp.target_tickets import TicketOps
from stack.errors import LocalError

__all__ = ["TargetCore"]


class TargetCore(RequestOps, TicketOps, HelloOps):
    """Sans-IO KBTP target (draft §3, §6).  See the module docstring for the protocol."""

    def __init__(
        self,
        config: TargetConfig,
        memory: memoryview | bytearray | None = None,
        *,
        fetch_add: FetchAdd | None = None,
        recovered: bool = False,
        persist: Persist | None = None,
    ) -> None:
        """``recovered``: ``memory`` holds a recovered pool (docs/kbtp.md §12.3) to adopt, not
        initialize; ``persist(offset, length)`` makes memory durable at each seal and free."""
        check_config(config)
        self.config = config
        self.layout: TargetLayout = plan_target_layout(config)
        check_handle_ranges(config, self.layout)
        if memory is None:
            memory = bytearray(self.layout.size)
        mem = memoryview(memory).cast("B")
        if len(mem) < self.layout.size:
            raise LocalError(f"memory of {len(mem)} octets, the layout needs {self.layout.size}")
        self.memory = mem
        self.fetch_add = fetch_add or make_local_fetch_add(config.counter_byteorder)
        self.persist = persist

        # rings
        self._rings = {}
        lay = self.layout
        shared_users = [i for i in config.initiators if not i.direct_alloc]
        if lay.shared_ring is not None:
            domains = {i.trust_domain for i in shared_users}
            ring = FreeRing(mem, lay.shared_ring, self.fetch_add, clear_on_free=len(domains) > 1)
            self._rings[SHARED_RING] = ring
        for index, part in enumerate(lay.partitions):
            self._rings[index] = FreeRing(mem, part.ring, self.fetch_add)

        # memory contents
        if not recovered:
            init_table(mem, lay)
            pool_off, pool_len = lay.pool_region
            mem[pool_off : pool_off + pool_len] = bytes(pool_len)
            if SHARED_RING in self._rings:
                shared = range(lay.shared_first_block, lay.shared_first_block + lay.shared_blocks)
                self._rings[SHARED_RING].initialize([lay.block_to(b) for b in shared])
            for index, part in enumerate(lay.partitions):
                self._rings[index].initialize(self._partition_blocks(part))

        self._initiators = {}
        part_index = 0
        for ic in config.initiators:
            rid = SHARED_RING
            if ic.direct_alloc:
                rid, part_index = part_index, part_index + 1
            self._initiators[ic.identity] = InitiatorState(ic, rid)

        self._sessions = {}
        self._ops = {}
        self._next_op = 1
        self._busy = {}
        self._waiters = {}
        self._bound_blocks = {}  # Block Offset -> the handle whose VALID entry holds it
        self._registered = {}  # session -> STags registered for it, until close_session
        self._orphans = {}  # op id -> session: registrations asked for by a closed session
        if recovered:
            self._adopt_table()

    def _partition_blocks(self, part: PartitionLayout) -> list[int]:
        return [
            self.layout.block_to(b) for b in range(part.first_block, part.first_block + part.blocks)
        ]

    # ----------------------------------------------------------------------------------
    # inspection (tests, tools, the state-space exploration)
    # ----------------------------------------------------------------------------------
    def ring_of(self, identity: bytes | None = None) -> FreeRing:
        """The ring an identity allocates from (the shared ring for None)."""
        rid = SHARED_RING if identity is None else self._initiators[identity].ring
        return self._rings[rid]

    @property
    def rings(self) -> dict[int, FreeRing]:
        return dict(self._rings)

    def held_blocks(self) -> list[int]:
        """Blocks consumed from a ring by a pending ALLOC_STORE and not yet in the table."""
        return [op.block for op in self._ops.values() if op.kind is OpKind.ALLOC_READ]

    def block_bytes(self, block_offset: int, length: int | None = None) -> bytes:
        start = self.layout.offset_of(block_offset)
        size = self.config.block_size if length is None else length
        return bytes(self.memory[start : start + size])

    def pending_ops(self) -> int:
        return len(self._ops)

    def session_identity(self, session: int) -> bytes | None:
        s = self._sessions.get(session)
        return None if s is None else s.identity

    def direct_alloc_enabled(self, session: int) -> bool:
        s = self._sessions.get(session)
        return s is not None and s.direct_alloc

    # ----------------------------------------------------------------------------------
    # sessions
    # ----------------------------------------------------------------------------------
    def open_session(
        self, session: int, now: float = 0.0, *, ird: int | None = None, ord: int | None = None
    ) -> None:
        """An RDMAP stream is established at ``now``; the next message on it must be HELLO,
        within the HELLO timeout (docs/kbtp.md §4.2).

        ``ird`` / ``ord``: the target's IRD and ORD on this stream as negotiated (RFC 6581),
        None if unknown; their minimums (docs/kbtp.md §4.1) are checked at HELLO.
        """
        if session in self._sessions:
            raise LocalError(f"session {session} already open")
        self._sessions[session] = SessionState(opened=now, active=now, ird=ird, ord=ord)

    def close_session(self, session: int, now: float) -> list[Action]:
        """The connection is gone (closed, reset, Terminated): release what it held.

        Returns actions for other sessions' requests that were waiting behind this
        session's operations, then the deregistration of every region registered for it.
        Unknown or already closed sessions are ignored.
        """
        out: list[Action] = []
        self._teardown(session, now, out)
        out.extend(DeregisterMemory(session, s) for s in self._registered.pop(session, ()))
        return out

    # ----------------------------------------------------------------------------------
    # inbound messages
    # ----------------------------------------------------------------------------------
    def receive_batch(self, session: int) -> None:
        """The binding is about to hand over the messages that arrived since its last call
        (one drain of the session's completion queue): they were all sent before the
        initiator could see any COMPLETION the core sends from now on, so those do not
        return credits until the next call (docs/kbtp.md §9.2).  A binding that never calls
        this gets a credit back with every COMPLETION, and over-credit requests that are
        answered in time go unnoticed."""
        sess = self._sessions.get(session)
        if sess is not None:
            sess.batching = True
            sess.uncredited = 0

    def handle_message(
        self, session: int, data: bytes | bytearray | memoryview, now: float
    ) -> list[Action]:
        """A Send arrived on ``session``: decode it and process it.

        Messages for a session that is not open (e.g. closed by a CloseSession action
        moments ago) are ignored.
        """
        out: list[Action] = []
        sess = self._sessions.get(session)
        if sess is None:
            return out
        if now > sess.active:
            sess.active = now
        if sess.hello_ack is not None:
            sess.early.append(bytes(data))  # processed after the HELLO_ACK
            return out
        try:
            message = decode_message(data)
        except KbtpError as exc:
            rid = exc.request_id or 0
            if sess.identity is None:
                self._send(out, session, HelloAck(rid, exc.status))
                self._close(session, now, exc.status, str(exc), out)
                return out
            if self._over_credit(sess):
                return self._credit_exceeded(session, rid, exc.handle, exc.opcode or 0, now)
            self._send(
                out,
                session,
                Completion(rid, exc.handle, 0, exc.status, request_opcode=exc.opcode or 0),
            )
            if exc.fatal:
                self._close(session, now, exc.status, str(exc), out)
            return out
        return self._request(session, sess, message, now, out)

    def handle_request(self, session: int, message: Message, now: float) -> list[Action]:
        """Process a decoded message (HELLO or a request) from ``session``."""
        out: list[Action] = []
        sess = self._sessions.get(session)
        if sess is None:
            return out
        if sess.hello_ack is not None:
            sess.early.append(message)  # processed after the HELLO_ACK
            return out
        return self._request(session, sess, message, now, out)

    def _request(
        self, session: int, sess: SessionState, message: Message, now: float, out: list[Action]
    ) -> list[Action]:
        """:meth:`handle_request` of an open session not waiting for its HELLO_ACK."""
        refusal = target_refusal(message.opcode, sess.identity is not None)
        if refusal is None and isinstance(message, Hello):
            self._hello(session, sess, message, now, out)
            return out
        if refusal is not None:
            status, reason = refusal
            rid = message.request_id
            if isinstance(message, Hello) or status is Status.NO_SESSION:
                self._send(out, session, HelloAck(rid, status))
            else:
                echo = Completion(
                    rid, getattr(message, "handle", 0), status=status, request_opcode=message.opcode
                )  # the Handle and Opcode of what was refused (§5.8)
                self._send(out, session, echo)
            self._close(session, now, status, reason, out)
            return out
        assert isinstance(message, Load | Store | AllocStore | Free | Bind)
        if self._over_credit(sess):
            return self._credit_exceeded(
                session, message.request_id, message.handle, message.opcode, now
            )
        sess.inflight += 1
        queue = self._busy.get(message.handle)
        if queue is not None:
            queue.append((session, message))
            return out
        self._busy[message.handle] = deque()
        if self._execute(session, message, now, out):
            self._release(message.handle, now, out)
        return out

    # ----------------------------------------------------------------------------------
    # feedback from the binding
    # ----------------------------------------------------------------------------------
    def rdma_completed(self, op_id: int, now: float) -> list[Action]:
        """An RDMA Write/Read or invalidation the core asked for has completed."""
        out: list[Action] = []
        op = self._ops.get(op_id)
        if op is None:
            return out  # aborted with its session
        if op.kind is OpKind.REGISTER:
            raise LocalError(f"op {op_id} is a registration: report it with memory_registered")
        del self._ops[op_id]
        sess = self._sessions.get(op.session)
        if sess is not None and now > sess.active:
            sess.active = now
        if op.kind is OpKind.INVALIDATE:
            self._invalidated(op_id, op, now, out)
            return out
        req = op.request
        assert req is not None
        if op.kind is OpKind.LOAD_WRITE:
            assert op.entry is not None
            self._complete(
                out,
                op.session,
                req,
                Status.SUCCESS,
                op.entry.generation,
                op.entry.data_length,
                op.entry.block_offset,
            )
        elif op.kind is OpKind.STORE_READ:
            assert isinstance(req, Store)
            self._finish_store(op.session, req, out)
        elif op.kind is OpKind.ALLOC_READ:
            assert isinstance(req, AllocStore)
            self._finish_alloc(op.session, req, op.block, out)
        else:  # pragma: no cover - ALLOC_WAIT ops are resumed by slot fills, not completions
            raise LocalError(f"op {op_id} ({op.kind.value}) has no RDMA operation")
        self._release(req.handle, now, out)
        return out

    def rdma_failed(
        self, op_id: int, now: float, reason: str = "RDMA operation failed"
    ) -> list[Action]:
        """An operation the core asked for failed: an RDMA operation (remote access error:
        the stream is being terminated), an invalidation or a registration (the target
        failed; a HELLO waiting for the registration is answered TARGET_FAILURE)."""
        out: list[Action] = []
        op = self._ops.get(op_id)
        if op is None:
            return out
        if op.kind is OpKind.REGISTER:
            del self._ops[op_id]
            sess = self._sessions[op.session]
            sess.registering.discard(op_id)
            if sess.hello_ack is not None:
                ack = HelloAck(sess.hello_ack["request_id"], Status.TARGET_FAILURE)
                sess.hello_ack = None
                self._send(out, op.session, ack)
        local = op.kind in (OpKind.INVALIDATE, OpKind.REGISTER)
        status = Status.TARGET_FAILURE if local else Status.REMOTE_ACCESS_ERROR
        self._close(op.session, now, status, reason, out)
        return out

    def tick(self, now: float, session: int | None = None) -> list[Action]:
        """Advance time: close sessions past their HELLO deadline or idle timeout
        (docs/kbtp.md §4.2), find abandoned direct tickets (draft §3.4) and act on them.

        Call it at least every Ticket Timeout / 2 while a session is open, and at
        :meth:`next_deadline`.  With ``session``, only that session is looked at (a binding
        ticks each session on its own, so that a failure ends that session only).
        """
        out: list[Action] = []
        cfg = self.config
        for sid, sess in list(self._sessions.items()):
            if session is not None and sid != session:
                continue
            if sess.identity is None:
                if now - sess.opened >= cfg.hello_timeout:
                    reason = f"no HELLO within {cfg.hello_timeout:g} s"
                    self._close(sid, now, Status.NO_SESSION, reason, out)
                continue
            if cfg.idle_timeout is not None and now - sess.active >= cfg.idle_timeout:
                reason = f"idle for {cfg.idle_timeout:g} s"
                self._close(sid, now, Status.NO_SESSION, reason, out)
                continue
            if sess.capabilities & Capability.DIRECT_ALLOC:
                self._check_tickets(sid, sess, now, out)
        return out

    def next_deadline(self, now: float) -> float | None:
        """When :meth:`tick` should next run for a HELLO deadline or a direct ticket (None:
        neither pending).  Idle timeouts are found by the periodic ticks (at most Ticket
        Timeout / 2 late)."""
        deadline: float | None = None
        timeout = self.config.ticket_timeout
        for sess in self._sessions.values():
            if sess.identity is None:
                due = sess.opened + self.config.hello_timeout
                deadline = due if deadline is None else min(deadline, due)
                continue
            if not sess.capabilities & Capability.DIRECT_ALLOC:
                continue
            ring = self._rings[self._initiators[sess.identity].ring]
            candidates = [now + timeout / 2]
            expiry = ring.next_expiry(timeout)
            if expiry is not None:
                candidates.append(expiry)
            best = min(candidates)
            deadline = best if deadline is None else min(deadline, best)
        return deadline

    # ==================================================================================
    # internals: handle queues, closing
    # ==================================================================================
    def _release(self, handle: int, now: float, out: list[Action]) -> None:
        """The operation on ``handle`` is over: run the requests queued behind it."""
        while True:
            queue = self._busy.get(handle)
            if queue is None:
                return
            if not queue:
                del self._busy[handle]
                return
            session, req = queue.popleft()
            if req is None:  # a hold (hold_handle): it has the handle until released
                return
            if not self._execute(session, req, now, out):
                return

    def _over_credit(self, sess: SessionState) -> bool:
        """A request arrives: would it be beyond the Request Credits (docs/kbtp.md §9.2)?

        Outstanding at the initiator when it sent this request were at least the requests
        the core or the RNIC's chains hold (``inflight``, ``offloaded``, §8.1) and those
        answered since the last :meth:`receive_batch`: it arrived before they were sent.
        """
        return sess.inflight + sess.uncredited + sess.offloaded >= self.config.request_credits

    def _credit_exceeded(
        self, session: int, rid: int, handle: int, opcode: int, now: float
    ) -> list[Action]:
        """CREDIT_EXCEEDED (fatal) echoing the request's Request ID, Handle and Opcode."""
        out: list[Action] = []
        answer = Completion(rid, handle, status=Status.CREDIT_EXCEEDED, request_opcode=opcode)
        self._send(out, session, answer)
        self._close(session, now, Status.CREDIT_EXCEEDED, "more requests than request credits", out)
        return out

    def _close(
        self, session: int, now: float, status: Status, reason: str, out: list[Action]
    ) -> None:
        if session not in self._sessions:
            return
        self._teardown(session, now, out)
        out.append(CloseSession(session, status, reason))

    def _teardown(self, session: int, now: float, out: list[Action]) -> None:
        sess = self._sessions.pop(session, None)
        if sess is None:
            return
        ini = self._initiators.get(sess.identity) if sess.identity is not None else None
        # Requests of this session waiting behind a handle are dropped.
        for queue in self._busy.values():
            kept = [(s, r) for s, r in queue if s != session]
            queue.clear()
            queue.extend(kept)
        # Its operations are aborted (all of them first, so that no block returned below
        # can resume one of them); blocks they hold go back to their ring.
        doomed = [(op_id, op) for op_id, op in self._ops.items() if op.session == session]
        for op_id, op in doomed:
            del self._ops[op_id]
            if op.kind is OpKind.ALLOC_WAIT:
                self._waiters.pop((op.ring, op.ticket), None)
            elif op.kind is OpKind.REGISTER:
                self._orphans[op_id] = session
        partitioned = ini is not None and ini.config.direct_alloc
        for _, op in doomed:
            if op.kind in (OpKind.ALLOC_READ, OpKind.ALLOC_WAIT):
                assert ini is not None
                ini.allocating -= 1
                if partitioned:
                    continue  # the partition ring is rebuilt below
                if op.kind is OpKind.ALLOC_READ:
                    self._return_block(op.ring, op.block, out, now)
                else:
                    self._reclaim(op.ring, op.ticket, out, now)
        if ini is not None:
            ini.session = None
            if partitioned:
                self._reset_partition(ini)
        for _, op in doomed:
            if op.request is not None:
                self._release(op.request.handle, now, out)

    def _reset_partition(
        self, ini: InitiatorState, counter_format: CounterFormat | None = None
    ) -> None:
        """Rebuild a partition's ring from its unbound blocks (no session can reach it now),
        in ``counter_format`` (None: the ring's current one)."""
        part = self.layout.partitions[ini.ring]
        bound = set()
        cfg = ini.config
        for h in range(cfg.handle_base, cfg.handle_base + cfg.handle_count):
            e = self.entry(h)
            if e.valid:
                bound.add(e.block_offset)
        free = [b for b in self._partition_blocks(part) if b not in bound]
        for key in [k for k in self._waiters if k[0] == ini.ring]:
            del self._waiters[key]
        self._rings[ini.ring].initialize(free, counter_format)
        ini.bound = len(bound)
        ini.allocating = 0
