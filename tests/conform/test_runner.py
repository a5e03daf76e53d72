"""The run loop's restart handling and its robustness against a broken case."""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import replace
from pathlib import Path

import pytest
import trio

from stack.conform import CommandRestarter, Status, Verdict, profile, run_cases
from stack.conform.context import CaseContext
from stack.conform.model import Case, DutRole
from stack.constants import MPA_KEY_REP
from tests.conform.helpers import QUICK, listens, run_against_rping_server, statuses


def _alive(pid: int) -> bool:
    stat = Path(f"/proc/{pid}/stat")
    try:
        return stat.read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


async def test_restart_command_runs_per_case_and_its_whole_group_ends(tmp_path: Path) -> None:
    """The command's children (not just the shell) are gone after the case."""
    pids = tmp_path / "pids"
    log: list[str] = []
    restarter = CommandRestarter(
        f"sleep 60 & echo $! >> {pids}; sleep 60", host="127.0.0.1", port=7, log=log.append
    )
    case = Case("MPA-18", "t", ("MPA-18",), "MUST", DutRole.LISTENS, "s", "e", _noop)
    for _ in range(2):
        await restarter.before_case(case)
        with trio.fail_after(5):
            while not pids.exists() or len(pids.read_text().split()) < len(log):
                await trio.sleep(0.02)
        await restarter.after_case(case)
    children = [int(p) for p in pids.read_text().split()]
    assert len(children) == 2 and not any(_alive(p) for p in children)
    assert log == ["restart: " + restarter.command] * 2


async def _noop(ctx: CaseContext) -> Verdict:
    return Verdict.met("nothing")


async def _buggy(ctx: CaseContext) -> Verdict:
    raise RuntimeError("a bug in the case")


async def test_a_case_that_raises_is_an_error_and_the_run_goes_on() -> None:
    buggy = Case("MPA-18", "buggy", ("MPA-18",), "MUST", DutRole.LISTENS, "s", "e", _buggy)
    fine = Case("MPA-12", "fine", ("MPA-12",), "MUST", DutRole.LISTENS, "s", "e", _noop)
    report = await run_cases([buggy, fine], profile("rping"), QUICK, target=("127.0.0.1", 9),
                             progress=lambda line: None)  # fmt: skip
    (first, second) = report.results
    assert (
        first.status is Status.ERROR and "RuntimeError: a bug in the case" in first.verdict.observed
    )
    assert second.status is Status.PASS


# ---------------------------------------------------------------------- preflight
_NOOPS = [
    Case("MPA-18", "a", ("MPA-18",), "MUST", DutRole.LISTENS, "s", "e", _noop),
    Case("MPA-12", "b", ("MPA-12",), "MUST", DutRole.LISTENS, "s", "e", _noop),
]
PREFLIGHT = replace(QUICK, preflight=True, timeout=0.5, wait=0.5)


@asynccontextmanager
async def _fake_dut(answer: bytes | None, hold: bool) -> AsyncIterator[tuple[int, list[int]]]:
    """A TCP listener on loopback that answers each connection's first bytes with
    ``answer`` (None: nothing), then holds it open (``hold``) or closes it; yields its port
    and the list that counts its connections."""
    accepted: list[int] = []
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")

    async def serve(stream: trio.SocketStream) -> None:
        accepted.append(1)
        async with stream:
            if answer is not None:
                await stream.receive_some(4096)
                await stream.send_all(answer)
            if hold:
                await trio.sleep_forever()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(trio.serve_listeners, serve, listeners)
        yield listeners[0].socket.getsockname()[1], accepted
        nursery.cancel_scope.cancel()


