"""KBTP messages: frozen dataclasses with byte-exact encode/decode (draft §5, docs/kbtp.md §5).

Every message starts with the 24-octet common header of draft §5.1; all fields are
big-endian, laid out as the table of :mod:`kbtp.formats` says (the structs here are built
from it).  :func:`decode_message` is strict: anything that does not match docs/kbtp.md
raises :class:`KbtpError` carrying the status code a target answers with (and the request
ID when the header could be read), never another exception.

The dataclasses themselves do not validate, so tests can build bad messages on purpose;
``encode()`` only refuses values that do not fit their fields (:class:`LocalError`).
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass, fields
from operator import attrgetter
from typing import Any, ClassVar

from kbtp.constants import (
    ALLOWED_FLAGS,
    BIND_LEN,
    COMMON_HEADER_LEN,
    COMPLETION_DESCRIPTOR_LEN,
    COMPLETION_LEN,
    COMPLETION_RECORD_LEN,
    DATA_DESCRIPTOR_LEN,
    HELLO_ACK_LEN,
    HELLO_FIXED_LEN,
    KBTP_VERSION,
    MAX_IDENTITY_LEN,
    NO_BLOCK_OFFSET,
    SESSION_FATAL_STATUSES,
    Capability,
    MessageOpcode,
    RequestFlag,
    Status,
)
from kbtp.formats import (
    BIND_BODY,
    COMPLETION_BODY,
    COMPLETION_DESCRIPTOR,
    COMPLETION_RECORD,
    DATA_DESCRIPTOR,
    HEADER,
    HELLO_ACK_BODY,
    HELLO_BODY,
    joined_codec,
)
from stack.errors import LocalError, ProtocolError
from stack.fastinit import maker

Buffer = bytes | bytearray | memoryview


class KbtpError(ProtocolError):
    """A KBTP message or request broke a rule of the draft or docs/kbtp.md.

    Fields: ``status`` (the :class:`Status` the target completes with), ``request_id``
    and ``opcode`` (from the common header, None when it could not be read), ``fatal``
    (the session must be closed after answering), plus ``rule``/``detail`` of
    :class:`ProtocolError`.
    """

    def __init__(
        self,
        status: Status,
        detail: str,
        *,
        rule: str = "KBTP-5",
        request_id: int | None = None,
        opcode: int | None = None,
        handle: int = 0,
        fatal: bool | None = None,
    ) -> None:
        super().__init__(rule, f"{status.name}: {detail}")
        self.status = status
        self.request_id = request_id
        self.opcode = opcode
        self.handle = handle
        self.fatal = status in SESSION_FATAL_STATUSES if fatal is None else fatal


# ======================================================================================
# Building blocks
# ======================================================================================


@dataclass(frozen=True, slots=True)
class CommonHeader:
    """The common header (draft §5.1).

    Fields: opcode, flags, request_id, handle, generation, status, version.
    """

    opcode: int
    flags: int = 0
    request_id: int = 0
    handle: int = 0
    generation: int = 0
    status: int = 0
    version: int = KBTP_VERSION

    def encode(self) -> bytes:
        return HEADER.pack(self)

    @classmethod
    def decode(cls, data: Buffer) -> CommonHeader:
        """Read the header; MALFORMED (fatal) if fewer than 24 octets."""
        if len(data) < COMMON_HEADER_LEN:
            raise KbtpError(
                Status.MALFORMED,
                f"{len(data)} octets, shorter than the common header",
                rule="KBTP-5.1",
                fatal=True,
            )
        return cls(**HEADER.unpack(data))


@dataclass(frozen=True, slots=True)
class DataDescriptor:
    """A buffer of the initiator: STag, Tagged Offset, Length (draft §5.2)."""

    stag: int
    to: int
    length: int

    def encode(self) -> bytes:
        return DATA_DESCRIPTOR.pack(self)

    @classmethod
    def decode(cls, data: Buffer, offset: int = 0) -> DataDescriptor:
        return cls(*DATA_DESCRIPTOR.values(data, offset))


@dataclass(frozen=True, slots=True)
class CompletionDescriptor:
    """A 24-octet completion record slot of the initiator: STag, Tagged Offset (draft §5.2)."""

    stag: int
    to: int

    def encode(self) -> bytes:
        return COMPLETION_DESCRIPTOR.pack(self)

    @classmethod
    def decode(cls, data: Buffer, offset: int = 0) -> CompletionDescriptor:
        return cls(*COMPLETION_DESCRIPTOR.values(data, offset))


@dataclass(frozen=True, slots=True)
class CompletionRecord:
    """The 24-octet completion record of draft §6.5 (never used on the RDMAP binding).

    Fields: request_id, status, generation, data_length, block_offset.
    """

    request_id: int
    status: int
    generation: int
    data_length: int
    block_offset: int

    def encode(self) -> bytes:
        return COMPLETION_RECORD.pack(self)

    @classmethod
    def decode(cls, data: Buffer) -> CompletionRecord:
        if len(data) != COMPLETION_RECORD_LEN:
            raise KbtpError(Status.MALFORMED, f"completion record of {len(data)} octets")
        return cls(*COMPLETION_RECORD.values(data))


# ======================================================================================
# Session setup (docs/kbtp.md §5.3, §5.4)
# ======================================================================================


@dataclass(frozen=True, slots=True)
class Hello:
    """HELLO, the initiator's first Send (docs/kbtp.md §5.3).

    Fields: request_id, capabilities (requested), identity (opaque, up to 256 octets).
    """

    opcode: ClassVar[MessageOpcode] = MessageOpcode.HELLO
    request_id: int
    capabilities: Capability = Capability.NONE
    identity: bytes = b""

    def encode(self) -> bytes:
        header = CommonHeader(self.opcode, request_id=self.request_id).encode()
        body = HELLO_BODY.pack_values(
            {"capabilities": self.capabilities, "identity_length": len(self.identity)}
        )
        return header + body + bytes(self.identity)


@dataclass(frozen=True, slots=True)
class HelloAck:
    """HELLO_ACK, the target's answer to HELLO (docs/kbtp.md §5.4); 144 octets.

    Fields: request_id (echoes HELLO), status, capabilities (granted), block_size,
    pool_blocks (F), quota (Allocation Quota), handle_base, handle_count (the initiator's
    handle range), ticket_timeout_ms, request_credits, ring_order (n of the initiator's
    partition ring, N = 2**n), max_inline, table_stag, pool_stag, table_offset,
    table_base_handle, pool_offset, ring_stag (the slots, read), partition_stag, ring_offset,
    head_offset, partition_offset, partition_length, head_stag (the Head, atomics),
    table_entries (DIRECT_LOAD: the handles served are [table_base_handle, + table_entries)).
    Fields of a capability not granted are zero.
    """

    opcode: ClassVar[MessageOpcode] = MessageOpcode.HELLO_ACK
    request_id: int
    status: int = Status.SUCCESS
    capabilities: Capability = Capability.NONE
    block_size: int = 0
    pool_blocks: int = 0
    quota: int = 0
    handle_base: int = 0
    handle_count: int = 0
    ticket_timeout_ms: int = 0
    request_credits: int = 0
    ring_order: int = 0
    max_inline: int = 0
    table_stag: int = 0
    pool_stag: int = 0
    table_offset: int = 0
    table_base_handle: int = 0
    pool_offset: int = 0
    ring_stag: int = 0
    partition_stag: int = 0
    ring_offset: int = 0
    head_offset: int = 0
    partition_offset: int = 0
    partition_length: int = 0
    head_stag: int = 0
    table_entries: int = 0

    def encode(self) -> bytes:
        header = CommonHeader(self.opcode, request_id=self.request_id, status=self.status)
        return header.encode() + HELLO_ACK_BODY.pack(self)

    def serves(self, handle: int) -> bool:
        """Whether DIRECT_LOAD may read ``handle``'s entry: the table has one (§5.4)."""
        return 0 <= handle - self.table_base_handle < self.table_entries

    def entry_to(self, handle: int) -> int:
        """Tagged Offset of ``handle``'s table entry under the Table STag (draft §3.2)."""
        return self.table_offset + 16 * (handle - self.table_base_handle)


