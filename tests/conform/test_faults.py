"""A deliberately broken DUT: each fault of :mod:`stack.conform.faults` turns exactly its
cases to FAIL (or WARN, or SKIP) while every other case of its scope keeps the verdict it
has against our unbroken stack (the session's baseline sweeps)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import trio

import stack.transport.cm as cm
from stack.conform import Status, exit_status, select
from stack.conform.faults import FAULTS, injected
from stack.conform.faults_model import fault_table_markdown
from stack.conform.model import Case
from stack.conform.registry import SelectionError
from stack.rnic.memory import StagTable
from tests.conform.conftest import Baselines
from tests.conform.helpers import (
    DUTS,
    FAST,
    QUICK,
    SHORT_TIMERS,
    run_against_rping_server,
    run_dut,
)


def _scope(name: str, dut: str) -> list[Case]:
    """The fault's cases (its ``fails`` and ``scope``) that DUT ``dut`` runs: the quick ones,
    and the slow ones (startup timers) the fault names in ``fails``."""
    fault = FAULTS[name]
    role, app = DUTS[dut]
    out: dict[str, Case] = {}
    for pattern in (*fault.fails, *fault.scope):
        try:
            picked = select([pattern], role=role, app=app)
        except SelectionError:
            continue
        out.update((c.id, c) for c in picked if not c.slow or c.id in fault.fails)
    return list(out.values())


def _duts(name: str) -> list[str]:
    fault = FAULTS[name]
    first = ["rping", "rping-client"] if fault.app == "rping" else [fault.app]
    return first + [d for d in fault.also if d not in first]


@pytest.mark.parametrize("name", sorted(FAULTS))
def test_fault_changes_exactly_its_cases(name: str, baselines: Baselines) -> None:
    fault = FAULTS[name]
    seen: dict[str, Status] = {}
    for dut in _duts(name):
        cases = _scope(name, dut)
        if not cases:
            continue
        base = baselines.statuses(dut)

        async def run(cases: list[Case] = cases, dut: str = dut) -> dict[str, Status]:
            with injected(name, **SHORT_TIMERS):  # as in the baseline sweeps
                report = await run_dut(dut, cases, options=FAST)
            return {r.case.id: r.status for r in report.results}

        for cid, status in trio.run(run).items():
            # A case that does not apply to this DUT (SKIP) cannot be broken on it.
            changes = cid in fault.fails and base[cid] is not Status.SKIP
            want = Status(fault.fails[cid]) if changes else base[cid]
            assert status is want, f"{name} on {dut}: {cid} is {status.value}, not {want.value}"
            if changes:
                seen[cid] = status
    assert set(fault.fails) <= set(seen), f"{name}: never broke {set(fault.fails) - set(seen)}"


def test_every_fault_breaks_something_and_names_known_cases() -> None:
    ids = {c.id for c in select()}
    for fault in FAULTS.values():
        assert fault.fails and set(fault.fails) <= ids, fault.name
        assert set(fault.fails.values()) <= {"FAIL", "WARN", "SKIP"}
        assert fault.app in DUTS


def test_every_case_can_be_failed_by_some_fault() -> None:
    """A case that no fault can fail is a defect: each case is in some fault's ``fails``."""
    named = {cid for fault in FAULTS.values() for cid in fault.fails}
    unfailed = [c.id for c in select() if c.id not in named]
    assert not unfailed, f"no fault fails {unfailed}"


def test_docs_fault_table_is_current() -> None:
    """docs/conform.md's fault table is :func:`fault_table_markdown` of :data:`FAULTS`."""
    doc = (Path(__file__).resolve().parents[2] / "docs" / "conform.md").read_text()
    assert fault_table_markdown(FAULTS.values()) in doc, (
        "docs/conform.md's fault table is stale: regenerate it with "
        "stack.conform.faults_model.fault_table_markdown(FAULTS.values())"
    )


async def test_strict_turns_a_should_fault_into_a_failure() -> None:
    cases = [c for c in select(["MPA-12"]) if c.id == "MPA-12"]
    with injected("terminate-headers"):
        normal = await run_against_rping_server(cases)
        strict = await run_against_rping_server(cases, options=replace(QUICK, strict=True))
    (warn,), (fail,) = normal.results, strict.results
    assert warn.status is Status.WARN and exit_status(normal.results) == 0
    assert (warn.rule_not_met, warn.level) == ("RDMAP-12", "SHOULD")
    assert fail.status is Status.FAIL and exit_status(strict.results) == 1


def test_injected_restores_every_fault_point() -> None:
    original = cm.IwarpConnection, cm.RdmaConnection, StagTable.register
    with injected("crc-unchecked", "stags-sequential", "ird-unenforced", request_timeout=1.0):
        assert cm.IwarpConnection is not original[0] and cm.RdmaConnection is not original[1]
        assert StagTable.register is not original[2]
    assert (cm.IwarpConnection, cm.RdmaConnection, StagTable.register) == original
    with pytest.raises(KeyError), injected("no-such-fault"):
        pass
    assert cm.IwarpConnection is original[0]
