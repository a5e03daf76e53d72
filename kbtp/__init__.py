"""KBTP, a KV-cache block transfer protocol over iWARP (docs/kbtp.md).

The names an application or a second implementation imports: the trio target and
initiator on the software RNIC (:class:`KbtpTarget`, :class:`KbtpInitiator`), their
configuration (:class:`TargetConfig`, :class:`InitiatorConfig`), the messages and their
codec (:mod:`kbtp.messages`), the sans-IO cores with their actions and events
(:class:`TargetCore`, :class:`InitiatorCore`), the wire constants and the errors.  Each is
imported from its module on first use, so ``import kbtp.messages`` stays light.

The application API (docs/kbtp.md §13): :class:`Arena` (memory registered once),
:class:`BlockRef` / :class:`BlockResult` and the batch calls (:func:`load_batch`,
:func:`store_batch`, :func:`free_batch`), :class:`KbtpClient` with its
:class:`BatchTicket` for threads, :class:`AsyncKbtpClient` for asyncio, and
:class:`TargetThread`, a target without a trio loop of the caller's.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kbtp.arena import Arena, ArenaError
    from kbtp.batch import BlockRef, BlockResult, free_batch, load_batch, store_batch
    from kbtp.client_async import AsyncKbtpClient
    from kbtp.client_sync import BatchTicket, KbtpClient
    from kbtp.constants import (
        Capability,
        CounterFormat,
        MessageOpcode,
        RequestFlag,
        Status,
        TableFlag,
    )
    from kbtp.initiator import KbtpInitiator, OpStats
    from kbtp.initiator_core import (
        AllocState,
        CompareSwapOp,
        DirectAlloc,
        DirectLoad,
        FetchAddOp,
        InitiatorCore,
        InitiatorEvent,
        ReadOp,
        RequestCompleted,
        SessionReady,
        SessionRefused,
        WriteOp,
    )
    from kbtp.initiator_errors import HelloRefused, HelloTimeout, KbtpStatusError, SessionClosed
    from kbtp.initiator_waiters import OnDone
    from kbtp.messages import (
        AllocStore,
        Bind,
        CommonHeader,
        Completion,
        CompletionDescriptor,
        CompletionRecord,
        DataDescriptor,
        Free,
        Hello,
        HelloAck,
        KbtpError,
        Load,
        Message,
        Request,
        Store,
        decode_message,
        encode_message,
        inline_descriptor,
        peek_header,
    )
    from kbtp.pool_file import PoolFile, PoolFileError
    from kbtp.pool_recovery import RecoveryReport, check_pool
    from kbtp.target import KbtpTarget
    from kbtp.target_actions import (
        Action,
        CloseSession,
        DeregisterMemory,
        InvalidateStag,
        ReadFromInitiator,
        RegionKind,
        RegisterMemory,
        SendMessage,
        WriteToInitiator,
    )
    from kbtp.target_config import InitiatorConfig, TargetConfig
    from kbtp.target_core import TargetCore
    from kbtp.target_thread import TargetThread

__all__ = [
    "Action",
    "AllocState",
    "AllocStore",
    "Arena",
    "ArenaError",
    "AsyncKbtpClient",
    "BatchTicket",
    "Bind",
    "BlockRef",
    "BlockResult",
    "Capability",
    "CloseSession",
    "CommonHeader",
    "CompareSwapOp",
    "CounterFormat",
    "Completion",
    "CompletionDescriptor",
    "CompletionRecord",
    "DataDescriptor",
    "DeregisterMemory",
    "DirectAlloc",
    "DirectLoad",
    "FetchAddOp",
    "Free",
    "Hello",
    "HelloAck",
    "HelloRefused",
    "HelloTimeout",
    "InitiatorConfig",
    "InitiatorCore",
    "InitiatorEvent",
    "InvalidateStag",
    "KbtpClient",
    "KbtpError",
    "KbtpInitiator",
    "KbtpStatusError",
    "KbtpTarget",
    "Load",
    "Message",
    "MessageOpcode",
    "OnDone",
    "OpStats",
    "PoolFile",
    "PoolFileError",
    "ReadFromInitiator",
    "ReadOp",
    "RecoveryReport",
    "RegionKind",
    "RegisterMemory",
    "Request",
    "RequestCompleted",
    "RequestFlag",
    "SendMessage",
    "SessionClosed",
    "SessionReady",
    "SessionRefused",
    "Status",
    "Store",
    "TableFlag",
    "TargetConfig",
    "TargetCore",
    "TargetThread",
    "WriteOp",
    "WriteToInitiator",
    "check_pool",
    "decode_message",
    "encode_message",
    "free_batch",
    "inline_descriptor",
    "load_batch",
    "peek_header",
    "store_batch",
]

_MODULES: dict[str, tuple[str, ...]] = {
    "kbtp.arena": ("Arena", "ArenaError"),
    "kbtp.batch": ("BlockRef", "BlockResult", "free_batch", "load_batch", "store_batch"),
    "kbtp.client_async": ("AsyncKbtpClient",),
    "kbtp.client_sync": ("BatchTicket", "KbtpClient"),
    "kbtp.constants": (
        "Capability",
        "CounterFormat",
        "MessageOpcode",
        "RequestFlag",
        "Status",
        "TableFlag",
    ),
    "kbtp.initiator": ("KbtpInitiator", "OpStats"),
    "kbtp.initiator_core": (
        "AllocState",
        "CompareSwapOp",
        "DirectAlloc",
        "DirectLoad",
        "FetchAddOp",
        "InitiatorCore",
        "InitiatorEvent",
        "ReadOp",
        "RequestCompleted",
        "SessionReady",
        "SessionRefused",
        "WriteOp",
    ),
    "kbtp.initiator_errors": ("HelloRefused", "HelloTimeout", "KbtpStatusError", "SessionClosed"),
    "kbtp.initiator_waiters": ("OnDone",),
    "kbtp.messages": (
        "AllocStore",
        "Bind",
        "CommonHeader",
        "Completion",
        "CompletionDescriptor",
        "CompletionRecord",
        "DataDescriptor",
        "Free",
        "Hello",
        "HelloAck",
        "KbtpError",
        "Load",
        "Message",
        "Request",
        "Store",
        "decode_message",
        "encode_message",
        "inline_descriptor",
        "peek_header",
    ),
    "kbtp.pool_file": ("PoolFile", "PoolFileError"),
    "kbtp.pool_recovery": ("RecoveryReport", "check_pool"),
    "kbtp.target": ("KbtpTarget",),
    "kbtp.target_actions": (
        "Action",
        "CloseSession",
        "DeregisterMemory",
        "InvalidateStag",
        "ReadFromInitiator",
        "RegionKind",
        "RegisterMemory",
        "SendMessage",
        "WriteToInitiator",
    ),
    "kbtp.target_config": ("InitiatorConfig", "TargetConfig"),
    "kbtp.target_core": ("TargetCore",),
    "kbtp.target_thread": ("TargetThread",),
}
_HOME = {name: module for module, names in _MODULES.items() for name in names}
"""The module each public name lives in."""


def __getattr__(name: str) -> Any:
    module = _HOME.get(name)
    if module is None:
        raise AttributeError(f"module 'kbtp' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
