"""Connection manager (rdma_cm-like): listen, connect, accept, reject, disconnect.

Usage::

    async with ConnectionManager.open(rnic) as cm:
        listener = await cm.listen("127.0.0.1", 0)
        ...                                     # elsewhere: conn = await cm.connect(host, port, qp)
        request = await listener.get_request()  # the peer's MPA Request arrived
        conn = await request.accept(qp, private_data=b"hello")

Each side's MPA choices (revision, CRC policy, markers, IRD/ORD, peer-to-peer and RTR kind,
timeouts) are an :class:`~stack.wire.events.MpaSettings`.  The MPA startup runs here over
trio with the engine's timers (MPA-27); once established, an
:class:`~stack.transport.driver.RdmaConnection` pumps the QP in the manager's nursery.
"""

from __future__ import annotations

import logging
import socket
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field, replace

import trio

from stack.constants import MPA_V2_NO_NEGOTIATION
from stack.errors import ConnectionTimeout, IwarpError, LocalError
from stack.rnic.device import Rnic
from stack.rnic.qp import QueuePair
from stack.transport.driver import RdmaConnection
from stack.transport.pumping import RECEIVE_SIZE, Tap
from stack.transport.sockopts import segment_size
from stack.transport.startup_slots import StartupSlot, StartupSlots
from stack.wire.connection import IwarpConnection
from stack.wire.events import (
    ConnectionFailed,
    Established,
    MpaFrame,
    MpaSettings,
    NeedData,
    PeerClosed,
    Rejected,
    RequestReceived,
    Role,
)

log = logging.getLogger(__name__)

MAX_STARTUPS = 256
"""MPA startups (and requests waiting for the ULP) a listener holds at once, in all."""
MAX_STARTUPS_PER_PEER = 64
"""...and from one peer address, so one client cannot take every descriptor; a connection
from an address at this bound takes that address's oldest stale slot, if any (MPA-23)."""
ACCEPT_BACKOFF_MIN = 0.05
ACCEPT_BACKOFF_MAX = 1.0
"""Seconds a listener waits after a failed accept() (doubling from the minimum)."""

TapFactory = Callable[[trio.SocketStream, bool], Tap | None]
"""Called with (stream, is_initiator) for each new TCP connection; returns a capture tap."""


class ConnectRejected(IwarpError):
    """The responder rejected the connection (MPA Reply with R=1, MPA-24)."""

    def __init__(self, frame: MpaFrame, reason: str = "") -> None:
        self.frame = frame
        self.private_data = frame.private_data
        self.peer_ird = frame.ird_ord.ird if frame.ird_ord else None
        self.peer_ord = frame.ird_ord.ord if frame.ird_ord else None
        super().__init__(f"connection rejected by peer{': ' + reason if reason else ''}")


class ConnectFailed(IwarpError):
    """MPA startup failed (malformed frame, policy mismatch, timeout, TCP error)."""

    def __init__(self, message: str, cause: Exception | None = None) -> None:
        super().__init__(message)
        self.cause = cause


def follows_socket(settings: MpaSettings) -> bool:
    """Whether a connection made with ``settings`` derives its MULPDU from its socket's
    segment size, so its driver follows that size as it grows (neither EMSS nor MULPDU
    fixed)."""
    return settings.emss is None and settings.mulpdu is None


def with_emss(settings: MpaSettings, sock: socket.socket | trio.socket.SocketType) -> MpaSettings:
    """``settings`` with EMSS from the connected socket's segment size (MPA-13), unless the
    caller fixed the EMSS or the MULPDU (:func:`follows_socket`); both connection managers
    call it."""
    if not follows_socket(settings):
        return settings
    emss = segment_size(sock)
    return replace(settings, emss=emss) if emss else settings


