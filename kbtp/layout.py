"""Target memory layouts: table entries, ring slots, counters and the memory map (draft §3).

Byte order (docs/kbtp.md §3.5): table entries and ring slots are **big-endian**, like the
messages, because initiators read them with RDMA Read, which moves octets unchanged; Head
and Tail counters are in the **target's memory byte order** (RFC 7306 runs atomics in
that order; draft §3.3) and are never read remotely.  This implementation's software RNIC
keeps atomic operands little-endian, hence the default ``counter_byteorder="little"``.

Everything here works on ``memoryview`` buffers with byte offsets, so the structures can
live inside registered memory regions.  Byte offsets in the buffer are mapped to Tagged
Offsets by adding the layout's ``base_to``; Block Offsets stored in entries and slots are
Tagged Offsets (draft §3.1), usable directly in RDMA operations.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Literal

from kbtp.constants import (
    COUNTER_ALIGNMENT,
    COUNTER_LEN,
    EMPTY_BLOCK_OFFSET,
    INITIAL_GENERATION,
    RING_MAX_ORDER,
    RING_MIN_ORDER,
    SLOT_LEN,
    TABLE_ENTRY_LEN,
    TICKET_MASK,
    CounterFormat,
    TableFlag,
    counter_value,
    ring_add_mask,
    ring_order_for,
    unpack_counter,
)
from stack.errors import LocalError
from stack.fastinit import maker

ByteOrder = Literal["little", "big"]

_ENTRY_HEAD = struct.Struct(">HH")  # Flags, Generation (octets 0-3)
_ENTRY_TAIL = struct.Struct(">IQ")  # Data Length, Block Offset (octets 4-15)
_ENTRY = struct.Struct(">HHIQ")
_SLOT_SEQ = struct.Struct(">II")  # Sequence, Reserved (octets 0-7)
_SLOT_OFFSET = struct.Struct(">Q")  # Block Offset (octets 8-15)
_SLOT = struct.Struct(">IIQ")
_VALID = int(TableFlag.VALID)
_SEALED = int(TableFlag.SEALED)
_FLAG_VALUES = {int(f): f for f in (TableFlag(v) for v in range(4))}
_COUNTER = {"little": struct.Struct("<Q"), "big": struct.Struct(">Q")}


# ======================================================================================
# Table entries (draft §3.2)
# ======================================================================================


@dataclass(frozen=True, slots=True)
class TableEntry:
    """A block table entry (draft §3.2).  Fields: flags, generation, data_length, block_offset."""

    flags: TableFlag = TableFlag.NONE
    generation: int = INITIAL_GENERATION
    data_length: int = 0
    block_offset: int = EMPTY_BLOCK_OFFSET

    @property
    def valid(self) -> bool:
        return bool(int(self.flags) & _VALID)

    @property
    def sealed(self) -> bool:
        return bool(int(self.flags) & _SEALED)

    def pack(self) -> bytes:
        return _ENTRY.pack(int(self.flags), self.generation, self.data_length, self.block_offset)

    @classmethod
    def unpack(cls, data: bytes | bytearray | memoryview) -> TableEntry:
        """Decode 16 octets (what a DIRECT_LOAD initiator reads with RDMA Read)."""
        if len(data) != TABLE_ENTRY_LEN:
            raise LocalError(f"table entry of {len(data)} octets")
        flags, generation, length, offset = _ENTRY.unpack(data)
        return cls(_table_flags(flags), generation, length, offset)


def _table_flags(value: int) -> TableFlag:
    known = _FLAG_VALUES.get(value)
    return known if known is not None else TableFlag(value)


_make_entry = maker(TableEntry)
_unpack_entry = _ENTRY.unpack_from


def read_entry(buf: memoryview, offset: int) -> TableEntry:
    """The entry stored at byte ``offset`` of ``buf``."""
    flags, generation, length, block = _unpack_entry(buf, offset)
    known = _FLAG_VALUES.get(flags)
    return _make_entry(TableFlag(flags) if known is None else known, generation, length, block)


def read_entry_values(buf: memoryview, offset: int) -> tuple[int, int, int, int]:
    """The entry stored at byte ``offset`` of ``buf`` as its four values (Flags as an int),
    without an object: for the target's own updates of an entry."""
    values: tuple[int, int, int, int] = _unpack_entry(buf, offset)
    return values


