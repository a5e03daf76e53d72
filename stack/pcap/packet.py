"""Frames and the TCP segments in them: link layer, IPv4/IPv6 and TCP headers peeled.

:func:`parse_tcp` peels Ethernet (with VLAN tags), Linux cooked (SLL, SLL2), BSD
loopback/null and raw IP down to IPv4 (RFC 791) or IPv6 (RFC 8200) and TCP (RFC 9293
§3.1), without copying: a segment's payload is a ``memoryview`` of the frame.  Non-TCP
frames, IP fragments and malformed headers give None and are counted in
:class:`CaptureStats`.
"""

from __future__ import annotations

import socket
import struct
from dataclasses import dataclass, field

from stack.pcap.format import (
    ETHERNET_HEADER_LEN,
    ETHERTYPE_IPV4,
    ETHERTYPE_IPV6,
    ETHERTYPE_VLAN,
    IPPROTO_TCP,
    IPV4_FRAGMENT_MASK,
    IPV4_HEADER_LEN,
    IPV4_NO_OPTIONS,
    IPV6_AH,
    IPV6_EXT_HEADERS,
    IPV6_FRAGMENT,
    IPV6_HEADER_LEN,
    LINKTYPE_ETHERNET,
    LINKTYPE_LINUX_SLL,
    LINKTYPE_LINUX_SLL2,
    LINKTYPE_LOOP,
    LINKTYPE_NULL,
    LINKTYPES_RAW_IP,
    LINUX_SLL2_HEADER_LEN,
    LINUX_SLL_HEADER_LEN,
    NULL_AF_INET,
    NULL_AF_INET6,
    NULL_HEADER_LEN,
    TCP_HEADER_LEN,
    VLAN_TAG_LEN,
)

TCP_HDR = struct.Struct(">HHIIBB")
"""sport, dport, seq, ack, data offset byte, flags."""
ETH_IPV4_TCP = struct.Struct(">12xIHxxIxxIIHHIIBB")
"""Ethertype, IP version/IHL and TOS (one word), total length, flags/fragment, TTL and
protocol (one word), addresses, TCP header of an Ethernet frame: the reader's inline path
for the common case."""
ETH_IPV4_HEAD = (ETHERTYPE_IPV4 << 8) | IPV4_NO_OPTIONS
"""The first word of :data:`ETH_IPV4_TCP` without its TOS byte: IPv4 without options."""
IPV4_FRAGMENT_PROTO_MASK = (IPV4_FRAGMENT_MASK << 16) | 0xFF
"""The fragment bits and the protocol of the second word: equal to IPPROTO_TCP for an
unfragmented TCP packet (RFC 791 §3.1)."""
ETH_IPV4_TCP_OFFSET = ETHERNET_HEADER_LEN + IPV4_HEADER_LEN
"""Where the TCP header starts in an Ethernet/IPv4 frame without IP options."""


@dataclass(slots=True)
class Frame:
    """One captured record.

    Fields: number (1-based), timestamp (seconds), linktype, data (captured bytes),
    orig_len (length on the wire, >= len(data) when the snapshot length cut it), record
    (the record as stored in the file, header included; only when asked for, see
    :func:`stack.pcap.copy_capture`).
    """

    number: int
    timestamp: float
    linktype: int
    data: memoryview
    orig_len: int
    record: memoryview | None = None


@dataclass(slots=True)
class TcpSegment:
    """A TCP segment pulled out of a frame.

    Fields: frame (1-based number), timestamp, src, dst (address strings), sport, dport,
    seq, ack, flags (TCP_* bits), payload (captured payload bytes), missing (payload
    bytes the IP length promises but the snapshot length cut off).
    """

    frame: int
    timestamp: float
    src: str
    dst: str
    sport: int
    dport: int
    seq: int
    ack: int
    flags: int
    payload: memoryview
    missing: int = 0


