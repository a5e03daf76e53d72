"""RDMAP messages on DDP segments (RFC 5040 §4, RFC 7306 §4-6), sans-IO.

Three entry points:

* :func:`encode_message` turns any message of :mod:`stack.wire.events` into its ULPDUs
  (DDP segments no larger than MULPDU), byte-exact to the RFCs' layouts (tests hold them to
  worked examples).
* :func:`decode_ulpdu` turns one ULPDU into a :class:`Segment` with every field of the
  DDP and RDMAP headers.  ``strict=True`` (the default) raises the first violation as a
  :class:`~stack.errors.ProtocolError` carrying its rule ID and Terminate cause;
  ``strict=False`` decodes as much as it can and lists the violations in
  :attr:`Segment.findings` (for the capture dissector, one call per FPDU).
* :func:`build_terminate` builds the Terminate that reports an error about an offending
  ULPDU, following RFC 5040 Fig. 10 (:func:`terminate_headers`) and §7.1.

Stateless checks live here (versions, opcodes, queue numbers, header lengths).  The
per-queue MSN/MO sequence checks need state and live in :mod:`stack.wire.stream`, which
calls :func:`check_ddp` and :func:`check_rdmap` with its own checks in between, so errors
are found in RFC layer order: DDP first (DV, header, QN, then MSN and MO), then RDMAP (RV,
opcode, T bit, queue, RDMAP header).

Check order and Terminate causes (raise order in strict mode):

====================================================  =======  ===========================
condition                                             rule     Terminate
====================================================  =======  ===========================
empty ULPDU / shorter than its DDP header (14 or 18)  DDP-01   1/0/0x00 (no RFC code)
DV != 1                                               DDP-03   1/1/0x04 or 1/2/0x06
QN not 0-2 (0-3 with RFC 7306)                        DDP-10   1/2/0x01
RV != 1                                               RDMAP-02 0/2/0x05
opcode 0xC-0xF                                        RDMAP-16 0/2/0x06
opcode 0x8-0xB without RFC 7306                       EXT-01   0/2/0x06
T bit disagrees with the opcode                       RDMAP-02 0/2/0x06
QN disagrees with the opcode                          RDMAP-01 1/2/0x01
single-segment message with L=0 or MO != 0            per op   0/2/0xFF, 1/2/0x04
RDMAP header truncated                                per op   0/2/0xFF
RDMAP header followed by extra bytes                  per op   1/2/0x05
Immediate Data not exactly 8 bytes                    EXT-09   0/2/0xFF
====================================================  =======  ===========================

Non-fatal findings (never raised, listed in ``findings`` in both modes): reserved DDP or
RDMAP control bits set (DDP-03, RDMAP-02), an Invalidate STag on an opcode other than
0x4/0x6 (RDMAP-03), reserved AOpCode bits (EXT-02), a Terminate in siw's swapped layout
or with missing or extra bytes (RDMAP-11).

Linux siw's Terminate: on little-endian hosts siw's bitfield swaps the
Layer and EType nibbles of byte 0 and stores M/D/R in bits 0x01/0x02/0x04 of byte 2, so
layer 1 / etype 2 / code 3 with M=D=1 arrives as ``21 03 03 00`` instead of ``12 03 c0
00``.  Detection, in order: (1) caller's hint ``siw_layout`` when not None; (2) byte 2
has bits in 0x07 and none in 0xF8 -> siw (an RFC sender keeps 0x1F zero); (3) byte 2 has
bits in 0xE0 only -> RFC; (4) otherwise (no flags at all) the RFC reading is kept unless
its (layer, etype) pair does not exist while the swapped pair does (``21 ..`` reads as
the impossible LLP/etype 1 but as DDP/untagged when swapped).  Byte 0 alone cannot tell
``20 06 00 00`` (RFC: LLP 2/0/6; siw: RDMAP 0/2/6) apart, so a connection known to face
siw should pass ``siw_layout=True``.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from stack.constants import (
    ATOMIC_OPCODE_MASK,
    ATOMIC_REQUEST_HDR_LEN,
    ATOMIC_RESPONSE_HDR_LEN,
    DDP_DV_MASK,
    DDP_LAST,
    DDP_RSVD_MASK,
    DDP_TAGGED,
    DDP_TAGGED_HDR_LEN,
    DDP_UNTAGGED_HDR_LEN,
    DDP_VERSION,
    IMMEDIATE_DATA_LEN,
    INVALIDATE_OPCODES,
    MULPDU_MAX,
    MULPDU_MIN,
    OPCODE_NAMES,
    OPCODE_QN,
    RDMAP_OPCODE_MASK,
    RDMAP_RSVD_MASK,
    RDMAP_RV_MASK,
    RDMAP_VERSION,
    READ_REQUEST_HDR_LEN,
    RFC7306_OPCODES,
    TAGGED_OPCODES,
    TERM_CODE_MASK,
    TERM_DDP_CATASTROPHIC,
    TERM_DDP_U_INVALID_MO,
    TERM_DDP_U_INVALID_QN,
    TERM_DDP_U_TOO_LONG,
    TERM_ETYPE_MASK,
    TERM_ETYPE_NAMES,
    TERM_FLAG_D,
    TERM_FLAG_M,
    TERM_FLAG_R,
    TERM_LAYER_MASK,
    TERM_RDMAP_CATASTROPHIC,
    TERM_RDMAP_INVALID_VERSION,
    TERM_RDMAP_OP_UNSPECIFIED,
    TERM_RDMAP_UNEXPECTED_OPCODE,
    TERM_RSVD_MASK,
    TERMINATE_CTRL_LEN,
    TERMINATE_SEG_LEN_LEN,
    Opcode,
    QueueNumber,
    RdmapEType,
    TermCode,
    TermLayer,
)
from stack.errors import DdpError, DecodeError, LocalError, ProtocolError, RdmapError
from stack.wire import ddp
from stack.wire.events import (
    AtomicRequest,
    AtomicResponse,
    Data,
    ImmediateData,
    RdmapMessage,
    RdmaWrite,
    ReadRequest,
    ReadResponse,
    Send,
    Terminate,
)

RdmapHeader = ReadRequest | AtomicRequest | AtomicResponse | Terminate | ImmediateData
"""What :attr:`Segment.header` holds for messages with an RDMAP header."""

READ_REQUEST = struct.Struct(">IQIIQ")
"""Sink STag, Sink TO, Read Message Size, Source STag, Source TO (RFC 5040 §4.4)."""
ATOMIC_REQUEST = struct.Struct(">IIIQQQQQ")
"""AOpCode word, Request ID, STag, TO, Add/Swap Data, Add/Swap Mask, Compare Data, Compare
Mask (RFC 7306 §5.2.1)."""
ATOMIC_RESPONSE = struct.Struct(">IQ")
"""Original Request ID, Original Remote Data Value (RFC 7306 §5.2.2)."""
TERMINATE_CTRL = struct.Struct(">I")
TERMINATE_SEG_LEN = struct.Struct(">H")

assert READ_REQUEST.size == READ_REQUEST_HDR_LEN
assert ATOMIC_REQUEST.size == ATOMIC_REQUEST_HDR_LEN
assert ATOMIC_RESPONSE.size == ATOMIC_RESPONSE_HDR_LEN

TERMINATE_MAX_BODY = (
    TERMINATE_CTRL_LEN + TERMINATE_SEG_LEN_LEN + DDP_UNTAGGED_HDR_LEN + READ_REQUEST_HDR_LEN
)
"""Longest Terminate RDMAP body: control, segment length, 18-byte DDP and 28-byte RDMA header."""

_MASK32 = 0xFFFFFFFF
_MASK64 = (1 << 64) - 1
_RV_BITS = RDMAP_VERSION << 6
_QNS_5040 = frozenset(int(q) for q in QueueNumber if q != QueueNumber.ATOMIC_RESPONSE)
_QNS_7306 = frozenset(int(q) for q in QueueNumber)
_OPS_5040 = frozenset(int(op) for op in Opcode if op not in RFC7306_OPCODES)
_OPS_7306 = frozenset(int(op) for op in Opcode)
_TAGGED_OPS = frozenset(int(op) for op in TAGGED_OPCODES)
_UNSPEC = TERM_RDMAP_OP_UNSPECIFIED
_INVALIDATE_OPS = frozenset(int(op) for op in INVALIDATE_OPCODES)

# Fixed-size RDMAP messages: opcode -> (rule, exact RDMAP header length or None for the
# variable-length Terminate).  They never span segments: L=1 and MO=0.
_SINGLE_SEGMENT: dict[int, tuple[str, int | None]] = {
    Opcode.RDMA_READ_REQUEST: ("RDMAP-04", READ_REQUEST_HDR_LEN),
    Opcode.TERMINATE: ("RDMAP-11", None),
    Opcode.IMMEDIATE_DATA: ("EXT-09", IMMEDIATE_DATA_LEN),
    Opcode.IMMEDIATE_DATA_SE: ("EXT-09", IMMEDIATE_DATA_LEN),
    Opcode.ATOMIC_REQUEST: ("EXT-02", ATOMIC_REQUEST_HDR_LEN),
    Opcode.ATOMIC_RESPONSE: ("EXT-03", ATOMIC_RESPONSE_HDR_LEN),
}

# ======================================================================================
# Decoded form
# ======================================================================================


@dataclass(frozen=True, slots=True)
class Finding:
    """A rule violation or deviation seen while decoding.

    Fields: rule (rule ID, :mod:`stack.rules`), detail, term (the Terminate cause it maps to,
    None for deviations that need none), fatal (True: strict decoding raises it; False: noted only).
    """

    rule: str
    detail: str
    term: TermCode | None = None
    fatal: bool = True

    @classmethod
    def of(cls, error: ProtocolError) -> Finding:
        return cls(error.rule, error.detail, error.term, True)


@dataclass(frozen=True, slots=True)
class Segment:
    """One fully decoded ULPDU (a DDP segment with its RDMAP control byte).

    Fields: tagged, last (DDP T and L), ddp_version, rdmap_version, opcode (int, possibly
    unknown), ddp_rsvd (the 0x3C control bits), rdmap_rsvd (the 0x30 bits); stag, to
    (tagged, else None); qn, msn, mo, inval_stag (untagged, else None; inval_stag is the raw
    RsvdULP[8:39] whatever the opcode); header (the decoded RDMAP header, None for Write,
    Read Response, Send, or when it could not be decoded); payload (bytes after the DDP and
    RDMAP headers, a view into the input); ulpdu_len; findings (lenient-mode violations and
    non-fatal deviations).
    """

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
    findings: tuple[Finding, ...] = ()

    @property
    def opcode_name(self) -> str:
        return OPCODE_NAMES.get(self.opcode, f"Unknown opcode 0x{self.opcode:X}")

    @property
    def ddp_header_len(self) -> int:
        return DDP_TAGGED_HDR_LEN if self.tagged else DDP_UNTAGGED_HDR_LEN


# ======================================================================================
# Staged validation (shared by decode_ulpdu and RdmapStream)
# ======================================================================================


class Checker:
    """Collects findings; in strict mode a fatal one is raised at once.

    Fields: strict, findings (list of :class:`Finding`).
    """

    __slots__ = ("strict", "findings")

    def __init__(self, strict: bool = True) -> None:
        self.strict = strict
        self.findings: list[Finding] = []

    def fail(self, error: ProtocolError) -> None:
        """A fatal violation: raise it (strict) or record it (lenient)."""
        if self.strict:
            raise error
        self.findings.append(Finding.of(error))

    def note(self, rule: str, detail: str) -> None:
        """A non-fatal deviation: always recorded, never raised."""
        self.findings.append(Finding(rule, detail, None, False))


class DdpFields:
    """The raw DDP header fields of a ULPDU (stage 1 of decoding; filled in two steps).

    Fields: view, ctrl, ulp_ctrl (RDMAP control byte), tagged, last, stag, to, qn, msn, mo,
    inval_stag, hlen (DDP header length).
    """

    __slots__ = (
        "view",
        "ctrl",
        "ulp_ctrl",
        "tagged",
        "last",
        "stag",
        "to",
        "qn",
        "msn",
        "mo",
        "inval_stag",
        "hlen",
    )

    def __init__(self, view: memoryview) -> None:
        self.view = view
        n = len(view)
        if n < 2:
            raise DecodeError(
                "DDP-01", f"ULPDU of {n} bytes has no DDP/RDMAP control", TERM_DDP_CATASTROPHIC
            )
        ctrl = view[0]
        self.ctrl = ctrl
        self.tagged = bool(ctrl & DDP_TAGGED)
        self.last = bool(ctrl & DDP_LAST)
        self.ulp_ctrl = view[1]
        self.stag = self.to = self.qn = self.msn = self.mo = self.inval_stag = None
        self.hlen = DDP_TAGGED_HDR_LEN if self.tagged else DDP_UNTAGGED_HDR_LEN

    def unpack(self) -> None:
        """Read the rest of the DDP header (the caller has checked the length)."""
        if self.tagged:
            _, _, self.stag, self.to = ddp.TAGGED_HDR.unpack_from(self.view)
        else:
            _, _, self.inval_stag, self.qn, self.msn, self.mo = ddp.UNTAGGED_HDR.unpack_from(
                self.view
            )


def check_ddp(view: memoryview, chk: Checker, rfc7306: bool) -> DdpFields:
    """Stage 1: DDP version, header length and QN (RFC 5041 §7; DDP-01, DDP-03, DDP-10).

    A ULPDU shorter than its DDP header raises :class:`DecodeError` even in lenient mode:
    there is no segment to describe.
    """
    f = DdpFields(view)
    if f.ctrl & DDP_DV_MASK != DDP_VERSION:
        chk.fail(ddp.version_error(f.ctrl))
    if len(view) < f.hlen:
        kind = "tagged" if f.tagged else "untagged"
        raise DecodeError(
            "DDP-01",
            f"ULPDU of {len(view)} bytes is shorter than a {kind} DDP header",
            TERM_DDP_CATASTROPHIC,
        )
    f.unpack()
    if f.ctrl & DDP_RSVD_MASK:
        chk.note("DDP-03", f"reserved DDP control bits 0x{f.ctrl & DDP_RSVD_MASK:02X} set")
    if not f.tagged and f.qn not in (_QNS_7306 if rfc7306 else _QNS_5040):
        chk.fail(DdpError("DDP-10", f"invalid queue number {f.qn}", TERM_DDP_U_INVALID_QN))
    return f


def check_rdmap(
    f: DdpFields, chk: Checker, rfc7306: bool, siw_layout: bool | None = None
) -> tuple[int, RdmapHeader | None, memoryview]:
    """Stage 2: RDMAP version, opcode, T bit, QN/opcode match and RDMAP header (§7.2).

    Returns ``(opcode, header, payload)``.
    """
    uc = f.ulp_ctrl
    op = uc & RDMAP_OPCODE_MASK
    view = f.view
    if uc & RDMAP_RV_MASK != _RV_BITS:
        chk.fail(
            RdmapError(
                "RDMAP-02",
                f"RDMAP version {uc >> 6}, expected {RDMAP_VERSION}",
                TERM_RDMAP_INVALID_VERSION,
            )
        )
    if uc & RDMAP_RSVD_MASK:
        chk.note("RDMAP-02", f"reserved RDMAP control bits 0x{uc & RDMAP_RSVD_MASK:02X} set")
    known = op in (_OPS_7306 if rfc7306 else _OPS_5040)
    if not known:
        rule = "EXT-01" if op in _OPS_7306 else "RDMAP-16"
        what = "needs RFC 7306" if op in _OPS_7306 else "is not assigned"
        chk.fail(RdmapError(rule, f"opcode 0x{op:X} {what}", TERM_RDMAP_UNEXPECTED_OPCODE))
    elif (op in _TAGGED_OPS) != f.tagged:
        model = "tagged" if f.tagged else "untagged"
        chk.fail(
            RdmapError(
                "RDMAP-02",
                f"{OPCODE_NAMES[op]} arrived in a {model} segment",
                TERM_RDMAP_UNEXPECTED_OPCODE,
            )
        )
    body = view[f.hlen :]
    if f.tagged or op not in _OPS_7306:
        return op, None, body
    want_qn = OPCODE_QN.get(op)
    if want_qn is not None and f.qn != want_qn and f.qn in _QNS_7306:
        chk.fail(
            DdpError(
                "RDMAP-01",
                f"{OPCODE_NAMES[op]} on QN {f.qn}, expected QN {want_qn}",
                TERM_DDP_U_INVALID_QN,
            )
        )
    if f.inval_stag and op not in _INVALIDATE_OPS:
        chk.note("RDMAP-03", f"Invalidate STag 0x{f.inval_stag:08X} on {OPCODE_NAMES[op]}")
    single = _SINGLE_SEGMENT.get(op)
    if single is None:
        return op, None, body
    rule, size = single
    if not f.last:
        chk.fail(RdmapError(rule, f"{OPCODE_NAMES[op]} without L (must be one segment)", _UNSPEC))
    if f.mo:
        chk.fail(DdpError(rule, f"{OPCODE_NAMES[op]} with MO {f.mo}", TERM_DDP_U_INVALID_MO))
    if size is None:
        if len(body) < TERMINATE_CTRL_LEN:
            what = f"Terminate header of {len(body)} bytes, needs {TERMINATE_CTRL_LEN}"
            chk.fail(DecodeError(rule, what, _UNSPEC))
            return op, None, body
        term, used = _decode_terminate(body, siw_layout, chk)
        return op, term, body[used:]
    n = len(body)
    if n != size:
        what = f"{OPCODE_NAMES[op]} RDMAP header of {n} bytes, expected {size}"
        if op in (Opcode.IMMEDIATE_DATA, Opcode.IMMEDIATE_DATA_SE):
            chk.fail(RdmapError(rule, what, _UNSPEC))
        elif n < size:
            chk.fail(DecodeError(rule, what, _UNSPEC))
            return op, None, body
        else:
            chk.fail(DdpError(rule, what, TERM_DDP_U_TOO_LONG))
        if n < size:
            return op, None, body
    return op, _decode_fixed_header(op, body, chk), body[size:]


def _decode_fixed_header(op: int, body: memoryview, chk: Checker) -> RdmapHeader:
    if op == Opcode.RDMA_READ_REQUEST:
        return ReadRequest(*READ_REQUEST.unpack_from(body))
    if op == Opcode.ATOMIC_REQUEST:
        word, *rest = ATOMIC_REQUEST.unpack_from(body)
        if word & ~ATOMIC_OPCODE_MASK:
            chk.note("EXT-02", f"reserved AOpCode bits 0x{word & ~ATOMIC_OPCODE_MASK:08X} set")
        return AtomicRequest(word & ATOMIC_OPCODE_MASK, *rest)
    if op == Opcode.ATOMIC_RESPONSE:
        return AtomicResponse(*ATOMIC_RESPONSE.unpack_from(body))
    return ImmediateData(bytes(body[:IMMEDIATE_DATA_LEN]), op == Opcode.IMMEDIATE_DATA_SE)


def decode_ulpdu(
    ulpdu: Data,
    *,
    strict: bool = True,
    rfc7306: bool = True,
    siw_layout: bool | None = None,
) -> Segment:
    """Decode one ULPDU (DDP segment) completely (RFC 5041 §4, RFC 5040 §4, RFC 7306 §4).

    ``strict``: raise the first violation (:class:`DecodeError`, :class:`DdpError` or
    :class:`RdmapError` with rule ID and Terminate cause).  ``strict=False``: record
    violations in :attr:`Segment.findings` and keep decoding; only a ULPDU too short for
    its DDP header still raises :class:`DecodeError`.  ``rfc7306``: accept opcodes 0x8-0xB
    and QN 3.  ``siw_layout``: how to read a Terminate's control word (module docstring).
    MSN/MO sequencing is not checked here (it needs state: :class:`RdmapStream`).
    """
    view = ddp.byte_view(ulpdu)
    chk = Checker(strict)
    f = check_ddp(view, chk, rfc7306)
    op, header, payload = check_rdmap(f, chk, rfc7306, siw_layout)
    return Segment(
        tagged=f.tagged,
        last=f.last,
        ddp_version=f.ctrl & DDP_DV_MASK,
        rdmap_version=f.ulp_ctrl >> 6,
        opcode=op,
        ddp_rsvd=f.ctrl & DDP_RSVD_MASK,
        rdmap_rsvd=f.ulp_ctrl & RDMAP_RSVD_MASK,
        stag=f.stag,
        to=f.to,
        qn=f.qn,
        msn=f.msn,
        mo=f.mo,
        inval_stag=f.inval_stag,
        header=header,
        payload=payload,
        ulpdu_len=len(view),
        findings=tuple(chk.findings),
    )


# ======================================================================================
# Terminate (RFC 5040 §4.8, §7.1)
# ======================================================================================

_VALID_LAYER_ETYPES = frozenset(TERM_ETYPE_NAMES)


def _siw_swapped(b0: int, b2: int, hint: bool | None) -> bool:
    """Whether a Terminate control word uses siw's swapped layout (module docstring)."""
    if hint is not None:
        return hint
    if b2 & 0x07 and not b2 & 0xF8:
        return True
    if b2:
        return False
    rfc_pair = (b0 >> 4, b0 & 0x0F)
    siw_pair = (b0 & 0x0F, b0 >> 4)
    return rfc_pair not in _VALID_LAYER_ETYPES and siw_pair in _VALID_LAYER_ETYPES


