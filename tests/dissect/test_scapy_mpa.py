"""Scapy MPA layers (stack.dissect.scapy.mpa): Request/Reply frames, marker, FPDU and CRC.

Byte-exact against reference frames (RFC 6581), field-exact on dissection, forced values,
CRC verdicts, truncation and robustness."""

from __future__ import annotations

import struct
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scapy.packet import Packet, Raw

from stack.constants import (
    MPA_CRC_RESIDUE,
    MPA_KEY_REP,
    MPA_KEY_REQ,
    MPA_RESERVED_MASK,
    MPA_V2_PEER_TO_PEER,
    MPA_V2_RTR_READ,
    MPA_V2_RTR_SEND,
    MPA_V2_RTR_WRITE,
    MpaFlag,
)
from stack.crc import crc32c
from stack.dissect.scapy import (
    DDP,
    MPA_FPDU,
    DDP_Tagged,
    DDP_Untagged,
    IWARP_Undecoded,
    MPA_FPDU_NoCRC,
    MPA_Frame,
    MPA_Marker,
    MPA_Reply,
    MPA_Request,
    RDMAP_ReadRequest,
    RDMAP_Terminate,
    insert_markers,
    send_fpdu,
)
from stack.errors import DecodeError
from tests.dissect.scapy_vectors import (
    CRC,
    DDP_EXPECT,
    FRAMES,
    HELLO,
    E,
    fields_of,
)


def dump(pkt: Packet) -> str:
    """``pkt.show(dump=True)``: the text Scapy returns instead of printing it."""
    text = pkt.show(dump=True)
    assert isinstance(text, str)
    return text


# --------------------------------------------------------------------------------------
# MPA Request / Reply: byte-exact building, dissection, forced values
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(E))
def test_mpa_12_examples_satisfy_crc_residue(name: str) -> None:
    assert crc32c(E[name]) == MPA_CRC_RESIDUE


def test_erc_03_erc_07_rfc6581_request_and_reply_byte_exact() -> None:
    req = MPA_Request(p2p=1, rtr_write=1, rtr_read=1, ird=16, ord=16)
    rep = MPA_Reply(p2p=1, rtr_write=1, ird=16, ord=16)
    assert bytes(req) == FRAMES["req"]
    assert bytes(rep) == FRAMES["rep"]


def test_mpa_23_reject_reply_rev1_no_private_data_byte_exact() -> None:
    assert bytes(MPA_Reply(rev=1, reject=1, enhanced=0)) == FRAMES["rej"]


def test_erc_03_frames_dissect_ird_ord_word() -> None:
    req = MPA_Frame(FRAMES["req"])
    assert type(req) is MPA_Request
    assert fields_of(req) == dict(
        key=MPA_KEY_REQ, markers=0, crc=1, reject=0, enhanced=1, res=0, rev=2, pd_length=4,
        p2p=1, rtr_send=0, ird=16, rtr_write=1, rtr_read=1, ord=16, private_data=b"",
    )  # fmt: skip
    rep = MPA_Frame(FRAMES["rep"])
    assert type(rep) is MPA_Reply and rep.key == MPA_KEY_REP
    assert (rep.p2p, rep.rtr_send, rep.rtr_write, rep.rtr_read) == (1, 0, 1, 0)
    rej = MPA_Frame(FRAMES["rej"])
    assert (rej.rev, rej.reject, rej.enhanced, rej.pd_length) == (1, 1, 0, 0)
    assert not rej.has_ird_ord() and "ird" not in rej.fields  # no word without S
    assert req.has_ird_ord() and rep.has_ird_ord()
    for name, raw in FRAMES.items():
        assert bytes(MPA_Frame(raw)) == raw, name


def test_erc_02_private_data_after_the_word_and_pd_length_auto() -> None:
    frame = MPA_Request(ird=5, ord=7, private_data=b"ulp!")
    raw = bytes(frame)
    assert struct.unpack_from(">H", raw, 18)[0] == 8
    assert struct.unpack_from(">I", raw, 20)[0] == (5 << 16) | 7
    got = MPA_Frame(raw)
    assert (got.ird, got.ord, got.private_data) == (5, 7, b"ulp!")
    plain = MPA_Request(rev=1, enhanced=0, private_data=b"abc")
    got = MPA_Frame(bytes(plain))
    assert (got.pd_length, got.private_data, got.has_ird_ord()) == (3, b"abc", False)


def test_erc_02_enhanced_flag_without_room_for_the_word() -> None:
    raw = bytes(MPA_Request(enhanced=1, pd_length=2, private_data=b"xy"))
    got = MPA_Frame(raw)
    assert got.enhanced == 1 and not got.has_ird_ord() and "ird" not in got.fields
    assert got.private_data == b"xy" and bytes(got) == raw


