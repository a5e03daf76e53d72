"""Deliberately broken DUTs: named faults injected into this project's own stack.

A conformance case is only worth something if it can fail.  Each :class:`Fault` breaks one
behaviour of our stack the way a faulty implementation would, and names the cases that
must then FAIL (or WARN, or SKIP); the tests run the stack as the DUT in-process with the
fault applied and check that exactly those cases of the fault's scope change while the
rest keep their verdicts.

Where faults are applied (the documented points; nothing else is touched):

* :data:`ENGINE_FACTORY` -- ``stack.transport.cm.IwarpConnection``, the engine class the
  connection manager creates for every connection it listens for or opens.  The runner
  never uses the connection manager (its peer is :mod:`stack.conform.peer`, its model DUT
  :mod:`stack.conform.oracle` builds engines directly), so patching that one name breaks
  the DUT only, even with runner and DUT in one process.
* :data:`CONNECTION_FACTORY` -- ``stack.transport.cm.RdmaConnection``, the driver the
  connection manager builds around each engine and the application's queue pair: faults
  of the RNIC's checks patch that QP (its ``handle_event``, ``fatal``, ``ird`` and the
  ``_snapshot_reads`` step of RFC 5040 §5.5 ordering).
* on each engine the DUT creates (:class:`~stack.wire.connection.IwarpConnection`): its
  public methods ``receive_data``, ``next_event``, ``send_message`` and ``send_terminate``,
  its ``settings``, ``rfc7306`` and those of its MPA engine; once established, its
  stream's ``receive_ulpdu``, ``sequencer``, ``recv_state`` and ``send_state``; and two
  attributes of :class:`~stack.wire.mpa.MpaConnection` the wire core has no public switch
  for: the FPDU deframer ``_deframer`` (its ``crc`` flag) and the responder's hold buffer
  ``_held`` (MPA-25).
* ``stack.rnic.memory.StagTable.register`` (STag allocation, SEC-08); the model DUT's
  table overrides it, so only the DUT is affected.

:func:`injected` applies faults (and optional settings changes, e.g. short startup timers)
for the duration of a ``with`` block.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any

from stack.conform.model import case_id
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
    TERM_DDP_CATASTROPHIC,
    TERM_DDP_T_BASE_BOUNDS,
    TERM_DDP_T_INVALID_STAG,
    TERM_DDP_T_STAG_NOT_ASSOCIATED,
    TERM_DDP_T_TO_WRAP,
    TERM_DDP_U_NO_BUFFER,
    TERM_DDP_U_TOO_LONG,
    TERM_LLP_INVALID_STARTUP,
    TERM_RDMAP_BASE_BOUNDS,
    TERM_RDMAP_CATASTROPHIC_STREAM,
    TERM_RDMAP_INVALID_STAG,
    TERM_RDMAP_OP_UNSPECIFIED,
    TERM_RDMAP_STAG_NOT_ASSOCIATED,
    TERM_RDMAP_TO_WRAP,
    AtomicOpcode,
    MpaFlag,
    Opcode,
    RtrType,
    TermCode,
)
from stack.errors import DdpError, MpaError, ProtocolError, RdmapError
from stack.rnic.memory import (
    DDP_TAGGED_CODES,
    RDMAP_REMOTE_CODES,
    Access,
    MemoryRegion,
    StagTable,
    check_remote_access,
)
from stack.rnic.qp import QueuePair
from stack.wire.checker import Checker
from stack.wire.connection import ConnectionEvent, IwarpConnection
from stack.wire.events import (
    AtomicRequestReceived,
    Established,
    RdmapMessage,
    RdmaWrite,
    ReadRequest,
    ReadRequestReceived,
    ReadResponse,
    ReadResponseSegment,
    RevPolicy,
    Role,
    Send,
    SendSegment,
    Terminate,
    TerminateReceived,
    WriteSegment,
)
from stack.wire.mpa import MpaState
from stack.wire.sequence import MessageSequencer
from stack.wire.stream import RecvState, SendState

__all__ = ["CONNECTION_FACTORY", "ENGINE_FACTORY", "FAULTS", "Fault", "injected"]

ENGINE_FACTORY = ("stack.transport.cm", "IwarpConnection")
"""(module, name) of the engine class the connection manager instantiates."""
CONNECTION_FACTORY = ("stack.transport.cm", "RdmaConnection")
"""(module, name) of the driver class the connection manager wraps engine and QP in."""

QpFault = Callable[[QueuePair, IwarpConnection, dict[str, Any]], None]
"""Patches one DUT queue pair (with its engine; ``shared`` lives as long as the ``with``)."""


@dataclass(frozen=True)
class Fault:
    """One way to break the stack.  Fields: name, description, fails (the case IDs that must
    not pass with it, with the status they get: ``{"MPA-12": "FAIL"}``), apply (patches one
    new engine of the DUT), apply_qp (patches one new queue pair of the DUT), app (the
    ``--app`` whose DUT the tests break: rping, kbtp or bench), scope (the cases the tests
    run with it: its ``fails`` and these selection patterns), patches ((object, attribute,
    replacement) set for the block: class-level fault points)."""

    name: str
    description: str
    fails: dict[str, str]
    apply: Callable[[IwarpConnection], None] | None = None
    apply_qp: QpFault | None = None
    app: str = "rping"
    scope: tuple[str, ...] = ()
    patches: tuple[tuple[Any, str, Any], ...] = field(default=())


# -- the faults ---------------------------------------------------------------------------


def _crc_wrong_terminate(engine: IwarpConnection) -> None:
    send_terminate = engine.send_terminate

    def wrong(error: ProtocolError, offending_ulpdu: memoryview | None) -> None:
        if error.rule == "MPA-12":  # a CRC error reported as an invalid startup frame
            error = MpaError(error.rule, error.detail, TERM_LLP_INVALID_STARTUP)
        send_terminate(error, offending_ulpdu)

    engine.send_terminate = wrong  # type: ignore[method-assign]


def _after_established(engine: IwarpConnection, action: Callable[[], None]) -> None:
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


def _crc_unchecked(engine: IwarpConnection) -> None:
    def off() -> None:
        deframer = engine.mpa._deframer  # noqa: SLF001 - documented fault point
        if deframer is not None:
            deframer.crc = False

    _after_established(engine, off)


def _reply_trailing_fpdu(engine: IwarpConnection) -> None:
    def early() -> None:
        if engine.role is Role.RESPONDER:
            engine.mpa._held = None  # noqa: SLF001 - documented fault point (MPA-25 hold)
            engine.send_message(RdmaWrite(1, 0, b""))

    _after_established(engine, early)


def _markers_ignored(engine: IwarpConnection) -> None:
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


def _unknown_rev_accepted(engine: IwarpConnection) -> None:
    engine.mpa.settings = replace(engine.mpa.settings, rev_policy=RevPolicy.ACCEPT)


def _terminate_headers(engine: IwarpConnection) -> None:
    """LLP Terminates copy a DDP header (RFC 5040 Fig. 10 says none: RDMAP-12, SHOULD)."""
    send_message = engine.send_message

    def hooked(message: RdmapMessage) -> None:
        if isinstance(message, Terminate) and message.layer == 2 and not message.d:
            header = bytes([0x41, 0x43]) + bytes(16)  # an untagged Send's DDP header
            message = replace(message, m=True, d=True, ddp_seg_len=len(header), ddp_header=header)
        send_message(message)

    engine.send_message = hooked  # type: ignore[method-assign]


def _wrong_rtr(engine: IwarpConnection) -> None:
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


def _stream_input(fix: Callable[[bytearray], bool]) -> Callable[[IwarpConnection], None]:
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

        _after_established(engine, action)

    return apply


def _dv_one(buf: bytearray) -> bool:
    if buf:
        buf[0] = (buf[0] & ~DDP_DV_MASK & 0xFF) | DDP_VERSION
    return True


def _rv_one(buf: bytearray) -> bool:
    if len(buf) >= 2:
        buf[1] = (buf[1] & ~RDMAP_RV_MASK & 0xFF) | 0x40
    return True


def _qn_of_opcode(buf: bytearray) -> bool:
    if len(buf) >= DDP_UNTAGGED_HDR_LEN and not buf[0] & DDP_TAGGED:
        qn = OPCODE_QN.get(buf[1] & RDMAP_OPCODE_MASK, 0)
        buf[6:10] = int(qn).to_bytes(4, "big")
    return True


_TAGGED = frozenset(int(op) for op in TAGGED_OPCODES)


def _known_opcode(buf: bytearray) -> bool:
    """Drop what has an unassigned opcode or one its T bit disagrees with."""
    if len(buf) < 2:
        return True
    op = buf[1] & RDMAP_OPCODE_MASK
    if op >= 0xC:
        return False
    return bool(buf[0] & DDP_TAGGED) == (op in _TAGGED)


def _no_short_ulpdus(buf: bytearray) -> bool:
    """A ULPDU too short for its DDP header is dropped instead of ending the stream."""
    return len(buf) >= DDP_TAGGED_HDR_LEN


def _reserved_checked(buf: bytearray) -> bool:
    """Reserved DDP or RDMAP control bits end the stream (DDP-03 and RDMAP-02 say: not
    checked)."""
    if len(buf) >= 2 and (buf[0] & DDP_RSVD_MASK or buf[1] & RDMAP_RSVD_MASK):
        error = DdpError("DDP-03", "reserved control bits set", TERM_DDP_CATASTROPHIC)
        error.ulpdu = memoryview(bytes(buf))
        raise error
    return True


_SINGLE = {int(Opcode.RDMA_READ_REQUEST): READ_REQUEST_HDR_LEN,
           int(Opcode.IMMEDIATE_DATA): IMMEDIATE_DATA_LEN,
           int(Opcode.IMMEDIATE_DATA_SE): IMMEDIATE_DATA_LEN,
           int(Opcode.ATOMIC_REQUEST): ATOMIC_REQUEST_HDR_LEN}  # fmt: skip


def _single_segment_unchecked(buf: bytearray) -> bool:
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

    def untagged(self, qn: int, msn: int, mo: int, ulp_ctrl: int, inval: int,
                 payload_len: int, last: bool, chk: Checker) -> None:  # fmt: skip
        super().untagged(qn, msn, mo, ulp_ctrl, inval, payload_len, last, Checker(strict=False))


def _msn_unchecked(engine: IwarpConnection) -> None:
    def action() -> None:
        assert engine.stream is not None
        engine.stream.sequencer = _LenientSequencer()

    _after_established(engine, action)


def _terminate_ignored(engine: IwarpConnection) -> None:
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


def _cause_swapped(pairs: dict[TermCode, TermCode]) -> Callable[[IwarpConnection], None]:
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


def _data_after_terminate(engine: IwarpConnection) -> None:
    """After a Terminate for an MSN error (DDP-05), one more FPDU (RDMAP-10 broken)."""
    send_terminate = engine.send_terminate

    def more(error: ProtocolError, offending_ulpdu: memoryview | None) -> None:
        send_terminate(error, offending_ulpdu)
        if error.rule == "DDP-05" and engine.stream is not None:
            engine.stream.send_state = SendState.OPEN
            engine.send_message(RdmaWrite(1, 0, b""))

    engine.send_terminate = more  # type: ignore[method-assign]


def _read_header_missing(engine: IwarpConnection) -> None:
    """Terminates about a Read Request leave out its copied RDMA header (R)."""
    send_message = engine.send_message

    def hooked(message: RdmapMessage) -> None:
        if isinstance(message, Terminate) and message.r:
            message = replace(message, r=False, rdma_header=b"")
        send_message(message)

    engine.send_message = hooked  # type: ignore[method-assign]


def _not_rfc7306(engine: IwarpConnection) -> None:
    engine.rfc7306 = False


def _oversize_accepted(engine: IwarpConnection) -> None:
    """FPDUs up to ULPDU_Length 65535 are taken (MPA-02 broken at the receiver)."""

    def action() -> None:
        deframer = engine.mpa._deframer  # noqa: SLF001 - documented fault point
        if deframer is not None:
            deframer.max_ulpdu = 0xFFFF

    _after_established(engine, action)


def _marker_bits_checked(engine: IwarpConnection) -> None:
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


def _read_response_misplaced(engine: IwarpConnection) -> None:
    """Read Responses go 8 octets past the Sink TO the Read named (RDMAP-04 broken)."""
    send_message = engine.send_message

    def hooked(message: RdmapMessage) -> None:
        if isinstance(message, ReadResponse) and len(message.data):
            message = replace(message, to=message.to + 8)
        send_message(message)

    engine.send_message = hooked  # type: ignore[method-assign]


def _whole_segments(engine: IwarpConnection) -> None:
    """Full Operation bytes that arrive in a piece of fewer than 12 octets are dropped (a
    receiver that expects whole FPDUs per TCP segment, MPA-15 broken)."""
    receive_data = engine.receive_data

    def hooked(data: Any) -> None:
        if engine.stream is not None and 0 < len(data) < 12:
            return
        receive_data(data)

    engine.receive_data = hooked  # type: ignore[method-assign]


# -- data-phase faults: the RNIC's checks (the queue pair) ------------------------------


def _handler(qp: QueuePair, around: Callable[[Callable[[Any], None], Any], None]) -> None:
    handle = qp.handle_event

    def hooked(event: Any) -> None:
        around(handle, event)

    qp.handle_event = hooked  # type: ignore[method-assign]


def _swallow(*causes: TermCode) -> QpFault:
    """Inbound errors with these causes are dropped: nothing placed, nothing reported."""

    def apply(qp: QueuePair, engine: IwarpConnection, shared: dict[str, Any]) -> None:
        def around(handle: Callable[[Any], None], event: Any) -> None:
            try:
                handle(event)
            except ProtocolError as exc:
                if exc.term not in causes:
                    raise

        _handler(qp, around)

    return apply


def _stag_of(event: Any) -> int | None:
    if isinstance(event, WriteSegment):
        return event.stag
    if isinstance(event, ReadRequestReceived | AtomicRequestReceived):
        req = event.request
        return req.src_stag if isinstance(req, ReadRequest) else req.stag
    return None


def _pd_ignored(qp: QueuePair, engine: IwarpConnection, shared: dict[str, Any]) -> None:
    """An STag of another protection domain is used as if it were this stream's."""

    def around(handle: Callable[[Any], None], event: Any) -> None:
        try:
            handle(event)
        except ProtocolError as exc:
            stag = _stag_of(event)
            mr = qp.table.lookup(stag) if stag is not None else None
            if exc.rule != "SEC-01" or mr is None:
                raise
            own, qp.pd = qp.pd, mr.pd
            try:
                handle(event)
            finally:
                qp.pd = own

    _handler(qp, around)


