"""One RDMAP/DDP stream, both directions, sans-IO (RFC 5040, RFC 5041, RFC 7306).

Theory of operation
-------------------
:class:`RdmapStream` sits between the MPA framer (which hands it validated ULPDUs and
takes ULPDUs to frame) and the RNIC (which places data and runs queues).  It has no
buffers of its own: on receive it validates each ULPDU and turns it into events of
:mod:`stack.wire.events` whose ``data`` are views into the ULPDU it was given (the caller
must keep that buffer unchanged until it has placed the data); on send it assigns MSNs
and returns the segments of a message.

Receive validation runs in RFC layer order, and every failure is raised before any event
for that segment (DDP-10): DDP version, header length and QN (stateless, see
:mod:`stack.wire.rdmap`); then per-queue sequencing by the
:class:`~stack.wire.sequence.MessageSequencer` the capture decoder uses too, run strictly
(MSN, MO, RsvdULP and Last flag: DDP-02, DDP-04, DDP-05, DDP-06); then RDMAP version,
opcode, T bit, QN/opcode match and the RDMAP header.  STag, protection domain and bounds
checks are the RNIC's (RFC 5041 §7.1, SEC-*); so is the receive-buffer accounting
(TERM_DDP_U_NO_BUFFER / TOO_LONG for Sends).

Tagged and Send data come out per segment (WriteSegment, ReadResponseSegment,
SendSegment) so the RNIC places them directly; one-segment messages come out whole.

State tables
------------
Receive (``recv_state``; the input is "a Terminate" when T=0 and opcode 7, else "data"):

==========  ==========  ====================================================  ==========
state       input       action                                                next
==========  ==========  ====================================================  ==========
OPEN        data        validate, emit events; on error remember it, raise    OPEN/FAILED
OPEN        Terminate   validate, emit TerminateReceived (MSN deviation noted)  TERMINATED
FAILED      data        raise the first error again (DDP-10: drop later data)  FAILED
FAILED      Terminate   decode leniently, emit TerminateReceived (RDMAP-10)   TERMINATED
TERMINATED  data        raise RdmapError RDMAP-10 (no Terminate to answer)    TERMINATED
TERMINATED  Terminate   ignore; noted in ``findings`` (at most one, RDMAP-10)  TERMINATED
==========  ==========  ====================================================  ==========

Send (``send_state``): OPEN accepts any message; sending a Terminate moves to TERMINATED,
where :meth:`RdmapStream.send` raises :class:`LocalError` (nothing follows a Terminate,
RDMAP-10).
"""

from __future__ import annotations

from collections.abc import Callable
from enum import Enum

from stack.buffers import Buffer as Data
from stack.constants import (
    ALL_ONES_32,
    DDP_LAST,
    DDP_TAGGED,
    DDP_TAGGED_HDR_LEN,
    DDP_UNTAGGED_HDR_LEN,
    DDP_VERSION,
    INVALIDATE_OPCODES,
    MULPDU_MAX,
    MULPDU_MIN,
    RDMAP_OPCODE_MASK,
    RFC7306_OPCODES,
    SEND_OPCODES,
    Opcode,
    QueueNumber,
)
from stack.errors import LocalError, ProtocolError, RdmapError
from stack.wire import ddp
from stack.wire.checker import Checker, Finding
from stack.wire.events import (
    AtomicRequest,
    AtomicRequestReceived,
    AtomicResponse,
    AtomicResponseReceived,
    ImmediateData,
    ImmediateDataReceived,
    MessageEvent,
    MessagePart,
    RdmapEvent,
    RdmapMessage,
    RdmaWrite,
    ReadRequest,
    ReadRequestReceived,
    ReadResponse,
    ReadResponseSegment,
    Send,
    SendSegment,
    Terminate,
    TerminateReceived,
    WriteSegment,
)
from stack.wire.rdmap import (
    _QN_OF_TYPE,
    EXACT_FIXED,
    check_ddp,
    check_rdmap,
    decode_ulpdu,
    encode_message_parts,
    encode_request_parts,
    encode_write_fields,
    exact_fixed_header,
    message_qn,
    rdmap_ctrl,
)
from stack.wire.sequence import MessageSequencer
from stack.wire.terminate import build_terminate, terminate_for

