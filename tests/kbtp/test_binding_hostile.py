"""A target no tenant can escape or kill, over real loopback TCP (docs/kbtp.md §3.6, §9).

What a hostile initiator's RNIC operations reach (the slots are read-only, only the Head is
atomic), and the binding's last resort: an exception in the target core ends that session
only, with a Terminate and a log line, never the process or another tenant's session.
"""

from __future__ import annotations

import logging

import pytest
import trio

from kbtp.constants import RING_ADD_DATA, MessageOpcode, Status, TableFlag, ring_add_mask
from kbtp.initiator import KbtpInitiator
from kbtp.initiator_core import CompareSwapOp, FetchAddOp, ReadOp
from kbtp.initiator_errors import HelloRefused, SessionClosed
from kbtp.layout import TableEntry, write_entry
from kbtp.messages import AllocStore, DataDescriptor, Free, Load, Store
from stack.constants import TERM_RDMAP_OP_UNSPECIFIED
from stack.rnic import Access, QpState, Rnic
from stack.transport.cm import ConnectionManager
from stack.wire.events import MpaSettings
from tests.kbtp.test_binding_ops import connect, data, serving, snapshot

pytestmark = pytest.mark.both_targets  # docs/kbtp.md §8.1: the initiator cannot tell


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


@pytest.mark.parametrize("burst", [17, 64])
async def test_s9_2_a_burst_beyond_the_credits_is_answered_credit_exceeded(burst: int) -> None:
    """16 credits and a burst of 17 or 64 requests sent at once (raw, bypassing the
    initiator's own accounting): an ALLOC_STORE whose data the target must RDMA-read, then
    FREEs of the same handle queued behind it.  Every request is received (credits + a
    margin of receives), the 17th is answered CREDIT_EXCEEDED with its Handle and Opcode,
    and the stream ends with the RDMAP Terminate of docs/kbtp.md §9.3, never DDP's "no
    buffer" (1/2/0x02)."""
    with trio.fail_after(30):
        async with serving(request_credits=16) as target, connect(target, "a") as a:
            source = a.pd.reg_mr(bytearray(data(4, 3000)), Access.REMOTE_READ)
            first = AllocStore(10_000, 5, DataDescriptor(source.rkey, source.base, 3000))
            rest = [Free(10_000 + k, 5 + k % 2) for k in range(1, burst)]
            batch: list[AllocStore | Free] = [first, *rest]
            messages = [(m.encode(), m.request_id) for m in batch]
            answers = await a.send_raw_burst(messages)
            over = answers[16]
            assert over is not None and over.status == Status.CREDIT_EXCEEDED
            assert (over.request_id, over.handle) == (rest[15].request_id, rest[15].handle)
            assert over.request_opcode == MessageOpcode.FREE
            assert all(answer is None for answer in answers[17:])
            assert a.conn is not None
            await a.conn.wait_closed()
            term = a.qp.peer_terminate
            assert term is not None and term.layer == 0  # RDMAP, not DDP
            assert term.cause == TERM_RDMAP_OP_UNSPECIFIED
            while target.sessions:
                await trio.sleep(0.01)
            assert target.core.usage(b"a") == 0 and target.core.pending_ops() == 0


