"""Bounds of the ``kbtp`` commands' numbers (kbtp/cli/bounds.py, docs/kbtp.md §11).

Out-of-range sizes, counts and times are one ``error:`` line and status 2 before anything
is mapped or served (``trio.run`` is stopped here, so a value that slips through fails at
once instead of serving); a configuration the target refuses or cannot map is a CLI error
for every command that builds one; ``kbtp bench`` LOAD rows check exactly the buffers
loaded.  Found by fuzzing the ``kbtp`` command.
"""

from __future__ import annotations

import errno
import math
from collections.abc import Iterator
from typing import Any

import pytest
import trio

from kbtp.cli import main
from kbtp.constants import DEFAULT_TICKET_TIMEOUT
from kbtp.initiator import KbtpInitiator
from kbtp.target_config import InitiatorConfig, TargetConfig, check_config
from stack.cli import CliError
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
# 1. sizes: block size, pool, table, receive buffers; config errors as CLI errors
# -------------------------------------------------------------------------------------


@pytest.mark.usefixtures("not_served")
@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["target", "--block-size", "1G"], "size must be 1 to 67108864"),
        (["target", "--pool-blocks", "2000000"], "at most 1048576"),
        (["target", "--block-size", "64M", "--pool-blocks", "100"], "more than 4294967296"),
        (["target", "--handles", "100000000"], "at most 4194304"),
        (["target", "--initiator", "x:handles=0x1000000000+5"], "block table of"),
        (["target", "--max-inline", "64M"], "octets per session"),
        (["target", "--credits", "70000"], "at most 65535"),
        (["target", "--initiators", "100000"], "at most 1024"),
        (["demo", "--block-size", "1G"], "size must be 1 to 67108864"),
        (["demo", "--block-size", "64M"], "more than 4294967296"),
        (["demo", "--credits", "100000"], "at most 65535"),
        (["bench", "-s", "4K,1G", "-n", "16"], "argument --sizes: size must be"),
        (["bench", "-s", "64M", "-n", "100"], "more than 4294967296"),
        (["bench", "-t", "100000"], "at most 65535"),
        (["bench", "--max-inline", "1G"], "size must be 1 to 67108864"),
        (["bench", "--bytes", "2G"], "size must be 1 to 1073741824"),
        (["bench", "--offload", "-s", "64M", "-t", "100"], "more than 4294967296"),
    ],
)
def test_sizes_beyond_the_bounds_are_refused_up_front(
    capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    _refused(capsys, argv, message)


def test_a_config_the_target_refuses_or_cannot_map_is_a_cli_error(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from kbtp.cli import target as cli_target
    from kbtp.cli.bounds import check_target_config

    with pytest.raises(CliError, match="request credits"):
        check_target_config(_config(request_credits=0))
    with pytest.raises(CliError, match="overlap"):
        check_target_config(
            TargetConfig(4096, 8, (InitiatorConfig(b"a", 0, 8, 4), InitiatorConfig(b"b", 4, 8, 4)))
        )

    def no_memory(*args: Any, **kwargs: Any) -> None:
        raise OSError(errno.ENOMEM, "Cannot allocate memory")

    monkeypatch.setattr(cli_target, "KbtpTarget", no_memory)
    bench = ["bench", "--in-process", "-s", "4K", "-n", "16", "--quiet"]
    for argv in (["demo", "--no-capture"], bench, ["target", "-p", "0"]):
        _refused(capsys, argv, "octets of target memory: Cannot allocate memory")


def test_the_bench_peer_refuses_a_bad_configuration_in_one_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from kbtp.cli.bench_peer import main as peer_main

    argv = ["--block-size=64M", "--pool-blocks=100", "--inflight=1", "--max-inline=4096"]
    assert peer_main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "more than 4294967296" in err, err


# -------------------------------------------------------------------------------------
# 2. --inline above --max-inline
# -------------------------------------------------------------------------------------


@pytest.mark.usefixtures("not_served")
def test_bench_inline_above_max_inline_is_refused_up_front(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = ["bench", "-s", "1K,4K", "-n", "16", "--inline", "--max-inline", "1024"]
    _refused(capsys, argv, "--inline: blocks of 4096 octets exceed --max-inline 1024")


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


# -------------------------------------------------------------------------------------
# 5. counts and times: negative, NaN, inf, 1e30, past the bound
# -------------------------------------------------------------------------------------

_BAD_NUMBERS = ["-1", "nan", "inf", "1e30", str(10**30)]


@pytest.mark.usefixtures("not_served")
@pytest.mark.parametrize("value", _BAD_NUMBERS)
@pytest.mark.parametrize(
    "argv",
    [
        ["bench", "-n"],
        ["bench", "-r"],
        ["bench", "-t"],
        ["demo", "-n"],
        ["demo", "--timeout"],
        ["demo", "--ticket-timeout"],
        ["target", "--duration"],
        ["target", "--ticket-timeout"],
        ["target", "--hello-timeout"],
        ["target", "--idle-timeout"],
    ],
)
def test_counts_and_times_out_of_range_are_argument_errors(
    capsys: pytest.CaptureFixture[str], argv: list[str], value: str
) -> None:
    _refused(capsys, [*argv, value], f"argument {argv[1]}")


# -------------------------------------------------------------------------------------
# 4. kbtp bench LOAD with fewer operations than in flight
# -------------------------------------------------------------------------------------


@pytest.mark.parametrize("layout", [[], ["--per-request"], ["--offload"]])
def test_bench_load_with_fewer_operations_than_in_flight_checks_the_loaded_buffers(
    capsys: pytest.CaptureFixture[str], layout: list[str]
) -> None:
    argv = ["bench", "-s", "4K", "-n", "2", "-t", "8", "--quiet", "--no-baseline"]
    code = _run([*argv, "--in-process", "--ops", "store,load", *layout])
    out = capsys.readouterr().out
    assert code == 0, out
    assert any(line.startswith("LOAD ") for line in out.splitlines()), out


@pytest.mark.parametrize("layout", [[], ["--per-request"]])
def test_bench_load_of_other_data_still_fails(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], layout: list[str]
) -> None:
    store = KbtpInitiator.store

    async def store_zeros(self: KbtpInitiator, handle: int, data: Any, **kwargs: Any) -> Any:
        return await store(self, handle, bytes(len(data)), **kwargs)

    monkeypatch.setattr(KbtpInitiator, "store", store_zeros)
    argv = ["bench", "-s", "4K", "-n", "2", "-t", "8", "--quiet", "--no-baseline"]
    _refused(capsys, [*argv, "--in-process", "--ops", "load", *layout], "LOAD returned wrong")
