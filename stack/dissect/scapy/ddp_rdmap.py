"""Scapy layers for DDP (RFC 5041 §4) and RDMAP (RFC 5040 §4, RFC 7306 §5-6), with bindings.

The RDMAP control byte (RV, Rsv, opcode) and the Invalidate STag are DDP's RsvdULP
(RFC 5040 §4.1, RDMAP-02/03), so they are fields of the DDP layers (``rv``, ``rsv``,
``opcode``, ``inval_stag``).  Each RDMAP layer is bound to its opcode (and, when built,
to its QN) with ``bind_top_down``/``bind_bottom_up``, Scapy's ``IP()/TCP()`` idiom:
stacking ``DDP_Untagged()/RDMAP_ReadRequest()`` sets opcode 1 and QN 1 unless given
explicitly, and dissection picks the RDMAP layer from the opcode.  Opcodes without an
RDMAP header get an empty layer that names the opcode (``RDMAP_Send``...), present even
when zero-length (DDP-07).
"""

from __future__ import annotations

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
    XBitField,
    XIntField,
    XLongField,
    XStrFixedLenField,
)
from scapy.packet import Packet, bind_bottom_up, bind_top_down

from stack.constants import (
    ALL_ONES_64,
    ATOMIC_OPCODE_MASK,
    DDP_DV_MASK,
    DDP_RSVD_MASK,
    DDP_TAGGED,
    DDP_TAGGED_HDR_LEN,
    DDP_UNTAGGED_HDR_LEN,
    DDP_VERSION,
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
    Opcode,
    QueueNumber,
    TermLayer,
    term_name,
)
from stack.dissect.scapy.base import _IwarpPacket, _width

__all__ = [
    "ATOMIC_OPCODE_DISPLAY",
    "DDP",
    "DDP_Tagged",
    "DDP_Untagged",
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
]

ATOMIC_OPCODE_DISPLAY: dict[int, str] = {
    AtomicOpcode.FETCH_ADD: "FetchAdd",
    AtomicOpcode.CMP_SWAP: "CmpSwap",
}
"""AOpCode names (RFC 7306 §5.2.1; 1 is reserved, the rest unassigned)."""

_QN_NAMES: dict[int, str] = {q.value: q.name.replace("_", " ").title() for q in QueueNumber}

# ======================================================================================
# DDP (RFC 5041 §4) with the RDMAP control in RsvdULP (RFC 5040 §4.1)
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
    fields_desc = []

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
# RDMAP headers (RFC 5040 §4, RFC 7306 §5-6)
# ======================================================================================


class _RdmapNoHeader(_IwarpPacket):
    """An RDMAP message with no header of its own; the layer names the opcode."""

    decode_rule = "RDMAP-02"
    fields_desc = []


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
    """RDMA Read Request header, 28 bytes (opcode 0x1, QN 1, RFC 5040 §4.4, RDMAP-04)."""

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

    def getfield(self, pkt: Packet, s: bytes) -> tuple[bytes, int | None]:  # type: ignore[override]  # absent: None
        if len(s) < 2:
            return s, None
        return super().getfield(pkt, s)


class _CopiedHeaderField(PacketField):
    """A header copied into a Terminate, bounded by the bytes present (RFC 5040 §4.8).

    ``rdma=False``: the terminated DDP header, 14 or 18 bytes by its own T bit.
    ``rdma=True``: the terminated 28-byte Read Request header.  A partial copy is Raw.
    """

    __slots__ = ["rdma"]

    def __init__(self, name: str, rdma: bool) -> None:
        super().__init__(name, None, RDMAP_ReadRequest if rdma else DDP)
        self.rdma = rdma

    def getfield(self, pkt: Packet, s: bytes) -> tuple[bytes, Packet | None]:  # type: ignore[override]  # absent: None
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
    """Terminate header (opcode 0x7, QN 2, RFC 5040 §4.8, RDMAP-11).

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
    """Atomic Request header, 52 bytes (opcode 0xA, QN 1, RFC 7306 §5.2.1, EXT-02).

    Defaults make a plain FetchAdd: Add Mask 0 (a set bit splits the add, RFC 7306 §5.1,
    EXT-06), Compare Data 0, Compare Mask all-ones.
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
