"""The two ring counter formats: masked (draft §3.3) and unmasked (draft §9.2, docs/kbtp.md §4.3).

The unmasked format lets an initiator whose RNIC has only a plain Fetch and Add (standard
verbs) allocate directly: Head holds the Ticket in its high 32 bits and zero below, and the
slot is 16 x (Ticket mod N).  These tests drive the ring and the target core through N, 2N,
3N tickets and across the 32-bit ticket wrap in both formats, run both formats side by side
on one target, switch an identity's format between sessions, and corrupt an unmasked Head
the ways a hostile initiator's atomics can (docs/kbtp.md §6.7), and recover a pool killed with
unmasked tickets in flight (§12.3).
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from kbtp.constants import (
    RING_ADD_DATA,
    RING_ADD_DATA_UNMASKED,
    TICKET_MASK,
    TICKET_MODULUS,
    Capability,
    CounterFormat,
    RequestFlag,
    Status,
    counter_operands,
    counter_ticket,
    counter_value,
    pack_counter,
    ring_add_mask,
)
from kbtp.initiator_core import DirectAlloc, FetchAddOp, InitiatorCore, check_hello_ack
from kbtp.layout import RingGeometry, read_counter, write_counter
from kbtp.messages import (
    Bind,
    DataDescriptor,
    Free,
    Hello,
    HelloAck,
    KbtpError,
    Load,
    decode_message,
)
from kbtp.pool_recovery import apply_recovery, plan_recovery, read_ring_blocks, read_table
from kbtp.ring import CounterCorrupt, FreeRing, make_local_fetch_add
from kbtp.target_actions import CloseSession, InvalidateStag, SendMessage
from kbtp.target_config import InitiatorConfig
from kbtp.target_core import TargetCore
from stack.wire.atomics import fetch_add
from tests.kbtp.helpers import A, B, C, Harness, default_config
from tests.kbtp.test_initiator_hostile import GOOD
from tests.kbtp.test_target_core import (
    DIRECT,
    SA,
    SC,
    _defer_behind_direct_ticket,
    inline_alloc,
    rejected,
)

UNMASKED = DIRECT | Capability.UNMASKED_COUNTER
D = InitiatorConfig(b"d", 48, 8, 3, "green", direct_alloc=True)
SD = 4
FORMATS = [CounterFormat.MASKED, CounterFormat.UNMASKED]


def _format_of(caps: Capability) -> CounterFormat:
    if caps & Capability.UNMASKED_COUNTER:
        return CounterFormat.UNMASKED
    return CounterFormat.MASKED


def _two_formats() -> Harness:
    """c (partition of 3, N = 4) in the masked format, d (the same) in the unmasked one."""
    h = Harness(default_config(pool_blocks=11, initiators=(A, B, C, D)))
    h.connect(SA, b"a")
    h.connect(SC, b"c", DIRECT)
    h.connect(SD, b"d", UNMASKED)
    return h


def _direct(h: Harness, session: int, data: bytes) -> tuple[int, int]:
    """FetchAdd in the session's format, read and confirm the slot, RDMA Write the data."""
    ticket, slot_offset = h.direct_fetch_add(session)
    slot = h.direct_read_slot(session, slot_offset)
    assert slot.holds(ticket), (ticket, slot)
    assert h.direct_read_slot(session, slot_offset) == slot
    h.direct_write(session, slot.block_offset, data)
    return ticket, slot.block_offset


def _head_value(h: Harness, identity: bytes) -> int:
    g = h.core.ring_of(identity).geometry
    return read_counter(h.core.memory, g.head_offset, g.byteorder)


def _load(h: Harness, session: int, handle: int, length: int) -> bytes:
    h.buffer(0x77, 64)
    assert h.request(session, Load(900 + handle, handle, DataDescriptor(0x77, 0, 64))).ok
    return bytes(h.buffers[0x77][:length])


# ======================================================================================
# The formats themselves (draft §3.3, §9.2)
# ======================================================================================


@pytest.mark.parametrize("n", [1, 2, 6, 10])
def test_s4_3_a_plain_fetch_add_corrupts_the_masked_counter_after_n_tickets(n: int) -> None:
    """Why DIRECT_ALLOC with the masked format needs MASKED_FETCH_ADD: the +16 of Add
    Data carries into bit n+4 once N tickets were taken."""
    slots = 1 << n
    value = counter_value(CounterFormat.MASKED, 0, n)
    for ticket in range(slots):
        assert counter_ticket(value, n, CounterFormat.MASKED) == ticket
        value = fetch_add(value, RING_ADD_DATA, 0)
    assert counter_ticket(value, n, CounterFormat.MASKED) is None


