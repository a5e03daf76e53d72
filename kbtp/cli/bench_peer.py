"""``kbtp bench``'s other process: the target and the raw baseline server of one block size.

``kbtp bench`` (two processes, its default) starts ``python -m kbtp.cli.bench_peer`` per
block size with the configuration of that row; the peer serves a :class:`KbtpTarget` and
the raw baseline server (:mod:`kbtp.cli.bench_baseline`) on loopback, prints
``PORT <kbtp> <raw> <pid>`` and serves until its standard input ends (``--cpu N``: on CPU N
only, ``kbtp bench --cpus``).  :class:`PeerProcess`
is the bench's handle on it, with the peer's CPU time read from ``/proc``.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

import trio

from kbtp.cli import bounds
from kbtp.cli.bench_baseline import raw_server
from kbtp.cli.bench_cpu import process_cpu_seconds
from kbtp.cli.target import LOOPBACK_EMSS, add_mpa_arguments, checked_target, mpa_settings
from kbtp.target_config import InitiatorConfig, TargetConfig
from stack.bench.process import pin_to
from stack.cli import CliError, one_line_errors

IDENTITY = b"bench"
START_TIMEOUT = 60.0
"""Seconds a peer may take to print its ports."""


def bench_config(size: int, blocks: int, inflight: int, max_inline: int) -> TargetConfig:
    """The target of one ``kbtp bench`` row: one identity owning every block."""
    return TargetConfig(
        block_size=size,
        pool_blocks=blocks,
        initiators=(InitiatorConfig(IDENTITY, 0, blocks, blocks),),
        request_credits=max(inflight, 1),
        max_inline=max_inline,
    )


@dataclass(slots=True)
class PeerProcess:
    """A running peer: its ports and process id."""

    port: int
    raw_port: int
    pid: int

    def cpu(self) -> float | None:
        return process_cpu_seconds(self.pid)


@asynccontextmanager
async def peer_process(
    size: int,
    blocks: int,
    inflight: int,
    max_inline: int,
    argv_mpa: list[str],
    cpu: int | None = None,
) -> AsyncIterator[PeerProcess]:
    """Start a peer for one row (on ``cpu`` only, if given); it ends when the block is left
    (standard input closed)."""
    argv = [
        sys.executable,
        "-m",
        "kbtp.cli.bench_peer",
        f"--block-size={size}",
        f"--pool-blocks={blocks}",
        f"--inflight={inflight}",
        f"--max-inline={max_inline}",
        *argv_mpa,
        *([] if cpu is None else [f"--cpu={cpu}"]),
    ]
    async with port_process(argv, "the bench peer", 3) as (port, blocks, stag):
        yield PeerProcess(port, blocks, stag)


@asynccontextmanager
async def port_process(argv: list[str], what: str, numbers: int) -> AsyncIterator[list[int]]:
    """Start ``argv``, a process that prints ``PORT`` and ``numbers`` numbers on a line and
    serves until its standard input closes; yield the numbers; at the end close its input
    and wait (killed if it has not ended 10 s later, or at once if it never started)."""
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    line = ""
    try:
        assert proc.stdout is not None
        with trio.move_on_after(START_TIMEOUT):
            line = await trio.to_thread.run_sync(proc.stdout.readline, abandon_on_cancel=True)
        words = line.split()
        if len(words) != numbers + 1 or words[0] != "PORT" or not all(map(str.isdigit, words[1:])):
            raise CliError(f"{what} did not start (it said {line.strip()!r})")
        yield [int(w) for w in words[1:]]
    finally:
        if proc.poll() is None and not line:
            proc.kill()
        if proc.stdin is not None:
            proc.stdin.close()
        try:
            await trio.to_thread.run_sync(proc.wait, 10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


async def serve(args: argparse.Namespace) -> None:
    config = bench_config(args.block_size, args.pool_blocks, args.inflight, args.max_inline)
    target = checked_target(config, settings=mpa_settings(args))
    async with target.running(), trio.open_nursery() as nursery:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        raw_port = listeners[0].socket.getsockname()[1]
        handler = lambda s: raw_server(s, args.block_size)  # noqa: E731
        nursery.start_soon(trio.serve_listeners, handler, listeners)
        print(f"PORT {target.port} {raw_port} {os.getpid()}", flush=True)
        stdin = trio.lowlevel.FdStream(os.dup(sys.stdin.fileno()))
        async with stdin:
            while await stdin.receive_some(4096):
                pass
        nursery.cancel_scope.cancel()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="kbtp-bench-peer", description=__doc__)
    parser.add_argument("--block-size", type=bounds.block_size, required=True)
    parser.add_argument("--pool-blocks", type=bounds.pool_blocks, required=True)
    parser.add_argument("--inflight", type=bounds.inflight, required=True)
    parser.add_argument("--max-inline", type=bounds.max_inline, required=True)
    parser.add_argument("--cpu", type=int, help="run on this CPU only")
    add_mpa_arguments(parser, LOOPBACK_EMSS)
    one_line_errors(parser)
    args = parser.parse_args(argv)
    try:
        if args.cpu is not None:
            pin_to(args.cpu)
        trio.run(serve, args)
    except KeyboardInterrupt:
        return 130
    except (CliError, OSError) as exc:  # the bench checked the configuration: the last word
        print(f"{parser.prog}: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
