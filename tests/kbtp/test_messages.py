"""KBTP message formats (draft §5, docs/kbtp.md §5): byte layouts, round trips, strict decoding."""

from __future__ import annotations

import re
import struct
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kbtp.constants import (
    ALLOWED_FLAGS,
    BIND_LEN,
    COMMON_HEADER_LEN,
    COMPLETION_LEN,
    HELLO_ACK_LEN,
    KBTP_VERSION,
    Capability,
    MessageOpcode,
    RequestFlag,
    Status,
)
from kbtp.messages import (
    AllocStore,
    Bind,
    CommonHeader,
    Completion,
    CompletionDescriptor,
    CompletionRecord,
    DataDescriptor,
    Free,
    Hello,
    HelloAck,
    KbtpError,
    Load,
    Message,
    Store,
    decode_message,
    inline_descriptor,
    peek_header,
)
from stack.errors import LocalError, ProtocolError

# --------------------------------------------------------------------------------------
# §5.1 common header and §5.2 descriptors, byte for byte
# --------------------------------------------------------------------------------------


def test_s5_1_common_header_layout() -> None:
    h = CommonHeader(0x10, 0x0011, 0x0102030405060708, 0x1112131415161718, 0x2122, 0x3132)
    assert h.encode().hex() == ("011000110102030405060708111213141516171821223132")
    assert len(h.encode()) == COMMON_HEADER_LEN == 24
    assert CommonHeader.decode(h.encode()) == h


def test_s5_2_data_descriptor_is_stag_to_length() -> None:
    d = DataDescriptor(0xA1B2C3D4, 0x0000_7F00_0000_1000, 0x10000)
    assert d.encode().hex() == "a1b2c3d400007f000000100000010000"


def test_s5_2_completion_descriptor_has_32_reserved_bits() -> None:
    assert CompletionDescriptor(0x11, 0x22).encode().hex() == "00000011000000000000002200000000"


def test_s6_5_completion_record_is_24_octets() -> None:
    r = CompletionRecord(0x0102030405060708, Status.NOT_VALID, 3, 4096, 0x8000)
    assert r.encode().hex() == "0102030405060708000b0003000010000000000000008000"
    assert CompletionRecord.decode(r.encode()) == r


# --------------------------------------------------------------------------------------
# Worked examples of docs/kbtp.md §10 (the same hex appears there)
# --------------------------------------------------------------------------------------

EXAMPLES: list[tuple[str, Message, str]] = [
    (
        "HELLO",
        Hello(1, Capability.DIRECT_LOAD | Capability.DIRECT_ALLOC, b"decode-7"),
        "01010000000000000000000100000000000000000000000000000003000800006465636f64652d37",
    ),
    (
        "HELLO_ACK",
        HelloAck(
            1,
            Status.SUCCESS,
            Capability.DIRECT_LOAD | Capability.DIRECT_ALLOC,
            block_size=0x10000,
            pool_blocks=1024,
            quota=64,
            handle_base=0x1000,
            handle_count=256,
            ticket_timeout_ms=2000,
            request_credits=16,
            ring_order=6,
            max_inline=4096,
            table_stag=0x1100,
            pool_stag=0x1200,
            table_offset=0x10000000,
            table_base_handle=0x1000,
            pool_offset=0x10010000,
            ring_stag=0x1300,
            partition_stag=0x1400,
            ring_offset=0x14000000,
            head_offset=0x14000400,
            partition_offset=0x10010000,
            partition_length=0x400000,
            head_stag=0x1500,
        ),
        "0102000000000000000000010000000000000000000000000000000300010000"
        "0000040000000040000000000000100000000100000007d00010060000001000"
        "0000110000001200000000001000000000000000000010000000000010010000"
        "0000130000001400000000001400000000000000140004000000000010010000"
        "00000000004000000000150000000000",
    ),
    (
        "LOAD",
        Load(0x2A, 0x1005, DataDescriptor(0x00ABCD01, 0x10000, 0x10000), 4),
        "01100000000000000000002a00000000000010050004000000abcd01000000000001000000010000",
    ),
    (
        "COMPLETION of the LOAD",
        Completion(0x2A, 0x1005, 4, Status.SUCCESS, 0x10000, 0x10030000, MessageOpcode.LOAD),
        "01030000000000000000002a00000000000010050004000000010000100000000000000010030000",
    ),
    (
        "STORE",
        Store(
            0x2B,
            0x1006,
            inline_descriptor(b"KV!"),
            b"KV!",
            2,
            RequestFlag.INLINE | RequestFlag.SEAL,
        ),
        "01110003000000000000002b000000000000100600020000000000000000000000000000000000034b5621",
    ),
    (
        "ALLOC_STORE",
        AllocStore(
            0x2C,
            0x1008,
            DataDescriptor(0x00ABCD02, 0x20000, 4096),
            flags=RequestFlag.SEAL | RequestFlag.INVALIDATE,
        ),
        "0112000a000000000000002c00000000000010080000000000abcd02000000000002000000001000",
    ),
    (
        "COMPLETION of the ALLOC_STORE",
        Completion(0x2C, 0x1008, 2, Status.SUCCESS, 4096, 0x10050000, MessageOpcode.ALLOC_STORE),
        "01030000000000000000002c00000000000010080002000000001000120000000000000010050000",
    ),
    (
        "COMPLETION with NO_SPACE",
        Completion(0x2C, 0x1008, 1, Status.NO_SPACE, request_opcode=MessageOpcode.ALLOC_STORE),
        "01030000000000000000002c0000000000001008000100120000000012000000ffffffffffffffff",
    ),
    (
        "FREE",
        Free(0x2D, 0x1005, 4),
        "01130000000000000000002d000000000000100500040000",
    ),
    (
        "BIND",
        Bind(0x2E, 0x1007, 9, 4096, 0x10040000, flags=RequestFlag.SEAL),
        "01140002000000000000002e00000000000010070000000000000009000010000000000010040000",
    ),
]


