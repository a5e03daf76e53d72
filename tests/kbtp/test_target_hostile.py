"""A target no tenant can escape or kill (docs/kbtp.md §3.6, §6.6, §6.7, §9.3).

Each test drives :class:`TargetCore` with what a hostile DIRECT_ALLOC initiator could do to
the memory its STags reach: rewriting a ring slot's Block Offset (what a Compare and Swap
through an atomic-capable Ring STag did before the slots became read-only), and any atomic
on its Head (the Head STag is remote atomic).  The target must refuse the BIND or detect
the corrupted counter, answer, and never raise or touch another tenant's data.
"""

from __future__ import annotations

import pytest

from kbtp.constants import (
    TICKET_MASK,
    Capability,
    Status,
    pack_counter,
)
from kbtp.layout import read_counter, write_counter, write_slot
from kbtp.messages import AllocStore, Bind, DataDescriptor, Free, Load
from kbtp.target_actions import CloseSession, ReadFromInitiator, RegionKind, RegisterMemory
from kbtp.target_state import SHARED_RING
from tests.kbtp.helpers import Harness, default_config
from tests.kbtp.test_target_core import (
    DIRECT,
    SA,
    SB,
    SC,
    direct_alloc,
    inline_alloc,
    inline_store,
    rejected,
)


def _harness() -> Harness:
    h = Harness()
    h.connect(SA, b"a")
    h.connect(SC, b"c", DIRECT)
    return h


def _forged_ticket(h: Harness, block_offset: int) -> int:
    """Take a direct ticket, then rewrite its slot's Block Offset (a forged slot)."""
    ticket, _ = h.direct_fetch_add(SC)
    ring = h.core.ring_of(b"c")
    write_slot(ring.mem, ring.slot_byte_offset(ticket), ticket, block_offset)
    return ticket


# ======================================================================================
# What the STags expose (docs/kbtp.md §3.6)
# ======================================================================================


def test_s3_6_no_atomic_reaches_a_slot() -> None:
    """The Ring STag covers the slots only; the Head STag covers the 8 octets of Head."""
    from kbtp.target import REGION_ACCESS
    from stack.rnic import Access

    h = Harness()
    h.core.open_session(SC)
    hello = h.core.handle_message(SC, _hello(b"c"), h.now)
    asked = {a.kind: (a.offset, a.length) for a in hello if isinstance(a, RegisterMemory)}
    ring = h.core.layout.partitions[0].ring
    assert asked[RegionKind.RING] == (ring.slots_offset, 16 * ring.slots)
    assert asked[RegionKind.HEAD] == (ring.head_offset, 8)
    atomic = [k for k, access in REGION_ACCESS.items() if access & Access.REMOTE_ATOMIC]
    assert atomic == [RegionKind.HEAD]
    assert REGION_ACCESS[RegionKind.HEAD] == Access.REMOTE_ATOMIC


def _hello(identity: bytes) -> bytes:
    from kbtp.messages import Hello

    return Hello(99, DIRECT | Capability.MASKED_FETCH_ADD, identity).encode()


# ======================================================================================
# BIND verifies its Block Offset (docs/kbtp.md §6.6)
# ======================================================================================


def test_s6_6_bind_of_another_tenants_block_is_refused() -> None:
    """A forged slot naming a's bound block: BIND is BAD_BIND, a's data stays a's."""
    h = _harness()
    victim = h.request(SA, inline_alloc(1, 1, b"a's secret")).block_offset
    ticket = _forged_ticket(h, victim)
    rejected(h, SC, Bind(2, 33, ticket, 4, victim), Status.BAD_BIND)
    h.buffer(0x55, 16)
    assert h.request(SC, Load(3, 1, DataDescriptor(0x55, 0, 16))).ok
    assert bytes(h.buffers[0x55][:10]) == b"a's secret"
    # a's FREE puts its block back into the shared ring once: never handed out twice.
    assert h.request(SA, Free(4, 1)).ok
    shared = h.core.rings[SHARED_RING].available_blocks()
    assert shared.count(victim) == 1 and len(shared) == len(set(shared))
    assert h.core.layout.shared_blocks == len(shared)


