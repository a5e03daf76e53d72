"""``kbtp bench --plot FILE.png``: the figure draws the run's own rows (KBTP and each
baseline it measured), the PNG is written, and a bad ``--plot`` is one error before any
benchmark runs.  No timing is asserted."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kbtp.cli import main
from kbtp.cli.bench_plot import SERIES, series_value

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _run(argv: list[str]) -> int:
    try:
        return int(main(argv))
    except SystemExit as exc:
        return int(exc.code or 0)


def test_a_sweep_is_drawn_from_the_rows_of_its_own_json(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    from kbtp.cli.bench_plot import OP_COLOURS, build_kbtp_figure

    out, png = tmp_path / "bench.json", tmp_path / "bench.png"
    argv = ["bench", "-s", "4K,16K", "--ops", "store,load", "-n", "32", "-t", "4"]
    assert _run([*argv, "--in-process", "--quiet", "--json", str(out), "--plot", str(png)]) == 0
    assert png.read_bytes().startswith(PNG_SIGNATURE)
    doc = json.loads(out.read_text())
    fig = build_kbtp_figure(doc)
    throughput, cpu = fig.axes[:2]
    # A line per operation and measured series (KBTP and the raw baseline here), each
    # through that series' figures of the JSON rows, in block-size order.
    for ax, field in ((throughput, "gbyte_per_s"), (cpu, "cpu_us_per_op")):
        lines = {ln.get_label(): ln for ln in ax.lines}
        assert set(lines) == {f"{op} {s[0]}" for op in ("STORE", "LOAD") for s in SERIES[:2]}
        for op in ("STORE", "LOAD"):
            rows = sorted(
                (r for r in doc["results"] if r["operation"] == op), key=lambda r: r["size_bytes"]
            )
            for label, key, style, _marker in SERIES[:2]:
                line = lines[f"{op} {label}"]
                assert list(line.get_xdata()) == [4096, 16384]
                assert list(line.get_ydata()) == [series_value(r, key, field) for r in rows]
                assert line.get_linestyle() == style and line.get_color() == OP_COLOURS[op]
    # The key names the operations and the series measured, not the floor or Mooncake.
    names = [t.get_text() for t in fig.legends[0].get_texts()]
    assert names == ["STORE", "LOAD", "KBTP", "raw TCP (pipelined baseline)"]


def test_one_size_is_drawn_as_bars_per_operation(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    from kbtp.cli.bench_plot import build_kbtp_figure

    out = tmp_path / "bench.json"
    argv = ["bench", "-s", "4K", "--ops", "load", "-n", "16", "-t", "2", "--no-baseline"]
    assert _run([*argv, "--in-process", "--quiet", "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    fig = build_kbtp_figure(doc)
    (bar,) = fig.axes[0].patches  # KBTP alone: no baseline was measured
    assert bar.get_height() == pytest.approx(doc["results"][0]["gbyte_per_s"])
    assert [t.get_text() for t in fig.axes[0].get_xticklabels()] == ["LOAD"]


def test_a_series_not_measured_has_no_value() -> None:
    row = {"gbyte_per_s": 0.5, "baseline": {"gbyte_per_s": 2.0, "cpu_us_per_op": None}}
    assert series_value(row, None, "gbyte_per_s") == 0.5
    assert series_value(row, "baseline", "gbyte_per_s") == 2.0
    assert series_value(row, "baseline", "cpu_us_per_op") is None
    assert series_value(row, "floor", "gbyte_per_s") is None


@pytest.mark.parametrize(
    "extra, says",
    [
        (["--plot", "bench.svg"], "must end in .png"),
        (["--plot", "/nonexistent-dir/b.png"], "--plot /nonexistent-dir/b.png"),
        (["--plot", "b.png", "--offload"], "not --offload"),
    ],
)
def test_a_bad_plot_is_one_error_before_running(
    extra: list[str], says: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    extra = [str(tmp_path / e) if e == "b.png" else e for e in extra]
    assert _run(["bench", "-s", "4K", "-n", "16", "--in-process", *extra]) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and says in lines[0], captured.err
    assert captured.out == ""  # nothing ran


def test_plot_without_matplotlib_is_one_error_before_running(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], no_matplotlib: None
) -> None:
    png = tmp_path / "b.png"
    assert _run(["bench", "-s", "4K", "-n", "16", "--in-process", "--plot", str(png)]) == 2
    captured = capsys.readouterr()
    assert "--plot needs matplotlib" in captured.err and captured.out == ""
    assert not png.exists()