def _rights_ignored(qp: QueuePair, engine: IwarpConnection, shared: dict[str, Any]) -> None:
    """Remote access rights are not checked."""

    def around(handle: Callable[[Any], None], event: Any) -> None:
        try:
            handle(event)
        except ProtocolError as exc:
            stag = _stag_of(event)
            mr: MemoryRegion | None = qp.table.lookup(stag) if stag is not None else None
            if exc.rule != "SEC-12" or mr is None:
                raise
            saved = mr.access_bits
            mr.access_bits = int(Access.REMOTE_READ | Access.REMOTE_WRITE | Access.REMOTE_ATOMIC)
            try:
                handle(event)
            finally:
                mr.access_bits = saved

    _handler(qp, around)


def _ird_unenforced(qp: QueuePair, engine: IwarpConnection, shared: dict[str, Any]) -> None:
    qp.ird = 1 << 14


def _invalidate_ignored(qp: QueuePair, engine: IwarpConnection, shared: dict[str, Any]) -> None:
    """Send with Invalidate taken as a plain Send: nothing invalidated, nothing checked."""

    def around(handle: Callable[[Any], None], event: Any) -> None:
        if isinstance(event, SendSegment) and event.invalidate_stag is not None:
            event = replace(event, invalidate_stag=None)
        handle(event)

    _handler(qp, around)


