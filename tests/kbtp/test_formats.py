"""The message format table (kbtp.formats, docs/kbtp.md §5) against the reference's octet
tables and against the independently written Scapy layers: field names, offsets and sizes,
and the values Scapy dissects from what kbtp.messages encodes."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scapy.packet import Packet

from kbtp.constants import KBTP_VERSION, Capability, MessageOpcode, RequestFlag
from kbtp.formats import (
    COMPLETION_DESCRIPTOR,
    FORMATS,
    HEADER,
    Field,
    Part,
    Tail,
)
from kbtp.messages import Completion, Hello, Message
from kbtp.scapy_layers import BODY_LAYERS, KBTP, KBTP_CompletionDescriptor
from tests.kbtp.test_messages import binds, frees, loads, stores, u16, u32, u64
from tests.kbtp.test_scapy_layers import hello_acks

DOC = (Path(__file__).parents[2] / "docs" / "kbtp.md").read_text()
OPCODES = list(MessageOpcode)
BY_OPCODE: dict[MessageOpcode, st.SearchStrategy[Message]] = {
    MessageOpcode.HELLO: st.builds(
        Hello, u64, st.sampled_from(list(Capability)), st.binary(max_size=256)
    ),
    MessageOpcode.HELLO_ACK: hello_acks,
    MessageOpcode.COMPLETION: st.builds(
        Completion, u64, u64, u16, u16, u32, u64, st.integers(0, 255)
    ),
    MessageOpcode.LOAD: loads(),
    MessageOpcode.STORE: stores().filter(lambda m: m.opcode == MessageOpcode.STORE),
    MessageOpcode.ALLOC_STORE: stores().filter(lambda m: m.opcode == MessageOpcode.ALLOC_STORE),
    MessageOpcode.FREE: frees(),
    MessageOpcode.BIND: binds(),
}
"""Messages of each opcode, as the round-trip tests of test_messages generate them."""


def _doc_rows(section: str) -> list[tuple[int, int]]:
    """(first, last) octet of each fixed row of the octet table of a §5 section."""
    start = DOC.index(f"### {section} ")
    text = DOC[start : DOC.index("\n### ", start + 1)]
    rows = []
    for first, last in re.findall(r"^\| (\d+)(?:-(\d+))? \|", text, re.M):
        rows.append((int(first), int(last or first)))
    return rows


def _spans(part: Part, start: int) -> list[tuple[int, int]]:
    return [(start + f.offset, start + f.offset + f.size - 1) for f in part.fields]


# --------------------------------------------------------------------------------------
# The table itself
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("section", "opcode"),
    [
        ("5.3", MessageOpcode.HELLO),
        ("5.4", MessageOpcode.HELLO_ACK),
        ("5.7", MessageOpcode.BIND),
        ("5.8", MessageOpcode.COMPLETION),
    ],
)
def test_s5_body_octets_are_those_of_the_reference(section: str, opcode: MessageOpcode) -> None:
    assert _doc_rows(section) == _spans(FORMATS[opcode].body, HEADER.size)


def test_s5_parts_are_contiguous_and_keys_unique_per_message() -> None:
    for form in FORMATS.values():
        parts = [HEADER, form.body] + ([COMPLETION_DESCRIPTOR] if form.request else [])
        keys = [k for p in parts for k in p.keys]
        assert len(keys) == len(set(keys)), form.opcode
        for part in parts:
            assert [f.offset for f in part.fields] == [
                sum(g.size for g in part.fields[:i]) for i in range(len(part.fields))
            ]
            assert part.full.size == part.codec.size == part.size


# --------------------------------------------------------------------------------------
# The Scapy layers agree with the table
# --------------------------------------------------------------------------------------


def _scapy_fields(layer: type[Packet], form_tail: Tail) -> list[str]:
    names = [f.name for f in layer.fields_desc]
    if form_tail is Tail.IDENTITY:
        assert names[-1] == "identity"  # the variable tail, not a fixed field
        names = names[:-1]
    return names


def _probe(layer: type[Packet], part: Part, f: Field) -> tuple[int, int]:
    """Where setting ``f`` alone to all ones changes the layer's octets: (offset, size)."""
    zero: dict[str, Any] = {g.name: 0 for g in part.fields}
    base = bytes(layer(**zero))
    ones = bytes(layer(**{**zero, f.name: (1 << (8 * f.size)) - 1}))
    assert len(base) == len(ones) == part.size
    changed = [i for i in range(part.size) if base[i] != ones[i]]
    return changed[0], len(changed)


def _check_layer(layer: type[Packet], part: Part, tail: Tail = Tail.NONE) -> None:
    assert _scapy_fields(layer, tail) == [f.name for f in part.fields], layer.__name__
    for f in part.fields:
        assert _probe(layer, part, f) == (f.offset, f.size), (layer.__name__, f.name)


def test_s5_1_scapy_header_layer_is_the_table_header() -> None:
    _check_layer(KBTP, HEADER)


def test_s5_2_scapy_completion_descriptor_is_the_table_descriptor() -> None:
    _check_layer(KBTP_CompletionDescriptor, COMPLETION_DESCRIPTOR)


@pytest.mark.parametrize("opcode", OPCODES, ids=[o.name for o in OPCODES])
def test_s5_scapy_body_layer_is_the_table_body(opcode: MessageOpcode) -> None:
    form = FORMATS[opcode]
    _check_layer(BODY_LAYERS[opcode], form.body, form.tail)


def _expected(message: Message, part: Part, f: Field) -> int | None:
    """The value ``message`` gives field ``f`` of ``part`` (None: reserved)."""
    if f.reserved:
        return None
    if part is HEADER:
        defaults = {"version": KBTP_VERSION, "handle": 0, "generation": 0, "status": 0}
        return int(getattr(message, f.name, defaults.get(f.name, 0)))
    if part is COMPLETION_DESCRIPTOR:
        return int(getattr(message.completion, f.name))  # type: ignore[union-attr]
    if f.name == "identity_length":
        assert isinstance(message, Hello)
        return len(message.identity)
    holder = getattr(message, "descriptor", message) if part.key_prefix == "desc_" else message
    return int(getattr(holder, f.name))


@pytest.mark.parametrize("opcode", OPCODES, ids=[o.name for o in OPCODES])
@settings(max_examples=25, deadline=None)
@given(data=st.data())
def test_s5_scapy_dissects_what_messages_encode_field_by_field(
    opcode: MessageOpcode, data: st.DataObject
) -> None:
    message = data.draw(BY_OPCODE[opcode])
    wire = message.encode()
    pkt = KBTP(wire)
    layers: list[tuple[Packet, Part, int]] = [(pkt, HEADER, 0)]
    layers.append((pkt.payload, FORMATS[opcode].body, HEADER.size))
    assert type(pkt.payload) is BODY_LAYERS[opcode]
    if FORMATS[opcode].request and message.flags & RequestFlag.RECORD:  # type: ignore[union-attr]
        descriptor = pkt.payload.payload
        assert isinstance(descriptor, KBTP_CompletionDescriptor)
        layers.append((descriptor, COMPLETION_DESCRIPTOR, HEADER.size + FORMATS[opcode].body.size))
    for layer, part, start in layers:
        for f in part.fields:
            at = start + f.offset
            on_wire = int.from_bytes(wire[at : at + f.size], "big")
            assert int(layer.getfieldval(f.name)) == on_wire, f.name
            want = _expected(message, part, f)
            assert on_wire == (0 if want is None else want), f.name
