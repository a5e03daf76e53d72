"""What a benchmark measured: result rows and the statistics behind them.

Bandwidth is in MB/s with MB = 2^20 bytes and message rates in Mpps, as perftest reports
them; latency in microseconds.  :func:`peak_rate` is ``BW peak``: the best pace over a
window of completions, not perftest's best single message (meaningless at Python timer
granularity).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, replace

from stack.bench.options import BenchError

MB = 1 << 20


@dataclass(frozen=True, slots=True)
class CpuCost:
    """CPU time per message in microseconds: client and server processes (user + system).

    ``server`` is None when both halves share one process; ``client`` is then the total.
    """

    client: float
    server: float | None

    def __str__(self) -> str:
        if self.server is None:
            return f"{self.client:.1f}(both)"
        return f"{self.client:.1f}/{self.server:.1f}"


@dataclass(frozen=True, slots=True)
class Repeats:
    """Every run of one size under ``--repeat``, in run order: iWARP's figure of each run
    (``values``: MB/s, or the median latency in µs) and, with a baseline, each run's ratio
    against the baseline measured right after it (``ratios``)."""

    values: tuple[float, ...]
    ratios: tuple[float, ...] = ()

    @property
    def runs(self) -> int:
        return len(self.values)

    @property
    def value_range(self) -> tuple[float, float]:
        return min(self.values), max(self.values)

    @property
    def ratio_range(self) -> tuple[float, float] | None:
        return (min(self.ratios), max(self.ratios)) if self.ratios else None


@dataclass(frozen=True, slots=True)
class BwResult:
    """One bandwidth row: MB/s (2^20 B/s), Mpps; raw_bw is the baseline's average.

    ``iterations`` is per QP, as perftest prints it; ``messages`` counts all QPs.
    """

    size: int
    iterations: int
    bw_peak: float
    bw_average: float
    msg_rate: float
    messages: int
    raw_bw: float | None = None
    cpu: CpuCost | None = None
    raw_cpu: CpuCost | None = None
    blocking_bw: float | None = None
    """The blocking-socket baseline's MB/s (:mod:`stack.bench.blocking`)."""
    repeats: Repeats | None = None
    """``--repeat``: every run of this size (this row is the median one, :func:`median_run`)."""

    @property
    def figure(self) -> float:
        """The figure runs of a size are ranked by when there is no baseline (MB/s)."""
        return self.bw_average

    @property
    def ratio(self) -> float | None:
        return self.bw_average / self.raw_bw if self.raw_bw else None

    @property
    def ratio_blocking(self) -> float | None:
        return self.bw_average / self.blocking_bw if self.blocking_bw else None


@dataclass(frozen=True, slots=True)
class LatResult:
    """One latency row, microseconds; raw_typical is the baseline's median."""

    size: int
    iterations: int
    t_min: float
    t_max: float
    t_typical: float
    t_avg: float
    t_stdev: float
    p99: float
    p999: float
    raw_typical: float | None = None
    cpu: CpuCost | None = None
    raw_cpu: CpuCost | None = None
    blocking_typical: float | None = None
    """The blocking-socket baseline's median (:mod:`stack.bench.blocking`)."""
    repeats: Repeats | None = None
    """``--repeat``: every run of this size (this row is the median one, :func:`median_run`)."""

    @property
    def figure(self) -> float:
        """The figure runs of a size are ranked by when there is no baseline (µs)."""
        return self.t_typical

    @property
    def ratio(self) -> float | None:
        return self.t_typical / self.raw_typical if self.raw_typical else None

    @property
    def ratio_blocking(self) -> float | None:
        return self.t_typical / self.blocking_typical if self.blocking_typical else None


@dataclass(frozen=True, slots=True)
class IdleResult:
    """Idle-QP memory: server RSS before/after ``qps`` extra idle QPs, bytes."""

    qps: int
    server_before: int
    server_after: int
    client_before: int
    client_after: int
    shared_process: bool

    @property
    def per_qp(self) -> float:
        return (self.server_after - self.server_before) / self.qps

    @property
    def client_per_qp(self) -> float:
        return (self.client_after - self.client_before) / self.qps


def every_ratio(ratios: Sequence[float | None]) -> list[float]:
    """``ratios`` when every run has one (every run had its baseline), else none."""
    known = [ratio for ratio in ratios if ratio is not None]
    return known if len(known) == len(ratios) else []


def median_index(ratios: Sequence[float | None], figures: Sequence[float]) -> int:
    """Which of several runs of one size to report (``--repeat``): the one with the median
    ratio against its own baseline when every run has one, else the median figure; the
    lower of the two middle runs for an even count."""
    keys = every_ratio(ratios) or list(figures)
    return sorted(range(len(figures)), key=keys.__getitem__)[(len(figures) - 1) // 2]


def median_run(runs: Sequence[BwResult | LatResult]) -> BwResult | LatResult:
    """The row to report for one size measured ``len(runs)`` times (``--repeat``).

    On a shared machine a single run's ratio moves with the minute it ran in; each run
    here is iWARP followed at once by its baselines, so each run's ratio is a fair pair.
    The row is the run :func:`median_index` picks, so every figure in it (bandwidth,
    baselines, CPU) comes from one run; ``repeats`` keeps all of them in run order.
    """
    if not runs:
        raise BenchError("no runs to report")
    ratios = [r.ratio for r in runs]
    figures = [r.figure for r in runs]
    repeats = Repeats(tuple(figures), tuple(every_ratio(ratios)))
    return replace(runs[median_index(ratios, figures)], repeats=repeats)


def latency_stats(size: int, seconds: Sequence[float]) -> LatResult:
    """perftest's latency figures from per-iteration times (seconds in, microseconds out)."""
    if not seconds:
        raise BenchError("no latency samples")
    us = sorted(s * 1e6 for s in seconds)
    n = len(us)

    def percentile(q: float) -> float:
        return us[min(n - 1, max(0, math.ceil(q * n) - 1))]

    return LatResult(
        size,
        n,
        us[0],
        us[-1],
        statistics.median(us),
        statistics.fmean(us),
        statistics.pstdev(us) if n > 1 else 0.0,
        percentile(0.99),
        percentile(0.999),
    )


def peak_rate(
    samples: Sequence[Sequence[tuple[float, int]]], start: float, min_window: int
) -> float:
    """Best messages/second over any window of >= ``min_window`` completed messages.

    ``samples`` holds, per QP, (time, messages completed so far) points.  Returns 0 when
    no window is long enough.
    """
    merged = sorted((t, q, done) for q, qp_samples in enumerate(samples) for t, done in qp_samples)
    per_qp = [0] * len(samples)
    points: list[tuple[float, int]] = [(start, 0)]
    total = 0
    for t, q, done in merged:
        total += done - per_qp[q]
        per_qp[q] = done
        points.append((t, total))
    best = 0.0
    i = 0
    for j in range(1, len(points)):
        tj, nj = points[j]
        while i + 1 < j and nj - points[i + 1][1] >= min_window:
            i += 1
        ti, ni = points[i]
        if nj - ni >= min_window and tj > ti:
            best = max(best, (nj - ni) / (tj - ti))
    return best