def decode_terminate(
    body: Data, *, siw_layout: bool | None = None, checker: Checker | None = None
) -> Terminate:
    """Decode a Terminate's RDMAP header (the bytes after the 18-byte DDP header).

    Bounded by ``len(body)``: a D or R flag whose bytes are missing is accepted (siw sends R
    without the 28-byte block) and noted as an RDMAP-11 deviation in ``checker``.  The
    copied DDP header is 14 or 18 bytes by its own T bit.  Raises :class:`DecodeError`
    only when the 4-byte control word itself is incomplete.
    """
    chk = checker if checker is not None else Checker(strict=False)
    return _decode_terminate(ddp.byte_view(body), siw_layout, chk)[0]


def _decode_terminate(
    view: memoryview, siw_layout: bool | None, chk: Checker
) -> tuple[Terminate, int]:
    """:func:`decode_terminate` plus the number of bytes the Terminate accounted for."""
    n = len(view)
    if n < TERMINATE_CTRL_LEN:
        raise DecodeError(
            "RDMAP-11", f"Terminate header of {n} bytes, needs {TERMINATE_CTRL_LEN}", _UNSPEC
        )
    b0, b2 = view[0], view[2]
    swapped = _siw_swapped(b0, b2, siw_layout)
    if swapped:
        layer, etype, code = b0 & 0x0F, b0 >> 4, view[1]
        m, d, r = bool(b2 & 0x01), bool(b2 & 0x02), bool(b2 & 0x04)
        rsvd = (b2 & 0xF8) | view[3]
        chk.note("RDMAP-11", "Terminate control word in siw's swapped layout")
    else:
        (word,) = TERMINATE_CTRL.unpack_from(view)
        layer = (word & TERM_LAYER_MASK) >> 28
        etype = (word & TERM_ETYPE_MASK) >> 24
        code = (word & TERM_CODE_MASK) >> 16
        m, d, r = bool(word & TERM_FLAG_M), bool(word & TERM_FLAG_D), bool(word & TERM_FLAG_R)
        rsvd = word & TERM_RSVD_MASK
    if rsvd:
        chk.note("RDMAP-11", f"reserved Terminate control bits 0x{rsvd:X} set")
    pos = TERMINATE_CTRL_LEN
    seg_len = 0
    ddp_header = b""
    rdma_header = b""
    if d:
        if n >= pos + TERMINATE_SEG_LEN_LEN:
            (seg_len,) = TERMINATE_SEG_LEN.unpack_from(view, pos)
            pos += TERMINATE_SEG_LEN_LEN
            if n > pos:
                want = ddp.header_len_for(view[pos])
                if n >= pos + want:
                    ddp_header = bytes(view[pos : pos + want])
                    pos += want
        if not ddp_header:
            chk.note("RDMAP-11", "D is set but the copied DDP header is missing")
    if r:
        if n >= pos + READ_REQUEST_HDR_LEN:
            rdma_header = bytes(view[pos : pos + READ_REQUEST_HDR_LEN])
            pos += READ_REQUEST_HDR_LEN
        else:
            chk.note("RDMAP-11", "R is set but the 28-byte RDMA header is missing")
    if n > pos:
        chk.note("RDMAP-11", f"{n - pos} bytes after the Terminate headers")
    term = Terminate(
        layer=layer,
        etype=etype,
        code=code,
        m=m,
        d=d,
        r=r,
        ddp_seg_len=seg_len,
        ddp_header=ddp_header,
        rdma_header=rdma_header,
        siw_swapped=swapped,
    )
    return term, pos


