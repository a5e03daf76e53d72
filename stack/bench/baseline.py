"""Raw trio TCP baselines (``--baseline``), run against the same server in the same run.

The fastest honest way to do the same exchange with trio, with the same message count and
QP (connection) count as the iWARP measurement:

* Writes and Sends: a stream of the same bytes whose sender hands the kernel what is
  available, as the iWARP sender does: up to the tx depth of messages (at most
  :data:`~stack.bench.blocking.BATCH_BYTES`) per ``send``; ended by the sink's count.
* Reads and atomics: pipelined request/response (a ``RAW_REQUEST``-byte request, a
  SIZE-byte reply) with the same depth (``min(tx depth, ORD)``), the server answering every
  complete request it has received in one send.
* Latency: the same exchange one at a time.

Every raw socket has the ``TCP_NOTSENT_LOWAT`` of the iWARP driver's (1 MiB,
:func:`~stack.transport.sockopts.limit_unsent`), not trio's 16 KiB, which costs a bulk
sender a system call and a writable wait per 16 KiB.  Every raw socket call is the
driver's own (:mod:`stack.bench.raw_socket`): ``send`` and ``recv_into`` on the plain
socket from the task, trio entered only to wait, not trio streams (whose checkpoints made
a 64 B ping-pong 2.8x slower; ``iwarp bench floor``'s ``raw-some`` row compares a stream
sink that reads through trio).  Every raw receiver reads
:data:`~stack.constants.RAW_RECEIVE_SIZE` (128 KiB) per call: the fastest size
measured for a stream (``iwarp bench floor --raw-sizes``; the driver's own
256 KiB, used before, made the raw stream about 1.6x slower); a request/response client runs
once per size of :data:`~stack.constants.RAW_RECEIVE_SIZES` and the faster run counts.

``ratio`` is iWARP over raw: for bandwidth above 1 is better, for latency below 1 is
better.  The second baseline, blocking sockets at both ends, is :mod:`stack.bench.blocking`.
"""

from __future__ import annotations

import statistics
import time

import trio

from stack.bench.blocking import batch_messages, latency_shape, zero_replies
from stack.bench.memory import zeroed
from stack.bench.options import ATOMIC_SIZE, WARMUP_ITERS, BenchError, BenchOptions
from stack.bench.protocol import (
    RAW_COUNT,
    RAW_REQRESP,
    RAW_REQUEST,
    RAW_SINK,
    open_raw,
    receive_exactly,
)
from stack.bench.raw_socket import recv, recv_exactly, send_plain, socket_of
from stack.bench.results import MB
from stack.constants import RAW_RECEIVE_SIZE, RAW_RECEIVE_SIZES


async def _raw_stream(
    stream: trio.SocketStream, size: int, count: int | None, deadline: float | None, depth: int
) -> int:
    """Stream ``size``-byte messages, ``depth`` per send; return the count once acknowledged."""
    batch = batch_messages(size, depth)
    chunk = memoryview(zeroed(size * batch, sent=True))
    sent = 0
    clock = time.perf_counter
    with socket_of(stream) as sock:
        while (count is None or sent < count) and (deadline is None or clock() < deadline):
            k = batch if count is None else min(batch, count - sent)
            await send_plain(sock, chunk if k == batch else chunk[: size * k])
            sent += k
    await stream.send_eof()
    acked = RAW_COUNT.unpack(await receive_exactly(stream, RAW_COUNT.size))[0]
    if acked != sent * size:
        raise BenchError(f"raw TCP sink counted {acked} bytes, {sent * size} were sent")
    return sent


async def raw_pipelined(
    stream: trio.SocketStream,
    size: int,
    depth: int,
    count: int | None,
    deadline: float | None,
    receive: int = RAW_RECEIVE_SIZE,
) -> int:
    """Request/response with ``depth`` outstanding requests, replies read ``receive`` octets
    per ``recv_into`` (the driver's socket calls, :mod:`stack.bench.raw_socket`); returns
    replies received (also ``iwarp bench floor --exchange read``'s ``raw``)."""
    clock = time.perf_counter
    target = count if count is not None else 1 << 62
    sent = min(depth, target)
    requests = bytes(RAW_REQUEST * depth)
    room = memoryview(bytearray(receive))
    with socket_of(stream) as sock:
        await send_plain(sock, requests[: RAW_REQUEST * sent])
        received = 0
        done = 0
        while done < sent:
            n = await recv(sock, room)
            if not n:
                raise BenchError("raw TCP server closed during the request/response baseline")
            received += n
            new_done = received // size
            more = new_done - done
            done = new_done
            if deadline is not None and target > sent and clock() >= deadline:
                target = sent
            more = min(more, target - sent)
            if more > 0:
                await send_plain(sock, requests[: RAW_REQUEST * more])
                sent += more
            if n == receive:  # the socket may have more: let the process's other tasks run
                await trio.lowlevel.checkpoint()
    return done


