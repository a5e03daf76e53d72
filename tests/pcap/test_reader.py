"""The pcap/pcapng reader (stack.pcap.reader): formats, link types, errors, in memory."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stack.errors import IwarpError
from stack.pcap import (
    CaptureError,
    CaptureReader,
    CaptureStats,
    TruncatedCapture,
    full_segment,
    parse_tcp,
    read_tcp_segments,
)
from tests.pcap.captures import ipv4_tcp, raw_frame_capture, tap_capture, to_pcapng


def test_truncated_file_yields_complete_frames_then_error() -> None:
    raw = tap_capture()
    cut = raw[:-7]
    reader = CaptureReader(cut)
    got = []
    with pytest.raises(TruncatedCapture, match="cut short in the middle of frame"):
        for seg in reader:
            got.append(seg)
    assert len(got) == len(read_tcp_segments(raw)) - 1


def test_truncated_record_header_and_file_header() -> None:
    raw = tap_capture()
    with pytest.raises(TruncatedCapture, match="record header"):
        read_tcp_segments(raw + b"\x00" * 5)
    with pytest.raises(CaptureError, match="header is truncated"):
        read_tcp_segments(raw[:20])


@pytest.mark.parametrize(
    "data, message",
    [
        (b"", "too short"),
        (b"hello world, not a capture", "unknown magic"),
        (b"\x1f\x8b\x08\x00rest", "gzip"),
    ],
)
def test_not_a_capture(data: bytes, message: str) -> None:
    with pytest.raises(CaptureError, match=message):
        CaptureReader(data)


def test_missing_file() -> None:
    with pytest.raises(CaptureError, match="no such file"):
        CaptureReader("/nonexistent/x.pcap")


def test_corrupt_record_length() -> None:
    raw = bytearray(tap_capture())
    struct.pack_into("<I", raw, 24 + 8, 0x7FFFFFFF)
    with pytest.raises(CaptureError, match="corrupt record"):
        read_tcp_segments(bytes(raw))


@pytest.mark.parametrize("big_endian", [False, True])
@pytest.mark.parametrize("nanos", [False, True])
def test_pcapng_matches_pcap(big_endian: bool, nanos: bool) -> None:
    raw = tap_capture()
    ng = to_pcapng(raw, big_endian, nanos)
    reader = CaptureReader(ng)
    assert reader.format == "pcapng"
    a = [(s.frame, s.seq, s.flags, bytes(s.payload), round(s.timestamp, 6)) for s in reader]
    b = [
        (s.frame, s.seq, s.flags, bytes(s.payload), round(s.timestamp, 6))
        for s in read_tcp_segments(raw)
    ]
    assert a == b


def test_pcapng_truncated_block() -> None:
    ng = to_pcapng(tap_capture())
    with pytest.raises(TruncatedCapture):
        read_tcp_segments(ng[:-10])


def test_linktypes_raw_sll_null_vlan_and_ethernet_padding() -> None:
    ip = ipv4_tcp(b"abc")
    vlan = b"\x02" * 12 + b"\x81\x00\x00\x05\x08\x00" + ip + b"\x00" * 10  # padded frame
    sll = b"\x00\x00\x00\x01\x00\x06" + b"\x00" * 8 + b"\x08\x00" + ip
    sll2 = b"\x08\x00" + b"\x00" * 18 + ip
    null = struct.pack("<I", 2) + ip
    for linktype, frame in [(101, ip), (1, vlan), (113, sll), (276, sll2), (0, null)]:
        segs = read_tcp_segments(raw_frame_capture(linktype, [frame]))
        assert [(s.src, s.dst, s.sport, s.seq, bytes(s.payload)) for s in segs] == [
            ("192.168.0.1", "192.168.0.2", 1000, 5, b"abc")
        ], linktype


def test_fragments_non_tcp_and_snaplen_cut() -> None:
    ip = bytearray(ipv4_tcp(b"abcdef"))
    frag = bytearray(ip)
    frag[6] = 0x20  # MF
    udp = bytearray(ip)
    udp[9] = 17
    reader = CaptureReader(raw_frame_capture(101, [bytes(frag), bytes(udp), bytes(ip[:-2])]))
    segs = list(reader)
    assert reader.stats.fragments == 1 and reader.stats.non_tcp == 1
    assert len(segs) == 1 and bytes(segs[0].payload) == b"abcd" and segs[0].missing == 2


def test_unsupported_linktype() -> None:
    with pytest.raises(CaptureError, match="link-layer type 147"):
        read_tcp_segments(raw_frame_capture(147, [b"x"]))


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=400), st.integers(min_value=0, max_value=400))
def test_garbage_never_raises_foreign_errors(noise: bytes, cut: int) -> None:
    base = bytearray(tap_capture(mss=64))
    pos = cut % len(base)
    base[pos : pos + len(noise)] = noise
    try:
        read_tcp_segments(bytes(base))
    except IwarpError:
        pass


def _ethernet(ip: bytes | bytearray, ethertype: bytes = b"\x08\x00") -> bytes:
    return b"\x02" * 12 + ethertype + bytes(ip)


def test_inline_ethernet_path_and_lean_segments_match_parse_tcp() -> None:
    """Every Ethernet/IPv4 case the reader's inline path tests (and the ones it leaves to
    parse_tcp): the segments, the lean segments and the counters agree with parse_tcp."""
    ip = bytearray(ipv4_tcp(b"abcdef"))
    cases: list[bytes | bytearray] = [bytes(ip), ip[:-2]]  # whole; cut by the snapshot length
    for at, value in [(1, 0xB8), (6, 0x20), (6, 0x40), (7, 0x01), (9, 17), (8, 1)]:
        case = bytearray(ip)  # TOS, MF, DF, fragment offset, UDP, TTL 1
        case[at] = value
        cases.append(case)
    short = bytearray(ip)
    struct.pack_into(">H", short, 2, 39)  # total length below 40
    options = bytearray(ip[:20]) + b"\x01\x01\x01\x00" + ip[20:]  # IHL 6: one option word
    options[0] = 0x46
    struct.pack_into(">H", options, 2, len(options))
    badtcp = bytearray(ip)
    badtcp[32] = 4 << 4  # TCP data offset 4 words
    other_port = bytearray(ip)
    other_port[21] = 7  # another source port: another key
    cases += [short, options, badtcp, other_port, bytes(ip)]
    frames = [_ethernet(c) for c in cases] + [_ethernet(ip, b"\x86\xdd")]
    data = raw_frame_capture(1, frames)
    inline = CaptureReader(data)
    got = list(inline)
    want = [s for f in CaptureReader(data).frames() if (s := parse_tcp(f)) is not None]
    assert got == want and len(got) >= 6
    lean_reader = CaptureReader(data)
    lean = list(lean_reader.lean())
    assert [full_segment(s) for s in lean] == want
    assert lean_reader.stats == inline.stats
    stats = CaptureStats(frames=len(frames), linktypes={1})
    assert [s for f in CaptureReader(data).frames() if (s := parse_tcp(f, stats))] == want
    assert inline.stats == stats and (stats.fragments, stats.non_tcp, stats.malformed) == (2, 1, 3)
    assert lean[0][2] is lean[-1][2] and lean[-2][2] != lean[-1][2]  # one key object each
