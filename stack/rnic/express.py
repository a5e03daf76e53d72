"""The express receive path: one lone FPDU applied, or answered, in one step.

In a request/response exchange each read of the socket holds one FPDU.
:class:`ExpressReceiver` takes such a chunk past the layers when it is a Read Request (RFC
5040 §4.4) or an Atomic Request (RFC 7306 §5.2.1), and the answer can go out with nothing
queued ahead of it; or a tagged Write or Read Response segment (RFC 5041 §4.1); or an
Atomic Response (RFC 7306 §5.2.2).  One function makes the checks the layers make for that
exact case and applies it: a request's answer framed into the engine's output where the
layers would make an event, apply it to the QP, queue the response and take it in the
transport's turn; a segment placed, a response returned to its WR, by the QP's own code.

It decides nothing on its own.  It takes only a chunk every layer accepts as it is:

* MPA: one whole FPDU, nothing else pending, no markers, its CRC good
  (:meth:`~stack.wire.deframer.FpduDeframer.take_whole`, MPA-12, MPA-16), no event queued,
  no FIN, not holding output for the initiator's first FPDU (MPA-25);
* DDP and RDMAP: the exact header the stream's own exact-case test accepts (DV=1, RV=1, L,
  reserved bits and Invalidate STag 0, the QN of the opcode, MO 0, the expected MSN with no
  message open on the queue: DDP-02, DDP-04..06, RDMAP-01/04, EXT-02), the stream open both
  ways, no RTR still to absorb (ERC-09);
* the QP: in RTS, no Read Responses still viewing memory, no chains, no Terminate pending,
  no ORD credit held by the connection's RTR; for a request, nothing queued ahead of the
  answer, a free IRD slot (SEC-10), and the access check the QP makes
  (:func:`~stack.rnic.memory.check_remote_access`: valid, PD, stream, right, wrap,
  bounds).

Anything else it hands back unchanged (``False``), and the layers take the chunk, refusing
it with their Terminate where it is wrong.  After it has taken the FPDU (the deframer's
offsets, the queue's MSN), it changes what the layers would change: the answer framed by
the stream's encoder and the framer, its IRD slot held until the transport drains the
output (:meth:`~stack.rnic.qp_send.QpSend.release_answered`).  What the QP refuses after
that (a segment outside its STag, SEC-04; an atomic the target word refuses, EXT-05; a
response that is not the oldest request's, EXT-03) raises its
:class:`~stack.errors.ProtocolError` naming the ULPDU, as through the layers.  The tests
run every exchange with and without it (``QpEndpoint.bulk``) and compare the bytes on the
wire.
"""

from __future__ import annotations

import struct
from typing import TYPE_CHECKING

from stack.constants import (
    ATOMIC_OPCODE_MASK,
    DDP_TAGGED,
    DDP_TAGGED_HDR_LEN,
    IOV_MIN_PAYLOAD,
    MPA_CRC_LEN,
    MPA_LENGTH_LEN,
    Opcode,
)
from stack.errors import ProtocolError
from stack.rnic.memory import RDMAP_REMOTE_CODES, Access, check_remote_access
from stack.rnic.qp_base import QpState
from stack.wire import ddp
from stack.wire.events import AtomicRequest, AtomicResponse
from stack.wire.markers import fpdu_wire_length
from stack.wire.rdmap import (
    ATOMIC_REQUEST_RECORD,
    ATOMIC_RESPONSE_RECORD,
    EXACT_FIXED,
    READ_REQUEST_RECORD,
    rdmap_ctrl,
)
from stack.wire.stream import TAGGED_EXACT

if TYPE_CHECKING:
    from stack.rnic.qp import QueuePair
    from stack.wire.connection import IwarpConnection
    from stack.wire.deframer import FpduDeframer
    from stack.wire.stream import RdmapStream

__all__ = ["ExpressReceiver"]


def _fpdu(record: struct.Struct) -> tuple[struct.Struct, int, int]:
    """The length field and ``record`` as one record, the ULPDU length and the FPDU's wire
    length (MPA-01: length, ULPDU, PAD, CRC)."""
    ulpdu = record.size
    return struct.Struct(">H" + record.format.lstrip(">")), ulpdu, fpdu_wire_length(ulpdu)


