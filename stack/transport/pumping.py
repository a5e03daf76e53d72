"""What both drivers pump a connection by: the receive buffer's sizes, the feed budget,
the stall release, the send pass, the EMSS that follows TCP's segment size (MPA-13), the
capture tap's interface and the orderly close's timeout.

The trio driver (:mod:`stack.transport.driver`) and the blocking driver
(:mod:`stack.transport.blocking`) take these from here, so the two behave alike: the same
bytes per read, the same events per feed, the same output per send pass.
"""

from __future__ import annotations

import socket
from collections.abc import Sequence
from typing import Protocol, TypeVar

from stack.constants import RAW_RECEIVE_SIZE, TCP_NOTSENT_LOWAT_BULK
from stack.rnic.endpoint import QpEndpoint
from stack.transport.sendq import SendQueue
from stack.transport.sockopts import path_segment_size, segment_size
from stack.wire.connection import IwarpConnection

T = TypeVar("T")

RECEIVE_SIZE = 256 * 1024
"""Size of a connection's receive buffer when it is made (at its first read)."""

RECEIVE_MAX = TCP_NOTSENT_LOWAT_BULK
"""Size a receive buffer grows to, doubling, while reads keep filling it: one send pass of
the peer (a bulk stream).  Measured on loopback: 64 KiB Writes went 25-33 % faster with a
1 MiB buffer than with 256 KiB; 512 KiB, 768 KiB, 1.25 MiB and 2 MiB gained nothing; 1 MiB
messages and 64 B round trips were unchanged.  A connection that never streams keeps the
small buffer, and so does one that receives markers (:meth:`RdmaConnection._rx_marked`)."""

RECEIVE_CHUNK = RAW_RECEIVE_SIZE
"""Most octets one ``recv_into`` asks for; one read of the buffer is as many of them as the
socket has ready (no checkpoint between them), parsed as one chunk.  On loopback the
sender's ``sendmsg`` also runs the receiving half of TCP, and a receiver taking up to 1 MiB
at a time made it dearer: with 128 KiB calls 1 MiB Writes went from 2.4-2.9 to 2.9-3.4 GB/s,
1 MiB Reads from 2.6-2.8 to 2.7-3.3 and 64 KiB Writes from 2.3-2.7 to 2.6-2.8 (the sender's
CPU per MiB fell from 340-406 to 292-336 µs); 64 KiB calls did as well, 256 KiB calls less.
That is when the whole-room read is slow; in the minutes when it was not (1 MiB Writes at
3.3-3.5 GB/s) the two were equal: chunked reads stayed at 3.2-3.35 in every run.
Capping the read itself (one ``recv_into`` of 128 KiB per read) did not help: the stack's
receiver pays a fixed cost per read."""

STALL_RELEASE_AFTER = 0.2
"""Seconds an event may wait for queued Read Responses to go out while none of our output
moves before it is applied anyway, the responses copied up to the QP's
``max_stalled_snapshot_bytes`` (:meth:`~stack.rnic.endpoint.QpEndpoint.stall_released`): two
ends that each wait for their responses to go out before they read again would otherwise
wait for each other for ever.  Both drivers."""

FEED_BUDGET = 64
"""Most events (Read and atomic Requests, mostly) the reader applies before it sends what
they produced: a read holding many requests gets its first answers out while the rest are
applied, so the peer works on them meanwhile.  Without it a pipeline of small requests
settled into one batch bouncing between the two ends, each idle while the other worked:
64 B Reads 128 deep went from 34k to 62k per second, FetchAdds from 23k to 44k, 4 KiB
Reads from 157 to 227 MB/s (medians of 3, two processes on loopback); bulk transfers and
round trips did not change (their data is placed as it is parsed, no event each)."""

MSS_CHECK_INTERVAL = 64 * 1024
"""Octets sent between two reads of TCP's segment size while the EMSS follows it."""

MSS_FOLLOW_LIMIT = 64 * 1024 * 1024
"""Octets after which a connection stops following TCP's segment size (it has settled)."""


DISCONNECT_TIMEOUT = 30.0
"""Seconds :meth:`RdmaConnection.disconnect` waits for the orderly close before it aborts."""


