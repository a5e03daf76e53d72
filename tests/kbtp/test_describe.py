"""kbtp.describe: summary lines, JSON fields and -V trees of KBTP messages in Send payloads
(docs/kbtp.md §5), findings for malformed messages, never an exception."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kbtp.constants import (
    COMMON_HEADER_LEN,
    KBTP_VERSION,
    NO_BLOCK_OFFSET,
    MessageOpcode,
    RequestFlag,
    Status,
)
from kbtp.describe import JSON_HEX_DIGITS, KbtpSummary, describe_payload, looks_like_kbtp
from kbtp.formats import COMPLETION_DESCRIPTOR, FORMATS, HEADER
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
from stack.wire.checker import Finding
from tests.kbtp.test_messages import EXAMPLES, messages
from tests.kbtp.test_scapy_layers import all_messages

COMMON_KEYS = {
    "kbtp_version",
    "kbtp_opcode",
    "kbtp_opcode_name",
    "kbtp_flags",
    "kbtp_flag_names",
    "kbtp_request_id",
    "kbtp_handle",
    "kbtp_generation",
    "kbtp_status",
    "kbtp_status_name",
    "kbtp_length",
    "kbtp_error",
    "kbtp_error_detail",
}
RECORD = CompletionDescriptor(0x77, 0x8000)

ONE_OF_EACH: dict[str, Message] = {
    "HELLO": Hello(1, identity=b"decode-7"),
    "HELLO_ACK": HelloAck(1, quota=64, handle_base=0x1000, handle_count=256),
    "COMPLETION": Completion(7, 42, 3, Status.SUCCESS, 4096, 0x10030000, MessageOpcode.LOAD),
    "LOAD": Load(7, 42, DataDescriptor(0x1234, 0x5000, 4096), 3, RequestFlag.ALLOW_UNSEALED),
    "LOAD+RECORD": Load(7, 42, DataDescriptor(1, 2, 3), 0, RequestFlag.RECORD, RECORD),
    "STORE inline": Store(
        8, 43, inline_descriptor(b"KV!"), b"KV!", 2, RequestFlag.INLINE | RequestFlag.SEAL
    ),
    "STORE": Store(8, 43, DataDescriptor(0xAB, 0x20000, 4096)),
    "ALLOC_STORE inline+RECORD": AllocStore(
        9,
        44,
        inline_descriptor(b"xyz"),
        b"xyz",
        0,
        RequestFlag.INLINE | RequestFlag.RECORD,
        RECORD,
    ),
    "FREE": Free(10, 45, 4),
    "FREE+RECORD": Free(10, 45, 4, RequestFlag.RECORD, RECORD),
    "BIND": Bind(11, 46, 9, 4096, 0x10040000, 0, RequestFlag.SEAL),
}


def expected_fields(m: Message) -> dict[str, Any]:
    """The JSON fields a message must produce, from the dataclass (the other side)."""
    flags = int(getattr(m, "flags", 0))
    out: dict[str, Any] = {
        "kbtp_version": KBTP_VERSION,
        "kbtp_opcode": int(m.opcode),
        "kbtp_opcode_name": m.opcode.name,
        "kbtp_flags": flags,
        "kbtp_flag_names": [f.name for f in RequestFlag if f.value and flags & f],
        "kbtp_request_id": m.request_id,
        "kbtp_handle": getattr(m, "handle", 0),
        "kbtp_generation": getattr(m, "generation", 0),
        "kbtp_status": int(getattr(m, "status", 0)),
        "kbtp_error": None,
        "kbtp_error_detail": None,
    }
    if isinstance(m, Hello):
        out["kbtp_capabilities"] = int(m.capabilities)
        out["kbtp_identity_length"] = len(m.identity)
        out["kbtp_identity_hex"] = m.identity.hex()
    elif isinstance(m, HelloAck):
        out["kbtp_capabilities"] = int(m.capabilities)
        for name in HelloAck.__dataclass_fields__:
            if name not in ("request_id", "status", "capabilities"):
                out["kbtp_" + name] = getattr(m, name)
    elif isinstance(m, Completion):
        out["kbtp_data_length"] = m.data_length
        out["kbtp_request_opcode"] = m.request_opcode
        out["kbtp_block_offset"] = m.block_offset
    else:
        comp = m.completion
        out["kbtp_record_stag"] = comp.stag if comp else None
        out["kbtp_record_to"] = comp.to if comp else None
        if isinstance(m, Bind):
            out["kbtp_ticket"] = m.ticket
            out["kbtp_data_length"] = m.data_length
            out["kbtp_block_offset"] = m.block_offset
        elif isinstance(m, Load | Store | AllocStore):
            d = m.descriptor
            out["kbtp_desc_stag"] = d.stag
            out["kbtp_desc_to"] = d.to
            out["kbtp_desc_length"] = d.length
            if isinstance(m, Store | AllocStore):
                out["kbtp_inline_length"] = len(m.data)
    return out


def assert_sound(s: KbtpSummary) -> None:
    """Every output of a summary is usable: one line, JSON-serializable fields, a tree."""
    assert "\n" not in s.line and s.line.startswith("KBTP " + s.opcode.name)
    fields = s.json_fields()
    assert COMMON_KEYS <= fields.keys()
    assert all(k.startswith("kbtp_") for k in fields)
    json.dumps(fields)
    tree = s.tree_lines()
    assert tree[0] == f"  KBTP {s.opcode.name}"
    assert all(line.startswith("    ") for line in tree[1:])
    assert (s.error is None) == (not s.findings) == s.ok


# --------------------------------------------------------------------------------------
# Well-formed messages
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("message", ONE_OF_EACH.values(), ids=ONE_OF_EACH.keys())
def test_s5_every_message_type_is_described(message: Message) -> None:
    wire = message.encode()
    s = describe_payload(wire)
    assert s is not None
    assert_sound(s)
    assert s.ok and s.message == message
    assert s.length == s.expected_length == len(wire)
    fields = s.json_fields()
    for key, value in expected_fields(message).items():
        assert fields[key] == value, key
    assert "kbtp_trailing_length" not in fields
    tree = "\n".join(s.tree_lines())
    assert f"Request ID: {message.request_id}" in tree
    assert "Finding" not in tree


EXPECTED_LINES = {
    "HELLO": 'KBTP HELLO id=1 caps=DIRECT_LOAD|DIRECT_ALLOC identity="decode-7"',
    "LOAD": "KBTP LOAD id=42 handle=4101 gen=4 dst=0xabcd01/0x10000+65536",
    "COMPLETION of the LOAD": (
        "KBTP COMPLETION id=42 handle=4101 gen=4 status=SUCCESS req=LOAD len=65536 block=0x10030000"
    ),
    "STORE": "KBTP STORE id=43 handle=4102 gen=2 flags=INLINE|SEAL inline=3",
    "ALLOC_STORE": (
        "KBTP ALLOC_STORE id=44 handle=4104 gen=0 flags=SEAL|INVALIDATE src=0xabcd02/0x20000+4096"
    ),
    "COMPLETION with NO_SPACE": (
        "KBTP COMPLETION id=44 handle=4104 gen=1 status=NO_SPACE req=ALLOC_STORE len=0 block=none"
    ),
    "FREE": "KBTP FREE id=45 handle=4101 gen=4",
    "BIND": "KBTP BIND id=46 handle=4103 gen=0 flags=SEAL ticket=9 len=4096 block=0x10040000",
}


@pytest.mark.parametrize(("name", "message", "hexstr"), EXAMPLES, ids=[e[0] for e in EXAMPLES])
def test_s10_worked_examples_are_described(name: str, message: Message, hexstr: str) -> None:
    s = describe_payload(bytes.fromhex(hexstr))
    assert s is not None
    assert_sound(s)
    assert s.message == message
    if name in EXPECTED_LINES:
        assert s.line == EXPECTED_LINES[name]
    fields = s.json_fields()
    for key, value in expected_fields(message).items():
        assert fields[key] == value, key


def test_s5_4_hello_ack_line_and_tree_name_the_session_parameters() -> None:
    ack = next(m for name, m, _ in EXAMPLES if name == "HELLO_ACK")
    s = describe_payload(ack.encode())
    assert s is not None
    assert s.line == (
        "KBTP HELLO_ACK id=1 status=SUCCESS caps=DIRECT_LOAD|DIRECT_ALLOC block_size=65536 "
        "pool=1024 quota=64 handles=0x1000+256 credits=16 max_inline=4096 ring_order=6"
    )
    tree = s.tree_lines()
    assert "    Ring STag: 0x1300" in tree
    assert "    Head Offset: 0x14000400" in tree
    assert "    Ticket Timeout (ms): 2000" in tree
    assert s.json_fields()["kbtp_capability_names"] == ["DIRECT_LOAD", "DIRECT_ALLOC"]


def test_s5_2_record_and_inline_in_line_and_tree() -> None:
    s = describe_payload(ONE_OF_EACH["ALLOC_STORE inline+RECORD"].encode())
    assert s is not None
    assert (
        s.line
        == "KBTP ALLOC_STORE id=9 handle=44 gen=0 flags=INLINE|RECORD inline=3 record=0x77/0x8000"
    )
    assert "    Inline data (3 octets): 78 79 7a" in s.tree_lines()
    assert "    Completion Descriptor STag: 0x77" in s.tree_lines()
    assert s.data == b"xyz"


def test_s5_8_completion_names_the_request_opcode_and_no_block() -> None:
    s = describe_payload(Completion(1, request_opcode=0x99).encode())
    assert s is not None
    fields = s.json_fields()
    assert fields["kbtp_request_opcode_name"] == "0x99"
    assert fields["kbtp_block_offset"] == NO_BLOCK_OFFSET
    assert "block=none" in s.line


def test_s5_3_binary_identity_is_shown_in_hex() -> None:
    s = describe_payload(Hello(1, identity=b"\x00\xffab").encode())
    assert s is not None
    assert "identity=0x00ff6162" in s.line
    assert s.json_fields()["kbtp_identity_hex"] == "00ff6162"


def test_buffers_of_every_kind_are_accepted() -> None:
    wire = ONE_OF_EACH["LOAD"].encode()
    for buf in (wire, bytearray(wire), memoryview(wire)):
        s = describe_payload(buf)
        assert s is not None and s.message == ONE_OF_EACH["LOAD"]


# --------------------------------------------------------------------------------------
# Not KBTP
# --------------------------------------------------------------------------------------

NOT_KBTP = {
    "empty": b"",
    "text": b"GET / HTTP/1.1\r\nHost: example\r\n\r\n",
    "version 2": bytes([2, MessageOpcode.LOAD]) + bytes(38),
    "reserved opcode": bytes([KBTP_VERSION, 0x15]) + bytes(38),
    "shorter than the header": Free(1, 2).encode()[: COMMON_HEADER_LEN - 1],
}


@pytest.mark.parametrize("payload", NOT_KBTP.values(), ids=NOT_KBTP.keys())
def test_s5_1_payloads_that_are_not_kbtp_give_none(payload: bytes) -> None:
    assert not looks_like_kbtp(payload)
    assert describe_payload(payload) is None


# --------------------------------------------------------------------------------------
# Malformed KBTP: a finding, never an exception
# --------------------------------------------------------------------------------------


def _patched(message: Message, at: int, value: bytes) -> bytes:
    wire = bytearray(message.encode())
    wire[at : at + len(value)] = value
    return bytes(wire)


MALFORMED: dict[str, tuple[bytes, Status]] = {
    "flag not allowed": (_patched(ONE_OF_EACH["LOAD"], 2, b"\x00\x01"), Status.BAD_FLAGS),
    "unknown flag bit": (_patched(ONE_OF_EACH["FREE"], 2, b"\x80\x00"), Status.BAD_FLAGS),
    "status in a request": (_patched(ONE_OF_EACH["FREE"], 22, b"\x00\x05"), Status.MALFORMED),
    "LOAD cut short": (ONE_OF_EACH["LOAD"].encode()[:30], Status.MALFORMED),
    "HELLO_ACK cut short": (ONE_OF_EACH["HELLO_ACK"].encode()[:100], Status.MALFORMED),
    "trailing octets": (ONE_OF_EACH["BIND"].encode() + b"\x00\x01", Status.MALFORMED),
    "RECORD without descriptor": (
        _patched(ONE_OF_EACH["FREE"], 2, b"\x00\x04"),
        Status.MALFORMED,
    ),
    "inline longer than the data": (
        _patched(ONE_OF_EACH["STORE inline"], 36, b"\x00\x00\x00\x09"),
        Status.MALFORMED,
    ),
    "inline with a STag": (
        _patched(ONE_OF_EACH["STORE inline"], 24, b"\x00\x00\x00\x01"),
        Status.MALFORMED,
    ),
    "identity longer than 256": (
        Hello(1).encode()[:28] + (300).to_bytes(2, "big") + bytes(2) + bytes(300),
        Status.MALFORMED,
    ),
}


@pytest.mark.parametrize(("payload", "status"), MALFORMED.values(), ids=MALFORMED.keys())
def test_s5_1_malformed_kbtp_gives_a_finding(payload: bytes, status: Status) -> None:
    with pytest.raises(KbtpError) as strict:  # the verdict is decode_message's
        decode_message(payload)
    s = describe_payload(payload)
    assert s is not None
    assert_sound(s)
    assert s.error == status and not s.ok and s.message is None
    (finding,) = s.findings
    assert isinstance(finding, Finding)
    assert finding.rule == strict.value.rule
    assert finding.detail.startswith(status.name)
    assert s.line.endswith(f"[{finding.detail}]")
    fields = s.json_fields()
    assert fields["kbtp_error"] == status.name
    assert fields["kbtp_error_detail"] == finding.detail
    assert f"    Finding {finding.rule}: {finding.detail}" in s.tree_lines()


def test_s5_fields_past_the_end_are_null_and_shown_as_unknown() -> None:
    s = describe_payload(ONE_OF_EACH["LOAD"].encode()[:30])
    assert s is not None
    fields = s.json_fields()
    assert fields["kbtp_desc_stag"] == 0x1234
    assert fields["kbtp_desc_to"] is None and fields["kbtp_desc_length"] is None
    assert "dst=0x1234/?+?" in s.line
    assert "    Truncated: 30 of 40 octets" in s.tree_lines()


def test_s5_trailing_octets_are_counted() -> None:
    s = describe_payload(ONE_OF_EACH["BIND"].encode() + b"\x00\x01")
    assert s is not None
    assert s.json_fields()["kbtp_trailing_length"] == 2
    assert "    Trailing octets: 2" in s.tree_lines()


def test_s5_nonzero_reserved_octets_are_shown_without_a_finding() -> None:
    wire = _patched(ONE_OF_EACH["COMPLETION"], 29, b"\xab\xcd\xef")
    s = describe_payload(wire)
    assert s is not None and s.ok  # ignored on receipt (docs/kbtp.md §2)
    assert any("Reserved" in line and "0xabcdef" in line for line in s.tree_lines())
    assert "kbtp_reserved" not in s.json_fields()


# --------------------------------------------------------------------------------------
# A message continuing in later segments (complete=False)
# --------------------------------------------------------------------------------------


def test_s9_1_first_segment_of_a_long_inline_store_is_not_malformed() -> None:
    data = bytes(range(256)) * 8
    wire = Store(1, 2, inline_descriptor(data), data, 0, RequestFlag.INLINE).encode()
    first = wire[:1000]
    whole = describe_payload(first)
    assert whole is not None and whole.error == Status.MALFORMED
    s = describe_payload(first, complete=False)
    assert s is not None
    assert_sound(s)
    assert s.ok and s.message is None
    assert s.line.endswith(f"(first 1000 of {len(wire)} octets)")
    assert s.json_fields()["kbtp_inline_length"] == 1000 - 40
    assert any(line.startswith("    Continues in later segments") for line in s.tree_lines())


def test_s9_1_first_segment_still_reports_header_errors() -> None:
    data = bytes(4000)
    bad = Store(1, 2, inline_descriptor(data), data, 0, RequestFlag.INLINE | RequestFlag.INVALIDATE)
    s = describe_payload(bad.encode()[:500], complete=False)
    assert s is not None
    assert s.error == Status.BAD_FLAGS


def test_s9_1_first_segment_of_a_huge_announced_length_is_not_validated() -> None:
    wire = _patched(
        Store(1, 2, inline_descriptor(b""), b"", 0, RequestFlag.INLINE), 36, b"\xff\xff\xff\xff"
    )
    s = describe_payload(wire + bytes(100), complete=False)
    assert s is not None
    assert s.ok and s.message is None
    assert "    Not validated (too long to check from one segment)" in s.tree_lines()


# --------------------------------------------------------------------------------------
# Properties (hypothesis, bounded)
# --------------------------------------------------------------------------------------


@settings(max_examples=300, deadline=None)
@given(all_messages)
def test_s5_describe_agrees_with_decode_for_every_message(message: Message) -> None:
    s = describe_payload(message.encode())
    assert s is not None and s.message == message
    fields = s.json_fields()
    for key, value in expected_fields(message).items():
        assert fields[key] == value, key


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=200))
def test_s5_random_bytes_never_raise(data: bytes) -> None:
    s = describe_payload(data)
    assert s is None or s.line


@settings(max_examples=300, deadline=None)
@given(
    st.sampled_from(list(MessageOpcode)),
    st.binary(min_size=COMMON_HEADER_LEN - 2, max_size=300),
    st.booleans(),
)
def test_s5_random_kbtp_looking_bytes_give_a_sound_summary(
    opcode: MessageOpcode, rest: bytes, complete: bool
) -> None:
    payload = bytes([KBTP_VERSION, opcode]) + rest
    s = describe_payload(payload, complete=complete)
    assert s is not None and s.opcode == opcode
    assert_sound(s)
    try:
        decoded: Message | None = decode_message(payload)
    except KbtpError:
        decoded = None
    if complete:
        assert s.message == decoded
        assert s.ok == (decoded is not None)


@settings(max_examples=300, deadline=None)
@given(messages, st.data())
def test_s5_mutated_messages_never_raise(message: Message, data: st.DataObject) -> None:
    raw = bytearray(message.encode())
    for _ in range(data.draw(st.integers(1, 4))):
        at = data.draw(st.integers(0, len(raw) - 1))
        raw[at] = data.draw(st.integers(0, 255))
    if data.draw(st.booleans()):
        del raw[data.draw(st.integers(COMMON_HEADER_LEN, len(raw))) :]
    s = describe_payload(bytes(raw), complete=data.draw(st.booleans()))
    if s is not None:
        assert_sound(s)


def test_describe_is_pure_no_scapy_imported() -> None:
    code = "import sys, kbtp.describe; print(any(m.startswith('scapy') for m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_json_hex_fields_are_the_stags_and_tagged_offsets() -> None:
    """docs/kbtp.md §2: the offsets named with an STag are Tagged Offsets; those and the STags
    are written as hex of the field's width by ``iwarp dissect --json``."""
    parts = (HEADER, COMPLETION_DESCRIPTOR, *(f.body for f in FORMATS.values()))
    labelled = {"kbtp_" + key: 2 * f.size for part in parts
                for key, f in zip(part.keys, part.fields, strict=True)
                if "STag" in f.label or "Offset" in f.label}  # fmt: skip
    assert JSON_HEX_DIGITS == labelled
    assert {JSON_HEX_DIGITS["kbtp_desc_stag"], JSON_HEX_DIGITS["kbtp_record_to"]} == {8, 16}
