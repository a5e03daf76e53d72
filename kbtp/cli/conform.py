"""``kbtp conform``: check a KBTP target against docs/kbtp.md §7, a verdict per status rule.

The cases are :data:`kbtp.conform.CASES`, run by :mod:`kbtp.conform_runner`; this is their
command: the target's address, the identity the runner says HELLO as (one no application
uses: the runner binds and frees its handles), a report on stdout and progress on stderr,
``--json`` and ``--junit`` for CI.  Exit status: 0 when no case failed, 1 when one did, 3
when none failed but some could not be run, 2 for bad arguments.
"""

from __future__ import annotations

import argparse
import sys
import xml.etree.ElementTree as ET
from typing import Any

from kbtp.cli.bench_connect import DEFAULT_IDENTITY, target_address
from kbtp.cli.target import (
    DEFAULT_PORT,
    add_mpa_arguments,
    identity_name,
    mpa_settings,
    run_trio,
)
from kbtp.conform import CASES
from kbtp.conform_runner import ERROR, FAIL, PASS, SKIP, Case, CaseResult, Probe, run_cases
from stack.cli import CliError, junit, one_line_errors, positive_seconds
from stack.cli.json_report import (
    add_json_argument,
    check_outputs,
    schema,
    text_to_stderr_if_json_stdout,
    write_json,
    write_outputs,
    write_text,
)

DEFAULT_TIMEOUT = 5.0
"""Seconds a case waits for each answer the target must give."""


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "conform",
        help="check a KBTP target against docs/kbtp.md: a verdict per status rule",
        description="Check a KBTP target (this project's, or another implementation) "
        "against the status rules of docs/kbtp.md §7: each case sends what one rule is "
        "about and checks the status answered, and for a session-ending status the "
        "Terminate 0/2/0xFF and close of §9.3.",
    )
    parser.add_argument(
        "items",
        nargs="*",
        metavar="HOST[:PORT] CASE",
        help=f"the target (port {DEFAULT_PORT} unless given; not with --list), then the "
        "cases to run (default all)",
    )
    parser.add_argument(
        "--identity",
        type=identity_name,
        default=DEFAULT_IDENTITY,
        metavar="NAME",
        help=f"the identity to say HELLO as (default {DEFAULT_IDENTITY}); give one no "
        "application uses: the runner binds and frees handles of its range",
    )
    parser.add_argument(
        "--timeout",
        type=positive_seconds,
        default=DEFAULT_TIMEOUT,
        metavar="S",
        help=f"seconds to wait for each answer (default {DEFAULT_TIMEOUT:g})",
    )
    parser.add_argument("--list", action="store_true", help="list the cases (no target needed)")
    add_mpa_arguments(parser, None)
    add_json_argument(parser)
    parser.add_argument(
        "--junit", metavar="FILE", help="also a JUnit XML report to FILE (- for stdout)"
    )
    one_line_errors(parser, rest_to="items")
    parser.set_defaults(func=run_conform)


def selected(names: list[str]) -> tuple[Case, ...]:
    """The cases named (all when none is); CliError naming an unknown one."""
    if not names:
        return CASES
    by_name = {case.name: case for case in CASES}
    unknown = [name for name in names if name not in by_name]
    if unknown:
        raise CliError(f"unknown case {unknown[0]!r} (kbtp conform --list shows them)")
    return tuple(case for case in CASES if case.name in names)


def run_conform(args: argparse.Namespace) -> int:
    if args.json == "-" and args.junit == "-":
        raise CliError("--json and --junit cannot both go to stdout")
    check_outputs(("--json", args.json), ("--junit", args.junit))
    if args.list:
        return _list(args)
    if not args.items:
        raise CliError("give the target's HOST[:PORT] (or --list)")
    try:
        host, port = target_address(args.items[0])
    except argparse.ArgumentTypeError as exc:
        raise CliError(f"the target: {exc}") from None
    cases = selected(args.items[1:])
    probe = Probe(host, port, args.identity, mpa_settings(args), args.timeout)
    to_stdout = "-" if "-" in (args.json, args.junit) else None
    with text_to_stderr_if_json_stdout(to_stdout):  # the text report moves to stderr
        print(f"kbtp conform: the KBTP target at {host}:{port}, as {args.identity!r}")

        def progress(result: CaseResult) -> None:
            case = result.case
            print(f"  {result.verdict:<5} {case.name:<24} {case.section:<8} {case.title}", end="")
            print(f"  ({result.seconds:.2f} s)", flush=True)
            if result.verdict != PASS:
                print(f"        observed: {result.observed}", flush=True)

        results: list[CaseResult] = []

        async def main() -> None:
            results.extend(await run_cases(probe, cases, progress))

        run_trio(main)
        counts = {v: sum(r.verdict == v for r in results) for v in (PASS, FAIL, SKIP, ERROR)}
        print(
            f"{len(results)} cases: {counts[PASS]} passed, {counts[FAIL]} failed, "
            f"{counts[SKIP]} skipped, {counts[ERROR]} errors"
        )
    status = 1 if counts[FAIL] else 3 if counts[ERROR] else 0
    write_outputs(
        (args.json, lambda path: write_json(path, _document(probe, results, status))),
        (args.junit, lambda path: write_text("--junit", path, junit_xml(probe, results))),
    )
    return status


def _list(args: argparse.Namespace) -> int:
    cases = selected(args.items)
    if args.json:
        write_json(args.json, {"schema": schema("kbtp-conform-list"), "cases": [
            _case_json(case) for case in cases
        ]})  # fmt: skip
        if args.json == "-":
            return 0
    for case in cases:
        fatal = ", ends the session" if case.fatal else ""
        print(f"{case.name:<24} {case.section:<8} {case.title}: {case.expect.name}{fatal}")
    return 0


def _case_json(case: Case) -> dict[str, Any]:
    return {
        "name": case.name,
        "section": case.section,
        "title": case.title,
        "status": case.expect.name,
        "status_code": int(case.expect),
        "fatal": case.fatal,
    }


def _document(probe: Probe, results: list[CaseResult], status: int) -> dict[str, Any]:
    ack = probe.ack
    return {
        "schema": schema("kbtp-conform"),
        "exit_status": status,
        "target": {
            "host": probe.host,
            "port": probe.port,
            "identity": probe.identity,
            "block_size_bytes": None if ack is None else ack.block_size,
            "max_inline_bytes": None if ack is None else ack.max_inline,
            "quota_blocks": None if ack is None else ack.quota,
            "request_credits": None if ack is None else ack.request_credits,
        },
        "results": [
            {
                **_case_json(r.case),
                "verdict": r.verdict,
                "observed": r.observed,
                "seconds": r.seconds,
            }
            for r in results
        ],
    }


def junit_xml(probe: Probe, results: list[CaseResult]) -> str:
    """One ``<testsuite>`` for the target, one ``<testcase>`` per case, classed by its
    section of docs/kbtp.md (:mod:`stack.cli.junit`)."""
    seconds = sum(r.seconds for r in results)
    root = ET.Element("testsuites", name="kbtp conform", time=f"{seconds:.3f}")
    name = f"kbtp conform {probe.host}:{probe.port} as {probe.identity}"
    suite = junit.testsuite(root, name, [r.verdict for r in results], seconds)
    for r in results:
        where, what = f"docs/kbtp.md {r.case.section}", f"{r.case.name} {r.case.title}"
        junit.testcase(suite, where, what, r.seconds, r.verdict, r.observed)
    return junit.document(root)


if __name__ == "__main__":  # pragma: no cover
    sys.exit("run it as: kbtp conform")
