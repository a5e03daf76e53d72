"""DDP headers and segmentation (RFC 5041 §4, §5.2), sans-IO.

DDP puts one header in front of every segment (ULPDU) it hands to MPA:

* tagged (T=1, 14 bytes): control, RsvdULP (8 bits), STag, TO;
* untagged (T=0, 18 bytes): control, RsvdULP (40 bits), QN, MSN, MO.

RDMAP owns RsvdULP: its first byte is the RDMAP control byte, and in untagged headers the
remaining 32 bits carry the Invalidate STag (RDMAP-03).  This module knows nothing about
RDMAP; :mod:`stack.wire.rdmap` builds on it.

Efficiency: the segmenters walk a message once, slice it through a ``memoryview`` and copy
each payload byte exactly once (``b"".join`` of header and slice into the segment's
``bytes``; no zero-fill), so a 1 MiB Write costs O(size) whatever the MULPDU.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from stack.buffers import Buffer as Data
from stack.constants import (
    ALL_ONES_32,
    DDP_DV_MASK,
    DDP_LAST,
    DDP_RSVD_MASK,
    DDP_TAGGED,
    DDP_TAGGED_HDR_LEN,
    DDP_UNTAGGED_HDR_LEN,
    DDP_VERSION,
    TERM_DDP_CATASTROPHIC,
    TERM_DDP_T_INVALID_VERSION,
    TERM_DDP_U_INVALID_VERSION,
)
from stack.errors import DdpError, DecodeError, LocalError

TAGGED_HDR = struct.Struct(">BBIQ")
"""Tagged header: control, RsvdULP (8), STag, TO (RFC 5041 §4.2)."""
UNTAGGED_HDR = struct.Struct(">BBIIII")
"""Untagged header: control, RsvdULP[0:7], RsvdULP[8:39], QN, MSN, MO (RFC 5041 §4.3)."""

assert TAGGED_HDR.size == DDP_TAGGED_HDR_LEN and UNTAGGED_HDR.size == DDP_UNTAGGED_HDR_LEN

MAX_MESSAGE_LEN = (1 << 32) - 1
"""A DDP message is shorter than 2^32 bytes (DDP-06)."""
_MASK40 = (1 << 40) - 1
_MASK64 = (1 << 64) - 1

_CTRL_TAGGED = DDP_TAGGED | DDP_VERSION
_CTRL_TAGGED_LAST = DDP_TAGGED | DDP_LAST | DDP_VERSION
_CTRL_UNTAGGED = DDP_VERSION
_CTRL_UNTAGGED_LAST = DDP_LAST | DDP_VERSION
CTRL_UNTAGGED_LAST = _CTRL_UNTAGGED_LAST
"""The control byte of an untagged segment with L set (DDP version 1, RFC 5041 §4.3)."""
_TAGGED_PACK = TAGGED_HDR.pack


@dataclass(frozen=True, slots=True)
class DdpHeader:
    """A decoded DDP header (RFC 5041 §4).

    Fields: tagged (T), last (L), rsvd (the 0x3C control bits, unchecked), dv (DDP
    version), rsvd_ulp (8 bits tagged, 40 bits untagged; opaque to DDP), stag and to
    (tagged only, else None), qn, msn, mo (untagged only, else None).
    """

    tagged: bool
    last: bool
    rsvd: int
    dv: int
    rsvd_ulp: int
    stag: int | None = None
    to: int | None = None
    qn: int | None = None
    msn: int | None = None
    mo: int | None = None

    @property
    def header_len(self) -> int:
        """14 for a tagged header, 18 for an untagged one."""
        return DDP_TAGGED_HDR_LEN if self.tagged else DDP_UNTAGGED_HDR_LEN


def header_len_for(ctrl: int) -> int:
    """Length of the DDP header announced by the control byte's T bit (DDP-01)."""
    return DDP_TAGGED_HDR_LEN if ctrl & DDP_TAGGED else DDP_UNTAGGED_HDR_LEN


def version_error(ctrl: int) -> DdpError:
    """The DDP-03 error for a control byte whose DV is not 1 (Terminate 1/1/4 or 1/2/6)."""
    term = TERM_DDP_T_INVALID_VERSION if ctrl & DDP_TAGGED else TERM_DDP_U_INVALID_VERSION
    return DdpError("DDP-03", f"DDP version {ctrl & DDP_DV_MASK}, expected {DDP_VERSION}", term)


