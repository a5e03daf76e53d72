"""Editing DDP/RDMAP headers of a ULPDU on purpose (RFC 5041 §4, RFC 5040 §4).

The data-phase cases send messages the stack's encoder builds
(:func:`~stack.wire.rdmap.encode_message`) with one field changed: the DDP control byte
(T, L, reserved bits, DV), the RDMAP control byte (RV, reserved bits, opcode), the untagged
header's Invalidate STag, QN, MSN or MO, the tagged header's STag or TO.  The offsets come
from the header layouts of :mod:`stack.wire.ddp`.  Nothing here judges a header: what a
receiver does with the edited bytes is asked of the stack's endpoint
(:mod:`stack.conform.oracle`).
"""

from __future__ import annotations

import struct

from stack.constants import (
    DDP_DV_MASK,
    DDP_LAST,
    DDP_TAGGED,
    RDMAP_OPCODE_MASK,
    RDMAP_RV_MASK,
)
from stack.wire.ddp import TAGGED_HDR, UNTAGGED_HDR

__all__ = [
    "INVAL_AT",
    "MO_AT",
    "MSN_AT",
    "QN_AT",
    "STAG_AT",
    "TO_AT",
    "ctrl",
    "set_u32",
    "set_u64",
    "with_dv",
    "with_last",
    "with_opcode",
    "with_rv",
]

_U32 = struct.Struct(">I")
_U64 = struct.Struct(">Q")
STAG_AT = struct.calcsize(">BB")
"""Tagged header: STag offset (after the two control bytes)."""
TO_AT = struct.calcsize(">BBI")
"""Tagged header: TO offset."""
INVAL_AT = struct.calcsize(">BB")
"""Untagged header: RsvdULP[8:39], the Invalidate STag."""
QN_AT = struct.calcsize(">BBI")
MSN_AT = struct.calcsize(">BBII")
MO_AT = struct.calcsize(">BBIII")

assert MO_AT + 4 == UNTAGGED_HDR.size and TO_AT + 8 == TAGGED_HDR.size


def ctrl(ulpdu: bytes, *, set_bits: int = 0, clear_bits: int = 0, byte: int = 0) -> bytes:
    """``ulpdu`` with bits of control byte ``byte`` (0: DDP, 1: RDMAP) set and cleared."""
    out = bytearray(ulpdu)
    out[byte] = (out[byte] | set_bits) & ~clear_bits & 0xFF
    return bytes(out)


def with_dv(ulpdu: bytes, dv: int) -> bytes:
    """The DDP version field (two bits) set to ``dv``."""
    return ctrl(ulpdu, set_bits=dv & DDP_DV_MASK, clear_bits=DDP_DV_MASK & ~dv)


def with_rv(ulpdu: bytes, rv: int) -> bytes:
    """The RDMAP version field (two top bits) set to ``rv``."""
    bits = (rv << 6) & RDMAP_RV_MASK
    return ctrl(ulpdu, set_bits=bits, clear_bits=RDMAP_RV_MASK & ~bits, byte=1)


def with_opcode(ulpdu: bytes, opcode: int) -> bytes:
    """The RDMAP opcode set to ``opcode`` (the header layout is kept)."""
    op = opcode & RDMAP_OPCODE_MASK
    return ctrl(ulpdu, set_bits=op, clear_bits=RDMAP_OPCODE_MASK & ~op, byte=1)


def with_last(ulpdu: bytes, last: bool) -> bytes:
    """The L bit set or cleared."""
    return ctrl(ulpdu, set_bits=DDP_LAST) if last else ctrl(ulpdu, clear_bits=DDP_LAST)


def is_tagged(ulpdu: bytes) -> bool:
    return bool(ulpdu[0] & DDP_TAGGED)


def set_u32(ulpdu: bytes, at: int, value: int) -> bytes:
    """A 32-bit header field at offset ``at`` (QN_AT, MSN_AT, MO_AT, INVAL_AT, STAG_AT)."""
    out = bytearray(ulpdu)
    _U32.pack_into(out, at, value & 0xFFFFFFFF)
    return bytes(out)


def set_u64(ulpdu: bytes, at: int, value: int) -> bytes:
    """A 64-bit header field at offset ``at`` (TO_AT)."""
    out = bytearray(ulpdu)
    _U64.pack_into(out, at, value & ((1 << 64) - 1))
    return bytes(out)
