"""Just enough pcap handling to check that a capture came out whole and to filter it.

The real decoding is ``iwarp dissect``'s job; the harness only proves that a file is a
well-formed classic pcap (tcpdump's and QEMU's filter-dump format), offers the TCP payloads
per direction, so smoke tests can look for MPA frames without depending on the dissector,
and keeps the frames of chosen TCP ports (QEMU's netdev dump has no capture filter).
"""

from __future__ import annotations

import struct
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from stack.siwvm.errors import CaptureError

LINKTYPE_ETHERNET = 1
LINKTYPE_RAW = 101
LINKTYPE_LINUX_SLL = 113

_MAGICS = {
    b"\xd4\xc3\xb2\xa1": ("<", 1e-6),
    b"\xa1\xb2\xc3\xd4": (">", 1e-6),
    b"\x4d\x3c\xb2\xa1": ("<", 1e-9),
    b"\xa1\xb2\x3c\x4d": (">", 1e-9),
}
_GLOBAL_HDR = 24
_RECORD_HDR = 16


@dataclass(frozen=True, slots=True)
class PcapRecord:
    """One captured packet.  Fields: ts (seconds), orig_len, data."""

    ts: float
    orig_len: int
    data: bytes


@dataclass(frozen=True, slots=True)
class Pcap:
    """A parsed pcap file.  Fields: linktype, snaplen, records."""

    linktype: int
    snaplen: int
    records: tuple[PcapRecord, ...]


@dataclass(frozen=True, slots=True)
class TcpSegment:
    """An IPv4 TCP segment.  Fields: src, sport, dst, dport, seq, flags, payload, ts."""

    src: str
    sport: int
    dst: str
    dport: int
    seq: int
    flags: int
    payload: bytes
    ts: float


def read_pcap(path: Path | str) -> Pcap:
    """Parse a classic pcap file; CaptureError if it is not one or is cut short."""
    try:
        raw = Path(path).read_bytes()
    except OSError as exc:
        raise CaptureError(f"cannot read capture {path}: {exc}") from exc
    if len(raw) < _GLOBAL_HDR or raw[:4] not in _MAGICS:
        raise CaptureError(f"{path}: not a pcap file ({len(raw)} bytes)")
    endian, unit = _MAGICS[raw[:4]]
    _, _, _, _, snaplen, linktype = struct.unpack(endian + "HHiIII", raw[4:_GLOBAL_HDR])
    records = []
    offset = _GLOBAL_HDR
    while offset < len(raw):
        if offset + _RECORD_HDR > len(raw):
            raise CaptureError(f"{path}: record header cut short at byte {offset}")
        sec, frac, incl, orig = struct.unpack(endian + "IIII", raw[offset : offset + _RECORD_HDR])
        offset += _RECORD_HDR
        if incl > max(snaplen, 262144) or offset + incl > len(raw):
            raise CaptureError(f"{path}: record of {incl} bytes cut short at byte {offset}")
        records.append(PcapRecord(sec + frac * unit, orig, raw[offset : offset + incl]))
        offset += incl
    return Pcap(linktype, snaplen, tuple(records))


def tcp_segments(pcap: Pcap) -> list[TcpSegment]:
    """The IPv4 TCP segments of an Ethernet, raw-IP or Linux-SLL capture (others skipped)."""
    out = []
    for rec in pcap.records:
        ip = _ipv4_payload(pcap.linktype, rec.data)
        if ip is None or len(ip) < 20 or ip[0] >> 4 != 4 or ip[9] != 6:
            continue
        ihl = (ip[0] & 0x0F) * 4
        total = struct.unpack(">H", ip[2:4])[0]
        tcp = ip[ihl:total]
        if len(tcp) < 20:
            continue
        sport, dport, seq = struct.unpack(">HHI", tcp[:8])
        doff = (tcp[12] >> 4) * 4
        out.append(
            TcpSegment(
                src=".".join(map(str, ip[12:16])),
                sport=sport,
                dst=".".join(map(str, ip[16:20])),
                dport=dport,
                seq=seq,
                flags=tcp[13],
                payload=bytes(tcp[doff:]),
                ts=rec.ts,
            )
        )
    return out


def stream_bytes(
    segments: list[TcpSegment], sport: int | None = None, dport: int | None = None
) -> bytes:
    """The payload bytes of one direction, in sequence order, retransmissions dropped."""
    chosen = [
        s
        for s in segments
        if s.payload and (sport is None or s.sport == sport) and (dport is None or s.dport == dport)
    ]
    if not chosen:
        return b""
    base = chosen[0].seq
    pieces: dict[int, bytes] = {}
    for seg in chosen:
        rel = (seg.seq - base) & 0xFFFFFFFF
        if rel not in pieces or len(seg.payload) > len(pieces[rel]):
            pieces[rel] = seg.payload
    out = bytearray()
    for rel in sorted(pieces):
        data = pieces[rel]
        if rel < len(out):
            data = data[len(out) - rel :]
        elif rel > len(out):
            break  # a hole: the capture lost data; return what is contiguous
        out += data
    return bytes(out)


def _ipv4_payload(linktype: int, frame: bytes) -> bytes | None:
    if linktype == LINKTYPE_ETHERNET:
        if len(frame) >= 14 and frame[12:14] == b"\x08\x00":
            return frame[14:]
    elif linktype == LINKTYPE_RAW:
        return frame
    elif linktype == LINKTYPE_LINUX_SLL:
        if len(frame) >= 16 and frame[14:16] == b"\x08\x00":
            return frame[16:]
    return None


def _tcp_ports(linktype: int, frame: bytes) -> tuple[int, int] | None:
    """(sport, dport) of an IPv4 TCP frame, None for anything else."""
    ip = _ipv4_payload(linktype, frame)
    if ip is None or len(ip) < 20 or ip[0] >> 4 != 4 or ip[9] != 6:
        return None
    ihl = (ip[0] & 0x0F) * 4
    if len(ip) < ihl + 4:
        return None
    sport, dport = struct.unpack(">HH", ip[ihl : ihl + 4])
    return sport, dport


def filter_tcp_ports(
    src: Path | str,
    dst: Path | str,
    *,
    ports: Iterable[int] = (),
    exclude: Iterable[int] = (),
) -> int:
    """Copy the frames of pcap ``src`` to ``dst`` (same header) that are TCP with a port in
    ``ports`` (any frame when ``ports`` is empty) and no port in ``exclude``: what tcpdump's
    ``tcp port P`` filter would have kept.  Returns the number of frames kept."""
    raw = Path(src).read_bytes()
    pcap = read_pcap(src)
    wanted, unwanted = frozenset(ports), frozenset(exclude)
    out = bytearray(raw[:_GLOBAL_HDR])
    kept = 0
    offset = _GLOBAL_HDR
    for rec in pcap.records:
        incl = len(rec.data)
        header = raw[offset : offset + _RECORD_HDR]
        offset += _RECORD_HDR + incl
        tcp = _tcp_ports(pcap.linktype, rec.data)
        if tcp is not None and unwanted.intersection(tcp):
            continue
        if wanted and (tcp is None or not wanted.intersection(tcp)):
            continue
        out += header + rec.data
        kept += 1
    Path(dst).write_bytes(bytes(out))
    return kept
