"""The direct modes of draft §6.6 over real loopback TCP, and the Ticket Timeout of §3.4/§6.7.

DIRECT_LOAD: entry, block, entry by RDMA Read through the Table and Pool STags, no target
processing.  DIRECT_ALLOC: masked FetchAdd on the partition Head through the target RNIC's
atomic engine (the same one the target's own FetchAdds use), slot reads, RDMA Write, BIND.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import trio

from kbtp.constants import RING_ADD_DATA, Status, ring_add_mask
from kbtp.initiator_core import FetchAddOp, ReadOp, WriteOp
from kbtp.initiator_errors import KbtpStatusError, SessionClosed
from kbtp.target_config import InitiatorConfig
from stack.constants import (
    TERM_DDP_T_STAG_NOT_ASSOCIATED,
    TERM_RDMAP_OP_UNSPECIFIED,
    TERM_RDMAP_STAG_NOT_ASSOCIATED,
)
from tests.kbtp.test_binding_ops import (
    BLOCK,
    A,
    B,
    C,
    connect,
    data,
    serving,
    snapshot,
)

pytestmark = pytest.mark.both_targets  # docs/kbtp.md §8.1: the initiator cannot tell


async def _until(predicate: Callable[[], object], timeout: float = 5.0) -> None:
    with trio.fail_after(timeout):
        while not predicate():
            await trio.sleep(0.01)


async def test_s6_6_direct_load_needs_no_target_processing() -> None:
    with trio.fail_after(30):
        async with serving() as target, connect(target, "a") as a, connect(target, "c") as c:
            await a.alloc_store(1, data(1, 5000), seal=True)
            await a.alloc_store(2, data(2, 10))  # unsealed
            (sess,) = [s for s in target.sessions.values() if s.identity == b"c"]
            before = sess.messages
            assert await c.direct_load(1) == data(1, 5000)  # another initiator's block
            assert sess.messages == before  # one-sided: the target saw no request
            for handle, status, kw in (
                (2, Status.NOT_SEALED, {}),
                (3, Status.NOT_VALID, {}),
                (1, Status.TOO_LONG_FOR_DESCRIPTOR, {"max_length": 4999}),
            ):
                with pytest.raises(KbtpStatusError) as info:
                    await c.direct_load(handle, **kw)
                assert info.value.status is status
            with pytest.raises(KbtpStatusError) as info:
                await a.direct_load(1)
            assert info.value.status is Status.NOT_OFFERED


async def test_s6_6_direct_alloc_fetch_add_slot_write_bind() -> None:
    with trio.fail_after(30):
        async with serving() as target, connect(target, "c") as c:
            ack = c.ack
            assert ack is not None
            alloc = await c.reserve(data(3, 3000))
            assert alloc.ticket == 0 and alloc.polls == 2  # read, then confirmed
            start = ack.partition_offset
            assert start <= alloc.block_offset < start + ack.partition_length
            # Step 3 placed the data before BIND; the entry is still unbound.
            assert target.core.block_bytes(alloc.block_offset, 3000) == data(3, 3000)
            assert not target.core.entry(130).valid
            done = await c.bind(alloc, 130, seal=True)
            assert done.ok and done.block_offset == alloc.block_offset
            assert done.data_length == 3000
            assert await c.load(130) == data(3, 3000)
            assert await c.direct_load(130) == data(3, 3000)
            assert target.core.usage(b"c") == 1
            assert target.core.ring_of(b"c").head()[0] == 1


async def test_s3_3_direct_and_target_fetch_adds_share_the_ring_atomically() -> None:
    """Direct allocations and ALLOC_STOREs racing on one partition ring (§3.3, §3.4)."""
    with trio.fail_after(30):
        async with serving() as target, connect(target, "c") as c:
            base = C.handle_base
            async with trio.open_nursery() as nursery:
                nursery.start_soon(lambda: c.direct_alloc(base, data(10, 100)))
                nursery.start_soon(lambda: c.alloc_store(base + 1, data(11, 200), seal=True))
                nursery.start_soon(lambda: c.direct_alloc(base + 2, data(12, BLOCK)))
                nursery.start_soon(lambda: c.alloc_store(base + 3, data(13, 300), seal=True))
            entries = [target.core.entry(base + k) for k in range(4)]
            assert all(e.valid and e.sealed for e in entries)
            assert len({e.block_offset for e in entries}) == 4
            for k, size in enumerate((100, 200, BLOCK, 300)):
                assert await c.load(base + k) == data(10 + k, size)
            assert target.core.ring_of(b"c").head()[0] == 4
            with pytest.raises(KbtpStatusError) as info:  # the partition is full: quota 4
                await c.alloc_store(base + 4, b"x")
            assert info.value.status is Status.NO_SPACE
            # FREE returns a block to the partition ring; a direct allocation reuses it.
            freed = await c.free(base + 2)
            again = await c.direct_alloc(base + 5, data(15, 50))
            assert again.block_offset == freed.block_offset


async def test_s6_7_ticket_timeout_invalidates_reclaims_and_a_late_bind_is_abandoned() -> None:
    with trio.fail_after(30):
        async with serving(ticket_timeout=0.3) as target:
            async with connect(target, "c") as c:
                ack = c.ack
                assert ack is not None
                alloc = await c.reserve(data(4, 1000))
                ring = target.core.ring_of(b"c")
                # Ticket Timeout: the Partition and Ring STags are invalidated first ...
                await _until(lambda: not target.stag_valid(ack.partition_stag))
                assert not target.stag_valid(ack.ring_stag)
                assert not target.stag_valid(ack.head_stag)
                # ... then the block is reclaimed into the ring; usage drops to zero.  (Its
                # slot stays unconsumed until the reclaim, so the block counts as available
                # all along: wait for the ticket to leave the outstanding set instead.)
                await _until(lambda: alloc.ticket not in ring.outstanding)
                assert target.core.usage(b"c") == 0
                assert ring.ready_block(alloc.ticket) is None  # its slot was consumed
                assert alloc.block_offset in ring.available_blocks()
                assert alloc.ticket in ring.abandoned
                before = snapshot(target)
                with pytest.raises(KbtpStatusError) as info:
                    await c.bind(alloc, 140)
                assert info.value.status is Status.TICKET_ABANDONED
                assert snapshot(target) == before
                with pytest.raises(KbtpStatusError) as info:  # refused locally from now on
                    await c.reserve(b"again")
                assert info.value.status is Status.TICKET_ABANDONED
                # Target-executed allocation still works, on the same partition ring.
                stored = await c.alloc_store(141, data(5, 700), seal=True)
                assert await c.load(141) == data(5, 700)
                # A Write through the invalidated Partition STag reaches nothing: the
                # target's RNIC terminates the stream (RFC 5040), the block is untouched.
                await c.one_sided(WriteOp(ack.partition_stag, stored.block_offset, b"late"))
                assert c.conn is not None
                await c.conn.wait_closed()
                assert target.core.block_bytes(stored.block_offset, 700) == data(5, 700)
                with pytest.raises(SessionClosed):
                    await c.load(141)
            # A new session gets new STags and a rebuilt partition ring: direct again.
            await _until(lambda: not target.sessions)
            async with connect(target, "c") as c2:
                assert c2.ack is not None and c2.ack.partition_stag != ack.partition_stag
                done = await c2.direct_alloc(142, data(6, 64))
                assert done.ok and await c2.direct_load(142) == data(6, 64)
                assert target.core.usage(b"c") == 2


async def test_s3_4_direct_tickets_beyond_the_quota_close_the_session() -> None:
    """An initiator that FetchAdds past its quota broke §3.4: NO_SPACE, Terminate, close."""
    with trio.fail_after(30):
        async with serving() as target:
            async with connect(target, "c") as c:
                ack = c.ack
                assert ack is not None
                op = FetchAddOp(
                    ack.head_stag, ack.head_offset, RING_ADD_DATA, ring_add_mask(ack.ring_order)
                )
                tickets: list[int] = []
                for _ in range(C.quota + 1):
                    original = await c.one_sided(op)
                    assert isinstance(original, int)  # a FetchAdd returns the original Head
                    tickets.append(original)
                assert [t >> 32 for t in tickets] == list(range(C.quota + 1))
                assert c.conn is not None
                await c.conn.wait_closed()  # at the next tick (Ticket Timeout / 2)
                term = c.qp.peer_terminate
                assert term is not None and term.cause == TERM_RDMAP_OP_UNSPECIFIED
            await _until(lambda: not target.sessions)
            # The session's end rebuilt the partition ring: the whole quota is free again.
            assert target.core.usage(b"c") == 0
            assert len(target.core.ring_of(b"c").available_blocks()) == C.quota
            async with connect(target, "c") as c2:
                for k in range(C.quota):
                    assert (await c2.direct_alloc(C.handle_base + k, b"ok")).ok


D = InitiatorConfig(b"d", 192, 64, 4, "green", direct_load=True, direct_alloc=True)


async def test_sec_03_every_session_has_its_own_pd_and_stags() -> None:
    """RFC 5042 §6.1.1 (SEC-01, SEC-03, SEC-07; docs/kbtp.md §3.6): each session's QP and
    STags live in a protection domain of its own, so even a trusted initiator cannot use
    the STags another session was given; the target's RNIC terminates the stream."""
    with trio.fail_after(30):
        async with serving(initiators=(A, B, C, D)) as target:
            async with connect(target, "c") as c:
                await c.alloc_store(130, data(7, 900), seal=True)
                stored = await c.direct_alloc(131, data(8, 300))
                assert c.ack is not None
                async with connect(target, "d") as d:
                    assert d.ack is not None
                    mine = {c.ack.table_stag, c.ack.pool_stag, c.ack.ring_stag, c.ack.head_stag}
                    mine.add(c.ack.partition_stag)
                    theirs = {d.ack.table_stag, d.ack.pool_stag, d.ack.ring_stag, d.ack.head_stag}
                    theirs.add(d.ack.partition_stag)
                    assert len(mine | theirs) == 10 and all(map(target.stag_valid, mine | theirs))
                    assert await d.direct_load(130) == data(7, 900)  # through its own STags
                    # d reads an entry through c's Table STag: not associated with d's stream.
                    with pytest.raises(SessionClosed, match="remote access error"):
                        await d.one_sided(ReadOp(c.ack.table_stag, c.ack.entry_to(130), 16))
                    assert d.conn is not None
                    await d.conn.wait_closed()
                    term = d.qp.peer_terminate
                    assert term is not None and term.cause == TERM_RDMAP_STAG_NOT_ASSOCIATED
                await _until(lambda: all(s.identity != b"d" for s in target.sessions.values()))
                assert not any(map(target.stag_valid, theirs))  # gone with d's session
                async with connect(target, "d") as d2:
                    before = snapshot(target)
                    # A Write through c's Partition STag into c's block: no placement.
                    await d2.one_sided(WriteOp(c.ack.partition_stag, stored.block_offset, b"x"))
                    assert d2.conn is not None
                    await d2.conn.wait_closed()
                    term = d2.qp.peer_terminate
                    assert term is not None and term.cause == TERM_DDP_T_STAG_NOT_ASSOCIATED
                    assert snapshot(target) == before
                # c never noticed: its STags and data are intact.
                assert all(map(target.stag_valid, mine))
                assert await c.direct_load(131) == data(8, 300)
                assert await c.load(130) == data(7, 900)
