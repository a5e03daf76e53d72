"""Scapy layers for KBTP messages (draft §5, docs/kbtp.md §5), bound above the RDMAP Sends.

For crafting, fuzzing and dissecting; the data path uses :mod:`kbtp.messages`.  The layers
are written independently of the format table :mod:`kbtp.formats` on purpose, as an oracle
the tests hold equal to it.  Importing this module binds the layers (and only then does
Scapy decode KBTP)::

    import kbtp.scapy_layers  # noqa: F401
    pkt = MPA_FPDU(raw)  # ... / RDMAP_Send / KBTP / KBTP_Load [/ KBTP_CompletionDescriptor]

Layer stack of one message (the payload of one Send, docs/kbtp.md §5)::

    KBTP / KBTP_Hello | KBTP_HelloAck | KBTP_Completion
    KBTP / KBTP_Load | KBTP_Store | KBTP_AllocStore | KBTP_Free | KBTP_Bind
         [/ KBTP_CompletionDescriptor]  (when the header's RECORD flag is set)
         [/ Raw]                        (inline data of an INLINE store; any trailing octets)

:class:`KBTP` is the 24-octet common header (draft §5.1); the body layer is chosen by its
opcode for dissection and sets it when stacked (``KBTP()/KBTP_Load()`` has opcode 0x10),
Scapy's ``IP()/TCP()`` idiom.  Bodies of LOAD, STORE and ALLOC_STORE are the Data
Descriptor (:class:`KBTP_DataDescriptor`); the Completion Descriptor is a layer of its own
so that it can be present or absent whatever the flags say.  Automatic fields (the HELLO
Identity Length, the Data Descriptor Length of a store) are computed only while ``None``;
every explicit value, however wrong, is emitted as given.

Binding (RFC 5040 Send, Send with SE, with Invalidate, with SE and Invalidate): each RDMAP
Send layer guesses :class:`KBTP` for its payload, and :meth:`KBTP.dispatch_hook` keeps it
only when the bytes look like KBTP (:func:`kbtp.describe.looks_like_kbtp`: 24 octets or
more, Version 1, a known opcode) and the segment starts the message (DDP MO 0); anything
else stays ``Raw``.  :mod:`stack.dissect.scapy` is not modified.
"""

from __future__ import annotations

import struct
from typing import Any

from scapy.config import conf
from scapy.fields import (
    ByteEnumField,
    ByteField,
    FieldLenField,
    FlagsField,
    IntField,
    LongField,
    ShortEnumField,
    ShortField,
    StrLenField,
    X3BytesField,
    XByteField,
    XIntField,
    XLongField,
    XShortField,
)
from scapy.packet import Packet, Raw, bind_bottom_up, bind_top_down

from kbtp.constants import (
    COMMON_HEADER_LEN,
    COMPLETION_DESCRIPTOR_LEN,
    KBTP_VERSION,
    NO_BLOCK_OFFSET,
    Capability,
    MessageOpcode,
    RequestFlag,
    Status,
)
from kbtp.describe import looks_like_kbtp
from kbtp.messages import (
    AllocStore,
    Bind,
    Completion,
    CompletionDescriptor,
    Free,
    Hello,
    HelloAck,
    KbtpError,
    Load,
    Message,
    Store,
)
from stack.dissect.scapy import (
    MPA_FPDU,
    DDP_Untagged,
    MPA_FPDU_NoCRC,
    RDMAP_Send,
    RDMAP_SendInvalidate,
    RDMAP_SendSE,
    RDMAP_SendSEInvalidate,
)

__all__ = [
    "KBTP",
    "KBTP_AllocStore",
    "KBTP_Bind",
    "KBTP_Completion",
    "KBTP_CompletionDescriptor",
    "KBTP_DataDescriptor",
    "KBTP_Free",
    "KBTP_Hello",
    "KBTP_HelloAck",
    "KBTP_Load",
    "KBTP_Store",
    "BODY_LAYERS",
    "SEND_LAYERS",
    "kbtp_layers",
    "kbtp_send_fpdu",
]

OPCODE_DISPLAY: dict[int, str] = {int(o): o.name for o in MessageOpcode}
STATUS_DISPLAY: dict[int, str] = {int(s): s.name for s in Status}
FLAG_DISPLAY: dict[int, str] = {int(f): str(f.name) for f in RequestFlag if f.value}
CAPABILITY_DISPLAY: dict[int, str] = {int(c): str(c.name) for c in Capability if c.value}

