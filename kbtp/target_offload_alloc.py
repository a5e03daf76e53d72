"""Target-executed ALLOC_STORE on a DIRECT_ALLOC partition ring (docs/kbtp.md §8.1).

:func:`alloc_store_branches` are the session chain's ALLOC_STORE branches (draft §6.3):
guards on the request and the entry as for STORE, plus the allocation's own: the slot of
the current Head holds its ticket and a block (§3.3), and the session's :class:`AllocLog`
has room.  Then, in the target's RNIC: the masked FetchAdd on Head (a ``LocalAtomic``),
a ``Check`` that the slot at Ring + (result & (16N - 1)) has Sequence = result >> 32, a
record (ticket, block, handle) in the log, the slot consumed (all ones to octets 8-15),
the RDMA Read of the data into the block, entry octets 4-15 then 0-3 (VALID, SEALED with
SEAL, the next Generation), the COMPLETION.

The budget rule: the log holds :data:`ALLOC_BUDGET` records; a full log fails the guard,
so the request falls back.  Before every core call for the session the binding hands the
records to the core (:meth:`AllocLog.take`, ``TargetCore.offloaded_allocations``), which
accounts them exactly as its own allocations (usage, bound blocks, the ring's tickets,
deferred frees) and so renews the budget.  Quotas need no reservation: a partition holds
quota-many blocks, so a slot that holds its ticket is a block within the quota (§3.4).
"""

from __future__ import annotations

import struct

from kbtp.constants import (
    COMMON_HEADER_LEN,
    GENERATION_MAX,
    CounterFormat,
    MessageOpcode,
    RequestFlag,
    TableFlag,
    counter_operands,
)
from kbtp.formats import COMPLETION_BODY
from kbtp.layout import PartitionLayout, RingGeometry, TargetLayout
from kbtp.ring import RingRecord
from kbtp.target_config import InitiatorConfig
from kbtp.target_core import TargetCore
from kbtp.target_offload import (
    ENTRY_BLOCK_OFFSET,
    ENTRY_DATA_LENGTH,
    ENTRY_FLAGS,
    ENTRY_GENERATION,
    Request,
    branches_of,
    shifted,
)
from stack.constants import ALL_ONES_64
from stack.rnic import (
    Branch,
    ChainItem,
    Check,
    Cmp,
    Guard,
    LocalAtomic,
    LocalWrite,
    MemoryRegion,
    Patch,
    PatchField,
    Ref,
    SendFlags,
    SendWR,
    Sge,
    WrOpcode,
)

__all__ = [
    "ALLOC_BUDGET",
    "AllocLog",
    "alloc_store_branches",
    "free_branches",
    "partition_ring",
]

ALLOC_BUDGET = 64
"""Offloaded ALLOC_STOREs a session's chain may run between two looks of the core."""

_RESULT = Ref.run(0)  # the run's own: the Head or Tail FetchAdd result (big-endian)
_INDEX = Ref.run(8)  # the run's own: the count FetchAdd result, its record's index
_COUNT = 8  # log octets: records written since the core's last look (little-endian, atomic)
_PENDING = 32  # the core's operations in flight (big-endian), published by the binding
_RECORDS = 64
_RECORD = struct.Struct(">QQQQ")  # ticket counter value | block offset | handle | kind
_DEFERRED = 24  # frees the core holds back (§3.3), published by the binding (big-endian)
_ALL_ONES = ALL_ONES_64.to_bytes(8, "big")
_ALLOCATED, _FREED = 0, 1


