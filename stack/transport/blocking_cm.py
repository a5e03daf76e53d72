"""Connecting and listening for the blocking driver (:mod:`stack.transport.blocking`).

Usage::

    conn = connect(host, port, qp, private_data=b"hello")     # rdma_connect
    conn.qp.post_send(wr); wc = conn.next_completion(cq)

    with BlockingListener("127.0.0.1", 0) as listener:          # rdma_listen
        request = listener.get_request()                        # the MPA Request arrived
        conn = request.accept(qp, private_data=b"advert")       # rdma_accept

The MPA startup (RFC 5044 §7.1) is the engine's, as in the trio connection manager: the
same settings (:class:`~stack.wire.events.MpaSettings`), the same timers (MPA-27), the same
errors (:class:`~stack.transport.cm.ConnectRejected`,
:class:`~stack.transport.cm.ConnectFailed`).  :meth:`BlockingListener.get_request` serves
one startup at a time in the calling thread; :meth:`BlockingListener.serve` runs each in a
thread of its own, within the trio listener's startup bounds (MAX_STARTUPS in all,
MAX_STARTUPS_PER_PEER from one address, shared fairly by
:class:`~stack.transport.startup_slots.StartupSlots`, MPA-23), so silent connections cannot
hold the port.  A connection whose startup fails (garbage, silence past the MPA timers, a
reset) is closed.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from stack.errors import ConnectionTimeout
from stack.rnic.qp import QueuePair
from stack.transport.blocking import BlockingConnection
from stack.transport.cm import (
    ACCEPT_BACKOFF_MAX,
    ACCEPT_BACKOFF_MIN,
    MAX_STARTUPS,
    MAX_STARTUPS_PER_PEER,
    ConnectFailed,
    RequestFrame,
    follows_socket,
    startup_error,
    with_emss,
)
from stack.transport.pumping import RECEIVE_SIZE, Tap, close_tap
from stack.transport.startup_slots import StartupSlot, StartupSlots
from stack.wire.connection import IwarpConnection
from stack.wire.events import (
    ConnectionFailed,
    Established,
    MpaFrame,
    MpaSettings,
    NeedData,
    RequestReceived,
    Role,
)

__all__ = ["BlockingListener", "BlockingRequest", "CONNECT_TIMEOUT", "SocketTapFactory", "connect"]

log = logging.getLogger(__name__)

SocketTapFactory = Callable[[socket.socket, bool], Tap | None]
"""Called with (connected socket, is_initiator) for each new connection; returns a capture
tap (:func:`~stack.transport.tap.socket_tap_factory`) or None."""

CONNECT_TIMEOUT = 30.0
"""Seconds :func:`connect` allows the TCP connect and the MPA startup by default."""


def connect(
    host: str,
    port: int,
    qp: QueuePair,
    *,
    private_data: bytes = b"",
    settings: MpaSettings | None = None,
    timeout: float = CONNECT_TIMEOUT,
    local_address: str | None = None,
    tap_factory: SocketTapFactory | None = None,
) -> BlockingConnection:
    """Connect ``qp`` to a listener (``rdma_connect``) and return its blocking connection.

    ``timeout`` bounds the TCP connect and the MPA startup together (the engine's MPA
    timers, MPA-27, apply within it).  ``tap_factory`` (e.g.
    :func:`~stack.transport.tap.socket_tap_factory`) is called with the connected socket
    and True, and its tap records both directions from the MPA Request on.  Raises
    :class:`~stack.transport.cm.ConnectRejected` (with the peer's private data and
    IRD/ORD) or :class:`~stack.transport.cm.ConnectFailed`.
    """
    deadline = time.monotonic() + timeout
    source = None if local_address is None else (local_address, 0)
    try:
        sock = socket.create_connection((host, port), timeout, source)
    except OSError as exc:
        raise ConnectFailed(f"TCP connect to {host}:{port} failed: {exc}", exc) from exc
    tap = None
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # as trio's streams
        tap = tap_factory(sock, True) if tap_factory is not None else None
        settings = settings or MpaSettings(ird=qp.ird, ord=qp.ord)
        follow = follows_socket(settings)
        settings = with_emss(settings, sock)
        engine = IwarpConnection(Role.INITIATOR, settings)
        engine.initiate(time.monotonic(), private_data)
        event = _startup(sock, engine, deadline, tap)
        if not isinstance(event, Established):
            raise startup_error(event)
    except OSError as exc:
        _close(sock, tap)
        raise ConnectFailed(f"connection lost during MPA startup: {exc}", exc) from exc
    except BaseException:
        _close(sock, tap)
        raise
    return BlockingConnection(sock, engine, qp, tap=tap, follow_mss=follow)


@dataclass
class BlockingRequest(RequestFrame):
    """An incoming connection whose MPA Request has arrived (``RDMA_CM_EVENT_CONNECT_REQUEST``).

    Fields: frame (the Request), private_data, peer_ird/peer_ord (None without RFC 6581),
    remote (peer address).  Answer it once, with :meth:`accept` or :meth:`reject`.
    """

    sock: socket.socket
    engine: IwarpConnection
    frame: MpaFrame
    remote: tuple[str, int]
    settings: MpaSettings
    tap: Tap | None = None
    _done: bool = field(default=False, repr=False)

    def accept(
        self,
        qp: QueuePair,
        private_data: bytes = b"",
        *,
        ird: int | None = None,
        ord: int | None = None,
    ) -> BlockingConnection:
        """Accept with ``qp`` (``rdma_accept``); returns its blocking connection."""
        out = self._accept_reply(private_data, ird, ord)
        try:
            self._send(out)
        except OSError as exc:
            _close(self.sock, self.tap)
            raise ConnectFailed(f"peer went away during accept: {exc}", exc) from exc
        event = self.engine.next_event()
        if not isinstance(event, Established):
            _close(self.sock, self.tap)
            raise ConnectFailed(f"MPA accept did not establish: {event!r}")
        follow = follows_socket(self.settings)
        return BlockingConnection(self.sock, self.engine, qp, tap=self.tap, follow_mss=follow)

    def reject(self, private_data: bytes = b"") -> None:
        """Reject with an R=1 Reply carrying ``private_data`` (MPA-23), then close."""
        out = self._reject_reply(private_data)
        try:
            self._send(out)
            self.sock.shutdown(socket.SHUT_WR)
        except OSError:
            pass
        _close(self.sock, self.tap)

    def _send(self, out: bytes | bytearray) -> None:
        if self.tap is not None:
            self.tap.record(True, out)
        self.sock.settimeout(self.engine.settings.request_timeout)
        self.sock.sendall(out)


class BlockingListener:
    """A listening endpoint (``rdma_listen``): startups in the calling thread
    (:meth:`get_request`) or a thread each (:meth:`serve`)."""

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        settings: MpaSettings | None = None,
        backlog: int = 64,
        tap_factory: SocketTapFactory | None = None,
        max_startups: int = MAX_STARTUPS,
        max_startups_per_peer: int = MAX_STARTUPS_PER_PEER,
    ) -> None:
        self.settings = settings or MpaSettings()
        self.tap_factory = tap_factory
        """Called with each accepted socket and False; its tap records the connection."""
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self._sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self._sock.bind((host, port))
            self._sock.listen(backlog)
        except OSError:
            self._sock.close()
            raise
        self.host: str = host
        self.port: int = self._sock.getsockname()[1]
        self.failures: list[Exception] = []
        """Why startups that reached no request ended (newest last, at most 64 kept)."""
        self.slots = StartupSlots(max_startups, max_startups_per_peer)
        """:meth:`serve`'s startup slots, shared fairly between peer addresses."""
        self.refused = 0
        """Connections :meth:`serve` closed at once because a startup bound was reached."""
        self.accept_errors = 0
        """accept() failures :meth:`serve` survived (descriptor exhaustion and the like)."""
        self._lock = threading.Lock()
        self._closed = False

    def __enter__(self) -> BlockingListener:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop listening; a :meth:`get_request` or :meth:`serve` waiting in another thread
        returns (an error, or :meth:`serve` returns)."""
        self._closed = True
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._sock.close()

    def get_request(self, timeout: float | None = None) -> BlockingRequest:
        """Accept TCP connections until one's MPA Request arrives; return it.

        Raises :class:`~stack.errors.ConnectionTimeout` after ``timeout`` seconds (None:
        wait), :class:`OSError` once the listener is closed."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise ConnectionTimeout(f"no connect request within {timeout} s")
            self._sock.settimeout(left)
            try:
                sock, remote = self._sock.accept()
            except TimeoutError:
                continue
            request = self._startup(sock, (str(remote[0]), int(remote[1])))
            if request is not None:
                return request

    def serve(self, handle: Callable[[BlockingRequest], None]) -> None:
        """Accept until :meth:`close`, each MPA startup in a thread of its own that then
        calls ``handle`` with the request (``handle`` answers it).  A connection beyond the
        startup bounds is closed at once, or takes a busier address's or its own stale slot
        (:class:`~stack.transport.startup_slots.StartupSlots`, MPA-23); a failing accept()
        backs off and tries again, as the trio listener's does."""
        backoff = ACCEPT_BACKOFF_MIN
        try:
            self._sock.settimeout(None)
        except OSError:
            if self._closed:
                return  # closed before this thread got here: nothing to serve
            raise
        while not self._closed:
            try:
                sock, remote = self._sock.accept()
            except OSError as exc:
                if self._closed:
                    return
                self.accept_errors += 1
                log.warning("listener: accept failed (%s); retrying in %.2f s", exc, backoff)
                time.sleep(backoff)
                backoff = min(backoff * 2, ACCEPT_BACKOFF_MAX)
                continue
            backoff = ACCEPT_BACKOFF_MIN
            self._start(sock, (str(remote[0]), int(remote[1])), handle)

    def _start(
        self,
        sock: socket.socket,
        remote: tuple[str, int],
        handle: Callable[[BlockingRequest], None],
    ) -> None:
        """Admit a new connection to a startup slot and start its thread, or close it."""

        def evict() -> None:  # under self._lock, before the owner releases (and closes)
            log.warning("listener: %s: startup slot given to another connection", remote[0])
            try:
                sock.shutdown(socket.SHUT_RDWR)  # its recv() returns: the startup ends
            except OSError:
                pass

        with self._lock:
            slot = self.slots.admit(remote[0], evict, time.monotonic())
        if slot is None:
            self.refused += 1
            log.warning("listener: %s: too many MPA startups in progress; closed", remote[0])
            sock.close()
            return

        def run() -> None:
            try:
                request = self._startup(sock, remote, slot)
            finally:
                self._release(slot)  # released already, unless something unforeseen raised
            if request is not None:
                handle(request)

        try:
            threading.Thread(target=run, name=f"mpa-startup-{remote[0]}", daemon=True).start()
        except RuntimeError as exc:  # no thread to be had
            log.warning("listener: %s: cannot start a startup thread: %s", remote[0], exc)
            self._release(slot)
            sock.close()

    def _release(self, slot: StartupSlot) -> bool:
        """Give ``slot`` back; False if it was evicted (its socket shut down) before."""
        with self._lock:
            if slot.released:
                return False
            self.slots.release(slot)
            return True

    def _startup(
        self, sock: socket.socket, remote: tuple[str, int], slot: StartupSlot | None = None
    ) -> BlockingRequest | None:
        """One MPA startup as the responder: the request, or None (the socket closed).
        ``slot`` (:meth:`serve`) is released before the socket is closed or handed on."""
        tap = None
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            tap = self.tap_factory(sock, False) if self.tap_factory is not None else None
            engine = IwarpConnection(Role.RESPONDER, with_emss(self.settings, sock))
            engine.start(time.monotonic())
            # The engine's timers end a silent peer (MPA-27); this bounds the whole startup.
            deadline = time.monotonic() + self.settings.request_timeout
            event = _startup(sock, engine, deadline, tap)
        except (OSError, ConnectFailed) as exc:
            event = ConnectionFailed(exc)
        evicted = slot is not None and not self._release(slot)
        if isinstance(event, RequestReceived) and not evicted:
            return BlockingRequest(sock, engine, event.frame, remote, self.settings, tap)
        error = event.error if isinstance(event, ConnectionFailed) else None
        self.failures = [*self.failures[-63:], error or ConnectFailed(f"MPA startup: {event!r}")]
        log.info("listener: MPA startup from %s failed: %s", remote, error or event)
        _close(sock, tap)
        return None


