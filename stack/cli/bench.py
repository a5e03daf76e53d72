"""``iwarp bench``: benchmarks, one sub-subcommand each (``iwarp bench codec``, ...).

Each module of :data:`BENCH_MODULES` defines ``register_bench(subparsers)``, which adds its
own sub-subcommand(s), e.g. ``iwarp bench write``, with ``set_defaults(func=...)`` naming a
function that takes the parsed namespace and returns an exit status.  Speed is reported,
never asserted.
"""

from __future__ import annotations

import argparse
import importlib

from stack.cli import one_line_errors

BENCH_MODULES = (
    "stack.bench.codec",
    "stack.bench.cli",
    "stack.bench.dissect",
    "stack.bench.goals",
    "stack.peers.perftest.cli",
)
"""The modules whose ``register_bench`` add the benchmarks and perftest-compatible peers."""


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "bench",
        help="run a benchmark (codec, write, read, send, atomic, server, idle-qps, ...)",
        description="Benchmarks of the stack; each prints a table of measured figures.",
    )
    one_line_errors(parser)
    sub = parser.add_subparsers(dest="benchmark", metavar="BENCHMARK")
    sub.required = True
    for name in BENCH_MODULES:
        importlib.import_module(name).register_bench(sub)
