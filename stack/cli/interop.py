"""``iwarp interop``: the siw interop suite (``--peer siw-vm``), or the conformance runner
against any device (``--peer HOST:PORT``).

``--peer HOST:PORT`` runs ``iwarp conform`` (:mod:`stack.cli.conform`) against the device
listening there (``rping -s`` or another ``--app``) and prints its report; ``--app``,
``--restart-cmd``, ``--junit``, ``--json``, ``--pcap-dir``, ``--quick`` and the CASE
selection are passed through.  ``--peer siw-vm`` (the default) runs the suite below.

The suite is the package :mod:`stack.interop.siw` with ``-m interop`` (Linux siw in a QEMU
guest), installed with the wheel and run in this process through ``pytest.main`` with a
small plugin that records each test's outcome.  Case and direction come from the test
ids: the parameter ``siw-active`` (the guest's tool opens the connection) or
``iwarp-active`` (ours does), else words of the test name (``siw_active``,
``responder``, ``siw_client_iwarp_server`` / ``siw_passive``, ``our_initiator``,
``siw_server_iwarp_client``; ``guest_to_guest`` is siw-siw); tests of the harness itself
have none (column ``harness``).

Every case saves its pcap (decoded in the test).  Without ``--capture-dir`` they go to a
temporary directory that is removed after a clean run and kept when something failed.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import io
import os
import re
import shutil
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stack.cli import CliError, one_line_errors
from stack.cli.endpoints import looks_like_endpoint
from stack.cli.json_report import check_outputs, write_json

SUITE = Path(__file__).resolve().parents[1] / "interop" / "siw"
"""The installed interop suite (pytest modules of :mod:`stack.interop.siw`)."""
PEERS = ("siw-vm",)
NO_DIRECTION = "harness"
DIRECTIONS = ("siw-active", "iwarp-active", "siw-siw", NO_DIRECTION)
"""Matrix columns, in this order (only those present are shown)."""

_NAME_DIRECTIONS = (
    (re.compile(r"guest_to_guest"), "siw-siw"),
    (re.compile(r"siw_server_iwarp_client"), "iwarp-active"),
    (re.compile(r"siw_client_iwarp_server"), "siw-active"),
    (re.compile(r"siw_active|responder"), "siw-active"),
    (re.compile(r"initiator|siw_passive|our_\w+_request|our_private_data"), "iwarp-active"),
)
"""Directions of tests whose ids do not say (names of the suite's test_mpa_siw.py etc.)."""
_NAME_NOISE = re.compile(
    r"_(?:to_siw_passive|siw_passive|siw_active|siw_server_iwarp_client|siw_client_iwarp_server)"
    r"(?=_|$)"
)
OUTCOMES = ("pass", "fail", "error", "xfail", "xpass", "skip")


@dataclass(frozen=True, slots=True)
class CaseResult:
    """One test's outcome.  Fields: nodeid, case, direction, outcome (one of
    :data:`OUTCOMES`, or 'listed' for --list), seconds, reason (first line, for
    anything but a pass)."""

    nodeid: str
    case: str
    direction: str
    outcome: str
    seconds: float = 0.0
    reason: str = ""


def split_nodeid(nodeid: str) -> tuple[str, str]:
    """(case, direction) of a pytest node id such as
    ``stack/interop/siw/test_rping_siw.py::test_rping_erc_09_p2p_rtr[write-siw-active]``."""
    name = nodeid.rsplit("::", 1)[-1]
    base, _, params = name.partition("[")
    params = params.rstrip("]")
    base = base.removeprefix("test_")
    direction = ""
    rest: list[str] = []
    for direction_id in ("siw-active", "iwarp-active"):
        if direction_id in params:
            direction = direction_id
            params = params.replace(direction_id, "")
    rest = [p for p in params.split("-") if p]
    if not direction:
        direction = next((d for word, d in _NAME_DIRECTIONS if word.search(base)), NO_DIRECTION)
        base = _NAME_NOISE.sub("", base).strip("_") or base
    case = base + (f"[{'-'.join(rest)}]" if rest else "")
    return case, direction


def first_line(text: str, width: int = 110) -> str:
    line = next((ln.strip() for ln in text.splitlines() if ln.strip()), "")
    return line if len(line) <= width else line[: width - 3] + "..."


def render_matrix(
    results: Sequence[CaseResult],
    *,
    capture_dir: str | None = None,
    wall_seconds: float | None = None,
) -> str:
    """The matrix (cases in order, one column per direction present), the reasons of
    everything that did not pass, totals and where the captures are."""
    columns = [d for d in DIRECTIONS if any(r.direction == d for r in results)]
    extra = sorted({r.direction for r in results} - set(DIRECTIONS))
    columns += extra
    cases: dict[str, dict[str, CaseResult]] = {}
    for r in results:
        cases.setdefault(r.case, {})[r.direction] = r
    width = max([len("case"), *(len(c) for c in cases)])
    cell_w = max([12, *(len(c) for c in columns)])

    def cell(r: CaseResult | None) -> str:
        if r is None:
            return "-"
        if r.outcome == "listed":
            return "listed"
        label = r.outcome.upper() if r.outcome in ("fail", "error") else r.outcome
        return f"{label} {r.seconds:.1f}s" if r.outcome in ("pass", "fail", "error") else label

    lines = ["case".ljust(width) + "  " + "  ".join(c.ljust(cell_w) for c in columns).rstrip()]
    lines.append("-" * len(lines[0]))
    for case, by_dir in cases.items():
        row = "  ".join(cell(by_dir.get(c)).ljust(cell_w) for c in columns)
        lines.append(f"{case.ljust(width)}  {row}".rstrip())
    notes = [r for r in results if r.outcome not in ("pass", "listed")]
    if notes:
        lines.append("")
        for r in notes:
            lines.append(f"{r.outcome.upper():5} {r.case} [{r.direction}]: {r.reason or '-'}")
    lines.append("")
    if all(r.outcome == "listed" for r in results):
        lines.append(f"{len(results)} tests in {len(cases)} cases (not run)")
    else:
        counts = {o: sum(r.outcome == o for r in results) for o in OUTCOMES}
        total = ", ".join(f"{n} {o}" for o, n in counts.items() if n) or "nothing ran"
        took = f" in {wall_seconds:.0f} s" if wall_seconds is not None else ""
        lines.append(f"totals: {total} ({len(results)} tests){took}")
    if capture_dir:
        lines.append(f"captures: {capture_dir}")
    return "\n".join(lines)


def failed(results: Sequence[CaseResult]) -> bool:
    return any(r.outcome in ("fail", "error") for r in results)


class _Recorder:
    """pytest plugin: one :class:`CaseResult` per test (setup, call and teardown merged)."""

    def __init__(self) -> None:
        self.order: list[str] = []
        self.phases: dict[str, list[Any]] = {}
        self.listed: list[str] = []

    def pytest_collection_finish(self, session: Any) -> None:
        self.listed = [item.nodeid for item in session.items]

    def pytest_runtest_logreport(self, report: Any) -> None:
        if report.nodeid not in self.phases:
            self.order.append(report.nodeid)
            self.phases[report.nodeid] = []
        self.phases[report.nodeid].append(report)

    def results(self) -> list[CaseResult]:
        return [self._merge(nodeid, self.phases[nodeid]) for nodeid in self.order]

    @staticmethod
    def _merge(nodeid: str, reports: list[Any]) -> CaseResult:
        case, direction = split_nodeid(nodeid)
        seconds = sum(r.duration for r in reports)
        outcome, reason = "pass", ""
        for r in reports:
            if hasattr(r, "wasxfail"):
                outcome = "xfail" if r.skipped else "xpass"
                reason = first_line(str(r.wasxfail))
            elif r.failed:
                outcome = "fail" if r.when == "call" else "error"
                crash = getattr(r.longrepr, "reprcrash", None)
                reason = first_line(crash.message if crash else str(r.longrepr))
                break
            elif r.skipped:
                outcome = "skip"
                longrepr = r.longrepr
                text = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
                reason = first_line(text.removeprefix("Skipped: "))
        return CaseResult(nodeid, case, direction, outcome, seconds, reason)


def pytest_args(args: argparse.Namespace) -> list[str]:
    marks = "interop" if args.slow else "interop and not slow"
    out = [str(SUITE), "-m", marks, "-p", "no:cacheprovider", f"--rootdir={SUITE}"]
    if args.keyword:
        out += ["-k", args.keyword]
    if args.exitfirst:
        out.append("-x")
    out += ["--collect-only", "-qq"] if args.list else ["-q", "-rN"]
    return out


CONFORM_OPTIONS = ("app", "restart_cmd", "junit", "json", "pcap_dir")
"""Options passed through to ``iwarp conform`` with ``--peer HOST:PORT``."""
REPORT_OPTIONS = ("junit", "json")
"""Of those, the reports the siw suite writes too (``--peer siw-vm``)."""
SUITE_OPTIONS = ("keyword", "capture_dir", "exitfirst")
"""Options of the siw suite only (``--peer siw-vm``)."""


def conform_argv(args: argparse.Namespace) -> list[str]:
    """The ``iwarp conform`` arguments for ``iwarp interop --peer HOST:PORT``."""
    out = [args.peer, *args.cases]
    for name in CONFORM_OPTIONS:
        value = getattr(args, name)
        if value is not None:
            out += ["--" + name.replace("_", "-"), value]
    if args.quick:
        out.append("--quick")
    if args.list:
        out = ["--list", *args.cases] + (["--app", args.app] if args.app else [])
    return out


def run_conform(args: argparse.Namespace) -> int:
    """``--peer HOST:PORT``: the conformance runner against that device, DUT listening."""
    from stack.cli import conform

    given = [f"--{n.replace('_', '-')}" for n in SUITE_OPTIONS if getattr(args, n)]
    if not args.slow:
        given.append("--no-slow")
    if given:
        raise CliError(f"{', '.join(given)}: only with --peer siw-vm (use CASE or --quick)")
    parser = argparse.ArgumentParser(prog="iwarp")
    conform.register(parser.add_subparsers())
    return int(conform.run(parser.parse_args(["conform", *conform_argv(args)])))


def run(args: argparse.Namespace) -> int:
    if looks_like_endpoint(args.peer):  # a device, not a suite
        return run_conform(args)
    if args.peer not in PEERS:
        raise CliError(
            f"unknown peer {args.peer!r}; known: {', '.join(PEERS)}, or a device as HOST:PORT"
        )
    given = [
        f"--{n.replace('_', '-')}"
        for n in CONFORM_OPTIONS
        if getattr(args, n) and n not in REPORT_OPTIONS
    ]
    given += ["--quick"] if args.quick else []
    given += ["CASE"] if args.cases else []
    if given:
        raise CliError(f"{', '.join(given)}: only with --peer HOST:PORT (use -k with siw-vm)")
    try:
        import pytest  # only here: the other iwarp tools start without it
    except ImportError:
        raise CliError(
            "the siw interop suite runs on pytest, which is not installed: "
            "pip install 'iwarp-kbtp[interop]'"
        ) from None

    recorder = _Recorder()
    if args.list:
        chatter = io.StringIO()
        with contextlib.redirect_stdout(chatter):
            code = pytest.main(pytest_args(args), plugins=[recorder])
        if code not in (0, 5):
            print(chatter.getvalue(), file=sys.stderr)
        listed = [CaseResult(n, *split_nodeid(n), "listed") for n in recorder.listed]
        print(render_matrix(listed))
        return 0 if code in (0, 5) else 1
    reports = (("--json", args.json), ("--junit", args.junit))
    check_outputs(*reports, folders=(("--capture-dir", args.capture_dir),))
    keep = args.capture_dir is not None
    capture_dir = Path(args.capture_dir or tempfile.mkdtemp(prefix="iwarp-interop-"))
    old = os.environ.get("IWARP_CAPTURE_DIR")
    os.environ["IWARP_CAPTURE_DIR"] = str(capture_dir)
    t0 = time.monotonic()
    extra = ["--junitxml", args.junit] if args.junit else []
    # with --json -, stdout carries the document alone: pytest's own lines go to stderr
    chatter_to = contextlib.redirect_stdout(sys.stderr) if args.json == "-" else None
    try:
        with chatter_to or contextlib.nullcontext():
            code = pytest.main(pytest_args(args) + extra, plugins=[recorder])
    finally:
        if old is None:
            os.environ.pop("IWARP_CAPTURE_DIR", None)
        else:
            os.environ["IWARP_CAPTURE_DIR"] = old
    results = recorder.results()
    bad = failed(results) or code not in (0, 5)
    where = str(capture_dir)
    if not keep and not bad:
        shutil.rmtree(capture_dir, ignore_errors=True)
        where = "removed after a clean run (keep them with --capture-dir DIR)"
    elif not keep:
        where += " (kept: something failed)"
    wall = time.monotonic() - t0
    out = sys.stderr if args.json == "-" else sys.stdout
    print(file=out)
    print(f"interop with Linux siw ({args.peer})", file=out)
    print(render_matrix(results, capture_dir=where, wall_seconds=wall), file=out)
    if code not in (0, 1, 5):
        print(f"pytest exit status {int(code)}", file=sys.stderr)
    if args.json:  # after the matrix: a JSON file that cannot be written loses nothing else
        write_json(args.json, results_document(results, where, wall, int(code)))
    return 1 if bad else 0


def results_document(
    results: list[CaseResult], captures: str, seconds: float, pytest_status: int
) -> dict[str, Any]:
    """The siw suite's results for ``--json``: one object per test (case, direction,
    outcome, seconds, reason), the counts per outcome and where the captures are."""
    counts = {o: sum(r.outcome == o for r in results) for o in OUTCOMES}
    return {
        "schema": "iwarp-interop-siw/1",
        "peer": "siw-vm",
        "seconds": round(seconds, 3),
        "pytest_status": pytest_status,
        "failed": failed(results) or pytest_status not in (0, 5),
        "counts": counts,
        "captures": captures,
        "cases": [dataclasses.asdict(r) for r in results],
    }


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "interop",
        help="run the interop suite against a real iWARP peer, print a result matrix",
        description="--peer siw-vm: run the installed interop suite (stack.interop.siw) "
        "against Linux siw in a QEMU guest and print case x direction x result; exit status "
        "1 if anything failed. --peer HOST:PORT: run iwarp conform against the device "
        "listening there and print its report (exit status as iwarp conform's).",
    )
    p.add_argument(
        "--peer", default="siw-vm",
        help="siw-vm (the suite, default) or HOST:PORT of a listening device (iwarp conform)",
    )  # fmt: skip
    p.add_argument(
        "cases", nargs="*", metavar="CASE",
        help="with HOST:PORT: the cases to run, as iwarp conform takes them (default all)",
    )  # fmt: skip
    p.add_argument("--app", help="with HOST:PORT: what the device runs (iwarp conform --app)")
    p.add_argument(
        "--restart-cmd", metavar="CMD",
        help="with HOST:PORT: command that (re)starts the device before each case",
    )  # fmt: skip
    p.add_argument("--junit", metavar="FILE", help="JUnit XML report to FILE")
    p.add_argument("--json", metavar="FILE", help="JSON report to FILE (- stdout)")
    p.add_argument("--pcap-dir", metavar="DIR", help="with HOST:PORT: one capture per case")
    p.add_argument(
        "--quick", action="store_true", help="with HOST:PORT: skip the cases that wait for timers"
    )
    p.add_argument("-k", dest="keyword", metavar="EXPR", help="select cases (pytest -k)")
    p.add_argument(
        "--capture-dir", metavar="DIR", help="keep each case's pcap in DIR (default: temporary)"
    )
    p.add_argument("--list", action="store_true", help="list the cases without running them")
    p.add_argument(
        "--no-slow", dest="slow", action="store_false", help="leave out slow cases (20-run race)"
    )
    p.add_argument("-x", dest="exitfirst", action="store_true", help="stop at the first failure")
    one_line_errors(p)
    p.set_defaults(func=run)
