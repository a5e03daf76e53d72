"""Faults of the wire engine a broken DUT has: startup, FPDU framing, DDP and RDMAP checks.

Each function patches one engine of the DUT (:class:`~stack.wire.connection.IwarpConnection`)
at the points :mod:`stack.conform.faults` documents: its public methods, its settings, its
established stream's ``receive_ulpdu``, ``sequencer`` and states, and the MPA engine's
deframer and hold buffer.  :data:`stack.conform.faults.FAULTS` names them and the cases each
turns.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from stack.constants import (
    ATOMIC_REQUEST_HDR_LEN,
    DDP_DV_MASK,
    DDP_LAST,
    DDP_RSVD_MASK,
    DDP_TAGGED,
    DDP_TAGGED_HDR_LEN,
    DDP_UNTAGGED_HDR_LEN,
    DDP_VERSION,
    IMMEDIATE_DATA_LEN,
    MPA_FRAME_HEADER_LEN,
    MPA_MARKER_INTERVAL,
    OPCODE_QN,
    RDMAP_OPCODE_MASK,
    RDMAP_RSVD_MASK,
    RDMAP_RV_MASK,
    READ_REQUEST_HDR_LEN,
    TAGGED_OPCODES,
    TERM_LLP_INVALID_STARTUP,
    MpaFlag,
    Opcode,
    RtrType,
    TermCode,
)
from stack.errors import MpaError, ProtocolError
from stack.wire.checker import Checker
from stack.wire.connection import ConnectionEvent, IwarpConnection
from stack.wire.ddp import version_error
from stack.wire.events import (
    Established,
    RdmapMessage,
    RdmaWrite,
    ReadRequest,
    ReadResponse,
    RevPolicy,
    Role,
    Send,
    Terminate,
    TerminateReceived,
)
from stack.wire.mpa import MpaState
from stack.wire.sequence import MessageSequencer
from stack.wire.stream import RecvState, SendState

__all__ = [
    "after_established",
    "cause_swapped",
    "crc_unchecked",
    "crc_wrong_terminate",
    "data_after_terminate",
    "dv_one",
    "known_opcode",
    "marker_bits_checked",
    "markers_ignored",
    "msn_unchecked",
    "no_short_ulpdus",
    "not_rfc7306",
    "oversize_accepted",
    "qn_of_opcode",
    "read_header_missing",
    "read_response_misplaced",
    "reply_trailing_fpdu",
    "reserved_checked",
    "rv_one",
    "single_segment_unchecked",
    "stream_input",
    "terminate_headers",
    "terminate_ignored",
    "unknown_rev_accepted",
    "whole_segments",
    "wrong_rtr",
]

# -- startup and framing -------------------------------------------------------------------


def crc_wrong_terminate(engine: IwarpConnection) -> None:
    send_terminate = engine.send_terminate

    def wrong(error: ProtocolError, offending_ulpdu: memoryview | None) -> None:
        if error.rule == "MPA-12":  # a CRC error reported as an invalid startup frame
            error = MpaError(error.rule, error.detail, TERM_LLP_INVALID_STARTUP)
        send_terminate(error, offending_ulpdu)

    engine.send_terminate = wrong  # type: ignore[method-assign]


def after_established(engine: IwarpConnection, action: Callable[[], None]) -> None:
    """Run ``action`` once, when the engine reports Full Operation."""
    next_event = engine.next_event
    done = False

    def hooked() -> ConnectionEvent:
        nonlocal done
        event = next_event()
        if isinstance(event, Established) and not done:
            done = True
            action()
        return event

    engine.next_event = hooked  # type: ignore[method-assign]


def crc_unchecked(engine: IwarpConnection) -> None:
    def off() -> None:
        deframer = engine.mpa._deframer  # noqa: SLF001 - documented fault point
        if deframer is not None:
            deframer.crc = False

    after_established(engine, off)


def reply_trailing_fpdu(engine: IwarpConnection) -> None:
    def early() -> None:
        if engine.role is Role.RESPONDER:
            engine.mpa._held = None  # noqa: SLF001 - documented fault point (MPA-25 hold)
            engine.send_message(RdmaWrite(1, 0, b""))

    after_established(engine, early)


def markers_ignored(engine: IwarpConnection) -> None:
    """Reads the peer's M bit as 0: no markers towards a peer that asked for them."""
    receive_data = engine.receive_data
    seen = 0

    def hooked(data: Any) -> None:
        nonlocal seen
        flags_at = MPA_FRAME_HEADER_LEN - 4  # frame byte 16: the flags
        waiting = engine.mpa.state in (MpaState.AWAIT_REQUEST, MpaState.AWAIT_REPLY)
        if waiting and seen <= flags_at < seen + len(data):
            buf = bytearray(data)
            buf[flags_at - seen] &= ~MpaFlag.MARKERS & 0xFF
            data = bytes(buf)
        seen += len(data)
        receive_data(data)

    engine.receive_data = hooked  # type: ignore[method-assign]


