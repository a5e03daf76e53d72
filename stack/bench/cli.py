"""``iwarp bench write|read|send|atomic``: perftest-style RDMA benchmarks over the software RNIC.

Modelled on perftest (``ib_write_bw``, ``ib_read_lat``, ...): the same options where they make
sense (``-s``, ``-a``, ``-n``, ``-D``, ``-q``, ``--post-list``, ``--cq-mod``, ``-t``), the same
table headers and dashed separators, the same split into a passive server and an active
client.  By default the client spawns the server half (``iwarp bench server``) on 127.0.0.1
and drives it; ``--server`` and ``--connect HOST:PORT`` run the halves by hand,
``--in-process`` runs both in one trio run.  ``iwarp bench idle-qps`` measures the memory
of idle connected QPs, ``iwarp bench floor`` the pure-Python floor of a bulk Write against raw
TCP (:mod:`stack.bench.floor`).  Also runnable as ``python -m stack.bench.cli``.

Speed is measured and reported, never asserted.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from stack.bench import floor
from stack.bench.export import idle_document, rdma_document
from stack.bench.options import (
    ALL_SIZES,
    ATOMIC_SIZE,
    DEFAULT_CQ_MOD,
    DEFAULT_IDLE_QPS,
    DEFAULT_PORT,
    DEFAULT_TX_DEPTH,
    MAX_DEPTH,
    MAX_IDLE_PARALLEL,
    MAX_QPS,
    MAX_RX_DEPTH,
    TESTS,
    BenchError,
    BenchOptions,
    default_cq_mod,
    parse_size,
)
from stack.bench.plot import MISSING_MATPLOTLIB, check_plot_path, have_matplotlib, save_plot
from stack.bench.process import cpu_list, pin_to, raise_nofile
from stack.bench.report import TEST_NAMES
from stack.bench.results import IdleResult
from stack.bench.run import BenchRecord, run_benchmark, run_idle_qps
from stack.bench.server import BenchServer, serve_forever
from stack.bench.session import STALL_TIMEOUT
from stack.cli import (
    MAX_DURATION,
    MAX_ITERATIONS,
    CliError,
    add_repeat_argument,
    address,
    counted,
    duration,
    emss,
    iterations,
    one_line_errors,
    port_number,
    positive_seconds,
    trio_run,
)
from stack.cli.capture import CAPTURE_HELP
from stack.cli.endpoints import EndpointError, parse_endpoint
from stack.cli.json_report import (
    add_json_argument,
    check_outputs,
    text_to_stderr_if_json_stdout,
    write_json,
    write_outputs,
)
from stack.errors import IwarpError


def parse_host_port(text: str, default_port: int = DEFAULT_PORT) -> tuple[str, int]:
    """argparse type: ``HOST``, ``HOST:PORT``, ``[V6]`` or ``[V6]:PORT`` to connect to
    (:func:`stack.cli.endpoints.parse_endpoint`); the port defaults to ``default_port``
    (perftest's 18515) and is not 0."""
    try:
        return parse_endpoint(text, default_port=default_port, connect=True)
    except EndpointError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _add_mpa_arguments(parser: argparse.ArgumentParser, crc_default: bool, who: str) -> None:
    parser.add_argument(
        "--crc",
        action=argparse.BooleanOptionalAction,
        default=crc_default,
        help=f"MPA CRC32c ({who}; CRC is on when either side asks)",
    )
    parser.add_argument(
        "--markers", action="store_true", help="MPA markers (both directions when both sides ask)"
    )
    parser.add_argument(
        "-m",
        "--mtu",
        type=emss,
        metavar="EMSS",
        help="EMSS the MULPDU is derived from, at least 64 and at most 65535 (default: the "
        "socket's MSS, followed as it grows)",
    )


def add_test_arguments(parser: argparse.ArgumentParser, test: str) -> None:
    sizes = parser.add_mutually_exclusive_group()
    sizes.add_argument(
        "-s",
        "--size",
        type=parse_size,
        help="message size in bytes, K/M suffixes allowed (default 65536; atomic: 8)",
    )
    sizes.add_argument("-a", "--all", action="store_true", help="all sizes from 2 to 2^23")
    count = parser.add_mutually_exclusive_group()
    count.add_argument(
        "-n",
        "--iters",
        type=iterations,
        help="iterations per size (default 5000 bandwidth / 1000 latency, "
        f"fewer for big messages: about 256 / 64 MiB per size; at most {MAX_ITERATIONS})",
    )
    count.add_argument(
        "-D",
        "--duration",
        type=duration,
        metavar="SECONDS",
        help=f"run for SECONDS per size (at most {MAX_DURATION:g})",
    )
    parser.add_argument(
        "-q",
        "--qps",
        type=counted(MAX_QPS),
        default=1,
        help=f"number of QPs (default 1, at most {MAX_QPS})",
    )
    parser.add_argument(
        "-l",
        "--post-list",
        type=counted(MAX_DEPTH),
        default=1,
        metavar="N",
        help="post N WRs per post_send (default 1, at most the tx depth)",
    )
    parser.add_argument(
        "-Q",
        "--cq-mod",
        type=counted(MAX_DEPTH),
        metavar="N",
        help=f"signal every Nth WR (default {DEFAULT_CQ_MOD}, at most half the tx depth: "
        "64 at the default 128; given, at most the tx depth)",
    )
    parser.add_argument(
        "-t",
        "--tx-depth",
        type=counted(MAX_DEPTH),
        default=DEFAULT_TX_DEPTH,
        help=f"WRs outstanding per QP (default {DEFAULT_TX_DEPTH}, at most {MAX_DEPTH})",
    )
    parser.add_argument(
        "--rx-depth",
        type=counted(MAX_RX_DEPTH),
        metavar="N",
        help="receives the server keeps posted for Sends (default: enough for the size; "
        f"at most {MAX_RX_DEPTH}, as the server takes)",
    )
    _add_mpa_arguments(parser, True, "requested by the client; default on")
    parser.add_argument("--lat", action="store_true", help="latency test (perftest's *_lat)")
    parser.add_argument(
        "--blocking",
        action="store_true",
        help="with --lat: both ends run the QP on the blocking driver "
        "(stack.transport.blocking: the thread that posts reads the socket, no event loop) "
        "instead of trio",
    )
    parser.add_argument(
        "-w",
        dest="capture",
        metavar="FILE",
        help=CAPTURE_HELP,
    )
    parser.add_argument(
        "--baseline",
        action="store_true",
        help="also run the same exchange over raw trio TCP and over blocking sockets, "
        "and print both ratios",
    )
    parser.add_argument(
        "--cpu",
        action="store_true",
        help="also print the CPU time per message of client and server (perftest --cpu_util)",
    )
    add_repeat_argument(
        parser,
        "each run iWARP, then its --baseline; the run with the median ratio is printed, "
        "the median figure without --baseline",
    )
    where = parser.add_mutually_exclusive_group()
    where.add_argument(
        "--server", action="store_true", help="run the server half here (as `iwarp bench server`)"
    )
    where.add_argument(
        "--connect",
        type=parse_host_port,
        metavar="HOST[:PORT]",
        help="run the client half against a server started by hand",
    )
    where.add_argument(
        "--in-process", action="store_true", help="run server and client in this process"
    )
    parser.add_argument(
        "-p",
        "--port",
        type=port_number,
        default=DEFAULT_PORT,
        help=f"--server: port to listen on (default {DEFAULT_PORT})",
    )
    parser.add_argument(
        "--host",
        type=address,
        default="127.0.0.1",
        help="--server: address to listen on (default 127.0.0.1)",
    )
    parser.add_argument(
        "--cpus",
        type=cpu_list,
        metavar="CLIENT[,SERVER]",
        help="run the client on CPU CLIENT and the server it spawns on CPU SERVER (one CPU: "
        "both there; --connect, --in-process, --server: one CPU, this process's); a round "
        "trip's wake-ups cost what the placement makes them cost (docs/performance.md)",
    )
    parser.add_argument("--quiet", action="store_true", help="no progress on stderr")
    add_json_argument(parser)
    parser.add_argument(
        "--plot",
        metavar="FILE.png",
        help="draw bandwidth and message rate (latency with --lat) against the size, iWARP "
        "and the --baseline of the same run (needs the 'plot' extra: matplotlib)",
    )
    one_line_errors(parser)


def options_from_args(args: argparse.Namespace, test: str) -> BenchOptions:
    """Check the combination of arguments; raises CliError with one clear line."""
    if test == "atomic":
        if args.all:
            raise CliError("atomic operations are 8 bytes: -a does not apply")
        if args.size not in (None, ATOMIC_SIZE):
            raise CliError(f"atomic operations are 8 bytes: -s {args.size} does not apply")
        sizes: tuple[int, ...] = (ATOMIC_SIZE,)
    elif args.all:
        sizes = ALL_SIZES
    else:
        sizes = (args.size or 65536,)
    tx_depth = args.tx_depth
    if args.lat:
        if args.qps != 1:
            raise CliError("--lat measures one QP: -q must be 1")
        if args.post_list != 1:
            raise CliError("--post-list applies to bandwidth tests, not --lat")
        if args.cq_mod is not None:
            raise CliError("--cq-mod applies to bandwidth tests, not --lat")
    if args.blocking and not args.lat:
        raise CliError("--blocking applies to latency tests: add --lat")
    if args.blocking and args.capture:
        raise CliError("-w records the trio driver's connections: not with --blocking")
    if args.post_list > tx_depth:
        raise CliError(f"--post-list {args.post_list} exceeds the tx depth {tx_depth}")
    if args.cq_mod is not None and args.cq_mod > tx_depth:
        raise CliError(f"--cq-mod {args.cq_mod} exceeds the tx depth {tx_depth}")
    cq_mod = args.cq_mod if args.cq_mod is not None else default_cq_mod(tx_depth)
    if args.rx_depth is not None and test != "send":
        raise CliError("--rx-depth applies to the send test")
    if args.connect is not None:
        mode, (host, port) = "connect", args.connect
    elif args.in_process:
        mode, host, port = "in-process", "127.0.0.1", 0
    else:
        mode, host, port = "spawn", "127.0.0.1", 0
    if args.cpus is not None and len(args.cpus) > 1 and mode != "spawn":
        where = "the server runs in this process" if args.in_process else "no server is spawned"
        raise CliError(f"--cpus {','.join(map(str, args.cpus))}: {where}: give one CPU")
    opts = BenchOptions(
        test=test,
        sizes=sizes,
        iters=args.iters,
        duration=args.duration,
        num_qps=args.qps,
        post_list=args.post_list,
        cq_mod=cq_mod,
        tx_depth=tx_depth,
        rx_depth=args.rx_depth,
        crc=args.crc,
        markers=args.markers,
        emss=args.mtu,
        latency=args.lat,
        baseline=args.baseline,
        cpu=args.cpu,
        capture=args.capture,
        mode=mode,
        host=host,
        port=port,
        progress=not args.quiet,
        repeat=args.repeat,
        blocking=args.blocking,
        cpus=args.cpus,
    )
    opts.check_sessions()
    return opts


def add_server_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--host", type=address, default="127.0.0.1", help="address to listen on (default 127.0.0.1)"
    )
    parser.add_argument(
        "-p",
        "--port",
        type=port_number,
        default=DEFAULT_PORT,
        help=f"iWARP port (default {DEFAULT_PORT}; 0: any)",
    )
    _add_mpa_arguments(parser, False, "default off: the client decides")
    parser.add_argument(
        "--stall-timeout",
        type=stall_seconds,
        default=STALL_TIMEOUT,
        metavar="SECONDS",
        help="end a session whose client acknowledges none of the server's output for "
        f"SECONDS, 1 to {MAX_STALL_TIMEOUT:.0f} (default {STALL_TIMEOUT:.0f}; a slow or "
        "lossy network may need more)",
    )
    parser.add_argument(
        "--cpus", type=cpu_list, metavar="CPU", help="run the server on this CPU only"
    )
    parser.add_argument("--exit-on-stdin-eof", action="store_true", help=argparse.SUPPRESS)
    one_line_errors(parser)


