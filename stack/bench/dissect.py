"""Benchmark: ``iwarp dissect`` against tshark on the same generated capture, in the same run.

``iwarp bench dissect [--fpdus 1000000] [--markers] [-r 1] [--median] [--keep FILE]
[--modes summary,json,fields,stats] [--rss-fpdus N] [--baseline DIR] [--json FILE]``

The capture (:mod:`stack.bench.dissect_capture`) holds one connection (MPA rev 2 with CRC)
carrying a mix of Sends, RDMA Writes of varied sizes (several FPDUs each), Read Requests and
Read Responses, with an MSS of 1460 bytes.  It is written to a temporary directory, or to
``--keep FILE`` and reused from there by a later run with the same ``--fpdus`` and
``--markers`` (the generator is seeded; a small JSON file next to it says what it holds).
Both tools run as subprocesses writing to /dev/null, interpreter and program start-up
included; runs alternate so both see the same load, and the best of ``--repeat`` runs is
kept (``--median``: the median wall and CPU times).  The modes compared (tshark with its
iWARP dissectors enabled and the port decoded as iWARP):

``summary``  the default one-line output; tshark ``-Y iwarp_mpa``
``json``     ``--json``; tshark ``-Y iwarp_mpa -T json -J "iwarp_mpa iwarp_ddp_rdmap"``
``fields``   ``-T fields -e ...`` of five columns; tshark the same columns
``stats``    ``-q -z io,stat,1``; tshark ``-q -z io,stat,1,iwarp_mpa``
``verbose``  ``-V``; tshark ``-Y iwarp_mpa -V`` (not in the default set: slow)

Each row has wall and CPU seconds, FPDUs per second, the peak RSS of each tool and the
ratios tshark/ours (above 1: ours is faster).  Without tshark on the PATH the ``iwarp`` rows
are measured alone, tshark's figures are null and the JSON says why (``tshark_problem``).
Constant memory: the summary mode also runs on a capture of ``--rss-fpdus`` FPDUs (default
a tenth) and both peak RSS are reported.  ``--baseline DIR`` times another source tree of
the project too (rows ``MODE@baseline``: before and after a change, in the same run).
Progress goes to stderr (``--quiet``: none).  Speed is reported, never asserted.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any, NamedTuple, TextIO

from stack.bench.dissect_capture import capture, generate
from stack.bench.process import PROJECT_ROOT
from stack.bench.progress import Progress
from stack.cli import (
    ERROR_PROG,
    MAX_REPEAT,
    CliError,
    counted,
    non_negative_int,
    one_line_errors,
    repeat_count,
)
from stack.cli.json_report import (
    add_json_argument,
    check_outputs,
    schema,
    text_to_stderr_if_json_stdout,
    write_json,
)
from stack.interop.tshark import OPTIONS as TSHARK_OPTIONS

__all__ = [
    "DEFAULT_MODES",
    "FIELDS",
    "HELP",
    "MAX_FPDUS",
    "MODES",
    "Timing",
    "add_arguments",
    "generate",
    "mode_commands",
    "register_bench",
    "run",
    "tshark_problem",
]

Doc = dict[str, Any]

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
MAX_FPDUS = 10_000_000
"""Most FPDUs ``--fpdus`` takes: the capture is about 840 octets per FPDU on disk (8.4 GB)."""

HELP = "iwarp dissect against tshark on a generated capture, mode by mode (wall, CPU, RSS)"
"""The one line ``iwarp bench --help`` shows for ``dissect``."""


def tshark_problem() -> str | None:
    """Why tshark cannot be timed here, or None."""
    if shutil.which("tshark") is None:
        return "tshark not found on the PATH (Debian: apt install tshark)"
    return None


def _iwarp_dissect(*args: str) -> list[str]:
    """``iwarp dissect ARGS`` with ``python -P``: only PYTHONPATH says which tree runs."""
    return [sys.executable, "-P", "-m", "stack.cli.iwarp", "dissect", *args]


def mode_commands(mode: str, path: str, tshark: str | None) -> tuple[list[str], list[str] | None]:
    """(our command, tshark's equivalent or None) of one mode on the capture ``path``."""
    ours = _iwarp_dissect(path)
    theirs = [tshark or "tshark", "-n", "-r", path, *TSHARK_OPTIONS]
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


class Timing(NamedTuple):
    """One run: wall seconds, CPU seconds of the child (user + system), peak RSS in KiB."""

    wall: float
    cpu: float
    rss_kib: int


Command = tuple[list[str], dict[str, str] | None]  # argv, environment (None: this one's)


def _once(cmd: list[str], env: dict[str, str] | None = None) -> Timing:
    """Run ``cmd`` to /dev/null; RuntimeError with its last words if it fails."""
    with tempfile.TemporaryFile() as errors:
        start = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=errors, env=env)
        _, status, usage = os.wait4(proc.pid, 0)
        elapsed = time.perf_counter() - start
        proc.returncode = os.waitstatus_to_exitcode(status)
        if proc.returncode != 0:
            errors.seek(0)
            said = errors.read().decode(errors="replace").strip().splitlines()
            tail = f": {said[-1]}" if said else ""
            raise RuntimeError(f"exit {proc.returncode} of {' '.join(cmd)}{tail}")
    return Timing(elapsed, usage.ru_utime + usage.ru_stime, usage.ru_maxrss)