def _read_responses_unchecked(
    qp: QueuePair, engine: IwarpConnection, shared: dict[str, Any]
) -> None:
    """Read Responses that match no outstanding Read (RDMAP-04) are dropped silently."""

    def around(handle: Callable[[Any], None], event: Any) -> None:
        try:
            handle(event)
        except ProtocolError as exc:
            if not (isinstance(event, ReadResponseSegment) and exc.rule == "RDMAP-04"):
                raise

    _handler(qp, around)


def _zero_reads_validated(qp: QueuePair, engine: IwarpConnection, shared: dict[str, Any]) -> None:
    """A zero-length Read's source is validated as if it were one octet (RDMAP-07 broken)."""

    def around(handle: Callable[[Any], None], event: Any) -> None:
        if isinstance(event, ReadRequestReceived) and event.request.size == 0:
            req = event.request
            check_remote_access(qp.table, qp.pd, req.src_stag, req.src_to, 1,
                                int(Access.REMOTE_READ), RDMAP_REMOTE_CODES)  # fmt: skip
        handle(event)

    _handler(qp, around)


def _atomic_edit(edit: Callable[[Any], Any]) -> QpFault:
    def apply(qp: QueuePair, engine: IwarpConnection, shared: dict[str, Any]) -> None:
        def around(handle: Callable[[Any], None], event: Any) -> None:
            if isinstance(event, AtomicRequestReceived):
                event = replace(event, request=edit(event.request))
            handle(event)

        _handler(qp, around)

    return apply


