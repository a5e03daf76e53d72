"""The means of ``kbtp conform``'s cases (:mod:`kbtp.conform`): sessions with the target
under test (:class:`Probe`), the verdicts (:class:`Outcome`, :func:`judged`,
:func:`session_end` for the close of KBTP-9.3) and :func:`run_cases`, which runs them one
after the other.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from typing import TypeVar

import trio

from kbtp.constants import SESSION_FATAL_STATUSES, Capability, Status, status_name
from kbtp.initiator import KbtpInitiator
from kbtp.initiator_errors import HelloRefused, SessionClosed
from kbtp.messages import Completion, HelloAck
from stack.constants import TERM_RDMAP_OP_UNSPECIFIED
from stack.errors import IwarpError
from stack.wire.events import MpaSettings

__all__ = [
    "ERROR",
    "FAIL",
    "PASS",
    "SKIP",
    "Case",
    "CaseResult",
    "Outcome",
    "Probe",
    "SetupFailed",
    "fatal_answer",
    "judged",
    "run_cases",
    "session_end",
]

T = TypeVar("T")

PASS, FAIL, SKIP, ERROR = "PASS", "FAIL", "SKIP", "ERROR"


@dataclass(frozen=True, slots=True)
class Outcome:
    """A case's verdict and what was observed."""

    verdict: str
    observed: str = ""


@dataclass(frozen=True, slots=True)
class Case:
    """One rule checked: ``name`` (the status and, where a status has several cases, what
    triggers it), the section of docs/kbtp.md, what is sent and the status expected."""

    name: str
    section: str
    title: str
    expect: Status
    check: Callable[[Probe, Case], Awaitable[Outcome]]

    @property
    def fatal(self) -> bool:
        """The status ends the session (docs/kbtp.md §7's last column)."""
        return self.expect in SESSION_FATAL_STATUSES


@dataclass(frozen=True, slots=True)
class CaseResult:
    case: Case
    verdict: str
    observed: str
    seconds: float


class Probe:
    """What a case may do with the target: open sessions as the runner's identities (the
    second for the one-session-per-identity rule), and use the first one's handles."""

    def __init__(
        self,
        host: str,
        port: int,
        identity: str,
        settings: MpaSettings,
        timeout: float,
    ) -> None:
        self.host = host
        self.port = port
        self.identity = identity
        self.settings = settings
        self.timeout = timeout
        self.ack: HelloAck | None = None

    @asynccontextmanager
    async def session(
        self,
        identity: str | None = None,
        *,
        wait_for_identity: bool = True,
        instead_of_hello: Callable[[int], bytes] | None = None,
        capabilities: Capability = Capability.DIRECT_LOAD | Capability.DIRECT_ALLOC,
    ) -> AsyncIterator[KbtpInitiator]:
        """A session as ``identity`` (default the runner's); the runner's HELLO_ACK is
        kept.  A HELLO refused with SESSION_EXISTS is tried again for up to the timeout
        (``wait_for_identity``): the target may not have seen the end of the last case's
        session yet."""
        deadline = trio.current_time() + self.timeout
        while True:
            stack = AsyncExitStack()
            try:
                ini = await stack.enter_async_context(
                    KbtpInitiator.connect(
                        self.host,
                        self.port,
                        identity or self.identity,
                        settings=self.settings,
                        hello_timeout=self.timeout,
                        instead_of_hello=instead_of_hello,
                        capabilities=capabilities,
                    )
                )
            except HelloRefused as exc:
                await stack.aclose()
                retry = wait_for_identity and exc.status is Status.SESSION_EXISTS
                if not retry or trio.current_time() >= deadline:
                    raise
                await trio.sleep(0.05)
                continue
            async with stack:
                if identity is None:
                    self.ack = ini.ack
                yield ini
            return

    def handle(self, k: int) -> int:
        """The runner's ``k``-th handle: its Handle Base plus ``k``."""
        assert self.ack is not None
        return self.ack.handle_base + k

    async def answer(self, request: Awaitable[T]) -> T:
        """The answer to ``request``, within the case's timeout (``trio.TooSlowError``)."""
        with trio.fail_after(self.timeout):
            return await request


