"""The KBTP target as a sans-IO engine (draft §3, §6; docs/kbtp.md §6-§9).

Theory of operation
-------------------
:class:`TargetCore` owns one memory buffer holding the block table, the block pool and the
free-block rings (layouts of :mod:`kbtp.layout`).  A binding to an RNIC registers that
buffer, then feeds the core what happens and carries out the actions it returns:

* ``open_session(sid)`` when an RDMAP stream is established; ``handle_message(sid, bytes,
  now)`` for every received Send; ``rdma_completed(op_id, now)`` / ``rdma_failed(op_id,
  now)`` when an RDMA Write, RDMA Read or local invalidation it asked for finishes;
  ``tick(now)`` periodically (Ticket Timeout); ``close_session(sid, now)`` when the
  connection is gone.
* Actions: :class:`SendMessage` (HELLO_ACK or COMPLETION as a Send, or a Send with
  Invalidate), :class:`WriteToInitiator` (RDMA Write of block octets), :class:`ReadFromInitiator`
  (RDMA Read of the initiator's buffer into a block), :class:`InvalidateStag` (local
  invalidation of a Partition or Ring STag), :class:`CloseSession`.

The core never blocks: a request that needs an RDMA operation stays pending until the
binding reports its completion, and the table is updated only then (a STORE's data is in
the block before Data Length changes; a LOAD's COMPLETION is sent after its Write).
Requests naming the same handle are executed one at a time in arrival order; requests on
different handles overlap freely (pipelining).  Time is an argument; the Ring FetchAdds go
through an injected atomic engine and STags come from an injected registrar.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from enum import Enum

from kbtp.constants import (
    DEFAULT_MAX_INLINE,
    DEFAULT_REQUEST_CREDITS,
    DEFAULT_TICKET_TIMEOUT,
    GENERATION_ANY,
    NO_BLOCK_OFFSET,
    RDMAP_BINDING_CAPABILITIES,
    Capability,
    RequestFlag,
    Status,
    TableFlag,
    next_generation,
)
from kbtp.layout import (
    ByteOrder,
    PartitionLayout,
    TableEntry,
    TargetLayout,
    init_table,
    plan_layout,
    read_entry,
    write_entry,
)
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
    Request,
    Store,
    decode_message,
)
from kbtp.ring import FetchAdd, FreeRing, TicketOwner, make_local_fetch_add
from stack.constants import TERM_RDMAP_OP_UNSPECIFIED, TermCode
from stack.errors import LocalError

SHARED_RING = -1
"""Ring id of the shared ring; partition rings are numbered 0.. in configuration order."""


# ======================================================================================
# Configuration
# ======================================================================================


@dataclass(frozen=True, slots=True)
class InitiatorConfig:
    """What the target grants one initiator identity (docs/kbtp.md §4.2).

    Fields: identity (the HELLO identity), handle_base, handle_count (its range),
    quota (Allocation Quota), trust_domain (blocks are cleared when they move between
    domains), direct_load, direct_alloc (offer the direct modes; only to trusted
    initiators, draft §6.6; direct_alloc gives it a partition of ``quota`` blocks).
    """

    identity: bytes
    handle_base: int
    handle_count: int
    quota: int
    trust_domain: str = "default"
    direct_load: bool = False
    direct_alloc: bool = False

    def owns(self, handle: int) -> bool:
        return 0 <= handle - self.handle_base < self.handle_count


@dataclass(frozen=True, slots=True)
class TargetConfig:
    """A target's pool, table and policy.

    Fields: block_size, pool_blocks (F), initiators, table_base_handle, table_entries
    (None: up to the highest configured handle), request_credits, max_inline,
    ticket_timeout (seconds), base_to (Tagged Offset of memory byte 0),
    counter_byteorder, shared_ring_order (None: smallest N >= shared blocks).
    """

    block_size: int
    pool_blocks: int
    initiators: tuple[InitiatorConfig, ...]
    table_base_handle: int = 0
    table_entries: int | None = None
    request_credits: int = DEFAULT_REQUEST_CREDITS
    max_inline: int = DEFAULT_MAX_INLINE
    ticket_timeout: float = DEFAULT_TICKET_TIMEOUT
    base_to: int = 0
    counter_byteorder: ByteOrder = "little"
    shared_ring_order: int | None = None


class RegionKind(Enum):
    """Memory regions the core asks the binding to register (docs/kbtp.md §3.6)."""

    TABLE = "table"  # remote read (DIRECT_LOAD)
    POOL = "pool"  # remote read (DIRECT_LOAD)
    RING = "ring"  # remote read + remote atomic: one partition ring's slots and Head
    PARTITION = "partition"  # remote write: one partition's blocks


Registrar = Callable[[RegionKind, int, int], int]
"""(kind, byte offset, length) -> STag of a new registration over that part of memory."""


class CountingRegistrar:
    """A registrar for tests: hands out STags 0x100, 0x200, ... and remembers the regions."""

    def __init__(self) -> None:
        self.regions: dict[int, tuple[RegionKind, int, int]] = {}

    def __call__(self, kind: RegionKind, offset: int, length: int) -> int:
        stag = 0x100 * (len(self.regions) + 1)
        self.regions[stag] = (kind, offset, length)
        return stag


# ======================================================================================
# Actions
# ======================================================================================


@dataclass(frozen=True, slots=True)
class SendMessage:
    """Send ``message`` (Send, or Send with Invalidate of ``invalidate_stag``)."""

    session: int
    message: HelloAck | Completion
    invalidate_stag: int | None = None

    def encode(self) -> bytes:
        return self.message.encode()


@dataclass(frozen=True, slots=True)
class WriteToInitiator:
    """RDMA Write ``length`` octets at target Tagged Offset ``local_to`` to the initiator."""

    op_id: int
    session: int
    local_to: int
    length: int
    remote_stag: int
    remote_to: int


@dataclass(frozen=True, slots=True)
class ReadFromInitiator:
    """RDMA Read ``length`` octets of the initiator's buffer into target TO ``local_to``."""

    op_id: int
    session: int
    remote_stag: int
    remote_to: int
    length: int
    local_to: int


