"""Recovery of a persistent pool: check table against rings, repair, rebuild (docs/kbtp.md §12).

Sans-IO: everything here reads and writes a ``memoryview`` laid out by
:func:`kbtp.target_config.plan_target_layout`.  :func:`plan_recovery` decides, from the
table entries and the blocks the rings hold, what a restarted target serves; it changes
nothing.  :func:`apply_recovery` writes the outcome: the repaired table with every Block
Offset expressed for the new mapping (Tagged Offsets are virtual addresses, which differ
from one run to the next), then every ring rebuilt from its free blocks (draft §3.3
initialization).  :func:`check_pool` is the read-only check of a live pool.

The invariant (docs/kbtp.md §12.3): every block is either bound, by exactly one VALID and
SEALED entry of a handle its ring serves, or free, in its own ring exactly once.  What is
neither (blocks of tickets in flight at the stop: consumed from a ring, never bound; a free
the ring had deferred) goes back to its ring; an entry that breaks a rule is invalidated
with its Generation advanced and its block, if it names one, returned once.
"""

from __future__ import annotations

from bisect import bisect_right
from collections import Counter
from dataclasses import dataclass, field

from kbtp.constants import (
    EMPTY_BLOCK_OFFSET,
    INITIAL_GENERATION,
    SLOT_LEN,
    TABLE_ENTRY_LEN,
    CounterFormat,
    TableFlag,
    counter_ticket,
    next_generation,
)
from kbtp.layout import TableEntry, TargetLayout, init_ring, read_counter, read_slot, write_entry
from kbtp.ring import ticket_distance
from kbtp.target_config import TargetConfig
from kbtp.target_state import SHARED_RING

__all__ = [
    "RecoveryPlan",
    "RecoveryReport",
    "RingDomain",
    "apply_recovery",
    "check_pool",
    "plan_recovery",
    "read_ring_blocks",
    "read_table",
    "ring_domains",
]

_KNOWN_FLAGS = int(TableFlag.VALID | TableFlag.SEALED)


@dataclass(frozen=True, slots=True)
class RingDomain:
    """One ring and what it serves: blocks [first, first + count) and the handle ranges of
    the initiators that allocate from it (half-open (base, end) pairs)."""

    ring: int
    first: int
    count: int
    handles: tuple[tuple[int, int], ...]

    def has_block(self, index: int) -> bool:
        return self.first <= index < self.first + self.count


def ring_domains(config: TargetConfig, layout: TargetLayout) -> list[RingDomain]:
    """The rings of ``layout``: partitions in configuration order, then the shared ring."""
    domains = []
    direct = [i for i in config.initiators if i.direct_alloc]
    for index, (ini, part) in enumerate(zip(direct, layout.partitions, strict=True)):
        span = ((ini.handle_base, ini.handle_base + ini.handle_count),)
        domains.append(RingDomain(index, part.first_block, part.blocks, span))
    if layout.shared_ring is not None:
        spans = tuple(
            (i.handle_base, i.handle_base + i.handle_count)
            for i in config.initiators
            if not i.direct_alloc
        )
        first, count = layout.shared_first_block, layout.shared_blocks
        domains.append(RingDomain(SHARED_RING, first, count, spans))
    return domains


@dataclass(slots=True)
class RecoveryReport:
    """What a recovery found and did (counts).

    Fields: sealed (entries served with their data), free (blocks in the rings afterwards),
    reclaimed (blocks of tickets in flight at the stop, returned to their ring), unsealed
    (VALID entries not SEALED: freed), bound_twice (entries invalidated because another
    entry named the same block), bad_entries (entries invalidated or normalized: unknown
    flags, Generation 0, a block outside the pool or outside the ring of the handle's
    initiator, a handle no initiator owns, Data Length beyond the block), free_and_bound
    (blocks bound and also in a ring: kept bound, dropped from the ring), duplicate_free
    (extra copies of a block in a ring), stray_slots (slots naming no block of their ring),
    checked (the rings were checked: False when resuming an interrupted recovery).
    """

    sealed: int = 0
    free: int = 0
    reclaimed: int = 0
    unsealed: int = 0
    bound_twice: int = 0
    bad_entries: int = 0
    free_and_bound: int = 0
    duplicate_free: int = 0
    stray_slots: int = 0
    checked: bool = True

    @property
    def repaired(self) -> int:
        """Inconsistencies repaired (zero on a pool stopped cleanly or killed between
        operations; tickets in flight and unsealed entries are not inconsistencies)."""
        return (
            self.bound_twice
            + self.bad_entries
            + self.free_and_bound
            + self.duplicate_free
            + self.stray_slots
        )

    def line(self) -> str:
        """One log line with every count."""
        checked = "" if self.checked else " (interrupted recovery resumed, rings rebuilt)"
        return (
            f"{self.sealed} sealed, {self.free} free, {self.reclaimed} in flight reclaimed, "
            f"{self.unsealed} unsealed freed, {self.repaired} repaired "
            f"({self.bound_twice} bound twice, {self.bad_entries} bad entries, "
            f"{self.free_and_bound} free and bound, {self.duplicate_free} duplicate free, "
            f"{self.stray_slots} stray slots){checked}"
        )


