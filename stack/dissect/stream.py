"""Capture stream decoder: MPA tracking, FPDU walk with marker removal, validation findings.

Theory of operation
-------------------
:class:`Dissector` takes TCP segments in capture order (from :mod:`stack.dissect.pcapio`),
reassembles each direction (:mod:`stack.dissect.tcp`) and hands the in-order bytes to a
:class:`_Half` per direction, which runs one of these modes:

``start``   expects an MPA Request or Reply at stream offset 0 (RFC 5044 §7.1).
``hold``    the initiator's bytes after its Request wait until the Reply tells whether the
            responder wants markers in them (M is chosen by the receiver, §7.1.1).
``fpdu``    Full Operation: FPDUs are walked from ULPDU_Length; with markers, SeqStart is
            the first byte after the direction's Request/Reply and a 4-byte marker sits at
            every offset ``(off - SeqStart) % 512 == 0`` (MPA-07), including before an FPDU
            (FPDUPTR 0), between PAD and CRC, and right after an FPDU that ends on a 512
            boundary.  The CRC covers the contiguous wire bytes from the leading marker (or
            the length field) to the CRC field, markers included (MPA-12), so it is one
            CRC32c call; markers are then cut out of the ULPDU.
``search``  the capture started mid-stream or a TCP gap lost the framing: candidate FPDU
            starts are tried until a chain of FPDUs is consistent (length, CRC when on,
            markers' FPDUPTRs when on, DDP/RDMAP header sanity).  CRC and marker settings
            are detected unless stated in :class:`DissectOptions`; the marker phase is
            found from the markers themselves.  After a gap the settings and the 4-byte
            alignment are known and only the phase-consistent starts are tried.
``dead``    not iWARP, rejected, or no FPDU chain found: bytes are counted, not decoded.

Each ULPDU is decoded by :func:`stack.wire.rdmap.decode_ulpdu` in lenient mode (stateless
checks: versions, reserved bits, opcode, T bit, QN/opcode pairing, header lengths,
Terminate form including siw's swapped nibbles), then :class:`_Sequencer` adds the
stateful checks: MSN sequence per queue and MO continuity (DDP-05, DDP-06), L on message
boundaries (DDP-02), constant opcode/RsvdULP/STag within a message (DDP-04), nothing after a
Terminate (RDMAP-10), Terminate header inclusion (RDMAP-12), Read Responses and Atomic
Responses matching the other direction's requests (RDMAP-04, EXT-03).  Startup frames get
the MPA/RFC 6581 checks (MPA-18..26, ERC-01/04/07/08/09/11).

Every PDU becomes a :class:`PduRecord` (emitted when the frame that completes it is fed);
events that are not PDUs (gaps, resynchronisation, non-iWARP connections) become
:class:`Note`.  Findings carry the digest's rule IDs; TCP-level facts use the pseudo rule
``TCP-GAP``.
"""

from __future__ import annotations

import struct
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from stack.constants import (
    DDP_DV_MASK,
    DDP_LAST,
    DDP_RSVD_MASK,
    DDP_TAGGED,
    DDP_TAGGED_HDR_LEN,
    DDP_UNTAGGED_HDR_LEN,
    DDP_VERSION,
    INVALIDATE_OPCODES,
    MPA_CRC_LEN,
    MPA_FPDUPTR_MASK,
    MPA_FRAME_HEADER_LEN,
    MPA_KEY_LEN,
    MPA_KEY_REP,
    MPA_KEY_REQ,
    MPA_MARKER_INTERVAL,
    MPA_MARKER_LEN,
    MPA_MAX_PRIVATE_DATA,
    MPA_RESERVED_MASK,
    MPA_REV_1,
    MPA_REV_2,
    MPA_REV_RDMAC,
    MPA_V2_NO_NEGOTIATION,
    MPA_V2_RTR_READ,
    MPA_V2_RTR_SEND,
    MPA_V2_RTR_WRITE,
    MULPDU_MAX,
    OPCODE_NAMES,
    OPCODE_QN,
    RDMAP_OPCODE_MASK,
    RDMAP_RSVD_MASK,
    RDMAP_RV_MASK,
    RDMAP_VERSION,
    SEND_OPCODES,
    TAGGED_OPCODES,
    TERM_LLP_CRC_ERROR,
    TERM_LLP_INVALID_STARTUP,
    TERM_LLP_MARKER_MISMATCH,
    TERM_LLP_NO_MATCHING_RTR,
    MpaFlag,
    Opcode,
    RdmapEType,
    RtrType,
    TermLayer,
)
from stack.crc import crc32c

try:  # the C function itself, without stack.crc's wrapper call, on the bulk path
    from crc32c import crc32c as _crc32c
except ImportError:  # pragma: no cover - crcmod backend
    _crc32c = crc32c
from stack.dissect.tcp import (
    Connection,
    Gap,
    HalfStream,
    OverlapConflict,
    Retransmission,
    StreamData,
    StreamEnd,
    StreamEvent,
    TcpReassembler,
)
from stack.errors import MpaError, ProtocolError
from stack.pcap import TCP_FIN, TCP_RST, TCP_SYN, TcpSegment
from stack.wire import ddp
from stack.wire.events import (
    AtomicRequest,
    AtomicResponse,
    MpaFrame,
    ReadRequest,
    Terminate,
)
from stack.wire.mpa import decode_frame
from stack.wire.rdmap import Checker, Finding, RdmapHeader, Segment, check_ddp, check_rdmap

__all__ = [
    "DissectOptions",
    "Dissector",
    "Finding",
    "Note",
    "PduRecord",
    "SegmentView",
    "StreamInfo",
    "dissect",
    "fpdu_layout",
]

_SEQ_MOD = 1 << 32
_TCP_SPECIAL = TCP_SYN | TCP_FIN | TCP_RST
_LE32 = struct.Struct("<I")
_U32 = struct.Struct(">I")
_MPA_HDR = struct.Struct(">16sBBH")
_MIN_ULPDU = DDP_TAGGED_HDR_LEN
_SEARCH_SPAN = 1040
"""A mid-stream chain must cover this many bytes (two marker intervals) when data allows."""
_SEARCH_MIN_FPDUS = 3
_SEARCH_GIVE_UP = 256 * 1024
"""Bytes of a direction searched without finding a chain before it is declared not iWARP."""
_MAX_ULPDU = 0xFFFF

_OP_WRITE = int(Opcode.RDMA_WRITE)
_OP_READ_REQUEST = int(Opcode.RDMA_READ_REQUEST)
_OP_READ_RESPONSE = int(Opcode.RDMA_READ_RESPONSE)
_OP_SEND = int(Opcode.SEND)
_OP_TERMINATE = int(Opcode.TERMINATE)
_OP_ATOMIC_REQUEST = int(Opcode.ATOMIC_REQUEST)
_OP_ATOMIC_RESPONSE = int(Opcode.ATOMIC_RESPONSE)

_RTR_BITS = ((MPA_V2_RTR_SEND, RtrType.SEND), (MPA_V2_RTR_WRITE, RtrType.WRITE),
             (MPA_V2_RTR_READ, RtrType.READ))  # fmt: skip


# ======================================================================================
# Public records
# ======================================================================================


@dataclass(frozen=True, slots=True)
class DissectOptions:
    """How to decode what the capture does not say.

    Fields: crc (None: from the negotiation, or detected mid-stream; True/False: forced),
    markers_i2r / markers_r2i (None: negotiated or detected; True/False: stated for
    mid-stream captures), initiator ((ip, port) of the MPA initiator for mid-stream
    captures; default: the side that sent the SYN, else the first sender), mid_stream
    (search for FPDUs even in connections whose start was captured but do not begin with
    MPA), rfc7306 (accept opcodes 0x8-0xB), siw_layout (Terminate layout hint, see
    :mod:`stack.wire.rdmap`), max_private_data (PD_Length limit, MPA-21).
    """

    crc: bool | None = None
    markers_i2r: bool | None = None
    markers_r2i: bool | None = None
    initiator: tuple[str, int] | None = None
    mid_stream: bool = False
    rfc7306: bool = True
    siw_layout: bool | None = None
    max_private_data: int = MPA_MAX_PRIVATE_DATA


@dataclass(slots=True)
class PduRecord:
    """One decoded PDU (an MPA Request/Reply or an FPDU) with its findings.

    Common fields: stream, frame (the frame completing it), timestamp, direction ('i2r'
    or 'r2i'), src, dst ('ip:port'), kind ('mpa_req', 'mpa_rep', 'fpdu'), offset (stream
    offset of its first byte, a leading marker included), wire_len, findings.
    MPA frames: mpa (:class:`MpaFrame`), mpa_flags (flag byte), rev, pd_len,
    private_data (all PD bytes, the RFC 6581 word included).
    FPDUs: ulpdu_len, crc_ok (None when CRC is off), crc_field (value carried), crc_value
    (computed), pad, marker_offsets (stream offsets), marker_ptrs (FPDUPTR values),
    marker_reserved, segment (:class:`SegmentView`, the fields of
    :class:`~stack.wire.rdmap.Segment`; None if undecodable),
    ulpdu (the ULPDU bytes, markers removed).
    """

    stream: int
    frame: int
    timestamp: float
    direction: str
    src: str
    dst: str
    kind: str
    offset: int
    wire_len: int
    findings: list[Finding] = field(default_factory=list)
    mpa: MpaFrame | None = None
    mpa_flags: int = 0
    rev: int = 0
    pd_len: int = 0
    private_data: bytes = b""
    ulpdu_len: int = 0
    crc_ok: bool | None = None
    crc_field: int = 0
    crc_value: int = 0
    pad: bytes = b""
    marker_offsets: tuple[int, ...] = ()
    marker_ptrs: tuple[int, ...] = ()
    marker_reserved: tuple[int, ...] = ()
    segment: SegmentView | None = None
    ulpdu: bytes | memoryview = b""

    @property
    def rules(self) -> list[str]:
        """Rule IDs of the findings, in order, without repeats."""
        return list(dict.fromkeys(f.rule for f in self.findings))


