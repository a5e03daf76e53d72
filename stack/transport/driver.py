"""The trio driver: a sans-IO :class:`IwarpConnection` and a :class:`QueuePair` on a TCP stream.

Theory of operation (the shape of trio's ``SSLStream``: an engine, one pump per direction).

* The *reader* task receives bytes (from the socket itself when there is one), feeds the
  engine, and applies every RDMAP event to the QP, :data:`FEED_BUDGET` events at a time
  with what they produced sent after each (the peer gets its first answers early).  A
  :class:`ProtocolError` (from the engine's DDP/RDMAP validation or the QP's protection
  checks) makes the connection send a Terminate with the offending ULPDU's headers (RFC
  5040 §7.1), move the QP to TERMINATE and close gracefully (RDMAP-15).
* Sends go out from the task that produced them when they can (fewer wake-ups per round
  trip): the reader after feeding a segment (Read Responses, atomic responses, in the pass
  that parsed their requests), and :meth:`QueuePair.post_send` (one WR, or a post list: one
  encode pass, one send).  Corking: once a task has sent, its further posts before the
  driver's tasks run again (a loop of single-WR posts in one task step) wait for the writer,
  which sends them in one pass when the task yields.  On a socket they leave as
  scatter-gather ``sendmsg`` calls (:class:`~stack.transport.sendq.SendQueue`: framing bytes
  and views of registered memory, many FPDUs per call); what the socket does not take now is
  copied and the *writer* task sends it once the socket is writable, with whatever was
  queued while it waited.  Output queued inside a feed or a send wakes no task: the pass in
  progress sends it.  A stream that is not a socket is written with ``send_all`` by the
  writer alone.
* Orderly close (RFC 5040 §6.2, DDP-13): :meth:`RdmaConnection.disconnect` sends every WR
  posted before it, then FIN, and keeps reading until the peer's FIN; the peer's FIN first
  lets what can still complete go out (:meth:`QueuePair.peer_closed`), then FIN.  When the
  stream is gone the QP enters ERROR (from CLOSING, or from TERMINATE after a Terminate).
* The optional capture tap records both directions exactly as they crossed the socket.
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Callable

import trio

from stack.errors import ConnectionTimeout
from stack.rnic.cq import CompletionQueue
from stack.rnic.endpoint import QpEndpoint
from stack.rnic.qp import QpState, QueuePair
from stack.rnic.verbs import WorkCompletion
from stack.transport.heap import keep_freed_memory
from stack.transport.pumping import (
    DISCONNECT_TIMEOUT,
    FEED_BUDGET,
    RECEIVE_CHUNK,
    RECEIVE_MAX,
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

log = logging.getLogger(__name__)

_CLOSING = QpState.CLOSING  # a module global: an Enum.MEMBER lookup is slow


class RdmaConnection:
    """A connected QP over a trio stream.  Created by the connection manager."""

    def __init__(
        self,
        stream: trio.abc.Stream,
        engine: IwarpConnection,
        qp: QueuePair,
        *,
        tap: Tap | None = None,
        sock: socket.socket | None = None,
        follow_mss: bool = False,
    ) -> None:
        self.stream = stream
        self.engine = engine
        self.qp = qp
        self.tap = tap
        self.negotiated: Negotiated | None = engine.negotiated
        self.error: Exception | None = None
        self.peer_closed = False
        self.closed = trio.Event()
        self._wake = trio.Event()
        self._reader_done = trio.Event()
        self._drained = trio.Event()
        self._closing = False  # reading is over: flush what is queued, FIN, tear down
        self._disconnecting = False  # the ULP asked for an orderly close
        self._aborted = False  # abort() before the pumps started: they end at once
        self.on_closed: Callable[[RdmaConnection], None] | None = None
        self.endpoint = QpEndpoint(engine, qp)
        # Scatter-gather sends need the socket itself (a trio stream has no sendmsg): the
        # stream's socket (made in run(), released in _finish), or ``sock`` from a test.
        self._given_sock = sock
        self._sock: socket.socket | None = None
        self._sendq: SendQueue | None = None
        self._flushing = False  # inside a send or a feed: QP callbacks only kick
        self._send_error: OSError | None = None  # the socket failed; the writer ends it
        self._rx_empty = True  # the last read emptied the socket
        self._rx_view: memoryview | None = None  # the receive buffer (made at first read)
        self._rx_end = 0  # where the last read's bytes end in it
        self._rx_grow = False  # the last read filled it: double it (RECEIVE_MAX)
        self._rx_failed: OSError | None = None  # a read failed after bytes it had read
        self._rx_refed = 0  # bytes the last read returned again (that partial FPDU)
        self._sent_in_step = False  # a task sent since the driver's tasks last ran
        self._reading_over = False  # FIN, Terminate or error: no more input is applied
        self._driver: trio.lowlevel.Task | None = None  # a task in next_completion drives
        self._reader_wait: trio.CancelScope | None = None  # the reader waits for input
        self._reader_parked = False  # the reader waits for the driving task to finish
        self._reader_resume = trio.Event()
        self._driven = False  # a task called next_completion: the reader's waits give way
        self._driver_waiting = False  # the driving task waits for input
        self._wakeups = 0  # times _pushed woke it (a wait it ends, for input or room, retries)
        # EMSS from the socket: follow TCP's segment size as the peer's window opens
        self._follow_mss = follow_mss
        self._emss: EmssFollower | None = None  # made with the socket (run)
        qp.on_output = self._on_output

    def __repr__(self) -> str:
        return f"<RdmaConnection qp={self.qp.qp_num} {self.qp.state.value}>"

    # ------------------------------------------------------------------ lifecycle
    async def run(self) -> None:
        """Pump until the connection ends (run it in a nursery)."""
        if self._aborted:
            await self._finish()
            return
        keep_freed_memory()  # bursts of FPDU buffers reuse the heap (stack.transport.heap)
        self._sock = self._given_sock or _raw_socket(self.stream)
        if self._sock is not None:
            self._sendq = SendQueue(self._sock.sendmsg)
            if self._follow_mss:
                self._emss = EmssFollower(self._sock, self.engine)
        self.qp.set_rts()
        if self._disconnecting:  # disconnect() came before the pumps started
            self.qp.close()
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                nursery.start_soon(self._writer)
                # Events that arrived with the MPA Reply (or before accept) come first.
                if self._feed(None):
                    self._kick()
                    await self._reader()
                # Reading is over (FIN, error, Terminate): let the writer flush what is
                # queued (a Terminate, say), send FIN and return.
                self._reader_done.set()
                self._closing = True
                self._kick()
        finally:
            await self._finish()

    async def _finish(self) -> None:
        if self._sock is not None:
            self._sock.detach()  # the stream owns the descriptor: it is closed below
        self._sock = self._sendq = None
        self.endpoint.stream_closed(None if self.peer_closed else self.error)
        with trio.CancelScope(shield=True):
            await trio.aclose_forcefully(self.stream)
        close_tap(self.tap)
        self.closed.set()
        if self.on_closed is not None:
            self.on_closed(self)
        # Break the QP -> connection reference cycle, so a closed connection's buffers go
        # when its last reference does, not at the next cyclic garbage collection.
        if self.qp.on_output == self._on_output:
            self.qp.on_output = None
        self.on_closed = None

    async def disconnect(self, timeout: float | None = DISCONNECT_TIMEOUT) -> None:
        """Orderly close (``rdma_disconnect``): send every WR posted before, then FIN; read
        until the peer's FIN (answers to our Reads still complete); flush what is left.

        A peer that never answers an outstanding Read or atomic, or never closes, would hold
        the close for ever: after ``timeout`` seconds (None: wait) the stream is aborted, the
        error is a :class:`~stack.errors.ConnectionTimeout`, and every WR still outstanding
        completes with WR_FLUSH_ERR (RFC 5040 §6.2)."""
        if not (self._closing or self._disconnecting):
            self._disconnecting = True
            self.qp.close()
            self._kick()
        with trio.move_on_after(float("inf") if timeout is None else timeout) as scope:
            await self.closed.wait()
        if scope.cancelled_caught:
            self.abort(ConnectionTimeout(f"orderly close not done within {timeout} s"))
            await self.closed.wait()

    def abort(self, error: Exception | None = None) -> None:
        """Tear the stream down now (no FIN, no flush of what is queued); ``error`` is why."""
        self.error = self.error or error
        self._aborted = True
        nursery = getattr(self, "_nursery", None)
        if nursery is not None:
            nursery.cancel_scope.cancel()

    def uncork(self) -> None:
        """Send what the calling task's posts left corked, and let its next output go out
        at once too, even though it has sent before in this scheduler step (posts are
        otherwise corked until it yields).  For a consumer answering a drain of
        completions in parts (:func:`drain_halves`): the first part's answers leave while
        it works on the next, so the peer works on them meanwhile."""
        if self.endpoint.has_output and not self._flushing:
            self._flush()
        self._sent_in_step = False

    async def wait_closed(self) -> None:
        await self.closed.wait()

    @property
    def receive_buffer_size(self) -> int:
        """Bytes of this connection's receive buffer: 0 before its first read (or on a
        stream that is not a socket), :data:`RECEIVE_SIZE` at first, up to
        :data:`RECEIVE_MAX` once it carries a bulk stream."""
        return 0 if self._rx_view is None else len(self._rx_view)

    @property
    def awaiting_first_fpdu(self) -> bool:
        """Responder: nothing has come from the initiator yet; our FPDUs wait (MPA-25)."""
        return self.endpoint.holding

    def send_first(self) -> None:
        """Responder: send without waiting for the initiator's first FPDU (waives MPA-25;
        :meth:`~stack.wire.mpa.MpaConnection.send_first`)."""
        self.engine.mpa.send_first()
        self._kick()

    # ------------------------------------------------------------------ reader
    async def _reader(self) -> None:
        while not self._reading_over:
            if self._driver is not None:  # a task drives the input (next_completion)
                self._reader_resume = trio.Event()
                self._reader_parked = True
                await self._reader_resume.wait()
                self._reader_parked = False
                continue
            if self.endpoint.stalled is not None or self.endpoint.events_pending:
                # What a driving task left when it was cancelled: applied before more is read.
                if not await self._apply(None):
                    return
                continue
            try:
                data = await self._receive(stand_down=self._driven)
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
                self.error = self.error or exc
                return
            if data is not None and not await self._apply(data):
                return

    async def _apply(self, data: bytes | bytearray | memoryview | None) -> bool:
        """Apply what one read returned (None: what is left to apply), a budget of events
        at a time, sending what each budget produced; wait while an event waits for queued
        Read Responses to go out.  False once reading is over (FIN, Terminate, error)."""
        self._sent_in_step = False
        if self.tap is not None and data:
            self.tap.record(False, data[self._rx_refed :])  # the new bytes only
        if not self._feed(data, FEED_BUDGET):
            return self._stop_reading()
        self._flush()
        while self.endpoint.events_pending:  # the rest of the chunk, a budget at a time
            if not self._feed(None, FEED_BUDGET):
                return self._stop_reading()
            self._flush()
        # Backpressure: an event waits for queued Read Responses to go out; read no more
        # until the writer has sent them (it resumes the event itself).
        while self.endpoint.stalled is not None and not self.endpoint.reading_done:
            self._drained = trio.Event()
            self._kick()
            sendq = self._sendq
            sent = None if sendq is None else sendq.sent
            with trio.move_on_after(STALL_RELEASE_AFTER):
                await self._drained.wait()
            if sendq is not None and sendq.sent == sent and not self._drained.is_set():
                with self.endpoint.stall_released():  # none of our output moved
                    self._feed(None)
                self._flush()
        self.error = self.endpoint.error or self.error
        self.peer_closed = self.endpoint.peer_closed
        if self.endpoint.reading_done:
            return self._stop_reading()
        return True

    def _stop_reading(self) -> bool:
        self._reading_over = True
        return False

    async def next_completion(self, cq: CompletionQueue) -> WorkCompletion:
        """The next completion of ``cq``, this connection's input driven by the calling
        task while it waits (manual progress, as a consumer that polls its CQ drives a
        verbs device): the reader task stands down, and the bytes that complete the WR are
        read and applied by this task, which goes on at once, with no hand-off to it from
        the reader (one scheduler pass fewer per round trip).  Otherwise as ``await
        cq.next()``: when ``cq`` takes completions of other queue pairs too, another task
        drives, the reader is busy (not waiting for input), or reading is over."""
        done = cq.poll(1)
        if done:
            return done[0]
        self._driven = True  # from the reader's next wait on, it gives way to such a task
        if (
            self._driver is not None
            or self._reading_over
            or self._sock is None
            or cq.queue_pairs != 1
            or (cq is not self.qp.send_cq and cq is not self.qp.recv_cq)
            or not (self._reader_parked or self._reader_wait is not None)
        ):
            return await cq.next()
        self._driver = trio.lowlevel.current_task()
        waiting = self._reader_wait
        if waiting is not None:
            waiting.cancel()  # it leaves the socket now, and parks when it next runs
        # A completion that comes another way (a Write or Send WR completing as another
        # task's send pass takes it, a flush) ends the wait for input (_pushed).
        cq.watchers.append(self._pushed)
        try:
            while not self._reading_over:
                wakeups = self._wakeups
                self._driver_waiting = True
                try:
                    data = await self._receive()
                except trio.ClosedResourceError:
                    if self._wakeups == wakeups:
                        raise
                    data = None  # woken by _pushed: nothing was read
                finally:
                    self._driver_waiting = False
                if data is not None and not await self._apply(data):
                    break
                done = cq.poll(1)
                if done:
                    return done[0]
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
            self.error = self.error or exc  # the reader meets it too, and ends
        finally:
            cq.watchers.remove(self._pushed)
            self._driver = None
            self._reader_resume.set()
        return await cq.next()

    def _pushed(self) -> None:
        """A completion was pushed to the CQ a task waits on in :meth:`next_completion`:
        if it came while that task waits for input (another task pushed it), wake it.
        ``notify_closing`` is trio's one way to end a wait for readability without a
        cancel scope around every wait (which cost this path a sixth of its round trip);
        the socket stays open, the next wait registers it again, and the writer retries a
        wait for writability it ends (:meth:`_send_socket`)."""
        if self._driver_waiting and self._sock is not None:
            self._wakeups += 1
            trio.lowlevel.notify_closing(self._sock)

    async def _receive(self, stand_down: bool = False) -> bytes | bytearray | memoryview | None:
        """The next received bytes (b"" at FIN).  On a socket, straight from it into the
        preallocated receive buffer (``recv_into``; the bytes are a view of it, parsed in
        place by :meth:`_feed`): after a read that emptied the socket, wait for
        readability first (one ``recv_into`` per message).  The socket is read in
        :data:`RECEIVE_CHUNK` calls until it has no more or the buffer is full.  A partial
        FPDU the engine left at the end of the last read comes again first.  With
        ``stand_down`` (the reader) the wait for readability gives way to a task that
        drives the input (:meth:`next_completion`): None, nothing read."""
        sock = self._sock
        if sock is None:
            return await self.stream.receive_some(RECEIVE_SIZE)
        if self._rx_failed is not None:
            raise self._rx_failed
        if self._rx_empty:
            if not await self._wait_readable(sock, stand_down):
                return None
        else:
            await trio.lowlevel.checkpoint()
        rx = self._rx_view
        if rx is None:
            rx = self._rx_view = memoryview(bytearray(RECEIVE_SIZE))
            self.engine.mpa.keep_tail = True  # a partial FPDU stays here (see below)
        # A partial FPDU the engine left at the end of the last read (MPA-16) stays where it
        # is and the next read lands right after it, so the FPDU is parsed in place, not
        # copied out and joined with what completes it; it moves to the front only when
        # less than half the buffer is left behind it (each byte moves at most once).
        tail = self.engine.mpa.tail  # of the last read's bytes (only they are memoryviews)
        end = self._rx_end
        start = end - tail
        if self._rx_grow:  # the last read filled the buffer: a bulk stream (RECEIVE_MAX)
            self._rx_grow = False
            grown = memoryview(bytearray(2 * len(rx)))
            grown[:tail] = rx[start:end]  # views of the old buffer keep it alive
            rx = self._rx_view = grown
            start, end = 0, tail
        elif not tail:
            start = end = 0
        elif len(rx) - end < len(rx) >> 1:
            rx[:tail] = rx[start:end]
            start, end = 0, tail
        room = rx[end:]
        chunk = RECEIVE_CHUNK
        got = 0
        while True:
            try:
                n = sock.recv_into(room[got : got + chunk])
            except BlockingIOError:
                if got:
                    self._rx_empty = True
                    break
                if not await self._wait_readable(sock, stand_down):
                    return None
                continue
            except OSError as exc:
                if not got:
                    raise
                self._rx_failed = exc  # the bytes before it are applied first
                break
            if not n:  # FIN: a partial FPDU left can never complete
                self._rx_empty = True
                if got:  # the bytes before it first (recv_into returns 0 again next time)
                    break
                self._rx_refed = 0
                return b""
            got += n
            if n < chunk or got == len(room):
                self._rx_empty = got < len(room)
                break
        if not self._rx_empty and len(rx) < RECEIVE_MAX and not self._rx_marked():
            self._rx_grow = True
        self._rx_refed = tail
        self._rx_end = end + got
        return rx[start : end + got]

    async def _wait_readable(self, sock: socket.socket, stand_down: bool) -> bool:
        """Wait until ``sock`` is readable; False when a task that drives the input took
        the wait over (``stand_down``: the reader's wait, :meth:`next_completion`)."""
        if not stand_down:
            await trio.lowlevel.wait_readable(sock)
            return True
        with trio.CancelScope() as scope:
            self._reader_wait = scope
            try:
                await trio.lowlevel.wait_readable(sock)
            finally:
                self._reader_wait = None
        return not scope.cancelled_caught

    def _rx_marked(self) -> bool:
        """Whether the peer inserts markers in what we receive (MPA-07): such a stream keeps
        the small buffer (with markers a read's bytes are copied once more to cut them out,
        and reads of 1 MiB made 1 MiB Writes 5-12 % and 64 KiB Writes 6-15 % slower)."""
        negotiated = self.engine.negotiated
        return negotiated is not None and negotiated.markers_rx

    def _feed(self, data: bytes | bytearray | memoryview | None, budget: int = 0) -> bool:
        """Apply received bytes.  A view of the receive buffer is parsed in place (the
        engine copies only a partial FPDU at its end); the buffer is not read into again
        before the events that view it are applied (the reader waits while one is
        stalled)."""
        self._flushing = True  # output waits until this feed (a budget of events) is done
        try:
            ok = self.endpoint.feed(data, budget)
        finally:
            self._flushing = False
        self.error = self.endpoint.error or self.error
        self.peer_closed = self.endpoint.peer_closed
        return ok

    # ------------------------------------------------------------------ writer
    def _kick(self) -> None:
        self._wake.set()

    def _on_output(self) -> None:
        """The QP queued output: send it now, from the calling task.

        A call from inside a feed or a send wakes nobody: the reader sends after the chunk
        it applied, and a send in progress takes what was queued meanwhile (:meth:`_flush`
        loops until the QP has nothing more).  A post list arrives here once, after all
        of its WRs were queued (:meth:`QueuePair.post_send`)."""
        if self._flushing:
            return
        if self._sent_in_step:
            self._kick()  # a burst: the writer sends the rest once this task yields
            return
        self._sent_in_step = True
        self._flush()

    def _flush(self) -> None:
        """Send what can go out now, from the calling task; leave the rest to the writer."""
        sendq = self._sendq
        if sendq is None or self._flushing or sendq.has_backlog or self._send_error is not None:
            self._kick()
            return
        if self._emss is not None:
            self._emss = self._emss.check(sendq.sent)
        endpoint = self.endpoint
        qp = self.qp
        self._flushing = True
        try:
            send_pass(endpoint, sendq, self.tap)
        except OSError as exc:
            self._send_error = exc
            sendq.clear()
        finally:
            self._flushing = False
        if (
            sendq.has_backlog
            or self._send_error is not None
            or self._closing
            or endpoint.closing
            or endpoint.stalled is not None
            or qp.state is _CLOSING
        ):
            self._kick()  # the writer: backlog, an error, FIN, a stalled reader

    async def _writer(self) -> None:
        while True:
            await self._wake.wait()
            self._wake = trio.Event()
            self._sent_in_step = False
            if self._sendq is not None:
                if not await self._send_socket(self._sendq):
                    return
            elif not await self._send_stream():
                return
            self._drained.set()
            # FIN once everything queued and posted is out (an orderly close, ours or the
            # peer's), or at once when reading failed (the stream is lost, nothing to keep).
            lost = self._closing and not self.endpoint.reading_done
            if lost or self.endpoint.wants_close:
                try:
                    await self.stream.send_eof()  # type: ignore[attr-defined]
                except (
                    AttributeError,
                    trio.BrokenResourceError,
                    trio.ClosedResourceError,
                    OSError,
                ):
                    pass
                # Give the peer a moment to close its side, then tear down.
                with trio.move_on_after(2.0):
                    await self._reader_done.wait()
                self._nursery.cancel_scope.cancel()
                return

    async def _send_socket(self, sendq: SendQueue) -> bool:
        """Drain the backlog and everything queued; False when the socket failed."""
        assert self._sock is not None
        while self._send_error is None:
            if sendq.has_backlog:
                wakeups = self._wakeups
                try:
                    await trio.lowlevel.wait_writable(self._sock)
                    if not sendq.send_backlog():
                        continue
                except trio.ClosedResourceError:
                    if self._wakeups != wakeups:
                        continue  # a driving task's wake-up (_pushed): the socket is open
                    self._send_error = OSError("the socket was closed")
                    break
                except OSError as exc:
                    self._send_error = exc
                    break
            self._flush()
            if not sendq.has_backlog and (not self.endpoint.has_output or self.endpoint.holding):
                break  # sent, or held until the initiator's first FPDU (MPA-25)
        if self._send_error is not None:
            self.error = self.error or self._send_error
            sendq.clear()
            self._nursery.cancel_scope.cancel()
            return False
        return True

    async def _send_stream(self) -> bool:
        """Without a socket: ``send_all`` of each coalesced batch; False when it failed."""
        while True:
            data = self.endpoint.produce()
            if not data:
                return True
            if self.tap is not None:
                self.tap.record(True, data)
            try:
                await self.stream.send_all(data)
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
                self.error = self.error or exc
                self._nursery.cancel_scope.cancel()
                return False


def _raw_socket(stream: trio.abc.Stream) -> socket.socket | None:
    """A standard socket object on a trio socket stream's descriptor (not a duplicate, so a
    close of the stream is seen at once), or None for other streams.  Release it with
    ``detach()``: the stream closes the descriptor.  A send pass of unsent data fits
    (:func:`~stack.transport.sockopts.limit_unsent`)."""
    trio_sock = getattr(stream, "socket", None)
    if trio_sock is None or trio_sock.type != socket.SOCK_STREAM or trio_sock.fileno() < 0:
        return None  # not a socket, or already closed: the stream's own errors then
    sock = socket.socket(trio_sock.family, trio_sock.type, trio_sock.proto, trio_sock.fileno())
    sock.setblocking(False)
    limit_unsent(sock)  # a whole send pass per sendmsg, not trio's 16 KiB
    return sock
