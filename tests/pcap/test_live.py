"""Live capture on loopback (stack.pcap.live): real TCP through an AF_PACKET socket.

Needs CAP_NET_RAW (the suite runs as root here); skipped with the reason otherwise.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from pathlib import Path

import pytest

from stack.pcap import (
    TCP_ACK,
    TCP_FIN,
    TCP_SYN,
    CaptureError,
    LiveCapture,
    PcapWriter,
    TcpSegment,
    can_capture,
    compile_capture_filter,
    interface_name,
    interfaces,
    iter_frames,
    parse_tcp,
)
from stack.pcap.format import LINKTYPE_LINUX_SLL

pytestmark = pytest.mark.skipif(
    not can_capture(), reason="live capture needs CAP_NET_RAW (AF_PACKET sockets, Linux)"
)
MESSAGES = (b"first", b"second message", b"x" * 3000)


class _Drained(Exception):
    """Raised by on_wait: every queued packet has been read."""


def _drained() -> None:
    raise _Drained


def _listener() -> socket.socket:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    return server


def _exchange(server: socket.socket) -> None:
    """A short TCP connection: the MESSAGES one way, one reply, both sides closed."""
    client = socket.create_connection(server.getsockname())
    peer, _ = server.accept()
    for message in MESSAGES:
        client.sendall(message)
    got = b""
    while len(got) < sum(map(len, MESSAGES)):
        got += peer.recv(65536)
    peer.sendall(b"reply")
    assert client.recv(16) == b"reply"
    client.close()
    peer.close()


def _capture(capture: LiveCapture) -> list[TcpSegment]:
    time.sleep(0.3)  # the last packets (FIN, ACK) are queued by then
    out = []
    try:
        for segment in capture:
            out.append(segment)
    except _Drained:
        pass
    return out


def test_loopback_packets_are_seen_once_and_the_filter_keeps_one_port(tmp_path: Path) -> None:
    server, other = _listener(), _listener()
    port = server.getsockname()[1]
    out = tmp_path / "live.pcap"
    with server, other, PcapWriter(out, linktype=LINKTYPE_LINUX_SLL) as writer:
        keep = compile_capture_filter(f"tcp port {port}")
        with LiveCapture("lo", keep=keep, on_wait=_drained) as capture:
            capture.on_frame = writer.write_frame
            _exchange(other)  # not captured: another port
            _exchange(server)
            segments = _capture(capture)
        assert capture.stats.frames == len(segments) == writer.packets
    assert segments and all(port in (s.sport, s.dport) for s in segments)
    assert [s.frame for s in segments] == list(range(1, len(segments) + 1))
    flags = [s.flags & (TCP_SYN | TCP_ACK | TCP_FIN) for s in segments]
    # each packet once: one SYN, one SYN-ACK, one FIN per side (twice each if the
    # leaving copies of loopback were kept)
    assert flags.count(TCP_SYN) == 1 and flags.count(TCP_SYN | TCP_ACK) == 1
    assert sum(1 for f in flags if f & TCP_FIN) == 2
    to_server = [s for s in segments if s.dport == port and s.payload]
    assert b"".join(sorted((s.seq, bytes(s.payload)) for s in to_server)[i][1]
                    for i in range(len(to_server))) == b"".join(MESSAGES)  # fmt: skip
    assert all(a.timestamp <= b.timestamp for a, b in zip(segments, segments[1:], strict=False))
    assert abs(segments[0].timestamp - time.time()) < 60
    # the written file holds the same frames: they decode to the same segments
    reread = [parse_tcp(f) for f in iter_frames(out)]
    assert [(s.frame, s.seq, s.flags, bytes(s.payload)) for s in reread if s] == [
        (s.frame, s.seq, s.flags, bytes(s.payload)) for s in segments
    ]


def test_interfaces_list_loopback_and_any_and_take_numbers() -> None:
    listed = interfaces()
    names = [name for name, _ in listed]
    assert ("lo", "Loopback") in listed and names[-1] == "any"
    assert interface_name(str(names.index("lo") + 1)) == "lo"
    assert interface_name("any") == "any"
    with pytest.raises(CaptureError, match="no such interface 'nosuch0'"):
        LiveCapture("nosuch0")
    with pytest.raises(CaptureError, match="no such interface '99'"):
        interface_name("99")


def test_a_closed_capture_yields_nothing() -> None:
    capture = LiveCapture("lo")
    capture.close()
    assert list(capture) == [] and capture.dropped == 0
    capture.close()  # twice is fine


def test_a_readable_wake_fd_ends_the_wait_and_is_drained() -> None:
    """A signal that lands just before the capture's select (``signal.set_wakeup_fd``
    writes its byte, the Python handler has not run yet) must end the wait on a quiet
    interface: the wake-up descriptor is waited on beside the socket, and drained."""
    wake_read, wake_write = socket.socketpair()
    wake_read.setblocking(False)
    waits: list[int] = []

    def on_wait() -> None:
        waits.append(1)
        if len(waits) == 2:  # the first wait ended: the capture looked again
            raise _Drained

    quiet = _listener()  # a port nothing talks to: no kept frame, only the wake byte
    keep = compile_capture_filter(f"tcp port {quiet.getsockname()[1]}")
    # if the wake byte were not waited on, a loopback packet after 30 s ends the wait
    # (the test then fails below instead of hanging)
    rescued: list[bool] = []

    def rescue_wait() -> None:
        rescued.append(True)
        with contextlib.suppress(OSError):
            socket.create_connection(("127.0.0.1", 9)).close()

    rescue = threading.Timer(30, rescue_wait)
    with quiet, wake_read, wake_write, LiveCapture("lo", keep=keep, on_wait=on_wait) as capture:
        capture.wake_fd = wake_read.fileno()
        wake_write.send(b"\x02")  # what the C-level handler writes for SIGINT
        rescue.start()
        try:
            assert _capture(capture) == []
        finally:
            rescue.cancel()
        assert len(waits) == 2 and not rescued
        with pytest.raises(BlockingIOError):
            wake_read.recv(1)  # drained