def _median(runs: list[Timing]) -> Timing:
    return Timing(
        statistics.median(r.wall for r in runs),
        statistics.median(r.cpu for r in runs),
        max(r.rss_kib for r in runs),
    )


def _best(runs: list[Timing]) -> Timing:
    return Timing(min(r.wall for r in runs), min(r.cpu for r in runs), max(r.rss_kib for r in runs))


def _race(
    commands: list[Command],
    repeat: int,
    median: bool = False,
    before_each: Callable[[int, int], None] | None = None,
) -> list[Timing]:
    """Best (``median``: median) wall and CPU time, and the peak RSS, of each command; runs
    alternate, so all see the same load.  ``before_each(run, command)``: called before
    each run (both 0-based)."""
    runs: list[list[Timing]] = [[] for _ in commands]
    for n in range(repeat):
        for i, (cmd, env) in enumerate(commands):
            if before_each is not None:
                before_each(n, i)
            runs[i].append(_once(cmd, env))
    return [(_median if median else _best)(r) for r in runs]


def _row(mode: str, count: int, ours: Timing, theirs: Timing | None) -> Doc:
    """One row of the table and the JSON; tshark's figures None when it was not run."""
    row: Doc = {
        "mode": mode,
        "ours_wall_s": round(ours.wall, 3),
        "ours_cpu_s": round(ours.cpu, 3),
        "ours_fpdu_per_s": round(count / ours.wall),
        "ours_peak_rss_kib": ours.rss_kib,
    }
    row.update(
        tshark_wall_s=None if theirs is None else round(theirs.wall, 3),
        tshark_cpu_s=None if theirs is None else round(theirs.cpu, 3),
        tshark_fpdu_per_s=None if theirs is None else round(count / theirs.wall),
        tshark_peak_rss_kib=None if theirs is None else theirs.rss_kib,
        speedup_wall=None if theirs is None else round(theirs.wall / ours.wall, 2),
        speedup_cpu=None if theirs is None or not ours.cpu else round(theirs.cpu / ours.cpu, 2),
    )
    return row


def _table(rows: list[Doc]) -> list[str]:
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
        if r["tshark_wall_s"] is not None:
            cpu = "-" if r["speedup_cpu"] is None else f"{r['speedup_cpu']:.2f}"
            line += (
                f"{r['tshark_wall_s']:>10.2f}s {r['tshark_cpu_s']:>6.2f}s "
                f"{r['tshark_fpdu_per_s']:>8} {int(r['tshark_peak_rss_kib']) / 1024:>7.1f} | "
                f"{r['speedup_wall']:>16.2f} {cpu:>5}"
            )
        else:
            line += "tshark not run"
        lines.append(line)
    return lines