SEND_LAYERS: tuple[type[Packet], ...] = (
    RDMAP_Send,
    RDMAP_SendSE,
    RDMAP_SendInvalidate,
    RDMAP_SendSEInvalidate,
)
"""The RDMAP layers that carry KBTP messages (docs/kbtp.md §9.1)."""

_RECORD = int(RequestFlag.RECORD)
_LENGTH_AT = 12  # Length within the Data Descriptor (STag 4, TO 8)


# ======================================================================================
# Base
# ======================================================================================


class _KbtpPacket(Packet):
    """Base of the KBTP layers: a truncated layer raises KbtpError (MALFORMED).

    Inside a packet Scapy turns the failed layer into ``Raw``, as with every layer.
    """

    def do_dissect(self, s: bytes) -> bytes:
        try:
            return super().do_dissect(s)
        except (struct.error, IndexError) as exc:
            raise KbtpError(
                Status.MALFORMED, f"{self.name} truncated ({len(s)} octets)", rule="KBTP-5"
            ) from exc


def _header_of(pkt: Packet) -> Packet | None:
    """The KBTP common header below ``pkt`` (None when built or dissected on its own)."""
    under = pkt.underlayer
    while under is not None and not isinstance(under, KBTP):
        under = under.underlayer
    return under


class _RequestBody(_KbtpPacket):
    """Body of a request: followed by the Completion Descriptor iff RECORD (draft §5.2)."""

    def guess_payload_class(self, payload: bytes) -> type[Packet]:
        header = _header_of(self)
        if header is not None and (header.flags or 0) & _RECORD:
            return KBTP_CompletionDescriptor
        return conf.raw_layer


# ======================================================================================
# Common header (draft §5.1)
# ======================================================================================


class KBTP(_KbtpPacket):
    """KBTP common header, 24 octets (draft §5.1, docs/kbtp.md §5.1).

    Fields: version (1), opcode (named), flags (named request flags), request_id, handle
    (Block Handle), generation, status (named).  The body layer follows by opcode.
    """

    name = "KBTP"
    fields_desc = [
        ByteField("version", KBTP_VERSION),
        ByteEnumField("opcode", 0, OPCODE_DISPLAY),
        FlagsField("flags", 0, 16, FLAG_DISPLAY),
        LongField("request_id", 0),
        XLongField("handle", 0),
        ShortField("generation", 0),
        ShortEnumField("status", Status.SUCCESS, STATUS_DISPLAY),
    ]

    @classmethod
    def dispatch_hook(cls, _pkt: bytes | None = None, *args: Any, **kargs: Any) -> type[Packet]:
        """Above an RDMAP Send, keep KBTP only for what looks like KBTP at MO 0."""
        if cls is KBTP and _pkt is not None:
            under = kargs.get("_underlayer")
            if isinstance(under, SEND_LAYERS) and not _send_carries_kbtp(under, _pkt):
                return conf.raw_layer
        return cls

    def do_dissect_payload(self, s: bytes) -> None:
        if s:
            super().do_dissect_payload(s)
        elif self.opcode == MessageOpcode.FREE:
            # FREE without RECORD has no body octets; still show the layer naming it.
            self.add_payload(KBTP_Free(_internal=1, _underlayer=self))

    def mysummary(self) -> str:
        status = " status=%status%" if self.status else ""
        return self.sprintf(
            f"KBTP %opcode% id=%request_id% handle=%handle% gen=%generation%{status}"
        )


def _send_carries_kbtp(send: Packet, payload: bytes) -> bool:
    ddp = send.underlayer
    mo = getattr(ddp, "mo", 0) if ddp is not None else 0
    return mo == 0 and looks_like_kbtp(payload)


# ======================================================================================
# Descriptors (draft §5.2)
# ======================================================================================


class KBTP_DataDescriptor(_RequestBody):
    """Data Descriptor, 16 octets: STag, Tagged Offset, Length (draft §5.2).

    The body of LOAD, STORE and ALLOC_STORE.  ``length`` None (the default of the stores)
    is the number of inline octets that follow (0 without inline data).
    """

    name = "KBTP Data Descriptor"
    match_subclass = True  # pkt[KBTP_DataDescriptor] finds LOAD, STORE and ALLOC_STORE
    fields_desc = [XIntField("stag", 0), XLongField("to", 0), IntField("length", None)]

    def post_build(self, pkt: bytes, pay: bytes) -> bytes:
        if self.length is None:
            inline = len(pay)
            if isinstance(self.payload, KBTP_CompletionDescriptor):
                inline -= COMPLETION_DESCRIPTOR_LEN
            at = _LENGTH_AT
            pkt = pkt[:at] + struct.pack(">I", max(inline, 0)) + pkt[at + 4 :]
        return pkt + pay

    def mysummary(self) -> str:
        return self.sprintf(f"{self.name} %stag%/%to%+%length%")


