"""Capture tap: record a connection's two byte streams into a pcap, exactly as exchanged.

The tap sits between the socket and the engine, so the capture holds the MPA startup
frames and every FPDU byte for byte, both directions, with each byte's TCP sequence number
equal to its real stream offset (the writer synthesizes Ethernet/IPv4/TCP headers).  Use it
on one side of a connection only: tapping both ends into one file records every byte twice.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from typing import Any, Protocol

import trio

from stack.pcap import ConnectionRecorder, Direction, PcapWriter


class CaptureTap:
    """Records one connection; ``local_is_src``: this end sent the SYN."""

    def __init__(self, recorder: ConnectionRecorder, local_is_src: bool) -> None:
        self.recorder = recorder
        self.local_is_src = local_is_src

    def record(self, outbound: bool, data: bytes | bytearray | memoryview) -> None:
        if not data or self.recorder.closed:
            return
        sent = outbound == self.local_is_src
        self.recorder.record(Direction.SENT if sent else Direction.RECEIVED, data, time.time())

    def close(self) -> None:
        if not self.recorder.closed:
            self.recorder.close(time.time())


def pcap_tap_factory(
    writer: PcapWriter, *, mss: int = 1448
) -> Callable[[trio.SocketStream, bool], CaptureTap]:
    """A ``tap_factory`` for the connection manager, writing to ``writer``."""

    def factory(stream: trio.SocketStream, is_active: bool) -> CaptureTap:
        return _socket_tap(writer, stream.socket, is_active, mss)

    return factory


def socket_tap_factory(
    writer: PcapWriter, *, mss: int = 1448
) -> Callable[[socket.socket, bool], CaptureTap]:
    """A ``tap_factory`` for the blocking driver's ``connect`` and listener
    (:mod:`stack.transport.blocking_cm`), writing to ``writer``."""

    def factory(sock: socket.socket, is_active: bool) -> CaptureTap:
        return _socket_tap(writer, sock, is_active, mss)

    return factory


def _socket_tap(writer: PcapWriter, sock: _Named, is_active: bool, mss: int) -> CaptureTap:
    """The tap of one connected socket (``is_active``: this end sent the SYN)."""
    local = sock.getsockname()[:2]
    peer = sock.getpeername()[:2]
    src, dst = (local, peer) if is_active else (peer, local)
    recorder = writer.connection(src, dst, timestamp=time.time(), mss=mss)
    return CaptureTap(recorder, local_is_src=is_active)


class _Named(Protocol):
    def getsockname(self) -> Any: ...
    def getpeername(self) -> Any: ...