_NUM_QN = len(QueueNumber)
_QN_SEND = int(QueueNumber.SEND)
_RECORD_QN: dict[type, int] = {
    ReadRequest: int(QueueNumber.READ_REQUEST),
    AtomicRequest: int(QueueNumber.READ_REQUEST),
    AtomicResponse: int(QueueNumber.ATOMIC_RESPONSE),
}
"""The one-segment messages :func:`~stack.wire.rdmap.encode_request_parts` encodes, and
their queues (RDMAP-01)."""
_INVALIDATE_OPS = frozenset(int(op) for op in INVALIDATE_OPCODES)
_SEND_EVENT_OPS = {int(op): op for op in Opcode}
_EXACT_FIXED_5040 = {
    ctrl: fixed for ctrl, fixed in EXACT_FIXED.items() if fixed[0] not in RFC7306_OPCODES
}
# Exact header bytes of the fast path: DV=1, reserved bits 0, RV=1.
_TAGGED_LAST = DDP_TAGGED | DDP_LAST | DDP_VERSION
_TAGGED_MORE = DDP_TAGGED | DDP_VERSION
_UNTAGGED_LAST = DDP_LAST | DDP_VERSION
_UNTAGGED_MORE = DDP_VERSION
_RDMAP_WRITE = rdmap_ctrl(Opcode.RDMA_WRITE)
_RDMAP_READ_RESPONSE = rdmap_ctrl(Opcode.RDMA_READ_RESPONSE)
_FAST_SEND_CTRLS = {rdmap_ctrl(op): op for op in SEND_OPCODES}
TAGGED_EXACT: dict[int, tuple[bool, bool]] = {
    b0 << 8 | b1: (b1 == _RDMAP_WRITE, b0 == _TAGGED_LAST)
    for b0 in (_TAGGED_LAST, _TAGGED_MORE)
    for b1 in (_RDMAP_WRITE, _RDMAP_READ_RESPONSE)
}
"""First two header bytes of a tagged Write / Read Response segment whose every DDP and
RDMAP header check passes (DDP-01, RDMAP-01: DV=1, RV=1, reserved 0) -> (Write, Last)."""

TaggedPlacer = Callable[[bool, bool, int, int, memoryview, memoryview], bool]
"""``placer(write, last, stag, to, payload, ulpdu)``: places a tagged segment (RFC 5041
§4.1) and returns True, or returns False to have it delivered as an event instead."""
SendPlacer = Callable[[Opcode, int, int, memoryview, bool, int | None, memoryview], bool]
"""``placer(opcode, msn, mo, payload, last, invalidate_stag, ulpdu)``: places a segment of
a Send-family message at ``mo`` of the posted receive (RFC 5041 §4.2) and returns True, or
returns False, having changed nothing, to have it delivered as an event instead."""
MessagePlacer = Callable[[MessageEvent], bool]
"""``placer(event)``: applies the event of a one-segment message (Read Request, atomic
Request or Response, Immediate Data) that passed every stream check and returns True, or
returns False, having changed nothing, to have it delivered as an event instead."""
MAX_FINDINGS = 256
"""Non-fatal findings kept per stream (the oldest are kept; later ones are counted)."""


class RecvState(Enum):
    """Receive side of an :class:`RdmapStream` (module docstring table)."""

    OPEN = "open"
    FAILED = "failed"
    TERMINATED = "terminated"


class SendState(Enum):
    """Send side of an :class:`RdmapStream`."""

    OPEN = "open"
    TERMINATED = "terminated"


_unpack_tagged = ddp.TAGGED_HDR.unpack_from
_RECV_OPEN = RecvState.OPEN  # module globals: an Enum.MEMBER lookup is slow
_SEND_TERMINATED = SendState.TERMINATED
_SEND_OPEN = SendState.OPEN


def _after_terminate() -> LocalError:
    """What sending anything after our Terminate raises (RDMAP-10)."""
    return LocalError("RDMAP-10: nothing may be sent after a Terminate")


