"""``kbtp bench --connect``: a target started by hand (``kbtp target`` in its own process),
measured at its block size within what its HELLO_ACK grants, and left as it was found."""

from __future__ import annotations

import json
import socket
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest
import trio

from kbtp.constants import Status
from kbtp.initiator import KbtpInitiator
from kbtp.initiator_errors import KbtpStatusError
from tests.installed import run_command, started_target

BLOCK = 16 << 10
"""The block size the test's target serves (the bench has to take it from the HELLO_ACK)."""

QUOTA = 40
"""Allocation Quota of each of the test target's identities."""


@pytest.fixture(scope="module")
def target() -> Iterator[int]:
    """A ``kbtp target`` in its own process, as installed: its port."""
    with started_target(
        "--block-size", "16K", "--pool-blocks", "256", "--credits", "64",
        "--initiator", f"alpha:quota={QUOTA}", "--initiator", f"beta:quota={QUOTA}", "--quiet",
    ) as port:  # fmt: skip
        yield port


def bench(port: int, *argv: str) -> subprocess.CompletedProcess[str]:
    return run_command("kbtp", "bench", "--connect", f"127.0.0.1:{port}", *argv)


def document(result: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    assert result.returncode == 0, result.stderr
    doc: dict[str, Any] = json.loads(result.stdout)
    return doc


def with_session(port: int, identity: str, work: Any) -> Any:
    """Run ``await work(initiator)`` in a session of its own with the test's target."""

    async def main() -> Any:
        async with KbtpInitiator.connect("127.0.0.1", port, identity) as ini:
            return await work(ini)

    return trio.run(main)


def test_the_bench_measures_the_targets_block_size_and_frees_what_it_bound(target: int) -> None:
    """Two runs in a row as one identity: the second finds every handle free again (the
    first would make it fail with ALREADY_VALID), and a session afterwards can bind the
    handles the bench used.  The ALLOC_STORE row is cut to the quota left once each of the
    4 requests in flight has its block."""
    for _ in range(2):
        doc = document(bench(target, "--identity", "alpha", "-n", "100", "-t", "4", "--json", "-"))
        connect = doc["parameters"]["connect"]
        assert connect["identity"] == "alpha"
        assert connect["block_size_bytes"] == BLOCK and connect["quota_blocks"] == QUOTA
        assert doc["parameters"]["sizes_bytes"] == [BLOCK]
        assert doc["parameters"]["baseline"] is False
        rows = {row["operation"]: row for row in doc["results"]}
        assert set(rows) == {"STORE", "LOAD", "ALLOC_STORE"}
        assert rows["STORE"]["iterations"] == rows["LOAD"]["iterations"] == 100
        assert rows["ALLOC_STORE"]["iterations"] == QUOTA - 4
        assert all(row["size_bytes"] == BLOCK and row["ops_per_s"] > 0 for row in rows.values())

    async def bind_all(ini: KbtpInitiator) -> int:
        assert ini.ack is not None
        base = ini.ack.handle_base
        for handle in range(base, base + QUOTA):  # every handle the bench bound, and free
            await ini.alloc_store(handle, b"x" * BLOCK)
        for handle in range(base, base + QUOTA):
            await ini.free(handle)
        return base

    with_session(target, "alpha", bind_all)


def test_a_handle_bound_already_stops_the_bench_and_stays_bound(target: int) -> None:
    """A block bound before the bench (its third handle) ends the run with a one-line
    error; the bench frees the two it had bound and leaves the other's data as it was."""
    data = bytes(range(256)) * (BLOCK // 256)

    async def bind_third(ini: KbtpInitiator) -> int:
        assert ini.ack is not None
        await ini.alloc_store(ini.ack.handle_base + 2, data, seal=True)
        return ini.ack.handle_base

    base = with_session(target, "beta", bind_third)
    result = bench(target, "--identity", "beta", "-n", "64", "-t", "4")
    assert result.returncode == 2
    assert f"handle 0x{base + 2:x} of 'beta' is bound at the target already" in result.stderr
    assert "Traceback" not in result.stderr

    async def check(ini: KbtpInitiator) -> None:
        assert await ini.load(base + 2) == data  # not written, not freed
        for handle in (base, base + 1):  # the bench's own: freed
            await ini.alloc_store(handle, b"y")
            await ini.free(handle)
        await ini.free(base + 2)
        with pytest.raises(KbtpStatusError) as excinfo:
            await ini.load(base + 2)
        assert excinfo.value.status is not Status.SUCCESS

    with_session(target, "beta", check)


def test_per_request_buffers_use_the_identitys_handles_too(target: int) -> None:
    doc = document(
        bench(target, "--identity", "beta", "-n", "64", "-t", "2", "--per-request", "--json", "-")
    )
    rows = {row["operation"]: row["iterations"] for row in doc["results"]}
    assert rows == {"STORE": 64, "LOAD": 64, "ALLOC_STORE": QUOTA - 2}


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["-s", "4K"], "--sizes does not go with --connect"),
        (["--floor"], "--floor does not go with --connect"),
        (["--in-process"], "--in-process does not go with --connect"),
        (["--max-inline", "100"], "--max-inline does not go with --connect"),
        (["--cpus", "0,0"], "give one CPU"),
        (["--identity", "nobody"], "refused identity 'nobody': UNKNOWN_INITIATOR"),
        (["--identity", ""], "an identity is at least one octet"),
        (["--identity", "alpha", "-t", "65"], "grants 'alpha' 64 Request Credits"),
        (["--identity", "alpha", "-t", "40"], "a quota of 40 blocks"),
        (["--identity", "alpha", "--inline"], "exceed the target's Max Inline 4096"),
    ],
)
def test_what_does_not_go_with_a_target_started_by_hand(
    target: int, argv: list[str], message: str
) -> None:
    result = bench(target, "-n", "64", *argv)
    assert result.returncode == 2
    assert message in result.stderr
    assert result.stderr.count("\n") == 1  # one line, no traceback


def test_identity_needs_connect_and_an_absent_target_is_one_line() -> None:
    alone = run_command("kbtp", "bench", "--identity", "alpha")
    assert alone.returncode == 2 and "--identity names who says HELLO" in alone.stderr
    with socket.socket() as unlistened:  # bound, never listening: connections are refused
        unlistened.bind(("127.0.0.1", 0))
        port = unlistened.getsockname()[1]
        gone = run_command("kbtp", "bench", "--connect", f"127.0.0.1:{port}", "-n", "64")
    assert gone.returncode == 2
    assert f"cannot start a session with the KBTP target at 127.0.0.1:{port}" in gone.stderr
    assert gone.stderr.count("\n") == 1
