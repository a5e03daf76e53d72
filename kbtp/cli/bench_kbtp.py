"""``kbtp bench``'s KBTP figures at one block size: N requests in flight on one session.

The buffers are spans of one :class:`~kbtp.arena.Arena` registered once (docs/kbtp.md §13.1)
and each completion submits the next request (:func:`_pipelined`); ``per_request``: one
worker task per buffer, awaiting ``load_into``/``store``/``alloc_store`` (:func:`_workers`).
"""

from __future__ import annotations

import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import trio

from kbtp.arena import Arena
from kbtp.batch import BlockRef, build_loads, build_stores
from kbtp.cli.bench_cpu import BothEndsCpu, CpuClock, no_peer
from kbtp.cli.bench_peer import IDENTITY
from kbtp.cli.bench_report import Result
from kbtp.constants import DEFAULT_MAX_INLINE, Status
from kbtp.initiator import KbtpInitiator
from kbtp.initiator_errors import KbtpStatusError, SessionClosed
from kbtp.messages import AllocStore, Completion, Request
from stack.cli import CliError
from stack.fastinit import maker
from stack.wire.events import MpaSettings

OPS = ("store", "load", "alloc_store")
"""Run order: LOAD needs the blocks the STOREs wrote (then sealed)."""


Timed = tuple[float, float, float | None]
"""A row's wall-clock seconds, CPU seconds of both ends, and the target's part of them (None:
the target is in this process, or its CPU cannot be read)."""


async def _workers(inflight: int, iters: int, job: Job, peer_cpu: CpuClock) -> Timed:
    """Run ``iters`` calls of ``job(worker, index)`` on ``inflight`` tasks (:data:`Timed`)."""
    counter = iter(range(iters))

    async def worker(w: int) -> None:
        for i in counter:
            await job(w, i)

    cpu = BothEndsCpu(peer_cpu)
    start = time.perf_counter()
    async with trio.open_nursery() as nursery:
        for w in range(inflight):
            nursery.start_soon(worker, w)
    seconds = time.perf_counter() - start
    return seconds, cpu.seconds(), cpu.peer


def pool_blocks(ops: list[str], iters: int, inflight: int) -> int:
    """Blocks a row's target needs: one per worker, and one per ALLOC_STORE."""
    return (iters if "alloc_store" in ops else 0) + inflight


async def bench_kbtp_size(
    size: int,
    ops: list[str],
    iters: int,
    inflight: int,
    settings: MpaSettings,
    inline: bool | None,
    max_inline: int = DEFAULT_MAX_INLINE,
    *,
    port: int,
    peer_cpu: CpuClock = no_peer,
    per_request: bool = False,
    host: str = "127.0.0.1",
    identity: str = IDENTITY.decode(),
    alloc_iters: int | None = None,
    cleanup: bool = False,
) -> list[Result]:
    """KBTP figures at one block size against the target at ``host``:``port`` (one session
    as ``identity``).

    Buffer ``w`` is span ``w`` of one :class:`~kbtp.arena.Arena` registered once
    (docs/kbtp.md §13.1) and completions submit the next requests; ``per_request``: a
    worker task per buffer, which every LOAD and STORE registers and deregisters.  The
    handles are the identity's from its Handle Base: one per buffer, then one per
    ALLOC_STORE (``alloc_iters`` of them, default ``iters``).  ``cleanup`` frees every
    handle the run bound when it ends, however it ends (a target started by hand,
    :mod:`kbtp.cli.bench_connect`).
    """
    data = bytearray(os.urandom(size))
    buffers = [bytearray(size) for _ in range(inflight)]
    results: list[Result] = []
    path = "inline" if (size <= max_inline if inline is None else inline) else "rdma"
    allocs = iters if alloc_iters is None else alloc_iters
    bound: set[int] = set()  # handles this run bound, as each ALLOC_STORE succeeds
    async with (
        KbtpInitiator.connect(host, port, identity, settings=settings) as ini,
        _freeing(ini, bound, cleanup),
    ):
        assert ini.ack is not None
        base = ini.ack.handle_base
        for w in range(inflight):
            await _alloc_first(ini, base + w, data)
            bound.add(base + w)
        jobs = _per_request_jobs(ini, base, inflight, data, buffers, inline, bound)
        if not per_request:
            memory = bytearray(data * inflight)
            arena = Arena.register(ini.pd, memory)
            requests = _arena_requests(ini, arena, base, inflight, size, inline)
            spans = [memoryview(memory)[w * size : (w + 1) * size] for w in range(inflight)]

        async def run(op: str, count: int, used: set[int]) -> Timed:
            """The row of ``op``, ``count`` requests; ``used`` gets the buffer of every request
            (fewer than ``inflight`` when ``count`` is)."""
            if per_request:
                job = jobs[op]

                async def tracked_job(w: int, i: int) -> object:
                    used.add(w)
                    return await job(w, i)

                return await _workers(inflight, count, tracked_job, peer_cpu)
            request_for = requests[op]

            def tracked_request(w: int, i: int) -> Request:
                used.add(w)
                return request_for(w, i)

            succeeded = bound.add if op == "alloc_store" else None
            return await _pipelined(ini, inflight, count, tracked_request, peer_cpu, succeeded)

        for op in OPS:
            if op not in ops:
                continue
            used: set[int] = set()
            if op == "load":
                for w in range(inflight):
                    await ini.store(base + w, data, seal=True)
                if not per_request:
                    memory[:] = bytes(len(memory))  # what the LOADs place is checked
                seconds, cpu, target = await run(op, iters, used)
                landed = buffers if per_request else spans
                if not used or any(landed[w] != data for w in used):
                    raise CliError("LOAD returned wrong data")
                results.append(Result(op, size, iters, seconds, "rdma", cpu, target_cpu=target))
            else:
                count = allocs if op == "alloc_store" else iters
                seconds, cpu, target = await run(op, count, used)
                results.append(Result(op, size, count, seconds, path, cpu, target_cpu=target))
        if not per_request:
            arena.close()
    return results