def add_idle_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "-q",
        "--qps",
        type=counted(MAX_QPS),
        default=DEFAULT_IDLE_QPS,
        help=f"idle QPs to connect (default {DEFAULT_IDLE_QPS}, at most {MAX_QPS})",
    )
    where = parser.add_mutually_exclusive_group()
    where.add_argument(
        "--connect",
        type=parse_host_port,
        metavar="HOST[:PORT]",
        help="measure a server started by hand",
    )
    where.add_argument(
        "--in-process", action="store_true", help="server in this process (counts both ends)"
    )
    parser.add_argument(
        "--crc", action=argparse.BooleanOptionalAction, default=True, help="MPA CRC32c (default on)"
    )
    parser.add_argument("--markers", action="store_true", help="MPA markers")
    parser.add_argument("--quiet", action="store_true", help="no progress on stderr")
    add_json_argument(parser)
    parser.add_argument(
        "--parallel",
        type=counted(MAX_IDLE_PARALLEL),
        default=32,
        help="connections set up at a time (default 32, at most "
        f"{MAX_IDLE_PARALLEL}: the listener's startups from one address)",
    )
    one_line_errors(parser)


def _fail(prog: str, exc: BaseException) -> int:
    print(f"{prog}: error: {exc}", file=sys.stderr)
    return 1


