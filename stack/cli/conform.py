"""``iwarp conform``: conformance-test an iWARP device under test (DUT) over TCP, h2spec style.

``iwarp conform HOST:PORT [CASE ...] --app rping``: the DUT listens (``rping -s``...); the
runner connects as MPA Initiator, provokes each rule and prints PASS, FAIL, WARN, SKIP or
ERROR per case.  ``iwarp conform --listen [HOST:]PORT --app rping``: the DUT connects
(``rping -c``) once per case and the runner is the MPA Responder.  ``--list`` prints the
cases without a DUT.  The logic is in :mod:`stack.conform`; docs/conform.md is the guide.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from stack.cli import (
    CliError,
    address,
    endpoints,
    one_line_errors,
    positive_seconds,
    seconds,
    trio_run,
)
from stack.cli.json_report import check_outputs, output_error, write_outputs, write_text

EPILOG = """\
CASE selects cases: a case ID (as --list shows them), a rule ID (MPA-12: all its cases), a
family (MPA, ERC) or a section (5044/7.1.2, RFC6581/9.2).  Exit status: 0 when no case failed,
1 when one did (a MUST; a SHOULD too with --strict), 3 when none failed but some could
not be run (ERROR), 2 for bad arguments."""


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "conform",
        help="conformance-test an iWARP device (MPA, DDP, RDMAP, RFC 7306, RFC 5042), h2spec style",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "items",
        nargs="*",
        metavar="[HOST:PORT] CASE",
        help="the listening DUT (unless --listen or --list), then cases to run (default all)",
    )
    p.add_argument(
        "--app",
        default="rping",
        help="what the DUT runs: rping, perftest, rdma_server, kbtp or bench (default rping)",
    )
    p.add_argument(
        "--listen",
        type=address,
        metavar="[HOST:]PORT",
        help="the DUT connects: listen here and run the DUT-connecting cases",
    )
    p.add_argument("--list", action="store_true", help="list the cases (no DUT needed)")
    p.add_argument("--markdown", action="store_true", help="with --list: Markdown tables")
    p.add_argument(
        "--json", metavar="FILE", help="JSON report (or, with --list, list) to FILE; - is stdout"
    )
    p.add_argument("--junit", metavar="FILE", help="JUnit XML report to FILE")
    p.add_argument("--pcap-dir", metavar="DIR", help="keep one capture per case in DIR")
    p.add_argument("--strict", action="store_true", help="count SHOULDs not met as failures")
    p.add_argument(
        "--timeout", type=positive_seconds, default=5.0, metavar="S",
        help="seconds to wait for an answer the DUT must give (default 5)",
    )  # fmt: skip
    p.add_argument(
        "--silence", type=positive_seconds, default=1.0, metavar="S",
        help="seconds of quiet that count as 'the DUT sent nothing' (default 1)",
    )  # fmt: skip
    p.add_argument(
        "--startup-timeout", type=positive_seconds, default=20.0, metavar="S",
        help="seconds the DUT's MPA startup timer may take to give up (default 20)",
    )  # fmt: skip
    p.add_argument(
        "--wait", type=positive_seconds, default=60.0, metavar="S",
        help="seconds to wait for the DUT to listen again or to connect (default 60)",
    )  # fmt: skip
    p.add_argument(
        "--first-fpdu-delay", type=seconds, default=0.0, metavar="S",
        help="hold the runner's first FPDU S seconds after the DUT's Reply (for passive "
        "sides that stall on an FPDU right after their Reply, as siw 6.1 does; default 0)",
    )  # fmt: skip
    p.add_argument(
        "--restart-cmd", metavar="CMD",
        help="shell command run before each case (ended after it if still running), e.g. "
        "'rping -s -a {host} -p {port}'",
    )  # fmt: skip
    p.add_argument("--quick", action="store_true", help="skip the cases that wait for timers")
    p.add_argument(
        "--no-preflight", dest="preflight", action="store_false",
        help="run every case even when the listening DUT answers a first valid MPA Request "
        "with no startup frame (by default that reports every case as not run, at once)",
    )  # fmt: skip
    p.add_argument("-v", "--verbose", action="store_true", help="evidence of passing cases too")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress lines on stderr")
    one_line_errors(p, rest_to="items")
    p.set_defaults(func=run)


def parse_endpoint(text: str, *, default_host: str = "", connect: bool = False) -> tuple[str, int]:
    """``host:port``, ``[v6]:port`` or (``default_host`` given) ``port``
    (:func:`stack.cli.endpoints.parse_endpoint`); to ``connect`` to, not port 0."""
    try:
        return endpoints.parse_endpoint(text, default_host=default_host or None, connect=connect)
    except endpoints.EndpointError as exc:
        raise CliError(str(exc)) from None


def run(args: argparse.Namespace) -> int:
    from stack.conform.apps import APPS, profile
    from stack.conform.context import RunOptions
    from stack.conform.model import DutRole, exit_status
    from stack.conform.registry import SelectionError, select

    if args.app not in APPS:
        raise CliError(f"unknown --app {args.app!r} (one of {', '.join(APPS)})")
    items = list(args.items)
    target = None
    if not args.list and args.listen is None:
        if not items or not endpoints.looks_like_endpoint(items[0]):
            raise CliError("give HOST:PORT of the listening DUT, --listen [HOST:]PORT, or --list")
        target = parse_endpoint(items.pop(0), connect=True)
    listen = parse_endpoint(args.listen, default_host="0.0.0.0") if args.listen else None
    role = (
        None
        if args.list and not args.listen
        else (DutRole.CONNECTS if listen is not None else DutRole.LISTENS)
    )
    try:
        cases = select(items, role=role, app=None if args.list else args.app)
    except SelectionError as exc:
        raise CliError(str(exc)) from None
    if args.quick:
        cases = [c for c in cases if not c.slow]
    if args.list:
        return _list(cases, args)
    if not cases:
        raise CliError("no case to run (the selection has none for this DUT role and app)")
    check_outputs(
        ("--json", args.json), ("--junit", args.junit), folders=(("--pcap-dir", args.pcap_dir),)
    )
    options = RunOptions(
        timeout=args.timeout,
        silence=args.silence,
        startup_timeout=args.startup_timeout,
        wait=args.wait,
        strict=args.strict,
        first_fpdu_delay=args.first_fpdu_delay,
        preflight=args.preflight,
    )
    report = trio_run(_run, cases, profile(args.app), options, target, listen, args)
    _write_reports(report, args)
    return exit_status(report.results)


async def _run(cases: Any, app: Any, options: Any, target: Any, listen: Any, args: Any) -> Any:
    from stack.conform.runner import CommandRestarter, run_cases

    say = (lambda line: None) if args.quiet else _stderr
    restarter = None
    if args.restart_cmd:
        host, port = target or listen
        restarter = CommandRestarter(args.restart_cmd, host=host or "127.0.0.1", port=port, log=say)
    try:
        return await run_cases(
            cases,
            app,
            options,
            target=target,
            listen=listen,
            pcap_dir=Path(args.pcap_dir) if args.pcap_dir else None,
            restarter=restarter,
            progress=say,
        )
    except OSError as exc:
        if exc.filename is not None:  # a case's capture, not saved in --pcap-dir
            raise output_error("--pcap-dir", args.pcap_dir, exc) from None
        where = f"cannot listen on {args.listen}: " if args.listen else ""
        raise CliError(f"{where}{exc.strerror or exc}") from None


def _list(cases: Any, args: argparse.Namespace) -> int:
    from stack.conform.report import case_list_json, case_list_markdown, case_list_text

    if args.json:
        write_text("--json", args.json, case_list_json(cases))
    elif args.markdown:
        print(case_list_markdown(cases), end="")
    else:
        print(case_list_text(cases), end="")
    return 0


def _write_reports(report: Any, args: argparse.Namespace) -> None:
    from stack.conform.report import junit_xml, report_json, report_text

    if args.json != "-":
        print(report_text(report, verbose=args.verbose), end="")
    write_outputs(
        (args.json, lambda path: write_text("--json", path, report_json(report))),
        (args.junit, lambda path: write_text("--junit", path, junit_xml(report))),
    )


def _stderr(line: str) -> None:
    print(f"iwarp conform: {line}", file=sys.stderr, flush=True)