async def answer_requests(stream: trio.SocketStream, size: int, request: int) -> int:
    """The server's half of request/response: every complete ``request``-octet request read
    (``RAW_RECEIVE_SIZE`` octets per ``recv_into``, the driver's socket calls) answered with
    ``size`` zero octets, all of them in one send of up to BATCH_BYTES at a time, until the
    client half-closes; returns the replies sent (the bench server's and ``iwarp bench
    floor``'s sink's)."""
    pending = replies = 0
    room = memoryview(bytearray(RAW_RECEIVE_SIZE))
    with socket_of(stream) as sock:
        while n := await recv(sock, room):
            count, pending = divmod(pending + n, request)
            replies += count
            while count:  # every complete request answered in one send
                k = batch_messages(size, count)  # (up to BATCH_BYTES; no copy)
                for piece in zero_replies(size, k):
                    await send_plain(sock, piece)
                count -= k
            if n == RAW_RECEIVE_SIZE:  # the socket may have more: let other tasks run
                await trio.lowlevel.checkpoint()
    return replies


async def raw_bandwidth(
    host: str,
    raw_port: int,
    opts: BenchOptions,
    size: int,
    messages: int,
    receive: int = RAW_RECEIVE_SIZE,
) -> float:
    """Baseline MB/s with ``num_qps`` TCP connections moving ``messages`` messages in all;
    the request/response client reads ``receive`` octets per ``recv_into``
    (:func:`raw_receive_sizes`)."""
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
            done[i] = await _raw_stream(streams[i], size, counts[i], None, opts.tx_depth)
        else:
            done[i] = await raw_pipelined(streams[i], reply, opts.ord, counts[i], None, receive)
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


def raw_receive_sizes(opts: BenchOptions) -> tuple[int, ...]:
    """The receive sizes the bandwidth baseline runs with, the fastest run counting: a
    stream's sink reads :data:`~stack.constants.RAW_RECEIVE_SIZE`; a request/response client
    tries each of :data:`~stack.constants.RAW_RECEIVE_SIZES` (neither is the faster at
    every reply size)."""
    return (RAW_RECEIVE_SIZE,) if opts.test in ("write", "send") else RAW_RECEIVE_SIZES


async def raw_latency(host: str, raw_port: int, opts: BenchOptions, size: int, count: int) -> float:
    """Baseline median latency (microseconds) of the same exchange, one at a time."""
    pingpong, reply, request = latency_shape(opts, size)
    stream = await open_raw(host, raw_port, RAW_REQRESP, reply, request)
    try:
        times = await time_round_trips(stream, bytes(request), reply, count)
    except (trio.BrokenResourceError, OSError) as exc:
        raise BenchError(f"raw TCP baseline failed: {exc}") from None
    finally:
        await trio.aclose_forcefully(stream)
    if pingpong:
        times = [t / 2 for t in times]
    return statistics.median(times) * 1e6


async def time_round_trips(
    stream: trio.SocketStream,
    message: bytes,
    reply: int,
    count: int | None,
    deadline: float | None = None,
) -> list[float]:
    """Seconds of each round trip of ``message`` answered by ``reply`` octets, one at a time
    (``send``, then ``recv_into`` until the reply is in: the driver's socket calls):
    WARMUP_ITERS untimed first, then ``count`` timed, or as many as end before ``deadline``
    (at least one; ``iwarp bench floor --exchange rtt``'s ``raw``)."""
    if count is None and deadline is None:
        raise ValueError("round trips need a count or a deadline")
    clock = time.perf_counter
    times: list[float] = []
    room = memoryview(bytearray(reply))
    with socket_of(stream) as sock:
        i = 0
        while count is None or len(times) < count:
            if deadline is not None and times and clock() >= deadline:
                break
            t0 = clock()
            await send_plain(sock, message)
            if not await recv_exactly(sock, room):
                raise BenchError("raw TCP peer closed early")
            t1 = clock()
            if i >= WARMUP_ITERS:
                times.append(t1 - t0)
            i += 1
    return times
