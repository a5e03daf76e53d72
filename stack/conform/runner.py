"""The run loop of ``iwarp conform``: restart the DUT, run each case, collect results.

Each case gets a fresh connection, a fresh capture and a time budget; whatever goes wrong
inside the runner (the DUT unreachable, no connection, a budget overrun, a bug) makes that
case an ERROR and the run goes on.  A DUT that exits after one connection (rping) is
handled by a :class:`Restarter`: :class:`CommandRestarter` runs ``--restart-cmd`` before
each case and ends what it started after it; without one the runner waits for the DUT to
listen again (or to connect, with ``--listen``) and says so on stderr.

With :attr:`RunOptions.preflight` a listening DUT is first sent one valid Request: a DUT
that is not there, says nothing, closes at once or answers with bytes that are no MPA
frame would make every case an ERROR after its full wait (minutes for a run), so the run
says why at once and reports every case as not run.  Likewise a DUT that stops listening
(or connecting) for :data:`GONE_AFTER` cases in a row ends the run: it crashed.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import trio

from stack.conform.apps import AppProfile
from stack.conform.context import CaseContext, DutAbsent, RunOptions, SetupError
from stack.conform.model import Case, CaseResult, DutRole, Outcome, Verdict, status_for
from stack.conform.script import start
from stack.constants import MPA_KEY_LEN, MPA_KEY_REP, MPA_KEY_REQ
from stack.errors import IwarpError

__all__ = [
    "CommandRestarter",
    "NoRestart",
    "Restarter",
    "RunReport",
    "run_cases",
]

MAX_EVIDENCE_FINDINGS = 6
"""Capture decoder findings added to a case's evidence at most."""
GROUP_GRACE = 2.0
"""Seconds a ``--restart-cmd`` process group gets to exit after SIGTERM (then SIGKILL)."""
GONE_AFTER = 2
"""Cases in a row whose DUT did not listen (or connect) within ``--wait`` after which the
run reports the cases left as not run: a DUT that crashed would cost each of them the wait
(a minute by default), hours for a run."""
SETTLE = 0.25
"""Seconds between cases without a restarter: a DUT that exits after a connection closes
its listener in that time, so the next case does not reach the old one."""


class Restarter(Protocol):
    """Brings the DUT into a state to take the next case."""

    async def before_case(self, case: Case) -> None: ...

    async def after_case(self, case: Case) -> None: ...


class NoRestart:
    """The DUT restarts itself (or serves many connections): nothing to do but, after each
    case, give a DUT that exits after one connection ``settle`` seconds to close its
    listener (0 for a DUT known to serve many)."""

    def __init__(self, settle: float = SETTLE) -> None:
        self.settle = settle

    async def before_case(self, case: Case) -> None:
        return None

    async def after_case(self, case: Case) -> None:
        if self.settle > 0:
            await trio.sleep(self.settle)


