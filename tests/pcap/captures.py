"""Small captures for the pcap tests, written with the capture-tap writer or by hand."""

from __future__ import annotations

import io
import struct

from stack.pcap import TCP_ACK, Direction, PcapWriter


def tap_capture(mss: int = 1460, isn: tuple[int, int] = (0xFFFFFFFF, 0xFFFFFFFF)) -> bytes:
    """One connection: handshake, 768 bytes sent, 5 received, FIN exchange."""
    out = io.BytesIO()
    with PcapWriter(out) as writer:
        conn = writer.connection(("10.0.0.1", 40000), ("10.0.0.2", 4791), mss=mss, isn=isn)
        conn.record(Direction.SENT, bytes(range(256)) * 3, 1.25)
        conn.record(Direction.RECEIVED, b"reply", 1.5)
        conn.close(2.0)
    return out.getvalue()


def to_pcapng(raw: bytes, big_endian: bool = False, nanos: bool = False) -> bytes:
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


def raw_frame_capture(linktype: int, frames: list[bytes]) -> bytes:
    """A classic pcap of ``linktype`` holding ``frames`` as they are."""
    out = bytearray(struct.pack("<IHHiIII", 0xA1B2C3D4, 2, 4, 0, 0, 65535, linktype))
    for data in frames:
        out += struct.pack("<IIII", 0, 0, len(data), len(data)) + data
    return bytes(out)


def ipv4_tcp(payload: bytes, seq: int = 5) -> bytes:
    """An IPv4 packet 192.168.0.1:1000 -> 192.168.0.2:2000 carrying ``payload``."""
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
