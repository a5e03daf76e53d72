"""``kbtp bench --offload``: STORE, LOAD, ALLOC_STORE and FREE on the software and the
offloaded target, one run.

For each block size (default 4K, 64K, 1M) and each number of requests in flight (1 and the
``--inflight`` value, default 16), one in-process target of each kind (``KbtpTarget`` and
``KbtpTarget(offload=True)``, docs/kbtp.md §8) serves one initiator over loopback TCP,
whose blocks are a DIRECT_ALLOC partition (so the offloaded target runs its ALLOC_STOREs
and FREEs too, §8.1); each worker stores its buffer into its own block (mapped STORE, by
RDMA Read), then loads it back (the blocks sealed in between); then rounds of
``inflight`` ALLOC_STOREs (by RDMA Read) and of ``inflight`` FREEs alternate, each round
timed on its own.
Figures per row: operations per second, latency p50 and p99, the calls into the target
application per operation and its CPU time per operation (thread CPU time spent inside
the target core's entry points), the requests the target's RNIC answered by itself per
operation, and the CPU time of the whole process per operation (both ends, both RNICs:
the RNIC's work is what remains once the application's is taken out).  Speed is
reported, never asserted.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from typing import Any

import trio

from kbtp.cli.bench_peer import IDENTITY, bench_config
from kbtp.cli.bounds import check_target_config
from kbtp.cli.target import checked_target, mpa_settings, run_trio
from kbtp.constants import DEFAULT_MAX_INLINE
from kbtp.initiator import KbtpInitiator
from kbtp.target import KbtpTarget
from kbtp.target_config import TargetConfig
from kbtp.target_offload import chain_runs
from stack.cli import CliError
from stack.cli.json_report import schema, text_to_stderr_if_json_stdout, write_json
from stack.wire.events import MpaSettings

__all__ = ["OFFLOAD_SIZES", "AppMeter", "OffloadRow", "run_offload"]

OFFLOAD_SIZES = (4 << 10, 64 << 10, 1 << 20)
_ENTRY_POINTS = (
    "handle_message",
    "rdma_completed",
    "rdma_failed",
    "memory_registered",
    "receive_batch",
    "tick",
    "offloaded_ring_ops",
)
"""The target core's methods the binding calls: the target application's work."""


class AppMeter:
    """Counts the calls into a target's core and the thread CPU time spent in them."""

    def __init__(self, target: KbtpTarget) -> None:
        self.requests = 0
        self.cpu = 0.0
        core = target.core
        for name in _ENTRY_POINTS:
            setattr(core, name, self._wrap(name, getattr(core, name)))

    def _wrap(self, name: str, call: Callable[..., Any]) -> Callable[..., Any]:
        def metered(*args: Any) -> Any:
            if name == "handle_message":
                self.requests += 1
            start = time.thread_time()
            try:
                return call(*args)
            finally:
                self.cpu += time.thread_time() - start

        return metered


@dataclass(slots=True)
class OffloadRow:
    """One row: ``op`` of ``size`` octets, ``inflight`` at once, on one kind of target."""

    op: str
    target: str
    size: int
    inflight: int
    iters: int
    seconds: float
    latencies: list[float]
    app_calls: int
    app_cpu: float
    rnic_runs: int
    process_cpu: float

    @property
    def ops(self) -> float:
        return self.iters / self.seconds

    def percentile(self, p: float) -> float:
        ordered = sorted(self.latencies)
        return ordered[min(len(ordered) - 1, int(p * len(ordered)))]

    def as_json(self) -> dict[str, Any]:
        return {
            "operation": self.op.upper(),
            "target": self.target,
            "size_bytes": self.size,
            "inflight": self.inflight,
            "iterations": self.iters,
            "seconds": self.seconds,
            "ops_per_s": self.ops,
            "latency_p50_us": self.percentile(0.5) * 1e6,
            "latency_p99_us": self.percentile(0.99) * 1e6,
            "latency_mean_us": statistics.fmean(self.latencies) * 1e6,
            "app_calls_per_op": self.app_calls / self.iters,
            "app_cpu_us_per_op": self.app_cpu / self.iters * 1e6,
            "rnic_answers_per_op": self.rnic_runs / self.iters,
            "process_cpu_us_per_op": self.process_cpu / self.iters * 1e6,
        }


