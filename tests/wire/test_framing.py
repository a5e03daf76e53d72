"""FPDU framing: length, pad, CRC32c, markers (RFC 5044 §4-§6, MPA-10..MPA-16)."""

from __future__ import annotations

import random
import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stack.constants import (
    MPA_CRC_RESIDUE,
    MULPDU_MAX,
    MULPDU_MIN,
    TERM_LLP_CRC_ERROR,
    TERM_LLP_MARKER_MISMATCH,
)
from stack.crc import crc32c, crc_field
from stack.errors import LocalError, MpaError, ProtocolError
from stack.wire.framing import (
    FpduDeframer,
    FpduFramer,
    fpdu_wire_length,
    mulpdu_for,
    stream_offset,
)
from tests.wire.helpers_mpa import reference_fpdu, reference_marker_stream


def h(text: str) -> bytes:
    """Hex dump lines ("0000: 00 1f ...") or plain hex to bytes."""
    out = []
    for line in text.strip().splitlines():
        out.append(line.split(":", 1)[1] if ":" in line else line)
    return bytes.fromhex(" ".join(out))


# Digest §9: byte-exact FPDUs with CRC on, no markers.  ULPDU = vector[2 : 2 + len].
E_VECTORS = {
    "E1": """
        0000: 00 1f 41 43 00 00 00 00 00 00 00 00 00 00 00 01
        0010: 00 00 00 00 48 65 6c 6c 6f 2c 20 69 57 41 52 50
        0020: 21 00 00 00 13 43 08 1e""",
    "E2": """
        0000: 00 16 c1 40 00 ab cd ef 00 00 00 00 00 00 10 00
        0010: 01 02 03 04 05 06 07 08 50 c1 0c dc""",
    "E3": """
        0000: 00 2e 41 41 00 00 00 00 00 00 00 01 00 00 00 01
        0010: 00 00 00 00 11 22 33 44 00 00 00 00 00 00 20 00
        0020: 00 00 10 00 55 66 77 88 00 00 00 00 00 00 30 00
        0030: 16 66 7b d9""",
    "E4": "0000: 00 0e c1 40 00 00 00 01 00 00 00 00 00 00 00 00 eb d3 4c 5f",
    "E5": """
        0000: 00 2a 41 47 00 00 00 00 00 00 00 02 00 00 00 01
        0010: 00 00 00 00 12 03 c0 00 00 1f 41 43 00 00 00 00
        0020: 00 00 00 00 00 00 00 07 00 00 00 00 46 7c 16 52""",
    "E6": """
        0000: 00 46 41 47 00 00 00 00 00 00 00 02 00 00 00 01
        0010: 00 00 00 00 01 00 e0 00 00 2e 41 41 00 00 00 00
        0020: 00 00 00 01 00 00 00 01 00 00 00 00 11 22 33 44
        0030: 00 00 00 00 00 00 20 00 00 00 10 00 55 66 77 88
        0040: 00 00 00 00 00 00 30 00 ef 77 f6 c0""",
    "E7": """
        0000: 00 46 41 4a 00 00 00 00 00 00 00 01 00 00 00 01
        0010: 00 00 00 00 00 00 00 00 de ad be ef 0a 0b 0c 0d
        0020: 00 00 00 00 00 00 40 00 00 00 00 00 00 00 00 01
        0030: 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00
        0040: ff ff ff ff ff ff ff ff fa df ca 51""",
    "E8": """
        0000: 00 1e 41 4b 00 00 00 00 00 00 00 03 00 00 00 01
        0010: 00 00 00 00 de ad be ef 00 00 00 00 00 00 00 29 b0 f1 11 7e""",
    "E9": """
        0000: 00 1a 41 48 00 00 00 00 00 00 00 00 00 00 00 02
        0010: 00 00 00 00 01 02 03 04 05 06 07 08 a9 8a 5e 54""",
}
E_CRCS = {
    "E1": 0x1E084313,
    "E2": 0xDC0CC150,
    "E3": 0xD97B6616,
    "E4": 0x5F4CD3EB,
    "E5": 0x52167C46,
    "E6": 0xC0F677EF,
    "E7": 0x51CADFFA,
    "E8": 0x7E11F1B0,
    "E9": 0x545E8AA9,
}
# E10, RFC 5044 Fig. 5: a marker (FPDUPTR 0) and the FPDU it precedes, CRC over both.
E10 = h("00000000 002a 4143 00000000 00000000 00000001 00000000" + "00" * 24 + "52 23 99 83")


