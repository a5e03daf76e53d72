"""Request Credits on the offloaded target: the chains count what the core cannot see (§9.2).

The core answers CREDIT_EXCEEDED to a request that arrives while Request Credits requests
are outstanding (docs/kbtp.md §9.2), but it sees only the requests that fall back.  So the
session keeps one count in registered memory, *out*: the requests the chain's runs hold,
and the answers sent (by a run or by the core) that the requests which arrived before
them have not all been examined yet.  Every branch of the session chain
(kbtp.target_offload) is wrapped by :meth:`CreditCount.wrap`: a guard that ``out`` leaves
room, an RNIC FetchAdd of +1 when it starts, and a *deferred* FetchAdd of -1 once its
COMPLETION has been handed to the transport, which the RNIC runs only after every request
that arrived before that point has been examined (:mod:`stack.rnic.chains`).  The core's
own answers count the same way (:meth:`CreditCount.answered`).  A request that finds no
room falls back, and the core decides with the same count
(``TargetCore.offloaded_requests``): CREDIT_EXCEEDED if its own requests and ``out`` reach
the credits, as on the software target.  The room is published by the binding after every
core call: Request Credits minus the requests the core holds (docs/kbtp.md §8.1).
"""

from __future__ import annotations

import dataclasses

from kbtp.target_offload import shifted
from stack.constants import ALL_ONES_64
from stack.rnic import (
    Branch,
    ChainItem,
    Check,
    Cmp,
    Guard,
    LocalAtomic,
    MemoryRegion,
    QueuePair,
    Ref,
    SendWR,
)

__all__ = ["CreditCount"]

_OUT = 0  # requests held by runs, and answers not yet credited (little-endian, the atomic engine's)
_ROOM = 8  # credits left to the chain, published by the binding (big-endian)
_RESULT = Ref.run(56)  # the run's own: the FetchAdds' results (unused)


def _after_checks(items: tuple[ChainItem, ...]) -> int:
    """Where a branch's +1 goes: after the Checks among its leading local items.  Those run
    in the same step as the guards, before any WR, so nothing else is examined between;
    and a Check that stops the run (it falls back) leaves nothing counted for it."""
    at = 0
    for i, item in enumerate(items):
        if isinstance(item, SendWR):
            break
        if isinstance(item, Check):
            at = i + 1
    return at


class CreditCount:
    """The registered counters of one session's chain (:attr:`SIZE` octets of ``mr``)."""

    SIZE = 24

    def __init__(self, mr: MemoryRegion) -> None:
        if mr.length < self.SIZE:
            raise ValueError(f"a credit count needs {self.SIZE} octets")
        self.mr = mr
        self._out = self._ref(_OUT, "little")
        self._room = self._ref(_ROOM, "big")
        self._return = LocalAtomic(self._out, self._ref(16, "little"), ALL_ONES_64, deferred=True)

    def _ref(self, at: int, byteorder: str) -> Ref:
        return Ref(self.mr.lkey, self.mr.base + at, 8, byteorder)  # type: ignore[arg-type]

    def wrap(self, branch: Branch) -> Branch:
        """``branch`` counted: only with room, its request held from its start and its
        credit returned (-1, deferred) once the requests that arrived before its COMPLETION
        was handed over have been examined."""
        start = LocalAtomic(self._out, _RESULT, 1)
        end = LocalAtomic(self._out, _RESULT, ALL_ONES_64, deferred=True)  # -1 modulo 2^64
        at = _after_checks(branch.wrs)
        wrs = (*branch.wrs[:at], start, *branch.wrs[at:], end)
        patches = [p for p in branch.patches if p.wr < at]
        patches += shifted([p for p in branch.patches if p.wr >= at], 1)
        return dataclasses.replace(
            branch,
            wrs=wrs,
            patches=tuple(patches),
            guards=(*branch.guards, Guard(self._out, Cmp.LT, self._room)),
        )

    def answered(self, qp: QueuePair) -> None:
        """The core answered a request of the session (its COMPLETION is posted on ``qp``):
        counted as the chain's answers are, +1 now and -1 deferred (no chain queue yet:
        nothing to count against)."""
        if qp.chains is None:
            return
        view = self.mr.view(self.mr.base + _OUT, 8)
        view[:] = ((int.from_bytes(view, "little") + 1) & ALL_ONES_64).to_bytes(8, "little")
        qp.post_deferred(self._return)

    def publish(self, room: int) -> None:
        """The credits the core leaves to the chain (Request Credits minus its own)."""
        self.mr.view(self.mr.base + _ROOM, 8)[:] = max(0, room).to_bytes(8, "big")

    def take(self) -> int:
        """``out``: what the core counts with its own for a request that fell back."""
        return int.from_bytes(self.mr.view(self.mr.base + _OUT, 8), "little")
