"""Scapy layers for MPA (RFC 5044, RFC 6581): Request/Reply frames, the marker, the FPDU.

The FPDU's PAD and CRC follow the ULPDU; :class:`MPA_FPDU` keeps them as its own fields
(``pad``, ``crc``) and bytes after the CRC (the next FPDU) become Scapy ``Padding``.  The
CRC field is the CRC32c value, sent least significant byte first (RFC 5044 §4.4, MPA-12).
Every automatic field (``ulpdu_length``, ``pad``, ``crc``, ``pd_length``) is computed only
while it is ``None``; any explicit value, however wrong, is emitted as given.

Markers are stream-level (RFC 5044 §4.3), so :mod:`stack.dissect.scapy.streams` inserts
and strips them; :class:`MPA_Marker` is the 4-byte marker itself.
"""

from __future__ import annotations

import struct
from typing import Any

from scapy.config import conf
from scapy.fields import (
    BitField,
    ByteField,
    ConditionalField,
    ShortField,
    StrFixedLenField,
    StrLenField,
    XBitField,
    XLEIntField,
    XShortField,
    XStrField,
)
from scapy.packet import Packet

from stack.constants import (
    DDP_TAGGED,
    MPA_CRC_LEN,
    MPA_FRAME_HEADER_LEN,
    MPA_IRD_ORD_LEN,
    MPA_KEY_LEN,
    MPA_KEY_REP,
    MPA_KEY_REQ,
    MPA_LENGTH_LEN,
    MPA_MARKER_LEN,
    MPA_RESERVED_MASK,
    MPA_REV_2,
    MPA_V2_IRD_MASK,
    MPA_V2_ORD_MASK,
    MpaFlag,
)
from stack.crc import crc32c
from stack.dissect.scapy.base import _IwarpPacket, _NoWireField, _width
from stack.dissect.scapy.ddp_rdmap import DDP_Tagged, DDP_Untagged
from stack.errors import DecodeError

__all__ = [
    "MPA_FPDU",
    "MPA_FPDU_NoCRC",
    "MPA_Frame",
    "MPA_Marker",
    "MPA_Reply",
    "MPA_Request",
]

_LE32 = struct.Struct("<I")
_BE16 = struct.Struct(">H")


def _pad_len(ulpdu_length: int) -> int:
    """PAD so that 2 + ULPDU_Length + PAD is a multiple of 4 (MPA-04)."""
    return -(MPA_LENGTH_LEN + ulpdu_length) & 3


# ======================================================================================
# MPA Request / Reply (RFC 5044 §7.1.1, RFC 6581 §6, §9)
# ======================================================================================


def _has_ird_ord(pkt: Packet) -> bool:
    """Whether the IRD/ORD word is present: S set and PD_Length room for it (ERC-02).

    On dissection both fields precede the word, so building and dissecting agree.
    """
    return bool(pkt.enhanced) and (pkt.pd_length is None or pkt.pd_length >= MPA_IRD_ORD_LEN)


def _private_data_len(pkt: Packet) -> int:
    word = MPA_IRD_ORD_LEN if _has_ird_ord(pkt) else 0
    return max(0, (pkt.pd_length or 0) - word)


def _word_bit(name: str, default: int, width: int = 1) -> ConditionalField:
    return ConditionalField(BitField(name, default, width), _has_ird_ord)