class KBTP_CompletionDescriptor(_KbtpPacket):
    """Completion Descriptor, 16 octets: STag, Tagged Offset, Reserved (draft §5.2).

    Present after a request body iff RECORD is set; inline data follows it as ``Raw``.
    """

    name = "KBTP Completion Descriptor"
    fields_desc = [XIntField("stag", 0), XLongField("to", 0), XIntField("reserved", 0)]

    def mysummary(self) -> str:
        return self.sprintf(f"{self.name} %stag%/%to%")


# ======================================================================================
# Messages (docs/kbtp.md §5.3-5.8)
# ======================================================================================


class KBTP_Hello(_KbtpPacket):
    """HELLO body (docs/kbtp.md §5.3): capabilities, identity_length (auto), reserved,
    identity (up to 256 octets; the message ends there)."""

    name = "KBTP HELLO"
    fields_desc = [
        FlagsField("capabilities", 0, 32, CAPABILITY_DISPLAY),
        FieldLenField("identity_length", None, length_of="identity", fmt="H"),
        XShortField("reserved", 0),
        StrLenField("identity", b"", length_from=lambda p: p.identity_length),
    ]

    def mysummary(self) -> str:
        return self.sprintf(f"{self.name} caps=%capabilities% identity=%identity%")


class KBTP_HelloAck(_KbtpPacket):
    """HELLO_ACK body, 120 octets (docs/kbtp.md §5.4); field names as :class:`HelloAck`."""

    name = "KBTP HELLO_ACK"
    fields_desc = [
        FlagsField("capabilities", 0, 32, CAPABILITY_DISPLAY),
        IntField("block_size", 0),
        IntField("pool_blocks", 0),
        IntField("quota", 0),
        XLongField("handle_base", 0),
        IntField("handle_count", 0),
        IntField("ticket_timeout_ms", 0),
        ShortField("request_credits", 0),
        ByteField("ring_order", 0),
        XByteField("reserved", 0),
        IntField("max_inline", 0),
        XIntField("table_stag", 0),
        XIntField("pool_stag", 0),
        XLongField("table_offset", 0),
        XLongField("table_base_handle", 0),
        XLongField("pool_offset", 0),
        XIntField("ring_stag", 0),
        XIntField("partition_stag", 0),
        XLongField("ring_offset", 0),
        XLongField("head_offset", 0),
        XLongField("partition_offset", 0),
        XLongField("partition_length", 0),
        XIntField("head_stag", 0),
        IntField("table_entries", 0),
    ]

    def mysummary(self) -> str:
        return self.sprintf(
            f"{self.name} caps=%capabilities% block_size=%block_size% quota=%quota% "
            "credits=%request_credits%"
        )


class KBTP_Completion(_KbtpPacket):
    """COMPLETION body, 16 octets (docs/kbtp.md §5.8): data_length, request_opcode
    (echoed), reserved (24 bits), block_offset (all ones when no block is named)."""

    name = "KBTP COMPLETION"
    fields_desc = [
        IntField("data_length", 0),
        ByteEnumField("request_opcode", 0, OPCODE_DISPLAY),
        X3BytesField("reserved", 0),
        XLongField("block_offset", NO_BLOCK_OFFSET),
    ]

    def mysummary(self) -> str:
        return self.sprintf(f"{self.name} %request_opcode% len=%data_length% block=%block_offset%")


class KBTP_Load(KBTP_DataDescriptor):
    """LOAD body (draft §6.1): the Data Descriptor of the destination (length default 0)."""

    name = "KBTP LOAD"
    fields_desc = [XIntField("stag", 0), XLongField("to", 0), IntField("length", 0)]


class KBTP_Store(KBTP_DataDescriptor):
    """STORE body (draft §6.2): the Data Descriptor of the source; inline data as Raw."""

    name = "KBTP STORE"


class KBTP_AllocStore(KBTP_DataDescriptor):
    """ALLOC_STORE body (draft §6.3): as STORE."""

    name = "KBTP ALLOC_STORE"


class KBTP_Free(_RequestBody):
    """FREE body (draft §6.4): empty; a Completion Descriptor may follow."""

    name = "KBTP FREE"
    fields_desc = []


class KBTP_Bind(_RequestBody):
    """BIND body, 16 octets (docs/kbtp.md §5.7): ticket, data_length, block_offset."""

    name = "KBTP BIND"
    fields_desc = [
        IntField("ticket", 0),
        IntField("data_length", 0),
        XLongField("block_offset", 0),
    ]

    def mysummary(self) -> str:
        return self.sprintf(f"{self.name} ticket=%ticket% len=%data_length% block=%block_offset%")


