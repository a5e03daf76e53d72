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
* ``LOCAL_INV`` -> local invalidation of ``invalidate_rkey`` (SEC-06).
* ``RDMA_READ_WITH_INV`` -> an RDMA Read whose sink STag (the SGE's ``lkey``) is invalidated
  locally when the Read completes (verbs' ``IB_WR_RDMA_READ_WITH_INV``; RFC 5040 has no such
  message, the invalidation is the local RNIC's).
* ``BIND_MW`` -> bind a memory window (``bind_mw``: :class:`BindMw`); ``REG_MR`` -> fast
  registration of an MR from ``alloc_mr`` (``reg_mr``: :class:`RegMr`).  Both are local
  (SEC-05), see :mod:`stack.rnic.windows`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum, IntEnum, IntFlag
from typing import TYPE_CHECKING, Any

from stack.constants import ALL_ONES_64
from stack.fastinit import slot_init

if TYPE_CHECKING:
    from stack.rnic.memory import Access, MemoryRegion
    from stack.rnic.windows import MemoryWindow


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
    RDMA_READ_WITH_INV = "RDMA_READ_WITH_INV"
    BIND_MW = "BIND_MW"
    REG_MR = "REG_MR"


class SendFlags(IntFlag):
    """``ibv_send_flags``."""

    NONE = 0
    FENCE = 0x1
    SIGNALED = 0x2
    SOLICITED = 0x4
    INLINE = 0x8


class WcStatus(IntEnum):
    """Work-completion status, with rdma-core's ``enum ibv_wc_status`` values (``IBV_WC_*``);
    :attr:`text` is what ``ibv_wc_status_str`` prints for it.  A ``GENERAL_ERR`` is 21, the
    "cq completion failed status 21" rping prints on siw."""

    SUCCESS = 0
    LOC_LEN_ERR = 1
    LOC_QP_OP_ERR = 2
    LOC_EEC_OP_ERR = 3
    LOC_PROT_ERR = 4
    WR_FLUSH_ERR = 5
    MW_BIND_ERR = 6
    BAD_RESP_ERR = 7
    LOC_ACCESS_ERR = 8
    REM_INV_REQ_ERR = 9
    REM_ACCESS_ERR = 10
    REM_OP_ERR = 11
    RETRY_EXC_ERR = 12
    RNR_RETRY_EXC_ERR = 13
    LOC_RDD_VIOL_ERR = 14
    REM_INV_RD_REQ_ERR = 15
    REM_ABORT_ERR = 16
    INV_EECN_ERR = 17
    INV_EEC_STATE_ERR = 18
    FATAL_ERR = 19
    RESP_TIMEOUT_ERR = 20
    GENERAL_ERR = 21

    @property
    def text(self) -> str:
        """``ibv_wc_status_str``'s text for this status."""
        return WC_STATUS_TEXT[self]

    def __str__(self) -> str:
        return self.text


WC_STATUS_TEXT: dict[WcStatus, str] = {
    WcStatus.SUCCESS: "success",
    WcStatus.LOC_LEN_ERR: "local length error",
    WcStatus.LOC_QP_OP_ERR: "local QP operation error",
    WcStatus.LOC_EEC_OP_ERR: "local EE context operation error",
    WcStatus.LOC_PROT_ERR: "local protection error",
    WcStatus.WR_FLUSH_ERR: "Work Request Flushed Error",
    WcStatus.MW_BIND_ERR: "memory management operation error",
    WcStatus.BAD_RESP_ERR: "bad response error",
    WcStatus.LOC_ACCESS_ERR: "local access error",
    WcStatus.REM_INV_REQ_ERR: "remote invalid request error",
    WcStatus.REM_ACCESS_ERR: "remote access error",
    WcStatus.REM_OP_ERR: "remote operation error",
    WcStatus.RETRY_EXC_ERR: "transport retry counter exceeded",
    WcStatus.RNR_RETRY_EXC_ERR: "RNR retry counter exceeded",
    WcStatus.LOC_RDD_VIOL_ERR: "local RDD violation error",
    WcStatus.REM_INV_RD_REQ_ERR: "remote invalid RD request",
    WcStatus.REM_ABORT_ERR: "aborted error",
    WcStatus.INV_EECN_ERR: "invalid EE context number",
    WcStatus.INV_EEC_STATE_ERR: "invalid EE context state",
    WcStatus.FATAL_ERR: "fatal error",
    WcStatus.RESP_TIMEOUT_ERR: "response timeout error",
    WcStatus.GENERAL_ERR: "general error",
}
"""``ibv_wc_status_str`` of rdma-core's libibverbs, text for text."""


def wc_status_str(status: WcStatus | int) -> str:
    """``ibv_wc_status_str``: the text of a status (``"unknown"`` for a value it lacks)."""
    try:
        return WC_STATUS_TEXT[WcStatus(status)]
    except ValueError:
        return "unknown"


class WcOpcode(IntEnum):
    """Work-completion opcode, with rdma-core's ``enum ibv_wc_opcode`` values; receive
    completions have bit 7 set (``IBV_WC_RECV``).  ``REG_MR`` (10) is the kernel's
    ``IB_WC_REG_MR`` (libibverbs has no fast registration); ``CHAIN`` is this stack's."""

    SEND = 0
    RDMA_WRITE = 1
    RDMA_READ = 2
    COMP_SWAP = 3
    FETCH_ADD = 4
    BIND_MW = 5
    LOCAL_INV = 6
    REG_MR = 10
    CHAIN = 0x40
    """A chain of :mod:`stack.rnic.chains` (this stack's own verbs extension)."""
    RECV = 1 << 7
    RECV_RDMA_WITH_IMM = (1 << 7) + 1

    def __str__(self) -> str:
        return self.name


class WcFlags(IntFlag):
    """Completion flags with rdma-core's ``enum ibv_wc_flags`` values (``IBV_WC_WITH_IMM``,
    ``IBV_WC_WITH_INV``: the Send carried an Invalidate, RDMAP-09).  ``SOLICITED`` (the
    message had the SE bit) is this stack's own, on a bit libibverbs does not use."""

    NONE = 0
    WITH_IMM = 0x2
    WITH_INV = 0x8
    SOLICITED = 0x100


@dataclass(frozen=True, slots=True)
class Sge:
    """A scatter/gather element: ``length`` bytes at ``addr`` of the MR whose STag is ``lkey``.

    ``addr`` is in the MR's TO space (its VA for VA-based MRs, an offset for zero-based ones).
    """

    addr: int
    length: int
    lkey: int


@dataclass(frozen=True, slots=True)
class MwBindInfo:
    """What a memory window is bound to (``ibv_mw_bind_info``): ``length`` octets at ``addr``
    (in the MR's TO space) of ``mr``, with the remote rights ``mw_access_flags`` (a subset
    of the MR's; :attr:`Access.ZERO_BASED` makes the window's TOs start at 0).  A zero
    ``length`` unbinds."""

    mr: MemoryRegion
    addr: int
    length: int
    mw_access_flags: Access


@dataclass(frozen=True, slots=True)
class BindMw:
    """The ``bind_mw`` part of a ``BIND_MW`` work request: window, its new STag (``rkey``:
    same index, new key, e.g. :func:`~stack.rnic.windows.inc_rkey` of ``mw.rkey``) and what
    it is bound to."""

    mw: MemoryWindow
    rkey: int
    bind_info: MwBindInfo


@dataclass(frozen=True, slots=True)
class RegMr:
    """The fast registration of a ``REG_MR`` work request (the kernel's ``ib_reg_wr``):
    ``mr`` from ``pd.alloc_mr`` gets ``buffer`` (at most its ``max_len`` octets), ``access``
    and the STag ``key`` (same index, new key)."""

    mr: MemoryRegion
    buffer: Any
    access: Access
    key: int


@dataclass(frozen=True, slots=True)
class SendWR:
    """A send-queue work request (``ibv_send_wr``).

    Atomics (RFC 7306 §5.1): ``compare_add`` is the FetchAdd addend or the CmpSwap compare
    value, ``swap`` the CmpSwap swap value.  The masks make the masked forms explicit:
    ``compare_add_mask`` is the FetchAdd Add Mask (None: 0, a plain 64-bit add) or the
    CmpSwap Compare Mask (None: all ones, a plain compare; 0: compare nothing, so the swap
    always happens); ``swap_mask`` the CmpSwap Swap Mask (all ones: a plain swap).
    ``bind_mw`` is the ``BIND_MW`` request, ``reg_mr`` the ``REG_MR`` one.
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
    bind_mw: BindMw | None = None
    reg_mr: RegMr | None = None


@dataclass(frozen=True, slots=True)
class RecvWR:
    """A receive-queue work request (``ibv_recv_wr``)."""

    wr_id: int = 0
    sg_list: tuple[Sge, ...] = ()


@slot_init
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