@pytest.mark.parametrize("start", [0, TICKET_MASK - 5])
@pytest.mark.parametrize("n", [1, 2, 6])
def test_s9_2_a_plain_fetch_add_keeps_the_unmasked_counter_sound_across_the_wrap(
    start: int, n: int
) -> None:
    add, mask = counter_operands(CounterFormat.UNMASKED, n)
    assert (add, mask) == (RING_ADD_DATA_UNMASKED, 0)
    value = counter_value(CounterFormat.UNMASKED, start, n)
    for k in range(3 * (1 << n) + 8):
        assert counter_ticket(value, n, CounterFormat.UNMASKED) == (start + k) & TICKET_MASK
        value = fetch_add(value, add, mask)


@pytest.mark.parametrize("fmt", FORMATS)
def test_s3_3_s9_2_counter_values_and_what_is_no_counter(fmt: CounterFormat) -> None:
    n = 3
    assert counter_value(fmt, 9, n) >> 32 == 9
    if fmt is CounterFormat.MASKED:
        assert counter_value(fmt, 9, n) == pack_counter(9, 16)
        assert counter_operands(fmt, n) == (RING_ADD_DATA, ring_add_mask(n))
    else:
        assert counter_value(fmt, 9, n) == 9 << 32
    good = counter_value(fmt, 9, n)
    assert counter_ticket(good, n, fmt) == 9
    for bad in (good + 1, good | 1 << 20, good + 16 * 3):
        assert counter_ticket(bad, n, fmt) is None
    # A value of one format with a slot offset is none of the other (ticket 9 is no
    # multiple of N); a ticket that is a multiple of N reads the same in both.
    other = FORMATS[1 - FORMATS.index(fmt)]
    assert counter_ticket(good, n, other) is None
    assert counter_ticket(counter_value(fmt, 16, n), n, other) == 16


# ======================================================================================
# FreeRing: N, 2N, 3N tickets and the 32-bit wrap
# ======================================================================================


def _ring(fmt: CounterFormat, first_ticket: int, blocks: list[int]) -> FreeRing:
    order = 2
    geo = RingGeometry(order, 0, 16 << order, (16 << order) + 64)
    ring = FreeRing(memoryview(bytearray(geo.tail_offset + 8)), geo, make_local_fetch_add())
    ring.initialize(blocks, fmt, first_ticket)
    return ring


@pytest.mark.parametrize("first", [0, TICKET_MODULUS - 6, TICKET_MODULUS - 1])
@pytest.mark.parametrize("fmt", FORMATS)
def test_s3_3_allocation_and_free_cycle_through_3n_tickets_and_the_wrap(
    fmt: CounterFormat, first: int
) -> None:
    blocks = [0x100, 0x200, 0x300]
    ring = _ring(fmt, first, blocks)
    assert ring.head()[0] == first and ring.tail()[0] == (first + 3) & TICKET_MASK
    held: list[int] = []
    for k in range(3 * ring.geometry.slots + 2):
        ticket = ring.take(0.0)
        assert ticket == (first + k) & TICKET_MASK
        block = ring.ready_block(ticket)
        assert block is not None
        got, ready = ring.consume(ticket)
        assert got == block and ready == ()
        held.append(block)
        if len(held) == 2:  # keep up to two blocks out, free the oldest
            out = ring.free(held.pop(0))
            assert not out.deferred
        g = ring.geometry
        for offset in (g.head_offset, g.tail_offset):
            assert counter_ticket(read_counter(ring.mem, offset), g.order, fmt) is not None
    assert sorted(ring.available_blocks() + held) == blocks


@pytest.mark.parametrize("fmt", FORMATS)
def test_s6_7_the_ring_refuses_a_counter_of_the_other_format(fmt: CounterFormat) -> None:
    ring = _ring(fmt, 1, [0x100, 0x200])
    other = FORMATS[1 - FORMATS.index(fmt)]
    write_counter(ring.mem, ring.geometry.head_offset, counter_value(other, 1, 2))
    with pytest.raises(CounterCorrupt, match=f"no counter.*{fmt.value}"):
        ring.take(0.0)