@pytest.mark.parametrize("opcode", [MessageOpcode.LOAD, MessageOpcode.STORE])
async def test_s9_2_credits_plus_one_requests_the_chains_could_answer_get_the_same_statuses(
    opcode: MessageOpcode,
) -> None:
    """4 credits and 5 LOADs of sealed blocks, or 5 mapped STOREs into bound ones, sent at
    once: on the offloaded target the chains take the first 4 and the 5th falls back as
    over the credits (docs/kbtp.md §8.1), so neither target answers the 5th but with
    CREDIT_EXCEEDED (its Request ID, Handle and Opcode), and both close the session for it."""
    with trio.fail_after(30):
        async with serving() as target, connect(target, "a") as a:
            for handle in range(5):
                await a.alloc_store(handle, data(handle, 3000), seal=opcode is MessageOpcode.LOAD)
            mr = a.pd.reg_mr(bytearray(data(9, 3000)), Access.LOCAL_WRITE | Access.REMOTE_READ
                             | Access.REMOTE_WRITE)  # fmt: skip
            desc = DataDescriptor(mr.rkey, mr.base, 3000)
            kind = Load if opcode is MessageOpcode.LOAD else Store
            burst = [kind(20_000 + h, h, desc) for h in range(5)]
            (session,) = target.sessions.values()
            answers = await a.send_raw_burst([(m.encode(), m.request_id) for m in burst])
            got = [None if c is None else (c.request_id, c.handle, c.status) for c in answers]
            # What each target answers before the session ends depends on timing (an
            # answer in flight when the Terminate comes is lost): never more than this.
            for h, answer in enumerate(got[:4]):
                assert answer in (None, (20_000 + h, h, Status.SUCCESS)), got
            assert got[4] in (None, (20_004, 4, Status.CREDIT_EXCEEDED)), got
            assert answers[4] is None or answers[4].request_opcode == opcode
            assert a.conn is not None
            await a.conn.wait_closed()
            while target.sessions:
                await trio.sleep(0.01)
            assert session.reason.startswith("closed by the target: CREDIT_EXCEEDED"), (
                session.reason
            )


async def test_s9_2_many_requests_in_flight_within_the_credits_never_exceed_them() -> None:
    """Under load (16 credits, 240 requests from 48 tasks, answers freeing credits while
    requests arrive), an initiator that keeps to its credits never sees CREDIT_EXCEEDED."""
    with trio.fail_after(60):
        async with serving(request_credits=16, pool_blocks=24) as target:
            async with connect(target, "a") as a, connect(target, "b") as b:

                async def worker(ini: object, base: int, k: int) -> None:
                    assert isinstance(ini, KbtpInitiator)
                    handle = base + k % 8
                    for round_ in range(5):
                        payload = data(k + round_, 100 + 37 * k)
                        await ini.alloc_store(handle, payload, seal=True, check=False)
                        buffer = bytearray(ini.block_size)
                        await ini.load_into(handle, buffer, allow_unsealed=True, check=False)
                        await ini.free(handle, check=False)

                async with trio.open_nursery() as nursery:
                    for k in range(24):
                        nursery.start_soon(worker, a, 0, k)
                        nursery.start_soon(worker, b, 64, k)
            for ini in (a, b):
                statuses = {st for (_, st) in ini.stats}
                assert "CREDIT_EXCEEDED" not in statuses and "SESSION_CLOSED" not in statuses
            assert target.core.usage(b"a") == target.core.usage(b"b") == 0


async def test_s4_2_a_connection_that_never_says_hello_is_closed_at_the_deadline() -> None:
    """MPA completes, then silence: the target closes the stream at the HELLO deadline and
    releases its QP, CQ and receive buffers."""
    with trio.fail_after(30):
        async with serving(hello_timeout=0.3) as target:
            rnic = Rnic("silent")
            pd = rnic.alloc_pd()
            qp = rnic.create_qp(pd, rnic.create_cq(16))
            async with ConnectionManager.open(rnic) as cm:
                conn = await cm.connect("127.0.0.1", target.port, qp, settings=MpaSettings())
                with trio.fail_after(5):
                    await conn.wait_closed()  # closed by the target, not by us
            assert qp.state is QpState.ERROR
            while target.sessions:
                await trio.sleep(0.01)
            async with connect(target, "a") as a:  # the target serves on
                assert (await a.alloc_store(1, b"fine")).ok


async def test_s4_2_a_squatter_holds_an_identity_only_until_it_falls_silent() -> None:
    """One session per identity (SESSION_EXISTS for a second one while the first lives);
    a session that says nothing for the idle timeout is closed, and the identity is free."""
    with trio.fail_after(30):
        async with serving(idle_timeout=0.5) as target:
            async with connect(target, "a") as squatter:
                with pytest.raises(HelloRefused) as info:
                    async with connect(target, "a"):
                        pass
                assert info.value.status is Status.SESSION_EXISTS
                assert squatter.conn is not None
                await squatter.conn.wait_closed()
                assert squatter.qp.peer_terminate is not None
            while target.sessions:
                await trio.sleep(0.01)
            async with connect(target, "a") as real:
                assert (await real.alloc_store(1, b"mine")).ok