def encode_terminate(t: Terminate) -> bytes:
    """The RDMAP header of a Terminate in the RFC layout (RFC 5040 §4.8; RDMAP-11).

    The segment length and copied DDP header (14 or 18 bytes) are written iff ``d``; the
    28-byte RDMA header iff ``r`` and ``rdma_header`` is given (R without the block is
    siw's habit and is allowed for interop testing).
    """
    if not (0 <= t.layer <= 0xF and 0 <= t.etype <= 0xF and 0 <= t.code <= 0xFF):
        raise LocalError(f"Terminate cause {t.layer}/{t.etype}/{t.code} out of range")
    word = (t.layer << 28) | (t.etype << 24) | (t.code << 16)
    word |= (TERM_FLAG_M if t.m else 0) | (TERM_FLAG_D if t.d else 0) | (TERM_FLAG_R if t.r else 0)
    parts = [TERMINATE_CTRL.pack(word)]
    if t.d:
        if len(t.ddp_header) not in (DDP_TAGGED_HDR_LEN, DDP_UNTAGGED_HDR_LEN):
            raise LocalError("a Terminate with D needs a 14- or 18-byte DDP header")
        if not 0 <= t.ddp_seg_len <= 0xFFFF:
            raise LocalError(f"DDP segment length {t.ddp_seg_len} does not fit 16 bits")
        parts += [TERMINATE_SEG_LEN.pack(t.ddp_seg_len), bytes(t.ddp_header)]
    elif t.ddp_header:
        raise LocalError("a copied DDP header needs the D flag")
    if t.rdma_header:
        if not t.r or len(t.rdma_header) != READ_REQUEST_HDR_LEN:
            raise LocalError("a copied RDMA header needs the R flag and 28 bytes")
        parts.append(bytes(t.rdma_header))
    return b"".join(parts)