def one(deframer: FpduDeframer) -> bytes:
    """The next ULPDU, which must be complete."""
    ulpdu = deframer.next_ulpdu()
    assert ulpdu is not None
    return bytes(ulpdu)


def ulpdu_of(vector: bytes) -> bytes:
    (length,) = struct.unpack_from(">H", vector)
    return vector[2 : 2 + length]


@pytest.mark.parametrize("name", sorted(E_VECTORS))
def test_mpa_01_mpa_12_example_fpdus_encode_byte_exact(name: str) -> None:
    vector = h(E_VECTORS[name])
    framer = FpduFramer(crc=True, markers=False)
    assert bytes(framer.frame(ulpdu_of(vector))) == vector
    assert framer.offset == len(vector)
    assert vector[-4:] == E_CRCS[name].to_bytes(4, "little")
    assert crc32c(vector) == MPA_CRC_RESIDUE


@pytest.mark.parametrize("name", sorted(E_VECTORS))
def test_mpa_10_example_fpdus_decode_back(name: str) -> None:
    vector = h(E_VECTORS[name])
    deframer = FpduDeframer(crc=True)
    deframer.feed(vector)
    ulpdu = deframer.next_ulpdu()
    assert ulpdu is not None and bytes(ulpdu) == ulpdu_of(vector)
    assert deframer.next_ulpdu() is None
    assert deframer.pending == 0
    assert (deframer.fpdu_offset, deframer.fpdu_wire_length) == (0, len(vector))


def test_mpa_07_e10_rfc5044_fig5_with_leading_marker() -> None:
    ulpdu = E10[6 : 6 + 0x2A]
    framer = FpduFramer(crc=True, markers=True)
    assert bytes(framer.frame(ulpdu)) == E10
    deframer = FpduDeframer(crc=True, markers=True)
    deframer.feed(E10)
    assert one(deframer) == ulpdu


def test_mpa_04_pad_is_zero_and_covered_by_crc() -> None:
    for n in range(0, 9):
        fpdu = FpduFramer().frame(bytes([0xAB]) * n)
        pad = -(2 + n) & 3
        assert len(fpdu) == 2 + n + pad + 4
        assert fpdu[2 + n : 2 + n + pad] == bytes(pad)
        assert fpdu[-4:] == crc_field(fpdu[:-4])


def test_mpa_04_pad_ignored_on_receive_except_for_crc() -> None:
    fpdu = bytearray(FpduFramer(crc=False).frame(b"x"))  # 1 pad byte at index 3
    fpdu[3] = 0x77
    deframer = FpduDeframer(crc=False)
    deframer.feed(fpdu)
    assert one(deframer) == b"x"
    deframer = FpduDeframer(crc=True)
    deframer.feed(fpdu[:-4] + crc_field(fpdu[:-4]))
    assert one(deframer) == b"x"


def test_mpa_05_crc_field_present_and_zero_when_off() -> None:
    fpdu = FpduFramer(crc=False).frame(b"abcd")
    assert fpdu == b"\x00\x04abcd\x00\x00\x00\x00\x00\x00"


def test_mpa_05_crc_field_not_checked_when_off() -> None:
    fpdu = bytearray(reference_fpdu(b"hello"))
    fpdu[-4:] = b"\xde\xad\xbe\xef"
    deframer = FpduDeframer(crc=False)
    deframer.feed(fpdu)
    assert one(deframer) == b"hello"


def test_mpa_12_crc_mismatch_is_terminate_2_0_2() -> None:
    fpdu = bytearray(reference_fpdu(b"hello, world"))
    fpdu[5] ^= 0x01
    deframer = FpduDeframer(crc=True)
    deframer.feed(fpdu)
    with pytest.raises(MpaError) as info:
        deframer.next_ulpdu()
    assert info.value.rule == "MPA-12"
    assert info.value.term == TERM_LLP_CRC_ERROR


def test_mpa_28_nothing_delivered_after_an_error() -> None:
    good = reference_fpdu(b"first")
    bad = bytearray(reference_fpdu(b"second"))
    bad[-1] ^= 0xFF
    deframer = FpduDeframer()
    deframer.feed(good + bad + reference_fpdu(b"third"))
    assert one(deframer) == b"first"
    with pytest.raises(MpaError) as first:
        deframer.next_ulpdu()
    deframer.feed(reference_fpdu(b"fourth"))
    with pytest.raises(MpaError) as again:
        deframer.next_ulpdu()
    assert again.value is first.value
    assert deframer.error is first.value


