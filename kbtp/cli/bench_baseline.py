"""``kbtp bench``'s baseline: pipelined raw trio TCP request/response of the same shape.

The fastest honest way to do what a KBTP LOAD or STORE does, in Python with trio: one
connection, ``inflight`` requests outstanding, a 40-octet request and a 40-octet response
(a KBTP request's and COMPLETION's size), the block's octets in the response (LOAD) or
after the request (STORE).  Both ends pipeline: the client sends every request it may
send in one go (as many as responses just completed), the server answers every complete
request it has received in one send (scatter-gather ``sendmsg``: headers and block
octets are not joined first), and octets are copied once, from the received chunk
into their destination (the server's memory for a STORE, the client's buffer for a LOAD),
as the target places them.
"""

from __future__ import annotations

import os
import struct
import time
from collections.abc import Iterator

import trio

from kbtp.cli.bench_cpu import BothEndsCpu, CpuClock, no_peer
from stack.bench.options import BenchError
from stack.bench.protocol import receive_exactly
from stack.constants import RAW_RECEIVE_SIZES
from stack.transport.sockopts import limit_unsent

RAW_HEADER = struct.Struct(">B3xI32x")
"""A raw request or response: op, length, padding to 40 octets (a KBTP request's size)."""
RAW_LOAD, RAW_STORE = 1, 2
RAW_HELLO = struct.Struct(">I")
"""A baseline connection's first 4 octets: the receive size both ends read with (the
server clamps it to RAW_RECEIVE_MIN..RAW_RECEIVE_MAX)."""
RAW_RECEIVE_MIN, RAW_RECEIVE_MAX = 4096, 16 << 20
JOIN_LIMIT = 64 * 1024
"""Pieces up to this size are joined into one send; larger ones go out as they are."""
IOV_MAX = 1024
"""Pieces per ``sendmsg`` call at most (the usual ``IOV_MAX``)."""


def coalesce(pieces: list[bytes | memoryview]) -> Iterator[bytes | memoryview]:
    """``pieces`` as few sends: runs of small pieces joined, large ones alone."""
    run: list[bytes | memoryview] = []
    size = 0
    for piece in pieces:
        if len(piece) > JOIN_LIMIT:
            if run:
                yield b"".join(run)
                run, size = [], 0
            yield piece
            continue
        run.append(piece)
        size += len(piece)
        if size >= JOIN_LIMIT:
            yield b"".join(run)
            run, size = [], 0
    if run:
        yield b"".join(run)


class _Parser:
    """Headers and bodies out of received chunks, each body octet copied once.

    ``feed`` returns the headers completed by a chunk, as (op, length); a body that
    follows a header with ``body_for(op, length)`` not None is copied into that view.
    """

    def __init__(self, body_for: object) -> None:
        self._body_for = body_for
        self._carry = bytearray()
        self._dest: memoryview | None = None
        self._filled = 0
        self._pending: tuple[int, int] | None = None

    def feed(self, chunk: bytes) -> list[tuple[int, int]]:
        done: list[tuple[int, int]] = []
        view = memoryview(chunk)
        pos = 0
        while pos < len(view):
            if self._dest is not None:
                take = min(len(self._dest) - self._filled, len(view) - pos)
                self._dest[self._filled : self._filled + take] = view[pos : pos + take]
                self._filled += take
                pos += take
                if self._filled == len(self._dest):
                    assert self._pending is not None
                    done.append(self._pending)
                    self._dest, self._pending = None, None
                continue
            need = RAW_HEADER.size - len(self._carry)
            if self._carry or len(view) - pos < RAW_HEADER.size:
                self._carry += view[pos : pos + need]
                pos += min(need, len(view) - pos)
                if len(self._carry) < RAW_HEADER.size:
                    break
                op, length = RAW_HEADER.unpack(self._carry)
                self._carry.clear()
            else:
                op, length = RAW_HEADER.unpack_from(view, pos)
                pos += RAW_HEADER.size
            dest = self._body_for(op, length) if length else None  # type: ignore[operator]
            if dest is None:
                done.append((op, length))
            else:
                self._dest, self._filled, self._pending = dest[:length], 0, (op, length)
        return done


