"""``kbtp bench``'s rows: the figures of one operation at one block size, the text table and
the ``--json`` document (KBTP next to the raw TCP baseline, ``--floor`` the pure-Python floor
of the exchange and, ``--vs mooncake``, Mooncake).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from kbtp.cli.bench_floor import describe as floor_exchange
from stack.bench.results import every_ratio, median_index
from stack.cli import size_label as size_label
from stack.cli.json_report import schema


@dataclass(slots=True)
class Result:
    """One row: an operation at one size, KBTP and (optionally) the raw baseline."""

    op: str
    size: int
    iters: int
    seconds: float
    path: str
    cpu: float = 0.0
    raw_seconds: float | None = None
    raw_cpu: float | None = None
    mc_seconds: float | None = None
    """Mooncake Transfer Engine's TCP transport moving the same blocks (``--vs mooncake``)."""
    mc_cpu: float | None = None
    floor_seconds: float | None = None
    """The pure-Python floor of the same exchange (``--floor``, :mod:`kbtp.cli.bench_floor`)."""
    floor_cpu: float | None = None
    run_ops: list[float] = field(default_factory=list)
    """``--repeat``: ops/s of every run of this row, in run order (empty: one run)."""
    run_ratios: list[float] = field(default_factory=list)
    """``--repeat``: the ratio of every run against its own baseline, in run order."""
    run_floor_ratios: list[float] = field(default_factory=list)
    """``--repeat --floor``: every run's floor over its own baseline, in run order."""
    target_cpu: float | None = None
    """The target's part of :attr:`cpu` (None: in this process, or not measurable)."""

    @property
    def ops(self) -> float:
        return self.iters / self.seconds

    @property
    def gbps(self) -> float:
        return self.iters * self.size / self.seconds / 1e9

    @property
    def raw_gbps(self) -> float | None:
        if self.raw_seconds is None:
            return None
        return self.iters * self.size / self.raw_seconds / 1e9

    @property
    def ratio(self) -> float | None:
        raw = self.raw_gbps
        return self.gbps / raw if raw else None

    @property
    def floor_gbps(self) -> float | None:
        if self.floor_seconds is None:
            return None
        return self.iters * self.size / self.floor_seconds / 1e9

    @property
    def floor_ratio(self) -> float | None:
        """The floor's GB/s over the baseline's."""
        raw, floor = self.raw_gbps, self.floor_gbps
        return floor / raw if raw and floor is not None else None

    @property
    def vs_floor(self) -> float | None:
        """KBTP's GB/s over the floor's."""
        floor = self.floor_gbps
        return self.gbps / floor if floor else None

    @property
    def mc_gbps(self) -> float | None:
        if self.mc_seconds is None:
            return None
        return self.iters * self.size / self.mc_seconds / 1e9

    @property
    def vs_mooncake(self) -> float | None:
        mc = self.mc_gbps
        return self.gbps / mc if mc else None


HEADER = (
    f"{'operation':<12} {'size':>5} {'path':<6} {'iters':>5} {'ops/s':>7} {'GB/s':>6}"
    f" {'raw ops/s':>9} {'raw GB/s':>8} {'ratio':>5}  {'CPU us/op':>9} {'raw CPU':>7}"
)


FLOOR_HEADER = f" {'fl ops/s':>8} {'fl GB/s':>7} {'fl/raw':>6} {'vs fl':>5} {'fl CPU':>6}"
"""The ``--floor`` columns: the floor's ops/s, GB/s, ratio to raw, KBTP over it, CPU us/op."""
MC_HEADER = f" {'MC GB/s':>7} {'vs MC':>5} {'MC CPU':>6}"
"""The ``--vs mooncake`` columns."""
REPEAT_HEADER = f" {'runs':>4} {'min-max':>11}"
"""The ``--repeat`` columns: runs, and the ratio's range (ops/s without a baseline)."""
MC_OPS = {"store": "write", "load": "read"}
"""The Mooncake transfer each KBTP operation is compared with."""


def median_result(runs: Sequence[Result]) -> Result:
    """The row to print for one operation measured ``len(runs)`` times (``--repeat``): the
    run :func:`~stack.bench.results.median_index` picks (by ratio against its own
    baseline, by ops/s without one), with every run's ops/s and ratio kept in run order."""
    if not runs:
        raise ValueError("no runs")
    ratios = [r.ratio for r in runs]
    ops = [r.ops for r in runs]
    chosen = runs[median_index(ratios, ops)]
    chosen.run_ops = ops
    chosen.run_ratios = every_ratio(ratios)
    if chosen.floor_seconds is not None:
        chosen.run_floor_ratios = every_ratio([r.floor_ratio for r in runs])
    return chosen


def format_row(r: Result, vs_mooncake: bool = False, repeat: int = 1, floor: bool = False) -> str:
    raw = "" if r.raw_seconds is None else f"{r.iters / r.raw_seconds:.0f}"
    raw_gb = "" if r.raw_gbps is None else f"{r.raw_gbps:.3f}"
    ratio = "" if r.ratio is None else f"{r.ratio:.2f}"
    raw_cpu = "" if r.raw_cpu is None else f"{r.raw_cpu / r.iters * 1e6:.0f}"
    line = (
        f"{r.op.upper():<12} {size_label(r.size):>5} {r.path:<6} {r.iters:>5} {r.ops:>7.0f}"
        f" {r.gbps:>6.3f} {raw:>9} {raw_gb:>8} {ratio:>5}  {r.cpu / r.iters * 1e6:>9.0f}"
        f" {raw_cpu:>7}"
    )
    if floor:
        line += _floor_columns(r)
    if vs_mooncake:
        mc = "-" if r.mc_gbps is None else f"{r.mc_gbps:.3f}"
        vs = "-" if r.vs_mooncake is None else f"{r.vs_mooncake:.2f}"
        mc_cpu = "-" if r.mc_cpu is None else f"{r.mc_cpu / r.iters * 1e6:.0f}"
        line += f" {mc:>7} {vs:>5} {mc_cpu:>6}"
    if repeat > 1:
        spread = r.run_ratios or r.run_ops or [r.ratio or r.ops]
        digits = 2 if r.run_ratios else 0
        span = f"{min(spread):.{digits}f}-{max(spread):.{digits}f}"
        line += f" {max(len(r.run_ops), 1):>4} {span:>11}"
    return line


