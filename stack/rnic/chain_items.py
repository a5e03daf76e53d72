"""The items of a work-request chain (stack.rnic.chains): WAITs, branches, guards, patches.

A verbs extension, not in RFC 5040 or libibverbs; the semantics are in
:mod:`stack.rnic.chains`.  These are plain values, checked when the chain is posted.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING, Literal

from stack.constants import ALL_ONES_64
from stack.rnic.verbs import SendWR

if TYPE_CHECKING:
    from stack.rnic.cq import CompletionQueue

__all__ = [
    "RECV",
    "RECV_LEN",
    "RUN",
    "RUN_SCRATCH",
    "Branch",
    "Chain",
    "ChainItem",
    "Check",
    "Cmp",
    "Guard",
    "LocalAtomic",
    "LocalWrite",
    "Patch",
    "PatchField",
    "Ref",
    "WaitCq",
    "WaitRecv",
]

RECV = -1
""":attr:`Ref.lkey` of the triggering receive: ``addr`` is an octet offset in its message."""
RECV_LEN = -2
""":attr:`Ref.lkey` of the triggering receive's length (``byte_len``; addr, width unused)."""
RUN = -3
""":attr:`Ref.lkey` of the run's own scratch octets (:data:`RUN_SCRATCH` of them, zero when
the chain triggers): private to one run, so runs in flight at once do not share them."""
RUN_SCRATCH = 64


@dataclass(frozen=True, slots=True)
class Ref:
    """``width`` octets at ``addr`` of the MR ``lkey`` (or :data:`RECV`), read at execution
    time; with ``index`` the address is ``addr + scale * value(index)`` mod 2^64."""

    lkey: int
    addr: int = 0
    width: int = 8
    byteorder: Literal["big", "little"] = "big"
    index: Ref | None = None
    scale: int = 1

    @classmethod
    def recv(cls, offset: int, width: int, byteorder: Literal["big", "little"] = "big") -> Ref:
        """Octets ``offset``.. of the received message."""
        return cls(RECV, offset, width, byteorder)

    @classmethod
    def recv_len(cls) -> Ref:
        """The received message's length."""
        return cls(RECV_LEN, 0, 4)

    @classmethod
    def run(cls, offset: int, width: int = 8, byteorder: Literal["big", "little"] = "big") -> Ref:
        """Octets ``offset``.. of the run's scratch (written by LocalWrite, LocalAtomic)."""
        return cls(RUN, offset, width, byteorder)

    def uses_recv(self) -> bool:
        return self.lkey in (RECV, RECV_LEN) or (self.index is not None and self.index.uses_recv())


class PatchField(Enum):
    """The fields a :class:`Patch` may set (octets of the value, or raw octets)."""

    REMOTE_ADDR = "remote_addr"
    RKEY = "rkey"
    SGE_ADDR = "sge_addr"
    SGE_LENGTH = "sge_length"
    COMPARE_ADD = "compare_add"
    SWAP = "swap"
    INVALIDATE_RKEY = "invalidate_rkey"
    PAYLOAD = "payload"


@dataclass(frozen=True, slots=True)
class Patch:
    """Set ``field`` of WR ``wr`` (its index in the branch) to ``value(src) + add`` (mod the
    field's width); SGE fields name SGE ``at``; PAYLOAD copies ``src.width`` octets into the
    WR's inline data at octet ``at``."""

    wr: int
    field: PatchField
    src: Ref
    add: int = 0
    at: int = 0


class Cmp(Enum):
    """How a :class:`Guard` compares (unsigned, after the mask)."""

    EQ = "=="
    NE = "!="
    LE = "<="
    LT = "<"
    GE = ">="
    ZERO_OR_EQ = "0 or =="
    """The left value is zero or equals the right one."""


@dataclass(frozen=True, slots=True)
class Guard:
    """``left & mask`` compared with ``right`` (a constant, or a Ref's value ``& mask``)."""

    left: Ref
    cmp: Cmp
    right: Ref | int
    mask: int = ALL_ONES_64


@dataclass(frozen=True, slots=True)
class LocalWrite:
    """A chain item that writes ``dst.width`` octets into registered memory at ``dst`` (an
    lkey with LOCAL_WRITE, checked like a local SGE): ``src``'s octets (a Ref of the same
    width; with ``add``, its value + ``add`` modulo 2^(8 width), at most 8 octets) or
    constant bytes.  It runs once every earlier WR of its branch has completed (a Read's
    data is placed), and later WRs start after it."""

    dst: Ref
    src: Ref | bytes
    add: int = 0


@dataclass(frozen=True, slots=True)
class LocalAtomic:
    """A chain item that runs an RFC 7306 atomic on the 8 aligned octets at ``dst`` (an lkey
    with LOCAL_WRITE, checked like a local SGE) through the RNIC's atomic engine (EXT-05,
    EXT-07): a FetchAdd of ``add`` under Add Mask ``mask``, or with ``swap`` a CmpSwap
    comparing with ``add``.  The original value goes, 8 octets in ``result.byteorder``, to
    ``result`` (registered memory with LOCAL_WRITE), where later Refs read it.  It runs
    like a :class:`LocalWrite`: after the earlier WRs of its branch completed.

    ``deferred``: reaching it only hands it to the chain queue, which runs it once every
    receive that had arrived when the run's latest WR left has been *examined* (triggered
    a run, or fell back and was ENABLEd again); the run does not wait for it.  A credit
    returned this way still counts for the requests that arrived before the answer that
    returns it (see :mod:`stack.rnic.chains`)."""

    dst: Ref
    result: Ref
    add: int
    mask: int = 0
    swap: int | None = None
    deferred: bool = False


@dataclass(frozen=True, slots=True)
class Check:
    """A chain item that evaluates ``guards`` when it is reached (after the earlier WRs of
    its branch completed, e.g. on a :class:`LocalAtomic`'s result).  If one fails the chain
    *stops*: it falls back as if no branch had held, except that what ran before it stays
    done (see :mod:`stack.rnic.chains`)."""

    guards: tuple[Guard, ...]


ChainItem = SendWR | LocalWrite | LocalAtomic | Check
"""What a :class:`Branch` runs, in order."""


@dataclass(frozen=True, slots=True)
class Branch:
    """Work requests and local items a chain runs when every guard holds, with their
    patches (``Patch.wr`` indexes ``wrs``)."""

    wrs: tuple[ChainItem, ...]
    patches: tuple[Patch, ...] = ()
    guards: tuple[Guard, ...] = ()


@dataclass(frozen=True, slots=True)
class WaitRecv:
    """WAIT for the QP's next receive completion."""


@dataclass(frozen=True, slots=True)
class WaitCq:
    """WAIT until ``cq`` has had ``count`` completions pushed (:attr:`CompletionQueue.total`)."""

    cq: CompletionQueue
    count: int


@dataclass(frozen=True, slots=True)
class Chain:
    """A chain of the chain queue (see the module docstring); ``signaled``: a CHAIN
    completion with ``wr_id`` when it has run (``extra['branch']``: which branch) or fell
    back (``extra['branch']`` None)."""

    wr_id: int
    wait: WaitRecv | WaitCq
    branches: tuple[Branch, ...]
    rearm: bool = False
    held: bool = False
    signaled: bool = False
    key: Ref | None = None
    """With a key (a Ref read when the chain triggers), the chain may trigger while runs
    of earlier chains are in flight, unless one of them has the same key value or none;
    without, it waits until every earlier run has completed."""
