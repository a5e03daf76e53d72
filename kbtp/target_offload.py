"""Target-executed LOAD on the software RNIC's chains (docs/kbtp.md §8).

:func:`load_chain` builds the chain a session pre-posts once its HELLO is accepted: it
waits for each received request (``WaitRecv``), checks in the RNIC what draft §6.1 and
docs/kbtp.md §5.1 require of a LOAD that can be answered SUCCESS (length, Version, opcode,
flags, Status, the handle served, Generation, entry VALID and SEALED, Data Length within
the descriptor and not zero), then RDMA-writes the block named by the table entry to the
Data Descriptor and sends the COMPLETION (a Send with Invalidate of the descriptor's STag
with INVALIDATE), every address patched at execution time from the request and the entry
(stack.rnic.chains).  It is ``rearm``: the RNIC re-posts the receive and the chain after
each request, so the target application is called for no LOAD it answers.

Anything else falls back: the receive completes to the application, the core processes the
message as it would without offload (every other opcode, every error status, RECORD,
ALLOW_UNSEALED, an empty block), and the binding ENABLEs the chain queue again when the
core has taken the message (:func:`resume`).  Why that keeps §6.0's order: the chain runs
only on a VALID and SEALED entry, and no operation of the core changes such an entry except
FREE, which does so before it returns; a STORE, ALLOC_STORE or BIND in progress leaves its
entry unsealed or not VALID until it is over, so a LOAD behind it falls back and queues.
"""

from __future__ import annotations

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
from stack.constants import ALL_ONES_64
from stack.rnic import (
    Branch,
    Chain,
    Cmp,
    Guard,
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

__all__ = ["LOAD_CHAIN_WR_ID", "OFFLOADED_OPCODES", "arm", "chain_runs", "load_chain"]

LOAD_CHAIN_WR_ID = (1 << 64) - 2
"""wr_id of the LOAD chain (apart from the driver's op ids and markers)."""

OFFLOADED_OPCODES = frozenset({MessageOpcode.LOAD})
"""Requests the RNIC answers without the target application (docs/kbtp.md §8)."""

_ENTRY_FLAGS = (0, 2)  # docs/kbtp.md §3.2: octet offset and size of each entry field
_ENTRY_GENERATION = (2, 2)
_ENTRY_DATA_LENGTH = (4, 4)
_ENTRY_BLOCK_OFFSET = (8, 8)
_LOAD_LEN = COMMON_HEADER_LEN + DATA_DESCRIPTOR_LEN
_READY = int(TableFlag.VALID | TableFlag.SEALED)


def _field(part: Part, name: str, base: int = 0) -> tuple[int, int]:
    """(octet offset, size) of ``name`` in ``part`` placed at ``base``."""
    f = next(f for f in part.fields if f.name == name)
    return base + f.offset, f.size


def _req(part: Part, name: str, base: int = 0) -> Ref:
    return Ref.recv(*_field(part, name, base))


def load_chain(layout: TargetLayout, lkey: int) -> Chain:
    """The LOAD chain of a session whose target buffer is registered under ``lkey`` (table
    and pool at the layout's Tagged Offsets)."""
    handle = _req(HEADER, "handle")
    first = layout.to(layout.table_offset) - TABLE_ENTRY_LEN * layout.table_base_handle

    def entry(at: tuple[int, int]) -> Ref:
        addr = (first + at[0]) & ALL_ONES_64
        return Ref(lkey, addr, at[1], index=handle, scale=TABLE_ENTRY_LEN)

    stag = _req(DATA_DESCRIPTOR, "stag", COMMON_HEADER_LEN)
    guards = (
        Guard(Ref.recv_len(), Cmp.EQ, _LOAD_LEN),
        Guard(_req(HEADER, "version"), Cmp.EQ, KBTP_VERSION),
        Guard(_req(HEADER, "opcode"), Cmp.EQ, MessageOpcode.LOAD),
        Guard(_req(HEADER, "status"), Cmp.EQ, 0),
        Guard(handle, Cmp.GE, layout.table_base_handle),
        Guard(handle, Cmp.LT, layout.table_base_handle + layout.table_entries),
        Guard(_req(HEADER, "generation"), Cmp.ZERO_OR_EQ, entry(_ENTRY_GENERATION)),
        Guard(entry(_ENTRY_FLAGS), Cmp.EQ, _READY, mask=_READY),
        Guard(entry(_ENTRY_DATA_LENGTH), Cmp.NE, 0),
        Guard(
            entry(_ENTRY_DATA_LENGTH),
            Cmp.LE,
            _req(DATA_DESCRIPTOR, "length", COMMON_HEADER_LEN),
        ),
    )
    write = SendWR(0, WrOpcode.RDMA_WRITE, (Sge(0, 0, lkey),), SendFlags.NONE)
    template = Completion(0, 0, 0, Status.SUCCESS, 0, 0, MessageOpcode.LOAD).encode()
    completion_at = COMMON_HEADER_LEN
    patches = (
        Patch(0, PatchField.SGE_ADDR, entry(_ENTRY_BLOCK_OFFSET)),
        Patch(0, PatchField.SGE_LENGTH, entry(_ENTRY_DATA_LENGTH)),
        Patch(0, PatchField.RKEY, stag),
        Patch(0, PatchField.REMOTE_ADDR, _req(DATA_DESCRIPTOR, "to", COMMON_HEADER_LEN)),
        Patch(
            1, PatchField.PAYLOAD, _req(HEADER, "request_id"), at=_field(HEADER, "request_id")[0]
        ),
        Patch(1, PatchField.PAYLOAD, handle, at=_field(HEADER, "handle")[0]),
        Patch(
            1,
            PatchField.PAYLOAD,
            entry(_ENTRY_GENERATION),
            at=_field(HEADER, "generation")[0],
        ),
        Patch(
            1,
            PatchField.PAYLOAD,
            entry(_ENTRY_DATA_LENGTH),
            at=_field(COMPLETION_BODY, "data_length", completion_at)[0],
        ),
        Patch(
            1,
            PatchField.PAYLOAD,
            entry(_ENTRY_BLOCK_OFFSET),
            at=_field(COMPLETION_BODY, "block_offset", completion_at)[0],
        ),
    )
    flags = _req(HEADER, "flags")
    plain = SendWR(0, WrOpcode.SEND, inline_data=template, send_flags=SendFlags.NONE)
    invalidating = SendWR(
        0, WrOpcode.SEND_WITH_INV, inline_data=template, send_flags=SendFlags.NONE
    )
    return Chain(
        LOAD_CHAIN_WR_ID,
        WaitRecv(),
        (
            Branch((write, plain), patches, (*guards, Guard(flags, Cmp.EQ, 0))),
            Branch(
                (write, invalidating),
                (*patches, Patch(1, PatchField.INVALIDATE_RKEY, stag)),
                (*guards, Guard(flags, Cmp.EQ, RequestFlag.INVALIDATE)),
            ),
        ),
        rearm=True,
    )


def arm(qp: QueuePair, layout: TargetLayout, lkey: int, armed: bool) -> bool:
    """After the application has taken a message: post the LOAD chain if the session is
    past HELLO and has none yet (``armed``), else ENABLE the chain queue again (the message
    fell back).  Returns whether the chain is posted."""
    if armed:
        qp.enable_chains()
        return True
    qp.post_chain(load_chain(layout, lkey))
    return True


def chain_runs(qp: QueuePair) -> int:
    """Requests the RNIC answered on ``qp`` without the application."""
    return 0 if qp.chains is None else qp.chains.runs
