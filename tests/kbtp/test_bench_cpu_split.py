"""``kbtp bench --json``: each KBTP row's CPU per operation split by end (initiator, target),
so the end that bounds the rate shows; one process has no split.  No timing is asserted."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from kbtp.cli import main
from kbtp.cli.bench_cpu import BothEndsCpu


def test_the_peer_part_is_what_the_peer_clock_moved() -> None:
    clock = iter([10.0, 10.25])
    cpu = BothEndsCpu(lambda: next(clock))
    spent = cpu.seconds()
    assert cpu.peer == pytest.approx(0.25)
    assert spent >= 0.25  # this process's own time on top
    alone = BothEndsCpu()
    deadline = time.process_time() + 0.01
    while time.process_time() < deadline:
        pass
    assert alone.seconds() >= 0.01 and alone.peer is None


def test_two_processes_split_the_cpu_and_one_process_does_not(tmp_path: Path) -> None:
    two, one = tmp_path / "two.json", tmp_path / "one.json"
    argv = ["bench", "-s", "4K", "--ops", "store,load", "-n", "64", "-t", "4", "--no-baseline"]
    assert main([*argv, "--quiet", "--json", str(two)]) == 0
    assert main([*argv, "--in-process", "--quiet", "--json", str(one)]) == 0
    for row in json.loads(two.read_text())["results"]:
        initiator, target = row["cpu_us_per_op_initiator"], row["cpu_us_per_op_target"]
        assert initiator > 0 and target >= 0
        assert initiator + target == pytest.approx(row["cpu_us_per_op"])
    for row in json.loads(one.read_text())["results"]:
        assert row["cpu_us_per_op_initiator"] is None and row["cpu_us_per_op_target"] is None
        assert row["cpu_us_per_op"] > 0