def terminate_headers(layer: int, etype: int, opcode: int | None) -> tuple[bool, bool]:
    """Which headers RFC 5040 Fig. 10 puts in a Terminate (§4.8, §7.1; RDMAP-12).

    For a cause ``layer``/``etype`` about a message with ``opcode`` (from its DDP header;
    None when unknown): ``(ddp, rdma)``, whether the DDP segment length and header are
    copied (M=D=1) and whether the 28-byte Read Request header is copied (R=1).  DDP-layer
    and RDMAP remote errors copy the DDP header; local catastrophic errors (either layer)
    and LLP (MPA) errors copy nothing; only an RDMAP remote protection error about a Read
    Request copies its RDMA header (Sends and RFC 7306 messages never get R, EXT-11).  The
    one table behind :func:`build_terminate`, :func:`check_terminate_headers` and the Scapy
    ``terminate_fpdu``.
    """
    if layer == TermLayer.RDMAP:
        if etype == RdmapEType.LOCAL_CATASTROPHIC:
            return False, False
        return True, etype == RdmapEType.REMOTE_PROTECTION and opcode == Opcode.RDMA_READ_REQUEST
    if layer == TermLayer.DDP:
        return etype != 0, False  # DDP local catastrophic carries no headers
    return False, False  # LLP (MPA) errors and unknown layers