def test_mpa_16_hold_until_the_fpdu_is_complete() -> None:
    fpdu = reference_fpdu(b"z" * 100)
    deframer = FpduDeframer()
    for i, byte in enumerate(fpdu[:-1]):
        deframer.feed(bytes([byte]))
        assert deframer.next_ulpdu() is None
        assert deframer.pending == i + 1
    deframer.feed(fpdu[-1:])
    assert one(deframer) == b"z" * 100


def test_mpa_16_oversized_ulpdu_length_rejected_without_waiting() -> None:
    deframer = FpduDeframer(max_ulpdu=1000)
    deframer.feed(b"\x03\xe9")  # 1001
    with pytest.raises(MpaError) as info:
        deframer.next_ulpdu()
    assert info.value.term == TERM_LLP_CRC_ERROR


def test_mpa_16_default_limit_is_mulpdu_max_plus_slack() -> None:
    deframer = FpduDeframer()
    deframer.feed(b"\xff\xff")
    with pytest.raises(MpaError):
        deframer.next_ulpdu()
    deframer = FpduDeframer()
    deframer.feed(struct.pack(">H", MULPDU_MAX))
    assert deframer.next_ulpdu() is None  # plausible: waits for the rest


def test_mpa_15_several_fpdus_per_chunk_and_any_split() -> None:
    ulpdus = [bytes([i]) * (i * 37 % 300) for i in range(40)]
    stream = b"".join(reference_fpdu(u) for u in ulpdus)
    rng = random.Random(15)
    for _ in range(20):
        deframer = FpduDeframer()
        got = []
        pos = 0
        while pos < len(stream):
            step = rng.choice([1, 3, 7, 64, 500, 4096])
            deframer.feed(stream[pos : pos + step])
            pos += step
            got += [bytes(u) for u in deframer]
        assert got == ulpdus


def test_mpa_15_mutable_input_is_copied() -> None:
    chunk = bytearray(reference_fpdu(b"keep me"))
    deframer = FpduDeframer()
    deframer.feed(chunk)
    chunk[:] = bytes(len(chunk))
    assert one(deframer) == b"keep me"


def test_mpa_10_ulpdu_is_a_zero_copy_view_of_bytes_input() -> None:
    stream = reference_fpdu(b"A" * 64) + reference_fpdu(b"B" * 64)
    deframer = FpduDeframer()
    deframer.feed(stream)
    first = deframer.next_ulpdu()
    assert isinstance(first, memoryview)
    assert first.obj is stream and first.readonly


def test_mpa_02_framer_refuses_ulpdu_over_limit() -> None:
    framer = FpduFramer()
    framer.frame(bytes(MULPDU_MAX))
    with pytest.raises(LocalError):
        framer.frame(bytes(MULPDU_MAX + 1))
    with pytest.raises(LocalError):
        framer.frame_into(bytearray(), bytes(MULPDU_MAX + 1))
    with pytest.raises(LocalError):
        FpduFramer(max_ulpdu=200).frame(bytes(201))