@pytest.mark.parametrize(("name", "message", "hexstr"), EXAMPLES, ids=[e[0] for e in EXAMPLES])
def test_s10_worked_examples(name: str, message: Message, hexstr: str) -> None:
    assert message.encode().hex() == hexstr
    assert decode_message(bytes.fromhex(hexstr)) == message


def _doc_examples() -> dict[str, bytes]:
    """Hex blocks of docs/kbtp.md §10: a fenced ``hex`` block whose first line is ``# name``."""
    doc = (Path(__file__).parents[2] / "docs" / "kbtp.md").read_text()
    found = {}
    for block in re.findall(r"```hex\n(.*?)```", doc, re.S):
        title, *rows = block.strip().splitlines()
        found[title.lstrip("# ").strip()] = bytes.fromhex("".join(rows).replace(" ", ""))
    return found


def test_s10_doc_shows_the_same_bytes() -> None:
    doc = _doc_examples()
    for name, message, hexstr in EXAMPLES:
        assert doc[name] == bytes.fromhex(hexstr), name
        assert decode_message(doc[name]) == message


def test_s5_4_hello_ack_is_144_octets_with_fields_in_order() -> None:
    ack = HelloAck(
        request_id=1,
        capabilities=Capability.DIRECT_ALLOC,
        block_size=4096,
        pool_blocks=1024,
        quota=64,
        handle_base=0x1000,
        handle_count=256,
        ticket_timeout_ms=2000,
        request_credits=16,
        ring_order=6,
        max_inline=4096,
        table_stag=0x101,
        pool_stag=0x102,
        table_offset=0x10,
        table_base_handle=0x20,
        pool_offset=0x30,
        ring_stag=0x103,
        partition_stag=0x104,
        ring_offset=0x40,
        head_offset=0x50,
        partition_offset=0x60,
        partition_length=0x70,
        head_stag=0x105,
    )
    raw = ack.encode()
    assert len(raw) == HELLO_ACK_LEN == 144
    body = raw[COMMON_HEADER_LEN:]
    assert struct.unpack_from(">IIII", body, 0) == (2, 4096, 1024, 64)
    assert struct.unpack_from(">QII", body, 16) == (0x1000, 256, 2000)
    assert struct.unpack_from(">HBBI", body, 32) == (16, 6, 0, 4096)
    assert struct.unpack_from(">II", body, 72) == (0x103, 0x104)
    assert struct.unpack_from(">Q", body, 104) == (0x70,)
    assert struct.unpack_from(">II", body, 112) == (0x105, 0)
    assert decode_message(raw) == ack
    assert ack.entry_to(0x25) == 0x10 + 16 * 5


