"""The pyverbs initiator's encoder and parsers (written from docs/kbtp.md alone) against the
document's worked examples (§10), without the siw guest; the interop test
``stack/interop/siw/test_kbtp_siw.py`` runs it in the guest."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from kbtp.constants import Status
from stack.interop.siw import kbtp_pyverbs_initiator as guest

DOC = Path(__file__).resolve().parents[2] / "docs" / "kbtp.md"


def worked_examples() -> dict[str, bytes]:
    """The hex blocks of docs/kbtp.md §10, by their ``# NAME`` line."""
    blocks = re.findall(r"```hex\n# ([^\n]+)\n(.*?)```", DOC.read_text(), re.S)
    return {name: bytes.fromhex("".join(body.split())) for name, body in blocks}


def test_guest_messages_are_the_worked_examples() -> None:
    """The guest's encoder, from docs/kbtp.md alone, gives §10's octets."""
    ex = worked_examples()
    hello = guest.header(guest.HELLO, 0, 1, 0, 0) + guest.HELLO_BODY.pack(3, 8, 0) + b"decode-7"
    assert hello == ex["HELLO"]
    load_ = guest.header(0x10, 0, 0x2A, 0x1005, 4) + guest.DESCRIPTOR.pack(
        0xABCD01, 0x10000, 0x10000
    )
    assert load_ == ex["LOAD"]
    flags = guest.flag_bits(["INLINE", "SEAL"])
    store = guest.header(0x11, flags, 0x2B, 0x1006, 2) + guest.DESCRIPTOR.pack(0, 0, 3) + b"KV!"
    assert store == ex["STORE"]
    assert guest.header(0x13, 0, 0x2D, 0x1005, 4) == ex["FREE"]
    bind = guest.header(0x14, 2, 0x2E, 0x1007, 0) + guest.BIND_BODY.pack(9, 0x1000, 0x10040000)
    assert bind == ex["BIND"]


def test_guest_parses_the_worked_examples() -> None:
    ex = worked_examples()
    ack = guest.parse_hello_ack(ex["HELLO_ACK"])
    assert (ack["status"], ack["request_id"], ack["capabilities"]) == (0, 1, 3)
    assert (ack["block_size"], ack["pool_size"], ack["quota"]) == (0x10000, 1024, 64)
    assert (ack["handle_base"], ack["handle_count"], ack["credits"]) == (0x1000, 0x100, 16)
    assert (ack["ring_order"], ack["max_inline"], ack["ticket_timeout"]) == (6, 4096, 2000)
    assert (ack["table_stag"], ack["pool_stag"], ack["table_offset"]) == (
        0x1100,
        0x1200,
        0x10000000,
    )
    assert (ack["ring_stag"], ack["partition_stag"], ack["head_stag"]) == (0x1300, 0x1400, 0x1500)
    assert (ack["head_offset"], ack["partition_length"]) == (0x14000400, 0x400000)
    comp = guest.parse_completion(ex["COMPLETION of the LOAD"])
    assert (comp["request_id"], comp["handle"], comp["generation"]) == (0x2A, 0x1005, 4)
    assert (comp["data_length"], comp["request_opcode"], comp["block_offset"]) == (
        0x10000,
        0x10,
        0x10030000,
    )
    no_space = guest.parse_completion(ex["COMPLETION with NO_SPACE"])
    assert no_space["status_name"] == Status.NO_SPACE.name == guest.status_name(18)
    assert no_space["block_offset"] == guest.ALL_ONES_64
    assert guest.STATUS_NAMES == [s.name for s in Status]
    with pytest.raises(RuntimeError, match="COMPLETION of 24 octets"):
        guest.parse_completion(ex["COMPLETION of the LOAD"][:24])


def test_guest_pattern_has_a_prime_period() -> None:
    data = guest.pattern(7, 3 * guest.PATTERN_PERIOD)
    assert data[: guest.PATTERN_PERIOD] == data[guest.PATTERN_PERIOD : 2 * guest.PATTERN_PERIOD]
    assert data[:256] != data[256:512] and guest.pattern(7, 100) != guest.pattern(8, 100)