_READ_FPDU, _READ_LEN, _READ_WIRE = _fpdu(READ_REQUEST_RECORD)
_ATOMIC_FPDU, _ATOMIC_LEN, _ATOMIC_WIRE = _fpdu(ATOMIC_REQUEST_RECORD)
_RESPONSE_FPDU, _RESPONSE_LEN, _RESPONSE_WIRE = _fpdu(ATOMIC_RESPONSE_RECORD)
_MIN_WIRE = MPA_LENGTH_LEN + DDP_TAGGED_HDR_LEN + MPA_CRC_LEN  # the shortest FPDU taken
_LAST = ddp.CTRL_UNTAGGED_LAST
_READ_CTRL = rdmap_ctrl(Opcode.RDMA_READ_REQUEST)
_ATOMIC_CTRL = rdmap_ctrl(Opcode.ATOMIC_REQUEST)
_READ_RESPONSE_CTRL = rdmap_ctrl(Opcode.RDMA_READ_RESPONSE)
_ATOMIC_RESPONSE_CTRL = rdmap_ctrl(Opcode.ATOMIC_RESPONSE)
_READ_FIXED = EXACT_FIXED[_READ_CTRL]  # (opcode, QN, RDMAP header length): RDMAP-01
_ATOMIC_FIXED = EXACT_FIXED[_ATOMIC_CTRL]
_RESPONSE_FIXED = EXACT_FIXED[_ATOMIC_RESPONSE_CTRL]
_REMOTE_READ = int(Access.REMOTE_READ)
_REMOTE_ATOMIC = int(Access.REMOTE_ATOMIC)
_RTS = QpState.RTS
_ATOMIC_WORD = 8


def _hooked(qp_attributes: dict[str, object]) -> bool:
    """Whether a method this path goes past is replaced on the QP (a test's or a fault's
    hook on the event path): then every message takes that path."""
    return (
        "handle_event" in qp_attributes
        or "place_tagged" in qp_attributes
        or "_on_read_request" in qp_attributes
        or "_on_atomic_request" in qp_attributes
        or "_on_atomic_response" in qp_attributes
        or "_queue_response" in qp_attributes
    )


