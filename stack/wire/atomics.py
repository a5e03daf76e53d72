"""Masked FetchAdd and CmpSwap of RFC 7306 §5.1 as pure functions (EXT-06).

All values are unsigned 64-bit integers in host order; converting target memory (in the
target's byte order) to and from these integers is the RNIC's business.

FetchAdd: a set bit in the Add Mask marks the most significant bit of an independent
field; the carry out of that bit is dropped, so a mask of 0 is one plain 64-bit add and an
all-ones mask makes every bit its own field (a per-bit XOR).  Closed form: add the
unmasked bits normally (masked positions are zero in both operands, so they receive the
incoming carry and never pass one on), then XOR the operands' masked bits back in.

CmpSwap: swap only if the bits selected by the Compare Mask equal Compare Data; the swap
writes only the bits selected by the Swap Mask.  All-ones masks give the classic CAS.
"""

from __future__ import annotations

from stack.constants import (
    ALL_ONES_64,
    ATOMIC_ALIGNMENT,
    TERM_RDMAP_CATASTROPHIC_STREAM,
    TERM_RDMAP_UNEXPECTED_OPCODE,
    AtomicOpcode,
)
from stack.errors import RdmapError
from stack.wire.events import AtomicRequest

_FETCH_ADD = AtomicOpcode.FETCH_ADD  # module globals: Enum.MEMBER is slow in 3.11
_CMP_SWAP = AtomicOpcode.CMP_SWAP


def fetch_add(value: int, add: int, mask: int = 0) -> int:
    """The value FetchAdd writes: ``value + add`` with carries stopped at ``mask`` bits (EXT-06)."""
    keep = ~mask & ALL_ONES_64
    return (((value & keep) + (add & keep)) ^ ((value ^ add) & mask)) & ALL_ONES_64


def cmp_swap(
    value: int,
    compare: int,
    compare_mask: int = ALL_ONES_64,
    swap: int = 0,
    swap_mask: int = ALL_ONES_64,
) -> int:
    """The value CmpSwap leaves in memory (EXT-06): swapped iff the masked compare matches."""
    if (value ^ compare) & compare_mask:
        return value & ALL_ONES_64
    return ((value & ~swap_mask) | (swap & swap_mask)) & ALL_ONES_64


def apply_atomic(req: AtomicRequest, value: int) -> int:
    """The new memory value after executing ``req`` on ``value``; the response carries ``value``.

    Raises :class:`RdmapError` (EXT-04, Terminate 0/2/0x06) for an AOpCode other than
    FetchAdd (0) and CmpSwap (2): RFC 7306 defines no code for it but it must be surfaced.
    """
    if req.atomic_opcode == _FETCH_ADD:
        return fetch_add(value, req.add_swap_data, req.add_swap_mask)
    if req.atomic_opcode == _CMP_SWAP:
        return cmp_swap(
            value, req.compare_data, req.compare_mask, req.add_swap_data, req.add_swap_mask
        )
    raise RdmapError(
        "EXT-04", f"unsupported atomic opcode {req.atomic_opcode}", TERM_RDMAP_UNEXPECTED_OPCODE
    )


def check_alignment(to: int) -> None:
    """Refuse an atomic target that is not 8-byte aligned (EXT-05, Terminate 0/2/0x07).

    The TO is checked; the RNIC must also check the resulting address if its regions can
    start off an 8-byte boundary.
    """
    if to % ATOMIC_ALIGNMENT:
        raise RdmapError(
            "EXT-05",
            f"atomic target TO 0x{to:X} is not 8-byte aligned",
            TERM_RDMAP_CATASTROPHIC_STREAM,
        )
