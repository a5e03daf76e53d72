"""Target-executed LOAD and mapped STORE on the software RNIC's chains (docs/kbtp.md §8.1).

:func:`session_chain` builds the chain a session pre-posts once its HELLO is accepted: it
waits for each received request (``WaitRecv``) and checks in the RNIC what draft §6.1
and docs/kbtp.md §5.1 require of a LOAD that can be answered SUCCESS (length, Version,
opcode, flags, Status, the handle served, Generation, entry VALID and SEALED, Data Length
within the descriptor and not zero), then RDMA-writes the block named by the table entry
to the Data Descriptor and sends the COMPLETION (a Send with Invalidate of the
descriptor's STag with INVALIDATE), every address patched at execution time from the
request and the entry (stack.rnic.chains); likewise mapped STORE (:func:`store_branches`)
and, on a DIRECT_ALLOC partition, ALLOC_STORE and FREE (kbtp.target_offload_alloc).  It
is ``rearm`` and keyed by the request's Handle: the RNIC re-posts the receive and the
chain, and requests of other handles overlap (§6.0), so the target application is called
for no request it answers.

Anything else falls back: the receive completes to the application, the core processes the
message as it would without offload (every other opcode, every error status, RECORD,
ALLOW_UNSEALED, an empty block), and the binding ENABLEs the chain queue again when the
core has taken the message (:func:`arm`).  Why that keeps §6.0's order: the chain runs
only on a VALID and SEALED entry, and no operation of the core changes such an entry except
FREE, which does so before it returns; a STORE, ALLOC_STORE or BIND in progress leaves its
entry unsealed or not VALID until it is over, so a LOAD behind it falls back and queues.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING

from kbtp.constants import (
    COMMON_HEADER_LEN,
    DATA_DESCRIPTOR_LEN,
    KBTP_VERSION,
    TABLE_ENTRY_LEN,
    MessageOpcode,
    RequestFlag,
    Status,
    TableFlag,
)
from kbtp.formats import COMPLETION_BODY, DATA_DESCRIPTOR, HEADER, Part
from kbtp.layout import TargetLayout
from kbtp.messages import Completion
from kbtp.target_config import InitiatorConfig
from stack.constants import ALL_ONES_64
from stack.rnic import (
    Branch,
    Chain,
    ChainItem,
    Cmp,
    Guard,
    LocalWrite,
    MemoryRegion,
    Patch,
    PatchField,
    QueuePair,
    Ref,
    SendFlags,
    SendWR,
    Sge,
    WaitRecv,
    WrOpcode,
)

if TYPE_CHECKING:
    from kbtp.target_offload_credits import CreditCount

__all__ = [
    "OFFLOADED_OPCODES",
    "SESSION_CHAIN_WR_ID",
    "StoreMarks",
    "arm",
    "chain_runs",
    "load_branches",
    "session_chain",
    "store_branches",
    "unsealed_load_handle",
]

SESSION_CHAIN_WR_ID = (1 << 64) - 2
"""wr_id of a session's chain (apart from the driver's op ids and markers)."""

OFFLOADED_OPCODES = frozenset(
    {MessageOpcode.LOAD, MessageOpcode.STORE, MessageOpcode.ALLOC_STORE, MessageOpcode.FREE}
)
"""Requests the RNIC may answer without the target application (docs/kbtp.md §8.1;
ALLOC_STORE and FREE on a DIRECT_ALLOC partition only)."""

ENTRY_FLAGS = (0, 2)  # docs/kbtp.md §3.2: octet offset and size of each entry field
ENTRY_GENERATION = (2, 2)
ENTRY_DATA_LENGTH = (4, 4)
ENTRY_BLOCK_OFFSET = (8, 8)
_REQUEST_LEN = COMMON_HEADER_LEN + DATA_DESCRIPTOR_LEN  # LOAD, STORE without RECORD
_READY = int(TableFlag.VALID | TableFlag.SEALED)


def _field(part: Part, name: str, base: int = 0) -> tuple[int, int]:
    """(octet offset, size) of ``name`` in ``part`` placed at ``base``."""
    f = next(f for f in part.fields if f.name == name)
    return base + f.offset, f.size


def _req(part: Part, name: str, base: int = 0) -> Ref:
    return Ref.recv(*_field(part, name, base))


_OPCODE = _field(HEADER, "opcode")[0]
_FLAGS = _field(HEADER, "flags")
_HANDLE = _field(HEADER, "handle")


class Request:
    """Refs into the received request and its table entry, and the COMPLETION template."""

    def __init__(self, layout: TargetLayout, lkey: int) -> None:
        self.handle = _req(HEADER, "handle")
        self.stag = _req(DATA_DESCRIPTOR, "stag", COMMON_HEADER_LEN)
        self.to = _req(DATA_DESCRIPTOR, "to", COMMON_HEADER_LEN)
        self.length = _req(DATA_DESCRIPTOR, "length", COMMON_HEADER_LEN)
        self.flags = _req(HEADER, "flags")
        self.lkey = lkey
        self.first = layout.to(layout.table_offset) - TABLE_ENTRY_LEN * layout.table_base_handle

    def entry(self, at: tuple[int, int]) -> Ref:
        """A field of the entry of the request's Handle (docs/kbtp.md §3.2)."""
        addr = (self.first + at[0]) & ALL_ONES_64
        return Ref(self.lkey, addr, at[1], index=self.handle, scale=TABLE_ENTRY_LEN)

    def header(self, opcode: MessageOpcode, low: int, count: int) -> tuple[Guard, ...]:
        """A 40-octet request of ``opcode`` for a Handle in [low, low + count), Generation
        0 or the entry's (§5.1, §6.0)."""
        return (
            Guard(Ref.recv_len(), Cmp.EQ, _REQUEST_LEN),
            Guard(_req(HEADER, "version"), Cmp.EQ, KBTP_VERSION),
            Guard(_req(HEADER, "opcode"), Cmp.EQ, opcode),
            Guard(_req(HEADER, "status"), Cmp.EQ, 0),
            Guard(self.handle, Cmp.GE, low),
            Guard(self.handle, Cmp.LT, low + count),
            Guard(_req(HEADER, "generation"), Cmp.ZERO_OR_EQ, self.entry(ENTRY_GENERATION)),
        )

    def completion(self, opcode: MessageOpcode, data_length: Ref) -> tuple[SendWR, list[Patch]]:
        """The COMPLETION Send (WR index 0 of its patches) of a SUCCESS."""
        template = Completion(0, 0, 0, Status.SUCCESS, 0, 0, opcode).encode()
        send = SendWR(0, WrOpcode.SEND, inline_data=template, send_flags=SendFlags.NONE)
        body = COMMON_HEADER_LEN
        patches = [
            Patch(0, PatchField.PAYLOAD, _req(HEADER, "request_id"), at=_at(HEADER, "request_id")),
            Patch(0, PatchField.PAYLOAD, self.handle, at=_at(HEADER, "handle")),
            Patch(
                0,
                PatchField.PAYLOAD,
                self.entry(ENTRY_GENERATION),
                at=_at(HEADER, "generation"),
            ),
            Patch(
                0,
                PatchField.PAYLOAD,
                data_length,
                at=_at(COMPLETION_BODY, "data_length", body),
            ),
            Patch(
                0,
                PatchField.PAYLOAD,
                self.entry(ENTRY_BLOCK_OFFSET),
                at=_at(COMPLETION_BODY, "block_offset", body),
            ),
        ]
        return send, patches