HEADER = (
    f"{'operation':<11} {'target':<8} {'size':>5} {'in flight':>9} {'iters':>5} {'ops/s':>7}"
    f" {'p50 us':>7} {'p99 us':>7} {'app calls/op':>12} {'app CPU us/op':>13} {'RNIC/op':>7}"
    f" {'CPU us/op':>9}"
)


def format_row(r: OffloadRow) -> str:
    from kbtp.cli.bench import size_label

    return (
        f"{r.op.upper():<11} {r.target:<8} {size_label(r.size):>5} {r.inflight:>9}"
        f" {r.iters:>5} {r.ops:>7.0f} {r.percentile(0.5) * 1e6:>7.0f}"
        f" {r.percentile(0.99) * 1e6:>7.0f}"
        f" {r.app_calls / r.iters:>12.2f} {r.app_cpu / r.iters * 1e6:>13.1f}"
        f" {r.rnic_runs / r.iters:>7.2f} {r.process_cpu / r.iters * 1e6:>9.0f}"
    )


def offload_config(size: int, inflight: int) -> TargetConfig:
    """The target of one row: a block per request in flight, all of them a DIRECT_ALLOC
    partition (so ALLOC_STORE and FREE are offloaded too, docs/kbtp.md §8.1)."""
    config = bench_config(size, inflight, inflight, DEFAULT_MAX_INLINE)
    return replace(
        config, initiators=tuple(replace(i, direct_alloc=True) for i in config.initiators)
    )


async def bench_rows(
    offload: bool, size: int, inflight: int, iters: int, settings: MpaSettings
) -> list[OffloadRow]:
    """STORE then LOAD ``iters`` times each, ``inflight`` at once, on a fresh target."""
    config = offload_config(size, inflight)
    target = checked_target(config, settings=settings, offload=offload)
    data = bytearray(os.urandom(size))
    buffers = [bytearray(size) for _ in range(inflight)]
    name = "offload" if offload else "software"
    rows = []
    async with target.running() as running:
        async with KbtpInitiator.connect(
            "127.0.0.1", running.port, IDENTITY.decode(), settings=settings
        ) as ini:
            for w in range(inflight):
                await ini.alloc_store(w, b"")
            meter = AppMeter(running)

            async def store(w: int) -> None:
                await ini.store(w, data, inline=False)

            loaded: set[int] = set()  # fewer than inflight when iters is

            async def load(w: int) -> None:
                loaded.add(w)
                await ini.load_into(w, buffers[w])

            for op, job in (("store", store), ("load", load)):
                if op == "load":
                    for w in range(inflight):
                        await ini.store(w, data, inline=False, seal=True)
                calls, app_cpu = meter.requests, meter.cpu
                runs0 = _runs(running)
                seconds, cpu, latencies = await _timed(job, inflight, iters)
                rows.append(
                    OffloadRow(
                        op,
                        name,
                        size,
                        inflight,
                        iters,
                        seconds,
                        latencies,
                        meter.requests - calls,
                        meter.cpu - app_cpu,
                        _runs(running) - runs0,
                        cpu,
                    )
                )
            if not loaded or any(buffers[w] != data for w in loaded):
                raise CliError("LOAD returned wrong data")
            for w in range(inflight):
                await ini.free(w)

            async def alloc_store(w: int) -> None:
                await ini.alloc_store(w, data, inline=False)

            async def free(w: int) -> None:
                await ini.free(w)

            rows += await _ring_rows(running, meter, name, size, inflight, iters, alloc_store, free)
            await ini.alloc_store(0, data, inline=False, seal=True)
            if await ini.load(0) != data:
                raise CliError("ALLOC_STORE placed wrong data")
    return rows