# ======================================================================================
# Requests (draft §5, §6; docs/kbtp.md §5.5-5.8)
# ======================================================================================


def _encode_request(
    opcode: MessageOpcode,
    flags: RequestFlag,
    request_id: int,
    handle: int,
    generation: int,
    descriptor: DataDescriptor,
    completion: CompletionDescriptor | None,
    data: bytes = b"",
) -> bytes:
    """A LOAD, STORE or ALLOC_STORE request: header, Data Descriptor, the Completion
    Descriptor if any, then the inline data (draft §5, §6)."""
    if completion is None:  # the common case in one pack; the same octets
        d = descriptor
        try:
            fixed = _HEADER_DESCRIPTOR.pack(
                KBTP_VERSION, opcode, flags, request_id, handle, generation, 0,
                d.stag, d.to, d.length,
            )  # fmt: skip
        except struct.error:
            pass  # the parts below name the field out of range
        else:
            return fixed + bytes(data) if data else fixed
    header = CommonHeader(opcode, flags, request_id, handle, generation).encode()
    tail = completion.encode() if completion is not None else b""
    return header + descriptor.encode() + tail + bytes(data)


@dataclass(frozen=True, slots=True)
class Load:
    """LOAD (draft §6.1): header + Data Descriptor (the destination) [+ Completion Descriptor].

    Fields: request_id, handle, descriptor, generation (0 = any), flags, completion.
    """

    opcode: ClassVar[MessageOpcode] = MessageOpcode.LOAD
    request_id: int
    handle: int
    descriptor: DataDescriptor
    generation: int = 0
    flags: RequestFlag = RequestFlag.NONE
    completion: CompletionDescriptor | None = None

    def encode(self) -> bytes:
        return _encode_request(
            self.opcode, self.flags, self.request_id, self.handle, self.generation,
            self.descriptor, self.completion,
        )  # fmt: skip


