"""An initiator that does not trust a hostile target (docs/kbtp.md §4.2, §6.6).

Everything a target advertises in HELLO_ACK, every COMPLETION and every table entry or slot
a direct mode reads is checked before the initiator sizes a buffer, computes an address,
runs a FetchAdd or writes: a clear, fatal :class:`KbtpError` instead of a 4 GiB allocation
or a LocalError later.  And ``connect`` gives up when no HELLO_ACK comes.
"""

from __future__ import annotations

import dataclasses

import pytest
import trio

from kbtp.constants import Capability, MessageOpcode, Status, TableFlag, pack_counter
from kbtp.initiator import KbtpInitiator
from kbtp.initiator_core import (
    AllocState,
    DirectAlloc,
    DirectLoad,
    FetchAddOp,
    InitiatorCore,
    ReadOp,
    RequestCompleted,
    SessionReady,
)
from kbtp.initiator_errors import HelloTimeout
from kbtp.layout import Slot, TableEntry
from kbtp.messages import Completion, DataDescriptor, Free, HelloAck, KbtpError, Load
from stack.rnic import Access, RecvWR, Rnic, Sge
from stack.transport.cm import ConnectionManager

DIRECT = Capability.DIRECT_LOAD | Capability.DIRECT_ALLOC
BLOCK = 4096

GOOD = HelloAck(
    1,
    Status.SUCCESS,
    DIRECT,
    block_size=BLOCK,
    pool_blocks=64,
    quota=4,
    handle_base=0x100,
    handle_count=16,
    ticket_timeout_ms=1000,
    request_credits=8,
    ring_order=2,
    max_inline=512,
    table_stag=0x11,
    pool_stag=0x12,
    table_offset=0x10000,
    table_base_handle=0,
    pool_offset=0x20000,
    ring_stag=0x13,
    partition_stag=0x14,
    ring_offset=0x80000,
    head_offset=0x80040,
    partition_offset=0x20000,
    partition_length=4 * BLOCK,
    head_stag=0x15,
    table_entries=0x110,
)


def _ready(ack: HelloAck = GOOD, caps: Capability = DIRECT) -> InitiatorCore:
    ini = InitiatorCore(b"x", caps)
    ini.hello()
    [event] = ini.on_message(ack.encode())
    assert isinstance(event, SessionReady)
    return ini


def test_s4_2_a_sound_hello_ack_is_accepted() -> None:
    assert _ready().credits == 8


BAD = [
    ("ring order 0", {"ring_order": 0}, "Ring Order 0"),
    ("ring order 29", {"ring_order": 29}, "Ring Order 29"),
    ("ring smaller than the quota", {"ring_order": 1, "quota": 4}, "ring of 2 slots"),
    ("block size 0", {"block_size": 0}, "Block Size of 0"),
    ("block size 1 GiB", {"block_size": 1 << 30, "partition_length": 4 << 30}, "Block Size"),
    ("no credits", {"request_credits": 0}, "no Request Credits"),
    ("quota over the pool", {"quota": 65, "ring_order": 7}, "quota of 65"),
    ("partition length", {"partition_length": 5 * BLOCK}, "Partition Length"),
    ("misaligned head", {"head_offset": 0x80044}, "Head at"),
    ("ring past 64 bits", {"ring_offset": (1 << 64) - 32}, "ring slots"),
    ("partition past 64 bits", {"partition_offset": (1 << 64) - BLOCK}, "partition beyond"),
    ("table past 64 bits", {"table_offset": (1 << 64) - 64}, "block table"),
    ("table below the range", {"table_base_handle": 0x101}, "block table"),
    ("table shorter than the range", {"table_entries": 0x10F}, "block table"),
    ("no ticket timeout", {"ticket_timeout_ms": 0}, "Ticket Timeout"),
    ("record completion", {"capabilities": DIRECT | Capability.RECORD_COMPLETION}, "capab"),
]


@pytest.mark.parametrize(("name", "change", "says"), BAD, ids=[b[0] for b in BAD])
def test_s4_2_a_hello_ack_no_target_could_honour_is_refused(
    name: str, change: dict[str, object], says: str
) -> None:
    ini = InitiatorCore(b"x", DIRECT)
    ini.hello()
    with pytest.raises(KbtpError, match=says) as info:
        ini.on_message(dataclasses.replace(GOOD, **change).encode())  # type: ignore[arg-type]
    assert info.value.fatal and info.value.status is Status.MALFORMED
    assert ini.ack is None and ini.credits == 0


def test_s4_2_capabilities_not_asked_for_are_refused() -> None:
    ini = InitiatorCore(b"x", Capability.DIRECT_LOAD)
    ini.hello()
    with pytest.raises(KbtpError, match="capabilities"):
        ini.on_message(GOOD.encode())