@dataclass(frozen=True, slots=True)
class Note:
    """Something about a stream that is not a PDU.

    Fields: stream, frame, direction, kind ('gap', 'resync', 'lost_sync', 'not_iwarp',
    'trailing', 'conflict', 'rejected', 'midstream'), detail, offset.
    """

    stream: int
    frame: int
    direction: str
    kind: str
    detail: str
    offset: int = 0


@dataclass(slots=True)
class DirectionInfo:
    """Per-direction facts and counters of a stream (for statistics)."""

    src: str = ""
    dst: str = ""
    crc: bool | None = None
    markers: bool | None = None
    seq_start: int | None = None
    pdus: int = 0
    fpdus: int = 0
    wire_bytes: int = 0
    ulpdu_bytes: int = 0
    payload_bytes: int = 0
    gap_bytes: int = 0
    retransmitted_bytes: int = 0
    undecoded_bytes: int = 0


@dataclass(slots=True)
class StreamInfo:
    """What is known about one TCP connection.  Fields: stream, state, rev, directions."""

    stream: int
    endpoints: tuple[str, str]
    state: str = "start"  # start, fpdu, midstream, rejected, not_iwarp
    rev: int | None = None
    enhanced: bool = False
    p2p: bool = False
    rtr: RtrType = RtrType.NONE
    directions: dict[str, DirectionInfo] = field(default_factory=dict)


def _endpoint(ip: str, port: int) -> str:
    return f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}"


_CTRL_TAGGED_LAST = DDP_TAGGED | DDP_LAST | DDP_VERSION
_CTRL_UNTAGGED_LAST = DDP_LAST | DDP_VERSION
_FAST_TAGGED = frozenset({DDP_TAGGED | DDP_VERSION, _CTRL_TAGGED_LAST})
_FAST_UNTAGGED = frozenset({DDP_VERSION, _CTRL_UNTAGGED_LAST})
_RV = RDMAP_VERSION << 6
_FAST_TAGGED_OPS = frozenset({_RV | Opcode.RDMA_WRITE, _RV | Opcode.RDMA_READ_RESPONSE})
_FAST_SEND_OPS = frozenset(_RV | op for op in SEND_OPCODES)
_FAST_INVALIDATE_OPS = frozenset(_RV | op for op in INVALIDATE_OPCODES)
_MARKER_UNPACK = struct.Struct(">HH").unpack_from
_ZEROS = tuple((0,) * k for k in range(64))
_LAYOUTS: dict[tuple[int, int], tuple[int, int, list[int]]] = {}
"""fpdu_layout results by (offset from SeqStart mod 512, ULPDU_Length); never mutated."""
_TAGGED_UNPACK = ddp.TAGGED_HDR.unpack_from
_UNTAGGED_UNPACK = ddp.UNTAGGED_HDR.unpack_from


class SegmentView:
    """A decoded ULPDU with exactly the fields of :class:`stack.wire.rdmap.Segment`.

    Built from the same staged checks as :func:`stack.wire.rdmap.decode_ulpdu`
    (:func:`~stack.wire.rdmap.check_ddp`, :func:`~stack.wire.rdmap.check_rdmap`, lenient
    mode), but as a plain slotted object: a frozen 17-field dataclass costs about ten
    times more to build, which dominated bulk decoding.  Fields: see ``Segment``.
    """

    __slots__ = (
        "tagged",
        "last",
        "ddp_version",
        "rdmap_version",
        "opcode",
        "ddp_rsvd",
        "rdmap_rsvd",
        "stag",
        "to",
        "qn",
        "msn",
        "mo",
        "inval_stag",
        "header",
        "payload",
        "ulpdu_len",
        "findings",
    )

    def __init__(self, ulpdu: bytes | memoryview, rfc7306: bool, siw_layout: bool | None) -> None:
        view = ulpdu if type(ulpdu) is memoryview else ddp.byte_view(ulpdu)
        n = len(view)
        if n >= DDP_UNTAGGED_HDR_LEN:
            # Canonical Write / Read Response / Send-family headers, for which the staged
            # checks find nothing: read them in one unpack (about half the bulk decode
            # time).  Anything else takes the staged path; the tests check both agree.
            ctrl = view[0]
            uc = view[1]
            if ctrl in _FAST_TAGGED and uc in _FAST_TAGGED_OPS:
                _, _, stag, to = _TAGGED_UNPACK(view)
                self.tagged = True
                self.last = ctrl == _CTRL_TAGGED_LAST
                self.ddp_version = 1
                self.rdmap_version = 1
                self.opcode = uc & RDMAP_OPCODE_MASK
                self.ddp_rsvd = self.rdmap_rsvd = 0
                self.stag = stag
                self.to = to
                self.qn = self.msn = self.mo = self.inval_stag = self.header = None
                self.payload = view[DDP_TAGGED_HDR_LEN:]
                self.ulpdu_len = n
                self.findings = ()
                return
            if ctrl in _FAST_UNTAGGED and uc in _FAST_SEND_OPS:
                _, _, inval, qn, msn, mo = _UNTAGGED_UNPACK(view)
                if qn == 0 and (not inval or uc in _FAST_INVALIDATE_OPS):
                    self.tagged = False
                    self.last = ctrl == _CTRL_UNTAGGED_LAST
                    self.ddp_version = 1
                    self.rdmap_version = 1
                    self.opcode = uc & RDMAP_OPCODE_MASK
                    self.ddp_rsvd = self.rdmap_rsvd = 0
                    self.stag = self.to = self.header = None
                    self.qn = qn
                    self.msn = msn
                    self.mo = mo
                    self.inval_stag = inval
                    self.payload = view[DDP_UNTAGGED_HDR_LEN:]
                    self.ulpdu_len = n
                    self.findings = ()
                    return
        chk = Checker(False)
        f = check_ddp(view, chk, rfc7306)
        op, header, payload = check_rdmap(f, chk, rfc7306, siw_layout)
        ctrl = f.ctrl
        self.tagged: bool = f.tagged
        self.last: bool = f.last
        self.ddp_version: int = ctrl & DDP_DV_MASK
        self.rdmap_version: int = f.ulp_ctrl >> 6
        self.opcode: int = op
        self.ddp_rsvd: int = ctrl & DDP_RSVD_MASK
        self.rdmap_rsvd: int = f.ulp_ctrl & RDMAP_RSVD_MASK
        self.stag: int | None = f.stag
        self.to: int | None = f.to
        self.qn: int | None = f.qn
        self.msn: int | None = f.msn
        self.mo: int | None = f.mo
        self.inval_stag: int | None = f.inval_stag
        self.header: RdmapHeader | None = header
        self.payload: memoryview = payload
        self.ulpdu_len: int = len(view)
        self.findings: tuple[Finding, ...] = tuple(chk.findings) if chk.findings else ()

    @property
    def opcode_name(self) -> str:
        return OPCODE_NAMES.get(self.opcode, f"Unknown opcode 0x{self.opcode:X}")

    @property
    def ddp_header_len(self) -> int:
        return DDP_TAGGED_HDR_LEN if self.tagged else DDP_UNTAGGED_HDR_LEN

    def to_segment(self) -> Segment:
        """The equivalent :class:`stack.wire.rdmap.Segment`."""
        return Segment(*(getattr(self, name) for name in self.__slots__))


# ======================================================================================
# FPDU layout with markers (RFC 5044 §4.2, §4.3)
# ======================================================================================


def fpdu_layout(rel: int, ulpdu_len: int, markers: bool) -> tuple[int, int, list[int]]:
    """Where an FPDU's parts fall when its first byte is ``rel`` bytes after SeqStart.

    Returns ``(length_at, wire_len, marker_rels)``: the position of ULPDU_Length relative to
    the FPDU's first byte (4 when a marker leads it, else 0), the bytes it occupies
    through the CRC, and the offsets (relative to the FPDU's first byte) of every marker
    it contains (MPA-07, MPA-08).
    """
    body = (ulpdu_len + 5) & ~3
    if not markers:
        return 0, body + MPA_CRC_LEN, []
    lead = MPA_MARKER_LEN if rel % MPA_MARKER_INTERVAL == 0 else 0
    # positions of body bytes advance past every 512 boundary they meet
    marks: list[int] = [0] if lead else []
    pos = rel + lead
    remaining = body
    while True:
        room = MPA_MARKER_INTERVAL - pos % MPA_MARKER_INTERVAL
        if remaining < room:
            pos += remaining
            break
        pos += room
        remaining -= room
        marks.append(pos - rel)
        pos += MPA_MARKER_LEN
        if remaining == 0:
            break  # marker between PAD and CRC
    return lead, pos - rel + MPA_CRC_LEN, marks


