"""KBTP message formats: the one table of every field of every message (docs/kbtp.md §5).

A message is the common header (:data:`HEADER`, draft §5.1), the body of its opcode
(:data:`FORMATS`, docs/kbtp.md §5.3-5.8), the Completion Descriptor when a request has
RECORD set (:data:`COMPLETION_DESCRIPTOR`, §5.2), then a variable tail: HELLO's identity
or a store's inline data.  Every field is an unsigned big-endian integer of ``size``
octets at ``offset`` within its :class:`Part`; names are the attributes of the
:mod:`kbtp.messages` dataclasses and, with the part's ``key_prefix``, the JSON keys of
:mod:`kbtp.describe`; labels and :class:`Display` are how ``iwarp dissect -V`` shows
them.  :mod:`kbtp.messages` builds its structs here, :mod:`kbtp.describe` its field lists;
the Scapy layers (:mod:`kbtp.scapy_layers`) are written independently and tested equal.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from enum import Enum
from operator import attrgetter
from typing import Any

from kbtp.constants import (
    BIND_LEN,
    COMMON_HEADER_LEN,
    COMPLETION_DESCRIPTOR_LEN,
    COMPLETION_LEN,
    COMPLETION_RECORD_LEN,
    DATA_DESCRIPTOR_LEN,
    HELLO_ACK_LEN,
    HELLO_FIXED_LEN,
    REQUEST_OPCODES,
    MessageOpcode,
)
from stack.errors import LocalError

__all__ = [
    "COMPLETION_DESCRIPTOR",
    "COMPLETION_RECORD",
    "DATA_DESCRIPTOR",
    "FORMATS",
    "HEADER",
    "Display",
    "Field",
    "MessageFormat",
    "Part",
    "Tail",
    "joined_codec",
]


class Display(Enum):
    """How a field's value is shown in the ``-V`` tree (:mod:`kbtp.describe`)."""

    DEC = "decimal"
    HEX = "hex"
    DEC_HEX = "decimal and hex"
    STAG = "STag"  # hex
    TAGGED_OFFSET = "Tagged Offset"  # hex (docs/kbtp.md §2: the offsets are Tagged Offsets)
    BLOCK = "block offset"  # a Tagged Offset: hex, "none" when all ones
    CAPABILITIES = "capability names"
    FLAGS = "request flag names"
    STATUS = "status name"
    OPCODE = "opcode (header)"
    REQUEST_OPCODE = "opcode (echoed)"
    RESERVED = "reserved"  # sent as zero, ignored on receipt, shown only when not zero


_CODES = {1: "B", 2: "H", 4: "I", 8: "Q"}
_STAG_OR_TO = frozenset({Display.STAG, Display.TAGGED_OFFSET, Display.BLOCK})


@dataclass(frozen=True, slots=True)
class Field:
    """One field: name, offset (octets from the start of its part), size (octets), label,
    display."""

    name: str
    offset: int
    size: int
    label: str
    display: Display

    @property
    def reserved(self) -> bool:
        return self.display is Display.RESERVED

    @property
    def stag_or_to(self) -> bool:
        """An STag or a Tagged Offset: ``iwarp dissect --json`` writes it as fixed-width hex."""
        return self.display in _STAG_OR_TO

    @property
    def code(self) -> str:
        """The field's :mod:`struct` code: B, H, I, Q, or ``3s`` (a 3-octet field)."""
        return _CODES.get(self.size, f"{self.size}s")


