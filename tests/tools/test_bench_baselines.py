"""The ``--baseline`` exchanges: the fastest honest shape of the same exchange, both servers."""

from __future__ import annotations

import socket
import tracemalloc
from collections.abc import Iterator
from dataclasses import replace
from types import SimpleNamespace
from typing import cast

import pytest
import trio

from stack.bench import run as bench_run
from stack.bench.blocking import (
    BATCH_BYTES,
    BlockingServer,
    batch_messages,
    blocking_bandwidth,
    blocking_latency,
)
from stack.bench.client import Client
from stack.bench.options import BenchError, BenchOptions
from stack.bench.protocol import RAW_HEADER, RAW_MAGIC, RAW_REQRESP, RAW_REQUEST
from stack.bench.report import baseline_lines
from stack.bench.results import BwResult
from stack.bench.server import BenchServer
from stack.constants import RAW_RECEIVE_SIZE, RAW_RECEIVE_SIZES


def test_batch_messages_is_what_is_posted_within_the_cap() -> None:
    assert batch_messages(64, 128) == 128
    assert batch_messages(1 << 20, 128) == 1
    assert batch_messages(65536, 128) == BATCH_BYTES // 65536
    assert batch_messages(0, 5) == 5 and batch_messages(64, 0) == 1


@pytest.fixture
def blocking_server() -> Iterator[BlockingServer]:
    server = BlockingServer("127.0.0.1")
    yield server
    server.close()


def _replies_to_a_burst(port: int, requests: int, size: int) -> list[int]:
    """Send ``requests`` requests at once; the sizes of the reads that bring the replies."""
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(RAW_HEADER.pack(RAW_MAGIC, RAW_REQRESP, size, RAW_REQUEST))
        sock.sendall(bytes(RAW_REQUEST * requests))
        sock.settimeout(10)
        got: list[int] = []
        while sum(got) < requests * size:
            data = sock.recv(1 << 20)
            assert data, "server closed early"
            got.append(len(data))
        return got


def test_blocking_server_answers_every_pending_request_at_once(
    blocking_server: BlockingServer,
) -> None:
    reads = _replies_to_a_burst(blocking_server.port, 100, 64)
    assert sum(reads) == 6400
    assert len(reads) <= 3  # one sendall for the whole burst (one per request: ~100 reads)


def test_trio_server_answers_every_pending_request_at_once() -> None:
    async def main() -> list[int]:
        server = BenchServer()
        async with trio.open_nursery() as nursery:
            _port, raw_port = await nursery.start(server.run)
            reads = await trio.to_thread.run_sync(_replies_to_a_burst, raw_port, 100, 64)
            nursery.cancel_scope.cancel()
        return reads

    reads = trio.run(main)
    assert sum(reads) == 6400 and len(reads) <= 3


@pytest.mark.parametrize("test", ["write", "send", "read", "atomic"])
def test_blocking_baselines_move_the_bytes(blocking_server: BlockingServer, test: str) -> None:
    opts = BenchOptions(test=test, sizes=(4096,), num_qps=2)
    assert blocking_bandwidth("127.0.0.1", blocking_server.port, opts, 4096, 64) > 0
    assert blocking_latency("127.0.0.1", blocking_server.port, opts, 64, 8) > 0


def test_blocking_baseline_to_a_closed_port_is_a_bench_error() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(BenchError, match="blocking-TCP port"):
        blocking_bandwidth("127.0.0.1", port, BenchOptions(test="write", sizes=(64,)), 64, 4)


@pytest.mark.parametrize(
    ("test", "tried"), [("read", list(RAW_RECEIVE_SIZES)), ("write", [RAW_RECEIVE_SIZE])]
)
def test_the_raw_bandwidth_baseline_keeps_its_fastest_receive_size(
    monkeypatch: pytest.MonkeyPatch, test: str, tried: list[int]
) -> None:
    """A request/response client runs once per receive size and the faster run counts (a
    stream's sink has one size); the header says so."""
    seen: list[int] = []
    speeds = {RAW_RECEIVE_SIZES[0]: 100.0, RAW_RECEIVE_SIZES[1]: 250.0}

    async def fake(*args: object) -> float:
        receive = args[-1]
        assert isinstance(receive, int)
        seen.append(receive)
        return speeds[receive]

    monkeypatch.setattr(bench_run, "raw_bandwidth", fake)
    opts = BenchOptions(test=test, sizes=(65536,))
    row = BwResult(65536, 10, 1.0, 1.0, 0.1, 10)
    client = cast(Client, SimpleNamespace(raw_port=1))
    out = trio.run(bench_run._raw_baseline, row, "127.0.0.1", client, opts, False)
    assert seen == tried
    assert isinstance(out, BwResult) and out.raw_bw == max(speeds[n] for n in tried)
    line = next(x for x in baseline_lines(replace(opts, baseline=True)) if "ratio " in x)
    assert all(f"{n // 1024}" in line for n in tried) and "per read" in line


def _a_huge_reply_begins(port: int) -> bytes:
    """Ask request/response replies of 4 GiB - 1 (the header's largest size); the first MiB."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(RAW_HEADER.pack(RAW_MAGIC, RAW_REQRESP, 0xFFFFFFFF, 1) + b"x")
        got = bytearray()
        while len(got) < 1 << 20:
            data = sock.recv(1 << 20)
            assert data, "server closed early"
            got += data
        return bytes(got[: 1 << 20])


def test_a_reply_size_from_the_header_allocates_nothing_on_either_server(
    blocking_server: BlockingServer,
) -> None:
    """A 17-octet request for 4 GiB replies: both servers send from one shared zero buffer;
    ``bytes(size)`` per connection was a MemoryError that ended the whole trio server where
    memory is not overcommitted (the campaign's bench server runs with RLIMIT_AS 4 GiB)."""

    async def main() -> bytes:
        server = BenchServer()
        async with trio.open_nursery() as nursery:
            _port, raw_port = await nursery.start(server.run)
            data = await trio.to_thread.run_sync(_a_huge_reply_begins, raw_port)
            nursery.cancel_scope.cancel()
        return data

    tracemalloc.start()
    try:
        assert trio.run(main) == bytes(1 << 20)
        assert _a_huge_reply_begins(blocking_server.port) == bytes(1 << 20)
        _now, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 256 << 20


def test_the_baselines_send_from_real_memory() -> None:
    """As the iWARP side's sources (memory.zeroed(sent=True)): a large ``bytes(n)`` is left
    untouched, every page the kernel's one zero page, and its sends read 4 KiB of cache."""
    from stack.bench.blocking import BATCH_BYTES, ZEROS
    from stack.bench.memory import zeroed
    from tests.tools.resident import resident_bytes

    assert resident_bytes(ZEROS) >= BATCH_BYTES
    assert resident_bytes(zeroed(8 << 20, sent=True)) >= 8 << 20
