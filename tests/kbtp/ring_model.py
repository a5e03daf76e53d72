"""Explicit-state model of a KBTP target with concurrent initiators, for exhaustive exploration.

The world is the real :class:`kbtp.target_core.TargetCore` plus small initiator state
machines and the RNIC operations in flight.  Every step that can interleave is its own
transition: a request reaching the target, an RDMA Read or invalidation completing, a
direct initiator's FetchAdd / slot read / RDMA Write / BIND, and time passing (which makes
observed direct tickets expire).  :func:`explore` enumerates all reachable states
breadth-first with a visited set keyed by a canonical state summary and checks the
invariants of draft §3.3/§3.4 in every state:

* conservation: every block of every ring is in exactly one place (an unconsumed slot or
  a deferred free, a pending allocation, or a VALID table entry) -- none lost, none
  handed out twice;
* quotas: bound handles and usage stay within each Allocation Quota, the sum within F;
* data: every bound handle holds exactly the bytes its owner stored (nobody else wrote it);
* a direct initiator only writes into the block its ticket's slot still holds for it;
* blocks of a ring shared by two trust domains are zero while free (§6.4 clearing);
* no deadlock: a state without successors has no pending operation or request.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Literal

from kbtp.constants import (
    TICKET_MASK,
    TICKET_MODULUS,
    Capability,
    CounterFormat,
    RequestFlag,
    Status,
    counter_operands,
    counter_ticket,
)
from kbtp.layout import read_slot
from kbtp.messages import (
    AllocStore,
    Bind,
    Completion,
    DataDescriptor,
    Free,
    Hello,
    inline_descriptor,
)
from kbtp.ring import TicketOwner
from kbtp.target_actions import (
    Action,
    CloseSession,
    InvalidateStag,
    ReadFromInitiator,
    SendMessage,
    WriteToInitiator,
)
from kbtp.target_config import InitiatorConfig, TargetConfig
from kbtp.target_core import TargetCore
from kbtp.target_state import SHARED_RING
from tests.kbtp.helpers import CountingRegistrar
from tests.kbtp.ring_offload import ChainExecutor


class ModelViolation(AssertionError):
    """An invariant failed; carries the trace of transitions that led there."""


Phase = (
    tuple[Literal["ticket"], int]
    | tuple[Literal["slot"], int, int]
    | tuple[Literal["written"], int, int, bytes]
)
"""A direct allocation in progress: (tag, ticket[, block[, data written]])."""


@dataclass(frozen=True)
class Actor:
    """One initiator.  kind: "inline" / "read" (target-executed stores) or "direct".

    inflight: (opcode name, handle, data) of the one outstanding request, or None.
    phase (direct only): None, ("ticket", t), ("slot", t, block), ("written", t, block, data).
    """

    name: str
    session: int
    kind: str
    handles: tuple[int, ...]
    quota: int
    budget: int
    bound: frozenset[int] = frozenset()
    inflight: tuple[str, int, bytes] | None = None
    phase: Phase | None = None
    alive: bool = True
    direct_ok: bool = True  # False after TICKET_ABANDONED: direct allocation is over


@dataclass(frozen=True)
class ModelConfig:
    """Sizes of the explored system (small: the state space grows fast)."""

    block_size: int = 2
    shared_quotas: tuple[int, int] = (1, 1)
    shared_order: int = 1
    direct_quota: int = 2
    budgets: tuple[int, int, int] = (3, 3, 5)
    data_length: int = 1
    timeout: float = 1.0
    counter_format: CounterFormat = CounterFormat.MASKED
    """C's partition ring: masked (draft §3.3) or unmasked (§9.2, UNMASKED_COUNTER)."""
    first_ticket: int = 0
    """Every ring starts its tickets here (near 2**32 to cross the ticket wrap)."""
    offload: bool = False
    """C's ALLOC_STOREs (by RDMA Read) and FREEs go to the offloaded target's chain
    first (tests.kbtp.ring_offload, docs/kbtp.md §8.1); the core takes what falls back."""