def check_terminate_headers(t: Terminate, chk: Checker) -> None:
    """Note where a received Terminate's headers differ from Fig. 10 (RDMAP-11, RDMAP-12).

    Header inclusion is a SHOULD (RDMAP-12), so these are noted, never fatal.  An RDMAP
    remote error without the DDP header is not noted (RFC 5040 §7.1 lets a Terminate carry
    only what is available, and Linux siw omits it for version and opcode errors).
    """
    layer, etype = t.layer, t.etype
    copied_op = t.ddp_header[1] & RDMAP_OPCODE_MASK if len(t.ddp_header) > 1 else None
    want_ddp, want_rdma = terminate_headers(layer, etype, copied_op)
    if not want_ddp:
        if t.d or t.r:
            chk.note("RDMAP-12", f"{layer}/{etype} Terminate should carry no headers")
    elif layer == TermLayer.DDP:
        if not (t.d and t.m):
            chk.note("RDMAP-12", "DDP Terminate should carry the DDP header (M, D)")
        if t.r:
            chk.note("RDMAP-12", "DDP Terminate should not carry an RDMA header")
    elif layer == TermLayer.RDMAP:
        if t.r and copied_op is not None and copied_op != Opcode.RDMA_READ_REQUEST:
            chk.note("RDMAP-12", "R set for a message that is not a Read Request")
        if want_rdma and not t.r:
            chk.note("RDMAP-12", "Read Request protection error without its header")
    if t.d and not t.m:
        chk.note("RDMAP-11", "D set without M: the segment length is not valid")
    if t.d and t.ddp_header and t.m:
        hlen = len(t.ddp_header)
        if t.ddp_seg_len < hlen:
            chk.note(
                "RDMAP-11",
                f"DDP Segment Length {t.ddp_seg_len} is shorter than the copied "
                f"{hlen}-byte DDP header (payload length, as siw sends?)",
            )


