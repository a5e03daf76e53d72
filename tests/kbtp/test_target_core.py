"""The sans-IO target: every step and MUST of draft §3 and §6, and docs/kbtp.md §6-§9.

Test names carry the draft section (s6_1 = §6.1) and step.  Every rejected request is
checked to change nothing: target memory (table, pool, rings), ring bookkeeping and usage
are compared before and after.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kbtp.constants import (
    EMPTY_BLOCK_OFFSET,
    GENERATION_MAX,
    TICKET_MASK,
    Capability,
    MessageOpcode,
    RequestFlag,
    Status,
    TableFlag,
    pack_counter,
)
from kbtp.layout import Slot, TableEntry, write_counter, write_entry, write_slot
from kbtp.messages import (
    AllocStore,
    Bind,
    CommonHeader,
    Completion,
    CompletionDescriptor,
    DataDescriptor,
    Free,
    Hello,
    Load,
    Message,
    Store,
    inline_descriptor,
)
from kbtp.target_actions import (
    CloseSession,
    DeregisterMemory,
    InvalidateStag,
    ReadFromInitiator,
    RegionKind,
    SendMessage,
    WriteToInitiator,
)
from kbtp.target_config import InitiatorConfig
from kbtp.target_core import TargetCore
from kbtp.target_state import SHARED_RING
from stack.errors import LocalError
from tests.kbtp.helpers import A, Harness, default_config

SA, SB, SC = 1, 2, 3  # sessions of initiators a, b, c
DIRECT = Capability.DIRECT_LOAD | Capability.DIRECT_ALLOC


@pytest.fixture
def h() -> Harness:
    harness = Harness()
    harness.connect(SA, b"a", DIRECT)
    harness.connect(SB, b"b", DIRECT)
    harness.connect(SC, b"c", DIRECT)
    return harness


def inline_alloc(
    rid: int, handle: int, data: bytes, flags: RequestFlag = RequestFlag.SEAL
) -> AllocStore:
    return AllocStore(rid, handle, inline_descriptor(data), data, flags=flags | RequestFlag.INLINE)


def inline_store(
    rid: int, handle: int, data: bytes, flags: RequestFlag = RequestFlag.NONE
) -> Store:
    return Store(rid, handle, inline_descriptor(data), data, flags=flags | RequestFlag.INLINE)


def rejected(h: Harness, session: int, message: object, status: Status) -> Completion:
    """Send ``message``; it must complete with ``status`` and change nothing.

    The target first looks at Head (a tick at the same time): learning of tickets that
    initiators took is not a change made by the request.
    """
    h.absorb(h.core.tick(h.now), auto=False)
    before = h.snapshot()
    comp = h.request(session, message)  # type: ignore[arg-type]
    assert Status(comp.status) is status, comp
    assert h.snapshot() == before
    assert not h.closed
    return comp


# ======================================================================================
# Session setup (docs/kbtp.md §4)
# ======================================================================================


def test_hello_ack_advertises_session_parameters(h: Harness) -> None:
    ack = h.acks[SC]
    lay = h.core.layout
    part = lay.partitions[0]
    assert ack.status == Status.SUCCESS and ack.request_id == 99
    assert ack.capabilities == DIRECT
    assert (ack.block_size, ack.pool_blocks, ack.quota) == (64, 8, 3)
    assert (ack.handle_base, ack.handle_count) == (32, 8)
    assert (ack.ticket_timeout_ms, ack.request_credits, ack.max_inline) == (1000, 4, 32)
    assert ack.ring_order == part.ring.order == 2
    assert ack.table_offset == lay.to(lay.table_offset) and ack.table_base_handle == 0
    assert ack.pool_offset == lay.to(lay.pool_offset)
    assert ack.ring_offset == lay.to(part.ring.slots_offset)
    assert ack.head_offset == lay.to(part.ring.head_offset)
    assert (ack.partition_offset, ack.partition_length) == (lay.block_to(0), 3 * 64)
    stags = {ack.table_stag, ack.pool_stag, ack.ring_stag, ack.head_stag, ack.partition_stag}
    assert len(stags) == 5


def test_s6_6_direct_modes_offered_only_to_trusted_initiators(h: Harness) -> None:
    assert h.acks[SB].capabilities == Capability.NONE
    assert h.acks[SB].table_stag == 0 and h.acks[SB].ring_stag == 0
    assert h.acks[SA].capabilities == Capability.DIRECT_LOAD
    assert h.acks[SA].partition_stag == 0


def test_s6_5_record_completion_is_never_granted_on_rdmap() -> None:
    h = Harness()
    ack = h.connect(SC, b"c", Capability.RECORD_COMPLETION | Capability.DIRECT_LOAD)
    assert ack.capabilities == Capability.DIRECT_LOAD


def test_s3_4_sum_of_quotas_must_not_exceed_pool() -> None:
    with pytest.raises(LocalError):
        TargetCore(default_config(pool_blocks=6))


def test_handle_ranges_must_not_overlap() -> None:
    with pytest.raises(LocalError):
        TargetCore(default_config(initiators=(A, InitiatorConfig(b"x", 4, 8, 1))))


def test_request_before_hello_closes_session() -> None:
    h = Harness()
    h.core.open_session(SA)
    actions = h.core.handle_message(SA, Free(5, 0).encode(), 0.0)
    assert isinstance(actions[0], SendMessage) and actions[0].message.status == Status.NO_SESSION
    assert isinstance(actions[1], CloseSession) and actions[1].status is Status.NO_SESSION


@pytest.mark.parametrize(
    ("identity", "status"),
    [(b"nobody", Status.UNKNOWN_INITIATOR), (b"a", Status.SESSION_EXISTS)],
)
def test_hello_refusals(identity: bytes, status: Status) -> None:
    h = Harness()
    h.connect(SA, b"a")
    h.core.open_session(7)
    actions = h.core.handle_message(7, Hello(1, identity=identity).encode(), 0.0)
    assert [type(a) for a in actions] == [SendMessage, CloseSession]
    assert actions[0].message.status == status  # type: ignore[union-attr]


def test_second_hello_is_bad_opcode_and_fatal(h: Harness) -> None:
    actions = h.core.handle_message(SA, Hello(2, identity=b"a").encode(), 0.0)
    assert actions[0].message.status == Status.BAD_OPCODE  # type: ignore[union-attr]
    assert isinstance(actions[1], CloseSession)
    assert h.core.session_identity(SA) is None


def test_s5_1_hello_with_bad_version_gets_hello_ack_and_close() -> None:
    h = Harness()
    h.core.open_session(SA)
    raw = b"\x02" + Hello(3, identity=b"a").encode()[1:]
    actions = h.core.handle_message(SA, raw, 0.0)
    assert actions[0].message.status == Status.BAD_VERSION  # type: ignore[union-attr]
    assert actions[0].message.request_id == 3  # type: ignore[union-attr]
    assert isinstance(actions[1], CloseSession)


def test_s5_1_request_with_bad_version_is_fatal(h: Harness) -> None:
    raw = b"\x02" + Free(8, 0).encode()[1:]
    h.send(SA, raw)
    assert h.completions[-1][1].status == Status.BAD_VERSION
    assert h.closed[-1].status is Status.BAD_VERSION


def test_completion_sent_to_target_is_bad_opcode_and_fatal(h: Harness) -> None:
    h.send(SA, Completion(4, 0x1234, request_opcode=MessageOpcode.LOAD))
    assert h.last_status() is Status.BAD_OPCODE and h.closed
    answer = h.completions[-1][1]
    # The answer echoes what was refused: its Request ID, Handle and Opcode (§5.8).
    assert (answer.request_id, answer.handle, answer.request_opcode) == (
        4,
        0x1234,
        MessageOpcode.COMPLETION,
    )


def test_malformed_request_is_answered_and_session_continues(h: Harness) -> None:
    before = h.snapshot()
    h.send(SA, Load(6, 0, DataDescriptor(1, 0, 8)).encode() + b"\x00")
    assert h.last_status() is Status.MALFORMED and h.completions[-1][1].request_id == 6
    assert not h.closed and h.snapshot() == before
    assert h.request(SA, inline_alloc(7, 0, b"x")).ok


def test_short_header_is_fatal(h: Harness) -> None:
    h.send(SA, b"\x01\x10\x00")
    assert h.last_status() is Status.MALFORMED and h.closed


def test_s5_1_bad_flags(h: Harness) -> None:
    raw = CommonHeader(MessageOpcode.FREE, RequestFlag.SEAL, 9, 0).encode()
    h.send(SA, raw)
    assert h.last_status() is Status.BAD_FLAGS and not h.closed


def test_credits_bound_requests_in_flight(h: Harness) -> None:
    """Request credits = receives the target posts; one more is CREDIT_EXCEEDED (fatal)."""
    for handle in range(2):
        h.request(SA, inline_alloc(handle, handle, b"abc"))
    h.buffer(0x55, 64)
    for rid in range(4):  # four LOADs whose RDMA Writes stay outstanding
        h.send(SA, Load(rid, rid % 2, DataDescriptor(0x55, 0, 64)), auto=False)
    assert len(h.pending) == 2  # same-handle LOADs queue behind each other
    h.send(SA, Load(9, 0, DataDescriptor(0x55, 0, 64)), auto=False)
    assert h.last_status() is Status.CREDIT_EXCEEDED
    assert h.closed[-1].status is Status.CREDIT_EXCEEDED


def test_credit_returns_with_each_completion(h: Harness) -> None:
    for rid in range(12):  # 3 x credits, one at a time
        assert h.request(SA, Free(rid, 0)).status == Status.NOT_VALID
    assert not h.closed


# ======================================================================================
# §6.1 Block Load
# ======================================================================================


def test_s6_1_step1_load_requires_valid(h: Harness) -> None:
    h.buffer(0x55, 64)
    rejected(h, SB, Load(1, 3, DataDescriptor(0x55, 0, 64)), Status.NOT_VALID)


def test_s6_1_step1_load_requires_sealed_unless_allow_unsealed(h: Harness) -> None:
    h.request(SA, inline_alloc(1, 0, b"unsealed", flags=RequestFlag.NONE))
    h.buffer(0x55, 64)
    rejected(h, SB, Load(2, 0, DataDescriptor(0x55, 0, 64)), Status.NOT_SEALED)
    comp = h.request(SB, Load(3, 0, DataDescriptor(0x55, 0, 64), flags=RequestFlag.ALLOW_UNSEALED))
    assert comp.ok and bytes(h.buffers[0x55][:8]) == b"unsealed"


def test_s6_1_step2_load_writes_data_length_octets_then_step3_completes(h: Harness) -> None:
    first = h.request(SA, inline_alloc(1, 2, b"hello kv"))
    h.buffer(0x55, 100)
    actions = h.send(SB, Load(2, 2, DataDescriptor(0x55, 10, 90)), auto=False)
    assert len(actions) == 1 and isinstance(actions[0], WriteToInitiator)
    w = actions[0]
    assert (w.local_to, w.length, w.remote_stag, w.remote_to) == (first.block_offset, 8, 0x55, 10)
    assert len(h.completions) == 1  # no COMPLETION before the Write completes
    h.finish(w.op_id)
    comp = h.completions[-1][1]
    assert comp.ok and comp.request_opcode == MessageOpcode.LOAD
    assert (comp.block_offset, comp.data_length, comp.generation) == (
        first.block_offset,
        8,
        first.generation,
    )
    assert bytes(h.buffers[0x55][10:18]) == b"hello kv"
    assert bytes(h.buffers[0x55][18:]) == bytes(82)  # only Data Length octets


def test_s6_1_step2_data_length_must_not_exceed_descriptor(h: Harness) -> None:
    h.request(SA, inline_alloc(1, 2, b"0123456789"))
    h.buffer(0x55, 64)
    rejected(h, SB, Load(2, 2, DataDescriptor(0x55, 0, 9)), Status.TOO_LONG_FOR_DESCRIPTOR)


def test_s6_1_load_of_empty_block_needs_no_write(h: Harness) -> None:
    h.request(SA, inline_alloc(1, 2, b""))
    actions = h.send(SB, Load(2, 2, DataDescriptor(0x55, 0, 0)), auto=False)
    assert [type(a) for a in actions] == [SendMessage] and h.completions[-1][1].ok


def test_s6_1_any_initiator_may_load_but_only_served_handles(h: Harness) -> None:
    h.buffer(0x55, 64)
    rejected(h, SB, Load(1, 40, DataDescriptor(0x55, 0, 64)), Status.HANDLE_OUT_OF_RANGE)
    rejected(h, SB, Load(1, 1 << 40, DataDescriptor(0x55, 0, 64)), Status.HANDLE_OUT_OF_RANGE)


def test_s5_1_generation_zero_means_any_otherwise_must_match(h: Harness) -> None:
    gen = h.request(SA, inline_alloc(1, 2, b"abc")).generation
    h.buffer(0x55, 64)
    rejected(
        h, SB, Load(2, 2, DataDescriptor(0x55, 0, 64), generation=gen + 1), Status.WRONG_GENERATION
    )
    assert h.request(SB, Load(3, 2, DataDescriptor(0x55, 0, 64), generation=gen)).ok
    assert h.request(SB, Load(4, 2, DataDescriptor(0x55, 0, 64), generation=0)).ok


def test_s6_5_invalidate_completes_with_send_with_invalidate(h: Harness) -> None:
    h.request(SA, inline_alloc(1, 2, b"abc"))
    h.buffer(0x77, 64)
    h.request(SB, Load(2, 2, DataDescriptor(0x77, 0, 64), flags=RequestFlag.INVALIDATE))
    assert h.completions[-1][2] == 0x77
    h.request(SB, Load(3, 2, DataDescriptor(0x77, 0, 64)))
    assert h.completions[-1][2] is None


def test_s6_5_record_is_not_offered_on_rdmap(h: Harness) -> None:
    rejected(
        h,
        SA,
        Free(1, 0, flags=RequestFlag.RECORD, completion=CompletionDescriptor(1, 0)),
        Status.NOT_OFFERED,
    )


# ======================================================================================
# §6.2 Block Mapped Store
# ======================================================================================


def test_s6_2_step1_store_requires_valid(h: Harness) -> None:
    rejected(h, SA, inline_store(1, 1, b"x"), Status.NOT_VALID)


def test_s6_2_step1_store_refuses_sealed(h: Harness) -> None:
    h.request(SA, inline_alloc(1, 1, b"x", RequestFlag.SEAL))
    rejected(h, SA, inline_store(2, 1, b"y"), Status.SEALED)


def test_s6_2_step1_store_requires_own_handle_range(h: Harness) -> None:
    h.request(SA, inline_alloc(1, 1, b"x", RequestFlag.NONE))
    rejected(h, SB, inline_store(2, 1, b"y"), Status.HANDLE_OUT_OF_RANGE)


def test_s6_2_step2_inline_then_step3_length_and_seal(h: Harness) -> None:
    alloc = h.request(SA, inline_alloc(1, 1, b"first version", RequestFlag.NONE))
    comp = h.request(SA, inline_store(2, 1, b"second", RequestFlag.SEAL))
    assert (
        comp.ok and comp.block_offset == alloc.block_offset and comp.generation == alloc.generation
    )
    entry = h.core.entry(1)
    assert entry == TableEntry(
        TableFlag.VALID | TableFlag.SEALED, alloc.generation, 6, alloc.block_offset
    )
    assert h.core.block_bytes(entry.block_offset, 6) == b"second"


def test_s6_2_step2_rdma_read_before_step3_table_update(h: Harness) -> None:
    alloc = h.request(SA, inline_alloc(1, 1, b"old", RequestFlag.NONE))
    h.buffer(0x66, b"....new data")
    actions = h.send(SA, Store(2, 1, DataDescriptor(0x66, 4, 8)), auto=False)
    assert len(actions) == 1 and isinstance(actions[0], ReadFromInitiator)
    r = actions[0]
    assert (r.remote_stag, r.remote_to, r.length, r.local_to) == (0x66, 4, 8, alloc.block_offset)
    assert h.core.entry(1).data_length == 3  # not before the Read completed
    h.finish(r.op_id)
    assert h.core.entry(1).data_length == 8 and h.completions[-1][1].ok
    assert h.core.block_bytes(alloc.block_offset, 8) == b"new data"


def test_s6_2_data_longer_than_block_or_inline_limit(h: Harness) -> None:
    h.request(SA, inline_alloc(1, 1, b"x", RequestFlag.NONE))
    rejected(h, SA, Store(2, 1, DataDescriptor(0x66, 0, 65)), Status.TOO_LONG_FOR_BLOCK)
    rejected(h, SA, inline_store(3, 1, b"y" * 33), Status.INLINE_TOO_LONG)


# ======================================================================================
# §6.3 Block Unmapped Store
# ======================================================================================


def test_s6_3_step1_handle_must_be_in_range(h: Harness) -> None:
    rejected(h, SA, inline_alloc(1, 16, b"x"), Status.HANDLE_OUT_OF_RANGE)
    rejected(h, SA, inline_alloc(1, 8, b"x"), Status.HANDLE_OUT_OF_RANGE)


def test_s6_3_step1_entry_must_not_be_valid(h: Harness) -> None:
    h.request(SA, inline_alloc(1, 1, b"x"))
    rejected(h, SA, inline_alloc(2, 1, b"y"), Status.ALREADY_VALID)


def test_s6_3_step2_allocates_from_ring_and_marks_slot_consumed(h: Harness) -> None:
    ring = h.core.ring_of(b"a")
    first = ring.slot(0)
    comp = h.request(SA, inline_alloc(1, 1, b"x"))
    assert comp.block_offset == first.block_offset
    assert ring.slot(0) == Slot(0, EMPTY_BLOCK_OFFSET) and ring.head() == (1, 16)


def test_s6_3_step3_data_before_step4_entry(h: Harness) -> None:
    h.buffer(0x66, b"remote kv block")
    actions = h.send(SB, AllocStore(1, 17, DataDescriptor(0x66, 0, 15)), auto=False)
    r = actions[0]
    assert isinstance(r, ReadFromInitiator) and r.length == 15
    assert not h.core.entry(17).valid  # the entry waits for the data
    assert h.core.held_blocks() == [r.local_to]
    h.finish(r.op_id)
    entry = h.core.entry(17)
    assert entry.valid and not entry.sealed and entry.block_offset == r.local_to
    assert h.core.block_bytes(r.local_to, 15) == b"remote kv block"


def test_s6_3_step4_next_generation_skips_zero(h: Harness) -> None:
    write_entry(h.core.memory, h.core.layout.entry_offset(1), TableEntry(generation=GENERATION_MAX))
    comp = h.request(SA, inline_alloc(1, 1, b"x"))
    assert comp.generation == 1 and h.core.entry(1).generation == 1


def test_s6_3_step5_completion_names_block_and_generation(h: Harness) -> None:
    comp = h.request(SA, inline_alloc(1, 1, b"x", RequestFlag.SEAL))
    entry = h.core.entry(1)
    assert entry.flags == TableFlag.VALID | TableFlag.SEALED
    assert (comp.block_offset, comp.generation, comp.data_length) == (
        entry.block_offset,
        entry.generation,
        1,
    )


def test_s6_3_data_longer_than_block(h: Harness) -> None:
    rejected(h, SB, AllocStore(1, 17, DataDescriptor(0x66, 0, 65)), Status.TOO_LONG_FOR_BLOCK)


def test_s3_4_quota_exceeded_is_no_space(h: Harness) -> None:
    h.request(SA, inline_alloc(1, 0, b"x"))
    h.request(SA, inline_alloc(2, 1, b"y"))
    rejected(h, SA, inline_alloc(3, 2, b"z"), Status.NO_SPACE)
    assert h.core.usage(b"a") == 2


def test_s3_4_allocations_in_progress_count_against_quota(h: Harness) -> None:
    h.buffer(0x66, 64)
    h.send(SB, AllocStore(1, 16, DataDescriptor(0x66, 0, 8)), auto=False)
    h.send(SB, AllocStore(2, 17, DataDescriptor(0x66, 0, 8)), auto=False)
    assert h.core.usage(b"b") == 2
    h.send(SB, AllocStore(3, 18, DataDescriptor(0x66, 0, 8)), auto=False)
    assert h.last_status() is Status.NO_SPACE
    h.finish_all()
    assert h.core.usage(b"b") == 2 and h.core.entry(16).valid and h.core.entry(17).valid


# ======================================================================================
# §6.4 Block Free
# ======================================================================================


def test_s6_4_step1_must_be_in_range_and_valid(h: Harness) -> None:
    h.request(SA, inline_alloc(1, 1, b"x"))
    rejected(h, SB, Free(2, 1), Status.HANDLE_OUT_OF_RANGE)
    rejected(h, SA, Free(3, 2), Status.NOT_VALID)


def test_s6_4_step2_clears_flags_bumps_generation_step3_returns_block(h: Harness) -> None:
    alloc = h.request(SA, inline_alloc(1, 1, b"x"))
    ring = h.core.ring_of(b"a")
    tail_ticket, _ = ring.tail()
    comp = h.request(SA, Free(2, 1))
    assert comp.ok and comp.generation == alloc.generation + 1
    entry = h.core.entry(1)
    assert not entry.valid and not entry.sealed and entry.generation == alloc.generation + 1
    assert ring.slot(tail_ticket) == Slot(tail_ticket, alloc.block_offset)
    assert ring.tail()[0] == tail_ticket + 1


def test_s3_4_free_releases_quota(h: Harness) -> None:
    h.request(SA, inline_alloc(1, 0, b"x"))
    h.request(SA, inline_alloc(2, 1, b"y"))
    h.request(SA, Free(3, 0))
    assert h.core.usage(b"a") == 1
    assert h.request(SA, inline_alloc(4, 2, b"z")).ok


def test_s6_4_block_cleared_before_it_can_reach_another_trust_domain(h: Harness) -> None:
    alloc = h.request(SA, inline_alloc(1, 1, b"secret of red"))
    h.request(SA, Free(2, 1))
    assert h.core.block_bytes(alloc.block_offset) == bytes(64)


def test_s6_4_block_kept_when_ring_serves_one_trust_domain() -> None:
    one_domain = (InitiatorConfig(b"a", 0, 8, 2, "red"), InitiatorConfig(b"b", 16, 8, 2, "red"))
    h = Harness(default_config(initiators=one_domain, pool_blocks=4))
    h.connect(SA, b"a")
    alloc = h.request(SA, inline_alloc(1, 1, b"kept"))
    h.request(SA, Free(2, 1))
    assert h.core.block_bytes(alloc.block_offset, 4) == b"kept"


def test_s6_4_partition_block_returns_to_its_own_ring(h: Harness) -> None:
    alloc = h.request(SC, inline_alloc(1, 33, b"x"))
    part = h.core.ring_of(b"c")
    lay = h.core.layout
    assert lay.block_index(alloc.block_offset) < lay.partitions[0].blocks  # type: ignore[operator]
    shared_before = h.core.rings[SHARED_RING].tail()
    h.request(SC, Free(2, 33))
    assert h.core.rings[SHARED_RING].tail() == shared_before
    assert alloc.block_offset in part.available_blocks()


# ======================================================================================
# Per-handle ordering and pipelining (docs/kbtp.md §6.0)
# ======================================================================================


def test_requests_on_one_handle_run_in_arrival_order(h: Harness) -> None:
    h.request(SA, inline_alloc(1, 1, b"old!", RequestFlag.NONE))
    h.buffer(0x66, b"new!")
    h.buffer(0x55, 4)
    store = h.send(SA, Store(2, 1, DataDescriptor(0x66, 0, 4)), auto=False)
    load = h.send(
        SB, Load(3, 1, DataDescriptor(0x55, 0, 4), flags=RequestFlag.ALLOW_UNSEALED), auto=False
    )
    assert load == []  # queued behind the STORE
    h.finish(store[0].op_id)  # type: ignore[union-attr]
    h.finish_all()
    assert [c.request_id for _, c, _ in h.completions[-2:]] == [2, 3]
    assert bytes(h.buffers[0x55]) == b"new!"


def test_s8_1_a_hold_queued_behind_a_core_operation_keeps_later_requests_waiting(
    h: Harness,
) -> None:
    """The binding holds a handle whose offloaded STORE is mid-Read (docs/kbtp.md §8.1)
    while one of the core's own operations has it: an ALLOW_UNSEALED LOAD after the hold
    waits for the core's operation and then for the hold's release, not for the first
    alone (§6.0)."""
    h.request(SA, inline_alloc(1, 1, b"old!", RequestFlag.NONE))
    h.buffer(0x66, b"new!")
    h.buffer(0x55, 4)
    store = h.send(SA, Store(2, 1, DataDescriptor(0x66, 0, 4)), auto=False)  # the core's op
    assert h.core.hold_handle(1)  # queued behind the STORE
    assert not h.core.hold_handle(1)  # one hold at a time: later requests wait behind it
    load = Load(3, 1, DataDescriptor(0x55, 0, 4), flags=RequestFlag.ALLOW_UNSEALED)
    assert h.send(SB, load, auto=False) == []
    h.finish(store[0].op_id)  # type: ignore[union-attr]
    h.finish_all()
    assert [c.request_id for _, c, _ in h.completions[-1:]] == [2]  # the LOAD still waits
    h.absorb(h.core.release_handle(1, h.now))
    assert [c.request_id for _, c, _ in h.completions[-2:]] == [2, 3]
    assert bytes(h.buffers[0x55]) == b"new!"


def test_s8_1_a_hold_released_before_its_turn_leaves_the_queue(h: Harness) -> None:
    """The STORE the hold waited for was over before the core's operation ended: the
    hold is dropped from the queue and the LOAD runs when the operation ends."""
    h.request(SA, inline_alloc(1, 1, b"old!", RequestFlag.NONE))
    h.buffer(0x66, b"new!")
    h.buffer(0x55, 4)
    store = h.send(SA, Store(2, 1, DataDescriptor(0x66, 0, 4)), auto=False)
    assert h.core.hold_handle(1)
    load = Load(3, 1, DataDescriptor(0x55, 0, 4), flags=RequestFlag.ALLOW_UNSEALED)
    assert h.send(SB, load, auto=False) == []
    assert h.core.release_handle(1, h.now) == []  # nothing runs yet: the STORE has it
    h.finish(store[0].op_id)  # type: ignore[union-attr]
    h.finish_all()
    assert [c.request_id for _, c, _ in h.completions[-2:]] == [2, 3]


def test_requests_on_different_handles_pipeline(h: Harness) -> None:
    h.request(SA, inline_alloc(1, 0, b"zero"))
    h.request(SA, inline_alloc(2, 1, b"one!"))
    h.buffer(0x55, 8)
    first = h.send(SB, Load(3, 0, DataDescriptor(0x55, 0, 4)), auto=False)
    second = h.send(SB, Load(4, 1, DataDescriptor(0x55, 4, 4)), auto=False)
    assert isinstance(first[0], WriteToInitiator) and isinstance(second[0], WriteToInitiator)
    h.finish(second[0].op_id)
    h.finish(first[0].op_id)
    assert [c.request_id for _, c, _ in h.completions[-2:]] == [4, 3]
    assert bytes(h.buffers[0x55]) == b"zeroone!"


def test_rdma_failure_closes_session_and_returns_the_block(h: Harness) -> None:
    free_before = sorted(h.core.rings[SHARED_RING].available_blocks())
    actions = h.send(SB, AllocStore(1, 16, DataDescriptor(0x66, 0, 8)), auto=False)
    out = h.core.rdma_failed(actions[0].op_id, 0.0)  # type: ignore[union-attr]
    assert [type(a) for a in out] == [CloseSession]
    assert out[0].status is Status.REMOTE_ACCESS_ERROR  # type: ignore[union-attr]
    assert sorted(h.core.rings[SHARED_RING].available_blocks()) == free_before
    assert h.core.usage(b"b") == 0 and not h.core.entry(16).valid


def test_close_session_releases_handles_for_others(h: Harness) -> None:
    h.request(SA, inline_alloc(1, 1, b"abcd"))
    h.buffer(0x55, 4)
    pending = h.send(SB, Load(2, 1, DataDescriptor(0x55, 0, 4)), auto=False)
    queued = h.send(SC, Load(3, 1, DataDescriptor(0x55, 0, 4)), auto=False)
    assert isinstance(pending[0], WriteToInitiator) and queued == []
    out = h.core.close_session(SB, 0.0)
    assert len(out) == 1 and isinstance(out[0], WriteToInitiator) and out[0].session == SC
    assert h.core.rdma_completed(pending[0].op_id, 0.0) == []  # a late report is ignored


# ======================================================================================
# §6.6 direct modes and §3.4 Ticket Timeout
# ======================================================================================


def test_s6_6_direct_load_reads_entry_block_entry(h: Harness) -> None:
    h.request(SA, inline_alloc(1, 5, b"direct"))
    first = h.direct_load_entry(SA, 5)
    assert first.valid and first.sealed
    ack = h.acks[SA]
    data = h.rdma_read(ack.pool_stag, RegionKind.POOL, first.block_offset, first.data_length)
    second = h.direct_load_entry(SA, 5)
    assert data == b"direct" and second == first


def test_s6_6_direct_load_detects_free_by_generation(h: Harness) -> None:
    h.request(SA, inline_alloc(1, 5, b"direct"))
    first = h.direct_load_entry(SA, 5)
    h.request(SA, Free(2, 5))
    h.request(SA, inline_alloc(3, 5, b"other!"))
    second = h.direct_load_entry(SA, 5)
    assert second.valid and second.generation != first.generation


def direct_alloc(h: Harness, data: bytes) -> tuple[int, int]:
    """FetchAdd, read the slot until it holds the ticket, confirm, RDMA Write the data."""
    ticket, slot_offset = h.direct_fetch_add(SC)
    slot = h.direct_read_slot(SC, slot_offset)
    assert slot.holds(ticket)
    assert h.direct_read_slot(SC, slot_offset) == slot  # the confirming second read
    h.direct_write(SC, slot.block_offset, data)
    return ticket, slot.block_offset


def test_s6_6_direct_alloc_then_bind(h: Harness) -> None:
    ticket, block = direct_alloc(h, b"direct data")
    assert h.core.usage(b"c") == 0  # the target has not looked at Head yet
    comp = h.request(SC, Bind(1, 34, ticket, 11, block, flags=RequestFlag.SEAL))
    assert comp.ok and comp.block_offset == block
    assert h.core.entry(34) == TableEntry(TableFlag.VALID | TableFlag.SEALED, 2, 11, block)
    assert h.core.ring_of(b"c").slot(ticket).consumed
    assert h.core.usage(b"c") == 1


def test_s6_6_bind_requires_direct_alloc(h: Harness) -> None:
    rejected(h, SA, Bind(1, 1, 0, 1, 0), Status.NOT_OFFERED)


@pytest.mark.parametrize("case", ["unknown ticket", "wrong block", "target ticket", "bound twice"])
def test_s6_6_bind_verifies_ticket_and_slot(h: Harness, case: str) -> None:
    ticket, block = direct_alloc(h, b"abc")
    if case == "unknown ticket":
        bind = Bind(1, 34, ticket + 1, 3, block)
    elif case == "wrong block":
        bind = Bind(1, 34, ticket, 3, block + 64)
    elif case == "target ticket":
        target = h.request(SC, inline_alloc(1, 33, b"t"))
        bind = Bind(2, 34, ticket + 1, 3, target.block_offset)
    else:
        h.request(SC, Bind(1, 34, ticket, 3, block))
        bind = Bind(2, 35, ticket, 3, block)
    rejected(h, SC, bind, Status.BAD_BIND)


def test_s6_6_bind_refusals_keep_the_ticket(h: Harness) -> None:
    ticket, block = direct_alloc(h, b"abc")
    h.request(SC, inline_alloc(1, 34, b"x"))
    rejected(h, SC, Bind(2, 34, ticket, 3, block), Status.ALREADY_VALID)
    rejected(h, SC, Bind(3, 35, ticket, 65, block), Status.TOO_LONG_FOR_BLOCK)
    rejected(h, SC, Bind(4, 8, ticket, 3, block), Status.HANDLE_OUT_OF_RANGE)
    assert h.request(SC, Bind(5, 35, ticket, 3, block)).ok


def test_s3_4_ticket_timeout_invalidates_partition_then_reclaims(h: Harness) -> None:
    ticket, block = direct_alloc(h, b"too late")
    ack = h.acks[SC]
    assert h.tick(0.5) == []  # observed now; not yet expired
    actions = h.tick(1.1)
    assert {a.stag for a in actions if isinstance(a, InvalidateStag)} == {
        ack.partition_stag,
        ack.head_stag,
        ack.ring_stag,
    }
    ring = h.core.ring_of(b"c")
    assert ring.slot(ticket) == Slot(ticket, block)  # not reclaimed before invalidation
    assert not h.core.direct_alloc_enabled(SC)
    h.finish_all((InvalidateStag,))
    assert ring.slot(ticket).consumed  # reclaimed ...
    assert block in ring.available_blocks()  # ... and back in the ring with a new ticket
    assert h.core.usage(b"c") == 0
    rejected(h, SC, Bind(1, 34, ticket, 8, block), Status.TICKET_ABANDONED)
    assert h.request(SC, inline_alloc(2, 34, b"target-executed still works")).ok


def test_s3_4_bind_within_timeout_is_honoured(h: Harness) -> None:
    ticket, block = direct_alloc(h, b"in time")
    h.tick(0.6)
    assert h.tick(0.6) == []  # seen at 0.6, now 1.2: 0.6 < 1.0
    assert h.request(SC, Bind(1, 34, ticket, 7, block)).ok
    assert h.core.next_deadline(h.now) == pytest.approx(h.now + 0.5)


def _two_block_partition(start: int = 0) -> Harness:
    """Initiator c with quota 2 on a ring of N = 2 whose tickets start at ``start``."""
    c2 = InitiatorConfig(b"c", 32, 8, 2, "green", direct_alloc=True)
    h = Harness(default_config(initiators=(A, c2), pool_blocks=4))
    ring = h.core.ring_of(b"c")
    if start:
        g = ring.geometry
        blocks = [ring.slot(0).block_offset, ring.slot(1).block_offset]
        for i, block in enumerate(blocks):
            write_slot(ring.mem, g.slots_offset + g.slot_offset(start + i), start + i, block)
        write_counter(ring.mem, g.head_offset, pack_counter(start, g.slot_offset(start)))
        end = (start + 2) & TICKET_MASK
        write_counter(ring.mem, g.tail_offset, pack_counter(end, g.slot_offset(end)))
        ring.observed_head = start
    h.connect(SC, b"c", Capability.DIRECT_ALLOC)
    return h


def _defer_behind_direct_ticket(h: Harness) -> tuple[int, int, int]:
    """Bound-and-free twice while direct ticket t1 is unread: the second free defers on
    t1's slot; a second direct ticket t3 then waits for that deferred write."""
    h.request(SC, inline_alloc(1, 32, b"p0"))
    t1, _ = h.direct_fetch_add(SC)
    h.request(SC, Free(2, 32))
    p0 = h.request(SC, inline_alloc(3, 33, b"p0 again")).block_offset
    h.request(SC, Free(4, 33))
    t3, _ = h.direct_fetch_add(SC)
    ring = h.core.ring_of(b"c")
    assert list(ring.deferred.values()) == [[(t3, p0)]] and ring.ready_block(t3) is None
    return t1, t3, p0


