"""The scripted peer's trio driver: a :class:`~stack.conform.peer_core.PeerCore` on a socket.

:class:`Peer` sends what the core frames and feeds it what the DUT sends, recording both
directions into the case's :class:`~stack.conform.capture.CaseCapture`.  Waiting is
bounded: :meth:`Peer.next_event` returns None when its time is up, so a silent or stuck
DUT can never hang a case.  A reset or a write to a closed connection is an event of the
case (the DUT closed), never an exception out of it.  :attr:`Peer.log` keeps the order of
what was sent and received in Full Operation (:class:`Out`, :class:`PduSeen`), so the
runner's model of the DUT (:mod:`stack.conform.oracle`) can replay the connection.
"""

from __future__ import annotations

import errno
import math
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

import trio

from stack.conform.capture import CaseCapture
from stack.conform.peer_core import Craft, Eof, PduSeen, PeerCore, PeerEvent, Sent
from stack.wire.events import RdmapMessage

__all__ = ["Out", "Peer"]

RECEIVE_SIZE = 65536
CLOSE_GRACE = 1.0
"""Seconds :meth:`Peer.close` waits for the DUT's FIN after sending ours."""


@dataclass(frozen=True, slots=True)
class Out:
    """FPDUs the runner sent in one write (a burst reaches the DUT together)."""

    sent: tuple[Sent, ...]


