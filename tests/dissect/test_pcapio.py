"""pcap/pcapng reader (stack.dissect.pcapio) and the capture-tap writer (stack.transport.pcap)."""

from __future__ import annotations

import io
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stack.dissect.pcapio import (
    TCP_ACK,
    TCP_FIN,
    TCP_PSH,
    TCP_SYN,
    CaptureError,
    CaptureReader,
    TruncatedCapture,
    read_tcp_segments,
)
from stack.errors import IwarpError, LocalError
from stack.transport.pcap import Direction, PcapWriter, internet_checksum


def _capture(mss: int = 1460, isn: tuple[int, int] = (0xFFFFFFFF, 0xFFFFFFFF)) -> bytes:
    out = io.BytesIO()
    with PcapWriter(out) as writer:
        conn = writer.connection(("10.0.0.1", 40000), ("10.0.0.2", 4791), mss=mss, isn=isn)
        conn.record(Direction.SENT, bytes(range(256)) * 3, 1.25)
        conn.record(Direction.RECEIVED, b"reply", 1.5)
        conn.close(2.0)
    return out.getvalue()


def test_writer_handshake_data_fin_sequence_numbers_are_stream_offsets() -> None:
    segs = read_tcp_segments(_capture(mss=500))
    flags = [s.flags for s in segs]
    assert flags[:3] == [TCP_SYN, TCP_SYN | TCP_ACK, TCP_ACK]
    data = [s for s in segs if len(s.payload)]
    assert [(s.src, s.sport, s.seq, len(s.payload)) for s in data] == [
        ("10.0.0.1", 40000, 0, 500),
        ("10.0.0.1", 40000, 500, 268),
        ("10.0.0.2", 4791, 0, 5),
    ]
    assert bytes(data[0].payload) + bytes(data[1].payload) == bytes(range(256)) * 3
    assert data[1].flags == TCP_ACK | TCP_PSH and data[0].flags == TCP_ACK
    assert data[2].ack == 768  # acknowledges everything the opener sent
    fins = [s for s in segs if s.flags & TCP_FIN]
    assert [(f.sport, f.seq) for f in fins] == [(40000, 768), (4791, 5)]
    assert segs[3].timestamp == pytest.approx(1.25)


def test_writer_isn_and_sequence_wrap() -> None:
    segs = read_tcp_segments(_capture(mss=200, isn=(0xFFFFFF00, 7)))
    data = [s for s in segs if len(s.payload) and s.sport == 40000]
    assert [s.seq for s in data] == [0xFFFFFF01, 0xFFFFFFC9, 145, 345]  # wraps after 255 bytes


def test_writer_checksums_verify() -> None:
    raw = _capture()
    frames = list(CaptureReader(raw).frames())
    for frame in frames:
        eth = bytes(frame.data)
        ip = eth[14:34]
        assert internet_checksum(ip) == 0
        tcp = eth[34:]
        pseudo = ip[12:20] + struct.pack(">BBH", 0, 6, len(tcp))
        assert internet_checksum(pseudo + tcp) == 0


def test_writer_ipv6_and_hand_made_segments() -> None:
    out = io.BytesIO()
    writer = PcapWriter(out)
    conn = writer.connection(("fd00::1", 1), ("fd00::2", 2), handshake=False)
    conn.segment(Direction.SENT, b"late", 0.0, offset=10)
    conn.segment(Direction.SENT, b"0123456789", 0.1, offset=0)
    assert conn.offset(Direction.SENT) == 14
    writer.close()
    segs = read_tcp_segments(out.getvalue())
    assert [(s.src, s.seq, bytes(s.payload)) for s in segs] == [
        ("fd00::1", 10, b"late"),
        ("fd00::1", 0, b"0123456789"),
    ]


def test_writer_rejects_bad_arguments() -> None:
    writer = PcapWriter(io.BytesIO())
    with pytest.raises(LocalError):
        writer.connection(("10.0.0.1", 1), ("fd00::2", 2))
    with pytest.raises(LocalError):
        writer.connection(("nonsense", 1), ("10.0.0.2", 2))
    conn = writer.connection(("10.0.0.1", 1), ("10.0.0.2", 2))
    conn.close(0.0)
    with pytest.raises(LocalError):
        conn.record(Direction.SENT, b"x", 0.0)


def test_truncated_file_yields_complete_frames_then_error() -> None:
    raw = _capture()
    cut = raw[:-7]
    reader = CaptureReader(cut)
    got = []
    with pytest.raises(TruncatedCapture, match="cut short in the middle of frame"):
        for seg in reader:
            got.append(seg)
    assert len(got) == len(read_tcp_segments(raw)) - 1


def test_truncated_record_header_and_file_header() -> None:
    raw = _capture()
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
    raw = bytearray(_capture())
    struct.pack_into("<I", raw, 24 + 8, 0x7FFFFFFF)
    with pytest.raises(CaptureError, match="corrupt record"):
        read_tcp_segments(bytes(raw))


