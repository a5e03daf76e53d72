"""CPU time of both ends of a ``kbtp bench`` measurement: this process and its peer's.

The peer's comes from ``/proc`` (:func:`process_cpu_seconds`); a peer in this process, or
one whose CPU cannot be read, adds nothing (:func:`no_peer`).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

CpuClock = Callable[[], float | None]
"""CPU seconds of the other process (None: one process, or not measurable)."""


def no_peer() -> float | None:
    """The :data:`CpuClock` of a peer in this process: nothing to add."""
    return None


def process_cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds of process ``pid`` (Linux ``/proc``; None elsewhere)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class BothEndsCpu:
    """CPU seconds spent since creation by this process plus the peer (when measurable)."""

    def __init__(self, peer: CpuClock = no_peer) -> None:
        self._peer = peer
        self._start = time.process_time()
        self._peer_start = peer()
        self.peer: float | None = None
        """The peer's part of the last :meth:`seconds` (None: none measured)."""

    def seconds(self) -> float:
        """Both ends' CPU seconds so far; the peer's part is kept in :attr:`peer`."""
        cpu = time.process_time() - self._start
        peer_now = self._peer()
        self.peer = None
        if self._peer_start is not None and peer_now is not None:
            self.peer = peer_now - self._peer_start
            cpu += self.peer
        return cpu
