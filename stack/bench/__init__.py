"""Benchmarks of the stack, with raw-TCP baselines in the same run (``iwarp bench``).

One concept a module: :mod:`~stack.bench.options` (a run's options, perftest's defaults),
:mod:`~stack.bench.protocol` (MPA private data and the raw-TCP port),
:mod:`~stack.bench.results` and :mod:`~stack.bench.report` (figures and tables),
:mod:`~stack.bench.server` and :mod:`~stack.bench.client` (the two halves),
:mod:`~stack.bench.baseline` (raw TCP) and :mod:`~stack.bench.run` (a run end to end).
The commands are modules of their own, not imported here (each also runs with
``python -m``): :mod:`~stack.bench.cli` (``iwarp bench write|read|send|atomic|server|
idle-qps|floor``), :mod:`~stack.bench.codec` (``iwarp bench codec``),
:mod:`~stack.bench.floor` (the pure-Python floor of a bulk Write) and
:mod:`~stack.bench.goals` (``iwarp bench goals``: the speed goals in one run).
"""

from stack.bench.baseline import raw_bandwidth, raw_latency
from stack.bench.client import Client, ClientQp, measure_bw, measure_lat
from stack.bench.memory import REMOTE_ALL, wait_for_byte
from stack.bench.options import (
    ALL_SIZES,
    ATOMIC_SIZE,
    DEFAULT_PORT,
    TESTS,
    BenchError,
    BenchOptions,
    mpa_settings,
    parse_size,
)
from stack.bench.process import raise_nofile, rss_bytes
from stack.bench.progress import Progress
from stack.bench.protocol import Advert, SessionSpec
from stack.bench.report import (
    RESULT_LINE,
    TEST_NAMES,
    TRANSPORT,
    bw_header,
    format_bw,
    format_idle,
    format_lat,
    header_block,
    lat_header,
)
from stack.bench.results import (
    MB,
    BwResult,
    CpuCost,
    IdleResult,
    LatResult,
    Repeats,
    latency_stats,
    median_run,
    peak_rate,
)
from stack.bench.run import (
    BenchRecord,
    CpuMeter,
    run_benchmark,
    run_idle_qps,
    server_command,
    server_for,
)
from stack.bench.server import BenchServer, serve_forever

__all__ = [
    "BenchRecord",
    "ALL_SIZES",
    "ATOMIC_SIZE",
    "DEFAULT_PORT",
    "MB",
    "REMOTE_ALL",
    "RESULT_LINE",
    "TESTS",
    "TEST_NAMES",
    "TRANSPORT",
    "Advert",
    "BenchError",
    "BenchOptions",
    "BenchServer",
    "BwResult",
    "Client",
    "ClientQp",
    "CpuCost",
    "CpuMeter",
    "IdleResult",
    "LatResult",
    "Progress",
    "Repeats",
    "SessionSpec",
    "bw_header",
    "format_bw",
    "format_idle",
    "format_lat",
    "header_block",
    "lat_header",
    "latency_stats",
    "measure_bw",
    "measure_lat",
    "median_run",
    "mpa_settings",
    "parse_size",
    "peak_rate",
    "raise_nofile",
    "raw_bandwidth",
    "raw_latency",
    "rss_bytes",
    "run_benchmark",
    "run_idle_qps",
    "serve_forever",
    "server_command",
    "server_for",
    "wait_for_byte",
]
