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
* :func:`~stack.wire.terminate.build_terminate` (in :mod:`stack.wire.terminate`) builds
  the Terminate that reports an error about an offending ULPDU (RFC 5040 Fig. 10, §7.1).

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

Terminates (layout, Fig. 10 header copies, siw's variant) are :mod:`stack.wire.terminate`;
the strict/lenient :class:`~stack.wire.checker.Checker` is :mod:`stack.wire.checker`.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from stack.buffers import Buffer as Data
from stack.constants import (
    ALL_ONES_32,
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
    TERM_DDP_CATASTROPHIC,
    TERM_DDP_U_INVALID_MO,
    TERM_DDP_U_INVALID_QN,
    TERM_DDP_U_TOO_LONG,
    TERM_RDMAP_INVALID_VERSION,
    TERM_RDMAP_OP_UNSPECIFIED,
    TERM_RDMAP_UNEXPECTED_OPCODE,
    TERMINATE_CTRL_LEN,
    Opcode,
    QueueNumber,
)
from stack.errors import DdpError, DecodeError, LocalError, RdmapError
from stack.wire import ddp
from stack.wire.checker import Checker, Finding
from stack.wire.events import (
    AtomicRequest,
    AtomicResponse,
    ImmediateData,
    RdmapMessage,
    RdmaWrite,
    ReadRequest,
    ReadResponse,
    Send,
    Terminate,
)
from stack.wire.headers import ATOMIC_REQUEST, ATOMIC_RESPONSE, READ_REQUEST
from stack.wire.terminate import _decode_terminate, encode_terminate

RdmapHeader = ReadRequest | AtomicRequest | AtomicResponse | Terminate | ImmediateData
"""What :attr:`Segment.header` holds for messages with an RDMAP header."""

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


EXACT_FIXED: dict[int, tuple[int, int, int]] = {
    _RV_BITS | op: (op, OPCODE_QN[op], size)
    for op, (_rule, size) in _SINGLE_SEGMENT.items()
    if size is not None
}
"""RDMAP control byte (RV=1, reserved 0) of a fixed-size message -> (opcode, QN, header
length): the messages whose exact validity :func:`exact_fixed_header` tells."""


def exact_fixed_header(op: int, body: memoryview) -> RdmapHeader | None:
    """The RDMAP header of a fixed-size message (an :data:`EXACT_FIXED` opcode, ``body``
    exactly its length) that :func:`check_rdmap` would pass without a finding, else None:
    only an Atomic Request's reserved AOpCode bits (EXT-02) remain to test."""
    if op == _ATOMIC_REQUEST_OP and ATOMIC_REQUEST.unpack_from(body)[0] & ~ATOMIC_OPCODE_MASK:
        return None
    return _decode_fixed_header(op, body, _NO_FINDINGS)


_NO_FINDINGS = Checker(strict=True)  # exact_fixed_header: nothing is noted or raised
# Module globals: Enum.MEMBER is a slow attribute lookup in 3.11 (the per-message paths).
_READ_REQUEST_OP = Opcode.RDMA_READ_REQUEST
_ATOMIC_REQUEST_OP = Opcode.ATOMIC_REQUEST
_ATOMIC_RESPONSE_OP = Opcode.ATOMIC_RESPONSE


def _decode_fixed_header(op: int, body: memoryview, chk: Checker) -> RdmapHeader:
    if op == _READ_REQUEST_OP:
        return ReadRequest(*READ_REQUEST.unpack_from(body))
    if op == _ATOMIC_REQUEST_OP:
        word, *rest = ATOMIC_REQUEST.unpack_from(body)
        if word & ~ATOMIC_OPCODE_MASK:
            chk.note("EXT-02", f"reserved AOpCode bits 0x{word & ~ATOMIC_OPCODE_MASK:08X} set")
        return AtomicRequest(word & ATOMIC_OPCODE_MASK, *rest)
    if op == _ATOMIC_RESPONSE_OP:
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


def encode_message_parts(
    msg: RdmapMessage, *, msn: int | None, mulpdu: int, mo: int = 0, last: bool = True
) -> list[ddp.Parts]:
    """:func:`encode_message` as (header, payload view) pairs: no payload copy.

    For a framer that writes header and payload straight into its FPDU buffer (one copy
    per byte for the whole send path).  The views alias the message's data.  ``mo`` and
    ``last`` encode a Write, Read Response or Send as part of a larger message
    (:class:`~stack.wire.events.MessagePart`): its untagged MOs from ``mo`` on (DDP-05), L
    only when ``last`` (DDP-02).
    """
    if not MULPDU_MIN <= mulpdu <= MULPDU_MAX:
        raise LocalError(f"MULPDU {mulpdu} outside {MULPDU_MIN}..{MULPDU_MAX}")
    if msn is None:
        msn = 1
    if isinstance(msg, RdmaWrite):
        return encode_write_fields(msg.stag, msg.to, msg.data, mulpdu, last)
    if isinstance(msg, ReadResponse):
        ctrl = _READ_RESPONSE_CTRL
        return ddp.segment_tagged_parts(msg.stag, msg.to, ctrl, msg.data, mulpdu, last)
    if isinstance(msg, Send):
        ulp = _send_ulp(msg)
        return ddp.segment_untagged_parts(QueueNumber.SEND, msn, ulp, msg.data, mulpdu, mo, last)
    op, body = _encode_fixed(msg)
    ulp = rdmap_ctrl(op) << 32
    (header, _) = ddp.segment_untagged_parts(OPCODE_QN[op], msn, ulp, _NO_PAYLOAD, mulpdu)[0]
    return [(header, memoryview(body))]


def _record(body: struct.Struct) -> struct.Struct:
    """A one-segment message's DDP untagged header and RDMAP header as one record."""
    return struct.Struct(ddp.UNTAGGED_HDR.format + body.format.lstrip(">"))


READ_REQUEST_RECORD = _record(READ_REQUEST)
"""A Read Request's ULPDU: control, RDMAP control, Invalidate STag field, QN, MSN, MO, then
Sink STag, Sink TO, size, Source STag, Source TO."""
ATOMIC_REQUEST_RECORD = _record(ATOMIC_REQUEST)
"""An Atomic Request's ULPDU: the DDP untagged header's six fields, then the RDMAP header's."""
ATOMIC_RESPONSE_RECORD = _record(ATOMIC_RESPONSE)
"""An Atomic Response's ULPDU: the DDP untagged header's six fields, then the RDMAP header's."""


def encode_request_parts(
    msg: ReadRequest | AtomicRequest | AtomicResponse, msn: int
) -> list[ddp.Parts]:
    """:func:`encode_message_parts` of a Read Request (RFC 5040 §4.4), an Atomic Request
    or an Atomic Response (RFC 7306 §5.2): one segment (L, MO 0, the QN of its opcode,
    RFC 5041 §4.3), its two headers packed as one record; the round trip's path."""
    try:
        if type(msg) is ReadRequest:
            segment = READ_REQUEST_RECORD.pack(
                ddp.CTRL_UNTAGGED_LAST, _READ_REQUEST_CTRL, 0, _QN_READ, msn, 0,
                msg.sink_stag, msg.sink_to, msg.size, msg.src_stag, msg.src_to,
            )  # fmt: skip
        elif type(msg) is AtomicRequest:
            if not 0 <= msg.atomic_opcode <= ATOMIC_OPCODE_MASK:
                raise LocalError(f"AOpCode {msg.atomic_opcode} does not fit 4 bits")
            segment = ATOMIC_REQUEST_RECORD.pack(
                ddp.CTRL_UNTAGGED_LAST, _ATOMIC_REQUEST_CTRL, 0, _QN_READ, msn, 0,
                msg.atomic_opcode, msg.req_id, msg.stag, msg.to, msg.add_swap_data,
                msg.add_swap_mask, msg.compare_data, msg.compare_mask,
            )  # fmt: skip
        else:
            assert type(msg) is AtomicResponse
            segment = ATOMIC_RESPONSE_RECORD.pack(
                ddp.CTRL_UNTAGGED_LAST, _ATOMIC_RESPONSE_CTRL, 0, _QN_ATOMIC_RESPONSE, msn, 0,
                msg.req_id, msg.orig_value,
            )  # fmt: skip
    except struct.error as exc:
        raise LocalError(f"{type(msg).__name__} field out of range: {exc}") from None
    return [(segment, _NO_PAYLOAD)]


def _send_ulp(msg: Send) -> int:
    """The RsvdULP of a Send: RDMAP control (its opcode) and the Invalidate STag (RDMAP-09)."""
    inval = msg.invalidate_stag
    if inval is not None and not 0 <= inval <= ALL_ONES_32:
        raise LocalError(f"Invalidate STag 0x{inval:X} does not fit 32 bits")
    return (rdmap_ctrl(msg.opcode) << 32) | (inval or 0)


_WRITE_CTRL = _RV_BITS | Opcode.RDMA_WRITE
_READ_RESPONSE_CTRL = _RV_BITS | Opcode.RDMA_READ_RESPONSE
_READ_REQUEST_CTRL = _RV_BITS | Opcode.RDMA_READ_REQUEST
_ATOMIC_REQUEST_CTRL = _RV_BITS | Opcode.ATOMIC_REQUEST
_ATOMIC_RESPONSE_CTRL = _RV_BITS | Opcode.ATOMIC_RESPONSE
_QN_READ = int(QueueNumber.READ_REQUEST)
_QN_ATOMIC_RESPONSE = int(QueueNumber.ATOMIC_RESPONSE)
_NO_PAYLOAD = memoryview(b"")  # a fixed-size message's DDP payload (its header is separate)


def encode_write_fields(
    stag: int, to: int, data: Data, mulpdu: int, last: bool = True
) -> list[ddp.Parts]:
    """The tagged segments of ``RdmaWrite(stag, to, data)`` (RFC 5040 §4.3: RDMAP version,
    opcode 0 in RsvdULP), for a ``mulpdu`` already checked; the sender's bulk path calls it
    with a Write's fields, no message made (``last``: see :func:`encode_message_parts`)."""
    return ddp.segment_tagged_parts(stag, to, _WRITE_CTRL, data, mulpdu, last)


def _encode_fixed(msg: RdmapMessage) -> tuple[int, bytes]:
    """Opcode and RDMAP header of a single-segment message."""
    try:
        if isinstance(msg, ReadRequest):
            body = READ_REQUEST.pack(msg.sink_stag, msg.sink_to, msg.size, msg.src_stag, msg.src_to)
            return _READ_REQUEST_OP, body
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
            return _ATOMIC_REQUEST_OP, body
        if isinstance(msg, AtomicResponse):
            return _ATOMIC_RESPONSE_OP, ATOMIC_RESPONSE.pack(msg.req_id, msg.orig_value)
        if isinstance(msg, ImmediateData):
            if len(msg.data) != IMMEDIATE_DATA_LEN:
                raise LocalError(f"Immediate Data must be 8 bytes, not {len(msg.data)} (EXT-09)")
            op = Opcode.IMMEDIATE_DATA_SE if msg.solicited else Opcode.IMMEDIATE_DATA
            return op, bytes(msg.data)
        if isinstance(msg, Terminate):
            return Opcode.TERMINATE, encode_terminate(msg)
    except struct.error as exc:
        raise LocalError(f"{type(msg).__name__} field out of range: {exc}") from None
    raise LocalError(f"not an RDMAP message: {type(msg).__name__}")


def message_qn(msg: RdmapMessage) -> int | None:
    """The untagged queue ``msg`` travels on, or None for tagged messages (RDMAP-01)."""
    qn = _QN_OF_TYPE.get(type(msg), -1)
    if qn != -1:
        return qn
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


_QN_OF_TYPE: dict[type, int | None] = {
    RdmaWrite: None,
    ReadResponse: None,
    Send: QueueNumber.SEND,
    ImmediateData: QueueNumber.SEND,
    ReadRequest: QueueNumber.READ_REQUEST,
    AtomicRequest: QueueNumber.READ_REQUEST,
    Terminate: QueueNumber.TERMINATE,
    AtomicResponse: QueueNumber.ATOMIC_RESPONSE,
}
""":func:`message_qn` of each message type itself (one lookup; subclasses take the tests)."""