def build_terminate(
    cause: TermCode | tuple[int, int, int],
    offending_ulpdu: Data | None,
    *,
    read_progress: int = 0,
) -> Terminate:
    """The Terminate reporting ``cause`` about ``offending_ulpdu`` (RFC 5040 §4.8, §7.1).

    Headers follow Fig. 10 (:func:`terminate_headers`): DDP-layer errors (except local
    catastrophic) and RDMAP remote protection/operation errors copy the segment length
    (the offending ULPDU_Length) and its 14- or 18-byte DDP header (M=D=1, chosen by the
    copied T bit); only an RDMAP remote protection error about a Read Request also copies
    its 28-byte header (R=1), advanced by ``read_progress`` bytes already served (Sink TO
    and Source TO += progress, Size -= progress).  RFC 7306 opcodes and Sends never get R
    (§5.4 conflict note, EXT-11).  No offending ULPDU (an error while building an outbound
    message, §7.1 case 1), LLP errors and local catastrophic errors give M=D=R=0.
    """
    cause = TermCode(*cause)
    if offending_ulpdu is None:
        return Terminate(cause.layer, cause.etype, cause.code)
    view = ddp.byte_view(offending_ulpdu)
    if len(view) < 2 or len(view) < ddp.header_len_for(view[0]):
        return Terminate(cause.layer, cause.etype, cause.code)
    hlen = ddp.header_len_for(view[0])
    opcode = None if view[0] & DDP_TAGGED else view[1] & RDMAP_OPCODE_MASK
    copy_ddp, copy_rdma = terminate_headers(cause.layer, cause.etype, opcode)
    if not copy_ddp:
        return Terminate(cause.layer, cause.etype, cause.code)
    rdma_header = b""
    if copy_rdma and len(view) >= hlen + READ_REQUEST_HDR_LEN:
        sink_stag, sink_to, size, src_stag, src_to = READ_REQUEST.unpack_from(view, hlen)
        p = max(0, min(read_progress, size))
        rdma_header = READ_REQUEST.pack(
            sink_stag, (sink_to + p) & _MASK64, size - p, src_stag, (src_to + p) & _MASK64
        )
    return Terminate(
        cause.layer,
        cause.etype,
        cause.code,
        m=True,
        d=True,
        r=bool(rdma_header),
        ddp_seg_len=min(len(view), 0xFFFF),
        ddp_header=bytes(view[:hlen]),
        rdma_header=rdma_header,
    )


