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
from typing import Protocol

from stack.constants import TCP_NOTSENT_LOWAT_BULK

__all__ = ["limit_unsent"]


class _Settable(Protocol):
    def setsockopt(self, level: int, option: int, value: int, /) -> None: ...


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
