"""``iwarp bench ib_*_bw`` (write, read, send, atomic) and ``ib_*_lat``: perftest ``-R`` peers.

Either side of perftest's bandwidth and latency tests with ``-R`` (rdma_cm), so the other
side can be the real perftest, for example on Linux siw or a hardware RNIC.  The command
line follows perftest's: no address makes a server, an address makes a client, and both
sides take the same options::

    iwarp bench ib_write_bw -R -n 5 -s 4096              # like `ib_write_bw -R -n 5 -s 4096`
    iwarp bench ib_write_bw -R -n 5 -s 4096 10.0.2.15    # client of a perftest server

``-R`` is accepted and implied (rdma_cm is the only exchange iWARP can use).  As with
perftest, give both sides the same ``-s``/``-a``/``-n``/``-q`` (and ``-r`` if any): the
server never learns them from the client.  It sizes its buffer by ``-s`` (Write/Read target,
Send receives) and an ``ib_send_bw`` server counts ``-n`` x ``-q`` receives.

perftest's device-local options (``-d DEV``, ``-i PORT``, ``-F``, ``-x GID``) are accepted
with a note that they do not apply.  ``--report_gbits``, ``-D SECONDS``, ``--out_json``
(``--out_json=FILE`` or ``--out_json_file FILE``) and ``-w FILE`` (our side's capture) as
described in :mod:`~stack.peers.perftest.report`.
"""

from __future__ import annotations

import argparse
import ipaddress
import sys

from stack.bench.options import MAX_DEPTH, MAX_QPS, parse_size
from stack.bench.report import TEST_NAMES
from stack.cli import (
    MAX_DURATION,
    MAX_ITERATIONS,
    CliError,
    address,
    counted,
    duration,
    emss,
    iterations,
    one_line_errors,
    port_number,
    positive_seconds,
    seconds,
    trio_run,
)
from stack.cli.json_report import check_outputs
from stack.errors import IwarpError
from stack.peers.perftest.client import run_client
from stack.peers.perftest.options import (
    DEFAULT_ITERS,
    DEFAULT_LAT_ITERS,
    DEFAULT_PORT,
    FIRST_FPDU_DELAY,
    LAT_SIZE,
    MAX_DEVICE_READS,
    MAX_SIZE,
    SEND_FIRST_AFTER,
    PerftestOptions,
)
from stack.peers.perftest.protocol import LAT_TESTS, TESTS, PerftestError
from stack.peers.perftest.server import PerftestServer


def _size(text: str) -> int:
    value = parse_size(text)
    if value > MAX_SIZE:
        raise argparse.ArgumentTypeError(f"size must be at most {MAX_SIZE} bytes, got {text!r}")
    return value


DEFAULT_JSON_FILE = "perftest_out.json"
"""perftest's ``--out_json`` file when ``--out_json_file`` is not given."""
DEVICE_OPTIONS = {
    "device": "-d",
    "ib_port": "-i",
    "cpu_freq_f": "-F",
    "gid_index": "-x",
}
"""perftest's device-local options: accepted, with a note that they do not apply here."""


def _json_file(text: str) -> str:
    if not text:
        raise argparse.ArgumentTypeError("empty file name")
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return text
    raise argparse.ArgumentTypeError(
        f"{text!r} is an address, not a file: give the server address before --out_json "
        "or write --out_json=FILE"
    )


