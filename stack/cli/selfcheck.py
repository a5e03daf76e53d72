"""``iwarp selfcheck``: prove the stack works on this machine, end to end, in seconds.

1. Every RDMAP message type is encoded by the wire core, framed by MPA (CRC on, markers on
   and off), deframed, decoded and compared.
2. Every negotiation variant and operation scenario of the reference captures runs between
   two software RNICs over loopback TCP, recorded through the capture tap.
3. Each capture is decoded by the stream decoder and checked against its expected decode.

Prints a table and exits non-zero on any mismatch.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import trio

from stack.cli import one_line_errors
from stack.cli.json_report import (
    add_json_argument,
    check_outputs,
    schema,
    text_to_stderr_if_json_stdout,
    write_json,
)
from stack.constants import OPCODE_NAMES
from stack.dissect.decoder import PduRecord, dissect
from stack.pcap import read_tcp_segments
from stack.scenarios import SCENARIOS, run_scenario
from stack.wire.events import (
    AtomicRequest,
    AtomicResponse,
    ImmediateData,
    RdmapMessage,
    RdmaWrite,
    ReadRequest,
    ReadResponse,
    Send,
    Terminate,
)
from stack.wire.framing import FpduDeframer, FpduFramer
from stack.wire.rdmap import decode_ulpdu
from stack.wire.stream import RdmapStream

MESSAGES: list[RdmapMessage] = [
    RdmaWrite(0x1234, 0x1000, bytes(range(200))),
    ReadRequest(0x11223344, 0x2000, 0x1000, 0x55667788, 0x3000),
    ReadResponse(0x11223344, 0x2000, b"response"),
    Send(b"send"),
    Send(b"send-inv", invalidate_stag=0xABCD),
    Send(b"send-se", solicited=True),
    Send(b"send-se-inv", solicited=True, invalidate_stag=0xABCD),
    Terminate(
        1, 2, 3, m=True, d=True, ddp_seg_len=31, ddp_header=bytes.fromhex("4143") + bytes(16)
    ),
    ImmediateData(bytes(range(8))),
    ImmediateData(bytes(range(8)), solicited=True),
    AtomicRequest.fetch_add(7, 0x0A0B0C0D, 0x4000, 1),
    AtomicResponse(7, 0x29),
]


def codec_round_trips() -> list[tuple[str, str, bool]]:
    """Encode -> frame -> deframe -> decode each message, markers off and on."""
    rows = []
    for markers in (False, True):
        for msg in MESSAGES:
            stream = RdmapStream(1442)
            framer = FpduFramer(crc=True, markers=markers)
            wire = b"".join(framer.frame(u) for u in stream.send(msg))
            deframer = FpduDeframer(crc=True, markers=markers)
            deframer.feed(wire)
            ulpdus = list(deframer)
            segment = decode_ulpdu(ulpdus[0])
            ok = OPCODE_NAMES[segment.opcode] == _name(msg) and len(ulpdus) >= 1
            rows.append((_name(msg), "markers" if markers else "plain", ok))
    return rows


def _name(msg: Any) -> str:
    if isinstance(msg, Send):
        return OPCODE_NAMES[msg.opcode]
    if isinstance(msg, ImmediateData):
        return "Immediate Data with SE" if msg.solicited else "Immediate Data"
    return {
        RdmaWrite: "RDMA Write",
        ReadRequest: "RDMA Read Request",
        ReadResponse: "RDMA Read Response",
        Terminate: "Terminate",
        AtomicRequest: "Atomic Request",
        AtomicResponse: "Atomic Response",
    }[type(msg)]


def _kind(record: PduRecord) -> str | None:
    """An MPA frame's kind, an FPDU's opcode name; None for an FPDU not decoded."""
    if record.kind != "fpdu":
        return record.kind
    return None if record.segment is None else record.segment.opcode_name


def live_scenarios(folder: Path) -> list[tuple[str, int, int, bool, float]]:
    """Run every scenario: (name, PDUs, findings, ok, seconds) each."""
    rows = []
    for i, scenario in enumerate(SCENARIOS, 1):
        print(f"  [{i}/{len(SCENARIOS)}] {scenario.name}", file=sys.stderr, flush=True)
        path = folder / f"{scenario.name}.pcap"
        start = time.perf_counter()
        trio.run(run_scenario, scenario, path)
        elapsed = time.perf_counter() - start
        records = [r for r in dissect(read_tcp_segments(path)) if isinstance(r, PduRecord)]
        kinds = [(r.direction, kind) for r in records if (kind := _kind(r)) is not None]
        findings = sum(len(r.findings) for r in records)
        ok = findings == 0 and all(
            [k for d, k in kinds if d == side] == [k for d, k in scenario.expect if d == side]
            for side in ("i2r", "r2i")
        )
        rows.append((scenario.name, len(records), findings, ok, elapsed))
    return rows


def run(args: argparse.Namespace) -> int:
    check_outputs(("--json", args.json), folders=(("--keep", args.keep),))
    print("iwarp selfcheck: wire codec round trips", file=sys.stderr)
    codec = codec_round_trips()
    folder = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="iwarp-selfcheck-"))
    print(
        f"iwarp selfcheck: live scenarios over loopback TCP (captures in {folder})", file=sys.stderr
    )
    live = live_scenarios(folder)
    failures = sum(not r[2] for r in codec) + sum(not r[3] for r in live)
    total = len(codec) + len(live)
    status = 1 if failures else 0
    with text_to_stderr_if_json_stdout(args.json):
        print(f"{'message':32} {'framing':8} result")
        for name, framing, ok in codec:
            print(f"{name:32} {framing:8} {'ok' if ok else 'FAIL'}")
        print()
        print(f"{'scenario':26} {'PDUs':>5} {'decode':14} {'time[s]':>7} result")
        for name, count, findings, ok, elapsed in live:
            note = f"{findings} findings"
            print(f"{name:26} {count:5d} {note:14} {elapsed:7.2f} {'ok' if ok else 'FAIL'}")
        print(f"\n{total - failures} passed, {failures} failed")
    if args.json:
        write_json(args.json, selfcheck_document(codec, live, folder, args.keep, status))
    return status


def selfcheck_document(
    codec: list[tuple[str, str, bool]],
    live: list[tuple[str, int, int, bool, float]],
    folder: Path,
    kept: str | None,
    exit_status: int,
) -> dict[str, Any]:
    """``iwarp selfcheck --json``: every check of the table, the counts and the verdict."""
    failures = sum(not r[2] for r in codec) + sum(not r[3] for r in live)
    return {
        "schema": schema("iwarp selfcheck"),
        "command": "iwarp selfcheck",
        "codec": [{"message": n, "framing": f, "ok": ok} for n, f, ok in codec],
        "scenarios": [
            {"scenario": n, "pdus": c, "findings": f, "seconds": t, "ok": ok}
            for n, c, f, ok, t in live
        ],
        "captures": str(folder) if kept else None,
        "passed": len(codec) + len(live) - failures,
        "failed": failures,
        "exit_status": exit_status,
        "verdict": "FAIL" if failures else "PASS",
    }


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "selfcheck", help="encode/decode every message and run every scenario over loopback TCP"
    )
    parser.add_argument("--keep", metavar="DIR", help="write the captures to DIR and keep them")
    add_json_argument(parser)
    one_line_errors(parser)
    parser.set_defaults(func=run)