def _align(req: Any) -> Any:
    return replace(req, to=req.to & ~7)


def _no_add_mask(req: Any) -> Any:
    if req.atomic_opcode == AtomicOpcode.FETCH_ADD:
        return replace(req, add_swap_mask=0)
    return req


def _always_swap(req: Any) -> Any:
    if req.atomic_opcode == AtomicOpcode.CMP_SWAP:
        return replace(req, compare_mask=0)
    return req


def _atomics_dropped(qp: QueuePair, engine: IwarpConnection, shared: dict[str, Any]) -> None:
    """Atomic Requests are taken and never run or answered."""

    def around(handle: Callable[[Any], None], event: Any) -> None:
        if not isinstance(event, AtomicRequestReceived):
            handle(event)

    _handler(qp, around)


def _zero_writes_validated(qp: QueuePair, engine: IwarpConnection, shared: dict[str, Any]) -> None:
    """A zero-length Write's STag is validated as if it were one octet (DDP-07 broken)."""

    def around(handle: Callable[[Any], None], event: Any) -> None:
        if isinstance(event, WriteSegment) and not len(event.data):
            check_remote_access(qp.table, qp.pd, event.stag, event.to, 1,
                                int(Access.REMOTE_WRITE), DDP_TAGGED_CODES)  # fmt: skip
        handle(event)

    _handler(qp, around)


def _invalidate_field_checked(
    qp: QueuePair, engine: IwarpConnection, shared: dict[str, Any]
) -> None:
    """The Invalidate STag field of every untagged message is read (RDMAP-03 broken): a Send
    invalidates it, anything else with it set ends the stream."""

    def around(handle: Callable[[Any], None], event: Any) -> None:
        raw = event.ulpdu
        field_value = (
            int.from_bytes(bytes(raw[2:6]), "big")
            if raw is not None and len(raw) >= 6 and not raw[0] & DDP_TAGGED else 0
        )  # fmt: skip
        if field_value and isinstance(event, SendSegment) and event.invalidate_stag is None:
            event = replace(event, invalidate_stag=field_value)
        elif field_value and isinstance(event, ReadRequestReceived):
            raise RdmapError("RDMAP-03", "Invalidate STag field set", TERM_RDMAP_OP_UNSPECIFIED)
        handle(event)

    _handler(qp, around)


def _partial_delivery(qp: QueuePair, engine: IwarpConnection, shared: dict[str, Any]) -> None:
    """Each Send segment completes its receive (messages delivered before their Last
    segment, DDP-08 broken); Read Response segments without L are dropped."""

    def around(handle: Callable[[Any], None], event: Any) -> None:
        if isinstance(event, SendSegment) and not event.last:
            event = replace(event, last=True)
        elif isinstance(event, ReadResponseSegment) and not event.last:
            return
        handle(event)

    _handler(qp, around)


def _last_octet_refused(qp: QueuePair, engine: IwarpConnection, shared: dict[str, Any]) -> None:
    """Accesses that reach the last octet of a region are refused (SEC-04 off by one)."""

    def around(handle: Callable[[Any], None], event: Any) -> None:
        if isinstance(event, ReadRequestReceived) and event.request.size:
            req = event.request
            mr = qp.table.lookup(req.src_stag)
            if mr is not None and req.src_to + req.size == mr.base + mr.length:
                raise RdmapError("SEC-04", "last octet", TERM_RDMAP_BASE_BOUNDS)
        handle(event)

    _handler(qp, around)


def _reads_not_snapshotted(
    qp: QueuePair, engine: IwarpConnection, shared: dict[str, Any]
) -> None:
    """Queued Read Responses read memory when sent, after later Writes (RFC 5040 §5.5)."""
    qp._snapshot_reads = lambda: None  # type: ignore[method-assign]  # noqa: SLF001


def _writes_dropped(qp: QueuePair, engine: IwarpConnection, shared: dict[str, Any]) -> None:
    """Inbound RDMA Writes are accepted and never placed."""

    def around(handle: Callable[[Any], None], event: Any) -> None:
        if isinstance(event, WriteSegment) and len(event.data):
            return
        handle(event)

    _handler(qp, around)


