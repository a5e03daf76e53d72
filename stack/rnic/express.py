"""The express receive path: a lone Read or Atomic Request answered in one step.

In a request/response exchange each read of the socket holds one FPDU, and the answer goes
out with nothing queued ahead of it.  :class:`ExpressReceiver` takes such a chunk past the
layers when it is a Read Request (RFC 5040 §4.4) or an Atomic Request (RFC 7306 §5.2.1):
one function makes the checks the layers make for that exact case and frames the answer
into the engine's output, where the layers would make an event, apply it to the QP, queue
the response and take it in the transport's turn.

It decides nothing on its own.  It takes only a chunk every layer accepts as it is:

* MPA: one whole FPDU, nothing else pending, no markers, its CRC good
  (:meth:`~stack.wire.deframer.FpduDeframer.take_whole`, MPA-12, MPA-16), no event queued,
  no FIN, not holding output for the initiator's first FPDU (MPA-25);
* DDP and RDMAP: the exact header the stream's own exact-case test accepts (DV=1, RV=1, L,
  reserved bits and Invalidate STag 0, the QN of the opcode, MO 0, the expected MSN with no
  message open on the queue: DDP-02, DDP-04..06, RDMAP-01/04, EXT-02), the stream open both
  ways, no RTR still to absorb (ERC-09);
* the QP: in RTS, no Read Responses still viewing memory, no chains, no Terminate pending,
  nothing queued ahead of the answer, a free IRD slot (SEC-10), and the access check the
  QP makes (:func:`~stack.rnic.memory.check_remote_access`: valid, PD, stream, right,
  wrap, bounds).

Anything else it hands back unchanged (``False``), and the layers take the chunk, refusing
it with their Terminate where it is wrong.  After it has taken the FPDU (the deframer's
offsets, the queue's MSN), it changes what the layers would change: the answer framed by
the stream's encoder and the framer, its IRD slot held until the transport drains the
output (:meth:`~stack.rnic.qp_send.QpSend.release_answered`).  An atomic that the target
memory refuses (EXT-05) raises the QP's :class:`~stack.errors.ProtocolError` naming the
ULPDU, as the layers raise it.  The tests run every exchange with and without it
(``QpEndpoint.bulk``) and compare the bytes on the wire.
"""

from __future__ import annotations

import struct
from typing import TYPE_CHECKING

from stack.constants import (
    ATOMIC_OPCODE_MASK,
    DDP_TAGGED_HDR_LEN,
    DDP_UNTAGGED_HDR_LEN,
    IOV_MIN_PAYLOAD,
    MPA_CRC_LEN,
    MPA_LENGTH_LEN,
    Opcode,
    QueueNumber,
)
from stack.errors import ProtocolError
from stack.rnic.memory import RDMAP_REMOTE_CODES, Access, check_remote_access
from stack.rnic.qp_base import QpState
from stack.wire import ddp
from stack.wire.events import AtomicRequest, AtomicResponse
from stack.wire.headers import ATOMIC_REQUEST, READ_REQUEST
from stack.wire.rdmap import ATOMIC_REQUEST_RECORD, READ_REQUEST_RECORD, rdmap_ctrl

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
    return (
        struct.Struct(">H" + record.format.lstrip(">")),
        ulpdu,
        ((MPA_LENGTH_LEN + ulpdu + 3) & ~3) + MPA_CRC_LEN,
    )


_READ_FPDU, _READ_LEN, _READ_WIRE = _fpdu(READ_REQUEST_RECORD)
_ATOMIC_FPDU, _ATOMIC_LEN, _ATOMIC_WIRE = _fpdu(ATOMIC_REQUEST_RECORD)
_LAST = ddp.CTRL_UNTAGGED_LAST
_READ_CTRL = rdmap_ctrl(Opcode.RDMA_READ_REQUEST)
_ATOMIC_CTRL = rdmap_ctrl(Opcode.ATOMIC_REQUEST)
_READ_RESPONSE_CTRL = rdmap_ctrl(Opcode.RDMA_READ_RESPONSE)
_QN = int(QueueNumber.READ_REQUEST)  # both requests' queue (RDMAP-01)
_READ_BODY = READ_REQUEST.size
_ATOMIC_BODY = ATOMIC_REQUEST.size
_REMOTE_READ = int(Access.REMOTE_READ)
_REMOTE_ATOMIC = int(Access.REMOTE_ATOMIC)
_RTS = QpState.RTS
_ATOMIC_WORD = 8


class ExpressReceiver:
    """The express receive path of one endpoint's engine and QP (module docstring)."""

    __slots__ = ("engine", "qp")

    def __init__(self, engine: IwarpConnection, qp: QueuePair) -> None:
        self.engine = engine
        self.qp = qp

    def take(self, view: memoryview) -> bool:
        """Answer the lone request ``view`` holds (a byte view of what one read of the
        socket returned); False, nothing changed, for anything else."""
        wire = len(view)
        if wire != _READ_WIRE and wire != _ATOMIC_WIRE:
            return False
        qp = self.qp
        if (
            qp.state is not _RTS
            or qp._out
            or qp._lazy
            or qp.chains is not None
            or qp.terminate_pending is not None
            or qp._inbound_pending >= qp.ird
        ):
            return False
        engine = self.engine
        mpa = engine.mpa
        deframer = mpa.plain_deframer
        stream = engine.plain_stream
        if deframer is None or stream is None or not mpa.sends_now:
            return False
        if wire == _READ_WIRE and view[3] == _READ_CTRL:
            return self._read_request(view, stream, deframer)
        if wire == _ATOMIC_WIRE and view[3] == _ATOMIC_CTRL and stream.rfc7306:
            return self._atomic_request(view, stream, deframer)
        return False

    def _read_request(self, view: memoryview, stream: RdmapStream, deframer: FpduDeframer) -> bool:
        """A Read Request: its Read Response (RFC 5040 §4.5), framed if the source is
        small enough to copy as it is framed (as the framer copies it)."""
        (n, ctrl, _rdmap, inval, qn, msn, mo, sink_stag, sink_to, size, stag, to) = (
            _READ_FPDU.unpack_from(view)
        )
        seq = stream.sequencer
        if (
            n != _READ_LEN
            or ctrl != _LAST
            or inval
            or qn != _QN
            or mo
            or _QN in seq.open_untagged
            or msn != seq.expected_msn(_QN)
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
        if deframer.take_whole(view) is None:  # the CRC (MPA-12); else taken from here on
            return False
        seq.advance(_QN, msn, 0, _READ_CTRL, 0, _READ_BODY, True)
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
        (n, ctrl, _rdmap, inval, qn, msn, mo, word, req_id, stag, to, *operands) = (
            _ATOMIC_FPDU.unpack_from(view)
        )
        seq = stream.sequencer
        if (
            n != _ATOMIC_LEN
            or ctrl != _LAST
            or inval
            or qn != _QN
            or mo
            or word & ~ATOMIC_OPCODE_MASK  # EXT-02: noted by the layers
            or _QN in seq.open_untagged
            or msn != seq.expected_msn(_QN)
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
        seq.advance(_QN, msn, 0, _ATOMIC_CTRL, 0, _ATOMIC_BODY, True)
        try:
            original = region.atomic(AtomicRequest(word, req_id, stag, to, *operands))
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


assert DDP_UNTAGGED_HDR_LEN + _READ_BODY == _READ_LEN