def add_arguments(parser: argparse.ArgumentParser, test: str, latency: bool = False) -> None:
    parser.add_argument("server", nargs="?", help="server address: run as client (else server)")
    parser.add_argument(
        "-R", "--rdma_cm", action="store_true", help="rdma_cm exchange (always on; accepted)"
    )
    if test != "atomic":
        default = LAT_SIZE if latency else 65536
        sizes = parser.add_mutually_exclusive_group()
        sizes.add_argument("-s", "--size", type=_size, help=f"message size (default {default})")
        sizes.add_argument("-a", "--all", action="store_true", help="sizes 2 to 2^23")
    iters = DEFAULT_LAT_ITERS if latency else DEFAULT_ITERS[test]
    parser.add_argument(
        "-n",
        "--iters",
        type=iterations,
        help=f"iterations (default {iters}, at most {MAX_ITERATIONS}; give the server the same)",
    )
    if not latency or test == "read":
        parser.add_argument(
            "-D",
            "--duration",
            type=duration,
            metavar="SECONDS",
            help=f"run for SECONDS instead of -n iterations (at most {MAX_DURATION:g}; give the "
            "server the same)",
        )
    if not latency:
        parser.add_argument(
            "-q",
            "--qp",
            type=counted(MAX_QPS),
            default=1,
            help=f"number of QPs (default 1, at most {MAX_QPS})",
        )
    parser.add_argument(
        "-p",
        "--port",
        type=port_number,
        default=DEFAULT_PORT,
        help=f"port (default {DEFAULT_PORT})",
    )
    if not latency:
        parser.add_argument(
            "-t",
            "--tx-depth",
            type=counted(MAX_DEPTH),
            help=f"WRs outstanding (128; at most {MAX_DEPTH}; no more than -n)",
        )
        parser.add_argument(
            "-Q",
            "--cq-mod",
            type=counted(MAX_DEPTH),
            help="signal every Nth WR (100, at most the tx depth)",
        )
    if test == "send" and not latency:
        parser.add_argument(
            "-r",
            "--rx-depth",
            type=counted(MAX_DEPTH),
            help=f"receives (512; at most {MAX_DEPTH}; no more than -n)",
        )
    if test in ("read", "atomic"):
        parser.add_argument(
            "-o",
            "--outs",
            type=counted(MAX_DEVICE_READS),
            help=f"outstanding reads ({MAX_DEVICE_READS}, at most {MAX_DEVICE_READS}: the "
            "device's IRD/ORD)",
        )
    if not latency:
        parser.add_argument(
            "--report_gbits", action="store_true", help="report bandwidth in Gb/s (not MB/s)"
        )
    parser.add_argument(
        "--out_json",
        nargs="?",
        const=DEFAULT_JSON_FILE,
        type=_json_file,
        metavar="FILE",
        help=f"write the results as JSON to FILE (default {DEFAULT_JSON_FILE})",
    )
    parser.add_argument(
        "--out_json_file", type=_json_file, metavar="FILE", help="the --out_json file (perftest)"
    )
    parser.add_argument("-w", dest="capture", metavar="FILE", help="write our side's pcap")
    device = parser.add_argument_group("perftest's device options (accepted; they do not apply)")
    device.add_argument("-d", "--ib-dev", dest="device", metavar="DEV", help="RDMA device")
    device.add_argument("-i", "--ib-port", dest="ib_port", metavar="PORT", help="device port")
    device.add_argument("-F", "--CPU-freq", dest="cpu_freq_f", action="store_true",
                        help="do not fail on CPU frequency warnings")  # fmt: skip
    device.add_argument("-x", "--gid-index", dest="gid_index", metavar="GID", help="GID index")
    parser.add_argument(
        "--bind", type=address, default="0.0.0.0", help="server: address to listen on (default all)"
    )
    parser.add_argument(
        "--crc",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="request MPA CRC (default: client on, server off; CRC is on if either asks)",
    )
    parser.add_argument(
        "--emss", type=emss, help="EMSS for the MULPDU, at least 64 and at most 65535 (MPA-13)"
    )
    parser.add_argument(
        "--timeout",
        type=positive_seconds,
        default=30.0,
        help="seconds without progress (default 30)",
    )
    parser.add_argument(
        "--first-fpdu-delay",
        type=seconds,
        default=FIRST_FPDU_DELAY,
        help="client: seconds between a connection and its first FPDU (Linux siw's passive "
        f"race; default {FIRST_FPDU_DELAY})",
    )
    if latency and test == "write":
        parser.add_argument(
            "--send-first-after",
            type=_send_first_after,
            default=SEND_FIRST_AFTER,
            metavar="SECONDS|never",
            help="server: Write first after SECONDS without an FPDU from a client that did not"
            " negotiate RFC 6581 peer-to-peer mode, as Linux siw does (MPA-25 waived); never:"
            f" keep MPA-25, such a client then waits for us (default {SEND_FIRST_AFTER})",
        )
    one_line_errors(parser)


