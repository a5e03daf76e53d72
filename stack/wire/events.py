"""The vocabulary of the wire core: RDMAP messages, receive events and MPA events.

Every class is a frozen, slotted dataclass (the h11 ``_events`` pattern).  The sans-IO
engines consume and produce these; the RNIC, the dissector and the tests import them.
Byte layouts live in :mod:`stack.wire.rdmap` (encode/decode) and :mod:`stack.wire.mpa`.

Messages (what a sender submits, RFC 5040 §4, RFC 7306 §4):
    :class:`RdmaWrite`, :class:`ReadRequest`, :class:`ReadResponse`, :class:`Send`,
    :class:`Terminate`, :class:`ImmediateData`, :class:`AtomicRequest`,
    :class:`AtomicResponse`.

Receive events (what :class:`stack.wire.stream.RdmapStream` yields per received DDP
segment or message; tagged and Send data arrive per segment, so the RNIC places it
directly, as DDP does):
    :class:`WriteSegment`, :class:`ReadResponseSegment`, :class:`SendSegment`,
    :class:`ReadRequestReceived`, :class:`AtomicRequestReceived`,
    :class:`AtomicResponseReceived`, :class:`ImmediateDataReceived`,
    :class:`TerminateReceived`.

MPA events (what :class:`stack.wire.mpa.MpaConnection` yields):
    :class:`RequestReceived`, :class:`Established`, :class:`Rejected`,
    :class:`UlpduReceived`, :class:`ConnectionFailed`, :class:`PeerClosed`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

from stack.buffers import Buffer as Data
from stack.constants import (
    ALL_ONES_64,
    AtomicOpcode,
    Opcode,
    RtrType,
    TermCode,
)
from stack.fastinit import slot_init

# ======================================================================================
# RDMAP messages (RFC 5040 §4, RFC 7306 §4-6)
# ======================================================================================


@slot_init
@dataclass(frozen=True, slots=True)
class RdmaWrite:
    """RDMA Write (opcode 0x0, tagged).  Fields: stag, to, data."""

    stag: int
    to: int
    data: Data = b""


@slot_init
@dataclass(frozen=True, slots=True)
class ReadRequest:
    """RDMA Read Request (opcode 0x1, QN 1, 28-byte header, RDMAP-04).

    Fields: sink_stag, sink_to, size, src_stag, src_to.
    """

    sink_stag: int
    sink_to: int
    size: int
    src_stag: int
    src_to: int


@slot_init
@dataclass(frozen=True, slots=True)
class ReadResponse:
    """RDMA Read Response (opcode 0x2, tagged to the request's sink).  Fields: stag, to, data."""

    stag: int
    to: int
    data: Data = b""


@slot_init
@dataclass(frozen=True, slots=True)
class Send:
    """The Send family (opcodes 0x3-0x6, QN 0, RDMAP-08/09).

    Fields: data; solicited (SE variants); invalidate_stag (None = no invalidate,
    otherwise opcode 0x4/0x6 with this STag in the RsvdULP field).
    """

    data: Data = b""
    solicited: bool = False
    invalidate_stag: int | None = None

    @property
    def opcode(self) -> Opcode:
        if self.invalidate_stag is None:
            return Opcode.SEND_SE if self.solicited else Opcode.SEND
        return Opcode.SEND_SE_INVALIDATE if self.solicited else Opcode.SEND_INVALIDATE


@dataclass(frozen=True, slots=True)
class Terminate:
    """Terminate (opcode 0x7, QN 2, RFC 5040 §4.8, RDMAP-10/11).

    Fields: layer, etype, code; m, d, r header-control bits; ddp_seg_len (valid when
    d); ddp_header (the copied 14- or 18-byte DDP header, present iff d); rdma_header (the
    copied 28-byte Read Request header, present iff r and the bytes were sent);
    siw_swapped (decode only: the control word had siw's swapped nibble layout,
    Linux siw on little-endian hosts).
    """

    layer: int
    etype: int
    code: int
    m: bool = False
    d: bool = False
    r: bool = False
    ddp_seg_len: int = 0
    ddp_header: bytes = b""
    rdma_header: bytes = b""
    siw_swapped: bool = False

    @property
    def cause(self) -> TermCode:
        return TermCode(self.layer, self.etype, self.code)


@slot_init
@dataclass(frozen=True, slots=True)
class ImmediateData:
    """Immediate Data (opcodes 0x8/0x9, QN 0, exactly 8 bytes, EXT-09).  Fields: data, solicited."""

    data: bytes
    solicited: bool = False


@slot_init
@dataclass(frozen=True, slots=True)
class AtomicRequest:
    """Atomic Request (opcode 0xA, QN 1, 52-byte header, RFC 7306 §5.2.1).

    Fields: atomic_opcode, req_id, stag, to, add_swap_data, add_swap_mask,
    compare_data, compare_mask.  For FetchAdd the compare fields are 0 / all-ones and an
    Add Mask of 0 means a plain 64-bit add (RFC 7306 §5.1: mask bits select the carry boundaries).
    """

    atomic_opcode: int
    req_id: int
    stag: int
    to: int
    add_swap_data: int
    add_swap_mask: int = 0
    compare_data: int = 0
    compare_mask: int = ALL_ONES_64

    @classmethod
    def fetch_add(cls, req_id: int, stag: int, to: int, add: int, mask: int = 0) -> AtomicRequest:
        return cls(AtomicOpcode.FETCH_ADD, req_id, stag, to, add, mask, 0, ALL_ONES_64)

    @classmethod
    def cmp_swap(
        cls,
        req_id: int,
        stag: int,
        to: int,
        compare: int,
        swap: int,
        compare_mask: int = ALL_ONES_64,
        swap_mask: int = ALL_ONES_64,
    ) -> AtomicRequest:
        return cls(AtomicOpcode.CMP_SWAP, req_id, stag, to, swap, swap_mask, compare, compare_mask)


@slot_init
@dataclass(frozen=True, slots=True)
class AtomicResponse:
    """Atomic Response (opcode 0xB, QN 3, 12-byte header).  Fields: req_id, orig_value."""

    req_id: int
    orig_value: int


RdmapMessage = (
    RdmaWrite
    | ReadRequest
    | ReadResponse
    | Send
    | Terminate
    | ImmediateData
    | AtomicRequest
    | AtomicResponse
)

WriteFields = tuple[int, int, Data]
"""An RDMA Write given by its fields ``(stag, to, data)``: the message ``RdmaWrite(stag,
to, data)`` without the object, which a sender's bulk path does not make per Write
(:meth:`~stack.wire.connection.IwarpConnection.send_messages`)."""


@slot_init
@dataclass(frozen=True, slots=True)
class MessagePart:
    """Part of a large data message that the sender's QP hands out over several send passes,
    so the transport never holds more than a pass of a message.  Each part is a run of the
    message's DDP segments (RFC 5041 §5.2), L set on the last segment of the last part only
    (DDP-02).

    ``message`` is the part itself: its data are the part's bytes, and a tagged message's
    TO is that of its first byte.  ``mo`` is the part's offset in its message (the MO of an
    untagged part's first segment, DDP-05); ``last`` whether the part ends the message (its
    last segment has L set and an untagged message's MSN advances after it)."""

    message: RdmaWrite | ReadResponse | Send
    mo: int = 0
    last: bool = False


OutboundMessage = RdmapMessage | WriteFields | MessagePart
"""What :meth:`~stack.wire.connection.IwarpConnection.send_messages` takes."""

# ======================================================================================
# Receive events of the RDMAP stream (one per DDP segment for data, one per message else)
# ======================================================================================
# Each carries ``ulpdu``, the ULPDU it came from (not compared, not shown), so an error the
# RNIC finds while applying it names the ULPDU its Terminate copies headers from (RFC 5040
# §4.8, Fig. 10).


@slot_init
@dataclass(frozen=True, slots=True)
class WriteSegment:
    """A validated-form RDMA Write segment to place (STag checks are the RNIC's: §7.1).

    Fields: stag, to, data, last.
    """

    stag: int
    to: int
    data: memoryview
    last: bool
    ulpdu: memoryview | None = field(default=None, compare=False, repr=False)


@slot_init
@dataclass(frozen=True, slots=True)
class ReadResponseSegment:
    """A Read Response segment to place at the requester.  Fields: stag, to, data, last."""

    stag: int
    to: int
    data: memoryview
    last: bool
    ulpdu: memoryview | None = field(default=None, compare=False, repr=False)


@slot_init
@dataclass(frozen=True, slots=True)
class SendSegment:
    """One segment of a Send-family message (QN 0) to place at ``mo`` in the receive buffer.

    Fields: opcode, msn, mo, data, last, invalidate_stag (None unless opcode 0x4/0x6).
    The message is complete (deliverable) when the ``last`` segment has been placed.
    """

    opcode: Opcode
    msn: int
    mo: int
    data: memoryview
    last: bool
    invalidate_stag: int | None = None
    ulpdu: memoryview | None = field(default=None, compare=False, repr=False)


@slot_init
@dataclass(frozen=True, slots=True)
class ReadRequestReceived:
    """A complete Read Request (QN 1).  Fields: msn, request."""

    msn: int
    request: ReadRequest
    ulpdu: memoryview | None = field(default=None, compare=False, repr=False)


@slot_init
@dataclass(frozen=True, slots=True)
class AtomicRequestReceived:
    """A complete Atomic Request (QN 1).  Fields: msn, request."""

    msn: int
    request: AtomicRequest
    ulpdu: memoryview | None = field(default=None, compare=False, repr=False)


@slot_init
@dataclass(frozen=True, slots=True)
class AtomicResponseReceived:
    """A complete Atomic Response (QN 3).  Fields: msn, response."""

    msn: int
    response: AtomicResponse
    ulpdu: memoryview | None = field(default=None, compare=False, repr=False)


@slot_init
@dataclass(frozen=True, slots=True)
class ImmediateDataReceived:
    """Immediate Data (QN 0; consumes a receive buffer).  Fields: msn, data, solicited."""

    msn: int
    data: bytes
    solicited: bool
    ulpdu: memoryview | None = field(default=None, compare=False, repr=False)


@dataclass(frozen=True, slots=True)
class TerminateReceived:
    """The peer's Terminate (QN 2).  Fields: terminate."""

    terminate: Terminate


RdmapEvent = (
    WriteSegment
    | ReadResponseSegment
    | SendSegment
    | ReadRequestReceived
    | AtomicRequestReceived
    | AtomicResponseReceived
    | ImmediateDataReceived
    | TerminateReceived
)
RDMAP_EVENT_TYPES = (
    WriteSegment,
    ReadResponseSegment,
    SendSegment,
    ReadRequestReceived,
    AtomicRequestReceived,
    AtomicResponseReceived,
    ImmediateDataReceived,
    TerminateReceived,
)
"""The classes of :data:`RdmapEvent`, for ``isinstance``."""
MessageEvent = (
    ReadRequestReceived | AtomicRequestReceived | AtomicResponseReceived | ImmediateDataReceived
)
"""The events of one-segment messages (fixed size: RFC 5040 §4.4, RFC 7306 §4, §5), which
the bulk path applies with no event (:data:`~stack.wire.stream.MessagePlacer`)."""

# ======================================================================================
# MPA negotiation (RFC 5044 §7.1, RFC 6581)
# ======================================================================================


class Role(Enum):
    """MPA role: the Initiator sends the Request (independent of who sent the SYN)."""

    INITIATOR = "initiator"
    RESPONDER = "responder"


class CrcPolicy(Enum):
    """What an endpoint asks for and accepts about CRC (MPA-11).

    REQUEST: send C=1 (the RFC default); CRC on both ways whatever the peer says.
    REQUIRE: send C=1 and refuse (reject/close) a peer that sent C=0 (siw's crc_strict).
    OFF: send C=0 (administrative choice); still honour a peer's C=1.
    STRICT_OFF: send C=0 and refuse a peer that sent C=1.
    """

    REQUEST = "request"
    REQUIRE = "require"
    OFF = "off"
    STRICT_OFF = "strict-off"


class RevPolicy(Enum):
    """How a responder treats Rev 0 or an unknown revision: reject with R=1 or close."""

    REJECT = "reject"
    CLOSE = "close"
    ACCEPT = "accept"


@dataclass(frozen=True, slots=True)
class IrdOrd:
    """The RFC 6581 IRD/ORD word (ERC-03).

    Fields: ird, ord (14-bit), p2p (A), rtr (B/C/D as :class:`RtrType`).
    """

    ird: int
    ord: int
    p2p: bool = False
    rtr: RtrType = RtrType.NONE


@dataclass(frozen=True, slots=True)
class MpaFrame:
    """An MPA Request or Reply frame (RFC 5044 §7.1.1, RFC 6581 §6).

    Fields: reply (key), markers (M), crc (C), reject (R), rev, ird_ord (present iff
    the S bit is set; its 4 bytes are *not* part of ``private_data``), private_data
    (the ULP's bytes), reserved (the reserved flag bits as received: 0x0F, plus 0x10 for
    Rev < 2 where S is still reserved; e.g. siw's 0x08).
    """

    reply: bool
    markers: bool = False
    crc: bool = True
    reject: bool = False
    rev: int = 2
    ird_ord: IrdOrd | None = None
    private_data: bytes = b""
    reserved: int = 0

    @property
    def enhanced(self) -> bool:
        return self.ird_ord is not None


@dataclass(frozen=True, slots=True)
class MpaSettings:
    """An endpoint's MPA choices.

    Fields: rev (1 or 2; 2 sends the enhanced word); crc (:class:`CrcPolicy`);
    want_markers (markers in FPDUs *sent to* this endpoint); ird, ord; p2p; rtr (RTR
    kinds this endpoint can send as initiator / accept as responder); rtr_preference
    (order a responder picks from); max_private_data (512; siw uses 256);
    rev_policy (responder treatment of Rev 0 / unknown revs); allow_enhanced (a
    responder that does not implement RFC 6581 closes on S=1, ERC-11); reply_timeout,
    request_timeout (seconds, MPA-27); emss (for MULPDU, MPA-13; None: the transport
    takes it from the connected socket's MSS, else 1448); mulpdu (override).
    """

    rev: int = 2
    crc: CrcPolicy = CrcPolicy.REQUEST
    want_markers: bool = False
    ird: int = 16
    ord: int = 16
    p2p: bool = False
    rtr: RtrType = RtrType.SEND | RtrType.WRITE | RtrType.READ
    rtr_preference: tuple[RtrType, ...] = (RtrType.WRITE, RtrType.READ, RtrType.SEND)
    max_private_data: int = 512
    rev_policy: RevPolicy = RevPolicy.REJECT
    allow_enhanced: bool = True
    reply_timeout: float = 10.0
    request_timeout: float = 5.0
    emss: int | None = None
    mulpdu: int | None = None


@dataclass(frozen=True, slots=True)
class Negotiated:
    """The outcome of MPA startup, reported to DDP and the ULP (MPA-03, ERC-05).

    Fields: role, rev, crc (both directions), markers_tx (we insert markers),
    markers_rx (peer inserts markers), ird, ord (this endpoint's final values),
    peer_ird, peer_ord (the peer's advertised values, None when not enhanced), p2p,
    rtr (the one RTR kind to use, NONE for client-server), peer_private_data,
    mulpdu, peer_frame, local_frame.
    """

    role: Role
    rev: int
    crc: bool
    markers_tx: bool
    markers_rx: bool
    ird: int
    ord: int
    peer_ird: int | None
    peer_ord: int | None
    p2p: bool
    rtr: RtrType
    peer_private_data: bytes
    mulpdu: int
    local_frame: MpaFrame
    peer_frame: MpaFrame


@dataclass(frozen=True, slots=True)
class RequestReceived:
    """Responder: a well-formed Request arrived; call ``accept()`` or ``reject()``.

    Fields: frame.
    """

    frame: MpaFrame


@dataclass(frozen=True, slots=True)
class Established:
    """Full Operation entered (both sides).  Fields: negotiated."""

    negotiated: Negotiated


@dataclass(frozen=True, slots=True)
class Rejected:
    """Initiator: the Reply had R=1 (MPA-24); TCP stays open.  Fields: frame, reason."""

    frame: MpaFrame
    reason: str = ""


@slot_init
@dataclass(frozen=True, slots=True)
class UlpduReceived:
    """A validated ULPDU (CRC checked, markers stripped; MPA-10/16).  Fields: ulpdu."""

    ulpdu: memoryview


@dataclass(frozen=True, slots=True)
class ConnectionFailed:
    """MPA startup or framing failed.

    Fields: error (the :class:`~stack.errors.ProtocolError` or timeout), close (True
    when the RFC says close TCP now, e.g. a malformed startup frame), terminate (the
    Terminate cause to send first if Full Operation had begun, else None).
    """

    error: Exception
    close: bool = True
    terminate: TermCode | None = None


@dataclass(frozen=True, slots=True)
class PeerClosed:
    """The peer closed its sending half (FIN; MPA SHOULD report it, §8)."""


MpaEvent = RequestReceived | Established | Rejected | UlpduReceived | ConnectionFailed | PeerClosed


@dataclass(frozen=True, slots=True)
class NeedData:
    """Sentinel from ``next_event()``: nothing more until more bytes arrive (h11 style)."""


NEED_DATA = NeedData()
