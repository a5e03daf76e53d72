"""The scripted peer's trio driver: a :class:`~stack.conform.peer_core.PeerCore` on a socket.

:class:`Peer` sends what the core frames and feeds it what the DUT sends, recording both
directions into the case's :class:`~stack.conform.capture.CaseCapture`.  Waiting is
bounded: :meth:`Peer.next_event` returns None when its time is up, so a silent or stuck
DUT can never hang a case.  A reset or a write to a closed connection is an event of the
case (the DUT closed), never an exception out of it.
"""

from __future__ import annotations

import errno
import math

import trio

from stack.conform.capture import CaseCapture
from stack.conform.peer_core import Craft, Eof, PeerCore, PeerEvent, Sent
from stack.wire.events import RdmapMessage

__all__ = ["Peer"]

RECEIVE_SIZE = 65536
CLOSE_GRACE = 1.0
"""Seconds :meth:`Peer.close` waits for the DUT's FIN after sending ours."""


class Peer:
    """The runner's end of one TCP connection to the DUT.

    Fields: ``core`` (the sans-IO :class:`PeerCore`), ``capture``, ``events`` (every event
    seen so far, in order), ``closed_by_dut`` (the DUT's FIN or reset arrived),
    ``send_failed`` (a send found the connection closed).
    """

    def __init__(self, stream: trio.SocketStream, capture: CaseCapture) -> None:
        self.stream = stream
        self.capture = capture
        self.core = PeerCore()
        self.events: list[PeerEvent] = []
        self.closed_by_dut = False
        self.reset_by_dut = False
        self.send_failed = False
        self._closed = False

    # -- sending -----------------------------------------------------------------------

    async def send_raw(self, data: bytes) -> None:
        """Send bytes as they are (startup frames, garbage)."""
        await self._send(self.core.raw(data))

    async def send_fpdu(self, ulpdu: bytes, craft: Craft | None = None) -> Sent:
        """Frame one ULPDU (broken as ``craft`` says) and send it."""
        sent = self.core.fpdu(ulpdu, craft)
        await self._send(sent.data)
        return sent

    async def send_message(self, message: RdmapMessage, craft: Craft | None = None) -> list[Sent]:
        """Send an RDMAP message (``craft`` applies to its first FPDU)."""
        out = []
        for i, ulpdu in enumerate(self.core.ulpdus(message)):
            out.append(await self.send_fpdu(ulpdu, craft if i == 0 else None))
        return out

    async def _send(self, data: bytes) -> None:
        if not data or self._closed:
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
