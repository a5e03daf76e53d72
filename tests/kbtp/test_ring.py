"""FreeRing: allocation, free, deferred writes and direct-ticket bookkeeping (draft §3.3, §3.4)."""

from __future__ import annotations

import pytest

from kbtp.constants import EMPTY_BLOCK_OFFSET, RING_ADD_DATA, TICKET_MASK, pack_counter
from kbtp.layout import RingGeometry, Slot, write_counter, write_slot
from kbtp.ring import FreeRing, TicketOwner, make_local_fetch_add, ticket_distance
from stack.errors import LocalError

BLOCKS = [0x100, 0x200, 0x300]


def make_ring(order: int = 2, blocks: list[int] | None = None) -> FreeRing:
    geo = RingGeometry(
        order=order, slots_offset=0, head_offset=16 << order, tail_offset=(16 << order) + 64
    )
    mem = memoryview(bytearray(geo.tail_offset + 8))
    ring = FreeRing(mem, geo, make_local_fetch_add())
    ring.initialize(list(BLOCKS if blocks is None else blocks))
    return ring


def direct_fetch_add(ring: FreeRing) -> int:
    """What a DIRECT_ALLOC initiator's FetchAdd on Head does (through the same engine)."""
    g = ring.geometry
    original = ring.fetch_add(ring.mem, g.head_offset, RING_ADD_DATA, g.add_mask)
    return original >> 32


def test_s3_3_allocation_takes_tickets_in_order_and_marks_slots_consumed() -> None:
    ring = make_ring()
    for expect, block in enumerate(BLOCKS):
        ticket = ring.take(0.0)
        assert ticket == expect
        assert ring.ready_block(ticket) == block
        got, ready = ring.consume(ticket)
        assert (got, ready) == (block, ())
        assert ring.slot(ticket) == Slot(ticket, EMPTY_BLOCK_OFFSET)
    assert ring.head() == (3, 48)


def test_s3_3_allocation_waits_until_sequence_matches() -> None:
    """Ticket 3 reads slot 3, which holds Sequence -1 (F <= s < N) until a free writes it."""
    ring = make_ring()
    for _ in range(3):
        ring.consume(ring.take(0.0))
    ticket = ring.take(0.0)
    assert ticket == 3 and ring.ready_block(3) is None
    assert ring.slot(3).sequence == (3 - 4) & TICKET_MASK
    outcome = ring.free(0x200)
    assert (outcome.ticket, outcome.deferred, outcome.ready) == (3, False, (3,))
    assert ring.ready_block(3) == 0x200


def test_s3_3_free_writes_consumed_slot_with_tail_ticket() -> None:
    ring = make_ring()
    t0 = ring.take(0.0)
    ring.consume(t0)
    outcome = ring.free(0x100)
    assert outcome.ticket == 3 and not outcome.deferred
    assert ring.slot(3) == Slot(3, 0x100)
    assert ring.tail() == (4, 0)


def test_s3_3_free_must_defer_when_slot_not_yet_consumed() -> None:
    """N = F = 2: ticket 0 taken but not read; a free of ticket 2 lands on its slot."""
    ring = make_ring(order=1, blocks=[0x100, 0x200])
    t0 = direct_fetch_add(ring)  # an initiator took ticket 0 and has not read slot 0 yet
    t1 = ring.take(0.0)
    block1, _ = ring.consume(t1)
    outcome = ring.free(block1)
    assert outcome.ticket == 2 and outcome.deferred and outcome.ready == ()
    assert ring.slot(0) == Slot(0, 0x100)  # MUST NOT overwrite
    assert ring.available_blocks() == [0x100, 0x200]
    got, ready = ring.consume(t0)  # the BIND of ticket 0 consumes the slot ...
    assert got == 0x100 and ready == (2,)  # ... and the deferred write happens right then
    assert ring.slot(0) == Slot(2, 0x200)
    assert ring.deferred == {}


def test_s3_3_consume_refuses_a_slot_that_does_not_hold_the_ticket() -> None:
    ring = make_ring()
    with pytest.raises(LocalError):
        ring.consume(5)


def test_s3_4_observe_records_direct_tickets_with_their_time() -> None:
    ring = make_ring()
    direct_fetch_add(ring)
    direct_fetch_add(ring)
    assert ring.observe(5.0) == 2
    assert {t: (o.owner, o.seen) for t, o in ring.outstanding.items()} == {
        0: (TicketOwner.DIRECT, 5.0),
        1: (TicketOwner.DIRECT, 5.0),
    }
    assert ring.observe(6.0) == 0
    ticket = ring.take(7.0)
    assert ticket == 2 and ring.outstanding[2].owner is TicketOwner.TARGET
    assert ring.direct_outstanding() == 2
    assert ring.expired(7.0, 1.5) == [0, 1] and ring.expired(6.0, 1.5) == []
    ring.abandon(0)
    assert ring.expired(7.0, 1.5) == [1] and 0 in ring.abandoned


def test_s3_4_observe_beyond_limit_does_not_enumerate() -> None:
    ring = make_ring()
    g = ring.geometry
    write_counter(ring.mem, g.head_offset, pack_counter(1_000_000, 0))
    assert ring.observe(0.0, limit=3) == 1_000_000
    assert ring.outstanding == {} and ring.observed_head == 0


def test_s3_3_tickets_wrap_modulo_2_32() -> None:
    ring = make_ring(order=1, blocks=[0x100, 0x200])
    g = ring.geometry
    start = TICKET_MASK - 1  # ... 0xFFFFFFFE, 0xFFFFFFFF, 0, 1
    write_counter(ring.mem, g.head_offset, pack_counter(start, g.slot_offset(start)))
    write_counter(ring.mem, g.tail_offset, pack_counter(start + 2, g.slot_offset(start)))
    write_slot(ring.mem, g.slots_offset, start, 0x100)
    write_slot(ring.mem, g.slots_offset + 16, start + 1, 0x200)
    ring.observed_head = start
    seen = []
    for _ in range(4):
        t = ring.take(0.0)
        block, _ = ring.consume(t)
        seen.append((t, block))
        ring.free(block)
    assert [t for t, _ in seen] == [TICKET_MASK - 1, TICKET_MASK, 0, 1]
    assert ticket_distance(1, TICKET_MASK) == 2


def test_s3_3_corrupt_counter_is_a_project_error() -> None:
    ring = make_ring()
    write_counter(ring.mem, ring.geometry.head_offset, pack_counter(1, 0x30))
    with pytest.raises(LocalError):
        ring.take(0.0)


def test_clone_is_independent() -> None:
    ring = make_ring()
    direct_fetch_add(ring)
    ring.observe(0.0)
    twin = ring.clone(memoryview(bytearray(ring.mem)))
    twin.consume(twin.take(0.0))
    assert ring.head() == (1, 16) and twin.head() == (2, 32)
    assert 1 not in ring.outstanding and ring.slot(1).block_offset == 0x200
    assert ring.state_key(0.0, 1.0) != twin.state_key(0.0, 1.0)