def unknown_rev_accepted(engine: IwarpConnection) -> None:
    engine.mpa.settings = replace(engine.mpa.settings, rev_policy=RevPolicy.ACCEPT)


def terminate_headers(engine: IwarpConnection) -> None:
    """LLP Terminates copy a DDP header (RFC 5040 Fig. 10 says none: RDMAP-12, SHOULD)."""
    send_message = engine.send_message

    def hooked(message: RdmapMessage) -> None:
        if isinstance(message, Terminate) and message.layer == 2 and not message.d:
            header = bytes([0x41, 0x43]) + bytes(16)  # an untagged Send's DDP header
            message = replace(message, m=True, d=True, ddp_seg_len=len(header), ddp_header=header)
        send_message(message)

    engine.send_message = hooked  # type: ignore[method-assign]


def wrong_rtr(engine: IwarpConnection) -> None:
    """A peer-to-peer initiator that always sends a Send RTR, whatever was negotiated."""
    send_message = engine.send_message
    first = True

    def hooked(message: RdmapMessage) -> None:
        nonlocal first
        neg = engine.negotiated
        if first and neg is not None and neg.p2p and neg.rtr and neg.rtr is not RtrType.SEND:
            first = False
            if isinstance(message, RdmaWrite | ReadRequest) and engine.role is Role.INITIATOR:
                message = Send(b"")
        send_message(message)

    engine.send_message = hooked  # type: ignore[method-assign]


# -- data-phase faults: the stream's checks --------------------------------------------


def stream_input(fix: Callable[[bytearray], bool]) -> Callable[[IwarpConnection], None]:
    """Each ULPDU the established stream gets goes through ``fix`` first (it edits the
    copy; False drops the ULPDU unseen)."""

    def apply(engine: IwarpConnection) -> None:
        def action() -> None:
            stream = engine.stream
            assert stream is not None
            receive = stream.receive_ulpdu

            def hooked(ulpdu: Any) -> Any:
                buf = bytearray(ulpdu)
                if not fix(buf):
                    return []
                return receive(buf)

            stream.receive_ulpdu = hooked  # type: ignore[method-assign]

        after_established(engine, action)

    return apply


def dv_one(buf: bytearray) -> bool:
    if buf:
        buf[0] = (buf[0] & ~DDP_DV_MASK & 0xFF) | DDP_VERSION
    return True


def rv_one(buf: bytearray) -> bool:
    if len(buf) >= 2:
        buf[1] = (buf[1] & ~RDMAP_RV_MASK & 0xFF) | 0x40
    return True


def qn_of_opcode(buf: bytearray) -> bool:
    if len(buf) >= DDP_UNTAGGED_HDR_LEN and not buf[0] & DDP_TAGGED:
        qn = OPCODE_QN.get(buf[1] & RDMAP_OPCODE_MASK, 0)
        buf[6:10] = int(qn).to_bytes(4, "big")
    return True


_TAGGED = frozenset(int(op) for op in TAGGED_OPCODES)


def known_opcode(buf: bytearray) -> bool:
    """Drop what has an unassigned opcode or one its T bit disagrees with."""
    if len(buf) < 2:
        return True
    op = buf[1] & RDMAP_OPCODE_MASK
    if op >= 0xC:
        return False
    return bool(buf[0] & DDP_TAGGED) == (op in _TAGGED)


def no_short_ulpdus(buf: bytearray) -> bool:
    """A ULPDU too short for its DDP header is dropped instead of ending the stream."""
    return len(buf) >= DDP_TAGGED_HDR_LEN


def reserved_checked(buf: bytearray) -> bool:
    """Reserved DDP or RDMAP control bits end the stream, reported as a wrong DDP version
    (DDP-03 and RDMAP-02 say: not checked)."""
    if len(buf) >= 2 and (buf[0] & DDP_RSVD_MASK or buf[1] & RDMAP_RSVD_MASK):
        error = version_error(buf[0])
        error.ulpdu = memoryview(bytes(buf))
        raise error
    return True


_SINGLE = {
    int(Opcode.RDMA_READ_REQUEST): READ_REQUEST_HDR_LEN,
    int(Opcode.IMMEDIATE_DATA): IMMEDIATE_DATA_LEN,
    int(Opcode.IMMEDIATE_DATA_SE): IMMEDIATE_DATA_LEN,
    int(Opcode.ATOMIC_REQUEST): ATOMIC_REQUEST_HDR_LEN,
}


def single_segment_unchecked(buf: bytearray) -> bool:
    """Read Requests, Immediate Data and Atomic Requests taken with any L and MO, and
    dropped when their RDMAP header has the wrong length (RFC 5040 §4.4, RFC 7306 broken)."""
    if len(buf) < DDP_UNTAGGED_HDR_LEN or buf[0] & DDP_TAGGED:
        return True
    size = _SINGLE.get(buf[1] & RDMAP_OPCODE_MASK)
    if size is None:
        return True
    if len(buf) - DDP_UNTAGGED_HDR_LEN != size:
        return False
    buf[0] |= DDP_LAST
    buf[14:18] = bytes(4)
    return True