@pytest.mark.parametrize(
    "forged",
    ["table offset", "past the memory", "misaligned", "bound by another handle"],
)
def test_s6_6_bind_refuses_a_block_offset_outside_the_partitions_free_blocks(
    forged: str,
) -> None:
    h = _harness()
    lay = h.core.layout
    own = lay.block_to(lay.partitions[0].first_block)
    if forged == "table offset":
        block = lay.to(lay.table_offset)
    elif forged == "past the memory":
        block = lay.to(lay.size)
    elif forged == "misaligned":
        block = own + 1
    else:
        block = h.request(SC, inline_alloc(1, 32, b"bound")).block_offset
    ticket = _forged_ticket(h, block)
    rejected(h, SC, Bind(2, 33, ticket, 4, block), Status.BAD_BIND)
    # Nothing went wrong later: the handle is unbound, its FREE and STORE are refused.
    rejected(h, SC, Free(3, 33), Status.NOT_VALID)
    rejected(h, SC, inline_store(4, 33, b"x"), Status.NOT_VALID)


def test_s6_6_an_honest_bind_after_a_refused_one_still_works() -> None:
    h = _harness()
    ticket, block = direct_alloc(h, b"fine")
    rejected(h, SC, Bind(1, 33, ticket, 4, block + 64 * 7), Status.BAD_BIND)
    assert h.request(SC, Bind(2, 33, ticket, 4, block)).ok


# ======================================================================================
# A corrupted Head is detected and answered (docs/kbtp.md §6.7)
# ======================================================================================


def _corrupt(h: Harness, how: str) -> None:
    ring = h.core.ring_of(b"c")
    g = ring.geometry
    value = read_counter(ring.mem, g.head_offset, g.byteorder)
    if how == "unmasked +1":
        value += 1
    elif how == "far ahead":
        value = pack_counter(1 << 31, g.slot_offset(1 << 31))
    elif how == "backwards":
        h.direct_fetch_add(SC)
        h.direct_fetch_add(SC)
        h.tick(0.0)  # the target has seen tickets 0 and 1
        value = pack_counter(TICKET_MASK, g.slot_offset(TICKET_MASK))
    elif how == "middle bits":
        value |= 1 << 20
    write_counter(ring.mem, g.head_offset, value, g.byteorder)


HOW = ["unmasked +1", "far ahead", "backwards", "middle bits"]


@pytest.mark.parametrize("how", HOW)
@pytest.mark.parametrize("trigger", ["ALLOC_STORE", "BIND", "tick"])
def test_s6_7_a_corrupted_head_closes_the_session_and_rebuilds_the_partition(
    how: str, trigger: str
) -> None:
    h = _harness()
    h.request(SC, inline_alloc(1, 32, b"kept"))
    _corrupt(h, how)
    if trigger == "ALLOC_STORE":
        h.send(SC, inline_alloc(2, 33, b"x"))
    elif trigger == "BIND":
        h.send(SC, Bind(2, 33, 1, 1, h.core.layout.block_to(1)))
    else:
        h.tick(0.1)
    if trigger != "tick":
        assert h.last_status() is Status.NO_SPACE
    closing = h.closed[-1]
    assert isinstance(closing, CloseSession) and closing.session == SC
    assert closing.status is Status.NO_SPACE
    ring = h.core.ring_of(b"c")
    assert ring.head() == (0, 0)  # rebuilt from the unbound blocks
    assert len(ring.available_blocks()) == 2 and h.core.entry(32).valid
    # Other sessions never noticed; the identity can come back.
    assert h.request(SA, inline_alloc(3, 2, b"a still works")).ok
    h.connect(9, b"c", DIRECT)
    assert h.request(9, inline_alloc(4, 33, b"again")).ok


def test_s6_7_a_corrupted_head_is_found_when_the_target_fetch_adds_it() -> None:
    """An initiator's atomic lands between the target's look at Head and its FetchAdd."""
    h = Harness()
    armed = False
    real = h.core.fetch_add

    def racing(mem: memoryview, offset: int, add: int, mask: int) -> int:
        nonlocal armed
        if armed and offset == h.core.layout.partitions[0].ring.head_offset:
            armed = False
            g = h.core.layout.partitions[0].ring
            write_counter(mem, offset, read_counter(mem, offset, g.byteorder) + 1, g.byteorder)
        return real(mem, offset, add, mask)

    for ring in h.core.rings.values():
        ring.fetch_add = racing
    h.connect(SC, b"c", Capability.DIRECT_ALLOC)
    armed = True
    h.send(SC, inline_alloc(1, 33, b"x"))
    assert h.last_status() is Status.NO_SPACE and h.closed[-1].status is Status.NO_SPACE
    assert h.core.ring_of(b"c").head() == (0, 0)


