"""Synchronous verbs (floor 4): pyverbs-shaped objects over an RNIC with its own thread.

``Context`` starts a background thread whose trio loop runs the engine and the TCP drivers,
so the RNIC progresses while the application computes, blocks or busy-polls.  Build on it as
with pyverbs: ``PD(ctx)``, ``MR(pd, buffer, access)``, ``CompChannel(ctx)``,
``CQ(ctx, capacity, channel)``, ``SRQ(pd)``, ``QP(pd, cq)``; connect with ``CMId`` and take
outcomes from ``CMEventChannel.get_cm_event(timeout)``.  Every object is usable from any
thread; channels and CQs also have ``async`` waits for asyncio.  Work requests, completions
and their enums are :mod:`stack.rnic`'s.
"""

from stack.verbs_sync.cm import CMEvent, CMEventChannel, CMId
from stack.verbs_sync.mailbox import RnicClosed
from stack.verbs_sync.portal import RnicFailed, RnicThread
from stack.verbs_sync.verbs import CQ, MR, PD, QP, SRQ, Closing, CompChannel, Context

__all__ = [
    "Closing",
    "CMEvent",
    "CMEventChannel",
    "CMId",
    "CQ",
    "CompChannel",
    "Context",
    "MR",
    "PD",
    "QP",
    "RnicClosed",
    "RnicFailed",
    "RnicThread",
    "SRQ",
]
