"""tools/bench_dissect: the median of the runs (``--median``) or the best."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tools import bench_dissect
from tools.bench_dissect import Timing, _race


def test_median_and_best_of_the_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    runs = iter([Timing(3.0, 2.0, 10), Timing(1.0, 5.0, 30), Timing(2.0, 1.0, 20)])
    monkeypatch.setattr(bench_dissect, "_once", lambda cmd, env=None: next(runs))
    assert _race([(["x"], None)], 3, median=True) == [Timing(2.0, 2.0, 30)]
    runs = iter([Timing(3.0, 2.0, 10), Timing(1.0, 5.0, 30), Timing(2.0, 1.0, 20)])
    assert _race([(["x"], None)], 3) == [Timing(1.0, 1.0, 30)]


def test_a_small_median_run_without_tshark(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    args = ["--fpdus", "300", "--modes", "summary", "--no-tshark", "--repeat", "3"]
    assert bench_dissect.main([*args, "--median", "--rss-fpdus", "0", "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["statistic"] == "median" and report["repeat"] == 3
    assert report["rows"][0]["mode"] == "summary" and report["rows"][0]["ours_wall_s"] > 0
