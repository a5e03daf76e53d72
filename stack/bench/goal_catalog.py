"""The goals of ``iwarp bench goals``: each a ratio, its target, and the benchmark behind it.

A :class:`Measurement` is one benchmark process (``iwarp bench ... --json``, ``kbtp bench
... --json``); a :class:`Goal` reads its figure from those processes' JSON documents and
names the floor row (``iwarp bench floor``) that bounds it on this host (the dissector's
goal, a speed against tshark, has none).  The targets are the issue's (docs/performance.md,
"The goals at a glance").
"""

from __future__ import annotations

import statistics
import sys
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from stack.bench.options import DEFAULT_TX_DEPTH
from stack.bench.process import usable_cpus

__all__ = [
    "FLOOR_RUNS",
    "GOALS",
    "GOAL_KEYS",
    "MEASUREMENTS",
    "ROUND_TRIPS",
    "ROUND_TRIP_CPUS",
    "ROUND_TRIP_FLOOR",
    "SMALL_BATCH",
    "TITLE_WIDTH",
    "FloorRun",
    "Doc",
    "Goal",
    "Measurement",
    "placed",
]

Doc = dict[str, Any]


@dataclass(frozen=True)
class Measurement:
    """One benchmark process behind some goals: ``tool`` (``iwarp`` or ``kbtp``), its
    arguments before the common ones (duration, repeat, JSON output)."""

    key: str
    tool: str
    args: tuple[str, ...]
    timed: bool = True  # takes -D SECONDS (kbtp bench moves a fixed number of octets)
    newer: tuple[str, ...] = ()  # arguments an older tree refuses (``--before``: run without)

    def without_newer(self) -> Measurement:
        """This measurement without the arguments of :attr:`newer`."""
        return replace(self, args=tuple(a for a in self.args if a not in self.newer), newer=())

    def argv(self, seconds: float, repeat: int, json_path: str) -> list[str]:
        """The subprocess's command line (``-P``: the working directory is not put first on
        the path, so a checkout there cannot shadow the tree measured)."""
        module = "stack" if self.tool == "iwarp" else "kbtp"
        extra = ["-D", f"{seconds:g}"] if self.timed else []
        return [
            sys.executable,
            "-P",
            "-m",
            module,
            "bench",
            *self.args,
            *extra,
            "-r",
            str(repeat),
            "--quiet",
            "--json",
            json_path,
        ]

    def command(self) -> str:
        """How a user runs it by hand (without the common arguments)."""
        return " ".join((self.tool, "bench", *self.args))


_RDMA = ("--baseline", "--cpu")


def split_cpus() -> tuple[str, ...]:
    """``--cpus C,S`` on the first two CPUs this process may use (none with one CPU).

    A round trip's figure depends on where its two ends run: on one CPU a message wakes
    the other end with no cross-CPU wake-up, on two each message pays one (on a VM with
    halt polling, the longer the other CPU waited the more).  So the round trips, the
    stack's, their baselines' and their floor's, are measured with the client and the
    server each on a CPU of its own, as two hosts would be (docs/performance.md)."""
    cpus = usable_cpus()
    return ("--cpus", f"{cpus[0]},{cpus[1]}") if len(cpus) > 1 else ()


