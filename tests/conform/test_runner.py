"""The run loop's restart handling and its robustness against a broken case."""

from __future__ import annotations

from pathlib import Path

import trio

from stack.conform import CommandRestarter, Status, Verdict, profile, run_cases
from stack.conform.context import CaseContext
from stack.conform.model import Case, DutRole
from tests.conform.helpers import QUICK


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