def run_test_command(args: argparse.Namespace) -> int:
    test = args.bench_test
    if args.server:
        return _serve(_server_from_args(args), False, _server_cpu(args))
    opts = options_from_args(args, test)
    if args.plot and not have_matplotlib():
        print(f"iwarp bench: error: {MISSING_MATPLOTLIB}", file=sys.stderr)
        return 2
    _check_outputs(args)
    if opts.cpus is not None:
        try:
            pin_to(opts.cpus[0])
        except OSError as exc:
            return _fail(f"iwarp bench {test}", exc)
    record = BenchRecord()
    status, error = 0, None
    with text_to_stderr_if_json_stdout(args.json):
        try:
            trio_run(lambda: run_benchmark(opts, record=record))
        except (BenchError, IwarpError, OSError, CliError) as exc:  # CliError: -w FILE
            status, error = _fail(f"iwarp bench {test}", exc), str(exc)
    write_outputs(
        (args.json, lambda path: write_json(path, rdma_document(opts, record, status, error))),
        (args.plot if record.results else None, lambda path: save_plot(path, record.results, opts)),
    )
    return status


def _check_outputs(args: argparse.Namespace) -> None:
    """Refuse unusable --json/--plot/-w before a run (a run can take minutes)."""
    plot_problem = check_plot_path(getattr(args, "plot", None))
    if plot_problem:
        raise CliError(plot_problem)
    check_outputs(("--json", args.json), ("-w", getattr(args, "capture", None)))


