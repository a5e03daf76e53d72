"""The robustness campaign in its bounded form (docs/campaign.md): every part, then the
harness itself (a crash, a hang, a chunking-dependent outcome are detected and saved)."""

from __future__ import annotations

import json
import random
import subprocess
import sys
import time
from pathlib import Path

import pytest

from stack.errors import DecodeError
from tools.campaign import DEFAULT_INPUTS, PartSummary, Runner, Target, run
from tools.campaign import fuzz as fuzz_module
from tools.campaign.load import QUOTA

ROOT = Path(__file__).resolve().parents[2]


def _part(name: str) -> PartSummary:
    (summary,), _ = run(only=[name], save=False, progress=False)
    return summary


def _assert_clean(summary: PartSummary) -> None:
    assert summary.crashes == 0, summary.rows
    assert summary.hangs == 0, summary.rows
    assert summary.servers_alive is not False, summary.rows
    assert summary.not_served == 0, summary.rows
    assert summary.lost_or_corrupted == 0, summary.rows
    assert summary.ok


def test_part1_decoder_fuzzing_finds_no_crash_hang_or_chunking_dependence() -> None:
    summary = _part("fuzz")
    _assert_clean(summary)
    assert summary.inputs >= DEFAULT_INPUTS
    names = {row["name"] for row in summary.rows}
    assert {"mpa-responder", "mpa-initiator", "fpdu-deframer", "ddp-rdmap", "kbtp-messages",
            "pcap-reader", "dissect"} <= names  # fmt: skip
    # the corpus (historical bugs) was replayed first
    assert sum(row["replayed"] for row in summary.rows) >= 10


def test_part2_hostile_peers_leave_every_server_alive_serving_and_intact() -> None:
    summary = _part("hostile")
    _assert_clean(summary)
    servers = {row["server"] for row in summary.rows}
    assert servers == {"kbtp-target", "kbtp-target-offload", "rping", "bench-server"}
    assert all(row["alive"] and row["served"] and row["fds_ok"] for row in summary.rows)
    assert len(summary.rows) >= 25
    bench = " ".join(row["name"] for row in summary.rows if row["server"] == "bench-server")
    assert "hostile session requests" in bench and "blocking iWARP port: slowloris" in bench


def test_part3_kbtp_load_verifies_every_byte_and_the_pool_accounting() -> None:
    summary = _part("load")
    _assert_clean(summary)
    assert [row["target"] for row in summary.rows] == ["kbtp-target", "kbtp-target-offload"]
    for row in summary.rows:  # each step pipelined over the credits: none refused
        assert row["corrupted"] == 0 and row["bytes_verified"] > 0 and not row["errors"]
        assert row["reallocated"] == row["pool_blocks"] == QUOTA * row["initiators"]
        assert row["over_quota_refused"] == row["initiators"]


def test_part4_faults_release_quota_time_out_silence_and_survive_resets() -> None:
    summary = _part("faults")
    _assert_clean(summary)
    names = " ".join(row["name"] for row in summary.rows)
    assert "kill -9" in names and "silence" in names and "reset in the middle" in names


# -- the harness detects what it claims to ---------------------------------------------


def _harness_target(run_fn: object, chunked: bool = False) -> Target:
    return Target("probe", run_fn, lambda: [b"seed-input"], (DecodeError,), chunked=chunked)  # type: ignore[arg-type]


def test_an_undocumented_exception_is_a_crash_and_is_saved(tmp_path: Path) -> None:
    def decoder(data: bytes, chunks: object) -> object:
        if len(data) > 12:
            raise IndexError("boom")
        if len(data) < 4:
            raise DecodeError("X-1", "documented")
        return len(data)

    figures = Runner(tmp_path).fuzz(_harness_target(decoder), 300, random.Random(1))
    assert figures.crashes > 0 and figures.hangs == 0
    assert all(f.kind == "crash" and "IndexError" in f.detail for f in figures.findings)
    saved = sorted(tmp_path.glob("probe-*.bin"))
    assert saved and all(len(p.read_bytes()) > 12 for p in saved)
    # saved inputs are replayed first on the next run
    again = Runner(tmp_path).fuzz(_harness_target(decoder), 0, random.Random(2))
    assert again.replayed == len(saved) and again.crashes >= len(saved)


def test_a_slow_input_is_a_hang(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(fuzz_module, "HANG_SECONDS", 0.2)

    def decoder(data: bytes, chunks: object) -> object:
        if data.startswith(b"seed"):
            time.sleep(5)
        return None

    figures = Runner(tmp_path).fuzz(_harness_target(decoder), 0, random.Random(1))
    assert figures.hangs == 1 and figures.crashes == 0
    assert figures.findings[0].kind == "hang"


def test_an_outcome_that_depends_on_the_chunking_is_found(tmp_path: Path) -> None:
    def decoder(data: bytes, chunks: list[bytes]) -> object:
        return len(chunks)

    figures = Runner(tmp_path, save=False).fuzz(
        _harness_target(decoder, chunked=True), 100, random.Random(1)
    )
    assert figures.diverged > 0 and figures.findings[0].kind == "diverged"


def test_cli_json_for_one_target() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "tools.campaign", "--only", "kbtp-messages", "--inputs", "300",
         "--json"],
        capture_output=True, text=True, cwd=ROOT, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["ok"] is True and doc["parameters"]["targets"] == ["kbtp-messages"]
    (part,) = doc["parts"]
    assert part["inputs"] >= 300 and part["crashes"] == 0
    assert "1 decoder fuzzing" in out.stderr  # the table goes to stderr with --json
