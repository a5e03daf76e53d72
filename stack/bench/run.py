"""Benchmark runs end to end: the server half as asked, the client, the tables.

:func:`run_benchmark` runs one ``iwarp bench write|read|send|atomic``: by default it spawns
the server half (``iwarp bench server``) on 127.0.0.1 and drives it; ``--connect`` uses a
server started by hand, ``--in-process`` runs both in one trio run.  ``--cpu``
(perftest's ``--cpu_util``, per message here) adds the CPU time (user + system) each
process spent per message, for iWARP and for the baseline: a figure that survives a busy
machine better than wall-clock rates do.  :func:`run_idle_qps` connects N idle QPs to one
server process and reports its RSS growth per QP.
"""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field, replace
from typing import TextIO

import trio

from stack.bench.baseline import raw_bandwidth, raw_latency, raw_receive_sizes
from stack.bench.blocking import blocking_bandwidth, blocking_latency
from stack.bench.blocking_iwarp import blocking_latency_run
from stack.bench.client import Client, ClientQp, measure_bw, measure_lat
from stack.bench.options import WARMUP_ITERS, BenchError, BenchOptions, mpa_settings
from stack.bench.process import PROJECT_ROOT, rss_bytes
from stack.bench.progress import Progress
from stack.bench.protocol import SessionSpec
from stack.bench.report import (
    RESULT_LINE,
    bw_header,
    format_bw,
    format_idle,
    format_lat,
    header_block,
    lat_header,
)
from stack.bench.results import BwResult, CpuCost, IdleResult, LatResult, median_run
from stack.bench.server import BenchServer
from stack.cli.capture import capturing_manager
from stack.rnic import Rnic
from stack.transport.cm import ConnectionManager
from stack.wire.events import Negotiated


def server_command(crc: bool, markers: bool, emss: int | None, cpu: int | None = None) -> list[str]:
    """The spawned server half: ``iwarp bench server`` (run as ``python -m stack.cli.iwarp``),
    pinned to ``cpu`` if given."""
    cmd = [sys.executable, "-m", "stack.cli.iwarp", "bench", "server", "--port", "0"]
    cmd += ["--host", "127.0.0.1", "--exit-on-stdin-eof", "--crc" if crc else "--no-crc"]
    if markers:
        cmd.append("--markers")
    if emss is not None:
        cmd += ["--mtu", str(emss)]
    if cpu is not None:
        cmd += ["--cpus", str(cpu)]
    return cmd


@asynccontextmanager
async def server_for(
    mode: str,
    *,
    host: str,
    port: int,
    crc: bool,
    markers: bool,
    emss: int | None,
    cpu: int | None = None,
) -> AsyncIterator[tuple[str, int, str]]:
    """The server half for a run: (host, port, description of the layout); a spawned
    server runs on ``cpu`` if given."""
    if mode == "connect":
        yield host, port, f"{host}:{port} (run by hand)"
        return
    if mode == "in-process":
        server = BenchServer(crc=crc, markers=markers, emss=emss)
        async with trio.open_nursery() as nursery:
            iwarp_port, _raw = await nursery.start(server.run)
            yield "127.0.0.1", iwarp_port, "in this process"
            nursery.cancel_scope.cancel()
        return
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [PROJECT_ROOT, env.get("PYTHONPATH")]))
    proc = await trio.lowlevel.open_process(
        server_command(crc, markers, emss, cpu),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env=env,
    )
    assert proc.stdin is not None and proc.stdout is not None
    try:
        line = bytearray()
        with trio.move_on_after(60):
            while not line.endswith(b"\n"):
                chunk = await proc.stdout.receive_some(1)
                if not chunk:
                    break
                line += chunk
        words = line.split()
        if len(words) != 3 or words[0] != b"PORT":
            raise BenchError("the server process did not start (see its error above)")
        where = "" if cpu is None else f", CPU {cpu}"
        yield "127.0.0.1", int(words[1]), f"127.0.0.1:{int(words[1])} (process {proc.pid}{where})"
    finally:
        with trio.CancelScope(shield=True):
            await proc.stdin.aclose()
            with trio.move_on_after(10):
                await proc.wait()
            if proc.returncode is None:
                proc.kill()
                await proc.wait()


@dataclass(slots=True)
class BenchRecord:
    """What a run learned, filled as it goes (so a failed run keeps its first rows):
    the negotiated connection of the first QP, the server layout, the result rows."""

    negotiated: Negotiated | None = None
    layout: str = ""
    results: list[BwResult | LatResult] = field(default_factory=list)


