"""The stateful wire checks of one direction, run leniently for the capture decoder."""

from __future__ import annotations

from stack.constants import (
    DDP_DV_MASK,
    DDP_RSVD_MASK,
    DDP_TAGGED,
    DDP_TAGGED_HDR_LEN,
    DDP_UNTAGGED_HDR_LEN,
    OPCODE_QN,
    RDMAP_OPCODE_MASK,
    RDMAP_RSVD_MASK,
    RDMAP_RV_MASK,
    RDMAP_VERSION,
    TAGGED_OPCODES,
    Opcode,
)
from stack.dissect.decoder.common import (
    _MIN_ULPDU,
    _OP_ATOMIC_REQUEST,
    _OP_ATOMIC_RESPONSE,
    _OP_READ_REQUEST,
    _OP_READ_RESPONSE,
    _OP_TERMINATE,
    _OP_WRITE,
    _U32,
)
from stack.dissect.decoder.records import SegmentView
from stack.wire.checker import Checker, Finding
from stack.wire.events import (
    AtomicRequest,
    AtomicResponse,
    ReadRequest,
    Terminate,
)
from stack.wire.sequence import MessageSequencer, RequestTracker
from stack.wire.terminate import check_terminate_headers

# ======================================================================================
# Stateful per-direction validation
# ======================================================================================


class DirectionChecks:
    """What is tracked of one sending direction: the wire engines' :class:`MessageSequencer`
    and :class:`RequestTracker`, run leniently, plus nothing after a Terminate (RDMAP-10).

    ``requests`` holds the Read and Atomic Requests this direction sent; the other
    direction's responses are matched against them.
    """

    __slots__ = ("messages", "requests", "terminated", "chk")

    def __init__(self, known: bool) -> None:
        self.messages = MessageSequencer(known)
        self.requests = RequestTracker(known)
        self.terminated = False
        self.chk = Checker(False)

    @property
    def known(self) -> bool:
        """True when the stream start was seen: MSNs start at 1, no request is unknown."""
        return self.messages.known

    @known.setter
    def known(self, value: bool) -> None:
        self.messages.known = self.requests.known = value

    def forget(self) -> None:
        """After lost data: MSNs, open messages and outstanding requests are unknown."""
        self.messages.forget()
        self.requests.forget()

    def check(self, seg: SegmentView, out: list[Finding], peer: DirectionChecks) -> None:
        """Append to ``out`` what this segment breaks of the stateful rules."""
        op = seg.opcode
        if seg.tagged:
            self.tagged(op, seg.stag, seg.to, seg.ulpdu_len - DDP_TAGGED_HDR_LEN, seg.last,  # type: ignore[arg-type]
                        out, peer)  # fmt: skip
        elif seg.qn is not None:
            self.untagged(
                seg.qn,
                seg.msn,  # type: ignore[arg-type]
                seg.mo,  # type: ignore[arg-type]
                (seg.rdmap_version << 6) | seg.rdmap_rsvd | op,
                seg.inval_stag or 0,
                seg.ulpdu_len - DDP_UNTAGGED_HDR_LEN,
                seg.last,
                out,
            )
        elif self.terminated:
            out.append(Finding("RDMAP-10", "FPDU sent after this side's Terminate"))
        header = seg.header
        if header is None and op != _OP_TERMINATE:
            return
        chk = self.chk
        chk.findings = out
        if op == _OP_TERMINATE:
            self.terminated = True
            if isinstance(header, Terminate):
                check_terminate_headers(header, chk)
        elif op == _OP_READ_REQUEST and isinstance(header, ReadRequest):
            self.requests.read_request(header.sink_stag, header.sink_to, header.size)
        elif op == _OP_ATOMIC_REQUEST and isinstance(header, AtomicRequest):
            self.requests.atomic_request(header.req_id)
        elif op == _OP_ATOMIC_RESPONSE and isinstance(header, AtomicResponse):
            peer.requests.atomic_response(header.req_id, chk)

    def tagged(
        self,
        op: int,
        stag: int,
        to: int,
        size: int,
        last: bool,
        out: list[Finding],
        peer: DirectionChecks,
    ) -> None:
        """The stateful checks of a tagged segment (DDP-02, DDP-04, RDMAP-04, RDMAP-10)."""
        messages = self.messages
        if op == _OP_WRITE and last and messages.open_tagged is None and not self.terminated:
            return  # a one-segment RDMA Write with nothing open: nothing to track
        chk = self.chk
        chk.findings = out
        if self.terminated:
            out.append(Finding("RDMAP-10", "FPDU sent after this side's Terminate"))
        messages.tagged(stag, to, op, size, last, chk)
        if op == _OP_READ_RESPONSE:
            peer.requests.read_response(stag, to, size, last, chk)

    def untagged(
        self,
        qn: int,
        msn: int,
        mo: int,
        ulp_ctrl: int,
        inval: int,
        size: int,
        last: bool,
        out: list[Finding],
    ) -> None:
        """The stateful checks of an untagged segment (DDP-02, DDP-04..06, RDMAP-10)."""
        chk = self.chk
        chk.findings = out
        if self.terminated:
            out.append(Finding("RDMAP-10", "FPDU sent after this side's Terminate"))
        self.messages.untagged(qn, msn, mo, ulp_ctrl, inval, size, last, chk)


def _plausible_ulpdu(u: memoryview | bytes, rfc7306: bool) -> bool:
    """Cheap header sanity for chain search: DV, RV, reserved bits, opcode, T, QN, length."""
    n = len(u)
    if n < _MIN_ULPDU:
        return False
    c = u[0]
    r = u[1]
    if c & DDP_DV_MASK != 1 or c & DDP_RSVD_MASK or r & RDMAP_RV_MASK != (RDMAP_VERSION << 6):
        return False
    if r & RDMAP_RSVD_MASK:
        return False
    op = r & RDMAP_OPCODE_MASK
    if op > (Opcode.ATOMIC_RESPONSE if rfc7306 else Opcode.TERMINATE):
        return False
    tagged = bool(c & DDP_TAGGED)
    if tagged != (op in TAGGED_OPCODES):
        return False
    if tagged:
        return True
    if n < DDP_UNTAGGED_HDR_LEN:
        return False
    qn = _U32.unpack_from(u, 6)[0]
    return OPCODE_QN.get(op) == qn
