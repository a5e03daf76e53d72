"""Synchronous connection management in librdmacm's shape: ``CMId`` and ``CMEventChannel``.

A :class:`CMId` (``rdma_cm_id``) listens, connects, accepts, rejects or disconnects; the
outcome of each arrives on its :class:`CMEventChannel` (``rdma_event_channel``) as a
:class:`CMEvent`, taken with the blocking :meth:`CMEventChannel.get_cm_event` (a timeout)
or, from asyncio, ``await`` :meth:`CMEventChannel.wait_cm_event`.  Each id drives its own
:class:`~stack.transport.cm_events.EventChannel` on the RNIC thread, so every event names
the id it belongs to (``event.id``; a CONNECT_REQUEST's ``id`` is the new id to accept or
reject, ``listen_id`` the listener).  Event types are
:class:`~stack.transport.cm_events.CmEventType`'s (MPA startup, RFC 5044 §7.1).
"""

from __future__ import annotations

import trio

from stack.errors import LocalError
from stack.transport.cm import Listener
from stack.transport.cm_events import CmEvent, CmEventType, EventChannel
from stack.transport.driver import RdmaConnection
from stack.verbs_sync.mailbox import Mailbox, RnicClosed
from stack.verbs_sync.portal import CALL_TIMEOUT
from stack.verbs_sync.verbs import QP, Closing, Context
from stack.wire.events import MpaSettings

_LAST = frozenset(
    {
        CmEventType.REJECTED,
        CmEventType.UNREACHABLE,
        CmEventType.CONNECT_ERROR,
        CmEventType.DISCONNECTED,
    }
)
"""Event types after which an id reports nothing more."""


class CMEvent:
    """One connection event of a :class:`CMId` (``struct rdma_cm_event``)."""

    __slots__ = ("raw", "id", "listen_id")

    def __init__(self, raw: CmEvent, id: CMId, listen_id: CMId | None = None) -> None:
        self.raw = raw
        """The trio-side event (fields as :class:`~stack.transport.cm_events.CmEvent`)."""
        self.id = id
        self.listen_id = listen_id

    @property
    def type(self) -> CmEventType:
        return self.raw.type

    @property
    def private_data(self) -> bytes:
        """The peer's private data (its Request, Reply or rejecting Reply)."""
        return self.raw.private_data

    @property
    def peer_ird(self) -> int | None:
        return self.raw.peer_ird

    @property
    def peer_ord(self) -> int | None:
        return self.raw.peer_ord

    @property
    def reason(self) -> str:
        return self.raw.reason

    def __repr__(self) -> str:
        return f"<CMEvent {self.type.name} {self.id!r}>"


class CMEventChannel(Closing):
    """Where the events of the ids created on it arrive, in order (pyverbs
    ``CMEventChannel``)."""

    def __init__(self, ctx: Context, capacity: int = 1024) -> None:
        self.ctx = ctx
        self._events: Mailbox[CMEvent] = Mailbox(f"CM event channel of {ctx.name}", capacity)
        ctx.thread.on_stop(self._events.close)

    def get_cm_event(self, timeout: float | None = None) -> CMEvent:
        """The next event (``rdma_get_cm_event``), waiting up to ``timeout`` seconds
        (:class:`TimeoutError`).  No ``ack`` is needed."""
        return self._events.get(timeout)

    async def wait_cm_event(self, timeout: float | None = None) -> CMEvent:
        """:meth:`get_cm_event` for asyncio: the event loop keeps running meanwhile."""
        return await self._events.aget(timeout)

    def close(self) -> None:
        self._events.close(RnicClosed("CM event channel closed"))


