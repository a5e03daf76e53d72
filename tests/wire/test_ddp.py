"""DDP headers and segmentation (RFC 5041 §4, §5.2)."""

from __future__ import annotations

import array
import struct
from collections.abc import Callable

import pytest

from stack.constants import (
    DDP_TAGGED_HDR_LEN,
    DDP_UNTAGGED_HDR_LEN,
    TERM_DDP_CATASTROPHIC,
    TERM_DDP_T_INVALID_VERSION,
    TERM_DDP_U_INVALID_VERSION,
)
from stack.errors import DecodeError, LocalError
from stack.wire import ddp

MIB = 1 << 20


def test_ddp_01_tagged_header_layout() -> None:
    seg = ddp.encode_tagged(True, 0x00ABCDEF, 0x1000, 0x40, bytes(range(1, 9)))
    assert bytes(seg) == bytes.fromhex("c140 00abcdef 0000000000001000 0102030405060708")
    hdr = ddp.parse_header(seg)
    assert hdr == ddp.DdpHeader(True, True, 0, 1, 0x40, stag=0x00ABCDEF, to=0x1000)
    assert hdr.header_len == DDP_TAGGED_HDR_LEN == 14


def test_ddp_01_untagged_header_layout() -> None:
    seg = ddp.encode_untagged(False, 1, 7, 0x10, (0x44 << 32) | 0xCAFEBABE, b"xy")
    assert bytes(seg) == bytes.fromhex("0144 cafebabe 00000001 00000007 00000010 7879")
    hdr = ddp.parse_header(seg)
    assert (hdr.tagged, hdr.last, hdr.qn, hdr.msn, hdr.mo) == (False, False, 1, 7, 0x10)
    assert hdr.rsvd_ulp == (0x44 << 32) | 0xCAFEBABE and hdr.stag is None and hdr.to is None
    assert hdr.header_len == DDP_UNTAGGED_HDR_LEN == 18


@pytest.mark.parametrize("data", [b"", b"\x80", b"\x01" * 17, b"\xc1" * 13])
def test_ddp_01_header_needs_its_full_length(data: bytes) -> None:
    with pytest.raises(DecodeError) as info:
        ddp.parse_header(data)
    assert info.value.rule == "DDP-01" and info.value.term == TERM_DDP_CATASTROPHIC


def test_ddp_03_version_one_and_reserved_zero_on_send() -> None:
    for seg in (
        ddp.encode_tagged(False, 1, 2, 0x40),
        ddp.encode_untagged(True, 0, 1, 0, 0x43 << 32),
    ):
        hdr = ddp.parse_header(seg)
        assert hdr.dv == 1 and hdr.rsvd == 0


def test_ddp_03_version_error_maps_by_t_bit() -> None:
    assert ddp.version_error(0x80).term == TERM_DDP_T_INVALID_VERSION
    assert ddp.version_error(0x02).term == TERM_DDP_U_INVALID_VERSION
    assert ddp.version_error(0xC0).rule == "DDP-03"


def test_ddp_05_untagged_mo_progression_worked_example() -> None:
    # Digest §4.2: 2048 bytes with MULPDU 1500 -> MO 0 / 1482 B, then MO 1482 / 566 B.
    segs = ddp.segment_untagged(0, 1, 0x43 << 32, bytes(2048), 1500)
    hdrs = [ddp.parse_header(s) for s in segs]
    assert [(h.mo, len(s) - 18, h.last) for h, s in zip(hdrs, segs, strict=True)] == [
        (0, 1482, False),
        (1482, 566, True),
    ]
    assert {h.msn for h in hdrs} == {1}


def test_ddp_06_tagged_to_progression_worked_example() -> None:
    # Digest §4.2: 2048 bytes at TO 16384 with MULPDU 1500 -> 16384 / 1486, 17870 / 562.
    segs = ddp.segment_tagged(5, 16384, 0x40, bytes(2048), 1500)
    hdrs = [ddp.parse_header(s) for s in segs]
    assert [(h.to, len(s) - 14) for h, s in zip(hdrs, segs, strict=True)] == [
        (16384, 1486),
        (17870, 562),
    ]