def _floor_columns(r: Result) -> str:
    if r.floor_seconds is None or r.floor_gbps is None or r.floor_cpu is None:
        return f" {'-':>8} {'-':>7} {'-':>6} {'-':>5} {'-':>6}"
    ratio = "-" if r.floor_ratio is None else f"{r.floor_ratio:.2f}"
    vs = "-" if r.vs_floor is None else f"{r.vs_floor:.2f}"
    return (
        f" {r.iters / r.floor_seconds:>8.0f} {r.floor_gbps:>7.3f} {ratio:>6} {vs:>5}"
        f" {r.floor_cpu / r.iters * 1e6:>6.0f}"
    )


def result_row(r: Result) -> dict[str, Any]:
    """One ``--json`` row: the table's figures, units in the key names."""
    row: dict[str, Any] = {
        "operation": r.op.upper(),
        "size_bytes": r.size,
        "path": r.path,
        "iterations": r.iters,
        "seconds": r.seconds,
        "ops_per_s": r.ops,
        "gbyte_per_s": r.gbps,
        "gbit_per_s": r.gbps * 8,
        "cpu_us_per_op": r.cpu / r.iters * 1e6,
        # Which end a row's CPU goes to (the busier end bounds the rate); None in one process.
        "cpu_us_per_op_initiator": None
        if r.target_cpu is None
        else (r.cpu - r.target_cpu) / r.iters * 1e6,
        "cpu_us_per_op_target": None if r.target_cpu is None else r.target_cpu / r.iters * 1e6,
    }
    if r.raw_seconds is not None:
        raw_gbps = r.raw_gbps or 0.0
        row["baseline"] = {
            "seconds": r.raw_seconds,
            "ops_per_s": r.iters / r.raw_seconds,
            "gbyte_per_s": raw_gbps,
            "gbit_per_s": raw_gbps * 8,
            "cpu_us_per_op": None if r.raw_cpu is None else r.raw_cpu / r.iters * 1e6,
        }
        row["ratio"] = r.ratio
    if r.floor_seconds is not None:
        floor_gbps = r.floor_gbps or 0.0
        row["floor"] = {
            "exchange": floor_exchange(r.op, r.path),
            "seconds": r.floor_seconds,
            "ops_per_s": r.iters / r.floor_seconds,
            "gbyte_per_s": floor_gbps,
            "gbit_per_s": floor_gbps * 8,
            "cpu_us_per_op": None if r.floor_cpu is None else r.floor_cpu / r.iters * 1e6,
        }
        row["floor_ratio"] = r.floor_ratio
        row["vs_floor"] = r.vs_floor
    if r.mc_seconds is not None:
        mc_gbps = r.mc_gbps or 0.0
        row["mooncake"] = {
            "transfer": MC_OPS[r.op],
            "seconds": r.mc_seconds,
            "gbyte_per_s": mc_gbps,
            "cpu_us_per_op": None if r.mc_cpu is None else r.mc_cpu / r.iters * 1e6,
        }
        row["vs_mooncake"] = r.vs_mooncake
    if r.run_ops:
        row["repeats"] = {"runs": len(r.run_ops), "ops_per_s": r.run_ops}
        if r.run_ratios:
            row["repeats"]["ratios"] = r.run_ratios
        if r.run_floor_ratios:
            row["repeats"]["floor_ratios"] = r.run_floor_ratios
    return row


def bench_document(
    parameters: dict[str, Any], results: list[Result], exit_status: int
) -> dict[str, Any]:
    """``kbtp bench --json``: parameters, the raw TCP baseline, the rows and the verdict."""
    baseline = None
    if parameters["baseline"]:
        baseline = {
            "name": "pipelined raw trio TCP request/response",
            "shape": "one connection, the same requests in flight, 40-octet requests and "
            "responses carrying the same block octets; the client sends every request it "
            "may at once, the server answers every pending request in one send; sends are "
            "scatter-gather sendmsg calls",
            "same_run": True,
        }
    floor = None
    if parameters.get("floor"):
        floor = {
            "name": "the pure-Python floor of the KBTP exchange (kbtp.cli.bench_floor)",
            "shape": "the same requests in flight on loopback, the target in a second process "
            "unless in-process: real FPDUs with CRC32c at both ends, the placement copy, the "
            "request and COMPLETION as Sends, nothing else; measured right after the baseline, "
            "the faster of one run per receive size",
            "same_run": True,
            "floor_ratio_is": "the floor's GB/s over the baseline's",
            "vs_floor_is": "KBTP GB/s over the floor's",
        }
    return {
        "schema": schema("kbtp bench"),
        "command": "kbtp bench",
        "parameters": parameters,
        "baseline": baseline,
        "ratio_is": "KBTP GB/s over the baseline's GB/s",
        "floor": floor,
        "results": [result_row(r) for r in results],
        "exit_status": exit_status,
        "verdict": "ok" if exit_status == 0 else "error",
    }