class Peer:
    """The runner's end of one TCP connection to the DUT.

    Fields: ``core`` (the sans-IO :class:`PeerCore`), ``capture``, ``events`` (every event
    seen so far, in order), ``closed_by_dut`` (the DUT's FIN or reset arrived),
    ``send_failed`` (a send found the connection closed), ``log`` (FPDUs sent, as
    :class:`Out`, and PDUs received, in order).  With ``first_fpdu_delay`` the first FPDU
    write waits until that many seconds have passed since the DUT's first bytes arrived
    (:attr:`~stack.conform.context.RunOptions.first_fpdu_delay`).
    """

    def __init__(
        self, stream: trio.SocketStream, capture: CaseCapture, *, first_fpdu_delay: float = 0.0
    ) -> None:
        self.stream = stream
        self.first_fpdu_delay = first_fpdu_delay
        self._dut_first_at: float | None = None
        self._fpdu_sent = False
        self.capture = capture
        self.core = PeerCore()
        self.events: list[PeerEvent] = []
        self.closed_by_dut = False
        self.reset_by_dut = False
        self.send_failed = False
        self.log: list[Out | PduSeen] = []
        self._closed = False
        self._corked: list[bytes] | None = None

    # -- sending -----------------------------------------------------------------------

    async def send_raw(self, data: bytes) -> None:
        """Send bytes as they are (startup frames, garbage)."""
        await self._send(self.core.raw(data))

    async def send_fpdu(self, ulpdu: bytes, craft: Craft | None = None) -> Sent:
        """Frame one ULPDU (broken as ``craft`` says) and send it."""
        sent = self.core.fpdu(ulpdu, craft)
        self.log.append(Out((sent,)))
        await self._hold_first_fpdu()
        await self._send(sent.data)
        return sent

    async def send_fpdus(self, items: list[tuple[bytes, Craft | None]]) -> list[Sent]:
        """Frame several ULPDUs and send them in one write (a burst)."""
        sent = [self.core.fpdu(ulpdu, craft) for ulpdu, craft in items]
        self.log.append(Out(tuple(sent)))
        await self._hold_first_fpdu()
        await self._send(b"".join(x.data for x in sent))
        return sent

    async def send_split(
        self,
        items: list[tuple[bytes, Craft | None]],
        cuts: list[int] | None,
        pause: float,
    ) -> list[Sent]:
        """Frame ULPDUs and send their bytes in pieces, cut at the offsets ``cuts`` (negative:
        from the end; None: after every octet), with ``pause`` seconds between the writes (so
        they travel in separate TCP segments)."""
        sent = [self.core.fpdu(ulpdu, craft) for ulpdu, craft in items]
        self.log.append(Out(tuple(sent)))
        data = b"".join(x.data for x in sent)
        n = len(data)
        points = range(1, n) if cuts is None else (c if c >= 0 else n + c for c in cuts)
        edges = [0, *sorted({c for c in points if 0 < c < n}), n]
        await self._hold_first_fpdu()
        for i, (a, b) in enumerate(zip(edges, edges[1:], strict=False)):
            if i:
                await trio.sleep(pause)
            await self._send(data[a:b])
        return sent

    async def send_message(self, message: RdmapMessage, craft: Craft | None = None) -> list[Sent]:
        """Send an RDMAP message (``craft`` applies to its first FPDU)."""
        out = []
        for i, ulpdu in enumerate(self.core.ulpdus(message)):
            out.append(await self.send_fpdu(ulpdu, craft if i == 0 else None))
        return out

    async def _hold_first_fpdu(self) -> None:
        """Wait out ``first_fpdu_delay`` before the first FPDU (see the class docstring)."""
        if self._fpdu_sent:
            return
        self._fpdu_sent = True
        if self.first_fpdu_delay > 0 and self._dut_first_at is not None:
            await trio.sleep_until(self._dut_first_at + self.first_fpdu_delay)

    @asynccontextmanager
    async def one_write(self) -> AsyncIterator[None]:
        """Everything sent inside the block goes out in one write when it ends (a Request
        and FPDUs together, MPA-17)."""
        self._corked = []
        try:
            yield
        finally:
            data = b"".join(self._corked)
            self._corked = None
            await self._send(data)

    async def _send(self, data: bytes) -> None:
        if not data or self._closed:
            return
        if self._corked is not None:
            self._corked.append(data)
            return
        self.capture.record(True, data)
        try:
            await self.stream.send_all(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            self.send_failed = True

    # -- receiving ---------------------------------------------------------------------

    async def next_event(self, timeout: float) -> PeerEvent | None:
        """The next event, waiting at most ``timeout`` seconds; None when none came."""
        deadline = trio.current_time() + max(0.0, timeout)
        while True:
            event = self.core.next_event()
            if event is not None:
                self.events.append(event)
                if isinstance(event, PduSeen):
                    self.log.append(event)
                if isinstance(event, Eof):
                    self.closed_by_dut = True
                    self.reset_by_dut = event.reset
                return event
            if self.closed_by_dut or self._closed:
                return None
            with trio.move_on_at(deadline) as scope:
                try:
                    data = await self.stream.receive_some(RECEIVE_SIZE)
                except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
                    if isinstance(exc, OSError) and exc.errno not in (
                        errno.ECONNRESET,
                        errno.EPIPE,
                        None,
                    ):
                        raise
                    self.core.reset()
                    self.capture.close(reset=True, dut_first=True)
                    continue
            if scope.cancelled_caught:
                return None
            if data:
                if self._dut_first_at is None:
                    self._dut_first_at = trio.current_time()
                self.capture.record(False, data)
            else:
                self.capture.close(dut_first=True)
            self.core.receive(data)

    async def wait_for_more(self, seconds: float) -> list[PeerEvent]:
        """Every event within ``seconds`` (until the DUT closes)."""
        deadline = trio.current_time() + seconds
        out: list[PeerEvent] = []
        while True:
            left = deadline - trio.current_time()
            if left <= 0:
                return out
            event = await self.next_event(left)
            if event is None:
                return out
            out.append(event)
            if isinstance(event, Eof):
                return out

    def frame_of_dut(self, offset: int) -> int | None:
        """The capture frame holding byte ``offset`` of the DUT's stream."""
        return self.capture.frame_of(False, offset)

    # -- closing -----------------------------------------------------------------------

    async def close(self, grace: float = CLOSE_GRACE) -> None:
        """Graceful close: our FIN, the DUT's FIN (up to ``grace`` seconds), then the socket.
        Waiting lets a DUT that exits after one connection finish before the next case."""
        if self._closed:
            return
        if not self.closed_by_dut and not self.send_failed:
            try:
                await self.stream.send_eof()
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                pass
            with trio.move_on_after(grace):
                while await self.next_event(math.inf) is not None:
                    if self.closed_by_dut:
                        break
        self._closed = True
        self.capture.close()
        await trio.aclose_forcefully(self.stream)