def write_entry_values(
    buf: memoryview, offset: int, flags: int, generation: int, length: int, block: int
) -> None:
    """:func:`write_entry` of an entry given by its values, in the same order."""
    _ENTRY_TAIL.pack_into(buf, offset + 4, length, block)
    _ENTRY_HEAD.pack_into(buf, offset, flags, generation)


def write_entry(buf: memoryview, offset: int, entry: TableEntry) -> None:
    """Store ``entry``: Data Length and Block Offset first, then Flags and Generation (§3.2).

    A reader that observes the new Flags/Generation therefore also observes the new
    length and offset (the order matters to DIRECT_LOAD and to offloading targets).
    """
    e = entry
    write_entry_values(buf, offset, int(e.flags), e.generation, e.data_length, e.block_offset)


# ======================================================================================
# Ring slots (draft §3.3)
# ======================================================================================


@dataclass(frozen=True, slots=True)
class Slot:
    """A free-block ring slot (draft §3.3).  Fields: sequence (a 32-bit ticket), block_offset."""

    sequence: int
    block_offset: int

    @property
    def consumed(self) -> bool:
        return self.block_offset == EMPTY_BLOCK_OFFSET

    def holds(self, ticket: int) -> bool:
        """True when this slot carries the block of ``ticket`` (Sequence matches, not consumed)."""
        return self.sequence == ticket & TICKET_MASK and not self.consumed

    def pack(self) -> bytes:
        return _SLOT.pack(self.sequence, 0, self.block_offset)

    @classmethod
    def unpack(cls, data: bytes | bytearray | memoryview) -> Slot:
        """Decode 16 octets (what a DIRECT_ALLOC initiator reads with RDMA Read)."""
        if len(data) != SLOT_LEN:
            raise LocalError(f"ring slot of {len(data)} octets")
        sequence, _reserved, block = _SLOT.unpack(data)
        return cls(sequence, block)


def read_slot(buf: memoryview, offset: int) -> Slot:
    sequence, _reserved, block = _SLOT.unpack_from(buf, offset)
    return Slot(sequence, block)


def write_slot(buf: memoryview, offset: int, ticket: int, block_offset: int) -> None:
    """Fill a slot: the Block Offset first, then the Sequence (draft §3.3)."""
    _SLOT_OFFSET.pack_into(buf, offset + 8, block_offset)
    _SLOT_SEQ.pack_into(buf, offset, ticket & TICKET_MASK, 0)


def consume_slot(buf: memoryview, offset: int) -> None:
    """Mark a slot consumed: Block Offset all ones, Sequence kept (draft §3.3)."""
    _SLOT_OFFSET.pack_into(buf, offset + 8, EMPTY_BLOCK_OFFSET)


# ======================================================================================
# Counters (draft §3.3)
# ======================================================================================


def read_counter(buf: memoryview, offset: int, byteorder: ByteOrder = "little") -> int:
    """The 64-bit counter at ``offset`` (target memory byte order)."""
    return int(_COUNTER[byteorder].unpack_from(buf, offset)[0])


def write_counter(
    buf: memoryview, offset: int, value: int, byteorder: ByteOrder = "little"
) -> None:
    _COUNTER[byteorder].pack_into(buf, offset, value)


# ======================================================================================
# Ring geometry and initialization (draft §3.3)
# ======================================================================================


@dataclass(frozen=True, slots=True)
class RingGeometry:
    """Where one ring lives in target memory.

    Fields: order (n; N = 2**n slots), slots_offset (byte offset of slot 0), head_offset,
    tail_offset (8-aligned byte offsets of the counters), byteorder (of the counters).
    """

    order: int
    slots_offset: int
    head_offset: int
    tail_offset: int
    byteorder: ByteOrder = "little"

    def __post_init__(self) -> None:
        if not RING_MIN_ORDER <= self.order <= RING_MAX_ORDER:
            raise LocalError(f"ring order {self.order} outside {RING_MIN_ORDER}..{RING_MAX_ORDER}")
        if self.head_offset % COUNTER_ALIGNMENT or self.tail_offset % COUNTER_ALIGNMENT:
            raise LocalError("ring counters must be aligned to 8 octets (draft §3.3)")

    @property
    def slots(self) -> int:
        """N."""
        return 1 << self.order

    @property
    def add_mask(self) -> int:
        return ring_add_mask(self.order)

    @property
    def slots_length(self) -> int:
        return self.slots * SLOT_LEN

    def slot_offset(self, ticket: int) -> int:
        """Slot Offset (16 * slot number) that the counters pair with ``ticket``."""
        return SLOT_LEN * (ticket % self.slots)

    def unpack_counter(self, value: int) -> tuple[int, int]:
        return unpack_counter(value, self.order)