def test_ddp_02_last_only_on_final_segment() -> None:
    for segs in (
        ddp.segment_tagged(5, 0, 0x40, bytes(10_000), 128),
        ddp.segment_untagged(0, 3, 0x43 << 32, bytes(10_000), 128),
    ):
        flags = [ddp.parse_header(s).last for s in segs]
        assert flags == [False] * (len(segs) - 1) + [True]


def test_ddp_04_rsvdulp_stag_qn_msn_identical_in_every_segment() -> None:
    tagged = [ddp.parse_header(s) for s in ddp.segment_tagged(9, 0, 0x42, bytes(5000), 200)]
    assert {(h.stag, h.rsvd_ulp) for h in tagged} == {(9, 0x42)}
    ulp = (0x44 << 32) | 0x1234
    untagged = [ddp.parse_header(s) for s in ddp.segment_untagged(0, 6, ulp, bytes(5000), 200)]
    assert {(h.qn, h.msn, h.rsvd_ulp) for h in untagged} == {(0, 6, ulp)}


@pytest.mark.parametrize("mulpdu", [128, 129, 1442, 8954, 64768])
@pytest.mark.parametrize("size", [1, 113, 114, 115, 4096, 100_003])
def test_ddp_06_segments_fit_mulpdu_and_carry_everything(mulpdu: int, size: int) -> None:
    payload = bytes(i % 251 for i in range(size))
    for segs, hlen, offset in (
        (ddp.segment_tagged(1, 1000, 0x40, payload, mulpdu), 14, "to"),
        (ddp.segment_untagged(0, 1, 0x43 << 32, payload, mulpdu), 18, "mo"),
    ):
        assert all(len(s) <= mulpdu for s in segs)
        assert all(len(s) == mulpdu for s in segs[:-1])  # every segment but the last is full
        assert b"".join(bytes(s[hlen:]) for s in segs) == payload
        base = 1000 if offset == "to" else 0
        pos = base
        for s in segs:
            assert getattr(ddp.parse_header(s), offset) == pos
            pos += len(s) - hlen