@pytest.mark.parametrize("start", [0, TICKET_MASK - 1], ids=["tickets from 0", "wrapping"])
def test_s3_4_abandoned_tickets_behind_a_deferred_free_are_all_reclaimed(start: int) -> None:
    h = _two_block_partition(start)
    t1, t3, _ = _defer_behind_direct_ticket(h)
    h.tick(0.0)
    assert h.core.usage(b"c") == 2  # both direct tickets seen at time 0
    h.tick(1.5)  # both expire together; when wrapping, t3 (= 1) sorts before t1
    h.finish_all((InvalidateStag,))
    ring = h.core.ring_of(b"c")
    assert h.core.usage(b"c") == 0 and ring.deferred == {}
    assert len(ring.available_blocks()) == 2 and ring.outstanding == {}
    assert {t1, t3} <= ring.abandoned
    rejected(h, SC, Bind(9, 34, t3, 1, 0), Status.TICKET_ABANDONED)


def test_s3_4_tickets_expiring_after_invalidation_are_reclaimed_at_once() -> None:
    h = _two_block_partition()
    t1, t3, _ = _defer_behind_direct_ticket(h)
    h.tick(0.5)  # t1 was seen at 0 (by an ALLOC_STORE), t3 is seen now
    actions = h.tick(0.6)  # t1 expires, t3 does not
    assert sum(isinstance(a, InvalidateStag) for a in actions) == 3
    h.finish_all((InvalidateStag,))
    ring = h.core.ring_of(b"c")
    assert t1 in ring.abandoned and t3 not in ring.abandoned
    assert ring.ready_block(t3) is not None and h.core.usage(b"c") == 1
    assert h.tick(0.5) == []  # t3 expires: no second invalidation, reclaimed right away
    assert t3 in ring.abandoned and h.core.usage(b"c") == 0
    assert len(ring.available_blocks()) == 2


