"""``iwarp bench`` option checks made before any work: the bounds of the counts and depths,
and a session the server would refuse (``MAX_SESSION_BYTES``) refused by the client up
front with the memory it needs, computed by :class:`SessionSpec` itself."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
import trio

from stack.bench import BenchError, BenchOptions, SessionSpec
from stack.bench.options import (
    MAX_DEPTH,
    MAX_IDLE_PARALLEL,
    MAX_QPS,
    MAX_RX_DEPTH,
    MAX_SIZE,
)
from stack.bench.protocol import MAX_SESSION_BYTES
from stack.cli import CliError
from stack.cli.iwarp import main
from stack.transport.cm import MAX_STARTUPS_PER_PEER
from stack.transport.startup_slots import STARTUP_STALE_AFTER

MIB = 1 << 20


class Started(BaseException):
    """Raised where the command would have started its run."""


def _stopped(*_args: object, **_kwargs: object) -> Any:
    raise Started


@pytest.fixture
def no_run(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(trio, "run", _stopped)
    monkeypatch.setattr(subprocess, "Popen", _stopped)


def _refused(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """The one error line of ``iwarp <argv>``, which must exit 2 before any work."""
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert not captured.out and len(captured.err.splitlines()) == 1, captured.err
    return captured.err


def _starts(argv: list[str]) -> bool:
    try:
        main(argv)
    except Started:
        return True
    return False


# ------------------------------------------------------------------ session memory
@pytest.mark.usefixtures("no_run")
@pytest.mark.parametrize(
    ("argv", "needs"),
    [
        (["send", "--lat", "-s", "512M"], "1610612736 bytes (1.5 GiB)"),
        (["send", "-s", "1G"], "2147483648 bytes (2 GiB)"),
        (["write", "--lat", "-s", "600M"], "1258291200 bytes (1.17188 GiB)"),
        (["send", "--lat", "-s", "400M", "--connect", "127.0.0.1"], "(1.17188 GiB)"),
        (["send", "--lat", "-s", "512M", "--in-process"], "1610612736 bytes"),
    ],
    ids=" ".join,
)
def test_a_session_the_server_refuses_is_refused_by_the_client_up_front(
    argv: list[str], needs: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """``send --lat -s 512M`` asks the server for three regions of 512 MiB: refused before
    a server is spawned or a connection made, not by the server's MPA reject."""
    err = _refused(["bench", *argv, "--quiet"], capsys)
    assert err.startswith(f"iwarp bench {argv[0]}: error: -s ")
    assert needs in err and f"{MAX_SESSION_BYTES} (1 GiB)" in err


