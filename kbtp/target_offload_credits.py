"""Request Credits on the offloaded target: the chains count what the core cannot see (§9.2).

The core answers CREDIT_EXCEEDED to a request that arrives while Request Credits requests
are outstanding (docs/kbtp.md §9.2), but it sees only the requests that fall back.  So
every branch of the session chain (kbtp.target_offload) is wrapped by :meth:`CreditCount.wrap`:
a guard that the session's outstanding requests leave room, a FetchAdd of +1 on the
count of the chain's runs in flight when it starts and of -1 once its COMPLETION has been
handed to the transport.  A request that finds no room falls back through
:meth:`CreditCount.over_branch`, which notes it; the binding then has the core count the
request as over its credits (``TargetCore.offloaded_requests``), so it is answered
CREDIT_EXCEEDED as on the software target.  For every other fallback the core counts the
runs in flight with its own.  The room is published by the binding after every core call:
Request Credits minus the requests the core holds (docs/kbtp.md §8.1).
"""

from __future__ import annotations

import dataclasses

from kbtp.target_offload import shifted
from stack.constants import ALL_ONES_64
from stack.rnic import (
    Branch,
    Check,
    Cmp,
    Guard,
    LocalAtomic,
    LocalWrite,
    MemoryRegion,
    Ref,
)

__all__ = ["CreditCount"]

_RUNS = 0  # the chain's runs in flight (little-endian, the atomic engine's)
_ROOM = 8  # credits left to the chain, published by the binding (big-endian)
_OVER = 16  # not 0: the request falling back found no room
_RESULT = Ref.run(56)  # the run's own: the FetchAdds' results (unused)
_NEVER = Guard(Ref.run(56), Cmp.LT, 0)  # unsigned < 0: a Check that always stops


class CreditCount:
    """The registered counters of one session's chain (:attr:`SIZE` octets of ``mr``)."""

    SIZE = 24

    def __init__(self, mr: MemoryRegion) -> None:
        if mr.length < self.SIZE:
            raise ValueError(f"a credit count needs {self.SIZE} octets")
        self.mr = mr
        self._runs = self._ref(_RUNS, "little")
        self._room = self._ref(_ROOM, "big")

    def _ref(self, at: int, byteorder: str) -> Ref:
        return Ref(self.mr.lkey, self.mr.base + at, 8, byteorder)  # type: ignore[arg-type]

    def _octets(self, at: int, byteorder: str) -> int:
        buf = self.mr.view(self.mr.base + at, 8)
        return int.from_bytes(buf, byteorder)  # type: ignore[arg-type]

    def wrap(self, branch: Branch) -> Branch:
        """``branch`` counted: only with room, its run counted in flight until its last
        item (the COMPLETION Send) has completed."""
        start = LocalAtomic(self._runs, _RESULT, 1)
        end = LocalAtomic(self._runs, _RESULT, ALL_ONES_64)  # -1 modulo 2^64
        return dataclasses.replace(
            branch,
            wrs=(start, *branch.wrs, end),
            patches=tuple(shifted(list(branch.patches), 1)),
            guards=(*branch.guards, Guard(self._runs, Cmp.LT, self._room)),
        )

    def over_branch(self) -> Branch:
        """The last branch: no room, so the request is noted and falls back."""
        note = LocalWrite(self._ref(_OVER, "big"), (1).to_bytes(8, "big"))
        return Branch((note, Check((_NEVER,))), (), (Guard(self._runs, Cmp.GE, self._room),))

    def publish(self, room: int) -> None:
        """The credits the core leaves to the chain (Request Credits minus its own)."""
        self.mr.view(self.mr.base + _ROOM, 8)[:] = max(0, room).to_bytes(8, "big")

    def take(self) -> tuple[int, bool]:
        """(runs in flight, whether the request that fell back found no room); the note
        is cleared."""
        over = self._octets(_OVER, "big") != 0
        self.mr.view(self.mr.base + _OVER, 8)[:] = bytes(8)
        return self._octets(_RUNS, "little"), over