def test_mpa_flags_and_word_bits_match_constants() -> None:
    flag = bytes(MPA_Request(markers=1, crc=0, reject=1, enhanced=1, res=0))[16]
    assert flag == MpaFlag.MARKERS | MpaFlag.REJECT | MpaFlag.ENHANCED
    assert bytes(MPA_Request(crc=1, enhanced=0))[16] == MpaFlag.CRC
    assert bytes(MPA_Request(crc=0, enhanced=0, res=0xF))[16] == MPA_RESERVED_MASK
    for field, bit in [
        ("p2p", MPA_V2_PEER_TO_PEER),
        ("rtr_send", MPA_V2_RTR_SEND),
        ("rtr_write", MPA_V2_RTR_WRITE),
        ("rtr_read", MPA_V2_RTR_READ),
    ]:
        # dict[str, Any]: Scapy's Packet(**fields) also has typed positional parameters
        word_bit: dict[str, Any] = {field: 1}
        raw = bytes(MPA_Request(ird=0, ord=0, **word_bit))
        assert struct.unpack_from(">I", raw, 20)[0] == bit, field


def test_mpa_04_mpa_12_forced_length_pad_crc_survive() -> None:
    pkt = MPA_FPDU(ulpdu_length=999, pad=b"\xaa\xbb", crc=0x11223344) / DDP_Untagged()
    raw = bytes(pkt)
    assert raw[:2] == (999).to_bytes(2, "big")
    assert raw[20:22] == b"\xaa\xbb" and raw[22:] == bytes.fromhex("44332211")
    pkt = MPA_FPDU(pad=b"") / DDP_Untagged() / Raw(b"x")
    assert len(bytes(pkt)) == 2 + 19 + 4  # no pad at all, on purpose


def test_mpa_19_mpa_20_mpa_21_forced_frame_fields_survive() -> None:
    frame = MPA_Request(key=b"MPA ID Xyz Frame", res=0xA, rev=7, pd_length=600, reject=1)
    raw = bytes(frame)
    assert raw[:16] == b"MPA ID Xyz Frame"
    assert raw[16] & MPA_RESERVED_MASK == 0xA and raw[16] & MpaFlag.REJECT
    assert raw[17] == 7 and raw[18:20] == (600).to_bytes(2, "big")
    got = MPA_Frame(raw)
    assert type(got) is MPA_Frame  # unknown key: generic frame
    assert (got.res, got.rev, got.pd_length) == (0xA, 7, 600) and bytes(got) == raw


