"""The project's commands as an installed wheel runs them (outside the checkout), and the
CPUs a test may place them on (``--cpus``)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

TWO_CPUS = len(os.sched_getaffinity(0)) >= 2 if hasattr(os, "sched_getaffinity") else False
needs_two_cpus = pytest.mark.skipif(not TWO_CPUS, reason="needs two CPUs to place two ends apart")


def run_command(package: str, *argv: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """``python -m PACKAGE ARGV...`` (``stack``: the ``iwarp`` command, ``kbtp``: ``kbtp``)
    from ``/``, so the installed package runs, not the checkout's files; output as text."""
    return subprocess.run(
        [sys.executable, "-m", package, *argv],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd="/",
    )


def two_cpus() -> tuple[int, int]:
    """The first two CPUs this process may run on (with :data:`needs_two_cpus`)."""
    first, second = sorted(os.sched_getaffinity(0))[:2]
    return first, second


@contextmanager
def started_target(*argv: str) -> Iterator[int]:
    """``kbtp target -p 0 ARGV...`` as installed, in a process of its own, until the block
    ends: its port (from the line it prints once it listens)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "kbtp", "target", "-p", "0", *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd="/",
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert "listening on" in line, line
        yield int(line.rsplit(":", 1)[1])
    finally:
        proc.terminate()
        proc.wait(timeout=30)
