"""``iwarp dissect FILE``: decode and check every MPA/DDP/RDMAP PDU of a pcap or pcapng capture.

Default output is one line per PDU (frame, relative time, stream, direction, addresses,
layers, key fields, findings); ``-V`` prints the full tree; ``--json`` (``-T json``) one
JSON object per PDU (STags and Tagged Offsets as fixed-width hex strings, as tshark writes
them); ``-T fields -e FIELD ...`` tshark-style columns (``-G fields`` lists
the names: JSON keys, Wireshark names, derived fields).  ``-Y`` filters on those fields
(``opcode == 3 and findings contains "MPA-12"``); ``-z STAT`` prints statistics at the
end; ``-w OUT`` copies the frames in which the shown PDUs end.  ``-i IFACE`` decodes an
interface live, as ``tshark -i`` (:mod:`stack.cli.dissect_live`).
Mid-stream captures are found automatically; ``--crc``, ``--markers`` and ``--initiator``
state what the capture cannot show.  ``FILE`` may be ``-`` (standard input) or a pipe: the
capture is decoded as it arrives, in bounded memory.

Exit status: 0 when iWARP traffic was decoded; 1 when the capture holds none; 2 for an
unreadable, corrupt or truncated file (after printing what was decoded) or a bad option;
3 with ``--fail-on-findings`` when any displayed PDU has a finding.  A live capture
ended by ``-c`` or Ctrl-C exits as a file would at its end.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections.abc import Iterator
from itertools import islice
from typing import Any, TextIO

from stack.cli import CliError, one_line_errors, positive_int
from stack.cli.dissect_live import (
    announce,
    capture_summary,
    list_interfaces,
    open_live,
    stop_on_signals,
)
from stack.cli.dissect_output import Printer
from stack.cli.endpoints import EndpointError, parse_endpoint
from stack.cli.json_report import check_outputs
from stack.dissect import StatError, field_list, parse_stat
from stack.dissect.decoder import BriefOutput, DissectOptions, Dissector
from stack.pcap import (
    CaptureError,
    CaptureReader,
    LeanSegment,
    LiveCapture,
    TcpSegment,
    TruncatedCapture,
    copy_capture,
    full_segment,
)

MARKER_CHOICES = {
    "auto": (None, None),
    "none": (False, False),
    "i2r": (True, False),
    "r2i": (False, True),
    "both": (True, True),
}


EPILOG = """\
display filter (-Y): field OP value, combined with and/or/not (&&, ||, !) and
parentheses; OP is == != < <= > >= contains, or 'in (v1, v2, ...)'; values are
decimal or 0x integers, decimals, "quoted strings", true, false, null; a bare
field is true when present and non-zero.  Fields: the --json keys and their
Wireshark names (iwarp_ddp.stag, iwarp_rdma.opcode, tcp.port, ip.addr,
frame.time_relative...; list: -G fields).  Example:
  -Y 'iwarp_rdma.opcode == 7 or findings contains "MPA-12"'

JSON (--json, -T json): one object per PDU and line, its keys those of
-G fields in a fixed order.  STags and Tagged Offsets (stag, to, inval_stag,
read_sink_stag/_to, read_src_stag/_to, atomic_remote_stag/_to; with --ulp
kbtp also the KBTP STags and offsets) are fixed-width hex strings, "0x%08x"
and "0x%016x" as tshark writes them ("stag": "0x0ca63ebe"); -T fields prints
the same strings, and -Y compares their numbers (stag == 0x0ca63ebe,
iwarp_ddp.stag == 212221630).

statistics (-z, repeatable): iwarp (or iwarp,stat; also --stats) for the
iWARP statistics, conv,tcp for TCP conversations, io,stat,SECONDS for PDUs per
interval.  With --json or -T fields they go to standard error.