class MPA_Frame(_IwarpPacket):
    """MPA Request or Reply (RFC 5044 §7.1.1); ``MPA_Frame(raw)`` dispatches on the key.

    Fields: key; flag bits markers (M), crc (C), reject (R), enhanced (S, RFC 6581), res
    (reserved, 4 bits); rev; pd_length (auto: word + private data); when S is set and
    PD_Length leaves room, the RFC 6581 IRD/ORD word (ERC-03): p2p (A), rtr_send (B), ird,
    rtr_write (C), rtr_read (D), ord; private_data (the ULP's bytes after the word).
    Defaults: Rev 2, C=1, S=1, IRD = ORD = 16, as the stack's own defaults.
    """

    name = "MPA Frame"
    decode_rule = "MPA-21"
    starts_pdu = True
    fields_desc = [
        StrFixedLenField("key", MPA_KEY_REQ, MPA_KEY_LEN),
        BitField("markers", 0, _width(MpaFlag.MARKERS)),
        BitField("crc", 1, _width(MpaFlag.CRC)),
        BitField("reject", 0, _width(MpaFlag.REJECT)),
        BitField("enhanced", 1, _width(MpaFlag.ENHANCED)),
        XBitField("res", 0, _width(MPA_RESERVED_MASK)),
        ByteField("rev", MPA_REV_2),
        ShortField("pd_length", None),
        _word_bit("p2p", 0),
        _word_bit("rtr_send", 0),
        _word_bit("ird", 16, _width(MPA_V2_IRD_MASK)),
        _word_bit("rtr_write", 0),
        _word_bit("rtr_read", 0),
        _word_bit("ord", 16, _width(MPA_V2_ORD_MASK)),
        StrLenField("private_data", b"", length_from=_private_data_len),
    ]

    @classmethod
    def dispatch_hook(cls, _pkt: bytes | None = None, *args: Any, **kargs: Any) -> type[Packet]:
        if cls is MPA_Frame and _pkt:
            if _pkt[:MPA_KEY_LEN] == MPA_KEY_REP:
                return MPA_Reply
            if _pkt[:MPA_KEY_LEN] == MPA_KEY_REQ:
                return MPA_Request
        return cls

    def post_build(self, pkt: bytes, pay: bytes) -> bytes:
        if self.pd_length is None:
            pd_length = len(pkt) - MPA_FRAME_HEADER_LEN
            at = MPA_FRAME_HEADER_LEN - 2
            pkt = pkt[:at] + _BE16.pack(pd_length & 0xFFFF) + pkt[at + 2 :]
        return pkt + pay

    def guess_payload_class(self, payload: bytes) -> type[Packet]:
        return conf.raw_layer

    def has_ird_ord(self) -> bool:
        """Whether the frame carries the RFC 6581 IRD/ORD word (S set and PD_Length >= 4)."""
        return _has_ird_ord(self)

    def mysummary(self) -> str:
        flags = "".join(
            c
            for c, bit in zip(
                "MCRS", (self.markers, self.crc, self.reject, self.enhanced), strict=True
            )
            if bit
        )
        word = f" IRD={self.ird} ORD={self.ord}" if _has_ird_ord(self) else ""
        return self.sprintf(f"{self.name} rev=%rev% flags={flags or '-'}{word}")


class MPA_Request(MPA_Frame):
    """MPA Request frame (key ``MPA ID Req Frame``)."""

    name = "MPA Request"


class MPA_Reply(MPA_Frame):
    """MPA Reply frame (key ``MPA ID Rep Frame``); bytes after it dissect as FPDUs.

    An accepting Reply may share its TCP segment with the first FPDU; leading ``00 00 00 00``
    is taken as the FPDUPTR-0 marker of a marked stream (a real ULPDU_Length is never 0).
    """

    name = "MPA Reply"
    fields_desc = [
        StrFixedLenField("key", MPA_KEY_REP, MPA_KEY_LEN),
        *MPA_Frame.fields_desc[1:],
    ]

    def guess_payload_class(self, payload: bytes) -> type[Packet]:
        if self.reject:
            return conf.raw_layer
        if payload[:MPA_MARKER_LEN] == bytes(MPA_MARKER_LEN):
            return MPA_Marker
        return MPA_FPDU


# ======================================================================================
# Marker (RFC 5044 §4.2, §4.3)
# ======================================================================================