class CommandRestarter:
    """``--restart-cmd CMD``: a shell command started before each case (in its own process
    group), ended after the case if it still runs (SIGTERM to its group, then SIGKILL).

    The command may restart a remote DUT and return (``ssh dut systemctl restart ...``) or
    be the DUT itself (``rping -s -p 7174``; for ``--listen``, ``rping -c ...``).
    ``{host}`` and ``{port}`` in it are filled in.
    """

    def __init__(self, command: str, *, host: str, port: int, log: Callable[[str], None]) -> None:
        self.command = command.replace("{host}", host).replace("{port}", str(port))
        self.log = log
        self._proc: trio.Process | None = None

    async def before_case(self, case: Case) -> None:
        self.log(f"restart: {self.command}")
        self._proc = await trio.lowlevel.open_process(
            self.command,
            shell=True,
            start_new_session=True,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

    async def after_case(self, case: Case) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        with trio.CancelScope(shield=True):
            # The whole group must be gone (a shell's child outlives the shell): a DUT still
            # dying holds the port, and the next case would reach it.
            _signal_group(proc.pid, signal.SIGTERM)
            with trio.move_on_after(GROUP_GRACE) as scope:
                await proc.wait()  # reaps the shell: a zombie still counts as alive
                while _group_alive(proc.pid):
                    await trio.sleep(0.02)
            if scope.cancelled_caught:
                _signal_group(proc.pid, signal.SIGKILL)
                await proc.wait()
                with trio.move_on_after(GROUP_GRACE):
                    while _group_alive(proc.pid):
                        await trio.sleep(0.02)


def _group_alive(pgid: int) -> bool:
    """Whether a process of group ``pgid`` still runs (zombies do not: they hold no socket,
    and an init that does not reap them must not stall the run)."""
    proc = Path("/proc")
    if proc.is_dir():
        for stat in proc.glob("[0-9]*/stat"):
            try:
                fields = stat.read_text().rsplit(")", 1)[1].split()
            except (OSError, IndexError):
                continue
            if len(fields) > 2 and int(fields[2]) == pgid and fields[0] != "Z":
                return True
        return False
    try:  # pragma: no cover - no /proc (not Linux)
        os.killpg(pgid, 0)
    except (ProcessLookupError, PermissionError):  # pragma: no cover
        return False
    return True  # pragma: no cover


def _signal_group(pid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pid, sig)  # the group the command leads (start_new_session)
    except ProcessLookupError:
        pass


@dataclass
class RunReport:
    """A finished run.  Fields: results, app, dut (what was tested, one line), role,
    options, seconds, started (Unix time)."""

    results: list[CaseResult]
    app: str
    dut: str
    role: DutRole
    options: RunOptions
    seconds: float = 0.0
    started: float = field(default_factory=time.time)


def budget(options: RunOptions, case: Case) -> float:
    """Seconds a case may take before the runner gives up on it (ERROR)."""
    waits = 4 * options.timeout + 2 * options.silence + options.wait + 5.0
    return waits + (options.startup_timeout if case.slow else 0.0)


async def run_cases(
    cases: Sequence[Case],
    app: AppProfile,
    options: RunOptions,
    *,
    target: tuple[str, int] | None = None,
    listen: tuple[str, int] | None = None,
    pcap_dir: Path | None = None,
    restarter: Restarter | None = None,
    progress: Callable[[str], None] | None = None,
    on_result: Callable[[CaseResult], None] | None = None,
) -> RunReport:
    """Run ``cases`` against the DUT at ``target`` (it listens) or from ``listen`` (it
    connects to us there); returns the report."""
    say = progress or _stderr
    restarter = restarter or NoRestart()
    role = DutRole.CONNECTS if listen is not None else DutRole.LISTENS
    if pcap_dir is not None:
        pcap_dir.mkdir(parents=True, exist_ok=True)
    listener: trio.SocketListener | None = None
    if listen is not None:
        host, port = listen
        listeners = await trio.open_tcp_listeners(port, host=host or None)
        listener = listeners[0]
        for extra in listeners[1:]:
            await extra.aclose()
        bound = listener.socket.getsockname()
        where = f"{host or '0.0.0.0'}:{bound[1]}"
        say(f"listening on {where}; the DUT connects once per case")
        dut = f"DUT connecting to {where}"
    else:
        assert target is not None
        dut = f"DUT listening at {target[0]}:{target[1]}"
    report = RunReport([], app.name, dut, role, options)
    started = trio.current_time()
    try:
        gone = None  # why the cases left are not run
        if options.preflight and target is not None and cases:
            gone = await preflight(cases[0], app, options, target, restarter, say)
            if gone is not None:
                say(f"preflight: {gone}; no case was run (--no-preflight runs them anyway)")
        absent = 0  # cases in a row whose DUT did not listen or connect within --wait
        for i, c in enumerate(cases, 1):
            if gone is not None:
                result = _not_run(c, gone, options)
            else:
                say(f"[{i}/{len(cases)}] {c.id}: {c.title}")
                result, missing = await _run_one(
                    c, app, options, target, listener, pcap_dir, restarter, say
                )
                say(f"[{i}/{len(cases)}] {c.id}: {result.status.value} ({result.seconds:.2f} s)")
                absent = absent + 1 if missing else 0
                if absent == GONE_AFTER and i < len(cases):
                    gone = f"the DUT is gone ({result.verdict.observed}, {absent} cases in a row)"
                    say(f"{gone}: the {len(cases) - i} cases left are not run")
            report.results.append(result)
            if on_result is not None:
                on_result(result)
    finally:
        if listener is not None:
            await listener.aclose()
    report.seconds = trio.current_time() - started
    return report


async def preflight(
    case: Case,
    app: AppProfile,
    options: RunOptions,
    target: tuple[str, int],
    restarter: Restarter,
    say: Callable[[str], None],
) -> str | None:
    """Send the listening DUT one valid Request of ``app`` (restarted for it as for
    ``case``): why every case would be an ERROR when the DUT does not answer it with a
    startup frame (it does not listen, says nothing for ``--timeout`` seconds, closes, or
    sends bytes that do not even begin with the Reply key), else None.  A Reply or Reject,
    valid or not, passes: judging it is the cases' work (MPA-18 and on)."""
    ctx = CaseContext(case, app, options, target=target, progress=lambda line: say(f"  {line}"))
    reason: str | None = None
    try:
        await restarter.before_case(case)
        with trio.fail_after(budget(options, case)):
            s = await start(ctx)
        answer = s.answer
        if answer.kind == "silence":
            reason = f"the DUT {answer.describe()} after a valid MPA Request"
        elif answer.kind == "close":
            reason = f"the DUT {answer.describe()}"
        elif answer.bad is not None and not _keyed(answer.bad.raw):
            reason = f"the DUT answered a valid MPA Request with {answer.describe()}"
    except SetupError as exc:
        reason = str(exc)
    except trio.TooSlowError:
        reason = f"a valid MPA startup did not finish within {budget(options, case):g} s"
    finally:
        with trio.CancelScope(shield=True):
            with trio.move_on_after(5.0):
                await ctx.close()
            await restarter.after_case(case)
    return reason


def _keyed(raw: bytes) -> bool:
    """Whether ``raw`` begins as an MPA startup frame does (its key, RFC 5044 §7.1)."""
    head = raw[:MPA_KEY_LEN]
    return bool(head) and (MPA_KEY_REP.startswith(head) or MPA_KEY_REQ.startswith(head))


def _not_run(case: Case, why: str, options: RunOptions) -> CaseResult:
    """An ERROR result for a case the run did not start (the DUT cannot be reached)."""
    verdict = Verdict.broken(f"not run: {why}")
    status = status_for(case.level, verdict.outcome, strict=options.strict)
    return CaseResult(case, status, verdict, 0.0, None, options.strict)


async def _run_one(
    c: Case,
    app: AppProfile,
    options: RunOptions,
    target: tuple[str, int] | None,
    listener: trio.SocketListener | None,
    pcap_dir: Path | None,
    restarter: Restarter,
    say: Callable[[str], None],
) -> tuple[CaseResult, bool]:
    """The case's result, and whether its DUT did not listen or connect (:class:`DutAbsent`)."""
    t0 = trio.current_time()
    ctx = CaseContext(
        c,
        app,
        options,
        target=target,
        listener=listener,
        progress=lambda line: say(f"  {line}"),
        restarting=not isinstance(restarter, NoRestart),
    )
    verdict: Verdict
    absent = False
    try:
        await restarter.before_case(c)
        with trio.fail_after(budget(options, c)):
            verdict = await c.body(ctx)
    except SetupError as exc:
        verdict = Verdict.broken(str(exc))
        absent = isinstance(exc, DutAbsent)
    except trio.TooSlowError:
        verdict = Verdict.broken(f"the case did not finish within {budget(options, c):g} s")
    except Exception as exc:  # noqa: BLE001 - a runner bug ends the case, not the run
        verdict = Verdict.broken(f"runner error: {type(exc).__name__}: {exc}")
    finally:
        with trio.CancelScope(shield=True):
            with trio.move_on_after(5.0):
                await ctx.close()
    verdict = _with_capture(ctx, verdict)
    pcap = None
    if pcap_dir is not None and ctx.capture is not None:
        pcap = ctx.capture.save(pcap_dir / f"{c.id}.pcap")
    with trio.CancelScope(shield=True):
        await restarter.after_case(c)
    level = verdict.level or c.level
    status = status_for(level, verdict.outcome, strict=options.strict)
    result = CaseResult(c, status, verdict, trio.current_time() - t0, pcap, options.strict)
    return result, absent


def _with_capture(ctx: CaseContext, verdict: Verdict) -> Verdict:
    """Add the capture decoder's findings on the DUT's PDUs to the evidence of a case that
    did not pass (on a passing one they are often the case's own provocation seen from the
    other side); name the frame of a stream offset."""
    capture = ctx.capture
    if capture is None:
        return verdict
    if verdict.frame is None and verdict.stream_offset is not None:
        frame = capture.frame_of(False, verdict.stream_offset)
        verdict = Verdict(
            verdict.outcome,
            verdict.observed,
            verdict.evidence,
            verdict.rule,
            verdict.level,
            frame,
            verdict.stream_offset,
        )
    if verdict.outcome in (Outcome.NOT_MET, Outcome.BROKEN):
        try:
            findings = capture.dut_findings()
        except IwarpError as exc:  # pragma: no cover - the capture is ours
            return verdict.with_evidence(f"capture decoder: {exc}")
        lines = [str(f) for f in findings[:MAX_EVIDENCE_FINDINGS]]
        if len(findings) > MAX_EVIDENCE_FINDINGS:
            lines.append(f"... {len(findings) - MAX_EVIDENCE_FINDINGS} more findings")
        verdict = verdict.with_evidence(*lines)
    return verdict


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)