@dataclass(slots=True)
class RecoveryPlan:
    """The outcome of :func:`plan_recovery`: ``entries`` (the table, Block Offsets as
    byte offsets into the layout, i.e. for base 0), ``free`` (ring id -> block indices to
    initialize it with) and ``report``."""

    entries: list[TableEntry]
    free: dict[int, list[int]]
    report: RecoveryReport = field(default_factory=RecoveryReport)


# ======================================================================================
# reading what is stored
# ======================================================================================


def read_table(mem: memoryview, layout: TargetLayout) -> list[TableEntry]:
    """Every table entry as stored (Block Offsets as written, in the stored base)."""
    return [
        TableEntry.unpack(mem[at : at + TABLE_ENTRY_LEN])
        for at in range(
            layout.table_offset, layout.table_offset + layout.table_entries * TABLE_ENTRY_LEN,
            TABLE_ENTRY_LEN,
        )
    ]  # fmt: skip


def read_ring_blocks(mem: memoryview, layout: TargetLayout) -> dict[int, list[tuple[int, bool]]]:
    """Ring id -> (Block Offset, taken) of every unconsumed slot, as stored.

    ``taken``: the slot's Sequence lies before Head, so its ticket was taken and the block
    not yet consumed (a direct allocation between FetchAdd and BIND, or a target allocation
    waiting for it).  With a Head or Tail that holds no counter (of one format, §3.3 or
    §9.2, for both), no slot counts as taken.
    """
    rings = {p: part.ring for p, part in enumerate(layout.partitions)}
    if layout.shared_ring is not None:
        rings[SHARED_RING] = layout.shared_ring
    out: dict[int, list[tuple[int, bool]]] = {}
    for rid, ring in rings.items():
        head_v = read_counter(mem, ring.head_offset, ring.byteorder)
        tail_v = read_counter(mem, ring.tail_offset, ring.byteorder)
        # The counter format is a session's (docs/kbtp.md §4.3): either may be stored.
        head: int | None = None
        live = 0
        for fmt in CounterFormat:
            h, t = (counter_ticket(v, ring.order, fmt) for v in (head_v, tail_v))
            if h is not None and t is not None:
                head, live = h, ticket_distance(t, h)
        found = []
        for s in range(ring.slots):
            slot = read_slot(mem, ring.slots_offset + s * SLOT_LEN)
            if slot.consumed:
                continue
            taken = head is not None and ticket_distance(slot.sequence, head) >= live
            found.append((slot.block_offset, taken))
        out[rid] = found
    return out


# ======================================================================================
# deciding
# ======================================================================================


def _index(layout: TargetLayout, block_offset: int, stored_base: int) -> int | None:
    """The block index ``block_offset`` names in a layout whose byte 0 was ``stored_base``."""
    rel = block_offset - stored_base - layout.pool_offset
    if rel < 0 or rel % layout.block_size or rel // layout.block_size >= layout.pool_blocks:
        return None
    return rel // layout.block_size


def _released(entry: TableEntry) -> TableEntry:
    """The entry unbound: Flags 0, the next Generation, no block (as a FREE would, §6.4)."""
    generation = next_generation(entry.generation) if entry.generation else INITIAL_GENERATION
    return TableEntry(TableFlag.NONE, generation, 0, EMPTY_BLOCK_OFFSET)


