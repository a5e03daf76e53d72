"""MPA Request and Reply frames, to bytes and back (RFC 5044 §7.1.1, RFC 6581 §6, §9).

:func:`encode_frame` / :func:`decode_frame` turn Request/Reply frames into bytes and back
(MPA-18..21, ERC-02/03); :func:`encode_ird_ord` / :func:`decode_ird_ord` the RFC 6581 word.
Decoding judges only what makes a frame unreadable (the key, PD_Length against the limit,
an S bit without room for the word); every other startup rule is in
:mod:`stack.wire.mpa_rules`.  Reserved flag bits are kept in :attr:`MpaFrame.reserved` and
never rejected (MPA-19).
"""

from __future__ import annotations

import struct

from stack.buffers import Buffer
from stack.constants import (
    MPA_FRAME_HEADER_LEN,
    MPA_IRD_ORD_LEN,
    MPA_KEY_LEN,
    MPA_KEY_REP,
    MPA_KEY_REQ,
    MPA_MAX_PRIVATE_DATA,
    MPA_RESERVED_MASK,
    MPA_REV_2,
    MPA_V2_IRD_MASK,
    MPA_V2_IRD_ORD_MAX,
    MPA_V2_ORD_MASK,
    MPA_V2_PEER_TO_PEER,
    MPA_V2_RTR_READ,
    MPA_V2_RTR_SEND,
    MPA_V2_RTR_WRITE,
    TERM_LLP_INVALID_STARTUP,
    MpaFlag,
    RtrType,
)
from stack.errors import LocalError, MpaError
from stack.wire.events import IrdOrd, MpaFrame

__all__ = ["decode_frame", "decode_ird_ord", "encode_frame", "encode_ird_ord", "reserved_mask"]

_U32 = struct.Struct(">I")
_RTR_BITS = (
    (RtrType.SEND, MPA_V2_RTR_SEND),
    (RtrType.WRITE, MPA_V2_RTR_WRITE),
    (RtrType.READ, MPA_V2_RTR_READ),
)
_ALL_RTR = RtrType.SEND | RtrType.WRITE | RtrType.READ

# ======================================================================================
# Frames (RFC 5044 §7.1.1, RFC 6581 §6, §9)
# ======================================================================================


def encode_ird_ord(value: IrdOrd) -> bytes:
    """The 4-byte RFC 6581 §9 word: A B IRD(14) | C D ORD(14), network order (ERC-03)."""
    for name, v in (("IRD", value.ird), ("ORD", value.ord)):
        if not 0 <= v <= MPA_V2_IRD_ORD_MAX:
            raise LocalError(f"{name} {v} does not fit in 14 bits (ERC-03)")
    rtr = RtrType(value.rtr)
    if rtr & ~_ALL_RTR:
        raise LocalError(f"unknown RTR bits {rtr!r}")
    word = (value.ird << 16) | value.ord
    if value.p2p:
        word |= MPA_V2_PEER_TO_PEER
    for kind, bit in _RTR_BITS:
        if rtr & kind:
            word |= bit
    return _U32.pack(word)


def decode_ird_ord(data: Buffer) -> IrdOrd:
    """Parse the RFC 6581 §9 IRD/ORD word (exactly 4 bytes)."""
    if len(data) != MPA_IRD_ORD_LEN:
        raise MpaError(
            "ERC-03",
            f"IRD/ORD word must be {MPA_IRD_ORD_LEN} bytes, got {len(data)}",
            TERM_LLP_INVALID_STARTUP,
        )
    (word,) = _U32.unpack(bytes(data))
    rtr = RtrType.NONE
    for kind, bit in _RTR_BITS:
        if word & bit:
            rtr |= kind
    return IrdOrd(
        ird=(word & MPA_V2_IRD_MASK) >> 16,
        ord=word & MPA_V2_ORD_MASK,
        p2p=bool(word & MPA_V2_PEER_TO_PEER),
        rtr=rtr,
    )


def reserved_mask(rev: int) -> int:
    """Reserved flag bits: 0x0F, plus the S bit (0x10) below Rev 2 (RFC 5044 Res = 0x1F)."""
    return MPA_RESERVED_MASK if rev >= MPA_REV_2 else MPA_RESERVED_MASK | MpaFlag.ENHANCED