SegmentKey = tuple[str, int, str, int]
"""(src, sport, dst, dport) of a segment: its connection and direction."""
LeanSegment = tuple[int, float, SegmentKey, int, int, int, memoryview, int]
"""A :class:`TcpSegment` as a plain tuple, the reader's cheaper form for the decoder's bulk
path: (frame, timestamp, key, seq, ack, flags, payload, missing).  The reader hands out
the same ``key`` object for every segment of one direction, mostly."""


def lean_segment(seg: TcpSegment, key: SegmentKey | None = None) -> LeanSegment:
    """``seg`` as a :data:`LeanSegment` (``key``: its key, when already made)."""
    if key is None:
        key = (seg.src, seg.sport, seg.dst, seg.dport)
    return (seg.frame, seg.timestamp, key, seg.seq, seg.ack, seg.flags, seg.payload, seg.missing)


def full_segment(lean: LeanSegment) -> TcpSegment:
    """The :class:`TcpSegment` of a :data:`LeanSegment`."""
    frame, ts, (src, sport, dst, dport), seq, ack, flags, payload, missing = lean
    return TcpSegment(frame, ts, src, dst, sport, dport, seq, ack, flags, payload, missing)


@dataclass(slots=True)
class CaptureStats:
    """What the reader skipped.  Fields: frames, tcp, non_tcp, fragments, malformed."""

    frames: int = 0
    tcp: int = 0
    non_tcp: int = 0
    fragments: int = 0
    malformed: int = 0
    linktypes: set[int] = field(default_factory=set)


_addr_cache: dict[bytes, str] = {}


def address(raw: memoryview | bytes) -> str:
    """The text form of a 4-byte IPv4 or 16-byte IPv6 address (cached)."""
    key = bytes(raw)
    text = _addr_cache.get(key)
    if text is None:
        family = socket.AF_INET if len(key) == 4 else socket.AF_INET6
        text = socket.inet_ntop(family, key)
        if len(_addr_cache) < 65536:
            _addr_cache[key] = text
    return text


def parse_tcp(frame: Frame, stats: CaptureStats | None = None) -> TcpSegment | None:
    """The TCP segment carried by ``frame``, or None (non-TCP, fragment, unsupported)."""
    data = frame.data
    size = len(data)
    linktype = frame.linktype
    pos = 0
    version = 0
    if linktype == LINKTYPE_ETHERNET:
        if size < ETHERNET_HEADER_LEN:
            return _skip(stats, "malformed")
        ethertype = (data[12] << 8) | data[13]
        pos = ETHERNET_HEADER_LEN
        while ethertype in ETHERTYPE_VLAN:
            if pos + VLAN_TAG_LEN > size:
                return _skip(stats, "malformed")
            ethertype = (data[pos + 2] << 8) | data[pos + 3]
            pos += VLAN_TAG_LEN
        if ethertype == ETHERTYPE_IPV4:
            version = 4
        elif ethertype == ETHERTYPE_IPV6:
            version = 6
        else:
            return _skip(stats, "non_tcp")
    elif linktype in LINKTYPES_RAW_IP:
        if size < 1:
            return _skip(stats, "malformed")
        version = data[0] >> 4
    elif linktype == LINKTYPE_LINUX_SLL:
        if size < LINUX_SLL_HEADER_LEN:
            return _skip(stats, "malformed")
        proto = (data[14] << 8) | data[15]
        version = 4 if proto == ETHERTYPE_IPV4 else 6 if proto == ETHERTYPE_IPV6 else 0
        pos = LINUX_SLL_HEADER_LEN
    elif linktype == LINKTYPE_LINUX_SLL2:
        if size < LINUX_SLL2_HEADER_LEN:
            return _skip(stats, "malformed")
        proto = (data[0] << 8) | data[1]
        version = 4 if proto == ETHERTYPE_IPV4 else 6 if proto == ETHERTYPE_IPV6 else 0
        pos = LINUX_SLL2_HEADER_LEN
    elif linktype in (LINKTYPE_NULL, LINKTYPE_LOOP):
        if size < NULL_HEADER_LEN:
            return _skip(stats, "malformed")
        family = int.from_bytes(data[:4], "big" if linktype == LINKTYPE_LOOP else "little")
        if family > 0xFFFF:  # written on a host of the other byte order
            family = int.from_bytes(data[:4], "little" if linktype == LINKTYPE_LOOP else "big")
        version = 4 if family == NULL_AF_INET else 6 if family in NULL_AF_INET6 else 0
        pos = NULL_HEADER_LEN
    if version == 4:
        return _ipv4(frame, data, pos, size, stats)
    if version == 6:
        return _ipv6(frame, data, pos, size, stats)
    return _skip(stats, "non_tcp")


