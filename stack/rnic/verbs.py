"""Work requests, work completions and their enums, named as rdma-core / pyverbs users expect.

Mapping onto RDMAP (RFC 5040, RFC 7306):

* ``SEND`` / ``SEND`` + ``SOLICITED`` -> Send / Send with SE; ``SEND_WITH_INV`` -> Send with
  Invalidate (with ``SOLICITED``: Send with SE and Invalidate).
* ``RDMA_WRITE`` -> RDMA Write.  ``RDMA_WRITE_WITH_IMM`` -> RDMA Write followed by an
  Immediate Data message (RFC 7306 §6 and §7: the Immediate completes at the peer only after
  the Write has been placed, which is InfiniBand's Write-with-Immediate).  The peer consumes
  a receive WR and gets a ``RECV_RDMA_WITH_IMM`` completion carrying the 8 immediate bytes
  (``imm_data``; an ``int`` is sent as a big-endian 64-bit value).
* ``SEND_IMM`` -> Immediate Data alone (with ``SOLICITED``: Immediate Data with SE).
* ``RDMA_READ`` -> Read Request / Read Response, bounded by ORD.
* ``ATOMIC_FETCH_AND_ADD`` / ``ATOMIC_CMP_AND_SWP`` -> Atomic Request / Response (masked, RFC
  7306 §5); the original value lands in the local 8-byte SGE in little-endian host order.
* ``LOCAL_INV`` -> local invalidation of ``invalidate_rkey``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum, IntFlag

from stack.constants import ALL_ONES_64


class WrOpcode(Enum):
    SEND = "SEND"
    SEND_WITH_INV = "SEND_WITH_INV"
    SEND_IMM = "SEND_IMM"
    RDMA_WRITE = "RDMA_WRITE"
    RDMA_WRITE_WITH_IMM = "RDMA_WRITE_WITH_IMM"
    RDMA_READ = "RDMA_READ"
    ATOMIC_FETCH_AND_ADD = "ATOMIC_FETCH_AND_ADD"
    ATOMIC_CMP_AND_SWP = "ATOMIC_CMP_AND_SWP"
    LOCAL_INV = "LOCAL_INV"


class SendFlags(IntFlag):
    """``ibv_send_flags``."""

    NONE = 0
    FENCE = 0x1
    SIGNALED = 0x2
    SOLICITED = 0x4
    INLINE = 0x8


class WcStatus(Enum):
    """Work-completion status names of verbs (``IBV_WC_*``)."""

    SUCCESS = "success"
    LOC_LEN_ERR = "local length error"
    LOC_QP_OP_ERR = "local QP operation error"
    LOC_PROT_ERR = "local protection error"
    WR_FLUSH_ERR = "WR flushed"
    MW_BIND_ERR = "memory window bind error"
    BAD_RESP_ERR = "bad response error"
    LOC_ACCESS_ERR = "local access error"
    REM_INV_REQ_ERR = "remote invalid request error"
    REM_ACCESS_ERR = "remote access error"
    REM_OP_ERR = "remote operation error"
    FATAL_ERR = "fatal error"
    GENERAL_ERR = "general error"


class WcOpcode(Enum):
    SEND = "SEND"
    RDMA_WRITE = "RDMA_WRITE"
    RDMA_READ = "RDMA_READ"
    COMP_SWAP = "COMP_SWAP"
    FETCH_ADD = "FETCH_ADD"
    LOCAL_INV = "LOCAL_INV"
    RECV = "RECV"
    RECV_RDMA_WITH_IMM = "RECV_RDMA_WITH_IMM"


class WcFlags(IntFlag):
    NONE = 0
    WITH_IMM = 0x2
    WITH_INV = 0x4
    SOLICITED = 0x8


@dataclass(frozen=True, slots=True)
class Sge:
    """A scatter/gather element: ``length`` bytes at ``addr`` of the MR whose STag is ``lkey``.

    ``addr`` is in the MR's TO space (its VA for VA-based MRs, an offset for zero-based ones).
    """

    addr: int
    length: int
    lkey: int


@dataclass(frozen=True, slots=True)
class SendWR:
    """A send-queue work request (``ibv_send_wr``).

    Atomics (RFC 7306 §5.1): ``compare_add`` is the FetchAdd addend or the CmpSwap compare
    value, ``swap`` the CmpSwap swap value.  The masks make the masked forms explicit:
    ``compare_add_mask`` is the FetchAdd Add Mask (None: 0, a plain 64-bit add) or the
    CmpSwap Compare Mask (None: all ones, a plain compare; 0: compare nothing, so the swap
    always happens); ``swap_mask`` the CmpSwap Swap Mask (all ones: a plain swap).
    """

    wr_id: int = 0
    opcode: WrOpcode = WrOpcode.SEND
    sg_list: tuple[Sge, ...] = ()
    send_flags: SendFlags = SendFlags.SIGNALED
    inline_data: bytes | None = None
    remote_addr: int = 0
    rkey: int = 0
    imm_data: int | bytes | None = None
    invalidate_rkey: int = 0
    compare_add: int = 0
    swap: int = 0
    compare_add_mask: int | None = None
    swap_mask: int = ALL_ONES_64


@dataclass(frozen=True, slots=True)
class RecvWR:
    """A receive-queue work request (``ibv_recv_wr``)."""

    wr_id: int = 0
    sg_list: tuple[Sge, ...] = ()


@dataclass(frozen=True, slots=True)
class WorkCompletion:
    """A completion (``ibv_wc``).  ``imm_data`` holds the 8 Immediate Data bytes."""

    wr_id: int
    status: WcStatus
    opcode: WcOpcode
    qp_num: int
    byte_len: int = 0
    imm_data: bytes | None = None
    invalidated_rkey: int | None = None
    wc_flags: WcFlags = WcFlags.NONE
    vendor_err: str = ""
    extra: dict[str, object] = field(default_factory=dict, compare=False)