def test_s5_8_completion_and_bind_lengths() -> None:
    assert len(Completion(1).encode()) == COMPLETION_LEN == 40
    assert len(Bind(1, 2, 3, 4, 5).encode()) == BIND_LEN == 40


# --------------------------------------------------------------------------------------
# Strict decoding: every malformed input gets its status, never a foreign exception
# --------------------------------------------------------------------------------------

LOAD = Load(7, 3, DataDescriptor(1, 2, 3)).encode()


def _status(data: bytes) -> Status:
    with pytest.raises(KbtpError) as info:
        decode_message(data)
    assert isinstance(info.value, ProtocolError)
    return info.value.status


def test_s5_1_short_header_is_malformed_and_fatal() -> None:
    with pytest.raises(KbtpError) as info:
        decode_message(LOAD[:23])
    assert info.value.status is Status.MALFORMED and info.value.fatal
    assert info.value.request_id is None
    assert peek_header(LOAD[:23]) is None


def test_s5_1_version_must_be_1() -> None:
    bad = bytes([2]) + LOAD[1:]
    with pytest.raises(KbtpError) as info:
        decode_message(bad)
    assert info.value.status is Status.BAD_VERSION and info.value.fatal
    assert info.value.request_id == 7
    assert KBTP_VERSION == 1


def test_s5_1_unknown_opcode() -> None:
    assert _status(LOAD[:1] + b"\x7f" + LOAD[2:]) is Status.BAD_OPCODE


@pytest.mark.parametrize("opcode", list(MessageOpcode))
def test_s5_1_flags_not_defined_for_the_opcode_are_bad_flags(opcode: MessageOpcode) -> None:
    extra = 0xFFFF & ~int(ALLOWED_FLAGS[opcode])
    header = CommonHeader(opcode, extra, 9).encode()
    assert _status(header + bytes(40)) is Status.BAD_FLAGS


def test_s5_1_status_must_be_zero_in_requests() -> None:
    bad = LOAD[:22] + b"\x00\x01" + LOAD[24:]
    assert _status(bad) is Status.MALFORMED


@pytest.mark.parametrize(
    "data",
    [
        LOAD[:-1],
        LOAD + b"\x00",
        Free(1, 2).encode() + b"\x00",
        Bind(1, 2, 3, 4, 5).encode()[:-2],
        Completion(1).encode()[:-1],
        HelloAck(1).encode() + b"\x00",
        Hello(1, identity=b"abc").encode()[:-1],
    ],
)
def test_s5_wrong_lengths_are_malformed(data: bytes) -> None:
    assert _status(data) is Status.MALFORMED


def test_s5_2_record_requires_the_completion_descriptor() -> None:
    header = CommonHeader(MessageOpcode.FREE, RequestFlag.RECORD, 1, 2).encode()
    assert _status(header) is Status.MALFORMED
    full = Free(1, 2, flags=RequestFlag.RECORD, completion=CompletionDescriptor(5, 6))
    assert decode_message(full.encode()) == full


def test_s5_2_inline_descriptor_rules() -> None:
    good = Store(1, 2, inline_descriptor(b"abcd"), b"abcd", flags=RequestFlag.INLINE)
    assert decode_message(good.encode()) == good
    short = Store(1, 2, DataDescriptor(0, 0, 5), b"abcd", flags=RequestFlag.INLINE)
    assert _status(short.encode()) is Status.MALFORMED
    stag = Store(1, 2, DataDescriptor(9, 0, 4), b"abcd", flags=RequestFlag.INLINE)
    assert _status(stag.encode()) is Status.MALFORMED
    inval = Store(
        1, 2, inline_descriptor(b"ab"), b"ab", flags=RequestFlag.INLINE | RequestFlag.INVALIDATE
    )
    assert _status(inval.encode()) is Status.BAD_FLAGS
    trailing = Store(1, 2, DataDescriptor(9, 0, 4), b"abcd")
    assert _status(trailing.encode()) is Status.MALFORMED


def test_s5_3_identity_longer_than_256_is_malformed() -> None:
    assert _status(Hello(1, identity=b"x" * 257).encode()) is Status.MALFORMED
    ok = Hello(1, identity=b"x" * 256)
    assert decode_message(ok.encode()) == ok