async def _startup_pump(
    stream: trio.SocketStream,
    engine: IwarpConnection,
    tap: Tap | None,
    first_fpdu_delay: float = 0.0,
) -> object:
    """Run MPA startup until an event other than NEED_DATA; returns that event.

    ``first_fpdu_delay``: seconds to wait after the Reply before the first FPDU leaves
    (the initiator's RTR, or whatever the QP sends first).
    """
    while True:
        out = engine.data_to_send()
        if out:
            if tap is not None:
                tap.record(True, out)
            await stream.send_all(out)
        event = engine.next_event()
        if not isinstance(event, NeedData):
            if isinstance(event, Established) and first_fpdu_delay > 0:
                await trio.sleep(first_fpdu_delay)
            out = engine.data_to_send()
            if out:
                if tap is not None:
                    tap.record(True, out)
                await stream.send_all(out)
            return event
        deadline = engine.timer_deadline()
        with trio.move_on_at(deadline if deadline is not None else float("inf")) as scope:
            data = await stream.receive_some(RECEIVE_SIZE)
        if scope.cancelled_caught:
            engine.handle_timer(trio.current_time())
            continue
        if tap is not None and data:
            tap.record(False, data)
        engine.receive_data(data)


class RequestFrame:
    """What an incoming connection's MPA Request says, for both connection managers'
    requests: private_data, peer_ird/peer_ord (None without RFC 6581); and the Reply that
    answers it, once."""

    frame: MpaFrame
    engine: IwarpConnection
    _done: bool

    def _accept_reply(self, private_data: bytes, ird: int | None, ord: int | None) -> bytes:
        """The engine's accepting Reply (MPA-22) with ``ird``/``ord`` where given."""
        self._answer()
        kwargs: dict[str, object] = {}
        if ird is not None:
            kwargs["ird"] = ird
        if ord is not None:
            kwargs["ord"] = ord
        self.engine.accept(private_data, **kwargs)
        return bytes(self.engine.data_to_send())

    def _reject_reply(self, private_data: bytes) -> bytes:
        """The engine's rejecting Reply, R=1 (MPA-23)."""
        self._answer()
        self.engine.reject(private_data)
        return bytes(self.engine.data_to_send())

    def _answer(self) -> None:
        if self._done:
            raise LocalError("connect request already answered")
        self._done = True

    @property
    def private_data(self) -> bytes:
        return self.frame.private_data

    @property
    def peer_ird(self) -> int | None:
        return self.frame.ird_ord.ird if self.frame.ird_ord else None

    @property
    def peer_ord(self) -> int | None:
        return self.frame.ird_ord.ord if self.frame.ird_ord else None


@dataclass
class ConnectRequest(RequestFrame):
    """An incoming connection whose MPA Request has arrived (``RDMA_CM_EVENT_CONNECT_REQUEST``).

    Fields: frame (the Request), private_data, peer_ird/peer_ord (None without RFC 6581),
    remote (peer address), follow_mss (the EMSS came from the socket: the connection
    follows TCP's segment size as it grows).
    """

    cm: ConnectionManager
    stream: trio.SocketStream
    engine: IwarpConnection
    frame: MpaFrame
    remote: tuple[str, int]
    tap: Tap | None = None
    follow_mss: bool = False
    _done: bool = field(default=False, repr=False)

    async def accept(
        self,
        qp: QueuePair,
        private_data: bytes = b"",
        *,
        ird: int | None = None,
        ord: int | None = None,
    ) -> RdmaConnection:
        """Accept with ``qp`` (``rdma_accept``); returns the running connection."""
        out = self._accept_reply(private_data, ird, ord)
        try:
            if self.tap is not None:
                self.tap.record(True, out)
            await self.stream.send_all(out)
        except (trio.BrokenResourceError, OSError) as exc:
            await trio.aclose_forcefully(self.stream)
            raise ConnectFailed(f"peer went away during accept: {exc}", exc) from exc
        event = self.engine.next_event()
        if not isinstance(event, Established):
            await trio.aclose_forcefully(self.stream)
            raise ConnectFailed(f"MPA accept did not establish: {event!r}")
        return self.cm._start(self.stream, self.engine, qp, self.tap, follow_mss=self.follow_mss)

    async def reject(self, private_data: bytes = b"") -> None:
        """Reject with an R=1 Reply carrying ``private_data`` (MPA-23), then close."""
        out = self._reject_reply(private_data)
        try:
            if self.tap is not None:
                self.tap.record(True, out)
            await self.stream.send_all(out)
            await self.stream.send_eof()
        except (trio.BrokenResourceError, OSError):
            pass
        await trio.aclose_forcefully(self.stream)


