"""``--json FILE`` of the measuring commands: one JSON document of a run's results.

``FILE`` is a path or ``-`` for stdout; with ``-`` nothing else goes to stdout (the text
report moves to stderr, as progress already does).  Every document carries a ``schema``
key (``<command>/<version>``) and an ``exit_status``; figures carry their unit in the key
name (``gbit_per_s``, ``msg_per_s``, ``us_p50``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import sys
from collections.abc import Iterator
from typing import Any

SCHEMA_VERSION = 1


def add_json_argument(parser: argparse.ArgumentParser) -> None:
    """Add ``--json FILE`` (``-``: stdout, the text report then goes to stderr)."""
    parser.add_argument(
        "--json",
        metavar="FILE",
        help="also write the results as JSON to FILE ('-': stdout, the table then to stderr)",
    )


def check_json_path(path: str | None) -> str | None:
    """Why ``path`` cannot be written (its folder is missing), or None: checked up front."""
    if path is None or path == "-":
        return None
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        return f"--json {path}: no such directory {folder}"
    if os.path.isdir(path):
        return f"--json {path}: is a directory"
    return None


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


def write_json(path: str, document: dict[str, Any]) -> None:
    """Write ``document`` to ``path`` (``-``: stdout); raises OSError if it cannot."""
    text = json.dumps(_clean(document), indent=2) + "\n"
    if path == "-":
        sys.stdout.write(text)
        sys.stdout.flush()
        return
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