@asynccontextmanager
async def _freeing(ini: KbtpInitiator, bound: set[int], cleanup: bool) -> AsyncIterator[None]:
    """With ``cleanup``: FREE every handle in ``bound`` (untimed) when the block ends,
    however it ends, as far as the session lasts."""
    try:
        yield
    finally:
        if cleanup:
            await _free_bound(ini, bound)


async def _free_bound(ini: KbtpInitiator, bound: set[int]) -> None:
    """FREE every handle in ``bound``, as far as the session lasts."""
    with trio.CancelScope(shield=True):
        for handle in sorted(bound):
            try:
                await ini.free(handle, check=False)
            except SessionClosed:
                return


async def _alloc_first(ini: KbtpInitiator, handle: int, data: bytearray) -> None:
    """ALLOC_STORE a buffer's block before the rows; a handle bound already is the run's
    error (the bench writes no block it did not allocate)."""
    try:
        await ini.alloc_store(handle, data)
    except KbtpStatusError as exc:
        if exc.status is Status.ALREADY_VALID:
            raise CliError(
                f"handle 0x{handle:x} of {ini.identity.decode(errors='replace')!r} is bound at "
                "the target already: the bench binds handles of its own from the identity's "
                "Handle Base (give it an identity none of whose handles are in use)"
            ) from None
        raise


Job = Callable[[int, int], Awaitable[object]]
"""One operation of worker ``w``, the ``i``-th of the row."""


def _per_request_jobs(
    ini: KbtpInitiator,
    base: int,
    inflight: int,
    data: bytearray,
    buffers: list[bytearray],
    inline: bool | None,
    bound: set[int],
) -> dict[str, Job]:
    """The operations on per-request buffers: each registers and deregisters its own;
    buffer ``w``'s handle is ``base + w``, the ``i``-th ALLOC_STORE's ``base + inflight +
    i`` (added to ``bound`` once it is)."""

    async def store(w: int, i: int) -> None:
        await ini.store(base + w, data, inline=inline)

    async def load(w: int, i: int) -> None:
        await ini.load_into(base + w, buffers[w])

    async def alloc_store(w: int, i: int) -> None:
        await ini.alloc_store(base + inflight + i, data, inline=inline)
        bound.add(base + inflight + i)

    return {"store": store, "load": load, "alloc_store": alloc_store}


RequestFor = Callable[[int, int], Request]
"""The request of buffer ``w``, the ``i``-th of the row."""


def _arena_requests(
    ini: KbtpInitiator, arena: Arena, base: int, inflight: int, size: int, inline: bool | None
) -> dict[str, RequestFor]:
    """The requests on the arena: buffer ``w`` loads into and stores from its span, handle
    ``base + w``; they are built once (an ALLOC_STORE's names its fresh handle, ``base +
    inflight + i``)."""
    assert ini.ack is not None
    refs = [BlockRef(base + w, w * size, size) for w in range(inflight)]
    loads = build_loads(arena, refs, ini.block_size)
    max_inline = ini.ack.max_inline
    stores = build_stores(
        arena, refs, ini.block_size, max_inline, alloc=False, seal=False, inline=inline
    )
    allocs = build_stores(arena, refs, ini.block_size, max_inline, seal=False, inline=inline)
    make = maker(AllocStore)

    def alloc(w: int, i: int) -> Request:
        """Buffer ``w``'s ALLOC_STORE with the fresh handle of the ``i``-th request."""
        a = allocs[w]
        assert isinstance(a, AllocStore)
        handle = base + inflight + i
        return make(a.request_id, handle, a.descriptor, a.data, a.generation, a.flags, None)

    return {"store": lambda w, i: stores[w], "load": lambda w, i: loads[w], "alloc_store": alloc}


async def _pipelined(
    ini: KbtpInitiator,
    inflight: int,
    iters: int,
    request_for: RequestFor,
    peer_cpu: CpuClock,
    succeeded: Callable[[int], None] | None = None,
) -> Timed:
    """``iters`` requests, ``inflight`` outstanding, each next one submitted by the
    completion of the last (:meth:`KbtpInitiator.submit`: no task per request);
    ``succeeded`` is called with the handle of each request that completes with SUCCESS.

    Returns the row's :data:`Timed` figures; a status other than SUCCESS or
    a session that ends raises :class:`CliError`.
    """
    free = list(range(inflight))
    issued = finished = 0
    failure: str | None = None
    all_done = trio.Event()

    def issue() -> None:
        nonlocal issued
        w = free.pop()
        request = request_for(w, issued)
        issued += 1
        ini.submit(request, lambda c, e: on_done(w, request, c, e))

    def on_done(w: int, request: Request, c: Completion | None, e: SessionClosed | None) -> None:
        nonlocal finished, failure
        finished += 1
        free.append(w)
        if succeeded is not None and c is not None and c.status == Status.SUCCESS:
            succeeded(request.handle)
        if failure is None and (c is None or c.status != Status.SUCCESS):
            what = e if c is None else Status(c.status).name
            failure = f"{request.opcode.name} of handle 0x{request.handle:x}: {what}"
        if failure is None and issued < iters:
            issue()
        elif finished == issued:
            all_done.set()

    cpu = BothEndsCpu(peer_cpu)
    start = time.perf_counter()
    for _ in range(min(inflight, iters)):
        issue()
    await all_done.wait()
    seconds = time.perf_counter() - start
    if failure is not None:
        raise CliError(failure)
    return seconds, cpu.seconds(), cpu.peer