# ======================================================================================
# Negotiation (docs/kbtp.md §4.3)
# ======================================================================================


def _granted(h: Harness, session: int, identity: bytes, caps: Capability) -> Capability:
    h.core.open_session(session)
    acts = h.registered(h.core.handle_message(session, Hello(7, caps, identity).encode(), h.now))
    ack = acts[0]
    assert isinstance(ack, SendMessage) and isinstance(ack.message, HelloAck)
    assert ack.message.status == Status.SUCCESS
    return Capability(ack.message.capabilities)


def test_s4_3_unmasked_counter_is_granted_with_direct_alloc_only() -> None:
    h = Harness()
    alloc = Capability.DIRECT_ALLOC
    # A verbs initiator: plain FetchAdd only; DIRECT_ALLOC in the unmasked format.
    assert _granted(h, 1, b"c", alloc | Capability.UNMASKED_COUNTER) == (
        alloc | Capability.UNMASKED_COUNTER
    )
    assert h.core.ring_of(b"c").counter_format is CounterFormat.UNMASKED
    h.core.close_session(1, h.now)
    # Asked for with the masked FetchAdd too: the initiator's request decides.
    both = alloc | Capability.MASKED_FETCH_ADD | Capability.UNMASKED_COUNTER
    assert _granted(h, 2, b"c", both) == alloc | Capability.UNMASKED_COUNTER
    h.core.close_session(2, h.now)
    # Neither format's FetchAdd: no DIRECT_ALLOC; UNMASKED_COUNTER alone means nothing.
    assert _granted(h, 3, b"c", alloc) == Capability.NONE
    h.core.close_session(3, h.now)
    assert _granted(h, 4, b"c", Capability.UNMASKED_COUNTER) == Capability.NONE
    # An identity without DIRECT_ALLOC gets neither.
    assert _granted(h, 5, b"a", alloc | Capability.UNMASKED_COUNTER) == Capability.NONE


def test_s4_3_the_masked_grant_puts_the_ring_back_in_the_masked_format() -> None:
    """Each HELLO granting DIRECT_ALLOC sets the partition's format; bound blocks stay."""
    h = Harness()
    h.connect(SC, b"c", UNMASKED)
    ticket, block = _direct(h, SC, b"unmasked")
    assert ticket == 0 and _head_value(h, b"c") == 1 << 32
    assert h.request(SC, Bind(1, 32, ticket, 8, block, flags=RequestFlag.SEAL)).ok
    h.core.close_session(SC, h.now)
    h.connect(9, b"c", DIRECT)
    ring = h.core.ring_of(b"c")
    assert ring.counter_format is CounterFormat.MASKED
    assert _head_value(h, b"c") == pack_counter(0, 0)
    assert len(ring.available_blocks()) == 2
    assert _load(h, 9, 32, 8) == b"unmasked"
    ticket, block = _direct(h, 9, b"masked")
    assert h.request(9, Bind(2, 33, ticket, 6, block, flags=RequestFlag.SEAL)).ok
    assert _head_value(h, b"c") == pack_counter(1, 16)
    h.core.close_session(9, h.now)
    h.connect(10, b"c", UNMASKED)
    assert _head_value(h, b"c") == 0 and h.core.ring_of(b"c").counter_format.value == "unmasked"
    assert _load(h, 10, 33, 6) == b"masked"


# ======================================================================================
# The target core: tickets across N, 2N, 3N and the wrap, both formats side by side
# ======================================================================================