class ExpressReceiver:
    """The express receive path of one endpoint's engine and QP (module docstring)."""

    __slots__ = ("engine", "qp")

    def __init__(self, engine: IwarpConnection, qp: QueuePair) -> None:
        self.engine = engine
        self.qp = qp

    def take(self, view: memoryview) -> bool:
        """Apply the lone FPDU ``view`` holds (a byte view of what one read of the socket
        returned) when it is a request, a tagged segment or an Atomic Response; False,
        nothing changed, for anything else."""
        wire = len(view)
        # One whole FPDU (MPA-01: the length field, the ULPDU, PAD, CRC), tested first: a
        # read of many FPDUs costs this test alone.
        if wire < _MIN_WIRE:
            return False
        if wire != ((MPA_LENGTH_LEN + (view[0] << 8 | view[1]) + 3) & ~3) + MPA_CRC_LEN:
            return False
        qp = self.qp
        if (
            qp.state is not _RTS
            or qp._lazy
            or qp.chains is not None
            or qp.terminate_pending is not None
            or qp.ord_reserved
            or _hooked(qp.__dict__)
        ):
            return False
        engine = self.engine
        deframer = engine.mpa.plain_deframer
        stream = engine.plain_stream
        if deframer is None or stream is None:
            return False
        if view[2] & DDP_TAGGED:
            return self._tagged(view, deframer)
        ctrl = view[3]
        if ctrl == _ATOMIC_RESPONSE_CTRL:
            return (
                wire == _RESPONSE_WIRE
                and stream.rfc7306
                and self._atomic_response(view, stream, deframer)
            )
        # A request: its answer goes out now, nothing may be queued ahead of it.
        if qp._out or qp.ird_full or not engine.mpa.sends_now:
            return False
        if ctrl == _READ_CTRL:
            return wire == _READ_WIRE and self._read_request(view, stream, deframer)
        if ctrl == _ATOMIC_CTRL:
            return (
                wire == _ATOMIC_WIRE
                and stream.rfc7306
                and self._atomic_request(view, stream, deframer)
            )
        return False

    def _tagged(self, view: memoryview, deframer: FpduDeframer) -> bool:
        """A tagged Write or Read Response segment whose header bytes are exactly valid
        (the stream's :data:`~stack.wire.stream.TAGGED_EXACT`), placed by the QP (RFC 5041
        §4.1, RFC 5042 §6) as the stream's bulk path hands it over."""
        kind = TAGGED_EXACT.get(view[2] << 8 | view[3])
        if kind is None or (view[0] << 8 | view[1]) < DDP_TAGGED_HDR_LEN:
            return False
        ulpdu = deframer.take_whole(view)
        if ulpdu is None:
            return False
        self.engine.mpa.tail = 0
        _, _, stag, to = ddp.TAGGED_HDR.unpack_from(ulpdu)
        self.qp.place_tagged(kind[0], kind[1], stag, to, ulpdu[DDP_TAGGED_HDR_LEN:], ulpdu)
        return True

    def _atomic_response(
        self, view: memoryview, stream: RdmapStream, deframer: FpduDeframer
    ) -> bool:
        """An Atomic Response (RFC 7306 §5.2.2): its original value returned to its WR."""
        (n, ctrl, _rdmap, inval, qn, msn, mo, req_id, original) = _RESPONSE_FPDU.unpack_from(view)
        if (
            n != _RESPONSE_LEN
            or ctrl != _LAST
            or not stream.fixed_in_sequence(_RESPONSE_FIXED[1], inval, qn, msn, mo)
        ):
            return False
        ulpdu = deframer.take_whole(view)
        if ulpdu is None:
            return False
        self.engine.mpa.tail = 0
        stream.advance_fixed(ulpdu, _RESPONSE_FIXED, msn)
        try:
            self.qp._on_atomic_response(AtomicResponse(req_id, original))
        except ProtocolError as exc:  # not the oldest request's (EXT-03)
            if exc.ulpdu is None:
                exc.ulpdu = ulpdu
            raise
        return True

    def _read_request(self, view: memoryview, stream: RdmapStream, deframer: FpduDeframer) -> bool:
        """A Read Request: its Read Response (RFC 5040 §4.5), framed if the source is
        small enough to copy as it is framed (as the framer copies it)."""
        (n, ctrl, _rdmap, inval, qn, msn, mo, sink_stag, sink_to, size, stag, to) = (
            _READ_FPDU.unpack_from(view)
        )
        if (
            n != _READ_LEN
            or ctrl != _LAST
            or not stream.fixed_in_sequence(_READ_FIXED[1], inval, qn, msn, mo)
            or not 0 < size < IOV_MIN_PAYLOAD
            or size + DDP_TAGGED_HDR_LEN > stream.mulpdu
        ):
            return False
        qp = self.qp
        try:
            data = check_remote_access(
                qp.table, qp.pd, stag, to, size, _REMOTE_READ, RDMAP_REMOTE_CODES, qp
            )
        except ProtocolError:
            return False  # the layers refuse it
        ulpdu = deframer.take_whole(view)  # the CRC (MPA-12); else taken from here on
        if ulpdu is None:
            return False
        stream.advance_fixed(ulpdu, _READ_FIXED, msn)
        parts = ddp.segment_tagged_parts(
            sink_stag, sink_to, _READ_RESPONSE_CTRL, data, stream.mulpdu
        )
        self._answered(parts)
        return True

    def _atomic_request(
        self, view: memoryview, stream: RdmapStream, deframer: FpduDeframer
    ) -> bool:
        """An Atomic Request: run on the target word (EXT-05..07) and answered with its
        Atomic Response (RFC 7306 §5.2.2)."""
        (n, ctrl, _rdmap, inval, qn, msn, mo, word, req_id, stag, to, add, add_mask, compare,
         compare_mask) = _ATOMIC_FPDU.unpack_from(view)  # fmt: skip
        if (
            n != _ATOMIC_LEN
            or ctrl != _LAST
            or word & ~ATOMIC_OPCODE_MASK  # EXT-02: noted by the layers
            or not stream.fixed_in_sequence(_ATOMIC_FIXED[1], inval, qn, msn, mo)
        ):
            return False
        qp = self.qp
        try:
            check_remote_access(
                qp.table, qp.pd, stag, to, _ATOMIC_WORD, _REMOTE_ATOMIC, RDMAP_REMOTE_CODES, qp
            )
        except ProtocolError:
            return False
        region = qp.table.lookup(stag)
        assert region is not None
        ulpdu = deframer.take_whole(view)
        if ulpdu is None:
            return False
        stream.advance_fixed(ulpdu, _ATOMIC_FIXED, msn)
        try:
            original = region.atomic(
                AtomicRequest(word, req_id, stag, to, add, add_mask, compare, compare_mask)
            )
        except ProtocolError as exc:  # refused before anything changed (EXT-05)
            self.engine.mpa.tail = 0
            qp._inbound_pending += 1  # as the layers take the slot before the check
            if exc.ulpdu is None:
                exc.ulpdu = ulpdu
            raise
        self._answered(stream.send_parts(AtomicResponse(req_id, original)))
        return True

    def _answered(self, parts: list[ddp.Parts]) -> None:
        """Frame the answer's ``parts`` now and hold its IRD slot until the output is
        drained (:meth:`~stack.rnic.qp_send.QpSend.release_answered`)."""
        mpa = self.engine.mpa
        mpa.tail = 0  # nothing of the chunk is left (the caller's receive buffer)
        mpa.send_ulpdu_parts(parts)
        qp = self.qp
        qp._inbound_pending += 1
        qp._answered_early += 1
        qp._notify_output()