def _streams_coupled(qp: QueuePair, engine: IwarpConnection, shared: dict[str, Any]) -> None:
    """When one connection fails or closes, every other connection of the DUT is ended
    with a Terminate (SEC-09 broken)."""
    qps: list[QueuePair] = shared.setdefault("qps", [])
    qps.append(qp)
    fatal = qp.fatal

    def hooked(error: ProtocolError | None, *, send_terminate: bool) -> None:
        first = qp.state.value != "error"
        fatal(error, send_terminate=send_terminate)
        if not first or shared.get("killing"):
            return
        shared["killing"] = True
        try:
            for other in qps:
                if other is not qp and other.state.value != "error":
                    err = RdmapError("SEC-09", "another stream failed", TERM_RDMAP_CATASTROPHIC_STREAM)
                    other.fatal(err, send_terminate=True)
                    if other.on_output is not None:
                        other.on_output()
        finally:
            shared["killing"] = False

    qp.fatal = hooked  # type: ignore[method-assign]


def _sequential_register(self: StagTable, mr: MemoryRegion) -> int:
    """STags handed out one index after the other, key 0 (SEC-08 broken)."""
    index = getattr(self, "_fault_next", 0x100)
    while index in self._in_use:  # noqa: SLF001 - documented fault point
        index += 1
    self._fault_next = index + 1  # type: ignore[attr-defined]
    self._in_use.add(index)  # noqa: SLF001
    stag = index << 8
    self._regions[stag] = mr  # noqa: SLF001
    return stag


def _c(*ids: str, status: str = "FAIL") -> dict[str, str]:
    return dict.fromkeys(ids, status)


_DEREG = (MemoryRegion, "dereg", lambda self: None)
_SEQUENTIAL = (StagTable, "register", _sequential_register)
_WRAP = {TERM_DDP_T_TO_WRAP: TERM_DDP_T_BASE_BOUNDS, TERM_RDMAP_TO_WRAP: TERM_RDMAP_BASE_BOUNDS}
_EXT_ALL = ("EXT-01", "EXT-02", "EXT-02.2", "EXT-02.3", "EXT-03", "EXT-04", "EXT-05",
            "EXT-06", "EXT-06.2", "EXT-06.3", "EXT-06.4", "EXT-08", "EXT-09", "EXT-09.2",
            "EXT-10", "EXT-11", "EXT-11.2", "EXT-11.3", "EXT-11.4")  # fmt: skip