def _at(part: Part, name: str, base: int = 0) -> int:
    return _field(part, name, base)[0]


def branches_of(
    items: tuple[ChainItem, ...],
    patches: list[Patch],
    guards: tuple[Guard, ...],
    req: Request,
    flags: RequestFlag,
) -> list[Branch]:
    """Two branches: flags exactly ``flags`` (COMPLETION by Send), and with INVALIDATE
    (by Send with Invalidate of the descriptor's STag, §6.0).  The COMPLETION is the last
    item; ``patches`` index ``items``."""
    last = len(items) - 1
    send = items[last]
    assert isinstance(send, SendWR)
    invalidating = dataclasses.replace(send, opcode=WrOpcode.SEND_WITH_INV)
    inv_patch = Patch(last, PatchField.INVALIDATE_RKEY, req.stag)
    return [
        Branch(items, tuple(patches), (*guards, Guard(req.flags, Cmp.EQ, flags))),
        Branch(
            (*items[:last], invalidating),
            (*patches, inv_patch),
            (*guards, Guard(req.flags, Cmp.EQ, flags | RequestFlag.INVALIDATE)),
        ),
    ]


def shifted(patches: list[Patch], by: int) -> list[Patch]:
    return [dataclasses.replace(p, wr=p.wr + by) for p in patches]