def _send_first_after(text: str) -> float | None:
    """``never`` (None), or seconds (0 or more)."""
    return None if text.strip().lower() == "never" else seconds(text)


def options_from_args(
    args: argparse.Namespace, test: str, latency: bool = False
) -> PerftestOptions:
    if args.server is not None and not args.server.strip():
        raise CliError("empty server address")
    if getattr(args, "duration", None) is not None and args.iters is not None:
        raise CliError("-D (duration) and -n (iterations) exclude each other")
    out_json = args.out_json_file or args.out_json
    try:
        return PerftestOptions.build(
            test,
            size=getattr(args, "size", None),
            all_sizes=getattr(args, "all", False),
            iters=args.iters,
            tx_depth=getattr(args, "tx_depth", None),
            rx_depth=getattr(args, "rx_depth", None),
            cq_mod=getattr(args, "cq_mod", None),
            out_reads=getattr(args, "outs", None),
            num_qps=getattr(args, "qp", 1),
            host=args.server,
            port=args.port,
            bind=args.bind,
            crc=args.crc if args.crc is not None else args.server is not None,
            emss=args.emss,
            timeout=args.timeout,
            first_fpdu_delay=args.first_fpdu_delay,
            send_first_after=getattr(args, "send_first_after", SEND_FIRST_AFTER),
            latency=latency,
            duration=getattr(args, "duration", None),
            report_gbits=getattr(args, "report_gbits", False),
            out_json=out_json,
            capture=args.capture,
        )
    except PerftestError as exc:
        raise CliError(str(exc)) from None


def device_notes(args: argparse.Namespace) -> list[str]:
    """One note per device-local option given: it does not apply to a TCP stack."""
    notes = []
    for dest, flag in DEVICE_OPTIONS.items():
        value = getattr(args, dest, None)
        if value is None or value is False:
            continue
        shown = flag if value is True else f"{flag} {value}"
        notes.append(f"note: {shown} does not apply (no RDMA device: iWARP over TCP sockets)")
    return notes


def run_command(args: argparse.Namespace) -> int:
    test, latency = args.perftest_test, args.perftest_latency
    prog = args.parser.prog
    try:
        opts = options_from_args(args, test, latency)
        json_option = "--out_json_file" if args.out_json_file else "--out_json"
        check_outputs((json_option, opts.out_json), ("-w", opts.capture))
    except CliError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 2
    for note in device_notes(args):
        print(f"{prog}: {note}", file=sys.stderr)
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
    """Add ``ib_{write,read,send,atomic}_bw`` and ``ib_{write,read,send}_lat``."""
    for latency, tests in ((False, TESTS), (True, LAT_TESTS)):
        kind = "latency" if latency else "bandwidth"
        for test in tests:
            name = f"ib_{test}_{'lat' if latency else 'bw'}"
            parser = subparsers.add_parser(
                name,
                help=f"perftest {name} -R peer (server, or client with an address)",
                description=f"{TEST_NAMES[test]} {kind} against perftest's {name} -R "
                "(rdma_cm exchange, perftest 4.5 / version 6.06): a server without an "
                "address, a client with one.",
            )
            add_arguments(parser, test, latency)
            parser.set_defaults(
                func=run_command, perftest_test=test, perftest_latency=latency, parser=parser
            )