@pytest.mark.parametrize(
    ("answer", "hold", "why"),
    [
        (None, True, "the DUT sent nothing for"),
        (None, False, "the DUT closed the connection after"),
        (b"SSH-2.0-OpenSSH_9.2p1\r\n", True, "bytes that are no MPA frame"),
    ],
    ids=["silent", "closes", "not-mpa"],
)
async def test_preflight_reports_every_case_not_run_when_the_dut_speaks_no_mpa(
    answer: bytes | None, hold: bool, why: str
) -> None:
    """One connection, then every case is an ERROR saying why (the noop cases would pass)."""
    lines: list[str] = []
    async with _fake_dut(answer, hold) as (port, accepted):
        report = await run_cases(
            _NOOPS, profile("rping"), PREFLIGHT, target=("127.0.0.1", port), progress=lines.append
        )
    assert accepted == [1]
    assert [r.status for r in report.results] == [Status.ERROR, Status.ERROR]
    assert all(r.verdict.observed.startswith("not run: ") for r in report.results)
    assert why in report.results[0].verdict.observed
    assert any(line.startswith("preflight: ") and why in line for line in lines)


async def test_preflight_says_when_nothing_listens() -> None:
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    report = await run_cases(
        _NOOPS, profile("rping"), PREFLIGHT, target=("127.0.0.1", port), progress=print
    )
    assert {r.status for r in report.results} == {Status.ERROR}
    assert "did not listen within 0.5 s" in report.results[1].verdict.observed


async def test_preflight_passes_a_dut_whose_reply_is_broken() -> None:
    """A Reply key with garbage after it is an MPA speaker with a bug: the cases judge it."""
    broken = MPA_KEY_REP + b"\xff" * 40
    async with _fake_dut(broken, True) as (port, accepted):
        report = await run_cases(
            _NOOPS, profile("rping"), PREFLIGHT, target=("127.0.0.1", port), progress=print
        )
    assert accepted == [1]  # the noop cases connect to nothing
    assert [r.status for r in report.results] == [Status.PASS, Status.PASS]


async def test_preflight_passes_a_real_dut_and_the_cases_run() -> None:
    cases = [c for c in listens() if c.id == "MPA-12"]
    report = await run_against_rping_server(cases, options=replace(QUICK, preflight=True))
    assert statuses(report) == {"MPA-12": Status.PASS}


# ---------------------------------------------------------------------- a DUT that goes away
async def _connects(ctx: CaseContext) -> Verdict:
    await ctx.connect()
    return Verdict.met("connected")


async def _accepts(ctx: CaseContext) -> Verdict:
    await ctx.accept()
    return Verdict.met("accepted")


def _cases(body: Callable[[CaseContext], Awaitable[Verdict]], role: DutRole) -> list[Case]:
    return [Case(f"MPA-1{i}", "c", ("MPA-18",), "MUST", role, "s", "e", body) for i in range(5)]


async def test_a_dut_that_stops_listening_ends_the_run_after_two_cases() -> None:
    """The first case reaches the DUT, which then goes away: two cases wait --wait for it,
    the two left are not run (each would wait too)."""
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]

    async def once() -> None:
        stream = await listeners[0].accept()
        await listeners[0].aclose()  # the DUT crashed
        await stream.aclose()

    lines: list[str] = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(once)
        report = await run_cases(
            _cases(_connects, DutRole.LISTENS), profile("rping"), replace(QUICK, wait=0.3),
            target=("127.0.0.1", port), progress=lines.append,
        )  # fmt: skip
    observed = [r.verdict.observed for r in report.results]
    assert [r.status for r in report.results] == [Status.PASS] + [Status.ERROR] * 4
    assert all("did not listen within 0.3 s" in o for o in observed[1:3])
    assert all(o.startswith("not run: the DUT is gone (") for o in observed[3:])
    assert any("the 2 cases left are not run" in line for line in lines)


async def test_a_dut_that_never_connects_ends_the_run_after_two_cases() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    report = await run_cases(
        _cases(_accepts, DutRole.CONNECTS), profile("rping"), replace(QUICK, wait=0.2),
        listen=("127.0.0.1", port), progress=print,
    )  # fmt: skip
    observed = [r.verdict.observed for r in report.results]
    assert all("did not connect within 0.2 s" in o for o in observed[:2])
    assert all(o.startswith("not run: the DUT is gone (") for o in observed[2:])
    assert [r.seconds for r in report.results[2:]] == [0.0] * 3