class _LenientSequencer(MessageSequencer):
    """MSN, MO and Last-flag violations noted, never raised."""

    __slots__ = ()

    def untagged(
        self,
        qn: int,
        msn: int,
        mo: int,
        ulp_ctrl: int,
        inval: int,
        payload_len: int,
        last: bool,
        chk: Checker,
    ) -> None:
        super().untagged(qn, msn, mo, ulp_ctrl, inval, payload_len, last, Checker(strict=False))


def msn_unchecked(engine: IwarpConnection) -> None:
    def action() -> None:
        assert engine.stream is not None
        engine.stream.sequencer = _LenientSequencer()

    after_established(engine, action)


def terminate_ignored(engine: IwarpConnection) -> None:
    """A received Terminate is dropped and the stream goes on as if none had come."""
    next_event = engine.next_event

    def hooked() -> ConnectionEvent:
        while True:
            event = next_event()
            if not isinstance(event, TerminateReceived):
                return event
            stream = engine.stream
            assert stream is not None
            stream.recv_state = RecvState.OPEN
            stream.terminate_received = None

    engine.next_event = hooked  # type: ignore[method-assign]


def cause_swapped(pairs: dict[TermCode, TermCode]) -> Callable[[IwarpConnection], None]:
    """Terminates of the causes in ``pairs`` go out with the paired cause instead."""

    def apply(engine: IwarpConnection) -> None:
        send_terminate = engine.send_terminate

        def wrong(error: ProtocolError, offending_ulpdu: memoryview | None) -> None:
            if error.term in pairs:
                changed = type(error)(error.rule, error.detail, pairs[error.term])
                changed.ulpdu = error.ulpdu
                error = changed
            send_terminate(error, offending_ulpdu)

        engine.send_terminate = wrong  # type: ignore[method-assign]

    return apply


def data_after_terminate(engine: IwarpConnection) -> None:
    """After a Terminate for an MSN error (DDP-05), one more FPDU (RDMAP-10 broken)."""
    send_terminate = engine.send_terminate

    def more(error: ProtocolError, offending_ulpdu: memoryview | None) -> None:
        send_terminate(error, offending_ulpdu)
        if error.rule == "DDP-05" and engine.stream is not None:
            engine.stream.send_state = SendState.OPEN
            engine.send_message(RdmaWrite(1, 0, b""))

    engine.send_terminate = more  # type: ignore[method-assign]


def read_header_missing(engine: IwarpConnection) -> None:
    """Terminates about a Read Request leave out its copied RDMA header (R)."""
    send_message = engine.send_message

    def hooked(message: RdmapMessage) -> None:
        if isinstance(message, Terminate) and message.r:
            message = replace(message, r=False, rdma_header=b"")
        send_message(message)

    engine.send_message = hooked  # type: ignore[method-assign]


def not_rfc7306(engine: IwarpConnection) -> None:
    engine.rfc7306 = False


def oversize_accepted(engine: IwarpConnection) -> None:
    """FPDUs up to ULPDU_Length 65535 are taken (MPA-02 broken at the receiver)."""

    def action() -> None:
        deframer = engine.mpa._deframer  # noqa: SLF001 - documented fault point
        if deframer is not None:
            deframer.max_ulpdu = 0xFFFF

    after_established(engine, action)


def marker_bits_checked(engine: IwarpConnection) -> None:
    """Markers with their RESERVED half or FPDUPTR's low two bits set are taken as
    mismatches (MPA-06 broken): such a marker's FPDUPTR is spoilt before deframing."""
    receive_data = engine.receive_data
    offset: list[int] = [0]

    def hooked(data: Any) -> None:
        neg = engine.negotiated
        if engine.stream is None or neg is None or not neg.markers_rx:
            receive_data(data)
            return
        buf = bytearray(data)
        for at in range(-offset[0] % MPA_MARKER_INTERVAL, len(buf) - 3, MPA_MARKER_INTERVAL):
            if buf[at] or buf[at + 1] or buf[at + 3] & 3:
                buf[at + 2] ^= 0x80
        offset[0] += len(buf)
        receive_data(bytes(buf))

    engine.receive_data = hooked  # type: ignore[method-assign]


def read_response_misplaced(engine: IwarpConnection) -> None:
    """Read Responses go 8 octets past the Sink TO the Read named (RDMAP-04 broken)."""
    send_message = engine.send_message

    def hooked(message: RdmapMessage) -> None:
        if isinstance(message, ReadResponse) and len(message.data):
            message = replace(message, to=message.to + 8)
        send_message(message)

    engine.send_message = hooked  # type: ignore[method-assign]


def whole_segments(engine: IwarpConnection) -> None:
    """Full Operation bytes that arrive in a piece of fewer than 12 octets are dropped (a
    receiver that expects whole FPDUs per TCP segment, MPA-15 broken)."""
    receive_data = engine.receive_data

    def hooked(data: Any) -> None:
        if engine.stream is not None and 0 < len(data) < 12:
            return
        receive_data(data)

    engine.receive_data = hooked  # type: ignore[method-assign]