@dataclass(frozen=True, slots=True)
class InvalidateStag:
    """Invalidate a local STag (Partition or Ring STag); report completion like an RDMA op."""

    op_id: int
    session: int
    stag: int


@dataclass(frozen=True, slots=True)
class CloseSession:
    """Close the stream (Terminate ``term``, then TCP close) after the preceding Sends."""

    session: int
    status: Status
    reason: str
    term: TermCode = TERM_RDMAP_OP_UNSPECIFIED


Action = SendMessage | WriteToInitiator | ReadFromInitiator | InvalidateStag | CloseSession


# ======================================================================================
# Internal state (plain containers: see TargetCore.clone)
# ======================================================================================


class _OpKind(Enum):
    LOAD_WRITE = "load-write"
    STORE_READ = "store-read"
    ALLOC_WAIT = "alloc-wait"  # ticket taken, slot not yet filled
    ALLOC_READ = "alloc-read"  # block consumed, RDMA Read in flight
    INVALIDATE = "invalidate"


@dataclass(slots=True)
class _Op:
    kind: _OpKind
    session: int
    request: Request | None
    ring: int = SHARED_RING
    ticket: int = 0
    block: int = NO_BLOCK_OFFSET
    entry: TableEntry | None = None


@dataclass(slots=True)
class _Session:
    identity: bytes | None = None
    capabilities: Capability = Capability.NONE
    inflight: int = 0
    table_stag: int = 0
    pool_stag: int = 0
    ring_stag: int = 0
    partition_stag: int = 0
    direct_alloc: bool = False  # DIRECT_ALLOC currently usable (STags valid)
    invalidating: set[int] = field(default_factory=set)  # op ids of pending invalidations


@dataclass(slots=True)
class _Initiator:
    config: InitiatorConfig
    ring: int
    session: int | None = None
    bound: int = 0
    allocating: int = 0  # target-executed allocations holding a ticket or block


OVER_QUOTA = "direct allocations exceed the Allocation Quota"

_RECLAIM = -1
"""Waiter marker: an abandoned ticket whose block is reclaimed when its slot is filled."""


# ======================================================================================
# The engine
# ======================================================================================


