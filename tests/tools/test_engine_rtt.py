"""The engines' share of a round trip (``python -m tools.engine_rtt``): its halves do the
real round trip's work, and its figures hold together."""

from __future__ import annotations

import os
import struct

import pytest

from stack.rnic.memory import MemoryRegion
from tools.engine_rtt import EngineRoundTrip, cpus_to_use, main, measure


def _fetched(halves: EngineRoundTrip) -> int:
    """The value the client's last FetchAdd returned (its 8-byte local sink)."""
    sge = halves.wr.sg_list[0]
    region = halves.client_qp.table.lookup(sge.lkey)
    assert isinstance(region, MemoryRegion)
    return int(struct.unpack("<Q", bytes(region.view(sge.addr, 8)))[0])


def test_the_halves_make_a_fetchadd_round_trip_each() -> None:
    """Each client turn completes the FetchAdd its server turn answered: the value fetched
    grows by the addend (1) per round trip, so the server applied every one."""
    halves = EngineRoundTrip("atomic")
    request = halves.post()
    seen = []
    for _ in range(5):
        request = halves.client_turn(halves.server_turn(request))
        seen.append(_fetched(halves))
    assert seen == [seen[0] + i for i in range(5)]


def test_a_read_round_trip_completes_and_its_request_is_a_read_request_fpdu() -> None:
    halves = EngineRoundTrip("read")
    request = halves.post()
    assert len(request) == 52  # the length field, DDP untagged header, RDMAP, CRC
    answer = halves.server_turn(request)
    assert len(answer) == 2 + 14 + 64 + 4  # a tagged Read Response carrying 64 octets
    assert len(halves.client_turn(answer)) == 52  # completed, and the next one posted


def test_a_failed_completion_is_an_error() -> None:
    halves = EngineRoundTrip("read")
    request = bytearray(halves.post())
    request[-1] ^= 0xFF  # a CRC error: the server terminates, nothing answers the Read
    with pytest.raises(RuntimeError, match="round trip failed"):
        halves.client_turn(halves.server_turn(memoryview(request)))


def test_the_cpus_are_two_distinct_ones_this_process_may_use() -> None:
    allowed = sorted(os.sched_getaffinity(0))
    with pytest.raises(ValueError, match="CLIENT,SERVER"):
        cpus_to_use(str(allowed[0]))
    with pytest.raises(ValueError, match="may use"):
        cpus_to_use(f"{allowed[0]},{max(allowed) + 1}")
    if len(allowed) >= 2:
        assert cpus_to_use(None) == (allowed[0], allowed[1])
        with pytest.raises(ValueError, match="two CPUs"):
            cpus_to_use(f"{allowed[0]},{allowed[0]}")
    else:
        with pytest.raises(ValueError, match="two CPUs"):
            cpus_to_use(None)


@pytest.mark.parametrize(
    "argv", [["--kinds", "write"], ["--iters", "0"], ["--cpus", "x,y"], ["--kinds", ","]]
)
def test_bad_options_are_one_error_line(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    assert "error:" in capsys.readouterr().err


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs")
def test_measure_reports_every_figure_and_the_bounds_are_its_ratios() -> None:
    heard: list[str] = []
    figures = measure(("read", "atomic", "read-sketch"), 30, 2, cpus_to_use(None), heard.append)
    assert heard == ["run 1/2: 30 round trips per loop", "run 2/2: 30 round trips per loop"]
    assert set(figures) == {"read", "atomic", "read-sketch"}
    for row in figures.values():
        assert all(value > 0 for key, value in row.items() if not key.startswith("engine_adds"))
        assert row["bound_trio"] == pytest.approx(row["raw_trio_engine_us"] / row["raw_trio_us"])
        assert row["bound_blocking"] == pytest.approx(row["raw_blk_engine_us"] / row["raw_trio_us"])
        assert row["engine_adds_blk_us"] == pytest.approx(
            row["raw_blk_engine_us"] - row["raw_blk_us"]
        )
    # One raw run serves every kind's row.
    assert figures["read"]["raw_trio_us"] == figures["read-sketch"]["raw_trio_us"]
