"""The capture-tap writer (stack.pcap.writer), checked through the reader."""

from __future__ import annotations

import io
import os
import struct

import pytest

from stack.errors import LocalError
from stack.pcap import (
    TCP_ACK,
    TCP_FIN,
    TCP_PSH,
    TCP_SYN,
    CaptureReader,
    Direction,
    PcapWriter,
    internet_checksum,
    read_tcp_segments,
)
from tests.pcap.captures import tap_capture


def test_writer_handshake_data_fin_sequence_numbers_are_stream_offsets() -> None:
    segs = read_tcp_segments(tap_capture(mss=500))
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
    segs = read_tcp_segments(tap_capture(mss=200, isn=(0xFFFFFF00, 7)))
    data = [s for s in segs if len(s.payload) and s.sport == 40000]
    assert [s.seq for s in data] == [0xFFFFFF01, 0xFFFFFFC9, 145, 345]  # wraps after 255 bytes


def test_writer_checksums_verify() -> None:
    raw = tap_capture()
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


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full (Linux)")
def test_close_closes_the_file_even_when_its_last_records_do_not_fit() -> None:
    """A full disk: close() raises the flush's OSError, and the file is closed all the same."""
    writer = PcapWriter("/dev/full")  # the header waits in the buffer
    file = writer._file
    with pytest.raises(OSError, match="No space left"):
        writer.close()
    assert file.closed
    writer.close()  # closed once