async def _send(stream: trio.SocketStream, pieces: list[bytes | memoryview]) -> None:
    """Send ``pieces``: on a socket as scatter-gather ``sendmsg`` calls (no joined copy, as
    the iWARP side sends), otherwise joined runs through ``send_all``."""
    sock = getattr(stream, "socket", None)
    if sock is None:
        for piece in coalesce(pieces):
            await stream.send_all(piece)
        return
    views = [memoryview(p) for p in pieces if len(p)]
    while views:
        sent = await sock.sendmsg(views[:IOV_MAX])
        views = _advance(views, sent)


def _advance(views: list[memoryview], sent: int) -> list[memoryview]:
    """``views`` without their first ``sent`` octets."""
    skip = 0
    while skip < len(views) and sent >= len(views[skip]):
        sent -= len(views[skip])
        skip += 1
    rest = views[skip:]
    if rest and sent:
        rest[0] = rest[0][sent:]
    return rest


async def raw_server(stream: trio.SocketStream, max_size: int) -> None:
    """The baseline server: LOAD answers with octets, STORE copies them into memory."""
    memory = memoryview(bytearray(max_size))
    source = memoryview(bytearray(os.urandom(max_size)))
    reply = RAW_HEADER.pack(RAW_STORE, 0)

    def body_for(op: int, length: int) -> memoryview | None:
        return memory if op == RAW_STORE and length <= max_size else None

    parser = _Parser(body_for)
    limit_unsent(stream)  # as the iWARP driver does with its sockets
    try:
        (receive,) = RAW_HELLO.unpack(await receive_exactly(stream, RAW_HELLO.size))
        receive = min(max(receive, RAW_RECEIVE_MIN), RAW_RECEIVE_MAX)  # whatever it said
        while chunk := await stream.receive_some(receive):
            out: list[bytes | memoryview] = []
            for op, length in parser.feed(chunk):
                if op == RAW_LOAD:
                    out += [RAW_HEADER.pack(op, length), source[: min(length, max_size)]]
                else:
                    out.append(reply)
            await _send(stream, out)
    except (trio.BrokenResourceError, trio.ClosedResourceError, BenchError):
        pass  # the client went away (before its first 4 octets, for a BenchError)


async def bench_raw(
    port: int,
    op: str,
    size: int,
    iters: int,
    inflight: int,
    peer_cpu: CpuClock = no_peer,
    receives: tuple[int, ...] = RAW_RECEIVE_SIZES,
) -> tuple[float, float]:
    """(seconds, CPU seconds of both ends) of ``iters`` exchanges, ``inflight`` outstanding:
    one run per receive size of ``receives`` (octets per ``receive_some`` at both ends), the
    faster run's figures (neither size is the faster at every block size).

    ``peer_cpu`` reads the server process's CPU seconds when it is another process.
    """
    runs = [
        await _bench_raw_once(port, op, size, iters, inflight, peer_cpu, receive)
        for receive in receives
    ]
    return min(runs)


async def _bench_raw_once(
    port: int,
    op: str,
    size: int,
    iters: int,
    inflight: int,
    peer_cpu: CpuClock,
    receive: int,
) -> tuple[float, float]:
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    limit_unsent(stream)
    await stream.send_all(RAW_HELLO.pack(receive))
    kind = RAW_LOAD if op == "load" else RAW_STORE
    data = memoryview(bytearray(os.urandom(size)))
    buffers = [memoryview(bytearray(size)) for _ in range(inflight)]
    request = RAW_HEADER.pack(kind, size)
    landed = 0
    # Response j lands in buffers[j % inflight]: at most ``inflight`` are outstanding.

    def body_for(op: int, length: int) -> memoryview | None:
        nonlocal landed
        if op != RAW_LOAD:
            return None
        landed += 1
        return buffers[(landed - 1) % inflight]

    def requests(count: int) -> list[bytes | memoryview]:
        return [request] * count if kind == RAW_LOAD else [request, data] * count

    parser = _Parser(body_for)
    cpu = BothEndsCpu(peer_cpu)
    start = time.perf_counter()
    sent = min(inflight, iters)
    done = 0
    try:
        await _send(stream, requests(sent))
        while done < iters:
            chunk = await stream.receive_some(receive)
            if not chunk:
                raise trio.BrokenResourceError("the baseline server closed early")
            completed = parser.feed(chunk)
            done += len(completed)
            more = min(len(completed), iters - sent)
            if more:
                await _send(stream, requests(more))
                sent += more
    finally:
        await stream.aclose()
    return time.perf_counter() - start, cpu.seconds()
