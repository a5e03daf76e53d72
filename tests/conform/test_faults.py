"""A deliberately broken DUT: each fault of :mod:`stack.conform.faults` turns exactly its
cases to FAIL (or WARN) while every other case keeps its verdict against our stack."""

from __future__ import annotations

from dataclasses import replace

import pytest

import stack.transport.cm as cm
from stack.conform import DutRole, Status, exit_status, select
from stack.conform.faults import FAULTS, injected
from tests.conform.helpers import QUICK, run_against_rping_client, run_against_rping_server

BASELINE_SKIPS = {
    DutRole.LISTENS: {"MPA-05", "MPA-08"},
    DutRole.CONNECTS: {"ERC-08.4", "ERC-09", "ERC-09.2"},
}
"""What our stack declines without a fault (tests/conform/test_own_stack.py checks why)."""


def _quick(role: DutRole) -> list:  # type: ignore[type-arg]
    return [c for c in select(role=role, app="rping") if not c.slow]


async def _run(name: str, role: DutRole, *extra: str) -> dict[str, Status]:
    with injected(name):
        if role is DutRole.LISTENS:
            report = await run_against_rping_server(_quick(role), *extra)
        else:
            report = await run_against_rping_client(_quick(role), *extra)
    return {r.case.id: r.status for r in report.results}


@pytest.mark.parametrize("name", sorted(FAULTS))
async def test_fault_fails_exactly_its_cases(name: str) -> None:
    fault = FAULTS[name]
    runs: list[tuple[DutRole, tuple[str, ...]]] = []
    if any(select([c])[0].role is DutRole.LISTENS for c in fault.fails):
        runs.append((DutRole.LISTENS, ()))
    if any(select([c])[0].role is DutRole.CONNECTS for c in fault.fails):
        runs.append((DutRole.CONNECTS, ("--p2p", "write") if name == "wrong-rtr" else ()))
    seen: dict[str, Status] = {}
    for role, extra in runs:
        got = await _run(name, role, *extra)
        skips = BASELINE_SKIPS[role] if not extra else set()
        for cid, status in got.items():
            want = (
                Status(fault.fails[cid])
                if cid in fault.fails
                else (Status.SKIP if cid in skips else Status.PASS)
            )
            assert status is want, f"{name}: {cid} is {status.value}, expected {want.value}"
        seen.update(got)
    assert set(fault.fails) <= set(seen)


async def test_strict_turns_a_should_fault_into_a_failure() -> None:
    cases = select(["MPA-12"])
    with injected("terminate-headers"):
        normal = await run_against_rping_server(cases)
        strict = await run_against_rping_server(cases, options=replace(QUICK, strict=True))
    (warn,), (fail,) = normal.results, strict.results
    assert warn.status is Status.WARN and exit_status(normal.results) == 0
    assert (warn.rule_not_met, warn.level) == ("RDMAP-12", "SHOULD")
    assert fail.status is Status.FAIL and exit_status(strict.results) == 1


def test_injected_restores_the_engine_factory() -> None:
    original = cm.IwarpConnection
    with injected("crc-unchecked", request_timeout=1.0):
        assert cm.IwarpConnection is not original
    assert cm.IwarpConnection is original
    with pytest.raises(KeyError), injected("no-such-fault"):
        pass
    assert cm.IwarpConnection is original