FAULTS: dict[str, Fault] = {
    f.name: f
    for f in (
        # -- MPA startup and framing -------------------------------------------------------
        Fault(
            "crc-wrong-terminate",
            "a CRC error is reported with Terminate 2/0/0x04 instead of 2/0/0x02",
            _c("MPA-12", "MPA-12.2", "MPA-12.3", "MPA-12.4", "MPA-12.5", "MPA-12.6", "MPA-28",
               "MPA-12.7"),
            _crc_wrong_terminate,
            scope=("MPA",),
        ),  # fmt: skip
        Fault(
            "crc-unchecked",
            "received FPDUs are delivered without checking their CRC",
            _c("MPA-12", "MPA-12.2", "MPA-12.3", "MPA-12.4", "MPA-12.5", "MPA-12.6", "MPA-28",
               "MPA-12.7"),
            _crc_unchecked,
            scope=("MPA",),
        ),
        Fault(
            "reply-trailing-fpdu",
            "the MPA Reply is followed at once by an FPDU (a zero-length RDMA Write), before "
            "the initiator's first FPDU",
            {"MPA-25": "FAIL"},
            _reply_trailing_fpdu,
            scope=("MPA-17", "MPA-19"),
        ),
        Fault(
            "markers-ignored",
            "the peer's M bit is read as 0: no markers in FPDUs to a peer that asked for them",
            {"MPA-09": "FAIL", case_id("MPA-09", 2): "FAIL"},
            _markers_ignored,
            scope=("MPA-11",),
        ),
        Fault(
            "unknown-rev-accepted",
            "a Request with an undefined MPA revision is accepted instead of refused",
            _c("MPA-20.2", "MPA-20.3", "MPA-20.4"),
            _unknown_rev_accepted,
            scope=("MPA-20", "ERC-01"),
        ),
        Fault(
            "terminate-headers",
            "LLP (MPA) Terminates carry a copied DDP header (Fig. 10 of RFC 5040: none)",
            _c("MPA-12", "MPA-16", "MPA-02", "MPA-12.2", "MPA-12.3", "MPA-12.4", "MPA-12.5",
               "MPA-12.6", "MPA-28", "MPA-12.7", status="WARN"),
            _terminate_headers,
            scope=("MPA",),
        ),  # fmt: skip
        Fault(
            "wrong-rtr",
            "a peer-to-peer initiator sends a Send RTR whatever RTR kind was negotiated",
            {"ERC-09": "FAIL"},
            _wrong_rtr,
            app="rping-client-p2p",
            scope=("ERC-08", "MPA-19.3"),
        ),
        Fault(
            "oversize-accepted",
            "FPDUs up to ULPDU_Length 65535 are taken and Sends longer than their receive are "
            "cut silently",
            {**_c("MPA-02", "MPA-02.2"), **_c("RDMAP-08", status="WARN")},
            _oversize_accepted,
            _swallow(TERM_DDP_U_TOO_LONG),
            scope=("MPA-16", "RDMAP-08.2"),
        ),
        Fault(
            "segments-must-be-whole",
            "bytes arriving in a TCP segment of fewer than 12 octets are dropped (MPA-15: "
            "FPDUs are reassembled whatever the segmentation)",
            _c("MPA-15", "MPA-15.2", "MPA-15.3", "MPA-15.4", "MPA-15.6"),
            _whole_segments,
            scope=("MPA-15",),
        ),
        Fault(
            "marker-bits-checked",
            "markers with their RESERVED half or FPDUPTR's low two bits set are taken as "
            "mismatches",
            _c("MPA-06", "MPA-06.2"),
            _marker_bits_checked,
            app="rping-markers",
            scope=("MPA-08", "MPA-09"),
        ),
        # -- DDP ---------------------------------------------------------------------------
        Fault(
            "ddp-version-unchecked",
            "the DDP version is not checked (segments with DV != 1 are taken as DV 1)",
            _c("DDP-03.2", "DDP-03.3", "DDP-03.4", "DDP-03.5", "DDP-03.6", "DDP-03.8"),
            _stream_input(_dv_one),
            scope=("DDP-03",),
        ),
        Fault(
            "reserved-bits-checked",
            "reserved DDP or RDMAP control bits end the stream (they are not to be checked)",
            _c("DDP-03", "DDP-03.7", "RDMAP-02", "RDMAP-02.6"),
            _stream_input(_reserved_checked),
            scope=("DDP-03", "RDMAP-02"),
        ),
        Fault(
            "qn-unchecked",
            "an untagged segment's QN is not checked (each goes to its opcode's queue)",
            _c("DDP-10", "DDP-10.2", "RDMAP-01", "RDMAP-01.2", "RDMAP-01.3", "RDMAP-01.4",
               "EXT-02.2"),
            _stream_input(_qn_of_opcode),
            scope=("DDP-05", "EXT-02"),
        ),  # fmt: skip
        Fault(
            "msn-unchecked",
            "MSN, MO and the Last flag are not checked (RFC 5041 §4.3, §5.2)",
            _c("DDP-05", "DDP-05.2", "DDP-05.3", "DDP-05.4", "DDP-05.5", "DDP-05.6", "DDP-06.2",
               "DDP-06.3", "DDP-02", "DDP-04", "DDP-04.2"),
            _msn_unchecked,
            scope=("DDP-06", "DDP-02.2", "RDMAP-04"),
        ),  # fmt: skip
        Fault(
            "partial-delivery",
            "each Send segment completes its receive, before the message's Last segment; Read "
            "Response segments without L are dropped",
            _c("DDP-02.2", "DDP-06", "RDMAP-04.9"),
            apply_qp=_partial_delivery,
            scope=("DDP-05", "RDMAP-04"),
        ),  # fmt: skip
        Fault(
            "short-ulpdus-dropped",
            "ULPDUs shorter than a DDP header are dropped instead of ending the stream",
            _c("MPA-01", "DDP-01"),
            _stream_input(_no_short_ulpdus),
            scope=("DDP-03.2",),
        ),
        Fault(
            "zero-writes-validated",
            "a zero-length RDMA Write's STag is validated (DDP-07: it is not)",
            _c("DDP-07", "DDP-07.2", "DDP-03.7", "RDMAP-02.6", "MPA-12.5", "MPA-15.5"),
            apply_qp=_zero_writes_validated,
            scope=("DDP-03", "RDMAP-02", "MPA-12", "MPA-15"),
        ),
        Fault(
            "terminate-then-data",
            "after a Terminate for an MSN error the DUT sends one more FPDU (RDMAP-10)",
            _c("DDP-05", "DDP-05.2", "DDP-05.3", "DDP-05.4", "DDP-05.5", "DDP-05.6"),
            _data_after_terminate,
            scope=("DDP-06",),
        ),
        # -- tagged placement and the RNIC's checks -----------------------------------------
        Fault(
            "stag-unchecked",
            "accesses with an invalid STag (or one a Read Response does not match) are "
            "dropped silently",
            _c("DDP-10.3", "RDMAP-16.6", "RDMAP-04.5", "RDMAP-04.10", "EXT-11", "SEC-06",
               "DDP-10.8", "RDMAP-16.11"),
            apply_qp=_swallow(TERM_DDP_T_INVALID_STAG, TERM_RDMAP_INVALID_STAG),
            scope=("DDP-10", "RDMAP-16", "RDMAP-09"),
        ),  # fmt: skip
        Fault(
            "bounds-unchecked",
            "accesses outside the region are dropped silently (nothing placed, no Terminate)",
            _c("DDP-10.4", "DDP-10.5", "RDMAP-16.7", "RDMAP-16.8", "SEC-04.2", "SEC-04.3",
               "SEC-15", "EXT-11.3"),
            apply_qp=_swallow(TERM_DDP_T_BASE_BOUNDS, TERM_RDMAP_BASE_BOUNDS),
            app="kbtp",
            scope=("DDP-10", "RDMAP-16", "SEC-04"),
        ),  # fmt: skip
        Fault(
            "last-octet-refused",
            "a Read reaching the last octet of its region is refused (bounds off by one)",
            _c("SEC-04"),
            apply_qp=_last_octet_refused,
            app="kbtp",
            scope=("SEC-04", "RDMAP-06"),
        ),
        Fault(
            "wrap-as-bounds",
            "a TO wrap is reported as a base or bounds violation",
            _c("DDP-10.6", "RDMAP-16.9", "EXT-11.4", status="WARN"),
            _cause_swapped(_WRAP),
            app="bench",
            scope=("DDP-10", "RDMAP-16", "EXT-11"),
        ),
        Fault(
            "pd-ignored",
            "an STag of another protection domain is used as if it were the stream's",
            _c("DDP-12", "SEC-01", "SEC-01.2"),
            apply_qp=_pd_ignored,
            app="kbtp",
            scope=("SEC-06.2", "SEC-02"),
        ),
        Fault(
            "stale-stags-usable",
            "regions outlive their connection and protection domains are not checked",
            _c("DDP-12", "SEC-01", "SEC-01.2", "SEC-06.2"),
            apply_qp=_pd_ignored,
            app="kbtp",
            patches=(_DEREG,),
            scope=("SEC-06",),
        ),
        Fault(
            "rights-ignored",
            "remote access rights are not checked",
            _c("DDP-10.7", "RDMAP-16.10", "EXT-11.2"),
            apply_qp=_rights_ignored,
            app="kbtp",
            scope=("DDP-10", "RDMAP-16"),
        ),
        Fault(
            "read-response-misplaced",
            "Read Responses go 8 octets past the Sink TO the Read named",
            _c("RDMAP-06", "RDMAP-06.2", "RDMAP-13", "EXT-08", "RDMAP-13.2", "RDMAP-05"),
            _read_response_misplaced,
            app="bench",
            scope=("RDMAP-07", "RDMAP-14.2"),
        ),  # fmt: skip
        Fault(
            "read-responses-unchecked",
            "Read Responses that match no outstanding Read are dropped silently",
            _c("RDMAP-04.5", "RDMAP-04.6", "RDMAP-04.7", "RDMAP-04.8", "RDMAP-04.10"),
            apply_qp=_read_responses_unchecked,
            scope=("RDMAP-04",),
        ),
        Fault(
            "single-segment-unchecked",
            "Read Requests, Atomic Requests and Immediate Data are taken with any L and MO, "
            "and dropped when their header has the wrong length",
            _c("RDMAP-04", "RDMAP-04.2", "RDMAP-04.3", "RDMAP-04.4", "EXT-02", "EXT-02.3",
               "EXT-09", "EXT-09.2"),
            _stream_input(_single_segment_unchecked),
            scope=("RDMAP-04.9", "EXT-02.2"),
        ),  # fmt: skip
        Fault(
            "zero-reads-validated",
            "a zero-length Read Request's source STag is validated (RDMAP-07: it is not)",
            _c("RDMAP-07", "RDMAP-07.2", "RDMAP-03.2", "RDMAP-14", "RDMAP-14.2", "RDMAP-07.3",
               "RDMAP-14.3"),
            apply_qp=_zero_reads_validated,
            scope=("RDMAP-07", "RDMAP-14", "RDMAP-03"),
        ),
        Fault(
            "ird-unenforced",
            "Read Requests beyond the negotiated IRD are served",
            _c("RDMAP-14", "RDMAP-14.3"),
            apply_qp=_ird_unenforced,
            scope=("RDMAP-14", "RDMAP-06"),
        ),
        Fault(
            "reads-not-snapshotted",
            "a queued Read Response reads memory when it is sent, after later Writes (RFC 5040 "
            "§5.5)",
            _c("RDMAP-13.2"),
            apply_qp=_reads_not_snapshotted,
            app="bench",
            scope=("RDMAP-13", "RDMAP-05"),
        ),
        Fault(
            "writes-dropped",
            "inbound RDMA Writes are taken and never placed",
            _c("RDMAP-13", "RDMAP-13.2", "RDMAP-05", "EXT-06", "EXT-06.2", "EXT-06.3",
               "EXT-06.4", "EXT-08", "DDP-10.3", "DDP-10.4", "DDP-10.5", "DDP-10.6"),
            apply_qp=_writes_dropped,
            app="bench",
            scope=("DDP-10", "RDMAP-06"),
        ),  # fmt: skip
        # -- RDMAP ---------------------------------------------------------------------------
        Fault(
            "rdmap-version-unchecked",
            "the RDMAP version is not checked (RV != 1 taken as 1)",
            _c("RDMAP-02.2", "RDMAP-02.3", "RDMAP-02.4", "RDMAP-02.5", "RDMAP-02.11"),
            _stream_input(_rv_one),
            scope=("RDMAP-02",),
        ),
        Fault(
            "opcode-unchecked",
            "segments with an unassigned opcode, or one the T bit disagrees with, are dropped "
            "silently",
            _c("RDMAP-16", "RDMAP-16.2", "RDMAP-16.3", "RDMAP-16.4", "RDMAP-16.5", "RDMAP-02.7",
               "RDMAP-02.8", "RDMAP-02.9", "RDMAP-02.10"),
            _stream_input(_known_opcode),
            scope=("RDMAP-02", "RDMAP-16"),
        ),  # fmt: skip
        Fault(
            "invalidate-field-checked",
            "the Invalidate STag field of a plain Send is honoured, and a Read Request with it "
            "set ends the stream",
            _c("RDMAP-03", "RDMAP-03.2"),
            apply_qp=_invalidate_field_checked,
            scope=("RDMAP-09",),
        ),
        Fault(
            "invalidate-ignored",
            "Send with Invalidate is taken as a plain Send: nothing checked or invalidated",
            _c("RDMAP-09", "SEC-06", "SEC-02"),
            apply_qp=_invalidate_ignored,
            app="kbtp",
            scope=("RDMAP-03",),
        ),
        Fault(
            "too-long-as-no-buffer",
            "a Send longer than its receive is reported as 'no buffer available' (1/2/0x02)",
            _c("RDMAP-08", status="WARN"),
            _cause_swapped({TERM_DDP_U_TOO_LONG: TERM_DDP_U_NO_BUFFER}),
            scope=("RDMAP-08", "MPA-02"),
        ),
        Fault(
            "no-buffer-as-too-long",
            "a Send that finds no receive is reported as 'too long' (1/2/0x05)",
            _c("RDMAP-08.2"),
            _cause_swapped({TERM_DDP_U_NO_BUFFER: TERM_DDP_U_TOO_LONG}),
            scope=("RDMAP-08",),
        ),
        Fault(
            "terminate-ignored",
            "a received Terminate is ignored: the stream goes on",
            {**_c("RDMAP-10"), **_c("RDMAP-10.2", "RDMAP-15", "RDMAP-15.2", "RDMAP-11",
                                    "RDMAP-11.2", "RDMAP-15.3", status="WARN")},
            _terminate_ignored,
            scope=("RDMAP-10", "RDMAP-15"),
        ),  # fmt: skip
        Fault(
            "read-header-missing",
            "Terminates about a Read Request leave out its copied header (R=0)",
            _c("RDMAP-16.6", "RDMAP-16.7", "RDMAP-16.8", "RDMAP-16.9", "RDMAP-16.11",
               "RDMAP-16.12", status="WARN"),
            _read_header_missing,
            scope=("RDMAP-16",),
        ),  # fmt: skip
        # -- RFC 7306 ------------------------------------------------------------------------
        Fault(
            "not-rfc7306",
            "the DUT does not implement RFC 7306 (opcodes 0x8-0xB unknown)",
            _c(*(c for c in _EXT_ALL if c != "EXT-04"), status="SKIP"),
            _not_rfc7306,
            app="bench",
            scope=("EXT",),
        ),
        Fault(
            "atomics-dropped",
            "Atomic Requests are taken and never run or answered",
            _c(*(c for c in _EXT_ALL if not c.startswith(("EXT-02", "EXT-09", "EXT-11.2")))),
            apply_qp=_atomics_dropped,
            app="bench",
            scope=("EXT",),
        ),
        Fault(
            "atomic-misaligned",
            "an atomic to a TO not 8-octet aligned runs on the aligned word below it",
            {**_c("EXT-05"), **_c("EXT-11.4", status="WARN")},
            apply_qp=_atomic_edit(_align),
            app="bench",
            scope=("EXT-06", "EXT-11"),
        ),
        Fault(
            "atomic-mask-ignored",
            "FetchAdd ignores its Add Mask (a plain 64-bit add)",
            _c("EXT-06.4"),
            apply_qp=_atomic_edit(_no_add_mask),
            app="bench",
            scope=("EXT-06",),
        ),
        Fault(
            "cmp-swap-always",
            "Compare and Swap swaps whatever the comparison",
            _c("EXT-06.3"),
            apply_qp=_atomic_edit(_always_swap),
            app="bench",
            scope=("EXT-06",),
        ),
        # -- RFC 5042 ------------------------------------------------------------------------
        Fault(
            "stags-sequential",
            "STags are handed out one after the other (index + 1, key 0)",
            _c("SEC-08", status="WARN"),
            app="kbtp",
            patches=(_SEQUENTIAL,),
            scope=("SEC-01",),
        ),
        Fault(
            "streams-coupled",
            "when one connection ends, every other connection of the DUT is ended too",
            _c("SEC-09", "SEC-09.2", "SEC-02"),
            apply_qp=_streams_coupled,
            app="kbtp",
            scope=("SEC-01", "SEC-06.2"),
        ),
    )
}
"""Every fault, by name."""