def _close(sock: socket.socket, tap: Tap | None) -> None:
    """A connection that never became a BlockingConnection: its socket and its tap."""
    sock.close()
    close_tap(tap)


def _startup(
    sock: socket.socket, engine: IwarpConnection, deadline: float, tap: Tap | None
) -> object:
    """Run the MPA startup until an event other than NEED_DATA; returns that event."""
    while True:
        _send_pending(sock, engine, deadline, tap)
        event = engine.next_event()
        if not isinstance(event, NeedData):
            _send_pending(sock, engine, deadline, tap)
            return event
        now = time.monotonic()
        if now >= deadline:
            raise ConnectFailed("MPA startup timed out", ConnectionTimeout("startup timeout"))
        timer = engine.timer_deadline()
        sock.settimeout(max(0.001, (deadline if timer is None else min(timer, deadline)) - now))
        try:
            data = sock.recv(RECEIVE_SIZE)
        except TimeoutError:
            engine.handle_timer(time.monotonic())
            continue
        if tap is not None and data:
            tap.record(False, data)
        engine.receive_data(data)


def _send_pending(
    sock: socket.socket, engine: IwarpConnection, deadline: float, tap: Tap | None
) -> None:
    """Send what the startup engine has queued, within ``deadline``."""
    out = engine.data_to_send()
    if out:
        if tap is not None:
            tap.record(True, out)
        sock.settimeout(max(0.001, deadline - time.monotonic()))
        sock.sendall(out)
