"""A test harness around :class:`TargetCore`: initiator memory, RDMA op execution, snapshots.

The harness plays the RNIC and the initiators: it performs the RDMA Writes and Reads the
core asks for against simulated initiator buffers (one bytearray per STag), reports their
completion, and collects the COMPLETIONs.  Direct modes are emulated through the regions
the core registered (RDMA Read of table/pool/slots, FetchAdd on Head, RDMA Write into the
partition), translating Tagged Offsets with the layout, exactly as an RNIC would.
"""

from __future__ import annotations

from dataclasses import dataclass

from kbtp.constants import (
    TICKET_MASK,
    Capability,
    CounterFormat,
    Status,
    counter_operands,
)
from kbtp.layout import Slot, TableEntry
from kbtp.messages import Completion, Hello, HelloAck, Message, decode_message
from kbtp.target_actions import (
    Action,
    CloseSession,
    DeregisterMemory,
    InvalidateStag,
    ReadFromInitiator,
    RegionKind,
    RegisterMemory,
    SendMessage,
    WriteToInitiator,
)
from kbtp.target_config import InitiatorConfig, TargetConfig
from kbtp.target_core import TargetCore

A = InitiatorConfig(b"a", 0, 8, 2, "red", direct_load=True)
B = InitiatorConfig(b"b", 16, 8, 2, "blue")
C = InitiatorConfig(b"c", 32, 8, 3, "green", direct_load=True, direct_alloc=True)


def default_config(**overrides: object) -> TargetConfig:
    base: dict[str, object] = dict(
        block_size=64,
        pool_blocks=8,
        initiators=(A, B, C),
        request_credits=4,
        max_inline=32,
        ticket_timeout=1.0,
    )
    base.update(overrides)
    return TargetConfig(**base)  # type: ignore[arg-type]


class CountingRegistrar:
    """Plays the binding's registrations: STags 0x100, 0x200, ... in the order asked for;
    ``regions`` maps each live STag to its (kind, byte offset, length)."""

    def __init__(self) -> None:
        self.regions: dict[int, tuple[RegionKind, int, int]] = {}
        self.deregistered: list[int] = []
        self._count = 0

    def serve(self, core: TargetCore, actions: list[Action], now: float) -> list[Action]:
        """``actions`` with every RegisterMemory carried out and replaced by the core's
        answer, and every DeregisterMemory carried out (kept in the list)."""
        out: list[Action] = []
        for action in actions:
            if isinstance(action, RegisterMemory):
                self._count += 1
                stag = 0x100 * self._count
                self.regions[stag] = (action.kind, action.offset, action.length)
                out += self.serve(core, core.memory_registered(action.op_id, stag, now), now)
                continue
            if isinstance(action, DeregisterMemory):
                del self.regions[action.stag]
                self.deregistered.append(action.stag)
            out.append(action)
        return out


@dataclass
class Snapshot:
    memory: bytes
    rings: tuple[object, ...]
    usage: tuple[int, ...]