@dataclass(frozen=True, slots=True)
class _StoreBase:
    opcode: ClassVar[MessageOpcode]  # each subclass's own

    request_id: int
    handle: int
    descriptor: DataDescriptor
    data: bytes = b""
    generation: int = 0
    flags: RequestFlag = RequestFlag.NONE
    completion: CompletionDescriptor | None = None

    def encode(self) -> bytes:
        return _encode_request(
            self.opcode, self.flags, self.request_id, self.handle,
            self.generation, self.descriptor, self.completion, self.data,
        )  # fmt: skip

    @property
    def inline(self) -> bool:
        return bool(int(self.flags) & _INLINE_FLAG)  # int: no Flag object made

    @property
    def data_length(self) -> int:
        """Octets to store: the inline payload's length or the descriptor Length."""
        return self.descriptor.length


@dataclass(frozen=True, slots=True)
class Store(_StoreBase):
    """STORE, the mapped store (draft §6.2).

    Fields: request_id, handle, descriptor (source; zero STag/TO and the data length
    when INLINE), data (the inline payload), generation, flags, completion.
    """

    opcode: ClassVar[MessageOpcode] = MessageOpcode.STORE


@dataclass(frozen=True, slots=True)
class AllocStore(_StoreBase):
    """ALLOC_STORE, the unmapped store (draft §6.3); same layout as STORE."""

    opcode: ClassVar[MessageOpcode] = MessageOpcode.ALLOC_STORE


def inline_descriptor(data: Buffer) -> DataDescriptor:
    """The Data Descriptor of an INLINE store: STag 0, TO 0, Length = len(data) (§5.2)."""
    return DataDescriptor(0, 0, len(data))


@dataclass(frozen=True, slots=True)
class Free:
    """FREE (draft §6.4): header [+ Completion Descriptor].

    Fields: request_id, handle, generation, flags, completion.
    """

    opcode: ClassVar[MessageOpcode] = MessageOpcode.FREE
    request_id: int
    handle: int
    generation: int = 0
    flags: RequestFlag = RequestFlag.NONE
    completion: CompletionDescriptor | None = None

    def encode(self) -> bytes:
        header = CommonHeader(
            self.opcode, self.flags, self.request_id, self.handle, self.generation
        ).encode()
        return header + (self.completion.encode() if self.completion is not None else b"")


@dataclass(frozen=True, slots=True)
class Bind:
    """BIND (draft §6.6, docs/kbtp.md §5.7): bind a directly allocated block to a handle.

    Fields: request_id, handle, ticket, data_length, block_offset, generation, flags
    (SEAL), completion.
    """

    opcode: ClassVar[MessageOpcode] = MessageOpcode.BIND
    request_id: int
    handle: int
    ticket: int
    data_length: int
    block_offset: int
    generation: int = 0
    flags: RequestFlag = RequestFlag.NONE
    completion: CompletionDescriptor | None = None

    def encode(self) -> bytes:
        header = CommonHeader(
            self.opcode, self.flags, self.request_id, self.handle, self.generation
        ).encode()
        body = BIND_BODY.pack(self)
        return header + body + (self.completion.encode() if self.completion is not None else b"")


