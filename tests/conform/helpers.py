"""Our own stack as the DUT, in-process: rping server and client, kbtp target, bench server.

:class:`InProcessDut` is a :class:`~stack.conform.runner.Restarter`: before each case it
starts a fresh DUT task (the same code ``iwarp rping -s`` / ``-c`` runs), after the case it
cancels it and waits until it is gone, so no case ever reaches the previous DUT.
"""

from __future__ import annotations

import argparse
import io
import socket
from collections.abc import Awaitable, Callable, Iterable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import trio

from kbtp.cli.target import build_config, mpa_settings
from kbtp.cli.target import register as register_target
from kbtp.target import KbtpTarget
from stack.bench.server import BenchServer
from stack.cli import build_parser
from stack.cli.iwarp import COMMANDS
from stack.cli.rping import run_client, run_server
from stack.conform import (
    DutRole,
    NoRestart,
    RunOptions,
    RunReport,
    Status,
    profile,
    run_cases,
    select,
)
from stack.conform.model import Case
from stack.peers.perftest.options import PerftestOptions
from stack.peers.perftest.server import PerftestServer

QUICK = RunOptions(timeout=2.0, silence=0.25, startup_timeout=4.0, wait=5.0)
"""Test timing: generous for a loaded machine, short silences; our DUT's startup timers are
set to 1 s (:func:`stack.conform.faults.injected`) for the timer cases."""
FAST = RunOptions(timeout=0.5, silence=0.1, startup_timeout=4.0, wait=5.0)
"""Timing of the fault runs: a broken DUT that stays silent costs this timeout per case."""
SHORT_TIMERS = {"request_timeout": 1.0, "reply_timeout": 1.0}
KBTP_ARGS = ("--trusted", "--pool-blocks", "16", "--block-size", "4K")
"""``kbtp target`` for the data-phase cases: every identity trusted (Table, Pool, Ring and
Partition STags in HELLO_ACK), a small pool."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def rping_args(*argv: str) -> argparse.Namespace:
    """The namespace ``iwarp rping ARGV`` runs with."""
    parser = build_parser("iwarp", "", COMMANDS, only="rping")
    return parser.parse_args(["rping", *argv])


def kbtp_target_args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    register_target(parser.add_subparsers())
    return parser.parse_args(["target", *argv])


class InProcessDut:
    """A DUT task restarted for every case (see the module docstring)."""

    def __init__(self, nursery: trio.Nursery, main: Callable[[], Awaitable[object]]) -> None:
        self.nursery = nursery
        self.main = main
        self.runs = 0
        self._scope: trio.CancelScope | None = None
        self._done: trio.Event | None = None

    async def before_case(self, case: Case) -> None:
        await self.stop()
        scope = self._scope = trio.CancelScope()
        done = self._done = trio.Event()
        self.runs += 1

        async def run() -> None:
            try:
                with scope:
                    await self.main()
            except Exception:  # noqa: BLE001 - a DUT that fails is what the cases judge
                pass
            finally:
                done.set()

        self.nursery.start_soon(run)
        await trio.sleep(0)

    async def after_case(self, case: Case) -> None:
        await self.stop()

    async def stop(self) -> None:
        if self._scope is not None and self._done is not None:
            self._scope.cancel()
            await self._done.wait()
        self._scope = self._done = None


async def run_against_rping_server(
    cases: Iterable[Case], *extra: str, options: RunOptions = QUICK, pcap_dir: Path | None = None
) -> RunReport:
    """Run ``cases`` against ``iwarp rping -s EXTRA`` (in-process, restarted per case)."""
    port = free_port()
    args = rping_args("-s", "-a", "127.0.0.1", "-p", str(port), *extra)
    async with trio.open_nursery() as nursery:
        dut = InProcessDut(nursery, lambda: run_server(args))
        report = await run_cases(
            list(cases),
            profile("rping"),
            options,
            target=("127.0.0.1", port),
            restarter=dut,
            pcap_dir=pcap_dir,
            progress=lambda line: None,
        )
        await dut.stop()
    return report


async def run_against_rping_client(
    cases: Iterable[Case], *extra: str, options: RunOptions = QUICK
) -> RunReport:
    """Run DUT-connecting ``cases`` with ``iwarp rping -c EXTRA`` connecting (in-process)."""
    port = free_port()
    args = rping_args("-c", "-a", "127.0.0.1", "-p", str(port), "-C", "1", "--timeout", "3",
                      *extra)  # fmt: skip
    async with trio.open_nursery() as nursery:
        dut = InProcessDut(nursery, lambda: run_client(args))
        report = await run_cases(
            list(cases),
            profile("rping"),
            options,
            listen=("127.0.0.1", port),
            restarter=dut,
            progress=lambda line: None,
        )
        await dut.stop()
    return report


@asynccontextmanager
async def kbtp_target(*argv: str) -> Any:
    """A running ``kbtp target ARGV`` (in-process); yields its port.  It serves every
    connection, so it needs no restart."""
    args = kbtp_target_args("--host", "127.0.0.1", "-p", "0", "--quiet", *argv)
    target = KbtpTarget(build_config(args), settings=mpa_settings(args), offload=args.offload)
    async with target.running("127.0.0.1", 0):
        yield target.port


def statuses(report: RunReport) -> dict[str, Status]:
    return {r.case.id: r.status for r in report.results}


def listens(app: str = "rping") -> list[Case]:
    return select(role=DutRole.LISTENS, app=app)


def connects(app: str = "rping") -> list[Case]:
    return select(role=DutRole.CONNECTS, app=app)


async def run_against_kbtp(
    cases: Iterable[Case], *extra: str, options: RunOptions = QUICK
) -> RunReport:
    """Run ``cases`` against ``kbtp target KBTP_ARGS EXTRA`` (in-process, serves them all)."""
    async with kbtp_target(*KBTP_ARGS, *extra) as port:
        return await run_cases(
            list(cases),
            profile("kbtp"),
            options,
            target=("127.0.0.1", port),
            restarter=NoRestart(settle=0),
            progress=lambda line: None,
        )


async def run_against_bench(cases: Iterable[Case], *, options: RunOptions = QUICK) -> RunReport:
    """Run ``cases`` against ``iwarp bench server`` (in-process, serves them all)."""
    async with trio.open_nursery() as nursery:
        server = BenchServer(host="127.0.0.1", port=0)
        port, _raw = await nursery.start(server.run)
        report = await run_cases(
            list(cases),
            profile("bench"),
            options,
            target=("127.0.0.1", port),
            restarter=NoRestart(settle=0),
            progress=lambda line: None,
        )
        nursery.cancel_scope.cancel()
    return report


DUTS = {
    "rping": (DutRole.LISTENS, "rping"),
    "rping-markers": (DutRole.LISTENS, "rping"),
    "rping-client": (DutRole.CONNECTS, "rping"),
    "rping-client-p2p": (DutRole.CONNECTS, "rping"),
    "rping-client-patient": (DutRole.CONNECTS, "rping"),
    "kbtp": (DutRole.LISTENS, "kbtp"),
    "bench": (DutRole.LISTENS, "bench"),
    "perftest": (DutRole.LISTENS, "perftest"),
}
"""The in-process DUTs of the tests: name -> (its role, its ``--app``)."""
SWEEP = {
    "rping-markers": ("MPA",),
    "rping-client-p2p": ("ERC", "MPA-19.3"),
    "rping-client-patient": ("MPA-18", "MPA-19", "MPA-24", "MPA-26", "MPA-27"),
    "perftest": ("DDP", "RDMAP", "EXT-01", "EXT-09"),
}
"""What a DUT's sweep covers when not every case (default: all it runs)."""