def _to_pcapng(raw: bytes, big_endian: bool = False, nanos: bool = False) -> bytes:
    """Re-pack a classic pcap as pcapng (SHB, IDB, EPBs), for the reader's other path."""
    e = ">" if big_endian else "<"

    def block(kind: int, body: bytes) -> bytes:
        body += b"\x00" * (-len(body) % 4)
        total = len(body) + 12
        return struct.pack(e + "II", kind, total) + body + struct.pack(e + "I", total)

    out = bytearray()
    shb = struct.pack(e + "IHHq", 0x1A2B3C4D, 1, 0, -1)
    out += struct.pack(e + "II", 0x0A0D0D0A, len(shb) + 12) + shb
    out += struct.pack(e + "I", len(shb) + 12)
    opts = b""
    if nanos:
        opts = struct.pack(e + "HH", 9, 1) + b"\x09\x00\x00\x00" + struct.pack(e + "HH", 0, 0)
    out += block(1, struct.pack(e + "HHI", 1, 0, 65535) + opts)
    pos = 24
    while pos < len(raw):
        sec, usec, incl, orig = struct.unpack_from("<IIII", raw, pos)
        data = raw[pos + 16 : pos + 16 + incl]
        ts = (sec * 10**9 + usec * 1000) if nanos else (sec * 10**6 + usec)
        out += block(6, struct.pack(e + "IIIII", 0, ts >> 32, ts & 0xFFFFFFFF, incl, orig) + data)
        pos += 16 + incl
    return bytes(out)


@pytest.mark.parametrize("big_endian", [False, True])
@pytest.mark.parametrize("nanos", [False, True])
def test_pcapng_matches_pcap(big_endian: bool, nanos: bool) -> None:
    raw = _capture()
    ng = _to_pcapng(raw, big_endian, nanos)
    reader = CaptureReader(ng)
    assert reader.format == "pcapng"
    a = [(s.frame, s.seq, s.flags, bytes(s.payload), round(s.timestamp, 6)) for s in reader]
    b = [
        (s.frame, s.seq, s.flags, bytes(s.payload), round(s.timestamp, 6))
        for s in read_tcp_segments(raw)
    ]
    assert a == b


def test_pcapng_truncated_block() -> None:
    ng = _to_pcapng(_capture())
    with pytest.raises(TruncatedCapture):
        read_tcp_segments(ng[:-10])


def _raw_frame_capture(linktype: int, frames: list[bytes]) -> bytes:
    out = bytearray(struct.pack("<IHHiIII", 0xA1B2C3D4, 2, 4, 0, 0, 65535, linktype))
    for data in frames:
        out += struct.pack("<IIII", 0, 0, len(data), len(data)) + data
    return bytes(out)


def _ipv4_tcp(payload: bytes, seq: int = 5) -> bytes:
    tcp = struct.pack(">HHIIBBHHH", 1000, 2000, seq, 0, 5 << 4, TCP_ACK, 100, 0, 0) + payload
    ip = struct.pack(
        ">BBHHHBBH4s4s",
        0x45,
        0,
        20 + len(tcp),
        0,
        0,
        64,
        6,
        0,
        bytes([192, 168, 0, 1]),
        bytes([192, 168, 0, 2]),
    )
    return ip + tcp


def test_linktypes_raw_sll_null_vlan_and_ethernet_padding() -> None:
    ip = _ipv4_tcp(b"abc")
    vlan = b"\x02" * 12 + b"\x81\x00\x00\x05\x08\x00" + ip + b"\x00" * 10  # padded frame
    sll = b"\x00\x00\x00\x01\x00\x06" + b"\x00" * 8 + b"\x08\x00" + ip
    sll2 = b"\x08\x00" + b"\x00" * 18 + ip
    null = struct.pack("<I", 2) + ip
    for linktype, frame in [(101, ip), (1, vlan), (113, sll), (276, sll2), (0, null)]:
        segs = read_tcp_segments(_raw_frame_capture(linktype, [frame]))
        assert [(s.src, s.dst, s.sport, s.seq, bytes(s.payload)) for s in segs] == [
            ("192.168.0.1", "192.168.0.2", 1000, 5, b"abc")
        ], linktype


def test_fragments_non_tcp_and_snaplen_cut() -> None:
    ip = bytearray(_ipv4_tcp(b"abcdef"))
    frag = bytearray(ip)
    frag[6] = 0x20  # MF
    udp = bytearray(ip)
    udp[9] = 17
    reader = CaptureReader(_raw_frame_capture(101, [bytes(frag), bytes(udp), bytes(ip[:-2])]))
    segs = list(reader)
    assert reader.stats.fragments == 1 and reader.stats.non_tcp == 1
    assert len(segs) == 1 and bytes(segs[0].payload) == b"abcd" and segs[0].missing == 2


def test_unsupported_linktype() -> None:
    with pytest.raises(CaptureError, match="link-layer type 147"):
        read_tcp_segments(_raw_frame_capture(147, [b"x"]))


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=400), st.integers(min_value=0, max_value=400))
def test_garbage_never_raises_foreign_errors(noise: bytes, cut: int) -> None:
    base = bytearray(_capture(mss=64))
    pos = cut % len(base)
    base[pos : pos + len(noise)] = noise
    try:
        read_tcp_segments(bytes(base))
    except IwarpError:
        pass