@dataclass(frozen=True, slots=True)
class Completion:
    """COMPLETION (draft §6.5, docs/kbtp.md §5.8); 40 octets.

    Fields: request_id and handle (echoed), generation (the entry's current one),
    status, data_length, block_offset (all ones when no block is named),
    request_opcode (echoed).
    """

    opcode: ClassVar[MessageOpcode] = MessageOpcode.COMPLETION
    request_id: int
    handle: int = 0
    generation: int = 0
    status: int = Status.SUCCESS
    data_length: int = 0
    block_offset: int = NO_BLOCK_OFFSET
    request_opcode: int = 0

    def encode(self) -> bytes:
        try:  # in one pack; the same octets as the parts
            return _HEADER_COMPLETION.pack(
                KBTP_VERSION, self.opcode, 0, self.request_id, self.handle, self.generation,
                self.status, self.data_length, self.request_opcode, self.block_offset,
            )  # fmt: skip
        except struct.error:
            pass  # the parts below name the field out of range
        header = CommonHeader(
            self.opcode, 0, self.request_id, self.handle, self.generation, self.status
        ).encode()
        return header + COMPLETION_BODY.pack(self)

    @property
    def ok(self) -> bool:
        return self.status == Status.SUCCESS


DATA_DESCRIPTOR.check_order(DataDescriptor)
COMPLETION_DESCRIPTOR.check_order(CompletionDescriptor)
COMPLETION_RECORD.check_order(CompletionRecord)

Request = Load | Store | AllocStore | Free | Bind
Message = Hello | HelloAck | Load | Store | AllocStore | Free | Bind | Completion

_HEADER_DESCRIPTOR = joined_codec(HEADER, DATA_DESCRIPTOR)
"""A LOAD, STORE or ALLOC_STORE without Completion Descriptor: header, Data Descriptor."""
_HEADER_COMPLETION = joined_codec(HEADER, COMPLETION_BODY)
"""A COMPLETION: header and body."""
if HEADER.names[:3] != ("version", "opcode", "flags") or HEADER.names[3:] != (
    "request_id",
    "handle",
    "generation",
    "status",
):  # pragma: no cover - the table is the source
    raise TypeError(f"the encoders above pack the header fields in the order {HEADER.names}")
if DATA_DESCRIPTOR.names != ("stag", "to", "length") or COMPLETION_BODY.names != (
    "data_length",
    "request_opcode",
    "block_offset",
):  # pragma: no cover - the table is the source
    raise TypeError("the encoders above pack the bodies in another order than the table")

_OTHER_FIELDS: dict[type, Any] = {}
"""Per request class: its maker and a getter of its fields after Request ID, in order."""


def with_request_id(request: Request, request_id: int) -> Request:
    """``dataclasses.replace(request, request_id=request_id)``, without its per-field work:
    the class's fields after Request ID (its first) are copied by one getter call."""
    cls = type(request)
    known = _OTHER_FIELDS.get(cls)
    if known is None:
        known = _OTHER_FIELDS[cls] = (maker(cls), _other_fields(cls))
    make, getter = known
    new: Request = make(request_id, *getter(request))
    return new


def _other_fields(cls: type) -> Callable[[object], tuple[Any, ...]]:
    names = [f.name for f in fields(cls)]
    if names[0] != "request_id":
        raise LocalError(f"{cls.__name__} does not start with a Request ID")
    rest = names[1:]
    if len(rest) < 2:  # attrgetter of one name returns the value, not a tuple
        return lambda obj: tuple(getattr(obj, n) for n in rest)
    getter: Callable[[object], tuple[Any, ...]] = attrgetter(*rest)
    return getter


# ======================================================================================
# Decoding
# ======================================================================================


class _Hdr:
    """The unpacked common header inside the decoder (cheaper than a frozen dataclass)."""

    __slots__ = ("version", "opcode", "flags", "request_id", "handle", "generation", "status")

    def __init__(self, values: tuple[int, ...]) -> None:
        (
            self.version,
            self.opcode,
            self.flags,
            self.request_id,
            self.handle,
            self.generation,
            self.status,
        ) = values


if _Hdr.__slots__ != HEADER.names:  # pragma: no cover - the table is the source
    raise TypeError(f"_Hdr slots {_Hdr.__slots__} are not the header fields {HEADER.names}")