def load_branches(layout: TargetLayout, lkey: int) -> list[Branch]:
    """LOAD (§6.1) answered SUCCESS: RDMA Write of the block, then the COMPLETION."""
    req = Request(layout, lkey)
    length = req.entry(ENTRY_DATA_LENGTH)
    guards = (
        *req.header(MessageOpcode.LOAD, layout.table_base_handle, layout.table_entries),
        Guard(req.entry(ENTRY_FLAGS), Cmp.EQ, _READY, mask=_READY),
        Guard(length, Cmp.NE, 0),
        Guard(length, Cmp.LE, req.length),
    )
    write = SendWR(0, WrOpcode.RDMA_WRITE, (Sge(0, 0, lkey),), SendFlags.NONE)
    send, completion = req.completion(MessageOpcode.LOAD, length)
    patches = [
        Patch(0, PatchField.SGE_ADDR, req.entry(ENTRY_BLOCK_OFFSET)),
        Patch(0, PatchField.SGE_LENGTH, length),
        Patch(0, PatchField.RKEY, req.stag),
        Patch(0, PatchField.REMOTE_ADDR, req.to),
        *shifted(completion, 1),
    ]
    return branches_of((write, send), patches, guards, req, RequestFlag.NONE)


class StoreMarks:
    """One octet per handle of an initiator, in registered scratch memory: its offloaded
    mapped STORE sets it before the Read and clears it after the entry write, so the
    binding can hold an ALLOW_UNSEALED LOAD of another session behind it (§6.0)."""

    def __init__(self, mr: MemoryRegion, initiator: InitiatorConfig) -> None:
        if mr.length < initiator.handle_count:
            raise ValueError(f"store marks need {initiator.handle_count} octets")
        self.mr = mr
        self.handle_base = initiator.handle_base
        self.handle_count = initiator.handle_count

    def ref(self) -> Ref:
        """The mark of the request's Handle (in range: the STORE guards check it first)."""
        base = (self.mr.base - self.handle_base) & ALL_ONES_64
        return Ref(self.mr.lkey, base, 1, index=_req(HEADER, "handle"), scale=1)

    def busy(self, handle: int) -> bool:
        """An offloaded STORE of ``handle`` is between its Read and its entry write."""
        index = handle - self.handle_base
        if not 0 <= index < self.handle_count:
            return False
        return self.mr.view(self.mr.base + index, 1)[0] != 0


def unsealed_load_handle(message: bytes) -> int | None:
    """The Handle of a LOAD with ALLOW_UNSEALED (§6.1), else None: what must wait behind an
    offloaded STORE of the same handle from another session (§6.0)."""
    if len(message) < COMMON_HEADER_LEN or message[_OPCODE] != MessageOpcode.LOAD:
        return None
    flags = int.from_bytes(message[_FLAGS[0] : _FLAGS[0] + _FLAGS[1]], "big")
    if not flags & RequestFlag.ALLOW_UNSEALED:
        return None
    return int.from_bytes(message[_HANDLE[0] : _HANDLE[0] + _HANDLE[1]], "big")