def _strip(buf: memoryview, start: int, lead: int, end_body: int, marks: list[int]) -> bytes:
    """The FPDU body (length field through PAD) with its inner markers cut out."""
    pieces = []
    pos = start + lead
    for m in marks:
        at = start + m
        if at < pos:  # the leading marker
            continue
        pieces.append(buf[pos:at])
        pos = at + MPA_MARKER_LEN
    pieces.append(buf[pos:end_body])
    return b"".join(pieces)


# ======================================================================================
# Stateful per-direction validation
# ======================================================================================


class _Sequencer:
    """MSN/MO/L tracking of one sending direction (RFC 5041 §4.3, §5.2; RFC 5040 §5)."""

    __slots__ = (
        "next_msn",
        "open_untagged",
        "open_tagged",
        "terminated",
        "known",
        "reads",
        "atomics",
        "first_fpdu",
    )

    def __init__(self, known: bool) -> None:
        self.known = known  # True when the stream start was seen: MSNs start at 1
        self.next_msn: dict[int, int] = {}
        self.open_untagged: dict[int, tuple[int, int, int, int]] = {}  # qn -> msn, mo, ctrl, inv
        self.open_tagged: tuple[int, int, int] | None = None  # stag, next to, opcode
        self.terminated = False
        # requests this direction sent, answered by the other direction (FIFO)
        self.reads: deque[list[int]] = deque()  # [sink_stag, sink_to, size, done]
        self.atomics: deque[int] = deque()  # req ids
        self.first_fpdu = True

    def forget(self) -> None:
        """After lost data: MSNs and open messages are unknown."""
        self.known = False
        self.next_msn.clear()
        self.open_untagged.clear()
        self.open_tagged = None
        self.reads.clear()
        self.atomics.clear()

    def check(self, seg: SegmentView, out: list[Finding], peer: _Sequencer) -> None:
        op = seg.opcode
        if op == _OP_WRITE and seg.last and self.open_tagged is None and not self.terminated:
            return  # a one-segment RDMA Write with nothing open: nothing to track

        if self.terminated:
            out.append(Finding("RDMAP-10", "FPDU sent after this side's Terminate"))
        if seg.tagged:
            self._tagged(seg, out, peer)
        elif seg.qn is not None:
            self._untagged(seg, out)
        if op == _OP_TERMINATE:
            self.terminated = True
            if isinstance(seg.header, Terminate):
                _check_terminate_form(seg.header, out)
        elif op == _OP_READ_REQUEST and isinstance(seg.header, ReadRequest):
            h = seg.header
            self.reads.append([h.sink_stag, h.sink_to, h.size, 0])
        elif op == _OP_ATOMIC_REQUEST and isinstance(seg.header, AtomicRequest):
            self.atomics.append(seg.header.req_id)
        elif op == _OP_ATOMIC_RESPONSE and isinstance(seg.header, AtomicResponse):
            if peer.atomics:
                want = peer.atomics.popleft()
                if seg.header.req_id != want:
                    out.append(
                        Finding(
                            "EXT-03",
                            f"Atomic Response for request 0x{seg.header.req_id:08X}, "
                            f"expected 0x{want:08X} (responses go in request order)",
                        )
                    )
            elif peer.known:
                out.append(Finding("EXT-03", "Atomic Response without an outstanding request"))

    def _untagged(self, seg: SegmentView, out: list[Finding]) -> None:
        qn = seg.qn
        msn = seg.msn
        mo = seg.mo
        # (hot path: no assert; the DDP header kind guarantees these fields)
        ctrl = seg.opcode
        inv = seg.inval_stag or 0
        size = seg.ulpdu_len - DDP_UNTAGGED_HDR_LEN  # the RDMAP header counts as payload
        open_msg = self.open_untagged.get(qn)
        if open_msg is not None and open_msg[0] == msn:
            if mo != open_msg[1]:
                out.append(Finding("DDP-06", f"QN {qn} MSN {msn}: MO {mo}, expected {open_msg[1]}"))
            if ctrl != open_msg[2] or inv != open_msg[3]:
                out.append(
                    Finding("DDP-04", f"QN {qn} MSN {msn}: opcode or RsvdULP changed mid-message")
                )
        else:
            if open_msg is not None:
                out.append(
                    Finding("DDP-02", f"QN {qn} MSN {open_msg[0]} ended without a Last segment")
                )
                self.next_msn[qn] = (open_msg[0] + 1) % _SEQ_MOD
            expected = self.next_msn.get(qn, 1 if self.known else None)
            if expected is not None and msn != expected:
                out.append(Finding("DDP-05", f"QN {qn}: MSN {msn}, expected {expected}"))
            if mo != 0 and (expected is not None or open_msg is not None):
                out.append(Finding("DDP-05", f"QN {qn} MSN {msn}: first segment has MO {mo}"))
        if seg.last:
            self.open_untagged.pop(qn, None)
            self.next_msn[qn] = (msn + 1) % _SEQ_MOD
        else:
            self.open_untagged[qn] = (msn, mo + size, ctrl, inv)

    def _tagged(self, seg: SegmentView, out: list[Finding], peer: _Sequencer) -> None:
        stag = seg.stag
        to = seg.to
        # (hot path: no assert; the DDP header kind guarantees these fields)
        size = seg.ulpdu_len - DDP_TAGGED_HDR_LEN
        op = seg.opcode
        ot = self.open_tagged
        if ot is not None:
            if stag != ot[0] or op != ot[2]:
                out.append(
                    Finding(
                        "DDP-02",
                        f"tagged message to STag 0x{ot[0]:08X} ended without a Last segment",
                    )
                )
            elif to != ot[1]:
                out.append(
                    Finding("DDP-06", f"STag 0x{stag:08X}: TO 0x{to:X}, expected 0x{ot[1]:X}")
                )
        self.open_tagged = None if seg.last else (stag, (to + size) & ((1 << 64) - 1), op)
        if op == _OP_READ_RESPONSE:
            self._read_response(seg, stag, to, size, out, peer)

    @staticmethod
    def _read_response(
        seg: SegmentView, stag: int, to: int, size: int, out: list[Finding], peer: _Sequencer
    ) -> None:
        if not peer.reads:
            if peer.known:
                out.append(Finding("RDMAP-04", "Read Response without an outstanding Read Request"))
            return
        req = peer.reads[0]
        sink_stag, sink_to, total, done = req
        if stag != sink_stag or to != (sink_to + done) & ((1 << 64) - 1):
            out.append(
                Finding(
                    "RDMAP-04",
                    f"Read Response to 0x{stag:08X}/0x{to:X}, the request's sink is "
                    f"0x{sink_stag:08X}/0x{(sink_to + done) & ((1 << 64) - 1):X}",
                )
            )
        req[3] = done = done + size
        if seg.last:
            if done != total:
                out.append(
                    Finding("RDMAP-04", f"Read Response carried {done} bytes, {total} requested")
                )
            peer.reads.popleft()
        elif done > total:
            out.append(Finding("RDMAP-04", f"Read Response exceeds the {total} bytes requested"))


def _check_terminate_form(t: Terminate, out: list[Finding]) -> None:
    """Header inclusion per RFC 5040 Fig. 10 (RDMAP-12, a SHOULD: noted, not fatal)."""
    layer, etype = t.layer, t.etype
    if layer == TermLayer.LLP or (
        layer == TermLayer.RDMAP and etype == RdmapEType.LOCAL_CATASTROPHIC
    ):
        if t.d or t.r:
            out.append(Finding("RDMAP-12", f"{layer}/{etype} Terminate should carry no headers"))
    elif layer == TermLayer.DDP:
        if not (t.d and t.m):
            out.append(Finding("RDMAP-12", "DDP Terminate should carry the DDP header (M, D)"))
        if t.r:
            out.append(Finding("RDMAP-12", "DDP Terminate should not carry an RDMA header"))
    elif layer == TermLayer.RDMAP:
        copied_op = t.ddp_header[1] & RDMAP_OPCODE_MASK if len(t.ddp_header) > 1 else None
        if t.r and copied_op is not None and copied_op != Opcode.RDMA_READ_REQUEST:
            out.append(Finding("RDMAP-12", "R set for a message that is not a Read Request"))
        if (
            etype == RdmapEType.REMOTE_PROTECTION
            and copied_op == Opcode.RDMA_READ_REQUEST
            and not t.r
        ):
            out.append(Finding("RDMAP-12", "Read Request protection error without its header"))
    if t.d and not t.m:
        out.append(Finding("RDMAP-11", "D set without M: the segment length is not valid"))
    if t.d and t.ddp_header and t.m:
        hlen = len(t.ddp_header)
        if t.ddp_seg_len < hlen:
            out.append(
                Finding(
                    "RDMAP-11",
                    f"DDP Segment Length {t.ddp_seg_len} is shorter than the copied "
                    f"{hlen}-byte DDP header (payload length, as siw sends?)",
                )
            )


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


