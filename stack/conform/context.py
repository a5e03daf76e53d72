"""What a case body gets: the run's options, the app profile and its one connection.

:class:`CaseContext` opens the case's connection (:meth:`~CaseContext.connect` when the DUT
listens, :meth:`~CaseContext.accept` when it connects) with a fresh
:class:`~stack.conform.capture.CaseCapture`, and closes it after the case.
"""

from __future__ import annotations

import socket
from collections.abc import Callable
from dataclasses import dataclass

import trio

from stack.conform.apps import AppProfile
from stack.conform.capture import CaseCapture
from stack.conform.model import Case
from stack.conform.peer import Peer

__all__ = ["CaseContext", "DutAbsent", "RunOptions", "SetupError"]

RETRY_INTERVAL = 0.05
"""Seconds between connection attempts while the DUT is not listening."""


def _refused(exc: BaseException) -> bool:
    """Whether a connect failed only because nothing listens (trio groups the attempts)."""
    if isinstance(exc, ConnectionRefusedError):
        return True
    cause = exc.__cause__
    if isinstance(cause, BaseExceptionGroup):
        return all(_refused(e) for e in cause.exceptions)
    return False


class SetupError(Exception):
    """The runner could not set the case up (the DUT is not reachable, no connection came):
    the case is an ERROR, not a verdict on the DUT."""


class DutAbsent(SetupError):
    """The DUT did not listen, or did not connect, within ``--wait`` seconds."""


@dataclass(frozen=True, slots=True)
class RunOptions:
    """Timing and policy of a run.

    Fields: timeout (seconds to wait for an answer the DUT must give); silence (seconds of
    quiet that count as "the DUT sent nothing"); startup_timeout (seconds the DUT's MPA
    startup timer may take to give up, MPA-27); wait (seconds to wait for the DUT to listen
    again or to connect); strict (SHOULDs count as failures); first_fpdu_delay (seconds
    the runner's first FPDU waits after the DUT's first bytes, its Reply when the DUT
    listens: some passive sides, siw 6.1 among them, stall on an FPDU that follows their
    Reply at once; 0 sends at once, as a conforming DUT must accept); preflight (a DUT that
    listens is first sent one valid Request, and one that answers it with no startup frame
    makes every case an ERROR at once: ``iwarp conform`` sets it unless ``--no-preflight``).
    """

    timeout: float = 5.0
    silence: float = 1.0
    startup_timeout: float = 20.0
    wait: float = 60.0
    strict: bool = False
    first_fpdu_delay: float = 0.0
    preflight: bool = False


class CaseContext:
    """One case's environment (see the module docstring).

    Fields: case, app, options, target ((host, port) of a listening DUT), listener (our
    socket listener when the DUT connects), progress (a callable printing one progress line),
    restarting (a restarter brings the DUT up: say so while waiting), peer (the case's
    connection once opened; its capture is the case's), extra (further connections of a
    case that needs several at once, closed with it).
    """

    def __init__(
        self,
        case: Case,
        app: AppProfile,
        options: RunOptions,
        *,
        target: tuple[str, int] | None = None,
        listener: trio.SocketListener | None = None,
        progress: Callable[[str], None] = lambda line: None,
        restarting: bool = False,
    ) -> None:
        self.case = case
        self.app = app
        self.options = options
        self.target = target
        self.listener = listener
        self.progress = progress
        self.restarting = restarting
        self.peer: Peer | None = None
        self.extra: list[Peer] = []

    @property
    def capture(self) -> CaseCapture | None:
        return self.peer.capture if self.peer is not None else None

    async def connect(self, *, extra: bool = False) -> Peer:
        """Open the case's connection to the listening DUT (``extra``: one more, for a
        case about several connections).  A refused connection is retried for up to
        ``options.wait`` seconds: a DUT that exits after each connection (rping) is
        listening again once it has been restarted."""
        if self.target is None:
            raise SetupError("this case needs a listening DUT (HOST:PORT)")
        if self.peer is not None and not extra:
            raise SetupError("a case opens one connection")
        host, port = self.target
        deadline = trio.current_time() + self.options.wait
        told = False
        while True:
            try:
                with trio.fail_after(self.options.timeout):
                    stream = await trio.open_tcp_stream(host, port)
                break
            except OSError as exc:
                if not _refused(exc):
                    raise SetupError(f"cannot connect to the DUT at {host}:{port}: {exc}") from None
                # the DUT is not listening (yet)
                how = self.app.dut_command.format(host=host, port=port)
                hint = (
                    "started by the restart command"
                    if self.restarting
                    else f"restart it: {how}, or give --restart-cmd"
                )
                if trio.current_time() >= deadline:
                    after = "after the restart command" if self.restarting else hint
                    raise DutAbsent(
                        f"the DUT at {host}:{port} did not listen within "
                        f"{self.options.wait:g} s ({after})"
                    ) from None
                if not told:
                    told = True
                    self.progress(
                        f"waiting up to {self.options.wait:g} s for the DUT to listen on "
                        f"{host}:{port} ({hint})"
                    )
                await trio.sleep(RETRY_INTERVAL)
            except trio.TooSlowError:
                raise SetupError(f"TCP connect to {host}:{port} timed out") from None
        peer = self._peer(stream, runner_connects=True)
        if self.peer is None:
            self.peer = peer
        else:
            self.extra.append(peer)
        return peer

    async def accept(self) -> Peer:
        """Wait (up to ``options.wait``) for the DUT to connect to us."""
        if self.listener is None:
            raise SetupError("this case needs --listen (the DUT connects to the runner)")
        if self.peer is not None:
            raise SetupError("a case opens one connection")
        with trio.move_on_after(self.options.wait) as scope:
            stream = await self.listener.accept()
        if scope.cancelled_caught:
            raise DutAbsent(f"the DUT did not connect within {self.options.wait:g} s")
        self.peer = self._peer(stream, runner_connects=False)
        return self.peer

    def _peer(self, stream: trio.SocketStream, *, runner_connects: bool) -> Peer:
        sock = stream.socket
        local = sock.getsockname()[:2]
        remote = sock.getpeername()[:2]
        if sock.family == socket.AF_INET6 and remote[0].startswith("::ffff:"):
            local, remote = (local[0][7:], local[1]), (remote[0][7:], remote[1])
        capture = CaseCapture(local, remote, runner_connects=runner_connects)
        delay = self.options.first_fpdu_delay if runner_connects else 0.0
        return Peer(stream, capture, first_fpdu_delay=delay)

    async def close(self) -> None:
        for peer in self.extra:
            await peer.close()
        if self.peer is not None:
            await self.peer.close()