def test_close_session_while_an_allocation_waits() -> None:
    h = _two_block_partition()
    h.request(SC, inline_alloc(1, 32, b"p0"))  # ticket 0
    h.direct_fetch_add(SC)  # ticket 1, never read
    h.request(SC, Free(2, 32))
    h.request(SC, inline_alloc(3, 33, b"p0 again"))  # ticket 2
    h.request(SC, Free(4, 33))  # ticket 3's write defers behind ticket 1
    h.send(SC, inline_alloc(5, 34, b"waits"))  # ticket 3: waits
    assert h.core.pending_ops() == 1 and h.completions[-1][1].request_id == 4
    closing = h.core.close_session(SC, 0.0)
    # Nothing for other sessions; the session's Ring and Partition regions go.
    assert [a for a in closing if not isinstance(a, DeregisterMemory)] == []
    ack = h.acks[SC]
    stags = {a.stag for a in closing if isinstance(a, DeregisterMemory)}
    assert stags == {ack.ring_stag, ack.head_stag, ack.partition_stag}
    ring = h.core.ring_of(b"c")
    assert len(ring.available_blocks()) == 2 and ring.deferred == {} and ring.outstanding == {}
    assert h.core.usage(b"c") == 0 and h.core.pending_ops() == 0
    assert not h.core.entry(34).valid