def init_ring(
    buf: memoryview,
    geometry: RingGeometry,
    blocks: list[int],
    fmt: CounterFormat = CounterFormat.MASKED,
    first_ticket: int = 0,
) -> None:
    """Initialize a ring with the Block Offsets ``blocks`` (F = len(blocks)), per draft §3.3.

    With ticket t_i = first_ticket + i: the slot of t_i (i < F) gets {t_i, blocks[i]}, the
    slot of t_i (F <= i < N) gets {t_i - N mod 2**32, all ones}; Head holds t_0 and Tail
    t_F in counter format ``fmt``.  ``first_ticket`` 0 is the draft's initialization; other
    values start the tickets elsewhere (near the 32-bit wrap, to test it).
    """
    n_slots = geometry.slots
    f = len(blocks)
    if f > n_slots:
        raise LocalError(f"{f} blocks do not fit a ring of {n_slots} slots (N >= F)")
    for i in range(n_slots):
        ticket = (first_ticket + i) & TICKET_MASK
        at = geometry.slots_offset + geometry.slot_offset(ticket)
        if i < f:
            write_slot(buf, at, ticket, blocks[i])
        else:
            write_slot(buf, at, (ticket - n_slots) & TICKET_MASK, EMPTY_BLOCK_OFFSET)
    head = counter_value(fmt, first_ticket, geometry.order)
    tail = counter_value(fmt, first_ticket + f, geometry.order)
    write_counter(buf, geometry.head_offset, head, geometry.byteorder)
    write_counter(buf, geometry.tail_offset, tail, geometry.byteorder)


# ======================================================================================
# The target memory map (docs/kbtp.md §3.6)
# ======================================================================================

_REGION_ALIGN = 64


