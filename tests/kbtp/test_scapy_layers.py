"""Scapy layers for KBTP (docs/kbtp.md §5): byte-exact against kbtp.messages and the worked
examples of §10, field-exact on dissection, the binding above the RDMAP Sends (§9.1) and its
guard, forced values, automatic fields, robustness."""

from __future__ import annotations

import struct
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scapy.packet import Packet, Raw

from kbtp.constants import (
    COMMON_HEADER_LEN,
    COMPLETION_DESCRIPTOR_LEN,
    HELLO_ACK_LEN,
    KBTP_VERSION,
    NO_BLOCK_OFFSET,
    Capability,
    MessageOpcode,
    RequestFlag,
    Status,
)
from kbtp.messages import (
    AllocStore,
    Bind,
    Completion,
    CompletionDescriptor,
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
)
from kbtp.scapy_layers import (
    KBTP,
    KBTP_AllocStore,
    KBTP_Bind,
    KBTP_Completion,
    KBTP_CompletionDescriptor,
    KBTP_DataDescriptor,
    KBTP_Free,
    KBTP_Hello,
    KBTP_HelloAck,
    KBTP_Load,
    KBTP_Store,
    kbtp_layers,
    kbtp_send_fpdu,
)
from stack.constants import Opcode, QueueNumber
from stack.dissect.scapy import (
    MPA_FPDU,
    DDP_Untagged,
    RDMAP_Send,
    RDMAP_SendInvalidate,
    RDMAP_SendSE,
    RDMAP_SendSEInvalidate,
    RDMAP_Write,
    send_fpdu,
    write_fpdu,
)
from tests.kbtp.test_messages import EXAMPLES, messages

BODY = {
    MessageOpcode.HELLO: KBTP_Hello,
    MessageOpcode.HELLO_ACK: KBTP_HelloAck,
    MessageOpcode.COMPLETION: KBTP_Completion,
    MessageOpcode.LOAD: KBTP_Load,
    MessageOpcode.STORE: KBTP_Store,
    MessageOpcode.ALLOC_STORE: KBTP_AllocStore,
    MessageOpcode.FREE: KBTP_Free,
    MessageOpcode.BIND: KBTP_Bind,
}
SENDS = [
    (RDMAP_Send, Opcode.SEND),
    (RDMAP_SendSE, Opcode.SEND_SE),
    (RDMAP_SendInvalidate, Opcode.SEND_INVALIDATE),
    (RDMAP_SendSEInvalidate, Opcode.SEND_SE_INVALIDATE),
]
ALL_KBTP_LAYERS = (KBTP, *BODY.values(), KBTP_CompletionDescriptor)

u16 = st.integers(0, 0xFFFF)
u32 = st.integers(0, 0xFFFFFFFF)
u64 = st.integers(0, (1 << 64) - 1)
hello_acks = st.builds(
    HelloAck,
    u64,
    u16,
    st.sampled_from(list(Capability)),
    *([u32] * 3),
    u64,
    u32,
    u32,
    u16,
    st.integers(0, 255),
    u32,
    u32,
    u32,
    u64,
    u64,
    u64,
    u32,
    u32,
    u64,
    u64,
    u64,
    u64,
)
all_messages = st.one_of(messages, hello_acks)


# --------------------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------------------


