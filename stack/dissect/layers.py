"""Scapy layers for iWARP: MPA (RFC 5044, RFC 6581), DDP (RFC 5041), RDMAP (RFC 5040, RFC 7306).

For dissecting, crafting and fuzzing; never the data path (the sans-IO core in ``stack.wire``
is).  Digest: ``shared/specs/iwarp-wire.md`` (section numbers below refer to it).

Layer stack of one FPDU (digest §1)::

    MPA_FPDU / DDP_Tagged   / RDMAP_Write | RDMAP_ReadResponse / Raw(payload)
    MPA_FPDU / DDP_Untagged / RDMAP_Send | RDMAP_SendInvalidate | RDMAP_SendSE |
                              RDMAP_SendSEInvalidate | RDMAP_ReadRequest | RDMAP_Terminate |
                              RDMAP_ImmediateData(SE) | RDMAP_AtomicRequest |
                              RDMAP_AtomicResponse [/ Raw]

How DDP and RDMAP are split: the RDMAP control byte (RV, Rsv, opcode) and the Invalidate
STag are DDP's RsvdULP (§4.1), so they are fields of the DDP layers (``rv``, ``rsv``,
``opcode``, ``inval_stag``).  Each RDMAP layer is bound to its opcode (and, when built, to
its QN) with ``bind_top_down``/``bind_bottom_up``, Scapy's ``IP()/TCP()`` idiom: stacking
``DDP_Untagged()/RDMAP_ReadRequest()`` sets opcode 1 and QN 1 unless given explicitly, and
dissection picks the RDMAP layer from the opcode.  Opcodes without an RDMAP header get an
empty layer that names the opcode (``RDMAP_Send``...), present even when zero-length.

The FPDU's PAD and CRC follow the ULPDU; :class:`MPA_FPDU` keeps them as its own fields
(``pad``, ``crc``) and bytes after the CRC (the next FPDU) become Scapy ``Padding``.  The
CRC field is the CRC32c value, sent least significant byte first (§2.4).  Every automatic
field (``ulpdu_length``, ``pad``, ``crc``, ``pd_length``) is computed only while it is
``None``; any explicit value, however wrong, is emitted as given.

Markers are stream-level (§2.5), so they are handled by :func:`insert_markers`,
:func:`strip_markers` and :func:`split_marked_fpdus` rather than inside the FPDU layer.

A header too short to dissect raises :class:`~stack.errors.DecodeError` at the top layer;
inside a packet Scapy turns it into ``Raw`` as usual.
"""

from __future__ import annotations

import struct
from bisect import bisect_left, bisect_right
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from scapy.config import conf
from scapy.fields import (
    BitEnumField,
    BitField,
    ByteField,
    ConditionalField,
    Field,
    IntEnumField,
    IntField,
    PacketField,
    ShortField,
    StrFixedLenField,
    StrLenField,
    XBitField,
    XIntField,
    XLEIntField,
    XLongField,
    XShortField,
    XStrField,
    XStrFixedLenField,
)
from scapy.packet import Packet, Raw, bind_bottom_up, bind_top_down

from stack.constants import (
    ALL_ONES_64,
    ATOMIC_OPCODE_MASK,
    DDP_DV_MASK,
    DDP_RSVD_MASK,
    DDP_TAGGED,
    DDP_TAGGED_HDR_LEN,
    DDP_UNTAGGED_HDR_LEN,
    DDP_VERSION,
    MPA_CRC_LEN,
    MPA_FRAME_HEADER_LEN,
    MPA_IRD_ORD_LEN,
    MPA_KEY_LEN,
    MPA_KEY_REP,
    MPA_KEY_REQ,
    MPA_LENGTH_LEN,
    MPA_MARKER_INTERVAL,
    MPA_MARKER_LEN,
    MPA_RESERVED_MASK,
    MPA_REV_2,
    MPA_V2_IRD_MASK,
    MPA_V2_ORD_MASK,
    OPCODE_NAMES,
    OPCODE_QN,
    RDMAP_OPCODE_MASK,
    RDMAP_RSVD_MASK,
    RDMAP_RV_MASK,
    RDMAP_VERSION,
    READ_REQUEST_HDR_LEN,
    TERM_ETYPE_MASK,
    TERM_ETYPE_NAMES,
    TERM_LAYER_MASK,
    TERM_LAYER_NAMES,
    TERM_RSVD_MASK,
    AtomicOpcode,
    MpaFlag,
    Opcode,
    QueueNumber,
    TermLayer,
    term_name,
)
from stack.crc import crc32c
from stack.errors import DecodeError
from stack.wire.framing import mark_fpdu
from stack.wire.terminate import terminate_headers

