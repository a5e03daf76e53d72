"""A target no tenant can escape or kill, over real loopback TCP (docs/kbtp.md §3.6, §9).

What a hostile initiator's RNIC operations reach (the slots are read-only, only the Head is
atomic), and the binding's last resort: an exception in the target core ends that session
only, with a Terminate and a log line, never the process or another tenant's session.
"""

from __future__ import annotations

import logging

import pytest
import trio

from kbtp.constants import RING_ADD_DATA, TableFlag, ring_add_mask
from kbtp.initiator import SessionClosed
from kbtp.initiator_core import CompareSwapOp, FetchAddOp, ReadOp
from kbtp.layout import TableEntry, write_entry
from stack.constants import TERM_RDMAP_OP_UNSPECIFIED
from tests.kbtp.test_binding_ops import connect, data, serving, snapshot


async def test_s3_6_no_atomic_of_the_initiator_reaches_a_slot() -> None:
    """A Compare and Swap on a slot's Block Offset through the Ring STag is refused by the
    target's RNIC (the Ring STag is remote read only): Terminate, the slot is untouched."""
    with trio.fail_after(30):
        async with serving() as target, connect(target, "a") as a, connect(target, "c") as c:
            victim = (await a.alloc_store(1, data(1, 100), seal=True)).block_offset
            ack = c.ack
            assert ack is not None
            alloc = await c.reserve(data(2, 100))
            before = snapshot(target)
            word = ack.ring_offset + alloc.slot_offset + 8  # the slot's Block Offset
            with pytest.raises(SessionClosed, match="remote access error"):
                await c.one_sided(CompareSwapOp(ack.ring_stag, word, alloc.block_offset, victim))
            assert snapshot(target) == before
            assert await a.load(1) == data(1, 100)


@pytest.mark.parametrize("probe", ["FetchAdd through the Ring STag", "Read of the Head"])
async def test_s3_6_the_ring_stag_is_read_only_and_the_head_stag_atomic_only(
    probe: str,
) -> None:
    with trio.fail_after(30):
        async with serving() as target, connect(target, "c") as c:
            ack = c.ack
            assert ack is not None
            if probe.startswith("FetchAdd"):
                mask = ring_add_mask(ack.ring_order)
                op: FetchAddOp | ReadOp = FetchAddOp(
                    ack.ring_stag, ack.ring_offset, RING_ADD_DATA, mask
                )
            else:
                op = ReadOp(ack.head_stag, ack.head_offset, 8)
            with pytest.raises(SessionClosed, match="remote access error"):
                await c.one_sided(op)
            assert target.core.ring_of(b"c").head() == (0, 0)


async def test_s9_3_an_exception_in_the_core_ends_that_session_only(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The binding's last resort: a table entry the target itself corrupted (a block
    outside the pool) makes the core raise on FREE; that session is Terminated and logged,
    the other session and the target go on."""
    with trio.fail_after(30):
        async with serving() as target, connect(target, "a") as a, connect(target, "b") as b:
            await a.alloc_store(1, b"one", seal=True)
            await b.alloc_store(64, data(3, 2000), seal=True)
            core = target.core
            bogus = TableEntry(TableFlag.VALID, 7, 3, core.layout.to(core.layout.size))
            write_entry(core.memory, core.layout.entry_offset(2), bogus)
            with caplog.at_level(logging.ERROR, logger="kbtp.target"):
                with pytest.raises(SessionClosed):
                    await a.free(2)
            assert a.conn is not None
            await a.conn.wait_closed()
            term = a.qp.peer_terminate
            assert term is not None and term.cause == TERM_RDMAP_OP_UNSPECIFIED
            assert any("the target core failed" in r.getMessage() for r in caplog.records)
            assert any(r.exc_info for r in caplog.records)
            # b never noticed; a new session of a is served.
            assert await b.load(64) == data(3, 2000)
            while any(s.identity == b"a" for s in target.sessions.values()):
                await trio.sleep(0.01)
            async with connect(target, "a") as again:
                assert await again.load(1) == b"one"