@pytest.mark.parametrize("first", [0, TICKET_MODULUS - 5])
@pytest.mark.parametrize("caps", [DIRECT, UNMASKED], ids=["masked", "unmasked"])
def test_s6_6_direct_allocations_through_3n_tickets(caps: Capability, first: int) -> None:
    """Direct allocations, target-executed ALLOC_STOREs on the same partition ring, BINDs
    and FREEs through 3N + 1 tickets; ``first`` starts the tickets 5 before the wrap."""
    h = Harness()
    h.connect(SC, b"c", caps)
    ring = h.core.ring_of(b"c")
    part = h.core.layout.partitions[0]
    ring.initialize(h.core._partition_blocks(part), first_ticket=first)
    fmt = _format_of(caps)
    slots = ring.geometry.slots
    expect = first
    for k in range(3 * slots + 1):
        data = bytes([k]) * 5
        if k % 3 == 2:  # every third ticket is the target's own FetchAdd
            comp = h.request(SC, inline_alloc(k + 1, 32, data))
            assert comp.ok
        else:
            ticket, block = _direct(h, SC, data)
            assert ticket == expect
            assert h.request(SC, Bind(k + 1, 32, ticket, 5, block, flags=RequestFlag.SEAL)).ok
        value = _head_value(h, b"c")
        expect = (expect + 1) & TICKET_MASK
        assert counter_ticket(value, ring.geometry.order, fmt) == expect
        assert _load(h, SC, 32, 5) == data
        assert h.request(SC, Free(500 + k, 32)).ok
        assert h.core.usage(b"c") == 0
    assert expect == (first + 3 * slots + 1) & TICKET_MASK
    assert sorted(ring.available_blocks()) == h.core._partition_blocks(part)
    assert not h.closed


def test_s6_6_masked_and_unmasked_partitions_side_by_side() -> None:
    """Interleaved direct allocations on c (masked) and d (unmasked): each Head stays in
    its own format, and each partition's blocks go to its own initiator only."""
    h = _two_formats()
    order = h.core.ring_of(b"c").geometry.order
    for k in range(2 * (1 << order) + 1):
        for session, identity, handle in ((SC, b"c", 32), (SD, b"d", 48)):
            data = identity * 4 + bytes([k])
            ticket, block = _direct(h, session, data)
            assert h.request(session, Bind(k, handle, ticket, 5, block, flags=RequestFlag.SEAL)).ok
            assert _load(h, SA, handle, 5) == data
            assert h.request(session, Free(100 + k, handle)).ok
        t = k + 1
        assert _head_value(h, b"c") == pack_counter(t, 16 * (t % (1 << order)))
        assert _head_value(h, b"d") == t << 32
    parts = h.core.layout.partitions
    for identity, part in ((b"c", parts[0]), (b"d", parts[1])):
        assert sorted(h.core.ring_of(identity).available_blocks()) == (
            h.core._partition_blocks(part)
        )


# ======================================================================================
# A corrupted unmasked Head (docs/kbtp.md §6.7)
# ======================================================================================

HOSTILE = ["masked FetchAdd", "plain +1", "plain +16", "far ahead", "backwards"]


def _corrupt_d(h: Harness, how: str) -> None:
    n = h.acks[SD].ring_order
    if how == "masked FetchAdd":  # the §3.3 operands on a §9.2 counter
        h.raw_fetch_add(SD, RING_ADD_DATA, ring_add_mask(n))
    elif how == "plain +1":
        h.raw_fetch_add(SD, 1)
    elif how == "plain +16":
        h.raw_fetch_add(SD, 16)
    elif how == "far ahead":  # a sound value, 2**31 tickets on (a Compare and Swap)
        h.raw_fetch_add(SD, 1 << 63)
    else:  # backwards, after the target saw tickets 0 and 1
        h.direct_fetch_add(SD)
        h.direct_fetch_add(SD)
        h.tick(0.0)
        h.raw_fetch_add(SD, (TICKET_MODULUS - 3) << 32)


@pytest.mark.parametrize("how", HOSTILE)
@pytest.mark.parametrize("trigger", ["ALLOC_STORE", "BIND", "tick"])
def test_s6_7_a_corrupted_unmasked_head_ends_direct_alloc_on_that_ring_only(
    how: str, trigger: str
) -> None:
    h = _two_formats()
    assert h.request(SD, inline_alloc(1, 48, b"kept")).ok
    c_ticket, c_block = _direct(h, SC, b"c's")  # c's ticket in flight meanwhile
    h.tick(0.0)  # the target has seen it
    c_ring = h.core.ring_of(b"c")
    c_before = (c_ring.state_key(h.now, 1.0), _head_value(h, b"c"))
    _corrupt_d(h, how)
    if trigger == "ALLOC_STORE":
        h.send(SD, inline_alloc(2, 49, b"x"))
    elif trigger == "BIND":
        h.send(SD, Bind(2, 49, 1, 1, h.core.layout.block_to(3)))
    else:
        h.tick(0.1)
    if trigger != "tick":
        assert h.last_status() is Status.NO_SPACE
    closing = h.closed[-1]
    assert isinstance(closing, CloseSession) and closing.session == SD
    assert closing.status is Status.NO_SPACE
    if how.startswith(("masked", "plain")):
        assert "corrupt" in closing.reason and "unmasked" in closing.reason
    # d's ring is rebuilt in its format from its unbound blocks; its bound block stays.
    d_ring = h.core.ring_of(b"d")
    assert d_ring.counter_format is CounterFormat.UNMASKED
    assert d_ring.head() == (0, 0) and _head_value(h, b"d") == 0
    assert len(d_ring.available_blocks()) == 2 and h.core.entry(48).valid
    # c's ring was not touched; its ticket binds.
    assert (c_ring.state_key(h.now, 1.0), _head_value(h, b"c")) == c_before
    assert h.request(SC, Bind(3, 32, c_ticket, 3, c_block)).ok
    assert h.request(SA, inline_alloc(4, 2, b"a")).ok
    # d comes back and allocates directly again.
    h.connect(9, b"d", UNMASKED)
    ticket, block = _direct(h, 9, b"again")
    assert h.request(9, Bind(5, 49, ticket, 5, block)).ok
    assert _load(h, SA, 48, 4) == b"kept"