def test_ddp_06_segment_sizes() -> None:
    assert ddp.segment_sizes(2048, 1500, 18) == [1482, 566]
    assert ddp.segment_sizes(2964, 1500, 18) == [1482, 1482]
    assert ddp.segment_sizes(1, 128, 14) == [1]
    assert sum(ddp.segment_sizes(MIB, 128, 14)) == MIB
    assert len(ddp.segment_sizes(MIB, 128, 14)) == -(-MIB // 114)


def test_ddp_06_message_must_be_below_2_pow_32() -> None:
    assert ddp.segment_sizes((1 << 32) - 1, 64768, 18)[-1] > 0
    with pytest.raises(LocalError):
        ddp.segment_sizes(1 << 32, 64768, 18)
    with pytest.raises(LocalError):
        ddp.segment_sizes(10, 18, 18)  # no room for payload


def test_ddp_07_zero_length_message_is_one_segment() -> None:
    (t,) = ddp.segment_tagged(1, 0, 0x40, b"", 128)
    assert bytes(t) == bytes.fromhex("c140 00000001 0000000000000000")  # the tagged header alone
    (u,) = ddp.segment_untagged(0, 1, 0x43 << 32, b"", 128)
    hdr = ddp.parse_header(u)
    assert len(u) == 18 and hdr.last and hdr.mo == 0
    assert ddp.segment_sizes(0, 128, 14) == [0]


def test_ddp_06_one_mib_write_slices_without_extra_copies() -> None:
    payload = bytearray(i & 0xFF for i in range(MIB))
    original = bytes(payload)
    segs = ddp.segment_tagged(7, 0, 0x40, memoryview(payload), 64768)
    assert len(segs) == -(-MIB // (64768 - 14))
    assert all(isinstance(s, bytes) for s in segs)
    payload[:] = bytes(MIB)  # segments own their bytes (exactly one copy each)
    assert b"".join(bytes(s[14:]) for s in segs) == original


def test_ddp_segmenter_accepts_any_buffer_format() -> None:
    words = array.array("I", range(100))  # 400 bytes, item size 4
    # Any buffer works at runtime; the Data annotation names only bytes-like types.
    segs = ddp.segment_untagged(0, 1, 0x43 << 32, words, 128)  # type: ignore[arg-type]
    assert b"".join(bytes(s[18:]) for s in segs) == words.tobytes()
    (one,) = ddp.segment_untagged(0, 1, 0x43 << 32, words, 1024)  # type: ignore[arg-type]  # one segment
    assert bytes(one[18:]) == words.tobytes()
    assert bytes(ddp.encode_tagged(True, 1, 2, 0x40, memoryview(words))[14:]) == words.tobytes()


def test_ddp_06_tagged_to_wraps_modulo_2_pow_64() -> None:
    top = (1 << 64) - 200
    segs = ddp.segment_tagged(1, top, 0x40, bytes(400), 128)
    tos = [ddp.parse_header(s).to for s in segs]
    last_to = tos[-1]
    assert last_to is not None
    assert tos[0] == top and last_to < 400  # the sender may aim at the peer's wrap check


@pytest.mark.parametrize(
    "call",
    [
        lambda: ddp.encode_tagged(True, 1 << 32, 0, 0x40),
        lambda: ddp.encode_tagged(True, 1, 1 << 64, 0x40),
        lambda: ddp.encode_tagged(True, 1, 0, 0x100),
        lambda: ddp.encode_untagged(True, 1 << 32, 1, 0, 0),
        lambda: ddp.encode_untagged(True, 0, -1, 0, 0),
        lambda: ddp.encode_untagged(True, 0, 1, 0, 1 << 40),
        lambda: ddp.segment_untagged(0, 1, -1, b"", 128),
        lambda: ddp.segment_untagged(0, 1 << 32, 0, b"x", 128),  # one segment
        lambda: ddp.segment_untagged(-1, 1, 0, b"x", 128),
        lambda: ddp.segment_untagged(0, 1 << 32, 0, bytes(300), 128),  # several
        lambda: ddp.segment_tagged(1, -1, 0x40, b"", 128),
        lambda: ddp.segment_tagged(1 << 32, 0, 0x40, b"x", 128),
    ],
)
def test_ddp_encoders_reject_out_of_range_fields(call: Callable[[], object]) -> None:
    with pytest.raises(LocalError):
        call()


def test_ddp_headers_are_big_endian() -> None:
    seg = ddp.encode_untagged(True, 0x01020304, 0x05060708, 0x090A0B0C, 0)
    assert struct.unpack(">III", seg[6:18]) == (0x01020304, 0x05060708, 0x090A0B0C)


def test_ddp_06_parts_alias_the_payload_and_join_to_the_segments() -> None:
    payload = bytearray(range(256)) * 10
    parts = ddp.segment_untagged_parts(0, 4, 0x43 << 32, payload, 700)
    assert [h + bytes(v) for h, v in parts] == ddp.segment_untagged(0, 4, 0x43 << 32, payload, 700)
    assert all(v.obj is payload for _, v in parts)  # views, not copies
    tparts = ddp.segment_tagged_parts(2, 5, 0x40, payload, 700)
    assert [h + bytes(v) for h, v in tparts] == ddp.segment_tagged(2, 5, 0x40, payload, 700)


@pytest.mark.parametrize("mulpdu", [128, 1442, 64768])
@pytest.mark.parametrize("full", [1, 2, 3])
def test_ddp_06_an_exact_multiple_of_the_room_makes_no_empty_last_segment(
    mulpdu: int, full: int
) -> None:
    """A tagged message of exactly ``full`` segments' room is ``full`` full segments, the
    last with L set and the TO of its first byte (DDP-02, DDP-06)."""
    room = mulpdu - 14
    segs = ddp.segment_tagged(3, 1 << 40, 0x40, bytes(full * room), mulpdu)
    headers = [ddp.parse_header(s) for s in segs]
    assert [len(s) for s in segs] == [mulpdu] * full
    assert [h.last for h in headers] == [False] * (full - 1) + [True]
    assert [h.to for h in headers] == [(1 << 40) + i * room for i in range(full)]


def test_ddp_a_multi_segment_tagged_message_rejects_an_stag_above_32_bits() -> None:
    with pytest.raises(LocalError, match="out of range"):
        ddp.segment_tagged(1 << 32, 0, 0x40, bytes(1000), 128)
