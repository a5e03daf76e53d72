"""Live capture on Linux: the frames of a network interface, from an AF_PACKET socket.

The socket (packet(7), ``SOCK_DGRAM``) hands over each packet from the network layer on
with its interface's facts; every frame gets the 16-octet Linux cooked header
(``LINKTYPE_LINUX_SLL``) in front, whatever the interface's link type, as tcpdump's
cooked mode does, so one rule (:func:`~stack.pcap.packet.parse_tcp`) turns captured and
read frames alike into TCP segments.  ``any`` captures on every interface.  A loopback
interface shows each packet twice, leaving (``PACKET_OUTGOING``) and arriving: only the
arriving copy is kept.  Timestamps are the kernel's (``SO_TIMESTAMPNS``).

A capture filter (:mod:`stack.pcap.capfilter`) decides which frames are kept; kept frames
are numbered from 1, as in a file written from them.  Opening needs CAP_NET_RAW
(:class:`CapturePermissionError`); an unknown interface is a :class:`CaptureError`.
"""

from __future__ import annotations

import contextlib
import os
import select
import socket
import struct
import time
from collections.abc import Callable, Iterator

from stack.pcap.capfilter import SegmentFilter
from stack.pcap.errors import CaptureError
from stack.pcap.format import LINKTYPE_LINUX_SLL, LINUX_SLL_HEADER_LEN, MAXIMUM_SNAPLEN
from stack.pcap.packet import CaptureStats, Frame, TcpSegment, parse_tcp

__all__ = [
    "ANY_INTERFACE",
    "CapturePermissionError",
    "LiveCapture",
    "can_capture",
    "interface_name",
    "interfaces",
]

ANY_INTERFACE = "any"
"""The pseudo-interface that captures on every interface."""

# Linux ABI numbers (linux/if_ether.h, linux/if_arp.h, linux/if_packet.h, asm/socket.h).
ETH_P_ALL = 0x0003
ARPHRD_LOOPBACK = 772
PACKET_OUTGOING = 4
SOL_PACKET = 263
PACKET_STATISTICS = 6
SO_TIMESTAMPNS = 35
SO_RCVBUFFORCE = 33
RECEIVE_BUFFER = 8 << 20
"""Socket receive buffer asked for: bursts queue here while the decoder catches up."""

_SLL = struct.Struct(">HHH8sH")  # packet type, ARPHRD type, address length, address, protocol
_TIMESPEC = struct.Struct("@qq")
_STATISTICS = struct.Struct("@II")  # tp_packets, tp_drops


def _drain(fd: int) -> None:
    """Empty a non-blocking wake-up descriptor."""
    with contextlib.suppress(OSError):
        while os.read(fd, 512):
            pass


class CapturePermissionError(CaptureError):
    """Capturing needs a privilege this process lacks (CAP_NET_RAW)."""


def interfaces() -> list[tuple[str, str]]:
    """The interfaces to capture on, in index order, then ``any``: (name, description)."""
    out = []
    for _, name in sorted(socket.if_nameindex()):
        try:
            with open(f"/sys/class/net/{name}/type") as f:
                loopback = int(f.read()) == ARPHRD_LOOPBACK
        except (OSError, ValueError):
            loopback = False
        out.append((name, "Loopback" if loopback else ""))
    out.append((ANY_INTERFACE, "Pseudo-device that captures on all interfaces"))
    return out


def interface_name(text: str) -> str:
    """The interface ``text`` names: a name, or a number of the :func:`interfaces` list."""
    if text == ANY_INTERFACE:
        return text
    try:
        socket.if_nametoindex(text)
        return text
    except OSError:
        pass
    listed = interfaces()
    if text.isdigit() and 1 <= int(text) <= len(listed):
        return listed[int(text) - 1][0]
    raise CaptureError(f"no such interface {text!r}")


def _open(name: str) -> socket.socket:
    """An AF_PACKET socket receiving every packet of interface ``name``."""
    if not hasattr(socket, "AF_PACKET"):
        raise CaptureError("live capture needs Linux (AF_PACKET sockets)")
    try:
        # Protocol 0 receives nothing until bound: no packet of another interface slips in.
        proto = socket.htons(ETH_P_ALL) if name == ANY_INTERFACE else 0
        sock = socket.socket(socket.AF_PACKET, socket.SOCK_DGRAM, proto)
    except PermissionError:
        raise CapturePermissionError(f"capturing on {name} needs CAP_NET_RAW") from None
    except OSError as exc:
        raise CaptureError(f"cannot capture on {name} ({exc.strerror or exc})") from None
    try:
        if name != ANY_INTERFACE:
            sock.bind((name, ETH_P_ALL))
        sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
        try:
            sock.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, RECEIVE_BUFFER)
        except OSError:  # without CAP_NET_ADMIN: as much as net.core.rmem_max allows
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RECEIVE_BUFFER)
        sock.setblocking(False)
    except OSError as exc:
        sock.close()
        raise CaptureError(f"cannot capture on {name} ({exc.strerror or exc})") from None
    return sock