class Listener:
    """A listening endpoint (``rdma_listen``); yields :class:`ConnectRequest` objects."""

    def __init__(
        self,
        cm: ConnectionManager,
        settings: MpaSettings,
        backlog: int,
        *,
        max_startups: int = MAX_STARTUPS,
        max_startups_per_peer: int = MAX_STARTUPS_PER_PEER,
    ) -> None:
        self.cm = cm
        self.settings = settings
        self._send, self._recv = trio.open_memory_channel[ConnectRequest](backlog)
        self.slots = StartupSlots(max_startups, max_startups_per_peer)
        """The startup slots, shared fairly between peer addresses (``slots.evicted``,
        ``slots.evicted_stale``)."""
        self.refused = 0
        """Connections closed at once because a startup bound was reached."""
        self.accept_errors = 0
        """accept() failures survived (descriptor exhaustion and the like)."""
        self.failures: list[Exception] = []
        self.port = 0
        self.host = ""
        self._cancel = trio.CancelScope()
        self._closed = trio.Event()

    @property
    def startups(self) -> dict[str, int]:
        """Connections per peer address still in MPA startup (or waiting for the ULP)."""
        return self.slots.counts()

    async def get_request(self) -> ConnectRequest:
        return await self._recv.receive()

    def __aiter__(self) -> AsyncIterator[ConnectRequest]:
        return self._recv.__aiter__()

    async def aclose(self) -> None:
        """Stop listening; returns once the listening sockets are closed."""
        self._cancel.cancel()
        await self._send.aclose()
        await self._closed.wait()

    async def _serve(self, listeners: list[trio.SocketListener], task_status: object) -> None:
        """Accept on ``listeners`` until :meth:`aclose` or the manager's end; the listening
        sockets are closed either way (not left to the garbage collector)."""
        try:
            with self._cancel:
                async with trio.open_nursery() as nursery:
                    for lst in listeners:
                        nursery.start_soon(self._accept_loop, lst, nursery)
                    task_status.started()  # type: ignore[attr-defined]
        finally:
            with trio.CancelScope(shield=True):
                for lst in listeners:
                    await lst.aclose()
            self._closed.set()

    async def _accept_loop(self, lst: trio.SocketListener, nursery: trio.Nursery) -> None:
        """Accept for ever; a failing accept() (out of descriptors: EMFILE, ENFILE, or a
        kernel without memory) backs off and tries again, so the existing connections keep
        running and new ones are served once descriptors free up."""
        backoff = ACCEPT_BACKOFF_MIN
        while True:
            try:
                stream = await lst.accept()
            except OSError as exc:
                self.accept_errors += 1
                log.warning("listener: accept failed (%s); retrying in %.2f s", exc, backoff)
                await trio.sleep(backoff)
                backoff = min(backoff * 2, ACCEPT_BACKOFF_MAX)
                continue
            backoff = ACCEPT_BACKOFF_MIN
            nursery.start_soon(self._handshake, stream)

    async def _handshake(self, stream: trio.SocketStream) -> None:
        """One MPA startup as the responder.  Whatever the peer does (a reset before the
        first byte, garbage, silence) ends this connection only."""
        try:
            remote = stream.socket.getpeername()[:2]
        except OSError as exc:  # reset before we looked (ENOTCONN)
            log.info("listener: connection gone before its startup: %s", exc)
            await trio.aclose_forcefully(stream)
            return
        host = str(remote[0])
        scope = trio.CancelScope()

        def evict() -> None:
            log.warning("listener: %s: startup slot given to another connection; closed", host)
            scope.cancel()

        slot = self.slots.admit(host, evict, trio.current_time())
        if slot is None:
            self.refused += 1
            log.warning("listener: %s: too many MPA startups in progress; closed", host)
            await trio.aclose_forcefully(stream)
            return
        try:
            with scope:
                await self._startup(stream, remote, slot)
            if scope.cancelled_caught:
                await trio.aclose_forcefully(stream)
        finally:
            self.slots.release(slot)

    async def _startup(
        self, stream: trio.SocketStream, remote: tuple[str, int], slot: StartupSlot
    ) -> None:
        try:
            engine = IwarpConnection(Role.RESPONDER, with_emss(self.settings, stream.socket))
            engine.start(trio.current_time())
            tap = self.cm.tap_factory(stream, False) if self.cm.tap_factory else None
        except OSError as exc:
            log.info("listener: connection from %s gone during setup: %s", remote, exc)
            await trio.aclose_forcefully(stream)
            return
        try:
            event = await _startup_pump(stream, engine, tap)
        except (trio.BrokenResourceError, OSError) as exc:
            event = ConnectionFailed(exc)
        if isinstance(event, RequestReceived):
            slot.evictable = False
            follow = follows_socket(self.settings)
            request = ConnectRequest(
                self.cm, stream, engine, event.frame, remote, tap, follow_mss=follow
            )
            # The backlog queues requests for the ULP; one not taken within the startup
            # timeout is rejected (MPA-23), as a full backlog would be.
            with trio.move_on_after(self.settings.request_timeout):
                try:
                    await self._send.send(request)
                    return
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    pass
            await request.reject()
            return
        error = event.error if isinstance(event, ConnectionFailed) else None
        self.failures.append(error or ConnectFailed(f"MPA startup ended with {event!r}"))
        log.info("listener: MPA startup from %s failed: %s", remote, error or event)
        out = engine.data_to_send()
        if out:
            try:
                await stream.send_all(out)
            except (trio.BrokenResourceError, OSError):
                pass
        await trio.aclose_forcefully(stream)


