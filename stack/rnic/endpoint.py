"""A queue pair bound to its wire engine: the sans-IO heart of a connection.

:class:`QpEndpoint` joins a :class:`~stack.rnic.qp.QueuePair` and an
:class:`~stack.wire.connection.IwarpConnection`.  :meth:`feed` takes received bytes and
applies every event to the QP; :meth:`produce` drains the QP's outbound messages into bytes
to send.  Any :class:`ProtocolError` (the engine's DDP/RDMAP validation or the QP's
protection checks) is answered with a Terminate that copies the offending ULPDU's headers
(RFC 5040 §7.1), and the QP moves to TERMINATE.  The peer's FIN is an orderly close of
its half (DDP-13, :meth:`QueuePair.peer_closed`); :meth:`stream_closed` ends the stream
(the QP reaches ERROR).  The trio driver and the in-memory test pairs both use this class,
so they behave identically.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager

from stack.constants import IOV_MIN_PAYLOAD
from stack.errors import IwarpError, LocalError, ProtocolError
from stack.rnic.express import ExpressReceiver
from stack.rnic.qp import QpState, QueuePair
from stack.wire.connection import IwarpConnection
from stack.wire.events import (
    NEED_DATA,
    RDMAP_EVENT_TYPES,
    AtomicRequest,
    AtomicResponse,
    ConnectionFailed,
    NeedData,
    PeerClosed,
    RdmapEvent,
    RdmapMessage,
    ReadRequest,
    ReadResponse,
    ReadResponseSegment,
    SendSegment,
    TerminateReceived,
    WriteSegment,
)

log = logging.getLogger(__name__)

_CLOSING = QpState.CLOSING  # a module global: Enum.MEMBER is a slow lookup

_DATA_SEGMENTS = (WriteSegment, ReadResponseSegment, SendSegment)

MAX_COALESCE = 1024 * 1024
"""Bytes of payload gathered into one :meth:`QpEndpoint.produce` result at most."""


class PeerTerminated(IwarpError):
    """The peer sent a Terminate; ``terminate`` holds it."""

    def __init__(self, terminate: object) -> None:
        super().__init__(f"peer sent Terminate: {terminate}")
        self.terminate = terminate


class QpEndpoint:
    """One side of a connection: engine + QP, no I/O."""

    def __init__(self, engine: IwarpConnection, qp: QueuePair, *, bulk: bool = True) -> None:
        self.engine = engine
        self.qp = qp
        self._express: ExpressReceiver | None = None
        self.error: Exception | None = None
        self.peer_closed = False
        self.reading_done = False
        self.closing = False
        qp.ord_reserved += int(engine.rtr_read_outstanding)  # the RTR counts against ORD
        self.bulk = bulk
        self.stalled: RdmapEvent | None = None
        """An event waiting until queued Read Responses have gone out (backpressure,
        :meth:`QueuePair.must_wait`); the driver stops reading meanwhile."""
        self._part_mulpdu = engine.part_mulpdu  # a large message's parts (take_outgoing)

    @property
    def bulk(self) -> bool:
        """The bulk receive path: tagged and Send segments placed, and one-segment messages
        (Read Requests, atomics, Immediate Data) applied, as they are deframed, no event
        each (:meth:`IwarpConnection.receive_data`), and a memoryview fed parsed in place
        (:meth:`feed`).  False: every ULPDU becomes an event from the engine's own copy
        (the reference path)."""
        return self.engine.tagged_placer is not None

    @bulk.setter
    def bulk(self, on: bool) -> None:
        self.engine.tagged_placer = self.qp.place_tagged if on else None
        self.engine.send_placer = self.qp.place_send if on else None
        self.engine.message_placer = self.qp.place_message if on else None
        self.engine.mpa.borrow_views = on
        self.qp.express_send = self.express_send if on else None
        self._express = ExpressReceiver(self.engine, self.qp) if on else None

    def express_send(self, message: RdmapMessage) -> bool:
        """The QP's express path (:attr:`QueuePair.express_send`, on with :attr:`bulk`):
        frame a one-segment message the QP would queue with nothing ahead of it (a Read or
        atomic Request, a Read Response of less than
        :data:`~stack.constants.IOV_MIN_PAYLOAD` octets, an atomic Response) into the
        engine's output now, as :meth:`produce` would frame it in its turn: the same
        segments and MSNs (the stream's encoder) and FPDUs (the framer); a small Read
        Response's data is copied as it is framed.  False, nothing changed, while the
        engine does not send now (before Full Operation, while the responder waits for the
        initiator's first FPDU, MPA-25, after a failure), while a ``send_message`` hook is
        installed on the engine, for an answer to anything but a request that came alone
        in its feed (a later message of it could fail the stream, and answers still queued
        then are not sent), or for any other message."""
        engine = self.engine
        stream = engine.stream
        if (
            stream is None
            or not engine.mpa.sends_now
            or "send_message" in engine.__dict__
            or self.qp.chains is not None
        ):
            return False  # not sending now, a send_message hook, or chains (their order)
        kind = type(message)
        if kind is ReadRequest or kind is AtomicRequest:
            pass
        elif kind is ReadResponse or kind is AtomicResponse:
            # An answer only to a request that came alone: a later message of the same
            # feed could fail the stream, and then answers still queued are not sent.
            if not engine.mpa.taking_whole:
                return False
            if kind is ReadResponse and len(message.data) >= IOV_MIN_PAYLOAD:  # type: ignore[union-attr]
                return False  # framed by reference when it is taken: stays queued
        else:
            return False
        try:
            parts = stream.send_parts(message)
        except LocalError:  # after our Terminate, say: the queue's encoder reports it
            return False
        engine.mpa.send_ulpdu_parts(parts)
        return True

    def feed(self, data: bytes | bytearray | memoryview | None, budget: int = 0) -> bool:
        """Feed received bytes (None: drain pending events only; b"": FIN).

        With :attr:`bulk`, a memoryview is parsed in place, not copied: keep it unchanged
        while :attr:`stalled` or :attr:`events_pending` (the events that wait view it); it
        may be reused once this returns otherwise.  ``budget`` (0: none) is the most
        events applied in this call: the rest wait, :attr:`events_pending` is set, and the
        caller sends what they produced before feeding None for more (see
        :data:`~stack.transport.pumping.FEED_BUDGET`).  Returns False once nothing more will
        be read (FIN, Terminate, error).
        """
        self.events_pending = False
        if self.reading_done:
            return False
        express = self._express
        if express is not None and type(data) is memoryview and self.stalled is None:
            try:
                if express.take(data):  # one lone FPDU, applied (stack.rnic.express)
                    if self.qp.terminate_pending is not None:  # a CQ overflowed, say
                        self.fail(self.qp.terminate_pending, offending=False)
                        return self._stop()
                    return True
            except ProtocolError as exc:
                self.fail(exc)
                return self._stop()
        engine = self.engine
        # The bulk path's one-segment messages count against the budget as their events
        # would (FEED_BUDGET: a read full of requests gets its first answers out while the
        # rest wait), and none passes an event that waits.
        qp = self.qp
        limit = budget or -1
        stalled = self.stalled is not None
        qp.bulk_messages_left = 0 if stalled else limit
        chains = qp.chains
        if chains is not None:
            chains.begin_input()  # what its receives' answers return waits for them all
        try:
            try:
                if data is not None:
                    engine.receive_data(data)
                if self.stalled is not None:
                    if self.qp.must_wait(self.stalled):
                        return True
                    waited, self.stalled = self.stalled, None
                    self.qp.handle_event(waited)
                next_event = engine.next_event
                handle = self.qp.handle_event
                must_wait = self.qp.must_wait
                left = limit if stalled else qp.bulk_messages_left  # what the bulk path left
                while left:
                    left -= 1
                    event = next_event()
                    if event is NEED_DATA:  # the bulk path applied the chunk: the usual end
                        break
                    # The bulk of the stream first: data segments, one type test (same path as
                    # the RDMAP_EVENT_TYPES branch below).
                    if isinstance(event, _DATA_SEGMENTS):
                        if must_wait(event):
                            self.stalled = event
                            return True
                        handle(event)
                        continue
                    if isinstance(event, NeedData):
                        break
                    if isinstance(event, PeerClosed):
                        self.peer_closed = True
                        self.closing = True
                        if self.holding and self.qp.has_outgoing:
                            # MPA-25: nothing of ours may go out before the initiator's first
                            # FPDU, and it closed without one: what we queued is flushed.
                            self.qp.fatal(
                                None,
                                send_terminate=False,
                                detail="peer closed before its first FPDU (MPA-25)",
                            )
                        self.qp.peer_closed()
                        return self._stop()
                    if isinstance(event, ConnectionFailed):
                        self.fail(event.error)
                        return self._stop()
                    if isinstance(event, TerminateReceived):
                        self.qp.handle_event(event)
                        self.error = self.error or PeerTerminated(event.terminate)
                        self.closing = True
                        return self._stop()
                    if isinstance(event, RDMAP_EVENT_TYPES):
                        if self.qp.must_wait(event):
                            self.stalled = event
                            return True
                        self.qp.handle_event(event)
                else:
                    self.events_pending = True  # the budget ran out (events may be left)
            except ProtocolError as exc:
                self.fail(exc)
                return self._stop()
            if self.qp.ord_reserved and not engine.rtr_read_outstanding:
                self.qp.release_ord_reservation()
            if self.qp.terminate_pending is not None:
                self.fail(self.qp.terminate_pending, offending=False)
                return self._stop()
            return True
        finally:
            if chains is not None:
                chains.end_input()

    def _stop(self) -> bool:
        self.reading_done = True
        return False

    def fail(self, exc: Exception, *, offending: bool = True) -> None:
        """A local error: queue the Terminate, move the QP to TERMINATE (ERROR when no
        Terminate could be sent), start closing."""
        self.error = self.error or exc
        self.qp.terminate_pending = None
        protocol_error = exc if isinstance(exc, ProtocolError) else None
        if protocol_error is not None:
            log.info("qp %d: %s", self.qp.qp_num, exc)
            self.engine.send_terminate(protocol_error, protocol_error.ulpdu if offending else None)
        self.qp.fatal(
            protocol_error,
            send_terminate=False,
            terminate_sent=self.engine.terminate_sent,
            detail=str(exc),
        )
        self.closing = True

    @property
    def holding(self) -> bool:
        """Responder before the initiator's first FPDU (MPA-25): messages stay queued."""
        return self.engine.mpa.awaiting_first_fpdu

    def produce(self, limit: int = MAX_COALESCE) -> bytearray:
        """Encode queued outbound messages (up to about ``limit`` payload bytes) into bytes.

        A responder takes none while it waits for the initiator's first FPDU (MPA-25): they
        stay on the QP's outbound queue, not yet handed to the transport, so their WRs do not
        complete before they can be sent, and a close or loss before it flushes them."""
        self._encode(limit)
        out = self.engine.data_to_send()
        self.qp.release_answered()
        self.resume_stalled()
        return out

    def produce_iov(self, limit: int = MAX_COALESCE) -> list[bytes | bytearray | memoryview]:
        """:meth:`produce` as pieces for one scatter-gather send.  Large payloads view the
        memory they come from: the caller sends or copies them, then calls
        :meth:`resume_stalled` (which may place data into that memory)."""
        qp = self.qp
        if qp.has_outgoing or qp.terminate_pending is not None:  # else _encode has nothing to do
            self._encode(limit)
        if qp._answered_early:
            qp.release_answered()
        return self.engine.data_to_send_iov()

    @property
    def has_output(self) -> bool:
        """Whether :meth:`produce` has something to send: messages the QP queued, or
        FPDUs the express path framed (:meth:`express_send`)."""
        return self.qp.has_outgoing or self.engine.mpa.has_output

    def _encode(self, limit: int) -> None:
        qp, engine = self.qp, self.engine
        if engine.stream is not None and not engine.mpa.awaiting_first_fpdu:  # not holding
            if qp.has_outgoing:
                engine.send_messages(qp.take_outgoing(limit, self._part_mulpdu))
            if qp.terminate_pending is not None:
                self.fail(qp.terminate_pending, offending=False)

    @contextmanager
    def stall_released(self) -> Iterator[None]:
        """While inside, events are applied with the QP's ``max_stalled_snapshot_bytes`` as
        the bound of its copies: the drivers feed None in it once the event that waits for
        queued Read Responses (:attr:`stalled`) has waited while none of our output moved
        (the peer reads nothing, or it waits for us as we wait for it), so that event and
        what follows it are applied, the responses copied (RFC 5040 §5.5), unless even that
        bound is too small."""
        qp = self.qp
        soft = qp.max_snapshot_bytes
        qp.max_snapshot_bytes = max(soft, qp.max_stalled_snapshot_bytes)
        try:
            yield
        finally:
            qp.max_snapshot_bytes = soft

    def resume_stalled(self) -> None:
        """Apply the event that waited for queued Read Responses once they are out."""
        if self.stalled is not None and not self.qp.must_wait(self.stalled):
            self.feed(None)  # the responses went out: apply what waited for them

    def stream_closed(self, error: Exception | None = None) -> None:
        """The connection is gone (both halves closed, or lost): the QP enters ERROR."""
        self.reading_done = True
        self.qp.stream_closed(error)
        self.qp.express_send = None  # nothing more to send; and no QP -> endpoint cycle

    @property
    def wants_close(self) -> bool:
        """True when everything queued and posted is out and our half should close (FIN)."""
        qp = self.qp
        closing = self.closing or qp.state is _CLOSING
        return closing and not qp.has_outgoing and not qp.has_pending