# ======================================================================================
# Request Credits (docs/kbtp.md §9.2)
# ======================================================================================


def test_s9_2_requests_arriving_together_beyond_the_credits_are_credit_exceeded() -> None:
    """Four credits; five requests in one receive batch: each of the first four completes
    at once, yet the fifth was sent before the initiator could see any of those answers."""
    h = _harness()
    h.core.receive_batch(SA)
    for rid in range(1, 5):
        assert h.request(SA, Free(rid, rid)).status == Status.NOT_VALID
    h.send(SA, Free(5, 6))
    last = h.completions[-1][1]
    assert Status(last.status) is Status.CREDIT_EXCEEDED
    assert (last.request_id, last.handle, last.request_opcode) == (5, 6, Free.opcode)
    assert h.closed[-1].session == SA and h.closed[-1].status is Status.CREDIT_EXCEEDED


def test_s9_2_a_new_receive_batch_returns_the_credits_of_the_answers_sent() -> None:
    h = _harness()
    for rid in range(1, 41):
        if rid % 4 == 1:
            h.core.receive_batch(SA)
        assert h.request(SA, Free(rid, 1)).status == Status.NOT_VALID
    assert not h.closed


def test_s9_2_a_request_refused_while_decoding_counts_too() -> None:
    h = _harness()
    h.core.receive_batch(SA)
    for rid in range(1, 5):
        h.request(SA, Free(rid, 1))
    bad = bytearray(Free(5, 2).encode())
    bad[22:24] = b"\x00\x01"  # Status != 0 in a request: MALFORMED, answered
    h.send(SA, bytes(bad))
    last = h.completions[-1][1]
    assert Status(last.status) is Status.CREDIT_EXCEEDED and last.handle == 2


# ======================================================================================
# HELLO deadline, idle timeout, a second session of a live identity (docs/kbtp.md §4.2)
# ======================================================================================


def test_s4_2_a_stream_without_hello_is_closed_at_the_hello_deadline() -> None:
    h = Harness(default_config(hello_timeout=5.0))
    h.core.open_session(SA, now=10.0)
    assert h.core.next_deadline(10.0) == 15.0
    assert h.core.tick(14.9) == []
    [closing] = h.core.tick(15.0)
    assert isinstance(closing, CloseSession) and closing.session == SA
    assert closing.status is Status.NO_SESSION and "no HELLO within 5 s" in closing.reason
    assert h.core.session_identity(SA) is None and h.core.next_deadline(15.0) is None


def test_s4_2_a_hello_in_time_stops_the_deadline() -> None:
    h = Harness(default_config(hello_timeout=5.0))
    h.now = 4.0
    h.connect(SA, b"a")
    assert h.tick(100.0) == [] and not h.closed


def test_s4_2_a_silent_session_is_closed_after_the_idle_timeout_and_frees_its_identity() -> None:
    h = Harness(default_config(idle_timeout=10.0))
    h.connect(SA, b"a")
    h.now = 3.0
    assert h.request(SA, inline_alloc(1, 1, b"kept")).ok
    # The identity has a live session: a second HELLO is refused (SESSION_EXISTS).
    h.core.open_session(9, h.now)
    [ack, close] = h.core.handle_message(9, _hello(b"a"), h.now)
    assert ack.message.status == Status.SESSION_EXISTS  # type: ignore[union-attr]
    assert isinstance(close, CloseSession) and close.session == 9
    assert h.tick(9.9) == []  # 12.9: active at 3.0
    h.tick(0.1)
    assert h.closed[-1].session == SA and h.closed[-1].status is Status.NO_SESSION
    assert "idle for 10 s" in h.closed[-1].reason
    h.connect(10, b"a")  # the identity is free again; its blocks are still its own
    h.buffer(0x55, 8)
    assert h.request(10, Load(2, 1, DataDescriptor(0x55, 0, 8))).ok


def test_s4_2_an_rdma_operation_the_initiator_never_answers_does_not_hold_the_session() -> None:
    h = Harness(default_config(idle_timeout=10.0))
    h.connect(SB, b"b")
    held = h.send(SB, AllocStore(1, 16, DataDescriptor(0x66, 0, 8)), auto=False)
    assert any(isinstance(a, ReadFromInitiator) for a in held)
    h.tick(10.0)
    assert h.closed[-1].session == SB and h.core.pending_ops() == 0
    assert h.core.usage(b"b") == 0