def _tree_env(tree: str, pycache: str) -> dict[str, str]:
    """The environment of an ``iwarp dissect`` of ``tree``: that tree alone on PYTHONPATH
    (with ``python -P``, so the working directory cannot shadow it), byte-compiled modules
    as an installed package has them, cached in ``pycache``, not in the tree (a session
    may run with PYTHONDONTWRITEBYTECODE, which would recompile every module at each
    start)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPATH"] = os.path.abspath(tree)
    env["PYTHONPYCACHEPREFIX"] = pycache
    return env


def measure(args: argparse.Namespace, doc: Doc, out: TextIO, progress: Progress) -> None:
    """Generate (or reuse) the capture, race the tools mode by mode, check the memory; the
    table on ``out`` as rows come, the figures into ``doc`` (what was measured stays there
    when a run fails)."""
    tshark = None if doc["tshark_problem"] else shutil.which("tshark")
    with tempfile.TemporaryDirectory(prefix="iwarp-bench-dissect-") as tmp:
        env = _tree_env(PROJECT_ROOT, os.path.join(tmp, "pycache"))
        _once(_iwarp_dissect("--help"), env)
        baseline_env = None
        if args.baseline:
            baseline_env = _tree_env(args.baseline, os.path.join(tmp, "pycache-baseline"))
            _once(_iwarp_dissect("--help"), baseline_env)
        path = args.keep or os.path.join(tmp, "bench.pcap")
        t0 = time.perf_counter()
        progress.start(f"writing the capture, {args.fpdus} FPDUs", total=args.fpdus)
        count, reused = capture(path, args.fpdus, args.markers, progress.advance)
        progress.finish()
        size = os.path.getsize(path)
        doc["capture"] = {"fpdus": count, "bytes": size, "markers": args.markers}
        how = "reused" if reused else f"generated in {time.perf_counter() - t0:.1f} s"
        print(
            f"capture: {count} FPDUs, {size / 1e6:.1f} MB, markers "
            f"{'on' if args.markers else 'off'} ({how})",
            file=out,
            flush=True,
        )
        rows: list[Doc] = doc["rows"]
        for mode in args.modes:
            mine, theirs = mode_commands(mode, path, tshark)
            commands: list[Command] = [(mine, env)]
            names = ["iwarp dissect"]
            if theirs:
                commands.append((theirs, env))
                names.append("tshark")
            if baseline_env is not None:
                commands.append((mine, baseline_env))
                names.append("iwarp dissect (baseline)")

            def say(n: int, i: int, mode: str = mode, names: list[str] = names) -> None:
                progress.note(f"{mode}: {names[i]}, run {n + 1} of {args.repeat}")

            timings = _race(commands, args.repeat, args.median, say)
            ts = timings[1] if theirs else None
            first = len(rows)
            rows.append(_row(mode, count, timings[0], ts))
            if baseline_env is not None:
                rows.append(_row(f"{mode}@baseline", count, timings[-1], ts))
            table = _table(rows)
            print("\n".join(table if not first else table[first + 1 :]), file=out, flush=True)
        small_fpdus = args.fpdus // 10 if args.rss_fpdus is None else args.rss_fpdus
        if small_fpdus > 0:
            small = os.path.join(tmp, "small.pcap")
            progress.start(f"writing the memory check's capture, {small_fpdus} FPDUs", small_fpdus)
            small_count = generate(small, small_fpdus, args.markers, progress=progress.advance)
            progress.note(f"memory: iwarp dissect on {small_count} and {count} FPDUs")
            peak_small = _once(_iwarp_dissect(small), env).rss_kib
            if args.modes[0] == "summary":
                peak_big = int(rows[0]["ours_peak_rss_kib"])
            else:
                peak_big = _once(_iwarp_dissect(path), env).rss_kib
            doc["memory"] = {
                "small_fpdus": small_count,
                "small_peak_rss_kib": peak_small,
                "large_fpdus": count,
                "large_peak_rss_kib": peak_big,
            }
            print(
                f"memory (summary, peak RSS): {small_count} FPDUs {peak_small / 1024:.1f} MiB, "
                f"{count} FPDUs {peak_big / 1024:.1f} MiB",
                file=out,
            )
    if tshark:
        version = subprocess.run(
            [tshark, "--version"], capture_output=True, text=True, check=False
        ).stdout.splitlines()
        doc["tshark"] = version[0] if version else "unknown version"
        print(f"tshark: {doc['tshark']}", file=out)


def _modes(text: str) -> list[str]:
    """argparse type of ``--modes``: a comma-separated list of :data:`MODES`."""
    chosen = [m.strip() for m in text.split(",") if m.strip()]
    unknown = [m for m in chosen if m not in MODES]
    if unknown or not chosen:
        raise argparse.ArgumentTypeError(f"modes are {', '.join(MODES)}; got {text!r}")
    return chosen


def _rss_fpdus(text: str) -> int:
    """argparse type of ``--rss-fpdus``: 0 (skip the check) to :data:`MAX_FPDUS`."""
    value = non_negative_int(text)
    if value > MAX_FPDUS:
        raise argparse.ArgumentTypeError(f"must be at most {MAX_FPDUS}, got {text}")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``iwarp bench dissect``; their types refuse a bad value (one usage
    error, before anything runs)."""
    parser.add_argument(
        "--fpdus",
        type=counted(MAX_FPDUS),
        default=1_000_000,
        metavar="N",
        help=f"FPDUs of the generated capture (default 1000000, at most {MAX_FPDUS})",
    )
    parser.add_argument("--markers", action="store_true", help="markers in both directions")
    parser.add_argument(
        "-r",
        "--repeat",
        type=repeat_count,
        default=1,
        metavar="N",
        help=f"alternated runs of each tool per mode, the best kept (default 1, at most "
        f"{MAX_REPEAT})",
    )
    parser.add_argument("--median", action="store_true", help="median of the runs, not the best")
    parser.add_argument(
        "--keep", metavar="FILE", help="write the capture to FILE (reused by the next run)"
    )
    parser.add_argument(
        "--modes",
        type=_modes,
        default=list(DEFAULT_MODES),
        metavar="LIST",
        help=f"comma-separated, of {','.join(MODES)} (default {','.join(DEFAULT_MODES)})",
    )
    parser.add_argument(
        "--rss-fpdus",
        type=_rss_fpdus,
        metavar="N",
        help="FPDUs of the smaller capture of the memory check, at most "
        f"{MAX_FPDUS} (default a tenth of --fpdus; 0: skip the check)",
    )
    parser.add_argument(
        "--baseline",
        metavar="DIR",
        help="also time the iwarp dissect of this source tree of the project (an earlier "
        "commit, e.g. from git archive), in the same runs: rows MODE@baseline",
    )
    parser.add_argument("--no-tshark", action="store_true", help="time iwarp dissect alone")
    parser.add_argument("--quiet", action="store_true", help="no progress on stderr")
    add_json_argument(parser)