ROUND_TRIP_CPUS = split_cpus()
"""The default ``--cpus`` of the round trips' measurements and their floor (empty with one
CPU); ``iwarp bench goals --round-trip-cpus`` chooses another (:func:`placed`)."""
ROUND_TRIPS = ("read-lat", "atomic-lat", "read-lat-blk", "atomic-lat-blk")
"""The measurements that are round trips (placed by :func:`placed`)."""
ROUND_TRIP_FLOOR = "rtt"
"""The floor run of the round trips (placed with them)."""
MEASUREMENTS = {
    m.key: m
    for m in (
        Measurement("write-1m", "iwarp", ("write", "-s", "1M", *_RDMA)),
        Measurement("send-1m", "iwarp", ("send", "-s", "1M", *_RDMA)),
        Measurement("read-1m", "iwarp", ("read", "-s", "1M", *_RDMA)),
        Measurement("write-64k", "iwarp", ("write", "-s", "64K", *_RDMA)),
        Measurement("read-64k", "iwarp", ("read", "-s", "64K", *_RDMA)),
        Measurement(
            "write-64-lists", "iwarp", ("write", "-s", "64", "-l", "16", "-Q", "16", *_RDMA)
        ),
        Measurement(
            "read-lat",
            "iwarp",
            ("read", "-s", "64", "--lat", *_RDMA),
        ),
        Measurement(
            "atomic-lat",
            "iwarp",
            ("atomic", "--lat", *_RDMA),
        ),
        Measurement(
            "read-lat-blk",
            "iwarp",
            ("read", "-s", "64", "--lat", "--blocking", *_RDMA),
        ),
        Measurement(
            "atomic-lat-blk",
            "iwarp",
            ("atomic", "--lat", "--blocking", *_RDMA),
        ),
        Measurement("write-1m-markers", "iwarp", ("write", "-s", "1M", "--markers", *_RDMA)),
        Measurement(
            "kbtp",
            "kbtp",
            ("-s", "64K,1M", "--bytes", "256M", "--floor", "--vs", "mooncake"),
            timed=False,
            newer=("--floor",),
        ),
        Measurement(
            "dissect",
            "iwarp",
            ("dissect", "--modes", "summary", "--fpdus", "1000000", "--rss-fpdus", "0"),
            timed=False,
        ),
    )
}


def _row(doc: Doc) -> Doc:
    """The first (only) row of an ``iwarp bench`` document."""
    row: Doc = doc["results"][0]
    return row


def _ratio(key: str, driver: str = "trio") -> Callable[[dict[str, Doc]], tuple[float, str]]:
    """The first row's ratio to raw trio TCP, measured on ``driver`` (the document's
    ``parameters.driver``; documents without it are of the trio driver)."""

    def value(docs: dict[str, Doc]) -> tuple[float, str]:
        ran = docs[key].get("parameters", {}).get("driver", "trio")
        if ran != driver:
            raise ValueError(f"measured on the {ran} driver, not the {driver} driver")
        ratio = float(_row(docs[key])["ratio"])
        return ratio, f"{ratio:.2f}"

    return value


def _markers_cost(docs: dict[str, Doc]) -> tuple[float, str]:
    plain = float(_row(docs["write-1m"])["bw_average_mib_per_s"])
    marked = float(_row(docs["write-1m-markers"])["bw_average_mib_per_s"])
    cost = 1.0 - marked / plain
    return cost, f"{cost:.0%} ({plain:.0f} -> {marked:.0f} MiB/s)"


def _kbtp_rows(docs: dict[str, Doc], size: int) -> dict[str, Doc]:
    return {r["operation"]: r for r in docs["kbtp"]["results"] if r["size_bytes"] == size}


def _kbtp_ratio(
    op: str, size: int, floor: bool = False
) -> Callable[[dict[str, Doc]], tuple[float, str]]:
    """KBTP GB/s over its pipelined raw baseline's (``floor``: the floor's over the same
    baseline, ``kbtp bench --floor``)."""

    def value(docs: dict[str, Doc]) -> tuple[float, str]:
        row = _kbtp_rows(docs, size)[op]
        runs = (row.get("repeats") or {}).get("floor_ratios") if floor else None
        # The printed run is KBTP's median; the floor's own median is of all its runs.
        ratio = statistics.median(runs) if runs else float(row["floor_ratio" if floor else "ratio"])
        return ratio, f"{ratio:.2f}"

    return value


def _mooncake(
    size: int, what: str, floor: bool = False
) -> Callable[[dict[str, Doc]], tuple[float, str]]:
    """STORE and LOAD against Mooncake's TCP transport: ``gbps`` their GB/s over
    Mooncake's (the worse of the two is the goal's value), ``cpu`` their CPU per block over
    Mooncake's (the larger); ``floor``: the floor's figures instead of KBTP's."""
    key = "gbyte_per_s" if what == "gbps" else "cpu_us_per_op"

    def value(docs: dict[str, Doc]) -> tuple[float, str]:
        rows = _kbtp_rows(docs, size)
        figures = []
        for op in ("STORE", "LOAD"):
            row = rows[op]
            mc = row.get("mooncake")
            if not mc:
                raise LookupError(docs["kbtp"].get("mooncake_problem") or "no Mooncake figures")
            ours = row["floor"] if floor else row
            if not ours:
                raise LookupError("no floor figures")
            figures.append(float(ours[key]) / float(mc[key]))
        worst = min(figures) if what == "gbps" else max(figures)
        return worst, f"{figures[0]:.2f} / {figures[1]:.2f}"

    return value