class MPA_Marker(_IwarpPacket):
    """MPA marker: reserved (16, MUST be 0) and FPDUPTR (16; low 2 bits 0, MPA-06/08)."""

    name = "MPA Marker"
    decode_rule = "MPA-06"
    starts_pdu = True
    fields_desc = [XShortField("reserved", 0), ShortField("fpduptr", 0)]

    def guess_payload_class(self, payload: bytes) -> type[Packet]:
        return MPA_FPDU

    def mysummary(self) -> str:
        return self.sprintf("MPA Marker FPDUPTR=%fpduptr%")


# ======================================================================================
# FPDU (RFC 5044 §4.1, §4.4)
# ======================================================================================


class MPA_FPDU(_IwarpPacket):
    """One FPDU: ``ULPDU_Length | ULPDU (payload) | PAD | CRC`` without markers.

    Fields: ulpdu_length (auto: payload length), pad (auto: zero bytes to the 4-byte
    boundary of the actual payload), crc (auto: CRC32c of length + ULPDU + pad; the value,
    sent LSB first).  :meth:`crc_ok` gives the verdict.  A dissected FPDU cut short keeps
    exactly the bytes it had: ``crc`` is then None, :meth:`is_truncated` is true and the
    wire-less field ``truncated`` (shown by show() and the summary) counts the bytes
    missing up to the end of the CRC (MPA-16); ``iwarp_error`` says so too.

    An FPDU taken from a marked stream (:class:`~stack.dissect.scapy.streams.FpduSplitter`,
    :meth:`~stack.dissect.scapy.session.MPA.tcp_reassemble`, records) is marker-free; it
    remembers the markers it held (``wire_markers``: ``(position from its first wire byte,
    MPA_Marker)``) and its CRC input as sent, markers included, so :meth:`crc_ok` judges the
    wire CRC (RFC 5044 §4.4, MPA-12).
    """

    name = "MPA FPDU"
    decode_rule = "MPA-16"
    starts_pdu = True
    __slots__ = ["_partial_crc", "_covered", "_wire_markers"]
    fields_desc = [
        ShortField("ulpdu_length", None),
        XStrField("pad", None),
        XLEIntField("crc", None),
        ConditionalField(_NoWireField("truncated", 0), lambda p: bool(p.missing_bytes())),
    ]

    def do_dissect(self, s: bytes) -> bytes:
        if len(s) < MPA_LENGTH_LEN:
            raise DecodeError(self.decode_rule, f"FPDU shorter than its length field ({len(s)})")
        length = _BE16.unpack_from(s)[0]
        ulpdu_end = MPA_LENGTH_LEN + length
        pad_end = ulpdu_end + _pad_len(length)
        ulpdu = s[MPA_LENGTH_LEN:ulpdu_end]
        crc_bytes = s[pad_end : pad_end + MPA_CRC_LEN]
        self.raw_packet_cache_fields = {}
        self.fields["ulpdu_length"] = length
        self.fields["pad"] = s[ulpdu_end:pad_end]
        if len(crc_bytes) == MPA_CRC_LEN:
            self.fields["crc"] = _LE32.unpack(crc_bytes)[0]
        else:
            self.fields["crc"] = None
            self.fields["truncated"] = pad_end + MPA_CRC_LEN - len(s)
            object.__setattr__(self, "_partial_crc", crc_bytes)
        # No raw cache: post_build reassembles header, ULPDU and trailer from the fields.
        self.raw_packet_cache = None
        self.explicit = 1
        return ulpdu + s[pad_end + MPA_CRC_LEN :]

    def extract_padding(self, s: bytes) -> tuple[bytes, bytes]:
        n = self.ulpdu_length or 0
        return s[:n], s[n:]

    def guess_payload_class(self, payload: bytes) -> type[Packet]:
        return DDP_Tagged if payload[0] & DDP_TAGGED else DDP_Untagged

    def _default_crc(self, covered: bytes) -> int:
        return crc32c(covered)

    def do_build(self) -> bytes:
        own, following = self._build_own()
        return own if following is None else own + following.do_build()

    def _build_own(self) -> tuple[bytes, Packet | None]:
        """This FPDU's bytes alone (its PAD and CRC follow its own ULPDU, not the next PDU
        stacked after it) and that next PDU."""
        following = self.next_pdu()
        if following is None:
            return super().do_build(), None
        under = following.underlayer
        if under is None:
            return super().do_build(), None
        under.remove_payload()
        try:
            return super().do_build(), following
        finally:
            under.add_payload(following)

    def post_build(self, pkt: bytes, pay: bytes) -> bytes:
        length = len(pay) if self.ulpdu_length is None else self.ulpdu_length
        pad = bytes(_pad_len(len(pay))) if self.pad is None else bytes(self.pad)
        body = _BE16.pack(length & 0xFFFF) + pay + pad
        partial = getattr(self, "_partial_crc", None)
        if self.crc is not None:
            return body + _LE32.pack(self.crc & 0xFFFFFFFF)
        if partial is not None:
            return body + partial
        return body + _LE32.pack(self._default_crc(body))

    def is_truncated(self) -> bool:
        """True when dissected from bytes that ended before the CRC field was complete."""
        return self.crc is None and getattr(self, "_partial_crc", None) is not None

    def missing_bytes(self) -> int:
        """Bytes missing up to the end of the CRC field (0 unless truncated)."""
        return int(self.fields.get("truncated", 0))

    def own_error(self) -> str | None:
        if not self.is_truncated():
            return None
        return f"MPA-16: FPDU truncated, {self.missing_bytes()} bytes missing up to the CRC end"

    @property
    def wire_markers(self) -> tuple[tuple[int, Packet], ...]:
        """Markers this FPDU held on the wire (marked streams only), by position."""
        return getattr(self, "_wire_markers", ())

    def set_wire(self, covered: bytes, markers: tuple[tuple[int, Packet], ...]) -> None:
        """Record the CRC input as sent (markers included) and the markers held (MPA-12)."""
        object.__setattr__(self, "_covered", covered)
        object.__setattr__(self, "_wire_markers", markers)

    def crc_ok(self, covered: bytes | None = None) -> bool | None:
        """CRC verdict (MPA-12): does the CRC field match the covered bytes?

        ``covered`` replaces this FPDU's own bytes (length through PAD) as the CRC input,
        for an FPDU taken from a marked stream (markers are covered too, RFC 5044 §4.4);
        see :func:`~stack.dissect.scapy.streams.split_marked_fpdus`.  A truncated FPDU is
        never OK.
        """
        if self.is_truncated():
            return False
        wire = self._build_own()[0]
        if len(wire) < MPA_LENGTH_LEN + MPA_CRC_LEN:
            return False
        if covered is None:
            covered = getattr(self, "_covered", None)
        data = wire[:-MPA_CRC_LEN] if covered is None else covered
        return crc32c(data) == _LE32.unpack(wire[-MPA_CRC_LEN:])[0]

    def mysummary(self) -> str:
        if self.is_truncated():
            return self.sprintf(
                f"{self.name} len=%ulpdu_length% TRUNCATED ({self.missing_bytes()} bytes missing)"
            )
        verdict = self.crc_ok()
        state = "n/a" if verdict is None else ("good" if verdict else "BAD")
        marks = f" markers={len(self.wire_markers)}" if self.wire_markers else ""
        return self.sprintf(f"{self.name} len=%ulpdu_length% crc={state}{marks}")


class MPA_FPDU_NoCRC(MPA_FPDU):
    """FPDU on a connection without CRC (C=0 both ways): an auto CRC field is sent as 0
    (as siw does) and :meth:`crc_ok` returns None because the field MUST NOT be checked
    (MPA-05)."""

    name = "MPA FPDU (no CRC)"

    def _default_crc(self, covered: bytes) -> int:
        return 0

    def crc_ok(self, covered: bytes | None = None) -> bool | None:
        return None
