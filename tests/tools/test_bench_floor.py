"""``iwarp bench floor``: the pure-Python floor and the raw receive-size sweep."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import pytest

from stack.bench.floor import VARIANTS, _marked_wire, _MarkedFramer, measure
from stack.constants import (
    DDP_TAGGED_HDR_LEN,
    MPA_CRC_RESIDUE,
    MPA_MARKER_INTERVAL,
    RAW_RECEIVE_SIZE,
)
from stack.crc import crc32c


def _floor(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``iwarp bench floor ARGS`` of the installed package, run outside the checkout."""
    argv = [sys.executable, "-m", "stack.cli.iwarp", "bench", "floor", *args]
    return subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, timeout=120)


def test_the_sweep_adds_a_raw_row_per_receive_size_with_ratios_to_raw(tmp_path: Path) -> None:
    done = _floor(
        tmp_path, "-s", "64K", "-D", "0.3", "--repeat", "1", "--raw-sizes", "64K,1M", "--json", "-"
    )
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert doc["schema"] == "iwarp-bench-floor/1" and doc["exit_status"] == 0
    rows = doc["rows"]
    names = [r["variant"] for r in rows]
    assert names == ["raw", "raw@64K", "raw@1M", "raw-into", "crc", "floor", "markers"]
    raw = rows[0]
    assert raw["ratio"] == 1.0 and raw["MBps"] > 0
    for row in rows[1:]:
        assert row["ratio"] == pytest.approx(row["MBps"] / raw["MBps"], rel=1e-9)
    assert RAW_RECEIVE_SIZE == 128 * 1024  # what ``raw`` reads per receive_some
    table = done.stderr.splitlines()  # --json -: the table on stderr, after the progress
    assert table[-len(rows) - 1].split()[:2] == ["size", "variant"]
    assert [line.split()[1] for line in table[-len(rows) :]] == names


@pytest.mark.parametrize("bad", ["0", "12Q", "2G"])
def test_bad_raw_sizes_are_one_usage_error(tmp_path: Path, bad: str) -> None:
    done = _floor(tmp_path, "--raw-sizes", bad)
    assert done.returncode == 2
    assert "--raw-sizes" in done.stderr and "Traceback" not in done.stderr


@pytest.mark.parametrize(
    ("args", "option"),
    [
        pytest.param(args, option, id=" ".join(args))
        for args, option in [
            (["--repeat", "0"], "--repeat"),
            (["-s", "nonsense"], "--sizes"),
            (["-s", "32"], "--sizes"),
            (["-D", "0"], "--duration"),
            (["--emss", "10"], "--emss"),
            (["--json", "no-such-dir/out.json"], "--json"),
        ]
    ],
)
def test_a_bad_argument_is_one_error_line_and_status_2(
    tmp_path: Path, args: list[str], option: str
) -> None:
    done = _floor(tmp_path, *args)
    assert done.returncode == 2 and done.stdout == ""
    assert len(done.stderr.splitlines()) == 1, done.stderr
    assert done.stderr.startswith("iwarp bench floor: error: ") and option in done.stderr


def test_the_read_size_caps_every_recv_into_and_is_recorded(tmp_path: Path) -> None:
    # An odd cap smaller than an FPDU: each FPDU arrives over many reads, a partial one at
    # the end of most of them, and the receivers still check every CRC and count every octet.
    done = _floor(
        tmp_path, "-s", "64K", "-D", "0.3", "--repeat", "1", "--read-size", "1000", "--json", "-"
    )
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert doc["read_size"] == 1000
    names = [r["variant"] for r in doc["rows"]]
    assert names == ["raw", "raw-into", "crc", "floor", "markers"]
    assert all(r["MBps"] > 0 for r in doc["rows"])


def test_the_read_size_defaults_to_what_raw_reads(tmp_path: Path) -> None:
    done = _floor(tmp_path, "-s", "64K", "-D", "0.2", "--repeat", "1", "--json", "-")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["read_size"] == RAW_RECEIVE_SIZE


@pytest.mark.parametrize("bad", ["0", "x", "2M"])
def test_bad_read_sizes_are_one_usage_error(tmp_path: Path, bad: str) -> None:
    done = _floor(tmp_path, "--read-size", bad)
    assert done.returncode == 2
    assert "--read-size" in done.stderr and "Traceback" not in done.stderr


def test_measure_sends_its_progress_where_asked(capsys: pytest.CaptureFixture[str]) -> None:
    # What another module calls: the rows of the table, a progress line per run to the
    # stream given, and none anywhere with None.
    out = io.StringIO()
    rows = measure([65536], 0.1, 1, 65483, progress=out)
    assert [r["variant"] for r in rows] == list(VARIANTS)
    keys = {"size", "variant", "MBps", "msgps", "cpu_send_us", "cpu_recv_us", "ratio"}
    assert all(set(r) == keys and r["size"] == 65536 for r in rows)
    assert len(out.getvalue().splitlines()) == len(VARIANTS)
    assert len(measure([65536], 0.1, 1, 65483, progress=None)) == len(VARIANTS)
    assert capsys.readouterr() == ("", "")


@pytest.mark.parametrize("length", [64, 490, 491, 508, 4000, 64752])
def test_the_markers_variant_frames_on_the_marker_grid(length: int) -> None:
    # A marker every 512 octets from the FPDU's start, 508 octets of the FPDU between them,
    # and a CRC over it all: the work the stack's marker framing has to do, no less.
    framer = _MarkedFramer(64752)
    payload = bytes(range(256)) * (length // 256 + 1)
    fpdu = framer.frame(0x1234, memoryview(payload[:length]))
    assert len(fpdu) == _marked_wire(DDP_TAGGED_HDR_LEN + length) and len(fpdu) % 4 == 0
    assert crc32c(fpdu) == MPA_CRC_RESIDUE
    markers = range(0, len(fpdu), MPA_MARKER_INTERVAL)
    assert all(fpdu[k : k + 4] == bytes(4) for k in markers)
    body = b"".join(fpdu[k + 4 : k + MPA_MARKER_INTERVAL] for k in markers)
    assert int.from_bytes(body[:2], "big") == DDP_TAGGED_HDR_LEN + length
    assert int.from_bytes(body[12:16], "big") == 0x1234  # the TO
    assert body[16 : 16 + length] == payload[:length]
    assert len(body) - 16 - length - 4 == -(2 + DDP_TAGGED_HDR_LEN + length) % 4  # the PAD