def test_framer_frame_into_matches_frame() -> None:
    for markers in (False, True):
        for crc_on in (False, True):
            a = FpduFramer(crc=crc_on, markers=markers)
            b = FpduFramer(crc=crc_on, markers=markers)
            out = bytearray()
            expected = b""
            for n in (0, 1, 13, 508, 1000, 3000):
                data = bytes(range(256)) * (n // 256) + bytes(n % 256)
                size = a.frame_into(out, data)
                fpdu = bytes(b.frame(data))
                assert size == len(fpdu)
                expected += fpdu
            assert bytes(out) == expected and a.offset == b.offset == len(expected)


def test_framer_accepts_any_buffer_type() -> None:
    data = bytes(range(200)) * 10
    for markers in (False, True):
        ref = bytes(FpduFramer(markers=markers).frame(data))
        assert bytes(FpduFramer(markers=markers).frame(bytearray(data))) == ref
        assert bytes(FpduFramer(markers=markers).frame(memoryview(data))) == ref


def test_framer_and_deframer_refuse_unaligned_offsets() -> None:
    with pytest.raises(LocalError):
        FpduFramer(offset=2)
    with pytest.raises(LocalError):
        FpduDeframer(offset=-4)


# -- markers ------------------------------------------------------------------------------

WORKED_A = (
    b"\x41\x43" + bytes(8) + struct.pack(">I", 1) + bytes(4) + bytes(i & 0xFF for i in range(488))
)
WORKED_B = b"\x41\x43" + bytes(8) + struct.pack(">I", 2) + bytes(4) + b"tail"


def test_mpa_07_worked_example_seqstart_11_byte_exact() -> None:
    """Digest §2.5: SeqStart 11, FPDU A (488-byte Send) and FPDU B; markers at 11, 523."""
    seq_start = 11
    framer = FpduFramer(crc=True, markers=True, offset=stream_offset(seq_start, seq_start))
    stream = bytes(framer.frame(WORKED_A)) + bytes(framer.frame(WORKED_B))
    assert len(WORKED_A) == 0x1FA
    assert stream[0:4] == bytes(4)  # marker @ seq 11, FPDUPTR 0
    assert stream[4:8] == bytes.fromhex("01fa4143")
    assert stream[508:512] == bytes.fromhex("e4e5e6e7")
    assert stream[512:516] == bytes.fromhex("000001fc")  # marker @ seq 523, FPDUPTR 508
    assert stream[516:520] == bytes.fromhex("68a8c2e0")  # CRC(A) = 0xE0C2A868
    assert crc32c(stream[0:516]) == 0xE0C2A868
    assert stream[520:524] == bytes.fromhex("00164143")
    assert stream[-4:] == (0x1E4729C4).to_bytes(4, "little")
    assert stream == reference_marker_stream([WORKED_A, WORKED_B])
    marker_seqs = [seq_start + i for i in range(0, len(stream), 512)]
    assert marker_seqs[:2] == [11, 523]
    assert all(stream_offset(s, seq_start) % 512 == 0 for s in marker_seqs)

    deframer = FpduDeframer(crc=True, markers=True)
    deframer.feed(stream)
    assert [bytes(u) for u in deframer] == [WORKED_A, WORKED_B]
    assert deframer.offset == len(stream)


def test_mpa_08_sequence_wrap() -> None:
    seq_start = 0xFFFFFF00
    assert stream_offset(0x00000100, seq_start) == 512  # second marker, after the wrap
    assert stream_offset(seq_start, seq_start) == 0
    deframer = FpduDeframer(markers=True, offset=stream_offset(0x00000004, seq_start))
    stream = reference_marker_stream([b"q" * 700], offset=260)
    deframer.feed(stream)
    assert one(deframer) == b"q" * 700


@pytest.mark.parametrize("offset", [0, 4, 8, 256, 500, 504, 508, 512, 1020])
@pytest.mark.parametrize("n", [0, 1, 2, 3, 4, 498, 502, 503, 504, 505, 506, 1010, 1014, 4000])
def test_mpa_07_markers_every_512_from_seqstart(offset: int, n: int) -> None:
    data = bytes((i * 7) & 0xFF for i in range(n))
    framer = FpduFramer(markers=True, offset=offset)
    fpdu = bytes(framer.frame(data))
    assert fpdu == reference_marker_stream([data], offset=offset)
    assert len(fpdu) == fpdu_wire_length(n, offset, markers=True)
    deframer = FpduDeframer(markers=True, offset=offset)
    deframer.feed(fpdu)
    assert one(deframer) == data


def test_mpa_07_marker_between_pad_and_crc() -> None:
    """Body ends exactly at a marker position: the marker sits before the CRC, covered."""
    data = bytes(505)  # length 2 + 505 + pad 1 = 508 = first marker distance at offset 0
    fpdu = bytes(FpduFramer(markers=True).frame(data))
    assert len(fpdu) == 4 + 508 + 4 + 4
    assert fpdu[512:516] == bytes.fromhex("000001fc")
    assert fpdu[-4:] == crc_field(fpdu[:-4])


def test_mpa_06_marker_low_bits_zero_on_send_and_ignored_on_receive() -> None:
    stream = bytearray(reference_marker_stream([bytes(1500)], crc=False))
    pointers = [struct.unpack_from(">HH", stream, at) for at in range(0, len(stream) - 4, 512)]
    assert all(reserved == 0 and ptr & 3 == 0 for reserved, ptr in pointers)
    stream[512 + 3] |= 0x03  # low FPDUPTR bits set by a sloppy peer
    deframer = FpduDeframer(crc=False, markers=True)
    deframer.feed(stream)
    assert one(deframer) == bytes(1500)


@pytest.mark.parametrize("where", [0, 512, 1024])
def test_mpa_08_marker_mismatch_is_terminate_2_0_3(where: int) -> None:
    stream = bytearray(reference_marker_stream([bytes(1500)], crc=False))
    stream[where + 2] ^= 0x04
    deframer = FpduDeframer(crc=False, markers=True)
    deframer.feed(stream)
    with pytest.raises(MpaError) as info:
        deframer.next_ulpdu()
    assert info.value.rule == "MPA-08"
    assert info.value.term == TERM_LLP_MARKER_MISMATCH


def test_mpa_08_bad_marker_with_crc_on_reports_crc_first() -> None:
    stream = bytearray(reference_marker_stream([bytes(1500)]))
    stream[512 + 2] ^= 0x04
    deframer = FpduDeframer(markers=True)
    deframer.feed(stream)
    with pytest.raises(MpaError) as info:
        deframer.next_ulpdu()
    assert info.value.term == TERM_LLP_CRC_ERROR


def test_mpa_08_bad_marker_with_valid_crc_is_marker_mismatch() -> None:
    stream = bytearray(reference_marker_stream([bytes(1500)], crc=False))
    stream[1024 + 2] ^= 0x08
    stream[-4:] = crc_field(stream[:-4])
    deframer = FpduDeframer(markers=True)
    deframer.feed(stream)
    with pytest.raises(MpaError) as info:
        deframer.next_ulpdu()
    assert info.value.term == TERM_LLP_MARKER_MISMATCH


def test_mpa_09_all_markers_in_a_long_stream_point_to_their_fpdu() -> None:
    ulpdus = [bytes([i % 251]) * ((i * 977) % 9000) for i in range(30)]
    stream = bytearray()
    framer = FpduFramer(markers=True)
    for u in ulpdus:
        framer.frame_into(stream, u)
    assert bytes(stream) == reference_marker_stream(ulpdus)
    # Where each FPDU's length field sits, found independently by the deframer.
    deframer = FpduDeframer(markers=True)
    deframer.feed(bytes(stream))
    starts = set()
    for _ in deframer:
        at = deframer.fpdu_offset
        starts.add(at + 4 if at % 512 == 0 else at)
    assert len(starts) == len(ulpdus)
    for at in range(0, len(stream), 512):
        (ptr,) = struct.unpack_from(">H", stream, at + 2)
        if ptr == 0:
            assert at + 4 in starts
        else:
            assert at - ptr in starts


# -- MULPDU -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("emss", "plain", "marked"),
    [(536, 530, 522), (1448, 1442, 1430), (1460, 1454, 1442), (8960, 8954, 8882)],
)
def test_mpa_13_mulpdu_table(emss: int, plain: int, marked: int) -> None:
    assert mulpdu_for(emss, markers=False) == plain
    assert mulpdu_for(emss, markers=True) == marked