# ======================================================================================
# Per-direction decoder
# ======================================================================================


class _Half:
    """One direction's byte stream: startup frame, then FPDUs (see module docstring)."""

    bulk = True
    """Use :meth:`walk_plain` in Full Operation (tests turn it off to compare both paths)."""

    def __init__(self, conn: _Conn, side: int) -> None:
        self.conn = conn
        self.side = side
        self.mode = "start"
        self.chunks: list[memoryview | bytes] = []
        self.buffered = 0
        self.need = MPA_KEY_LEN
        self.base = 0  # stream offset of the first buffered byte
        self.ends: deque[tuple[int, int, float]] = deque()  # (end offset, frame, ts)
        self.crc: bool | None = None
        self.markers: bool | None = None
        self.seq_start = 0
        self.aligned = False  # FPDU starts are known to be 4-aligned to seq_start
        self.seq = _Sequencer(known=False)  # True once Full Operation starts in view
        self.searched = 0
        self._scan_base = -1
        self._bulk: tuple | None = None  # walk_plain's per-direction constants
        self._scan: dict[tuple[bool, bool], set[int] | int] = {}
        self.sent_request = False
        self.info = DirectionInfo()

    # ---- buffering ------------------------------------------------------------------
    def push(self, data: memoryview | bytes, offset: int, frame: int, ts: float) -> None:
        if not self.chunks:
            self.base = offset
        self.chunks.append(data)
        self.buffered += len(data)
        self.ends.append((offset + len(data), frame, ts))
        if self.mode == "dead":
            self.info.undecoded_bytes += len(data)
            self._drop_all()
            return
        if self.buffered >= self.need:
            if self.mode == "fpdu" and self.bulk:
                # the waiting partial FPDU is now complete: walk the joined bytes in bulk
                joined = self._joined()
                base = self.base
                self.chunks = []
                self.buffered = 0
                self.ends.clear()
                self.walk_plain(joined, base, frame, ts)
                return
            self.run(False)

    def _joined(self) -> memoryview:
        chunks = self.chunks
        if len(chunks) == 1:
            buf = chunks[0]
            return buf if isinstance(buf, memoryview) else memoryview(buf)
        joined = b"".join(chunks)
        self.chunks = [joined]
        return memoryview(joined)

    def _consume(self, n: int) -> None:
        """Drop the first ``n`` buffered bytes."""
        if not n:
            return
        if n == self.buffered:
            self._drop_all()
            return
        buf = self._joined()
        rest = buf[n:]
        self.chunks = [rest] if len(rest) else []
        self.buffered -= n
        self.base += n
        ends = self.ends
        while ends and ends[0][0] <= self.base:
            ends.popleft()

    def _drop_all(self) -> None:
        self.base += self.buffered
        if self.chunks:
            self.chunks = []
        self.buffered = 0
        if self.ends:
            self.ends.clear()

    def _frame_at(self, end: int) -> tuple[int, float]:
        ends = self.ends
        if len(ends) == 1:
            e, frame, ts = ends[0]
            if e >= end:
                return frame, ts
        for e, frame, ts in ends:
            if e >= end:
                return frame, ts
        last = self.ends[-1] if self.ends else (0, self.conn.last_frame, 0.0)
        return last[1], last[2]

    # ---- gaps -----------------------------------------------------------------------
    def gap(self, offset: int, length: int, frame: int) -> None:
        self.info.gap_bytes += length
        lost = self.buffered
        self._drop_all()
        self.base = offset + length
        what = f"TCP gap: {length} bytes never captured at offset {offset}"
        if lost:
            what += f"; {lost} buffered bytes of a partial PDU dropped"
        self.conn.note(self.side, frame, "gap", what, offset)
        if self.mode in ("fpdu", "search"):
            if self.mode == "fpdu":
                self.conn.pending_findings[self.side].append(Finding("TCP-GAP", what))
            self.mode = "search"
            self.searched = 0
            self.seq.forget()
            self.need = 1
        elif self.mode in ("start", "hold"):
            self.mode = "search"
            self.aligned = False
            self.searched = 0
            self.seq.forget()
            self.need = 1

    def finish(self, frame: int) -> None:
        if self.buffered and self.mode not in ("dead",):
            self.run(True)
        if self.buffered:
            if self.mode != "dead":
                self.conn.note(
                    self.side,
                    frame,
                    "trailing",
                    f"{self.buffered} bytes at the end of the stream do not complete a PDU",
                    self.base,
                )
            self.info.undecoded_bytes += self.buffered
            self._drop_all()

    # ---- main loop ------------------------------------------------------------------
    def run(self, final: bool) -> None:
        while self.buffered:
            mode = self.mode
            if mode == "fpdu":
                if not self._walk():
                    return
            elif mode == "start":
                if not self._startup(final):
                    return
            elif mode == "search":
                if not self._search(final):
                    return
            else:  # hold, dead
                return

    # ---- startup frames -------------------------------------------------------------
    def _startup(self, final: bool) -> bool:
        conn = self.conn
        if self.base != 0 or not conn.tcp.halves[self.side].syn_seen:
            return self._begin_midstream()
        buf = self._joined()
        if len(buf) < MPA_KEY_LEN:
            self.need = MPA_KEY_LEN
            return False
        key = bytes(buf[:MPA_KEY_LEN])
        if key not in (MPA_KEY_REQ, MPA_KEY_REP):
            if conn.opts.mid_stream:
                return self._begin_midstream()
            if conn.request is not None and conn.initiator != self.side:
                why = "the answer to the MPA Request is not an MPA Reply (MPA-18)"
            else:
                why = "the connection does not start with an MPA Request"
            conn.not_iwarp(self, why, both=True)
            return False
        if len(buf) < MPA_FRAME_HEADER_LEN:
            self.need = MPA_FRAME_HEADER_LEN
            return False
        _, flags, rev, pd_len = _MPA_HDR.unpack_from(buf)
        total = MPA_FRAME_HEADER_LEN + pd_len
        if len(buf) < total:
            if pd_len > conn.opts.max_private_data and not final:
                # malformed: a receiver would close now; still show what arrived
                pass
            self.need = total
            if not final:
                return False
            total = len(buf)
        frame_no, ts = self._frame_at(self.base + total)
        raw = bytes(buf[:total])
        offset = self.base
        self._consume(total)
        conn.startup_frame(self, key == MPA_KEY_REP, raw, offset, flags, rev, pd_len, frame_no, ts)
        return True

    def _begin_midstream(self) -> bool:
        self.mode = "search"
        self.seq.forget()
        self.conn.midstream(self)
        self.need = 1
        return True

    def enter_fpdu(self, crc: bool, markers: bool) -> None:
        """Full Operation starts at the current base (RFC 5044 §7.1.2)."""
        self.crc = crc
        self.markers = markers
        self.seq_start = self.base
        self.aligned = True
        self.info.crc = crc
        self.info.markers = markers
        self.info.seq_start = self.base
        self.mode = "fpdu"
        self.seq.known = True
        self.need = MPA_MARKER_LEN + 2 if markers else 2

    # ---- FPDU walk ------------------------------------------------------------------
    def _walk(self) -> bool:
        buf = self._joined()
        n = len(buf)
        pos = 0
        markers = self.markers
        crc_on = self.crc
        base = self.base
        seq_start = self.seq_start
        while True:
            if markers:
                rel = base + pos - seq_start
                lead = MPA_MARKER_LEN if rel % MPA_MARKER_INTERVAL == 0 else 0
                if pos + lead + 2 > n:
                    self.need = pos + lead + 2 - pos
                    break
                ulen = (buf[pos + lead] << 8) | buf[pos + lead + 1]
                lead, wire, marks = fpdu_layout(rel, ulen, True)
            else:
                if pos + 2 > n:
                    self.need = 2
                    break
                ulen = (buf[pos] << 8) | buf[pos + 1]
                lead = 0
                wire = ((ulen + 5) & ~3) + MPA_CRC_LEN
                marks = []
            if pos + wire > n:
                self.need = wire
                break
            end_body = pos + wire - MPA_CRC_LEN
            crc_field = _LE32.unpack_from(buf, end_body)[0]
            crc_value = crc32c(buf[pos:end_body])
            if marks:
                body = _strip(buf, pos, lead, end_body, marks)
                ulpdu: bytes | memoryview = body[2 : 2 + ulen]
                pad = body[2 + ulen :]
            else:
                ulpdu = buf[pos + 2 : pos + 2 + ulen]
                pad = bytes(buf[pos + 2 + ulen : end_body]) if end_body - pos - 2 - ulen else b""
            good = crc_value == crc_field
            if (
                crc_on
                and not good
                and not _plausible_ulpdu(ulpdu, self.conn.opts.rfc7306)
                and not self._next_plausible(buf, pos + wire)
            ):
                # bad CRC, a header that makes no sense and no FPDU where the length points:
                # the framing is lost (MPA-16); a corrupted FPDU alone is shown with MPA-12
                self._consume(pos)
                self.conn.note(
                    self.side,
                    self._frame_at(self.base + 1)[0],
                    "lost_sync",
                    f"FPDU framing lost at offset {self.base} (bad CRC, implausible header); "
                    "searching for the next FPDU",
                    self.base,
                )
                self._lose_sync()
                return True
            ends = self.ends
            if len(ends) == 1 and ends[0][0] >= base + pos + wire:
                _, frame_no, ts = ends[0]
            else:
                frame_no, ts = self._frame_at(base + pos + wire)
            self.conn.fpdu(
                self,
                base + pos,
                wire,
                ulen,
                good if crc_on else None,
                crc_field,
                crc_value,
                pad,
                buf,
                pos,
                lead,
                marks,
                ulpdu,
                frame_no,
                ts,
            )
            pos += wire
            if self.mode != "fpdu":
                break
        self._consume(pos)
        return self.mode != "fpdu" and bool(self.buffered)

    def walk_plain(self, data: memoryview, offset: int, frame: int, ts: float) -> None:
        """The bulk path of :meth:`push` + :meth:`_walk` for an empty buffer.

        Every FPDU that ``data`` completes is decoded straight from the capture bytes
        (markers checked and cut out when the direction has them); a partial FPDU at the
        end is buffered for :meth:`push`.  Anything unusual (bad CRC, a marker that is
        not as expected, non-zero PAD, an undecodable ULPDU, the first FPDU of a direction,
        a pending gap finding) goes through the general :meth:`_walk` / :meth:`Conn.fpdu`.
        """
        conn = self.conn
        n = len(data)
        pos = 0
        side = self.side
        ctx = self._bulk
        if ctx is None or ctx[0] != conn.initiator:
            ctx = self._bulk = (
                conn.initiator,
                conn.emit,
                conn.stream,
                conn.direction(side),
                conn.names[side],
                conn.names[1 - side],
                self.seq,
                conn.halves[1 - side].seq,
                self.info,
                conn.rfc7306,
                conn.siw_layout,
                conn.pending_findings[side],
            )
        _, emit, stream, direction, src, dst, seq, peer, info, rfc7306, siw, pending = ctx
        crc_on = self.crc
        verdict = True if crc_on else None
        check = seq.check
        make_view = SegmentView
        make_record = PduRecord
        crc_of = _crc32c
        read_crc = _LE32.unpack_from
        fpdus = wire_bytes = ulpdu_bytes = payload_bytes = 0
        markers = self.markers
        seq_start = self.seq_start
        first_missing = conn.first_fpdu_frame[side] is None
        ptrs: tuple[int, ...] = ()
        offsets: tuple[int, ...] = ()
        reserved: tuple[int, ...] = ()
        while pos + 2 <= n:
            if markers:
                phase = (offset + pos - seq_start) % MPA_MARKER_INTERVAL
                lead = 0 if phase else MPA_MARKER_LEN
                if pos + lead + 2 > n:
                    break
                ulen = (data[pos + lead] << 8) | data[pos + lead + 1]
                layout = _LAYOUTS.get((phase, ulen))
                if layout is None:
                    layout = fpdu_layout(phase, ulen, True)
                    if len(_LAYOUTS) < 65536:
                        _LAYOUTS[(phase, ulen)] = layout
                lead, wire, marks = layout
            else:
                ulen = (data[pos] << 8) | data[pos + 1]
                wire = ((ulen + 5) & ~3) + MPA_CRC_LEN
            end = pos + wire
            if end > n:
                break
            end_body = end - MPA_CRC_LEN
            crc_field = read_crc(data, end_body)[0]
            crc_value = crc_of(data[pos:end_body])
            odd = False
            if markers:
                found = []
                for m in marks:
                    res, ptr = _MARKER_UNPACK(data, pos + m)
                    if res or ptr != (0 if (m == 0 and lead) else m - lead):
                        odd = True
                        break
                    found.append(ptr)
                body = _strip(data, pos, lead, end_body, marks)
                ulpdu: bytes | memoryview = body[2 : 2 + ulen]
                pad = body[2 + ulen :]
                pad_len = len(pad)
                ptrs = tuple(found)
                at = offset + pos
                offsets = tuple([at + m for m in marks])
                reserved = _ZEROS[len(marks)] if len(marks) < 64 else (0,) * len(marks)
            else:
                pad_len = end_body - pos - 2 - ulen
                pad = bytes(data[end_body - pad_len : end_body]) if pad_len else b""
                ulpdu = data[pos + 2 : pos + 2 + ulen]
            segment = None
            if not (
                odd
                or (crc_on and crc_value != crc_field)
                or first_missing
                or pending
                or (pad_len and any(pad))
                or ulen > MULPDU_MAX
            ):
                try:
                    segment = make_view(ulpdu, rfc7306, siw)
                except ProtocolError:
                    pass
            if segment is None:
                # the general path (findings, first-FPDU checks, lost framing, bad ULPDU)
                self._count(fpdus, wire_bytes, ulpdu_bytes, payload_bytes)
                self._hold_rest(data, pos, offset, frame, ts)
                self.run(False)
                return
            findings: list[Finding] = list(segment.findings) if segment.findings else []
            check(segment, findings, peer)
            payload_bytes += len(segment.payload)
            emit(
                make_record(stream, frame, ts, direction, src, dst, "fpdu", offset + pos, wire,
                            findings, None, 0, 0, 0, b"", ulen, verdict, crc_field, crc_value,
                            pad, offsets, ptrs, reserved, segment, ulpdu)
            )  # fmt: skip
            fpdus += 1
            wire_bytes += wire
            ulpdu_bytes += ulen
            pos = end
        self._count(fpdus, wire_bytes, ulpdu_bytes, payload_bytes)
        if frame > conn.last_frame:
            conn.last_frame = frame
        if pos < n:
            self._hold_rest(data, pos, offset, frame, ts)
            left = n - pos
            if markers:
                rel = offset + pos - seq_start
                lead = MPA_MARKER_LEN if rel % MPA_MARKER_INTERVAL == 0 else 0
                if left >= lead + 2:
                    ulen = (data[pos + lead] << 8) | data[pos + lead + 1]
                    self.need = fpdu_layout(rel, ulen, True)[1]
                else:
                    self.need = lead + 2
            elif left >= 2:
                self.need = ((((data[pos] << 8) | data[pos + 1]) + 5) & ~3) + MPA_CRC_LEN
            else:
                self.need = 2
        else:
            self.base = offset + n

    def _hold_rest(self, data: memoryview, pos: int, offset: int, frame: int, ts: float) -> None:
        """Buffer ``data[pos:]`` (stream offset ``offset + pos``) for :meth:`push` / :meth:`run`."""
        n = len(data)
        self.base = offset + pos
        self.chunks = [data[pos:]]
        self.buffered = n - pos
        self.ends.append((offset + n, frame, ts))

    def _count(self, fpdus: int, wire_bytes: int, ulpdu_bytes: int, payload_bytes: int) -> None:
        if fpdus:
            info = self.info
            info.pdus += fpdus
            info.fpdus += fpdus
            info.wire_bytes += wire_bytes
            info.ulpdu_bytes += ulpdu_bytes
            info.payload_bytes += payload_bytes

    def _next_plausible(self, buf: memoryview, pos: int) -> bool:
        """Whether an FPDU plausibly starts at ``pos`` (True when the bytes are not there)."""
        if self.markers and (self.base + pos - self.seq_start) % MPA_MARKER_INTERVAL == 0:
            pos += MPA_MARKER_LEN
        if pos + 2 + _MIN_ULPDU > len(buf):
            return True
        ulen = (buf[pos] << 8) | buf[pos + 1]
        return ulen >= _MIN_ULPDU and _plausible_ulpdu(
            buf[pos + 2 : pos + 2 + min(ulen, DDP_UNTAGGED_HDR_LEN)], self.conn.opts.rfc7306
        )

    def _lose_sync(self) -> None:
        self.mode = "search"
        self.searched = 0
        self.seq.forget()
        self.need = 1
        # skip the bad start itself
        self._consume(min(self.buffered, 4 if self.aligned else 1))

    # ---- mid-stream search ----------------------------------------------------------
    def _settings(self) -> list[tuple[bool, bool]]:
        opts = self.conn.opts
        crcs = (
            [self.crc]
            if self.crc is not None
            else ([opts.crc] if opts.crc is not None else [True, False])
        )
        stated = self.conn.stated_markers(self.side)
        if self.markers is not None:
            marks = [self.markers]
        elif stated is not None:
            marks = [stated]
        else:
            marks = [True, False]
        return [(c, m) for c in crcs for m in marks]  # CRC-verified and marked chains first

    def _search(self, final: bool) -> bool:
        searching = self.conn.dissector.searching
        searching.discard(self)
        buf = self._joined()
        n = len(buf)
        best: tuple[int, bool, bool, int] | None = None  # start, crc, markers, seq_start
        decided = final or n >= _SEARCH_GIVE_UP
        for crc_on, markers in self._settings():
            found = self._search_one(buf, crc_on, markers, decided)
            if found is None:
                continue
            if found == "wait":
                self.need = n + 1
                searching.add(self)  # output waits, so that it stays in capture order
                return False
            assert not isinstance(found, str)
            best = (found[0], crc_on, markers, found[1])
            break
        if best is not None:
            start, crc_on, markers, seq_start = best
            skipped = start
            self._consume(start)
            self.crc = crc_on
            self.markers = markers
            self.seq_start = seq_start
            self.aligned = True
            self.info.crc = crc_on
            self.info.markers = markers
            if self.info.seq_start is None:
                self.info.seq_start = seq_start
            self.mode = "fpdu"
            self.info.undecoded_bytes += skipped
            self.conn.note(
                self.side,
                self._frame_at(self.base + 1)[0],
                "resync",
                f"FPDU chain found at offset {self.base} after {skipped} skipped bytes "
                f"(CRC {'on' if crc_on else 'off'}, markers {'on' if markers else 'off'})",
                self.base,
            )
            return True
        if final or n >= _SEARCH_GIVE_UP:
            if self.conn.ever_synced(self.side):
                self.info.undecoded_bytes += n
                self._drop_all()
                return False
            self.conn.not_iwarp(self, "no consistent chain of FPDUs found")
            return False
        self.need = n + 1
        searching.add(self)
        return False

    def _search_one(
        self, buf: memoryview, crc_on: bool, markers: bool, final: bool
    ) -> tuple[int, int] | str | None:
        """Earliest consistent chain start under one setting; 'wait' if undecided."""
        n = len(buf)
        base = self.base
        final = final or n >= _SEARCH_GIVE_UP
        # What earlier passes over the same bytes ruled out (the bytes never change while
        # searching): dead marker phases, and the first start not yet ruled out.  Keeps the
        # search linear in the data however it arrives.
        if self._scan_base != base:
            self._scan_base = base
            self._scan.clear()
        if markers:
            if self.aligned:
                phases = [(self.seq_start - base) % MPA_MARKER_INTERVAL]
            else:
                phases = list(range(min(MPA_MARKER_INTERVAL, n)))
            dead = self._scan.setdefault((crc_on, True), set())
            assert isinstance(dead, set)
            waiting = False
            best: tuple[int, int] | None = None
            for phase in phases:
                if phase in dead:
                    continue
                res = self._try_phase(buf, phase, crc_on, final)
                if res is None:
                    dead.add(phase)
                elif res == "wait":
                    waiting = True
                elif isinstance(res, int):
                    # the markers only point at FPDUs they sit in: look for an earlier start
                    for start in range(phase % 4, res, 4):
                        if self._chain(buf, start, crc_on, True, phase, final) is True:
                            res = start
                            break
                    if best is None or res < best[0]:
                        best = (res, base + phase)
            if best is not None:
                return best
            return "wait" if waiting else None
        step = 4 if self.aligned else 1
        first = (self.seq_start - base) % 4 if self.aligned else 0
        resume = self._scan.get((crc_on, False), first)
        assert isinstance(resume, int)
        for start in range(resume, max(resume, n - 7), step):
            res = self._chain(buf, start, crc_on, False, 0, final)
            if res == "wait":
                self._scan[(crc_on, False)] = start
                return "wait"
            if res:
                return start, base + start
        self._scan[(crc_on, False)] = max(resume, n - 7 - (n - 7 - resume) % step)
        return "wait" if n < _SEARCH_GIVE_UP and not final else None

    def _try_phase(
        self, buf: memoryview, phase: int, crc_on: bool, final: bool
    ) -> int | None | str:
        """A marker phase: the first FPDU start its markers point to, if its chain holds."""
        n = len(buf)
        pos = phase
        count = 0
        while pos + MPA_MARKER_LEN <= n:
            reserved, ptr = struct.unpack_from(">HH", buf, pos)
            if reserved or ptr & 3:
                return None
            count += 1
            start = pos - ptr
            if ptr and (start - phase) % MPA_MARKER_INTERVAL == MPA_MARKER_LEN:
                start -= MPA_MARKER_LEN  # the FPDU opens with a marker (FPDUPTR 0)
            if start >= 0:
                res = self._chain(buf, start, crc_on, True, phase, final)
                if res == "wait":
                    return "wait"
                return start if res else None
            pos += MPA_MARKER_INTERVAL
        return None if final else "wait"

    def _chain(
        self, buf: memoryview, start: int, crc_on: bool, markers: bool, phase: int, final: bool
    ) -> bool | str:
        """Whether a consistent FPDU chain begins at ``start`` (phase: a marker position)."""
        n = len(buf)
        pos = start
        count = 0
        rfc7306 = self.conn.opts.rfc7306
        while True:
            rel = (pos - phase) % MPA_MARKER_INTERVAL if markers else 1
            lead = MPA_MARKER_LEN if markers and rel == 0 else 0
            if pos + lead + 2 > n:
                break
            ulen = (buf[pos + lead] << 8) | buf[pos + lead + 1]
            if ulen < _MIN_ULPDU:
                return False
            lead, wire, marks = fpdu_layout(rel, ulen, markers)
            if pos + wire > n:
                break
            end_body = pos + wire - MPA_CRC_LEN
            if markers:
                for m in marks:
                    at = pos + m
                    reserved, ptr = struct.unpack_from(">HH", buf, at)
                    want = 0 if m == 0 and lead else m - lead
                    if reserved or (ptr & MPA_FPDUPTR_MASK) != want:
                        return False
                body = _strip(buf, pos, lead, end_body, marks)
                ulpdu: bytes | memoryview = body[2 : 2 + ulen]
            else:
                ulpdu = buf[pos + 2 : pos + 2 + ulen]
            if not _plausible_ulpdu(ulpdu, rfc7306):
                return False
            if crc_on:
                if crc32c(buf[pos:end_body]) != _LE32.unpack_from(buf, end_body)[0]:
                    return False
            count += 1
            pos += wire
            if count >= _SEARCH_MIN_FPDUS and pos - start >= _SEARCH_SPAN:
                return True
        if final or n >= _SEARCH_GIVE_UP:
            return count >= (1 if crc_on else 2) or (count >= 1 and pos == n)
        return "wait"


