"""``iwarp bench ... --plot FILE.png``: the figure's data is the run's, the PNG is written,
and without matplotlib the option is one clear error before any benchmark runs."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
import trio

from stack.bench import BenchOptions, run_benchmark
from stack.bench.export import bw_row
from stack.bench.results import BwResult
from stack.cli.iwarp import main as iwarp_main

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _run(argv: list[str]) -> int:
    try:
        return int(iwarp_main(argv))
    except SystemExit as exc:
        return int(exc.code or 0)


def test_plot_without_matplotlib_is_one_line_and_status_2_before_running(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], no_matplotlib: None
) -> None:
    png = tmp_path / "bw.png"
    assert _run(["bench", "write", "-n", "4", "--in-process", "--plot", str(png)]) == 2
    captured = capsys.readouterr()
    assert captured.err == (
        "iwarp bench: error: --plot needs matplotlib: pip install 'iwarp-kbtp[plot]'\n"
    )
    assert captured.out == "" and not png.exists()  # nothing ran


def test_sweep_figure_draws_the_runs_results() -> None:
    pytest.importorskip("matplotlib")
    from stack.bench.plot import BASELINE_LABEL, IWARP_LABEL, build_figure

    opts = BenchOptions(
        "write", (256, 4096), iters=16, baseline=True, mode="in-process", progress=False
    )

    class Null(io.StringIO):
        def write(self, text: str) -> int:
            return len(text)

        def flush(self) -> None:
            pass

    results = trio.run(run_benchmark, opts, Null())
    assert all(isinstance(r, BwResult) for r in results)
    rows = [bw_row(r) for r in results if isinstance(r, BwResult)]
    fig = build_figure(results, opts)
    bandwidth, rate = fig.axes
    for ax, key in ((bandwidth, "gbit_per_s"), (rate, "msg_per_s")):
        lines = {line.get_label(): line for line in ax.get_lines()}
        assert set(lines) == {IWARP_LABEL, BASELINE_LABEL}
        assert list(lines[IWARP_LABEL].get_xdata()) == [256, 4096]
        assert list(lines[IWARP_LABEL].get_ydata()) == [row[key] for row in rows]
        assert list(lines[BASELINE_LABEL].get_ydata()) == [row["baseline"][key] for row in rows]
        assert ax.get_xscale() == "log"


def test_single_size_plot_is_a_bar_chart_png(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("matplotlib")
    png = tmp_path / "bw.png"
    out = tmp_path / "bw.json"
    argv = ["bench", "send", "-s", "1K", "-n", "16", "--in-process", "--baseline", "--quiet"]
    assert _run([*argv, "--plot", str(png), "--json", str(out)]) == 0
    capsys.readouterr()
    data = png.read_bytes()
    assert data.startswith(PNG_SIGNATURE) and len(data) > 1000


def test_single_size_figure_bars_are_iwarp_and_baseline() -> None:
    pytest.importorskip("matplotlib")
    from stack.bench.plot import build_figure

    opts = BenchOptions("write", (1024,), baseline=True)
    result = BwResult(1024, 100, 12.0, 10.0, 0.01024, 100, raw_bw=20.0)
    fig = build_figure([result], opts)
    row = bw_row(result)
    for ax, key in zip(fig.axes, ("gbit_per_s", "msg_per_s"), strict=True):
        heights = [bar.get_height() for bar in ax.patches]
        assert heights == [row[key], row["baseline"][key]]
        assert [t.get_text() for t in ax.get_xticklabels()] == ["iWARP", "raw TCP (baseline)"]


def test_plot_file_name_must_be_png(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("matplotlib")
    assert _run(["bench", "write", "-n", "4", "--in-process", "--plot", str(tmp_path / "x")]) == 2
    assert "must end in .png" in capsys.readouterr().err