_make_completion = maker(Completion)
_make_descriptor = maker(DataDescriptor)
_make_load = maker(Load)
_make_store: dict[int, Callable[..., Store | AllocStore]] = {
    MessageOpcode.STORE: maker(Store),
    MessageOpcode.ALLOC_STORE: maker(AllocStore),
}
_HEADER_VALUES = HEADER.codec.unpack_from
_DESCRIPTOR_VALUES = DATA_DESCRIPTOR.codec.unpack_from
_COMPLETION_BODY_VALUES = COMPLETION_BODY.codec.unpack_from
_OPCODES = {int(o): o for o in MessageOpcode}
_ALLOWED = {o: int(f) for o, f in ALLOWED_FLAGS.items()}
_FLAGS = [RequestFlag(v) for v in range(1 << len(RequestFlag.__members__))]
_RECORD_FLAG = int(RequestFlag.RECORD)
_INLINE_FLAG = int(RequestFlag.INLINE)
_INVALIDATE_FLAG = int(RequestFlag.INVALIDATE)


def _err(status: Status, detail: str, h: _Hdr, rule: str = "KBTP-5") -> KbtpError:
    return KbtpError(
        status, detail, rule=rule, request_id=h.request_id, opcode=h.opcode, handle=h.handle
    )


def _expect_len(
    data: Buffer, want: int, h: _Hdr, what: str | MessageOpcode, inline: int | None = None
) -> None:
    """MALFORMED unless ``data`` is ``want`` octets; the message is named (an opcode by its
    name, with its ``inline`` octets if given) only when it is not."""
    if len(data) != want:
        name = what if isinstance(what, str) else what.name
        if inline is not None:
            name += f" with {inline} inline octets"
        raise _err(Status.MALFORMED, f"{name} of {len(data)} octets, expected {want}", h)


def _completion_descriptor(
    data: Buffer, offset: int, h: _Hdr
) -> tuple[CompletionDescriptor | None, int]:
    if not h.flags & _RECORD_FLAG:
        return None, offset
    if len(data) < offset + COMPLETION_DESCRIPTOR_LEN:
        raise _err(Status.MALFORMED, "RECORD set but no Completion Descriptor", h, "KBTP-5.2")
    return CompletionDescriptor.decode(data, offset), offset + COMPLETION_DESCRIPTOR_LEN


def _decode_hello(data: Buffer, h: _Hdr) -> Hello:
    if len(data) < HELLO_FIXED_LEN:
        raise _err(Status.MALFORMED, f"HELLO of {len(data)} octets", h)
    body = HELLO_BODY.unpack(data, COMMON_HEADER_LEN)
    id_len = body["identity_length"]
    if id_len > MAX_IDENTITY_LEN:
        raise _err(Status.MALFORMED, f"identity length {id_len} > {MAX_IDENTITY_LEN}", h)
    _expect_len(data, HELLO_FIXED_LEN + id_len, h, "HELLO")
    return Hello(h.request_id, Capability(body["capabilities"]), bytes(data[HELLO_FIXED_LEN:]))


def _decode_hello_ack(data: Buffer, h: _Hdr) -> HelloAck:
    _expect_len(data, HELLO_ACK_LEN, h, "HELLO_ACK")
    body = HELLO_ACK_BODY.unpack(data, COMMON_HEADER_LEN)
    body["capabilities"] = Capability(body["capabilities"])
    return HelloAck(h.request_id, h.status, **body)


def _decode_completion(data: Buffer, h: _Hdr) -> Completion:
    _expect_len(data, COMPLETION_LEN, h, "COMPLETION")
    length, opcode, block = _COMPLETION_BODY_VALUES(data, COMMON_HEADER_LEN)
    return _make_completion(
        h.request_id, h.handle, h.generation, h.status, length, block, opcode
    )  # fmt: skip


def _decode_load(data: Buffer, h: _Hdr) -> Load:
    if len(data) < COMMON_HEADER_LEN + DATA_DESCRIPTOR_LEN:
        raise _err(Status.MALFORMED, "LOAD without a Data Descriptor", h, "KBTP-5.2")
    desc = _make_descriptor(*_DESCRIPTOR_VALUES(data, COMMON_HEADER_LEN))
    comp, end = _completion_descriptor(data, COMMON_HEADER_LEN + DATA_DESCRIPTOR_LEN, h)
    _expect_len(data, end, h, "LOAD")
    return _make_load(h.request_id, h.handle, desc, h.generation, _FLAGS[h.flags], comp)