def test_s6_7_a_bind_after_an_unmasked_wrap_past_the_quota_is_refused() -> None:
    """More tickets than the quota in the unmasked format: NO_SPACE, session closed."""
    h = Harness()
    h.connect(SC, b"c", UNMASKED)
    for _ in range(4):  # quota 3
        h.direct_fetch_add(SC)
    h.send(SC, Bind(1, 32, 0, 1, h.core.layout.block_to(0)))
    assert h.last_status() is Status.NO_SPACE
    assert h.closed[-1].session == SC


def test_s6_7_an_honest_unmasked_session_is_not_disturbed_by_checks() -> None:
    """Ticks, refused BINDs and ALLOC_STOREs between direct allocations change nothing."""
    h = Harness()
    h.connect(SC, b"c", UNMASKED)
    ticket, block = _direct(h, SC, b"one")
    h.tick(0.1)
    rejected(h, SC, Bind(1, 32, ticket, 3, block + 1), Status.BAD_BIND)
    assert h.request(SC, Bind(2, 32, ticket, 3, block)).ok
    assert h.request(SC, inline_alloc(3, 33, b"two")).ok
    assert _head_value(h, b"c") == 2 << 32
    assert not h.closed


def test_s4_3_hello_ack_of_an_unmasked_session_round_trips() -> None:
    h = Harness()
    ack = h.connect(SC, b"c", UNMASKED)
    assert isinstance(ack, HelloAck)
    assert ack.capabilities & Capability.UNMASKED_COUNTER
    assert not ack.capabilities & Capability.MASKED_FETCH_ADD  # never echoed


# ======================================================================================
# The persistent pool (docs/kbtp.md §12.3): the format is a session's, not the file's
# ======================================================================================


def test_s12_3_recovery_counts_unmasked_tickets_in_flight_and_rebuilds_masked() -> None:
    """A pool killed with two unmasked direct tickets taken and not bound: recovery reads
    the unmasked Head, reclaims exactly those two blocks, keeps the sealed one, and
    rebuilds the ring in the masked format; the next unmasked HELLO switches it back."""
    h = Harness()
    h.connect(SC, b"c", UNMASKED)
    ticket, block = _direct(h, SC, b"sealed")
    assert h.request(SC, Bind(1, 32, ticket, 6, block, flags=RequestFlag.SEAL)).ok
    _direct(h, SC, b"in flight")
    h.direct_fetch_add(SC)
    core, lay, mem = h.core, h.core.layout, h.core.memory
    assert _head_value(h, b"c") == 3 << 32  # no counter of the masked format
    plan = plan_recovery(
        core.config, lay, read_table(mem, lay), lay.base_to, read_ring_blocks(mem, lay)
    )
    r = plan.report
    assert (r.sealed, r.reclaimed, r.repaired) == (1, 2, 0), r.line()
    apply_recovery(mem, lay, plan)
    again = TargetCore(core.config, mem, recovered=True)
    ring = again.ring_of(b"c")
    assert ring.counter_format is CounterFormat.MASKED
    assert read_counter(mem, ring.geometry.head_offset) == pack_counter(0, 0)
    assert len(ring.available_blocks()) == 2 and block not in ring.available_blocks()
    h2 = Harness(core.config)
    h2.core = again
    h2.connect(7, b"c", UNMASKED)
    assert ring.counter_format is CounterFormat.UNMASKED
    t2, b2 = _direct(h2, 7, b"after")
    assert (t2, _head_value(h2, b"c")) == (0, 1 << 32)
    assert h2.request(7, Bind(2, 33, t2, 5, b2, flags=RequestFlag.SEAL)).ok
    assert _load(h2, 7, 32, 6) == b"sealed" and _load(h2, 7, 33, 5) == b"after"