async def run_dut(name: str, cases: Iterable[Case], *, options: RunOptions = QUICK) -> RunReport:
    """Run ``cases`` against the in-process DUT ``name`` (:data:`DUTS`)."""
    if name == "rping":
        return await run_against_rping_server(cases, options=options)
    if name == "rping-markers":
        return await run_against_rping_server(cases, "--markers", options=options)
    if name == "rping-client":
        return await run_against_rping_client(cases, options=options)
    if name == "rping-client-p2p":
        return await run_against_rping_client(cases, "--p2p", "write", options=options)
    if name == "rping-client-patient":  # its own timeout does not end the startup first
        return await run_against_rping_client(cases, "--timeout", "30", options=options)
    if name == "kbtp":
        return await run_against_kbtp(cases, options=options)
    if name == "perftest":
        return await run_against_perftest(cases, options=options)
    return await run_against_bench(cases, options=options)


async def run_against_perftest(cases: Iterable[Case], *, options: RunOptions = QUICK) -> RunReport:
    """Run ``cases`` against this project's ``ib_write_bw -R`` server peer (in-process,
    restarted per case: it serves one exchange connection)."""
    port = free_port()
    opts = PerftestOptions("write", port=port, bind="127.0.0.1", out=io.StringIO())
    async with trio.open_nursery() as nursery:
        dut = InProcessDut(nursery, lambda: PerftestServer(opts).session())
        report = await run_cases(
            list(cases),
            profile("perftest"),
            options,
            target=("127.0.0.1", port),
            restarter=dut,
            progress=lambda line: None,
        )
        await dut.stop()
    return report


def cases_of(name: str, patterns: Iterable[str] = (), *, quick: bool = False) -> list[Case]:
    """The cases DUT ``name`` runs (its role and app), restricted to ``patterns`` (default:
    its :data:`SWEEP`); ``quick``: without the slow ones."""
    role, app = DUTS[name]
    chosen = list(patterns) or list(SWEEP.get(name, ()))
    picked = select(chosen, role=role, app=app)
    return [c for c in picked if not (quick and c.slow)]