def judged(case: Case, completion: Completion | HelloAck | None) -> Outcome:
    """PASS when ``completion`` (or a HELLO_ACK) carries the case's status (a fatal one's
    session end is judged by :func:`session_end`)."""
    if completion is None:
        return Outcome(FAIL, "no COMPLETION: the session ended first")
    if completion.status == case.expect:
        return Outcome(PASS, f"answered {case.expect.name}")
    return Outcome(FAIL, f"answered {status_name(completion.status)}, not {case.expect.name}")


async def session_end(ini: KbtpInitiator, timeout: float) -> str | None:
    """None when the session ends within ``timeout`` with the Terminate of KBTP-9.3, else
    what happened instead."""
    conn = ini.conn
    if conn is None:
        return "the session has no connection"
    with trio.move_on_after(timeout):
        await conn.wait_closed()
    if not conn.closed.is_set():
        return f"the session did not end within {timeout:g} s (KBTP-9.3)"
    term = ini.qp.peer_terminate
    if term is None:
        return "the session ended without a Terminate (KBTP-9.3: 0/2/0xFF, then TCP close)"
    if term.cause != TERM_RDMAP_OP_UNSPECIFIED:
        return f"Terminate {term.layer}/{term.etype}/0x{term.code:02X}, not 0/2/0xFF (KBTP-9.3)"
    return None


async def fatal_answer(
    probe: Probe,
    case: Case,
    send: Callable[[KbtpInitiator], Awaitable[Completion | HelloAck | None]],
) -> Outcome:
    """Open a session, ``send`` one request, judge its answer and the session's end."""
    async with probe.session() as ini:
        try:
            completion = await probe.answer(send(ini))
        except SessionClosed:
            completion = None
        outcome = judged(case, completion)
        if outcome.verdict != PASS:
            return outcome
        problem = await session_end(ini, probe.timeout)
    if problem is not None:
        return Outcome(FAIL, f"answered {case.expect.name}, but {problem}")
    return Outcome(PASS, f"answered {case.expect.name}, then Terminate 0/2/0xFF and close")


class SetupFailed(Exception):
    """A request a case needs before its own was refused: the case is an ERROR."""


async def run_cases(
    probe: Probe, cases: tuple[Case, ...], progress: Callable[[CaseResult], None]
) -> list[CaseResult]:
    """Run ``cases`` one after the other against ``probe``'s target (each opens its own
    sessions); ``progress`` gets each result as it is known."""
    results: list[CaseResult] = []
    try:  # one session first: without one no case can run
        async with probe.session():
            pass
    except (trio.TooSlowError, IwarpError, OSError) as exc:  # HelloRefused, SessionClosed too
        why = f"not run: no session with the target ({type(exc).__name__}: {exc})"
        for case in cases:
            results.append(CaseResult(case, ERROR, why, 0.0))
            progress(results[-1])
        return results
    for case in cases:
        start = time.perf_counter()
        try:
            outcome = await case.check(probe, case)
        except trio.TooSlowError:
            outcome = Outcome(FAIL, f"no answer within {probe.timeout:g} s")
        except SetupFailed as exc:
            outcome = Outcome(ERROR, str(exc))
        except HelloRefused as exc:
            outcome = Outcome(ERROR, f"no session: HELLO_ACK answered {exc.status.name}")
        except (IwarpError, OSError) as exc:  # SessionClosed too
            outcome = Outcome(ERROR, f"{type(exc).__name__}: {exc}")
        result = CaseResult(case, outcome.verdict, outcome.observed, time.perf_counter() - start)
        progress(result)
        results.append(result)
    return results
