"""Batches over a real target and real TCP (trio): one arena registered once, per-block
results, errors before anything is sent (docs/kbtp.md §13.1, §13.2)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import pytest
import trio

from kbtp.arena import Arena, ArenaError
from kbtp.batch import BlockRef, BlockResult, free_batch, load_batch, store_batch
from kbtp.constants import Capability, Status
from kbtp.initiator import KbtpInitiator
from kbtp.initiator_errors import SessionClosed
from kbtp.target import KbtpTarget
from stack.errors import LocalError
from tests.kbtp.api_helpers import BLOCK, CREDITS, MAX_INLINE, config, pattern
from tests.kbtp.targets import new_target

pytestmark = pytest.mark.both_targets  # docs/kbtp.md §8.1: the initiator cannot tell


@asynccontextmanager
async def session(**overrides: object) -> AsyncIterator[tuple[KbtpTarget, KbtpInitiator]]:
    async with new_target(config(**overrides)).running() as target:
        async with KbtpInitiator.connect(
            "127.0.0.1", target.port, "a", capabilities=Capability.NONE
        ) as initiator:
            yield target, initiator


class Registrations:
    """Counts the memory registrations of one protection domain (reg_mr and alloc_mr)."""

    def __init__(self, initiator: KbtpInitiator) -> None:
        self.count = 0
        pd = initiator.pd
        pd.reg_mr = self._counting(pd.reg_mr)  # type: ignore[method-assign]
        pd.alloc_mr = self._counting(pd.alloc_mr)  # type: ignore[method-assign]

    def _counting(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        def counted(*args: Any, **kwargs: Any) -> Any:
            self.count += 1
            return fn(*args, **kwargs)

        return counted


def blocks_of(lengths: list[int], first_handle: int = 0) -> list[BlockRef]:
    """Blocks laid end to end in the arena, handles from ``first_handle``."""
    refs, offset = [], 0
    for i, length in enumerate(lengths):
        refs.append(BlockRef(first_handle + i, offset, length))
        offset += length
    return refs


async def test_batches_round_trip_bytes_with_no_registration_per_request() -> None:
    """Three times the credits in one call, each way: stores by RDMA Read and inline,
    loads into a second arena; the bytes match and no MR is registered per request."""
    lengths = [BLOCK, MAX_INLINE, 1, BLOCK - 3, 3000] * (3 * CREDITS // 5 + 1)
    refs = blocks_of(lengths)
    total = sum(lengths)
    with trio.fail_after(60):
        async with session() as (target, ini):
            source = bytearray(b"".join(pattern(i, n) for i, n in enumerate(lengths)))
            src, dst = Arena.register(ini.pd, source), Arena.register(ini.pd, bytearray(total))
            counter = Registrations(ini)
            stored = await store_batch(ini, src, refs)
            loaded = await load_batch(ini, dst, refs)
            assert counter.count == 0
            assert [r.status for r in stored + loaded] == [Status.SUCCESS] * (2 * len(refs))
            assert bytes(dst.view) == bytes(source)
            for ref, put, got in zip(refs, stored, loaded, strict=True):
                assert put.handle == got.handle == ref.handle
                assert got.data_length == ref.length and got.generation == put.generation
                entry = target.core.entry(ref.handle)
                assert entry.sealed and entry.block_offset == put.block_offset
            # STORE (bound handles) from the same arena, unsealed, RDMA Read only.
            refs2 = [BlockRef(r.handle, r.offset, r.length) for r in refs[: CREDITS + 1]]
            await free_batch(ini, [r.handle for r in refs2])
            source[: sum(r.length for r in refs2)] = bytes(
                b ^ 0x5A for b in source[: sum(r.length for r in refs2)]
            )
            first = await store_batch(ini, src, refs2, seal=False, inline=False)
            assert all(r.ok for r in first)
            again = await store_batch(ini, src, refs2, alloc=False, inline=False)
            assert all(r.ok for r in again) and counter.count == 0, [r.status for r in again]
            for ref in refs2:
                assert target.core.block_bytes(
                    target.core.entry(ref.handle).block_offset, ref.length
                ) == bytes(src.span(ref.offset, ref.length))
            # The per-request path registers: the counter would see it.
            await ini.load_into(refs[0].handle, bytearray(BLOCK))
            assert counter.count == 1


async def test_a_failed_block_does_not_fail_the_others() -> None:
    """Loads of blocks absent, of another generation, outside the table, amid good ones;
    an ALLOC_STORE of a bound handle amid new ones: each block gets its own status."""
    with trio.fail_after(60):
        async with session() as (target, ini):
            data = bytearray(pattern(7, 4 * BLOCK))
            arena = Arena.register(ini.pd, data)
            good = [BlockRef(i, i * BLOCK, BLOCK) for i in range(3)]
            stored = await store_batch(ini, arena, good)
            assert all(r.ok for r in stored)
            mixed = [*good[:2], BlockRef(3, 3 * BLOCK, BLOCK), good[2]]
            again = await store_batch(ini, arena, mixed)
            assert [r.status for r in again] == [Status.ALREADY_VALID] * 2 + [
                Status.SUCCESS,
                Status.ALREADY_VALID,
            ]
            dst = Arena.register(ini.pd, bytearray(6 * BLOCK))
            wrong = stored[1].generation % 0xFFFF + 1
            loads = [
                BlockRef(0, 0, BLOCK),
                BlockRef(50, BLOCK, BLOCK),  # never stored
                BlockRef(1, 2 * BLOCK, BLOCK, generation=wrong),
                BlockRef(1 << 40, 3 * BLOCK, BLOCK),  # no table entry
                BlockRef(2, 4 * BLOCK, BLOCK // 2),  # the block is longer
                BlockRef(2, 5 * BLOCK, BLOCK),
            ]
            results = await load_batch(ini, dst, loads)
            assert [r.status for r in results] == [
                Status.SUCCESS,
                Status.NOT_VALID,
                Status.WRONG_GENERATION,
                Status.HANDLE_OUT_OF_RANGE,
                Status.TOO_LONG_FOR_DESCRIPTOR,
                Status.SUCCESS,
            ]
            assert not results[1].ok and results[1].error is None
            assert bytes(dst.span(0, BLOCK)) == bytes(data[:BLOCK])
            assert bytes(dst.span(5 * BLOCK, BLOCK)) == bytes(data[2 * BLOCK : 3 * BLOCK])
            assert bytes(dst.span(BLOCK, 4 * BLOCK)) == bytes(4 * BLOCK)  # nothing placed
            assert not ini.closed


@pytest.mark.parametrize(
    ("blocks", "message"),
    [
        ([BlockRef(0, 3 * BLOCK, BLOCK + 1)], "outside the arena"),
        ([BlockRef(0, 4 * BLOCK, 1)], "outside the arena"),
        ([BlockRef(0, 0, BLOCK + 1)], "exceed the Block Size"),
        ([BlockRef(0, -1, 10)], "offset must be a non-negative integer"),
        ([BlockRef(0, 0, -5)], "length must be a non-negative integer"),
        ([BlockRef(-1, 0, 10)], "handle -1 is not in"),
        ([BlockRef(1 << 64, 0, 10)], "handle"),
        ([BlockRef(0, 0, 10, generation=0x10000)], "generation"),
        ([BlockRef(0, 0, 10), "not a block"], "block 1: a BlockRef"),
        ([BlockRef(0, 0, BLOCK), BlockRef(1, BLOCK - 1, 10)], "overlap"),
    ],
)
async def test_a_bad_argument_is_refused_before_anything_is_sent(
    blocks: list[Any], message: str
) -> None:
    with trio.fail_after(30):
        async with session() as (target, ini):
            arena = Arena.register(ini.pd, bytearray(4 * BLOCK))
            before = bytes(target.core.memory)
            for call in (load_batch, store_batch):
                if call is store_batch and "overlap" in message:
                    continue  # stores may read overlapping spans
                with pytest.raises(ArenaError, match=message):
                    await call(ini, arena, blocks)
            assert ini.stats == {} and bytes(target.core.memory) == before
            assert arena.busy == 0 and not ini.closed


async def test_arena_errors() -> None:
    """Read-only or empty memory is refused; a closed arena is refused; an arena in use
    refuses to close."""
    with trio.fail_after(30):
        async with session() as (_, ini):
            with pytest.raises(LocalError, match="read-only"):
                Arena.register(ini.pd, b"x" * 100)
            with pytest.raises(ArenaError, match="at least one octet"):
                Arena.register(ini.pd, bytearray())
            with pytest.raises(ArenaError, match="needs a buffer"):
                Arena.register(ini.pd, 12)
            arena = Arena.register(ini.pd, bytearray(2 * BLOCK))
            assert len(arena) == 2 * BLOCK and "STag" in repr(arena)
            arena.busy = 1
            with pytest.raises(ArenaError, match="in use"):
                arena.close()
            arena.busy = 0
            arena.close()
            arena.close()
            assert arena.closed and "closed" in repr(arena)
            with pytest.raises(ArenaError, match="closed"):
                await load_batch(ini, arena, [BlockRef(0, 0, 10)])


async def test_free_batch_and_a_session_that_ends_mid_batch() -> None:
    """FREE in a batch; then the target goes away with a batch in flight: the blocks that
    got no COMPLETION carry SessionClosed, the call returns."""
    target = new_target(config())
    stop_target = trio.CancelScope()

    async def serve(task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
        with stop_target:
            await target.serve(task_status=task_status)

    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            port = await nursery.start(serve)
            async with KbtpInitiator.connect(
                "127.0.0.1", port, "a", capabilities=Capability.NONE
            ) as ini:
                arena = Arena.register(ini.pd, bytearray(pattern(3, 64 * BLOCK)))
                refs = [BlockRef(i, i * BLOCK, BLOCK) for i in range(64)]
                assert all(r.ok for r in await store_batch(ini, arena, refs[:8]))
                freed = await free_batch(ini, [0, (1, 0), 99])
                assert [r.status for r in freed] == [
                    Status.SUCCESS,
                    Status.SUCCESS,
                    Status.NOT_VALID,
                ]
                with pytest.raises(ArenaError, match="handle 'x'"):
                    await free_batch(ini, ["x"])  # type: ignore[list-item]

                def on_result(index: int, result: BlockResult) -> None:
                    stop_target.cancel()  # the first COMPLETION ends the target

                results = await store_batch(ini, arena, refs[8:], inline=False, on_result=on_result)
                assert len(results) == 56 and ini.closed
                assert any(r.ok for r in results) and any(r.error is not None for r in results)
                for r in results:
                    assert r.ok or r.status is None
                    assert (r.status is None) == isinstance(r.error, SessionClosed)