async def run_benchmark(
    opts: BenchOptions,
    out: TextIO | None = None,
    err: TextIO | None = None,
    record: BenchRecord | None = None,
) -> list[BwResult | LatResult]:
    """Run ``opts`` end to end: tables on ``out`` (stdout), progress on ``err`` (stderr);
    ``record`` (if given) receives the connection and each row as they come."""
    out = out or sys.stdout
    progress = Progress((err or sys.stderr) if opts.progress else None)
    record = record if record is not None else BenchRecord()
    results = record.results
    async with server_for(
        opts.mode,
        host=opts.host,
        port=opts.port,
        crc=opts.crc,
        markers=opts.markers,
        emss=opts.emss,
        cpu=opts.server_cpu if opts.mode == "spawn" else None,
    ) as (host, port, layout):
        record.layout = layout
        async with capturing_manager(Rnic("bench-client"), opts.capture) as cm:
            client = Client(cm, host, port)
            tx_depth = 1 if opts.latency else opts.tx_depth
            printed = shared = False
            for size in opts.sizes:
                runs: list[BwResult | LatResult] = []
                for run in range(opts.repeat):
                    qps: list[ClientQp] = []
                    # --blocking: one trio QP, the first, tells the negotiation and the port
                    if not (opts.blocking and printed):
                        qps = await client.connect_many(
                            _session_spec(opts, size),
                            opts.mpa_settings,
                            opts.num_qps,
                            tx_depth=tx_depth,
                            ord=opts.ord,
                        )
                    if not printed:
                        neg = qps[0].conn.negotiated
                        assert neg is not None
                        record.negotiated = neg
                        emss = qps[0].conn.engine.settings.emss
                        lines = header_block(opts, neg, layout, emss)
                        header = lat_header if opts.latency else bw_header
                        lines.append(header(opts.baseline, opts.cpu, opts.repeat))
                        out.write("\n".join(lines) + "\n")
                        out.flush()
                        printed = True
                        if opts.cpu:
                            shared = (await client.server_stats())["pid"] == os.getpid()
                    if opts.repeat > 1:
                        progress.note(f"{opts.test} {size} B: run {run + 1} of {opts.repeat}")
                    runs.append(await _one_run(qps, host, client, opts, size, shared, progress))
                result = runs[0] if opts.repeat == 1 else median_run(runs)
                results.append(result)
                if isinstance(result, LatResult):
                    out.write(format_lat(result, opts.baseline, opts.cpu, opts.repeat) + "\n")
                else:
                    out.write(format_bw(result, opts.baseline, opts.cpu, opts.repeat) + "\n")
                out.flush()
            out.write(RESULT_LINE + "\n")
            out.flush()
    return results


def _session_spec(opts: BenchOptions, size: int) -> SessionSpec:
    """What the server is asked for one run of ``size`` (Send: the receives it keeps)."""
    send_bw = opts.test == "send" and not opts.latency
    return SessionSpec(opts.test, size, opts.latency, opts.rx_depth_for(size) if send_bw else 0)


async def _one_run(
    qps: list[ClientQp],
    host: str,
    client: Client,
    opts: BenchOptions,
    size: int,
    shared: bool,
    progress: Progress,
) -> BwResult | LatResult:
    """One run of ``size`` on the connected ``qps`` (closed after it), then its baselines."""
    try:
        result: BwResult | LatResult
        if opts.blocking and qps:  # the probe QP of the first run: closed before timing
            await client.close(qps)
            qps = []
        meter = CpuMeter(client, shared) if opts.cpu else None
        if meter:
            await meter.start()
        if opts.blocking:
            result = await _blocking_iwarp_latency(host, client, opts, size, progress)
        elif opts.latency:
            result = await measure_lat(qps[0], opts, size, progress)
        else:
            result = await measure_bw(qps, opts, size, progress)
        if meter:
            result = replace(result, cpu=await meter.stop(_messages(result)))
    finally:
        await client.close(qps)
    if opts.baseline:
        result = await _raw_baseline(result, host, client, opts, shared)
        result = await _blocking_baseline(result, host, client, opts)
    return result


async def _blocking_iwarp_latency(
    host: str, client: Client, opts: BenchOptions, size: int, progress: Progress
) -> LatResult:
    """``--blocking``: the latency run on the blocking driver, in a worker thread, against
    the server's blocking iWARP port."""
    if not client.iwarp_blocking_port:
        raise BenchError("the server has no blocking iWARP port (an older server?)")
    iters = None if opts.duration is not None else opts.iterations_for(size)
    progress.start(f"{opts.test} latency {size} B (blocking driver)", iters, opts.duration)
    # The trio thread only waits meanwhile, so the worker may report progress itself.
    result = await trio.to_thread.run_sync(
        blocking_latency_run,
        host,
        client.iwarp_blocking_port,
        opts.mpa_settings,
        opts,
        size,
        iters,
        progress.advance,
    )
    progress.finish()
    return result


