"""The target mode of the KBTP tests: ``both_targets`` tests run against both targets.

A test (or module, by ``pytestmark``) marked ``both_targets`` runs once with the software
target and once with the offloaded one (docs/kbtp.md §8.1: the initiator cannot tell the
difference).  Every other test gets the software target.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.kbtp import targets


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if metafunc.definition.get_closest_marker("both_targets") is not None:
        metafunc.parametrize("target_mode", targets.MODES, indirect=True)


@pytest.fixture(autouse=True)
def target_mode(request: pytest.FixtureRequest) -> Iterator[str]:
    """The mode the test's targets start in (tests.kbtp.targets)."""
    mode = str(getattr(request, "param", "software"))
    targets.select(mode)
    yield mode
    targets.select("software")