def assert_matches(pkt: Packet, m: Message) -> None:
    """The dissected layers carry exactly the fields of the kbtp.messages dataclass."""
    h = pkt[KBTP]
    assert h.version == KBTP_VERSION
    assert h.opcode == m.opcode
    assert h.request_id == m.request_id
    assert h.handle == getattr(m, "handle", 0)
    assert h.generation == getattr(m, "generation", 0)
    assert h.status == getattr(m, "status", 0)
    assert h.flags == int(getattr(m, "flags", 0))
    body = h.payload
    assert type(body) is BODY[m.opcode]
    if isinstance(m, Hello):
        assert body.capabilities == m.capabilities
        assert body.identity_length == len(m.identity)
        assert body.identity == m.identity
    elif isinstance(m, HelloAck):
        for f in KBTP_HelloAck.fields_desc:
            if not f.name.startswith("reserved"):
                assert body.getfieldval(f.name) == getattr(m, f.name), f.name
    elif isinstance(m, Completion):
        assert (body.data_length, body.request_opcode, body.block_offset) == (
            m.data_length,
            m.request_opcode,
            m.block_offset,
        )
    else:
        if isinstance(m, Bind):
            assert (body.ticket, body.data_length, body.block_offset) == (
                m.ticket,
                m.data_length,
                m.block_offset,
            )
        elif isinstance(m, Load | Store | AllocStore):
            d = m.descriptor
            assert (body.stag, body.to, body.length) == (d.stag, d.to, d.length)
        rest = body.payload
        if m.completion is not None:
            assert isinstance(rest, KBTP_CompletionDescriptor)
            assert (rest.stag, rest.to, rest.reserved) == (m.completion.stag, m.completion.to, 0)
            rest = rest.payload
        else:
            assert KBTP_CompletionDescriptor not in pkt
        data = bytes(m.data) if isinstance(m, Store | AllocStore) else b""
        assert (rest.load if isinstance(rest, Raw) else b"") == data


# --------------------------------------------------------------------------------------
# Worked examples (docs/kbtp.md §10), built by hand with the layers
# --------------------------------------------------------------------------------------

