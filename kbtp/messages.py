"""KBTP messages: decoding and the codec's public names (draft §5, docs/kbtp.md §5).

The message dataclasses and their encoders live in :mod:`kbtp.message_types`; every public
name of it is re-exported here, so ``kbtp.messages`` stays the one module to import.
:func:`decode_message` is strict: anything that does not match docs/kbtp.md raises
:class:`KbtpError` carrying the status code a target answers with (and the request ID when
the header could be read), never another exception.
"""

from __future__ import annotations

from collections.abc import Callable

from kbtp.constants import (
    ALLOWED_FLAGS,
    BIND_LEN,
    COMMON_HEADER_LEN,
    COMPLETION_DESCRIPTOR_LEN,
    COMPLETION_LEN,
    DATA_DESCRIPTOR_LEN,
    HELLO_ACK_LEN,
    HELLO_FIXED_LEN,
    KBTP_VERSION,
    MAX_IDENTITY_LEN,
    Capability,
    MessageOpcode,
    RequestFlag,
    Status,
)
from kbtp.formats import (
    BIND_BODY,
    COMPLETION_BODY,
    DATA_DESCRIPTOR,
    HEADER,
    HELLO_ACK_BODY,
    HELLO_BODY,
)
from kbtp.message_types import AllocStore as AllocStore
from kbtp.message_types import Bind as Bind
from kbtp.message_types import CommonHeader as CommonHeader
from kbtp.message_types import Completion as Completion
from kbtp.message_types import CompletionDescriptor as CompletionDescriptor
from kbtp.message_types import CompletionRecord as CompletionRecord
from kbtp.message_types import DataDescriptor as DataDescriptor
from kbtp.message_types import Free as Free
from kbtp.message_types import Hello as Hello
from kbtp.message_types import HelloAck as HelloAck
from kbtp.message_types import KbtpError as KbtpError
from kbtp.message_types import Load as Load
from kbtp.message_types import Message as Message
from kbtp.message_types import Request as Request
from kbtp.message_types import Store as Store
from kbtp.message_types import inline_descriptor as inline_descriptor
from kbtp.message_types import with_request_id as with_request_id
from stack.buffers import Buffer as Buffer
from stack.fastinit import maker

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
