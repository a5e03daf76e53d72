"""``iwarp conform`` against Linux siw in the QEMU guest, both roles, with pinned verdicts.

Three runs of the conformance catalog (:mod:`stack.conform`) against the guest's rdma-core
``rping`` on siw:

* ``listens``: the guest runs ``rping -s -a 0.0.0.0 -p 7174`` (restarted before every case:
  it serves one connection and exits), reached through a hostfwd; the runner is the MPA
  Initiator;
* ``connects``: the runner listens on the host's 127.0.0.1 and the guest runs
  ``rping -c -a 10.0.2.2 -p PORT -C 1`` once per case; the runner is the MPA Responder;
* ``connects-p2p``: the same with siw's ``peer_to_peer`` knob on, so siw's Request offers
  RFC 6581 peer-to-peer (Write and Read RTR); only the cases that need a peer-to-peer
  initiator (those a default siw SKIPs as "not peer-to-peer") run here.

Every case's status is compared with the pinned expectation file
(``stack/interop/siw/conform_siw_expected.json``: run -> case ID -> ``PASS``, or the
status and a one-line reason).  ``python -m stack.interop.conform_siw --pin`` boots the guest,
runs the whole catalog and rewrites that file, keeping the reasons of verdicts that did
not change; ``python -m stack.interop.conform_siw`` runs and compares.  A case that would
crash the guest kernel (:data:`EXCLUDED`) is left out, with its reason; ``--crashers``
runs it too, last.
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import trio

from stack.conform import (
    Case,
    CaseResult,
    DutRole,
    RunOptions,
    RunReport,
    SetupError,
    Status,
    case_id,
    profile,
    run_cases,
    select,
)
from stack.conform.report import report_json, report_text, summary_line
from stack.interop.conform_pins import (
    EXCLUDED_STATUS,
    EXPECTED_FILE,
    Pins,
    allowed,
    differences_message,
    load_expected,
    one_line,
    split_pin,
    unexplained,
    write_expected,
)
from stack.interop.helpers import SIW_PASSIVE_FIRST_FPDU_DELAY
from stack.siwvm import HOST_ADDR, GuestProcess, SiwVM, SiwVmError, free_port

__all__ = [
    "EXCLUDED",
    "RUNS",
    "GuestRestarter",
    "SiwRun",
    "compare",
    "pin",
    "run_all",
    "run_one",
]

GUEST_PORT = 7174
"""The guest port ``rping -s`` listens on (DUT-listening run)."""
OPTIONS = RunOptions(
    timeout=5.0,
    silence=1.0,
    startup_timeout=25.0,
    wait=20.0,
    first_fpdu_delay=SIW_PASSIVE_FIRST_FPDU_DELAY,
)
"""Timing against siw under TCG: the runner's defaults, a startup timeout above siw's
MPA timers (10 s for the Request and the Reply), a shorter wait (the restarter already
waited for rping to listen) and the first FPDU held back after siw's Reply (siw 6.1's
passive side can stall on an FPDU that follows its Reply at once)."""
LISTEN_TIMEOUT = 20.0
"""Seconds the guest's ``rping -s`` gets to listen after it was started."""
GUEST_CASE_TIMEOUT = 120.0
"""Seconds after which the guest agent kills a case's rping, whatever happens on the host."""
GUEST_LINES = 4
"""Lines of the guest rping's output added to the evidence of a case that did not pass."""
NOT_P2P = "is not peer-to-peer"
"""How a case SKIPs a DUT whose Request is not peer-to-peer: those run again with siw's
``peer_to_peer`` knob on (the ``connects-p2p`` run)."""


@dataclass(frozen=True)
class SiwRun:
    """One run of the catalog against siw.  Fields: name (the key in the expectation file),
    role (what siw does), knobs (siw's knobs for the run, on top of the upstream defaults
    with ``zcopy_tx=N``), command (the guest's rping; ``{host}``/``{port}`` filled in),
    about (one line for the report)."""

    name: str
    role: DutRole
    knobs: Mapping[str, bool | int | str]
    command: str
    about: str


RUNS = (
    SiwRun(
        "listens",
        DutRole.LISTENS,
        {},
        "exec rping -s -a 0.0.0.0 -p {port}",
        "siw listens: the guest's rping -s, restarted for each case",
    ),
    SiwRun(
        "connects",
        DutRole.CONNECTS,
        {},
        "exec rping -c -a {host} -p {port} -C 1",
        "siw connects: the guest's rping -c -C 1, once per case",
    ),
    SiwRun(
        "connects-p2p",
        DutRole.CONNECTS,
        {"p2p": True},
        "exec rping -c -a {host} -p {port} -C 1",
        "siw connects peer-to-peer (peer_to_peer=Y: Write|Read RTR offered), once per case",
    ),
)
"""The runs, in order; ``connects-p2p`` takes the cases ``connects`` SKIPped as not
peer-to-peer."""

