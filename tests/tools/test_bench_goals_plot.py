"""``iwarp bench goals --plot`` and ``--from``: the goals drawn as the share of each target
reached, and a run saved with ``--json`` printed and drawn again without measuring."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest

from stack.bench.goal_catalog import GOALS
from stack.bench.goals import (
    GoalsRun,
    format_table,
    goals_document,
    judge,
    run_from_document,
    with_saved_before,
)
from stack.bench.goals_plot import SHARE_MAX, SHARE_MIN, load_goals_document, reached
from stack.cli import CliError
from tests.installed import run_command

GOAL = {g.key: g for g in GOALS}
SAVED_RUN = Path(__file__).resolve().parents[2] / "docs" / "goals-run.json"
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _bw_doc(ratio: float, mib_s: float = 1000.0) -> dict[str, Any]:
    return {"results": [{"ratio": ratio, "bw_average_mib_per_s": mib_s}]}


def _run() -> GoalsRun:
    """A run judged from benchmark documents as ``run_goals`` judges them: a Write at 0.5 of
    raw (floor 0.6: beyond reach), a round trip at 1.2 (met), the markers' cost, a goal whose
    benchmark failed, and the round trip measured in a --before tree too."""
    docs = {
        "write-64k": _bw_doc(0.5),
        "read-lat": _bw_doc(1.2),
        "write-1m": _bw_doc(0.7, 3000.0),
        "write-1m-markers": _bw_doc(0.5, 2400.0),
    }
    failures = {"read-64k": "exit status 1: boom"}
    floor = {"64K": 0.6, "markers": 0.31}
    keys = ("write-64k", "read-64k", "read-lat", "markers-1m")
    run = GoalsRun(loop_seconds=0.61, round_trip_cpus=("--cpus", "0,1"), before_tree="/old")
    run.results = [judge(GOAL[k], docs, failures, floor) for k in keys]
    run.results[2].before = judge(GOAL["read-lat"], {"read-lat": _bw_doc(1.9)}, {}, {})
    run.failures = failures
    return run


def _saved(tmp_path: Path, doc: object) -> str:
    path = tmp_path / "goals.json"
    path.write_text(json.dumps(doc))
    return str(path)


def test_the_share_reached_is_measured_over_target_or_target_over_measured() -> None:
    assert reached(0.8, 0.4, at_most=False) == pytest.approx(0.5)
    assert reached(1.5, 3.0, at_most=True) == pytest.approx(0.5)  # twice the allowed time
    assert reached(1.5, 1.0, at_most=True) == pytest.approx(1.5)  # met with room
    assert reached(0.15, 0.0, at_most=True) == SHARE_MAX  # no cost at all
    assert reached(0.25, 0.0, at_most=False) == SHARE_MIN  # drawn, at the axis' end
    assert reached(0.8, None, at_most=False) is None


def test_a_saved_run_prints_the_same_table_as_the_run_itself(tmp_path: Path) -> None:
    run = _run()
    live = io.StringIO()
    format_table(run, live)
    doc = load_goals_document(_saved(tmp_path, goals_document(run, 2.0, 1)))
    again = io.StringIO()
    format_table(run_from_document(doc), again)
    assert again.getvalue() == live.getvalue()
    assert "1 of 4 goals met" in live.getvalue() and "exit status 1: boom" in live.getvalue()


def test_the_figure_draws_each_goal_as_the_share_of_its_target() -> None:
    pytest.importorskip("matplotlib")
    from matplotlib.colors import to_rgba

    from stack.bench.goals_plot import MET_COLOUR, MISSED_COLOUR, build_goals_figure

    run = _run()
    doc = goals_document(run, 2.0, 1)
    fig = build_goals_figure(doc)
    ax = fig.axes[0]
    labels = [t.get_text() for t in ax.get_yticklabels()]
    # The first goal at the top (the highest y), each with its target; no figure: said.
    assert labels[::-1][0].startswith("RDMA Write 64 KiB / raw trio") and labels[0].endswith(
        "<= 15%"
    )
    assert "(not measured)" in labels[::-1][1]
    bars = {round(p.get_y() + p.get_height() / 2): p for p in ax.patches}
    by_row = dict(zip(range(len(labels)), reversed(run.results), strict=True))
    assert set(bars) == {y for y, r in by_row.items() if r.measured is not None}
    for y, bar in bars.items():
        result = by_row[y]
        assert result.measured is not None
        share = reached(result.goal.target, result.measured, result.goal.at_most)
        assert bar.get_x() + bar.get_width() == pytest.approx(share)
        assert bar.get_facecolor() == to_rgba(MET_COLOUR if result.met else MISSED_COLOUR)
    # The floor's diamonds where the floor reaches, the --before tree's hollow circle.
    diamonds = {
        round(ln.get_ydata()[0]): ln.get_xdata()[0] for ln in ax.lines if ln.get_marker() == "D"
    }
    assert diamonds == {3: pytest.approx(0.6 / 0.8), 0: pytest.approx(0.15 / 0.31)}
    (circle,) = [ln for ln in ax.lines if ln.get_marker() == "o"]
    assert circle.get_xdata()[0] == pytest.approx(1.5 / 1.9) and circle.get_ydata()[0] == 1
    assert fig._suptitle.get_text().startswith("iwarp bench goals: 1 of 4 met")


def test_from_prints_and_draws_a_saved_run_with_the_installed_command(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    saved = _saved(tmp_path, goals_document(_run(), 2.0, 1))
    png = tmp_path / "goals.png"
    done = run_command("stack", "bench", "goals", "--from", saved, "--plot", str(png), timeout=120)
    assert done.returncode == 0, done.stderr
    assert "1 of 4 goals met" in done.stdout and "write-64k" in done.stdout
    assert png.read_bytes().startswith(PNG_SIGNATURE)
    assert done.stderr == ""  # nothing measured, no progress


@pytest.mark.parametrize(
    "content, says",
    [
        (None, "cannot read"),
        ("{not json", "not JSON"),
        ('{"schema": "iwarp-bench-write/1", "goals": []}', "not an iwarp bench goals document"),
        ('{"schema": "iwarp-bench-goals/1", "goals": [{"key": "nope"}]}', "its goals are not"),
        (
            '{"schema": "iwarp-bench-goals/1", "goals": [{"key": "write-64k", "target": 0.8, '
            '"compare": ">=", "measured": "fast"}]}',
            "its goals are not",
        ),
    ],
)
def test_a_file_that_is_not_a_saved_run_is_one_clear_error(
    tmp_path: Path, content: str | None, says: str
) -> None:
    path = tmp_path / "goals.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(CliError, match=says):
        load_goals_document(str(path))


@pytest.mark.parametrize(
    "argv, says",
    [
        (["--from", "/nonexistent-dir/g.json"], "--from /nonexistent-dir/g.json: cannot read"),
        (["--from", "/dev/null", "--json", "-"], "--json does not go with it"),
        (["--from", "/dev/null", "-r", "3"], "-r/--repeat does not go with it"),
        (["--from-before", "/dev/null"], "--from-before goes with --from"),
        (["--plot", "goals.svg"], "must end in .png"),
        (["--plot", "/nonexistent-dir/g.png"], "--plot"),
    ],
)
def test_bad_plot_and_from_arguments_are_one_error_line(argv: list[str], says: str) -> None:
    done = run_command("stack", "bench", "goals", *argv, timeout=60)
    assert done.returncode == 2, done.stdout
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and says in lines[0] and "Traceback" not in done.stderr


def test_the_run_drawn_in_the_docs_is_a_saved_run_of_every_goal() -> None:
    doc = load_goals_document(str(SAVED_RUN))  # docs/performance.md, "The goals drawn"
    assert [g["key"] for g in doc["goals"]] == [g.key for g in GOALS]
    run = run_from_document(doc)
    assert sum(1 for r in run.results if r.met) == doc["met"]


def test_two_saved_runs_side_by_side_as_before_shows_a_tree(tmp_path: Path) -> None:
    older = _run()
    older.results[0] = judge(GOAL["write-64k"], {"write-64k": _bw_doc(0.4)}, {}, {"64K": 0.6})
    newer = _run()
    newer.results.append(judge(GOAL["write-1m"], {"write-1m": _bw_doc(0.7)}, {}, {}))
    for run in (older, newer):
        run.before_tree = None
        for r in run.results:
            r.before = None
    old_doc, new_doc = goals_document(older, 2.0, 1), goals_document(newer, 2.0, 1)
    merged = with_saved_before(new_doc, old_doc, "old.json")
    assert merged["parameters"]["before_tree"] == "old.json"
    before = {g["key"]: g["before"] for g in merged["goals"]}
    assert before["write-64k"]["measured"] == pytest.approx(0.4)
    assert before["write-1m"] == {
        "measured": None,
        "shown": "-",
        "met": None,
        "note": "not in old.json",
    }
    run = run_from_document(load_goals_document(_saved(tmp_path, merged)))
    out = io.StringIO()
    format_table(run, out)
    rows = {line.split()[0]: line for line in out.getvalue().splitlines()}
    assert rows["goal"].split()[2] == "before"
    line = rows["write-64k"]
    assert line.index(" 0.40 ") < line.index(" 0.50 ") < line.index(" 0.60 ")  # before, now, floor
    assert "before: not in old.json" in out.getvalue()
    assert new_doc["goals"][0].get("before") is None  # the run itself is not changed


def test_from_before_names_its_own_option_when_its_file_is_bad(tmp_path: Path) -> None:
    saved = _saved(tmp_path, goals_document(_run(), 2.0, 1))
    done = run_command(
        "stack", "bench", "goals", "--from", saved, "--from-before", "/nonexistent", timeout=60
    )
    assert done.returncode == 2
    assert done.stderr.strip() == (
        "iwarp bench goals: error: --from-before /nonexistent: cannot read "
        "(No such file or directory)"
    )