@dataclass
class Stats:
    states: int = 0
    transitions: int = 0
    terminal: int = 0
    coverage: Counter[str] = field(default_factory=Counter)


class World:
    """A mutable world; :meth:`copy` clones it for the next transition."""

    def __init__(
        self,
        core: TargetCore,
        actors: list[Actor],
        now: float,
        chains: ChainExecutor | None = None,
    ) -> None:
        self.core = core
        self.chains = chains  # the offloaded target's RNIC, shared by every world
        self.actors = actors
        self.now = now
        # pending RDMA Reads / invalidations by op id
        self.rnic: dict[int, ReadFromInitiator | InvalidateStag] = {}
        self.stag_valid = {"ring": True, "head": True, "partition": True}
        self.ghost: dict[int, bytes] = {}  # handle -> bytes its owner stored
        self.events: list[str] = []  # coverage events of the last transition

    def copy(self) -> World:
        new = World(self.core.clone(), list(self.actors), self.now, self.chains)
        new.rnic = dict(self.rnic)
        new.stag_valid = dict(self.stag_valid)
        new.ghost = dict(self.ghost)
        return new

    def key(self) -> tuple[object, ...]:
        rnic = tuple(sorted(repr(replace(a, op_id=0)) for a in self.rnic.values()))
        return (
            self.core.state_key(self.now),
            tuple(self.actors),
            rnic,
            tuple(sorted(self.stag_valid.items())),
            tuple(sorted(self.ghost.items())),
        )

    def request(self, a: Actor, req: AllocStore | Free, data: bytes = b"") -> None:
        """``req`` from ``a`` reaches the target: C's to the chain first (offload), the
        rest, and what falls back, to the core."""
        if self.chains is not None and a.kind == "direct":
            answer, actions = self.chains.offer(self.core, a.session, req, data, self.now)
            if answer is not None:
                self.events.append("offloaded")
                self._deliver(a.session, answer)
                self.apply(actions)
                return
            self.events.append("fallback")
        self.apply(self.core.handle_request(a.session, req, self.now))

    # -- delivering the target's actions ------------------------------------------------
    def apply(self, actions: list[Action]) -> None:
        for action in actions:
            if isinstance(action, SendMessage):
                assert isinstance(action.message, Completion)
                self._deliver(action.session, action.message)
            elif isinstance(action, ReadFromInitiator | InvalidateStag):
                self.rnic[action.op_id] = action
            elif isinstance(action, CloseSession):
                self.events.append(f"close:{action.status.name}")
                self._kill(action.session)
            elif isinstance(action, WriteToInitiator):  # pragma: no cover - no LOADs here
                raise ModelViolation("unexpected RDMA Write")

    def _actor_index(self, session: int) -> int:
        return next(i for i, a in enumerate(self.actors) if a.session == session)

    def _kill(self, session: int) -> None:
        i = self._actor_index(session)
        self.actors[i] = replace(self.actors[i], alive=False, inflight=None, phase=None)
        for op_id, act in list(self.rnic.items()):
            if act.session == session:
                del self.rnic[op_id]

    def _deliver(self, session: int, c: Completion) -> None:
        i = self._actor_index(session)
        a = self.actors[i]
        if a.inflight is None:
            raise ModelViolation(f"{a.name}: completion without a request: {c}")
        op, handle, data = a.inflight
        status = Status(c.status)
        self.events.append(f"{op}:{status.name}")
        bound = set(a.bound)
        phase = a.phase
        if status is Status.SUCCESS:
            if op in ("ALLOC_STORE", "BIND"):
                bound.add(handle)
                self.ghost[handle] = data
                if op == "BIND":
                    phase = None
            elif op == "FREE":
                bound.discard(handle)
                self.ghost.pop(handle, None)
        elif op == "ALLOC_STORE" and status is Status.NO_SPACE:
            pass
        elif op == "BIND" and status is Status.TICKET_ABANDONED:
            phase = None
            a = replace(a, direct_ok=False)
        else:
            raise ModelViolation(f"{a.name}: unexpected {status.name} for {op} of {handle}")
        self.actors[i] = replace(a, bound=frozenset(bound), inflight=None, phase=phase)


