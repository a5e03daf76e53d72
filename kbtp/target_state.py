"""The KBTP target core's state and the plumbing every part of the engine shares.

:class:`CoreState` holds what :class:`~kbtp.target_core.TargetCore` knows: the memory and
its layout, the rings, the initiators and sessions, the pending operations, the per-handle
queues (docs/kbtp.md §6.0) and the tickets waiting for a slot.  The engine is one class
written in parts: requests (:mod:`kbtp.target_ops`, draft §6), direct tickets and block
returns (:mod:`kbtp.target_tickets`, draft §3.4), HELLO (:mod:`kbtp.target_hello`,
docs/kbtp.md §4.2) and the core (:mod:`kbtp.target_core`: sessions, feedback from the
binding).  The methods one part calls in another are declared here.  All state is plain
containers, so that ``TargetCore.clone`` can copy it.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Self

from kbtp.constants import NO_BLOCK_OFFSET, Capability, CounterFormat, RequestFlag, Status
from kbtp.layout import TableEntry, TargetLayout, read_entry
from kbtp.messages import AllocStore, Completion, HelloAck, Load, Message, Request, Store
from kbtp.ring import FetchAdd, FreeRing
from kbtp.target_actions import Action, RegionKind, SendMessage
from kbtp.target_config import InitiatorConfig, TargetConfig
from stack.errors import LocalError
from stack.fastinit import maker

_INVALIDATE = int(RequestFlag.INVALIDATE)  # an int test makes no Flag object per request
_make_completion = maker(Completion)
_make_send = maker(SendMessage)

SHARED_RING = -1
"""Ring id of the shared ring; partition rings are numbered 0.. in configuration order."""

OVER_QUOTA = "direct allocations exceed the Allocation Quota"

Persist = Callable[[int, int], None]
"""Makes target memory octets [offset, offset + length) durable (a persistent pool's msync,
docs/kbtp.md §12.4)."""

RECLAIM = -1
"""Waiter marker: an abandoned ticket whose block is reclaimed when its slot is filled."""

HOLD: tuple[int, Request | None] = (-1, None)
"""Handle-queue entry of a hold behind an offloaded STORE (``TargetCore.hold_handle``,
docs/kbtp.md §8.1): it takes the handle like an operation until released."""


class OpKind(Enum):
    """What a pending operation waits for."""

    LOAD_WRITE = "load-write"
    STORE_READ = "store-read"
    ALLOC_WAIT = "alloc-wait"  # ticket taken, slot not yet filled
    ALLOC_READ = "alloc-read"  # block consumed, RDMA Read in flight
    INVALIDATE = "invalidate"
    REGISTER = "register"  # a region of a HELLO_ACK being registered


@dataclass(slots=True)
class PendingOp:
    """An operation the core waits on (an action with an ``op_id``, or a ticket's slot)."""

    kind: OpKind
    session: int
    request: Request | None
    ring: int = SHARED_RING
    ticket: int = 0
    block: int = NO_BLOCK_OFFSET
    entry: TableEntry | None = None
    region: RegionKind | None = None

    def copy(self) -> PendingOp:
        return PendingOp(
            self.kind,
            self.session,
            self.request,
            self.ring,
            self.ticket,
            self.block,
            self.entry,
            self.region,
        )


@dataclass(slots=True)
class SessionState:
    """One RDMAP stream: its identity after HELLO, capabilities, requests in flight, the
    STags it was given, and while its HELLO_ACK waits for registrations, the ACK's fields
    (``hello_ack``) and the messages that arrived meanwhile (``early``)."""

    identity: bytes | None = None
    capabilities: Capability = Capability.NONE
    opened: float = 0.0  # when the stream was established (the HELLO deadline runs from it)
    active: float = 0.0  # the last message received or operation completed (idle timeout)
    inflight: int = 0
    uncredited: int = 0  # COMPLETIONs sent since the binding's last receive_batch
    offloaded: int = 0  # requests the RNIC's chains hold (docs/kbtp.md §8.1)
    batching: bool = False  # the binding reports receive batches (docs/kbtp.md §9.2)
    ird: int | None = None  # the target's negotiated IRD on the stream (None: unknown)
    ord: int | None = None  # the target's negotiated ORD on the stream (docs/kbtp.md §4.1)
    table_stag: int = 0
    pool_stag: int = 0
    ring_stag: int = 0
    head_stag: int = 0
    partition_stag: int = 0
    direct_alloc: bool = False  # DIRECT_ALLOC currently usable (STags valid)
    invalidating: set[int] = field(default_factory=set)  # op ids of pending invalidations
    hello_ack: dict[str, Any] | None = None
    registering: set[int] = field(default_factory=set)  # op ids of pending registrations
    early: deque[bytes | Message] = field(default_factory=deque)

    def copy(self) -> SessionState:
        new = SessionState(**{name: getattr(self, name) for name in self.__slots__})
        new.invalidating = set(self.invalidating)
        new.hello_ack = None if self.hello_ack is None else dict(self.hello_ack)
        new.registering = set(self.registering)
        new.early = deque(self.early)
        return new


@dataclass(slots=True)
class InitiatorState:
    """One configured identity: its ring, its session (None between sessions), the handles
    it has bound and the target-executed allocations holding a ticket or block."""

    config: InitiatorConfig
    ring: int
    session: int | None = None
    bound: int = 0
    allocating: int = 0

    def copy(self) -> InitiatorState:
        return InitiatorState(self.config, self.ring, self.session, self.bound, self.allocating)


class CoreState:
    """The state of the target engine and the plumbing its parts share (see the module)."""

    config: TargetConfig
    layout: TargetLayout
    memory: memoryview
    fetch_add: FetchAdd
    persist: Persist | None
    _rings: dict[int, FreeRing]
    _initiators: dict[bytes, InitiatorState]
    _sessions: dict[int, SessionState]
    _ops: dict[int, PendingOp]
    _next_op: int
    _busy: dict[int, deque[tuple[int, Request | None]]]
    """Per handle being operated on: what waits for it, in order (§6.0); ``HOLD`` entries
    are the binding's holds behind an offloaded STORE (``hold_handle``)."""
    _waiters: dict[tuple[int, int], int]
    _bound_blocks: dict[int, int]
    _registered: dict[int, list[int]]
    _orphans: dict[int, int]

    # ----------------------------------------------------------------------------------
    # reading state
    # ----------------------------------------------------------------------------------
    def entry(self, handle: int) -> TableEntry:
        """The table entry of ``handle`` as stored in memory."""
        if not self.layout.serves(handle):
            raise LocalError(f"handle {handle} is not served")
        return read_entry(self.memory, self.layout.entry_offset(handle))

    def note_activity(self, session: int, now: float) -> None:
        """The RNIC answered requests of ``session`` by itself (docs/kbtp.md §8): it is not
        idle (docs/kbtp.md §4.2)."""
        sess = self._sessions.get(session)
        if sess is not None:
            sess.active = max(sess.active, now)

    def usage(self, identity: bytes) -> int:
        """Bound handles + tickets taken and not bound (draft §3.4)."""
        ini = self._initiators[identity]
        direct = self._rings[ini.ring].direct_outstanding() if ini.config.direct_alloc else 0
        return ini.bound + ini.allocating + direct

    def _adopt_table(self) -> None:
        """Take over a table and rings already in memory (a recovered persistent pool,
        docs/kbtp.md §12.3): count each initiator's bound handles and note their blocks."""
        for ini in self._initiators.values():
            cfg = ini.config
            for handle in range(cfg.handle_base, cfg.handle_base + cfg.handle_count):
                entry = self.entry(handle)
                if entry.valid:
                    ini.bound += 1
                    self._bound_blocks[entry.block_offset] = handle
        for ring in self._rings.values():
            ring.observed_head = ring.head()[0]

    # ----------------------------------------------------------------------------------
    # copying and summarizing (the state-space exploration)
    # ----------------------------------------------------------------------------------
    def clone(self) -> Self:
        """An independent copy (memory and bookkeeping) for state-space exploration."""
        new = object.__new__(type(self))
        new.__dict__.update(self.__dict__)
        new.memory = memoryview(bytearray(self.memory))
        new._rings = {rid: ring.clone(new.memory) for rid, ring in self._rings.items()}
        # Requests, configs and table entries are immutable; everything else is copied.
        new._initiators = {k: v.copy() for k, v in self._initiators.items()}
        new._sessions = {k: v.copy() for k, v in self._sessions.items()}
        new._ops = {k: v.copy() for k, v in self._ops.items()}
        new._busy = {k: deque(v) for k, v in self._busy.items()}
        new._waiters = dict(self._waiters)
        new._bound_blocks = dict(self._bound_blocks)
        new._registered = {k: list(v) for k, v in self._registered.items()}
        new._orphans = dict(self._orphans)
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
                    s.uncredited,
                    s.direct_alloc,
                    len(s.invalidating),
                    len(s.registering),
                    tuple(repr(m) for m in s.early),
                )
                for sid, s in sorted(self._sessions.items())
            ),
            ops,
            tuple(sorted((h, tuple(repr(x) for x in q)) for h, q in self._busy.items())),
            tuple(sorted((k, v if v == RECLAIM else 0) for k, v in self._waiters.items())),
            tuple(sorted((sid, len(stags)) for sid, stags in self._registered.items())),
            len(self._orphans),
        )

    # ----------------------------------------------------------------------------------
    # plumbing
    # ----------------------------------------------------------------------------------
    def _new_op(self, op: PendingOp) -> int:
        op_id = self._next_op
        self._next_op += 1
        self._ops[op_id] = op
        return op_id

    def _send(
        self, out: list[Action], session: int, msg: HelloAck | Completion, inv: int | None = None
    ) -> None:
        out.append(_make_send(session, msg, inv))

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
        if int(req.flags) & _INVALIDATE and isinstance(req, Load | Store | AllocStore):
            inv = req.descriptor.stag
        msg = _make_completion(
            req.request_id, req.handle, generation, status, data_length, block_offset, req.opcode
        )
        out.append(_make_send(session, msg, inv))
        sess = self._sessions.get(session)
        if sess is not None:
            sess.inflight -= 1
            if sess.batching:
                sess.uncredited += 1

    def _fail(self, out: list[Action], session: int, req: Request, status: Status) -> bool:
        """Complete ``req`` with an error status; the request changed nothing."""
        generation = 0
        if self.layout.serves(req.handle):
            generation = self.entry(req.handle).generation
        self._complete(out, session, req, status, generation)
        return True

    def _persist(self, offset: int, length: int) -> None:
        """Make memory octets durable if the pool is persistent and synced (§12.4)."""
        if self.persist is not None:
            self.persist(offset, length)

    def _write_block(self, block_offset: int, data: bytes) -> None:
        """Write ``data`` at the start of a pool block (LocalError if it names none)."""
        if self.layout.block_index(block_offset) is None or len(data) > self.config.block_size:
            raise LocalError(f"no block of {len(data)} octets at 0x{block_offset:x}")
        start = self.layout.offset_of(block_offset)
        self.memory[start : start + len(data)] = data

    # ----------------------------------------------------------------------------------
    # provided by the parts (kbtp.target_core, kbtp.target_ops, kbtp.target_tickets)
    # ----------------------------------------------------------------------------------
    def handle_message(
        self, session: int, data: bytes | bytearray | memoryview, now: float
    ) -> list[Action]:
        """A Send arrived on ``session``: decode it and process it (target_core)."""
        raise NotImplementedError

    def handle_request(self, session: int, message: Message, now: float) -> list[Action]:
        """Process a decoded message (HELLO or a request) from ``session`` (target_core)."""
        raise NotImplementedError

    def _close(
        self, session: int, now: float, status: Status, reason: str, out: list[Action]
    ) -> None:
        """Tear ``session`` down and ask the binding to close it (target_core)."""
        raise NotImplementedError

    def _release(self, handle: int, now: float, out: list[Action]) -> None:
        """The operation on ``handle`` is over: run the requests queued behind it."""
        raise NotImplementedError

    def _reset_partition(
        self, ini: InitiatorState, counter_format: CounterFormat | None = None
    ) -> None:
        """Rebuild a partition's ring from its unbound blocks (target_core)."""
        raise NotImplementedError

    def _alloc_got_block(self, op_id: int, now: float, out: list[Action]) -> bool:
        """A waiting ALLOC_STORE's slot is filled: take its block (target_ops)."""
        raise NotImplementedError

    def _wake(self, rid: int, ready: tuple[int, ...], out: list[Action], now: float) -> None:
        """Tickets whose slots were just filled: resume or reclaim (target_tickets)."""
        raise NotImplementedError

    def _return_block(self, rid: int, block: int, out: list[Action], now: float) -> None:
        """A block goes back to its ring (target_tickets)."""
        raise NotImplementedError

    def _direct_violation(self, ini: InitiatorState, now: float) -> str | None:
        """Why ``ini``'s direct tickets or Head close its session, or None (target_tickets)."""
        raise NotImplementedError

    def _over_quota(
        self,
        session: int,
        req: Request,
        generation: int,
        now: float,
        out: list[Action],
        reason: str = OVER_QUOTA,
    ) -> bool:
        """Answer an allocation beyond the quota and close the session (target_tickets)."""
        raise NotImplementedError
