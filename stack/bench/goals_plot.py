"""``iwarp bench goals --plot FILE.png`` and ``--from FILE``: the goals drawn, a saved run read.

Every goal is a ratio with its own scale and direction (a Write at >= 0.90 of raw TCP, a
round trip at <= 1.50 of it, the markers' cost at <= 15 %), so the figure draws each as
the share of its target reached: ``measured / target`` for an at-least goal, ``target /
measured`` for an at-most one, 1 meaning met (the dashed line), on a logarithmic axis so
that 0.04 and 2.2 both read.  Each row is a bar for the measured figure (green met, red
not), a diamond for the pure-Python floor of the same exchange (a diamond left of the line:
no pure-Python stack meets the goal on this host) and, after ``--before TREE``, a hollow
circle for that tree (or, with ``--from-before``, another saved run).  The figure is made
from the run's JSON document (:func:`~stack.bench.goals_report.goals_document`), so a run
saved with ``--json`` is drawn again with ``--from`` without measuring anything
(:func:`load_goals_document` reads it back, checked).
"""

from __future__ import annotations

import json
import math
from typing import Any

from stack.bench.goal_catalog import GOAL_KEYS, TITLE_WIDTH, Doc
from stack.bench.goals_report import saved_goal
from stack.bench.plot import save_figure
from stack.cli import CliError
from stack.cli.json_report import schema

__all__ = ["build_goals_figure", "load_goals_document", "reached", "save_goals_plot"]

MET_COLOUR = "tab:green"
MISSED_COLOUR = "tab:red"
FLOOR_LABEL = "pure-Python floor of the same exchange"
SHARE_MIN = 0.005
"""Smallest share drawn (a measured 0, or a share below it, is drawn here)."""
SHARE_MAX = 100.0
"""Largest share drawn (an at-most goal measured at 0 reached it infinitely)."""


def reached(target: float, value: float | None, at_most: bool) -> float | None:
    """The share of ``target`` that ``value`` reaches (1: exactly met, above 1: met with
    room), clamped to [:data:`SHARE_MIN`, :data:`SHARE_MAX`]; None without a value."""
    if value is None or not math.isfinite(value):
        return None
    if at_most:
        share = SHARE_MAX if value <= 0 else target / value
    else:
        share = value / target if target > 0 else SHARE_MAX
    return min(max(share, SHARE_MIN), SHARE_MAX)


def load_goals_document(path: str, option: str = "--from") -> Doc:
    """The ``iwarp bench goals --json`` document saved in ``path`` (given with ``option``);
    a one-line :class:`CliError` if it cannot be read or is not such a document."""
    try:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
    except OSError as exc:
        raise CliError(f"{option} {path}: cannot read ({exc.strerror or exc})") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CliError(f"{option} {path}: not JSON ({exc})") from None
    want = schema("iwarp bench goals")
    if not isinstance(doc, dict) or doc.get("schema") != want:
        got = doc.get("schema") if isinstance(doc, dict) else type(doc).__name__
        raise CliError(f"{option} {path}: not an iwarp bench goals document (schema {got!r})")
    goals = doc.get("goals")
    if not isinstance(goals, list) or not all(_goal_entry_ok(g) for g in goals):
        raise CliError(f"{option} {path}: its goals are not what iwarp bench goals writes")
    return doc


def _goal_entry_ok(entry: object) -> bool:
    """Whether ``entry`` is a goal object as :meth:`GoalResult.document` writes it."""
    if not isinstance(entry, dict) or entry.get("key") not in GOAL_KEYS:
        return False
    numbers = (entry.get("measured"), entry.get("floor"))
    if not all(v is None or _number(v) for v in numbers) or not _number(entry.get("target")):
        return False
    before = entry.get("before")
    if before is not None and not (isinstance(before, dict) and _maybe_number(before)):
        return False
    return isinstance(entry.get("shown", ""), str) and entry.get("compare") in ("<=", ">=")


