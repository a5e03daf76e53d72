"""KBTP message types: frozen dataclasses and their byte-exact encoders (draft §5).

Every message starts with the 24-octet common header of draft §5.1; all fields are
big-endian, laid out as the table of :mod:`kbtp.formats` says (the structs here are built
from it).  Also :class:`KbtpError`, the building blocks' own ``decode`` and
:func:`with_request_id`.  The message decoder is :mod:`kbtp.messages`, which re-exports
every public name here.

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
    COMMON_HEADER_LEN,
    COMPLETION_RECORD_LEN,
    KBTP_VERSION,
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
from stack.buffers import Buffer
from stack.errors import LocalError, ProtocolError
from stack.fastinit import maker


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
_INLINE_FLAG = int(RequestFlag.INLINE)
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