class RdmapStream:
    """DDP/RDMAP engine of one connection (both directions), sans-IO.

    ``mulpdu``: largest ULPDU to send (128..64768, MPA-02; settable at any time, MPA
    may change it); ``rfc7306``: accept and send opcodes 0x8-0xB and QN 3;
    ``siw_layout``: how to read the peer's Terminate control word (None = detect,
    see :mod:`stack.wire.rdmap`; True for a peer known to be Linux siw).

    Attributes: ``recv_state``, ``send_state``, ``error`` (the first receive error),
    ``terminate_received`` (the peer's Terminate), ``findings`` (non-fatal deviations).
    """

    def __init__(
        self, mulpdu: int, *, rfc7306: bool = True, siw_layout: bool | None = None
    ) -> None:
        self.mulpdu = mulpdu
        self.rfc7306 = rfc7306
        self.siw_layout = siw_layout
        self.recv_state = RecvState.OPEN
        self.send_state = SendState.OPEN
        self.error: ProtocolError | None = None
        self.terminate_received: Terminate | None = None
        self.findings: list[Finding] = []
        self.findings_dropped = 0
        self._tx_msn = [1] * _NUM_QN
        self.sequencer = MessageSequencer()
        """Receive sequencing: MSN, MO and RsvdULP per queue (DDP-02, DDP-04..06)."""
        self._exact_fixed = EXACT_FIXED if rfc7306 else _EXACT_FIXED_5040
        self.placer: TaggedPlacer | None = None
        """The bulk path's consumer of tagged segments (:meth:`place_tagged`)."""
        self.send_placer: SendPlacer | None = None
        """The bulk path's consumer of Send segments (:meth:`place_tagged`); None: they
        become events."""
        self.message_placer: MessagePlacer | None = None
        """The bulk path's consumer of one-segment messages (:meth:`place_tagged`); None:
        they become events."""

    @property
    def open_both_ways(self) -> bool:
        """Whether both directions are open: nothing failed or was terminated."""
        return self.recv_state is _RECV_OPEN and self.send_state is _SEND_OPEN

    # -- configuration -----------------------------------------------------------------

    @property
    def mulpdu(self) -> int:
        """Largest ULPDU :meth:`send` produces (DDP-06)."""
        return self._mulpdu

    @mulpdu.setter
    def mulpdu(self, value: int) -> None:
        if not MULPDU_MIN <= value <= MULPDU_MAX:
            raise LocalError(f"MULPDU {value} outside {MULPDU_MIN}..{MULPDU_MAX} (MPA-02)")
        self._mulpdu = value

    def next_send_msn(self, qn: int) -> int:
        """The MSN the next message sent on ``qn`` will carry."""
        return self._tx_msn[qn]

    def expected_msn(self, qn: int) -> int:
        """The MSN the next segment received on ``qn`` must carry."""
        open_msg = self.sequencer.open_untagged.get(qn)
        if open_msg is not None:
            return open_msg[0]
        return self.sequencer.next_msn.get(qn, 1)

    # -- send --------------------------------------------------------------------------

    def send(self, msg: RdmapMessage) -> list[bytes]:
        """The ULPDUs of ``msg``, MSN assigned per QN (starting at 1, wrapping; DDP-05).

        Raises :class:`LocalError` after a Terminate was sent (RDMAP-10), for RFC 7306
        messages when ``rfc7306`` is off, and for fields that do not fit.
        """
        join = b"".join
        return [join(p) for p in self.send_parts(msg)]

    def send_parts(self, msg: RdmapMessage | MessagePart) -> list[ddp.Parts]:
        """:meth:`send` as (DDP header, payload view) pairs, for a framer that copies once."""
        if type(msg) is RdmaWrite:  # the bulk of a sender's messages
            return self.send_write_parts(msg.stag, msg.to, msg.data)
        if self.send_state is _SEND_TERMINATED:
            raise _after_terminate()
        kind = type(msg)
        # The one-segment messages of a round trip, without the general encoder's dispatch.
        record_qn = _RECORD_QN.get(kind)
        if record_qn is not None and (self.rfc7306 or kind is ReadRequest):
            msns = self._tx_msn
            record_msn = msns[record_qn]
            parts = encode_request_parts(msg, record_msn)  # type: ignore[arg-type]
            msns[record_qn] = (record_msn + 1) & ALL_ONES_32
            return parts
        if type(msg) is ReadResponse:
            return ddp.segment_tagged_parts(
                msg.stag, msg.to, _RDMAP_READ_RESPONSE, msg.data, self._mulpdu
            )
        if not self.rfc7306 and isinstance(msg, ImmediateData | AtomicRequest | AtomicResponse):
            raise LocalError(f"{type(msg).__name__} needs RFC 7306 (EXT-01)")
        qn = _QN_OF_TYPE.get(type(msg), -1)
        if qn == -1:
            if isinstance(msg, MessagePart):
                return self._part_parts(msg)
            qn = message_qn(msg)
        msn = None if qn is None else self._tx_msn[qn]
        parts = encode_message_parts(msg, msn=msn, mulpdu=self._mulpdu)  # type: ignore[arg-type]  # parts returned above
        if qn is not None:
            self._tx_msn[qn] = (self._tx_msn[qn] + 1) & ALL_ONES_32
        if isinstance(msg, Terminate):
            self.send_state = SendState.TERMINATED
        return parts

    def _part_parts(self, part: MessagePart) -> list[ddp.Parts]:
        """:meth:`send_parts` of part of a message: a Send's parts share its MSN, which
        advances after the last part (DDP-04, DDP-05)."""
        msns = self._tx_msn
        msn = msns[_QN_SEND]
        parts = encode_message_parts(
            part.message, msn=msn, mulpdu=self._mulpdu, mo=part.mo, last=part.last
        )
        if part.last and isinstance(part.message, Send):
            msns[_QN_SEND] = (msn + 1) & ALL_ONES_32
        return parts

    def send_write_parts(self, stag: int, to: int, data: Data) -> list[ddp.Parts]:
        """:meth:`send_parts` of ``RdmaWrite(stag, to, data)``, no message made (the
        sender's bulk path, :data:`~stack.wire.events.WriteFields`)."""
        if self.send_state is _SEND_TERMINATED:
            raise _after_terminate()
        return encode_write_fields(stag, to, data, self._mulpdu)

    def terminate_message(
        self, error: ProtocolError | None, offending_ulpdu: Data | None, *, read_progress: int = 0
    ) -> Terminate:
        """The Terminate reporting ``error`` about ``offending_ulpdu`` (RFC 5040 §7.1).

        Pass it to :meth:`send`.  An error without a Terminate cause becomes RDMAP local
        catastrophic.  See :func:`stack.wire.terminate.build_terminate`.
        """
        return build_terminate(terminate_for(error), offending_ulpdu, read_progress=read_progress)

    # -- receive -----------------------------------------------------------------------

    def receive_ulpdu(self, ulpdu: Data) -> list[RdmapEvent]:
        """Validate one ULPDU and return its events (module docstring)."""
        if isinstance(ulpdu, memoryview) and ulpdu.format == "B" and ulpdu.ndim == 1:
            view = ulpdu
        else:
            view = ddp.byte_view(ulpdu)
        if self.recv_state is _RECV_OPEN:
            fast = self._fast_path(view)
            if fast is not None:
                return fast
        is_terminate = (
            len(view) >= 2
            and not view[0] & DDP_TAGGED
            and view[1] & RDMAP_OPCODE_MASK == Opcode.TERMINATE
        )
        return _RECV_ACTIONS[self.recv_state, is_terminate](self, view)

    def _fast_path(self, view: memoryview) -> list[RdmapEvent] | None:
        """Tagged data and in-sequence Send segments whose header bytes are exactly valid.

        Only segments that every check of :meth:`_process` would pass without a finding
        take this path (same events, same state change); anything else returns None.
        """
        n = len(view)
        if n < DDP_TAGGED_HDR_LEN:
            return None
        b0 = view[0]
        b1 = view[1]
        if b0 & DDP_TAGGED:
            tagged = TAGGED_EXACT.get(b0 << 8 | b1)
            if tagged is None:
                return None
            _, _, stag, to = ddp.TAGGED_HDR.unpack_from(view)
            write, last = tagged
            segment = WriteSegment if write else ReadResponseSegment
            return [segment(stag, to, view[DDP_TAGGED_HDR_LEN:], last, view)]
        if b0 == _UNTAGGED_LAST and (fixed := self._exact_fixed.get(b1)) is not None:
            return self._fixed_message(view, fixed)
        send = self._send_in_sequence(view)
        if send is None:
            return None
        op, inval, msn, mo = send
        last = b0 == _UNTAGGED_LAST
        self.sequencer.advance(0, msn, mo, b1, inval, mo + n - DDP_UNTAGGED_HDR_LEN, last)
        data = view[DDP_UNTAGGED_HDR_LEN:]
        return [
            SendSegment(op, msn, mo, data, last, inval if op in _INVALIDATE_OPS else None, view)
        ]

    def _fixed_message(
        self, view: memoryview, fixed: tuple[int, int, int]
    ) -> list[RdmapEvent] | None:
        """:meth:`_fixed_event` as the events of :meth:`receive_ulpdu`, the sequencer
        advanced."""
        event = self._fixed_event(view, fixed)
        if event is None:
            return None
        self.advance_fixed(view, fixed, event.msn)
        return [event]

    def _fixed_event(self, view: memoryview, fixed: tuple[int, int, int]) -> MessageEvent | None:
        """The event of a Read Request, atomic or Immediate Data message (one segment, fixed
        size) that every check of :meth:`_process` passes without a finding: exact length,
        QN of its opcode, RsvdULP 0, MO 0, the expected MSN with no message open on the
        queue (RDMAP-01, RDMAP-04, DDP-05, EXT-02/03/09); else None.  Nothing changes: the
        caller advances the sequencer when it takes the event."""
        op, qn, size = fixed
        if len(view) != DDP_UNTAGGED_HDR_LEN + size:
            return None
        _, _b1, inval, q, msn, mo = ddp.UNTAGGED_HDR.unpack_from(view)
        if not self.fixed_in_sequence(qn, inval, q, msn, mo):
            return None
        header = exact_fixed_header(op, view[DDP_UNTAGGED_HDR_LEN:])
        if header is None:
            return None
        if isinstance(header, ImmediateData):
            return ImmediateDataReceived(msn, header.data, header.solicited, view)
        if isinstance(header, ReadRequest):
            return ReadRequestReceived(msn, header, view)
        if isinstance(header, AtomicRequest):
            return AtomicRequestReceived(msn, header, view)
        assert isinstance(header, AtomicResponse)
        return AtomicResponseReceived(msn, header, view)

    def _send_in_sequence(self, view: memoryview) -> tuple[Opcode, int, int, int] | None:
        """(opcode, Invalidate STag field, MSN, MO) of a Send-family segment whose header
        bytes are exactly valid and in sequence on QN 0 (DDP-02, DDP-04..06), else None:
        the test both fast paths share (nothing changes)."""
        b0 = view[0]
        b1 = view[1]
        if (b0 != _UNTAGGED_LAST and b0 != _UNTAGGED_MORE) or len(view) < DDP_UNTAGGED_HDR_LEN:
            return None
        op = _FAST_SEND_CTRLS.get(b1)
        if op is None:
            return None
        _, _, inval, qn, msn, mo = ddp.UNTAGGED_HDR.unpack_from(view)
        if qn or (inval and op not in _INVALIDATE_OPS):
            return None
        open_msg = self.sequencer.open_untagged.get(0)
        if open_msg is None:
            if mo or msn != self.sequencer.next_msn.get(0, 1):
                return None
        elif msn != open_msg[0] or mo != open_msg[1] or b1 != open_msg[2] or inval != open_msg[3]:
            return None
        return op, inval, msn, mo

    def place_tagged(self, ulpdu: memoryview) -> bool:
        """The bulk path: hand a tagged Write / Read Response segment that passes every
        stream check (the :meth:`_fast_path` header test) straight to :attr:`placer`, an
        in-sequence Send segment to :attr:`send_placer`, and the event of a one-segment
        message that passes them to :attr:`message_placer`, with no event queued; False
        (nothing changed) for anything else, which goes the event way.

        ``ulpdu`` is a byte view (what the deframer hands out).  The placer runs the RNIC's
        checks (RFC 5041 §7.1, SEC-*) and raises their :class:`ProtocolError`.
        """
        if len(ulpdu) < DDP_TAGGED_HDR_LEN or self.recv_state is not _RECV_OPEN:
            return False
        # The tagged header's fields, read at once (for an untagged ULPDU, long enough for
        # the shorter tagged header, only the first two bytes are used).
        b0, b1, stag, to = _unpack_tagged(ulpdu)
        tagged = TAGGED_EXACT.get(b0 << 8 | b1)
        if tagged is None:
            if b0 & DDP_TAGGED:
                return False
            if b0 == _UNTAGGED_LAST and (fixed := self._exact_fixed.get(b1)) is not None:
                return self._place_fixed(ulpdu, fixed)
            if self.send_placer is None:
                return False
            return self._place_send(ulpdu)
        placer = self.placer
        if placer is None:
            return False
        return placer(tagged[0], tagged[1], stag, to, ulpdu[DDP_TAGGED_HDR_LEN:], ulpdu)

    def _place_fixed(self, view: memoryview, fixed: tuple[int, int, int]) -> bool:
        """The bulk path for a one-segment message: the :meth:`_fast_path` checks, then
        :attr:`message_placer`; the sequencer advances as on the event path (also when the
        placer raises a :class:`ProtocolError`), and not when the placer declines."""
        placer = self.message_placer
        if placer is None:
            return False
        event = self._fixed_event(view, fixed)
        if event is None:
            return False
        try:
            placed = placer(event)
        except ProtocolError:
            self.advance_fixed(view, fixed, event.msn)
            raise
        if placed:
            self.advance_fixed(view, fixed, event.msn)
        return placed

    def fixed_in_sequence(self, qn: int, inval: int, q: int, msn: int, mo: int) -> bool:
        """Whether the DDP fields of a one-segment message for queue ``qn`` are exactly
        what is expected: Invalidate STag field 0, QN ``qn``, MO 0, the expected MSN with no
        message open on the queue (RDMAP-01, DDP-02, DDP-05).  The exact-case test of the
        bulk path and of the express path (:mod:`stack.rnic.express`); nothing changes."""
        seq = self.sequencer
        return (
            not inval
            and q == qn
            and not mo
            and qn not in seq.open_untagged
            and msn == seq.expected_msn(qn)
        )

    def advance_fixed(self, view: memoryview, fixed: tuple[int, int, int], msn: int) -> None:
        """The sequencer takes a one-segment message of :meth:`_fixed_event` (its QN, MSN,
        RsvdULP byte and length; MO 0, Last)."""
        self.sequencer.advance(fixed[1], msn, 0, view[1], 0, fixed[2], True)

    def _place_send(self, view: memoryview) -> bool:
        """The bulk path for a Send segment: the :meth:`_fast_path` checks (exact header,
        QN 0, MSN and MO in sequence, DDP-02/DDP-04..06), then :attr:`send_placer`; the
        sequencer advances as it does on the event path (also when placement fails with a
        :class:`ProtocolError`), and not when the placer declines."""
        send = self._send_in_sequence(view)
        if send is None:
            return False
        op, inval, msn, mo = send
        b1 = view[1]
        n = len(view)
        last = view[0] == _UNTAGGED_LAST
        seq = self.sequencer
        placer = self.send_placer
        assert placer is not None
        data = view[DDP_UNTAGGED_HDR_LEN:]
        invalidate = inval if op in _INVALIDATE_OPS else None
        try:
            placed = placer(op, msn, mo, data, last, invalidate, view)
        except ProtocolError:
            seq.advance(0, msn, mo, b1, inval, mo + n - DDP_UNTAGGED_HDR_LEN, last)
            raise
        if placed:
            seq.advance(0, msn, mo, b1, inval, mo + n - DDP_UNTAGGED_HDR_LEN, last)
        return placed

    def _process(self, view: memoryview) -> list[RdmapEvent]:
        chk = Checker(strict=True)
        try:
            f = check_ddp(view, chk, self.rfc7306)
            if not f.tagged:
                self.sequencer.untagged(
                    f.qn,  # type: ignore[arg-type]
                    f.msn,  # type: ignore[arg-type]
                    f.mo,  # type: ignore[arg-type]
                    f.ulp_ctrl,
                    f.inval_stag,  # type: ignore[arg-type]
                    len(view) - f.hlen,
                    f.last,
                    chk,
                )
            op, header, payload = check_rdmap(f, chk, self.rfc7306, self.siw_layout)
        except ProtocolError as exc:
            self._keep(chk.findings)
            if exc.ulpdu is None:
                exc.ulpdu = view
            self.error = exc
            self.recv_state = RecvState.FAILED
            raise
        if chk.findings:
            self._keep(chk.findings)
        if f.tagged:
            if op == Opcode.RDMA_WRITE:
                return [WriteSegment(f.stag, f.to, payload, f.last, view)]  # type: ignore[arg-type]
            return [ReadResponseSegment(f.stag, f.to, payload, f.last, view)]  # type: ignore[arg-type]
        msn: int = f.msn  # type: ignore[assignment]
        if header is None:
            inval = f.inval_stag if op in _INVALIDATE_OPS else None
            return [
                SendSegment(_SEND_EVENT_OPS[op], msn, f.mo, payload, f.last, inval, view)  # type: ignore[arg-type]
            ]
        if isinstance(header, ReadRequest):
            return [ReadRequestReceived(msn, header, view)]
        if isinstance(header, AtomicRequest):
            return [AtomicRequestReceived(msn, header, view)]
        if isinstance(header, AtomicResponse):
            return [AtomicResponseReceived(msn, header, view)]
        if isinstance(header, ImmediateData):
            return [ImmediateDataReceived(msn, header.data, header.solicited, view)]
        self.terminate_received = header
        self.recv_state = RecvState.TERMINATED
        return [TerminateReceived(header)]

    def _refuse(self, view: memoryview) -> list[RdmapEvent]:
        assert self.error is not None
        raise self.error.with_traceback(None)

    def _terminate_after_error(self, view: memoryview) -> list[RdmapEvent]:
        try:
            seg = decode_ulpdu(view, strict=False, rfc7306=self.rfc7306, siw_layout=self.siw_layout)
        except ProtocolError:
            return self._refuse(view)
        if not isinstance(seg.header, Terminate) or seg.qn != QueueNumber.TERMINATE:
            return self._refuse(view)
        self._keep(seg.findings)
        self.terminate_received = seg.header
        self.recv_state = RecvState.TERMINATED
        return [TerminateReceived(seg.header)]

    def _data_after_terminate(self, view: memoryview) -> list[RdmapEvent]:
        error = RdmapError("RDMAP-10", "segment received after the peer's Terminate")
        error.ulpdu = view
        raise error

    def _second_terminate(self, view: memoryview) -> list[RdmapEvent]:
        self._keep([Finding("RDMAP-10", "second Terminate ignored", None, False)])
        return []

    def _keep(self, findings: list[Finding] | tuple[Finding, ...]) -> None:
        room = MAX_FINDINGS - len(self.findings)
        self.findings.extend(findings[:room])
        self.findings_dropped += max(0, len(findings) - room)


_RecvAction = Callable[[RdmapStream, memoryview], list[RdmapEvent]]
_RECV_ACTIONS: dict[tuple[RecvState, bool], _RecvAction] = {
    (RecvState.OPEN, False): RdmapStream._process,
    (RecvState.OPEN, True): RdmapStream._process,
    (RecvState.FAILED, False): RdmapStream._refuse,
    (RecvState.FAILED, True): RdmapStream._terminate_after_error,
    (RecvState.TERMINATED, False): RdmapStream._data_after_terminate,
    (RecvState.TERMINATED, True): RdmapStream._second_terminate,
}
"""(state, input is a Terminate) -> action: the receive table of the module docstring."""