MAX_STALL_TIMEOUT = 3600.0
"""Most ``--stall-timeout`` seconds: beyond an hour a stuck client holds its session's memory
(up to ``MAX_SESSION_BYTES``) for longer than any benchmark runs."""


def stall_seconds(text: str) -> float:
    """argparse type of ``--stall-timeout``: 1 to :data:`MAX_STALL_TIMEOUT` seconds (below a
    second the kernel would end sessions on an ordinary pause of the client)."""
    value = positive_seconds(text)
    if not 1 <= value <= MAX_STALL_TIMEOUT:
        raise argparse.ArgumentTypeError(
            f"must be 1 to {MAX_STALL_TIMEOUT:.0f} seconds, got {text}"
        )
    return value


def run_server_command(args: argparse.Namespace) -> int:
    return _serve(_server_from_args(args), args.exit_on_stdin_eof, _server_cpu(args))


def _server_cpu(args: argparse.Namespace) -> int | None:
    """The one CPU of a server half's ``--cpus`` (CliError for two)."""
    if args.cpus is None:
        return None
    if len(args.cpus) > 1:
        raise CliError(f"--cpus {','.join(map(str, args.cpus))}: a server runs on one CPU")
    cpu: int = args.cpus[0]
    return cpu


def _server_from_args(args: argparse.Namespace) -> BenchServer:
    """The server of ``iwarp bench server`` and of a test's ``--server`` half."""
    return BenchServer(
        host=args.host,
        port=args.port,
        crc=args.crc,
        markers=args.markers,
        emss=args.mtu,
        stall_timeout=getattr(args, "stall_timeout", STALL_TIMEOUT),
    )