def _align(value: int, to: int = _REGION_ALIGN) -> int:
    return -(-value // to) * to


@dataclass(frozen=True, slots=True)
class PartitionLayout:
    """A DIRECT_ALLOC partition: blocks [first_block, first_block + blocks) and its ring.

    The ring's slots (``ring_region``, the Ring STag: remote read) and its Head
    (``head_region``, the Head STag: remote atomic) are exposed apart, so no atomic can
    reach a slot; Tail, on a line of its own, is never exposed (docs/kbtp.md §3.6).
    """

    first_block: int
    blocks: int
    ring: RingGeometry


@dataclass(frozen=True, slots=True)
class TargetLayout:
    """Byte offsets of every structure in one target memory buffer.

    Fields: base_to (Tagged Offset of byte 0), block_size, pool_blocks (F),
    table_offset, table_base_handle, table_entries, pool_offset, shared_first_block,
    shared_blocks, shared_ring (None if no initiator uses the shared ring), partitions,
    size (octets of memory needed).
    """

    base_to: int
    block_size: int
    pool_blocks: int
    table_offset: int
    table_base_handle: int
    table_entries: int
    pool_offset: int
    shared_first_block: int
    shared_blocks: int
    shared_ring: RingGeometry | None
    partitions: tuple[PartitionLayout, ...]
    size: int

    # -- addresses ----------------------------------------------------------------------
    def to(self, offset: int) -> int:
        """Tagged Offset of byte ``offset``."""
        return self.base_to + offset

    def offset_of(self, to: int) -> int:
        return to - self.base_to

    def entry_offset(self, handle: int) -> int:
        """Byte offset of ``handle``'s entry: Table Offset + 16 * (h - Table Base Handle)."""
        return self.table_offset + TABLE_ENTRY_LEN * (handle - self.table_base_handle)

    def serves(self, handle: int) -> bool:
        return 0 <= handle - self.table_base_handle < self.table_entries

    def block_byte_offset(self, index: int) -> int:
        return self.pool_offset + index * self.block_size

    def block_to(self, index: int) -> int:
        """Block Offset (a Tagged Offset) of block ``index``."""
        return self.to(self.block_byte_offset(index))

    def block_index(self, block_offset: int) -> int | None:
        """Index of the block whose Block Offset is ``block_offset``, or None if none is."""
        rel = self.offset_of(block_offset) - self.pool_offset
        if rel < 0 or rel % self.block_size or rel // self.block_size >= self.pool_blocks:
            return None
        return rel // self.block_size

    def partition_region(self, part: PartitionLayout) -> tuple[int, int]:
        """(byte offset, length) of a partition's blocks: the Partition STag's range."""
        return self.block_byte_offset(part.first_block), part.blocks * self.block_size

    def ring_region(self, ring: RingGeometry) -> tuple[int, int]:
        """(byte offset, length) of a ring's slots: the Ring STag's range (remote read)."""
        return ring.slots_offset, ring.slots_length

    def head_region(self, ring: RingGeometry) -> tuple[int, int]:
        """(byte offset, length) of a ring's Head: the Head STag's range (remote atomic)."""
        return ring.head_offset, COUNTER_LEN

    @property
    def table_region(self) -> tuple[int, int]:
        return self.table_offset, self.table_entries * TABLE_ENTRY_LEN

    @property
    def pool_region(self) -> tuple[int, int]:
        return self.pool_offset, self.pool_blocks * self.block_size


def _ring_at(offset: int, order: int, byteorder: ByteOrder) -> tuple[RingGeometry, int]:
    slots = offset
    head = slots + (1 << order) * SLOT_LEN
    tail = _align(head + COUNTER_LEN)  # a separate line: Tail is never remotely reachable
    return RingGeometry(order, slots, head, tail, byteorder), _align(tail + COUNTER_LEN)


def plan_layout(
    *,
    block_size: int,
    pool_blocks: int,
    partition_sizes: list[int],
    table_entries: int,
    table_base_handle: int = 0,
    shared_ring_order: int | None = None,
    partition_ring_orders: list[int] | None = None,
    base_to: int = 0,
    byteorder: ByteOrder = "little",
) -> TargetLayout:
    """Place table, pool (partitions first, then shared blocks) and rings in one buffer.

    ``shared_ring_order`` None means "smallest n with 2**n >= shared blocks"; pass 0 blocks
    of shared pool to get no shared ring.  Raises :class:`LocalError` on impossible sizes.
    """
    if block_size < 1 or pool_blocks < 1 or table_entries < 1:
        raise LocalError("block size, pool size and table size must be positive")
    if any(p < 1 for p in partition_sizes):
        raise LocalError("every partition needs at least one block")
    shared = pool_blocks - sum(partition_sizes)
    if shared < 0:
        raise LocalError(
            f"partitions need {sum(partition_sizes)} blocks, the pool has {pool_blocks}"
        )
    table_offset = 0
    pool_offset = _align(table_entries * TABLE_ENTRY_LEN)
    cursor = _align(pool_offset + pool_blocks * block_size)
    shared_ring = None
    if shared > 0:
        order = ring_order_for(shared) if shared_ring_order is None else shared_ring_order
        if (1 << order) < shared:
            raise LocalError(f"shared ring of {1 << order} slots < {shared} blocks")
        shared_ring, cursor = _ring_at(cursor, order, byteorder)
    parts = []
    first = 0
    orders = partition_ring_orders or [ring_order_for(p) for p in partition_sizes]
    if len(orders) != len(partition_sizes):
        raise LocalError("one ring order per partition")
    for size, order in zip(partition_sizes, orders, strict=True):
        if (1 << order) < size:
            raise LocalError(f"partition ring of {1 << order} slots < {size} blocks")
        ring, cursor = _ring_at(cursor, order, byteorder)
        parts.append(PartitionLayout(first, size, ring))
        first += size
    return TargetLayout(
        base_to=base_to,
        block_size=block_size,
        pool_blocks=pool_blocks,
        table_offset=table_offset,
        table_base_handle=table_base_handle,
        table_entries=table_entries,
        pool_offset=pool_offset,
        shared_first_block=first,
        shared_blocks=shared,
        shared_ring=shared_ring,
        partitions=tuple(parts),
        size=cursor,
    )


def init_table(buf: memoryview, layout: TargetLayout) -> None:
    """Every entry unbound: Flags 0, Generation 1, Data Length 0, Block Offset all ones."""
    blank = TableEntry().pack()
    for i in range(layout.table_entries):
        at = layout.table_offset + i * TABLE_ENTRY_LEN
        buf[at : at + TABLE_ENTRY_LEN] = blank