# ======================================================================================
# Per-connection tracker
# ======================================================================================


class _Conn:
    """MPA state of one TCP connection and its two directions."""

    def __init__(self, dissector: Dissector, tcp: Connection) -> None:
        self.dissector = dissector
        self.emit = dissector._out.append
        self.tcp = tcp
        self.opts = dissector.options
        self.rfc7306 = self.opts.rfc7306
        self.siw_layout = self.opts.siw_layout
        self.stream = tcp.stream
        self.halves = (_Half(self, 0), _Half(self, 1))
        self.initiator: int | None = None  # side that sent the Request
        self.request: MpaFrame | None = None
        self.request_word = 0
        self.reply: MpaFrame | None = None
        self.reply_word = 0
        self.last_frame = tcp.first_frame
        self.first_fpdu_frame: list[int | None] = [None, None]
        self.pending_findings: tuple[list[Finding], list[Finding]] = ([], [])
        self.names = [_endpoint(*tcp.endpoints[0]), _endpoint(*tcp.endpoints[1])]
        self.info = StreamInfo(self.stream, (self.names[0], self.names[1]))
        self._synced = [False, False]
        for side in (0, 1):
            self.halves[side].info.src = self.names[side]
            self.halves[side].info.dst = self.names[1 - side]

    # ---- naming ---------------------------------------------------------------------
    def initiator_side(self) -> int:
        if self.initiator is not None:
            return self.initiator
        hint = self.opts.initiator
        if hint is not None:
            for side in (0, 1):
                if self.tcp.endpoints[side] == hint:
                    return side
        return 0

    def direction(self, side: int) -> str:
        return "i2r" if side == (self.initiator if self.initiator is not None else
                                 self.initiator_side()) else "r2i"  # fmt: skip

    def stated_markers(self, side: int) -> bool | None:
        return self.opts.markers_i2r if self.direction(side) == "i2r" else self.opts.markers_r2i

    def ever_synced(self, side: int) -> bool:
        return self._synced[side]

    def note(self, side: int, frame: int, kind: str, detail: str, offset: int = 0) -> None:
        self.emit(Note(self.stream, frame, self.direction(side), kind, detail, offset))

    def not_iwarp(self, half: _Half, why: str, both: bool = False) -> None:
        """Stop decoding ``half`` (and its peer when ``both``): not MPA traffic."""
        for h in (half, self.halves[1 - half.side]) if both else (half,):
            h.mode = "dead"
            h.info.undecoded_bytes += h.buffered
            h._drop_all()
        if self.info.state in ("start", "midstream") and not any(self._synced):
            self.info.state = "not_iwarp"
        self.note(half.side, self.last_frame, "not_iwarp", f"not iWARP: {why}", half.base)

    def midstream(self, half: _Half) -> None:
        if self.info.state == "start":
            self.info.state = "midstream"

    # ---- startup --------------------------------------------------------------------
    def startup_frame(
        self,
        half: _Half,
        is_reply: bool,
        raw: bytes,
        offset: int,
        flags: int,
        rev: int,
        pd_len: int,
        frame: int,
        ts: float,
    ) -> None:
        side = half.side
        findings: list[Finding] = []
        pd = bytes(raw[MPA_FRAME_HEADER_LEN:])
        decoded: tuple[MpaFrame, int] | None = None
        try:
            decoded = decode_frame(raw, max_private_data=0xFFFF)
        except MpaError as exc:
            findings.append(Finding(exc.rule, exc.detail, exc.term))
        if decoded is not None:
            mpa = decoded[0]
        else:  # malformed or cut short: show the fields as sent
            mpa = MpaFrame(
                reply=is_reply,
                markers=bool(flags & MpaFlag.MARKERS),
                crc=bool(flags & MpaFlag.CRC),
                reject=bool(flags & MpaFlag.REJECT),
                rev=rev,
                ird_ord=None,
                private_data=pd,
                reserved=flags & (MpaFlag.ENHANCED | MPA_RESERVED_MASK),
            )
        ird_ord = mpa.ird_ord
        enhanced = mpa.enhanced
        word = _U32.unpack_from(pd)[0] if enhanced else 0
        # --- MPA-18..26, ERC checks
        if pd_len > self.opts.max_private_data:
            findings.append(
                Finding(
                    "MPA-21",
                    f"PD_Length {pd_len} exceeds {self.opts.max_private_data}",
                    TERM_LLP_INVALID_STARTUP,
                )
            )
        if len(pd) < pd_len:
            findings.append(
                Finding(
                    "MPA-21",
                    f"PD_Length {pd_len} but only {len(pd)} bytes follow",
                    TERM_LLP_INVALID_STARTUP,
                )
            )
        if rev not in (MPA_REV_RDMAC, MPA_REV_1, MPA_REV_2):
            findings.append(Finding("MPA-20", f"unknown MPA revision {rev}"))
        if flags & MpaFlag.ENHANCED and rev < MPA_REV_2:
            findings.append(Finding("ERC-01", f"S bit set in a Rev {rev} frame (not enhanced)"))
        if ird_ord is not None and not ird_ord.p2p and ird_ord.rtr:
            findings.append(Finding("ERC-07", "RTR bits set without peer-to-peer (A=0)"))
        if flags & MpaFlag.SIW_GSO:
            findings.append(Finding("MPA-19", "reserved flag 0x08 set (siw's GSO bit)", None))
        if not is_reply:
            if self.initiator is not None and self.initiator != side:
                findings.append(
                    Finding("MPA-26", "MPA Request from both sides (initiator/initiator)")
                )
            if mpa.reject:
                findings.append(Finding("MPA-19", "R set in an MPA Request"))
            if self.request is None:
                self.initiator = side
                self.request = mpa
                self.request_word = word
                self.info.rev = rev
                self.info.enhanced = enhanced
            half.sent_request = True
            self._emit_startup(
                half, mpa, "mpa_req", raw, offset, flags, rev, pd_len, pd, findings, frame, ts
            )
            half.mode = "hold"
            half.need = 1 << 62
            half.seq_start = half.base
            return
        # a Reply
        if self.request is None or self.initiator == side:
            what = "MPA Reply without a Request from the other side"
            findings.append(Finding("MPA-18", what, TERM_LLP_INVALID_STARTUP))
            if self.initiator is None:
                self.initiator = 1 - side
        else:
            req = self.request
            if req.enhanced != enhanced:
                findings.append(
                    Finding("ERC-11", "Reply enhanced format does not follow the Request's S bit")
                )
            if req.ird_ord is not None and ird_ord is not None:
                if req.ird_ord.p2p != ird_ord.p2p:
                    findings.append(Finding("ERC-08", "Reply does not echo the P2P bit (A)"))
                if ird_ord.p2p and not ird_ord.rtr and not mpa.reject:
                    findings.append(Finding("ERC-08", "P2P Reply signals no RTR type"))
                if (
                    req.ird_ord.ird != MPA_V2_NO_NEGOTIATION
                    and ird_ord.ord != MPA_V2_NO_NEGOTIATION
                    and ird_ord.ord > req.ird_ord.ird
                    and not mpa.reject
                ):
                    findings.append(
                        Finding(
                            "ERC-04",
                            f"responder ORD {ird_ord.ord} exceeds initiator IRD {req.ird_ord.ird}",
                        )
                    )
        self.reply = mpa
        self.reply_word = word
        self._emit_startup(
            half, mpa, "mpa_rep", raw, offset, flags, rev, pd_len, pd, findings, frame, ts
        )
        req = self.request
        ini = self.halves[self.initiator] if self.initiator is not None else self.halves[1 - side]
        if mpa.reject:
            self.info.state = "rejected"
            for h in (half, ini):
                h.mode = "dead"
                h.info.undecoded_bytes += h.buffered
                h._drop_all()
            self.note(side, frame, "rejected", "connection rejected (R=1); MPA ends here")
            return
        crc = (
            self.opts.crc
            if self.opts.crc is not None
            else (mpa.crc or (req.crc if req is not None else False))
        )
        self.info.state = "fpdu"
        if req is not None and req.ird_ord is not None and ird_ord is not None:
            self.info.p2p = req.ird_ord.p2p and ird_ord.p2p
            self.info.rtr = req.ird_ord.rtr & ird_ord.rtr if self.info.p2p else RtrType.NONE
        # r2i markers were requested by the initiator (Request M); i2r by the responder (Reply M)
        half.enter_fpdu(crc, req.markers if req is not None else False)
        self._synced[side] = True
        if ini is not half and ini.mode in ("hold", "start"):
            held_base = ini.seq_start if ini.mode == "hold" else ini.base
            ini.mode = "fpdu"
            ini.crc = crc
            ini.markers = mpa.markers
            ini.seq_start = held_base
            ini.aligned = True
            ini.info.crc = crc
            ini.info.markers = mpa.markers
            ini.info.seq_start = held_base
            ini.seq.known = True
            ini.need = 2
            self._synced[ini.side] = True
            if ini.buffered:
                ini.run(False)

    def _emit_startup(
        self,
        half: _Half,
        mpa: MpaFrame,
        kind: str,
        raw: bytes,
        offset: int,
        flags: int,
        rev: int,
        pd_len: int,
        pd: bytes,
        findings: list[Finding],
        frame: int,
        ts: float,
    ) -> None:
        side = half.side
        rec = PduRecord(
            self.stream,
            frame,
            ts,
            self.direction(side),
            self.names[side],
            self.names[1 - side],
            kind,
            offset,
            len(raw),
            findings,
            mpa=mpa,
            mpa_flags=flags,
            rev=rev,
            pd_len=pd_len,
            private_data=pd,
        )
        half.info.pdus += 1
        half.info.wire_bytes += len(raw)
        self.last_frame = max(self.last_frame, frame)
        self.emit(rec)

    # ---- FPDUs ----------------------------------------------------------------------
    def fpdu(
        self,
        half: _Half,
        offset: int,
        wire: int,
        ulen: int,
        crc_ok: bool | None,
        crc_field: int,
        crc_value: int,
        pad: bytes,
        buf: memoryview,
        pos: int,
        lead: int,
        marks: list[int],
        ulpdu: bytes | memoryview,
        frame: int,
        ts: float,
    ) -> None:
        side = half.side
        self._synced[side] = True
        pending = self.pending_findings[side]
        findings: list[Finding] = pending[:] if pending else []
        if pending:
            pending.clear()
        if crc_ok is False:
            findings.append(
                Finding(
                    "MPA-12",
                    f"CRC 0x{crc_field:08X} on the wire, computed 0x{crc_value:08X}",
                    TERM_LLP_CRC_ERROR,
                )
            )
        ptrs: tuple[int, ...] = ()
        offsets: tuple[int, ...] = ()
        reserved: tuple[int, ...] = ()
        if marks:
            ptr_list = []
            res_list = []
            for m in marks:
                res, ptr = struct.unpack_from(">HH", buf, pos + m)
                ptr_list.append(ptr)
                res_list.append(res)
                want = 0 if (m == 0 and lead) else m - lead
                if res:
                    findings.append(Finding("MPA-06", f"marker RESERVED 0x{res:04X} is not 0"))
                if ptr & 3:
                    findings.append(Finding("MPA-06", f"FPDUPTR 0x{ptr:04X} has low bits set"))
                if ptr & MPA_FPDUPTR_MASK != want:
                    findings.append(
                        Finding(
                            "MPA-08",
                            f"marker at offset {offset + m} has FPDUPTR {ptr}, expected {want}",
                            TERM_LLP_MARKER_MISMATCH,
                        )
                    )
            ptrs = tuple(ptr_list)
            reserved = tuple(res_list)
            offsets = tuple(offset + m for m in marks)
        if pad and any(pad):
            findings.append(Finding("MPA-04", f"PAD bytes {pad.hex()} are not zero"))
        if ulen > MULPDU_MAX:
            findings.append(Finding("MPA-02", f"ULPDU_Length {ulen} exceeds {MULPDU_MAX}"))
        segment: SegmentView | None
        try:
            segment = SegmentView(ulpdu, self.rfc7306, self.siw_layout)
        except ProtocolError as exc:
            segment = None
            findings.append(Finding(exc.rule, exc.detail, exc.term))
        seq = half.seq
        if segment is not None:
            if segment.findings:
                findings.extend(segment.findings)
            seq.check(segment, findings, self.halves[1 - side].seq)
            if self.first_fpdu_frame[side] is None:
                self._first_fpdu_checks(side, segment, frame, findings)
            half.info.payload_bytes += len(segment.payload)
        rec = PduRecord(
            self.stream,
            frame,
            ts,
            self.direction(side),
            self.names[side],
            self.names[1 - side],
            "fpdu",
            offset,
            wire,
            findings,
            None,
            0,
            0,
            0,
            b"",
            ulen,
            crc_ok,
            crc_field,
            crc_value,
            pad,
            offsets,
            ptrs,
            reserved,
            segment,
            ulpdu,
        )  # positional: keyword calls cost several times more on this hot path
        info = half.info
        info.pdus += 1
        info.fpdus += 1
        info.wire_bytes += wire
        info.ulpdu_bytes += ulen
        if frame > self.last_frame:
            self.last_frame = frame
        self.emit(rec)

    def _first_fpdu_checks(
        self, side: int, seg: SegmentView, frame: int, findings: list[Finding]
    ) -> None:
        """MPA-25 (responder waits for the initiator's first FPDU) and ERC-09 (RTR)."""
        if self.first_fpdu_frame[side] is not None:
            return
        self.first_fpdu_frame[side] = frame
        if self.request is None or self.reply is None or self.initiator is None:
            return
        if side != self.initiator:
            if self.first_fpdu_frame[self.initiator] is None:
                findings.append(
                    Finding("MPA-25", "responder sent an FPDU before the initiator's first FPDU")
                )
            return
        if not self.info.p2p:
            return
        rtr = self.info.rtr
        op = seg.opcode
        if op == Opcode.TERMINATE and not rtr:
            return  # no RTR in common: a Terminate is the initiator's required answer (ERC-09)
        zero = seg.ulpdu_len - seg.ddp_header_len == 0
        ok = (
            (op == Opcode.SEND and zero and rtr & RtrType.SEND)
            or (op == Opcode.RDMA_WRITE and zero and rtr & RtrType.WRITE)
            or (
                op == Opcode.RDMA_READ_REQUEST
                and isinstance(seg.header, ReadRequest)
                and seg.header.size == 0
                and rtr & RtrType.READ
            )
        )
        if not ok:
            findings.append(
                Finding(
                    "ERC-09",
                    f"first FPDU of a P2P connection is not a negotiated RTR ({rtr!r})",
                    TERM_LLP_NO_MATCHING_RTR,
                )
            )

    # ---- TCP events -----------------------------------------------------------------
    def events(self, side: int, events: list[StreamEvent], ts: float) -> None:
        half = self.halves[side]
        if len(events) == 1 and type(events[0]) is StreamData:  # the common case
            ev = events[0]
            if ev.frame > self.last_frame:
                self.last_frame = ev.frame
            half.push(ev.data, ev.offset, ev.frame, ts)
            return
        for ev in events:
            if type(ev) is StreamData:
                if ev.frame > self.last_frame:
                    self.last_frame = ev.frame
                half.push(ev.data, ev.offset, ev.frame, ts)
            elif type(ev) is Gap:
                half.gap(ev.offset, ev.length, ev.frame)
            elif type(ev) is Retransmission:
                half.info.retransmitted_bytes += ev.length
            elif type(ev) is OverlapConflict:
                half.info.retransmitted_bytes += ev.length
                self.note(
                    side,
                    ev.frame,
                    "conflict",
                    f"retransmitted bytes at offset {ev.offset} (+{ev.length}) differ from the "
                    "first copy (kept)",
                    ev.offset,
                )
            elif type(ev) is StreamEnd:
                half.finish(ev.frame)

    def finish(self, frame: int) -> None:
        for half in self.halves:
            if half.mode == "hold":
                # a Request never answered: its sender's later bytes cannot be framed
                if half.buffered:
                    self.note(
                        half.side,
                        frame,
                        "trailing",
                        f"{half.buffered} bytes after an unanswered MPA Request",
                        half.base,
                    )
                    half.info.undecoded_bytes += half.buffered
                    half._drop_all()
                continue
            half.finish(frame)
        for side in (0, 1):
            info = self.halves[side].info
            info.retransmitted_bytes = max(
                info.retransmitted_bytes, self.tcp.halves[side].retransmitted_bytes
            )
            self.info.directions[self.direction(side)] = info


