"""The verdicts of ``iwarp bench goals``: each goal judged from the benchmarks' documents,
the table, the JSON document, and a saved document read back.

:func:`judge` turns the JSON documents of the benchmarks a goal needs into a
:class:`GoalResult` (measured, met, the floor of its exchange); :class:`GoalsRun` is what a
run measured; :func:`format_table` and :func:`goals_document` are its table and its
``--json``; :func:`run_from_document` reads a saved document (``--from``) back into a run,
and :func:`with_saved_before` puts another saved run beside it (``--from-before``).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TextIO

from stack.bench.goal_catalog import GOALS, MEASUREMENTS, ROUND_TRIPS, TITLE_WIDTH, Doc, Goal
from stack.cli.json_report import schema

_BY_KEY = {g.key: g for g in GOALS}

__all__ = [
    "LOOP_ITERATIONS",
    "GoalResult",
    "GoalsRun",
    "format_table",
    "goals_document",
    "judge",
    "run_from_document",
    "saved_goal",
    "with_saved_before",
]

LOOP_ITERATIONS = 10_000_000
"""The interpreter-speed probe: ``x += i`` this many times at module level (0.46 s on the
fast host of docs/performance.md, 0.61-0.66 s on the slower one)."""


@dataclass
class GoalResult:
    """A goal's verdict: ``met`` None when it was not measured (``note`` says why)."""

    goal: Goal
    measured: float | None = None
    shown: str = "-"
    met: bool | None = None
    floor: float | None = None
    note: str = ""
    before: GoalResult | None = None  # the same goal measured in the --before tree
    measured_by: tuple[str, ...] = ()  # the commands behind it, as run (else the catalog's)

    def verdict(self) -> str:
        """``yes``, ``no``, ``no: beyond the floor`` or ``not measured``."""
        if self.met is None:
            return "not measured"
        if self.met:
            return "yes"
        return "no: target beyond this host's floor" if self.beyond_floor() else "no"

    def beyond_floor(self) -> bool:
        """Whether the pure-Python floor itself misses the target on this host."""
        if self.floor is None:
            return False
        return self.floor > self.goal.target if self.goal.at_most else self.floor < self.goal.target

    def document(self) -> Doc:
        """The JSON object of this goal."""
        g = self.goal
        return {
            "key": g.key,
            "title": g.title,
            "target": g.target,
            "compare": "<=" if g.at_most else ">=",
            "measured": self.measured,
            "shown": self.shown,
            "met": self.met,
            "floor": self.floor,
            "beyond_floor": self.beyond_floor(),
            "verdict": self.verdict(),
            "note": self.note or None,
            "measured_by": list(self.measured_by) or [MEASUREMENTS[k].command() for k in g.needs],
            "before": None
            if self.before is None
            else {
                "measured": self.before.measured,
                "shown": self.before.shown,
                "met": self.before.met,
                "note": self.before.note or None,
            },
        }


def judge(
    goal: Goal, docs: dict[str, Doc], failures: dict[str, str], floor: dict[str, float]
) -> GoalResult:
    """``goal``'s verdict from the benchmarks' JSON documents ``docs`` (by measurement key);
    ``failures`` says why a measurement has no document; ``floor`` holds the floor's ratios
    (``64K``, ``1M``) and the markers' least cost (``markers``)."""
    result = GoalResult(goal, floor=floor.get(goal.floor) if goal.floor else None)
    missing = [k for k in goal.needs if k not in docs]
    if missing:
        result.note = "; ".join(f"{k}: {failures.get(k, 'not run')}" for k in missing)
        return result
    if goal.floor_of is not None:
        try:
            result.floor = goal.floor_of(docs)[0]
        except (LookupError, TypeError, ValueError, ZeroDivisionError):
            pass  # the benchmark gave no floor (an older tree, a refused option)
    try:
        result.measured, result.shown = goal.value(docs)
    except (LookupError, TypeError, ValueError, ZeroDivisionError) as exc:
        result.note = f"no figure: {exc}"
        return result
    if goal.at_most:
        result.met = result.measured <= goal.target
    else:
        result.met = result.measured >= goal.target
    return result


@dataclass
class GoalsRun:
    """What one ``iwarp bench goals`` run measured."""

    results: list[GoalResult] = field(default_factory=list)
    floor: dict[str, float] = field(default_factory=dict)
    loop_seconds: float = 0.0
    failures: dict[str, str] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)  # not run here, and why
    before_tree: str | None = None
    before_failures: dict[str, str] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)
    round_trip_cpus: tuple[str, ...] = ()  # the round trips' --cpus (empty: the kernel's)


