"""Asynchronous events of the software RNIC, as ``ibv_get_async_event`` reports them.

A QP that fails (a Terminate sent or received, RFC 5040 §7.1; a CQ overflow, SEC-09) and a
QP that finishes closing raise an :class:`AsyncEvent` on its RNIC's
:class:`AsyncEventQueue` (``rnic.async_events``): ``await rnic.get_async_event()``,
``rnic.poll_async_event()`` or ``async for event in rnic.async_events``.  Event types carry
rdma-core's ``enum ibv_event_type`` values.

Which event a Terminate raises, by its cause (layer / error type, RFC 5040 §4.8):

* a protection error, RDMAP 0/1/* or DDP tagged 1/1/* (invalid STag, bounds, rights, STag
  not associated, TO wrap): ``QP_ACCESS_ERR``;
* an invalid request, RDMAP remote operation 0/2/* (version, opcode, cannot invalidate,
  unspecified) or DDP untagged 1/2/* (QN, no buffer, MSN, MO, too long): ``QP_REQ_ERR``;
* anything catastrophic, RDMAP 0/0/*, DDP 1/0/*, the stream-local and global catastrophic
  codes 0/2/0x07 and 0/2/0x08, and every LLP (MPA) cause 2/*/*: ``QP_FATAL``.

The same mapping applies whether the peer sent the Terminate (``remote`` is True) or this
RNIC sent it about the peer's segment; a stream lost without a Terminate is ``QP_FATAL``
with no cause.  A QP with an SRQ that enters ERROR raises ``QP_LAST_WQE_REACHED``; a QP
closing in order (RFC 5040 §6.2) raises ``SQ_DRAINED`` once everything it was given has been
sent; a CQ that overflows raises ``CQ_ERR`` naming the CQ.
"""

from __future__ import annotations

from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass
from enum import IntEnum

import trio

from stack.constants import (
    TERM_RDMAP_CATASTROPHIC_GLOBAL,
    TERM_RDMAP_CATASTROPHIC_STREAM,
    DdpEType,
    RdmapEType,
    TermCode,
    TermLayer,
)
from stack.errors import ProtocolError

__all__ = ["AsyncEvent", "AsyncEventQueue", "AsyncEventType", "event_type_for_cause"]


class AsyncEventType(IntEnum):
    """``enum ibv_event_type`` of rdma-core's libibverbs, value for value."""

    CQ_ERR = 0
    QP_FATAL = 1
    QP_REQ_ERR = 2
    QP_ACCESS_ERR = 3
    COMM_EST = 4
    SQ_DRAINED = 5
    PATH_MIG = 6
    PATH_MIG_ERR = 7
    DEVICE_FATAL = 8
    PORT_ACTIVE = 9
    PORT_ERR = 10
    LID_CHANGE = 11
    PKEY_CHANGE = 12
    SM_CHANGE = 13
    SRQ_ERR = 14
    SRQ_LIMIT_REACHED = 15
    QP_LAST_WQE_REACHED = 16
    CLIENT_REREGISTER = 17
    GID_CHANGE = 18
    WQ_FATAL = 19

    def __str__(self) -> str:
        return f"IBV_EVENT_{self.name}"


def event_type_for_cause(cause: TermCode | None) -> AsyncEventType:
    """The QP event a Terminate cause raises (the mapping in this module's docstring)."""
    if cause is None:
        return AsyncEventType.QP_FATAL
    cause = TermCode(*cause)
    if cause.layer == TermLayer.RDMAP:
        if cause.etype == RdmapEType.REMOTE_PROTECTION:
            return AsyncEventType.QP_ACCESS_ERR
        if cause.etype == RdmapEType.REMOTE_OPERATION and cause not in _CATASTROPHIC:
            return AsyncEventType.QP_REQ_ERR
    elif cause.layer == TermLayer.DDP:
        if cause.etype == DdpEType.TAGGED_BUFFER:
            return AsyncEventType.QP_ACCESS_ERR
        if cause.etype == DdpEType.UNTAGGED_BUFFER:
            return AsyncEventType.QP_REQ_ERR
    return AsyncEventType.QP_FATAL