def run(args: argparse.Namespace) -> int:
    """``iwarp bench dissect``: measure, print the table (on stderr with ``--json -``),
    write the JSON; a failed run is one error line and status 1 (its JSON says so)."""
    prog = getattr(args, ERROR_PROG, "iwarp bench dissect")
    if args.keep == "-":
        raise CliError("--keep -: the capture needs a file, not standard output")
    check_outputs(("--keep", args.keep), ("--json", args.json))
    if args.baseline and not os.path.isfile(os.path.join(args.baseline, "stack", "__init__.py")):
        raise CliError(f"--baseline {args.baseline}: not a source tree of this project")
    problem = "not run (--no-tshark)" if args.no_tshark else tshark_problem()
    if problem and not args.no_tshark:
        print(f"{prog}: {problem}: timing iwarp dissect alone", file=sys.stderr, flush=True)
    doc: Doc = {
        "schema": schema("iwarp bench dissect"),
        "command": "iwarp bench dissect",
        "modes": args.modes,
        "repeat": args.repeat,
        "statistic": "median" if args.median else "best",
        "baseline_tree": os.path.abspath(args.baseline) if args.baseline else None,
        "capture": None,
        "tshark": None,
        "tshark_problem": problem,
        "rows": [],
        "memory": None,
    }
    status = 0
    progress = Progress(None if args.quiet else sys.stderr, delay=0.5)
    with text_to_stderr_if_json_stdout(args.json):
        try:
            measure(args, doc, sys.stdout, progress)
        except (OSError, RuntimeError) as exc:
            progress.finish()
            print(f"{prog}: error: {exc}", file=sys.stderr)
            status, doc["error"] = 1, str(exc)
    doc |= {"exit_status": status, "verdict": "ok" if status == 0 else "failed"}
    if args.json:
        write_json(args.json, doc)
    return status


def register_bench(subparsers: argparse._SubParsersAction) -> None:
    """Add ``dissect``."""
    parser = subparsers.add_parser(
        "dissect",
        help=HELP,
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_arguments(parser)
    one_line_errors(parser)
    parser.set_defaults(func=run)