__all__ = [
    "ATOMIC_OPCODE_DISPLAY",
    "DDP",
    "DDP_Tagged",
    "DDP_Untagged",
    "MPA_FPDU",
    "MPA_FPDU_NoCRC",
    "MPA_Frame",
    "MPA_Marker",
    "MPA_Reply",
    "MPA_Request",
    "MarkedFpdu",
    "RDMAP_AtomicRequest",
    "RDMAP_AtomicResponse",
    "RDMAP_ImmediateData",
    "RDMAP_ImmediateDataSE",
    "RDMAP_ReadRequest",
    "RDMAP_ReadResponse",
    "RDMAP_Send",
    "RDMAP_SendInvalidate",
    "RDMAP_SendSE",
    "RDMAP_SendSEInvalidate",
    "RDMAP_Terminate",
    "RDMAP_Write",
    "atomic_cmp_swap_fpdu",
    "atomic_fetch_add_fpdu",
    "atomic_response_fpdu",
    "immediate_data_fpdu",
    "insert_markers",
    "read_request_fpdu",
    "read_response_fpdu",
    "send_fpdu",
    "split_fpdus",
    "split_marked_fpdus",
    "strip_markers",
    "terminate_fpdu",
    "write_fpdu",
]

_LE32 = struct.Struct("<I")
_BE16 = struct.Struct(">H")
_MARKER = struct.Struct(">HH")

ATOMIC_OPCODE_DISPLAY: dict[int, str] = {
    AtomicOpcode.FETCH_ADD: "FetchAdd",
    AtomicOpcode.CMP_SWAP: "CmpSwap",
}
"""AOpCode names (RFC 7306 §5.2.1; 1 is reserved, the rest unassigned)."""

_QN_NAMES: dict[int, str] = {q.value: q.name.replace("_", " ").title() for q in QueueNumber}


def _width(mask: int) -> int:
    """Bit width of a contiguous field mask from :mod:`stack.constants`."""
    return bin(mask).count("1")


def _pad_len(ulpdu_length: int) -> int:
    """PAD so that 2 + ULPDU_Length + PAD is a multiple of 4 (MPA-04)."""
    return -(MPA_LENGTH_LEN + ulpdu_length) & 3


# ======================================================================================
# Common base
# ======================================================================================


class _IwarpPacket(Packet):
    """Base of every layer here: truncated headers raise DecodeError; extra slots are copied."""

    decode_rule = "MPA-16"
    """Rule ID reported when this layer's header is truncated."""
    match_subclass = True  # pkt[MPA_FPDU] also finds MPA_FPDU_NoCRC, pkt[DDP] both DDPs

    def do_dissect(self, s: bytes) -> bytes:
        try:
            return super().do_dissect(s)
        except (struct.error, IndexError) as exc:
            raise DecodeError(
                self.decode_rule, f"{self.name}: header truncated ({len(s)} bytes)"
            ) from exc

    def copy(self) -> Any:
        clone = super().copy()
        for attr in type(self).__all_slots__ - set(Packet.__slots__):
            if hasattr(self, attr):
                object.__setattr__(clone, attr, getattr(self, attr))
        return clone


# ======================================================================================
# MPA Request / Reply (RFC 5044 §7.1.1, RFC 6581 §6, §9; digest §2.1, §3.2)
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
    """MPA Request or Reply (digest §2.1); ``MPA_Frame(raw)`` dispatches on the key.

    Fields: key; flag bits markers (M), crc (C), reject (R), enhanced (S, RFC 6581), res
    (reserved, 4 bits); rev; pd_length (auto: word + private data); when S is set and
    PD_Length leaves room, the RFC 6581 IRD/ORD word (ERC-03): p2p (A), rtr_send (B), ird,
    rtr_write (C), rtr_read (D), ord; private_data (the ULP's bytes after the word).
    Defaults: Rev 2, C=1, S=1, IRD = ORD = 16, as the stack's own defaults.
    """

    name = "MPA Frame"
    decode_rule = "MPA-21"
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
# Marker (RFC 5044 §4.2, §4.3; digest §2.5)
# ======================================================================================


class MPA_Marker(_IwarpPacket):
    """MPA marker: reserved (16, MUST be 0) and FPDUPTR (16; low 2 bits 0, MPA-06/08)."""

    name = "MPA Marker"
    decode_rule = "MPA-06"
    fields_desc = [XShortField("reserved", 0), ShortField("fpduptr", 0)]

    def guess_payload_class(self, payload: bytes) -> type[Packet]:
        return MPA_FPDU

    def mysummary(self) -> str:
        return self.sprintf("MPA Marker FPDUPTR=%fpduptr%")


# ======================================================================================
# FPDU (RFC 5044 §4.1, §4.4; digest §2.3, §2.4)
# ======================================================================================


