"""The initiator pieces against the real target core, wired back to back (no sockets).

The test plays both RNICs: the target's RDMA Writes and Reads touch the initiator's
buffers, and the initiator's one-sided operations touch target memory through the STags
the target registered (bounds and invalidation checked as an RNIC would).
"""

from __future__ import annotations

import pytest

from kbtp.constants import Capability, RequestFlag, Status
from kbtp.initiator_core import (
    AllocState,
    CompareSwapOp,
    DirectAlloc,
    DirectLoad,
    FetchAddOp,
    InitiatorCore,
    InitiatorEvent,
    ReadOp,
    RequestCompleted,
    SessionReady,
    SessionRefused,
    WriteOp,
)
from kbtp.layout import TableEntry
from kbtp.messages import (
    AllocStore,
    Completion,
    DataDescriptor,
    Free,
    KbtpError,
    Load,
    inline_descriptor,
)
from kbtp.target_actions import Action, InvalidateStag, RegionKind, SendMessage
from stack.errors import LocalError
from tests.kbtp.helpers import Harness

DIRECT = Capability.DIRECT_LOAD | Capability.DIRECT_ALLOC


class Pair:
    """An InitiatorCore on session ``sid`` of a Harness-driven TargetCore."""

    def __init__(self, h: Harness, sid: int, identity: bytes, caps: Capability) -> None:
        self.h, self.sid = h, sid
        self.ini = InitiatorCore(identity, caps)
        h.core.open_session(sid)
        self.events = self._deliver(
            h.registered(h.core.handle_message(sid, self.ini.hello(), h.now))
        )

    def _deliver(self, actions: list[Action]) -> list[InitiatorEvent]:
        before = len(self.h.completions)
        events: list[InitiatorEvent] = []
        for a in actions:  # HELLO_ACK here; COMPLETIONs below, in the order recorded
            if isinstance(a, SendMessage) and a.session == self.sid:
                if not isinstance(a.message, Completion):
                    events += self.ini.on_message(a.encode())
        self.h.absorb(actions, auto=False)
        for sess, comp, _ in self.h.completions[before:]:
            if sess == self.sid:
                events += self.ini.on_message(comp.encode())
        return events

    def pump(self, finish: bool = True) -> list[InitiatorEvent]:
        """Send what the credits allow; optionally complete the target's RDMA operations."""
        events: list[InitiatorEvent] = []
        for data in self.ini.outgoing():
            events += self._deliver(
                self.h.registered(self.h.core.handle_message(self.sid, data, self.h.now))
            )
        while finish and self.h.pending:
            op_id = min(self.h.pending)
            before = len(self.h.completions)
            self.h.finish(op_id)
            for sess, comp, _ in self.h.completions[before:]:
                if sess == self.sid:
                    events += self.ini.on_message(comp.encode())
        return events

    def run(self, op: ReadOp | FetchAddOp | WriteOp) -> int | bytes:
        """Execute a one-sided operation at the target, as the target's RNIC would."""
        h = self.h
        assert op.stag not in h.invalidated, "access through an invalidated STag"
        kind, offset, length = h.registrar.regions[op.stag]
        start = h.core.layout.offset_of(op.to)
        size = (
            8
            if isinstance(op, FetchAddOp)
            else (op.length if isinstance(op, ReadOp) else len(op.data))
        )
        assert offset <= start and start + size <= offset + length, "base/bounds violation"
        mem = h.core.memory
        if isinstance(op, ReadOp):
            assert kind in (RegionKind.TABLE, RegionKind.POOL, RegionKind.RING)
            return bytes(mem[start : start + size])
        if isinstance(op, FetchAddOp):
            assert kind is RegionKind.HEAD
            return h.core.fetch_add(mem, start, op.add, op.mask)
        assert kind is RegionKind.PARTITION
        mem[start : start + size] = op.data
        return b""

    def read(self, op: ReadOp | None) -> bytes:
        """Execute ``op``, which must be an RDMA Read, and return the octets it read."""
        assert op is not None
        data = self.run(op)
        assert isinstance(data, bytes)
        return data


@pytest.fixture
def h() -> Harness:
    return Harness()


def test_s4_2_hello_then_requests_within_credits(h: Harness) -> None:
    p = Pair(h, 1, b"a", DIRECT)
    assert isinstance(p.events[0], SessionReady) and p.ini.credits == 4
    h.buffer(0x55, 64)
    ids = [
        p.ini.submit(
            AllocStore(
                0,
                x,
                inline_descriptor(b"v%d" % x),
                b"v%d" % x,
                flags=RequestFlag.INLINE | RequestFlag.SEAL,
            )
        )
        for x in range(2)
    ]
    ids += [p.ini.submit(Load(0, x % 2, DataDescriptor(0x55, 0, 64))) for x in range(6)]
    assert len(set(ids)) == 8 and p.ini.queued == 8
    sent = p.ini.outgoing()
    assert len(sent) == 4 and p.ini.credits == 0 and p.ini.queued == 4
    events = []
    for data in sent:
        events += p._deliver(h.core.handle_message(1, data, 0.0))
    events += p.pump()  # finish the Writes, then send the rest as credits return
    events += p.pump()
    done = [e for e in events if isinstance(e, RequestCompleted)]
    assert sorted(e.request.request_id for e in done) == sorted(ids)
    assert all(e.ok for e in done) and p.ini.outstanding == 0 and p.ini.queued == 0


def test_s4_2_refused_hello(h: Harness) -> None:
    p = Pair(h, 1, b"stranger", Capability.NONE)
    assert isinstance(p.events[0], SessionRefused)
    assert p.events[0].ack.status == Status.UNKNOWN_INITIATOR and p.ini.credits == 0