def encode_frame(frame: MpaFrame, *, max_private_data: int | None = MPA_MAX_PRIVATE_DATA) -> bytes:
    """Encode an MPA Request or Reply (RFC 5044 §7.1.1; RFC 6581 §6 when ``ird_ord``).

    ``max_private_data`` limits PD_Length including the IRD/ORD word (MPA-21, ERC-02);
    ``None`` allows up to 65535 bytes (for building malformed frames in tests).
    """
    if not 0 <= frame.rev <= 0xFF:
        raise LocalError(f"Rev {frame.rev} does not fit in a byte")
    pd = bytes(frame.private_data)
    flags = (
        (MpaFlag.MARKERS if frame.markers else 0)
        | (MpaFlag.CRC if frame.crc else 0)
        | (MpaFlag.REJECT if frame.reject else 0)
        | (frame.reserved & reserved_mask(frame.rev))
    )
    if frame.ird_ord is not None:
        if frame.rev < MPA_REV_2:
            raise LocalError(f"the IRD/ORD word needs Rev >= 2, frame has Rev {frame.rev}")
        flags |= MpaFlag.ENHANCED
        pd = encode_ird_ord(frame.ird_ord) + pd
    limit = 0xFFFF if max_private_data is None else max_private_data
    if len(pd) > limit:
        raise LocalError(f"private data of {len(pd)} bytes exceeds the limit {limit} (MPA-21)")
    key = MPA_KEY_REP if frame.reply else MPA_KEY_REQ
    return key + bytes((flags, frame.rev)) + len(pd).to_bytes(2, "big") + pd


def decode_frame(
    buf: Buffer, *, max_private_data: int = MPA_MAX_PRIVATE_DATA
) -> tuple[MpaFrame, int] | None:
    """Decode a Request or Reply at the start of ``buf``.

    Returns ``(frame, bytes consumed)`` or None while the frame is incomplete.  A wrong key
    is reported as soon as the received prefix cannot start either key (MPA-18).  Raises
    :class:`MpaError` with Terminate 2/0/4 for a bad key, PD_Length over the limit (MPA-21)
    or an S bit with no room for the IRD/ORD word (ERC-02).  The R bit is decoded as sent
    (the engine ignores it in a Request, MPA-19); Rev is not judged here (MPA-20).
    """
    have = min(len(buf), MPA_KEY_LEN)
    prefix = bytes(buf[:have])
    if prefix != MPA_KEY_REQ[:have] and prefix != MPA_KEY_REP[:have]:
        raise MpaError("MPA-18", f"invalid MPA key {prefix!r}", TERM_LLP_INVALID_STARTUP)
    if len(buf) < MPA_FRAME_HEADER_LEN:
        return None
    flags = buf[16]
    rev = buf[17]
    pd_len = (buf[18] << 8) | buf[19]
    if pd_len > max_private_data:
        raise MpaError(
            "MPA-21",
            f"PD_Length {pd_len} exceeds the limit {max_private_data}",
            TERM_LLP_INVALID_STARTUP,
        )
    enhanced = rev >= MPA_REV_2 and bool(flags & MpaFlag.ENHANCED)
    if enhanced and pd_len < MPA_IRD_ORD_LEN:
        raise MpaError(
            "ERC-02",
            f"S bit set but PD_Length {pd_len} leaves no room for the IRD/ORD word",
            TERM_LLP_INVALID_STARTUP,
        )
    end = MPA_FRAME_HEADER_LEN + pd_len
    if len(buf) < end:
        return None
    pd = bytes(buf[MPA_FRAME_HEADER_LEN:end])
    ird_ord = None
    if enhanced:
        ird_ord = decode_ird_ord(pd[:MPA_IRD_ORD_LEN])
        pd = pd[MPA_IRD_ORD_LEN:]
    frame = MpaFrame(
        reply=prefix == MPA_KEY_REP,
        markers=bool(flags & MpaFlag.MARKERS),
        crc=bool(flags & MpaFlag.CRC),
        reject=bool(flags & MpaFlag.REJECT),
        rev=rev,
        ird_ord=ird_ord,
        private_data=pd,
        reserved=flags & reserved_mask(rev),
    )
    return frame, end