class MPA_FPDU(_IwarpPacket):
    """One FPDU: ``ULPDU_Length | ULPDU (payload) | PAD | CRC`` without markers.

    Fields: ulpdu_length (auto: payload length), pad (auto: zero bytes to the 4-byte
    boundary of the actual payload), crc (auto: CRC32c of length + ULPDU + pad; the value,
    sent LSB first).  :meth:`crc_ok` gives the verdict.  A dissected FPDU cut short keeps
    exactly the bytes it had (``crc`` is then None and :meth:`is_truncated` is true).
    """

    name = "MPA FPDU"
    decode_rule = "MPA-16"
    __slots__ = ["_partial_crc"]
    fields_desc = [
        ShortField("ulpdu_length", None),
        XStrField("pad", None),
        XLEIntField("crc", None),
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

    def crc_ok(self, covered: bytes | None = None) -> bool | None:
        """CRC verdict (MPA-12): does the CRC field match the covered bytes?

        ``covered`` replaces this FPDU's own bytes (length through PAD) as the CRC input,
        for an FPDU taken from a marked stream (markers are covered too, §2.4); see
        :func:`split_marked_fpdus`.  A truncated FPDU is never OK.
        """
        if self.is_truncated():
            return False
        wire = self.do_build()
        if len(wire) < MPA_LENGTH_LEN + MPA_CRC_LEN:
            return False
        data = wire[:-MPA_CRC_LEN] if covered is None else covered
        return crc32c(data) == _LE32.unpack(wire[-MPA_CRC_LEN:])[0]

    def mysummary(self) -> str:
        verdict = self.crc_ok()
        state = "n/a" if verdict is None else ("good" if verdict else "BAD")
        return self.sprintf(f"{self.name} len=%ulpdu_length% crc={state}")


class MPA_FPDU_NoCRC(MPA_FPDU):
    """FPDU on a connection without CRC (C=0 both ways): an auto CRC field is sent as 0
    (as siw does) and :meth:`crc_ok` returns None because the field MUST NOT be checked
    (MPA-05)."""

    name = "MPA FPDU (no CRC)"

    def _default_crc(self, covered: bytes) -> int:
        return 0

    def crc_ok(self, covered: bytes | None = None) -> bool | None:
        return None


# ======================================================================================
# DDP (RFC 5041 §4; digest §1, §4.1) with the RDMAP control in RsvdULP (RFC 5040 §4.1)
# ======================================================================================


def _ddp_ctrl(tagged: int) -> list[Field[Any, Any]]:
    return [
        BitField("tagged", tagged, _width(DDP_TAGGED)),
        BitField("last", 1, 1),
        XBitField("rsvd", 0, _width(DDP_RSVD_MASK)),
        BitField("dv", DDP_VERSION, _width(DDP_DV_MASK)),
        BitField("rv", RDMAP_VERSION, _width(RDMAP_RV_MASK)),
        XBitField("rsv", 0, _width(RDMAP_RSVD_MASK)),
        BitEnumField(
            "opcode",
            Opcode.RDMA_WRITE if tagged else Opcode.SEND,
            _width(RDMAP_OPCODE_MASK),
            OPCODE_NAMES,
        ),
    ]


class DDP(_IwarpPacket):
    """DDP segment header; ``DDP(raw)`` dispatches on the T bit to the two real layers."""

    name = "DDP"
    decode_rule = "DDP-10"
    fields_desc: list[Field[Any, Any]] = []

    @classmethod
    def dispatch_hook(cls, _pkt: bytes | None = None, *args: Any, **kargs: Any) -> type[Packet]:
        if cls is DDP:
            return DDP_Tagged if _pkt and _pkt[0] & DDP_TAGGED else DDP_Untagged
        return cls

    def do_dissect_payload(self, s: bytes) -> None:
        if s:
            super().do_dissect_payload(s)
            return
        # A zero-length message still has its (header-less) RDMAP layer, e.g. an RTR.
        cls = self.guess_payload_class(s)
        if isinstance(cls, type) and issubclass(cls, _RdmapNoHeader):
            self.add_payload(cls(_internal=1, _underlayer=self))


class DDP_Tagged(DDP):
    """Tagged DDP header, 14 bytes (T=1): control, RDMAP control (RsvdULP), STag, TO."""

    name = "DDP Tagged"
    fields_desc = [*_ddp_ctrl(1), XIntField("stag", 0), XLongField("to", 0)]

    def mysummary(self) -> str:
        return self.sprintf("DDP tagged STag=%stag% TO=%to% L=%last% %opcode%")


class DDP_Untagged(DDP):
    """Untagged DDP header, 18 bytes (T=0): control, RDMAP control and Invalidate STag
    (together RsvdULP), QN, MSN (default 1, DDP-05), MO."""

    name = "DDP Untagged"
    fields_desc = [
        *_ddp_ctrl(0),
        XIntField("inval_stag", 0),
        IntEnumField("qn", QueueNumber.SEND, _QN_NAMES),
        IntField("msn", 1),
        IntField("mo", 0),
    ]

    def mysummary(self) -> str:
        return self.sprintf("DDP untagged QN=%qn% MSN=%msn% MO=%mo% L=%last% %opcode%")


# ======================================================================================
# RDMAP headers (RFC 5040 §4, RFC 7306 §5-6; digest §5, §6)
# ======================================================================================


class _RdmapNoHeader(_IwarpPacket):
    """An RDMAP message with no header of its own; the layer names the opcode."""

    decode_rule = "RDMAP-02"
    fields_desc: list[Field[Any, Any]] = []


class RDMAP_Write(_RdmapNoHeader):
    """RDMA Write (opcode 0x0, tagged); the payload follows as Raw."""

    name = "RDMAP RDMA Write"


class RDMAP_ReadResponse(_RdmapNoHeader):
    """RDMA Read Response (opcode 0x2, tagged)."""

    name = "RDMAP RDMA Read Response"


class RDMAP_Send(_RdmapNoHeader):
    """Send (opcode 0x3, QN 0)."""

    name = "RDMAP Send"


class RDMAP_SendInvalidate(_RdmapNoHeader):
    """Send with Invalidate (opcode 0x4); the STag is the DDP layer's ``inval_stag``."""

    name = "RDMAP Send with Invalidate"


class RDMAP_SendSE(_RdmapNoHeader):
    """Send with Solicited Event (opcode 0x5)."""

    name = "RDMAP Send with SE"


class RDMAP_SendSEInvalidate(_RdmapNoHeader):
    """Send with SE and Invalidate (opcode 0x6); the STag is the DDP ``inval_stag``."""

    name = "RDMAP Send with SE and Invalidate"


class RDMAP_ReadRequest(_IwarpPacket):
    """RDMA Read Request header, 28 bytes (opcode 0x1, QN 1, RDMAP-04, digest §5.2)."""

    name = "RDMAP Read Request"
    decode_rule = "RDMAP-04"
    fields_desc = [
        XIntField("sink_stag", 0),
        XLongField("sink_to", 0),
        IntField("size", 0),
        XIntField("src_stag", 0),
        XLongField("src_to", 0),
    ]

    def mysummary(self) -> str:
        return self.sprintf(
            "Read Request sink=%sink_stag%/%sink_to% size=%size% src=%src_stag%/%src_to%"
        )


class _TermETypeField(BitField):
    """Terminate error type, named per layer (RFC 5040 §4.8)."""

    def i2repr(self, pkt: Packet | None, x: int) -> str:
        layer = pkt.layer if pkt is not None else None
        name = TERM_ETYPE_NAMES.get((layer, x)) if layer is not None else None
        return f"{x} ({name})" if name else str(x)


class _TermCodeField(ByteField):
    """Terminate error code, named from (layer, etype, code)."""

    def i2repr(self, pkt: Packet | None, x: int) -> str:
        if pkt is None or x is None:
            return repr(x)
        return f"0x{x:02x} ({term_name((pkt.layer, pkt.etype, x))})"


class _OptionalShortField(ShortField):
    """A 16-bit field that is simply absent when fewer than 2 bytes remain."""

    def getfield(self, pkt: Packet, s: bytes) -> tuple[bytes, int | None]:
        if len(s) < 2:
            return s, None
        return super().getfield(pkt, s)


class _CopiedHeaderField(PacketField):
    """A header copied into a Terminate, bounded by the bytes present (§5.4).

    ``rdma=False``: the terminated DDP header, 14 or 18 bytes by its own T bit.
    ``rdma=True``: the terminated 28-byte Read Request header.  A partial copy is Raw.
    """

    __slots__ = ["rdma"]

    def __init__(self, name: str, rdma: bool) -> None:
        super().__init__(name, None, RDMAP_ReadRequest if rdma else DDP)
        self.rdma = rdma

    def getfield(self, pkt: Packet, s: bytes) -> tuple[bytes, Packet | None]:
        if not s:
            return s, None
        if self.rdma:
            n = READ_REQUEST_HDR_LEN
        else:
            n = DDP_TAGGED_HDR_LEN if s[0] & DDP_TAGGED else DDP_UNTAGGED_HDR_LEN
        chunk, rest = s[:n], s[n:]
        if len(chunk) < n:
            return rest, conf.raw_layer(chunk)
        hdr = self.cls(chunk)
        hdr.remove_payload()
        return rest, hdr


class RDMAP_Terminate(_IwarpPacket):
    """Terminate header (opcode 0x7, QN 2, RFC 5040 §4.8, RDMAP-11; digest §5.4).

    Fields: layer, etype, code (named from the stack.constants tables), m, d, r,
    reserved (13 bits); when d: ddp_seg_len and ddp_hdr (the terminated DDP header as
    a DDP layer, 14 or 18 bytes by its own T bit, not by EType as Wireshark does); when r:
    rdma_hdr (the 28-byte Read Request header, absent if not sent, as siw does).  Copies
    are bounded by the bytes present; a partial copy is Raw.
    """

    name = "RDMAP Terminate"
    decode_rule = "RDMAP-11"
    fields_desc = [
        BitEnumField("layer", TermLayer.RDMAP, _width(TERM_LAYER_MASK), TERM_LAYER_NAMES),
        _TermETypeField("etype", 0, _width(TERM_ETYPE_MASK)),
        _TermCodeField("code", 0),  # TERM_CODE_MASK: one byte
        BitField("m", 0, 1),
        BitField("d", 0, 1),
        BitField("r", 0, 1),
        XBitField("reserved", 0, _width(TERM_RSVD_MASK)),
        ConditionalField(_OptionalShortField("ddp_seg_len", 0), lambda p: p.d),
        ConditionalField(_CopiedHeaderField("ddp_hdr", rdma=False), lambda p: p.d),
        ConditionalField(_CopiedHeaderField("rdma_hdr", rdma=True), lambda p: p.r),
    ]

    def mysummary(self) -> str:
        cause = term_name((self.layer, self.etype, self.code))
        return f"Terminate {self.layer}/{self.etype}/0x{self.code:02x} {cause}"


class RDMAP_ImmediateData(_IwarpPacket):
    """Immediate Data (opcode 0x8, QN 0): exactly 8 bytes (RFC 7306 §6, EXT-09)."""

    name = "RDMAP Immediate Data"
    decode_rule = "EXT-09"
    fields_desc = [XStrFixedLenField("data", bytes(8), 8)]


class RDMAP_ImmediateDataSE(RDMAP_ImmediateData):
    """Immediate Data with Solicited Event (opcode 0x9, QN 0)."""

    name = "RDMAP Immediate Data with SE"


class RDMAP_AtomicRequest(_IwarpPacket):
    """Atomic Request header, 52 bytes (opcode 0xA, QN 1, RFC 7306 §5.2.1; digest §6.2).

    Defaults make a plain FetchAdd: Add Mask 0 (a set bit splits the add, digest §6.4),
    Compare Data 0, Compare Mask all-ones.
    """

    name = "RDMAP Atomic Request"
    decode_rule = "EXT-11"
    fields_desc = [
        XBitField("reserved", 0, 32 - _width(ATOMIC_OPCODE_MASK)),
        BitEnumField(
            "aopcode", AtomicOpcode.FETCH_ADD, _width(ATOMIC_OPCODE_MASK), ATOMIC_OPCODE_DISPLAY
        ),
        XIntField("req_id", 0),
        XIntField("remote_stag", 0),
        XLongField("remote_to", 0),
        XLongField("add_swap_data", 0),
        XLongField("add_swap_mask", 0),
        XLongField("compare_data", 0),
        XLongField("compare_mask", ALL_ONES_64),
    ]

    def mysummary(self) -> str:
        return self.sprintf("Atomic %aopcode% id=%req_id% %remote_stag%/%remote_to%")


class RDMAP_AtomicResponse(_IwarpPacket):
    """Atomic Response header, 12 bytes (opcode 0xB, QN 3, RFC 7306 §5.2.2).

    Fields: orig_req_id (Original Request Identifier), orig_value (Original Remote Data
    Value, the 64-bit value before the operation; Wireshark mislabels it).
    """

    name = "RDMAP Atomic Response"
    decode_rule = "EXT-11"
    fields_desc = [XIntField("orig_req_id", 0), XLongField("orig_value", 0)]


# ======================================================================================
# Bindings: opcode for dissection; opcode and QN for building
# ======================================================================================

_TAGGED_LAYERS: dict[int, type[Packet]] = {
    Opcode.RDMA_WRITE: RDMAP_Write,
    Opcode.RDMA_READ_RESPONSE: RDMAP_ReadResponse,
}
_UNTAGGED_LAYERS: dict[int, type[Packet]] = {
    Opcode.RDMA_READ_REQUEST: RDMAP_ReadRequest,
    Opcode.SEND: RDMAP_Send,
    Opcode.SEND_INVALIDATE: RDMAP_SendInvalidate,
    Opcode.SEND_SE: RDMAP_SendSE,
    Opcode.SEND_SE_INVALIDATE: RDMAP_SendSEInvalidate,
    Opcode.TERMINATE: RDMAP_Terminate,
    Opcode.IMMEDIATE_DATA: RDMAP_ImmediateData,
    Opcode.IMMEDIATE_DATA_SE: RDMAP_ImmediateDataSE,
    Opcode.ATOMIC_REQUEST: RDMAP_AtomicRequest,
    Opcode.ATOMIC_RESPONSE: RDMAP_AtomicResponse,
}

for _op, _cls in _TAGGED_LAYERS.items():
    bind_bottom_up(DDP_Tagged, _cls, opcode=int(_op))
    bind_top_down(DDP_Tagged, _cls, opcode=int(_op))
for _op, _cls in _UNTAGGED_LAYERS.items():
    bind_bottom_up(DDP_Untagged, _cls, opcode=int(_op))
    bind_top_down(DDP_Untagged, _cls, opcode=int(_op), qn=int(OPCODE_QN[_op]))


# ======================================================================================
# Convenience constructors (whole FPDUs; every field stays overridable afterwards)
# ======================================================================================


def _frame(crc: bool) -> Packet:
    return MPA_FPDU() if crc else MPA_FPDU_NoCRC()


def _with_data(pkt: Packet, data: bytes) -> Packet:
    return pkt / Raw(data) if data else pkt


def write_fpdu(
    stag: int, to: int, data: bytes = b"", *, last: bool = True, crc: bool = True
) -> Packet:
    """An RDMA Write segment (digest E2, E4)."""
    return _with_data(
        _frame(crc) / DDP_Tagged(stag=stag, to=to, last=int(last)) / RDMAP_Write(), data
    )


def read_response_fpdu(
    stag: int, to: int, data: bytes = b"", *, last: bool = True, crc: bool = True
) -> Packet:
    """An RDMA Read Response segment, tagged to the request's sink."""
    ddp = DDP_Tagged(stag=stag, to=to, last=int(last))
    return _with_data(_frame(crc) / ddp / RDMAP_ReadResponse(), data)


def read_request_fpdu(
    sink_stag: int,
    sink_to: int,
    size: int,
    src_stag: int,
    src_to: int,
    *,
    msn: int = 1,
    crc: bool = True,
) -> Packet:
    """An RDMA Read Request on QN 1 (digest E3)."""
    hdr = RDMAP_ReadRequest(
        sink_stag=sink_stag, sink_to=sink_to, size=size, src_stag=src_stag, src_to=src_to
    )
    return _frame(crc) / DDP_Untagged(msn=msn) / hdr


def send_fpdu(
    data: bytes = b"",
    *,
    msn: int = 1,
    mo: int = 0,
    last: bool = True,
    solicited: bool = False,
    inval_stag: int | None = None,
    crc: bool = True,
) -> Packet:
    """A Send-family segment on QN 0; ``inval_stag`` selects Send with Invalidate (E1)."""
    if inval_stag is None:
        rdmap: Packet = RDMAP_SendSE() if solicited else RDMAP_Send()
        ddp = DDP_Untagged(msn=msn, mo=mo, last=int(last))
    else:
        rdmap = RDMAP_SendSEInvalidate() if solicited else RDMAP_SendInvalidate()
        ddp = DDP_Untagged(msn=msn, mo=mo, last=int(last), inval_stag=inval_stag)
    return _with_data(_frame(crc) / ddp / rdmap, data)


def immediate_data_fpdu(
    data: bytes, *, msn: int = 1, solicited: bool = False, crc: bool = True
) -> Packet:
    """Immediate Data (with SE) on QN 0 (digest E9)."""
    layer = RDMAP_ImmediateDataSE if solicited else RDMAP_ImmediateData
    return _frame(crc) / DDP_Untagged(msn=msn) / layer(data=data)


def atomic_fetch_add_fpdu(
    req_id: int, stag: int, to: int, add: int, mask: int = 0, *, msn: int = 1, crc: bool = True
) -> Packet:
    """A FetchAdd Atomic Request on QN 1 (digest E7)."""
    hdr = RDMAP_AtomicRequest(
        aopcode=AtomicOpcode.FETCH_ADD,
        req_id=req_id,
        remote_stag=stag,
        remote_to=to,
        add_swap_data=add,
        add_swap_mask=mask,
        compare_data=0,
        compare_mask=ALL_ONES_64,
    )
    return _frame(crc) / DDP_Untagged(msn=msn) / hdr


def atomic_cmp_swap_fpdu(
    req_id: int,
    stag: int,
    to: int,
    compare: int,
    swap: int,
    compare_mask: int = ALL_ONES_64,
    swap_mask: int = ALL_ONES_64,
    *,
    msn: int = 1,
    crc: bool = True,
) -> Packet:
    """A CmpSwap Atomic Request on QN 1."""
    hdr = RDMAP_AtomicRequest(
        aopcode=AtomicOpcode.CMP_SWAP,
        req_id=req_id,
        remote_stag=stag,
        remote_to=to,
        add_swap_data=swap,
        add_swap_mask=swap_mask,
        compare_data=compare,
        compare_mask=compare_mask,
    )
    return _frame(crc) / DDP_Untagged(msn=msn) / hdr


def atomic_response_fpdu(req_id: int, orig_value: int, *, msn: int = 1, crc: bool = True) -> Packet:
    """An Atomic Response on QN 3 (digest E8)."""
    hdr = RDMAP_AtomicResponse(orig_req_id=req_id, orig_value=orig_value)
    return _frame(crc) / DDP_Untagged(msn=msn) / hdr


def terminate_fpdu(
    layer: int,
    etype: int,
    code: int,
    *,
    offending: bytes | Packet | None = None,
    m: bool | None = None,
    d: bool | None = None,
    r: bool | None = None,
    ddp_seg_len: int | None = None,
    crc: bool = True,
) -> Packet:
    """A Terminate on QN 2, MSN 1 (digest E5, E6).

    ``offending`` is the FPDU that caused it (bytes or packet, no markers); its
    ULPDU_Length, DDP header and, for a Read Request, 28-byte RDMA header are copied.
    M/D/R default to RFC 5040 Fig. 10 (:func:`stack.wire.terminate.terminate_headers`): D = M
    = a DDP header is copied and the cause is neither LLP nor local catastrophic; R = a Read
    Request header was copied for an RDMAP remote protection error.  Explicit
    m/d/r/ddp_seg_len win.
    """
    hdr: Packet | None = None
    rdma: Packet | None = None
    seg_len = 0
    opcode: int | None = None
    if offending is not None:
        raw = bytes(offending)
        seg_len = _BE16.unpack_from(raw)[0] if len(raw) >= MPA_LENGTH_LEN else 0
        ulpdu = raw[MPA_LENGTH_LEN : MPA_LENGTH_LEN + seg_len]
        if ulpdu:
            tagged = bool(ulpdu[0] & DDP_TAGGED)
            n = DDP_TAGGED_HDR_LEN if tagged else DDP_UNTAGGED_HDR_LEN
            hdr = DDP(ulpdu[:n]) if len(ulpdu) >= n else conf.raw_layer(ulpdu)
            hdr.remove_payload()
            if not tagged and len(ulpdu) > 1:
                opcode = ulpdu[1] & RDMAP_OPCODE_MASK
            rr = ulpdu[n : n + READ_REQUEST_HDR_LEN]
            if not tagged and opcode == Opcode.RDMA_READ_REQUEST and rr:
                rdma = RDMAP_ReadRequest(rr) if len(rr) == READ_REQUEST_HDR_LEN else Raw(rr)
    want_ddp, want_rdma = terminate_headers(layer, etype, opcode)
    if d is None:
        d = hdr is not None and want_ddp
    if m is None:
        m = d
    if r is None:
        r = rdma is not None and want_rdma
    term = RDMAP_Terminate(
        layer=layer,
        etype=etype,
        code=code,
        m=int(m),
        d=int(d),
        r=int(r),
        ddp_seg_len=seg_len if ddp_seg_len is None else ddp_seg_len,
        ddp_hdr=hdr if d else None,
        rdma_hdr=rdma if r else None,
    )
    ddp = DDP_Untagged(qn=QueueNumber.TERMINATE, msn=1, mo=0)
    return _frame(crc) / ddp / term


# ======================================================================================
# FPDU streams and markers (RFC 5044 §4.2-4.4; digest §2.5)
# ======================================================================================


def _as_bytes(fpdus: bytes | bytearray | Packet | Iterable[bytes | Packet]) -> bytes:
    if isinstance(fpdus, bytes | bytearray):
        return bytes(fpdus)
    if isinstance(fpdus, Packet):
        return bytes(fpdus)
    return b"".join(bytes(f) for f in fpdus)


def _fpdu_spans(clean: bytes) -> list[tuple[int, int, int]]:
    """(start, crc_start, end) of each FPDU in a marker-free stream, by ULPDU_Length.

    The last span may be cut short; a tail shorter than the length field is skipped.
    """
    spans = []
    at = 0
    while len(clean) - at >= MPA_LENGTH_LEN:
        length = _BE16.unpack_from(clean, at)[0]
        crc_start = min(len(clean), at + MPA_LENGTH_LEN + length + _pad_len(length))
        end = min(len(clean), crc_start + MPA_CRC_LEN)
        spans.append((at, crc_start, end))
        at = end
    return spans


def split_fpdus(data: bytes, *, crc: bool = True) -> list[Packet]:
    """Dissect a marker-free run of back-to-back FPDUs (e.g. one TCP payload) into packets."""
    cls = MPA_FPDU if crc else MPA_FPDU_NoCRC
    return [cls(data[start:end]) for start, _, end in _fpdu_spans(data)]


def insert_markers(
    fpdus: bytes | bytearray | Packet | Iterable[bytes | Packet],
    seq_start_offset: int = 0,
    *,
    adjust_crc: bool = True,
) -> bytes:
    """Insert markers into back-to-back FPDUs, as a marked sender does (MPA-07/08).

    ``seq_start_offset`` is the TCP sequence number of the first FPDU byte minus SeqStart
    (mod 2^32); markers go where ``(seq_start_offset + position) % 512 == 0``, a marker
    just before an FPDU gets FPDUPTR 0, the others the distance back to their FPDU's
    ULPDU_Length (:func:`stack.wire.framing.mark_fpdu`, the framer's geometry).  With
    ``adjust_crc`` each CRC is recomputed to cover the markers (MPA-12) while keeping its
    error: a CRC that was wrong by some XOR stays wrong by it.  Pass ``adjust_crc=False``
    for CRC-off streams.
    """
    clean = _as_bytes(fpdus)
    out = bytearray()
    spans = _fpdu_spans(clean)
    for start, crc_start, end in spans:
        cov_start = len(out)
        out += mark_fpdu(clean[start:end], seq_start_offset + cov_start)
        if adjust_crc and end - crc_start == MPA_CRC_LEN:
            error = _LE32.unpack_from(clean, crc_start)[0] ^ crc32c(clean[start:crc_start])
            fixed = crc32c(bytes(out[cov_start:-MPA_CRC_LEN])) ^ error
            out[-MPA_CRC_LEN:] = _LE32.pack(fixed)
    tail = clean[spans[-1][2] if spans else 0 :]  # too short to hold a length field
    if tail and (seq_start_offset + len(out)) % MPA_MARKER_INTERVAL == 0:
        out += _MARKER.pack(0, 0)
    out += tail
    return bytes(out)


def strip_markers(data: bytes, seq_start_offset: int = 0) -> tuple[bytes, list[tuple[int, Packet]]]:
    """Remove the markers from a marked stream (MPA-10).

    ``seq_start_offset`` is ``data[0]``'s sequence number minus SeqStart (mod 2^32); every
    4 bytes at ``(seq_start_offset + position) % 512 == 0`` are removed.  Returns the clean
    bytes and ``(position in data, MPA_Marker)`` for each complete marker.
    """
    out = bytearray()
    markers: list[tuple[int, Packet]] = []
    i = 0
    pos = -seq_start_offset % MPA_MARKER_INTERVAL
    while pos < len(data):
        out.extend(data[i:pos])
        raw = data[pos : pos + MPA_MARKER_LEN]
        if len(raw) == MPA_MARKER_LEN:
            markers.append((pos, MPA_Marker(raw)))
        i = pos + MPA_MARKER_LEN
        pos += MPA_MARKER_INTERVAL
    out.extend(data[i:])
    return bytes(out), markers


@dataclass(frozen=True, slots=True)
class MarkedFpdu:
    """One FPDU from a marked stream.

    Fields: offset (position of its ULPDU_Length in the marked data), fpdu (the
    marker-free MPA_FPDU packet), markers (``(position, MPA_Marker)`` it owns, including
    an FPDUPTR-0 marker just before it), crc_ok (verdict over the covered bytes with
    markers, §2.4; None when CRC is off).
    """

    offset: int
    fpdu: Packet
    markers: tuple[tuple[int, Packet], ...]
    crc_ok: bool | None


def split_marked_fpdus(
    data: bytes, seq_start_offset: int = 0, *, crc: bool = True
) -> list[MarkedFpdu]:
    """Strip markers, split the FPDUs and check each CRC over its marked bytes (MPA-12)."""
    clean, markers = strip_markers(data, seq_start_offset)
    # A marker removed before clean position q[j] shifts every later byte by 4.
    cleanpos = [pos - MPA_MARKER_LEN * j for j, (pos, _) in enumerate(markers)]

    def marked(c: int) -> int:
        return c + MPA_MARKER_LEN * bisect_right(cleanpos, c)

    cls = MPA_FPDU if crc else MPA_FPDU_NoCRC
    result = []
    for start, crc_start, end in _fpdu_spans(clean):
        fpdu = cls(clean[start:end])
        lo, hi = bisect_left(cleanpos, start), bisect_left(cleanpos, end)
        owned = tuple(markers[lo:hi])
        leading = lo < hi and cleanpos[lo] == start
        cov_start = marked(start) - (MPA_MARKER_LEN if leading else 0)
        verdict: bool | None = None
        if crc:
            covered = data[cov_start : marked(crc_start)]
            verdict = (
                end - crc_start == MPA_CRC_LEN
                and crc32c(covered) == _LE32.unpack(clean[crc_start:end])[0]
            )
        result.append(MarkedFpdu(marked(start), fpdu, owned, verdict))
    return result
