"""One scenario table, every API: each scenario of :mod:`tests.e2e.verbs_scenarios` over real
loopback TCP through the trio API, the sync API, and a sync client against a trio server and
the other way round."""

from __future__ import annotations

import pytest

from tests.e2e.test_tcp import VARIANTS
from tests.e2e.verbs_scenarios import MODES, SCENARIOS, run_async, run_sync


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("name", list(SCENARIOS))
async def test_scenario(name: str, mode: str) -> None:
    client_api, server_api = MODES[mode]
    await run_async(SCENARIOS[name], client_api, server_api)


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_scenario_in_plain_python(name: str) -> None:
    run_sync(SCENARIOS[name])


@pytest.mark.parametrize("variant", ["rev1-crc", "markers-both", "p2p-read-rtr", "rev2-nocrc"])
@pytest.mark.parametrize("name", ["write-with-immediate", "rdma-read", "atomics"])
def test_scenario_in_plain_python_under_mpa_variants(name: str, variant: str) -> None:
    """``CMId.listen`` / ``connect`` take each side's MPA settings."""
    run_sync(SCENARIOS[name], *VARIANTS[variant])
