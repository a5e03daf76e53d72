"""The blocking driver: one QP on a blocking TCP socket, no event loop.

Theory of operation.  :class:`BlockingConnection` pumps the same sans-IO
:class:`~stack.rnic.endpoint.QpEndpoint` as the trio driver
(:class:`~stack.transport.driver.RdmaConnection`), from the one thread that uses the QP:

* Output goes out from the call that made it: :meth:`QueuePair.post_send` (one WR or a
  post list) reaches the socket before it returns, and so do the answers (Read Responses,
  atomic responses, Terminates) to what a read applied.  Sends are scatter-gather
  ``sendmsg`` calls that never block (:class:`~stack.transport.sendq.SendQueue`, framing
  bytes and views of registered memory); what the socket does not take is copied and sent
  as soon as it is writable again, by whichever call waits next.
* Nothing is read until the thread asks: :meth:`next_completion` (wait for the next
  completion on a CQ), :meth:`poll_cq` (busy polling, perftest's default) and
  :meth:`progress` read what has arrived and apply it, :data:`FEED_BUDGET` events at a time
  with what they produced sent after each, as the trio driver's reader does.  A read with
  nothing to send is one blocking ``recv_into``; while output waits for the socket the
  thread waits for both directions (``poll``), so a peer that stops reading until it can
  send cannot deadlock it.
* So a round trip costs a ``sendmsg`` and a ``recv_into`` at this end and no scheduler pass:
  the trio driver's reader task, woken by the socket, wakes the task awaiting the CQ (one
  more pass of the trio loop).  For latency-bound programs with one connection per thread
  and for perftest-style latency runs (``iwarp bench read --lat --blocking``); a server with
  many connections wants the trio driver.
* Close: the peer's FIN lets what can still complete go out, then FIN
  (:meth:`QueuePair.peer_closed`, DDP-13); :meth:`disconnect` is the orderly close of RFC
  5040 §6.2 (every WR posted before it, FIN, read until the peer's FIN); after a Terminate,
  an error or a lost stream the QP enters ERROR and its WRs complete with WR_FLUSH_ERR.
  :mod:`stack.transport.blocking_cm` connects and listens (the MPA startup of RFC 5044
  §7.1, with the engine's timers, MPA-27).

The EMSS is the socket's segment size, followed as it grows as the trio driver follows it
(:class:`~stack.transport.pumping.EmssFollower`) unless the settings fix ``emss`` or
``mulpdu``.
"""

from __future__ import annotations

import select
import socket
import time
from collections.abc import Sequence

from stack.buffers import Buffer
from stack.errors import ConnectionTimeout, IwarpError
from stack.rnic.cq import CompletionQueue
from stack.rnic.endpoint import QpEndpoint
from stack.rnic.qp import QueuePair
from stack.rnic.verbs import WorkCompletion
from stack.transport.cm import bind_ird_ord
from stack.transport.pumping import (
    DISCONNECT_TIMEOUT,
    FEED_BUDGET,
    RECEIVE_SIZE,
    STALL_RELEASE_AFTER,
    EmssFollower,
    Tap,
    close_tap,
    send_pass,
)
from stack.transport.sendq import SendQueue
from stack.transport.sockopts import limit_unsent
from stack.wire.connection import IwarpConnection
from stack.wire.events import Negotiated

__all__ = ["BlockingConnection", "ConnectionClosed"]

FIN_WAIT = 2.0
"""Seconds a connection whose reading ended waits for its last output to leave."""

_POLL_IN = select.POLLIN | select.POLLPRI | select.POLLERR | select.POLLHUP
_POLL_OUT = select.POLLOUT | select.POLLERR | select.POLLHUP


class ConnectionClosed(IwarpError):
    """The connection ended (FIN, Terminate, error) before the awaited completion came."""