def test_s4_2_unused_capabilities_fields_are_not_judged() -> None:
    """Without DIRECT_ALLOC a Ring Order of 0 means nothing (the field is zero)."""
    plain = dataclasses.replace(GOOD, capabilities=Capability.NONE, ring_order=0)
    assert _ready(plain, Capability.NONE).credits == 8


def test_s9_2_credits_are_capped_by_the_initiators_receives() -> None:
    ini = InitiatorCore(b"x", DIRECT, max_credits=3)
    ini.hello()
    ini.on_message(GOOD.encode())
    assert ini.request_credits == 3 and ini.credits == 3


def _submit_load(ini: InitiatorCore, length: int = BLOCK) -> int:
    rid = ini.submit(Load(0, 0x105, DataDescriptor(1, 0, length)))
    ini.outgoing()
    return rid


@pytest.mark.parametrize(
    "answer",
    ["data longer than the block", "data longer than the buffer", "other handle", "other op"],
)
def test_s5_8_a_completion_that_does_not_answer_its_request_is_refused(answer: str) -> None:
    ini = _ready()
    rid = _submit_load(ini, length=100)
    comp = Completion(rid, 0x105, 2, Status.SUCCESS, 50, 0x20000, MessageOpcode.LOAD)
    if answer == "data longer than the block":
        comp = dataclasses.replace(comp, data_length=BLOCK + 1)
    elif answer == "data longer than the buffer":
        comp = dataclasses.replace(comp, data_length=101)
    elif answer == "other handle":
        comp = dataclasses.replace(comp, handle=0x106)
    else:
        comp = dataclasses.replace(comp, request_opcode=MessageOpcode.FREE)
    with pytest.raises(KbtpError) as info:
        ini.on_message(comp.encode())
    assert info.value.fatal


def test_s5_8_an_error_completion_needs_no_data_length_check() -> None:
    ini = _ready()
    rid = ini.submit(Free(0, 0x105))
    ini.outgoing()
    comp = Completion(rid, 0x105, 2, Status.NOT_VALID, 0, request_opcode=MessageOpcode.FREE)
    [done] = ini.on_message(comp.encode())
    assert isinstance(done, RequestCompleted) and done.completion == comp


def test_s6_6_a_direct_load_never_reads_more_than_a_block() -> None:
    """A 16-octet entry claiming 4 GiB - 1 octets: refused before any read is sized."""
    load = DirectLoad(GOOD, 0x105)
    assert load.next_op() == ReadOp(0x11, GOOD.entry_to(0x105), 16)
    huge = TableEntry(TableFlag.VALID | TableFlag.SEALED, 2, 0xFFFFFFFF, 0x20000)
    with pytest.raises(KbtpError, match="Data Length 4294967295"):
        load.feed(huge.pack())


def test_s6_6_a_direct_alloc_checks_the_head_and_the_slot() -> None:
    alloc = DirectAlloc(GOOD, b"data")
    fetch = alloc.next_op()
    assert isinstance(fetch, FetchAddOp)
    assert fetch.stag == GOOD.head_stag
    with pytest.raises(KbtpError, match="no counter"):
        alloc.feed(pack_counter(1, 0x30))  # ticket 1 must be at slot offset 0x10
    alloc = DirectAlloc(GOOD, b"data")
    alloc.feed(pack_counter(1, 0x10))
    outside = Slot(1, 0x20000 + 4 * BLOCK).pack()  # past the partition
    alloc.feed(outside)
    with pytest.raises(KbtpError, match="no block of the partition"):
        alloc.feed(outside)
    assert alloc.state is not AllocState.WRITE
    alloc = DirectAlloc(GOOD, b"data")
    alloc.feed(pack_counter(1, 0x10))
    good = Slot(1, 0x20000 + BLOCK).pack()
    alloc.feed(good)
    alloc.feed(good)
    assert alloc.state is AllocState.WRITE


async def test_s4_2_connect_gives_up_when_no_hello_ack_comes() -> None:
    """A peer that completes MPA and never answers HELLO: HelloTimeout, not a hang."""
    rnic = Rnic("mute")
    pd = rnic.alloc_pd()
    with trio.fail_after(20):
        async with ConnectionManager.open(rnic) as cm:
            listener = await cm.listen("127.0.0.1", 0)
            async with trio.open_nursery() as nursery:

                async def mute() -> None:
                    async for request in listener:
                        qp = rnic.create_qp(pd, rnic.create_cq(16))
                        mr = pd.reg_mr(bytearray(512), Access.LOCAL_WRITE)
                        qp.post_recv(RecvWR(1, (Sge(mr.base, 512, mr.lkey),)))  # takes HELLO
                        await request.accept(qp)
                        await trio.sleep_forever()

                nursery.start_soon(mute)
                with pytest.raises(HelloTimeout, match="no HELLO_ACK within 0.3 s"):
                    async with KbtpInitiator.connect(
                        "127.0.0.1", listener.port, "x", hello_timeout=0.3
                    ):
                        pass
                nursery.cancel_scope.cancel()
