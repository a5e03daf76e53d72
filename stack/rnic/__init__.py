"""The software RNIC (floor 2): verbs objects over the sans-IO wire core.

``Rnic`` -> ``alloc_pd()`` -> ``pd.reg_mr(buffer, Access...)``; ``create_cq()``;
``create_qp(pd, cq)``; ``qp.post_send(SendWR(...))``, ``qp.post_recv(RecvWR(...))``;
completions by ``cq.poll()`` or ``await cq.next()``; asynchronous events (a QP terminated,
a CQ overflowed) by ``await rnic.get_async_event()`` or ``rnic.poll_async_event()``.
Memory windows (``pd.alloc_mw``, ``qp.bind_mw``, ``BIND_MW``) and fast registration
(``pd.alloc_mr``, ``REG_MR``): see :mod:`stack.rnic.windows`.  Chains (``qp.post_chain``:
WAIT, ENABLE, fields patched at execution time), this stack's verbs extension: see
:mod:`stack.rnic.chains`.
"""

from stack.rnic.chains import (
    RECV,
    RECV_LEN,
    RUN,
    RUN_SCRATCH,
    Branch,
    Chain,
    ChainItem,
    Check,
    Cmp,
    Guard,
    LocalAtomic,
    LocalWrite,
    Patch,
    PatchField,
    Ref,
    WaitCq,
    WaitRecv,
)
from stack.rnic.cq import CompletionQueue, CqOverflow
from stack.rnic.device import Rnic
from stack.rnic.events import AsyncEvent, AsyncEventQueue, AsyncEventType, event_type_for_cause
from stack.rnic.memory import Access, MemoryOpError, MemoryRegion, ProtectionDomain, StagTarget
from stack.rnic.qp import QpCap, QpState, QueuePair, SharedReceiveQueue
from stack.rnic.verbs import (
    WC_STATUS_TEXT,
    BindMw,
    MwBindInfo,
    RecvWR,
    RegMr,
    SendFlags,
    SendWR,
    Sge,
    WcFlags,
    WcOpcode,
    WcStatus,
    WorkCompletion,
    WrOpcode,
    wc_status_str,
)
from stack.rnic.windows import MemoryWindow, MwType, inc_rkey, reg_mr_wr

__all__ = [
    "Access",
    "AsyncEvent",
    "AsyncEventQueue",
    "AsyncEventType",
    "BindMw",
    "Branch",
    "Chain",
    "ChainItem",
    "Check",
    "Cmp",
    "CompletionQueue",
    "CqOverflow",
    "Guard",
    "LocalAtomic",
    "LocalWrite",
    "MemoryOpError",
    "MemoryRegion",
    "MemoryWindow",
    "MwBindInfo",
    "MwType",
    "Patch",
    "PatchField",
    "ProtectionDomain",
    "QpCap",
    "QpState",
    "QueuePair",
    "RECV",
    "RECV_LEN",
    "RUN",
    "RUN_SCRATCH",
    "RecvWR",
    "Ref",
    "RegMr",
    "Rnic",
    "SendFlags",
    "SendWR",
    "Sge",
    "SharedReceiveQueue",
    "StagTarget",
    "WaitCq",
    "WaitRecv",
    "WcFlags",
    "WC_STATUS_TEXT",
    "WcOpcode",
    "WcStatus",
    "inc_rkey",
    "reg_mr_wr",
    "wc_status_str",
    "WorkCompletion",
    "WrOpcode",
    "event_type_for_cause",
]
