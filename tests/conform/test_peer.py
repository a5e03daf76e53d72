"""The scripted peer's driver on real sockets: the first FPDU held after the DUT's Reply."""

from __future__ import annotations

from functools import partial

import trio
import trio.testing

from stack.conform.capture import CaseCapture
from stack.conform.peer import Peer
from stack.conform.peer_core import Craft


async def _exchange(delay: float, *, early: bool) -> tuple[float, bytes]:
    """A 'DUT' that sends a Reply and reads to EOF; the peer sends raw bytes ``early``
    (before the Reply) or not, then, once the Reply is in, one FPDU.  Returns the seconds
    between the Reply and the DUT's first byte of the FPDU, and everything the DUT got."""
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]
    reply = b"R" * 20
    seen: dict[str, float] = {}
    got = bytearray()

    async def dut(stream: trio.SocketStream) -> None:
        if early:
            got.extend(await stream.receive_some(100))
        await stream.send_all(reply)
        seen["reply"] = trio.current_time()
        while data := await stream.receive_some(65536):
            seen.setdefault("fpdu", trio.current_time())
            got.extend(data)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(trio.serve_listeners, dut, listeners)
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        capture = CaseCapture(("127.0.0.1", 1), ("127.0.0.1", port), runner_connects=True)
        peer = Peer(stream, capture, first_fpdu_delay=delay)
        peer.core.start_tx(crc=True, markers=False)
        if early:
            await peer.send_raw(b"early")
        await peer.next_event(0.5)  # the Reply arrives (not parsed: no event)
        await peer.send_fpdu(b"\x00" * 18, Craft())
        await peer.send_fpdu(b"\x00" * 18, Craft())  # only the first FPDU waits
        await stream.send_eof()
        while "fpdu" not in seen or len(got) < (5 if early else 0) + 2 * 24:
            await trio.sleep(0.01)
        nursery.cancel_scope.cancel()
    return seen["fpdu"] - seen["reply"], bytes(got)


def test_first_fpdu_waits_the_delay_after_the_reply() -> None:
    clock = trio.testing.MockClock(autojump_threshold=0)
    gap, got = trio.run(partial(_exchange, 30.0, early=False), clock=clock)
    assert gap >= 30.0 and len(got) == 2 * 24


def test_without_a_delay_the_fpdu_goes_at_once_and_early_bytes_are_not_held() -> None:
    clock = trio.testing.MockClock(autojump_threshold=0)
    gap, got = trio.run(partial(_exchange, 0.0, early=True), clock=clock)
    assert gap < 30.0 and got.startswith(b"early")
    gap, _ = trio.run(partial(_exchange, 30.0, early=True), clock=clock)
    assert gap >= 30.0