class ConnectionManager:
    """Creates and tracks connections of one RNIC inside a trio nursery."""

    def __init__(
        self, rnic: Rnic, nursery: trio.Nursery, *, tap_factory: TapFactory | None = None
    ) -> None:
        self.rnic = rnic
        self.nursery = nursery
        self.tap_factory = tap_factory
        self.connections: list[RdmaConnection] = []

    @classmethod
    @asynccontextmanager
    async def open(
        cls, rnic: Rnic | None = None, *, tap_factory: TapFactory | None = None
    ) -> AsyncIterator[ConnectionManager]:
        """A manager with its own nursery; leaving the block disconnects everything."""
        async with trio.open_nursery() as nursery:
            cm = cls(rnic or Rnic(), nursery, tap_factory=tap_factory)
            try:
                yield cm
            finally:
                nursery.cancel_scope.cancel()

    def _start(
        self,
        stream: trio.SocketStream,
        engine: IwarpConnection,
        qp: QueuePair,
        tap: Tap | None,
        *,
        follow_mss: bool = False,
    ) -> RdmaConnection:
        bind_ird_ord(qp, engine)
        conn = RdmaConnection(stream, engine, qp, tap=tap, follow_mss=follow_mss)
        self.connections.append(conn)
        conn.on_closed = self.connections.remove
        self.nursery.start_soon(conn.run)
        return conn

    async def listen(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        settings: MpaSettings | None = None,
        backlog: int = 64,
        max_startups: int = MAX_STARTUPS,
        max_startups_per_peer: int = MAX_STARTUPS_PER_PEER,
    ) -> Listener:
        """Listen for connections (``rdma_listen``); port 0 picks a free port.

        ``backlog``: connection requests queued for the ULP (one not taken within the MPA
        request timeout is rejected); ``max_startups`` / ``max_startups_per_peer``: MPA
        startups in progress at once, beyond which a new connection is closed at once
        unless it can take a stale one (:mod:`~stack.transport.startup_slots`).
        """
        listener = Listener(
            self,
            settings or MpaSettings(),
            backlog,
            max_startups=max_startups,
            max_startups_per_peer=max_startups_per_peer,
        )
        sockets = await trio.open_tcp_listeners(port, host=host)
        listener.host, listener.port = sockets[0].socket.getsockname()[:2]
        await self.nursery.start(listener._serve, sockets)
        return listener

    async def connect(
        self,
        host: str,
        port: int,
        qp: QueuePair,
        *,
        private_data: bytes = b"",
        settings: MpaSettings | None = None,
        first_fpdu_delay: float = 0.0,
        local_address: str | None = None,
    ) -> RdmaConnection:
        """Connect ``qp`` to a listener (``rdma_connect``); ``local_address`` binds the source.

        ``first_fpdu_delay`` holds the first FPDU back for that many seconds after the MPA
        Reply.  Linux siw as the passive side can leave an FPDU that arrives right after its
        Reply unprocessed until more data comes (it sends the Reply before it hands the
        socket to the QP); 0.2 s avoids that race.

        Raises :class:`ConnectRejected` (with the peer's private data and IRD/ORD) or
        :class:`ConnectFailed`.
        """
        try:
            stream = await trio.open_tcp_stream(host, port, local_address=local_address)
        except OSError as exc:
            raise ConnectFailed(f"TCP connect to {host}:{port} failed: {exc}", exc) from exc
        settings = settings or MpaSettings(ird=qp.ird, ord=qp.ord)
        engine = IwarpConnection(Role.INITIATOR, with_emss(settings, stream.socket))
        tap = self.tap_factory(stream, True) if self.tap_factory else None
        engine.initiate(trio.current_time(), private_data)
        try:
            event = await _startup_pump(stream, engine, tap, first_fpdu_delay)
        except (trio.BrokenResourceError, OSError) as exc:
            await trio.aclose_forcefully(stream)
            raise ConnectFailed(f"connection lost during MPA startup: {exc}", exc) from exc
        if isinstance(event, Established):
            return self._start(stream, engine, qp, tap, follow_mss=follows_socket(settings))
        await trio.aclose_forcefully(stream)
        raise startup_error(event)


