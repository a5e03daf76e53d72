"""This process as the benchmarks see it: resident memory, descriptor limit, where its code is."""

from __future__ import annotations

import os
import resource

PROJECT_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
"""The directory holding this ``stack`` package (and its ``kbtp``): a checkout or
site-packages; what a benchmark's child process puts first on its path to run this code."""


def rss_bytes() -> int:
    """This process's resident set size (Linux /proc; ru_maxrss elsewhere)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def raise_nofile(wanted: int) -> int:
    """Raise RLIMIT_NOFILE's soft limit towards ``wanted`` (up to the hard limit)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):
            pass
    return soft if soft != resource.RLIM_INFINITY else wanted


def usable_cpus() -> list[int]:
    """The CPUs this process may run on (its affinity mask; every CPU where there is none)."""
    getter = getattr(os, "sched_getaffinity", None)
    if getter is None:
        return list(range(os.cpu_count() or 1))
    return sorted(getter(0))


def cpu_list(text: str) -> tuple[int, ...]:
    """argparse type of ``--cpus``: one or two CPU numbers, comma separated, each below the
    machine's CPU count (``0,1``: the client on CPU 0, the server on 1; ``0``: both on 0).
    Whether this process may run there is learnt when it pins itself (:func:`pin_to`)."""
    import argparse  # here: this module is imported by every benchmark child

    words = text.split(",")
    if not 1 <= len(words) <= 2 or not all(w.strip().isdigit() for w in words):
        raise argparse.ArgumentTypeError(
            f"expected CPU or CLIENT,SERVER (CPU numbers, e.g. 0,1), got {text!r}"
        )
    cpus = tuple(int(w) for w in words)
    count = os.cpu_count() or 1
    for cpu in cpus:
        if cpu >= count:
            raise argparse.ArgumentTypeError(f"CPU {cpu}: this machine has CPUs 0 to {count - 1}")
    return cpus


def pin_to(cpu: int) -> None:
    """Run this process (every thread it starts from now on, and its children) on ``cpu``
    only (``--cpus``: where the two ends run decides what a round trip's wake-ups cost).
    Raises OSError with a clear message where that CPU is not allowed (a cpuset, or no
    ``sched_setaffinity`` on this system)."""
    setter = getattr(os, "sched_setaffinity", None)
    if setter is None:
        raise OSError("pinning to a CPU (--cpus) needs sched_setaffinity (Linux)")
    try:
        setter(0, {cpu})
    except OSError as exc:
        raise OSError(f"cannot run on CPU {cpu} (--cpus): {exc.strerror or exc}") from None