class BlockingConnection:
    """A connected QP on a blocking socket, pumped by the thread that calls it.

    Made by :func:`~stack.transport.blocking_cm.connect` and
    :meth:`~stack.transport.blocking_cm.BlockingRequest.accept` (or from a socket whose
    MPA startup ``engine`` has completed).  One thread uses it and its QP: nothing here
    locks.  As a context manager it disconnects on leaving (aborts on an exception).
    Fields: ``negotiated`` (the MPA outcome), ``error`` (why the connection ended, or
    None), ``peer_closed`` (the peer sent FIN), ``closed`` (the socket is closed).
    """

    def __init__(
        self,
        sock: socket.socket,
        engine: IwarpConnection,
        qp: QueuePair,
        *,
        tap: Tap | None = None,
        follow_mss: bool = False,
    ) -> None:
        if engine.negotiated is None:
            raise IwarpError("the MPA startup of this connection has not completed")
        self.sock = sock
        self.engine = engine
        self.qp = qp
        self.tap = tap
        self.negotiated: Negotiated = engine.negotiated
        self.error: Exception | None = None
        self.peer_closed = False
        self.closed = False
        self.endpoint = QpEndpoint(engine, qp)
        self._sendq = SendQueue(self._sendmsg)
        self._rx = memoryview(bytearray(RECEIVE_SIZE))
        self._busy = False  # inside a feed or a send: output waits for it to finish
        self._stall_mark = -1  # octets sent when the current stall's wait began
        self._stall_release = 0.0  # when that stall is released (STALL_RELEASE_AFTER)
        self._fin_sent = False
        self._emss = EmssFollower(sock, engine) if follow_mss else None
        sock.setblocking(True)
        limit_unsent(sock)
        bind_ird_ord(qp, engine)
        qp.on_output = self._on_output
        qp.set_rts()
        self._apply(None)  # events that arrived with the MPA Reply

    def __repr__(self) -> str:
        return f"<BlockingConnection qp={self.qp.qp_num} {self.qp.state.value}>"

    def __enter__(self) -> BlockingConnection:
        return self

    def __exit__(self, *exc: object) -> None:
        if exc[0] is None:
            self.disconnect()
        else:
            self.abort()

    # ------------------------------------------------------------------ waiting
    def progress(self, timeout: float | None = 0.0) -> bool:
        """Read what has arrived (waiting up to ``timeout`` seconds for it, None: until
        something comes), apply it and send what that produced; False once the connection
        reads no more (closed, the QP in ERROR; or the peer closed its half and only our
        last output is still leaving)."""
        if self.closed:
            return False
        sendq = self._sendq
        if sendq.has_backlog:
            sent = sendq.sent
            self._flush()
            if sendq.sent != sent:
                return not self.closed  # output moved: WRs may have completed, look first
        deadline = None if timeout is None else time.monotonic() + timeout
        if self.endpoint.stalled is not None:
            # An event waits for queued Read Responses to leave (backpressure): the
            # receive buffer it views is not read into until they have, or until none of
            # our output has moved for STALL_RELEASE_AFTER (a peer waiting for us).
            if sendq.has_backlog:
                if self._stall_mark != sendq.sent:  # output moved: the wait starts again
                    self._stall_mark = sendq.sent
                    self._stall_release = time.monotonic() + STALL_RELEASE_AFTER
                release = self._stall_release
                if not self._wait(False, release if deadline is None else min(deadline, release)):
                    if time.monotonic() >= release and self._stall_mark == sendq.sent:
                        with self.endpoint.stall_released():
                            self._apply(None)
            else:
                self._apply(None)  # they have left: apply it
            return not self.closed
        if self.closed:
            return False
        if self.endpoint.reading_done:  # the peer's FIN came: only our last output is left
            self._reading_over()
            if not self.closed:
                self._wait(False, deadline)  # a backlog still leaving
            return False
        data = self._read(deadline)
        if data is not None:
            self._apply(data)
        return not self.closed

    def poll_cq(self, cq: CompletionQueue, n: int = 16) -> list[WorkCompletion]:
        """Apply what has arrived without waiting, then take up to ``n`` completions
        (``ibv_poll_cq`` on a busy-polling thread)."""
        if not len(cq):
            self.progress(0.0)
        return cq.poll(n)

    def next_completion(self, cq: CompletionQueue, timeout: float | None = None) -> WorkCompletion:
        """Read and apply until ``cq`` holds a completion, and take it.

        Raises :class:`~stack.errors.ConnectionTimeout` after ``timeout`` seconds (None:
        wait), :class:`ConnectionClosed` when the connection ended and left ``cq`` empty
        (its WRs complete with WR_FLUSH_ERR first, so a WR posted here is reported)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not len(cq):
            if self.closed:
                raise ConnectionClosed(f"connection closed: {self.error or 'orderly close'}")
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise ConnectionTimeout(f"no completion within {timeout} s")
            if not self.progress(left) and not len(cq):
                why = self.error or ("the peer closed" if self.peer_closed else "orderly close")
                raise ConnectionClosed(f"connection closed: {why}")
        return cq.poll(1)[0]

    # ------------------------------------------------------------------ closing
    def disconnect(self, timeout: float | None = DISCONNECT_TIMEOUT) -> None:
        """Orderly close (``rdma_disconnect``): send every WR posted before, then FIN; read
        until the peer's FIN (answers to our Reads still complete).  A peer that does not
        close within ``timeout`` seconds (None: wait) is aborted: the error is a
        :class:`~stack.errors.ConnectionTimeout` and outstanding WRs are flushed."""
        if self.closed:
            return
        self.qp.close()
        self._flush()
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self.closed:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                self.abort(ConnectionTimeout(f"orderly close not done within {timeout} s"))
                return
            self.progress(left)

    def abort(self, error: Exception | None = None) -> None:
        """Close the socket now (no FIN after what is queued); the QP enters ERROR."""
        self.error = self.error or error
        self._close()

    # ------------------------------------------------------------------ sending
    def _sendmsg(self, pieces: Sequence[Buffer]) -> int:
        return self.sock.sendmsg(pieces, (), socket.MSG_DONTWAIT)

    def _on_output(self) -> None:
        """The QP queued output: send it now, unless a feed or a send in progress will."""
        if not self._busy:
            self._flush()

    def _flush(self) -> None:
        """Send what can go out now; what the socket does not take waits in the backlog."""
        sendq = self._sendq
        if self.closed or self._busy:
            return
        endpoint = self.endpoint
        if self._emss is not None:
            self._emss = self._emss.check(sendq.sent)
        self._busy = True
        try:
            if sendq.has_backlog and not sendq.send_backlog():
                return  # nothing new may pass the backlog
            send_pass(endpoint, sendq, self.tap)
        except OSError as exc:
            self._lost(exc)
            return
        finally:
            self._busy = False
        if not sendq.has_backlog and endpoint.wants_close and not self._fin_sent:
            self._send_fin()

    def _send_fin(self) -> None:
        self._fin_sent = True
        try:
            self.sock.shutdown(socket.SHUT_WR)
        except OSError:
            pass
        if self.endpoint.reading_done:
            self._close()

    # ------------------------------------------------------------------ receiving
    def _read(self, deadline: float | None) -> memoryview | bytes | None:
        """The next received bytes (a view of the receive buffer; b"" at FIN), or None when
        ``deadline`` passed first."""
        rx = self._rx
        while not self.closed:
            try:
                if deadline is None and not self._sendq.has_backlog:
                    n = self.sock.recv_into(rx)  # nothing else to wait for: block here
                else:
                    n = self.sock.recv_into(rx, 0, socket.MSG_DONTWAIT)
            except BlockingIOError:
                if not self._wait(True, deadline) & _POLL_IN:
                    return None  # the deadline, or the backlog moved (the CQ may have more)
                continue
            except OSError as exc:
                self._lost(exc)
                return None
            if self.tap is not None and n:
                self.tap.record(False, rx[:n])
            return rx[:n] if n else b""
        return None

    def _wait(self, readable: bool, deadline: float | None) -> int:
        """Wait until the socket is readable (``readable``) or the backlog can move, and
        send what it can then.  Returns the ``poll`` events: 0 when ``deadline`` passed
        first, or when there is nothing to wait for."""
        backlog = self._sendq.has_backlog
        if not readable and not backlog:
            return 0  # nothing could change: only the caller's timeout is left
        poller = select.poll()
        poller.register(self.sock, (_POLL_IN if readable else 0) | (_POLL_OUT if backlog else 0))
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        events = 0
        for _fd, mask in poller.poll(None if left is None else left * 1000.0):
            events |= mask
        if backlog and events & _POLL_OUT:
            self._flush()  # may complete WRs: a caller waiting for the CQ looks again
        return events

    def _apply(self, data: memoryview | bytes | None) -> None:
        """Feed ``data`` a budget of events at a time, sending what each budget produced."""
        endpoint = self.endpoint
        while True:
            self._busy = True
            try:
                reading = endpoint.feed(data, FEED_BUDGET)
            finally:
                self._busy = False
            data = None
            if (
                endpoint.has_output
                or endpoint.stalled is not None
                or (not self._fin_sent and endpoint.wants_close)
            ):
                self._flush()
            if not reading or not endpoint.events_pending or self.closed:
                break
        self.error = endpoint.error or self.error
        self.peer_closed = endpoint.peer_closed
        if endpoint.reading_done and not self.closed:
            self._reading_over()

    def _reading_over(self) -> None:
        """FIN, a Terminate or an error ended reading: let the last output (a Terminate,
        what a FIN let complete) leave, send FIN, close."""
        deadline = time.monotonic() + FIN_WAIT
        while self._sendq.has_backlog and not self.closed and self._wait(False, deadline):
            pass
        if self.closed:
            return
        if self.error is None and not self.endpoint.wants_close:
            return  # the peer's FIN: our half stays open for what may still be posted
        if not self._fin_sent:
            self._send_fin()
        self._close()

    def _lost(self, exc: OSError) -> None:
        self.error = self.error or exc
        self._close()

    def _close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self._sendq.clear()
        try:
            self.sock.close()
        finally:
            self.endpoint.stream_closed(None if self.peer_closed else self.error)
            close_tap(self.tap)
            if self.qp.on_output == self._on_output:
                self.qp.on_output = None
