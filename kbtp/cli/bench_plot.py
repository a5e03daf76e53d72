"""``kbtp bench --plot FILE.png``: KBTP against what the same run measured beside it, drawn.

Two panels, block throughput (GB/s, 10^9 octets of block data per second) and CPU per
operation (µs, both ends, as the table counts it), against the block size on a log scale
when the run measured several sizes, as grouped bars for one size.  One colour per
operation (STORE, LOAD, ALLOC_STORE); one line style per series: KBTP (solid), the
pipelined raw TCP baseline (dashed), the pure-Python floor of the same exchange
(``--floor``, dotted) and Mooncake Transfer Engine's TCP transport (``--vs mooncake``,
dash-dot), each only where the run measured it.  The figure is made from the ``--json``
document's rows (:func:`~kbtp.cli.bench_report.bench_document`); matplotlib is the
optional ``plot`` extra, checked before a run (:mod:`stack.bench.plot`).
"""

from __future__ import annotations

from typing import Any

from stack.bench.plot import save_figure

__all__ = ["SERIES", "build_kbtp_figure", "save_kbtp_plot"]

SERIES: tuple[tuple[str, str | None, Any, str], ...] = (  # the style: a matplotlib linestyle
    ("KBTP", None, "-", "o"),
    ("raw TCP (pipelined baseline)", "baseline", "--", "s"),
    ("pure-Python floor", "floor", ":", "D"),
    ("Mooncake TCP", "mooncake", "-.", "^"),
)
"""(label, the row's key of its figures or None for KBTP's own, line style, marker)."""

PANELS = (("gbyte_per_s", "throughput [GB/s]"), ("cpu_us_per_op", "CPU per operation [µs]"))
OP_COLOURS = {"STORE": "tab:blue", "LOAD": "tab:orange", "ALLOC_STORE": "tab:green"}
Row = dict[str, Any]


def series_value(row: dict[str, Any], key: str | None, field: str) -> float | None:
    """``field`` of ``row``'s series ``key`` (None: KBTP's own), None where not measured."""
    part = row if key is None else row.get(key)
    if not isinstance(part, dict):
        return None
    value = part.get(field)
    return float(value) if isinstance(value, int | float) else None


def build_kbtp_figure(doc: dict[str, Any]) -> Any:
    """A matplotlib Figure of a ``kbtp bench --json`` document's rows."""
    from matplotlib.figure import Figure

    rows: list[dict[str, Any]] = doc["results"]
    ops = list(dict.fromkeys(r["operation"] for r in rows))
    sizes = sorted({r["size_bytes"] for r in rows})
    fig = Figure(figsize=(13, 5), layout="constrained")
    params = doc.get("parameters") or {}
    fig.suptitle(
        f"kbtp bench: {params.get('inflight', '?')} in flight, "
        f"{'two processes' if params.get('processes') == 2 else 'one process'}, "
        f"CRC {'on' if params.get('crc', True) else 'off'}"
    )
    axes = fig.subplots(1, len(PANELS))
    for ax, (field, label) in zip(axes, PANELS, strict=True):
        if len(sizes) > 1:
            _lines(ax, rows, ops, sizes, field)
        else:
            _bars(ax, rows, ops, field, sizes[0])
        ax.set_ylabel(label)
    if len(sizes) > 1:  # one key for both panels: the colour an operation, the style a series
        fig.legend(handles=_key(rows, ops), loc="outside lower center", ncols=8, fontsize=8)
    return fig


def _key(rows: list[Row], ops: list[str]) -> list[Any]:
    """The legend's handles: each operation's colour, then each measured series' style."""
    from matplotlib.lines import Line2D

    handles: list[Any] = [
        Line2D([], [], color=OP_COLOURS.get(op, "tab:gray"), label=op) for op in ops
    ]
    for label, key, style, marker in SERIES:
        if any(series_value(r, key, "gbyte_per_s") is not None for r in rows):
            handles.append(
                Line2D([], [], color="black", linestyle=style, marker=marker, label=label)
            )
    return handles


def _lines(
    ax: Any, rows: list[dict[str, Any]], ops: list[str], sizes: list[int], field: str
) -> None:
    """A line per operation and series, against the block size."""
    for op in ops:
        by_size = {r["size_bytes"]: r for r in rows if r["operation"] == op}
        for label, key, style, marker in SERIES:
            points = [
                (s, v)
                for s in sizes
                if s in by_size and (v := series_value(by_size[s], key, field)) is not None
            ]
            if not points:
                continue
            xs, ys = zip(*points, strict=True)
            ax.plot(
                xs,
                ys,
                linestyle=style,
                marker=marker,
                color=OP_COLOURS.get(op, "tab:gray"),
                label=f"{op} {label}",
            )
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("block size [octets]")
    ax.grid(True, which="both", alpha=0.3)


def _bars(ax: Any, rows: list[dict[str, Any]], ops: list[str], field: str, size: int) -> None:
    """Grouped bars: an operation per group, a bar per series it has."""
    present = [s for s in SERIES if any(series_value(r, s[1], field) is not None for r in rows)]
    width = 0.8 / max(1, len(present))
    by_op = {r["operation"]: r for r in rows}
    for i, (label, key, _style, _marker) in enumerate(present):
        xs, ys = [], []
        for n, op in enumerate(ops):
            value = series_value(by_op[op], key, field)
            if value is not None:
                xs.append(n + (i - (len(present) - 1) / 2) * width)
                ys.append(value)
        ax.bar(xs, ys, width=width, label=label)
    ax.set_xticks(range(len(ops)), ops)
    ax.set_xlabel(f"block size {size} octets")
    ax.legend(fontsize=7)


def save_kbtp_plot(path: str, doc: dict[str, Any]) -> None:
    """Draw ``doc`` into the PNG file ``path`` (:func:`~stack.bench.plot.save_figure`)."""
    save_figure(path, build_kbtp_figure(doc))
