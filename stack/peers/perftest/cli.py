"""``iwarp bench ib_write_bw|ib_read_bw|ib_send_bw``: perftest's ``-R`` peers on our stack.

Either side of perftest's bandwidth tests with ``-R`` (rdma_cm), so the other side can be
the real perftest, for example on Linux siw.  The command line follows perftest's: no
address makes a server, an address makes a client, and both sides take the same options::

    iwarp bench ib_write_bw -R -n 5 -s 4096              # like `ib_write_bw -R -n 5 -s 4096`
    iwarp bench ib_write_bw -R -n 5 -s 4096 10.0.2.15    # client of a perftest server

``-R`` is accepted and implied (rdma_cm is the only exchange iWARP can use).  As with
perftest, give both sides the same ``-s``/``-a``/``-n``/``-q`` (and ``-r`` if any): the
server never learns them from the client.  It sizes its buffer by ``-s`` (Write/Read target,
Send receives) and an ``ib_send_bw`` server counts ``-n`` x ``-q`` receives.
"""

from __future__ import annotations

import argparse
import sys

from stack.bench.options import parse_size
from stack.bench.report import TEST_NAMES
from stack.cli import CliError, port_number, positive_int, trio_run
from stack.errors import IwarpError
from stack.peers.perftest.client import run_client
from stack.peers.perftest.options import (
    DEFAULT_ITERS,
    DEFAULT_PORT,
    FIRST_FPDU_DELAY,
    MAX_DEVICE_READS,
    MAX_SIZE,
    PerftestOptions,
)
from stack.peers.perftest.protocol import TESTS, PerftestError
from stack.peers.perftest.server import PerftestServer


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid number {text!r}") from None
    if not 0 <= value < 1e6:
        raise argparse.ArgumentTypeError(f"must be 0 or more seconds, got {text}")
    return value


def _timeout(text: str) -> float:
    value = _seconds(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be more than 0 seconds, got {text}")
    return value


def _size(text: str) -> int:
    value = parse_size(text)
    if value > MAX_SIZE:
        raise argparse.ArgumentTypeError(f"size must be at most {MAX_SIZE} bytes, got {text!r}")
    return value


def add_arguments(parser: argparse.ArgumentParser, test: str) -> None:
    parser.add_argument("server", nargs="?", help="server address: run as client (else server)")
    parser.add_argument(
        "-R", "--rdma_cm", action="store_true", help="rdma_cm exchange (always on; accepted)"
    )
    sizes = parser.add_mutually_exclusive_group()
    sizes.add_argument("-s", "--size", type=_size, help="message size (default 65536)")
    sizes.add_argument("-a", "--all", action="store_true", help="sizes 2 to 2^23")
    parser.add_argument(
        "-n",
        "--iters",
        type=positive_int,
        help=f"iterations (default {DEFAULT_ITERS[test]}; give the server the same)",
    )
    parser.add_argument("-q", "--qp", type=positive_int, default=1, help="number of QPs")
    parser.add_argument(
        "-p",
        "--port",
        type=port_number,
        default=DEFAULT_PORT,
        help=f"port (default {DEFAULT_PORT})",
    )
    parser.add_argument("-t", "--tx-depth", type=positive_int, help="WRs outstanding (128)")
    parser.add_argument("-Q", "--cq-mod", type=positive_int, help="signal every Nth WR (100)")
    if test == "send":
        parser.add_argument("-r", "--rx-depth", type=positive_int, help="receives (512)")
    if test == "read":
        parser.add_argument(
            "-o", "--outs", type=positive_int, help=f"outstanding reads ({MAX_DEVICE_READS})"
        )
    parser.add_argument(
        "--bind", default="0.0.0.0", help="server: address to listen on (default all)"
    )
    parser.add_argument(
        "--crc",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="request MPA CRC (default: client on, server off; CRC is on if either asks)",
    )
    parser.add_argument("--emss", type=positive_int, help="EMSS for the MULPDU (MPA-13)")
    parser.add_argument(
        "--timeout", type=_timeout, default=30.0, help="seconds without progress (default 30)"
    )
    parser.add_argument(
        "--first-fpdu-delay",
        type=_seconds,
        default=FIRST_FPDU_DELAY,
        help="client: seconds between a connection and its first FPDU (Linux siw's passive race)",
    )


def options_from_args(args: argparse.Namespace, test: str) -> PerftestOptions:
    try:
        return PerftestOptions.build(
            test,
            size=args.size,
            all_sizes=args.all,
            iters=args.iters,
            tx_depth=args.tx_depth,
            rx_depth=getattr(args, "rx_depth", None),
            cq_mod=args.cq_mod,
            out_reads=getattr(args, "outs", None),
            num_qps=args.qp,
            host=args.server,
            port=args.port,
            bind=args.bind,
            crc=args.crc if args.crc is not None else args.server is not None,
            emss=args.emss,
            timeout=args.timeout,
            first_fpdu_delay=args.first_fpdu_delay,
        )
    except PerftestError as exc:
        raise CliError(str(exc)) from None


def run_command(args: argparse.Namespace) -> int:
    test = args.perftest_test
    opts = options_from_args(args, test)
    prog = f"iwarp bench ib_{test}_bw"
    try:
        if opts.host is None:
            trio_run(PerftestServer(opts).session)
        else:
            trio_run(run_client, opts)
    except (PerftestError, IwarpError, OSError) as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 1
    return 0


def register_bench(subparsers: argparse._SubParsersAction) -> None:
    """Add ``ib_write_bw``, ``ib_read_bw`` and ``ib_send_bw`` (perftest ``-R`` peers)."""
    for test in TESTS:
        parser = subparsers.add_parser(
            f"ib_{test}_bw",
            help=f"perftest ib_{test}_bw -R peer (server, or client with an address)",
            description=f"{TEST_NAMES[test]} bandwidth against perftest's ib_{test}_bw -R "
            "(rdma_cm exchange, perftest 4.5 / version 6.06): a server without an address, "
            "a client with one.",
        )
        add_arguments(parser, test)
        parser.set_defaults(func=run_command, perftest_test=test)
