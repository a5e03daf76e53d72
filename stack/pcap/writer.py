"""pcap writer for the capture tap: synthesizes Ethernet/IP/TCP around recorded byte streams.

Theory of operation: the stack runs over real TCP sockets, which hide segment boundaries,
sequence numbers and handshakes.  To let Wireshark, tshark and ``iwarp dissect`` read what
the stack sent and received, each connection's two byte streams are re-wrapped in
synthetic packets: a three-way handshake when the connection is opened, one or more data
segments (cut at the MSS) per :meth:`ConnectionRecorder.record` call, and FIN/ACK
exchanges on :meth:`ConnectionRecorder.close`.  The TCP sequence number of every data
byte is its true offset in its direction's stream (plus the ISN + 1), so markers,
FPDUPTRs and the decoder's reassembly see exactly the stream the peers exchanged.

Addresses are IPv4 or IPv6 strings; the ``src`` endpoint of :meth:`PcapWriter.connection`
is the side that sent the SYN.  Checksums (IPv4 header and TCP) are computed, so the
packets are valid on any reader.  For tests and fuzzing, :meth:`ConnectionRecorder.segment`
writes one hand-made segment at any sequence offset (retransmissions, overlaps, holes).

:meth:`PcapWriter.write_frame` copies captured frames as they are (a live capture's ``-w``).

Not thread-safe: one writer per trio task tree (trio is single-threaded).
"""

from __future__ import annotations

import ipaddress
import os
import struct
from enum import Enum
from typing import BinaryIO

from stack.errors import LocalError
from stack.pcap.format import (
    ETHERTYPE_IPV4,
    ETHERTYPE_IPV6,
    IPPROTO_TCP,
    IPV4_DONT_FRAGMENT,
    IPV4_NO_OPTIONS,
    LINKTYPE_ETHERNET,
    MAXIMUM_SNAPLEN,
    PCAP_MAGIC_US,
    PCAP_VERSION,
    TCP_ACK,
    TCP_FIN,
    TCP_PSH,
    TCP_RST,
    TCP_SYN,
)
from stack.pcap.packet import Frame

DEFAULT_SNAPLEN = MAXIMUM_SNAPLEN
DEFAULT_MSS = 1460
MAX_MSS = 65495  # largest TCP payload an IPv4 packet can carry with a 20-byte header

_ETH_IPV4 = ETHERTYPE_IPV4.to_bytes(2, "big")
_ETH_IPV6 = ETHERTYPE_IPV6.to_bytes(2, "big")
_REC_HDR = struct.Struct("<IIII")
_IPV4_HDR = struct.Struct(">BBHHHBBH4s4s")
_IPV6_HDR = struct.Struct(">IHBB16s16s")
_TCP_HDR = struct.Struct(">HHIIBBHHH")


class Direction(Enum):
    """Which way a recorded chunk travelled: from the ``src`` endpoint or towards it."""

    SENT = "sent"  # src -> dst
    RECEIVED = "received"  # dst -> src


def internet_checksum(data: bytes | bytearray) -> int:
    """RFC 1071 ones' complement sum of ``data`` (padded to even length), complemented."""
    if len(data) & 1:
        data = bytes(data) + b"\x00"
    # 2**16 == 1 (mod 0xFFFF): the ones' complement sum is the number modulo 0xFFFF.
    total = int.from_bytes(data, "big") % 0xFFFF
    if total == 0 and any(data):
        total = 0xFFFF
    return (~total) & 0xFFFF


def _mac(host: bytes) -> bytes:
    """A stable locally administered MAC address derived from an IP address."""
    return b"\x02" + (host[-4:] if len(host) >= 4 else host.rjust(4, b"\0")) + b"\x01"


