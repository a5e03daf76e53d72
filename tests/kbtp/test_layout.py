"""Table entries, ring slots, counters and the memory map (draft §3.1-§3.3, docs/kbtp.md §3)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import kbtp.layout as layout
from kbtp.constants import (
    EMPTY_BLOCK_OFFSET,
    RING_ADD_DATA,
    TICKET_MASK,
    TableFlag,
    next_generation,
    pack_counter,
    ring_add_mask,
    ring_order_for,
    unpack_counter,
)
from kbtp.layout import (
    RingGeometry,
    Slot,
    TableEntry,
    consume_slot,
    init_ring,
    plan_layout,
    read_counter,
    read_entry,
    read_slot,
    write_entry,
    write_slot,
)
from stack.errors import LocalError
from stack.wire.atomics import fetch_add

# --------------------------------------------------------------------------------------
# §3.2 table entries
# --------------------------------------------------------------------------------------


def test_s3_2_entry_is_16_octets_big_endian() -> None:
    entry = TableEntry(
        TableFlag.VALID | TableFlag.SEALED, 0x1234, 0x00010000, 0x0000_0001_0000_2000
    )
    assert entry.pack().hex() == "00031234000100000000000100002000"
    assert TableEntry.unpack(entry.pack()) == entry
    assert entry.valid and entry.sealed


def test_s3_2_entry_address_is_table_offset_plus_16_per_handle() -> None:
    lay = plan_layout(
        block_size=64, pool_blocks=2, partition_sizes=[], table_entries=10, table_base_handle=100
    )
    assert lay.entry_offset(100) == lay.table_offset
    assert lay.entry_offset(107) == lay.table_offset + 16 * 7
    assert lay.serves(109) and not lay.serves(110) and not lay.serves(99)


class _Recorder:
    """Stands in for a struct.Struct and logs which part of a structure is written when."""

    def __init__(self, name: str, real: object, log: list[str]) -> None:
        self.name, self.real, self.log = name, real, log

    def pack_into(self, buf: memoryview, offset: int, *values: int) -> None:
        self.log.append(self.name)
        self.real.pack_into(buf, offset, *values)  # type: ignore[attr-defined]


def test_s3_2_binding_writes_length_and_offset_before_flags_and_generation(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    log: list[str] = []
    monkeypatch.setattr(layout, "_ENTRY_TAIL", _Recorder("length+offset", layout._ENTRY_TAIL, log))
    monkeypatch.setattr(
        layout, "_ENTRY_HEAD", _Recorder("flags+generation", layout._ENTRY_HEAD, log)
    )
    buf = memoryview(bytearray(16))
    write_entry(buf, 0, TableEntry(TableFlag.VALID, 2, 5, 0x40))
    assert log == ["length+offset", "flags+generation"]
    assert read_entry(buf, 0) == TableEntry(TableFlag.VALID, 2, 5, 0x40)


@pytest.mark.parametrize(("before", "after"), [(1, 2), (0xFFFE, 0xFFFF), (0xFFFF, 1), (0, 1)])
def test_s3_2_generation_never_zero(before: int, after: int) -> None:
    assert next_generation(before) == after


def test_s3_2_unpack_rejects_wrong_length_with_project_error() -> None:
    with pytest.raises(LocalError):
        TableEntry.unpack(b"\x00" * 15)
    with pytest.raises(LocalError):
        Slot.unpack(b"\x00" * 17)


# --------------------------------------------------------------------------------------
# §3.3 slots and counters
# --------------------------------------------------------------------------------------


def test_s3_3_slot_layout_and_consumed_marker() -> None:
    buf = memoryview(bytearray(16))
    write_slot(buf, 0, 7, 0x1000)
    assert bytes(buf).hex() == "00000007000000000000000000001000"
    assert read_slot(buf, 0) == Slot(7, 0x1000) and read_slot(buf, 0).holds(7)
    consume_slot(buf, 0)
    assert read_slot(buf, 0) == Slot(7, EMPTY_BLOCK_OFFSET)
    assert read_slot(buf, 0).consumed and not read_slot(buf, 0).holds(7)


def test_s3_3_slot_block_offset_written_before_sequence(monkeypatch: pytest.MonkeyPatch) -> None:
    log: list[str] = []
    monkeypatch.setattr(layout, "_SLOT_OFFSET", _Recorder("offset", layout._SLOT_OFFSET, log))
    monkeypatch.setattr(layout, "_SLOT_SEQ", _Recorder("sequence", layout._SLOT_SEQ, log))
    write_slot(memoryview(bytearray(16)), 0, 1, 2)
    assert log == ["offset", "sequence"]


@pytest.mark.parametrize("n", [1, 2, 3, 10, 28])
def test_s3_3_add_mask_is_bits_63_31_and_n_plus_3(n: int) -> None:
    assert ring_add_mask(n) == (1 << 63) | (1 << 31) | (1 << (n + 3))


@pytest.mark.parametrize("n", [0, 29, -1])
def test_s3_3_ring_order_outside_1_to_28_is_refused(n: int) -> None:
    with pytest.raises(LocalError):
        ring_add_mask(n)


@pytest.mark.parametrize("n", [1, 2, 4, 8])
def test_s3_3_fetchadd_advances_ticket_and_wraps_slot_offset(n: int) -> None:
    """One masked FetchAdd per allocation walks every slot and wraps; bits 31..n+4 stay zero."""
    slots = 1 << n
    value = pack_counter(0, 0)
    for step in range(3 * slots):
        ticket, offset = unpack_counter(value, n)
        assert (ticket, offset) == (step, 16 * (step % slots))
        assert value & 0xFFFFFFFF & ~((1 << (n + 4)) - 1) == 0
        value = fetch_add(value, RING_ADD_DATA, ring_add_mask(n))


def test_s3_3_ticket_wraps_modulo_2_32_without_disturbing_offset() -> None:
    n = 2
    value = pack_counter(TICKET_MASK, 16 * 3)
    value = fetch_add(value, RING_ADD_DATA, ring_add_mask(n))
    assert unpack_counter(value, n) == (0, 0)


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 28), st.integers(0, TICKET_MASK))
def test_s3_3_fetchadd_fields_independent(n: int, ticket: int) -> None:
    slots = 1 << n
    value = pack_counter(ticket, 16 * (ticket % slots))
    after = fetch_add(value, RING_ADD_DATA, ring_add_mask(n))
    nxt = (ticket + 1) & TICKET_MASK
    assert unpack_counter(after, n) == (nxt, 16 * ((ticket + 1) % slots))


def test_s3_3_initialization() -> None:
    """Slots s < F hold {s, block}; F <= s < N hold {s - N mod 2^32, all ones}; Head, Tail."""
    geo = RingGeometry(order=3, slots_offset=0, head_offset=128, tail_offset=192)
    buf = memoryview(bytearray(200))
    blocks = [0x1000, 0x2000, 0x3000, 0x4000, 0x5000]
    init_ring(buf, geo, blocks)
    for s in range(5):
        assert read_slot(buf, 16 * s) == Slot(s, blocks[s])
    for s in range(5, 8):
        assert read_slot(buf, 16 * s) == Slot((s - 8) & TICKET_MASK, EMPTY_BLOCK_OFFSET)
    assert read_counter(buf, 128) == pack_counter(0, 0)
    assert read_counter(buf, 192) == pack_counter(5, 16 * 5)
    # counters are in the target's (little-endian) memory order, never big-endian here
    assert bytes(buf[192:200]) == pack_counter(5, 80).to_bytes(8, "little")


def test_s3_3_initialization_full_ring_tail_wraps_to_slot_zero() -> None:
    geo = RingGeometry(order=1, slots_offset=0, head_offset=32, tail_offset=40, byteorder="big")
    buf = memoryview(bytearray(48))
    init_ring(buf, geo, [0xA0, 0xB0])
    assert read_counter(buf, 40, "big") == pack_counter(2, 0)


def test_s3_3_n_not_smaller_than_f() -> None:
    geo = RingGeometry(order=1, slots_offset=0, head_offset=32, tail_offset=40)
    with pytest.raises(LocalError):
        init_ring(memoryview(bytearray(48)), geo, [1, 2, 3])
    assert ring_order_for(1) == 1 and ring_order_for(2) == 1 and ring_order_for(5) == 3


def test_s3_3_counters_must_be_8_aligned() -> None:
    with pytest.raises(LocalError):
        RingGeometry(order=1, slots_offset=0, head_offset=36, tail_offset=40)


# --------------------------------------------------------------------------------------
# §3.1 pool and the memory map
# --------------------------------------------------------------------------------------


def test_s3_1_block_offsets_are_tagged_offsets() -> None:
    lay = plan_layout(
        block_size=4096,
        pool_blocks=6,
        partition_sizes=[2],
        table_entries=8,
        base_to=0x7F00_0000_0000,
    )
    assert lay.block_to(0) == 0x7F00_0000_0000 + lay.pool_offset
    assert lay.block_to(5) - lay.block_to(4) == 4096
    assert lay.block_index(lay.block_to(3)) == 3
    assert lay.block_index(lay.block_to(3) + 1) is None
    assert lay.block_index(lay.block_to(5) + 4096) is None
    assert lay.partitions[0].first_block == 0 and lay.shared_first_block == 2
    assert lay.shared_blocks == 4


def test_s3_6_regions_do_not_overlap_and_only_head_is_in_head_stag() -> None:
    lay = plan_layout(block_size=100, pool_blocks=7, partition_sizes=[3, 1], table_entries=5)
    regions = [lay.table_region, lay.pool_region]
    rings = [lay.shared_ring] + [p.ring for p in lay.partitions]
    for ring in rings:
        assert ring is not None
        start, length = lay.ring_region(ring)
        assert (start, length) == (ring.slots_offset, 16 * ring.slots)
        assert lay.head_region(ring) == (ring.head_offset, 8)
        regions.append((start, length))
        regions.append(lay.head_region(ring))
        regions.append((ring.tail_offset, 8))
    regions.sort()
    for (a, alen), (b, _) in zip(regions, regions[1:], strict=False):
        assert a + alen <= b
    assert regions[-1][0] + regions[-1][1] <= lay.size


def test_s3_4_partitions_cannot_exceed_pool() -> None:
    with pytest.raises(LocalError):
        plan_layout(block_size=8, pool_blocks=3, partition_sizes=[2, 2], table_entries=4)
