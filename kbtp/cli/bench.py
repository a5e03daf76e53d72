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
and deregister the buffer for every request (:mod:`kbtp.cli.bench_kbtp`).

``--offload`` measures STORE and LOAD on the software and the offloaded target instead
(:mod:`kbtp.cli.bench_offload`, docs/kbtp.md §8).

``--connect HOST[:PORT]`` measures a target started by hand (``kbtp target`` on another
host, say) as ``--identity`` (default ``init-0``), at its block size and within what its
HELLO_ACK grants, with no baseline and this process's CPU alone; it binds handles of the
identity's own range only and frees them when each run ends (:mod:`kbtp.cli.bench_connect`).

The baseline, in the same run, is pipelined raw trio TCP with the same shape
(:mod:`kbtp.cli.bench_baseline`): one connection, N requests in flight, a 40-octet request
and a 40-octet response, with the block's octets in the response (LOAD) or after the
request (STORE, ALLOC_STORE); the client sends every request it may in one go, the server
answers every complete request in one send (both scatter-gather ``sendmsg``) and copies
stored octets into its memory, as the target places them; it runs once per receive size
of ``RAW_RECEIVE_SIZES`` (128 and 256 KiB per ``recv_into``) and the faster run counts;
both ends make the stack's driver's socket calls (:mod:`stack.bench.raw_socket`).
Figures: operations per second
and GB/s (10^9 octets per second) of block data, KBTP over raw, and the process CPU time
per operation of each, both ends counted (the peer's from ``/proc``; CPU per operation is
the figure that survives a busy machine best; the JSON splits KBTP's by end,
``cpu_us_per_op_initiator`` and ``cpu_us_per_op_target``, in clock ticks of /proc, so the
end that bounds the rate shows).  Speed is reported, never asserted.  The
rows, the table and the ``--json`` document: :mod:`kbtp.cli.bench_report`.  ``-r N``
measures each size N times, each run on a fresh target with its baseline right after it,
and prints each operation's run with the median ratio and the range of all runs: single
runs of these rows move by 10-20 % on a busy machine.