def _skip(stats: CaptureStats | None, what: str) -> TcpSegment | None:
    """None, counting the reason in ``stats``."""
    if stats is not None:
        setattr(stats, what, getattr(stats, what) + 1)
    return None


def _ipv4(
    frame: Frame, data: memoryview, pos: int, size: int, stats: CaptureStats | None
) -> TcpSegment | None:
    if pos + IPV4_HEADER_LEN > size or data[pos] >> 4 != 4:
        return _skip(stats, "malformed")
    ihl = (data[pos] & 0x0F) * 4
    total = (data[pos + 2] << 8) | data[pos + 3]
    if ihl < IPV4_HEADER_LEN or total < ihl:
        return _skip(stats, "malformed")
    if data[pos + 9] != IPPROTO_TCP:
        return _skip(stats, "non_tcp")
    if ((data[pos + 6] << 8) | data[pos + 7]) & IPV4_FRAGMENT_MASK:
        return _skip(stats, "fragments")
    ip_end = pos + total
    if total == 0:  # TSO captures on the sending host may carry 0
        ip_end = pos + max(ihl, frame.orig_len - pos)
    missing = max(0, ip_end - size)
    return _tcp(
        frame,
        data,
        pos + ihl,
        min(ip_end, size),
        missing,
        address(data[pos + 12 : pos + 16]),
        address(data[pos + 16 : pos + 20]),
        stats,
    )


def _ipv6(
    frame: Frame, data: memoryview, pos: int, size: int, stats: CaptureStats | None
) -> TcpSegment | None:
    if pos + IPV6_HEADER_LEN > size or data[pos] >> 4 != 6:
        return _skip(stats, "malformed")
    payload_len = (data[pos + 4] << 8) | data[pos + 5]
    next_header = data[pos + 6]
    src = address(data[pos + 8 : pos + 24])
    dst = address(data[pos + 24 : pos + 40])
    if payload_len:
        ip_end = pos + IPV6_HEADER_LEN + payload_len
    else:  # a jumbogram, or TSO on the sending host
        ip_end = pos + max(IPV6_HEADER_LEN, frame.orig_len - pos)
    pos += IPV6_HEADER_LEN
    while next_header in IPV6_EXT_HEADERS:
        if pos + 2 > size:
            return _skip(stats, "malformed")
        length = (data[pos + 1] + 2) * 4 if next_header == IPV6_AH else (data[pos + 1] + 1) * 8
        next_header = data[pos]
        pos += length
    if next_header == IPV6_FRAGMENT:
        return _skip(stats, "fragments")
    if next_header != IPPROTO_TCP:
        return _skip(stats, "non_tcp")
    missing = max(0, ip_end - size)
    return _tcp(frame, data, pos, min(ip_end, size), missing, src, dst, stats)


def _tcp(
    frame: Frame,
    data: memoryview,
    pos: int,
    end: int,
    missing: int,
    src: str,
    dst: str,
    stats: CaptureStats | None,
) -> TcpSegment | None:
    if pos + TCP_HEADER_LEN > end:
        return _skip(stats, "malformed")
    sport, dport, seq, ack, offset_byte, flags = TCP_HDR.unpack_from(data, pos)
    header_len = (offset_byte >> 4) * 4
    if header_len < TCP_HEADER_LEN or pos + header_len > end:
        return _skip(stats, "malformed")
    if stats is not None:
        stats.tcp += 1
    return TcpSegment(
        frame.number,
        frame.timestamp,
        src,
        dst,
        sport,
        dport,
        seq,
        ack,
        flags,
        data[pos + header_len : end],
        missing,
    )