def test_mpa_13_mulpdu_clamped() -> None:
    assert mulpdu_for(100, markers=False) == MULPDU_MIN
    assert mulpdu_for(1 << 20, markers=True) == MULPDU_MAX
    with pytest.raises(LocalError):
        mulpdu_for(0, markers=False)


@pytest.mark.parametrize("emss", [536, 1448, 1460, 1500, 4096, 8960, 9000])
def test_mpa_13_mpa_14_mulpdu_fpdus_fit_in_emss(emss: int) -> None:
    """An FPDU carrying MULPDU bytes never exceeds the EMSS, wherever it starts."""
    for markers in (False, True):
        mulpdu = mulpdu_for(emss, markers)
        for offset in range(0, 512, 4):
            assert fpdu_wire_length(mulpdu, offset, markers) <= emss + (4 if markers else 0)


# -- properties ---------------------------------------------------------------------------

ulpdu_lists = st.lists(st.binary(max_size=1400), min_size=1, max_size=6)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    ulpdus=ulpdu_lists,
    markers=st.booleans(),
    crc_on=st.booleans(),
    offset=st.integers(0, 300).map(lambda x: 4 * x),
    cuts=st.lists(st.integers(1, 2000), max_size=30),
)
def test_mpa_15_arbitrary_chunking_never_changes_ulpdus(
    ulpdus: list[bytes], markers: bool, crc_on: bool, offset: int, cuts: list[int]
) -> None:
    framer = FpduFramer(crc=crc_on, markers=markers, offset=offset)
    stream = b"".join(bytes(framer.frame(u)) for u in ulpdus)
    if markers:
        expected = reference_marker_stream(ulpdus, offset=offset, crc=crc_on)
        assert stream == expected
    deframer = FpduDeframer(crc=crc_on, markers=markers, offset=offset)
    got: list[bytes] = []
    pos = 0
    for cut in [*cuts, len(stream)]:
        deframer.feed(memoryview(stream)[pos : pos + cut])
        pos += cut
        got += [bytes(u) for u in deframer]
    assert got == ulpdus
    assert deframer.pending == 0 and deframer.offset == offset + len(stream)


@settings(max_examples=300, deadline=None)
@given(data=st.binary(max_size=3000), markers=st.booleans(), crc_on=st.booleans())
def test_mpa_16_random_bytes_raise_only_protocol_errors(
    data: bytes, markers: bool, crc_on: bool
) -> None:
    deframer = FpduDeframer(crc=crc_on, markers=markers)
    deframer.feed(data)
    try:
        for _ in deframer:
            pass
    except ProtocolError:
        pass