HAND_BUILT: dict[str, Packet] = {
    "HELLO": KBTP(request_id=1)
    / KBTP_Hello(capabilities="DIRECT_LOAD+DIRECT_ALLOC", identity=b"decode-7"),
    "HELLO_ACK": KBTP(request_id=1)
    / KBTP_HelloAck(
        capabilities=3,
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
    "LOAD": KBTP(request_id=0x2A, handle=0x1005, generation=4)
    / KBTP_Load(stag=0x00ABCD01, to=0x10000, length=0x10000),
    "COMPLETION of the LOAD": KBTP(request_id=0x2A, handle=0x1005, generation=4)
    / KBTP_Completion(data_length=0x10000, request_opcode="LOAD", block_offset=0x10030000),
    "STORE": KBTP(request_id=0x2B, handle=0x1006, generation=2, flags="INLINE+SEAL")
    / KBTP_Store()
    / Raw(b"KV!"),
    "ALLOC_STORE": KBTP(request_id=0x2C, handle=0x1008, flags="SEAL+INVALIDATE")
    / KBTP_AllocStore(stag=0x00ABCD02, to=0x20000, length=4096),
    "COMPLETION of the ALLOC_STORE": KBTP(request_id=0x2C, handle=0x1008, generation=2)
    / KBTP_Completion(data_length=4096, request_opcode="ALLOC_STORE", block_offset=0x10050000),
    "COMPLETION with NO_SPACE": KBTP(
        request_id=0x2C, handle=0x1008, generation=1, status="NO_SPACE"
    )
    / KBTP_Completion(request_opcode=MessageOpcode.ALLOC_STORE),
    "FREE": KBTP(request_id=0x2D, handle=0x1005, generation=4) / KBTP_Free(),
    "BIND": KBTP(request_id=0x2E, handle=0x1007, flags="SEAL")
    / KBTP_Bind(ticket=9, data_length=4096, block_offset=0x10040000),
}


@pytest.mark.parametrize(("name", "message", "hexstr"), EXAMPLES, ids=[e[0] for e in EXAMPLES])
def test_s10_worked_examples_built_with_the_layers(
    name: str, message: Message, hexstr: str
) -> None:
    wire = bytes.fromhex(hexstr)
    assert bytes(HAND_BUILT[name]) == wire
    assert bytes(kbtp_layers(message)) == wire
    assert decode_message(bytes(HAND_BUILT[name])) == message


@pytest.mark.parametrize(("name", "message", "hexstr"), EXAMPLES, ids=[e[0] for e in EXAMPLES])
def test_s10_worked_examples_dissected_field_exact(
    name: str, message: Message, hexstr: str
) -> None:
    wire = bytes.fromhex(hexstr)
    pkt = KBTP(wire)
    assert_matches(pkt, message)
    assert bytes(pkt) == wire
    assert pkt.summary()  # every layer can describe itself


def test_s5_1_header_is_24_octets_big_endian_with_named_fields() -> None:
    h = KBTP(
        opcode="LOAD",
        flags="ALLOW_UNSEALED+RECORD",
        request_id=0x0102030405060708,
        handle=0x1112131415161718,
        generation=0x2122,
        status="BAD_BIND",
    )
    assert bytes(h).hex() == "011000140102030405060708111213141516171821220014"
    assert len(KBTP()) == COMMON_HEADER_LEN
    assert h.sprintf("%opcode% %status%") == "LOAD BAD_BIND"
    assert "ALLOW_UNSEALED" in h.sprintf("%flags%")


def test_s5_4_hello_ack_body_is_120_octets() -> None:
    assert len(KBTP() / KBTP_HelloAck()) == HELLO_ACK_LEN


# --------------------------------------------------------------------------------------
# Build with one side, parse with the other (hypothesis, bounded)
# --------------------------------------------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(all_messages)
def test_s5_layers_build_what_messages_decode(message: Message) -> None:
    wire = bytes(kbtp_layers(message))
    assert wire == message.encode()
    assert decode_message(wire) == message


@settings(max_examples=200, deadline=None)
@given(all_messages)
def test_s5_layers_dissect_what_messages_encode(message: Message) -> None:
    wire = message.encode()
    pkt = KBTP(wire)
    assert_matches(pkt, message)
    assert bytes(pkt) == wire


@settings(max_examples=150, deadline=None)
@given(all_messages, st.sampled_from(SENDS), st.integers(0, 0xFFFFFFFF))
def test_s9_1_full_fpdu_round_trip_for_every_message(
    message: Message, send: tuple[type[Packet], Opcode], msn: int
) -> None:
    layer, opcode = send
    # dict[str, Any]: Scapy's Packet(**fields) also has typed positional parameters
    inval: dict[str, Any] = {"inval_stag": 0xABCD02} if "Invalidate" in layer.__name__ else {}
    fpdu = MPA_FPDU() / DDP_Untagged(msn=msn, **inval) / layer() / kbtp_layers(message)
    raw = bytes(fpdu)
    pkt = MPA_FPDU(raw)
    assert pkt.crc_ok()
    ddp = pkt[DDP_Untagged]
    assert (ddp.opcode, ddp.qn, ddp.msn, ddp.mo) == (opcode, QueueNumber.SEND, msn, 0)
    assert isinstance(ddp.payload, layer)
    assert_matches(pkt, message)
    assert bytes(pkt) == raw


# --------------------------------------------------------------------------------------
# The binding above the RDMAP Sends (docs/kbtp.md §9.1) and its guard
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize(("layer", "opcode"), SENDS, ids=[s[0].__name__ for s in SENDS])
def test_s9_1_fpdu_from_raw_bytes_shows_kbtp_above_each_send(
    layer: type[Packet], opcode: Opcode
) -> None:
    comp = CompletionDescriptor(0x77, 0x8000)
    load = Load(7, 42, DataDescriptor(0x1234, 0x5000, 4096), 3, RequestFlag.RECORD, comp)
    raw = bytes(
        MPA_FPDU() / DDP_Untagged(msn=5) / layer() / KBTP(request_id=7, handle=42, generation=3,
        flags="RECORD") / KBTP_Load(stag=0x1234, to=0x5000, length=4096)
        / KBTP_CompletionDescriptor(stag=0x77, to=0x8000)
    )  # fmt: skip
    pkt = MPA_FPDU(raw)
    assert pkt.layers() == [
        MPA_FPDU,
        DDP_Untagged,
        layer,
        KBTP,
        KBTP_Load,
        KBTP_CompletionDescriptor,
    ]
    assert pkt[DDP_Untagged].opcode == opcode
    assert pkt[KBTP].opcode == MessageOpcode.LOAD
    assert pkt[KBTP_DataDescriptor].length == 4096  # found through the descriptor base class
    assert_matches(pkt, load)
    assert decode_message(bytes(pkt[KBTP])) == load


def test_s9_1_send_with_invalidate_helper_carries_the_stag() -> None:
    done = Completion(0x2C, 0x1008, 2, Status.SUCCESS, 4096, 0x10050000, MessageOpcode.ALLOC_STORE)
    pkt = MPA_FPDU(bytes(kbtp_send_fpdu(done, msn=9, inval_stag=0x00ABCD02)))
    assert isinstance(pkt[DDP_Untagged].payload, RDMAP_SendInvalidate)
    assert pkt[DDP_Untagged].inval_stag == 0x00ABCD02
    assert pkt[DDP_Untagged].msn == 9
    assert_matches(pkt, done)
    se = MPA_FPDU(bytes(kbtp_send_fpdu(kbtp_layers(done), solicited=True)))
    assert isinstance(se[DDP_Untagged].payload, RDMAP_SendSE)
    assert bytes(se[KBTP]) == done.encode()


NOT_KBTP = {
    "text": b"GET / HTTP/1.1\r\nHost: example\r\n\r\n",
    "version 0": bytes([0, MessageOpcode.LOAD]) + bytes(38),
    "version 2": bytes([2, MessageOpcode.LOAD]) + bytes(38),
    "reserved opcode": bytes([KBTP_VERSION, 0x04]) + bytes(38),
    "shorter than the header": Free(1, 2).encode()[: COMMON_HEADER_LEN - 1],
}


@pytest.mark.parametrize("payload", NOT_KBTP.values(), ids=NOT_KBTP.keys())
def test_s9_1_guard_leaves_non_kbtp_send_payloads_raw(payload: bytes) -> None:
    pkt = MPA_FPDU(bytes(send_fpdu(payload)))
    assert KBTP not in pkt
    assert pkt[RDMAP_Send].payload.load == payload


def test_s9_1_guard_needs_the_first_segment_of_the_message() -> None:
    """A later segment (MO > 0) holds the middle of a message, never its header."""
    data = Load(1, 2, DataDescriptor(3, 4, 5)).encode()
    assert KBTP in MPA_FPDU(bytes(send_fpdu(data, mo=0)))
    later = MPA_FPDU(bytes(send_fpdu(data, mo=4096)))
    assert KBTP not in later
    assert later[Raw].load == data


def test_s9_1_only_sends_are_bound() -> None:
    data = Load(1, 2, DataDescriptor(3, 4, 5)).encode()
    pkt = MPA_FPDU(bytes(write_fpdu(0x10, 0x20, data)))
    assert isinstance(pkt[RDMAP_Write].payload, Raw)
    assert KBTP not in pkt


def test_s9_1_empty_send_has_no_kbtp_layer() -> None:
    pkt = MPA_FPDU(bytes(send_fpdu(b"")))
    assert RDMAP_Send in pkt
    assert KBTP not in pkt


# --------------------------------------------------------------------------------------
# Automatic fields, forced values
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("opcode", list(MessageOpcode))
def test_s5_1_stacking_a_body_sets_the_opcode(opcode: MessageOpcode) -> None:
    assert bytes(KBTP() / BODY[opcode]())[1] == opcode


def test_s5_3_identity_length_is_automatic_unless_forced() -> None:
    assert bytes(KBTP() / KBTP_Hello(identity=b"abc"))[28:30] == b"\x00\x03"
    forced = bytes(KBTP() / KBTP_Hello(identity=b"abc", identity_length=300))
    assert forced[28:30] == (300).to_bytes(2, "big")
    with pytest.raises(KbtpError) as info:
        decode_message(forced)
    assert info.value.status == Status.MALFORMED


def test_s5_2_inline_length_counts_data_after_the_completion_descriptor() -> None:
    built = (
        KBTP(request_id=1, handle=2, flags="INLINE+SEAL+RECORD")
        / KBTP_Store()
        / KBTP_CompletionDescriptor(stag=5, to=6)
        / Raw(b"hello")
    )
    flags = RequestFlag.INLINE | RequestFlag.SEAL | RequestFlag.RECORD
    comp = CompletionDescriptor(5, 6)
    want = Store(1, 2, inline_descriptor(b"hello"), b"hello", 0, flags, comp)
    assert bytes(built) == want.encode()
    assert bytes(KBTP() / KBTP_AllocStore(stag=1, to=2))[36:40] == bytes(4)  # no inline: 0


def test_s5_2_inline_length_forced_wrong_is_malformed() -> None:
    pkt = KBTP(flags="INLINE") / KBTP_Store(length=9) / Raw(b"abc")
    wire = bytes(pkt)
    assert struct.unpack_from(">I", wire, 36)[0] == 9
    with pytest.raises(KbtpError) as info:
        decode_message(wire)
    assert info.value.status == Status.MALFORMED
    assert KBTP(wire)[KBTP_Store].length == 9


FORCED: list[tuple[str, Packet, Status]] = [
    ("version", KBTP(version=2) / KBTP_Free(), Status.BAD_VERSION),
    ("opcode over the binding", KBTP(opcode=0x7F) / KBTP_Load(), Status.BAD_OPCODE),
    ("flags", KBTP(flags=0x8001) / KBTP_Load(), Status.BAD_FLAGS),
    ("INVALIDATE with INLINE", KBTP(flags="INLINE+INVALIDATE") / KBTP_Store(), Status.BAD_FLAGS),
    ("status in a request", KBTP(status="SEALED") / KBTP_Free(), Status.MALFORMED),
    ("RECORD without descriptor", KBTP(flags="RECORD") / KBTP_Bind(), Status.MALFORMED),
    (
        "descriptor without RECORD",
        KBTP() / KBTP_Free() / KBTP_CompletionDescriptor(stag=1),
        Status.MALFORMED,
    ),
    (
        "inline with a STag",
        KBTP(flags="INLINE") / KBTP_Store(stag=5) / Raw(b"x"),
        Status.MALFORMED,
    ),
    ("COMPLETION cut short", KBTP(opcode="COMPLETION") / Raw(bytes(15)), Status.MALFORMED),
]


@pytest.mark.parametrize(("name", "pkt", "status"), FORCED, ids=[f[0] for f in FORCED])
def test_s5_1_forced_wrong_values_are_emitted_and_refused(
    name: str, pkt: Packet, status: Status
) -> None:
    wire = bytes(pkt)
    with pytest.raises(KbtpError) as info:
        decode_message(wire)
    assert info.value.status == status
    again = KBTP(wire)  # direct dissection: no guard, the forced fields read back
    assert bytes(again) == wire
    for f in KBTP.fields_desc:
        assert again.getfieldval(f.name) == pkt.getfieldval(f.name), f.name


def test_s5_reserved_fields_can_be_forced() -> None:
    comp = KBTP() / KBTP_Completion(reserved=0xABCDEF)
    assert bytes(comp)[29:32] == bytes.fromhex("abcdef")
    ack = KBTP(opcode="HELLO_ACK") / KBTP_HelloAck(reserved=0x5A)
    assert bytes(ack)[59] == 0x5A
    hello = KBTP() / KBTP_Hello(reserved=0x1234)
    assert bytes(hello)[30:32] == b"\x12\x34"
    desc = KBTP(flags="RECORD") / KBTP_Free() / KBTP_CompletionDescriptor(reserved=7)
    assert bytes(desc)[-4:] == b"\x00\x00\x00\x07"
    # Reserved octets are ignored on receipt (docs/kbtp.md §2) except a request's Status.
    decoded = decode_message(bytes(comp))
    assert isinstance(decoded, Completion)
    assert decoded.block_offset == NO_BLOCK_OFFSET
    assert KBTP(bytes(comp))[KBTP_Completion].reserved == 0xABCDEF


@settings(max_examples=150, deadline=None)
@given(
    st.integers(0, 255),
    st.sampled_from(list(MessageOpcode)),
    u16,
    u64,
    u64,
    u16,
    u16,
)
def test_s5_1_any_header_value_survives_build_and_dissect(
    version: int,
    opcode: MessageOpcode,
    flags: int,
    request_id: int,
    handle: int,
    generation: int,
    status: int,
) -> None:
    pkt = (
        KBTP(
            version=version,
            flags=flags,
            request_id=request_id,
            handle=handle,
            generation=generation,
            status=status,
        )
        / BODY[opcode]()
    )
    wire = bytes(pkt)
    assert struct.unpack_from(">BBHQQHH", wire) == (
        version,
        opcode,
        flags,
        request_id,
        handle,
        generation,
        status,
    )
    back = KBTP(wire)
    assert bytes(back) == wire
    assert (back.version, back.flags, back.status) == (version, flags, status)


# --------------------------------------------------------------------------------------
# Truncation and robustness
# --------------------------------------------------------------------------------------


def test_s5_1_truncated_header_raises_kbtp_error_when_dissected_alone() -> None:
    with pytest.raises(KbtpError) as info:
        KBTP(Free(1, 2).encode()[:10])
    assert info.value.status == Status.MALFORMED


def test_s5_truncated_body_inside_an_fpdu_becomes_raw() -> None:
    data = Load(1, 2, DataDescriptor(3, 4, 5)).encode()[:30]
    pkt = MPA_FPDU(bytes(send_fpdu(data)))
    assert pkt[KBTP].opcode == MessageOpcode.LOAD
    assert isinstance(pkt[KBTP].payload, Raw)
    assert bytes(pkt[KBTP]) == data


def test_s5_7_free_without_record_still_names_its_body() -> None:
    pkt = KBTP(Free(1, 2, 3).encode())
    assert isinstance(pkt.payload, KBTP_Free)
    assert bytes(pkt) == Free(1, 2, 3).encode()


def test_s5_trailing_octets_after_a_message_stay_visible() -> None:
    wire = Completion(1).encode() + b"\xee\xff"
    pkt = KBTP(wire)
    assert pkt[Raw].load == b"\xee\xff"
    assert bytes(pkt) == wire


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(list(MessageOpcode)), u16, st.binary(max_size=160))
def test_s9_1_random_kbtp_looking_sends_dissect_and_rebuild(
    opcode: MessageOpcode, flags: int, rest: bytes
) -> None:
    payload = bytes([KBTP_VERSION, opcode]) + flags.to_bytes(2, "big") + rest
    raw = bytes(send_fpdu(payload))
    pkt = MPA_FPDU(raw)
    assert bytes(pkt) == raw
    assert bytes(pkt[RDMAP_Send].payload) == payload
    if len(payload) >= COMMON_HEADER_LEN:
        assert pkt[KBTP].flags == flags
    else:
        assert KBTP not in pkt
    pkt.summary()


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(ALL_KBTP_LAYERS), st.binary(min_size=1, max_size=200))
def test_s5_any_layer_on_random_bytes_dissects_or_raises_kbtp_error(
    layer: type[Packet], data: bytes
) -> None:
    try:
        pkt = layer(data)
    except KbtpError as exc:
        assert exc.status == Status.MALFORMED
    else:
        assert bytes(pkt) == data


def test_s5_2_completion_descriptor_is_16_octets() -> None:
    assert len(KBTP_CompletionDescriptor()) == COMPLETION_DESCRIPTOR_LEN
    assert bytes(KBTP_CompletionDescriptor(stag=0x11, to=0x22)).hex() == (
        CompletionDescriptor(0x11, 0x22).encode().hex()
    )
