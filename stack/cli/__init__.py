"""Shared machinery of the ``iwarp`` and ``kbtp`` commands.

Each command names its subcommands in a table, subcommand -> module
(:data:`stack.cli.iwarp.COMMANDS`, :data:`kbtp.cli.COMMANDS`); the module defines
``register(subparsers)``, which adds the subcommand(s) and calls
``parser.set_defaults(func=...)`` with a function taking the parsed namespace and returning
an exit status.  Only the named subcommand's module is imported (``iwarp dissect`` starts
without trio or the RNIC).  User errors are raised as :class:`CliError` and printed as one
line, never as a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import math
import sys
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from importlib import metadata
from typing import NoReturn, TypeVar, overload

from stack.cli import endpoints
from stack.errors import single_exception

__all__ = [
    "ERROR_PROG",
    "MAX_DURATION",
    "MAX_EMSS",
    "MAX_ITERATIONS",
    "MAX_REPEAT",
    "CliError",
    "add_repeat_argument",
    "address",
    "binary_size",
    "bounded_int",
    "call",
    "build_parser",
    "counted",
    "duration",
    "emss",
    "iterations",
    "non_negative_int",
    "one_line_errors",
    "port_number",
    "size_label",
    "positive_int",
    "positive_seconds",
    "repeat_count",
    "run",
    "seconds",
    "trio_run",
    "version",
]

T = TypeVar("T")
N = TypeVar("N")


ERROR_PROG = "error_prog"
"""Namespace attribute :func:`one_line_errors` sets: the subcommand's ``prog``, which
:func:`run` prefixes a :class:`CliError` with (``iwarp rping: error: ...``)."""


def one_line_errors(parser: argparse.ArgumentParser, rest_to: str | None = None) -> None:
    """Bad arguments: one ``prog: error: ...`` line and exit status 2 (no usage dump).

    A :class:`CliError` the subcommand raises later is printed with the same ``prog``.
    ``rest_to``: the ``nargs="*"`` positional that also takes the positionals given after
    an option (``HOST --timeout 1 CASE``), which argparse leaves over otherwise.
    """

    def error(message: str) -> NoReturn:
        parser.exit(2, f"{parser.prog}: error: {message}\n")

    parse_known_args = parser.parse_known_args

    # The overloads of ArgumentParser.parse_known_args, so the replacement has its type.
    @overload
    def strict_parse_known_args(
        args: Iterable[str] | None = None, namespace: None = None
    ) -> tuple[argparse.Namespace, list[str]]: ...
    @overload
    def strict_parse_known_args(
        args: Iterable[str] | None, namespace: N
    ) -> tuple[N, list[str]]: ...
    @overload
    def strict_parse_known_args(*, namespace: N) -> tuple[N, list[str]]: ...
    def strict_parse_known_args(
        args: Iterable[str] | None = None, namespace: object = None
    ) -> tuple[object, list[str]]:
        # As a subparser, leftovers would reach the top parser's usage-dumping error.
        parsed, extras = parse_known_args(args, namespace)
        if extras and rest_to is not None and not any(x.startswith("-") for x in extras):
            setattr(parsed, rest_to, [*getattr(parsed, rest_to), *extras])
            extras = []
        if extras:
            error(f"unrecognized arguments: {' '.join(extras)}")
        return parsed, extras

    parser.error = error  # type: ignore[method-assign]
    parser.parse_known_args = strict_parse_known_args  # type: ignore[method-assign]
    parser.set_defaults(**{ERROR_PROG: parser.prog})


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1 (``0x`` prefixes accepted)."""
    try:
        value = int(text, 0)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid integer {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {text}")
    return value


def bounded_int(text: str, maximum: int) -> int:
    """An integer of 1 to ``maximum`` (``0x`` prefixes accepted), for argparse types."""
    value = positive_int(text)
    if value > maximum:
        raise argparse.ArgumentTypeError(f"must be at most {maximum}, got {text}")
    return value


def counted(maximum: int) -> Callable[[str], int]:
    """argparse type of a count: an integer of 1 to ``maximum`` (:func:`bounded_int`); the
    option's help says "at most ``maximum``"."""

    def count(text: str) -> int:
        return bounded_int(text, maximum)

    count.__name__ = f"count of at most {maximum}"
    return count


MAX_REPEAT = 100
"""Most runs per size a benchmark's ``-r/--repeat`` takes."""
MAX_ITERATIONS = 10_000_000
"""Most iterations a benchmark's ``-n`` takes: a latency run keeps every sample (32 octets
each), and at 10^5 messages a second it is still under two minutes."""
MAX_DURATION = 3600.0
"""Most seconds a benchmark's ``-D`` runs each size (an hour; a latency run keeps every
sample, about a gigabyte of them in an hour)."""


MIN_EMSS, MAX_EMSS = 64, 65535
"""The EMSS an ``--emss`` takes: TCP's MSS option is 16 bits; below 64 no TCP path goes
(the MULPDU derived from it is clamped to 128..64768 all the same, MPA-13)."""


def emss(text: str) -> int:
    """argparse type of ``--emss``: :data:`MIN_EMSS` to :data:`MAX_EMSS` octets."""
    value = positive_int(text)
    if not MIN_EMSS <= value <= MAX_EMSS:
        raise argparse.ArgumentTypeError(f"EMSS must be {MIN_EMSS} to {MAX_EMSS}, got {text}")
    return value


def repeat_count(text: str) -> int:
    """argparse type of ``--repeat``: 1 to :data:`MAX_REPEAT`."""
    return bounded_int(text, MAX_REPEAT)


def iterations(text: str) -> int:
    """argparse type of a benchmark's ``-n``: 1 to :data:`MAX_ITERATIONS`."""
    return bounded_int(text, MAX_ITERATIONS)


def duration(text: str) -> float:
    """argparse type of a benchmark's ``-D``: seconds, more than 0, at most
    :data:`MAX_DURATION`."""
    value = _float_seconds(text)
    if not 0 < value <= MAX_DURATION:
        raise argparse.ArgumentTypeError(
            f"must be > 0 and at most {MAX_DURATION:g} seconds, got {text}"
        )
    return value


def add_repeat_argument(parser: argparse.ArgumentParser, what: str) -> None:
    """A benchmark's ``-r/--repeat N`` (``args.repeat``, default 1); ``what`` says what each
    run is and which run is printed."""
    parser.add_argument(
        "-r",
        "--repeat",
        type=repeat_count,
        default=1,
        metavar="N",
        help=f"measure each size N times ({what}), with the runs and the range they spanned "
        f"(default 1, at most {MAX_REPEAT})",
    )


def non_negative_int(text: str) -> int:
    """argparse type: an integer >= 0 (``0x`` prefixes accepted)."""
    try:
        value = int(text, 0)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid integer {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
    return value


def address(text: str) -> str:
    """argparse type: a host name or IP address, not empty (an unset shell variable)."""
    if not text.strip():
        raise argparse.ArgumentTypeError("empty address: give a host name or IP address")
    return text


MAX_SECONDS = 1e6
"""Seconds are below this (11 days): a timeout beyond it is a typing mistake."""


def _float_seconds(text: str) -> float:
    """``text`` as seconds; NaN is no number of seconds either (every bound is false for it)."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if math.isnan(value):
        raise argparse.ArgumentTypeError(f"invalid number of seconds {text!r}") from None
    return value


def seconds(text: str) -> float:
    """argparse type: a duration in seconds, 0 or more, below :data:`MAX_SECONDS`."""
    value = _float_seconds(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more seconds, got {text}")
    if value >= MAX_SECONDS:
        raise argparse.ArgumentTypeError(f"must be below {MAX_SECONDS:.0f} seconds, got {text}")
    return value


def positive_seconds(text: str) -> float:
    """argparse type: a duration in seconds, more than 0 (a timeout)."""
    value = seconds(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be more than 0 seconds, got {text}")
    return value


def binary_size(text: str, maximum: int, *, base: int = 10, unit: str = "") -> int:
    """``65536``, ``64K``, ``1M``, ``1MiB`` -> octets (binary suffixes), 1 to ``maximum``.

    ``base``: as :func:`int` (0 also takes ``0x`` prefixes); ``unit`` ends the range in the
    error message (" bytes").
    """
    t = text.strip().upper().removesuffix("B").removesuffix("I")
    scale = 1
    for suffix, factor in (("K", 1 << 10), ("M", 1 << 20), ("G", 1 << 30)):
        if t.endswith(suffix):
            t, scale = t[:-1], factor
            break
    try:
        value = int(t, base) * scale
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid size {text!r}") from None
    if not 1 <= value <= maximum:
        raise argparse.ArgumentTypeError(f"size must be 1 to {maximum}{unit}, got {text!r}")
    return value


def size_label(octets: int) -> str:
    """``64K``, ``1M`` or the octets: a size as the options take it (:func:`binary_size`)."""
    for unit, scale in (("M", 1 << 20), ("K", 1 << 10)):
        if octets % scale == 0:
            return f"{octets // scale}{unit}"
    return str(octets)


def port_number(text: str) -> int:
    """argparse type: a TCP port, 0 to 65535 (:func:`stack.cli.endpoints.port_number`)."""
    try:
        return endpoints.port_number(text)
    except endpoints.EndpointError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


class CliError(Exception):
    """A user-facing error: printed as ``<prog>: error: <message>``, exit status 2."""


def version() -> str:
    """The installed distribution's version (``iwarp --version``, ``kbtp --version``)."""
    try:
        return metadata.version("iwarp-kbtp")
    except metadata.PackageNotFoundError:  # pragma: no cover - run from a bare checkout
        return "unknown (not installed)"


def build_parser(
    prog: str, description: str, commands: Mapping[str, str], only: str | None = None
) -> argparse.ArgumentParser:
    """The command's parser with every subcommand of ``commands`` (name -> module), or, with
    ``only``, just that subcommand when ``commands`` names it (so a command imports only
    what it needs)."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument("--version", action="version", version=f"%(prog)s {version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    if only is not None and only in commands:
        _register(commands[only], sub)
        if only in sub.choices:
            return parser
        return build_parser(prog, description, commands)
    for module_name in dict.fromkeys(commands[name] for name in sorted(commands)):
        _register(module_name, sub)
    return parser


def _register(module_name: str, sub: argparse._SubParsersAction) -> None:
    module = importlib.import_module(module_name)
    module.register(sub)


def run(
    prog: str,
    description: str,
    commands: Mapping[str, str],
    argv: Sequence[str] | None = None,
) -> int:
    """Parse ``argv`` (default ``sys.argv[1:]``), run the chosen subcommand, return its exit
    status; a :class:`CliError` is one ``prog: error: ...`` line and status 2 (``prog`` of
    the subcommand when it uses :func:`one_line_errors`)."""
    args_in = list(sys.argv[1:] if argv is None else argv)
    first = args_in[0] if args_in and not args_in[0].startswith("-") else None
    parser = build_parser(prog, description, commands, only=first)
    return call(parser.parse_args(args_in), prog)


def call(args: argparse.Namespace, prog: str) -> int:
    """Run the parsed command ``args.func(args)``, return its exit status; a
    :class:`CliError` is one ``prog: error: ...`` line and status 2 (``prog`` of the
    subcommand when it uses :func:`one_line_errors`), an interrupt status 130, a closed
    standard output status 0 (:func:`run`, and the modules that run with ``python -m``)."""
    try:
        return int(args.func(args) or 0)
    except CliError as exc:
        print(f"{getattr(args, ERROR_PROG, prog)}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0


def trio_run(fn: Callable[..., Awaitable[T]], *args: object) -> T:
    """``trio.run`` that lifts a lone error out of trio's exception groups.

    A tool's ``except BenchError`` (or any user-facing error) then works whether the error
    was raised in a nursery or not.
    """
    import trio  # here, not at module level: `iwarp dissect` starts faster without trio

    with single_exception():
        return trio.run(fn, *args)