class Part:
    """A fixed run of fields: the header, a message body, a descriptor.

    ``key_prefix`` makes the part's names unique among a message's JSON keys (``desc_``
    for the Data Descriptor, ``record_`` for the Completion Descriptor).  ``full`` is the
    struct of every field (3-octet fields as bytes), ``codec`` that of the named fields
    only, reserved fields being zero padding: what encoding and decoding use.  ``named``
    and ``names`` are the fields that are not reserved, ``keys`` every field's JSON key.
    """

    __slots__ = (
        "name",
        "fields",
        "key_prefix",
        "size",
        "named",
        "names",
        "keys",
        "full",
        "codec",
        "_of",
    )

    def __init__(self, name: str, fields: tuple[Field, ...], key_prefix: str = "") -> None:
        at = 0
        for f in fields:
            if f.offset != at:
                raise ValueError(f"{name}: {f.name} at {f.offset}, expected {at}")
            at += f.size
        self.name = name
        self.fields = fields
        self.key_prefix = key_prefix
        self.size = at
        self.named = tuple(f for f in fields if not f.reserved)
        self.names = tuple(f.name for f in self.named)
        self.keys = tuple(key_prefix + f.name for f in fields)
        self.full = struct.Struct(">" + "".join(f.code for f in fields))
        codes = (f"{f.size}x" if f.reserved else f.code for f in fields)
        self.codec = struct.Struct(">" + "".join(codes))
        self._of: Callable[[object], Any]
        if len(self.names) > 1:
            self._of = attrgetter(*self.names)
        else:  # a tuple of one value, or of none
            self._of = lambda obj: tuple(getattr(obj, n) for n in self.names)

    def __repr__(self) -> str:
        return f"Part({self.name!r}, {self.size} octets)"

    # -- the codec (big-endian, reserved fields zero) ----------------------------------------
    def pack(self, obj: object) -> bytes:
        """The part's octets from ``obj``'s attributes of the named fields' names."""
        return self._pack(self._of(obj))

    def pack_values(self, values: Mapping[str, int]) -> bytes:
        """The part's octets from the named fields' values by name."""
        return self._pack(tuple(values[n] for n in self.names))

    def _pack(self, values: tuple[Any, ...]) -> bytes:
        try:
            return self.codec.pack(*values)
        except struct.error as exc:
            raise LocalError(f"KBTP {self.name} field out of range: {exc}") from None

    def values(self, data: bytes | bytearray | memoryview, offset: int = 0) -> tuple[Any, ...]:
        """The named fields' values at ``data[offset:]``, in table order."""
        return self.codec.unpack_from(data, offset)

    def unpack(self, data: bytes | bytearray | memoryview, offset: int = 0) -> dict[str, Any]:
        """The named fields' values at ``data[offset:]``, by name."""
        return dict(zip(self.names, self.codec.unpack_from(data, offset), strict=True))

    def check_order(self, cls: type) -> None:
        """Refuse (TypeError) a dataclass whose first fields are not this part's named
        fields in table order: decoders pass :meth:`values` to it positionally."""
        first = tuple(f.name for f in fields(cls))[: len(self.names)]
        if first != self.names:
            raise TypeError(f"{cls.__name__} fields {first} are not in table order {self.names}")


def joined_codec(*parts: Part) -> struct.Struct:
    """One struct of the named fields of ``parts`` laid end to end (reserved fields zero):
    a message's fixed parts packed or unpacked in one call, the same octets as each part's
    ``codec`` in turn."""
    return struct.Struct(">" + "".join(p.codec.format[1:] for p in parts))


def _part(name: str, spec: tuple[tuple[str, int, str, Display], ...], key_prefix: str = "") -> Part:
    """A part from (name, size, label, display) rows; offsets follow from the sizes."""
    fields = []
    at = 0
    for fname, size, label, display in spec:
        fields.append(Field(fname, at, size, label, display))
        at += size
    return Part(name, tuple(fields), key_prefix)


_D, _X, _B, _R = Display.DEC, Display.HEX, Display.BLOCK, Display.RESERVED
_S, _T = Display.STAG, Display.TAGGED_OFFSET

HEADER = _part(
    "common header",
    (
        ("version", 1, "Version", _D),
        ("opcode", 1, "Opcode", Display.OPCODE),
        ("flags", 2, "Flags", Display.FLAGS),
        ("request_id", 8, "Request ID", Display.DEC_HEX),
        ("handle", 8, "Block Handle", Display.DEC_HEX),
        ("generation", 2, "Generation", _D),
        ("status", 2, "Status", Display.STATUS),
    ),
)
"""The common header, 24 octets (draft §5.1, docs/kbtp.md §5.1)."""

DATA_DESCRIPTOR = _part(
    "Data Descriptor",
    (
        ("stag", 4, "Data Descriptor STag", _S),
        ("to", 8, "Data Descriptor Tagged Offset", _T),
        ("length", 4, "Data Descriptor Length", _D),
    ),
    key_prefix="desc_",
)
"""The Data Descriptor, 16 octets: body of LOAD, STORE and ALLOC_STORE (draft §5.2)."""

COMPLETION_DESCRIPTOR = _part(
    "Completion Descriptor",
    (
        ("stag", 4, "Completion Descriptor STag", _S),
        ("to", 8, "Completion Descriptor Tagged Offset", _T),
        ("reserved", 4, "Completion Descriptor Reserved", _R),
    ),
    key_prefix="record_",
)
"""The Completion Descriptor, 16 octets, after a request body iff RECORD (draft §5.2)."""

COMPLETION_RECORD = _part(
    "completion record",
    (
        ("request_id", 8, "Request ID", Display.DEC_HEX),
        ("status", 2, "Status", Display.STATUS),
        ("generation", 2, "Generation", _D),
        ("data_length", 4, "Data Length", _D),
        ("block_offset", 8, "Block Offset", _B),
    ),
)
"""The 24-octet completion record (draft §6.5, docs/kbtp.md §5.9); never sent on RDMAP."""

