"""``kbtp bench``'s raw baseline: pipelined at both ends, each octet copied once."""

from __future__ import annotations

import os

import pytest
import trio

from kbtp.cli import bench_baseline
from kbtp.cli.bench_baseline import (
    RAW_HEADER,
    RAW_HELLO,
    RAW_LOAD,
    RAW_STORE,
    _Parser,
    bench_raw,
    raw_server,
)
from stack.constants import RAW_RECEIVE_SIZE, RAW_RECEIVE_SIZES


def _stream_of(messages: list[tuple[int, bytes]]) -> bytes:
    return b"".join(RAW_HEADER.pack(op, len(body)) + body for op, body in messages)


@pytest.mark.parametrize("step", [1, 7, 40, 41, 1000, 1 << 20])
def test_parser_gives_the_same_messages_however_the_stream_is_cut(step: int) -> None:
    bodies = [os.urandom(n) for n in (0, 1, 39, 40, 4096, 70000)]
    wire = _stream_of([(RAW_STORE, b) for b in bodies]) + RAW_HEADER.pack(RAW_LOAD, 9)
    landed: list[bytearray] = []

    def body_for(op: int, length: int) -> memoryview | None:
        if op != RAW_STORE:
            return None
        landed.append(bytearray(length))
        return memoryview(landed[-1])

    parser = _Parser(body_for)
    seen = []
    for pos in range(0, len(wire), step):
        seen += parser.feed(wire[pos : pos + step])
    assert seen == [(RAW_STORE, len(b)) for b in bodies] + [(RAW_LOAD, 9)]
    assert [bytes(b) for b in landed] == [b for b in bodies if b]


def test_server_answers_a_burst_of_requests_in_one_send() -> None:
    async def main() -> tuple[list[int], bytes]:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        port = listeners[0].socket.getsockname()[1]
        async with trio.open_nursery() as nursery:
            nursery.start_soon(trio.serve_listeners, lambda s: raw_server(s, 4096), listeners)
            stream = await trio.open_tcp_stream("127.0.0.1", port)
            burst = _stream_of([(RAW_STORE, bytes(100))] * 20) + RAW_HEADER.pack(RAW_LOAD, 64) * 10
            await stream.send_all(RAW_HELLO.pack(RAW_RECEIVE_SIZE) + burst)
            want = 20 * RAW_HEADER.size + 10 * (RAW_HEADER.size + 64)
            reads, got = [], b""
            while len(got) < want:
                chunk = await stream.receive_some(1 << 20)
                assert chunk
                reads.append(len(chunk))
                got += chunk
            await stream.aclose()
            nursery.cancel_scope.cancel()
        return reads, got

    reads, got = trio.run(main)
    assert len(reads) <= 3  # one send per received chunk, not one per request (30)
    ops = []
    pos = 0
    while pos < len(got):
        op, length = RAW_HEADER.unpack_from(got, pos)
        ops.append((op, length))
        pos += RAW_HEADER.size + (length if op == RAW_LOAD else 0)
    assert ops == [(RAW_STORE, 0)] * 20 + [(RAW_LOAD, 64)] * 10


@pytest.mark.parametrize("op", ["load", "store"])
@pytest.mark.parametrize("inflight", [1, 16])
def test_bench_raw_completes_every_exchange(op: str, inflight: int) -> None:
    async def main() -> tuple[float, float]:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        port = listeners[0].socket.getsockname()[1]
        async with trio.open_nursery() as nursery:
            nursery.start_soon(trio.serve_listeners, lambda s: raw_server(s, 65536), listeners)
            result = await bench_raw(port, op, 65536, 50, inflight)
            nursery.cancel_scope.cancel()
        return result

    seconds, cpu = trio.run(main)
    assert seconds > 0 and cpu > 0


def test_the_fastest_baseline_runs_each_receive_size_and_keeps_the_faster(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    seen: list[int] = []
    real = bench_baseline._bench_raw_once

    async def spy(*args: object) -> tuple[float, float]:
        seen.append(args[-1])  # type: ignore[arg-type]
        return await real(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(bench_baseline, "_bench_raw_once", spy)

    async def main() -> tuple[float, float]:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        port = listeners[0].socket.getsockname()[1]
        async with trio.open_nursery() as nursery:
            nursery.start_soon(trio.serve_listeners, lambda s: raw_server(s, 65536), listeners)
            result = await bench_raw(port, "load", 65536, 40, 16)
            nursery.cancel_scope.cancel()
        return result

    seconds, cpu = trio.run(main)
    assert seen == list(RAW_RECEIVE_SIZES) and seconds > 0 and cpu > 0


def test_the_baseline_server_survives_a_client_without_its_hello_and_clamps_its_size() -> None:
    async def main() -> tuple[float, float]:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        port = listeners[0].socket.getsockname()[1]
        async with trio.open_nursery() as nursery:
            nursery.start_soon(trio.serve_listeners, lambda s: raw_server(s, 65536), listeners)
            early = await trio.open_tcp_stream("127.0.0.1", port)
            await early.send_all(b"\x00\x01")  # half a hello, then gone
            await early.aclose()
            # 4 GiB asked: the server reads 16 MiB at most, and still answers every request.
            result = await bench_baseline.bench_raw(
                port, "store", 65536, 30, 4, receives=((1 << 32) - 1,)
            )
            nursery.cancel_scope.cancel()
        return result

    seconds, _cpu = trio.run(main)
    assert seconds > 0