def terminate_for(error: ProtocolError | None) -> TermCode:
    """The Terminate cause for ``error``; RDMAP local catastrophic when it names none."""
    if error is None or error.term is None:
        return TERM_RDMAP_CATASTROPHIC
    return error.term


# ======================================================================================
# Encoding
# ======================================================================================


def rdmap_ctrl(opcode: int) -> int:
    """The RDMAP control byte: RV=01, Rsv=0, opcode (RFC 5040 §4.2; RDMAP-02)."""
    return _RV_BITS | opcode


def encode_message(msg: RdmapMessage, *, msn: int | None, mulpdu: int) -> list[bytes]:
    """The ULPDUs (DDP segments, each <= ``mulpdu``) carrying ``msg``.

    ``msn``: the MSN for untagged messages (per QN, see :class:`RdmapStream`); None means
    1, the first message on its queue.  Ignored for Write and Read Response.  Data
    messages are segmented (DDP-06); all others are a single segment with L=1, MO=0.
    Raises :class:`LocalError` for values that do not fit their fields, Immediate Data that
    is not 8 bytes, or ``mulpdu`` outside 128..64768 (MPA-02).
    """
    join = b"".join
    return [join(p) for p in encode_message_parts(msg, msn=msn, mulpdu=mulpdu)]