class LiveCapture:
    """Iterate the TCP segments captured on an interface, as they arrive, until closed.

    ``keep``: the capture filter (None: every frame); ``on_frame`` (also an attribute, read
    when iteration starts): called with each kept frame before its segment is yielded
    (e.g. to write it out); ``on_wait``: called before each wait for a packet (e.g. to
    flush output); ``wake_fd`` (an attribute, read when iteration starts): a descriptor
    waited on beside the socket, drained when readable: the read end of a
    :func:`signal.set_wakeup_fd` pipe, so a signal that lands just before a wait (after
    Python last looked for signals) ends the wait instead of waiting for a packet.
    Attributes: name (the interface),
    linktype (``LINKTYPE_LINUX_SLL``), snaplen, stats (:class:`CaptureStats` of the kept
    frames), dropped (packets the kernel dropped, known once closed).  Iteration raises
    :class:`CaptureError` if the interface fails (goes away).
    """

    def __init__(
        self,
        interface: str,
        *,
        keep: SegmentFilter | None = None,
        on_frame: Callable[[Frame], object] | None = None,
        on_wait: Callable[[], object] | None = None,
        snaplen: int = MAXIMUM_SNAPLEN,
    ) -> None:
        self.name = interface_name(interface)
        self.linktype = LINKTYPE_LINUX_SLL
        self.snaplen = snaplen
        self.stats = CaptureStats()
        self.stats.linktypes.add(LINKTYPE_LINUX_SLL)
        self.dropped = 0
        self._keep = keep
        self.on_frame = on_frame
        self._on_wait = on_wait
        self.wake_fd: int | None = None
        self._sock: socket.socket | None = _open(self.name)

    def frames(self) -> Iterator[Frame]:
        """Every kept frame."""
        for frame, _ in self._captured():
            yield frame

    def __iter__(self) -> Iterator[TcpSegment]:
        for _, segment in self._captured():
            if segment is not None:
                yield segment

    def _captured(self) -> Iterator[tuple[Frame, TcpSegment | None]]:
        sock = self._sock
        if sock is None:
            return
        buf = bytearray(max(self.snaplen - LINUX_SLL_HEADER_LEN, 0))
        view = memoryview(buf)
        ancillary = socket.CMSG_SPACE(_TIMESPEC.size)
        flags = socket.MSG_TRUNC | socket.MSG_DONTWAIT
        keep, on_frame, stats = self._keep, self.on_frame, self.stats
        wake = self.wake_fd
        waits: list[socket.socket | int] = [sock] if wake is None else [sock, wake]
        number = 0
        while self._sock is not None:
            try:
                size, cmsgs, _, addr = sock.recvmsg_into([view], ancillary, flags)
            except BlockingIOError:
                if self._on_wait is not None:
                    self._on_wait()
                ready, _, _ = select.select(waits, [], [])
                if wake is not None and wake in ready:
                    _drain(wake)  # the signal's Python handler runs on return from here
                continue
            except OSError as exc:
                raise CaptureError(f"capture failed ({exc.strerror or exc})", self.name) from None
            _, proto, pkttype, hatype, haddr = addr
            if pkttype == PACKET_OUTGOING and hatype == ARPHRD_LOOPBACK:
                continue  # the same packet comes again, arriving
            timestamp = time.time()
            for level, kind, value in cmsgs:
                if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS:
                    sec, nsec = _TIMESPEC.unpack_from(value)
                    timestamp = sec + nsec * 1e-9
            head = _SLL.pack(pkttype, hatype, len(haddr), haddr[:8], proto)
            data = head + bytes(view[: min(size, len(buf))])
            frame = Frame(0, timestamp, LINKTYPE_LINUX_SLL, memoryview(data), size + len(head))
            if keep is None:
                segment = parse_tcp(frame, stats)
            else:
                segment = parse_tcp(frame)
                if segment is None or not keep(segment):
                    continue
                stats.tcp += 1
            number += 1
            stats.frames += 1
            frame.number = number
            if segment is not None:
                segment.frame = number
            if on_frame is not None:
                on_frame(frame)
            yield frame, segment

    def close(self) -> None:
        """Stop capturing (``dropped`` is then final); iteration ends."""
        sock, self._sock = self._sock, None
        if sock is None:
            return
        try:
            _, drops = _STATISTICS.unpack(
                sock.getsockopt(SOL_PACKET, PACKET_STATISTICS, _STATISTICS.size)
            )
            self.dropped += drops
        except OSError:
            pass
        sock.close()

    def __enter__(self) -> LiveCapture:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        sock = getattr(self, "_sock", None)
        if sock is not None:
            sock.close()


def can_capture() -> bool:
    """Whether this process may open a capture socket (CAP_NET_RAW, on Linux)."""
    if not hasattr(socket, "AF_PACKET"):
        return False
    try:
        socket.socket(socket.AF_PACKET, socket.SOCK_DGRAM, 0).close()
    except OSError:
        return False
    return True
