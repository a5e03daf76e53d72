"""The project's commands as an installed wheel runs them (outside the checkout), and the
CPUs a test may place them on (``--cpus``)."""

from __future__ import annotations

import os
import subprocess
import sys

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