# ======================================================================================
# Deferred frees and the Ticket Timeout on an unmasked ring (draft §3.3, §3.4; §6.7)
# ======================================================================================


@pytest.mark.parametrize("start", [0, TICKET_MASK - 1], ids=["tickets from 0", "wrapping"])
def test_s3_4_unmasked_abandoned_tickets_behind_a_deferred_free_are_reclaimed(
    start: int,
) -> None:
    c2 = InitiatorConfig(b"c", 32, 8, 2, "green", direct_alloc=True)
    h = Harness(default_config(initiators=(A, c2), pool_blocks=4))
    h.connect(SC, b"c", Capability.DIRECT_ALLOC | Capability.UNMASKED_COUNTER)
    ring = h.core.ring_of(b"c")
    ring.initialize(h.core._partition_blocks(h.core.layout.partitions[0]), first_ticket=start)
    t1, t3, _ = _defer_behind_direct_ticket(h)
    assert (t1, t3) == ((start + 1) & TICKET_MASK, (start + 3) & TICKET_MASK)
    h.tick(0.0)
    assert h.core.usage(b"c") == 2
    h.tick(1.5)  # both expire: the STags are invalidated, then both blocks reclaimed
    h.finish_all((InvalidateStag,))
    assert h.core.usage(b"c") == 0 and ring.deferred == {} and ring.outstanding == {}
    assert sorted(ring.available_blocks()) == h.core._partition_blocks(h.core.layout.partitions[0])
    rejected(h, SC, Bind(9, 34, t3, 1, 0), Status.TICKET_ABANDONED)
    g = ring.geometry
    for offset in (g.head_offset, g.tail_offset):  # the reclaims' FetchAdds kept the format
        value = read_counter(h.core.memory, offset)
        assert counter_ticket(value, g.order, ring.counter_format) is not None
    assert ring.counter_format is CounterFormat.UNMASKED and not h.closed


# ======================================================================================
# The initiator's side of the negotiation (docs/kbtp.md §4.2, §4.3)
# ======================================================================================


def test_s4_3_the_initiator_asks_for_one_format_and_checks_the_grant() -> None:
    plain = InitiatorCore(b"v", DIRECT | Capability.UNMASKED_COUNTER)
    hello = decode_message(plain.hello())
    assert isinstance(hello, Hello)
    assert hello.capabilities == DIRECT | Capability.UNMASKED_COUNTER  # no MASKED_FETCH_ADD
    masked = decode_message(InitiatorCore(b"m", DIRECT).hello())
    assert isinstance(masked, Hello)
    assert masked.capabilities == DIRECT | Capability.MASKED_FETCH_ADD
    asked = DIRECT | Capability.UNMASKED_COUNTER
    unmasked_ack = replace(GOOD, capabilities=asked)
    check_hello_ack(unmasked_ack, asked)
    with pytest.raises(KbtpError, match="masked counter to a plain FetchAdd"):
        check_hello_ack(GOOD, asked)  # DIRECT_ALLOC in the masked format: unusable
    lone = Capability.DIRECT_LOAD | Capability.UNMASKED_COUNTER
    with pytest.raises(KbtpError, match="UNMASKED_COUNTER without DIRECT_ALLOC"):
        check_hello_ack(replace(GOOD, capabilities=lone), asked)
    # The step machine's FetchAdd follows the grant; a masked value is no counter here.
    alloc = DirectAlloc(unmasked_ack, b"x")
    op = alloc.next_op()
    assert isinstance(op, FetchAddOp) and (op.add, op.mask) == (RING_ADD_DATA_UNMASKED, 0)
    with pytest.raises(KbtpError, match="no counter of its ring"):
        alloc.feed(pack_counter(1, 16))
    alloc = DirectAlloc(unmasked_ack, b"x")
    alloc.feed(5 << 32)
    assert (alloc.ticket, alloc.slot_offset) == (5, 16 * (5 % 4))