# --------------------------------------------------------------------------------------
# CRC verdict (MPA-05, MPA-12)
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(DDP_EXPECT))
def test_mpa_12_crc_verdict_flips_with_any_bit(name: str) -> None:
    raw = bytearray(E[name])
    assert MPA_FPDU(bytes(raw)).crc_ok() is True
    for bit in (0, 8 * 5 + 3, 8 * len(raw) - 1):  # length field, header, CRC field
        flipped = bytearray(raw)
        flipped[bit // 8] ^= 0x80 >> (bit % 8)
        assert MPA_FPDU(bytes(flipped)).crc_ok() is False, bit


def test_mpa_12_crc_covers_nonzero_pad_and_modified_fields() -> None:
    raw = bytearray(E["E1"])
    raw[33] = 0x55  # PAD byte: ignored on receive but covered by the CRC (MPA-04)
    pkt = MPA_FPDU(bytes(raw))
    assert pkt.pad == b"\x55\x00\x00" and pkt.crc_ok() is False and bytes(pkt) == bytes(raw)
    pkt = MPA_FPDU(E["E1"])
    pkt[DDP_Untagged].msn = 2
    assert pkt.crc_ok() is False  # stored CRC no longer matches
    pkt.crc = None
    assert pkt.crc_ok() is True


def test_mpa_05_no_crc_variant_sends_zero_and_is_never_checked() -> None:
    pkt = send_fpdu(HELLO, crc=False)
    raw = bytes(pkt)
    assert raw[:-4] == E["E1"][:-4] and raw[-4:] == bytes(4)
    got = MPA_FPDU_NoCRC(raw)
    assert got.crc == 0 and got.crc_ok() is None
    assert MPA_FPDU(raw).crc_ok() is False
    assert MPA_FPDU_NoCRC(E["E1"]).crc == CRC["E1"]  # any value allowed, kept as received
    assert (Raw(b"") / got)[MPA_FPDU] is not None  # the variant is found as MPA_FPDU


# --------------------------------------------------------------------------------------
# Marker layer, a Reply sharing its segment, truncation
# --------------------------------------------------------------------------------------


def test_mpa_06_marker_layer_fields() -> None:
    m = MPA_Marker(bytes.fromhex("000001fc"))
    assert (m.reserved, m.fpduptr) == (0, 508)
    assert bytes(MPA_Marker(reserved=0xFFFF, fpduptr=3)) == bytes.fromhex("ffff0003")


def test_mpa_25_reply_shares_its_segment_with_an_fpdu() -> None:
    seg = FRAMES["rep"] + E["E2"]
    pkt = MPA_Frame(seg)
    assert type(pkt) is MPA_Reply
    assert pkt[MPA_FPDU].crc_ok() is True and pkt[DDP_Tagged].stag == 0x00ABCDEF
    assert bytes(pkt) == seg
    marked = FRAMES["rep"] + insert_markers(E["E2"], 0)
    pkt = MPA_Frame(marked)
    assert pkt[MPA_Marker].fpduptr == 0 and pkt[DDP_Tagged].stag == 0x00ABCDEF
    rejected = MPA_Frame(FRAMES["rej"] + b"junk")
    assert rejected[Raw].load == b"junk"


def test_mpa_16_truncated_fpdu_keeps_its_bytes_and_fails_crc() -> None:
    for cut in (3, 20, 35, 38):
        raw = E["E1"][:cut]
        pkt = MPA_FPDU(raw)
        assert pkt.is_truncated() and pkt.crc_ok() is False
        assert bytes(pkt) == raw and bytes(pkt.copy()) == raw
    assert not MPA_FPDU(E["E1"]).is_truncated()


@pytest.mark.parametrize(
    ("cls", "raw"),
    [
        (MPA_FPDU, b"\x00"),
        (MPA_Frame, FRAMES["req"][:19]),
        (MPA_Marker, b"\x00\x00\x01"),
        (DDP, b"\x41\x43\x00"),
        (RDMAP_ReadRequest, bytes(27)),
    ],
)
def test_mpa_16_ddp_10_truncated_headers_raise_decode_error(cls: type[Packet], raw: bytes) -> None:
    # strict: the exception; plain dissection keeps every byte with the verdict (Scapy's way)
    with pytest.raises(DecodeError) as exc:
        cls.strict(raw)
    pkt = cls(raw)
    assert pkt.iwarp_error == str(exc.value) and exc.value.rule in pkt.iwarp_error
    assert pkt[IWARP_Undecoded].load == raw and bytes(pkt) == raw
    assert exc.value.rule in dump(pkt) and "undecoded" in pkt.summary()


def test_summaries_name_layers() -> None:
    assert "crc=good" in MPA_FPDU(E["E1"]).mysummary()
    assert "crc=BAD" in MPA_FPDU(E["E1"][:-1] + b"\x00").mysummary()
    assert "Send" in MPA_FPDU(E["E1"])[DDP_Untagged].mysummary()
    assert "IRD=16" in MPA_Frame(FRAMES["req"]).mysummary()


# --------------------------------------------------------------------------------------
# Hypothesis: random frames round-trip; random bytes never crash
# --------------------------------------------------------------------------------------

bit = st.integers(min_value=0, max_value=1)


@settings(max_examples=60, deadline=None)
@given(
    reply=st.booleans(),
    flags=st.tuples(bit, bit, bit, bit, st.integers(0, 15)),
    rev=st.integers(0, 255),
    word=st.tuples(bit, bit, st.integers(0, 0x3FFF), bit, bit, st.integers(0, 0x3FFF)),
    private=st.binary(max_size=64),
)
def test_erc_03_random_mpa_frames_round_trip(
    reply: bool,
    flags: tuple[int, ...],
    rev: int,
    word: tuple[int, ...],
    private: bytes,
) -> None:
    names = ("p2p", "rtr_send", "ird", "rtr_write", "rtr_read", "ord")
    kw: dict[str, Any] = dict(
        zip(("markers", "crc", "reject", "enhanced", "res"), flags, strict=True)
    )
    kw.update(zip(names, word, strict=True))
    frame = (MPA_Reply if reply else MPA_Request)(rev=rev, private_data=private, **kw)
    raw = bytes(frame)
    got = MPA_Frame(raw)
    assert type(got) is type(frame) and bytes(got) == raw
    assert got.pd_length == len(private) + (4 if kw["enhanced"] else 0)
    expect = {k: v for k, v in fields_of(frame).items() if k != "pd_length"}
    if not kw["enhanced"]:
        expect = {k: v for k, v in expect.items() if k not in names}
    assert {k: got.getfieldval(k) for k in expect} == expect


@settings(max_examples=200, deadline=None)
@given(
    data=st.binary(max_size=120),
    cls=st.sampled_from([MPA_FPDU, MPA_FPDU_NoCRC, MPA_Frame, MPA_Marker, DDP, RDMAP_Terminate]),
)
def test_mpa_16_random_bytes_dissect_or_decode_error_and_rebuild_exactly(
    data: bytes, cls: type[Packet]
) -> None:
    if not data:
        return  # Scapy: cls(b"") is the default packet, not a dissection
    pkt = cls(data)  # never raises: what cannot be dissected is kept with its verdict
    if pkt.iwarp_error is not None:
        with pytest.raises(DecodeError):
            cls.strict(data)
    else:
        assert bytes(cls.strict(data)) == data
    assert bytes(pkt) == data
    pkt.show(dump=True)
    pkt.summary()
    if isinstance(pkt, MPA_FPDU):
        assert pkt.crc_ok() in (True, False, None)
