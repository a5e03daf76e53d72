"""One connection of the software KBTP target, and the sizes it is built with
(docs/kbtp.md §9.2)."""

from __future__ import annotations

from dataclasses import dataclass, field

from kbtp.constants import HELLO_FIXED_LEN, MAX_IDENTITY_LEN, MAX_REQUEST_FIXED_LEN
from kbtp.target_actions import CloseSession
from kbtp.target_config import TargetConfig, plan_target_layout
from kbtp.target_offload import StoreMarks
from kbtp.target_offload_alloc import AllocLog
from kbtp.target_offload_credits import CreditCount
from stack.rnic import (
    CompletionQueue,
    MemoryRegion,
    ProtectionDomain,
    QueuePair,
    RecvWR,
    SendWR,
    Sge,
)
from stack.transport.driver import RdmaConnection

__all__ = ["TargetSession", "layout_size", "receive_buffer_size"]


def layout_size(config: TargetConfig) -> int:
    """Octets of target memory ``config`` needs (the size does not depend on base_to)."""
    return plan_target_layout(config).size


def receive_buffer_size(config: TargetConfig) -> int:
    """A target receive buffer: the longest request (56 + Max Inline) or HELLO (§4.1, §9.2)."""
    return max(MAX_REQUEST_FIXED_LEN + config.max_inline, HELLO_FIXED_LEN + MAX_IDENTITY_LEN)


@dataclass(eq=False)
class TargetSession:
    """One connection of the target.  Fields: sid, pd (the session's own protection domain:
    its QP and every STag it is given, SEC-03), local_mr (the target buffer registered in
    that PD, for the SGEs of its Writes and Reads), qp, cq, peer (address), conn, identity
    (after HELLO), regions (the driver's own MRs of the session, deregistered when it
    ends), close (the CloseSession waiting for its last Send), reason (why it ended)."""

    sid: int
    pd: ProtectionDomain
    local_mr: MemoryRegion
    qp: QueuePair
    cq: CompletionQueue
    peer: tuple[str, int]
    recv_mr: MemoryRegion
    recv_size: int
    marker_mr: MemoryRegion
    conn: RdmaConnection | None = None
    identity: bytes | None = None
    regions: list[MemoryRegion] = field(default_factory=list)
    close: CloseSession | None = None
    reason: str = ""
    messages: int = 0
    outbox: list[SendWR] = field(default_factory=list)
    """Work requests of the drain being applied, posted as one post list at its end."""
    reposts: list[RecvWR] = field(default_factory=list)
    recv_wrs: list[RecvWR] = field(default_factory=list)
    """Receives of the drain being applied, reposted before its outbox is posted."""
    chained: bool = False  # the session's chain is posted (offload, docs/kbtp.md §8)
    chain_runs: int = 0  # requests the RNIC answered, as of the last tick
    alloc_log: AllocLog | None = None  # the chain's ALLOC_STOREs for the core (§8.1)
    credits: CreditCount | None = None  # the chain's runs against the credits (§8.1)
    marks: StoreMarks | None = None  # handles whose offloaded STORE is mid-Read (§8.1)

    def recv_wr(self, slot: int) -> RecvWR:
        """The receive of buffer ``slot`` (built once: reposting it reuses it)."""
        while len(self.recv_wrs) <= slot:
            addr = self.recv_mr.base + len(self.recv_wrs) * self.recv_size
            wr = RecvWR(len(self.recv_wrs), (Sge(addr, self.recv_size, self.recv_mr.lkey),))
            self.recv_wrs.append(wr)
        return self.recv_wrs[slot]