class TargetCore:
    """Sans-IO KBTP target (draft §3, §6).  See the module docstring for the protocol."""

    def __init__(
        self,
        config: TargetConfig,
        memory: memoryview | bytearray | None = None,
        *,
        fetch_add: FetchAdd | None = None,
        registrar: Registrar | None = None,
    ) -> None:
        self.config = config
        self._validate_config()
        partitioned = [i for i in config.initiators if i.direct_alloc]
        table_entries = config.table_entries
        if table_entries is None:
            table_entries = max(
                i.handle_base + i.handle_count - config.table_base_handle for i in config.initiators
            )
        self.layout: TargetLayout = plan_layout(
            block_size=config.block_size,
            pool_blocks=config.pool_blocks,
            partition_sizes=[i.quota for i in partitioned],
            table_entries=table_entries,
            table_base_handle=config.table_base_handle,
            shared_ring_order=config.shared_ring_order,
            base_to=config.base_to,
            byteorder=config.counter_byteorder,
        )
        self._check_ranges()
        if memory is None:
            memory = bytearray(self.layout.size)
        mem = memoryview(memory).cast("B")
        if len(mem) < self.layout.size:
            raise LocalError(f"memory of {len(mem)} octets, the layout needs {self.layout.size}")
        self.memory = mem
        self.fetch_add = fetch_add or make_local_fetch_add(config.counter_byteorder)
        self.registrar: Registrar = registrar or CountingRegistrar()

        # rings
        self._rings: dict[int, FreeRing] = {}
        lay = self.layout
        shared_users = [i for i in config.initiators if not i.direct_alloc]
        if lay.shared_ring is not None:
            domains = {i.trust_domain for i in shared_users}
            ring = FreeRing(mem, lay.shared_ring, self.fetch_add, clear_on_free=len(domains) > 1)
            self._rings[SHARED_RING] = ring
        for index, part in enumerate(lay.partitions):
            self._rings[index] = FreeRing(mem, part.ring, self.fetch_add)

        # memory contents
        init_table(mem, lay)
        pool_off, pool_len = lay.pool_region
        mem[pool_off : pool_off + pool_len] = bytes(pool_len)
        if SHARED_RING in self._rings:
            shared = range(lay.shared_first_block, lay.shared_first_block + lay.shared_blocks)
            self._rings[SHARED_RING].initialize([lay.block_to(b) for b in shared])
        for index, part in enumerate(lay.partitions):
            self._rings[index].initialize(self._partition_blocks(part))

        self._initiators: dict[bytes, _Initiator] = {}
        part_index = 0
        for ic in config.initiators:
            ring = SHARED_RING
            if ic.direct_alloc:
                ring, part_index = part_index, part_index + 1
            self._initiators[ic.identity] = _Initiator(ic, ring)

        self._sessions: dict[int, _Session] = {}
        self._ops: dict[int, _Op] = {}
        self._next_op = 1
        self._busy: dict[int, deque[tuple[int, Request]]] = {}
        self._waiters: dict[tuple[int, int], int] = {}

    # ----------------------------------------------------------------------------------
    # configuration checks
    # ----------------------------------------------------------------------------------
    def _validate_config(self) -> None:
        c = self.config
        if not c.initiators:
            raise LocalError("a target needs at least one initiator identity")
        if len({i.identity for i in c.initiators}) != len(c.initiators):
            raise LocalError("initiator identities must be distinct")
        if sum(i.quota for i in c.initiators) > c.pool_blocks:
            raise LocalError("the sum of Allocation Quotas exceeds the pool size F (draft §3.4)")
        if c.request_credits < 1 or c.request_credits > 0xFFFF:
            raise LocalError("request credits must be 1..65535")
        if c.ticket_timeout <= 0:
            raise LocalError("the Ticket Timeout must be positive")
        for i in c.initiators:
            if i.quota < 0 or i.handle_count < 0 or (i.direct_alloc and i.quota < 1):
                raise LocalError(f"bad quota or handle range for {i.identity!r}")

    def _check_ranges(self) -> None:
        spans = sorted(
            (i.handle_base, i.handle_base + i.handle_count) for i in self.config.initiators
        )
        for (_, end), (start, _) in zip(spans, spans[1:], strict=False):
            if start < end:
                raise LocalError("initiator handle ranges overlap")
        for start, end in spans:
            if end > start and not (self.layout.serves(start) and self.layout.serves(end - 1)):
                raise LocalError("an initiator handle range lies outside the table")

    def _partition_blocks(self, part: PartitionLayout) -> list[int]:
        return [
            self.layout.block_to(b) for b in range(part.first_block, part.first_block + part.blocks)
        ]

    # ----------------------------------------------------------------------------------
    # inspection (tests, tools, the state-space exploration)
    # ----------------------------------------------------------------------------------
    def entry(self, handle: int) -> TableEntry:
        """The table entry of ``handle`` as stored in memory."""
        if not self.layout.serves(handle):
            raise LocalError(f"handle {handle} is not served")
        return read_entry(self.memory, self.layout.entry_offset(handle))

    def ring_of(self, identity: bytes | None = None) -> FreeRing:
        """The ring an identity allocates from (the shared ring for None)."""
        rid = SHARED_RING if identity is None else self._initiators[identity].ring
        return self._rings[rid]

    @property
    def rings(self) -> dict[int, FreeRing]:
        return dict(self._rings)

    def usage(self, identity: bytes) -> int:
        """Bound handles + tickets taken and not bound (draft §3.4)."""
        ini = self._initiators[identity]
        direct = self._rings[ini.ring].direct_outstanding() if ini.config.direct_alloc else 0
        return ini.bound + ini.allocating + direct

    def held_blocks(self) -> list[int]:
        """Blocks consumed from a ring by a pending ALLOC_STORE and not yet in the table."""
        return [op.block for op in self._ops.values() if op.kind is _OpKind.ALLOC_READ]

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

    def clone(self) -> TargetCore:
        """An independent copy (memory and bookkeeping) for state-space exploration."""
        new = object.__new__(TargetCore)
        new.__dict__.update(self.__dict__)
        new.memory = memoryview(bytearray(self.memory))
        new._rings = {rid: ring.clone(new.memory) for rid, ring in self._rings.items()}
        # Requests, configs and table entries are immutable; everything else is copied.
        new._initiators = {
            k: _Initiator(v.config, v.ring, v.session, v.bound, v.allocating)
            for k, v in self._initiators.items()
        }
        new._sessions = {
            k: replace(v, invalidating=set(v.invalidating)) for k, v in self._sessions.items()
        }
        new._ops = {
            k: _Op(v.kind, v.session, v.request, v.ring, v.ticket, v.block, v.entry)
            for k, v in self._ops.items()
        }
        new._busy = {k: deque(v) for k, v in self._busy.items()}
        new._waiters = dict(self._waiters)
        return new

    def state_key(self, now: float) -> tuple[object, ...]:
        """Hashable summary of everything that determines future behaviour (op ids aside)."""
        timeout = self.config.ticket_timeout
        ops = tuple(
            sorted(
                (op.kind.value, op.session, repr(op.request), op.ring, op.ticket, op.block)
                for op in self._ops.values()
            )
        )
        return (
            bytes(self.memory),
            tuple((rid, r.state_key(now, timeout)) for rid, r in sorted(self._rings.items())),
            tuple(
                (k, v.session, v.bound, v.allocating) for k, v in sorted(self._initiators.items())
            ),
            tuple(
                (
                    sid,
                    s.identity,
                    int(s.capabilities),
                    s.inflight,
                    s.direct_alloc,
                    len(s.invalidating),
                )
                for sid, s in sorted(self._sessions.items())
            ),
            ops,
            tuple(sorted((h, tuple(repr(x) for x in q)) for h, q in self._busy.items())),
            tuple(sorted((k, v if v == _RECLAIM else 0) for k, v in self._waiters.items())),
        )

    # ----------------------------------------------------------------------------------
    # sessions
    # ----------------------------------------------------------------------------------
    def open_session(self, session: int) -> None:
        """An RDMAP stream is established; the next message on it must be HELLO."""
        if session in self._sessions:
            raise LocalError(f"session {session} already open")
        self._sessions[session] = _Session()

    def close_session(self, session: int, now: float) -> list[Action]:
        """The connection is gone (closed, reset, Terminated): release what it held.

        Returns actions for other sessions' requests that were waiting behind this
        session's operations.  Unknown or already closed sessions are ignored.
        """
        out: list[Action] = []
        self._teardown(session, now, out)
        return out

    # ----------------------------------------------------------------------------------
    # inbound messages
    # ----------------------------------------------------------------------------------
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
        try:
            message = decode_message(data)
        except KbtpError as exc:
            rid = exc.request_id or 0
            if sess.identity is None:
                self._send(out, session, HelloAck(rid, exc.status))
                self._close(session, now, exc.status, str(exc), out)
                return out
            if sess.inflight >= self.config.request_credits:
                return self._credit_exceeded(session, rid, now)
            self._send(
                out,
                session,
                Completion(rid, exc.handle, 0, exc.status, request_opcode=exc.opcode or 0),
            )
            if exc.fatal:
                self._close(session, now, exc.status, str(exc), out)
            return out
        return self.handle_request(session, message, now)

    def handle_request(self, session: int, message: Message, now: float) -> list[Action]:
        """Process a decoded message (HELLO or a request) from ``session``."""
        out: list[Action] = []
        sess = self._sessions.get(session)
        if sess is None:
            return out
        if isinstance(message, Hello):
            self._hello(session, sess, message, now, out)
            return out
        if sess.identity is None:
            rid = getattr(message, "request_id", 0)
            self._send(out, session, HelloAck(rid, Status.NO_SESSION))
            self._close(session, now, Status.NO_SESSION, "request before HELLO", out)
            return out
        if not isinstance(message, Load | Store | AllocStore | Free | Bind):
            self._send(
                out,
                session,
                Completion(
                    message.request_id, status=Status.BAD_OPCODE, request_opcode=message.opcode
                ),
            )
            self._close(
                session, now, Status.BAD_OPCODE, f"{message.opcode.name} sent to a target", out
            )
            return out
        if sess.inflight >= self.config.request_credits:
            return self._credit_exceeded(session, message.request_id, now)
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
        op = self._ops.pop(op_id, None)
        if op is None:
            return out  # aborted with its session
        if op.kind is _OpKind.INVALIDATE:
            self._invalidated(op_id, op, now, out)
            return out
        req = op.request
        assert req is not None
        if op.kind is _OpKind.LOAD_WRITE:
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
        elif op.kind is _OpKind.STORE_READ:
            assert isinstance(req, Store)
            self._finish_store(op.session, req, out)
        elif op.kind is _OpKind.ALLOC_READ:
            assert isinstance(req, AllocStore)
            self._finish_alloc(op.session, req, op.block, out)
        else:  # pragma: no cover - ALLOC_WAIT ops are resumed by slot fills, not completions
            raise LocalError(f"op {op_id} ({op.kind.value}) has no RDMA operation")
        self._release(req.handle, now, out)
        return out

    def rdma_failed(
        self, op_id: int, now: float, reason: str = "RDMA operation failed"
    ) -> list[Action]:
        """An RDMA operation failed (remote access error: the stream is being terminated)."""
        out: list[Action] = []
        op = self._ops.get(op_id)
        if op is None:
            return out
        status = (
            Status.TARGET_FAILURE if op.kind is _OpKind.INVALIDATE else Status.REMOTE_ACCESS_ERROR
        )
        self._close(op.session, now, status, reason, out)
        return out

    def tick(self, now: float) -> list[Action]:
        """Advance time: find abandoned direct tickets (draft §3.4) and act on them.

        Call it at least every Ticket Timeout / 2 while a session has DIRECT_ALLOC, and at
        :meth:`next_deadline`.
        """
        out: list[Action] = []
        for session, sess in list(self._sessions.items()):
            if sess.identity is None or not sess.capabilities & Capability.DIRECT_ALLOC:
                continue
            self._check_tickets(session, sess, now, out)
        return out

    def next_deadline(self, now: float) -> float | None:
        """When :meth:`tick` should next run (None: no DIRECT_ALLOC session)."""
        deadline: float | None = None
        timeout = self.config.ticket_timeout
        for sess in self._sessions.values():
            if sess.identity is None or not sess.capabilities & Capability.DIRECT_ALLOC:
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
    # internals: plumbing
    # ==================================================================================
    def _new_op(self, op: _Op) -> int:
        op_id = self._next_op
        self._next_op += 1
        self._ops[op_id] = op
        return op_id

    def _send(
        self, out: list[Action], session: int, msg: HelloAck | Completion, inv: int | None = None
    ) -> None:
        out.append(SendMessage(session, msg, inv))

    def _complete(
        self,
        out: list[Action],
        session: int,
        req: Request,
        status: Status,
        generation: int = 0,
        data_length: int = 0,
        block_offset: int = NO_BLOCK_OFFSET,
    ) -> None:
        """Send the COMPLETION of ``req`` (draft §6.5) and return its credit."""
        inv = None
        if req.flags & RequestFlag.INVALIDATE and isinstance(req, Load | Store | AllocStore):
            inv = req.descriptor.stag
        msg = Completion(
            req.request_id, req.handle, generation, status, data_length, block_offset, req.opcode
        )
        self._send(out, session, msg, inv)
        sess = self._sessions.get(session)
        if sess is not None:
            sess.inflight -= 1

    def _fail(self, out: list[Action], session: int, req: Request, status: Status) -> bool:
        """Complete ``req`` with an error status; the request changed nothing."""
        generation = 0
        if self.layout.serves(req.handle):
            generation = self.entry(req.handle).generation
        self._complete(out, session, req, status, generation)
        return True

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
            if not self._execute(session, req, now, out):
                return

    def _credit_exceeded(self, session: int, rid: int, now: float) -> list[Action]:
        out: list[Action] = []
        self._send(out, session, Completion(rid, status=Status.CREDIT_EXCEEDED))
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
            if op.kind is _OpKind.ALLOC_WAIT:
                self._waiters.pop((op.ring, op.ticket), None)
        partitioned = ini is not None and ini.config.direct_alloc
        for _, op in doomed:
            if op.kind in (_OpKind.ALLOC_READ, _OpKind.ALLOC_WAIT):
                assert ini is not None
                ini.allocating -= 1
                if partitioned:
                    continue  # the partition ring is rebuilt below
                if op.kind is _OpKind.ALLOC_READ:
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

    def _reset_partition(self, ini: _Initiator) -> None:
        """Rebuild a partition's ring from its unbound blocks (no session can reach it now)."""
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
        self._rings[ini.ring].initialize(free)
        ini.bound = len(bound)
        ini.allocating = 0

    # ==================================================================================
    # internals: HELLO (docs/kbtp.md §4.2)
    # ==================================================================================
    def _hello(
        self, session: int, sess: _Session, hello: Hello, now: float, out: list[Action]
    ) -> None:
        def refuse(status: Status, reason: str) -> None:
            self._send(out, session, HelloAck(hello.request_id, status))
            self._close(session, now, status, reason, out)

        if sess.identity is not None:
            refuse(Status.BAD_OPCODE, "second HELLO")
            return
        ini = self._initiators.get(hello.identity)
        if ini is None:
            refuse(Status.UNKNOWN_INITIATOR, f"unknown identity {hello.identity!r}")
            return
        if ini.session is not None:
            refuse(Status.SESSION_EXISTS, f"identity {hello.identity!r} already has a session")
            return
        cfg = ini.config
        allowed = Capability.NONE
        if cfg.direct_load:
            allowed |= Capability.DIRECT_LOAD
        if cfg.direct_alloc:
            allowed |= Capability.DIRECT_ALLOC
        granted = Capability(hello.capabilities) & allowed & RDMAP_BINDING_CAPABILITIES
        sess.identity = hello.identity
        sess.capabilities = granted
        ini.session = session
        lay = self.layout
        ack = dict(
            request_id=hello.request_id,
            status=Status.SUCCESS,
            capabilities=granted,
            block_size=self.config.block_size,
            pool_blocks=self.config.pool_blocks,
            quota=cfg.quota,
            handle_base=cfg.handle_base,
            handle_count=cfg.handle_count,
            ticket_timeout_ms=round(self.config.ticket_timeout * 1000),
            request_credits=self.config.request_credits,
            max_inline=self.config.max_inline,
        )
        if granted & Capability.DIRECT_LOAD:
            # Per session, like every STag this target exposes (docs/kbtp.md §3.6, SEC-03).
            sess.table_stag = self.registrar(RegionKind.TABLE, *lay.table_region)
            sess.pool_stag = self.registrar(RegionKind.POOL, *lay.pool_region)
            ack.update(
                table_stag=sess.table_stag,
                pool_stag=sess.pool_stag,
                table_offset=lay.to(lay.table_offset),
                table_base_handle=lay.table_base_handle,
                pool_offset=lay.to(lay.pool_offset),
            )
        if granted & Capability.DIRECT_ALLOC:
            part = lay.partitions[ini.ring]
            ring = self._rings[ini.ring]
            sess.ring_stag = self.registrar(RegionKind.RING, *lay.ring_region(part.ring))
            p_off, p_len = lay.partition_region(part)
            sess.partition_stag = self.registrar(RegionKind.PARTITION, p_off, p_len)
            sess.direct_alloc = True
            ring.observe(now)
            ack.update(
                ring_order=part.ring.order,
                ring_stag=sess.ring_stag,
                partition_stag=sess.partition_stag,
                ring_offset=lay.to(part.ring.slots_offset),
                head_offset=lay.to(part.ring.head_offset),
                partition_offset=lay.to(p_off),
                partition_length=p_len,
            )
        self._send(out, session, HelloAck(**ack))  # type: ignore[arg-type]

    # ==================================================================================
    # internals: requests (draft §6)
    # ==================================================================================
    def _execute(self, session: int, req: Request, now: float, out: list[Action]) -> bool:
        """Run ``req`` (its handle is locked); True if it completed, False if pending."""
        sess = self._sessions[session]
        assert sess.identity is not None
        ini = self._initiators[sess.identity]
        if req.flags & RequestFlag.RECORD:
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
        self, req: Request, ini: _Initiator | None
    ) -> tuple[Status, TableEntry | None]:
        """Handle range (initiator's, or the table's when ``ini`` is None) and Generation."""
        if not self.layout.serves(req.handle) or (
            ini is not None and not ini.config.owns(req.handle)
        ):
            return Status.HANDLE_OUT_OF_RANGE, None
        entry = self.entry(req.handle)
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
        if not entry.sealed and not req.flags & RequestFlag.ALLOW_UNSEALED:
            return self._fail(out, session, req, Status.NOT_SEALED)
        if entry.data_length > req.descriptor.length:
            return self._fail(out, session, req, Status.TOO_LONG_FOR_DESCRIPTOR)
        if entry.data_length == 0:
            self._complete(
                out, session, req, Status.SUCCESS, entry.generation, 0, entry.block_offset
            )
            return True
        op_id = self._new_op(_Op(_OpKind.LOAD_WRITE, session, req, entry=entry))
        d = req.descriptor
        out.append(
            WriteToInitiator(op_id, session, entry.block_offset, entry.data_length, d.stag, d.to)
        )
        return False

    # -- §6.2 Block Mapped Store ---------------------------------------------------------
    def _data_checks(self, req: Store | AllocStore) -> Status:
        if req.descriptor.length > self.config.block_size:
            return Status.TOO_LONG_FOR_BLOCK
        if req.inline and len(req.data) > self.config.max_inline:
            return Status.INLINE_TOO_LONG
        if req.inline and len(req.data) != req.descriptor.length:
            return Status.MALFORMED
        return Status.SUCCESS

    def _store(self, session: int, ini: _Initiator, req: Store, out: list[Action]) -> bool:
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
        op_id = self._new_op(_Op(_OpKind.STORE_READ, session, req))
        d = req.descriptor
        out.append(ReadFromInitiator(op_id, session, d.stag, d.to, d.length, entry.block_offset))
        return False

    def _finish_store(self, session: int, req: Store, out: list[Action]) -> None:
        """§6.2 steps 3-4: Data Length (and SEALED) after the data is in the block."""
        at = self.layout.entry_offset(req.handle)
        entry = read_entry(self.memory, at)
        flags = entry.flags | (TableFlag.SEALED if req.flags & RequestFlag.SEAL else TableFlag.NONE)
        updated = TableEntry(flags, entry.generation, req.descriptor.length, entry.block_offset)
        write_entry(self.memory, at, updated)
        self._complete(
            out,
            session,
            req,
            Status.SUCCESS,
            updated.generation,
            updated.data_length,
            updated.block_offset,
        )

    def _write_block(self, block_offset: int, data: bytes) -> None:
        start = self.layout.offset_of(block_offset)
        self.memory[start : start + len(data)] = data

    # -- §6.3 Block Unmapped Store -------------------------------------------------------
    def _alloc_store(
        self, session: int, ini: _Initiator, req: AllocStore, now: float, out: list[Action]
    ) -> bool:
        status, entry = self._entry_checks(req, ini)
        if status is not Status.SUCCESS or entry is None:
            return self._fail(out, session, req, status)
        if entry.valid:
            return self._fail(out, session, req, Status.ALREADY_VALID)
        status = self._data_checks(req)
        if status is not Status.SUCCESS:
            return self._fail(out, session, req, status)
        if self._direct_over_quota(ini, now):
            return self._over_quota(session, req, entry.generation, now, out)
        if self.usage(ini.config.identity) + 1 > ini.config.quota:
            return self._fail(out, session, req, Status.NO_SPACE)
        ring = self._rings[ini.ring]
        ticket = ring.take(now)
        ini.allocating += 1
        if self.usage(ini.config.identity) > ini.config.quota:
            # A direct FetchAdd raced ours and went over the quota (draft §3.4: NO_SPACE,
            # MAY terminate).  The ticket cannot be given back; closing resets the partition.
            ini.allocating -= 1
            return self._over_quota(session, req, entry.generation, now, out)
        op_id = self._new_op(_Op(_OpKind.ALLOC_WAIT, session, req, ring=ini.ring, ticket=ticket))
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
        op.kind = _OpKind.ALLOC_READ
        d = req.descriptor
        out.append(ReadFromInitiator(op_id, op.session, d.stag, d.to, d.length, block))
        return False

    def _finish_alloc(
        self, session: int, req: AllocStore | Bind, block: int, out: list[Action]
    ) -> None:
        """§6.3 steps 4-5 (and BIND): entry written after the data; then complete."""
        sess = self._sessions[session]
        assert sess.identity is not None
        ini = self._initiators[sess.identity]
        at = self.layout.entry_offset(req.handle)
        old = read_entry(self.memory, at)
        flags = TableFlag.VALID | (
            TableFlag.SEALED if req.flags & RequestFlag.SEAL else TableFlag.NONE
        )
        length = req.data_length if isinstance(req, Bind) else req.descriptor.length
        entry = TableEntry(flags, next_generation(old.generation), length, block)
        write_entry(self.memory, at, entry)
        ini.bound += 1
        if isinstance(req, AllocStore):
            ini.allocating -= 1
        self._complete(out, session, req, Status.SUCCESS, entry.generation, length, block)

    # -- §6.4 Block Free -----------------------------------------------------------------
    def _free(
        self, session: int, ini: _Initiator, req: Free, now: float, out: list[Action]
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
            if waiter == _RECLAIM:
                work.extend(self._reclaim_now(rid, ticket, out, now))
                continue
            op = self._ops[waiter]
            assert op.request is not None
            if self._alloc_got_block(waiter, now, out):
                self._release(op.request.handle, now, out)

    def _reclaim(self, rid: int, ticket: int, out: list[Action], now: float) -> None:
        """Reclaim an abandoned ticket's block now, or as soon as its slot is filled."""
        if self._rings[rid].ready_block(ticket) is None:
            self._waiters[(rid, ticket)] = _RECLAIM
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

    # -- §6.6 BIND -------------------------------------------------------------------------
    def _bind(
        self,
        session: int,
        sess: _Session,
        ini: _Initiator,
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
        if self._direct_over_quota(ini, now):
            return self._over_quota(session, req, entry.generation, now, out)
        held = ring.outstanding.get(req.ticket)
        if held is None or held.owner is not TicketOwner.DIRECT or held.abandoned:
            return self._fail(out, session, req, Status.BAD_BIND)
        if ring.ready_block(req.ticket) != req.block_offset:
            return self._fail(out, session, req, Status.BAD_BIND)
        # Within quota: usage (which counts this ticket) was checked by _direct_over_quota.
        _, ready = ring.consume(req.ticket)
        self._wake(ini.ring, ready, out, now)
        self._finish_alloc(session, req, req.block_offset, out)
        return True

    # ==================================================================================
    # internals: DIRECT_ALLOC tickets and the Ticket Timeout (draft §3.4)
    # ==================================================================================
    def _direct_over_quota(self, ini: _Initiator, now: float) -> bool:
        """Account for direct tickets taken since the last look; True if over the quota."""
        if not ini.config.direct_alloc:
            return False
        limit = ini.config.quota
        found = self._rings[ini.ring].observe(now, limit=limit)
        return found > limit or self.usage(ini.config.identity) > limit

    def _over_quota(
        self, session: int, req: Request, generation: int, now: float, out: list[Action]
    ) -> bool:
        """Draft §3.4: an allocation beyond the quota gets NO_SPACE; this target also closes
        the session (the partition ring is then rebuilt).  The request is finished."""
        self._complete(out, session, req, Status.NO_SPACE, generation)
        self._close(session, now, Status.NO_SPACE, OVER_QUOTA, out)
        return True

    def _check_tickets(self, session: int, sess: _Session, now: float, out: list[Action]) -> None:
        assert sess.identity is not None
        ini = self._initiators[sess.identity]
        if self._direct_over_quota(ini, now):
            self._close(session, now, Status.NO_SPACE, OVER_QUOTA, out)
            return
        ring = self._rings[ini.ring]
        expired = ring.expired(now, self.config.ticket_timeout)
        if not expired:
            return
        for ticket in expired:
            ring.abandon(ticket)
        if sess.direct_alloc:
            # Before any block is reclaimed, no RDMA Write of the initiator may reach it:
            # invalidate the Partition STag (and the Ring STag, so no new tickets appear).
            sess.direct_alloc = False
            for stag in (sess.partition_stag, sess.ring_stag):
                op_id = self._new_op(_Op(_OpKind.INVALIDATE, session, None, ring=ini.ring))
                sess.invalidating.add(op_id)
                out.append(InvalidateStag(op_id, session, stag))
        elif not sess.invalidating:
            self._reclaim_abandoned(ini, out, now)

    def _invalidated(self, op_id: int, op: _Op, now: float, out: list[Action]) -> None:
        sess = self._sessions.get(op.session)
        if sess is None:
            return
        sess.invalidating.discard(op_id)
        if sess.invalidating or sess.identity is None:
            return
        ini = self._initiators[sess.identity]
        # The Ring STag is invalid now: Head is final; account for the last direct tickets.
        if self._direct_over_quota(ini, now):
            self._close(op.session, now, Status.NO_SPACE, OVER_QUOTA, out)
        else:
            self._reclaim_abandoned(ini, out, now)

    def _reclaim_abandoned(self, ini: _Initiator, out: list[Action], now: float) -> None:
        ring = self._rings[ini.ring]
        for ticket in sorted(t for t, o in ring.outstanding.items() if o.abandoned):
            if (ini.ring, ticket) not in self._waiters:
                self._reclaim(ini.ring, ticket, out, now)