@settings(max_examples=200, deadline=None)
@given(
    ulpdus=ulpdu_lists,
    markers=st.booleans(),
    flips=st.lists(st.tuples(st.integers(0, 10**6), st.integers(1, 255)), min_size=1, max_size=4),
)
def test_mpa_12_mutated_streams_are_detected_or_harmless(
    ulpdus: list[bytes], markers: bool, flips: list[tuple[int, int]]
) -> None:
    """Corrupting a CRC-protected stream raises MpaError; it never yields wrong ULPDUs."""
    framer = FpduFramer(crc=True, markers=markers)
    stream = bytearray(b"".join(bytes(framer.frame(u)) for u in ulpdus))
    for where, xor in flips:
        stream[where % len(stream)] ^= xor
    deframer = FpduDeframer(crc=True, markers=markers)
    deframer.feed(stream)
    got = []
    try:
        got = [bytes(u) for u in deframer]
    except ProtocolError as exc:
        assert exc.term in (TERM_LLP_CRC_ERROR, TERM_LLP_MARKER_MISMATCH)
    assert got == ulpdus[: len(got)]


# -- marker fast paths: staged send, word-array receive ----------------------------------


def test_mpa_07_one_framer_many_sizes_and_offsets_matches_reference() -> None:
    """One framer (staging buffer and cached join pieces reused) over FPDUs of marker
    counts 0..128 at drifting offsets, byte-exact against the byte-by-byte reference."""
    rng = random.Random(7)
    sizes = [0, 1, 502, 503, 506, 507, 1014, MULPDU_MAX - 1, MULPDU_MAX]
    sizes += [rng.randrange(0, MULPDU_MAX) for _ in range(12)]
    ulpdus = [rng.randbytes(n) for n in sizes]
    for offset in (0, 4, 508):
        framer = FpduFramer(markers=True, offset=offset)
        stream = b"".join(bytes(framer.frame(u)) for u in ulpdus)
        assert stream == reference_marker_stream(ulpdus, offset=offset)
        deframer = FpduDeframer(markers=True, offset=offset)
        deframer.feed(stream)
        assert [bytes(u) for u in deframer] == ulpdus


def test_mpa_02_framer_stage_follows_a_raised_max_ulpdu() -> None:
    framer = FpduFramer(markers=True, max_ulpdu=600)
    small = bytes(range(200)) * 3
    first = bytes(framer.frame(small))
    framer.max_ulpdu = 5000
    big = bytes(range(250)) * 20
    second = bytes(framer.frame(big))
    assert first + second == reference_marker_stream([small, big])


def test_mpa_07_framed_fpdus_are_independent_resizable_buffers() -> None:
    framer = FpduFramer(markers=True)
    a = framer.frame(b"a" * 3000)
    b = framer.frame(b"b" * 3000)
    assert isinstance(a, bytearray) and isinstance(b, bytearray)
    assert bytes(a) + bytes(b) == reference_marker_stream([b"a" * 3000, b"b" * 3000])
    a[:] = bytes(len(a))  # no view of the framer's staging buffer
    a += b"more"  # no buffer export left on the result
    assert bytes(b) == reference_marker_stream([b"a" * 3000, b"b" * 3000])[len(b) :]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    sizes=st.lists(st.integers(0, 6000), min_size=1, max_size=5),
    crc_on=st.booleans(),
    offset=st.integers(0, 127).map(lambda x: 4 * x),
    cuts=st.lists(st.integers(1, 9), min_size=1, max_size=40),
    seed=st.integers(0, 2**32 - 1),
)
def test_mpa_10_marker_fast_paths_match_reference_under_small_chunks(
    sizes: list[int], crc_on: bool, offset: int, cuts: list[int], seed: int
) -> None:
    """Differential: framer output equals the reference builder; the deframer recovers the
    ULPDUs when FPDUs straddle many chunks of 1..9 bytes (the word array takes whole words,
    carrying partial ones across chunks) and when they arrive whole."""
    rng = random.Random(seed)
    ulpdus = [rng.randbytes(n) for n in sizes]
    framer = FpduFramer(crc=crc_on, markers=True, offset=offset)
    stream = b"".join(bytes(framer.frame(u)) for u in ulpdus)
    assert stream == reference_marker_stream(ulpdus, offset=offset, crc=crc_on)
    deframer = FpduDeframer(crc=crc_on, markers=True, offset=offset)
    got: list[memoryview] = []
    pos = 0
    step = 0
    while pos < len(stream):
        cut = cuts[step % len(cuts)] if step < 4 * len(cuts) else len(stream)
        deframer.feed(stream[pos : pos + cut])
        pos += cut
        step += 1
        got += list(deframer)
    assert [bytes(u) for u in got] == ulpdus  # earlier views stay valid
    assert deframer.pending == 0 and deframer.offset == offset + len(stream)
    whole = FpduDeframer(crc=crc_on, markers=True, offset=offset)
    whole.feed(stream)
    assert [bytes(u) for u in whole] == ulpdus