def parse_header(ulpdu: Data) -> DdpHeader:
    """Decode the DDP header at the start of ``ulpdu`` without judging its values.

    Raises :class:`DecodeError` when the ULPDU is shorter than the header its T bit
    announces.  DV is reported, not checked (see :func:`version_error`).
    """
    n = len(ulpdu)
    if n < 1:
        raise DecodeError("DDP-01", "empty ULPDU", TERM_DDP_CATASTROPHIC)
    ctrl = ulpdu[0]
    need = header_len_for(ctrl)
    if n < need:
        kind = "tagged" if ctrl & DDP_TAGGED else "untagged"
        raise DecodeError(
            "DDP-01",
            f"ULPDU of {n} bytes is shorter than a {kind} DDP header",
            TERM_DDP_CATASTROPHIC,
        )
    last = bool(ctrl & DDP_LAST)
    rsvd = ctrl & DDP_RSVD_MASK
    dv = ctrl & DDP_DV_MASK
    if ctrl & DDP_TAGGED:
        _, ulp, stag, to = TAGGED_HDR.unpack_from(ulpdu)
        return DdpHeader(tagged=True, rsvd_ulp=ulp, stag=stag, to=to, last=last, rsvd=rsvd, dv=dv)
    _, ulp_hi, ulp_lo, qn, msn, mo = UNTAGGED_HDR.unpack_from(ulpdu)
    return DdpHeader(
        tagged=False, rsvd_ulp=(ulp_hi << 32) | ulp_lo, qn=qn, msn=msn, mo=mo, last=last,
        rsvd=rsvd, dv=dv,
    )  # fmt: skip


# --------------------------------------------------------------------------------------
# Encoding
# --------------------------------------------------------------------------------------


def encode_tagged(last: bool, stag: int, to: int, rsvd_ulp: int, payload: Data = b"") -> bytes:
    """One tagged DDP segment: 14-byte header (T=1, DV=1) followed by ``payload``."""
    ctrl = _CTRL_TAGGED_LAST if last else _CTRL_TAGGED
    return _join(_pack(TAGGED_HDR, ctrl, rsvd_ulp, stag, to), byte_view(payload))


def encode_untagged(
    last: bool, qn: int, msn: int, mo: int, rsvd_ulp: int, payload: Data = b""
) -> bytes:
    """One untagged DDP segment: 18-byte header (T=0, DV=1) followed by ``payload``.

    ``rsvd_ulp`` is the 40-bit RsvdULP field (RDMAP control byte << 32 | Invalidate STag).
    """
    if not 0 <= rsvd_ulp <= _MASK40:
        raise LocalError(f"RsvdULP 0x{rsvd_ulp:X} does not fit 40 bits")
    ctrl = _CTRL_UNTAGGED_LAST if last else _CTRL_UNTAGGED
    hdr = _pack(UNTAGGED_HDR, ctrl, rsvd_ulp >> 32, rsvd_ulp & ALL_ONES_32, qn, msn, mo)
    return _join(hdr, byte_view(payload))


def segment_sizes(length: int, mulpdu: int, header_len: int) -> list[int]:
    """Payload sizes of the segments of a ``length``-byte message (DDP-06, DDP-07).

    Every segment but the last carries ``mulpdu - header_len`` bytes; a zero-length
    message is exactly one empty segment.
    """
    room = mulpdu - header_len
    if room <= 0:
        raise LocalError(f"MULPDU {mulpdu} leaves no room after a {header_len}-byte header")
    if not 0 <= length <= MAX_MESSAGE_LEN:
        raise LocalError(f"message length {length} is outside 0..2^32-1 (DDP-06)")
    if length == 0:
        return [0]
    full, rest = divmod(length, room)
    return [room] * full + ([rest] if rest else [])


Parts = tuple[bytes, memoryview]
"""A segment as (DDP header, payload view): join them, or write both into an FPDU buffer."""


def segment_tagged(stag: int, to: int, rsvd_ulp: int, payload: Data, mulpdu: int) -> list[bytes]:
    """Split a tagged message into segments <= ``mulpdu`` (RFC 5041 §5.2).

    Each segment's TO is the message TO plus the offset of its first byte (modulo 2^64:
    a sender may deliberately aim at the peer's TO-wrap check); L is set only on the last.
    """
    join = b"".join
    return [join(p) for p in segment_tagged_parts(stag, to, rsvd_ulp, payload, mulpdu)]


def segment_untagged(qn: int, msn: int, rsvd_ulp: int, payload: Data, mulpdu: int) -> list[bytes]:
    """Split an untagged message into segments <= ``mulpdu`` (RFC 5041 §5.2).

    All segments share QN, MSN and RsvdULP (DDP-04); MO starts at 0 and advances by each
    segment's payload length (DDP-05); L is set only on the last (DDP-02).
    """
    join = b"".join
    return [join(p) for p in segment_untagged_parts(qn, msn, rsvd_ulp, payload, mulpdu)]