def test_encode_refuses_out_of_range_fields_with_local_error() -> None:
    with pytest.raises(LocalError):
        Load(1 << 64, 0, DataDescriptor(0, 0, 0)).encode()
    with pytest.raises(LocalError):
        Completion(1, generation=0x10000).encode()


# --------------------------------------------------------------------------------------
# Round trips and fuzz (bounded hypothesis budgets)
# --------------------------------------------------------------------------------------

u16 = st.integers(0, 0xFFFF)
u32 = st.integers(0, 0xFFFFFFFF)
u64 = st.integers(0, (1 << 64) - 1)
descriptors = st.builds(DataDescriptor, u32, u64, u32)
completions = st.none() | st.builds(CompletionDescriptor, u32, u64)


def _with_record(flags: int, comp: CompletionDescriptor | None) -> RequestFlag:
    flags &= ~RequestFlag.RECORD
    return RequestFlag(flags | (RequestFlag.RECORD if comp is not None else 0))


@st.composite
def stores(draw: st.DrawFn) -> Store | AllocStore:
    classes: list[type[Store] | type[AllocStore]] = [Store, AllocStore]
    cls = draw(st.sampled_from(classes))
    comp = draw(completions)
    flags = draw(st.sampled_from([0, RequestFlag.SEAL, RequestFlag.INVALIDATE]))
    if draw(st.booleans()):
        data = draw(st.binary(max_size=64))
        flags = RequestFlag.INLINE | (flags & RequestFlag.SEAL)
        return cls(
            draw(u64),
            draw(u64),
            inline_descriptor(data),
            data,
            draw(u16),
            _with_record(flags, comp),
            comp,
        )
    return cls(
        draw(u64), draw(u64), draw(descriptors), b"", draw(u16), _with_record(flags, comp), comp
    )


@st.composite
def loads(draw: st.DrawFn) -> Load:
    comp = draw(completions)
    flags = draw(st.sampled_from([0, RequestFlag.ALLOW_UNSEALED, RequestFlag.INVALIDATE]))
    return Load(draw(u64), draw(u64), draw(descriptors), draw(u16), _with_record(flags, comp), comp)


@st.composite
def frees(draw: st.DrawFn) -> Free:
    comp = draw(completions)
    return Free(draw(u64), draw(u64), draw(u16), _with_record(0, comp), comp)


@st.composite
def binds(draw: st.DrawFn) -> Bind:
    comp = draw(completions)
    flags = _with_record(draw(st.sampled_from([0, RequestFlag.SEAL])), comp)
    return Bind(draw(u64), draw(u64), draw(u32), draw(u32), draw(u64), draw(u16), flags, comp)


messages = st.one_of(
    loads(),
    stores(),
    frees(),
    binds(),
    st.builds(Hello, u64, st.sampled_from(list(Capability)), st.binary(max_size=256)),
    st.builds(Completion, u64, u64, u16, u16, u32, u64, st.integers(0, 255)),
    st.builds(
        HelloAck,
        u64,
        u16,
        st.sampled_from(list(Capability)),
        u32,
        u32,
        u32,
        u64,
        u32,
        u32,
        u16,
        st.integers(0, 255),
        u32,
    ),
)


@settings(max_examples=300, deadline=None)
@given(messages)
def test_s5_round_trip(message: Message) -> None:
    assert decode_message(message.encode()) == message


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=200))
def test_s5_fuzz_random_bytes_only_raise_kbtp_errors(data: bytes) -> None:
    try:
        decode_message(data)
    except KbtpError as exc:
        assert isinstance(exc.status, Status)


@settings(max_examples=300, deadline=None)
@given(messages, st.data())
def test_s5_fuzz_mutated_messages_only_raise_kbtp_errors(
    message: Message, data: st.DataObject
) -> None:
    raw = bytearray(message.encode())
    for _ in range(data.draw(st.integers(1, 4))):
        kind = data.draw(st.sampled_from(["flip", "cut", "grow"]))
        if kind == "flip" and raw:
            i = data.draw(st.integers(0, len(raw) - 1))
            raw[i] ^= data.draw(st.integers(1, 255))
        elif kind == "cut" and raw:
            del raw[data.draw(st.integers(0, len(raw) - 1)) :]
        else:
            raw += data.draw(st.binary(min_size=1, max_size=8))
    try:
        decoded = decode_message(bytes(raw))
    except KbtpError:
        return
    assert decode_message(decoded.encode()) == decoded
