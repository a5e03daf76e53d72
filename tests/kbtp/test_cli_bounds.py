"""Bounds of the ``kbtp`` commands' numbers (kbtp/cli/bounds.py, docs/kbtp.md §11).

Out-of-range sizes, counts and times are one ``error:`` line and status 2 before anything
is mapped or served (``trio.run`` is stopped here, so a value that slips through fails at
once instead of serving); a configuration the target refuses or cannot map is a CLI error
for every command that builds one; ``kbtp bench`` LOAD rows check exactly the buffers
loaded.  Found by fuzzing the ``kbtp`` command.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import pytest
import trio

from kbtp.cli import main
from kbtp.constants import DEFAULT_TICKET_TIMEOUT
from kbtp.target_config import InitiatorConfig, TargetConfig, check_config
from stack.errors import LocalError


def _run(argv: list[str]) -> int:
    try:
        return main(argv)
    except SystemExit as exc:  # argparse errors exit from inside
        return int(exc.code or 0)


def _refused(capsys: pytest.CaptureFixture[str], argv: list[str], message: str) -> None:
    code = _run(argv)
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "error: " in err and message in err, err


@pytest.fixture
def not_served(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """A command that gets as far as running its event loop fails the test at once."""

    def started(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("the command started serving")

    monkeypatch.setattr(trio, "run", started)
    yield


def _config(**fields: Any) -> TargetConfig:
    return TargetConfig(
        block_size=4096, pool_blocks=8, initiators=(InitiatorConfig(b"a", 0, 8, 8),), **fields
    )


# -------------------------------------------------------------------------------------
# 3. the Ticket Timeout: what HELLO_ACK's 32 bits of milliseconds carry
# -------------------------------------------------------------------------------------


@pytest.mark.parametrize("timeout", [math.inf, 1e30, math.nan, 0.0, -1.0, 0.0004, 4.3e6])
def test_a_ticket_timeout_hello_ack_cannot_carry_is_refused(timeout: float) -> None:
    with pytest.raises(LocalError, match="Ticket Timeout"):
        check_config(_config(ticket_timeout=timeout))


@pytest.mark.parametrize("timeout", [0.001, DEFAULT_TICKET_TIMEOUT, 4.2e6])
def test_a_ticket_timeout_hello_ack_carries_is_kept(timeout: float) -> None:
    check_config(_config(ticket_timeout=timeout))


@pytest.mark.parametrize("timeout", [math.inf, math.nan, 0.0])
def test_hello_and_idle_timeouts_are_positive_and_finite(timeout: float) -> None:
    for fields in ({"hello_timeout": timeout}, {"idle_timeout": timeout}):
        with pytest.raises(LocalError, match="positive and finite"):
            check_config(_config(**fields))
    check_config(_config(idle_timeout=None))
