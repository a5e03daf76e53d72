"""``iwarp bench ... --lat --blocking``: the latency exchange on the blocking driver at both
ends, end to end (figures parsed, never timed); the arguments it refuses are with the
others in test_bench_rdma."""

from __future__ import annotations

import json

import pytest

from stack.bench.protocol import Advert
from tests.tools.test_bench_rdma import (
    LAT_BASELINE_HEADER,
    LAT_HEADER,
    header_value,
    run_cli,
    table_rows,
)


@pytest.mark.parametrize(
    ("test", "size"), [("read", 64), ("atomic", 8), ("write", 64), ("send", 4096)]
)
def test_each_latency_test_runs_on_the_blocking_driver_in_process(
    capsys: pytest.CaptureFixture[str], test: str, size: int
) -> None:
    args = [test, "--lat", "--blocking", "-n", "40", "--in-process", "--baseline"]
    if test != "atomic":
        args += ["-s", str(size)]
    code, out, _err = run_cli(capsys, *args)
    assert code == 0, out
    assert header_value(out, "Driver") == "blocking, both ends (stack.transport.blocking)"
    [row] = table_rows(out, LAT_HEADER + LAT_BASELINE_HEADER)
    b, n, t_min, t_max, typical = row[:5]
    assert (b, n) == (size, 40)
    assert 0 < t_min <= typical <= t_max


def test_two_processes_with_cpu_and_repeats(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _err = run_cli(
        capsys, "read", "-s", "64", "--lat", "--blocking", "-n", "50", "--cpu", "-r", "2"
    )
    assert code == 0, out
    assert "(process" in header_value(out, "Server")
    rows = [line for line in out.splitlines() if line.startswith(" 64 ")]
    assert len(rows) == 1
    cells = [v for v in rows[0].split() if "/" in v]
    client, server = (float(v) for v in cells[0].split("/"))
    assert client > 0 and server > 0  # both processes did the work of the exchange


def test_the_json_names_the_driver(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _err = run_cli(
        capsys, "atomic", "--lat", "--blocking", "-n", "20", "--in-process", "--json", "-"
    )
    assert code == 0
    doc = json.loads(out)
    assert doc["parameters"]["driver"] == "blocking" and doc["kind"] == "latency"
    [row] = doc["results"]
    assert row["size_bytes"] == 8 and row["iterations"] == 20


def test_the_trio_driver_is_not_named_without_blocking(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _err = run_cli(capsys, "read", "-s", "64", "--lat", "-n", "20", "--in-process")
    assert code == 0
    assert " Driver " not in out


def test_the_advert_names_the_blocking_iwarp_port() -> None:
    advert = Advert(1, 2, 3, 4000, 4001, 4002)
    assert Advert.decode(advert.encode()) == advert
    assert Advert.decode(Advert(1, 2, 3, 4000).encode()).iwarp_blocking_port == 0
