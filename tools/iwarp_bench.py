"""``iwarp bench``: benchmarks, one sub-subcommand each (``iwarp bench codec``, ...).

Benchmarks are discovered, not listed (as :mod:`tools.cli` does for subcommands): a module
``tools/bench_<name>.py`` that defines ``register_bench(subparsers)`` adds its own
sub-subcommand(s), e.g. ``iwarp bench write``.  ``register_bench`` must add a parser and
``set_defaults(func=...)`` with a function taking the parsed namespace and returning an
exit status.  Speed is reported, never asserted.
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil

import tools

BENCH_PREFIX = "bench_"


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "bench",
        help="run a benchmark (codec, write, read, send, atomic, server, idle-qps, ...)",
        description="Benchmarks of the stack; each prints a table of measured figures.",
    )
    sub = parser.add_subparsers(dest="benchmark", metavar="BENCHMARK")
    sub.required = True
    for info in sorted(pkgutil.iter_modules(tools.__path__), key=lambda m: m.name):
        if info.name.startswith(BENCH_PREFIX):
            module = importlib.import_module(f"tools.{info.name}")
            register_bench = getattr(module, "register_bench", None)
            if register_bench is not None:
                register_bench(sub)