class _Half:
    """One direction of a recorded connection: its endpoints and next sequence number."""

    __slots__ = ("src", "dst", "sport", "dport", "isn", "offset", "fin_sent", "mac_src", "mac_dst")

    def __init__(self, src: bytes, dst: bytes, sport: int, dport: int, isn: int) -> None:
        self.src = src
        self.dst = dst
        self.sport = sport
        self.dport = dport
        self.isn = isn
        self.offset = 0  # bytes of data recorded so far (the next byte's stream offset)
        self.fin_sent = False
        self.mac_src = _mac(src)
        self.mac_dst = _mac(dst)

    def seq_at(self, offset: int) -> int:
        return (self.isn + 1 + offset) & 0xFFFFFFFF


class ConnectionRecorder:
    """Records the two byte streams of one TCP connection into a :class:`PcapWriter`.

    Create with :meth:`PcapWriter.connection`.  ``record(direction, data, timestamp)``
    appends stream bytes (cut into MSS-sized segments); ``close(timestamp)`` writes the
    FIN exchange; ``reset(direction, timestamp)`` an RST.
    """

    def __init__(
        self,
        writer: PcapWriter,
        src: tuple[str, int],
        dst: tuple[str, int],
        *,
        mss: int,
        isn: tuple[int, int],
        timestamp: float,
        handshake: bool,
    ) -> None:
        if not 1 <= mss <= MAX_MSS:
            raise LocalError(f"MSS {mss} out of range 1..{MAX_MSS}")
        src_ip = _ip_bytes(src[0])
        dst_ip = _ip_bytes(dst[0])
        if len(src_ip) != len(dst_ip):
            raise LocalError("src and dst must both be IPv4 or both IPv6")
        for port in (src[1], dst[1]):
            if not 0 <= port <= 0xFFFF:
                raise LocalError(f"port {port} out of range")
        self._writer = writer
        self.mss = mss
        self._halves = {
            Direction.SENT: _Half(src_ip, dst_ip, src[1], dst[1], isn[0] & 0xFFFFFFFF),
            Direction.RECEIVED: _Half(dst_ip, src_ip, dst[1], src[1], isn[1] & 0xFFFFFFFF),
        }
        self.closed = False
        if handshake:
            fwd = self._halves[Direction.SENT]
            rev = self._halves[Direction.RECEIVED]
            self._emit(fwd, fwd.isn, 0, TCP_SYN, b"", timestamp)
            self._emit(rev, rev.isn, fwd.seq_at(0), TCP_SYN | TCP_ACK, b"", timestamp)
            self._emit(fwd, fwd.seq_at(0), rev.seq_at(0), TCP_ACK, b"", timestamp)

    def offset(self, direction: Direction) -> int:
        """Stream offset of the next byte recorded in ``direction``."""
        return self._halves[direction].offset

    def record(
        self, direction: Direction, data: bytes | bytearray | memoryview, timestamp: float
    ) -> None:
        """Append ``data`` to the ``direction`` stream as segments of at most ``mss`` bytes."""
        half = self._halves[direction]
        if self.closed or half.fin_sent:
            raise LocalError(f"{direction.value} half of the recorded connection is closed")
        view = memoryview(data).cast("B")
        for start in range(0, len(view), self.mss):
            chunk = view[start : start + self.mss]
            last = start + self.mss >= len(view)
            self._data(half, half.offset, chunk, timestamp, push=last)
            half.offset += len(chunk)

    def segment(
        self,
        direction: Direction,
        data: bytes | bytearray | memoryview,
        timestamp: float,
        *,
        offset: int | None = None,
        flags: int = TCP_ACK | TCP_PSH,
        advance: bool | None = None,
    ) -> None:
        """Write one hand-made segment holding ``data`` at stream ``offset`` (no MSS cut).

        ``offset`` defaults to the current end of the stream.  ``advance`` (default: only
        when the segment extends the stream) moves the stream end past the segment, so a
        hole can be left by writing at a later offset and never filling it.
        """
        half = self._halves[direction]
        at = half.offset if offset is None else offset
        if at < 0:
            raise LocalError("segment offset must be >= 0")
        self._emit(half, half.seq_at(at), self._ack_for(direction), flags, bytes(data), timestamp)
        end = at + len(data)
        if advance is None:
            advance = end > half.offset
        if advance:
            half.offset = max(half.offset, end)

    def close(self, timestamp: float, direction: Direction = Direction.SENT) -> None:
        """Graceful close: FIN from ``direction``'s sender, then FIN from the other side."""
        if self.closed:
            return
        first = self._halves[direction]
        other_dir = Direction.RECEIVED if direction is Direction.SENT else Direction.SENT
        for dir_, half in ((direction, first), (other_dir, self._halves[other_dir])):
            if not half.fin_sent:
                self._emit(
                    half,
                    half.seq_at(half.offset),
                    self._ack_for(dir_),
                    TCP_FIN | TCP_ACK,
                    b"",
                    timestamp,
                )
                half.fin_sent = True
        # the final ACK of the first FIN sender
        self._emit(
            first, first.seq_at(first.offset + 1), self._ack_for(direction), TCP_ACK, b"", timestamp
        )
        self.closed = True

    def reset(self, timestamp: float, direction: Direction = Direction.SENT) -> None:
        """Abortive close: an RST from ``direction``'s sender."""
        if self.closed:
            return
        half = self._halves[direction]
        seq = half.seq_at(half.offset)
        self._emit(half, seq, self._ack_for(direction), TCP_RST | TCP_ACK, b"", timestamp)
        self.closed = True

    def _ack_for(self, direction: Direction) -> int:
        other = self._halves[Direction.RECEIVED if direction is Direction.SENT else Direction.SENT]
        return other.seq_at(other.offset + (1 if other.fin_sent else 0))

    def _data(self, half: _Half, offset: int, chunk: memoryview, ts: float, push: bool) -> None:
        direction = Direction.SENT if half is self._halves[Direction.SENT] else Direction.RECEIVED
        flags = TCP_ACK | (TCP_PSH if push else 0)
        self._emit(half, half.seq_at(offset), self._ack_for(direction), flags, chunk, ts)

    def _emit(
        self, half: _Half, seq: int, ack: int, flags: int, payload: bytes | memoryview, ts: float
    ) -> None:
        self._writer._write_packet(half, seq, ack, flags, payload, ts)


