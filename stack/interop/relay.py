"""A TCP relay that holds the initiator's first FPDU back from a passive siw for a moment.

siw 6.1's passive side races an FPDU that arrives right after its MPA Reply against its own
QP setup and can stall it for good (:data:`~stack.interop.helpers.SIW_PASSIVE_FIRST_FPDU_DELAY`);
this project's peers wait that long before their first FPDU (``--first-fpdu-delay``).  The
conformance runner does not, so :class:`FirstFpduRelay` sits between it and the guest's
hostfwd: bytes the runner sends within ``delay`` seconds after the DUT's first bytes (its
Reply) go out when ``delay`` has passed; everything else is relayed at once, a half-close
as a half-close and a reset as a reset.  Bytes the runner sends before the DUT has sent any
(its Request, an FPDU in the same write) are not held.
"""

from __future__ import annotations

import socket
import struct

import trio

from stack.interop.helpers import SIW_PASSIVE_FIRST_FPDU_DELAY

__all__ = ["FirstFpduRelay"]

CHUNK = 65536
_ERRORS = (trio.BrokenResourceError, trio.ClosedResourceError, OSError)


class FirstFpduRelay:
    """Listen on 127.0.0.1 (:attr:`port`, once :meth:`serve` has started) and relay each
    connection to ``upstream`` (see the module docstring)."""

    def __init__(
        self, upstream: tuple[str, int], *, delay: float = SIW_PASSIVE_FIRST_FPDU_DELAY
    ) -> None:
        self.upstream = upstream
        self.delay = delay
        self.port = 0
        self.held = 0
        """How many writes of the runner waited for the delay."""

    async def serve(self, *, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
        """Accept and relay until cancelled; reports the port through ``task_status``."""
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        self.port = int(listeners[0].socket.getsockname()[1])
        task_status.started(self.port)
        await trio.serve_listeners(self._relay, listeners)

    async def _relay(self, client: trio.SocketStream) -> None:
        try:
            server = await trio.open_tcp_stream(*self.upstream)
        except OSError:
            _reset(client)
            await trio.aclose_forcefully(client)
            return
        async with trio.open_nursery() as nursery:
            pair = _Pair(self, nursery.cancel_scope)
            nursery.start_soon(pair.pump, client, server, True)
            nursery.start_soon(pair.pump, server, client, False)
        await trio.aclose_forcefully(server)
        await trio.aclose_forcefully(client)


class _Pair:
    """One relayed connection: when the DUT's first bytes came, and the relay's scope."""

    def __init__(self, relay: FirstFpduRelay, scope: trio.CancelScope) -> None:
        self.relay = relay
        self.scope = scope
        self.dut_spoke_at: float | None = None

    async def pump(self, src: trio.SocketStream, dst: trio.SocketStream, to_dut: bool) -> None:
        """Relay ``src`` to ``dst`` until EOF (passed on as a half-close) or an error (passed
        on as a reset of the other side, ending the connection)."""
        while True:
            try:
                data = await src.receive_some(CHUNK)
            except _ERRORS:
                _reset(dst)
                self.scope.cancel()
                return
            if to_dut and self.dut_spoke_at is not None:
                until = self.dut_spoke_at + self.relay.delay
                if trio.current_time() < until:
                    self.relay.held += 1
                    await trio.sleep_until(until)
            elif not to_dut and data and self.dut_spoke_at is None:
                self.dut_spoke_at = trio.current_time()
            try:
                if not data:
                    await dst.send_eof()
                    return
                await dst.send_all(data)
            except _ERRORS:
                _reset(src)
                self.scope.cancel()
                return


def _reset(stream: trio.SocketStream) -> None:
    """Make the coming close of ``stream`` a reset (SO_LINGER 0)."""
    try:
        stream.socket.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    except OSError:
        pass