def _serve(server: BenchServer, exit_on_stdin_eof: bool, cpu: int | None = None) -> int:
    raise_nofile(1 << 20)
    try:
        if cpu is not None:
            pin_to(cpu)
        trio_run(
            lambda: serve_forever(server, announce=sys.stdout, exit_on_stdin_eof=exit_on_stdin_eof)
        )
    except (BenchError, IwarpError, OSError) as exc:
        return _fail("iwarp bench server", exc)
    return 0


def run_idle_command(args: argparse.Namespace) -> int:
    count = args.qps
    fds_per_qp = 2 if args.in_process else 1
    limit = raise_nofile(count * fds_per_qp + 256)
    usable = (limit - 256) // fds_per_qp
    if usable < count:
        print(
            f"iwarp bench idle-qps: RLIMIT_NOFILE allows {limit} descriptors: "
            f"measuring {usable} QPs",
            file=sys.stderr,
        )
        count = max(1, usable)
    if args.connect is not None:
        mode, (host, port) = "connect", args.connect
    else:
        mode, host, port = ("in-process" if args.in_process else "spawn"), "127.0.0.1", 0

    async def main() -> IdleResult:
        return await run_idle_qps(
            count,
            mode=mode,
            host=host,
            port=port,
            crc=args.crc,
            markers=args.markers,
            parallel=args.parallel,
            progress=not args.quiet,
        )

    _check_outputs(args)
    result: list[IdleResult] = []
    status, error = 0, None
    with text_to_stderr_if_json_stdout(args.json):
        try:
            result.append(trio_run(main))
        except (BenchError, IwarpError, OSError) as exc:
            status, error = _fail("iwarp bench idle-qps", exc), str(exc)
    if args.json:
        parameters = {
            "qps": count,
            "mode": mode,
            "crc": args.crc,
            "markers": args.markers,
            "parallel": args.parallel,
        }
        write_json(
            args.json,
            idle_document(parameters, result[0] if result else None, status, error),
        )
    return status


def register_bench(subparsers: argparse._SubParsersAction) -> None:
    """Add ``write``, ``read``, ``send``, ``atomic``, ``server``, ``idle-qps`` and ``floor``."""
    for test in TESTS:
        parser = subparsers.add_parser(
            test,
            help=f"{TEST_NAMES[test]} bandwidth or latency (perftest ib_{test}_bw/_lat)",
            description=f"{TEST_NAMES[test]} benchmark over the software RNIC, perftest style.",
        )
        add_test_arguments(parser, test)
        parser.set_defaults(func=run_test_command, bench_test=test)
    server = subparsers.add_parser(
        "server",
        help="the server half of the RDMA benchmarks",
        description="Serve `iwarp bench write|read|send|atomic|idle-qps` clients (and raw TCP "
        "baselines); prints `PORT <iwarp> <raw>`.  Each session maps at most 1 GiB, all "
        "sessions together at most half the machine's memory (past either a client's Request "
        "is rejected with the reason), and a session whose client takes none of its output "
        "for --stall-timeout seconds is ended and logged; other sessions go on.",
    )
    add_server_arguments(server)
    server.set_defaults(func=run_server_command)
    idle = subparsers.add_parser(
        "idle-qps",
        help="memory of idle connected QPs (server RSS growth per QP)",
        description="Connect N idle QPs to one server process; report its RSS growth / N.",
    )
    add_idle_arguments(idle)
    idle.set_defaults(func=run_idle_command)
    floor_parser = subparsers.add_parser(
        "floor",
        help=floor.HELP,
        description=floor.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    floor.add_arguments(floor_parser)
    one_line_errors(floor_parser)
    floor_parser.set_defaults(func=floor.run)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m stack.bench.cli write|read|send|atomic|server|idle-qps|floor ...``."""
    parser = argparse.ArgumentParser(prog="iwarp bench", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="benchmark", metavar="BENCHMARK")
    sub.required = True
    register_bench(sub)
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except CliError as exc:
        print(f"iwarp bench {args.benchmark}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("iwarp bench: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
