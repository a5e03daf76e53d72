"""Benchmark: ``iwarp dissect`` against tshark on the same generated capture, in the same run.

``python -m tools.bench_dissect [--fpdus 1000000] [--markers] [--repeat 1] [--median]
[--keep FILE] [--modes summary,json,fields,stats] [--rss-fpdus N] [--json OUT]
[--baseline DIR]``

The capture holds one connection (MPA rev 2 with CRC) carrying a mix of Sends, RDMA Writes
of varied sizes (segmented at MULPDU into several FPDUs), Read Requests and Read
Responses, recorded through the capture-tap writer with an MSS of 1460 bytes.  It is
written to a temporary directory, or to ``--keep FILE`` and reused from there by a later
run with the same ``--fpdus`` and ``--markers`` (the generator is seeded; a small JSON
file next to it says what it holds).  Both tools run as subprocesses writing to
/dev/null, interpreter and program start-up included; runs alternate so both see the
same load, and the best of ``--repeat`` runs is kept (``--median``: the median wall and
CPU times).  The modes compared (tshark with its
iWARP dissectors enabled and the port decoded as iWARP):

``summary``  the default one-line output; tshark ``-Y iwarp_mpa``
``json``     ``--json``; tshark ``-Y iwarp_mpa -T json -J "iwarp_mpa iwarp_ddp_rdmap"``
``fields``   ``-T fields -e ...`` of five columns; tshark the same columns
``stats``    ``-q -z io,stat,1``; tshark ``-q -z io,stat,1,iwarp_mpa``
``verbose``  ``-V``; tshark ``-Y iwarp_mpa -V`` (not in the default set: slow)

Each row has wall and CPU seconds, FPDUs per second, the peak RSS of each tool and the
ratios tshark/ours (above 1: ours is faster).  Constant memory: the summary mode also runs
on a capture of ``--rss-fpdus`` FPDUs (default a tenth) and both peak RSS are reported.
``--json OUT`` writes the figures as one JSON document (``-``: standard output, after the
table); ``--baseline DIR`` times another source tree of the project too (rows
``MODE@baseline``: before and after a change, in the same run).  Speed is reported, never
asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any, NamedTuple

from stack.constants import MPA_MAX_PRIVATE_DATA
from stack.pcap import Direction, PcapWriter
from stack.wire.events import IrdOrd, MpaFrame, RdmaWrite, ReadRequest, ReadResponse, Send
from stack.wire.framing import FpduFramer, mulpdu_for
from stack.wire.mpa import encode_frame
from stack.wire.rdmap import encode_message

TSHARK_OPTS = [
    "--disable-heuristic",
    "rpcrdma_iwarp",
    "--disable-heuristic",
    "smb_direct_iwarp",
    "-o",
    "iwarp_ddp_rdmap.reassemble_iwarp_rdma_send:FALSE",
]


def generate(path: str, fpdus: int, markers: bool = False, seed: int = 1) -> int:
    """Write a capture with at least ``fpdus`` FPDUs; return the exact FPDU count."""
    rng = random.Random(seed)
    mss = 1460
    mulpdu = mulpdu_for(mss, markers)
    with PcapWriter(path) as writer:
        conn = writer.connection(("192.0.2.1", 40000), ("192.0.2.2", 4791), mss=mss)
        now = 0.0
        word = IrdOrd(16, 16)
        request = MpaFrame(reply=False, crc=True, markers=markers, rev=2, ird_ord=word)
        reply = MpaFrame(reply=True, crc=True, markers=markers, rev=2, ird_ord=word)
        conn.record(
            Direction.SENT, encode_frame(request, max_private_data=MPA_MAX_PRIVATE_DATA), now
        )
        conn.record(Direction.RECEIVED, encode_frame(reply), now)
        tx = FpduFramer(crc=True, markers=markers)
        rx = FpduFramer(crc=True, markers=markers)
        msn_send = msn_read = 1
        count = 0
        to = 0
        while count < fpdus:
            now += 1e-5
            kind = rng.random()
            if kind < 0.45:
                msg = Send(bytes(rng.randrange(0, 256)))
                ulpdus = encode_message(msg, msn=msn_send, mulpdu=mulpdu)
                msn_send += 1
            elif kind < 0.85:
                size = rng.choice((64, 512, 1024, 4096, 8192))
                ulpdus = encode_message(RdmaWrite(0x100, to, bytes(size)), msn=None, mulpdu=mulpdu)
                to += size
            else:
                size = rng.choice((128, 2048))
                req = ReadRequest(0x200, 0x1000, size, 0x300, 0x2000)
                ulpdus = encode_message(req, msn=msn_read, mulpdu=mulpdu)
                msn_read += 1
                conn.record(Direction.SENT, b"".join(tx.frame(u) for u in ulpdus), now)
                count += len(ulpdus)
                resp = ReadResponse(0x200, 0x1000, bytes(size))
                ulpdus = encode_message(resp, msn=None, mulpdu=mulpdu)
                conn.record(Direction.RECEIVED, b"".join(rx.frame(u) for u in ulpdus), now)
                count += len(ulpdus)
                continue
            conn.record(Direction.SENT, b"".join(tx.frame(u) for u in ulpdus), now)
            count += len(ulpdus)
        conn.close(now)
    return count


FIELDS = [
    "frame.number",
    "iwarp_rdma.opcode",
    "iwarp_ddp.stag",
    "iwarp_ddp.msn",
    "iwarp_mpa.ulpdulength",
]
"""The columns of the ``fields`` mode: names both tools know."""

MODES = ("summary", "json", "fields", "stats", "verbose")
DEFAULT_MODES = ("summary", "json", "fields", "stats")


def mode_commands(mode: str, path: str, tshark: str | None) -> tuple[list[str], list[str] | None]:
    """(our command, tshark's equivalent or None) of one mode on the capture ``path``."""
    ours = [sys.executable, "-m", "stack.cli.iwarp", "dissect", path]
    theirs = [tshark or "tshark", "-n", "-r", path, *TSHARK_OPTS]
    columns = [arg for name in FIELDS for arg in ("-e", name)]
    if mode == "summary":
        mine, other = ours, [*theirs, "-Y", "iwarp_mpa"]
    elif mode == "json":
        mine = [*ours, "--json"]
        other = [*theirs, "-Y", "iwarp_mpa", "-T", "json", "-J", "iwarp_mpa iwarp_ddp_rdmap"]
    elif mode == "fields":
        mine = [*ours, "-T", "fields", *columns]
        other = [*theirs, "-Y", "iwarp_mpa", "-T", "fields", *columns]
    elif mode == "stats":
        mine = [*ours, "-q", "-z", "io,stat,1"]
        other = [*theirs, "-q", "-z", "io,stat,1,iwarp_mpa"]
    elif mode == "verbose":
        mine, other = [*ours, "-V"], [*theirs, "-Y", "iwarp_mpa", "-V"]
    else:
        raise ValueError(f"unknown mode {mode!r}")
    return mine, other if tshark else None


_ENV: dict[str, str] | None = None


class Timing(NamedTuple):
    """One run: wall seconds, CPU seconds of the child (user + system), peak RSS in KiB."""

    wall: float
    cpu: float
    rss_kib: int


def _once(cmd: list[str], env: dict[str, str] | None = None) -> Timing:
    start = time.perf_counter()
    proc = subprocess.Popen(
        cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env or _ENV
    )
    _, status, usage = os.wait4(proc.pid, 0)
    elapsed = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise SystemExit(f"command failed ({proc.returncode}): {' '.join(cmd)}")
    return Timing(elapsed, usage.ru_utime + usage.ru_stime, usage.ru_maxrss)


def _best(a: Timing | None, b: Timing) -> Timing:
    if a is None:
        return b
    return Timing(min(a.wall, b.wall), min(a.cpu, b.cpu), max(a.rss_kib, b.rss_kib))


Command = tuple[list[str], dict[str, str] | None]  # argv, environment (None: the default)


def _median(runs: list[Timing]) -> Timing:
    return Timing(
        statistics.median(r.wall for r in runs),
        statistics.median(r.cpu for r in runs),
        max(r.rss_kib for r in runs),
    )


def _race(commands: list[Command], repeat: int, median: bool = False) -> list[Timing]:
    """Best (``median``: median) wall and CPU time, and the peak RSS, of each command; runs
    alternate, so all see the same load."""
    runs: list[list[Timing]] = [[] for _ in commands]
    for _ in range(repeat):
        for i, (cmd, env) in enumerate(commands):
            runs[i].append(_once(cmd, env))
    if median:
        return [_median(r) for r in runs]
    out = []
    for r in runs:
        best: Timing | None = None
        for one in r:
            best = _best(best, one)
        assert best is not None
        out.append(best)
    return out


def _capture(path: str, fpdus: int, markers: bool) -> tuple[int, bool]:
    """Generate the capture at ``path``, or reuse it when its note says it holds this
    one; (exact FPDU count, reused)."""
    note = path + ".json"
    wanted = {"fpdus": fpdus, "markers": markers, "seed": 1}
    if os.path.exists(path) and os.path.exists(note):
        with open(note, encoding="utf-8") as f:
            try:
                held = json.load(f)
            except ValueError:
                held = {}
        if {k: held.get(k) for k in wanted} == wanted and isinstance(held.get("count"), int):
            return held["count"], True
    count = generate(path, fpdus, markers)
    with open(note, "w", encoding="utf-8") as f:
        json.dump({**wanted, "count": count}, f)
    return count, False


def _row(mode: str, count: int, ours: Timing, theirs: Timing | None) -> dict[str, Any]:
    row: dict[str, Any] = {
        "mode": mode,
        "ours_wall_s": round(ours.wall, 3),
        "ours_cpu_s": round(ours.cpu, 3),
        "ours_fpdu_per_s": round(count / ours.wall),
        "ours_peak_rss_kib": ours.rss_kib,
    }
    if theirs is not None:
        row.update(
            tshark_wall_s=round(theirs.wall, 3),
            tshark_cpu_s=round(theirs.cpu, 3),
            tshark_fpdu_per_s=round(count / theirs.wall),
            tshark_peak_rss_kib=theirs.rss_kib,
            speedup_wall=round(theirs.wall / ours.wall, 2),
            speedup_cpu=round(theirs.cpu / ours.cpu, 2),
        )
    return row


def _table(rows: list[dict[str, Any]]) -> list[str]:
    """The rows as a fixed-width table."""
    lines = [
        f"{'mode':16} {'ours wall':>9} {'CPU':>7} {'FPDU/s':>8} {'RSS MiB':>7} | "
        f"{'tshark wall':>11} {'CPU':>7} {'FPDU/s':>8} {'RSS MiB':>7} | "
        f"{'tshark/ours wall':>16} {'CPU':>5}"
    ]
    for r in rows:
        line = (
            f"{r['mode']:16} {r['ours_wall_s']:>8.2f}s {r['ours_cpu_s']:>6.2f}s "
            f"{r['ours_fpdu_per_s']:>8} {int(r['ours_peak_rss_kib']) / 1024:>7.1f} | "
        )
        if "tshark_wall_s" in r:
            line += (
                f"{r['tshark_wall_s']:>10.2f}s {r['tshark_cpu_s']:>6.2f}s "
                f"{r['tshark_fpdu_per_s']:>8} {int(r['tshark_peak_rss_kib']) / 1024:>7.1f} | "
                f"{r['speedup_wall']:>16.2f} {r['speedup_cpu']:>5.2f}"
            )
        else:
            line += "tshark not run"
        lines.append(line)
    return lines


def _modes(text: str) -> list[str]:
    """argparse type: a comma-separated list of MODES."""
    chosen = [m.strip() for m in text.split(",") if m.strip()]
    unknown = [m for m in chosen if m not in MODES]
    if unknown or not chosen:
        raise argparse.ArgumentTypeError(f"modes are {', '.join(MODES)}; got {text!r}")
    return chosen


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tools.bench_dissect",
        description=__doc__.split("\n")[0] if __doc__ else None,
    )
    parser.add_argument("--fpdus", type=int, default=1_000_000)
    parser.add_argument("--markers", action="store_true", help="markers in both directions")
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--median", action="store_true", help="median of the runs, not the best")
    parser.add_argument("--keep", metavar="FILE", help="write the capture here (reused next time)")
    parser.add_argument(
        "--modes",
        type=_modes,
        default=list(DEFAULT_MODES),
        help=f"comma-separated, of {','.join(MODES)} (default {','.join(DEFAULT_MODES)})",
    )
    parser.add_argument("--no-json", action="store_true", help="compare the summaries only")
    parser.add_argument("--no-tshark", action="store_true", help="time iwarp dissect alone")
    parser.add_argument(
        "--rss-fpdus",
        type=int,
        metavar="N",
        help="FPDUs of the smaller capture of the memory check (default fpdus/10; 0: skip)",
    )
    parser.add_argument("--json", dest="json_out", metavar="OUT", help="write JSON (- stdout)")
    parser.add_argument(
        "--baseline",
        metavar="DIR",
        help="also time the iwarp dissect of this source tree (an earlier commit, e.g. from "
        "git archive), in the same runs: rows MODE@baseline",
    )
    args = parser.parse_args(argv)
    if args.fpdus < 1 or args.repeat < 1:
        parser.error("--fpdus and --repeat must be at least 1")
    modes = ["summary"] if args.no_json else args.modes
    tshark = None if args.no_tshark else shutil.which("tshark")
    global _ENV
    with tempfile.TemporaryDirectory() as tmp:
        # Byte-compiled modules as an installed package has them (a session may run with
        # PYTHONDONTWRITEBYTECODE, which would recompile every module at each start);
        # the cache goes to the temporary directory, not into the source tree.
        _ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
        _ENV["PYTHONPYCACHEPREFIX"] = os.path.join(tmp, "pycache")
        _once([sys.executable, "-m", "stack.cli.iwarp", "dissect", "--help"])
        path = args.keep or os.path.join(tmp, "bench.pcap")
        t0 = time.perf_counter()
        count, reused = _capture(path, args.fpdus, args.markers)
        size = os.path.getsize(path)
        how = "reused" if reused else f"generated in {time.perf_counter() - t0:.1f} s"
        print(
            f"capture: {count} FPDUs, {size / 1e6:.1f} MB, markers "
            f"{'on' if args.markers else 'off'} ({how})",
            flush=True,
        )
        rows: list[dict[str, Any]] = []
        before_env = None
        if args.baseline:
            # PYTHONSAFEPATH: the current directory (this tree) must not come first
            before_env = {
                **_ENV,
                "PYTHONPATH": os.path.abspath(args.baseline),
                "PYTHONSAFEPATH": "1",
            }
            before_env["PYTHONPYCACHEPREFIX"] = os.path.join(tmp, "pycache-baseline")
            _once([sys.executable, "-m", "stack.cli.iwarp", "dissect", "--help"], before_env)
        for mode in modes:
            mine, theirs = mode_commands(mode, path, tshark)
            commands: list[Command] = [(mine, None)]
            if theirs:
                commands.append((theirs, None))
            if before_env is not None:
                commands.append((mine, before_env))
            timings = _race(commands, args.repeat, args.median)
            ts = timings[1] if theirs else None
            rows.append(_row(mode, count, timings[0], ts))
            if before_env is not None:
                rows.append(_row(f"{mode}@baseline", count, timings[-1], ts))
            table = _table(rows)
            new = 2 if before_env is not None else 1
            print("\n".join(table if mode == modes[0] else table[-new:]), flush=True)
        report: dict[str, Any] = {
            "capture": {"fpdus": count, "bytes": size, "markers": args.markers},
            "repeat": args.repeat,
            "statistic": "median" if args.median else "best",
            "rows": rows,
        }
        small_fpdus = args.fpdus // 10 if args.rss_fpdus is None else args.rss_fpdus
        if small_fpdus > 0:
            small = os.path.join(tmp, "small.pcap")
            small_count = generate(small, small_fpdus, args.markers)
            mine, _ = mode_commands("summary", small, None)
            peak_small = _once(mine).rss_kib
            peak_big = int(rows[0]["ours_peak_rss_kib"]) if modes[0] == "summary" else (
                _once(mode_commands("summary", path, None)[0]).rss_kib
            )  # fmt: skip
            report["memory"] = {
                "small_fpdus": small_count,
                "small_peak_rss_kib": peak_small,
                "large_fpdus": count,
                "large_peak_rss_kib": peak_big,
            }
            print(
                f"memory (summary, peak RSS): {small_count} FPDUs {peak_small / 1024:.1f} MiB, "
                f"{count} FPDUs {peak_big / 1024:.1f} MiB"
            )
        if tshark:
            version = subprocess.run(
                [tshark, "--version"], capture_output=True, text=True, check=False
            ).stdout.splitlines()
            report["tshark"] = version[0] if version else "unknown version"
            print(f"tshark: {report['tshark']}")
    if args.json_out:
        text = json.dumps(report, indent=2)
        if args.json_out == "-":
            print(text)
        else:
            with open(args.json_out, "w", encoding="utf-8") as f:
                f.write(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