EXCLUDED: dict[tuple[str, str], str] = {
    ("listens", "ERC-08"): "excluded: Linux 6.1 iw_cm BUG() (iwcm.c:969 cm_close_handler): "
    "passive siw, waiting for a peer-to-peer RTR, gets the Terminate 2/0/0x07 the runner "
    "must send when siw's Reply flags no Send RTR (RFC 6581 §9.2)",
    ("connects", case_id("MPA-21", 7)): "excluded: Linux 6.1 siw oopses on a Reply with "
    "PD_Length 513 (NULL pointer dereference in kmemdup from iw_cm's cm_event_handler, called "
    "by siw_cm_upcall for the failed CONNECT_REPLY with the too-long length and no private "
    "data); siw's CM workqueue is dead afterwards",
}
"""(run, case ID) -> why the case is not run against siw: it breaks the guest kernel.
``python -m stack.interop.conform_siw --crashers`` runs each on a guest of its own."""


OOPS = re.compile(r"cut here|kernel BUG|BUG: |Oops|WARNING: CPU")
"""A guest kernel BUG, oops or WARN on the serial console."""


class GuestRestarter:
    """A :class:`~stack.conform.runner.Restarter` that starts the case's rping in the guest
    before each case and stops it after the case.

    With ``listen_port`` (siw listens) it waits until the guest listens there before the
    case (a QEMU hostfwd accepts a connection even when nothing listens in the guest) and,
    after the case, until the port is closed again.  Each case's rping output (its last
    lines) is kept in :attr:`history`, and the kernel oopses the guest's console showed
    during a case in :attr:`oopses`; after an oops the guest is not trusted any more, so
    every later case is an ERROR.
    """

    def __init__(
        self,
        vm: SiwVM,
        command: str,
        *,
        listen_port: int | None = None,
        log: Callable[[str], None] = lambda line: None,
    ) -> None:
        self.vm = vm
        self.command = command
        self.listen_port = listen_port
        self.log = log
        self.history: dict[str, tuple[int | None, list[str]]] = {}
        self.oopses: dict[str, list[str]] = {}
        self._proc: GuestProcess | None = None
        self._console_at = 0

    async def before_case(self, case: Case) -> None:
        await trio.to_thread.run_sync(self._start)

    async def after_case(self, case: Case) -> None:
        proc, self._proc = self._proc, None
        if proc is not None:
            self.history[case.id] = await trio.to_thread.run_sync(self._stop, proc)
        oops = self._new_oopses()
        if oops:
            self.oopses[case.id] = oops

    def _start(self) -> None:
        if self.oopses:
            first = next(iter(self.oopses))
            raise SetupError(f"not run: the guest kernel oopsed in {first} earlier in this run")
        if not self.vm.running:
            raise SetupError("the siw guest is not running:\n" + self.vm.console_tail(20))
        self._console_at = _size(self.vm.console_path)
        self.log(f"guest: {self.command}")
        try:
            self._proc = self.vm.run(self.command, background=True, timeout=GUEST_CASE_TIMEOUT)
            if self.listen_port is not None:
                self.vm.wait_listen(self.listen_port, LISTEN_TIMEOUT)
        except SiwVmError as exc:
            raise SetupError(f"the guest's rping did not start: {exc}") from None

    def _stop(self, proc: GuestProcess) -> tuple[int | None, list[str]]:
        try:
            rc = proc.poll()
            if rc is None:
                proc.stop(2.0)
            output = proc.output()
            if self.listen_port is not None:
                deadline = time.monotonic() + LISTEN_TIMEOUT
                while self.vm.listening(self.listen_port) and time.monotonic() < deadline:
                    time.sleep(0.1)
        except SiwVmError as exc:
            return None, [f"the guest did not answer: {exc}"]
        return rc, [line for line in output.splitlines() if line.strip()][-GUEST_LINES:]

    def _new_oopses(self) -> list[str]:
        try:
            with open(self.vm.console_path, "rb") as f:
                f.seek(self._console_at)
                text = f.read().decode(errors="replace")
        except OSError:
            return []
        return [line.strip() for line in text.splitlines() if OOPS.search(line)]


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def cases_of(run: SiwRun, patterns: Sequence[str] = ()) -> list[Case]:
    """The catalog's cases for ``run``'s role with ``--app rping``, in catalog order."""
    return select(patterns, role=run.role, app="rping")