def segment_tagged_parts(
    stag: int, to: int, rsvd_ulp: int, payload: Data, mulpdu: int, last: bool = True
) -> list[Parts]:
    """:func:`segment_tagged` without the copy: (header, payload view) per segment.
    ``last=False``: a part of a message that goes on after it, L clear on every segment
    (DDP-02)."""
    ctrl_last = _CTRL_TAGGED_LAST if last else _CTRL_TAGGED
    if not 0 <= to <= _MASK64:
        raise LocalError(f"TO 0x{to:X} does not fit 64 bits")
    src = payload if type(payload) is memoryview and payload.format == "B" else byte_view(payload)
    if len(src) <= mulpdu - DDP_TAGGED_HDR_LEN and mulpdu > DDP_TAGGED_HDR_LEN:
        # One segment (DDP-06): its header packed, and range-checked, once.
        try:
            return [(_TAGGED_PACK(ctrl_last, rsvd_ulp, stag, to), src)]
        except struct.error as exc:
            raise LocalError(f"DDP header field out of range: {exc}") from None
    n = len(src)
    room = mulpdu - DDP_TAGGED_HDR_LEN
    if room <= 0 or n > MAX_MESSAGE_LEN:
        segment_sizes(n, mulpdu, DDP_TAGGED_HDR_LEN)  # raises the LocalError that says why
    # Every segment but the last carries ``room`` bytes (DDP-06); the last starts at
    # ``final_at`` and alone has L set (DDP-02).  One list comprehension, no per-segment
    # sizes.
    final_at = (n - 1) // room * room
    try:
        final = _TAGGED_PACK(ctrl_last, rsvd_ulp, stag, (to + final_at) & _MASK64)
        pack = _TAGGED_PACK
        out: list[Parts] = [
            (pack(_CTRL_TAGGED, rsvd_ulp, stag, (to + off) & _MASK64), src[off : off + room])
            for off in range(0, final_at, room)
        ]
    except struct.error as exc:
        raise LocalError(f"DDP header field out of range: {exc}") from None
    out.append((final, src[final_at:]))
    return out


def segment_untagged_parts(
    qn: int, msn: int, rsvd_ulp: int, payload: Data, mulpdu: int, mo: int = 0, last: bool = True
) -> list[Parts]:
    """:func:`segment_untagged` without the copy: (header, payload view) per segment.
    ``mo`` and ``last=False``: a part of a message, its first byte ``mo`` bytes into it
    (DDP-05), and L clear on every segment when the message goes on after it (DDP-02)."""
    if not 0 <= rsvd_ulp <= _MASK40:
        raise LocalError(f"RsvdULP 0x{rsvd_ulp:X} does not fit 40 bits")
    src = payload if type(payload) is memoryview and payload.format == "B" else byte_view(payload)
    ctrl_last = _CTRL_UNTAGGED_LAST if last else _CTRL_UNTAGGED
    if len(src) <= mulpdu - DDP_UNTAGGED_HDR_LEN and mulpdu > DDP_UNTAGGED_HDR_LEN:
        # One segment (DDP-06), MO ``mo`` (DDP-05): its header packed, and range-checked,
        # once.
        try:
            header = UNTAGGED_HDR.pack(
                ctrl_last, rsvd_ulp >> 32, rsvd_ulp & ALL_ONES_32, qn, msn, mo
            )
        except struct.error as exc:
            raise LocalError(f"DDP header field out of range: {exc}") from None
        return [(header, src)]
    sizes = segment_sizes(len(src), mulpdu, DDP_UNTAGGED_HDR_LEN)
    ulp_hi, ulp_lo = rsvd_ulp >> 32, rsvd_ulp & ALL_ONES_32
    # Range-checked once, with the largest MO (the last segment's).
    _pack(UNTAGGED_HDR, _CTRL_UNTAGGED, ulp_hi, ulp_lo, qn, msn, mo + len(src) - sizes[-1])
    pack = UNTAGGED_HDR.pack
    out: list[Parts] = []
    last_index = len(sizes) - 1
    off = 0
    for i, n in enumerate(sizes):
        ctrl = ctrl_last if i == last_index else _CTRL_UNTAGGED
        out.append((pack(ctrl, ulp_hi, ulp_lo, qn, msn, mo + off), src[off : off + n]))
        off += n
    return out


def byte_view(data: Data) -> memoryview:
    """A flat, byte-indexed ``memoryview`` of ``data`` (no copy)."""
    view = memoryview(data)
    if view.format != "B" or view.ndim != 1:
        view = view.cast("B")
    return view


def _pack(fmt: struct.Struct, *fields: int) -> bytes:
    """``fmt.pack`` turning out-of-range fields into :class:`LocalError`."""
    try:
        return fmt.pack(*fields)
    except struct.error as exc:
        raise LocalError(f"DDP header field out of range: {exc}") from None


def _join(header: bytes, payload: memoryview) -> bytes:
    """Header and payload as one new ``bytes`` (the payload's only copy)."""
    return b"".join((header, payload)) if len(payload) else header