def plan_recovery(
    config: TargetConfig,
    layout: TargetLayout,
    entries: list[TableEntry],
    stored_base: int,
    rings: dict[int, list[tuple[int, bool]]] | None,
) -> RecoveryPlan:
    """Decide what a restarted target serves (docs/kbtp.md §12.3); changes nothing.

    ``entries``: the table as stored, its Block Offsets Tagged Offsets of a layout whose
    byte 0 was ``stored_base``; ``rings``: :func:`read_ring_blocks` of the same memory, or
    None when the rings cannot be trusted (an interrupted recovery: every block not bound
    is free, nothing is counted as reclaimed).  The plan's entries name blocks by byte
    offset (base 0).
    """
    report = RecoveryReport(checked=rings is not None)
    domains = ring_domains(config, layout)
    spans = sorted(
        ((base, end, d) for d in domains for base, end in d.handles if end > base),
        key=lambda span: span[0],
    )
    starts = [base for base, _, _ in spans]

    def domain_of(handle: int) -> RingDomain | None:
        at = bisect_right(starts, handle) - 1
        return spans[at][2] if at >= 0 and handle < spans[at][1] else None

    out = list(entries)
    claims: dict[int, list[int]] = {}
    released: set[int] = set()
    for i, entry in enumerate(entries):
        handle = layout.table_base_handle + i
        flags = int(entry.flags)
        if not flags & TableFlag.VALID:
            if flags or entry.generation == 0:
                report.bad_entries += 1  # SEALED or unknown bits without VALID, Generation 0
                out[i] = _released(entry)
            else:
                out[i] = TableEntry(TableFlag.NONE, entry.generation, 0, EMPTY_BLOCK_OFFSET)
            continue
        index = _index(layout, entry.block_offset, stored_base)
        domain = domain_of(handle)
        if (
            flags & ~_KNOWN_FLAGS
            or entry.generation == 0
            or domain is None
            or index is None
            or not domain.has_block(index)
            or entry.data_length > layout.block_size
        ):
            report.bad_entries += 1
            out[i] = _released(entry)
            if index is not None:
                released.add(index)
            continue
        if not flags & TableFlag.SEALED:
            report.unsealed += 1
            out[i] = _released(entry)
            released.add(index)
            continue
        claims.setdefault(index, []).append(i)
    bound: set[int] = set()
    for index, holders in claims.items():
        if len(holders) == 1:
            bound.add(index)
            i = holders[0]
            e = entries[i]
            rel = layout.block_byte_offset(index)
            out[i] = TableEntry(e.flags, e.generation, e.data_length, rel)
            continue
        report.bound_twice += len(holders)  # which one holds the data is unknowable
        for i in holders:
            out[i] = _released(entries[i])
        released.add(index)
    report.sealed = len(bound)

    free: dict[int, list[int]] = {}
    for d in domains:
        blocks = range(d.first, d.first + d.count)
        free[d.ring] = [b for b in blocks if b not in bound]
        if rings is None:
            continue
        seen: Counter[int] = Counter()
        taken: set[int] = set()
        for offset, was_taken in rings.get(d.ring, []):
            index = _index(layout, offset, stored_base)
            if index is None or not d.has_block(index):
                report.stray_slots += 1
                continue
            seen[index] += 1
            if was_taken:
                taken.add(index)
        for b in blocks:
            if b in bound:
                report.free_and_bound += 1 if seen[b] else 0
                report.duplicate_free += max(seen[b] - 1, 0)
                continue
            report.duplicate_free += max(seen[b] - 1, 0)
            if b in released:
                continue
            if seen[b] == 0 or b in taken:
                report.reclaimed += 1
    report.free = sum(len(v) for v in free.values())
    return RecoveryPlan(out, free, report)


# ======================================================================================
# writing
# ======================================================================================


def apply_recovery(mem: memoryview, layout: TargetLayout, plan: RecoveryPlan) -> None:
    """Write the plan: the table with Block Offsets for ``layout.base_to``, then every ring
    initialized with its free blocks (draft §3.3 initialization: Head and Tail reset)."""
    for i, entry in enumerate(plan.entries):
        at = layout.table_offset + i * TABLE_ENTRY_LEN
        offset = entry.block_offset
        if offset != EMPTY_BLOCK_OFFSET:
            offset = layout.to(offset)
        write_entry(mem, at, TableEntry(entry.flags, entry.generation, entry.data_length, offset))
    rings = {p: part.ring for p, part in enumerate(layout.partitions)}
    if layout.shared_ring is not None:
        rings[SHARED_RING] = layout.shared_ring
    for rid, geometry in rings.items():
        init_ring(mem, geometry, [layout.block_to(b) for b in plan.free.get(rid, [])])


def check_pool(mem: memoryview, config: TargetConfig, layout: TargetLayout) -> RecoveryReport:
    """Check a pool in place (its Block Offsets for ``layout.base_to``): what a recovery
    would find.  A consistent pool with no ticket in flight reports nothing repaired,
    nothing reclaimed, ``free`` = F - ``sealed``."""
    rings = read_ring_blocks(mem, layout)
    return plan_recovery(config, layout, read_table(mem, layout), layout.base_to, rings).report