# ======================================================================================
# The dissector
# ======================================================================================

Output = PduRecord | Note
_Route = tuple[HalfStream, HalfStream, "_Conn", "_Half"]
"""(sender's TCP half, the other TCP half, MPA connection, sender's MPA half)."""


def _frame_of(item: Output) -> int:
    return item.frame


class Dissector:
    """Feed TCP segments in capture order; collect :class:`PduRecord` and :class:`Note`.

    ``feed(segment)`` returns the records completed by that segment; ``finish()``
    flushes the reassembly and returns what the end of the capture completes.
    ``streams()`` lists :class:`StreamInfo` of every connection seen.
    """

    def __init__(self, options: DissectOptions | None = None) -> None:
        self.options = options or DissectOptions()
        self.tcp = TcpReassembler()
        self._routes: dict[
            tuple[str, int, str, int], tuple[HalfStream, HalfStream, _Conn, _Half]
        ] = {}
        self._conns: dict[int, _Conn] = {}
        self._out: list[Output] = []
        self.searching: set[_Half] = set()
        self._held = False
        self.last_frame = 0
        self.last_ts = 0.0

    def _emit(self, item: Output) -> None:
        self._out.append(item)

    def _conn(self, tcp_conn: Connection) -> _Conn:
        conn = tcp_conn.user
        if conn is None:
            conn = self._conns[tcp_conn.stream] = _Conn(self, tcp_conn)
            tcp_conn.user = conn
        assert isinstance(conn, _Conn)
        return conn

    def feed(self, segment: TcpSegment) -> list[Output]:
        frame = self.last_frame = segment.frame
        ts = self.last_ts = segment.timestamp
        flags = segment.flags
        if not flags & _TCP_SPECIAL and not segment.missing:
            # bulk path: the next in-order bytes of a known connection, straight to MPA
            # (the same steps as TcpReassembler.feed's fast path, without event objects)
            route = self._routes.get((segment.src, segment.sport, segment.dst, segment.dport))
            if route is not None:
                half, other, conn, mpa_half = route
                base_seq = half.base_seq
                if (
                    base_seq is not None
                    and half.fin_offset is None
                    and not half._pending
                    and not other._pending
                ):
                    nxt = half.next_offset
                    if segment.seq == (base_seq + nxt) & 0xFFFFFFFF:
                        payload = segment.payload
                        size = len(payload)
                        if size:
                            half.next_offset = nxt + size
                            half.delivered_bytes += size
                            half._recent.append((nxt, payload))
                            if frame > conn.last_frame:
                                conn.last_frame = frame
                            if mpa_half.mode == "fpdu" and not mpa_half.chunks and mpa_half.bulk:
                                mpa_half.walk_plain(payload, nxt, frame, ts)
                            else:
                                mpa_half.push(payload, nxt, frame, ts)
                            out = self._out
                            if not out:
                                return []
                            if self.searching:
                                self._held = True
                                return []
                            return self._release()
                        return []
        tcp_conn, side, events = self.tcp.feed(segment)
        conn = tcp_conn.user or self._conn(tcp_conn)
        assert isinstance(conn, _Conn)
        # the route the bulk path takes for this direction from now on
        self._routes[(segment.src, segment.sport, segment.dst, segment.dport)] = (
            tcp_conn.halves[side],
            tcp_conn.halves[1 - side],
            conn,
            conn.halves[side],
        )
        if events:
            conn.events(side, events, segment.timestamp)
        deferred = self.tcp.deferred
        if deferred:
            for other_conn, other_side, other_events in deferred:
                self._conn(other_conn).events(other_side, other_events, ts)
            deferred.clear()
        out = self._out
        if not out:
            return []
        if self.searching:  # a direction is still looking for FPDUs: hold the output
            self._held = True
            return []
        return self._release()

    def _release(self) -> list[Output]:
        items = self._out[:]
        self._out.clear()
        if self._held:  # held output from several directions: back into capture order
            self._held = False
            items.sort(key=_frame_of)
        return items

    def finish(self) -> list[Output]:
        for tcp_conn, side, events in self.tcp.flush(self.last_frame):
            self._conn(tcp_conn).events(side, events, self.last_ts)
        for conn in self._conns.values():
            conn.finish(self.last_frame)
        self.searching.clear()
        return self._release()

    def streams(self) -> list[StreamInfo]:
        return [self._conns[k].info for k in sorted(self._conns)]


def dissect(
    segments: Iterable[TcpSegment], options: DissectOptions | None = None
) -> Iterator[Output]:
    """Decode TCP segments into records and notes, in capture order."""
    dissector = Dissector(options)
    for segment in segments:
        out = dissector.feed(segment)
        if out:
            yield from out
    yield from dissector.finish()
