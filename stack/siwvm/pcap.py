"""What the harness does with its captures, on :mod:`stack.pcap`: check, reassemble, filter.

The real decoding is ``iwarp dissect``'s job; the harness only proves that a capture came
out whole, offers the TCP payload of one direction, so smoke tests can look for MPA frames
without depending on the dissector, and keeps the frames of chosen TCP ports (QEMU's
netdev dump has no capture filter).  A capture the reader refuses raises the harness's
:class:`~stack.siwvm.errors.CaptureError`.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

import stack.pcap
from stack.pcap import Frame, TcpSegment, copy_capture, parse_tcp
from stack.siwvm.errors import CaptureError


@contextmanager
def _harness_error() -> Iterator[None]:
    try:
        yield
    except stack.pcap.CaptureError as exc:
        raise CaptureError(f"bad capture: {exc}") from None


def check_capture(path: Path | str) -> int:
    """The number of frames of a well-formed capture (read through, never held whole)."""
    with _harness_error():
        return sum(1 for _ in stack.pcap.iter_frames(path))


def read_frames(path: Path | str) -> list[Frame]:
    """Every frame of a pcap or pcapng file; CaptureError if it is none or is cut short."""
    with _harness_error():
        return list(stack.pcap.iter_frames(path))


def tcp_segments(path: Path | str) -> list[TcpSegment]:
    """The TCP segments of a capture (every link type the reader knows)."""
    with _harness_error():
        return stack.pcap.read_tcp_segments(path)


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
    pieces: dict[int, memoryview] = {}
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
    wanted, unwanted = frozenset(ports), frozenset(exclude)

    def keep(frame: Frame) -> bool:
        segment = parse_tcp(frame)
        tcp = None if segment is None else (segment.sport, segment.dport)
        if tcp is not None and unwanted.intersection(tcp):
            return False
        return not wanted or (tcp is not None and bool(wanted.intersection(tcp)))

    with _harness_error():
        return copy_capture(src, dst, keep)
