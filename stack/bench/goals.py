"""``iwarp bench goals``: the data path's speed goals (docs/performance.md), measured in one run.

Each goal is a ratio to a baseline measured in the same benchmark run (raw trio TCP, the
pipelined raw request/response of ``kbtp bench``, Mooncake Transfer Engine's TCP
transport, tshark on the same capture), with a target and a direction.  This command runs
the benchmarks behind them, one after the other, each as its own process (``iwarp bench
... --baseline --cpu --json``, ``kbtp bench ... --vs mooncake --json``, ``iwarp bench
dissect --json``), reads their JSON documents and prints one table: target, measured, met.
It also measures each goal's pure-Python floor on this host (``iwarp bench floor``: the
goal's exchange against the same raw baseline with only FPDU framing, CRC32c at both ends
and the placement copy added; streams of 64 KiB and 1 MiB with and without markers, 64 B
messages batched as the raw baseline batches them, pipelined Reads, the 64 B Read round
trip, which also bounds the FetchAdd's): where a goal's target lies beyond that floor, no
pure-Python implementation meets it on this host, and the table says so.  And it times a
10M-iteration ``x += i`` loop, so the figures of two hosts can be told apart by the
interpreter's speed.  ``--before TREE`` also runs each benchmark with another source tree of
the project first on the path, right before this one's: before and after a change, on the
same host in the same minutes.

The ``iwarp dissect`` goal (summary mode at least 1.5 times tshark's speed on 1M FPDUs) is
measured by ``iwarp bench dissect``, which generates the capture (a minute or two in all);
without tshark on the PATH it is not run and the goal is not measured, with the reason.

``--plot FILE.png`` draws the run, each goal as the share of its target reached next to
its floor (:mod:`stack.bench.goals_plot`); ``--from FILE`` prints and draws a run saved
with ``--json`` without measuring, ``--from-before OLD`` beside another saved run.

Speed is reported, never asserted: the exit status is 0 when every benchmark ran, whatever
the verdicts; 1 when one failed (its goals say why).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import replace
from typing import TextIO

from stack.bench.goal_catalog import (
    FLOOR_RUNS,
    GOAL_KEYS,
    GOALS,
    MEASUREMENTS,
    ROUND_TRIP_CPUS,
    SMALL_BATCH,
    TITLE_WIDTH,
    Doc,
    FloorRun,
    Goal,
    Measurement,
    placed,
)
from stack.bench.goals_plot import load_goals_document, save_goals_plot
from stack.bench.goals_report import (
    LOOP_ITERATIONS,
    GoalResult,
    GoalsRun,
    format_table,
    goals_document,
    judge,
    run_from_document,
    with_saved_before,
)
from stack.bench.plot import MISSING_MATPLOTLIB, check_plot_path, have_matplotlib
from stack.bench.process import PROJECT_ROOT, cpu_list
from stack.cli import MAX_DURATION, CliError, add_repeat_argument, duration, one_line_errors
from stack.cli.json_report import check_outputs, write_json

__all__ = [
    "FLOOR_RUNS",
    "GOALS",
    "LOOP_ITERATIONS",
    "MEASUREMENTS",
    "FloorRun",
    "Goal",
    "GoalResult",
    "GoalsRun",
    "Measurement",
    "format_table",
    "goals_document",
    "judge",
    "register_bench",
    "run_from_document",
    "run_goals",
    "with_saved_before",
]


def interpreter_loop_seconds() -> float:
    """Seconds a module-level ``x += i`` loop of LOOP_ITERATIONS takes here (the host's
    Python speed; global names, as ``python -c`` runs it)."""
    code = compile(f"x = 0\nfor i in range({LOOP_ITERATIONS}):\n    x += i\n", "<loop>", "exec")
    start = time.perf_counter()
    exec(code, {})
    return time.perf_counter() - start


def _run_measurement(
    m: Measurement, seconds: float, repeat: int, workdir: str, tree: str | None = None
) -> Doc:
    """Run one benchmark process with ``tree`` (default this one's, PROJECT_ROOT) first on
    the path; its JSON document, or RuntimeError with its last words."""
    path = os.path.join(workdir, f"{m.key}{'-before' if tree else ''}.json")
    argv = m.argv(seconds, repeat, path)
    budget = 600 + 60 * repeat * (seconds + 5)
    env = dict(os.environ, PYTHONPATH=os.path.abspath(tree or PROJECT_ROOT))
    try:
        done = subprocess.run(
            argv, capture_output=True, text=True, timeout=budget, check=False, env=env
        )
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"did not finish in {budget:.0f} s") from None
    try:
        with open(path, encoding="utf-8") as f:
            doc: Doc = json.load(f)
    except (OSError, ValueError):
        tail = (done.stderr or done.stdout).strip().splitlines()
        raise RuntimeError(f"exit {done.returncode}: {tail[-1] if tail else 'no output'}") from None
    if done.returncode != 0 or doc.get("verdict") not in (None, "ok"):
        raise RuntimeError(f"exit {done.returncode}: {doc.get('error') or doc.get('verdict')}")
    return doc


def _run_before(m: Measurement, seconds: float, repeat: int, workdir: str, tree: str) -> Doc:
    """:func:`_run_measurement` in the ``--before`` tree; when it refuses its arguments
    (exit 2) and some are newer than it may be (``kbtp bench --floor``), again without them
    (its goals then have no floor figure of their own, only this tree's)."""
    try:
        return _run_measurement(m, seconds, repeat, workdir, tree)
    except RuntimeError as exc:
        if not m.newer or not str(exc).startswith("exit 2"):
            raise
    return _run_measurement(m.without_newer(), seconds, repeat, workdir, tree)


def _mooncake_problem() -> str | None:
    """Why Mooncake's TCP transport cannot run here (``kbtp bench --vs mooncake``), or None."""
    from kbtp.cli.bench_mooncake import mooncake_problem

    return mooncake_problem()


def _tshark_problem() -> str | None:
    """Why ``iwarp bench dissect`` cannot time tshark here, or None."""
    from stack.bench.dissect import tshark_problem

    return tshark_problem()


def _floor(run: FloorRun, seconds: float, repeat: int = 1) -> dict[str, float]:
    """The floor keys ``run`` gives: floor over raw, the median of ``repeat`` alternated
    runs (``rtt``: its round trip over raw's), and the markers' least cost."""
    from stack.bench.floor import measure
    from stack.bench.floor_exchange import measure_exchange

    emss = 65483  # loopback's, as every benchmark here runs
    if run.key == "stream":
        rows = measure([65536, 1 << 20], seconds, repeat, emss, progress=None)
        by = {(r["size"], r["variant"]): r for r in rows}
        out = {"64K": by[65536, "floor"]["ratio"], "1M": by[1 << 20, "floor"]["ratio"]}
        out["markers"] = 1.0 - by[1 << 20, "markers"]["MBps"] / by[1 << 20, "floor"]["MBps"]
        return out
    if run.key == "small":
        rows = measure([64], seconds, repeat, emss, batch=SMALL_BATCH, progress=None)
        return {"small": next(r["ratio"] for r in rows if r["variant"] == "floor")}
    if run.key == "read":
        rows = measure_exchange("read", [65536, 1 << 20], seconds, repeat, emss, progress=None)
        by = {(r["size"], r["variant"]): r for r in rows}
        return {"read-64K": by[65536, "floor"]["ratio"], "read-1M": by[1 << 20, "floor"]["ratio"]}
    rows = measure_exchange("rtt", [64], seconds, repeat, emss, progress=None)
    return {"rtt": next(r["ratio"] for r in rows if r["variant"] == "floor")}


def run_goals(
    keys: Sequence[str],
    seconds: float,
    repeat: int,
    with_floor: bool = True,
    progress: TextIO | None = sys.stderr,
    before: str | None = None,
    round_trip_cpus: tuple[str, ...] = ROUND_TRIP_CPUS,
) -> GoalsRun:
    """Measure the goals ``keys`` (in :data:`GOALS` order): each benchmark they need once,
    ``seconds`` per run and ``repeat`` runs (the median printed by each benchmark);
    ``before``: also in that source tree of the project, each benchmark there first and
    here right after (before and after a change, in one run); ``round_trip_cpus``: the
    ``--cpus`` of the round trips and their floor (empty: where the kernel puts them)."""
    goals = [g for g in GOALS if g.key in keys]
    measurements, floor_runs = placed(round_trip_cpus)
    needed = [k for k in measurements if any(k in g.needs for g in goals)]
    run = GoalsRun(
        loop_seconds=interpreter_loop_seconds(),
        before_tree=before,
        round_trip_cpus=round_trip_cpus,
    )
    say = (lambda text: print(f"goals: {text}", file=progress, flush=True)) if progress else None
    if say:
        say(f"this interpreter: {run.loop_seconds:.2f} s for {LOOP_ITERATIONS:,} x += i")
    docs: dict[str, Doc] = {}
    docs_before: dict[str, Doc] = {}
    floors = [
        f for f in floor_runs.values() if with_floor and any(g.floor in f.gives for g in goals)
    ]
    steps = len(needed) + len(floors)
    mooncake = _mooncake_problem() if "kbtp" in needed else None
    tshark = _tshark_problem() if "dissect" in needed else None
    if tshark:
        run.skipped["dissect"] = tshark  # its one goal needs tshark's figures
    with tempfile.TemporaryDirectory(prefix="iwarp-goals-") as workdir:
        for n, key in enumerate(needed, 1):
            m = measurements[key]
            if key == "kbtp" and mooncake:
                m = replace(m, args=m.args[: m.args.index("--vs")])  # without --vs mooncake
            if say:
                say(f"[{n}/{steps}] {m.command()}")
            if key in run.skipped:
                if say:
                    say(f"  not run: {run.skipped[key]}")
                continue
            if before:
                try:
                    docs_before[key] = _run_before(m, seconds, repeat, workdir, before)
                except RuntimeError as exc:
                    run.before_failures[key] = str(exc)
                    if say:
                        say(f"  failed in {before}: {exc}")
            start = time.monotonic()
            try:
                docs[key] = _run_measurement(m, seconds, repeat, workdir)
            except RuntimeError as exc:
                run.failures[key] = str(exc)
                if say:
                    say(f"  failed: {exc}")
            run.seconds[key] = time.monotonic() - start
    for found in (docs, docs_before):
        if "kbtp" in found and mooncake:
            found["kbtp"]["mooncake_problem"] = f"Mooncake {mooncake}"
    for n, f in enumerate(floors, len(needed) + 1):
        if say:
            say(f"[{n}/{steps}] {f.command(repeat)}")
        try:
            run.floor.update(_floor(f, seconds, repeat))
        except (OSError, RuntimeError, ValueError, LookupError) as exc:
            run.failures[f"floor {f.key}"] = str(exc) or type(exc).__name__
            if say:
                say(f"  failed: {exc}")
    run.results = [judge(g, docs, {**run.skipped, **run.failures}, run.floor) for g in goals]
    for r in run.results:
        r.measured_by = tuple(measurements[k].command() for k in r.goal.needs)
    if before:
        for r in run.results:
            r.before = judge(r.goal, docs_before, {**run.skipped, **run.before_failures}, {})
    return run


def _keys(text: str) -> list[str]:
    keys = [k.strip() for k in text.split(",") if k.strip()]
    unknown = [k for k in keys if k not in GOAL_KEYS]
    if not keys:
        raise CliError(f"--only: no goal in {text!r}; goals: {', '.join(GOAL_KEYS)}")
    if unknown:
        named = ", ".join(repr(key) for key in unknown)
        plural = "s" if len(unknown) > 1 else ""
        raise CliError(f"--only: unknown goal{plural} {named}; goals: {', '.join(GOAL_KEYS)}")
    return keys


def run_goals_command(args: argparse.Namespace) -> int:
    """``iwarp bench goals``."""
    if args.list:
        for g in GOALS:
            print(f"{g.key:16} {g.title:{TITLE_WIDTH}} {g.target_text()}")
        return 0
    if args.plot:
        problem = check_plot_path(args.plot)
        if problem:
            raise CliError(problem)
        if not have_matplotlib():
            raise CliError(MISSING_MATPLOTLIB)
    if args.source is not None:
        return _from_saved(args)
    if args.source_before is not None:
        raise CliError("--from-before goes with --from: it is the saved run to show beside it")
    keys = _keys(args.only) if args.only else list(GOAL_KEYS)
    args.duration = 2.0 if args.duration is None else args.duration
    args.repeat = 1 if args.repeat is None else args.repeat
    check_outputs(("--json", args.json))  # before minutes of benchmarks
    if args.before and not os.path.isfile(os.path.join(args.before, "stack", "__init__.py")):
        raise CliError(f"--before: {args.before} is not a source tree of this project")
    progress = None if args.quiet else sys.stderr
    cpus = ROUND_TRIP_CPUS if args.round_trip_cpus is None else args.round_trip_cpus
    run = run_goals(
        keys, args.duration, args.repeat, not args.no_floor, progress, args.before, cpus
    )
    to_stdout = args.json == "-"
    format_table(run, sys.stderr if to_stdout else sys.stdout)
    doc = goals_document(run, args.duration, args.repeat)
    if args.json:
        write_json(args.json, doc)
    if args.plot:
        save_goals_plot(args.plot, doc)
    return 1 if run.failures else 0


_MEASURING = (
    ("--only", "only"),
    ("--before", "before"),
    ("--no-floor", "no_floor"),
    ("--round-trip-cpus", "round_trip_cpus"),
    ("-D/--duration", "duration"),
    ("-r/--repeat", "repeat"),
    ("--json", "json"),
)
"""The options that measure or save a run: none of them goes with ``--from``."""


def _from_saved(args: argparse.Namespace) -> int:
    """``--from FILE``: the table (and ``--plot``) of a saved run, nothing measured."""
    given = [option for option, name in _MEASURING if getattr(args, name) not in (None, False)]
    if given:
        raise CliError(f"--from draws a saved run: {', '.join(given)} does not go with it")
    doc = load_goals_document(args.source)
    if args.source_before is not None:
        older = load_goals_document(args.source_before, "--from-before")
        doc = with_saved_before(doc, older, args.source_before)
    format_table(run_from_document(doc), sys.stdout)
    if args.plot:
        save_goals_plot(args.plot, doc)
    return 0


def register_bench(subparsers: argparse._SubParsersAction) -> None:
    """Add ``goals``."""
    parser = subparsers.add_parser(
        "goals",
        help="the data path's speed goals, measured in one run, with a verdict each",
        description=__doc__.split("\n\n")[0] + "  " + __doc__.split("\n\n")[1],
    )
    one_line_errors(parser)
    parser.add_argument(
        "-D",
        "--duration",
        type=duration,
        default=None,
        metavar="SECONDS",
        help=f"seconds per timed benchmark run (default 2, at most {MAX_DURATION:g})",
    )
    add_repeat_argument(parser, "each benchmark run; each prints its run with the median ratio")
    parser.set_defaults(repeat=None)  # 1; None tells --from that it was not given
    parser.add_argument("--only", metavar="LIST", help="these goals only, comma separated (--list)")
    parser.add_argument("--list", action="store_true", help="list the goals and exit")
    parser.add_argument(
        "--before",
        metavar="TREE",
        help="also measure this source tree of the project, each benchmark there first",
    )
    parser.add_argument("--no-floor", action="store_true", help="skip measuring the floor")
    parser.add_argument(
        "--round-trip-cpus",
        type=_round_trip_cpus,
        metavar="CLIENT[,SERVER]|kernel",
        help="where the round trips, their baselines and their floor run (default: the first "
        "two CPUs this process may use, one end on each, as two hosts would be; one CPU: "
        "both there, no cross-CPU wake-up; kernel: not pinned)",
    )
    parser.add_argument("--quiet", action="store_true", help="no progress on stderr")
    parser.add_argument("--json", metavar="FILE", help="also write the goals as JSON ('-': stdout)")
    parser.add_argument(
        "--plot",
        metavar="FILE.png",
        help="also draw the goals: each as the share of its target reached, with its floor "
        "(needs the 'plot' extra: matplotlib)",
    )
    parser.add_argument(
        "--from",
        dest="source",
        metavar="SAVED.json",
        help="measure nothing: print (and --plot) the run --json saved in SAVED.json",
    )
    parser.add_argument(
        "--from-before",
        dest="source_before",
        metavar="SAVED.json",
        help="with --from: another saved run, shown beside it as --before shows a tree",
    )
    parser.set_defaults(func=run_goals_command)


def _round_trip_cpus(text: str) -> tuple[str, ...]:
    """argparse type of ``--round-trip-cpus``: the ``--cpus`` arguments it stands for."""
    if text == "kernel":
        return ()
    return ("--cpus", ",".join(map(str, cpu_list(text))))
