"""``kbtp bench --cpus CLIENT[,TARGET]``: the initiator on one CPU, every process the bench
starts (the target and raw server, the floor's target, Mooncake's server) on the other.
Every run that pins the bench is a process of its own: pinning this one would pin the tests."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import trio

from kbtp.cli import bench_floor, bench_mooncake
from kbtp.cli.bench_floor import floor_process
from kbtp.cli.bench_mooncake import mooncake_available, run_mooncake
from kbtp.cli.bench_peer import peer_process
from kbtp.cli.target import LOOPBACK_EMSS
from tests.installed import TWO_CPUS, run_command
from tests.installed import needs_two_cpus as needs_two
from tests.installed import two_cpus as _cpus

MPA = ["--crc", f"--emss={LOOPBACK_EMSS}"]


def _kbtp(*argv: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """``kbtp ...`` as the installed command runs it, outside the checkout."""
    return run_command("kbtp", *argv, timeout=timeout)


def _children() -> set[int]:
    """Process ids of this process's children (every thread's, from /proc)."""
    found: set[int] = set()
    for task in os.listdir("/proc/self/task"):
        with open(f"/proc/self/task/{task}/children") as f:
            found.update(int(w) for w in f.read().split())
    return found


@needs_two
def test_the_initiator_and_what_it_starts_run_where_asked(tmp_path: Path) -> None:
    client, target = _cpus()
    out = tmp_path / "kbtp.json"
    done = _kbtp(
        "bench", "-s", "4K", "-n", "64", "--ops", "store,load", "--floor",
        "--cpus", f"{client},{target}", "--json", str(out), "--quiet",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    doc = json.loads(out.read_text())
    assert doc["parameters"]["cpus"] == {"client": client, "target": target}
    assert f"(initiator on CPU {client}, target on CPU {target}, --cpus)" in done.stdout
    assert [r["operation"] for r in doc["results"]] == ["STORE", "LOAD"]
    assert all(r["floor"] for r in doc["results"])


@needs_two
def test_the_peer_pins_itself_though_started_by_a_process_elsewhere() -> None:
    _, target = _cpus()

    async def go() -> set[int]:
        async with peer_process(4096, 8, 1, 4096, MPA, cpu=target) as peer:
            return os.sched_getaffinity(peer.pid)

    assert trio.run(go) == {target}


@needs_two
def test_the_floor_target_pins_itself() -> None:
    _, target = _cpus()

    async def go() -> set[int]:
        before = _children()
        async with floor_process(target):
            (pid,) = _children() - before
            return os.sched_getaffinity(pid)

    assert trio.run(go) == {target}


def test_without_cpus_the_document_says_none(tmp_path: Path) -> None:
    out = tmp_path / "kbtp.json"
    done = _kbtp("bench", "-s", "4K", "-n", "32", "--ops", "load", "--json", str(out), "--quiet")
    assert done.returncode == 0, done.stderr
    assert json.loads(out.read_text())["parameters"]["cpus"] is None
    assert "--cpus" not in done.stdout


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--cpus", "0,1", "--in-process"], "--in-process runs the target in this process"),
        (["--cpus", "0,1", "--offload"], "--offload runs the target in this process"),
        (["--cpus", "4096"], "argument --cpus: CPU 4096: this machine has CPUs 0 to"),
        (["--cpus", "0,1,2"], "argument --cpus: expected CPU or CLIENT,SERVER"),
    ],
)  # fmt: skip
def test_a_placement_that_cannot_be_is_a_usage_error(argv: list[str], message: str) -> None:
    done = _kbtp("bench", "-s", "4K", "-n", "32", *argv)
    assert done.returncode == 2
    assert message in done.stderr
    assert "Traceback" not in done.stderr


def test_a_cpu_outside_the_affinity_mask_is_refused_before_anything_starts() -> None:
    """A CPU the machine has but the bench may not use (a cpuset, taskset) is named."""
    if not TWO_CPUS:
        pytest.skip("needs two CPUs: one to allow, one to leave out")
    allowed, other = _cpus()
    done = subprocess.run(
        [sys.executable, "-m", "kbtp", "bench", "-s", "4K", "--cpus", f"{allowed},{other}"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd="/",
        preexec_fn=lambda: os.sched_setaffinity(0, {allowed}),  # noqa: PLW1509
    )  # fmt: skip
    assert done.returncode == 2
    assert f"this process may not run on CPU {other}" in done.stderr


def test_the_child_commands_refuse_arguments_they_do_not_know(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert bench_floor.main(["zero"]) == 2
    assert bench_mooncake.main(["server", "64", "x"]) == 2
    assert bench_mooncake.main(["client", "1", "2", "3", "4", "5"]) == 2
    err = capsys.readouterr().err
    assert "usage: python -m kbtp.cli.bench_floor [CPU]" in err
    assert "client SIZE BLOCKS BATCH [SERVER_CPU]" in err


@needs_two
@pytest.mark.skipif(not mooncake_available(), reason="needs mooncake-transfer-engine-non-cuda")
def test_the_mooncake_comparison_runs_with_its_server_placed() -> None:
    _, target = _cpus()
    figures = run_mooncake(4096, 32, 16, server_cpu=target)
    assert figures["write"].seconds > 0 and figures["read"].cpu > 0


def test_the_offload_rows_run_on_the_one_cpu_given(tmp_path: Path) -> None:
    """``--offload`` is one process: one CPU, named in the header and the JSON."""
    (cpu,) = sorted(os.sched_getaffinity(0))[-1:]
    out = tmp_path / "offload.json"
    done = _kbtp(
        "bench", "--offload", "-s", "4K", "-n", "32", "--cpus", str(cpu),
        "--json", str(out), "--quiet",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert f"one process (CPU {cpu}, --cpus), loopback TCP" in done.stdout
    assert json.loads(out.read_text())["parameters"]["cpus"] == {"client": cpu, "target": None}
