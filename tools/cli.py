"""Shared machinery of the ``iwarp`` and ``kbtp`` commands.

Subcommands are discovered, not listed: a module ``tools/<prefix>_<name>.py`` that
defines ``register(subparsers)`` adds subcommand ``<name>`` (``iwarp_dissect.py`` ->
``iwarp dissect``).  ``register`` must call ``parser.set_defaults(func=...)`` with a function
taking the parsed namespace and returning an exit status.  User errors are raised as
:class:`CliError` and printed as one line, never as a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys
from collections.abc import Awaitable, Callable, Sequence
from typing import NoReturn, TypeVar

import tools

T = TypeVar("T")


def one_line_errors(parser: argparse.ArgumentParser) -> None:
    """Bad arguments: one ``prog: error: ...`` line and exit status 2 (no usage dump)."""

    def error(message: str) -> NoReturn:
        parser.exit(2, f"{parser.prog}: error: {message}\n")

    parse_known_args = parser.parse_known_args

    def strict_parse_known_args(
        args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        # As a subparser, leftovers would reach the top parser's usage-dumping error.
        namespace, extras = parse_known_args(args, namespace)
        if extras:
            error(f"unrecognized arguments: {' '.join(extras)}")
        return namespace, extras

    parser.error = error  # type: ignore[method-assign]
    parser.parse_known_args = strict_parse_known_args  # type: ignore[method-assign]


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1 (``0x`` prefixes accepted)."""
    try:
        value = int(text, 0)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid integer {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {text}")
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


def port_number(text: str) -> int:
    """argparse type: a TCP port, 0 to 65535."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid port {text!r}") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"port must be 0 to 65535, got {text}")
    return value


class CliError(Exception):
    """A user-facing error: printed as ``<prog>: error: <message>``, exit status 2."""


def build_parser(prog: str, description: str, only: str | None = None) -> argparse.ArgumentParser:
    """The command's parser with every discovered subcommand, or, with ``only``, just the
    subcommand of that name when the module ``<prog>_<only>`` registers it (so a command
    imports only what it needs: ``iwarp dissect`` starts without trio or the RNIC)."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    prefix = f"{prog}_"
    names = sorted(
        info.name
        for info in pkgutil.iter_modules(tools.__path__)
        if info.name.startswith(prefix) and info.name != f"{prog}_cli"
    )
    if only is not None:
        name = prefix + only.replace("-", "_")
        if name in names:
            _register(name, sub)
            if only in sub.choices:
                return parser
        return build_parser(prog, description)
    for name in names:
        _register(name, sub)
    return parser


def _register(module_name: str, sub: argparse._SubParsersAction) -> None:
    module = importlib.import_module(f"tools.{module_name}")
    register = getattr(module, "register", None)
    if register is not None:
        register(sub)


def run(prog: str, description: str, argv: Sequence[str] | None = None) -> int:
    args_in = list(sys.argv[1:] if argv is None else argv)
    first = args_in[0] if args_in and not args_in[0].startswith("-") else None
    parser = build_parser(prog, description, only=first)
    args = parser.parse_args(args_in)
    try:
        return int(args.func(args) or 0)
    except CliError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0


def lone_exception(exc: BaseException) -> BaseException:
    """The single exception inside nested exception groups (trio nurseries), else ``exc``."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc


def trio_run(fn: Callable[..., Awaitable[T]], *args: object) -> T:
    """``trio.run`` that lifts a lone error out of trio's exception groups.

    A tool's ``except BenchError`` (or any user-facing error) then works whether the error
    was raised in a nursery or not.
    """
    import trio  # here, not at module level: `iwarp dissect` starts faster without trio

    try:
        return trio.run(fn, *args)
    except BaseExceptionGroup as group:
        inner = lone_exception(group)
        if inner is group:
            raise
        raise inner from None