class AllocLog:
    """The registered scratch memory of one session's offloaded allocations."""

    SIZE = _RECORDS + _RECORD.size * ALLOC_BUDGET

    def __init__(self, mr: MemoryRegion) -> None:
        if mr.length < self.SIZE:
            raise ValueError(f"an allocation log needs {self.SIZE} octets")
        self.mr = mr

    def ref(self, at: int, width: int = 8, **kw: object) -> Ref:
        return Ref(self.mr.lkey, self.mr.base + at, width, **kw)  # type: ignore[arg-type]

    def record(self, at: int, width: int) -> Ref:
        """Octets ``at`` of this allocation's record."""
        return self.ref(_RECORDS + at, width, index=_INDEX, scale=_RECORD.size)

    def take(self) -> list[RingRecord]:
        """The records written since the last call, in the order the chain ran them; the
        log is empty again afterwards (the budget renewed)."""
        buf = self.mr.view(self.mr.base, self.SIZE)
        count = int.from_bytes(buf[_COUNT : _COUNT + 8], "little")
        out = []
        for i in range(min(count, ALLOC_BUDGET)):
            counter, block, handle, kind = _RECORD.unpack_from(buf, _RECORDS + i * _RECORD.size)
            out.append(RingRecord(kind == _FREED, counter >> 32, block, handle))
        buf[_COUNT : _COUNT + 8] = bytes(8)
        return out

    def publish(self, deferred: int, pending: int) -> None:
        """What the chain must know of the core: the frees of the ring waiting for their
        slot (§3.3; not 0: FREE falls back) and the core's operations in flight (not 0:
        ALLOC_STORE falls back, so it queues behind one of its handle, §6.0)."""
        buf = self.mr.view(self.mr.base, self.SIZE)
        buf[_DEFERRED : _DEFERRED + 8] = deferred.to_bytes(8, "big")
        buf[_PENDING : _PENDING + 8] = pending.to_bytes(8, "big")

    def items(self, ticket_of: Ref, block: Ref, handle: Ref, kind: int) -> list[ChainItem]:
        """The chain items that take a record and fill it in."""
        return [
            LocalAtomic(self.ref(_COUNT, 8, byteorder="little"), _INDEX, 1),
            LocalWrite(self.record(0, 8), ticket_of),
            LocalWrite(self.record(8, 8), block),
            LocalWrite(self.record(16, 8), handle),
            LocalWrite(self.record(24, 8), kind.to_bytes(8, "big")),
        ]

    def guards(self) -> tuple[Guard, ...]:
        """The budget: room for one more record."""
        return (Guard(self.ref(_COUNT, 8, byteorder="little"), Cmp.LT, ALLOC_BUDGET),)


def alloc_store_branches(
    layout: TargetLayout,
    lkey: int,
    initiator: InitiatorConfig,
    ring: RingGeometry,
    log: AllocLog,
) -> list[Branch]:
    """ALLOC_STORE (§6.3) by RDMA Read into a block of ``ring`` (masked counters)."""
    req = Request(layout, lkey)
    head_at = layout.to(ring.head_offset)
    slots_at = layout.to(ring.slots_offset)
    offset_bits = 16 * ring.slots - 1
    head_offset = Ref(lkey, head_at, 4, "little")  # the low half of a little-endian Head
    head_ticket = Ref(lkey, head_at + 4, 4, "little")
    result_offset = Ref.run(4, 4)

    def slot(at: int, width: int, index: Ref) -> Ref:
        return Ref(lkey, slots_at + at, width, index=index)

    guards = (
        *req.header(MessageOpcode.ALLOC_STORE, initiator.handle_base, initiator.handle_count),
        Guard(req.entry(ENTRY_FLAGS), Cmp.EQ, 0),
        Guard(req.entry(ENTRY_GENERATION), Cmp.LT, GENERATION_MAX),  # a wrap: software
        Guard(req.length, Cmp.NE, 0),
        Guard(req.length, Cmp.LE, layout.block_size),
        *log.guards(),
        Guard(log.ref(_PENDING), Cmp.EQ, 0),
        Guard(head_offset, Cmp.EQ, 0, mask=0xFFFF_FFFF & ~offset_bits),
        Guard(slot(0, 4, head_offset), Cmp.EQ, head_ticket),
        Guard(slot(8, 8, head_offset), Cmp.NE, ALL_ONES_64),
    )
    add, mask = counter_operands(CounterFormat.MASKED, ring.order)
    items_before: list[ChainItem] = [
        LocalAtomic(Ref(lkey, head_at, 8, "little"), _RESULT, add, mask),
        Check((Guard(slot(0, 4, result_offset), Cmp.EQ, Ref.run(0, 4)),)),
        *log.items(_RESULT, slot(8, 8, result_offset), req.handle, _ALLOCATED),
        LocalWrite(slot(8, 8, result_offset), _ALL_ONES),  # consumed (§3.3)
    ]
    block = log.record(8, 8)
    read = SendWR(0, WrOpcode.RDMA_READ, (Sge(0, 0, lkey),), SendFlags.NONE)
    n = len(items_before)
    patches = [
        Patch(n, PatchField.SGE_ADDR, block),
        Patch(n, PatchField.SGE_LENGTH, req.length),
        Patch(n, PatchField.RKEY, req.stag),
        Patch(n, PatchField.REMOTE_ADDR, req.to),
    ]
    entry_tail = [
        LocalWrite(req.entry(ENTRY_DATA_LENGTH), req.length),
        LocalWrite(req.entry(ENTRY_BLOCK_OFFSET), block),
    ]
    out: list[Branch] = []
    for flags in (RequestFlag.NONE, RequestFlag.SEAL):
        valid = TableFlag.VALID | (TableFlag.SEALED if flags else TableFlag.NONE)
        head = req.entry((ENTRY_FLAGS[0], 4))  # Flags | Generation, written last (§3.2)
        entry_head = LocalWrite(head, head, add=(int(valid) << 16) + 1)
        send, completion = req.completion(MessageOpcode.ALLOC_STORE, req.length)
        items = (*items_before, read, *entry_tail, entry_head, send)
        out += branches_of(
            items, [*patches, *shifted(completion, len(items) - 1)], guards, req, flags
        )
    return out