def _number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _maybe_number(before: dict[str, Any]) -> bool:
    value = before.get("measured")
    return value is None or _number(value)


def build_goals_figure(doc: Doc) -> Any:
    """A matplotlib Figure of the goals of ``doc`` (an ``iwarp bench goals`` document)."""
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    goals: list[Doc] = doc["goals"]
    rows = list(reversed(goals))  # the first goal at the top
    fig = Figure(figsize=(11, 0.42 * len(rows) + 1.9), layout="constrained")
    ax = fig.subplots()
    ys = list(range(len(rows)))
    for y, g in zip(ys, rows, strict=True):
        at_most = g["compare"] == "<="
        share = reached(g["target"], g["measured"], at_most)
        floor = reached(g["target"], g.get("floor"), at_most)
        if share is not None:
            colour = MET_COLOUR if g.get("met") else MISSED_COLOUR
            ax.barh(y, share - SHARE_MIN, left=SHARE_MIN, color=colour, height=0.6)
            ax.annotate(  # right of the bar and of the floor's diamond
                g.get("shown") or f"{g['measured']:.2f}",
                (max(share, floor or 0.0), y),
                xytext=(7, 0),
                textcoords="offset points",
                va="center",
                fontsize=8,
            )
        if floor is not None:
            ax.plot([floor], [y], marker="D", color="black", markersize=6, linestyle="none")
        before = g.get("before") or {}
        was = reached(g["target"], before.get("measured"), at_most)
        if was is not None:
            ax.plot([was], [y], marker="o", markerfacecolor="none", color="tab:blue")
    ax.axvline(1.0, color="black", linestyle="--", linewidth=1)
    ax.set_xscale("log")
    ax.set_xlim(SHARE_MIN, max(4.0, *(_shares(goals))) * 3)
    ax.set_yticks(ys, [_label(g) for g in rows], fontsize=8)
    ax.set_xlabel("share of the target reached (measured / target; target / measured for <=)")
    handles = [
        Patch(color=MET_COLOUR, label="met"),
        Patch(color=MISSED_COLOUR, label="not met"),
        Line2D([], [], marker="D", color="black", linestyle="none", label=FLOOR_LABEL),
        Line2D([], [], color="black", linestyle="--", label="target"),
    ]
    if any(g.get("before") for g in goals):
        handles.append(
            Line2D(
                [],
                [],
                marker="o",
                markerfacecolor="none",
                color="tab:blue",
                linestyle="none",
                label=f"before: {doc['parameters'].get('before_tree')}",
            )
        )
    fig.legend(handles=handles, loc="outside lower center", ncols=len(handles), fontsize=8)
    met = sum(1 for g in goals if g.get("met"))
    loop = (doc.get("host") or {}).get("python_loop_s")
    host = f"; interpreter loop {loop:.2f} s" if isinstance(loop, int | float) else ""
    fig.suptitle(f"iwarp bench goals: {met} of {len(goals)} met{host}", fontsize=11)
    return fig


def _shares(goals: list[Doc]) -> list[float]:
    out: list[float] = []
    for g in goals:
        at_most = g["compare"] == "<="
        for value in (g.get("measured"), g.get("floor")):
            share = reached(g["target"], value, at_most)
            if share is not None:
                out.append(share)
    return out


def _label(g: Doc) -> str:
    """A row's label: its title and target (``not measured`` when it has no figure)."""
    title = str(g.get("title") or g["key"])[:TITLE_WIDTH]
    missing = "" if g.get("measured") is not None else " (not measured)"
    return f"{title}  {saved_goal(g).target_text()}{missing}"


def save_goals_plot(path: str, doc: Doc) -> None:
    """Draw the goals of ``doc`` into the PNG file ``path`` (:func:`~stack.bench.plot
    .save_figure`)."""
    save_figure(path, build_goals_figure(doc))
