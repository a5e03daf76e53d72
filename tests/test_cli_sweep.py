"""Every option of every ``iwarp`` / ``kbtp`` subcommand, given bad values, fails the same way.

The subcommands and their options are discovered from the parsers (:func:`stack.cli.build_parser`
over the command tables).  Each option that takes a value gets the bad values of its kind
(a non-number, an empty string, a negative number, 0 where a count is meant, a port out of
range, an unknown choice, a missing input file; for a number NaN, infinity, 1e30 and a huge
number where a bound is documented); each run must exit with status 2, print nothing on
stdout and exactly one line ``<prog> <sub>: error: ...`` on stderr, never a traceback.  Runs
are in-process through ``main(argv)``; anything that would start the real work
(``trio.run``, a subprocess, ``pytest.main``) is stopped, so a value that slips through is a
failure here rather than a network operation.  Every option that writes a file or fills a
folder is given paths that cannot take it, and must refuse them the same way before any
work.  A few subprocess runs check the same from the outside.

A second sweep checks the help: every subcommand has a one-line ``help``, and every option
with a default shows it in its help text ("(default X)").
"""

from __future__ import annotations

import argparse
import importlib
import os
import re
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

import pytest

from kbtp.cli import COMMANDS as KBTP_COMMANDS
from stack.cli import build_parser
from stack.cli.iwarp import COMMANDS as IWARP_COMMANDS

REPO = Path(__file__).resolve().parents[1]
PCAP = REPO / "pcaps" / "ops-rev2-crc.pcap"
TABLES: Mapping[str, tuple[str, Mapping[str, str]]] = {
    "iwarp": ("stack.cli.iwarp", IWARP_COMMANDS),
    "kbtp": ("kbtp.cli", KBTP_COMMANDS),
}
MISSING_FILE = "no-such-dir/no-such-file.pcap"
ADDRESS_DESTS = frozenset({"host", "addr", "bind", "server", "source", "peer", "connect", "listen"})
"""Options naming an address: an empty one is an error (an unset shell variable), not 'any'."""
ZERO_OK = {
    "first_fpdu_delay": "a delay: 0 sends the first FPDU at once",
    "max_private_data": "a limit: 0 allows no private data",
}
"""Numeric options (by dest) for which 0 is a meaning, not a mistake, and why; options whose
help mentions 0 ("0: any free") need no entry."""
CONTEXT = {
    "iwarp rdma-client": ["-s", "127.0.0.1"],
    "iwarp dissect": [str(PCAP)],
    "iwarp rping": ["-s"],
    "iwarp cmatose": ["-C", "0"],  # -c alone, not through -c x -C
}
"""Arguments a subcommand needs besides the one under test (so the error is about that one)."""
NUMERIC_PROBES = ("1", "2", "128", "1024", "65483", "1.5")
NOT_FINITE = ("nan", "inf", "1e30")
"""Refused by every numeric option of ``iwarp`` and ``kbtp`` (an integer type refuses them as
not integers)."""
HUGE = "99999999999999999999"
BOUNDED: Mapping[str, Mapping[str, str]] = {
    "iwarp": {
        "iters": "a benchmark's -n: a latency run keeps every sample",
        "duration": "a benchmark's -D: seconds of measuring per size, samples kept",
        "repeat": "runs of each size",
        "mib": "bench codec: MiB encoded per figure",
        "messages": "cmatose -C: a receive buffer and two CQ entries per message",
        "connections": "cmatose -c: a QP and a descriptor at each end, made one at a time",
        "qps": "bench -q, idle-qps -q: a TCP connection each, from one address to one port",
        "qp": "the perftest peers' -q: as bench -q",
        "tx_depth": "-t: WRs outstanding per QP, the QP's queue and CQ sized by it",
        "post_list": "-l: WRs per post, at most the tx depth",
        "cq_mod": "-Q: signalling period, at most the tx depth",
        "rx_depth": "receives kept posted per QP (the bench server takes at most 2^20)",
        "outs": "perftest -o: Reads outstanding, the device's IRD/ORD",
        "parallel": "idle-qps --parallel: startups from one address the listener holds",
        "iwarp rping count": "rping -C: rping's own int (0 still pings for ever)",
        "smp": "siwvm --smp: the vCPUs QEMU's pc machine takes",
        "emss": "--emss: TCP's MSS option is 16 bits (stack.cli.emss)",
        "batch": "bench floor --batch: messages per send, as many as -t (MAX_DEPTH)",
        "fpdus": "bench dissect --fpdus: FPDUs of the generated capture, 840 octets each on disk",
        "rss_fpdus": "bench dissect --rss-fpdus: FPDUs of the memory check's capture, as --fpdus",
    },
    "kbtp": {  # kbtp/cli/bounds.py, docs/kbtp.md §11
        "inflight": "kbtp bench -t: a Request Credit each (16-bit field)",
        "iters": "kbtp bench -n: one block of the pool per ALLOC_STORE",
        "bytes": "kbtp bench --bytes: octets a row moves",
        "repeat": "runs of each row",
        "initiators": "sessions (demo -n) or identities (target --initiators) made up front",
        "block_size": "the Block Size an initiator accepts from HELLO_ACK",
        "max_inline": "at most the largest Block Size",
        "credits": "Request Credits: HELLO_ACK's 16-bit field",
        "pool_blocks": "blocks of the pool, each a ring slot and table entries",
        "handles": "block table entries, initialized one at a time",
        "emss": "--emss: TCP's MSS option is 16 bits (stack.cli.emss)",
    },
}
"""Numeric options (by command, then dest, or ``"<prog> <dest>"`` where the dest is bounded
in that subcommand only) with an upper bound, shown in their help ("at most N"), and why:
:data:`HUGE` must be refused."""
KNOWN_UNSTATED_BOUNDS: dict[str, str] = {}
"""Bounded options whose help does not say the bound yet, and why (strict xfail)."""