def bind_ird_ord(qp: QueuePair, engine: IwarpConnection) -> None:
    """RFC 6581 §9.1: the negotiated IRD/ORD bind the QP (0x3FFF: the ULP decides)."""
    neg = engine.negotiated
    if neg is None:
        return
    if neg.ird != MPA_V2_NO_NEGOTIATION:
        qp.ird = min(qp.ird, neg.ird) if neg.peer_ord is None else neg.ird
    if neg.ord != MPA_V2_NO_NEGOTIATION:
        qp.ord = min(qp.ord, neg.ord) if neg.peer_ird is None else neg.ord


def startup_error(event: object) -> IwarpError:
    """The error an initiator raises for an MPA startup that ended in ``event`` instead of
    Established: :class:`ConnectRejected` (MPA-24) or :class:`ConnectFailed`."""
    if isinstance(event, Rejected):
        return ConnectRejected(event.frame, event.reason)
    if isinstance(event, ConnectionFailed):
        if isinstance(event.error, ConnectionTimeout):
            return ConnectFailed(f"MPA startup timed out: {event.error}", event.error)
        return ConnectFailed(f"MPA startup failed: {event.error}", event.error)
    if isinstance(event, PeerClosed):
        return ConnectFailed("peer closed the connection during MPA startup")
    return ConnectFailed(f"unexpected MPA startup event {event!r}")