class CMId(Closing):
    """A connection identifier (``rdma_create_id``; pyverbs ``CMID``) on ``channel``.

    Passive side: :meth:`listen`, then each CONNECT_REQUEST event carries a new id to
    :meth:`accept` (ESTABLISHED follows) or :meth:`reject`.  Active side: :meth:`connect`;
    ESTABLISHED, REJECTED, UNREACHABLE or CONNECT_ERROR follows.  Either side ends with
    :meth:`disconnect` (DISCONNECTED on both sides; the QP goes to ERROR and flushes).
    """

    def __init__(self, channel: CMEventChannel, *, _request: CmEvent | None = None) -> None:
        self.channel = channel
        self.ctx = channel.ctx
        self._request = _request
        self.qp: QP | None = None
        self.host = ""
        self.port = 0
        """The port a listening id is bound to (useful after ``listen(port=0)``)."""
        self._listener: Listener | None = None
        self._conn: RdmaConnection | None = None
        self._scope = trio.CancelScope()
        self._used = False

    def __repr__(self) -> str:
        if self._listener is not None:
            return f"<CMId listening on {self.host}:{self.port}>"
        qp = f" qp={self.qp.qp_num}" if self.qp is not None else ""
        return f"<CMId{qp}{' connected' if self.connected else ''}>"

    @property
    def connected(self) -> bool:
        """True from ESTABLISHED until the connection has closed."""
        conn = self._conn
        return conn is not None and not conn.closed.is_set()

    # ------------------------------------------------------------------ RNIC-thread side
    def _start(self) -> EventChannel:
        """(RNIC thread) This id's own event channel, forwarded into :attr:`channel`."""
        if self._used:
            raise LocalError(f"{self!r} is already in use")
        self._used = True
        events = EventChannel(self.ctx.thread.cm)

        async def forward() -> None:
            with self._scope:
                while True:
                    raw = await events.get_cm_event()
                    if raw.type is CmEventType.CONNECT_REQUEST:
                        child = CMId(self.channel, _request=raw)
                        self.channel._events.put(CMEvent(raw, child, self))
                        continue
                    if raw.type is CmEventType.ESTABLISHED:
                        self._conn = raw.connection
                    self.channel._events.put(CMEvent(raw, self))
                    if raw.type in _LAST:
                        return

        self.ctx.thread.spawn(forward)
        return events

    # ------------------------------------------------------------------ passive side
    def listen(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        backlog: int = 64,
        settings: MpaSettings | None = None,
        timeout: float = CALL_TIMEOUT,
    ) -> int:
        """Listen (``rdma_bind_addr`` + ``rdma_listen``); returns the bound port.

        ``backlog``: connection requests waiting for an answer; ``settings``: this side's
        MPA choices (revision, CRC, markers, peer-to-peer, RFC 5044 §7.1, RFC 6581)."""

        async def start() -> Listener:
            events = self._start()
            try:
                return await events.listen(host, port, settings=settings, backlog=backlog)
            except BaseException:
                self._scope.cancel()  # nothing to report: stop this id's forwarding
                raise

        self._listener = self.ctx.thread.run(start, timeout=timeout)
        self.host, self.port = self._listener.host, self._listener.port
        return self.port

    def _pending_request(self) -> CmEvent:
        if self._request is None:
            raise LocalError(f"{self!r} has no connect request to answer")
        return self._request

    def accept(self, qp: QP, private_data: bytes = b"", timeout: float = CALL_TIMEOUT) -> None:
        """Accept this CONNECT_REQUEST with ``qp`` (``rdma_accept``); returns once the MPA
        Reply is sent (ESTABLISHED is on the channel).  Raises
        :class:`~stack.transport.cm.ConnectFailed` if the peer went away."""
        request = self._pending_request()
        if qp.ctx is not self.ctx:
            raise ValueError("the QP belongs to another context")

        async def answer() -> RdmaConnection:
            return await self._start().accept(request, qp.qp, private_data)

        self.qp = qp
        self._conn = self.ctx.thread.run(answer, timeout=timeout)

    def reject(self, private_data: bytes = b"", timeout: float = CALL_TIMEOUT) -> None:
        """Reject this CONNECT_REQUEST (``rdma_reject``): the peer gets REJECTED with
        ``private_data`` (MPA-23)."""
        request = self._pending_request().request
        assert request is not None
        self._used = True
        self.ctx.thread.run(request.reject, private_data, timeout=timeout)

    # ------------------------------------------------------------------ active side
    def connect(
        self,
        host: str,
        port: int,
        qp: QP,
        private_data: bytes = b"",
        *,
        settings: MpaSettings | None = None,
        timeout: float = CALL_TIMEOUT,
    ) -> None:
        """Start connecting ``qp`` (``rdma_resolve_addr`` + ``rdma_connect``); the outcome
        comes on the channel.  ``settings``: as for :meth:`listen` (default: the QP's
        IRD/ORD)."""
        if qp.ctx is not self.ctx:
            raise ValueError("the QP belongs to another context")

        def start() -> None:
            self._start().connect(host, port, qp.qp, private_data=private_data, settings=settings)

        self.qp = qp
        self.ctx.thread.run_sync(start, timeout=timeout)

    # ------------------------------------------------------------------ both
    def disconnect(self, timeout: float = CALL_TIMEOUT) -> None:
        """Graceful close (``rdma_disconnect``): queued messages go out, then FIN; returns
        once the connection is down (outstanding WRs flushed, DISCONNECTED on the channel)."""
        conn = self._conn
        if conn is None:
            raise LocalError(f"{self!r} is not connected")
        self.ctx.thread.run(conn.disconnect, timeout=timeout)

    def close(self, timeout: float = CALL_TIMEOUT) -> None:
        """Destroy the id (``rdma_destroy_id``): stop listening, disconnect a live
        connection, report no further events.  Idempotent; a no-op once the RNIC stopped."""
        listener, self._listener = self._listener, None
        try:
            if listener is not None:
                self.ctx.thread.run(listener.aclose, timeout=timeout)
            if self.connected:
                self.disconnect(timeout)
            self.ctx.thread.run_sync(self._scope.cancel, timeout=timeout)
        except RnicClosed:
            pass