KNOWN_BAD_VALUES: dict[str, str] = {}
"""``"<prog> <option>"`` -> reason: options of files outside this change that do not yet fail
cleanly (strict xfail: the fix turns the entry into a failure, so it is removed with it)."""
KNOWN_GROUP_ERRORS: dict[str, str] = {}
"""Parsers of subcommands (``iwarp bench ...``) whose unknown-choice error is not one line."""
KNOWN_MISSING_DEFAULTS: dict[str, str] = {}
"""``"<prog> <option>"`` -> reason: options of other files whose help does not show the default."""
DEFAULT_NOT_SHOWN = {
    "iwarp interop --no-slow": "a --no-X flag: its name says X is the default",
}
"""Options whose default is deliberately not spelled "(default X)", and why."""


# ---------------------------------------------------------------------------- discovery
@dataclass(frozen=True)
class Leaf:
    """A runnable subcommand: its parser and the argv words that reach it."""

    command: str
    words: tuple[str, ...]
    parser: argparse.ArgumentParser


def _subparsers(parser: argparse.ArgumentParser) -> list[argparse._SubParsersAction]:
    return [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]


def _walk(
    command: str, parser: argparse.ArgumentParser, words: tuple[str, ...]
) -> Iterator[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    subs = _subparsers(parser)
    if not subs:
        yield words, parser
    for action in subs:
        for name, child in action.choices.items():
            yield from _walk(command, child, (*words, name))


def _groups() -> Iterator[tuple[str, tuple[str, ...], argparse._SubParsersAction]]:
    """(command, words, subparsers action) of every parser that has subcommands."""

    def walk(
        command: str, parser: argparse.ArgumentParser, words: tuple[str, ...]
    ) -> Iterator[tuple[str, tuple[str, ...], argparse._SubParsersAction]]:
        for action in _subparsers(parser):
            yield command, words, action
            for name, child in action.choices.items():
                yield from walk(command, child, (*words, name))

    for command, (_module, table) in TABLES.items():
        yield from walk(command, build_parser(command, "sweep", table), ())


def leaves() -> list[Leaf]:
    out = []
    for command, (_module, table) in TABLES.items():
        for words, parser in _walk(command, build_parser(command, "sweep", table), ()):
            out.append(Leaf(command, words, parser))
    return out


LEAVES = leaves()


def _takes_value(action: argparse.Action) -> bool:
    return action.nargs != 0 and not isinstance(
        action, argparse._HelpAction | argparse._VersionAction | argparse._SubParsersAction
    )


def _converts(action: argparse.Action, text: str) -> object:
    """``action.type(text)``, or the exception it raised."""
    convert: Callable[[str], object] = action.type or str  # type: ignore[assignment]
    try:
        return convert(text)
    except (argparse.ArgumentTypeError, ValueError, TypeError) as exc:
        return exc


def _numeric(action: argparse.Action) -> bool:
    if action.type in (int, float):
        return True
    if action.type is None or action.choices is not None:
        return False
    return any(
        isinstance(v, int | float) and not isinstance(v, bool)
        for v in (_converts(action, p) for p in NUMERIC_PROBES)
    )


def _input_file(action: argparse.Action) -> bool:
    words = ("write", "report", "keep", "to FILE", "record", "capture file", "--out")
    return action.metavar == "FILE" and not any(w in (action.help or "") for w in words)


def bad_values(action: argparse.Action) -> list[str]:
    """The values of ``action``'s kind that a command must refuse."""
    if action.choices is not None:
        return ["no-such-choice", ""]
    if _numeric(action):
        values = ["abc", "", "-1"]
        if "port" in action.dest:
            values.append("65536")
        elif action.dest not in ZERO_OK and not re.search(r"\b0\b", action.help or ""):
            values.append("0")
        return values
    if _input_file(action):
        return [MISSING_FILE]
    if action.dest in ADDRESS_DESTS:
        return [""]
    return []


def _bound_key(leaf: Leaf, action: argparse.Action) -> str | None:
    """The :data:`BOUNDED` key of ``action``, if it is bounded."""
    table = BOUNDED.get(leaf.command, {})
    for key in (f"{leaf.parser.prog} {action.dest}", action.dest):
        if key in table:
            return key
    return None


def bounded(leaf: Leaf, action: argparse.Action) -> bool:
    """Whether ``action`` must refuse :data:`HUGE` (and say its bound)."""
    return _bound_key(leaf, action) is not None and _numeric(action)


def number_bad_values(leaf: Leaf, action: argparse.Action) -> list[str]:
    """The bad values of a numeric option: :data:`NOT_FINITE`, and :data:`HUGE` where
    :func:`bounded`."""
    if not _numeric(action):
        return []
    return [*NOT_FINITE, *([HUGE] if bounded(leaf, action) else [])]


def _option_id(leaf: Leaf, action: argparse.Action) -> str:
    name = action.option_strings[-1] if action.option_strings else action.metavar or action.dest
    return f"{leaf.parser.prog} {name}"


def _sweep_cases() -> list[Any]:
    cases = []
    for leaf in LEAVES:
        for action in leaf.parser._actions:
            if not _takes_value(action) or action.help == argparse.SUPPRESS:
                continue
            values = bad_values(action) + number_bad_values(leaf, action)
            if not values:
                continue
            case_id = _option_id(leaf, action)
            marks = []
            if case_id in KNOWN_BAD_VALUES:
                marks.append(pytest.mark.xfail(reason=KNOWN_BAD_VALUES[case_id], strict=True))
            cases.append(pytest.param(leaf, action, values, id=case_id, marks=marks))
    return cases


# ---------------------------------------------------------------------------- running
class WouldRun(BaseException):
    """Raised where a command would start its real work (trio, a subprocess, pytest)."""


def _argv(leaf: Leaf, action: argparse.Action, value: str) -> list[str]:
    context = [] if action.dest in ("file", "read_file") else CONTEXT.get(leaf.parser.prog, [])
    if not action.option_strings:
        return [*leaf.words, *context, value]
    option = action.option_strings[-1]
    if value.startswith("-"):  # attached, or argparse would read it as an option
        joined = f"{option}={value}" if option.startswith("--") else option + value
        return [*leaf.words, joined, *context]
    return [*leaf.words, option, value, *context]


def _stopped(*_args: object, **_kwargs: object) -> Any:
    raise WouldRun


def _alarm(_signum: int, _frame: FrameType | None) -> None:
    raise WouldRun


@pytest.fixture
def guarded(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    """No command started under this fixture gets to do its work (or to take over 5 s)."""
    import trio

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(trio, "run", _stopped)
    monkeypatch.setattr(subprocess, "Popen", _stopped)
    monkeypatch.setattr(pytest, "main", _stopped)
    old = signal.signal(signal.SIGALRM, _alarm)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def run_main(command: str, argv: list[str]) -> tuple[int | str, bool]:
    """Exit status of ``<command> <argv>`` run in-process (or why it had none), and whether
    it got as far as starting its work."""
    main = importlib.import_module(TABLES[command][0]).main
    signal.alarm(5)
    try:
        status = main(argv)
    except SystemExit as exc:
        status = exc.code if isinstance(exc.code, int) else 1
    except WouldRun:
        return "started its work", True
    except Exception as exc:  # noqa: BLE001 - reported as the failure it is
        return f"raised {type(exc).__name__}: {exc}", False
    finally:
        signal.alarm(0)
    return status, False


def problems(prog: str, status: int | str, out: str, err: str, started: bool = False) -> list[str]:
    """What is wrong with a run that should have been one clean usage error."""
    found = []
    if started:
        found.append("accepted the value and started")
    elif status != 2:
        found.append(f"exit status {status}, not 2")
    if out:
        found.append(f"stdout {out[:80]!r}")
    lines = err.splitlines()
    if "Traceback" in err:
        found.append("a traceback on stderr")
    if len(lines) != 1:
        found.append(f"{len(lines)} stderr lines, not 1: {err[:160]!r}")
    elif not lines[0].startswith(f"{prog}: error: "):
        found.append(f"stderr {lines[0][:120]!r} does not start {prog + ': error: '!r}")
    return found


@pytest.mark.usefixtures("guarded")
@pytest.mark.parametrize(("leaf", "action", "values"), _sweep_cases())
def test_bad_value_is_one_error_line_and_status_2(
    leaf: Leaf, action: argparse.Action, values: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    failures = []
    for value in values:
        argv = _argv(leaf, action, value)
        status, started = run_main(leaf.command, argv)
        captured = capsys.readouterr()
        found = problems(leaf.parser.prog, status, captured.out, captured.err, started)
        if found:
            failures.append(f"{leaf.command} {' '.join(argv)!r}: {'; '.join(found)}")
    assert not failures, "\n".join(failures)


def test_the_sweep_covers_every_subcommand() -> None:
    """Each subcommand with value-taking options is swept; the sweep is not vacuous."""
    swept = {c.values[0].parser.prog for c in _sweep_cases()}
    assert {"iwarp rping", "iwarp cmatose", "iwarp siwvm shell-run", "kbtp target"} <= swept
    assert len(_sweep_cases()) > 100
    for command, table in BOUNDED.items():
        huge = {
            _bound_key(c.values[0], c.values[1])
            for c in _sweep_cases()
            if c.values[0].command == command and HUGE in c.values[2]
        }
        assert huge == set(table), command
    kbtp = [c for c in _sweep_cases() if c.values[0].command == "kbtp"]
    assert kbtp and all(set(NOT_FINITE) <= set(c.values[2]) for c in kbtp if _numeric(c.values[1]))


def _nan_messages() -> dict[str, str]:
    """``"<prog> <option>"`` -> the error of its type for NaN, every numeric option."""
    out = {}
    for leaf in LEAVES:
        for action in leaf.parser._actions:
            if _takes_value(action) and _numeric(action):
                out[_option_id(leaf, action)] = str(_converts(action, "nan"))
    return out


def test_nan_is_refused_as_no_number_not_as_out_of_range() -> None:
    """NaN fails every comparison: "must be 0 or more seconds, got nan" misleads; the
    message says the value is no number (as "abc" gets)."""
    messages = _nan_messages()
    assert messages["iwarp rping --timeout"] == "invalid number of seconds 'nan'"
    assert messages["iwarp bench write --duration"] == "invalid number of seconds 'nan'"
    assert messages["kbtp target --ticket-timeout"] == "invalid number of seconds 'nan'"
    wrong = {k: m for k, m in messages.items() if re.search(r"must be|or more|at most", m)}
    assert not wrong


def _bounded_cases() -> list[Any]:
    cases = []
    for leaf in LEAVES:
        for action in leaf.parser._actions:
            if not bounded(leaf, action):
                continue
            case_id = _option_id(leaf, action)
            reason = KNOWN_UNSTATED_BOUNDS.get(case_id)
            marks = [pytest.mark.xfail(reason=reason, strict=True)] if reason else []
            cases.append(pytest.param(action, id=case_id, marks=marks))
    return cases


@pytest.mark.parametrize("action", _bounded_cases())
def test_a_bounded_option_says_its_bound(action: argparse.Action) -> None:
    assert "at most" in " ".join((action.help or "").split())


def _group_cases() -> list[Any]:
    cases = []
    for command, words, _action in _groups():
        if not words:  # `iwarp nosuch`: the top-level usage, see tests/tools/test_cli.py
            continue
        case_id = f"{command} {' '.join(words)}"
        reason = KNOWN_GROUP_ERRORS.get(case_id)
        marks = [pytest.mark.xfail(reason=reason, strict=True)] if reason else []
        cases.append(pytest.param(command, words, id=case_id, marks=marks))
    return cases


@pytest.mark.usefixtures("guarded")
@pytest.mark.parametrize(("command", "words"), _group_cases())
def test_unknown_sub_subcommand_is_one_error_line(
    command: str, words: tuple[str, ...], capsys: pytest.CaptureFixture[str]
) -> None:
    status, started = run_main(command, [*words, "no-such-thing"])
    captured = capsys.readouterr()
    prog = f"{command} {' '.join(words)}"
    assert not problems(prog, status, captured.out, captured.err, started)
    assert "no-such-thing" in captured.err


@pytest.mark.usefixtures("guarded")
@pytest.mark.parametrize(
    "argv",
    [
        ["iwarp", "siwvm", "boot-check", "--siw", "no_such_knob=1"],
        ["iwarp", "siwvm", "boot-check", "--siw", "zcopy_tx"],
        ["iwarp", "siwvm", "boot-check", "--siw", "mpa_version=two"],
        ["iwarp", "siwvm", "shell-run", "-f", "70000:22", "--", "true"],
        ["iwarp", "siwvm", "shell-run", "-f", "ssh", "--", "true"],
        ["iwarp", "rdma-server", "-p", "0"],
        ["iwarp", "cmatose", "-c", "2", "-C", "20000"],  # more completions than the CQ holds
        ["iwarp", "cmatose", "-C", "64", "-S", "16M"],  # 1 GiB of receive buffers
        ["kbtp", "target", "--initiator", "x:quota=-1"],
    ],
    ids=" ".join,
)
def test_values_checked_after_parsing_are_refused_before_any_work(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    """Options whose values argparse's types cannot judge alone (KNOB=VALUE, HOST:GUEST)."""
    status, started = run_main(argv[0], argv[1:])
    captured = capsys.readouterr()
    prog = " ".join(w for w in argv[: next(i for i, w in enumerate(argv) if w[0] == "-")])
    assert not problems(prog, status, captured.out, captured.err, started), captured.err


# ---------------------------------------------------------------------------- outputs
OUTPUT_METAVARS = {"FILE": ".out", "FILE.png": ".png", "PCAP": ".pcap", "OUT": ".pcap", "DIR": "/"}
"""Metavars of the options that write a file (and the name's ending to give), or fill a
folder ("/")."""
OUTPUT_CONTEXT = {
    "iwarp bench codec": ["--mib", "1", "--repeat", "1", "--size", "4096"],
    "iwarp conform": ["127.0.0.1:1"],
    "iwarp dissect": [str(PCAP), "-q"],
    "iwarp interop --pcap-dir": ["--peer", "127.0.0.1:1"],
    "iwarp rdma-client": ["-s", "127.0.0.1"],
    "iwarp rping": ["-s"],
    "iwarp siwvm shell-run": ["--", "true"],
}
"""Arguments an output option needs to be checked (by prog, or by prog and option)."""
KNOWN_LATE_OUTPUTS: dict[str, str] = {}
"""Output options refused only once the run starts, and why (strict xfail)."""


def _output_cases() -> list[Any]:
    cases = []
    for leaf in LEAVES:
        for action in leaf.parser._actions:
            if leaf.command != "iwarp" or action.dest == "read_file" or not action.option_strings:
                continue
            if action.metavar not in OUTPUT_METAVARS:
                continue
            case_id = _option_id(leaf, action)
            reason = KNOWN_LATE_OUTPUTS.get(case_id)
            marks = [pytest.mark.xfail(reason=reason, strict=True)] if reason else []
            cases.append(pytest.param(leaf, action, id=case_id, marks=marks))
    return cases


def unusable_paths(folder: Path, ending: str) -> list[str]:
    """Paths that cannot take an output ending in ``ending`` ("/": a folder), for root too."""
    a_file = folder / "a-file"
    a_file.write_text("")
    if ending == "/":
        return [str(a_file), str(a_file / "sub"), "x" * 300]
    a_folder = folder / f"a-folder{ending}"
    a_folder.mkdir(exist_ok=True)
    missing = folder / "no-such-dir" / f"x{ending}"
    return [str(missing), str(a_file / f"x{ending}"), "x" * 300 + ending, str(a_folder)]


@pytest.mark.usefixtures("guarded")
@pytest.mark.parametrize(("leaf", "action"), _output_cases())
def test_an_unusable_output_is_refused_before_any_work(
    leaf: Leaf, action: argparse.Action, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A run can take minutes: its --json, -w, --keep DIR... are checked before it starts
    (stack.cli.json_report.check_outputs), with one error line naming the option."""
    option = action.option_strings[-1]
    context = OUTPUT_CONTEXT.get(f"{leaf.parser.prog} {option}")
    context = context or OUTPUT_CONTEXT.get(leaf.parser.prog, [])
    failures = []
    for path in unusable_paths(tmp_path, OUTPUT_METAVARS[str(action.metavar)]):
        argv = [*leaf.words, option, path, *context]
        status, started = run_main(leaf.command, argv)
        captured = capsys.readouterr()
        found = problems(leaf.parser.prog, status, captured.out, captured.err, started)
        if not started and f"{option} {path}: " not in captured.err:
            found.append(f"the error does not name {option} {path}: {captured.err[:160]!r}")
        if found:
            failures.append(f"{' '.join(argv)[:160]!r}: {'; '.join(found)}")
    assert not failures, "\n".join(failures)


# ---------------------------------------------------------------------------- help
def test_every_subcommand_has_a_one_line_help() -> None:
    for command, words, action in _groups():
        helps = {a.dest: a.help for a in action._choices_actions}
        for name in action.choices:
            text = helps.get(name)
            where = f"{command} {' '.join((*words, name))}"
            assert text and "\n" not in text and len(text) <= 100, where


@pytest.mark.parametrize("command", sorted(TABLES))
def test_top_level_help_lists_every_subcommand_with_its_help(
    command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    main = importlib.import_module(TABLES[command][0]).main
    with pytest.raises(SystemExit) as info:
        main(["--help"])
    assert info.value.code == 0
    out = " ".join(capsys.readouterr().out.split())
    group = next(a for _c, w, a in _groups() if _c == command and not w)
    for choice in group._choices_actions:
        assert f"{choice.dest} {' '.join((choice.help or '').split())}" in out


SPELLED = {"auto": ["auto", "detect"], "0.0.0.0": ["0.0.0.0", "all"]}
"""Defaults that help texts spell by what they mean ("default: detect", "default all")."""


def default_spellings(default: object) -> list[str]:
    """How a help text may spell ``default``: 65536 as 65536 or 64K, True as on, 30.0 as 30."""
    if default is True:
        return ["on"]
    if isinstance(default, str) and default in SPELLED:
        return SPELLED[default]
    if isinstance(default, int):
        out = [str(default)]
        for suffix, factor in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
            if default and default % factor == 0:
                out.append(f"{default // factor}{suffix}")
        return out
    if isinstance(default, float):
        return [f"{default:g}"]
    if isinstance(default, list | tuple):
        return [",".join(map(str, default))]
    return [str(default)]


def _default_cases() -> list[Any]:
    cases = []
    for leaf in LEAVES:
        for action in leaf.parser._actions:
            default = action.default
            if default is None or default is False or default == [] or default == "":
                continue
            if not action.help or action.help == argparse.SUPPRESS:
                continue
            if isinstance(action, argparse._HelpAction | argparse._VersionAction):
                continue
            case_id = _option_id(leaf, action)
            if case_id in DEFAULT_NOT_SHOWN:
                continue
            marks = []
            if case_id in KNOWN_MISSING_DEFAULTS:
                reason = KNOWN_MISSING_DEFAULTS[case_id]
                marks.append(pytest.mark.xfail(reason=reason, strict=True))
            cases.append(pytest.param(action, id=case_id, marks=marks))
    return cases


@pytest.mark.parametrize("action", _default_cases())
def test_help_shows_the_default(action: argparse.Action) -> None:
    text = " ".join((action.help or "").split())
    assert "default" in text and any(s in text for s in default_spellings(action.default)), (
        f"{text!r} should say (default {default_spellings(action.default)[0]})"
    )


# ---------------------------------------------------------------------------- from outside
@pytest.mark.parametrize(
    "argv",
    [
        ["iwarp", "cmatose", "-c", "0"],
        ["iwarp", "rdma-server", "-p", "70000"],
        ["iwarp", "siwvm", "boot-check", "--smp", "0"],
        ["kbtp", "target", "--host", ""],
        ["iwarp", "rules", "DDP-99"],
    ],
    ids=" ".join,
)
def test_spot_check_in_a_subprocess(argv: list[str], tmp_path: Path) -> None:
    """Only values refused before any work: nothing here is guarded."""
    prog = " ".join(argv[:-2] if argv[-2].startswith("-") else argv[:-1])
    done = subprocess.run(
        [sys.executable, "-m", TABLES[argv[0]][0], *argv[1:]],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert not problems(prog, done.returncode, done.stdout, done.stderr), done.stderr