# ======================================================================================
# Building the initial world
# ======================================================================================


def initial_world(mc: ModelConfig) -> World:
    qa, qb = mc.shared_quotas
    cfg = TargetConfig(
        block_size=mc.block_size,
        pool_blocks=qa + qb + mc.direct_quota,
        initiators=(
            InitiatorConfig(b"A", 0, qa + 1, qa, trust_domain="red"),
            InitiatorConfig(b"B", qa + 1, qb + 1, qb, trust_domain="blue"),
            InitiatorConfig(
                b"C",
                qa + qb + 2,
                mc.direct_quota + 1,
                mc.direct_quota,
                trust_domain="green",
                direct_alloc=True,
            ),
        ),
        request_credits=1,
        ticket_timeout=mc.timeout,
        shared_ring_order=mc.shared_order,
    )
    core = TargetCore(cfg)
    chains = ChainExecutor(core.layout.size, mc.data_length) if mc.offload else None
    registrar = CountingRegistrar()
    actors = []
    for session, (ic, kind, budget) in enumerate(
        zip(cfg.initiators, ("inline", "read", "direct"), mc.budgets, strict=True), start=1
    ):
        core.open_session(session)
        caps = Capability.NONE
        if kind == "direct" and mc.counter_format is CounterFormat.UNMASKED:
            caps = Capability.DIRECT_ALLOC | Capability.UNMASKED_COUNTER
        elif kind == "direct":
            caps = Capability.DIRECT_ALLOC | Capability.MASKED_FETCH_ADD
        hello = core.handle_request(session, Hello(0, caps, ic.identity), 0.0)
        acts = registrar.serve(core, hello, 0.0)
        assert isinstance(acts[0], SendMessage) and acts[0].message.status == Status.SUCCESS
        handles = tuple(range(ic.handle_base, ic.handle_base + ic.handle_count))
        actors.append(Actor(ic.identity.decode(), session, kind, handles, ic.quota, budget))
    if mc.first_ticket:
        lay = core.layout
        shared = range(lay.shared_first_block, lay.shared_first_block + lay.shared_blocks)
        core.ring_of(None).initialize([lay.block_to(b) for b in shared], None, mc.first_ticket)
        part = lay.partitions[0]
        core.ring_of(b"C").initialize(core._partition_blocks(part), None, mc.first_ticket)
    assert core.ring_of(b"C").counter_format is mc.counter_format
    if chains is not None:
        chains.arm(core, cfg.initiators[2])  # posted once C's HELLO is accepted
    return World(core, actors, 0.0, chains)


# ======================================================================================
# Transitions
# ======================================================================================

Step = Callable[[World], None]


def _data(actor_index: int, budget: int, length: int) -> bytes:
    return bytes([16 * (actor_index + 1) + budget]) * length


def _usage(a: Actor) -> int:
    """What a well-behaved initiator counts against its quota."""
    held = 1 if a.phase is not None else 0
    alloc = 1 if a.inflight is not None and a.inflight[0] in ("ALLOC_STORE", "BIND") else 0
    return len(a.bound) + held + alloc