def store_branches(
    layout: TargetLayout, lkey: int, initiator: InitiatorConfig, marks: StoreMarks | None = None
) -> list[Branch]:
    """Mapped STORE (§6.2) by RDMA Read answered SUCCESS: the Read into the block, then
    Data Length (and SEALED) in the entry, then the COMPLETION; with ``marks`` the handle's
    mark is set before the Read and cleared after the entry write."""
    req = Request(layout, lkey)
    guards = (
        *req.header(MessageOpcode.STORE, initiator.handle_base, initiator.handle_count),
        Guard(req.entry(ENTRY_FLAGS), Cmp.EQ, int(TableFlag.VALID)),
        Guard(req.length, Cmp.NE, 0),
        Guard(req.length, Cmp.LE, layout.block_size),
    )
    read = SendWR(0, WrOpcode.RDMA_READ, (Sge(0, 0, lkey),), SendFlags.NONE)
    read_patches = [
        Patch(0, PatchField.SGE_ADDR, req.entry(ENTRY_BLOCK_OFFSET)),
        Patch(0, PatchField.SGE_LENGTH, req.length),
        Patch(0, PatchField.RKEY, req.stag),
        Patch(0, PatchField.REMOTE_ADDR, req.to),
    ]
    record = LocalWrite(req.entry(ENTRY_DATA_LENGTH), req.length)
    seal = LocalWrite(req.entry(ENTRY_FLAGS), _READY.to_bytes(ENTRY_FLAGS[1], "big"))
    send, completion = req.completion(MessageOpcode.STORE, req.length)
    before: tuple[ChainItem, ...] = ()
    after: tuple[ChainItem, ...] = ()
    if marks is not None:
        before = (LocalWrite(marks.ref(), b"\x01"),)
        after = (LocalWrite(marks.ref(), b"\x00"),)
    first = len(before)
    out: list[Branch] = []
    for flag, steps in ((RequestFlag.NONE, (record,)), (RequestFlag.SEAL, (record, seal))):
        items = (*before, read, *steps, *after, send)
        patches = [*shifted(read_patches, first), *shifted(completion, len(items) - 1)]
        out += branches_of(items, patches, guards, req, flag)
    return out


def session_chain(
    layout: TargetLayout,
    lkey: int,
    initiator: InitiatorConfig | None,
    stores: bool,
    more: list[Branch] | None = None,
    credits: CreditCount | None = None,
    marks: StoreMarks | None = None,
) -> Chain:
    """The chain a session pre-posts once its HELLO is accepted: LOAD, and with ``stores``
    the initiator's mapped STOREs, then ``more`` (ALLOC_STORE, kbtp.target_offload_alloc);
    re-armed after every request.  With ``credits`` every branch runs only within the
    Request Credits (kbtp.target_offload_credits); with ``marks`` the STOREs mark their
    handle while their Read is in flight (:class:`StoreMarks`)."""
    branches = load_branches(layout, lkey)
    if stores and initiator is not None:
        branches += store_branches(layout, lkey, initiator, marks)
    branches += more or []
    if credits is not None:
        branches = [*map(credits.wrap, branches)]
    key = _req(HEADER, "handle")  # §6.0: one at a time per handle, others concurrently
    return Chain(SESSION_CHAIN_WR_ID, WaitRecv(), tuple(branches), rearm=True, key=key)


def arm(qp: QueuePair, chain: Callable[[], Chain], armed: bool) -> bool:
    """After the application has taken a message: post the session's chain if the session
    is past HELLO and has none yet (``armed``), else ENABLE the chain queue again (the
    message fell back).  Returns whether the chain is posted."""
    if armed:
        qp.enable_chains()
    else:
        qp.post_chain(chain())
    return True


def chain_runs(qp: QueuePair) -> int:
    """Requests the RNIC answered on ``qp`` without the application."""
    return 0 if qp.chains is None else qp.chains.runs
