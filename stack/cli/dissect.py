"""``iwarp dissect FILE``: decode and check every MPA/DDP/RDMAP PDU of a pcap or pcapng capture.

Default output is one line per PDU (frame, stream, direction, addresses, layers, key fields,
findings); ``-V`` prints the full tree; ``--json`` one JSON object per PDU (keys listed in
``--help``).
``-Y`` filters on the JSON keys (``opcode == 3 and "MPA-12" in findings`` is written
``opcode == 3 and findings contains "MPA-12"``); ``-z`` prints statistics at the end.
Mid-stream captures are found automatically; ``--crc``, ``--markers`` and ``--initiator``
state what the capture cannot show.  ``FILE`` may be ``-`` (standard input) or a pipe: the
capture is decoded as it arrives, in bounded memory.

Exit status: 0 when iWARP traffic was decoded; 1 when the capture holds none; 2 for an
unreadable, corrupt or truncated file (after printing what was decoded) or a bad option;
3 with ``--fail-on-findings`` when any displayed PDU has a finding.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from typing import Any, TextIO

from stack.cli import CliError
from stack.constants import SEND_OPCODES
from stack.dissect import (
    FilterError,
    Statistics,
    compile_filter,
    note_line,
    record_json,
    summary_line,
    verbose_lines,
)
from stack.dissect.decoder import DissectOptions, Dissector, Note, PduRecord
from stack.pcap import CaptureError, CaptureReader, TruncatedCapture

_SEND_OPCODES = frozenset(int(op) for op in SEND_OPCODES)


def ulp_annotator(name: str) -> Callable[[PduRecord], Any] | None:
    """The decoder of the upper-layer protocol carried in Sends (``--ulp``), or None.

    ``kbtp``: KBTP messages (docs/kbtp.md) in the first segment of Send-family messages.
    A connection counts as KBTP once the first Send on it decodes as a well-formed KBTP
    message (a session opens with HELLO); Sends of other protocols are left alone, so
    their bytes never produce KBTP findings.  The stream decoder stays ULP-agnostic
    (floors 0-1); this tool layer adds the ULP.
    """
    if name == "none":
        return None
    from kbtp.describe import describe_payload

    verdict: dict[int, bool] = {}

    def annotate(rec: PduRecord) -> Any:
        seg = rec.segment
        if seg is None or seg.opcode not in _SEND_OPCODES or seg.mo != 0 or seg.findings:
            return None
        known = verdict.get(rec.stream)
        if known is False:
            return None
        summary = describe_payload(seg.payload, complete=seg.last)
        if known is None:
            verdict[rec.stream] = known = summary is not None and not summary.findings
            if not known:
                return None
        if summary is not None and summary.findings:
            rec.findings.extend(summary.findings)
        return summary

    return annotate


MARKER_CHOICES = {
    "auto": (None, None),
    "none": (False, False),
    "i2r": (True, False),
    "r2i": (False, True),
    "both": (True, True),
}


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "dissect",
        help="decode and check the iWARP PDUs of a pcap/pcapng capture",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
    )
    parser.add_argument("file", metavar="FILE", help="pcap or pcapng capture (- for stdin)")
    out = parser.add_mutually_exclusive_group()
    out.add_argument("-V", "--verbose", action="store_true", help="print the full decode tree")
    out.add_argument("--json", action="store_true", help="one JSON object per PDU")
    parser.add_argument("-Y", "--filter", metavar="EXPR", help="display filter on the JSON keys")
    parser.add_argument(
        "-z", "--stats", action="store_true", help="print statistics after the PDUs"
    )
    parser.add_argument("-q", "--quiet", action="store_true", help="no per-PDU output")
    parser.add_argument("-c", "--count", type=int, metavar="N", help="stop after N PDUs shown")
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
        type=int,
        default=512,
        metavar="N",
        help="PD_Length limit for MPA-21 (512; siw uses 256)",
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
    host, sep, port = text.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or int(port) > 0xFFFF:
        raise CliError(f"--initiator wants IP:PORT, got {text!r}")
    return host, int(port)


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


class _Printer:
    """Formats records as they come; counts what was shown."""

    def __init__(self, args: argparse.Namespace, out: TextIO) -> None:
        self.args = args
        self.write = out.write
        self.predicate = None
        if args.filter:
            try:
                self.predicate = compile_filter(
                    args.filter, field_prefixes=("kbtp_",) if args.ulp == "kbtp" else ()
                )
            except FilterError as exc:
                raise CliError(f"bad display filter: {exc}") from None
        self.stats = Statistics() if args.stats else None
        self.shown = 0
        self.with_findings = 0
        self.pdus = 0
        self.limit = args.count
        self.lines: list[str] = []
        self.ulp = ulp_annotator(args.ulp)
        self.plain = not (
            args.json or args.verbose or args.quiet or args.filter or args.stats or args.count
        )

    @property
    def done(self) -> bool:
        return self.limit is not None and self.shown >= self.limit

    def emit(self, items: list[PduRecord | Note]) -> None:
        args = self.args
        lines = self.lines
        if self.plain:  # default output, nothing to filter or count: the bulk path
            append = lines.append
            pdus = flagged = 0
            ulp = self.ulp
            for item in items:
                if type(item) is PduRecord:
                    info = ulp(item) if ulp is not None else None
                    append(
                        summary_line(item)
                        if info is None
                        else f"{summary_line(item)} | {info.line}"
                    )
                    pdus += 1
                    if item.findings:
                        flagged += 1
                elif not args.no_notes:
                    append(note_line(item))  # type: ignore[arg-type]
            self.pdus += pdus
            self.with_findings += flagged
            self.shown = self.pdus
            if len(lines) > 512:
                self.flush()
            return
        for item in items:
            if self.done:
                return
            if type(item) is Note:
                if self.stats is not None:
                    self.stats.add_note(item)
                if not (args.json or args.quiet or args.no_notes or self.predicate):
                    lines.append(note_line(item))
                continue
            assert isinstance(item, PduRecord)
            self.pdus += 1
            ulp_info = self.ulp(item) if self.ulp is not None else None
            record = None
            if self.predicate is not None:
                record = self._json(item, ulp_info)
                if not self.predicate(record):
                    continue
            self.shown += 1
            if item.findings:
                self.with_findings += 1
            if self.stats is not None:
                self.stats.add(item)
            if args.quiet:
                continue
            if args.json:
                record = record or self._json(item, ulp_info)
                lines.append(json.dumps(record, separators=(", ", ": ")))
            elif args.verbose:
                lines.extend(verbose_lines(item))
                if ulp_info is not None:
                    lines.extend(ulp_info.tree_lines())
                lines.append("")
            elif ulp_info is not None:
                lines.append(f"{summary_line(item)} | {ulp_info.line}")
            else:
                lines.append(summary_line(item))
        if len(lines) > 512:
            self.flush()

    @staticmethod
    def _json(item: PduRecord, ulp_info: Any) -> dict[str, Any]:
        record = record_json(item)
        if ulp_info is not None:
            record.update(ulp_info.json_fields())
        return record

    def flush(self) -> None:
        if self.lines:
            self.lines.append("")
            self.write("\n".join(self.lines))
            self.lines = []


def run(args: argparse.Namespace, out: TextIO | None = None) -> int:
    out = out or sys.stdout
    options = options_from(args)
    printer = _Printer(args, out)

    def flush_decoded() -> None:  # before a read that may wait: show what is decoded
        printer.flush()
        out.flush()

    try:
        reader = CaptureReader(args.file, on_wait=flush_decoded)
    except CaptureError as exc:
        raise CliError(str(exc)) from None
    dissector = Dissector(options)
    error: CaptureError | None = None
    feed = dissector.feed
    emit = printer.emit
    try:
        if printer.limit is None:
            for segment in reader:
                items = feed(segment)
                if items:
                    emit(items)
        else:
            for segment in reader:
                items = feed(segment)
                if items:
                    emit(items)
                    if printer.done:
                        break
    except CaptureError as exc:
        error = exc
    finally:
        reader.close()
    if not printer.done:
        printer.emit(dissector.finish())
    streams = dissector.streams()
    if printer.stats is not None:
        printer.lines.extend(printer.stats.render(streams))
    printer.flush()
    out.flush()
    name = reader.name
    if error is not None:
        kind = "truncated" if isinstance(error, TruncatedCapture) else "corrupt"
        print(f"iwarp dissect: {name}: {kind} capture: {error.message}", file=sys.stderr)
        return 2
    if printer.pdus == 0:
        tcp = reader.stats.tcp
        why = "no TCP segments" if tcp == 0 else f"{len(streams)} TCP connection(s), none iWARP"
        print(f"iwarp dissect: {name}: no iWARP (MPA) traffic found ({why})", file=sys.stderr)
        return 1
    if args.fail_on_findings and printer.with_findings:
        return 3
    return 0