def transitions(w: World, mc: ModelConfig) -> list[tuple[str, Step]]:
    out: list[tuple[str, Step]] = []
    core = w.core
    for i, a in enumerate(w.actors):
        if not a.alive:
            continue
        if a.inflight is None and a.budget > 0:
            free_handles = [h for h in a.handles if h not in a.bound]
            if free_handles and _usage(a) <= a.quota:
                out.append((f"{a.name}:alloc", _step_alloc(i, free_handles[0], mc)))
            if a.bound:
                out.append((f"{a.name}:free", _step_free(i, min(a.bound))))
        if a.kind == "direct":
            out.extend(_direct_steps(w, i, a, mc))
    for op_id, act in w.rnic.items():
        out.append((f"rnic:{type(act).__name__}:{op_id}", _step_rnic(op_id)))
    ring = core.ring_of(b"C")
    if any(
        o.owner is TicketOwner.DIRECT and not o.abandoned for o in ring.outstanding.values()
    ) or (core.direct_alloc_enabled(3) and ring.head()[0] != ring.observed_head):
        out.append(("time", _step_time(mc)))
    return out


def _step_alloc(i: int, handle: int, mc: ModelConfig) -> Step:
    def step(w: World) -> None:
        a = w.actors[i]
        data = _data(i, a.budget, mc.data_length)
        if a.kind == "direct" and w.chains is not None:  # by RDMA Read: offloadable
            src = w.chains.source
            req = AllocStore(a.budget, handle, DataDescriptor(src.rkey, src.base, len(data)))
        elif a.kind == "read":
            req = AllocStore(a.budget, handle, DataDescriptor(0x1000 + i, 0, len(data)))
        else:
            req = AllocStore(
                a.budget, handle, inline_descriptor(data), data, flags=RequestFlag.INLINE
            )
        w.actors[i] = replace(a, budget=a.budget - 1, inflight=("ALLOC_STORE", handle, data))
        w.request(a, req, data)

    return step


def _step_free(i: int, handle: int) -> Step:
    def step(w: World) -> None:
        a = w.actors[i]
        w.actors[i] = replace(a, budget=a.budget - 1, inflight=("FREE", handle, b""))
        w.request(a, Free(a.budget, handle))

    return step


def _step_rnic(op_id: int) -> Step:
    def step(w: World) -> None:
        act = w.rnic.pop(op_id)
        if isinstance(act, ReadFromInitiator):
            i = w._actor_index(act.session)
            inflight = w.actors[i].inflight
            assert inflight is not None
            start = w.core.layout.offset_of(act.local_to)
            w.core.memory[start : start + act.length] = inflight[2][: act.length]
        elif isinstance(act, InvalidateStag):
            w.events.append("invalidated")
            kind = next(k for k in ("ring", "head", "partition") if act.stag == _stag(w, k))
            w.stag_valid[kind] = False
        w.apply(w.core.rdma_completed(op_id, w.now))

    return step


def _stag(w: World, kind: str) -> int:
    sess = w.core._sessions.get(3)  # the direct initiator's session
    if sess is None:
        return -1
    return {"ring": sess.ring_stag, "head": sess.head_stag}.get(kind, sess.partition_stag)


def _step_time(mc: ModelConfig) -> Step:
    def step(w: World) -> None:
        w.apply(w.core.tick(w.now))  # a poll now (observes Head) ...
        w.now += mc.timeout * 1.5
        w.apply(w.core.tick(w.now))  # ... and one after the Ticket Timeout

    return step


