"""Terminate messages: their layout, Linux siw's variant, and which headers they copy.

RFC 5040 §4.8 defines the Terminate's RDMAP header (control word, DDP segment length, copied
DDP header, copied RDMA Read Request header) and Fig. 10 which headers a Terminate for each
error carries (:func:`terminate_headers`, the one table behind :func:`build_terminate`,
:func:`check_terminate_headers` and the Scapy layers).

Linux siw's Terminate: on little-endian hosts siw's bitfield swaps the Layer and EType
nibbles of byte 0 and stores M/D/R in bits 0x01/0x02/0x04 of byte 2, so layer 1 / etype 2 /
code 3 with M=D=1 arrives as ``21 03 03 00`` instead of ``12 03 c0 00``.  Detection, in
order: (1) the caller's hint ``siw_layout`` when not None; (2) byte 2 has bits in 0x07 and
none in 0xF8 -> siw (an RFC sender keeps 0x1F zero); (3) byte 2 has bits in 0xE0 only ->
RFC; (4) otherwise (no flags at all) the RFC reading is kept unless its (layer, etype) pair
does not exist while the swapped pair does (``21 ..`` reads as the impossible LLP/etype 1
but as DDP/untagged when swapped), or both pairs exist and only the swapped reading names an
error RFC 5040 defines: siw's MPA CRC error ``02 02 00 00`` is LLP 2/0/0x02 (no RDMAP Remote
Operation code 0x02 exists; an LLP error carries no flags to tell).  Byte 0 alone cannot
tell ``20 06 00 00`` (RFC: LLP 2/0/6; siw: RDMAP 0/2/6) apart, so a connection known to
face siw should pass ``siw_layout=True``.
"""

from __future__ import annotations

from stack.buffers import Buffer as Data
from stack.constants import (
    DDP_TAGGED,
    DDP_TAGGED_HDR_LEN,
    DDP_UNTAGGED_HDR_LEN,
    RDMAP_OPCODE_MASK,
    READ_REQUEST_HDR_LEN,
    TERM_CODE_MASK,
    TERM_CODE_NAMES,
    TERM_ETYPE_MASK,
    TERM_ETYPE_NAMES,
    TERM_FLAG_D,
    TERM_FLAG_M,
    TERM_FLAG_R,
    TERM_LAYER_MASK,
    TERM_RDMAP_CATASTROPHIC,
    TERM_RDMAP_OP_UNSPECIFIED,
    TERM_RSVD_MASK,
    TERMINATE_CTRL_LEN,
    TERMINATE_SEG_LEN_LEN,
    Opcode,
    RdmapEType,
    TermCode,
    TermLayer,
)
from stack.errors import DecodeError, LocalError, ProtocolError
from stack.wire import ddp
from stack.wire.checker import Checker
from stack.wire.events import (
    Terminate,
)
from stack.wire.headers import READ_REQUEST, TERMINATE_CTRL, TERMINATE_SEG_LEN

__all__ = [
    "build_terminate",
    "check_terminate_headers",
    "decode_terminate",
    "encode_terminate",
    "terminate_for",
    "terminate_headers",
]

_MASK64 = (1 << 64) - 1
_UNSPEC = TERM_RDMAP_OP_UNSPECIFIED

# ======================================================================================
# Terminate (RFC 5040 §4.8, §7.1)
# ======================================================================================

_VALID_LAYER_ETYPES = frozenset(TERM_ETYPE_NAMES)


def _siw_swapped(b0: int, b1: int, b2: int, hint: bool | None) -> bool:
    """Whether a Terminate control word uses siw's swapped layout (module docstring)."""
    if hint is not None:
        return hint
    if b2 & 0x07 and not b2 & 0xF8:
        return True
    if b2:
        return False
    rfc_pair = (b0 >> 4, b0 & 0x0F)
    siw_pair = (b0 & 0x0F, b0 >> 4)
    if rfc_pair not in _VALID_LAYER_ETYPES:
        return siw_pair in _VALID_LAYER_ETYPES
    # Both pairs valid (no M/D/R flags to tell, as in every LLP error): take siw's reading
    # when only it names a defined error, e.g. 02 02: siw's MPA CRC error (2/0/0x02), not
    # RDMAP Remote Operation 0x02, which RFC 5040 does not define.
    rfc, siw = TermCode(*rfc_pair, b1), TermCode(*siw_pair, b1)
    return rfc not in TERM_CODE_NAMES and siw in TERM_CODE_NAMES


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
    swapped = _siw_swapped(b0, view[1], b2, siw_layout)
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
