"""Part 3: KBTP load: N initiators doing verified STORE/LOAD/ALLOC_STORE/FREE on one target.

Every initiator works its own handles concurrently (one trio run, one session each):
ALLOC_STORE, LOAD and compare, STORE new contents, LOAD and compare, FREE, for a number
of rounds, with block contents of every size from a few octets (INLINE) to the whole
block (the target reads it by RDMA).  Each step runs on all of an initiator's handles at
once, so its :data:`QUOTA` requests are pipelined over :data:`CREDITS` Request Credits
(the rest sent as COMPLETIONs return credits, §9.2): a target that counted an answer the
initiator has seen as outstanding would refuse one.  It runs against ``kbtp target`` and
against ``kbtp target --offload``, whose chains answer the LOADs and STOREs.  The
target's VmRSS is read at start and end.  Pool accounting at the end: the target exposes
no statistics, so every initiator allocates its whole quota again (the sum is the pool
size), one more allocation must be refused, and everything is freed.
"""

from __future__ import annotations

import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import trio

from kbtp import Capability, KbtpInitiator
from tools.campaign.servers import KBTP_BLOCK, kbtp_target, run_trio

QUOTA = 8
CREDITS = 4
"""The target's Request Credits: half of the requests of a step wait for a credit."""


@dataclass
class LoadFigures:
    target: str = "kbtp-target"
    initiators: int = 0
    operations: int = 0
    bytes_verified: int = 0
    corrupted: int = 0
    errors: list[str] = field(default_factory=list)
    pool_blocks: int = 0
    reallocated: int = 0
    over_quota_refused: int = 0
    rss_start_kib: int = 0
    rss_end_kib: int = 0
    alive: bool = True
    seconds: float = 0.0

    @property
    def accounting_ok(self) -> bool:
        return self.reallocated == self.pool_blocks and self.over_quota_refused == self.initiators


def _data(rng: random.Random, tag: str) -> bytes:
    size = rng.choice((1, 17, 500, 1024, 1025, 3000, KBTP_BLOCK))
    head = tag.encode()
    return (head * (size // len(head) + 1))[:size]


def run_load(full: bool, seed: int, progress: Callable[[str], None]) -> list[LoadFigures]:
    """The load on the software target, then on the offloaded one."""
    return [_run_load(full, seed, progress, offload) for offload in (False, True)]


async def _each(handles: list[int], step: Callable[[int], Awaitable[None]]) -> None:
    """``step`` on every handle at once (the session pipelines them over its credits)."""
    async with trio.open_nursery() as nursery:
        for h in handles:
            nursery.start_soon(step, h)


async def _round(
    ini: KbtpInitiator,
    first: dict[int, bytes],
    then: dict[int, bytes],
    seal: bool,
    figures: LoadFigures,
) -> None:
    """One round on ``first``'s handles, each step on all of them at once: ALLOC_STORE
    ``first``; LOAD and compare, STORE ``then`` (sealed with ``seal``); LOAD and compare,
    FREE."""
    contents = dict(first)

    async def allocate(h: int) -> None:
        await ini.alloc_store(h, contents[h])
        figures.operations += 1

    async def rewrite(h: int) -> None:
        got = await ini.load(h, allow_unsealed=True)
        figures.operations += 1
        figures.bytes_verified += len(got)
        figures.corrupted += got != contents[h]
        await ini.store(h, then[h], seal=seal)
        contents[h] = then[h]
        figures.operations += 1

    async def release(h: int) -> None:
        got = await ini.load(h, allow_unsealed=True)
        figures.bytes_verified += len(got)
        figures.corrupted += got != contents[h]
        await ini.free(h)
        figures.operations += 2

    for step in (allocate, rewrite, release):
        await _each(list(contents), step)


def _run_load(full: bool, seed: int, progress: Callable[[str], None], offload: bool) -> LoadFigures:
    n = 64 if full else 8
    rounds = 12 if full else 3
    t0 = time.monotonic()
    extra = ["--initiators", str(n), "--max-inline", "1024", "--handles", str(4 * QUOTA)]
    extra += ["--credits", str(CREDITS)]
    server = kbtp_target([], pool=n * QUOTA, extra=extra, offload=offload)
    name = server.name
    figures = LoadFigures(name, initiators=n, pool_blocks=n * QUOTA)
    with server:
        figures.rss_start_kib = server.rss_kib()

        async def worker(i: int) -> None:
            rng = random.Random(f"{seed}:load:{i}")
            async with KbtpInitiator.connect(
                "127.0.0.1", server.port, f"init-{i}", capabilities=Capability.NONE
            ) as ini:
                assert ini.ack is not None
                base = ini.ack.handle_base
                for r in range(rounds):
                    handles = [base + (r * QUOTA + k) % ini.ack.handle_count for k in range(QUOTA)]
                    first = {h: _data(rng, f"{i}/{r}/{h}/a") for h in handles}
                    then = {h: _data(rng, f"{i}/{r}/{h}/b") for h in handles}
                    await _round(ini, first, then, r % 2 == 0, figures)
                if i % max(n // 8, 1) == 0:
                    progress(f"load {name}: initiator {i} finished {rounds} rounds")

        async def accounting(i: int) -> None:
            async with KbtpInitiator.connect(
                "127.0.0.1", server.port, f"init-{i}", capabilities=Capability.NONE
            ) as ini:
                assert ini.ack is not None
                base, quota = ini.ack.handle_base, ini.ack.quota
                for k in range(quota):
                    c = await ini.alloc_store(base + k, b"q", check=False)
                    figures.reallocated += c.status == 0
                extra = await ini.alloc_store(base + quota, b"over", check=False)
                figures.over_quota_refused += extra.status != 0
                for k in range(quota):
                    await ini.free(base + k)

        async def main() -> None:
            async with trio.open_nursery() as nursery:
                for i in range(n):
                    nursery.start_soon(guarded, worker, i)
            async with trio.open_nursery() as nursery:
                for i in range(n):
                    nursery.start_soon(guarded, accounting, i)

        async def guarded(fn: Callable[[int], object], i: int) -> None:
            try:
                await fn(i)  # type: ignore[misc]
            except Exception as exc:
                figures.errors.append(f"init-{i}: {type(exc).__name__}: {exc}")

        run_trio(main, timeout=600 if full else 120)
        figures.rss_end_kib = server.rss_kib()
        figures.alive = server.alive()
    figures.seconds = time.monotonic() - t0
    progress(
        f"load {name}: {n} initiators, {figures.operations} operations, "
        f"{figures.bytes_verified} bytes verified, {figures.corrupted} corrupted, "
        f"pool {figures.reallocated}/{figures.pool_blocks} reallocated, "
        f"RSS {figures.rss_start_kib} -> {figures.rss_end_kib} KiB"
    )
    return figures
