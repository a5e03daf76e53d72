"""Masked FetchAdd / CmpSwap (RFC 7306 §5.1) against a bit-serial reference."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stack.constants import (
    ALL_ONES_64,
    TERM_RDMAP_CATASTROPHIC_STREAM,
    TERM_RDMAP_UNEXPECTED_OPCODE,
    AtomicOpcode,
)
from stack.errors import RdmapError
from stack.wire.atomics import apply_atomic, check_alignment, cmp_swap, fetch_add
from stack.wire.events import AtomicRequest

u64 = st.integers(min_value=0, max_value=ALL_ONES_64)
# Masks biased towards the interesting shapes: none, all, single field boundaries.
masks = st.one_of(
    st.just(0),
    st.just(ALL_ONES_64),
    st.builds(lambda bits: sum(1 << b for b in bits), st.sets(st.integers(0, 63), max_size=6)),
    u64,
)


def ref_fetch_add(value: int, add: int, mask: int) -> int:
    """Ripple-carry add, one bit at a time; a set mask bit swallows the carry it produces."""
    result = 0
    carry = 0
    for bit in range(64):
        total = ((value >> bit) & 1) + ((add >> bit) & 1) + carry
        result |= (total & 1) << bit
        carry = 0 if (mask >> bit) & 1 else total >> 1
    return result


def ref_cmp_swap(value: int, compare: int, compare_mask: int, swap: int, swap_mask: int) -> int:
    """Compare the selected bits one by one; on a match replace the selected bits one by one."""
    for bit in range(64):
        if (compare_mask >> bit) & 1 and ((value >> bit) & 1) != ((compare >> bit) & 1):
            return value
    result = value
    for bit in range(64):
        if (swap_mask >> bit) & 1:
            result = (result & ~(1 << bit)) | (((swap >> bit) & 1) << bit)
    return result


@settings(max_examples=200, deadline=None)
@given(u64, u64, masks)
def test_ext_06_fetch_add_matches_bit_serial_reference(value: int, add: int, mask: int) -> None:
    assert fetch_add(value, add, mask) == ref_fetch_add(value, add, mask)


@settings(max_examples=200, deadline=None)
@given(u64, u64, masks, u64, masks)
def test_ext_06_cmp_swap_matches_bit_serial_reference(
    value: int, compare: int, compare_mask: int, swap: int, swap_mask: int
) -> None:
    expected = ref_cmp_swap(value, compare, compare_mask, swap, swap_mask)
    assert cmp_swap(value, compare, compare_mask, swap, swap_mask) == expected
    # A compare value equal to memory always matches.
    assert cmp_swap(value, value, compare_mask, swap, swap_mask) == ref_cmp_swap(
        value, value, compare_mask, swap, swap_mask
    )


@pytest.mark.parametrize(
    ("value", "add", "mask", "new"),
    [  # worked examples of RFC 7306 §5.1
        (0x00000000FFFFFFFF, 0x0000000100000001, 0, 0x0000000200000000),
        (0x00000000FFFFFFFF, 0x0000000100000001, 0x8000000080000000, 0x0000000100000000),
        (0x00FF7F80FFFF0001, 0x0101010101010101, 0x8080808080808080, 0x0100808100000102),
        (0xFFFFFFFFFFFFFFFF, 0x1, 0, 0x0),
        (0x1, 0x1, ALL_ONES_64, 0x0),
    ],
)
def test_ext_06_fetch_add_worked_table(value: int, add: int, mask: int, new: int) -> None:
    assert fetch_add(value, add, mask) == new == ref_fetch_add(value, add, mask)


@settings(max_examples=100, deadline=None)
@given(u64, u64)
def test_ext_06_fetch_add_mask_zero_is_plain_add_all_ones_is_xor(value: int, add: int) -> None:
    assert fetch_add(value, add, 0) == (value + add) % (1 << 64)
    assert fetch_add(value, add, ALL_ONES_64) == value ^ add


def test_ext_06_cmp_swap_worked_examples() -> None:
    v = 0x1111222233334444
    assert cmp_swap(v, v, ALL_ONES_64, 0xAAAABBBBCCCCDDDD, ALL_ONES_64) == 0xAAAABBBBCCCCDDDD
    assert (
        cmp_swap(v, 0x1111000000000000, 0xFFFF000000000000, 0x00000000FFFF0000, 0x00000000FFFF0000)
        == 0x11112222FFFF4444
    )
    assert cmp_swap(v, 0x2222000000000000, 0xFFFF000000000000, 0, ALL_ONES_64) == v
    assert cmp_swap(v, 0, 0, 7, ALL_ONES_64) == 7  # compare mask 0: always swaps


@pytest.mark.parametrize("n", [1, 2, 4, 10, 20, 27])  # 2^n slots of 16 bytes
def test_ext_06_kbtp_ring_mask_ticket_and_slot_advance_independently(n: int) -> None:
    # Word: ticket (bits 32-63) | untouched middle (bits n+4..31) | slot offset (bits 0..n+3).
    add = 0x0000000100000010
    mask = (1 << 63) | (1 << 31) | (1 << (n + 3))
    ring_bytes = 16 << n
    middle = (0x5A5A5A5A << (n + 4)) & 0xFFFFFFFF & ~(ring_bytes - 1)
    ticket0 = 0xFFFFFFFF - 3  # the ticket wraps during the run as well
    slot0 = ring_bytes - 16  # the last slot: the first add wraps it
    word = (ticket0 << 32) | middle | slot0
    for k in range(1, 2 * (1 << min(n, 6)) + 8):
        prev, word = word, fetch_add(word, add, mask)
        assert word == ref_fetch_add(prev, add, mask)
        ticket, low = word >> 32, word & 0xFFFFFFFF
        assert ticket == (ticket0 + k) & 0xFFFFFFFF
        assert low & (ring_bytes - 1) == (slot0 + 16 * k) % ring_bytes  # slot wraps at 16*2^n
        assert low & ~(ring_bytes - 1) == middle  # no carry leaks out of the slot field


@pytest.mark.parametrize("n", [0, 3, 27])
def test_ext_06_kbtp_ring_mask_matches_reference(n: int) -> None:
    add, mask = 0x0000000100000010, (1 << 63) | (1 << 31) | (1 << (n + 3))
    for word in (0, ALL_ONES_64, 0xFFFFFFFF00000000 | ((16 << n) - 16), 0x7FFFFFFF7FFFFFF0):
        assert fetch_add(word, add, mask) == ref_fetch_add(word, add, mask)


def test_ext_04_apply_atomic_both_opcodes() -> None:
    fa = AtomicRequest.fetch_add(1, 2, 8, add=5, mask=0)
    assert apply_atomic(fa, 10) == 15
    cs = AtomicRequest.cmp_swap(1, 2, 8, compare=10, swap=99)
    assert apply_atomic(cs, 10) == 99 and apply_atomic(cs, 11) == 11
    masked = AtomicRequest.cmp_swap(1, 2, 8, 0xF0, 0xAB, compare_mask=0xF0, swap_mask=0x0F)
    assert apply_atomic(masked, 0xF3) == 0xFB


@pytest.mark.parametrize("aop", [1, 3, 0xF])
def test_ext_04_unknown_atomic_opcode_is_surfaced(aop: int) -> None:
    with pytest.raises(RdmapError) as info:
        apply_atomic(AtomicRequest(aop, 1, 2, 8, 1), 0)
    assert info.value.rule == "EXT-04" and info.value.term == TERM_RDMAP_UNEXPECTED_OPCODE
    assert AtomicOpcode.FETCH_ADD == 0 and AtomicOpcode.CMP_SWAP == 2


def test_ext_05_target_must_be_8_byte_aligned() -> None:
    check_alignment(0)
    check_alignment(0x4000)
    for to in (1, 4, 7, 0x4004):
        with pytest.raises(RdmapError) as info:
            check_alignment(to)
        assert info.value.rule == "EXT-05" and info.value.term == TERM_RDMAP_CATASTROPHIC_STREAM
