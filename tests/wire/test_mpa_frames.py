"""MPA Request/Reply frames and the RFC 6581 IRD/ORD word (RFC 5044 §7.1, RFC 6581 §9)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stack.constants import (
    MPA_KEY_REP,
    MPA_KEY_REQ,
    MPA_V2_IRD_ORD_MAX,
    TERM_LLP_INVALID_STARTUP,
    MpaFlag,
    RtrType,
)
from stack.errors import LocalError, MpaError, ProtocolError
from stack.wire.events import IrdOrd, MpaFrame
from stack.wire.mpa import decode_frame, decode_ird_ord, encode_frame, encode_ird_ord

REQ_KEY_HEX = "4d 50 41 20 49 44 20 52 65 71 20 46 72 61 6d 65"
REP_KEY_HEX = "4d 50 41 20 49 44 20 52 65 70 20 46 72 61 6d 65"

# Digest §3.6.
REQ_V2 = bytes.fromhex(REQ_KEY_HEX + "50 02 00 04 80 10 c0 10")
REP_V2 = bytes.fromhex(REP_KEY_HEX + "50 02 00 04 80 10 80 10")
REJ_V1 = bytes.fromhex(REP_KEY_HEX + "60 01 00 00")

REQ_V2_FRAME = MpaFrame(
    reply=False,
    crc=True,
    rev=2,
    ird_ord=IrdOrd(16, 16, p2p=True, rtr=RtrType.WRITE | RtrType.READ),
)
REP_V2_FRAME = MpaFrame(
    reply=True, crc=True, rev=2, ird_ord=IrdOrd(16, 16, p2p=True, rtr=RtrType.WRITE)
)
REJ_V1_FRAME = MpaFrame(reply=True, crc=True, reject=True, rev=1)


def decode_all(data: bytes, **kwargs: int) -> MpaFrame:
    result = decode_frame(data, **kwargs)
    assert result is not None
    frame, used = result
    assert used == len(data)
    return frame


@pytest.mark.parametrize(
    ("wire", "frame"),
    [(REQ_V2, REQ_V2_FRAME), (REP_V2, REP_V2_FRAME), (REJ_V1, REJ_V1_FRAME)],
    ids=["request-v2", "reply-v2", "reject-v1"],
)
def test_erc_03_reference_frames_byte_exact(wire: bytes, frame: MpaFrame) -> None:
    assert encode_frame(frame) == wire
    assert decode_all(wire) == frame


def test_mpa_18_exact_keys() -> None:
    assert MPA_KEY_REQ == bytes.fromhex(REQ_KEY_HEX)
    assert MPA_KEY_REP == bytes.fromhex(REP_KEY_HEX)
    assert encode_frame(MpaFrame(reply=False, rev=1))[:16] == MPA_KEY_REQ
    assert encode_frame(MpaFrame(reply=True, rev=1))[:16] == MPA_KEY_REP


@pytest.mark.parametrize(
    "bad",
    [
        b"MPA ID Req Frame".lower(),
        b"MPA ID Rsp Frame",
        b"MPA ID Req Frame\x00".replace(b" ", b"\x00"),
        b"GET / HTTP/1.1\r\n",
    ],
)
def test_mpa_18_wrong_key_is_malformed(bad: bytes) -> None:
    data = bad[:16] + bytes([0x40, 1, 0, 0])
    with pytest.raises(MpaError) as info:
        decode_frame(data)
    assert info.value.rule == "MPA-18"
    assert info.value.term == TERM_LLP_INVALID_STARTUP


def test_mpa_18_wrong_key_detected_from_a_prefix() -> None:
    """A bad key is reported as soon as the bytes cannot start either key."""
    assert decode_frame(b"MPA ID Re") is None
    assert decode_frame(b"") is None
    with pytest.raises(MpaError):
        decode_frame(b"MPA ID Rx")
    with pytest.raises(MpaError):
        decode_frame(b"\x16\x03\x01")  # a TLS ClientHello


def test_mpa_19_reserved_bits_kept_and_not_rejected() -> None:
    wire = bytes.fromhex(REP_KEY_HEX + "48 01 00 00")  # C + siw's GSO bit 0x08
    frame = decode_all(wire)
    assert frame.reserved == MpaFlag.SIW_GSO
    assert frame.crc and not frame.markers and not frame.reject
    assert encode_frame(frame) == wire
    all_reserved = decode_all(bytes.fromhex(REQ_KEY_HEX + "0f 02 00 00"))
    assert all_reserved.reserved == 0x0F and all_reserved.ird_ord is None


def test_mpa_19_r_bit_in_request_decoded_as_sent() -> None:
    frame = decode_all(bytes.fromhex(REQ_KEY_HEX + "60 01 00 00"))
    assert not frame.reply and frame.reject


def test_erc_01_s_bit_below_rev_2_is_reserved() -> None:
    """RFC 5044 counts 0x10 as Res: a Rev 1 frame with it has no IRD/ORD word."""
    frame = decode_all(bytes.fromhex(REQ_KEY_HEX + "50 01 00 04 80 10 c0 10"))
    assert frame.ird_ord is None
    assert frame.reserved == MpaFlag.ENHANCED
    assert frame.private_data == bytes.fromhex("80 10 c0 10")
    assert encode_frame(frame) == bytes.fromhex(REQ_KEY_HEX + "50 01 00 04 80 10 c0 10")


def test_erc_01_word_needs_rev_2_to_encode() -> None:
    with pytest.raises(LocalError):
        encode_frame(MpaFrame(reply=False, rev=1, ird_ord=IrdOrd(1, 1)))


@pytest.mark.parametrize("rev", [0, 3, 255])
def test_mpa_20_other_revisions_decode(rev: int) -> None:
    frame = MpaFrame(reply=False, rev=rev, private_data=b"pd")
    assert decode_all(encode_frame(frame)) == frame


def test_mpa_21_private_data_limit() -> None:
    frame = MpaFrame(reply=False, rev=1, private_data=bytes(512))
    wire = encode_frame(frame)
    assert decode_all(wire) == frame
    with pytest.raises(MpaError) as info:
        decode_frame(wire, max_private_data=256)  # siw's limit
    assert info.value.rule == "MPA-21"
    assert info.value.term == TERM_LLP_INVALID_STARTUP
    with pytest.raises(LocalError):
        encode_frame(MpaFrame(reply=False, rev=1, private_data=bytes(513)))
    big = encode_frame(MpaFrame(reply=False, rev=1, private_data=bytes(513)), max_private_data=None)
    with pytest.raises(MpaError):
        decode_frame(big)


def test_mpa_21_pd_length_checked_before_the_data_arrives() -> None:
    header = bytes.fromhex(REQ_KEY_HEX + "40 01 02 01")  # PD_Length 513
    with pytest.raises(MpaError):
        decode_frame(header)


def test_mpa_21_incomplete_frame_waits_and_trailing_bytes_untouched() -> None:
    wire = encode_frame(MpaFrame(reply=True, rev=1, private_data=b"hello"))
    for cut in range(len(wire)):
        assert decode_frame(wire[:cut]) is None
    result = decode_frame(wire + b"\x00\x10FPDU...")
    assert result is not None and result[1] == len(wire)


def test_erc_02_word_counts_in_pd_length_and_limit() -> None:
    frame = MpaFrame(reply=False, rev=2, ird_ord=IrdOrd(1, 2), private_data=bytes(508))
    wire = encode_frame(frame)
    assert wire[18:20] == (512).to_bytes(2, "big")
    assert decode_all(wire) == frame
    with pytest.raises(LocalError):
        encode_frame(MpaFrame(reply=False, rev=2, ird_ord=IrdOrd(1, 2), private_data=bytes(509)))


@pytest.mark.parametrize("pd_len", [0, 1, 3])
def test_erc_02_s_bit_without_room_for_the_word(pd_len: int) -> None:
    wire = bytes.fromhex(REQ_KEY_HEX + "50 02") + pd_len.to_bytes(2, "big") + bytes(pd_len)
    with pytest.raises(MpaError) as info:
        decode_frame(wire)
    assert info.value.rule == "ERC-02"


@pytest.mark.parametrize(
    ("value", "word"),
    [
        (IrdOrd(0, 0), 0x00000000),
        (IrdOrd(0x3FFF, 0x3FFF), 0x3FFF3FFF),
        (IrdOrd(1, 2, p2p=True), 0x80010002),
        (IrdOrd(0, 0, rtr=RtrType.SEND), 0x40000000),
        (IrdOrd(0, 0, rtr=RtrType.WRITE), 0x00008000),
        (IrdOrd(0, 0, rtr=RtrType.READ), 0x00004000),
        (IrdOrd(16, 16, True, RtrType.WRITE | RtrType.READ), 0x8010C010),
    ],
)
def test_erc_03_ird_ord_word_layout(value: IrdOrd, word: int) -> None:
    assert encode_ird_ord(value) == word.to_bytes(4, "big")
    assert decode_ird_ord(word.to_bytes(4, "big")) == value


def test_erc_03_ird_ord_fourteen_bits() -> None:
    with pytest.raises(LocalError):
        encode_ird_ord(IrdOrd(MPA_V2_IRD_ORD_MAX + 1, 0))
    with pytest.raises(LocalError):
        encode_ird_ord(IrdOrd(0, -1))
    with pytest.raises(MpaError):
        decode_ird_ord(b"\x00\x00\x00")


# -- properties ---------------------------------------------------------------------------

ird_ords = st.builds(
    IrdOrd,
    st.integers(0, MPA_V2_IRD_ORD_MAX),
    st.integers(0, MPA_V2_IRD_ORD_MAX),
    st.booleans(),
    st.sampled_from([RtrType(v) for v in range(8)]),
)


@st.composite
def frames(draw: st.DrawFn) -> MpaFrame:
    rev = draw(st.sampled_from([0, 1, 2, 3, 200]))
    ird_ord = draw(st.none() | ird_ords) if rev >= 2 else None
    limit = 508 if ird_ord is not None else 512
    reserved_mask = 0x0F if rev >= 2 else 0x1F
    return MpaFrame(
        reply=draw(st.booleans()),
        markers=draw(st.booleans()),
        crc=draw(st.booleans()),
        reject=draw(st.booleans()),
        rev=rev,
        ird_ord=ird_ord,
        private_data=draw(st.binary(max_size=limit)),
        reserved=draw(st.integers(0, 0x1F)) & reserved_mask,
    )


@settings(max_examples=100, deadline=None)
@given(frames())
def test_mpa_21_frame_round_trip(frame: MpaFrame) -> None:
    assert decode_all(encode_frame(frame)) == frame


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=600), st.booleans())
def test_mpa_18_random_bytes_raise_only_protocol_errors(data: bytes, with_key: bool) -> None:
    if with_key:
        data = MPA_KEY_REQ + data
    try:
        decode_frame(data)
    except ProtocolError:
        pass


@settings(max_examples=120, deadline=None)
@given(frames(), st.lists(st.tuples(st.integers(0, 600), st.integers(1, 255)), max_size=4))
def test_mpa_21_mutated_frames_raise_only_protocol_errors(
    frame: MpaFrame, flips: list[tuple[int, int]]
) -> None:
    wire = bytearray(encode_frame(frame))
    for where, xor in flips:
        wire[where % len(wire)] ^= xor
    try:
        result = decode_frame(wire)
    except ProtocolError:
        return
    if result is not None:
        assert result[1] <= len(wire)