_CATASTROPHIC = (TERM_RDMAP_CATASTROPHIC_STREAM, TERM_RDMAP_CATASTROPHIC_GLOBAL)


@dataclass(frozen=True, slots=True)
class AsyncEvent:
    """One asynchronous event (``struct ibv_async_event``).

    Fields: ``event_type``; the element it is about: ``qp`` (a
    :class:`~stack.rnic.qp.QueuePair`) for QP events, ``cq`` for ``CQ_ERR``; ``qp_num``;
    ``cause`` (the Terminate's layer/type/code, None without one); ``remote`` (True: the
    peer sent the Terminate; False: this RNIC did, about the peer's data or a local
    failure); ``error`` (the local error, when this RNIC detected it); ``detail`` (text).
    """

    event_type: AsyncEventType
    qp: object | None = None
    qp_num: int = 0
    cq: object | None = None
    cause: TermCode | None = None
    remote: bool = False
    error: Exception | None = None
    detail: str = ""

    def __str__(self) -> str:
        what = f"QP {self.qp_num}" if self.qp is not None else "CQ"
        cause = f", Terminate {TermCode(*self.cause)}" if self.cause is not None else ""
        side = " from the peer" if self.remote and self.cause is not None else ""
        return (
            f"{self.event_type} on {what}{cause}{side}{': ' + self.detail if self.detail else ''}"
        )


class AsyncEventQueue:
    """The asynchronous event queue of one RNIC (the async fd of an ``ibv_context``).

    Events are kept in the order they happen, at most ``max_events`` (the oldest is
    dropped beyond that and counted in :attr:`dropped`).  :meth:`post` is synchronous, so the
    sans-IO QP engine raises events directly; waiting needs trio.
    """

    def __init__(self, max_events: int = 1024) -> None:
        if max_events < 1:
            raise ValueError("max_events must be >= 1")
        self.max_events = max_events
        self.dropped = 0
        self._events: deque[AsyncEvent] = deque()
        self._lot = trio.lowlevel.ParkingLot()

    def __len__(self) -> int:
        return len(self._events)

    def post(self, event: AsyncEvent) -> None:
        """Queue ``event`` (called by QPs and CQs) and wake a waiting reader.

        A queued event may outlive its connection by far (a server that never reads the
        queue keeps the last ``max_events``), so its error keeps no traceback (whose frames
        hold the connection's driver and receive buffer) and its offending ULPDU is a copy
        of its own, not a view of the receive buffer."""
        _detach(event.error)
        if len(self._events) >= self.max_events:
            self._events.popleft()
            self.dropped += 1
        self._events.append(event)
        self._lot.unpark_all()

    def poll(self) -> AsyncEvent | None:
        """The oldest event, or None at once when there is none (non-blocking)."""
        return self._events.popleft() if self._events else None

    async def get(self) -> AsyncEvent:
        """Wait for and take the next event (``ibv_get_async_event``)."""
        while not self._events:
            await self._lot.park()
        return self._events.popleft()

    def __aiter__(self) -> AsyncIterator[AsyncEvent]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[AsyncEvent]:
        while True:
            yield await self.get()


def _detach(error: BaseException | None) -> None:
    """Drop what ties a kept error to the code and buffers it came from: the tracebacks of
    it and of its causes and contexts, and the receive buffer its ``ulpdu`` views."""
    seen: set[int] = set()
    pending = [error]
    while pending:
        error = pending.pop()
        if error is None or id(error) in seen:
            continue
        seen.add(id(error))
        error.__traceback__ = None
        if isinstance(error, ProtocolError) and error.ulpdu is not None:
            error.ulpdu = memoryview(error.ulpdu.tobytes())
        pending += (error.__cause__, error.__context__)