def _decode_store(data: Buffer, h: _Hdr) -> Store | AllocStore:
    cls = Store if h.opcode == MessageOpcode.STORE else AllocStore
    if len(data) < COMMON_HEADER_LEN + DATA_DESCRIPTOR_LEN:
        name = cls.opcode.name
        raise _err(Status.MALFORMED, f"{name} without a Data Descriptor", h, "KBTP-5.2")
    desc = _make_descriptor(*_DESCRIPTOR_VALUES(data, COMMON_HEADER_LEN))
    comp, end = _completion_descriptor(data, COMMON_HEADER_LEN + DATA_DESCRIPTOR_LEN, h)
    flags = _FLAGS[h.flags]
    if h.flags & _INLINE_FLAG:
        if desc.stag or desc.to:
            raise _err(Status.MALFORMED, "INLINE with nonzero STag or TO", h, "KBTP-5.2")
        _expect_len(data, end + desc.length, h, cls.opcode, desc.length)
        payload = bytes(data[end:])
    else:
        _expect_len(data, end, h, cls.opcode)
        payload = b""
    return _make_store[cls.opcode](h.request_id, h.handle, desc, payload, h.generation, flags, comp)


def _decode_free(data: Buffer, h: _Hdr) -> Free:
    comp, end = _completion_descriptor(data, COMMON_HEADER_LEN, h)
    _expect_len(data, end, h, "FREE")
    return Free(h.request_id, h.handle, h.generation, _FLAGS[h.flags], comp)


def _decode_bind(data: Buffer, h: _Hdr) -> Bind:
    if len(data) < BIND_LEN:
        raise _err(Status.MALFORMED, f"BIND of {len(data)} octets", h)
    body = BIND_BODY.unpack(data, COMMON_HEADER_LEN)
    comp, end = _completion_descriptor(data, BIND_LEN, h)
    _expect_len(data, end, h, "BIND")
    return Bind(
        h.request_id,
        h.handle,
        **body,
        generation=h.generation,
        flags=_FLAGS[h.flags],
        completion=comp,
    )


_DECODERS: dict[MessageOpcode, Callable[[Buffer, _Hdr], Message]] = {
    MessageOpcode.HELLO: _decode_hello,
    MessageOpcode.HELLO_ACK: _decode_hello_ack,
    MessageOpcode.COMPLETION: _decode_completion,
    MessageOpcode.LOAD: _decode_load,
    MessageOpcode.STORE: _decode_store,
    MessageOpcode.ALLOC_STORE: _decode_store,
    MessageOpcode.FREE: _decode_free,
    MessageOpcode.BIND: _decode_bind,
}
_ANSWERS = frozenset({MessageOpcode.HELLO_ACK, MessageOpcode.COMPLETION})


def decode_message(data: Buffer) -> Message:
    """Decode one KBTP message (the payload of one Send).

    Checks, in order (docs/kbtp.md §5.1): header length (MALFORMED, fatal), Version
    (BAD_VERSION), Opcode (BAD_OPCODE), flags allowed for the opcode (BAD_FLAGS), Status
    zero in HELLO and requests (MALFORMED), then the opcode's exact length and fields.
    """
    if len(data) < COMMON_HEADER_LEN:
        CommonHeader.decode(data)  # raises MALFORMED (fatal)
    h = _Hdr(_HEADER_VALUES(data))
    if h.version != KBTP_VERSION:
        raise _err(Status.BAD_VERSION, f"version {h.version}, not {KBTP_VERSION}", h, "KBTP-5.1")
    opcode = _OPCODES.get(h.opcode)
    if opcode is None:
        raise _err(Status.BAD_OPCODE, f"unknown opcode 0x{h.opcode:02x}", h, "KBTP-5.1")
    extra = h.flags & ~_ALLOWED[opcode]
    if extra:
        raise _err(Status.BAD_FLAGS, f"flags 0x{extra:04x} not allowed in {opcode.name}", h)
    if h.flags & _INLINE_FLAG and h.flags & _INVALIDATE_FLAG:
        # A flag rule (§5.2), so before any field rule: there is no STag to invalidate.
        raise _err(Status.BAD_FLAGS, "INVALIDATE with INLINE: no STag", h, "KBTP-5.1")
    if opcode not in _ANSWERS and h.status != 0:
        raise _err(Status.MALFORMED, f"Status {h.status} in a {opcode.name}", h, "KBTP-5.1")
    return _DECODERS[opcode](data, h)


def peek_header(data: Buffer) -> CommonHeader | None:
    """The common header of ``data`` if it has 24 octets, else None (never raises)."""
    if len(data) < COMMON_HEADER_LEN:
        return None
    return CommonHeader.decode(data)


def encode_message(message: Message) -> bytes:
    """``message.encode()``; provided for symmetry with :func:`decode_message`."""
    return message.encode()
