"""Scatter-gather sends on a non-blocking socket: many FPDUs per ``sendmsg``, payloads by
reference.

:class:`SendQueue` takes the pieces :meth:`~stack.rnic.endpoint.QpEndpoint.produce_iov`
returns (framing bytes and views of registered memory, MPA-01) and hands them to the kernel
at once, up to :data:`~stack.constants.IOV_MAX` pieces per call.  Whatever the kernel does
not take (a short send, ``EAGAIN``) is copied into one owned buffer, the *backlog*, before
the caller can yield: a completion is reported when its message is encoded, so the memory
a piece viewed may change as soon as another task runs (RFC 5040 §5.5, the same reason
queued Read Responses are snapshotted).  While a backlog exists new pieces queue behind
it, so bytes leave in order.  No I/O loop here: the driver waits for the socket to become
writable and calls :meth:`SendQueue.send_backlog`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from stack.buffers import Buffer
from stack.constants import IOV_MAX

__all__ = ["SendQueue"]


class SendQueue:
    """Ordered outbound pieces for one socket; ``sendmsg`` is the socket's (non-blocking).

    ``sendmsg(pieces)`` returns the number of bytes the kernel took and raises
    :class:`BlockingIOError` when it takes none; any other :class:`OSError` propagates.
    """

    __slots__ = ("_sendmsg", "_backlog", "sent", "has_backlog")

    def __init__(self, sendmsg: Callable[[Sequence[Buffer]], int]) -> None:
        self._sendmsg = sendmsg
        self._backlog: list[Buffer] = []
        self.sent = 0
        """Bytes handed to the kernel so far."""
        self.has_backlog = False
        """Whether bytes wait for the socket to become writable (:attr:`backlog` > 0): a
        plain attribute, kept with the backlog, read before every send pass."""

    @property
    def backlog(self) -> int:
        """Bytes waiting for the socket to become writable."""
        return sum(map(len, self._backlog)) if self._backlog else 0

    def send(self, pieces: list[Buffer]) -> bool:
        """Send ``pieces`` now as far as the socket takes them; True when all went out.

        What is left is copied into the backlog (the pieces are not referenced afterwards).
        With a backlog already waiting, everything is appended to it, in order.
        """
        if not pieces:
            return not self._backlog
        if self._backlog:
            self._backlog.append(b"".join(pieces))
            return False
        left = self._push(pieces)
        if left:
            self._backlog.append(b"".join(left))
            self.has_backlog = True
            return False
        return True

    def send_backlog(self) -> bool:
        """Retry the backlog (the socket became writable); True when it is empty."""
        if self._backlog:
            self._backlog = self._push(self._backlog)
            self.has_backlog = bool(self._backlog)
        return not self._backlog

    def clear(self) -> None:
        """Drop the backlog (the connection is lost)."""
        self._backlog = []
        self.has_backlog = False

    def _push(self, pieces: list[Buffer]) -> list[Buffer]:
        """Send until done or the socket is full; return the unsent rest (views)."""
        start = 0
        while start < len(pieces):
            batch = pieces[start : start + IOV_MAX]
            try:
                n = self._sendmsg(batch)
            except BlockingIOError:
                return pieces[start:]
            self.sent += n
            for piece in batch:
                size = len(piece)
                if n < size:
                    rest = pieces[start:]
                    if n:
                        rest[0] = memoryview(piece)[n:]
                    return rest
                n -= size
                start += 1
        return []