@dataclass
class RunOutcome:
    """One run against siw: its report (every result's evidence has the guest rping's last
    lines when it did not pass) and the guest kernel oopses, by case ID."""

    report: RunReport
    oopses: dict[str, list[str]]


async def run_one(
    vm: SiwVM,
    run: SiwRun,
    cases: Sequence[Case],
    *,
    pcap_dir: Path | None = None,
    progress: Callable[[str], None] = lambda line: None,
) -> RunOutcome:
    """Run ``cases`` against siw as ``run`` says (its knobs set first)."""
    await trio.to_thread.run_sync(lambda: vm.reset_siw(zcopy_tx=False, **run.knobs))
    app = profile("rping")
    if run.role is DutRole.LISTENS:
        host_port = await trio.to_thread.run_sync(vm.hostfwd, GUEST_PORT)
        restarter = GuestRestarter(
            vm, run.command.format(port=GUEST_PORT), listen_port=GUEST_PORT, log=progress
        )
        report = await run_cases(cases, app, OPTIONS, target=("127.0.0.1", host_port),
                                 pcap_dir=pcap_dir, restarter=restarter,
                                 progress=progress)  # fmt: skip
    else:
        port = free_port()
        command = run.command.format(host=HOST_ADDR, port=port)
        restarter = GuestRestarter(vm, command, log=progress)
        report = await run_cases(cases, app, OPTIONS, listen=("127.0.0.1", port),
                                 pcap_dir=pcap_dir, restarter=restarter,
                                 progress=progress)  # fmt: skip
    report.results[:] = [_with_guest(r, restarter) for r in report.results]
    return RunOutcome(report, dict(restarter.oopses))


def _with_guest(r: CaseResult, restarter: GuestRestarter) -> CaseResult:
    """``r`` with what the guest said about its case (non-PASS only): rping's last lines
    and the kernel's oops lines."""
    if r.status is Status.PASS and r.case.id not in restarter.oopses:
        return r
    lines = [f"guest kernel: {line}" for line in restarter.oopses.get(r.case.id, [])[:GUEST_LINES]]
    rc, output = restarter.history.get(r.case.id, (None, []))
    if output:
        label = "siw's rping" if rc is None else f"siw's rping (exit {rc})"
        lines += [f"{label}: {line}" for line in output]
    return replace(r, verdict=r.verdict.with_evidence(*lines)) if lines else r


@dataclass
class SiwResults:
    """A siw conformance session: the reports by run name, the cases left out (run -> case
    ID -> why), the guest kernel oopses (run -> case ID -> console lines), the (run, case
    ID) pairs ``quick`` left out, the runs attempted, and how long it took."""

    reports: dict[str, RunReport] = field(default_factory=dict)
    excluded: dict[str, dict[str, str]] = field(default_factory=dict)
    oopses: dict[str, dict[str, list[str]]] = field(default_factory=dict)
    left_out: set[tuple[str, str]] = field(default_factory=set)
    runs: list[str] = field(default_factory=list)
    seconds: float = 0.0


async def run_all(
    vm: SiwVM,
    *,
    role: DutRole | None = None,
    quick: bool = False,
    patterns: Sequence[str] = (),
    pcap_dir: Path | None = None,
    progress: Callable[[str], None] = lambda line: None,
) -> SiwResults:
    """Every run of :data:`RUNS` against siw (with ``role``: the runs where siw does that),
    without the :data:`EXCLUDED` cases; ``quick`` leaves out the cases that wait for siw's
    MPA timers.  A run in which the guest kernel oopsed ends the session (the later runs
    are not run)."""
    out = SiwResults()
    t0 = time.monotonic()
    p2p_cases: list[Case] = []
    for run in RUNS:
        if role is not None and run.role is not role:
            continue
        out.runs.append(run.name)
        if run.name == "connects-p2p":
            cases = p2p_cases
        else:
            cases = cases_of(run, patterns)
            out.left_out |= {(run.name, c.id) for c in cases if quick and c.slow}
            cases = [c for c in cases if (run.name, c.id) not in out.left_out]
        left = {c.id: EXCLUDED[(run.name, c.id)] for c in cases if (run.name, c.id) in EXCLUDED}
        if left:
            out.excluded[run.name] = left
        cases = [c for c in cases if c.id not in left]
        if not cases:
            continue
        progress(f"== {run.name}: {run.about} ({len(cases)} cases)")
        outcome = await run_one(vm, run, cases, pcap_dir=_pcaps(pcap_dir, run.name),
                                progress=progress)  # fmt: skip
        out.reports[run.name] = outcome.report
        if outcome.oopses:
            out.oopses[run.name] = outcome.oopses
            break
        if run.name == "connects":
            p2p_cases = [
                r.case
                for r in outcome.report.results
                if r.status is Status.SKIP and NOT_P2P in r.verdict.observed
            ]
    out.seconds = time.monotonic() - t0
    return out