def _dissect_speed(docs: dict[str, Doc]) -> tuple[float, str]:
    """tshark's wall time over ``iwarp dissect``'s in the summary row (above 1: ours is
    faster); LookupError with the document's reason when tshark was not run."""
    doc = docs["dissect"]
    rows = [r for r in doc["rows"] if r["mode"] == "summary"]
    if not rows:
        raise LookupError("no summary row")
    theirs, ours = rows[0].get("tshark_wall_s"), float(rows[0]["ours_wall_s"])
    if theirs is None:
        raise LookupError(doc.get("tshark_problem") or "no tshark figures")
    ratio = float(theirs) / ours
    return ratio, f"{ratio:.2f} ({float(theirs):.1f} / {ours:.1f} s)"


@dataclass(frozen=True)
class FloorRun:
    """One run of ``iwarp bench floor`` behind some goals' floor column: ``gives`` the floor
    keys it measures (a goal's ``floor`` names one)."""

    key: str
    args: tuple[str, ...]
    gives: tuple[str, ...]

    def command(self, repeat: int = 1) -> str:
        """How a user runs it by hand."""
        return " ".join(("iwarp", "bench", "floor", *self.args, "--repeat", str(repeat)))


SMALL_BATCH = DEFAULT_TX_DEPTH
"""Messages per send of the small-message floor: what the 64 B Write goal's raw baseline
sends per ``send`` (its tx depth, the bench's default; ``-l`` does not change it)."""
FLOOR_RUNS = {
    f.key: f
    for f in (
        FloorRun("stream", ("-s", "64K,1M"), ("64K", "1M", "markers")),
        FloorRun("small", ("-s", "64", "--batch", str(SMALL_BATCH)), ("small",)),
        FloorRun("read", ("--exchange", "read", "-s", "64K,1M"), ("read-64K", "read-1M")),
        FloorRun(ROUND_TRIP_FLOOR, ("--exchange", "rtt"), ("rtt",)),
    )
}
"""The floor runs, by key; each runs once when a goal selected needs one of its keys."""


def placed(
    cpus: tuple[str, ...],
) -> tuple[dict[str, Measurement], dict[str, FloorRun]]:
    """:data:`MEASUREMENTS` and :data:`FLOOR_RUNS` with the round trips and their floor
    given ``cpus`` (``("--cpus", "0,1")``; empty: where the kernel puts them).  An older
    tree (``--before``) that refuses ``--cpus`` runs them unplaced (``newer``)."""
    measurements = {
        k: replace(m, args=(*m.args, *cpus), newer=(*m.newer, *cpus)) if k in ROUND_TRIPS else m
        for k, m in MEASUREMENTS.items()
    }
    floors = {
        k: replace(f, args=(*f.args, *cpus)) if k == ROUND_TRIP_FLOOR else f
        for k, f in FLOOR_RUNS.items()
    }
    return measurements, floors


@dataclass(frozen=True)
class Goal:
    """A target for one ratio: ``at_most`` False means measured >= target is met."""

    key: str
    title: str
    target: float
    needs: tuple[str, ...]
    value: Callable[[dict[str, Doc]], tuple[float, str]]
    at_most: bool = False
    percent: bool = False
    floor: str | None = None  # the floor key that bounds it (FLOOR_RUNS' gives)
    # or the floor read from the benchmarks' own documents (kbtp bench --floor)
    floor_of: Callable[[dict[str, Doc]], tuple[float, str]] | None = None

    def target_text(self) -> str:
        """``>= 0.90``, ``<= 1.50``, ``<= 15%``."""
        sign = "<=" if self.at_most else ">="
        return f"{sign} {self.target:.0%}" if self.percent else f"{sign} {self.target:.2f}"


