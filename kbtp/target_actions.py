"""What the KBTP target core asks its binding to do (docs/kbtp.md §3.6, §6, §9).

:class:`~kbtp.target_core.TargetCore` does no I/O: its methods return a list of these
actions, which the binding (:mod:`kbtp.target` for the software RNIC) carries out in order.
Actions with an ``op_id`` are reported back: ``rdma_completed(op_id, now)`` or
``rdma_failed(op_id, now)`` for RDMA Writes, Reads and invalidations,
``memory_registered(op_id, stag, now)`` (or ``rdma_failed``) for registrations.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from kbtp.constants import Status
from kbtp.messages import Completion, HelloAck
from stack.constants import TERM_RDMAP_OP_UNSPECIFIED, TermCode

__all__ = [
    "Action",
    "CloseSession",
    "DeregisterMemory",
    "InvalidateStag",
    "ReadFromInitiator",
    "RegionKind",
    "RegisterMemory",
    "SendMessage",
    "WriteToInitiator",
]


class RegionKind(Enum):
    """Memory regions the core asks the binding to register (docs/kbtp.md §3.6)."""

    TABLE = "table"  # remote read (DIRECT_LOAD)
    POOL = "pool"  # remote read (DIRECT_LOAD)
    RING = "ring"  # remote read: one partition ring's slots
    HEAD = "head"  # remote atomic: that ring's Head, and nothing else (docs/kbtp.md §3.6)
    PARTITION = "partition"  # remote write: one partition's blocks


@dataclass(frozen=True, slots=True)
class SendMessage:
    """Send ``message`` (Send, or Send with Invalidate of ``invalidate_stag``)."""

    session: int
    message: HelloAck | Completion
    invalidate_stag: int | None = None

    def encode(self) -> bytes:
        return self.message.encode()


@dataclass(frozen=True, slots=True)
class WriteToInitiator:
    """RDMA Write ``length`` octets at target Tagged Offset ``local_to`` to the initiator."""

    op_id: int
    session: int
    local_to: int
    length: int
    remote_stag: int
    remote_to: int


@dataclass(frozen=True, slots=True)
class ReadFromInitiator:
    """RDMA Read ``length`` octets of the initiator's buffer into target TO ``local_to``."""

    op_id: int
    session: int
    remote_stag: int
    remote_to: int
    length: int
    local_to: int


@dataclass(frozen=True, slots=True)
class InvalidateStag:
    """Invalidate a local STag (Partition or Ring STag); report completion like an RDMA op."""

    op_id: int
    session: int
    stag: int


@dataclass(frozen=True, slots=True)
class RegisterMemory:
    """Register ``length`` octets of target memory at byte ``offset`` as a ``kind`` region
    for ``session`` only (its protection domain, SEC-03), with the access of docs/kbtp.md
    §3.6 and Tagged Offsets ``base_to + offset`` on; report its STag with
    ``memory_registered`` (a failure with ``rdma_failed``)."""

    op_id: int
    session: int
    kind: RegionKind
    offset: int
    length: int


@dataclass(frozen=True, slots=True)
class DeregisterMemory:
    """Deregister ``stag``, which a :class:`RegisterMemory` of ``session`` created; the
    session's connection is gone (or the STag was never exposed)."""

    session: int
    stag: int


@dataclass(frozen=True, slots=True)
class CloseSession:
    """Close the stream (Terminate ``term``, then TCP close) after the preceding Sends."""

    session: int
    status: Status
    reason: str
    term: TermCode = TERM_RDMAP_OP_UNSPECIFIED


Action = (
    SendMessage
    | WriteToInitiator
    | ReadFromInitiator
    | InvalidateStag
    | RegisterMemory
    | DeregisterMemory
    | CloseSession
)
