"""``iwarp bench dissect``: ``iwarp dissect`` against tshark on a generated capture.

The runs are of the installed command from ``/`` on small captures; speed is reported,
never asserted.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from stack.bench import dissect
from stack.bench.dissect import Timing, _race

REPO = Path(__file__).resolve().parents[2]


def _bench(
    *argv: str, cwd: Path | str = "/", env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``iwarp bench dissect ARGV`` as the installed command runs it (``-P``: a tree in the
    working directory is not imported)."""
    return subprocess.run(
        [sys.executable, "-P", "-m", "stack", "bench", "dissect", *argv],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=cwd,
        env=env,
    )


def test_median_and_best_of_the_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    runs = iter([Timing(3.0, 2.0, 10), Timing(1.0, 5.0, 30), Timing(2.0, 1.0, 20)])
    monkeypatch.setattr(dissect, "_once", lambda cmd, env=None: next(runs))
    assert _race([(["x"], None)], 3, median=True) == [Timing(2.0, 2.0, 30)]
    runs = iter([Timing(3.0, 2.0, 10), Timing(1.0, 5.0, 30), Timing(2.0, 1.0, 20)])
    assert _race([(["x"], None)], 3) == [Timing(1.0, 1.0, 30)]


def test_a_small_median_run_writes_its_document(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    done = _bench(
        "--fpdus", "2000", "--modes", "summary,stats", "-r", "3", "--median", "--rss-fpdus", "200",
        "--json", str(out),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    doc: dict[str, Any] = json.loads(out.read_text())
    assert doc["schema"] == "iwarp-bench-dissect/1" and doc["command"] == "iwarp bench dissect"
    assert doc["verdict"] == "ok" and doc["exit_status"] == 0
    assert doc["statistic"] == "median" and doc["repeat"] == 3
    assert doc["capture"]["fpdus"] >= 2000 and doc["capture"]["markers"] is False
    assert [r["mode"] for r in doc["rows"]] == ["summary", "stats"]
    summary = doc["rows"][0]
    assert summary["ours_wall_s"] > 0 and summary["ours_peak_rss_kib"] > 0
    if doc["tshark_problem"] is None:
        assert summary["tshark_wall_s"] > 0 and summary["speedup_wall"] > 0
        assert doc["tshark"].startswith("TShark")
    else:
        assert summary["tshark_wall_s"] is None and summary["speedup_wall"] is None
    assert doc["memory"]["small_fpdus"] >= 200 and doc["memory"]["small_peak_rss_kib"] > 0
    assert "summary" in done.stdout and "memory (summary, peak RSS)" in done.stdout
    assert "bench: summary: iwarp dissect, run 3 of 3" in done.stderr


def test_without_tshark_iwarp_is_measured_alone_and_the_document_says_why(
    tmp_path: Path,
) -> None:
    """No tshark on the PATH: one line says so, the iwarp rows are measured, tshark's
    figures are null and ``tshark_problem`` gives the reason."""
    env = {**os.environ, "PATH": str(tmp_path)}  # an empty folder: no tshark
    done = _bench("--fpdus", "2000", "--modes", "summary", "--quiet", "--json", "-", env=env)
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert doc["verdict"] == "ok" and doc["tshark"] is None
    assert "tshark not found" in doc["tshark_problem"]
    (row,) = doc["rows"]
    assert row["ours_wall_s"] > 0 and row["tshark_wall_s"] is None and row["speedup_cpu"] is None
    said = f"iwarp bench dissect: {doc['tshark_problem']}: timing iwarp dissect alone"
    assert done.stderr.splitlines().count(said) == 1, done.stderr
    assert "tshark not run" in done.stderr  # the table, on stderr with --json -


def test_baseline_runs_that_tree_not_the_working_directory_s(tmp_path: Path) -> None:
    """``--baseline DIR``: each ``iwarp dissect`` of DIR runs with ``python -P`` and DIR
    on PYTHONPATH, so a checkout in the working directory shadows neither tree."""
    cwd = tmp_path / "cwd"
    for tree, body in (
        (cwd, "raise SystemExit('the working directory was imported')\n"),
        (
            tmp_path / "base",
            "import os, sys\nwith open(os.environ['BASELINE_RAN'], 'a') as f:\n"
            "    f.write(' '.join(sys.argv[1:]) + '\\n')\n",
        ),
    ):
        (tree / "stack" / "cli").mkdir(parents=True)
        (tree / "stack" / "__init__.py").write_text("")
        (tree / "stack" / "cli" / "__init__.py").write_text("")
        (tree / "stack" / "cli" / "iwarp.py").write_text(body)
    ran = tmp_path / "ran.txt"
    env = {**os.environ, "BASELINE_RAN": str(ran)}
    done = _bench(
        "--fpdus", "2000", "--modes", "summary", "--no-tshark", "--rss-fpdus", "0",
        "--baseline", str(tmp_path / "base"), "--quiet", "--json", "-",
        cwd=cwd, env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert [r["mode"] for r in doc["rows"]] == ["summary", "summary@baseline"]
    assert doc["baseline_tree"] == str(tmp_path / "base")
    assert doc["tshark_problem"] == "not run (--no-tshark)"
    lines = ran.read_text().splitlines()
    assert lines[0] == "dissect --help" and lines[1].startswith("dissect ")


def test_a_failing_run_is_one_error_line_and_a_failed_document(tmp_path: Path) -> None:
    broken = tmp_path / "broken"
    (broken / "stack" / "cli").mkdir(parents=True)
    (broken / "stack" / "__init__.py").write_text("")
    (broken / "stack" / "cli" / "__init__.py").write_text("")
    (broken / "stack" / "cli" / "iwarp.py").write_text("raise SystemExit('broken tree')\n")
    out = tmp_path / "d.json"
    done = _bench("--fpdus", "2000", "--baseline", str(broken), "--quiet", "--json", str(out))
    assert done.returncode == 1
    errors = [ln for ln in done.stderr.splitlines() if "error" in ln]
    assert len(errors) == 1 and "broken tree" in errors[0] and "Traceback" not in done.stderr
    doc = json.loads(out.read_text())
    assert doc["verdict"] == "failed" and doc["exit_status"] == 1 and "broken tree" in doc["error"]


@pytest.mark.parametrize(
    "argv, says",
    [
        (["--fpdus", "0"], "--fpdus"),
        (["--fpdus", "10000001"], "at most 10000000"),
        (["--modes", "summary,nope"], "modes are"),
        (["--baseline", "/"], "not a source tree"),
        (["--keep", "/nonexistent-dir/c.pcap"], "--keep"),
    ],
)
def test_bad_arguments_are_one_error_line(argv: list[str], says: str) -> None:
    done = _bench(*argv)
    assert done.returncode == 2 and not done.stdout
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and says in lines[0] and lines[0].startswith("iwarp bench dissect: ")


def test_a_kept_capture_is_reused(tmp_path: Path) -> None:
    keep = tmp_path / "c.pcap"
    args = ("--fpdus", "2000", "--modes", "summary", "--no-tshark", "--rss-fpdus", "0")
    first = _bench(*args, "--keep", str(keep))
    assert first.returncode == 0 and "generated in" in first.stdout, first.stderr
    again = _bench(*args, "--keep", str(keep), "--quiet")
    assert again.returncode == 0 and "(reused)" in again.stdout and not again.stderr
