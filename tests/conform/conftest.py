"""Session fixtures: one sweep of every case against each in-process DUT of our stack.

The sweeps are the baseline the own-stack tests judge (every case PASSes or SKIPs with its
reason) and the fault tests compare against (a fault changes exactly its cases)."""

from __future__ import annotations

import pytest
import trio

from stack.conform import RunReport, Status
from stack.conform.faults import injected
from tests.conform.helpers import DUTS, SHORT_TIMERS, cases_of, run_dut

SWEEPS = tuple(DUTS)
"""Every in-process DUT; the sweep of each runs all its cases (startup timers shortened)."""


class Baselines:
    """Sweep reports by DUT name, run on first use (once per test session)."""

    def __init__(self) -> None:
        self._reports: dict[str, RunReport] = {}

    def report(self, name: str) -> RunReport:
        if name not in self._reports:

            async def sweep() -> RunReport:
                with injected(**SHORT_TIMERS):
                    return await run_dut(name, cases_of(name))

            self._reports[name] = trio.run(sweep)
        return self._reports[name]

    def statuses(self, name: str) -> dict[str, Status]:
        return {r.case.id: r.status for r in self.report(name).results}


_BASELINES = Baselines()


@pytest.fixture(scope="session")
def baselines() -> Baselines:
    return _BASELINES
