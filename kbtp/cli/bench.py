"""``kbtp bench``: KBTP throughput over iWARP against a raw TCP request/response baseline.

For each block size (default 4K, 16K, 64K, 256K, 1M) one target (in a second process,
:mod:`kbtp.cli.bench_peer`; ``--in-process``: in this one) and one initiator talk over
loopback TCP, and N requests are kept in flight (default 16; Request Credits = N), each
of N buffers used by one request at a time:

* **LOAD**: every worker loads its own sealed block into its own buffer (the target
  RDMA-writes it, then sends the COMPLETION);
* **STORE**: every worker stores its buffer into its own unsealed block (INLINE up to Max
  Inline, otherwise the target RDMA-reads the buffer in place);
* **ALLOC_STORE**: every request allocates a fresh block through the free-block ring.

The buffers are spans of one :class:`~kbtp.arena.Arena`, registered once, as an
application moves blocks (docs/kbtp.md §13.1), and each completion submits the next request
(:meth:`~kbtp.initiator.KbtpInitiator.submit`: no task per request).  ``--per-request``:
one worker task per buffer, awaiting ``load_into``/``store``/``alloc_store``, which register
and deregister the buffer for every request.

``--offload`` measures STORE and LOAD on the software and the offloaded target instead
(:mod:`kbtp.cli.bench_offload`, docs/kbtp.md §8).

The baseline, in the same run, is pipelined raw trio TCP with the same shape
(:mod:`kbtp.cli.bench_baseline`): one connection, N requests in flight, a 40-octet request
and a 40-octet response, with the block's octets in the response (LOAD) or after the
request (STORE, ALLOC_STORE); the client sends every request it may in one go, the server
answers every complete request in one send (both scatter-gather ``sendmsg``) and copies
stored octets into its memory, as the target places them.  Figures: operations per second
and GB/s (10^9 octets per second) of block data, KBTP over raw, and the process CPU time
per operation of each, both ends counted (the peer's from ``/proc``; CPU per operation is
the figure that survives a busy machine best).  Speed is reported, never asserted.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, replace
from typing import Any

import trio

from kbtp.arena import Arena
from kbtp.batch import BlockRef, build_loads, build_stores
from kbtp.cli.bench_baseline import bench_raw, raw_server
from kbtp.cli.bench_cpu import BothEndsCpu, CpuClock, no_peer
from kbtp.cli.bench_mooncake import PACKAGE as MC_PACKAGE
from kbtp.cli.bench_mooncake import mooncake_available, run_mooncake
from kbtp.cli.bench_offload import run_offload
from kbtp.cli.bench_peer import IDENTITY, bench_config, peer_process
from kbtp.cli.target import (
    LOOPBACK_EMSS,
    add_mpa_arguments,
    mpa_settings,
    parse_size,
    positive_int,
    run_trio,
)
from kbtp.constants import DEFAULT_MAX_INLINE, Status
from kbtp.initiator import KbtpInitiator
from kbtp.initiator_errors import SessionClosed
from kbtp.messages import Completion, Request
from kbtp.target import KbtpTarget
from stack.cli import CliError, one_line_errors
from stack.cli.json_report import (
    add_json_argument,
    check_json_path,
    schema,
    text_to_stderr_if_json_stdout,
    write_json,
)
from stack.wire.events import MpaSettings
from stack.wire.framing import mulpdu_for

DEFAULT_SIZES = (4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20)
DEFAULT_INFLIGHT = 16
DEFAULT_BYTES = 32 << 20
MIN_ITERS = 64
MAX_ITERS = 8192
OPS = ("store", "load", "alloc_store")
"""Run order: LOAD needs the blocks the STOREs wrote (then sealed)."""


@dataclass(slots=True)
class Result:
    """One row: an operation at one size, KBTP and (optionally) the raw baseline."""

    op: str
    size: int
    iters: int
    seconds: float
    path: str
    cpu: float = 0.0
    raw_seconds: float | None = None
    raw_cpu: float | None = None
    mc_seconds: float | None = None
    """Mooncake Transfer Engine's TCP transport moving the same blocks (``--vs mooncake``)."""
    mc_cpu: float | None = None

    @property
    def ops(self) -> float:
        return self.iters / self.seconds

    @property
    def gbps(self) -> float:
        return self.iters * self.size / self.seconds / 1e9

    @property
    def raw_gbps(self) -> float | None:
        if self.raw_seconds is None:
            return None
        return self.iters * self.size / self.raw_seconds / 1e9

    @property
    def ratio(self) -> float | None:
        raw = self.raw_gbps
        return self.gbps / raw if raw else None

    @property
    def mc_gbps(self) -> float | None:
        if self.mc_seconds is None:
            return None
        return self.iters * self.size / self.mc_seconds / 1e9

    @property
    def vs_mooncake(self) -> float | None:
        mc = self.mc_gbps
        return self.gbps / mc if mc else None


