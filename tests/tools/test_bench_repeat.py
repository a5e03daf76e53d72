"""``iwarp bench ... --repeat N``: each size measured N times, the median run reported.

:func:`median_run` is checked on made-up rows (which run it picks, what it keeps); tiny
in-process runs check the table's extra columns, the header line and the JSON ``repeats``
against each other.  No timing is asserted.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from stack.bench import BenchError, BwResult, LatResult, Repeats, median_run
from stack.cli.iwarp import main

DASHES = "-" * 87


def bw(average: float, raw: float | None = None, iterations: int = 10) -> BwResult:
    return BwResult(4096, iterations, average * 1.1, average, average / 4096, 10, raw_bw=raw)


def lat(typical: float, raw: float | None = None) -> LatResult:
    return LatResult(64, 100, typical / 2, typical * 3, typical, typical, 1.0, 0, 0, raw)


def test_the_run_with_the_median_ratio_is_reported_whole() -> None:
    # Run 2 is the fastest but against a fast baseline: the median ratio is run 3's.
    runs = [bw(100, 400, 1), bw(300, 500, 2), bw(200, 500, 3)]  # ratios 0.25, 0.6, 0.4
    row = median_run(runs)
    assert isinstance(row, BwResult)
    assert (row.iterations, row.bw_average, row.raw_bw) == (3, 200, 500)
    assert row.repeats == Repeats((100, 300, 200), (0.25, 0.6, 0.4))
    assert row.repeats.ratio_range == (0.25, 0.6)
    assert row.repeats.value_range == (100, 300)


def test_an_even_count_takes_the_lower_middle_and_no_baseline_ranks_by_the_figure() -> None:
    row = median_run([bw(40), bw(10), bw(30), bw(20)])
    assert isinstance(row, BwResult)
    assert row.bw_average == 20 and row.repeats is not None
    assert row.repeats.ratios == () and row.repeats.ratio_range is None
    # Latency without a baseline: ranked by the median latency of each run.
    row = median_run([lat(90.0), lat(70.0), lat(80.0)])
    assert isinstance(row, LatResult) and row.t_typical == 80.0
    # With one: by the ratio (latency over raw, lower is better; the median is the same).
    row = median_run([lat(90.0, 30.0), lat(70.0, 10.0), lat(80.0, 40.0)])  # 3.0, 7.0, 2.0
    assert isinstance(row, LatResult)
    assert row.t_typical == 90.0 and row.ratio == pytest.approx(3.0)


def test_no_runs_is_an_error() -> None:
    with pytest.raises(BenchError):
        median_run([])


def _row_cells(out: str, header_start: str) -> tuple[str, list[str]]:
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(header_start))
    assert lines[start + 2] == DASHES  # one row per size
    return lines[start], lines[start + 1].split()


def test_write_with_baseline_reports_the_median_ratio_run(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    doc_path = tmp_path / "bench.json"
    code = main(
        ["bench", "write", "-s", "4K", "-n", "60", "-r", "3", "--baseline", "--in-process"]
        + ["--quiet", "--json", str(doc_path)]
    )
    out = capsys.readouterr().out
    assert code == 0
    assert " Repeats         : 3 runs per size, iWARP then its baselines each time" in out
    header, cells = _row_cells(out, " #bytes")
    assert header.endswith("   runs   ratio min-max")
    ratio, runs, span = float(cells[6]), cells[-2], cells[-1]
    low, high = (float(v) for v in span.split("-"))
    assert runs == "3" and low <= ratio <= high
    doc = json.loads(doc_path.read_text())
    assert doc["parameters"]["repeat"] == 3
    [row] = doc["results"]
    repeats = row["repeats"]
    assert repeats["runs"] == 3 and repeats["figure"] == "bw_average_mib_per_s"
    assert len(repeats["values"]) == len(repeats["ratios"]) == 3
    assert row["ratio"] == statistics.median(repeats["ratios"])
    assert row["bw_average_mib_per_s"] in repeats["values"]
    assert (repeats["ratio_min"], repeats["ratio_max"]) == (
        min(repeats["ratios"]),
        max(repeats["ratios"]),
    )
    assert round(repeats["ratio_min"], 2) == low and round(repeats["ratio_max"], 2) == high


def test_latency_without_baseline_shows_the_range_of_the_medians(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code = main(["bench", "read", "--lat", "-s", "64", "-n", "40", "-r", "2", "--in-process"])
    captured = capsys.readouterr()
    assert code == 0
    assert "the row is the run with the median t_typical" in captured.out
    assert captured.err.count("run 2 of 2") == 1  # progress names each run on stderr
    header, cells = _row_cells(captured.out, " #bytes")
    assert header.endswith("   runs   t_typical min-max[usec]")
    typical, runs, span = float(cells[4]), cells[-2], cells[-1]
    low, high = (float(v) for v in span.split("-"))
    assert runs == "2"
    assert typical == pytest.approx(low, abs=0.006)  # an even count: the lower middle


def test_one_run_keeps_the_plain_table(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["bench", "write", "-s", "1K", "-n", "20", "--in-process", "--quiet"])
    out = capsys.readouterr().out
    assert code == 0
    assert "Repeats" not in out and "runs" not in out


@pytest.mark.parametrize(
    ("value", "message"),
    [("0", "must be >= 1"), ("101", "at most 100"), ("x", "invalid integer")],
)
def test_bad_repeat_counts_are_one_usage_error(
    capsys: pytest.CaptureFixture[str], value: str, message: str
) -> None:
    code: str | int | None
    try:
        code = main(["bench", "write", "-r", value])
    except SystemExit as exc:
        code = exc.code
    err = capsys.readouterr().err
    assert code == 2
    assert err.count("\n") == 1 and message in err, err