def test_mpa_06_marker_reserved_bits_ignored_on_receive() -> None:
    stream = bytearray(reference_marker_stream([bytes(1500)], offset=8))
    stream[504] = 0x80  # RESERVED of the first inner marker (at 512 - 8)
    stream[-4:] = crc_field(stream[:-4])
    deframer = FpduDeframer(markers=True, offset=8)
    deframer.feed(bytes(stream))
    assert one(deframer) == bytes(1500)


@pytest.mark.parametrize("split", [0, 700])
def test_mpa_12_crc_error_reports_received_and_computed(split: int) -> None:
    stream = bytearray(reference_marker_stream([bytes(range(256)) * 4]))
    stream[600] ^= 0x10
    received = stream[-4:].hex()
    deframer = FpduDeframer(markers=True)
    if split:
        deframer.feed(bytes(stream[:split]))
        assert deframer.next_ulpdu() is None
    deframer.feed(bytes(stream[split:]))
    with pytest.raises(MpaError) as info:
        deframer.next_ulpdu()
    assert info.value.rule == "MPA-12" and info.value.term == TERM_LLP_CRC_ERROR
    field = int.from_bytes(bytes.fromhex(received), "little")
    assert f"received 0x{field:08X}" in str(info.value)
    assert f"computed 0x{crc32c(stream[:-4]):08X}" in str(info.value)


def test_mpa_08_straddling_fpdu_with_bad_marker_is_marker_mismatch() -> None:
    stream = bytearray(reference_marker_stream([bytes(3000)], offset=256, crc=False))
    stream[256 + 512 + 2] ^= 0x04  # second inner marker
    deframer = FpduDeframer(crc=False, markers=True, offset=256)
    deframer.feed(bytes(stream[:1000]))
    deframer.feed(bytes(stream[1000:]))
    with pytest.raises(MpaError) as info:
        deframer.next_ulpdu()
    assert info.value.rule == "MPA-08" and info.value.term == TERM_LLP_MARKER_MISMATCH
    assert "expected 0x0300" in str(info.value)


@settings(max_examples=150, deadline=None)
@given(
    st.binary(min_size=0, max_size=30),
    st.binary(min_size=0, max_size=3000),
    st.booleans(),
    st.booleans(),
    st.integers(0, 2047),
)
def test_mpa_12_frame_parts_equals_framing_the_joined_ulpdu(header, payload, crc, markers, off):
    """frame_parts_into (chained CRC, no join) gives the same bytes as framing the ULPDU."""
    off &= ~3
    a = FpduFramer(crc=crc, markers=markers, offset=off)
    b = FpduFramer(crc=crc, markers=markers, offset=off)
    out_a, out_b = bytearray(), bytearray()
    for _ in range(2):
        a.frame_parts_into(out_a, header, memoryview(payload))
        b.frame_into(out_b, header + payload)
    assert out_a == out_b and a.offset == b.offset


@settings(max_examples=150, deadline=None)
@given(
    st.lists(st.tuples(st.binary(max_size=30), st.binary(max_size=3000)), max_size=4),
    st.booleans(),
    st.booleans(),
    st.integers(0, 2047),
    st.integers(0, 3001),
)
def test_mpa_01_frame_parts_iov_joins_to_the_framed_fpdus(
    ulpdus: list[tuple[bytes, bytes]], crc: bool, markers: bool, off: int, min_ref: int
) -> None:
    """frame_parts_iov (scatter-gather: payloads of min_ref bytes or more by reference
    between the framing bytes) joins to the bytes frame_into gives for the joined ULPDUs,
    and advances the offset alike."""
    off &= ~3
    a = FpduFramer(crc=crc, markers=markers, offset=off)
    b = FpduFramer(crc=crc, markers=markers, offset=off)
    parts = [(header, memoryview(payload)) for header, payload in ulpdus]
    iov: list[bytes | bytearray | memoryview] = []
    start = bytearray(b"queued")
    out, error = a.frame_parts_iov(parts, start, iov, min_ref)
    assert error is None
    expected = bytearray(b"queued")
    for header, payload in ulpdus:
        b.frame_into(expected, header + payload)
    assert b"".join([*iov, out]) == expected and a.offset == b.offset
    if not markers:  # a large payload is the caller's own view, not a copy
        referenced = [view for _, view in parts if len(view) >= min_ref]
        assert [p for p in iov if isinstance(p, memoryview)] == referenced
        assert all(any(p is view for p in iov) for view in referenced)
    if not iov:
        assert out is start  # nothing referenced: everything was appended to ``out``