def test_s3_4_alloc_store_after_direct_over_quota_closes_session(h: Harness) -> None:
    for _ in range(4):
        h.direct_fetch_add(SC)
    h.send(SC, inline_alloc(1, 33, b"x"))
    assert h.last_status() is Status.NO_SPACE and h.closed[-1].status is Status.NO_SPACE


def test_s3_4_bind_after_direct_over_quota_closes_session(h: Harness) -> None:
    ticket, block = direct_alloc(h, b"x")
    for _ in range(3):
        h.direct_fetch_add(SC)
    h.send(SC, Bind(1, 33, ticket, 1, block))
    assert h.last_status() is Status.NO_SPACE and h.closed[-1].status is Status.NO_SPACE


def test_s6_6_bind_before_slot_is_filled_is_bad_bind() -> None:
    h = _two_block_partition()
    _, t3, p0 = _defer_behind_direct_ticket(h)
    rejected(h, SC, Bind(9, 34, t3, 1, p0), Status.BAD_BIND)


def test_s3_4_direct_allocations_over_quota_close_the_session(h: Harness) -> None:
    h.request(SC, inline_alloc(1, 32, b"bound"))
    for _ in range(3):  # quota 3, one bound: two tickets would be the limit
        h.direct_fetch_add(SC)
    actions = h.tick(0.1)
    assert [type(a) for a in actions] == [CloseSession]
    assert actions[0].status is Status.NO_SPACE  # type: ignore[union-attr]
    ring = h.core.ring_of(b"c")
    assert ring.head() == (0, 0) and len(ring.available_blocks()) == 2  # rebuilt
    assert h.core.entry(32).valid  # bound blocks survive the session
    h.connect(9, b"c", DIRECT)
    assert h.request(9, inline_alloc(2, 33, b"again")).ok