def _ip_bytes(text: str) -> bytes:
    try:
        return ipaddress.ip_address(text).packed
    except ValueError:
        raise LocalError(f"not an IP address: {text!r}") from None


class PcapWriter:
    """Writes a classic pcap file (microsecond timestamps, Ethernet link type by default).

    ``PcapWriter(path_or_binary_file)``; ``connection(src, dst, ...)`` starts recording a
    connection (Ethernet only); ``write_frame(frame)`` copies a captured frame of the
    writer's ``linktype``; ``close()`` flushes and closes the file (a file object passed in
    is only flushed).  Usable as a context manager.
    """

    def __init__(
        self,
        target: str | os.PathLike[str] | BinaryIO,
        *,
        snaplen: int = DEFAULT_SNAPLEN,
        flush_each: bool = False,
        linktype: int = LINKTYPE_ETHERNET,
    ) -> None:
        if isinstance(target, str | os.PathLike):
            self._file: BinaryIO = open(target, "wb")  # noqa: SIM115 - closed in close()
            self._owns = True
        else:
            self._file = target
            self._owns = False
        self.snaplen = snaplen
        self.flush_each = flush_each
        self.linktype = linktype
        self.packets = 0
        self._ip_id = 0
        self._closed = False
        self._file.write(
            struct.pack("<IHHiIII", PCAP_MAGIC_US, *PCAP_VERSION, 0, 0, snaplen, linktype)
        )

    def __enter__(self) -> PcapWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def connection(
        self,
        src: tuple[str, int],
        dst: tuple[str, int],
        *,
        timestamp: float = 0.0,
        mss: int = DEFAULT_MSS,
        isn: tuple[int, int] = (0xFFFFFFFF, 0xFFFFFFFF),
        handshake: bool = True,
    ) -> ConnectionRecorder:
        """Start recording the connection ``src`` -> ``dst`` (``src`` sent the SYN).

        ``isn`` is the initial sequence number per direction (SENT, RECEIVED); the default
        makes every data byte's sequence number equal its stream offset.  ``handshake``
        False omits SYN/SYN-ACK/ACK (a capture that starts mid-connection).
        """
        if self._closed:
            raise LocalError("pcap writer is closed")
        if self.linktype != LINKTYPE_ETHERNET:
            raise LocalError("recorded connections are written as Ethernet frames")
        return ConnectionRecorder(
            self, src, dst, mss=mss, isn=isn, timestamp=timestamp, handshake=handshake
        )

    def flush(self) -> None:
        self._file.flush()

    def close(self) -> None:
        """Flush and close (a file passed in: flush); the file is closed even when the
        flush fails (a full disk), and that OSError is raised."""
        if self._closed:
            return
        self._closed = True
        try:
            self._file.flush()
        finally:
            if self._owns:
                self._file.close()

    def _write_packet(
        self, half: _Half, seq: int, ack: int, flags: int, payload: bytes | memoryview, ts: float
    ) -> None:
        if self._closed:
            raise LocalError("pcap writer is closed")
        payload = bytes(payload)
        tcp_len = 20 + len(payload)
        ack_value = ack if flags & TCP_ACK else 0
        tcp = bytearray(
            _TCP_HDR.pack(half.sport, half.dport, seq, ack_value, 5 << 4, flags, 65535, 0, 0)
        )
        tcp += payload
        if len(half.src) == 4:
            pseudo = half.src + half.dst + struct.pack(">BBH", 0, IPPROTO_TCP, tcp_len)
        else:
            pseudo = half.src + half.dst + struct.pack(">IxxxB", tcp_len, IPPROTO_TCP)
        struct.pack_into(">H", tcp, 16, internet_checksum(pseudo + tcp))
        if len(half.src) == 4:
            self._ip_id = (self._ip_id + 1) & 0xFFFF
            ip = bytearray(
                _IPV4_HDR.pack(
                    IPV4_NO_OPTIONS,
                    0,
                    20 + tcp_len,
                    self._ip_id,
                    IPV4_DONT_FRAGMENT,
                    64,
                    IPPROTO_TCP,
                    0,
                    half.src,
                    half.dst,
                )
            )
            struct.pack_into(">H", ip, 10, internet_checksum(ip))
            ethertype = _ETH_IPV4
        else:
            ip = bytearray(_IPV6_HDR.pack(6 << 28, tcp_len, IPPROTO_TCP, 64, half.src, half.dst))
            ethertype = _ETH_IPV6
        frame = half.mac_dst + half.mac_src + ethertype + bytes(ip) + bytes(tcp)
        self._record(ts, frame, len(frame))

    def write_frame(self, frame: Frame) -> None:
        """Write a captured frame (of this writer's ``linktype``) as one record."""
        if self._closed:
            raise LocalError("pcap writer is closed")
        self._record(frame.timestamp, frame.data, max(frame.orig_len, len(frame.data)))

    def _record(self, ts: float, frame: bytes | memoryview, orig_len: int) -> None:
        """One record: header (microsecond timestamp, lengths), then at most snaplen bytes."""
        sec = int(ts)
        usec = int(round((ts - sec) * 1e6))
        if usec >= 1000000:
            sec, usec = sec + 1, usec - 1000000
        caplen = min(len(frame), self.snaplen)
        self._file.write(_REC_HDR.pack(sec, usec, caplen, orig_len))
        self._file.write(frame[:caplen])
        self.packets += 1
        if self.flush_each:
            self._file.flush()
