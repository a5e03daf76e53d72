"""One iWARP connection as a sans-IO engine: MPA startup and framing, then DDP/RDMAP.

Theory of operation (the wsproto shape: handshake, then framing).  An
:class:`IwarpConnection` owns an :class:`~stack.wire.mpa.MpaConnection` (startup frames,
CRC, markers) and, once Full Operation starts, an :class:`~stack.wire.stream.RdmapStream`
(DDP segmentation and validation, RDMAP messages).  Bytes go in with
:meth:`receive_data`; :meth:`next_event` returns MPA events (``RequestReceived``,
``Established``, ``Rejected``, ``ConnectionFailed``, ``PeerClosed``) and RDMAP receive
events (``WriteSegment``, ``SendSegment``, ...): :data:`ConnectionEvent`.  Each RDMAP
event and each :class:`~stack.errors.ProtocolError` raised for one carries the ULPDU it came
from (``ulpdu``), so :meth:`send_terminate` copies the right headers (RFC 5040 Fig. 10).
Messages go out with :meth:`send_message`; :meth:`data_to_send` hands over the bytes.

Peer-to-peer RTR (RFC 6581 §5, ERC-09) is handled here, invisibly to the ULP: the
initiator sends the negotiated zero-length Send, Write (STag 1, as siw does) or Read as its
first FPDU before reporting ``Established``; the responder absorbs the RTR (answering a Read
RTR with a zero-length Read Response) instead of delivering it.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable

from stack.constants import RtrType, TermCode
from stack.errors import ProtocolError
from stack.wire.ddp import Parts
from stack.wire.events import (
    NEED_DATA,
    ConnectionFailed,
    Established,
    MessagePart,
    MpaEvent,
    MpaSettings,
    NeedData,
    Negotiated,
    OutboundMessage,
    RdmapEvent,
    RdmapMessage,
    RdmaWrite,
    ReadRequest,
    ReadRequestReceived,
    ReadResponse,
    ReadResponseSegment,
    Role,
    Send,
    SendSegment,
    Terminate,
    UlpduReceived,
    WriteSegment,
)
from stack.wire.mpa import MpaConnection
from stack.wire.stream import MessagePlacer, RdmapStream, SendPlacer, TaggedPlacer
from stack.wire.terminate import build_terminate

WRITE_RTR_STAG = 1
"""STag of a zero-length Write RTR (siw's choice; Chelsio hardware rejects STag 0)."""

ConnectionEvent = MpaEvent | RdmapEvent | NeedData
"""What :meth:`IwarpConnection.next_event` returns."""


class IwarpConnection:
    """MPA + DDP/RDMAP for one TCP connection (no I/O; time passed in)."""

    def __init__(self, role: Role, settings: MpaSettings | None = None, *, rfc7306: bool = True):
        self.role = role
        self.settings = settings or MpaSettings()
        self.mpa = MpaConnection(role, self.settings)
        self.rfc7306 = rfc7306
        self.stream: RdmapStream | None = None
        self.negotiated: Negotiated | None = None
        self.terminate_sent = False
        self._events: deque[ConnectionEvent] = deque()
        self._rtr_pending: RtrType = RtrType.NONE  # responder: RTR still to absorb
        self._rtr_read_outstanding = False  # initiator: zero-length Read RTR unanswered
        self.tagged_placer: TaggedPlacer | None = None
        """The RNIC's placement of tagged segments for the bulk path (:meth:`receive_data`);
        None: every segment becomes an event."""
        self.send_placer: SendPlacer | None = None
        """The RNIC's placement of Send segments for the bulk path (with a
        :attr:`tagged_placer`); None: Send segments become events."""
        self.message_placer: MessagePlacer | None = None
        """The RNIC's handling of one-segment messages (Read Requests, atomics, Immediate
        Data) for the bulk path (with a :attr:`tagged_placer`); None: they become events."""

    @property
    def rtr_read_outstanding(self) -> bool:
        """The initiator's zero-length Read RTR is not answered yet: it holds an ORD credit
        (RFC 6581 §9.2, RDMAP-14)."""
        return self._rtr_read_outstanding

    @property
    def plain_stream(self) -> RdmapStream | None:
        """The stream, while a ULPDU may be applied past this engine (the express path,
        :mod:`stack.rnic.express`): no event queued, no RTR to absorb or answer (ERC-09),
        no ``send_message`` hook, the stream open in both directions; else None."""
        stream = self.stream
        if (
            stream is None
            or self._events
            or self._rtr_pending
            or self._rtr_read_outstanding
            or "send_message" in self.__dict__
            or not stream.open_both_ways
        ):
            return None
        return stream

    # ------------------------------------------------------------------ startup
    def initiate(self, now: float, private_data: bytes = b"") -> None:
        self.mpa.initiate(now, private_data)

    def start(self, now: float) -> None:
        self.mpa.start(now)

    def accept(self, private_data: bytes = b"", **kwargs: object) -> None:
        self.mpa.accept(private_data, **kwargs)  # type: ignore[arg-type]

    def reject(self, private_data: bytes = b"") -> None:
        self.mpa.reject(private_data)

    def timer_deadline(self) -> float | None:
        return self.mpa.timer_deadline()

    def handle_timer(self, now: float) -> None:
        self.mpa.handle_timer(now)

    # ------------------------------------------------------------------ data path
    def receive_data(self, data: bytes | bytearray | memoryview) -> None:
        """Feed received bytes (a memoryview is parsed in place with
        :attr:`~stack.wire.mpa.MpaConnection.borrow_views`).

        With a :attr:`tagged_placer`, tagged Write / Read Response segments (and Send
        segments, with a :attr:`send_placer`, and one-segment messages, with a
        :attr:`message_placer`) that arrive while no event is waiting are placed or
        applied during this call, with no event (the bulk path,
        :meth:`~stack.wire.stream.RdmapStream.place_tagged`); not while an RTR is
        still to be absorbed (ERC-09), which needs the event.
        """
        mpa = self.mpa
        stream = self.stream
        if (
            self.tagged_placer is not None
            and stream is not None
            and not self._events
            and not self._rtr_pending
            and not self._rtr_read_outstanding
        ):
            stream.placer = self.tagged_placer
            stream.send_placer = self.send_placer
            stream.message_placer = self.message_placer
            mpa.ulpdu_sink = stream.place_tagged
        else:
            mpa.ulpdu_sink = None
        mpa.receive_data(data)

    def next_event(self) -> ConnectionEvent:
        """The next MPA or RDMAP event, or ``NEED_DATA``.  Raises ProtocolError on bad input.

        A ProtocolError from DDP/RDMAP validation carries the offending ULPDU (``ulpdu``);
        pass it to :meth:`send_terminate`.
        """
        while True:
            if self._events:
                return self._events.popleft()
            event = self.mpa.next_event()
            if event is NEED_DATA:  # the bulk path took the chunk: the usual answer
                return event
            if type(event) is UlpduReceived:
                assert self.stream is not None
                rdmap_events = self.stream.receive_ulpdu(event.ulpdu)
                if len(rdmap_events) == 1 and not self._rtr_pending:
                    if not self._rtr_read_outstanding:
                        return rdmap_events[0]  # the common case: no RTR left to absorb
                for rdmap_event in rdmap_events:
                    if not self._absorb_rtr(rdmap_event):
                        self._events.append(rdmap_event)
                continue
            if isinstance(event, Established):
                self._on_established(event)
                continue
            if isinstance(event, ConnectionFailed) and event.terminate is not None:
                self._terminate_refused_reply(event.terminate)
            return event

    def _on_established(self, event: Established) -> None:
        neg = event.negotiated
        self.negotiated = neg
        self.stream = RdmapStream(neg.mulpdu, rfc7306=self.rfc7306)
        if neg.p2p and neg.rtr:
            if self.role is Role.INITIATOR:
                self._send_rtr(neg.rtr)
            else:
                self._rtr_pending = neg.rtr
        self._events.append(event)

    def _send_rtr(self, rtr: RtrType) -> None:
        if rtr is RtrType.WRITE:
            self.send_message(RdmaWrite(WRITE_RTR_STAG, 0, b""))
        elif rtr is RtrType.READ:
            self._rtr_read_outstanding = True
            self.send_message(ReadRequest(0, 0, 0, 0, 0))
        else:
            self.send_message(Send(b""))

    def _absorb_rtr(self, event: RdmapEvent) -> bool:
        """Consume the RTR so the ULP never sees it (ERC-09)."""
        if self._rtr_pending:
            kind, self._rtr_pending = self._rtr_pending, RtrType.NONE
            if kind is RtrType.WRITE and isinstance(event, WriteSegment) and not event.data:
                return True
            if kind is RtrType.SEND and isinstance(event, SendSegment) and not event.data:
                return True
            if kind is RtrType.READ and isinstance(event, ReadRequestReceived):
                if event.request.size == 0:
                    req = event.request
                    self.send_message(ReadResponse(req.sink_stag, req.sink_to, b""))
                    return True
            # Not the negotiated RTR: deliver it anyway (lenient; the dissector flags it).
            return False
        if self._rtr_read_outstanding and isinstance(event, ReadResponseSegment):
            self._rtr_read_outstanding = False
            return not event.data
        return False

    def _terminate_refused_reply(self, term: TermCode) -> None:
        """A Reply the initiator refuses after MPA set up framing (ERC-09 no matching RTR,
        IRD too small): queue its Terminate before the close, though no stream was reported."""
        if self.terminate_sent or self.stream is not None:
            return  # Full Operation errors go through send_terminate with the offending ULPDU
        self.terminate_sent = True
        stream = RdmapStream(self.mpa.mulpdu, rfc7306=self.rfc7306)
        self.mpa.send_ulpdu_parts(stream.send_parts(build_terminate(term, None)))

    def update_emss(self, emss: int) -> int:
        """A new EMSS from the transport (MPA-13, MULPDU may change): messages encoded
        from now on are segmented for the MULPDU it gives (returned)."""
        mulpdu = self.mpa.update_emss(emss)
        self.settings = self.mpa.settings
        if self.stream is not None:
            self.stream.mulpdu = mulpdu
        return mulpdu

    def send_message(self, message: RdmapMessage) -> None:
        """Segment, frame and queue one RDMAP message."""
        assert self.stream is not None, "send_message before Full Operation"
        self.mpa.send_ulpdu_parts(self.stream.send_parts(message))

    def send_messages(self, messages: Iterable[OutboundMessage]) -> None:
        """Segment, frame and queue ``messages`` in order, framed in one pass (a post list
        of small messages becomes one run of FPDUs); an RDMA Write may come as its fields
        (:data:`~stack.wire.events.WriteFields`, no message object).  Whatever was
        segmented before an error is still queued, as with one :meth:`send_message` call
        per message.  A ``send_message`` replaced on the instance (a conformance fault's
        hook) still sees every message, each Write as an :class:`RdmaWrite`."""
        assert self.stream is not None, "send_messages before Full Operation"
        if "send_message" in self.__dict__:
            for message in messages:
                if isinstance(message, MessagePart):  # the QP splits no message for a hook
                    self.mpa.send_ulpdu_parts(self.stream.send_parts(message))
                else:
                    self.send_message(
                        RdmaWrite(*message) if isinstance(message, tuple) else message
                    )
            return
        send_parts = self.stream.send_parts
        write_parts = self.stream.send_write_parts
        parts: list[Parts] = []
        try:
            for message in messages:
                if isinstance(message, tuple):
                    parts += write_parts(*message)
                else:
                    parts += send_parts(message)
        finally:
            if parts:
                self.mpa.send_ulpdu_parts(parts)

    def part_mulpdu(self) -> int:
        """The MULPDU a sender may cut a large message into :class:`MessagePart` runs of
        whole segments for; 0 before Full Operation and while a ``send_message`` hook is
        installed (it sees whole messages)."""
        stream = self.stream
        if stream is None or "send_message" in self.__dict__:
            return 0
        return stream.mulpdu

    def send_terminate(self, error: ProtocolError, offending_ulpdu: memoryview | None) -> None:
        """Send the Terminate for ``error`` about ``offending_ulpdu`` (usually
        ``error.ulpdu``; None for a local error), at most one per stream (RDMAP-10)."""
        if self.terminate_sent or self.stream is None or error.term is None:
            return
        self.terminate_sent = True
        term: Terminate = build_terminate(error.term, offending_ulpdu)
        self.send_message(term)

    def data_to_send(self) -> bytearray:
        return self.mpa.data_to_send()

    def data_to_send_iov(self) -> list[bytes | bytearray | memoryview]:
        """:meth:`data_to_send` as pieces for a scatter-gather send (payloads by
        reference: :meth:`~stack.wire.mpa.MpaConnection.data_to_send_iov`)."""
        return self.mpa.data_to_send_iov()


__all__ = ["ConnectionEvent", "IwarpConnection", "WRITE_RTR_STAG", "ConnectionFailed", "NeedData"]