def test_s3_4_alloc_store_over_quota_by_racing_direct_fetchadd() -> None:
    """An initiator's FetchAdd lands between the target's look at Head and its own FetchAdd."""
    h = Harness()
    armed = False
    real = h.core.fetch_add

    def racing(mem: memoryview, offset: int, add: int, mask: int) -> int:
        nonlocal armed
        if armed and offset == h.core.layout.partitions[0].ring.head_offset:
            armed = False
            real(mem, offset, add, mask)  # the initiator's FetchAdd wins the race
        return real(mem, offset, add, mask)

    for ring in h.core.rings.values():
        ring.fetch_add = racing
    h.connect(SC, b"c", DIRECT)
    h.direct_fetch_add(SC)
    h.direct_fetch_add(SC)
    h.tick(0.1)  # observed: usage 2 of 3, so one more allocation is allowed
    armed = True
    h.send(SC, inline_alloc(1, 33, b"x"))
    assert h.last_status() is Status.NO_SPACE
    assert h.closed[-1].status is Status.NO_SPACE


def test_s3_3_allocation_waits_for_deferred_free_then_resumes() -> None:
    """N = F = 2: a FREE defers behind an unbound direct ticket; ALLOC_STORE waits for it."""
    c2 = InitiatorConfig(b"c", 32, 8, 2, "green", direct_alloc=True)
    h = Harness(default_config(initiators=(A, c2), pool_blocks=4))
    h.connect(SC, b"c", Capability.DIRECT_ALLOC)
    p0 = h.request(SC, inline_alloc(1, 32, b"p0")).block_offset  # ticket 0
    ticket, slot_offset = h.direct_fetch_add(SC)  # ticket 1, slot 1 (not read yet)
    assert ticket == 1
    h.request(SC, Free(2, 32))  # tail ticket 2 -> slot 0 (consumed): written
    assert h.request(SC, inline_alloc(3, 33, b"p0 again")).block_offset == p0  # ticket 2
    h.request(SC, Free(4, 33))  # tail ticket 3 -> slot 1: unconsumed -> deferred
    ring = h.core.ring_of(b"c")
    assert ring.deferred == {1: [(3, p0)]}
    h.send(SC, inline_alloc(5, 34, b"waits"))  # ticket 3: slot 1 still holds ticket 1
    assert h.completions[-1][1].request_id == 4 and h.core.pending_ops() == 1
    slot = h.direct_read_slot(SC, slot_offset)
    h.direct_write(SC, slot.block_offset, b"direct")
    h.send(SC, Bind(6, 35, ticket, 6, slot.block_offset))
    done = {c.request_id: c for _, c, _ in h.completions[-2:]}
    assert done[6].ok and done[5].ok and done[5].block_offset == p0
    assert ring.deferred == {} and h.core.pending_ops() == 0
    assert h.core.block_bytes(p0, 5) == b"waits"