@pytest.mark.usefixtures("no_run")
@pytest.mark.parametrize(
    "argv",
    [
        ["write", "-s", "1G"],  # one region: exactly the limit
        ["read", "--lat", "-s", "1G"],
        ["send", "-s", "512M"],  # target and inbox
        ["send", "--lat", "-s", str(MAX_SESSION_BYTES // 3)],
        ["write", "--lat", "-s", "512M"],
        ["send", "-a", "--lat"],
        ["atomic"],
    ],
    ids=" ".join,
)
def test_a_session_within_the_limit_starts(argv: list[str]) -> None:
    assert _starts(["bench", *argv, "--quiet"])


@pytest.mark.parametrize("test", ["write", "read", "send", "atomic"])
@pytest.mark.parametrize("latency", [False, True])
@pytest.mark.parametrize("size", [8, 300 * MIB, 400 * MIB, 512 * MIB, 513 * MIB, MAX_SIZE])
def test_the_client_refuses_exactly_what_the_server_rejects(
    test: str, latency: bool, size: int
) -> None:
    """One computation: the client's check against SessionSpec.decode, the server's."""
    opts = BenchOptions(test, (size,), latency=latency)
    pong = (1, 0, size) if test == "write" and latency else None  # as the client sends it
    spec = SessionSpec(test, size, latency, 0, pong)
    try:
        SessionSpec.decode(spec.encode())
        server_accepts = True
    except BenchError:
        server_accepts = False
    try:
        opts.check_sessions()
        client_accepts = True
    except CliError:
        client_accepts = False
    assert client_accepts == server_accepts


# ------------------------------------------------------------------ bounds
def test_the_bounds_are_the_limits_they_name() -> None:
    assert MAX_IDLE_PARALLEL == MAX_STARTUPS_PER_PEER
    assert SessionSpec.decode(SessionSpec("send", 64, rx_depth=MAX_RX_DEPTH).encode())
    with pytest.raises(BenchError, match="bad rx depth"):
        SessionSpec.decode(SessionSpec("send", 64, rx_depth=MAX_RX_DEPTH + 1).encode())
    # The default receive depth at the deepest -t and the smallest Sends is still served.
    deepest = BenchOptions("send", (2,), tx_depth=MAX_DEPTH)
    assert deepest.rx_depth_for(2) <= MAX_RX_DEPTH


@pytest.mark.usefixtures("no_run")
@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["bench", "write", "-q", str(MAX_QPS + 1)], f"at most {MAX_QPS}"),
        (["bench", "write", "-t", str(MAX_DEPTH + 1)], f"at most {MAX_DEPTH}"),
        (["bench", "write", "-l", str(MAX_DEPTH + 1)], f"at most {MAX_DEPTH}"),
        (["bench", "write", "-Q", str(MAX_DEPTH + 1)], f"at most {MAX_DEPTH}"),
        (["bench", "send", "--rx-depth", str(MAX_RX_DEPTH + 1)], f"at most {MAX_RX_DEPTH}"),
        (["bench", "idle-qps", "-q", str(MAX_QPS + 1)], f"at most {MAX_QPS}"),
        (["bench", "idle-qps", "--parallel", str(MAX_IDLE_PARALLEL + 1)], "at most 64"),
        (["bench", "ib_write_bw", "-q", str(MAX_QPS + 1)], f"at most {MAX_QPS}"),
        (["bench", "ib_write_bw", "-t", str(MAX_DEPTH + 1)], f"at most {MAX_DEPTH}"),
        (["bench", "ib_write_bw", "-Q", str(MAX_DEPTH + 1)], f"at most {MAX_DEPTH}"),
        (["bench", "ib_send_bw", "-r", str(MAX_DEPTH + 1)], f"at most {MAX_DEPTH}"),
        (["bench", "ib_read_bw", "-o", "129"], "at most 128"),
        (["bench", "ib_atomic_bw", "-o", "129"], "at most 128"),
        (["cmatose", "-C", "0", "-c", "513"], "at most 512"),
        (["cmatose", "-c", "100000", "-C", "0"], "at most 512"),
        (["rping", "-c", "-a", "127.0.0.1", "-C", str(1 << 31)], "0 to 2147483647"),
        (["siwvm", "boot-check", "--smp", "256"], "at most 255"),
    ],
    ids=" ".join,
)
def test_a_count_beyond_its_bound_is_refused(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and message in err, err


@pytest.mark.usefixtures("no_run")
@pytest.mark.parametrize(
    "argv",
    [
        ["bench", "write", "-q", "4", "-t", str(MAX_DEPTH), "-l", str(MAX_DEPTH), "-s", "64"],
        ["bench", "send", "--rx-depth", str(MAX_RX_DEPTH), "-s", "64"],
        ["bench", "idle-qps", "-q", str(MAX_QPS), "--parallel", str(MAX_IDLE_PARALLEL)],
        ["bench", "ib_read_bw", "-o", "128", "-q", "2", "-t", str(MAX_DEPTH), "127.0.0.1"],
        ["cmatose", "-C", "0", "-c", "512"],
        ["rping", "-c", "-a", "127.0.0.1", "-C", str((1 << 31) - 1)],
    ],
    ids=" ".join,
)
def test_a_count_at_its_bound_starts(argv: list[str]) -> None:
    assert _starts(argv)


def test_the_campaign_doc_states_the_per_address_startup_rule() -> None:
    """docs/campaign.md gives the listener's per-address limit and its stale-slot rule with
    the values the code has (the bound of idle-qps --parallel rests on it)."""
    doc = " ".join((Path(__file__).parents[2] / "docs" / "campaign.md").read_text().split())
    assert f"{MAX_STARTUPS_PER_PEER} from one address (`MAX_STARTUPS_PER_PEER`" in doc
    assert f"older than `STARTUP_STALE_AFTER` ({STARTUP_STALE_AFTER:g} s)" in doc
    assert "own oldest slot still without an MPA Request" in doc
    assert f"`iwarp bench idle-qps --parallel` is at most {MAX_IDLE_PARALLEL}" in doc