def test_unexpected_completion_is_a_protocol_error(h: Harness) -> None:
    p = Pair(h, 1, b"a", Capability.NONE)
    with pytest.raises(KbtpError):
        p.ini.on_message(Completion(777).encode())
    with pytest.raises(LocalError):
        p.ini.hello()


def test_s6_6_direct_load_round_trip(h: Harness) -> None:
    p = Pair(h, 1, b"a", DIRECT)
    p.ini.submit(
        AllocStore(
            0,
            3,
            inline_descriptor(b"kv block"),
            b"kv block",
            flags=RequestFlag.INLINE | RequestFlag.SEAL,
        )
    )
    p.pump()
    ack = p.ini.ack
    assert ack is not None
    load = DirectLoad(ack, 3)
    while (op := load.next_op()) is not None:
        load.feed(p.read(op))
    assert load.data == b"kv block"
    unsealed = DirectLoad(ack, 4)
    unsealed.feed(p.read(unsealed.next_op()))
    assert unsealed.done and unsealed.data is None and "VALID" in unsealed.reason


def test_s6_6_direct_load_sees_a_free_between_its_reads(h: Harness) -> None:
    p = Pair(h, 1, b"a", DIRECT)
    p.ini.submit(
        AllocStore(
            0, 3, inline_descriptor(b"old"), b"old", flags=RequestFlag.INLINE | RequestFlag.SEAL
        )
    )
    p.pump()
    assert p.ini.ack is not None
    load = DirectLoad(p.ini.ack, 3)
    load.feed(p.read(load.next_op()))
    p.ini.submit(Free(0, 3))
    p.pump()
    while (op := load.next_op()) is not None:
        load.feed(p.read(op))
    assert load.data is None and "changed" in load.reason


def test_s6_6_direct_load_refuses_a_torn_entry_read_with_the_same_generation(h: Harness) -> None:
    """A 16-octet RDMA Read is not atomic: a first read may show the new Generation with the
    old Data Length and Block Offset.  Both reads must be identical, not just agree on the
    Generation (docs/kbtp.md §6.6)."""
    p = Pair(h, 1, b"a", DIRECT)
    p.ini.submit(
        AllocStore(
            0, 3, inline_descriptor(b"new"), b"new", flags=RequestFlag.INLINE | RequestFlag.SEAL
        )
    )
    p.pump()
    assert p.ini.ack is not None
    load = DirectLoad(p.ini.ack, 3)
    whole = p.read(load.next_op())
    real = TableEntry.unpack(whole)
    torn = TableEntry(real.flags, real.generation, real.data_length + 1, real.block_offset)
    load.feed(torn.pack())
    while (op := load.next_op()) is not None:
        load.feed(p.read(op))
    assert load.data is None and "changed" in load.reason


def test_s6_6_direct_load_never_reads_outside_the_table(h: Harness) -> None:
    """HELLO_ACK's Table Entries bound the handles DIRECT_LOAD may read (§5.4)."""
    p = Pair(h, 1, b"a", DIRECT)
    ack = p.ini.ack
    assert ack is not None and ack.table_entries > 0
    last = ack.table_base_handle + ack.table_entries - 1
    assert DirectLoad(ack, last).next_op() is not None
    beyond = DirectLoad(ack, last + 1)
    assert beyond.next_op() is None and beyond.done and beyond.data is None
    assert "HANDLE_OUT_OF_RANGE" in beyond.reason


def test_s6_6_direct_alloc_round_trip(h: Harness) -> None:
    p = Pair(h, 3, b"c", DIRECT)
    assert p.ini.ack is not None
    alloc = DirectAlloc(p.ini.ack, b"written one-sidedly")
    ops = []
    while (op := alloc.next_op()) is not None:
        ops.append(type(op).__name__)
        assert not isinstance(op, CompareSwapOp)  # DIRECT_ALLOC uses no Compare and Swap
        alloc.feed(p.run(op))
    assert ops == ["FetchAddOp", "ReadOp", "ReadOp", "WriteOp"] and alloc.polls == 2
    p.ini.submit(alloc.bind(35, seal=True))
    (done,) = [e for e in p.pump() if isinstance(e, RequestCompleted)]
    assert done.ok and done.completion.block_offset == alloc.block_offset
    h.buffer(0x55, 64)
    p.ini.submit(Load(0, 35, DataDescriptor(0x55, 0, 64)))
    p.pump()
    assert bytes(h.buffers[0x55][:19]) == b"written one-sidedly"


def test_s3_4_direct_alloc_learns_its_ticket_was_abandoned(h: Harness) -> None:
    p = Pair(h, 3, b"c", DIRECT)
    assert p.ini.ack is not None
    alloc = DirectAlloc(p.ini.ack, b"slow")
    fetch = alloc.next_op()
    assert isinstance(fetch, FetchAddOp)
    alloc.feed(p.run(fetch))
    h.tick(0.0)
    h.tick(2.0)  # Ticket Timeout: STags invalidated, then the block reclaimed
    h.finish_all((InvalidateStag,))
    slot_op = alloc.next_op()
    assert isinstance(slot_op, ReadOp) and slot_op.stag in h.invalidated  # RNIC would refuse
    raw = bytes(h.core.memory[h.core.layout.offset_of(slot_op.to) :][:16])
    alloc.feed(raw)
    assert alloc.state is AllocState.ABANDONED
    with pytest.raises(LocalError):
        alloc.bind(33)


def test_direct_modes_need_their_capability(h: Harness) -> None:
    p = Pair(h, 2, b"b", DIRECT)
    assert p.ini.ack is not None and p.ini.ack.capabilities == Capability.NONE
    with pytest.raises(LocalError):
        DirectLoad(p.ini.ack, 0)
    with pytest.raises(LocalError):
        DirectAlloc(p.ini.ack, b"x")