# ======================================================================================
# Bindings
# ======================================================================================

BODY_LAYERS: dict[MessageOpcode, type[Packet]] = {
    MessageOpcode.HELLO: KBTP_Hello,
    MessageOpcode.HELLO_ACK: KBTP_HelloAck,
    MessageOpcode.COMPLETION: KBTP_Completion,
    MessageOpcode.LOAD: KBTP_Load,
    MessageOpcode.STORE: KBTP_Store,
    MessageOpcode.ALLOC_STORE: KBTP_AllocStore,
    MessageOpcode.FREE: KBTP_Free,
    MessageOpcode.BIND: KBTP_Bind,
}
"""The body layer of each opcode (dissection and, when stacked, the opcode it sets)."""

for _op, _cls in BODY_LAYERS.items():
    bind_bottom_up(KBTP, _cls, opcode=int(_op))
    bind_top_down(KBTP, _cls, opcode=int(_op))

for _send in SEND_LAYERS:
    # Unconditional guess; KBTP.dispatch_hook turns non-KBTP payloads back into Raw.
    bind_bottom_up(_send, KBTP)

assert COMMON_HEADER_LEN == len(KBTP())


# ======================================================================================
# From kbtp.messages
# ======================================================================================


def _completion_layer(desc: CompletionDescriptor | None) -> Packet | None:
    return None if desc is None else KBTP_CompletionDescriptor(stag=desc.stag, to=desc.to)


def kbtp_layers(message: Message) -> Packet:
    """The Scapy layers of a :mod:`kbtp.messages` message; builds to ``message.encode()``."""
    header = KBTP(opcode=int(message.opcode), request_id=message.request_id)
    body: Packet
    tail: Packet | None = None
    data = b""
    if isinstance(message, Hello):
        body = KBTP_Hello(capabilities=int(message.capabilities), identity=message.identity)
    elif isinstance(message, HelloAck):
        header.status = int(message.status)
        values: dict[str, Any] = {
            f.name: getattr(message, f.name, 0) for f in KBTP_HelloAck.fields_desc
        }
        values["capabilities"] = int(message.capabilities)
        body = KBTP_HelloAck(**values)
    elif isinstance(message, Completion):
        header.handle, header.generation = message.handle, message.generation
        header.status = int(message.status)
        body = KBTP_Completion(
            data_length=message.data_length,
            request_opcode=int(message.request_opcode),
            block_offset=message.block_offset,
        )
    else:
        header.flags = int(message.flags)
        header.handle, header.generation = message.handle, message.generation
        tail = _completion_layer(message.completion)
        if isinstance(message, Free):
            body = KBTP_Free()
        elif isinstance(message, Bind):
            body = KBTP_Bind(
                ticket=message.ticket,
                data_length=message.data_length,
                block_offset=message.block_offset,
            )
        else:
            cls = {Load: KBTP_Load, Store: KBTP_Store, AllocStore: KBTP_AllocStore}[type(message)]
            d = message.descriptor
            body = cls(stag=d.stag, to=d.to, length=d.length)
            if isinstance(message, Store | AllocStore):
                data = bytes(message.data)
    pkt = header / body
    if tail is not None:
        pkt = pkt / tail
    if data:
        pkt = pkt / Raw(data)
    return pkt


def kbtp_send_fpdu(
    message: Message | Packet,
    *,
    msn: int = 1,
    solicited: bool = False,
    inval_stag: int | None = None,
    crc: bool = True,
) -> Packet:
    """One FPDU carrying a whole KBTP message as a Send on QN 0 (docs/kbtp.md §9.1).

    ``inval_stag`` selects Send with Invalidate (a COMPLETION of an INVALIDATE request),
    ``solicited`` the SE variants.  ``message`` is a dataclass or already a KBTP packet.
    """
    kbtp = message if isinstance(message, Packet) else kbtp_layers(message)
    if inval_stag is None:
        rdmap: Packet = RDMAP_SendSE() if solicited else RDMAP_Send()
        ddp = DDP_Untagged(msn=msn)
    else:
        rdmap = RDMAP_SendSEInvalidate() if solicited else RDMAP_SendInvalidate()
        ddp = DDP_Untagged(msn=msn, inval_stag=inval_stag)
    frame = MPA_FPDU() if crc else MPA_FPDU_NoCRC()
    return frame / ddp / rdmap / kbtp
