"""librdmacm-style connection events: an event channel beside the ConnectionManager calls.

librdmacm programs drive connections with ``rdma_get_cm_event``: CONNECT_REQUEST on a
listener, ESTABLISHED, REJECTED (with the peer's private data), UNREACHABLE (no TCP
connection), CONNECT_ERROR (the MPA startup failed, RFC 5044 §7.1.2) and DISCONNECTED.
:class:`EventChannel` gives the same shape over :class:`~stack.transport.cm.ConnectionManager`:
start operations with :meth:`EventChannel.listen`, :meth:`EventChannel.connect` and
:meth:`EventChannel.accept`, then take their outcomes in order with
:meth:`EventChannel.get_cm_event`.  Every event carries the private data and, with
RFC 6581, the peer's IRD/ORD.  The direct calls stay the native API; this is a view of them.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

import trio

from stack.rnic.qp import QueuePair
from stack.transport.cm import (
    ConnectFailed,
    ConnectionManager,
    ConnectRejected,
    ConnectRequest,
    Listener,
)
from stack.transport.driver import RdmaConnection
from stack.wire.events import MpaSettings

__all__ = ["CmEvent", "CmEventType", "EventChannel"]


class CmEventType(Enum):
    """``enum rdma_cm_event_type`` names of the events this channel reports."""

    CONNECT_REQUEST = "RDMA_CM_EVENT_CONNECT_REQUEST"
    ESTABLISHED = "RDMA_CM_EVENT_ESTABLISHED"
    REJECTED = "RDMA_CM_EVENT_REJECTED"
    UNREACHABLE = "RDMA_CM_EVENT_UNREACHABLE"
    CONNECT_ERROR = "RDMA_CM_EVENT_CONNECT_ERROR"
    DISCONNECTED = "RDMA_CM_EVENT_DISCONNECTED"


@dataclass(frozen=True, slots=True)
class CmEvent:
    """One connection event.

    Fields: type; request (CONNECT_REQUEST: answer it with :meth:`EventChannel.accept` or
    its ``reject``); connection (ESTABLISHED, DISCONNECTED); private_data (the peer's: its
    Request, Reply or rejecting Reply); peer_ird / peer_ord (RFC 6581, None without it);
    reason (REJECTED, UNREACHABLE, CONNECT_ERROR, DISCONNECTED after an error: why).
    """

    type: CmEventType
    request: ConnectRequest | None = None
    connection: RdmaConnection | None = None
    private_data: bytes = b""
    peer_ird: int | None = None
    peer_ord: int | None = None
    reason: str = ""


class EventChannel:
    """Connection events of one :class:`ConnectionManager`, in the order they happen
    (``rdma_create_event_channel``); tasks run in the manager's nursery."""

    def __init__(self, cm: ConnectionManager, *, max_events: int = 1024) -> None:
        self.cm = cm
        self._send, self._receive = trio.open_memory_channel[CmEvent](max_events)

    async def get_cm_event(self) -> CmEvent:
        """The next event (``rdma_get_cm_event``), waiting for it."""
        return await self._receive.receive()

    def _post(self, event: CmEvent) -> None:
        try:
            self._send.send_nowait(event)
        except trio.WouldBlock:  # nobody takes events: drop the oldest rather than block
            self._receive.receive_nowait()
            self._send.send_nowait(event)

    async def listen(
        self, host: str, port: int, *, settings: MpaSettings | None = None, backlog: int = 64
    ) -> Listener:
        """Listen (``rdma_listen``): each incoming Request becomes a CONNECT_REQUEST."""
        listener = await self.cm.listen(host, port, settings=settings, backlog=backlog)

        async def requests() -> None:
            async for request in listener:
                self._post(
                    CmEvent(
                        CmEventType.CONNECT_REQUEST,
                        request=request,
                        private_data=request.private_data,
                        peer_ird=request.peer_ird,
                        peer_ord=request.peer_ord,
                    )
                )

        self.cm.nursery.start_soon(requests)
        return listener

    async def accept(
        self, event: CmEvent, qp: QueuePair, private_data: bytes = b""
    ) -> RdmaConnection:
        """Accept a CONNECT_REQUEST with ``qp`` (``rdma_accept``): ESTABLISHED, later
        DISCONNECTED.  A failure to finish the startup is a CONNECT_ERROR (and raised)."""
        if event.type is not CmEventType.CONNECT_REQUEST or event.request is None:
            raise ValueError(f"accept needs a CONNECT_REQUEST event, not {event.type.name}")
        try:
            conn = await event.request.accept(qp, private_data)
        except ConnectFailed as exc:
            self._post(CmEvent(CmEventType.CONNECT_ERROR, reason=str(exc)))
            raise
        self._established(conn)
        return conn

    def connect(
        self,
        host: str,
        port: int,
        qp: QueuePair,
        *,
        private_data: bytes = b"",
        settings: MpaSettings | None = None,
    ) -> None:
        """Start connecting ``qp`` (``rdma_connect``); the outcome comes as an event:
        ESTABLISHED (then DISCONNECTED), REJECTED, UNREACHABLE or CONNECT_ERROR."""

        async def attempt() -> None:
            try:
                conn = await self.cm.connect(
                    host, port, qp, private_data=private_data, settings=settings
                )
            except ConnectRejected as exc:
                ird_ord = exc.frame.ird_ord
                self._post(
                    CmEvent(
                        CmEventType.REJECTED,
                        private_data=exc.frame.private_data,
                        peer_ird=ird_ord.ird if ird_ord else None,
                        peer_ord=ird_ord.ord if ird_ord else None,
                        reason=str(exc),
                    )
                )
                return
            except ConnectFailed as exc:
                unreachable = isinstance(exc.cause, OSError) and "TCP connect" in str(exc)
                kind = CmEventType.UNREACHABLE if unreachable else CmEventType.CONNECT_ERROR
                self._post(CmEvent(kind, reason=str(exc)))
                return
            self._established(conn)

        self.cm.nursery.start_soon(attempt)

    def _established(self, conn: RdmaConnection) -> None:
        """ESTABLISHED with what the startup negotiated (the peer's private data and
        IRD/ORD), and a watch that reports DISCONNECTED when the connection ends."""
        neg = conn.negotiated
        self._post(
            CmEvent(
                CmEventType.ESTABLISHED,
                connection=conn,
                private_data=neg.peer_private_data if neg else b"",
                peer_ird=neg.peer_ird if neg else None,
                peer_ord=neg.peer_ord if neg else None,
            )
        )

        async def watch() -> None:
            await conn.wait_closed()
            reason = str(conn.error) if conn.error is not None else ""
            self._post(CmEvent(CmEventType.DISCONNECTED, connection=conn, reason=reason))

        self.cm.nursery.start_soon(watch)