def drain_halves(items: Sequence[T]) -> tuple[Sequence[T], ...]:
    """A drain of completions in the two parts a consumer answers one after the other (the
    first half's answers sent, :meth:`RdmaConnection.uncork`, then the second's): with a
    fixed number of requests in flight, answering a whole drain at once makes the two ends
    pass one batch back and forth, each idle while the other works.  Measured with KBTP,
    16 in flight, two processes (medians of 3): 4 KiB STOREs 7.2k -> 13.4k per second,
    LOADs 7.0k -> 12.9k, ALLOC_STOREs 6.1k -> 10.0k; 64 KiB unchanged at 16 in flight, up
    to 1.36x at 64.  Splitting in parts of 8 did as well at 16 and cost more CPU at 64."""
    if len(items) < 2:
        return (items,)
    middle = (len(items) + 1) // 2
    return items[:middle], items[middle:]


class EmssFollower:
    """MPA-13 on a socket whose segment size grows: the EMSS read again every
    :data:`MSS_CHECK_INTERVAL` octets sent, and the MULPDU derived from it when it grew
    (Linux starts it at half the peer's initial window, about half a loopback path's
    65483), until it reaches the path's (``tcpi_advmss``) or :data:`MSS_FOLLOW_LIMIT`
    octets were sent.  Both drivers call :meth:`update` once ``sent`` reaches
    :attr:`check_at`."""

    __slots__ = ("_sock", "_engine", "_ceiling", "check_at")

    def __init__(self, sock: socket.socket, engine: IwarpConnection) -> None:
        self._sock = sock
        self._engine = engine
        self._ceiling = path_segment_size(sock)
        self.check_at = 0
        """Octets sent at which the segment size is read again."""

    def check(self, sent: int) -> EmssFollower | None:
        """Called with the octets sent so far before each send pass: reads the segment size
        when :attr:`check_at` is reached; returns None once it has settled (stop calling),
        else itself."""
        if sent < self.check_at or self.update(sent):
            return self
        return None

    def update(self, sent: int) -> bool:
        """Read the segment size now (``sent`` octets sent so far); False once it has
        settled (stop calling)."""
        size = segment_size(self._sock)
        emss = self._engine.settings.emss
        if size is not None and (emss is None or size > emss):
            self._engine.update_emss(size)
            emss = size
        ceiling = self._ceiling
        if sent >= MSS_FOLLOW_LIMIT or (
            ceiling is not None and emss is not None and emss >= ceiling
        ):
            return False
        self.check_at = sent + MSS_CHECK_INTERVAL
        return True


class Tap(Protocol):
    """What the driver needs of a capture recorder."""

    def record(self, outbound: bool, data: bytes | bytearray | memoryview) -> None: ...


def close_tap(tap: Tap | None) -> None:
    """Close ``tap`` if it has a ``close`` (a pcap tap ends its connection's records)."""
    close = getattr(tap, "close", None)
    if close is not None:
        close()


def send_pass(endpoint: QpEndpoint, sendq: SendQueue, tap: Tap | None) -> None:
    """Encode what the QP has queued and hand it to ``sendq`` until nothing is left or the
    socket stops taking it (a backlog); an event that waited for queued Read Responses
    (:attr:`QpEndpoint.stalled`) is applied once they are out.  The send pass of both
    drivers; the socket's :class:`OSError` propagates."""
    while True:
        pieces = endpoint.produce_iov()
        if not pieces:
            return
        if tap is not None:
            tap.record(True, b"".join(pieces))
        done = sendq.send(pieces)
        del pieces  # no view of registered memory outlives the send (SendQueue)
        stalled = endpoint.stalled is not None
        if stalled:
            endpoint.resume_stalled()
        # Another pass only when something may have been queued meanwhile: by the QP
        # (callbacks during the send), or by the event that waited (its feed).
        if not done or not (stalled or endpoint.has_output):
            return


__all__ = [
    "DISCONNECT_TIMEOUT",
    "FEED_BUDGET",
    "MSS_CHECK_INTERVAL",
    "MSS_FOLLOW_LIMIT",
    "RECEIVE_CHUNK",
    "RECEIVE_MAX",
    "RECEIVE_SIZE",
    "STALL_RELEASE_AFTER",
    "EmssFollower",
    "Tap",
    "close_tap",
    "drain_halves",
    "send_pass",
]
