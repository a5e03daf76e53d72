"""``python -m tools.bench_floor``: the pure-Python floor and the raw receive-size sweep."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from stack.constants import RAW_RECEIVE_SIZE

ROOT = Path(__file__).resolve().parents[2]


def _floor(*args: str) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "tools.bench_floor", *args]
    return subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=120)


def test_the_sweep_adds_a_raw_row_per_receive_size_with_ratios_to_raw() -> None:
    done = _floor("-s", "64K", "-D", "0.3", "--repeat", "1", "--raw-sizes", "64K,1M", "--json", "-")
    assert done.returncode == 0, done.stderr
    rows = json.loads(done.stdout)["rows"]
    names = [r["variant"] for r in rows]
    assert names == ["raw", "raw@64K", "raw@1M", "raw-into", "crc", "floor"]
    raw = rows[0]
    assert raw["ratio"] == 1.0 and raw["MBps"] > 0
    for row in rows[1:]:
        assert row["ratio"] == pytest.approx(row["MBps"] / raw["MBps"], rel=1e-9)
    assert RAW_RECEIVE_SIZE == 128 * 1024  # what ``raw`` reads per receive_some


@pytest.mark.parametrize("bad", ["0", "12Q", "2G"])
def test_bad_raw_sizes_are_one_usage_error(bad: str) -> None:
    done = _floor("--raw-sizes", bad)
    assert done.returncode == 2
    assert "--raw-sizes" in done.stderr and "Traceback" not in done.stderr


def test_the_read_size_caps_every_recv_into_and_is_recorded() -> None:
    # An odd cap smaller than an FPDU: each FPDU arrives over many reads, a partial one at
    # the end of most of them, and the receivers still check every CRC and count every octet.
    done = _floor("-s", "64K", "-D", "0.3", "--repeat", "1", "--read-size", "1000", "--json", "-")
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert doc["read_size"] == 1000
    names = [r["variant"] for r in doc["rows"]]
    assert names == ["raw", "raw-into", "crc", "floor"]
    assert all(r["MBps"] > 0 for r in doc["rows"])


def test_the_read_size_defaults_to_what_raw_reads() -> None:
    done = _floor("-s", "64K", "-D", "0.2", "--repeat", "1", "--json", "-")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["read_size"] == RAW_RECEIVE_SIZE


@pytest.mark.parametrize("bad", ["0", "x", "2M"])
def test_bad_read_sizes_are_one_usage_error(bad: str) -> None:
    done = _floor("--read-size", bad)
    assert done.returncode == 2
    assert "--read-size" in done.stderr and "Traceback" not in done.stderr