def test_next_deadline_without_direct_sessions_is_none() -> None:
    h = Harness()
    h.connect(SA, b"a")
    assert h.core.next_deadline(0.0) is None


# ======================================================================================
# Fuzz: arbitrary and mutated requests never raise and never break the pool
# ======================================================================================

_SEEDS: list[Message] = [
    inline_alloc(1, 1, b"abc"),
    inline_alloc(2, 33, b"direct partition"),
    AllocStore(3, 17, DataDescriptor(0x66, 0, 8)),
    Store(4, 1, DataDescriptor(0x66, 0, 8)),
    inline_store(5, 1, b"xy"),
    Load(6, 1, DataDescriptor(0x55, 0, 64), flags=RequestFlag.ALLOW_UNSEALED),
    Free(7, 1),
    Free(8, 33),
    Bind(9, 34, 0, 4, 0),
]


def _check_pool(h: Harness) -> None:
    core = h.core
    lay = core.layout
    bound = [
        core.entry(x).block_offset
        for x in range(lay.table_base_handle, lay.table_base_handle + lay.table_entries)
        if core.entry(x).valid
    ]
    free = [b for ring in core.rings.values() for b in ring.available_blocks()]
    everything = sorted(bound + free + core.held_blocks())
    assert everything == [lay.block_to(i) for i in range(lay.pool_blocks)]
    for ident in (b"a", b"b", b"c"):
        assert core.usage(ident) <= {b"a": 2, b"b": 2, b"c": 3}[ident]