def _direct_steps(w: World, i: int, a: Actor, mc: ModelConfig) -> list[tuple[str, Step]]:
    steps: list[tuple[str, Step]] = []
    core = w.core
    ring = core.ring_of(b"C")
    geometry = ring.geometry
    if (
        a.phase is None
        and a.direct_ok
        and a.budget > 0
        and a.inflight is None
        and _usage(a) < a.quota
    ):

        def fetch_add(w: World) -> None:
            b = w.actors[i]
            if not w.stag_valid["head"]:
                w.events.append("direct:stale-stag")
                w._kill(b.session)
                w.apply(w.core.close_session(b.session, w.now))
                return
            r = w.core.ring_of(b"C")
            g = r.geometry
            add, mask = counter_operands(r.counter_format, g.order)  # as its HELLO_ACK says
            original = w.core.fetch_add(w.core.memory, g.head_offset, add, mask)
            ticket = (original >> 32) & TICKET_MASK
            w.actors[i] = replace(b, budget=b.budget - 1, phase=("ticket", ticket))

        steps.append((f"{a.name}:fetchadd", fetch_add))
        return steps
    phase = a.phase
    if phase is None:
        return steps
    ticket = phase[1]
    if phase[0] == "ticket":
        slot = read_slot(core.memory, geometry.slots_offset + geometry.slot_offset(ticket))
        newer = 0 < (slot.sequence - ticket) % TICKET_MODULUS < TICKET_MODULUS // 2
        if not w.stag_valid["ring"]:
            steps.append((f"{a.name}:read-stale", _die(i)))
        elif slot.holds(ticket):
            block = slot.block_offset

            def read(w: World, block: int = block) -> None:
                b = w.actors[i]
                w.actors[i] = replace(b, phase=("slot", ticket, block))

            steps.append((f"{a.name}:read", read))
        elif newer or (slot.sequence == ticket and slot.consumed):

            def give_up(w: World) -> None:
                w.events.append("direct:gave-up")
                w.actors[i] = replace(w.actors[i], phase=None, direct_ok=False)

            steps.append((f"{a.name}:give-up", give_up))
    elif phase[0] == "slot":
        block = phase[2]

        def write(w: World) -> None:
            b = w.actors[i]
            if not w.stag_valid["partition"]:
                w.events.append("direct:write-after-invalidate")
                w._kill(b.session)
                w.apply(w.core.close_session(b.session, w.now))
                return
            r = w.core.ring_of(b"C")
            if r.ready_block(ticket) != block:
                raise ModelViolation(f"direct write to block {block:#x} its ticket no longer holds")
            data = _data(i, b.budget, mc.data_length)
            start = w.core.layout.offset_of(block)
            w.core.memory[start : start + len(data)] = data
            w.actors[i] = replace(b, phase=("written", ticket, block, data))

        steps.append((f"{a.name}:write", write))
    elif phase[0] == "written" and a.inflight is None:
        block, data = phase[2], phase[3]
        handle = next((h for h in a.handles if h not in a.bound), None)
        if handle is not None:

            def bind(w: World, handle: int = handle) -> None:
                b = w.actors[i]
                w.actors[i] = replace(b, inflight=("BIND", handle, data))
                req = Bind(ticket, handle, ticket, len(data), block)
                w.apply(w.core.handle_request(b.session, req, w.now))

            steps.append((f"{a.name}:bind", bind))
    return steps


def _die(i: int) -> Step:
    def step(w: World) -> None:
        b = w.actors[i]
        w.events.append("direct:stale-stag")
        w._kill(b.session)
        w.apply(w.core.close_session(b.session, w.now))

    return step


# ======================================================================================
# Invariants
# ======================================================================================


