"""Registered memory both benchmark halves use: access rights, polling for a landed Write.

A Write leaves no completion at its target, so Write latency is measured as perftest
measures it: each side polls the last byte of its region for the peer's ping or pong.
"""

from __future__ import annotations

import time

import trio

from stack.bench.options import BenchError
from stack.rnic import Access, QpState, QueuePair
from stack.rnic.memory import MemoryRegion

REMOTE_ALL = Access.LOCAL_WRITE | Access.REMOTE_WRITE | Access.REMOTE_READ | Access.REMOTE_ATOMIC
SPIN_SECONDS = 200e-6
BACKOFF_SECONDS = 20e-6
LIVE = (QpState.IDLE, QpState.RTS)
"""QP states of a usable connection (IDLE until the driver's first run step)."""


async def wait_for_byte(buf: memoryview, index: int, value: int, qp: QueuePair) -> None:
    """Poll registered memory until ``buf[index] == value`` (a Write has landed).

    Busy-polls (a trio checkpoint per look, as perftest spins on memory) for SPIN_SECONDS,
    then looks every BACKOFF_SECONDS so an idle or starved process gives its CPU away.
    Raises BenchError when the QP leaves RTS.
    """
    spin_until = time.perf_counter() + SPIN_SECONDS
    while buf[index] != value:
        if qp.state not in LIVE:
            raise BenchError(f"QP went to {qp.state.value} during Write ping-pong")
        await trio.sleep(0 if time.perf_counter() < spin_until else BACKOFF_SECONDS)


def dereg(mr: MemoryRegion) -> None:
    """Deregister ``mr``, or leave it to the garbage collector while a message views it."""
    try:
        mr.dereg()
    except BufferError:  # a queued message still views it; the GC frees it later
        pass