def encode_message_parts(msg: RdmapMessage, *, msn: int | None, mulpdu: int) -> list[ddp.Parts]:
    """:func:`encode_message` as (header, payload view) pairs: no payload copy.

    For a framer that writes header and payload straight into its FPDU buffer (one copy
    per byte for the whole send path).  The views alias the message's data.
    """
    if not MULPDU_MIN <= mulpdu <= MULPDU_MAX:
        raise LocalError(f"MULPDU {mulpdu} outside {MULPDU_MIN}..{MULPDU_MAX}")
    if msn is None:
        msn = 1
    if isinstance(msg, RdmaWrite):
        return ddp.segment_tagged_parts(msg.stag, msg.to, _RV_BITS, msg.data, mulpdu)
    if isinstance(msg, ReadResponse):
        return ddp.segment_tagged_parts(
            msg.stag, msg.to, _RV_BITS | Opcode.RDMA_READ_RESPONSE, msg.data, mulpdu
        )
    if isinstance(msg, Send):
        inval = msg.invalidate_stag
        if inval is not None and not 0 <= inval <= _MASK32:
            raise LocalError(f"Invalidate STag 0x{inval:X} does not fit 32 bits")
        ulp = (rdmap_ctrl(msg.opcode) << 32) | (inval or 0)
        return ddp.segment_untagged_parts(QueueNumber.SEND, msn, ulp, msg.data, mulpdu)
    op, body = _encode_fixed(msg)
    ulp = rdmap_ctrl(op) << 32
    (header, _) = ddp.segment_untagged_parts(OPCODE_QN[op], msn, ulp, b"", mulpdu)[0]
    return [(header, memoryview(body))]


def _encode_fixed(msg: RdmapMessage) -> tuple[int, bytes]:
    """Opcode and RDMAP header of a single-segment message."""
    try:
        if isinstance(msg, ReadRequest):
            body = READ_REQUEST.pack(msg.sink_stag, msg.sink_to, msg.size, msg.src_stag, msg.src_to)
            return Opcode.RDMA_READ_REQUEST, body
        if isinstance(msg, Terminate):
            return Opcode.TERMINATE, encode_terminate(msg)
        if isinstance(msg, ImmediateData):
            if len(msg.data) != IMMEDIATE_DATA_LEN:
                raise LocalError(f"Immediate Data must be 8 bytes, not {len(msg.data)} (EXT-09)")
            op = Opcode.IMMEDIATE_DATA_SE if msg.solicited else Opcode.IMMEDIATE_DATA
            return op, bytes(msg.data)
        if isinstance(msg, AtomicRequest):
            if not 0 <= msg.atomic_opcode <= ATOMIC_OPCODE_MASK:
                raise LocalError(f"AOpCode {msg.atomic_opcode} does not fit 4 bits")
            body = ATOMIC_REQUEST.pack(
                msg.atomic_opcode,
                msg.req_id,
                msg.stag,
                msg.to,
                msg.add_swap_data,
                msg.add_swap_mask,
                msg.compare_data,
                msg.compare_mask,
            )
            return Opcode.ATOMIC_REQUEST, body
        if isinstance(msg, AtomicResponse):
            return Opcode.ATOMIC_RESPONSE, ATOMIC_RESPONSE.pack(msg.req_id, msg.orig_value)
    except struct.error as exc:
        raise LocalError(f"{type(msg).__name__} field out of range: {exc}") from None
    raise LocalError(f"not an RDMAP message: {type(msg).__name__}")


def message_qn(msg: RdmapMessage) -> int | None:
    """The untagged queue ``msg`` travels on, or None for tagged messages (RDMAP-01)."""
    if isinstance(msg, RdmaWrite | ReadResponse):
        return None
    if isinstance(msg, Send | ImmediateData):
        return QueueNumber.SEND
    if isinstance(msg, ReadRequest | AtomicRequest):
        return QueueNumber.READ_REQUEST
    if isinstance(msg, Terminate):
        return QueueNumber.TERMINATE
    if isinstance(msg, AtomicResponse):
        return QueueNumber.ATOMIC_RESPONSE
    raise LocalError(f"not an RDMAP message: {type(msg).__name__}")