HELLO_BODY = _part(
    "HELLO",
    (
        ("capabilities", 4, "Capabilities", Display.CAPABILITIES),
        ("identity_length", 2, "Identity Length", _D),
        ("reserved", 2, "Reserved", _R),
    ),
)
HELLO_ACK_BODY = _part(
    "HELLO_ACK",
    (
        ("capabilities", 4, "Capabilities", Display.CAPABILITIES),
        ("block_size", 4, "Block Size", _D),
        ("pool_blocks", 4, "Pool Size (F)", _D),
        ("quota", 4, "Allocation Quota", _D),
        ("handle_base", 8, "Handle Base", _X),
        ("handle_count", 4, "Handle Count", _D),
        ("ticket_timeout_ms", 4, "Ticket Timeout (ms)", _D),
        ("request_credits", 2, "Request Credits", _D),
        ("ring_order", 1, "Ring Order", _D),
        ("reserved", 1, "Reserved", _R),
        ("max_inline", 4, "Max Inline", _D),
        ("table_stag", 4, "Table STag", _S),
        ("pool_stag", 4, "Pool STag", _S),
        ("table_offset", 8, "Table Offset", _T),
        ("table_base_handle", 8, "Table Base Handle", _X),
        ("pool_offset", 8, "Pool Offset", _T),
        ("ring_stag", 4, "Ring STag", _S),
        ("partition_stag", 4, "Partition STag", _S),
        ("ring_offset", 8, "Ring Offset", _T),
        ("head_offset", 8, "Head Offset", _T),
        ("partition_offset", 8, "Partition Offset", _T),
        ("partition_length", 8, "Partition Length", _X),
        ("head_stag", 4, "Head STag", _S),
        ("table_entries", 4, "Table Entries", _D),
    ),
)
COMPLETION_BODY = _part(
    "COMPLETION",
    (
        ("data_length", 4, "Data Length", _D),
        ("request_opcode", 1, "Request Opcode", Display.REQUEST_OPCODE),
        ("reserved", 3, "Reserved", _R),
        ("block_offset", 8, "Block Offset", _B),
    ),
)
FREE_BODY = _part("FREE", ())
BIND_BODY = _part(
    "BIND",
    (
        ("ticket", 4, "Ticket", _D),
        ("data_length", 4, "Data Length", _D),
        ("block_offset", 8, "Block Offset", _B),
    ),
)


class Tail(Enum):
    """What follows a message's fixed parts (docs/kbtp.md §5.2, §5.3)."""

    NONE = "none"
    IDENTITY = "identity"  # HELLO: Identity Length octets
    INLINE = "inline"  # STORE, ALLOC_STORE with INLINE: Data Descriptor Length octets


@dataclass(frozen=True, slots=True)
class MessageFormat:
    """One opcode's format: header, ``body``, the Completion Descriptor iff RECORD (in a
    request), then ``tail``."""

    opcode: MessageOpcode
    body: Part
    tail: Tail = Tail.NONE

    @property
    def request(self) -> bool:
        """A request: RECORD may add the Completion Descriptor after the body (§5.2)."""
        return self.opcode in REQUEST_OPCODES

    @property
    def fixed_length(self) -> int:
        """Octets of header and body (without Completion Descriptor and tail)."""
        return HEADER.size + self.body.size


FORMATS: dict[MessageOpcode, MessageFormat] = {
    f.opcode: f
    for f in (
        MessageFormat(MessageOpcode.HELLO, HELLO_BODY, tail=Tail.IDENTITY),
        MessageFormat(MessageOpcode.HELLO_ACK, HELLO_ACK_BODY),
        MessageFormat(MessageOpcode.COMPLETION, COMPLETION_BODY),
        MessageFormat(MessageOpcode.LOAD, DATA_DESCRIPTOR),
        MessageFormat(MessageOpcode.STORE, DATA_DESCRIPTOR, tail=Tail.INLINE),
        MessageFormat(MessageOpcode.ALLOC_STORE, DATA_DESCRIPTOR, tail=Tail.INLINE),
        MessageFormat(MessageOpcode.FREE, FREE_BODY),
        MessageFormat(MessageOpcode.BIND, BIND_BODY),
    )
}
"""The format of every opcode (docs/kbtp.md §5.1 table)."""

# The lengths of kbtp.constants are the sums of this table's sizes.
assert HEADER.size == COMMON_HEADER_LEN
assert DATA_DESCRIPTOR.size == DATA_DESCRIPTOR_LEN
assert COMPLETION_DESCRIPTOR.size == COMPLETION_DESCRIPTOR_LEN
assert COMPLETION_RECORD.size == COMPLETION_RECORD_LEN
assert FORMATS[MessageOpcode.HELLO].fixed_length == HELLO_FIXED_LEN
assert FORMATS[MessageOpcode.HELLO_ACK].fixed_length == HELLO_ACK_LEN
assert FORMATS[MessageOpcode.COMPLETION].fixed_length == COMPLETION_LEN
assert FORMATS[MessageOpcode.BIND].fixed_length == BIND_LEN
assert set(FORMATS) == set(MessageOpcode)