async def run_excluded(
    boot: Callable[[], SiwVM],
    *,
    pcap_dir: Path | None = None,
    progress: Callable[[str], None] = lambda line: None,
) -> list[tuple[str, RunOutcome]]:
    """Each :data:`EXCLUDED` case on a guest of its own (``boot()`` gives a started one,
    stopped afterwards): its result and the oops it causes, by run name."""
    out = []
    by_name = {run.name: run for run in RUNS}
    for (name, cid), why in EXCLUDED.items():
        progress(f"== {name} {cid} on a guest of its own ({why})")
        vm = await trio.to_thread.run_sync(boot)
        try:
            cases = [c for c in cases_of(by_name[name], [cid]) if c.id == cid]
            outcome = await run_one(vm, by_name[name], cases, pcap_dir=_pcaps(pcap_dir, name),
                                    progress=progress)  # fmt: skip
        finally:
            await trio.to_thread.run_sync(vm.stop)
        out.append((name, outcome))
    return out


def _pcaps(pcap_dir: Path | None, name: str) -> Path | None:
    return pcap_dir / name if pcap_dir is not None else None


# ======================================================================================
# Comparing with the pinned verdicts, pinning them
# ======================================================================================


def compare(results: SiwResults, expected: Pins, *, complete: bool = True) -> list[str]:
    """What differs between ``results`` and the pinned ``expected`` verdicts, one line each
    (empty: they agree).  A case without a pinned entry is a difference, and so is a guest
    kernel oops; with ``complete``, so is a pinned case of an attempted run that did not run
    (removed from the catalog, or not reached), unless ``results`` left it out on purpose
    (``quick``)."""
    problems: list[str] = []
    for name, oopses in results.oopses.items():
        for cid, lines in oopses.items():
            problems.append(
                f"{name} {cid}: the guest kernel oopsed ({lines[0]}); if siw cannot take the "
                "case, add it to EXCLUDED in stack/interop/conform_siw.py with the reason"
            )
    for name, report in results.reports.items():
        pinned = expected.get(name, {})
        for r in report.results:
            if r.case.id not in pinned:
                problems.append(f"{name} {r.case.id}: {r.status.value}, not pinned (a new case)")
                continue
            status, reason = split_pin(pinned[r.case.id])
            if r.status.value not in allowed(status):
                problems.append(
                    f"{name} {r.case.id}: {r.status.value}, pinned {status}"
                    + (f" ({reason})" if reason else "")
                    + f"; observed: {one_line(r.verdict.observed)}"
                )
    if complete:
        ran = {(n, r.case.id) for n, rep in results.reports.items() for r in rep.results}
        for name, pinned in expected.items():
            if name not in results.runs:
                continue
            for cid, entry in pinned.items():
                key = (name, cid)
                if key in ran or key in results.left_out:
                    continue
                status = split_pin(entry)[0]
                if status == EXCLUDED_STATUS and key in EXCLUDED:
                    continue
                problems.append(f"{name} {cid}: pinned {status} but did not run")
        for name, cid in EXCLUDED:
            pinned_as = split_pin(expected.get(name, {}).get(cid, ""))[0]
            if name in results.runs and pinned_as != EXCLUDED_STATUS:
                problems.append(f"{name} {cid}: excluded but not pinned as {EXCLUDED_STATUS}")
    return problems


def pin(results: SiwResults, old: Pins) -> Pins:
    """The pinned verdicts of ``results``, in catalog order: a non-PASS keeps the reason
    pinned before if its status did not change, else gets the runner's observation
    (``observed: ...``) until someone explains it; :data:`EXCLUDED` cases with their reason."""
    out: Pins = {}
    for name, report in results.reports.items():
        entries = out.setdefault(name, {})
        for r in report.results:
            status = r.status.value
            before, reason = split_pin(old.get(name, {}).get(r.case.id, ""))
            if "|" in before and status in allowed(before):
                entries[r.case.id] = old[name][r.case.id]  # a varying verdict stays as pinned
                continue
            if r.status is Status.PASS:
                entries[r.case.id] = status
                continue
            if before != status or not reason:
                reason = f"observed: {one_line(r.verdict.observed)}"
            entries[r.case.id] = f"{status}: {reason}"
    for (name, cid), why in EXCLUDED.items():
        out.setdefault(name, {})[cid] = f"{EXCLUDED_STATUS}: {why}"
    order = {c.id: i for i, c in enumerate(select())}
    return {
        name: dict(sorted(entries.items(), key=lambda kv: order.get(kv[0], len(order))))
        for name, entries in out.items()
    }