def partition_ring(core: TargetCore, initiator: InitiatorConfig | None) -> RingGeometry | None:
    """The ring of ``initiator``'s offloaded ALLOC_STOREs: its partition's, in the masked
    format.  None: they stay in software (the shared ring does not enforce a quota, §3.4;
    the unmasked format's slot address needs a modulo, §3.7, §8)."""
    if initiator is None or not initiator.direct_alloc:
        return None
    ring = core.ring_of(initiator.identity)
    return ring.geometry if ring.counter_format is CounterFormat.MASKED else None


def free_branches(
    layout: TargetLayout,
    lkey: int,
    initiator: InitiatorConfig,
    part: PartitionLayout,
    log: AllocLog,
) -> list[Branch]:
    """FREE (§6.4) of a block of the partition ``part``: entry octets 0-3 (Flags cleared,
    the next Generation), FetchAdd on Tail, the block into the slot at Ring + (result &
    (16N - 1)) (Block Offset, then Sequence, §3.3), the COMPLETION.  Only when the slot is
    consumed and the core holds back no free: otherwise §3.3 defers the write (software)."""
    req = Request(layout, lkey)
    ring = part.ring
    tail_at = layout.to(ring.tail_offset)
    slots_at = layout.to(ring.slots_offset)
    first, length = layout.partition_region(part)
    tail_offset = Ref(lkey, tail_at, 4, "little")
    result_offset = Ref.run(4, 4)
    block = req.entry(ENTRY_BLOCK_OFFSET)
    header = [
        g
        for g in req.header(MessageOpcode.FREE, initiator.handle_base, initiator.handle_count)
        if g.left != Ref.recv_len()
    ]
    guards = (
        Guard(Ref.recv_len(), Cmp.EQ, COMMON_HEADER_LEN),
        *header,
        Guard(req.flags, Cmp.EQ, RequestFlag.NONE),
        Guard(req.entry(ENTRY_GENERATION), Cmp.LT, GENERATION_MAX),
        Guard(block, Cmp.GE, layout.to(first)),
        Guard(block, Cmp.LT, layout.to(first + length)),
        *log.guards(),
        Guard(log.ref(_DEFERRED), Cmp.EQ, 0),
        Guard(tail_offset, Cmp.EQ, 0, mask=0xFFFF_FFFF & ~(16 * ring.slots - 1)),
        Guard(Ref(lkey, slots_at + 8, 8, index=tail_offset), Cmp.EQ, ALL_ONES_64),
    )
    add, mask = counter_operands(CounterFormat.MASKED, ring.order)
    send, completion = req.completion(MessageOpcode.FREE, req.handle)
    length_at = COMMON_HEADER_LEN + next(
        f.offset for f in COMPLETION_BODY.fields if f.name == "data_length"
    )
    completion = [p for p in completion if p.at != length_at]  # Data Length 0
    out = []
    for flags in (TableFlag.VALID, TableFlag.VALID | TableFlag.SEALED):
        head = req.entry((ENTRY_FLAGS[0], 4))  # Flags | Generation
        items: tuple[ChainItem, ...] = (
            LocalWrite(head, head, add=(1 << 32) - (int(flags) << 16) + 1),
            LocalAtomic(Ref(lkey, tail_at, 8, "little"), _RESULT, add, mask),
            *log.items(_RESULT, block, req.handle, _FREED),
            LocalWrite(Ref(lkey, slots_at + 8, 8, index=result_offset), block),
            LocalWrite(Ref(lkey, slots_at, 4, index=result_offset), Ref.run(0, 4)),
            send,
        )
        patches = shifted(completion, len(items) - 1)
        entry_flags = Guard(req.entry(ENTRY_FLAGS), Cmp.EQ, int(flags))
        out.append(Branch(items, tuple(patches), (*guards, entry_flags)))
    return out
