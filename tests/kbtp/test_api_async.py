"""The asyncio client over a real target and real TCP: concurrent batches from tasks, a
cancelled waiter, closing with batches in flight (docs/kbtp.md §13.4)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from kbtp.batch import BlockRef, BlockResult
from kbtp.client_async import AsyncKbtpClient
from kbtp.client_sync import BatchTicket
from kbtp.constants import Status
from kbtp.initiator_errors import SessionClosed
from kbtp.target_thread import TargetThread
from tests.kbtp.api_helpers import BLOCK, CREDITS, config, pattern
from tests.kbtp.targets import target_thread

pytestmark = pytest.mark.both_targets  # docs/kbtp.md §8.1: the initiator cannot tell

WAIT = 60.0


@pytest.fixture
def target() -> Iterator[TargetThread]:
    with target_thread(config()) as served:
        yield served


def refs(count: int, first: int = 0, slot: int = 0) -> list[BlockRef]:
    return [BlockRef(first + i, (slot + i) * BLOCK, BLOCK) for i in range(count)]


def test_tasks_store_and_load_concurrently(target: TargetThread) -> None:
    """Four tasks gather their batches on one session while a ticker keeps running: the
    event loop is never blocked, and the bytes come back exactly."""
    tasks, per = 4, 2 * CREDITS
    source = bytearray(b"".join(pattern(i, BLOCK) for i in range(tasks * per)))

    async def main() -> int:
        ticks = 0

        async def ticker() -> None:
            nonlocal ticks
            while True:
                await asyncio.sleep(0)
                ticks += 1

        async with await AsyncKbtpClient.connect("127.0.0.1", target.port, "a") as client:
            assert client.block_size == BLOCK and client.ack.request_credits == CREDITS
            src = await client.register(source)
            dst = await client.register(bytearray(len(source)))
            tick = asyncio.create_task(ticker())

            async def one(n: int) -> None:
                mine = refs(per, n * per, n * per)
                stored = await client.store(src, mine)
                assert [r.status for r in stored] == [Status.SUCCESS] * per
                loaded = await client.load(dst, mine)
                assert all(r.ok and r.data_length == BLOCK for r in loaded)

            await asyncio.wait_for(asyncio.gather(*(one(n) for n in range(tasks))), WAIT)
            tick.cancel()
            assert bytes(dst.view) == bytes(source)
            freed = await client.free([n for n in range(tasks * per)])
            assert all(r.ok for r in freed)
            await client.release(dst)
            assert dst.closed
        assert client.closed
        return ticks

    assert asyncio.run(main()) > 0


def test_cancelled_waiter_and_close_in_flight(target: TargetThread) -> None:
    """Cancelling the task that awaits a batch leaves the batch running (its ticket
    completes); aclose() with a batch in flight fails its unfinished blocks cleanly."""

    async def main() -> None:
        client = await AsyncKbtpClient.connect("127.0.0.1", target.port, "b")
        arena = await client.register(bytearray(pattern(5, 64 * BLOCK)))
        ticket = client.submit_store(arena, refs(16, 128, 0))
        waiter = asyncio.ensure_future(_await(ticket))
        await asyncio.sleep(0)
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
        results = await asyncio.wait_for(_await(ticket), WAIT)
        assert [r.status for r in results] == [Status.SUCCESS] * 16
        flying = client.submit_load(arena, refs(16, 128, 0))
        await client.aclose()
        done = await asyncio.wait_for(_await(flying), WAIT)
        assert all(r.ok or isinstance(r.error, SessionClosed) for r in done)
        with pytest.raises(SessionClosed):
            await client.load(arena, refs(1, 128, 0))

    asyncio.run(main())


async def _await(ticket: BatchTicket) -> list[BlockResult]:
    """A coroutine awaiting ``ticket`` (a task of its own, so it can be cancelled)."""
    return await ticket