async def _ring_rows(
    target: KbtpTarget,
    meter: AppMeter,
    name: str,
    size: int,
    inflight: int,
    iters: int,
    *jobs: Callable[[int], Awaitable[None]],
) -> list[OffloadRow]:
    """Rows of ``jobs`` (ALLOC_STORE, FREE) run in alternating rounds of ``inflight``."""
    totals = [[0.0, 0.0, 0, 0.0, 0] for _ in jobs]  # seconds, cpu, calls, app cpu, runs
    latencies: list[list[float]] = [[] for _ in jobs]
    done = 0
    while done < iters:
        n = min(inflight, iters - done)
        for k, job in enumerate(jobs):
            calls, app_cpu, runs0 = meter.requests, meter.cpu, _runs(target)
            seconds, cpu, lat = await _timed(job, n, n)
            t = totals[k]
            t[0] += seconds
            t[1] += cpu
            t[2] += meter.requests - calls
            t[3] += meter.cpu - app_cpu
            t[4] += _runs(target) - runs0
            latencies[k] += lat
        done += n
    return [
        OffloadRow(op, name, size, inflight, iters, t[0], lat, int(t[2]), t[3], int(t[4]), t[1])
        for op, t, lat in zip(("alloc_store", "free"), totals, latencies, strict=True)
    ]


def _runs(target: KbtpTarget) -> int:
    return sum(chain_runs(s.qp) for s in target.sessions.values())


async def _timed(
    job: Callable[[int], Awaitable[None]], inflight: int, iters: int
) -> tuple[float, float, list[float]]:
    """(wall seconds, process CPU seconds, latencies) of ``iters`` jobs on ``inflight``
    workers."""
    latencies: list[float] = []
    counter = iter(range(iters))

    async def worker(w: int) -> None:
        for _ in counter:
            start = time.perf_counter()
            await job(w)
            latencies.append(time.perf_counter() - start)

    cpu0 = time.process_time()
    start = time.perf_counter()
    async with trio.open_nursery() as nursery:
        for w in range(inflight):
            nursery.start_soon(worker, w)
    return time.perf_counter() - start, time.process_time() - cpu0, latencies


def _on_cpu(args: argparse.Namespace) -> str:
    """`` (CPU N, --cpus)`` when ``kbtp bench --cpus`` pinned this process, else nothing."""
    return "" if args.cpus is None else f" (CPU {args.cpus[0]}, --cpus)"


def run_offload(args: argparse.Namespace, default_sizes: str) -> int:
    """The ``kbtp bench --offload`` command (parsed arguments of ``kbtp bench``)."""
    from kbtp.cli.bench import iterations, parse_sizes, size_label

    sizes = list(OFFLOAD_SIZES) if args.sizes == default_sizes else parse_sizes(args.sizes)
    inflights = sorted({1, args.inflight})
    for size in sizes:  # every row's target, before any is started
        check_target_config(offload_config(size, args.inflight))
    settings = mpa_settings(args)
    rows: list[OffloadRow] = []
    with text_to_stderr_if_json_stdout(args.json):
        print(
            "kbtp bench --offload: STORE, LOAD, ALLOC_STORE, FREE, software target vs offloaded "
            "target "
            f"(docs/kbtp.md §8), one process{_on_cpu(args)}, loopback TCP; app = the target "
            "core's entry points"
        )
        print(HEADER, flush=True)

        async def main() -> None:
            for size in sizes:
                iters = iterations(size, args.bytes, args.iters)
                for inflight in inflights:
                    for offload in (False, True):
                        if not args.quiet:
                            kind = "offload" if offload else "software"
                            print(
                                f"kbtp bench: {size_label(size)} x{inflight} {kind}",
                                file=sys.stderr,
                                flush=True,
                            )
                        for row in await bench_rows(offload, size, inflight, iters, settings):
                            print(format_row(row), flush=True)
                            rows.append(row)

        run_trio(main)
    if args.json:
        document = {
            "schema": schema("kbtp bench"),
            "command": "kbtp bench --offload",
            "parameters": {
                "sizes_bytes": sizes,
                "inflight": inflights,
                "processes": 1,
                "cpus": None if args.cpus is None else {"client": args.cpus[0], "target": None},
            },
            "results": [r.as_json() for r in rows],
            "exit_status": 0,
            "verdict": "ok",
        }
        write_json(args.json, document)
    return 0
