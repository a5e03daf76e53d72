"""``--json FILE`` of the measuring commands: one JSON document of a run's results.

``FILE`` is a path or ``-`` for stdout; with ``-`` nothing else goes to stdout (the text
report moves to stderr, as progress already does).  Every document carries a ``schema``
key (``<command>/<version>``) and an ``exit_status``; figures carry their unit in the key
name (``gbit_per_s``, ``msg_per_s``, ``us_p50``).

Also the one rule of every option that writes a file or fills a folder (``--json``,
``--plot``, ``-w``, ``--junit``, ``--keep``, ``--pcap-dir``, ...): :func:`check_outputs`
refuses an unusable path before the run (a run can take minutes, its results would be
lost), and a write that fails all the same is one :class:`~stack.cli.CliError` line
(:func:`output_error`), never a traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import sys
import tempfile
from collections.abc import Callable, Iterator
from typing import Any

from stack.cli import CliError

SCHEMA_VERSION = 1


def add_json_argument(parser: argparse.ArgumentParser) -> None:
    """Add ``--json FILE`` (``-``: stdout, the text report then goes to stderr)."""
    parser.add_argument(
        "--json",
        metavar="FILE",
        help="also write the results as JSON to FILE ('-': stdout, the table then to stderr)",
    )


def check_output(option: str, path: str | None, *, folder: bool = False) -> str | None:
    """Why ``option path`` cannot be written, or None (None and ``-``, stdout, are fine).

    A file: not a folder, in a folder that exists, and a file can be created there or the
    existing one opened for writing (neither truncated nor left behind; an existing device
    or pipe is only checked for permission, opening it could block).  ``folder``: a
    folder, made now (with its parents) if missing, in which a file can be created.
    """
    if path is None or (path == "-" and not folder):
        return None
    if not path:
        return f"{option}: empty file name"
    try:
        return _folder_problem(option, path) if folder else _file_problem(option, path)
    except OSError as exc:
        return str(output_error(option, path, exc))


def _file_problem(option: str, path: str) -> str | None:
    if os.path.isdir(path):
        return f"{option} {path}: is a directory"
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        missing = "no such directory" if not os.path.exists(parent) else "not a directory:"
        return f"{option} {path}: {missing} {parent}"
    if not os.path.exists(path):
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
        os.unlink(path)
    elif os.path.isfile(path):
        os.close(os.open(path, os.O_WRONLY | os.O_APPEND))
    elif not os.access(path, os.W_OK):
        return f"{option} {path}: cannot write (Permission denied)"
    return None


def _folder_problem(option: str, path: str) -> str | None:
    if os.path.exists(path) and not os.path.isdir(path):
        return f"{option} {path}: not a directory"
    os.makedirs(path, exist_ok=True)
    tempfile.TemporaryFile(dir=path).close()
    return None


def check_outputs(
    *files: tuple[str, str | None], folders: tuple[tuple[str, str | None], ...] = ()
) -> None:
    """Raise a :class:`CliError` for the first unusable output, each ``(option, path)``
    (:func:`check_output`): called before a run."""
    checks = [(o, p, False) for o, p in files] + [(o, p, True) for o, p in folders]
    for option, path, folder in checks:
        problem = check_output(option, path, folder=folder)
        if problem:
            raise CliError(problem)


def check_json_path(path: str | None) -> str | None:
    """:func:`check_output` of ``--json``."""
    return check_output("--json", path)


def output_error(option: str, path: str, exc: OSError) -> CliError:
    """The one-line error of ``option path`` that could not be written."""
    return CliError(f"{option} {path}: cannot write ({exc.strerror or exc})")


def write_outputs(*writes: tuple[str | None, Callable[[str], None]]) -> None:
    """``write(path)`` of each ``(path, write)`` given a path, even after one failed (a
    ``--plot`` that fails keeps the ``--json``); the :class:`CliError` s then as one."""
    errors = []
    for path, write in writes:
        if not path:
            continue
        try:
            write(path)
        except CliError as exc:
            errors.append(str(exc))
    if errors:
        raise CliError("; ".join(errors))


def schema(command: str) -> str:
    """The ``schema`` value of ``command``'s documents, e.g. ``iwarp-bench-write/1``."""
    return f"{command.replace(' ', '-')}/{SCHEMA_VERSION}"


@contextlib.contextmanager
def text_to_stderr_if_json_stdout(path: str | None) -> Iterator[None]:
    """Send what the block prints to stdout to stderr when the JSON goes to stdout."""
    if path == "-":
        with contextlib.redirect_stdout(sys.stderr):
            yield
    else:
        yield


def _clean(value: Any) -> Any:
    """JSON has no NaN or infinity: those become null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_clean(v) for v in value]
    return value


def write_text(option: str, path: str, text: str) -> None:
    """Write ``text`` to ``path`` (``-``: stdout); :func:`output_error` if it cannot."""
    if path == "-":
        sys.stdout.write(text)
        sys.stdout.flush()
        return
    try:
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
    except OSError as exc:
        raise output_error(option, path, exc) from None


def write_json(path: str, document: dict[str, Any], option: str = "--json") -> None:
    """Write ``document`` to ``path`` (``-``: stdout); :func:`output_error` if it cannot."""
    write_text(option, path, json.dumps(_clean(document), indent=2) + "\n")