async def _raw_baseline(
    result: BwResult | LatResult, host: str, client: Client, opts: BenchOptions, shared: bool
) -> BwResult | LatResult:
    """``result`` with the raw trio figures of the same exchange: bandwidth from the fastest
    run over :func:`~stack.bench.baseline.raw_receive_sizes`, its CPU with it."""
    size = result.size
    if isinstance(result, LatResult):
        meter = CpuMeter(client, shared) if opts.cpu else None
        if meter:
            await meter.start()
        raw = await raw_latency(host, client.raw_port, opts, size, result.iterations)
        result = replace(result, raw_typical=raw)
        if meter:
            result = replace(result, raw_cpu=await meter.stop(_messages(result)))
        return result
    best: BwResult | None = None
    for receive in raw_receive_sizes(opts):
        meter = CpuMeter(client, shared) if opts.cpu else None
        if meter:
            await meter.start()
        bw = await raw_bandwidth(host, client.raw_port, opts, size, result.messages, receive)
        run = replace(result, raw_bw=bw)
        if meter:
            run = replace(run, raw_cpu=await meter.stop(_messages(run)))
        if best is None or (run.raw_bw or 0) > (best.raw_bw or 0):
            best = run
    assert best is not None
    return best


async def _blocking_baseline(
    result: BwResult | LatResult, host: str, client: Client, opts: BenchOptions
) -> BwResult | LatResult:
    """``result`` with the blocking-socket figure of the same exchange (a worker thread)."""
    if not client.blocking_port:
        return result
    port = client.blocking_port
    if isinstance(result, LatResult):
        size, count = result.size, result.iterations
        lat = await trio.to_thread.run_sync(blocking_latency, host, port, opts, size, count)
        return replace(result, blocking_typical=lat)
    size, count = result.size, result.messages
    bw = await trio.to_thread.run_sync(blocking_bandwidth, host, port, opts, size, count)
    return replace(result, blocking_bw=bw)


def _messages(result: BwResult | LatResult) -> int:
    """Messages (latency: round trips, warm-up included) a CPU measurement covers."""
    if isinstance(result, LatResult):
        return result.iterations + WARMUP_ITERS
    return result.messages


class CpuMeter:
    """CPU time of both processes across one measurement (``--cpu``)."""

    def __init__(self, client: Client, shared: bool) -> None:
        self.client = client
        self.shared = shared
        self._own = 0
        self._server = 0

    async def _server_ns(self) -> int:
        return 0 if self.shared else (await self.client.server_stats())["cpu_ns"]

    async def start(self) -> None:
        self._server = await self._server_ns()
        self._own = time.process_time_ns()

    async def stop(self, messages: int) -> CpuCost:
        own = time.process_time_ns() - self._own
        server = await self._server_ns() - self._server
        per = 1e-3 / max(messages, 1)
        return CpuCost(own * per, None if self.shared else server * per)


async def run_idle_qps(
    count: int,
    *,
    mode: str,
    host: str,
    port: int,
    crc: bool,
    markers: bool,
    out: TextIO | None = None,
    err: TextIO | None = None,
    progress: bool = True,
    parallel: int = 32,
) -> IdleResult:
    """Connect ``count`` idle QPs to one server process and report its RSS growth per QP."""
    out = out or sys.stdout
    report = Progress((err or sys.stderr) if progress else None)
    settings = mpa_settings(crc, markers, None)
    spec = SessionSpec("idle", 0)
    async with server_for(mode, host=host, port=port, crc=crc, markers=markers, emss=None) as (
        host,
        port,
        layout,
    ):
        async with ConnectionManager.open(Rnic("bench-client")) as cm:
            client = Client(cm, host, port)
            # One QP first: the server's lazily built state (imports, caches) is not per QP.
            warm = await client.connect_many(spec, settings, 1, tx_depth=1, ord=1)
            await trio.sleep(0.1)
            before = await client.server_stats(collect=True)
            gc.collect()
            client_before = rss_bytes()
            report.start(f"connecting {count} idle QPs", count)
            qps = await client.connect_many(
                spec, settings, count, tx_depth=1, ord=1, parallel=parallel, progress=report
            )
            report.finish()
            await trio.sleep(0.2)  # let the last handshakes' buffers go
            after = await client.server_stats(collect=True)
            gc.collect()
            client_after = rss_bytes()
            if after["qps"] != count + 1:
                raise BenchError(f"server reports {after['qps']} QPs, expected {count + 1}")
            result = IdleResult(
                count,
                before["rss"],
                after["rss"],
                client_before,
                client_after,
                after["pid"] == os.getpid(),
            )
            await client.close(warm + qps)
    for line in format_idle(result, layout):
        out.write(line + "\n")
    out.flush()
    return result