live decode: -i IFACE captures on an interface (Linux; CAP_NET_RAW, as for
tshark and dumpcap: run as root or grant the capability) and decodes as the
frames arrive; -D lists the interfaces (-i takes a name or their number; any
captures on all).  -f is the capture filter: [tcp] [src|dst] port N,
[tcp] [src|dst] portrange N-M, [src|dst] host ADDR, tcp, ip, ip6, combined with
and/or/not and parentheses (tcpdump's syntax, applied to TCP segments).  -c N
stops after N PDUs, Ctrl-C (or SIGTERM) at any time, printing the statistics
asked for; -w OUT saves every captured frame (Linux cooked pcap, for -r later).
Example:  iwarp dissect -i lo -f 'tcp port 7174' --json -z iwarp
Without the capability:  tcpdump -U -i IFACE -w - tcp port PORT | iwarp dissect -
(standard input is decoded as it arrives, in bounded memory).

exit status: 0 iWARP traffic decoded; 1 the capture holds no iWARP traffic;
2 an unreadable, corrupt or truncated capture (after printing what was
decoded) or a bad option; 3 with --fail-on-findings when a shown PDU has a
finding.  A live capture ended by -c or Ctrl-C exits as a file at its end.
"""


def _non_negative(text: str) -> int:
    """argparse type: an integer >= 0."""
    try:
        value = int(text, 0)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid integer {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
    return value


def _stat(text: str) -> tuple[str, float | None]:
    """argparse type: a ``-z`` argument."""
    try:
        return parse_stat(text)
    except StatError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "dissect",
        help="decode and check the iWARP PDUs of a pcap/pcapng capture",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    one_line_errors(parser)
    parser.add_argument(
        "file", metavar="FILE", nargs="?", help="pcap or pcapng capture (- for stdin)"
    )
    parser.add_argument("-r", dest="read_file", metavar="FILE", help="the capture, as tshark -r")
    parser.add_argument(
        "-i",
        dest="interface",
        metavar="IFACE",
        help="capture live on this interface (name or -D number, any: all; CAP_NET_RAW)",
    )
    parser.add_argument(
        "-f",
        dest="capture_filter",
        metavar="FILTER",
        help="capture filter of -i: tcp port N, host ADDR... with and/or/not (see below)",
    )
    parser.add_argument(
        "-D", dest="list_interfaces", action="store_true", help="list the interfaces and exit"
    )
    out = parser.add_mutually_exclusive_group()
    out.add_argument("-V", "--verbose", action="store_true", help="print the full decode tree")
    out.add_argument("--json", action="store_true", help="one JSON object per PDU (and line)")
    parser.add_argument(
        "-T",
        dest="format",
        choices=("text", "fields", "json"),
        help="output format: text (default), fields (-e), json (= --json)",
    )
    parser.add_argument(
        "-e", dest="fields", action="append", metavar="FIELD", help="a column of -T fields"
    )
    parser.add_argument(
        "-E",
        dest="field_options",
        action="append",
        metavar="OPT",
        help="-T fields option: header=y, separator=/t|/s|CHAR, quote=d|s|n, aggregator=CHAR",
    )
    parser.add_argument(
        "-G", dest="report", choices=("fields",), help="print the field names and exit"
    )
    parser.add_argument("-Y", "--filter", metavar="EXPR", help="display filter (see below)")
    parser.add_argument(
        "-z",
        dest="stat_specs",
        action="append",
        type=_stat,
        metavar="STAT",
        help="statistics after the PDUs: iwarp, conv,tcp, io,stat,SECONDS",
    )
    parser.add_argument(
        "--stats", action="store_true", help="print the iWARP statistics (= -z iwarp)"
    )
    parser.add_argument("-q", "--quiet", action="store_true", help="no per-PDU output")
    parser.add_argument(
        "-c", "--count", type=positive_int, metavar="N", help="stop after N PDUs shown"
    )
    parser.add_argument(
        "-w",
        dest="write",
        metavar="OUT",
        help="write the frames in which the shown PDUs end to the pcap OUT "
        "(with -i: every captured frame)",
    )
    parser.add_argument(
        "--crc",
        choices=("auto", "on", "off"),
        default="auto",
        help="CRC setting when the capture misses the MPA negotiation (default: detect)",
    )
    parser.add_argument(
        "--markers",
        choices=tuple(MARKER_CHOICES),
        default="auto",
        help="directions carrying markers when the negotiation is missing (default: detect)",
    )
    parser.add_argument(
        "--initiator",
        metavar="IP:PORT",
        help="MPA initiator of mid-stream connections (default: the TCP opener)",
    )
    parser.add_argument(
        "--mid-stream",
        action="store_true",
        help="search for FPDUs even in connections that do not start with MPA",
    )
    parser.add_argument(
        "--no-rfc7306",
        action="store_true",
        help="treat opcodes 0x8-0xB and QN 3 as errors (peer without RFC 7306)",
    )
    parser.add_argument(
        "--siw-terminate",
        choices=("auto", "yes", "no"),
        default="auto",
        help="read Terminate control words in siw's swapped layout (default: detect)",
    )
    parser.add_argument(
        "--max-private-data",
        type=_non_negative,
        default=512,
        metavar="N",
        help="PD_Length limit for MPA-21 (default 512; siw uses 256)",
    )
    parser.add_argument(
        "--fail-on-findings", action="store_true", help="exit 3 if a shown PDU has findings"
    )
    parser.add_argument("--no-notes", action="store_true", help="hide stream events (gaps...)")
    parser.add_argument(
        "--ulp",
        choices=("kbtp", "none"),
        default="kbtp",
        help="decode this upper-layer protocol inside Sends (default kbtp)",
    )
    parser.set_defaults(func=run)


def _endpoint(text: str) -> tuple[str, int]:
    try:
        return parse_endpoint(text)
    except EndpointError as exc:
        raise CliError(f"--initiator wants IP:PORT: {exc}") from None


def options_from(args: argparse.Namespace) -> DissectOptions:
    markers_i2r, markers_r2i = MARKER_CHOICES[args.markers]
    return DissectOptions(
        crc={"auto": None, "on": True, "off": False}[args.crc],
        markers_i2r=markers_i2r,
        markers_r2i=markers_r2i,
        initiator=_endpoint(args.initiator) if args.initiator else None,
        mid_stream=args.mid_stream,
        rfc7306=not args.no_rfc7306,
        siw_layout={"auto": None, "yes": True, "no": False}[args.siw_terminate],
        max_private_data=args.max_private_data,
    )


def _output_mode(args: argparse.Namespace) -> str:
    """'text', 'verbose', 'json' or 'fields' from -V, --json, -T and -e."""
    fmt = args.format
    if args.json:
        if fmt not in (None, "json"):
            raise CliError(f"--json and -T {fmt} disagree")
        fmt = "json"
    if args.fields and fmt is None:
        fmt = "fields"
    if args.fields and fmt != "fields":
        raise CliError("-e needs -T fields")
    if args.field_options and fmt != "fields":
        raise CliError("-E needs -T fields")
    if args.verbose:
        if fmt not in (None, "text"):
            raise CliError(f"-V and -T {fmt} disagree")
        return "verbose"
    return fmt or "text"


def _capture_path(args: argparse.Namespace) -> str | None:
    """The capture file to read, or None for a live capture (``-i``)."""
    if args.interface is not None:
        if args.file is not None or args.read_file is not None:
            raise CliError("give one source: -i IFACE or a capture file, not both")
        return None
    if args.capture_filter is not None:
        raise CliError("-f is the capture filter of -i IFACE (filter a file with -Y)")
    if args.file is not None and args.read_file is not None:
        raise CliError("give the capture once: FILE or -r FILE, not both")
    path = args.file if args.file is not None else args.read_file
    if path is None:
        raise CliError("no capture given: iwarp dissect FILE (or -r FILE; - for stdin)")
    return str(path)


def _check_write(args: argparse.Namespace, path: str) -> None:
    """-w needs a capture file it can read a second time, and another file to write (a
    missing file or a directory is left to the reader to report)."""
    if not args.write:
        return
    piped = os.path.exists(path) and not (os.path.isfile(path) or os.path.isdir(path))
    if path == "-" or piped:
        raise CliError(f"-w {args.write}: needs a capture file, not a pipe or stdin ({path})")
    if os.path.exists(path) and os.path.exists(args.write) and os.path.samefile(path, args.write):
        raise CliError(f"-w {args.write}: would overwrite the capture being read")
    check_outputs(("-w", args.write))


def _write_frames(path: str, target: str, frames: set[int]) -> int:
    """Copy the frames numbered ``frames`` of the pcap ``path`` to ``target``."""
    try:
        return copy_capture(path, target, lambda frame: frame.number in frames)
    except CaptureError as exc:
        raise CliError(f"-w {target}: {exc}") from None
    except OSError as exc:
        raise CliError(f"-w {target}: {exc.strerror or exc}") from None


_BATCH = 256
"""Segments decoded between two takes of the decoder's output (without -c or -z conv)."""


def _decode(
    segments: Iterator[TcpSegment], dissector: Dissector[BriefOutput], printer: Printer
) -> None:
    """Feed every segment to the decoder and its records to the printer, until ``-c``."""
    feed = dissector.feed
    emit = printer.emit
    snap = printer.snap.add
    conversations = printer.conversations
    for segment in segments:  # the first: the origin of relative times
        printer.context.t0 = segment.timestamp
        if segment.missing:
            snap(segment)
        if conversations is not None:
            conversations.add(segment)
        items = feed(segment)
        if items:
            emit(items)
        break
    if printer.limit is None and conversations is None:
        # nothing to stop early for: the output of many segments is taken at once
        ingest_many = dissector.ingest_many
        take = dissector.take
        while True:
            count = ingest_many(islice(segments, _BATCH), snap)
            items = take()
            if items:
                emit(items)
            if count < _BATCH:
                break
    elif not printer.done:
        for segment in segments:
            if segment.missing:
                snap(segment)
            if conversations is not None:
                conversations.add(segment)
            items = feed(segment)
            if items:
                emit(items)
                if printer.done:
                    break


def _decode_lean(
    segments: Iterator[LeanSegment], dissector: Dissector[BriefOutput], printer: Printer
) -> None:
    """:func:`_decode` of a capture file with nothing to stop early for: the reader's
    lean segments through the decoder's fused path, the output of many taken at once."""
    emit = printer.emit
    snap = printer.snap.add
    ingest_lean = dissector.ingest_lean
    take = dissector.take
    for segment in segments:  # the first: the origin of relative times
        printer.context.t0 = segment[1]
        if segment[7]:
            snap(full_segment(segment))
        ingest_lean((segment,))
        dissector.text = printer.brief_text()
        break
    while True:
        items = take()
        if items:
            emit(items)
        count = ingest_lean(islice(segments, _BATCH), snap)
        if count < _BATCH:
            items = take()
            if items:
                emit(items)
            break


def run(args: argparse.Namespace, out: TextIO | None = None) -> int:
    out = out or sys.stdout
    if args.report == "fields":
        for line in field_list():
            print(line, file=out)
        return 0
    if args.list_interfaces:
        list_interfaces(out)
        return 0
    path = _capture_path(args)
    mode = _output_mode(args)
    if path is not None:
        _check_write(args, path)
    options = options_from(args)
    printer = Printer(args, out, mode)

    dissector = Dissector(options, brief=printer.plain)

    def flush_decoded() -> None:  # before a read that may wait: show what is decoded
        items = dissector.take()
        if items:
            printer.emit(items)
        printer.flush()
        out.flush()

    reader: CaptureReader | LiveCapture
    writer = None
    if path is None:
        reader, writer = open_live(args, flush_decoded)
        printer.frames = None  # -w saves the capture itself, frame by frame
    else:
        try:
            reader = CaptureReader(path, on_wait=flush_decoded)
        except CaptureError as exc:
            raise CliError(str(exc)) from None
    error: CaptureError | None = None
    with stop_on_signals() if path is None else contextlib.nullcontext() as wake_fd:
        try:
            if isinstance(reader, LiveCapture):
                reader.wake_fd = wake_fd
                announce(reader)  # once Ctrl-C ends the capture cleanly: a peer may act on it
            if isinstance(reader, CaptureReader) and (
                printer.limit is None and printer.conversations is None
            ):
                _decode_lean(reader.lean(), dissector, printer)
            else:
                _decode(iter(reader), dissector, printer)
        except CaptureError as exc:
            error = exc
        except KeyboardInterrupt:  # Ctrl-C ends a live capture: finish as at its end
            if path is not None:
                raise
        finally:
            reader.close()
            if writer is not None:
                writer.close()
    if not printer.done:
        printer.emit(dissector.finish())
    streams = dissector.streams()
    stats = printer.statistics(list(streams))
    if mode in ("json", "fields"):  # standard output stays machine-readable
        printer.flush()
        out.flush()
        if stats:
            print("\n".join(stats), file=sys.stderr)
    else:
        printer.lines.extend(stats)
        printer.flush()
    out.flush()
    name = reader.name
    if isinstance(reader, LiveCapture):
        print(capture_summary(reader), file=sys.stderr)
        if error is not None:
            print(f"iwarp dissect: {error}", file=sys.stderr)
            return 2
    if error is not None:
        kind = "truncated" if isinstance(error, TruncatedCapture) else "corrupt"
        print(f"iwarp dissect: {name}: {kind} capture: {error.message}", file=sys.stderr)
        if args.write:
            print(f"iwarp dissect: {args.write}: not written", file=sys.stderr)
        return 2
    if printer.frames is not None and path is not None:
        _write_frames(path, args.write, printer.frames)
    if printer.pdus == 0:
        tcp = reader.stats.tcp
        why = "no TCP segments" if tcp == 0 else f"{len(streams)} TCP connection(s), none iWARP"
        print(f"iwarp dissect: {name}: no iWARP (MPA) traffic found ({why})", file=sys.stderr)
        return 1
    if args.fail_on_findings and printer.with_findings:
        return 3
    return 0