@contextmanager
def injected(*names: str, **settings: Any) -> Iterator[None]:
    """Apply the faults ``names`` (and :class:`~stack.wire.events.MpaSettings` changes
    ``settings``, e.g. ``request_timeout=1.0``) to every engine and queue pair the
    connection manager sets up inside the block; KeyError for an unknown fault."""
    faults = [FAULTS[n] for n in names]
    module = importlib.import_module(ENGINE_FACTORY[0])
    original = getattr(module, ENGINE_FACTORY[1])
    original_conn = getattr(module, CONNECTION_FACTORY[1])
    shared: dict[str, Any] = {}

    def factory(role: Role, engine_settings: Any = None, **kwargs: Any) -> IwarpConnection:
        if settings and engine_settings is not None:
            engine_settings = replace(engine_settings, **settings)
        engine = original(role, engine_settings, **kwargs)
        for fault in faults:
            if fault.apply is not None:
                fault.apply(engine)
        return engine

    def connection(stream: Any, engine: IwarpConnection, qp: QueuePair, **kwargs: Any) -> Any:
        for fault in faults:
            if fault.apply_qp is not None:
                fault.apply_qp(qp, engine, shared)
        return original_conn(stream, engine, qp, **kwargs)

    saved = [(obj, name, getattr(obj, name)) for f in faults for obj, name, _ in f.patches]
    setattr(module, ENGINE_FACTORY[1], factory)
    setattr(module, CONNECTION_FACTORY[1], connection)
    for f in faults:
        for obj, name, value in f.patches:
            setattr(obj, name, value)
    try:
        yield
    finally:
        setattr(module, ENGINE_FACTORY[1], original)
        setattr(module, CONNECTION_FACTORY[1], original_conn)
        for obj, name, value in reversed(saved):
            setattr(obj, name, value)