``--floor`` adds, right after each row's baseline, the pure-Python floor of the same
exchange (:mod:`kbtp.cli.bench_floor`): real FPDUs with CRC32c at both ends, the placement
copy and the request and COMPLETION as Sends, nothing else, the same requests in flight,
its target in a process of its own (``--in-process``: in this one); its ops/s, GB/s,
ratio to the baseline, KBTP over it and CPU per operation of both ends (ALLOC_STORE's
floor is STORE's exchange).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, nullcontext
from typing import Any

import trio

from kbtp.cli import bounds
from kbtp.cli.bench_baseline import bench_raw, raw_server
from kbtp.cli.bench_connect import (
    DEFAULT_IDENTITY,
    SESSION_ERRORS,
    RemoteTarget,
    check_connect_options,
    probe_target,
    target_address,
)
from kbtp.cli.bench_cpu import CpuClock, no_peer
from kbtp.cli.bench_floor import bench_floor, floor_target
from kbtp.cli.bench_kbtp import OPS, bench_kbtp_size, pool_blocks
from kbtp.cli.bench_kbtp import Job as Job
from kbtp.cli.bench_kbtp import RequestFor as RequestFor
from kbtp.cli.bench_kbtp import _arena_requests as _arena_requests
from kbtp.cli.bench_kbtp import _per_request_jobs as _per_request_jobs
from kbtp.cli.bench_kbtp import _pipelined as _pipelined
from kbtp.cli.bench_kbtp import _workers as _workers
from kbtp.cli.bench_mooncake import PACKAGE as MC_PACKAGE
from kbtp.cli.bench_mooncake import mooncake_problem, run_mooncake
from kbtp.cli.bench_offload import run_offload
from kbtp.cli.bench_peer import bench_config, peer_process
from kbtp.cli.bench_plot import save_kbtp_plot
from kbtp.cli.bench_report import (
    FLOOR_HEADER,
    HEADER,
    MC_HEADER,
    MC_OPS,
    REPEAT_HEADER,
    Result,
    bench_document,
    format_row,
    median_result,
    size_label,
)
from kbtp.cli.bench_report import result_row as result_row
from kbtp.cli.target import DEFAULT_PORT as TARGET_PORT
from kbtp.cli.target import (
    LOOPBACK_EMSS,
    add_mpa_arguments,
    checked_target,
    identity_name,
    mpa_settings,
    run_trio,
)
from kbtp.constants import DEFAULT_MAX_INLINE, MAX_REQUEST_CREDITS
from stack.bench.plot import MISSING_MATPLOTLIB, check_plot_path, have_matplotlib
from stack.bench.process import cpu_list, pin_to, usable_cpus
from stack.cli import CliError, add_repeat_argument, one_line_errors
from stack.cli.json_report import (
    add_json_argument,
    check_json_path,
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


def iterations(size: int, total: int, fixed: int | None) -> int:
    if fixed is not None:
        return fixed
    return max(MIN_ITERS, min(MAX_ITERS, total // size))


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
        metavar="LIST",
        help="block sizes, comma separated (default 4K,16K,64K,256K,1M; each at most 64M)",
    )
    parser.add_argument(
        "-t",
        "--inflight",
        type=bounds.inflight,
        default=DEFAULT_INFLIGHT,
        metavar="N",
        help=f"requests in flight (default {DEFAULT_INFLIGHT}, at most {MAX_REQUEST_CREDITS})",
    )
    parser.add_argument(
        "--ops",
        default=",".join(OPS),
        metavar="LIST",
        help="operations, comma separated (default store,load,alloc_store)",
    )
    group = parser.add_mutually_exclusive_group()
    group.add_argument(
        "-n",
        "--iters",
        type=bounds.iterations,
        metavar="N",
        help=f"operations per row (fixed, at most {bounds.MAX_POOL_BLOCKS})",
    )
    group.add_argument(
        "--bytes",
        type=bounds.row_bytes,
        default=DEFAULT_BYTES,
        metavar="SIZE",
        help=f"octets per row, {MIN_ITERS}..{MAX_ITERS} operations (default 32M, at most 1G)",
    )
    parser.add_argument(
        "--inline",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="force INLINE stores on or off (default: inline up to Max Inline)",
    )
    parser.add_argument(
        "--max-inline",
        type=bounds.max_inline,
        metavar="OCTETS",
        help=f"the target's Max Inline (default {DEFAULT_MAX_INLINE}, at most 64M)",
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
        "--floor",
        action="store_true",
        help="also measure, right after each baseline, the pure-Python floor of the same "
        "exchange (FPDUs with CRC32c at both ends, the placement copy, the request and "
        "COMPLETION as Sends; nothing else; ALLOC_STORE's is STORE's); not with --offload "
        "or --markers",
    )
    add_repeat_argument(
        parser,
        "each run a fresh target: KBTP, then the baseline; each operation's run with the "
        "median ratio is printed, the median ops/s without a baseline",
    )
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
    parser.add_argument(
        "--connect",
        type=target_address,
        metavar="HOST[:PORT]",
        help=f"measure a target started by hand (kbtp target; port {TARGET_PORT} unless "
        "given) at its block size, as --identity; the handles it binds are freed at the "
        "end; no baseline, and the CPU is this process's",
    )
    parser.add_argument(
        "--identity",
        type=identity_name,
        metavar="NAME",
        help=f"with --connect: the identity to say HELLO as (default {DEFAULT_IDENTITY}); "
        "its handles must be free",
    )
    parser.add_argument(
        "--cpus",
        type=cpu_list,
        metavar="CLIENT[,TARGET]",
        help="run the initiator on CPU CLIENT, and the target, the baseline's server, the "
        "floor's target and Mooncake's server on CPU TARGET (one CPU: all there; "
        "--in-process and --offload: one CPU, this process's)",
    )
    add_mpa_arguments(parser, LOOPBACK_EMSS)
    parser.add_argument("--quiet", action="store_true", help="no progress on stderr")
    add_json_argument(parser)
    parser.add_argument(
        "--plot",
        metavar="FILE.png",
        help="also draw the rows: GB/s and CPU per operation against the block size, KBTP "
        "and each baseline the run measured (needs the 'plot' extra: matplotlib)",
    )
    one_line_errors(parser)
    parser.set_defaults(func=run_bench)


def _parse_list(text: str, what: str) -> list[str]:
    items = [t.strip().lower() for t in text.split(",") if t.strip()]
    if not items:
        raise CliError(f"empty {what} list")
    return items


def run_bench(args: argparse.Namespace) -> int:
    problem = check_json_path(args.json) or check_plot_path(args.plot)
    if problem:
        raise CliError(problem)
    if args.plot and args.offload:
        raise CliError("--plot draws the KBTP and baseline rows, not --offload")
    if args.plot and not have_matplotlib():
        raise CliError(MISSING_MATPLOTLIB)
    if args.offload and args.repeat > 1:
        raise CliError("--repeat applies to the KBTP and baseline rows, not --offload")
    if args.floor and args.offload:
        raise CliError("--floor applies to the KBTP and baseline rows, not --offload")
    if args.floor and args.markers:
        raise CliError("--floor frames FPDUs without markers (iwarp bench floor measures them)")
    check_connect_options(args)
    if args.max_inline is None:
        args.max_inline = DEFAULT_MAX_INLINE
    if args.sizes is None and args.connect is None:
        args.sizes = ",".join(size_label(s) for s in DEFAULT_SIZES)
    _pin_client(args)
    if args.offload:
        return run_offload(args, ",".join(size_label(s) for s in DEFAULT_SIZES))
    with text_to_stderr_if_json_stdout(args.json):
        results, parameters = _run_bench(args)
    doc = bench_document(parameters, results, 0)
    if args.json:
        write_json(args.json, doc)
    if args.plot and results:
        save_kbtp_plot(args.plot, doc)
    return 0


def _pin_client(args: argparse.Namespace) -> None:
    """``--cpus``: check both CPUs are this process's to use, then run it on the first (the
    processes it starts pin themselves to the last, :func:`target_cpu`)."""
    if args.cpus is None:
        return
    text = ",".join(map(str, args.cpus))
    if len(args.cpus) > 1 and (args.in_process or args.offload):
        where = "--in-process" if args.in_process else "--offload"
        raise CliError(f"--cpus {text}: {where} runs the target in this process: give one CPU")
    allowed = usable_cpus()
    for cpu in args.cpus:
        if cpu not in allowed:
            raise CliError(f"--cpus {text}: this process may not run on CPU {cpu}")
    try:
        pin_to(args.cpus[0])
    except OSError as exc:
        raise CliError(str(exc)) from None


def _remote_target(
    args: argparse.Namespace, ops: list[str], settings: MpaSettings
) -> RemoteTarget | None:
    """``--connect``: what the target grants the bench's identity, checked against
    ``--inflight``; None without ``--connect``."""
    if args.connect is None:
        return None
    host, port = args.connect
    identity = args.identity or DEFAULT_IDENTITY
    remote: list[RemoteTarget] = []

    async def probe() -> None:
        remote.append(await probe_target(host, port, identity, settings))

    run_trio(probe)
    remote[0].check(ops, args.inflight)
    return remote[0]


def target_cpu(args: argparse.Namespace) -> int | None:
    """The CPU of the processes ``kbtp bench`` starts (``--cpus``' last), or None."""
    return None if args.cpus is None else int(args.cpus[-1])


def parse_sizes(text: str) -> list[int]:
    """The block sizes of ``--sizes`` (CliError naming the option)."""
    try:
        return [bounds.block_size(s) for s in _parse_list(text, "size")]
    except argparse.ArgumentTypeError as exc:
        raise CliError(f"argument --sizes: {exc}") from None


def _run_bench(args: argparse.Namespace) -> tuple[list[Result], dict[str, Any]]:
    ops = _parse_list(args.ops, "operation")
    unknown = [op for op in ops if op not in OPS]
    if unknown:
        raise CliError(f"unknown operation {unknown[0]!r} (store, load, alloc_store)")
    settings = mpa_settings(args)
    assert settings.emss is not None  # --emss defaults to LOOPBACK_EMSS here
    mulpdu = mulpdu_for(settings.emss, settings.want_markers)
    remote = _remote_target(args, ops, settings)
    if remote is not None:
        sizes = [remote.block_size]
        args.max_inline = remote.max_inline
        args.no_baseline = True
    else:
        sizes = parse_sizes(args.sizes)
    if args.inline and max(sizes) > args.max_inline:
        limit = "the target's Max Inline" if remote is not None else "--max-inline"
        raise CliError(
            f"--inline: blocks of {max(sizes)} octets exceed {limit} {args.max_inline} "
            "(an INLINE store carries at most Max Inline, docs/kbtp.md §6.2)"
        )
    if remote is None:
        for size in sizes:  # every row's target, before any is started
            blocks = pool_blocks(ops, iterations(size, args.bytes, args.iters), args.inflight)
            config = bench_config(size, blocks, args.inflight, args.max_inline)
            bounds.check_target_config(config)
    problem = mooncake_problem() if args.vs else None
    if problem is not None:
        raise CliError(f"--vs mooncake {problem}")
    if remote is not None:
        layout = (
            f"the target at {remote.host}:{remote.port} as {remote.identity!r} (quota "
            f"{remote.quota} blocks, {remote.request_credits} Request Credits), CPU of this "
            "process only, no baseline"
        )
    elif args.in_process:
        layout = "loopback TCP, one process"
    else:
        layout = "loopback TCP, target in a second process"
    if args.cpus is not None:
        if remote is not None:
            where = f"initiator on CPU {args.cpus[0]}"
        elif args.in_process:
            where = f"CPU {args.cpus[0]}"
        else:
            where = f"initiator on CPU {args.cpus[0]}, target on CPU {target_cpu(args)}"
        layout += f" ({where}, --cpus)"
    memory = "buffers registered per request" if args.per_request else "one arena"
    print(
        f"kbtp bench: {args.inflight} in flight, one session, {memory}, {layout}, "
        f"CRC {'on' if args.crc else 'off'}, EMSS {settings.emss} (MULPDU {mulpdu})"
    )
    if remote is not None:
        iters = iterations(remote.block_size, args.bytes, args.iters)
        allocs = remote.alloc_iters(args.inflight, iters)
        if "alloc_store" in ops and allocs < iters:
            print(
                f"kbtp bench: ALLOC_STORE rows of {allocs} operations, not {iters}: the "
                f"blocks {remote.identity!r} may bind besides the {args.inflight} in flight"
            )
    print(
        HEADER
        + (FLOOR_HEADER if args.floor else "")
        + (MC_HEADER if args.vs else "")
        + (REPEAT_HEADER if args.repeat > 1 else ""),
        flush=True,
    )
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
            async with checked_target(config, settings=settings).running() as target:
                yield target.port, raw_port, no_peer
            return
        if remote is not None:
            yield remote.port, 0, no_peer
            return
        cpu = target_cpu(args)
        async with peer_process(size, blocks, args.inflight, args.max_inline, mpa, cpu) as peer:
            yield peer.port, peer.raw_port, peer.cpu

    raw_port = floor_port = 0
    mpa = [
        "--crc" if args.crc else "--no-crc",
        *(["--markers"] if args.markers else []),
        f"--emss={settings.emss}",
    ]

    async def one_run(size: int, iters: int, show: bool) -> list[Result]:
        """One run of every operation at ``size`` on a fresh target, then the baselines;
        ``show`` prints each row as it is done."""
        async with row_target(size, iters) as (port, raw, cpu):
            rows = await _kbtp_rows(size, iters, port, cpu)
            for row in rows:
                if not args.no_baseline:
                    progress(f"{size_label(size)}: raw TCP {row.op}")
                    row.raw_seconds, row.raw_cpu = await bench_raw(
                        raw, row.op, size, iters, args.inflight, cpu
                    )
                if args.floor:
                    progress(f"{size_label(size)}: floor {row.op}")
                    row.floor_seconds, row.floor_cpu = await bench_floor(
                        floor_port,
                        row.op,
                        row.path,
                        size,
                        iters,
                        args.inflight,
                        mulpdu=mulpdu,
                        crc=args.crc,
                        peer_cpu=not args.in_process,
                    )
                if args.vs and row.op in MC_OPS:
                    progress(f"{size_label(size)}: Mooncake {MC_OPS[row.op]}")
                    figures = await trio.to_thread.run_sync(
                        run_mooncake, size, iters, args.inflight, target_cpu(args)
                    )
                    mc = figures[MC_OPS[row.op]]
                    row.mc_seconds, row.mc_cpu = mc.seconds, mc.cpu
                if show:
                    print(format_row(row, bool(args.vs), floor=args.floor), flush=True)
                    results.append(row)
        return rows

    async def _kbtp_rows(size: int, iters: int, port: int, cpu: CpuClock) -> list[Result]:
        """The KBTP rows of one run; a target started by hand (``remote``) gets its own
        host, identity and ALLOC_STORE count, its handles freed after, and a session that
        ends early is the run's one-line error."""
        common = (size, ops, iters, args.inflight, settings, args.inline, args.max_inline)
        if remote is None:
            return await bench_kbtp_size(
                *common, port=port, peer_cpu=cpu, per_request=args.per_request
            )
        try:
            return await bench_kbtp_size(
                *common,
                port=port,
                per_request=args.per_request,
                host=remote.host,
                identity=remote.identity,
                alloc_iters=remote.alloc_iters(args.inflight, iters),
                cleanup=True,
            )
        except SESSION_ERRORS as exc:
            raise CliError(f"the session with {remote.host}:{remote.port} ended: {exc}") from None

    async def main() -> None:
        nonlocal raw_port, floor_port
        floor = floor_target(args.in_process, target_cpu(args)) if args.floor else nullcontext(0)
        async with floor as floor_port, trio.open_nursery() as nursery:
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
                runs: list[list[Result]] = []
                for run in range(args.repeat):
                    note = f", run {run + 1} of {args.repeat}" if args.repeat > 1 else ""
                    progress(f"{size_label(size)}: KBTP, {iters} operations per row{note}")
                    runs.append(await one_run(size, iters, args.repeat == 1))
                if args.repeat > 1:
                    for per_op in zip(*runs, strict=True):
                        row = median_result(per_op)
                        line = format_row(row, bool(args.vs), args.repeat, args.floor)
                        print(line, flush=True)
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
        "connect": None if remote is None else remote.as_json(),
        "registration": "per request" if args.per_request else "arena",
        "vs": args.vs,
        "floor": args.floor,
        "repeat": args.repeat,
        "cpus": None
        if args.cpus is None
        else {"client": args.cpus[0], "target": None if args.in_process else target_cpu(args)},
    }
    return results, parameters
