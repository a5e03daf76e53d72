"""The sans-IO MPA connection engine: startup, then FPDU framing (RFC 5044 §7, RFC 6581).

Theory of operation
-------------------
Frames are encoded and decoded by :mod:`stack.wire.mpa_frames` (re-exported here); the
startup rules a peer's frame can break are the tables of :mod:`stack.wire.mpa_rules`, which
this engine runs strictly (the capture decoder runs the same tables leniently), and the
RFC 6581 negotiation arithmetic is there too.  :class:`MpaConnection` runs one endpoint:
the driver feeds TCP bytes with :meth:`~MpaConnection.receive_data`, pulls events with
:meth:`~MpaConnection.next_event` (vocabulary in :mod:`stack.wire.events`), and collects
outbound bytes with :meth:`~MpaConnection.data_to_send` (h2/aioquic style).  Time is an
argument: :meth:`~MpaConnection.timer_deadline` says when to call
:meth:`~MpaConnection.handle_timer` (MPA-27).

Startup is an explicit state table (:data:`~stack.wire.mpa_startup.TRANSITIONS`, run by
:class:`~stack.wire.mpa_startup.MpaStartup`, which this class inherits).  The initiator queues its
Request in :meth:`~MpaConnection.initiate` and waits for the Reply; the responder waits
for the Request, reports :class:`RequestReceived` and the ULP answers with
:meth:`~MpaConnection.accept` or :meth:`~MpaConnection.reject`.  After an accepting
Reply both sides are in Full Operation: :class:`~stack.wire.framing.FpduFramer` /
:class:`~stack.wire.framing.FpduDeframer` do the FPDU work with the negotiated CRC and
per-direction markers, whose SeqStart is the first byte after the startup frame in each
direction (MPA-07, MPA-17).

Leniency (documented deviations of real peers):

* Reserved flag bits are kept in :attr:`MpaFrame.reserved` and never rejected (siw sends
  0x08 for GSO, MPA-19).  For Rev < 2 the S bit (0x10) is reserved too, so it is kept
  there and not interpreted.
* Rev 0 and unknown revisions decode; the responder's ``rev_policy`` decides.
* A responder that receives bytes after the Request before the ULP has accepted buffers
  them and parses them as FPDUs after accepting (siw drops the connection instead).
* An initiator accepts FPDUs in the same chunk as the Reply.
* Bytes after a failed startup are ignored (Linux siw sends a Terminate 2/0/4 after a bad
  Reply key, though RFC 5044 §7.1.2 only says to close).

A failure after a valid accepting Reply (IRD/ORD or RTR mismatch, a CRC or marker error in
Full Operation) moves to :attr:`MpaState.ERROR`: nothing more is delivered (MPA-28) but
``send_ulpdu`` still works so the ULP can send the Terminate named in
:class:`ConnectionFailed`.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import replace

from stack.buffers import Buffer
from stack.constants import (
    DEFAULT_EMSS,
    MPA_MAX_PRIVATE_DATA,
    TERM_LLP_CONNECTION_LOST,
)
from stack.errors import LocalError, MpaError
from stack.wire.checker import Finding
from stack.wire.events import (
    NEED_DATA,
    ConnectionFailed,
    Established,
    MpaEvent,
    MpaFrame,
    MpaSettings,
    NeedData,
    Negotiated,
    PeerClosed,
    Role,
    UlpduReceived,
)
from stack.wire.framing import FpduDeframer, FpduFramer, mulpdu_for
from stack.wire.mpa_frames import (
    decode_frame,
    decode_ird_ord,
    encode_frame,
    encode_ird_ord,
)
from stack.wire.mpa_rules import FRAME_RULES, REPLY_RULES, StartupRule
from stack.wire.mpa_startup import (
    KNOWN_REVS,
    TRANSITIONS,
    WAITING,
    MpaInput,
    MpaStartup,
    MpaState,
)

__all__ = [
    "MpaConnection",
    "MpaInput",
    "MpaState",
    "TRANSITIONS",
    "decode_frame",
    "decode_ird_ord",
    "encode_frame",
    "encode_ird_ord",
]

_DEFAULT_SETTINGS = MpaSettings()
# A tuple (identity tests), not a set: an Enum's hash is a Python-level call.
_SENDING = (MpaState.FULL_OPERATION, MpaState.ERROR)
_FULL_OPERATION = MpaState.FULL_OPERATION  # a module global: Enum.MEMBER is a slow lookup


class MpaConnection(MpaStartup):
    """One MPA endpoint: startup negotiation (:class:`~stack.wire.mpa_startup.MpaStartup`),
    then FPDU framing (sans-IO).

    Fields: ``role``, ``settings``, ``state`` (:class:`MpaState`), ``negotiated`` (after
    :class:`Established`), ``mulpdu`` (largest ULPDU to post, MPA-02/13), ``peer_frame``
    (the peer's startup frame once received), ``frame_rules`` / ``reply_rules`` (the
    startup rule tables this engine runs: :data:`~stack.wire.mpa_rules.FRAME_RULES` and
    :data:`~stack.wire.mpa_rules.REPLY_RULES`).
    """

    def __init__(self, role: Role, settings: MpaSettings = _DEFAULT_SETTINGS) -> None:
        if settings.rev not in KNOWN_REVS:
            raise LocalError(f"settings.rev must be 1 or 2, got {settings.rev}")
        if not 0 <= settings.max_private_data <= MPA_MAX_PRIVATE_DATA:
            raise LocalError(f"max_private_data must be 0..{MPA_MAX_PRIVATE_DATA}")
        self.role = role
        self.settings = settings
        self.state = MpaState.IDLE
        self.negotiated: Negotiated | None = None
        self.peer_frame: MpaFrame | None = None
        self.frame_rules: tuple[StartupRule, ...] = FRAME_RULES
        self.reply_rules: tuple[StartupRule, ...] = REPLY_RULES
        self.peer_findings: list[Finding] = []
        """Deviations of the peer's startup frame that are only noted (MPA-19, ERC-01...)."""
        self._local_frame: MpaFrame | None = None
        self._events: deque[MpaEvent] = deque()
        self._out = bytearray()  # queued output after _iov's pieces
        self._iov: list[Buffer] = []  # queued output as pieces, payloads by reference
        self._inbuf = bytearray()  # startup bytes; later, bytes held until accept()
        self._deadline: float | None = None
        self._framer: FpduFramer | None = None
        self._deframer: FpduDeframer | None = None
        self._held: bytearray | None = None  # MPA-25: responder output before first FPDU
        self._fin = False
        self._fin_reported = False
        self.borrow_views = False
        """Full Operation: a memoryview fed is parsed in place, not copied; the ULPDUs of
        the events view it, so the caller keeps it unchanged until they have been taken
        and applied (a partial FPDU at its end is copied before :meth:`receive_data`
        returns, MPA-16)."""
        self.keep_tail = False
        """Full Operation, with :attr:`borrow_views`: a partial FPDU at the end of a fed
        memoryview is not copied; :attr:`tail` says how many of its last bytes are unread,
        and the caller feeds them again, followed by what comes next, in its next
        :meth:`receive_data` (it leaves them in its buffer and reads right after them)."""
        self.tail = 0
        """Unread bytes at the end of the last memoryview fed (with :attr:`keep_tail`); 0
        after any other input."""
        self.taking_whole = False
        """True while :attr:`ulpdu_sink` takes the ULPDU of a fed memoryview that is one
        whole FPDU with nothing pending: nothing else of the feed follows it."""
        self.ulpdu_sink: Callable[[memoryview], bool] | None = None
        """Full Operation: takes a validated ULPDU before an event is made for it (the bulk
        path of the layer above); returns False to have it queued as an event instead.
        Called only while no event is queued, so events and sunk ULPDUs keep stream order;
        an exception it raises propagates from :meth:`receive_data` (the ULPDU is
        consumed, later bytes stay buffered)."""

    # -- introspection -------------------------------------------------------------------

    @property
    def mulpdu(self) -> int:
        """Largest ULPDU DDP should post (MPA-02, MPA-13): settings override or from EMSS."""
        if self.settings.mulpdu is not None:
            return self.settings.mulpdu
        markers = self._framer.markers if self._framer is not None else False
        return mulpdu_for(self.settings.emss or DEFAULT_EMSS, markers)

    def update_emss(self, emss: int) -> int:
        """The path's EMSS changed (TCP's segment size grows as the peer's window opens):
        the MULPDU is derived from it again (MPA-13; MULPDU may change during a
        connection).  Returns the MULPDU; a fixed ``settings.mulpdu`` stays."""
        if emss != self.settings.emss:
            self.settings = replace(self.settings, emss=emss)
        return self.mulpdu

    # -- data path -----------------------------------------------------------------------

    def receive_data(self, data: Buffer) -> None:
        """Feed bytes received from TCP; ``b""`` means the peer sent FIN (see
        :attr:`borrow_views` for a memoryview)."""
        self.tail = 0
        if not data:
            if not self._fin:
                self._fin = True
                self._on_fin()
            return
        if self._fin:
            raise LocalError("data received after the peer's FIN")
        state = self.state
        if state is _FULL_OPERATION:
            self._feed_fpdus(data, self.borrow_views and type(data) is memoryview)
            return
        if state in (MpaState.IDLE, MpaState.AWAIT_REPLY, MpaState.AWAIT_REQUEST):
            self._inbuf += data
            self._process_startup()
        elif state is MpaState.REQUEST_RECEIVED:
            self._inbuf += data  # held until accept(); siw would drop the connection
        # REJECTED, ERROR, FAILED: MPA is over for this direction; bytes are ignored.

    def next_event(self) -> MpaEvent | NeedData:
        """The next event, or :data:`~stack.wire.events.NEED_DATA`."""
        if self._events:
            return self._events.popleft()
        return NEED_DATA

    @property
    def awaiting_first_fpdu(self) -> bool:
        """Responder: no valid FPDU has come from the initiator yet, so ours are held (MPA-25)."""
        return self._held is not None

    @property
    def plain_deframer(self) -> FpduDeframer | None:
        """The deframer, while a fed memoryview may be taken as one whole FPDU past this
        engine (:meth:`~stack.wire.deframer.FpduDeframer.take_whole`, the caller then sets
        nothing else here): Full Operation, views borrowed, no event queued, no FIN, not
        holding our FPDUs for the initiator's first (MPA-25); else None."""
        if (
            self.state is _FULL_OPERATION
            and self.borrow_views
            and not self._events
            and not self._fin
            and self._held is None
        ):
            return self._deframer
        return None

    @property
    def sends_now(self) -> bool:
        """Whether an FPDU queued now goes out with the next :meth:`data_to_send`: Full
        Operation, not held for the initiator's first FPDU (MPA-25)."""
        return self.state is _FULL_OPERATION and self._held is None

    @property
    def has_output(self) -> bool:
        """Whether FPDUs are queued for :meth:`data_to_send` (not those held, MPA-25)."""
        return bool(self._out) or bool(self._iov)

    def send_first(self) -> None:
        """Responder: release held FPDUs and send from now on, before the initiator has
        (waives MPA-25, RFC 5044 §7.1.2 step 4), as Linux siw's responder always does.

        For a ULP whose initiator waits for the responder without RFC 6581 peer-to-peer
        mode, where keeping the rule leaves both waiting.  In peer-to-peer mode the
        initiator's RTR comes first (ERC-09), so this is refused there.
        """
        self._require_role(Role.RESPONDER, "send_first")
        if self.negotiated is None:
            raise LocalError("send_first() before Full Operation")
        if self.negotiated.p2p:
            raise LocalError("send_first() in peer-to-peer mode: the RTR comes first (ERC-09)")
        if self._held is not None:
            self._release_held()

    def send_ulpdu(self, ulpdu: Buffer) -> None:
        """Frame one ULPDU as an FPDU (CRC, pad, markers) and queue it (MPA-01).

        A responder's FPDUs are held until its first valid FPDU has arrived (MPA-25).
        """
        framer = self._framer
        if framer is None or self.state not in _SENDING:
            raise LocalError(f"cannot send FPDUs in state {self.state.value}")
        framer.frame_into(self._out if self._held is None else self._held, ulpdu)

    def send_ulpdus(self, ulpdus: Iterable[Buffer]) -> None:
        """Frame and queue several ULPDUs in order."""
        framer = self._framer
        if framer is None or self.state not in _SENDING:
            raise LocalError(f"cannot send FPDUs in state {self.state.value}")
        out = self._out if self._held is None else self._held
        frame_into = framer.frame_into
        for ulpdu in ulpdus:
            frame_into(out, ulpdu)

    def send_ulpdu_parts(self, parts: Iterable[tuple[Buffer, Buffer]]) -> None:
        """Frame and queue ULPDUs given as (DDP header, payload) pairs, copying each once."""
        framer = self._framer
        if framer is None or self.state not in _SENDING:
            raise LocalError(f"cannot send FPDUs in state {self.state.value}")
        if type(parts) is list and len(parts) == 1 and not parts[0][1]:
            # One ULPDU with its headers as one record (a request, an atomic Response):
            # framed whole, as the loop below frames it.
            framer.frame_into(self._out if self._held is None else self._held, parts[0][0])
            return
        if self._held is not None:
            _, error = framer.frame_parts_iov(parts, self._held, None)
        else:
            # Large payloads are queued by reference between the framing bytes (one copy
            # fewer for a scatter-gather send, data_to_send_iov); small ones are copied.
            self._out, error = framer.frame_parts_iov(parts, self._out, self._iov)
        if error is not None:
            raise error

    def data_to_send(self) -> bytearray:
        """All queued outbound bytes; ownership passes to the caller."""
        out = self._out
        self._out = bytearray()
        if self._iov:
            joined = bytearray()
            for piece in self._iov:
                joined += piece
            joined += out
            self._iov = []
            return joined
        return out

    def data_to_send_iov(self) -> list[Buffer]:
        """All queued outbound bytes as pieces for one scatter-gather send; ownership passes
        to the caller.  Pieces may view the memory a payload came from (registered memory):
        send them, or copy them, before that memory may change."""
        iov = self._iov
        if self._out:
            iov.append(self._out)
            self._out = bytearray()
        self._iov = []
        return iov

    def _enter_full_operation(self, negotiated: Negotiated) -> None:
        """Set up framing; SeqStart is the next byte in each direction (MPA-07, MPA-17)."""
        self.negotiated = negotiated
        self._framer = FpduFramer(crc=negotiated.crc, markers=negotiated.markers_tx)
        self._deframer = FpduDeframer(crc=negotiated.crc, markers=negotiated.markers_rx)
        if self.role is Role.INITIATOR:
            self._held = None
        self._events.append(Established(negotiated))

    # -- internals: Full Operation ------------------------------------------------------

    def _feed_fpdus(self, data: Buffer, borrow: bool = False) -> None:
        """Deframe what is complete (MPA-16): each ULPDU goes to :attr:`ulpdu_sink` while no
        event is queued (so the order of everything received is kept), else it is queued
        as an :class:`UlpduReceived` event."""
        deframer = self._deframer
        if deframer is None or self.state is not _FULL_OPERATION:
            return
        events = self._events
        sink = self.ulpdu_sink
        if borrow and (whole := deframer.take_whole(data)) is not None:  # type: ignore[arg-type]
            # One whole FPDU and nothing pending (a request/response exchange's chunk):
            # taken in one step, as the loop below would take it.
            if self._held is not None:
                self._release_held()
            if sink is not None and not events:
                self.taking_whole = True
                try:
                    if sink(whole):
                        return
                finally:
                    self.taking_whole = False
            events.append(UlpduReceived(whole))
            return
        deframer.feed(data, borrow=borrow)
        append = events.append
        next_ulpdu = deframer.next_ulpdu
        try:
            ulpdu = next_ulpdu()
            if ulpdu is not None and self._held is not None:
                self._release_held()
            if sink is not None and not events:
                while ulpdu is not None and sink(ulpdu):
                    ulpdu = next_ulpdu()
            while ulpdu is not None:
                append(UlpduReceived(ulpdu))
                ulpdu = next_ulpdu()
        except MpaError as exc:
            self._transition(MpaInput.FPDU_ERROR)
            if self._held is not None:
                # The initiator evidently is in Full Operation; let a Terminate out.
                self._release_held()
            append(ConnectionFailed(exc, close=False, terminate=exc.term))
        finally:
            if borrow and self.keep_tail:
                self.tail = deframer.release_tail()
            else:
                deframer.settle()

    def _release_held(self) -> None:
        """MPA-25: the first valid FPDU arrived; release the responder's held FPDUs."""
        held = self._held
        self._held = None
        if held:
            self._out += held

    def _report_fin(self) -> None:
        self._fin_reported = True
        self._events.append(PeerClosed())

    def _on_fin(self) -> None:
        state = self.state
        if state in WAITING:
            waiting_for = "Reply" if state is MpaState.AWAIT_REPLY else "Request"
            self._fail_startup(
                MpaError(
                    "MPA-28",
                    f"peer closed the connection before the MPA {waiting_for} completed",
                    TERM_LLP_CONNECTION_LOST,
                )
            )
            return
        if state is MpaState.FAILED or state is MpaState.REQUEST_RECEIVED:
            return  # nothing to report / reported after accept() or reject()
        self._report_fin()
