"""What the load-free profilers (:mod:`tools.op_profile`, :mod:`tools.kbtp_op_profile`)
share: socket calls and trio's scheduler passes and task steps counted while a case
runs, and callgrind's count of user-space instructions of one run of a script.

The profilers import it as ``tools.profiling`` under ``python -m``, and as the sibling
module ``profiling`` when run as a file (``--baseline`` runs this checkout's tool with
another tree's ``stack`` and ``kbtp`` first on the path, whose ``tools`` may predate it).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import trio

SOCKET_CALLS = ("send", "sendmsg", "recv", "recv_into")
"""The data-path methods of a standard socket that :func:`counting_sockets` counts."""


@contextmanager
def counting_sockets() -> Iterator[list[int]]:
    """Count calls of the data-path methods of every standard socket while active."""
    count = [0]
    saved = {name: getattr(socket.socket, name) for name in SOCKET_CALLS}

    def counted(original: Callable[..., Any]) -> Callable[..., Any]:
        def call(self: socket.socket, *args: Any, **kwargs: Any) -> Any:
            count[0] += 1
            return original(self, *args, **kwargs)

        return call

    for name, original in saved.items():
        setattr(socket.socket, name, counted(original))
    try:
        yield count
    finally:
        for name, original in saved.items():
            setattr(socket.socket, name, original)


class Steps(trio.abc.Instrument):
    """Scheduler passes and task steps while ``counting``."""

    def __init__(self) -> None:
        self.counting = False
        self.passes = 0
        self.steps = 0

    def before_io_wait(self, timeout: float) -> None:
        if self.counting:
            self.passes += 1

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        if self.counting:
            self.steps += 1


def callgrind_instructions(
    prog: str, argv: list[str], what: str, env: dict[str, str] | None = None
) -> int:
    """Callgrind's total of user-space instructions of ``python argv`` (``prog`` and
    ``what`` name the tool and the run in progress and errors)."""
    cmd = ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", sys.executable]
    print(f"{prog}: callgrind: {what}", file=sys.stderr, flush=True)
    try:
        done = subprocess.run([*cmd, *argv], capture_output=True, text=True, check=True, env=env)
    except FileNotFoundError:
        raise SystemExit(f"{prog}: --instructions needs valgrind (apt install valgrind)") from None
    except subprocess.CalledProcessError as exc:
        raise SystemExit(f"{prog}: {what} failed under callgrind: {exc.stderr[-800:]}") from None
    match = re.search(r"Collected : (\d+)", done.stderr)
    if match is None:
        raise SystemExit(f"{prog}: callgrind printed no instruction count")
    return int(match.group(1))


def add_common_arguments(parser: argparse.ArgumentParser) -> None:
    """The options both profilers take: ``--baseline DIR``, ``--json``, ``--instructions``."""
    parser.add_argument("--baseline", metavar="DIR", help="also measure this source tree")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    parser.add_argument(
        "--instructions",
        action="store_true",
        help="also count instructions per operation with valgrind's callgrind (load-free)",
    )


def measure_in_tree(script: str, tree: str, argv: list[str]) -> dict[str, dict[str, Any]]:
    """The ``--json`` figures of the profiler ``script`` (this checkout's file) run over
    another source tree ``tree`` (``--baseline``): a subprocess with that tree first on the
    path and as its working directory."""
    env = dict(os.environ, PYTHONPATH=os.path.abspath(tree))
    cmd = [sys.executable, os.path.abspath(script), *argv, "--json"]
    done = subprocess.run(cmd, env=env, cwd=tree, capture_output=True, text=True, check=True)
    result: dict[str, dict[str, Any]] = json.loads(done.stdout)
    return result
