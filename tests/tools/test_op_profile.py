"""The work-count tool (``python -m tools.op_profile``) measures the real data path."""

from __future__ import annotations

import shutil

import pytest

from tools.op_profile import (
    blocking_round_trip,
    instructions,
    post_list_writes,
    raw_blocking_round_trip,
    raw_round_trip,
    round_trip,
)


def test_post_list_writes_counts_the_senders_work_per_wr() -> None:
    one = post_list_writes(1, 20)["python_calls"]
    listed = post_list_writes(8, 20)["python_calls"]
    assert 0 < listed < one  # a post list shares its per-send work among its WRs


def test_round_trip_counts_both_ends() -> None:
    figures = round_trip("read", 20)
    assert figures["python_calls"] > 0
    assert figures["socket_calls"] >= 2  # at least the Read Request and its Response sent
    assert figures["task_steps"] >= 2  # at least the server's and the client's reader


def test_raw_round_trip_is_the_benchs_raw_exchange_without_iwarp() -> None:
    """The ``read`` case's baseline: both ends of the bench's raw round trip, each a send
    and a read per trip (a read that finds nothing, then the one after the wait), one
    scheduler pass each, and fewer Python calls than the stack's Read."""
    raw = raw_round_trip(20)
    assert raw["socket_calls"] == pytest.approx(6, abs=0.5)
    assert raw["scheduler_passes"] == pytest.approx(2, abs=0.5)
    assert 0 < raw["python_calls"] < round_trip("read", 20)["python_calls"]


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("valgrind") is None, reason="needs valgrind (callgrind)")
def test_instructions_count_the_loop_alone() -> None:
    """callgrind's count of the loop, set-up cancelled: a post list of 8 costs each WR
    fewer instructions than one WR per post (the per-send work is shared)."""
    one = instructions("write", 200, 1) / 200
    listed = instructions("write", 200, 8) / (200 * 8)
    assert 0 < listed < one


@pytest.mark.parametrize("kind", ["read", "atomic"])
def test_the_blocking_round_trip_is_two_sends_and_two_reads_without_a_scheduler(
    kind: str,
) -> None:
    """``read-blk`` / ``atomic-blk``: each end sends once and reads once per round trip (the
    Request and its Response; the thread reads only what has arrived), with fewer Python
    calls than the same round trip on the trio driver."""
    blocking = blocking_round_trip(kind, 30)
    assert blocking["socket_calls"] == pytest.approx(4, abs=0.1)
    assert blocking["scheduler_passes"] == blocking["task_steps"] == 0
    assert 0 < blocking["python_calls"] < round_trip(kind, 30)["python_calls"]


def test_the_blocking_raw_round_trip_is_the_exchange_alone() -> None:
    """``raw-blk``: the raw exchange's two sends and two reads on blocking sockets, no
    scheduler, and far fewer Python calls than the same exchange under trio or the stack's
    Read on the blocking driver."""
    bare = raw_blocking_round_trip(30)
    assert bare["socket_calls"] == pytest.approx(4, abs=0.1)
    assert bare["scheduler_passes"] == bare["task_steps"] == 0
    assert 0 < bare["python_calls"] < raw_round_trip(30)["python_calls"]
    assert bare["python_calls"] < blocking_round_trip("read", 30)["python_calls"]
