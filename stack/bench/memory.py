"""Registered memory both benchmark halves use: access rights, polling for a landed Write.

A Write leaves no completion at its target, so Write latency is measured as perftest
measures it: each side watches the last byte of its region for the peer's ping or pong
(waking when the QP places a Write, where perftest spins).
"""

from __future__ import annotations

import mmap

import trio

from stack.bench.options import BenchError
from stack.rnic import Access, QpState, QueuePair
from stack.rnic.memory import MemoryRegion

REMOTE_ALL = Access.LOCAL_WRITE | Access.REMOTE_WRITE | Access.REMOTE_READ | Access.REMOTE_ATOMIC
WAKE_SECONDS = 0.05
"""The longest a Write-latency waiter sleeps before it looks at the memory and the QP."""
LIVE = (QpState.IDLE, QpState.RTS)
"""QP states of a usable connection (IDLE until the driver's first run step)."""


def zeroed(size: int, *, sent: bool = False) -> mmap.mmap | bytearray:
    """``size`` zero bytes in an anonymous mapping.  A region that only receives gets its
    pages from the kernel as they are first written: a gigabyte costs no time to make and no
    memory until data lands.  One the run sends from (``sent``: a Write or Send source, a
    Read's target) has them all made at once (``MAP_POPULATE``, in the kernel, without the
    GIL): untouched, every page would be the kernel's one shared zero page, and the stack's
    CRC and copies would read 4 KiB of cache where the baselines read real memory."""
    if not size:
        return bytearray()
    populate = getattr(mmap, "MAP_POPULATE", 0) if sent else 0
    buf = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | populate)
    if sent and not populate:  # no MAP_POPULATE here: write a zero into every page
        buf[:: mmap.PAGESIZE] = bytes(-(-size // mmap.PAGESIZE))
    return buf


async def wait_for_byte(buf: memoryview, index: int, value: int, qp: QueuePair) -> None:
    """Wait until ``buf[index] == value`` (a Write has landed).

    perftest spins on the memory; here the wait sleeps until the QP reports a Write
    segment placed (``QueuePair.on_remote_write``), so ``--cpu`` counts the stack's work,
    not the spinning.  Looks again every WAKE_SECONDS whatever happens; raises BenchError
    when the QP leaves RTS.
    """
    while buf[index] != value:
        if qp.state not in LIVE:
            raise BenchError(f"QP went to {qp.state.value} during Write ping-pong")
        landed = trio.Event()
        qp.on_remote_write = landed.set
        try:  # no checkpoint since the look above: nothing can have landed in between
            with trio.move_on_after(WAKE_SECONDS):
                await landed.wait()
        finally:
            qp.on_remote_write = None


def dereg(mr: MemoryRegion) -> None:
    """Deregister ``mr``, or leave it to the garbage collector while a message views it."""
    try:
        mr.dereg()
    except BufferError:  # a queued message still views it; the GC frees it later
        pass