def summary(results: SiwResults) -> str:
    """One summary line per run, and the excluded cases."""
    lines = [
        f"{name:<13} {summary_line(report.results, report.seconds)}"
        for name, report in results.reports.items()
    ]
    for name, excluded in results.excluded.items():
        lines += [f"{name:<13} excluded {cid}: {why}" for cid, why in excluded.items()]
    return "\n".join(lines)


def write_reports(results: SiwResults, directory: Path) -> list[Path]:
    """Each run's text and JSON report, ``DIRECTORY/<run>.txt`` and ``.json``."""
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, report in results.reports.items():
        for suffix, text in ((".txt", report_text(report)), (".json", report_json(report))):
            path = directory / f"{name}{suffix}"
            path.write_text(text)
            paths.append(path)
    return paths


# ======================================================================================
# python -m stack.interop.conform_siw
# ======================================================================================


def main(argv: Iterable[str] | None = None) -> int:
    """Boot the siw guest, run the catalog both ways, compare with (or ``--pin``) the file."""
    p = argparse.ArgumentParser(
        prog="python -m stack.interop.conform_siw",
        description="iwarp conform against Linux siw in the QEMU guest (both roles); compare "
        "each verdict with the pinned file, or rewrite it with --pin.",
    )
    p.add_argument("cases", nargs="*", metavar="CASE", help="only these cases (as iwarp conform)")
    p.add_argument("--pin", action="store_true", help=f"rewrite {EXPECTED_FILE.name}")
    p.add_argument("--quick", action="store_true", help="leave out the cases that wait for timers")
    p.add_argument(
        "--crashers", action="store_true",
        help="also run each excluded case, on a guest of its own (it breaks the guest kernel)",
    )  # fmt: skip
    p.add_argument("--reports", metavar="DIR", help="write each run's text and JSON report")
    p.add_argument("--pcap-dir", metavar="DIR", help="keep one capture per case")
    p.add_argument("--expected", metavar="FILE", default=str(EXPECTED_FILE), help="the file")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress lines")
    args = p.parse_args(list(argv) if argv is not None else None)
    if args.pin and (args.quick or args.cases):
        p.error("--pin runs the whole catalog: no CASE or --quick")
    say = (lambda line: None) if args.quiet else _stderr
    pcap_dir = Path(args.pcap_dir) if args.pcap_dir else None
    try:
        vm = _boot(say)
    except SiwVmError as exc:
        print(f"the siw guest did not come up: {exc}", file=sys.stderr)
        return 2
    try:
        results = trio.run(
            lambda: run_all(
                vm, quick=args.quick, patterns=args.cases, pcap_dir=pcap_dir, progress=say
            )  # fmt: skip
        )
    finally:
        vm.stop()
    for report in results.reports.values():
        print(report_text(report))
    print(summary(results))
    if args.crashers:
        crashed = trio.run(lambda: run_excluded(lambda: _boot(say), pcap_dir=pcap_dir,
                                                progress=say))  # fmt: skip
        for name, outcome in crashed:
            print(f"\n{name}, on a guest of its own:\n{report_text(outcome.report)}")
    if args.reports:
        for path in write_reports(results, Path(args.reports)):
            say(f"wrote {path}")
    expected_path = Path(args.expected)
    old = load_expected(expected_path)
    problems = compare(results, old, complete=not args.cases)
    if args.pin:
        if results.oopses:
            print("\n".join(p for p in problems if "oopsed" in p))
            print("not pinned: the guest kernel oopsed")
            return 1
        runs = pin(results, old)
        write_expected(runs, expected_path)
        print(f"pinned {sum(len(c) for c in runs.values())} verdicts in {expected_path}")
        for line in unexplained(runs):
            print(f"  unexplained (give it a reason in the file): {line}")
        return 0
    if problems:
        print(differences_message(problems, expected_path))
        return 1
    print(f"every verdict as pinned in {expected_path}")
    return 0


def _boot(say: Callable[[str], None]) -> SiwVM:
    from stack.siwvm import build

    vm = SiwVM(build(progress=say))
    try:
        vm.start()
    except BaseException:
        vm.stop()
        raise
    say(f"siw guest up in {vm.boot_seconds:.1f} s (accel {vm.accel})")
    return vm


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


if __name__ == "__main__":
    raise SystemExit(main())
