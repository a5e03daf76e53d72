"""``iwarp bench ... --plot FILE.png``: iWARP against the same run's baseline, drawn.

Bandwidth (Gbit/s) and message rate (messages/s) against the message size for a size
sweep (``-a``), a bar chart of iWARP and the baseline for a single size; latency runs
(``--lat``) plot the median latency.  The figures are the ``--json`` rows
(:mod:`stack.bench.export`).  matplotlib is the optional ``plot`` extra, used with its Agg
backend (no display): :func:`have_matplotlib` is checked before a run.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from typing import Any

from stack.bench.export import bw_row, lat_row
from stack.bench.options import BenchOptions
from stack.bench.report import TEST_NAMES
from stack.bench.results import BwResult, LatResult
from stack.cli.json_report import check_output, output_error

MISSING_MATPLOTLIB = "--plot needs matplotlib: pip install 'iwarp-kbtp[plot]'"
IWARP_LABEL = "iWARP"
BASELINE_LABEL = "raw TCP (baseline)"

# (row key, axis label) of each panel
BW_PANELS = (("gbit_per_s", "bandwidth [Gbit/s]"), ("msg_per_s", "message rate [msg/s]"))
LAT_PANELS = (("us_p50", "median latency [usec]"),)


def have_matplotlib() -> bool:
    """Whether the ``plot`` extra is installed."""
    return importlib.util.find_spec("matplotlib") is not None


def check_plot_path(path: str | None) -> str | None:
    """Why ``path`` cannot take the PNG, or None (checked before a run)."""
    if path is not None and not path.lower().endswith(".png"):
        return f"--plot {path}: the file name must end in .png"
    return check_output("--plot", path)


def plot_rows(results: Sequence[BwResult | LatResult]) -> list[dict[str, Any]]:
    """The rows the plot draws: those of ``--json``."""
    return [lat_row(r) if isinstance(r, LatResult) else bw_row(r) for r in results]


def build_figure(results: Sequence[BwResult | LatResult], opts: BenchOptions) -> Any:
    """A matplotlib Figure of ``results`` (a line per series for a sweep, bars otherwise)."""
    from matplotlib.figure import Figure

    rows = plot_rows(results)
    panels = LAT_PANELS if opts.latency else BW_PANELS
    kind = "latency" if opts.latency else "bandwidth"
    fig = Figure(figsize=(6.4 * len(panels), 4.8), layout="constrained")
    fig.suptitle(f"iwarp bench {opts.test}: {TEST_NAMES[opts.test]} {kind}, {opts.num_qps} QP")
    axes = fig.subplots(1, len(panels), squeeze=False)[0]
    has_baseline = all("baseline" in row for row in rows)
    sizes = [row["size_bytes"] for row in rows]
    for ax, (key, label) in zip(axes, panels, strict=True):
        iwarp = [row[key] for row in rows]
        raw = [row["baseline"][key] for row in rows] if has_baseline else None
        if len(rows) > 1:
            ax.plot(sizes, iwarp, marker="o", label=IWARP_LABEL)
            if raw is not None:
                ax.plot(sizes, raw, marker="s", linestyle="--", label=BASELINE_LABEL)
            ax.set_xscale("log", base=2)
            ax.set_xlabel("message size [bytes]")
            ax.set_yscale("log")
            ax.legend()
            ax.grid(True, which="both", alpha=0.3)
        else:
            names = [IWARP_LABEL] + ([BASELINE_LABEL] if raw is not None else [])
            values = iwarp + (raw or [])
            ax.bar(names, values, color=["tab:blue", "tab:orange"][: len(values)])
            ax.set_xlabel(f"message size {sizes[0]} bytes")
        ax.set_ylabel(label)
    return fig


def save_plot(path: str, results: Sequence[BwResult | LatResult], opts: BenchOptions) -> None:
    """Draw ``results`` into the PNG file ``path`` (:func:`save_figure`)."""
    save_figure(path, build_figure(results, opts))


def save_figure(path: str, fig: Any) -> None:
    """Write the matplotlib Figure ``fig`` as the PNG file ``path`` of ``--plot`` (Agg
    backend: no display needed); a one-line :class:`~stack.cli.CliError` if it cannot be
    written.  Every command's ``--plot`` ends here."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    FigureCanvasAgg(fig)
    try:
        fig.savefig(path, format="png")
    except OSError as exc:
        raise output_error("--plot", path, exc) from None