class Harness:
    def __init__(self, config: TargetConfig | None = None, **core_kwargs: object) -> None:
        self.registrar = CountingRegistrar()
        self.core = TargetCore(
            config or default_config(),
            **core_kwargs,  # type: ignore[arg-type]
        )
        self.buffers: dict[int, bytearray] = {}
        self.completions: list[tuple[int, Completion, int | None]] = []
        self.closed: list[CloseSession] = []
        self.pending: dict[int, Action] = {}
        self.invalidated: set[int] = set()
        self.now = 0.0
        self.acks: dict[int, HelloAck] = {}

    # -- initiator memory ----------------------------------------------------------------
    def buffer(self, stag: int, data: bytes | int) -> int:
        self.buffers[stag] = bytearray(data if isinstance(data, bytes) else bytes(data))
        return stag

    # -- driving the core ----------------------------------------------------------------
    def connect(
        self,
        session: int,
        identity: bytes,
        caps: Capability = Capability.NONE,
        *,
        ird: int | None = None,
        ord: int | None = None,
    ) -> HelloAck:
        self.core.open_session(session, self.now, ird=ird, ord=ord)
        if caps & Capability.DIRECT_ALLOC and not caps & Capability.UNMASKED_COUNTER:
            caps |= Capability.MASKED_FETCH_ADD  # what this stack's initiator asks with it
        actions = self.registered(
            self.core.handle_message(session, Hello(99, caps, identity).encode(), self.now)
        )
        assert len(actions) == 1 and isinstance(actions[0], SendMessage), actions
        ack = actions[0].message
        assert isinstance(ack, HelloAck)
        assert decode_message(ack.encode()) == ack
        self.acks[session] = ack
        return ack

    def registered(self, actions: list[Action]) -> list[Action]:
        """``actions`` with the registrations carried out (:meth:`CountingRegistrar.serve`)."""
        return self.registrar.serve(self.core, actions, self.now)

    def send(self, session: int, message: Message | bytes, auto: bool = True) -> list[Action]:
        """Deliver a message as bytes; execute RDMA ops now if ``auto``; return the actions."""
        data = message if isinstance(message, bytes) else message.encode()
        actions = self.registered(self.core.handle_message(session, data, self.now))
        self.absorb(actions, auto)
        return actions

    def absorb(self, actions: list[Action], auto: bool = True) -> None:
        for action in self.registered(actions):
            if isinstance(action, DeregisterMemory):
                continue
            if isinstance(action, SendMessage):
                msg = action.message
                assert decode_message(action.encode()) == msg
                if isinstance(msg, Completion):
                    self.completions.append((action.session, msg, action.invalidate_stag))
            elif isinstance(action, CloseSession):
                self.closed.append(action)
            else:
                self.pending[action.op_id] = action
        if auto:
            self.finish_all()

    def finish(self, op_id: int) -> list[Action]:
        """Perform one pending RDMA operation and report its completion."""
        action = self.pending.pop(op_id)
        mem = self.core.memory
        lay = self.core.layout
        if isinstance(action, WriteToInitiator):
            src = lay.offset_of(action.local_to)
            buf = self.buffers[action.remote_stag]
            buf[action.remote_to : action.remote_to + action.length] = mem[
                src : src + action.length
            ]
        elif isinstance(action, ReadFromInitiator):
            dst = lay.offset_of(action.local_to)
            buf = self.buffers[action.remote_stag]
            mem[dst : dst + action.length] = buf[
                action.remote_to : action.remote_to + action.length
            ]
        elif isinstance(action, InvalidateStag):
            self.invalidated.add(action.stag)
        actions = self.core.rdma_completed(op_id, self.now)
        self.absorb(actions, auto=False)
        return actions

    def finish_all(self, kinds: tuple[type, ...] = (WriteToInitiator, ReadFromInitiator)) -> None:
        while True:
            ready = [i for i, a in self.pending.items() if isinstance(a, kinds)]
            if not ready:
                return
            self.finish(min(ready))

    def request(self, session: int, message: Message | bytes) -> Completion:
        """Send and run to completion; returns the one new COMPLETION."""
        before = len(self.completions)
        self.send(session, message)
        new = self.completions[before:]
        assert len(new) == 1, new
        return new[0][1]

    def tick(self, dt: float) -> list[Action]:
        self.now += dt
        actions = self.core.tick(self.now)
        self.absorb(actions, auto=False)
        return actions

    # -- direct modes, as the initiator's RNIC would do them -----------------------------
    def _region(self, stag: int, kind: RegionKind) -> int:
        assert stag not in self.invalidated, "access through an invalidated STag"
        got_kind, offset, _ = self.registrar.regions[stag]
        assert got_kind is kind
        return offset

    def rdma_read(self, stag: int, kind: RegionKind, to: int, length: int) -> bytes:
        self._region(stag, kind)
        start = self.core.layout.offset_of(to)
        return bytes(self.core.memory[start : start + length])

    def direct_load_entry(self, session: int, handle: int) -> TableEntry:
        ack = self.acks[session]
        raw = self.rdma_read(ack.table_stag, RegionKind.TABLE, ack.entry_to(handle), 16)
        return TableEntry.unpack(raw)

    def direct_fetch_add(self, session: int) -> tuple[int, int]:
        """The session's FetchAdd on its Head in its counter format: (ticket, slot offset)."""
        ack = self.acks[session]
        fmt = CounterFormat.MASKED
        if ack.capabilities & Capability.UNMASKED_COUNTER:
            fmt = CounterFormat.UNMASKED
        add, mask = counter_operands(fmt, ack.ring_order)
        original = self.raw_fetch_add(session, add, mask)
        ticket = (original >> 32) & TICKET_MASK
        if fmt is CounterFormat.UNMASKED:
            return ticket, 16 * (ticket % (1 << ack.ring_order))
        return ticket, original & ((1 << (ack.ring_order + 4)) - 1)

    def raw_fetch_add(self, session: int, add: int, mask: int = 0) -> int:
        """Any RFC 7306 FetchAdd through the session's Head STag; the original value."""
        ack = self.acks[session]
        self._region(ack.head_stag, RegionKind.HEAD)
        offset = self.core.layout.offset_of(ack.head_offset)
        return self.core.fetch_add(self.core.memory, offset, add, mask)

    def direct_read_slot(self, session: int, slot_offset: int) -> Slot:
        ack = self.acks[session]
        raw = self.rdma_read(ack.ring_stag, RegionKind.RING, ack.ring_offset + slot_offset, 16)
        return Slot.unpack(raw)

    def direct_write(self, session: int, block_offset: int, data: bytes) -> None:
        ack = self.acks[session]
        self._region(ack.partition_stag, RegionKind.PARTITION)
        assert ack.partition_offset <= block_offset < ack.partition_offset + ack.partition_length
        start = self.core.layout.offset_of(block_offset)
        self.core.memory[start : start + len(data)] = data

    # -- "changes nothing" --------------------------------------------------------------
    def snapshot(self) -> Snapshot:
        core = self.core
        rings = tuple(r.state_key(self.now, 1.0) for _, r in sorted(core.rings.items()))
        usage = tuple(core.usage(i.identity) for i in core.config.initiators)
        return Snapshot(bytes(core.memory), rings, usage)

    def last_status(self) -> Status:
        return Status(self.completions[-1][1].status)