def check(w: World, mc: ModelConfig) -> None:
    core = w.core
    lay = core.layout
    held = core.held_blocks()
    seen: Counter[int] = Counter()
    entries = {
        h: core.entry(h)
        for h in range(lay.table_base_handle, lay.table_base_handle + lay.table_entries)
    }
    bound_blocks = [e.block_offset for e in entries.values() if e.valid]
    for rid, ring in core.rings.items():
        if rid == SHARED_RING:
            own = range(lay.shared_first_block, lay.shared_first_block + lay.shared_blocks)
        else:
            part = lay.partitions[rid]
            own = range(part.first_block, part.first_block + part.blocks)
        mine = {lay.block_to(b) for b in own}
        available = ring.available_blocks()
        here = Counter(available) + Counter(b for b in held if b in mine)
        here += Counter(b for b in bound_blocks if b in mine)
        if set(here) != mine or any(n != 1 for n in here.values()):
            raise ModelViolation(f"ring {rid}: blocks {dict(here)} != each of {sorted(mine)} once")
        seen += here
        for offset in (ring.geometry.head_offset, ring.geometry.tail_offset):
            value = ring.mem[offset : offset + 8]
            counter = int.from_bytes(value, ring.geometry.byteorder)
            if counter_ticket(counter, ring.geometry.order, ring.counter_format) is None:
                raise ModelViolation(f"ring {rid}: counter {counter:#018x} is corrupt")
        if mc.first_ticket and ring.head()[0] < mc.first_ticket:
            w.events.append("state:wrapped")  # Head's ticket went past 2**32 - 1 to 0
        if rid == SHARED_RING:  # used by A ("red") and B ("blue"): two trust domains
            for b in available:
                if any(core.block_bytes(b)):
                    raise ModelViolation(f"free block {b:#x} of a shared ring is not cleared")
        if ring.deferred:
            w.events.append("state:deferred")
    if sum(seen.values()) != lay.pool_blocks:
        raise ModelViolation("blocks outside every ring")
    total = 0
    for a in w.actors:
        ident = a.name.encode()
        usage = core.usage(ident)
        total += usage
        valid = sum(1 for h in a.handles if entries[h].valid)
        if valid > a.quota or usage > a.quota:
            raise ModelViolation(f"{a.name}: {valid} bound, usage {usage} > quota {a.quota}")
    if total > lay.pool_blocks:
        raise ModelViolation("sum of usage exceeds F")
    for h, e in entries.items():
        if e.valid != (h in w.ghost):
            raise ModelViolation(
                f"handle {h}: table VALID={e.valid} but owner thinks {h in w.ghost}"
            )
        if e.valid:
            data = w.ghost[h]
            if e.data_length != len(data) or core.block_bytes(e.block_offset, len(data)) != data:
                raise ModelViolation(f"handle {h}: block {e.block_offset:#x} lost its data")
    for a in w.actors:
        if a.kind == "direct" and a.phase is not None and a.phase[0] in ("slot", "written"):
            ticket = a.phase[1]
            ring = core.ring_of(b"C")
            if ticket not in ring.abandoned and ring.ready_block(ticket) != a.phase[2]:
                raise ModelViolation(f"ticket {ticket}'s block left its slot before BIND")
    if any(op.kind.value == "alloc-wait" for op in core._ops.values()):
        w.events.append("state:alloc-wait")
    if core.ring_of(b"C").abandoned:
        w.events.append("state:abandoned")


def check_terminal(w: World) -> None:
    if w.rnic or w.core.pending_ops():
        raise ModelViolation("deadlock: operations pending with no transition enabled")
    for a in w.actors:
        if a.inflight is not None or (a.alive and a.phase is not None):
            raise ModelViolation(f"deadlock: {a.name} is stuck in {a.inflight or a.phase}")


# ======================================================================================
# Exploration
# ======================================================================================


def explore(mc: ModelConfig, max_states: int = 2_000_000) -> Stats:
    """Breadth-first exploration of every interleaving; raises ModelViolation on a bug."""
    stats = Stats()
    start = initial_world(mc)
    check(start, mc)
    visited = {start.key()}
    queue: deque[tuple[World, tuple[str, ...]]] = deque([(start, ())])
    while queue:
        world, trace = queue.popleft()
        stats.states += 1
        steps = transitions(world, mc)
        if not steps:
            stats.terminal += 1
            try:
                check_terminal(world)
            except ModelViolation as exc:
                raise ModelViolation(f"{exc}\ntrace: {' '.join(trace)}") from None
        for label, step in steps:
            nxt = world.copy()
            try:
                step(nxt)
                key = nxt.key()
                if key in visited:
                    continue  # already checked
                check(nxt, mc)
            except ModelViolation as exc:
                raise ModelViolation(f"{exc}\ntrace: {' '.join(trace + (label,))}") from None
            finally:
                stats.transitions += 1
            stats.coverage.update(nxt.events)
            nxt.events = []
            visited.add(key)
            if len(visited) > max_states:
                raise ModelViolation(f"more than {max_states} states")
            queue.append((nxt, trace + (label,)))
    return stats
