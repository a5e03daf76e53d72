"""Socket options the data path sets on its TCP connections.

trio's :class:`~trio.SocketStream` enables ``TCP_NOTSENT_LOWAT`` at 16 KiB, so a
non-blocking send stops once 16 KiB are queued unsent and the socket reports writable only
below that: a 1 MiB RDMA Write leaves in about 7 ``sendmsg`` calls, each followed by a
writable wait, and the kernel work per byte grows with the call count.  With no limit at
all (the kernel's default) a fast sender queues the whole send buffer, and a receiver that
falls behind copies from memory that has left its caches.  The driver and the benchmarks'
raw baselines set 1 MiB (:data:`~stack.constants.TCP_NOTSENT_LOWAT_BULK`, one send pass
of the driver) on their sockets, so both sides of a ratio send alike.
"""

from __future__ import annotations

import socket
import struct
from typing import Protocol

from stack.constants import TCP_NOTSENT_LOWAT_BULK

__all__ = ["limit_unsent", "path_segment_size", "segment_size"]


class _Settable(Protocol):
    def setsockopt(self, level: int, option: int, value: int, /) -> None: ...


class _Readable(Protocol):
    def getsockopt(self, level: int, option: int, /) -> int: ...


class _InfoReadable(Protocol):
    def getsockopt(self, level: int, option: int, buflen: int, /) -> bytes: ...


_TCP_INFO_ADVMSS = struct.Struct("=I")
_TCP_INFO_ADVMSS_AT = 8 + 19 * 4  # struct tcp_info: 8 octets of u8 fields, tcpi_advmss the 20th u32


def limit_unsent(sock: _Settable) -> None:
    """Let ``sock`` (a socket, or a trio socket stream) queue up to
    :data:`~stack.constants.TCP_NOTSENT_LOWAT_BULK` unsent octets per send; a no-op where
    the platform has no ``TCP_NOTSENT_LOWAT`` or the socket refuses it."""
    option = getattr(socket, "TCP_NOTSENT_LOWAT", None)
    if option is None:
        return
    try:
        sock.setsockopt(socket.IPPROTO_TCP, option, TCP_NOTSENT_LOWAT_BULK)
    except OSError:
        pass


def segment_size(sock: _Readable) -> int | None:
    """TCP's current segment size on a connected socket (a socket or a trio socket,
    ``TCP_MAXSEG``), the EMSS of MPA-13; None when it cannot be read.

    Linux bounds it to half the largest window the peer has advertised, so on a path
    whose MSS exceeds half the initial window (loopback: 65483 against 64 KiB) it starts
    at about half the path's and grows as the peer's window opens."""
    try:
        size = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_MAXSEG)
    except OSError:
        return None
    return size if size > 0 else None


def path_segment_size(sock: _InfoReadable) -> int | None:
    """The segment size the path allows (Linux ``tcpi_advmss``, from the route's MTU),
    which :func:`segment_size` grows to (a socket or a trio socket); None where ``TCP_INFO``
    is not Linux's."""
    option = getattr(socket, "TCP_INFO", None)
    if option is None:
        return None
    try:
        info = sock.getsockopt(socket.IPPROTO_TCP, option, 104)
    except OSError:
        return None
    if len(info) < _TCP_INFO_ADVMSS_AT + 4:
        return None
    (size,) = _TCP_INFO_ADVMSS.unpack_from(info, _TCP_INFO_ADVMSS_AT)
    return size if size > 0 else None
