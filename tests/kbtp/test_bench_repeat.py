"""``kbtp bench -r N``: each size measured N times, each operation's median run printed.

:func:`median_result` is checked on made-up rows; a tiny in-process run checks the table's
extra columns against the JSON ``repeats``.  No timing is asserted.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from kbtp.cli import main
from kbtp.cli.bench_report import Result, median_result


def row(seconds: float, raw_seconds: float | None = None) -> Result:
    return Result("store", 4096, 100, seconds, "inline", raw_seconds=raw_seconds)


def test_the_run_with_the_median_ratio_is_printed_with_every_run_kept() -> None:
    # ops/s 100, 50, 25; ratios 0.5, 0.25, 1.0 (the fastest run had the fastest baseline)
    runs = [row(1.0, 0.5), row(2.0, 0.5), row(4.0, 4.0)]
    chosen = median_result(runs)
    assert chosen is runs[0]
    assert chosen.run_ops == [100.0, 50.0, 25.0]
    assert chosen.run_ratios == [0.5, 0.25, 1.0]


def test_without_a_baseline_the_median_ops_and_an_even_count_takes_the_lower() -> None:
    runs = [row(1.0), row(4.0), row(2.0), row(8.0)]  # 100, 25, 50, 12.5 ops/s
    chosen = median_result(runs)
    assert chosen is runs[1] and chosen.run_ratios == []
    with pytest.raises(ValueError):
        median_result([])


def test_a_tiny_repeated_run_prints_the_median_and_the_range(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    out_json = tmp_path / "bench.json"
    argv = ["bench", "-s", "4K", "--ops", "store,load", "-n", "32", "-t", "4", "-r", "3"]
    assert main([*argv, "--in-process", "--quiet", "--json", str(out_json)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].endswith(" runs     min-max")
    rows = [line.split() for line in lines[2:]]
    assert [r[0] for r in rows] == ["STORE", "LOAD"]
    doc = json.loads(out_json.read_text())
    assert doc["parameters"]["repeat"] == 3
    for cells, result in zip(rows, doc["results"], strict=True):
        repeats = result["repeats"]
        assert repeats["runs"] == 3 and len(repeats["ops_per_s"]) == len(repeats["ratios"]) == 3
        assert result["ratio"] == statistics.median(repeats["ratios"])
        low, high = (float(v) for v in cells[-1].split("-"))
        assert cells[-2] == "3"
        assert (low, high) == (round(min(repeats["ratios"]), 2), round(max(repeats["ratios"]), 2))


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["bench", "-r", "0"], "must be >= 1"),
        (["bench", "-r", "101"], "at most 100"),
        (["bench", "--offload", "-r", "2"], "not --offload"),
    ],
)
def test_bad_repeat_arguments_are_one_error(
    capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    try:
        code = main(argv)
    except SystemExit as exc:
        code = int(exc.code or 0)
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and message in err, err