def format_table(run: GoalsRun, out: TextIO) -> None:
    """The goals as a table on ``out``."""
    head = f"{'goal':16} {'':{TITLE_WIDTH}} {'target':>8}  "
    if run.before_tree:
        head += f"{'before':24} "
    print(f"{head}{'measured':24} {'floor':>6}  met", file=out)
    for r in run.results:
        floor = (
            "-" if r.floor is None else (f"{r.floor:.0%}" if r.goal.percent else f"{r.floor:.2f}")
        )
        g = r.goal
        line = f"{g.key:16} {g.title:{TITLE_WIDTH}} {g.target_text():>8}  "
        if r.before is not None:
            line += f"{r.before.shown:24} "
        line += f"{r.shown:24} {floor:>6}"
        print(f"{line}  {r.verdict()}", file=out)
        if r.note:
            print(f"{'':18}{r.note}", file=out)
        if r.before is not None and r.before.note:
            print(f"{'':18}before: {r.before.note}", file=out)
    met = sum(1 for r in run.results if r.met)
    print(
        f"{met} of {len(run.results)} goals met; this interpreter runs {LOOP_ITERATIONS:,} "
        f"x += i in {run.loop_seconds:.2f} s; floor: the same exchange with only what any "
        "pure-Python iWARP must add, FPDU framing, CRC32c at both ends and the placement copy, "
        "over the same raw baseline (iwarp bench floor)",
        file=out,
    )
    if any(r.goal.key in ROUND_TRIPS for r in run.results):
        print(f"round trips, their baselines and their floor: {_placement(run)}", file=out)


def _placement(run: GoalsRun) -> str:
    """Where a run's round trips ran, in words."""
    if not run.round_trip_cpus:
        return "where the kernel put the client and the server (no --cpus)"
    option = " ".join(run.round_trip_cpus)
    cpus = run.round_trip_cpus[-1].split(",")
    if len(cpus) == 1 or cpus[0] == cpus[1]:
        return (
            f"the client and the server on one CPU ({option}): no cross-CPU wake-up, so "
            "what is left is the work of the two ends"
        )
    return f"the client and the server each on a CPU of its own ({option}), as two hosts would be"


def goals_document(run: GoalsRun, seconds: float, repeat: int) -> Doc:
    """The JSON document of a run."""
    return {
        "schema": schema("iwarp bench goals"),
        "command": "iwarp bench goals",
        "parameters": {
            "duration_s": seconds,
            "repeat": repeat,
            "before_tree": run.before_tree,
            "round_trip_cpus": run.round_trip_cpus[-1] if run.round_trip_cpus else None,
        },
        "host": {"python_loop_s": run.loop_seconds, "loop_iterations": LOOP_ITERATIONS},
        "floor": run.floor or None,
        "goals": [r.document() for r in run.results],
        "met": sum(1 for r in run.results if r.met),
        "failed_measurements": run.failures,
        "skipped_measurements": run.skipped,
        "failed_before": run.before_failures,
        "measurement_seconds": run.seconds,
        "verdict": "ok" if not run.failures else "failed",
    }


def saved_goal(entry: Doc) -> Goal:
    """The goal of a saved document's ``entry`` with the target and direction it was judged
    against then (the catalog's may have moved since)."""
    return replace(_BY_KEY[entry["key"]], target=entry["target"], at_most=entry["compare"] == "<=")


def run_from_document(doc: Doc) -> GoalsRun:
    """The run a saved ``--json`` document (:func:`load_goals_document`, checked) records,
    for :func:`format_table`: its figures and verdicts as they were measured."""
    params = doc.get("parameters") or {}
    cpus = params.get("round_trip_cpus")
    run = GoalsRun(
        loop_seconds=float((doc.get("host") or {}).get("python_loop_s") or 0.0),
        before_tree=params.get("before_tree"),
        round_trip_cpus=("--cpus", str(cpus)) if cpus else (),
        failures=dict(doc.get("failed_measurements") or {}),
    )
    for entry in doc["goals"]:
        result = _saved_result(saved_goal(entry), entry)
        before = entry.get("before")
        if isinstance(before, dict):
            result.before = _saved_result(result.goal, before)
        run.results.append(result)
    return run


def with_saved_before(doc: Doc, older: Doc, label: str) -> Doc:
    """``doc`` with each goal's figures in the saved run ``older`` as its ``before`` (as
    ``--before TREE`` records them; ``label`` names that run): two runs of any two trees,
    hosts or days side by side.  A goal ``older`` did not measure says so."""
    then = {g["key"]: g for g in older["goals"]}
    goals = []
    for entry in doc["goals"]:
        was = then.get(entry["key"])
        before = (
            {"measured": None, "shown": "-", "met": None, "note": f"not in {label}"}
            if was is None
            else {k: was.get(k) for k in ("measured", "shown", "met", "note")}
        )
        goals.append({**entry, "before": before})
    return {
        **doc,
        "parameters": {**doc.get("parameters", {}), "before_tree": label},
        "goals": goals,
    }


def _saved_result(goal: Goal, entry: Doc) -> GoalResult:
    return GoalResult(
        goal,
        measured=entry.get("measured"),
        shown=str(entry.get("shown") or "-"),
        met=entry.get("met"),
        floor=entry.get("floor"),
        note=str(entry.get("note") or ""),
    )