@pytest.mark.parametrize("markers", [False, True])
def test_mpa_02_frame_parts_iov_stops_at_a_ulpdu_above_the_maximum(markers: bool) -> None:
    """The FPDUs before the oversized ULPDU are framed whole; the error is returned and
    nothing of that ULPDU or after it is framed."""
    a, b = FpduFramer(markers=markers), FpduFramer(markers=markers)
    good = (b"h" * 14, memoryview(bytes(3000)))
    parts = [good, (b"", memoryview(bytes(MULPDU_MAX + 1))), good]
    iov: list[bytes | bytearray | memoryview] = []
    out, error = a.frame_parts_iov(parts, bytearray(), iov)
    assert isinstance(error, LocalError) and "MPA-02" in str(error)
    expected = bytearray()
    b.frame_parts_into(expected, *good)
    assert b"".join([*iov, out]) == expected and a.offset == b.offset
    with pytest.raises(LocalError, match="MPA-02"):
        FpduFramer().frame_parts_into(bytearray(), b"", bytes(MULPDU_MAX + 1))


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.tuples(st.binary(max_size=20), st.integers(0, 9000)), min_size=1, max_size=8),
    st.booleans(),
)
def test_mpa_01_data_to_send_iov_joins_to_data_to_send(parts, markers):
    """The scatter-gather output of an MpaConnection (large payloads by reference, small
    ones copied) is byte for byte what data_to_send gives, and the peer delivers the
    ULPDUs sent."""
    from stack.wire.events import MpaSettings, UlpduReceived
    from tests.wire.helpers_mpa import ConnectionPair, drain

    settings = MpaSettings(want_markers=markers)
    pairs = [ConnectionPair(settings, settings) for _ in range(2)]
    for pair in pairs:
        pair.handshake()
    ulpdus = [(h, bytes(random.Random(n).randbytes(n))) for h, n in parts]
    for pair in pairs:
        pair.initiator.send_ulpdu_parts((h, memoryview(p)) for h, p in ulpdus)
    iov = pairs[0].initiator.data_to_send_iov()
    pieces = b"".join(iov)
    assert pieces == pairs[1].initiator.data_to_send()
    assert pairs[0].initiator.data_to_send_iov() == []
    pairs[0].responder.receive_data(pieces)
    got = [bytes(e.ulpdu) for e in drain(pairs[0].responder) if isinstance(e, UlpduReceived)]
    assert got == [h + p for h, p in ulpdus]


@settings(max_examples=60, deadline=None)
@given(
    sizes=st.lists(st.integers(0, 3000), min_size=1, max_size=12),
    markers=st.booleans(),
    cuts=st.lists(st.integers(1, 700), min_size=1, max_size=40),
)
def test_mpa_16_borrowed_input_is_parsed_in_place_and_the_rest_kept(
    sizes: list[int], markers: bool, cuts: list[int]
) -> None:
    """Fed as views of one reused buffer (``borrow``), the deframer hands out the same
    ULPDUs as fed ``bytes``; after settle() nothing it keeps views that buffer (a partial
    FPDU at the end is its own copy), so scribbling over the buffer changes nothing."""
    framer = FpduFramer(markers=markers)
    ulpdus = [bytes([k % 251]) * size for k, size in enumerate(sizes)]
    wire = b"".join(bytes(framer.frame(u)) for u in ulpdus)
    deframer = FpduDeframer(markers=markers)
    rx = bytearray(max(cuts))
    got: list[bytes] = []
    at = k = 0
    while at < len(wire):
        chunk = wire[at : at + cuts[k % len(cuts)]]
        at += len(chunk)
        k += 1
        rx[: len(chunk)] = chunk
        deframer.feed(memoryview(rx)[: len(chunk)], borrow=True)
        got.extend(bytes(u) for u in deframer)  # taken (copied) before the buffer changes
        deframer.settle()
        rx[:] = b"\xa5" * len(rx)
    assert got == ulpdus
    assert not deframer.pending and deframer.offset == len(wire)
