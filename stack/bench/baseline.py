"""Raw trio TCP baselines (``--baseline``), run against the same server in the same run.

Same message count and QP (connection) count as the iWARP measurement: Writes and Sends
against a stream of the same bytes with one ``send_all`` per message (ended by the sink's
byte count); Reads and atomics against request/response (a ``RAW_REQUEST``-byte request, a
SIZE-byte reply) with the same pipelining depth (``min(tx depth, ORD)``); latency against
the same exchange one at a time.  ``ratio`` is iWARP over raw: for bandwidth above 1 is
better, for latency below 1 is better.
"""

from __future__ import annotations

import statistics
import time

import trio

from stack.bench.options import ATOMIC_SIZE, WARMUP_ITERS, BenchError, BenchOptions
from stack.bench.protocol import (
    RAW_COUNT,
    RAW_REQRESP,
    RAW_REQUEST,
    RAW_SINK,
    open_raw,
    receive_exactly,
)
from stack.bench.results import MB
from stack.transport.driver import RECEIVE_SIZE


async def _raw_stream(
    stream: trio.SocketStream, size: int, count: int | None, deadline: float | None
) -> int:
    """Stream ``size``-byte messages, one send_all each; return the count once acknowledged."""
    message = bytes(size)
    sent = 0
    clock = time.perf_counter
    while (count is None or sent < count) and (deadline is None or clock() < deadline):
        await stream.send_all(message)
        sent += 1
    await stream.send_eof()
    acked = RAW_COUNT.unpack(await receive_exactly(stream, RAW_COUNT.size))[0]
    if acked != sent * size:
        raise BenchError(f"raw TCP sink counted {acked} bytes, {sent * size} were sent")
    return sent


async def _raw_pipelined(
    stream: trio.SocketStream, size: int, depth: int, count: int | None, deadline: float | None
) -> int:
    """Request/response with ``depth`` outstanding requests; returns replies received."""
    clock = time.perf_counter
    target = count if count is not None else 1 << 62
    sent = min(depth, target)
    await stream.send_all(bytes(RAW_REQUEST * sent))
    received = 0
    done = 0
    while done < sent:
        data = await stream.receive_some(RECEIVE_SIZE)
        if not data:
            raise BenchError("raw TCP server closed during the request/response baseline")
        received += len(data)
        new_done = received // size
        more = new_done - done
        done = new_done
        if deadline is not None and target > sent and clock() >= deadline:
            target = sent
        more = min(more, target - sent)
        if more > 0:
            await stream.send_all(bytes(RAW_REQUEST * more))
            sent += more
    return done


async def raw_bandwidth(
    host: str, raw_port: int, opts: BenchOptions, size: int, messages: int
) -> float:
    """Baseline MB/s with ``num_qps`` TCP connections moving ``messages`` messages in all."""
    streaming = opts.test in ("write", "send")
    reply = ATOMIC_SIZE if opts.test == "atomic" else size
    n = opts.num_qps
    counts = [messages // n + (i < messages % n) for i in range(n)]
    streams = []
    for _ in range(n):
        if streaming:
            streams.append(await open_raw(host, raw_port, RAW_SINK))
        else:
            streams.append(await open_raw(host, raw_port, RAW_REQRESP, reply, RAW_REQUEST))
    done = [0] * n
    ends = [0.0] * n
    start = time.perf_counter()

    async def one(i: int) -> None:
        if streaming:
            done[i] = await _raw_stream(streams[i], size, counts[i], None)
        else:
            done[i] = await _raw_pipelined(streams[i], reply, opts.ord, counts[i], None)
        ends[i] = time.perf_counter()

    try:
        async with trio.open_nursery() as nursery:
            for i in range(n):
                nursery.start_soon(one, i)
    except (trio.BrokenResourceError, OSError) as exc:
        raise BenchError(f"raw TCP baseline failed: {exc}") from None
    finally:
        for s in streams:
            await trio.aclose_forcefully(s)
    return sum(done) * reply / (max(ends) - start) / MB


async def raw_latency(host: str, raw_port: int, opts: BenchOptions, size: int, count: int) -> float:
    """Baseline median latency (microseconds) of the same exchange, one at a time."""
    pingpong = opts.test in ("write", "send")
    reply = ATOMIC_SIZE if opts.test == "atomic" else size
    request = size if pingpong else RAW_REQUEST
    stream = await open_raw(host, raw_port, RAW_REQRESP, reply, request)
    message = bytes(request)
    clock = time.perf_counter
    times = []
    try:
        for i in range(WARMUP_ITERS + count):
            t0 = clock()
            await stream.send_all(message)
            await receive_exactly(stream, reply)
            t1 = clock()
            if i >= WARMUP_ITERS:
                times.append(t1 - t0)
    except (trio.BrokenResourceError, OSError) as exc:
        raise BenchError(f"raw TCP baseline failed: {exc}") from None
    finally:
        await trio.aclose_forcefully(stream)
    if pingpong:
        times = [t / 2 for t in times]
    return statistics.median(times) * 1e6
