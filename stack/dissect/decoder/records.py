"""What the capture decoder produces: PDU records, notes, stream facts, segment views."""

from __future__ import annotations

from dataclasses import dataclass, field

from stack.constants import (
    DDP_DV_MASK,
    DDP_RSVD_MASK,
    DDP_TAGGED_HDR_LEN,
    DDP_UNTAGGED_HDR_LEN,
    MPA_MAX_PRIVATE_DATA,
    OPCODE_NAMES,
    RDMAP_OPCODE_MASK,
    RDMAP_RSVD_MASK,
    RtrType,
)
from stack.dissect.decoder.common import (
    _CTRL_TAGGED_LAST,
    _CTRL_UNTAGGED_LAST,
    _FAST_INVALIDATE_OPS,
    _FAST_SEND_OPS,
    _FAST_TAGGED,
    _FAST_TAGGED_OPS,
    _FAST_UNTAGGED,
    _TAGGED_UNPACK,
    _UNTAGGED_UNPACK,
)
from stack.wire import ddp
from stack.wire.checker import Checker, Finding
from stack.wire.events import (
    MpaFrame,
)
from stack.wire.rdmap import RdmapHeader, Segment, check_ddp, check_rdmap

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
        return rule_ids(self.findings)


def rule_ids(findings: list[Finding] | tuple[Finding, ...]) -> list[str]:
    """The rule IDs of ``findings``, in order, without repeats."""
    return list(dict.fromkeys(f.rule for f in findings))


Route = tuple[int, str, str, str]
"""(stream, direction, src, dst) of one direction: the same tuple for all its FPDUs."""

BriefFpdu = tuple[
    int,  # frame completing the FPDU
    float,  # its timestamp
    Route,
    int,  # RDMAP opcode
    bool,  # tagged
    int | None,  # tagged: STag; untagged: QN
    int | None,  # tagged: TO; untagged: MSN
    int | None,  # untagged: MO (tagged: None)
    "int | tuple[int, int, int, int, int] | None",  # untagged: Invalidate STag, or a Read
    # Request's header (sink STag, sink TO, size, source STag, source TO); tagged: None
    int,  # DDP payload length (after the RDMAP header)
    bool,  # L (last)
    bool | None,  # CRC good (True), or None when CRC is off
    int,  # markers in the FPDU
    "bytes | memoryview | None",  # a Send: the DDP payload (otherwise None)
    int,  # the FPDU's length on the wire (markers included)
]
"""A clean FPDU as ``Dissector(brief=True)`` yields it, instead of a :class:`PduRecord`:
a canonical DDP/RDMAP header (RFC 5041 §4, RFC 5040 §4: RDMA Write, Read Response or a
Send-family message on QN 0; on the fused path also a Read Request, RFC 5040 §4.4), CRC
good or off, markers as expected, PAD zero, and no finding of any stateful check.
Everything the one-line summary shows, and nothing else."""

BriefText = tuple[int, str]
"""(frame, summary line): a :data:`BriefFpdu` the fused path printed itself, when the
decoder was given the printer's :class:`~stack.dissect.text.BriefLines`."""


@dataclass(frozen=True, slots=True)
class Note:
    """Something about a stream that is not a PDU.

    Fields: stream, frame, direction, kind ('gap', 'resync', 'lost_sync', 'not_iwarp',
    'trailing', 'conflict', 'rejected', 'midstream', 'no_reply', 'after_end'), detail,
    offset.
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

    tagged: bool
    last: bool
    ddp_version: int
    rdmap_version: int
    opcode: int
    ddp_rsvd: int
    rdmap_rsvd: int
    stag: int | None
    to: int | None
    qn: int | None
    msn: int | None
    mo: int | None
    inval_stag: int | None
    header: RdmapHeader | None
    payload: memoryview
    ulpdu_len: int
    findings: tuple[Finding, ...]

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
        self.tagged = f.tagged
        self.last = f.last
        self.ddp_version = ctrl & DDP_DV_MASK
        self.rdmap_version = f.ulp_ctrl >> 6
        self.opcode = op
        self.ddp_rsvd = ctrl & DDP_RSVD_MASK
        self.rdmap_rsvd = f.ulp_ctrl & RDMAP_RSVD_MASK
        self.stag = f.stag
        self.to = f.to
        self.qn = f.qn
        self.msn = f.msn
        self.mo = f.mo
        self.inval_stag = f.inval_stag
        self.header = header
        self.payload = payload
        self.ulpdu_len = len(view)
        self.findings = tuple(chk.findings) if chk.findings else ()

    @property
    def opcode_name(self) -> str:
        return OPCODE_NAMES.get(self.opcode, f"Unknown opcode 0x{self.opcode:X}")

    @property
    def ddp_header_len(self) -> int:
        return DDP_TAGGED_HDR_LEN if self.tagged else DDP_UNTAGGED_HDR_LEN

    def to_segment(self) -> Segment:
        """The equivalent :class:`stack.wire.rdmap.Segment`."""
        return Segment(*(getattr(self, name) for name in self.__slots__))