def iterations(size: int, total: int, fixed: int | None) -> int:
    if fixed is not None:
        return fixed
    return max(MIN_ITERS, min(MAX_ITERS, total // size))


def size_label(size: int) -> str:
    for unit, scale in (("M", 1 << 20), ("K", 1 << 10)):
        if size % scale == 0:
            return f"{size // scale}{unit}"
    return str(size)


HEADER = (
    f"{'operation':<12} {'size':>5} {'path':<6} {'iters':>5} {'ops/s':>7} {'GB/s':>6}"
    f" {'raw ops/s':>9} {'raw GB/s':>8} {'ratio':>5}  {'CPU us/op':>9} {'raw CPU':>7}"
)


MC_HEADER = f" {'MC GB/s':>7} {'vs MC':>5} {'MC CPU':>6}"
"""The ``--vs mooncake`` columns."""
MC_OPS = {"store": "write", "load": "read"}
"""The Mooncake transfer each KBTP operation is compared with."""


def format_row(r: Result, vs_mooncake: bool = False) -> str:
    raw = "" if r.raw_seconds is None else f"{r.iters / r.raw_seconds:.0f}"
    raw_gb = "" if r.raw_gbps is None else f"{r.raw_gbps:.3f}"
    ratio = "" if r.ratio is None else f"{r.ratio:.2f}"
    raw_cpu = "" if r.raw_cpu is None else f"{r.raw_cpu / r.iters * 1e6:.0f}"
    line = (
        f"{r.op.upper():<12} {size_label(r.size):>5} {r.path:<6} {r.iters:>5} {r.ops:>7.0f}"
        f" {r.gbps:>6.3f} {raw:>9} {raw_gb:>8} {ratio:>5}  {r.cpu / r.iters * 1e6:>9.0f}"
        f" {raw_cpu:>7}"
    )
    if vs_mooncake:
        mc = "-" if r.mc_gbps is None else f"{r.mc_gbps:.3f}"
        vs = "-" if r.vs_mooncake is None else f"{r.vs_mooncake:.2f}"
        mc_cpu = "-" if r.mc_cpu is None else f"{r.mc_cpu / r.iters * 1e6:.0f}"
        line += f" {mc:>7} {vs:>5} {mc_cpu:>6}"
    return line


# ======================================================================================
# KBTP
# ======================================================================================


async def _workers(inflight: int, iters: int, job: Job, peer_cpu: CpuClock) -> tuple[float, float]:
    """Run ``iters`` calls of ``job(worker, index)`` on ``inflight`` tasks.

    Returns (wall-clock seconds, CPU seconds of both ends: this process and the peer's).
    """
    counter = iter(range(iters))

    async def worker(w: int) -> None:
        for i in counter:
            await job(w, i)

    cpu = BothEndsCpu(peer_cpu)
    start = time.perf_counter()
    async with trio.open_nursery() as nursery:
        for w in range(inflight):
            nursery.start_soon(worker, w)
    return time.perf_counter() - start, cpu.seconds()


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
) -> list[Result]:
    """KBTP figures at one block size against the target at ``port`` (one session).

    Buffer ``w`` is span ``w`` of one :class:`~kbtp.arena.Arena` registered once
    (docs/kbtp.md §13.1) and completions submit the next requests; ``per_request``: a
    worker task per buffer, which every LOAD and STORE registers and deregisters.
    """
    data = bytearray(os.urandom(size))
    buffers = [bytearray(size) for _ in range(inflight)]
    results = []
    path = "inline" if (size <= max_inline if inline is None else inline) else "rdma"
    async with KbtpInitiator.connect(
        "127.0.0.1", port, IDENTITY.decode(), settings=settings
    ) as ini:
        for w in range(inflight):
            await ini.alloc_store(w, data)
        jobs = _per_request_jobs(ini, inflight, data, buffers, inline)
        if not per_request:
            memory = bytearray(data * inflight)
            arena = Arena.register(ini.pd, memory)
            requests = _arena_requests(ini, arena, inflight, size, inline)
            spans = [memoryview(memory)[w * size : (w + 1) * size] for w in range(inflight)]

        async def run(op: str) -> tuple[float, float]:
            if per_request:
                return await _workers(inflight, iters, jobs[op], peer_cpu)
            return await _pipelined(ini, inflight, iters, requests[op], peer_cpu)

        for op in OPS:
            if op not in ops:
                continue
            if op == "load":
                for w in range(inflight):
                    await ini.store(w, data, seal=True)
                if not per_request:
                    memory[:] = bytes(len(memory))  # what the LOADs place is checked
                seconds, cpu = await run(op)
                landed = buffers if per_request else spans
                if any(buf != data for buf in landed):
                    raise CliError("LOAD returned wrong data")
                results.append(Result(op, size, iters, seconds, "rdma", cpu))
            else:
                seconds, cpu = await run(op)
                results.append(Result(op, size, iters, seconds, path, cpu))
        if not per_request:
            arena.close()
    return results


Job = Callable[[int, int], Awaitable[object]]
"""One operation of worker ``w``, the ``i``-th of the row."""


def _per_request_jobs(
    ini: KbtpInitiator,
    inflight: int,
    data: bytearray,
    buffers: list[bytearray],
    inline: bool | None,
) -> dict[str, Job]:
    """The operations on per-request buffers: each registers and deregisters its own."""

    async def store(w: int, i: int) -> None:
        await ini.store(w, data, inline=inline)

    async def load(w: int, i: int) -> None:
        await ini.load_into(w, buffers[w])

    async def alloc_store(w: int, i: int) -> None:
        await ini.alloc_store(inflight + i, data, inline=inline)

    return {"store": store, "load": load, "alloc_store": alloc_store}


RequestFor = Callable[[int, int], Request]
"""The request of buffer ``w``, the ``i``-th of the row."""


def _arena_requests(
    ini: KbtpInitiator, arena: Arena, inflight: int, size: int, inline: bool | None
) -> dict[str, RequestFor]:
    """The requests on the arena: buffer ``w`` loads into and stores from its span; they
    are built once (an ALLOC_STORE's names its fresh handle)."""
    assert ini.ack is not None
    refs = [BlockRef(w, w * size, size) for w in range(inflight)]
    loads = build_loads(arena, refs, ini.block_size)
    max_inline = ini.ack.max_inline
    stores = build_stores(
        arena, refs, ini.block_size, max_inline, alloc=False, seal=False, inline=inline
    )
    allocs = build_stores(arena, refs, ini.block_size, max_inline, seal=False, inline=inline)
    return {
        "store": lambda w, i: stores[w],
        "load": lambda w, i: loads[w],
        "alloc_store": lambda w, i: replace(allocs[w], handle=inflight + i),
    }


async def _pipelined(
    ini: KbtpInitiator, inflight: int, iters: int, request_for: RequestFor, peer_cpu: CpuClock
) -> tuple[float, float]:
    """``iters`` requests, ``inflight`` outstanding, each next one submitted by the
    completion of the last (:meth:`KbtpInitiator.submit`: no task per request).

    Returns (wall-clock seconds, CPU seconds of both ends); a status other than SUCCESS or
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
    return seconds, cpu.seconds()


# ======================================================================================
# the command
# ======================================================================================


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "bench",
        help="ops/s and GB/s of LOAD, STORE, ALLOC_STORE against raw TCP",
        description="Measure KBTP LOAD, STORE and ALLOC_STORE over iWARP on loopback TCP, "
        "N requests in flight, next to a raw trio TCP request/response baseline moving the "
        "same octets.",
    )
    parser.add_argument(
        "-s",
        "--sizes",
        default=",".join(size_label(s) for s in DEFAULT_SIZES),
        metavar="LIST",
        help="block sizes, comma separated (default 4K,16K,64K,256K,1M)",
    )
    parser.add_argument(
        "-t",
        "--inflight",
        type=positive_int,
        default=DEFAULT_INFLIGHT,
        metavar="N",
        help=f"requests in flight (default {DEFAULT_INFLIGHT})",
    )
    parser.add_argument(
        "--ops",
        default=",".join(OPS),
        metavar="LIST",
        help="operations, comma separated (default store,load,alloc_store)",
    )
    group = parser.add_mutually_exclusive_group()
    group.add_argument(
        "-n", "--iters", type=positive_int, metavar="N", help="operations per row (fixed)"
    )
    group.add_argument(
        "--bytes",
        type=parse_size,
        default=DEFAULT_BYTES,
        metavar="SIZE",
        help=f"octets per row, {MIN_ITERS}..{MAX_ITERS} operations (default 32M)",
    )
    parser.add_argument(
        "--inline",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="force INLINE stores on or off (default: inline up to Max Inline)",
    )
    parser.add_argument(
        "--max-inline",
        type=positive_int,
        default=DEFAULT_MAX_INLINE,
        metavar="OCTETS",
        help=f"the target's Max Inline (default {DEFAULT_MAX_INLINE})",
    )
    parser.add_argument(
        "--per-request",
        action="store_true",
        help="one task per buffer awaiting load_into/store, which register the buffer for "
        "each request, instead of one arena registered once (docs/kbtp.md §13.1) and "
        "requests submitted by the completions",
    )
    parser.add_argument("--no-baseline", action="store_true", help="skip the raw TCP baseline")
    parser.add_argument(
        "--offload",
        action="store_true",
        help="STORE and LOAD on the software target and the offloaded one (docs/kbtp.md §8) in "
        "one process: ops/s, p50/p99, target application calls and CPU per operation, at "
        "4K, 64K, 1M (or --sizes) with 1 and --inflight requests in flight",
    )
    parser.add_argument(
        "--vs",
        choices=["mooncake"],
        help="also move the same blocks over Mooncake Transfer Engine's TCP transport "
        f"(STORE: batch writes, LOAD: batch reads; needs {MC_PACKAGE}, not a dependency)",
    )
    parser.add_argument(
        "--in-process",
        action="store_true",
        help="run target and baseline server in this process (default: a second process, "
        "CPU counted at both ends)",
    )
    add_mpa_arguments(parser, LOOPBACK_EMSS)
    parser.add_argument("--quiet", action="store_true", help="no progress on stderr")
    add_json_argument(parser)
    one_line_errors(parser)
    parser.set_defaults(func=run_bench)


def _parse_list(text: str, what: str) -> list[str]:
    items = [t.strip().lower() for t in text.split(",") if t.strip()]
    if not items:
        raise CliError(f"empty {what} list")
    return items


def result_row(r: Result) -> dict[str, Any]:
    """One ``--json`` row: the table's figures, units in the key names."""
    row: dict[str, Any] = {
        "operation": r.op.upper(),
        "size_bytes": r.size,
        "path": r.path,
        "iterations": r.iters,
        "seconds": r.seconds,
        "ops_per_s": r.ops,
        "gbyte_per_s": r.gbps,
        "gbit_per_s": r.gbps * 8,
        "cpu_us_per_op": r.cpu / r.iters * 1e6,
    }
    if r.raw_seconds is not None:
        raw_gbps = r.raw_gbps or 0.0
        row["baseline"] = {
            "seconds": r.raw_seconds,
            "ops_per_s": r.iters / r.raw_seconds,
            "gbyte_per_s": raw_gbps,
            "gbit_per_s": raw_gbps * 8,
            "cpu_us_per_op": None if r.raw_cpu is None else r.raw_cpu / r.iters * 1e6,
        }
        row["ratio"] = r.ratio
    if r.mc_seconds is not None:
        mc_gbps = r.mc_gbps or 0.0
        row["mooncake"] = {
            "transfer": MC_OPS[r.op],
            "seconds": r.mc_seconds,
            "gbyte_per_s": mc_gbps,
            "cpu_us_per_op": None if r.mc_cpu is None else r.mc_cpu / r.iters * 1e6,
        }
        row["vs_mooncake"] = r.vs_mooncake
    return row


def bench_document(
    parameters: dict[str, Any], results: list[Result], exit_status: int
) -> dict[str, Any]:
    """``kbtp bench --json``: parameters, the raw TCP baseline, the rows and the verdict."""
    baseline = None
    if parameters["baseline"]:
        baseline = {
            "name": "pipelined raw trio TCP request/response",
            "shape": "one connection, the same requests in flight, 40-octet requests and "
            "responses carrying the same block octets; the client sends every request it "
            "may at once, the server answers every pending request in one send; sends are "
            "scatter-gather sendmsg calls",
            "same_run": True,
        }
    return {
        "schema": schema("kbtp bench"),
        "command": "kbtp bench",
        "parameters": parameters,
        "baseline": baseline,
        "ratio_is": "KBTP GB/s over the baseline's GB/s",
        "results": [result_row(r) for r in results],
        "exit_status": exit_status,
        "verdict": "ok" if exit_status == 0 else "error",
    }


def run_bench(args: argparse.Namespace) -> int:
    problem = check_json_path(args.json)
    if problem:
        raise CliError(problem)
    if args.offload:
        return run_offload(args, ",".join(size_label(s) for s in DEFAULT_SIZES))
    with text_to_stderr_if_json_stdout(args.json):
        results, parameters = _run_bench(args)
    if args.json:
        write_json(args.json, bench_document(parameters, results, 0))
    return 0


def _run_bench(args: argparse.Namespace) -> tuple[list[Result], dict[str, Any]]:
    try:
        sizes = [parse_size(s) for s in _parse_list(args.sizes, "size")]
    except argparse.ArgumentTypeError as exc:
        raise CliError(f"argument --sizes: {exc}") from None
    ops = _parse_list(args.ops, "operation")
    unknown = [op for op in ops if op not in OPS]
    if unknown:
        raise CliError(f"unknown operation {unknown[0]!r} (store, load, alloc_store)")
    if args.vs and not mooncake_available():
        raise CliError(f"--vs mooncake needs the {MC_PACKAGE} package, which is not installed")
    settings = mpa_settings(args)
    assert settings.emss is not None  # --emss defaults to LOOPBACK_EMSS here
    mulpdu = mulpdu_for(settings.emss, settings.want_markers)
    layout = "one process" if args.in_process else "target in a second process"
    memory = "buffers registered per request" if args.per_request else "one arena"
    print(
        f"kbtp bench: {args.inflight} in flight, one session, {memory}, loopback TCP, {layout}, "
        f"CRC {'on' if args.crc else 'off'}, EMSS {settings.emss} (MULPDU {mulpdu})"
    )
    print(HEADER + (MC_HEADER if args.vs else ""), flush=True)
    results: list[Result] = []

    def progress(text: str) -> None:
        if not args.quiet:
            print(f"kbtp bench: {text}", file=sys.stderr, flush=True)

    @asynccontextmanager
    async def row_target(size: int, iters: int) -> AsyncIterator[tuple[int, int, CpuClock]]:
        """(KBTP port, raw port, the peer's CPU clock) of one row's target."""
        blocks = pool_blocks(ops, iters, args.inflight)
        if args.in_process:
            config = bench_config(size, blocks, args.inflight, args.max_inline)
            async with KbtpTarget(config, settings=settings).running() as target:
                yield target.port, raw_port, no_peer
            return
        async with peer_process(size, blocks, args.inflight, args.max_inline, mpa) as peer:
            yield peer.port, peer.raw_port, peer.cpu

    raw_port = 0
    mpa = [
        "--crc" if args.crc else "--no-crc",
        *(["--markers"] if args.markers else []),
        f"--emss={settings.emss}",
    ]

    async def main() -> None:
        nonlocal raw_port
        async with trio.open_nursery() as nursery:
            if args.in_process and not args.no_baseline:
                listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
                raw_port = listeners[0].socket.getsockname()[1]
                nursery.start_soon(
                    trio.serve_listeners,
                    lambda s: raw_server(s, max(sizes)),
                    listeners,
                )
            for size in sizes:
                iters = iterations(size, args.bytes, args.iters)
                progress(f"{size_label(size)}: KBTP, {iters} operations per row")
                async with row_target(size, iters) as (port, raw, cpu):
                    rows = await bench_kbtp_size(
                        size,
                        ops,
                        iters,
                        args.inflight,
                        settings,
                        args.inline,
                        args.max_inline,
                        port=port,
                        peer_cpu=cpu,
                        per_request=args.per_request,
                    )
                    for row in rows:
                        if not args.no_baseline:
                            progress(f"{size_label(size)}: raw TCP {row.op}")
                            row.raw_seconds, row.raw_cpu = await bench_raw(
                                raw, row.op, size, iters, args.inflight, cpu
                            )
                        if args.vs and row.op in MC_OPS:
                            progress(f"{size_label(size)}: Mooncake {MC_OPS[row.op]}")
                            figures = await trio.to_thread.run_sync(
                                run_mooncake, size, iters, args.inflight
                            )
                            mc = figures[MC_OPS[row.op]]
                            row.mc_seconds, row.mc_cpu = mc.seconds, mc.cpu
                        print(format_row(row, bool(args.vs)), flush=True)
                        results.append(row)
            nursery.cancel_scope.cancel()

    run_trio(main)
    parameters = {
        "sizes_bytes": sizes,
        "operations": ops,
        "inflight": args.inflight,
        "iters": args.iters,
        "bytes_per_row": None if args.iters else args.bytes,
        "inline": args.inline,
        "max_inline_bytes": args.max_inline,
        "crc": args.crc,
        "emss_bytes": settings.emss,
        "mulpdu_bytes": mulpdu,
        "baseline": not args.no_baseline,
        "processes": 1 if args.in_process else 2,
        "registration": "per request" if args.per_request else "arena",
        "vs": args.vs,
    }
    return results, parameters