GOALS: tuple[Goal, ...] = (
    Goal(
        "write-1m",
        "RDMA Write 1 MiB / raw trio",
        0.9,
        ("write-1m",),
        _ratio("write-1m"),
        floor="1M",
    ),
    Goal("send-1m", "Send 1 MiB / raw trio", 0.9, ("send-1m",), _ratio("send-1m"), floor="1M"),
    Goal(
        "read-1m",
        "RDMA Read 1 MiB / raw trio",
        0.8,
        ("read-1m",),
        _ratio("read-1m"),
        floor="read-1M",
    ),
    Goal(
        "write-64k",
        "RDMA Write 64 KiB / raw trio",
        0.8,
        ("write-64k",),
        _ratio("write-64k"),
        floor="64K",
    ),
    Goal(
        "read-64k",
        "RDMA Read 64 KiB / raw trio",
        0.7,
        ("read-64k",),
        _ratio("read-64k"),
        floor="read-64K",
    ),
    Goal(
        "write-64-lists",
        "64 B Writes, post lists of 16 / batched raw",
        0.25,
        ("write-64-lists",),
        _ratio("write-64-lists"),
        floor="small",
    ),
    Goal(
        "read-lat",
        "64 B Read round trip, trio driver / raw ping-pong",
        1.5,
        ("read-lat",),
        _ratio("read-lat"),
        at_most=True,
        floor="rtt",
    ),
    Goal(
        "atomic-lat",
        "FetchAdd round trip, trio driver / raw ping-pong",
        1.5,
        ("atomic-lat",),
        _ratio("atomic-lat"),
        at_most=True,
        floor="rtt",
    ),
    Goal(
        "read-lat-blk",
        "64 B Read round trip, blocking driver / raw ping-pong",
        1.5,
        ("read-lat-blk",),
        _ratio("read-lat-blk", "blocking"),
        at_most=True,
        floor="rtt",
    ),
    Goal(
        "atomic-lat-blk",
        "FetchAdd round trip, blocking driver / raw ping-pong",
        1.5,
        ("atomic-lat-blk",),
        _ratio("atomic-lat-blk", "blocking"),
        at_most=True,
        floor="rtt",
    ),
    Goal(
        "markers-1m",
        "markers' cost, 1 MiB Writes",
        0.15,
        ("write-1m", "write-1m-markers"),
        _markers_cost,
        at_most=True,
        percent=True,
        floor="markers",
    ),
    Goal(
        "kbtp-load-64k",
        "KBTP LOAD 64 KiB / pipelined raw",
        0.8,
        ("kbtp",),
        _kbtp_ratio("LOAD", 65536),
        floor_of=_kbtp_ratio("LOAD", 65536, floor=True),
    ),
    Goal(
        "kbtp-store-64k",
        "KBTP STORE 64 KiB / pipelined raw",
        0.8,
        ("kbtp",),
        _kbtp_ratio("STORE", 65536),
        floor_of=_kbtp_ratio("STORE", 65536, floor=True),
    ),
    Goal(
        "kbtp-alloc-64k",
        "KBTP ALLOC_STORE 64 KiB / pipelined raw",
        0.7,
        ("kbtp",),
        _kbtp_ratio("ALLOC_STORE", 65536),
        floor_of=_kbtp_ratio("ALLOC_STORE", 65536, floor=True),
    ),
    Goal(
        "kbtp-mc-64k",
        "KBTP STORE / LOAD 64 KiB / Mooncake",
        1.0,
        ("kbtp",),
        _mooncake(65536, "gbps"),
        floor_of=_mooncake(65536, "gbps", floor=True),
    ),
    Goal(
        "kbtp-mc-1m",
        "KBTP STORE / LOAD 1 MiB / Mooncake",
        1.0,
        ("kbtp",),
        _mooncake(1 << 20, "gbps"),
        floor_of=_mooncake(1 << 20, "gbps", floor=True),
    ),
    Goal(
        "kbtp-cpu-64k",
        "KBTP CPU per block 64 KiB / Mooncake's",
        1.0,
        ("kbtp",),
        _mooncake(65536, "cpu"),
        at_most=True,
        floor_of=_mooncake(65536, "cpu", floor=True),
    ),
    Goal(
        "kbtp-cpu-1m",
        "KBTP CPU per block 1 MiB / Mooncake's",
        1.0,
        ("kbtp",),
        _mooncake(1 << 20, "cpu"),
        at_most=True,
        floor_of=_mooncake(1 << 20, "cpu", floor=True),
    ),
    Goal(
        "dissect-summary",
        "iwarp dissect summary / tshark, 1M FPDUs",
        1.5,
        ("dissect",),
        _dissect_speed,
    ),
)
GOAL_KEYS = tuple(g.key for g in GOALS)
TITLE_WIDTH = max(len(g.title) for g in GOALS)
"""The width of the goals' title column."""