@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from([SA, SB, SC]),
            st.sampled_from(range(len(_SEEDS))),
            st.lists(st.tuples(st.integers(0, 60), st.integers(0, 255)), max_size=3),
            st.booleans(),
        ),
        max_size=25,
    )
)
def test_fuzz_requests_never_raise_and_keep_every_block(
    steps: list[tuple[int, int, list[tuple[int, int]], bool]],
) -> None:
    h = Harness()
    for session, identity in ((SA, b"a"), (SB, b"b"), (SC, b"c")):
        h.connect(session, identity, DIRECT)
    h.buffer(0x55, 64)
    h.buffer(0x66, b"12345678")
    for session, seed, flips, finish in steps:
        raw = bytearray(_SEEDS[seed].encode())
        for at, value in flips:
            if at < len(raw):
                raw[at] = value
        h.send(session, bytes(raw), auto=False)
        if finish:
            for op_id, act in list(h.pending.items()):
                ok = not isinstance(act, WriteToInitiator | ReadFromInitiator) or (
                    act.remote_stag in h.buffers
                    and act.remote_to + act.length <= len(h.buffers[act.remote_stag])
                )
                if ok:
                    h.finish(op_id)
                else:  # what the RNIC reports for a bad STag or bounds
                    h.pending.pop(op_id)
                    h.absorb(h.core.rdma_failed(op_id, h.now), auto=False)
        _check_pool(h)
