"""``kbtp bench``'s baseline: pipelined raw trio TCP request/response of the same shape.

The fastest honest way to do what a KBTP LOAD or STORE does, in Python with trio: one
connection, ``inflight`` requests outstanding, a 40-octet request and a 40-octet response
(a KBTP request's and COMPLETION's size), the block's octets in the response (LOAD) or
after the request (STORE).  Both ends pipeline: the client sends every request it may
send in one go (as many as responses just completed), the server answers every complete
request it has received in one send (scatter-gather ``sendmsg``: headers and block
octets are not joined first), and octets are copied once, from the received chunk
into their destination (the server's memory for a STORE, the client's buffer for a LOAD),
as the target places them.  Both ends make the stack's driver's socket calls
(:mod:`stack.bench.raw_socket`): ``recv_into`` a preallocated buffer, ``sendmsg`` straight
from the task, trio's scheduler entered only to wait; through trio streams (a checkpoint on
each side of every call, a new object per read) the raw exchange was slower than its own
floor (``kbtp bench --floor``).
"""

from __future__ import annotations

import os
import struct
import time

import trio

from kbtp.cli.bench_cpu import BothEndsCpu, CpuClock, no_peer
from stack.bench.options import BenchError
from stack.bench.protocol import receive_exactly
from stack.bench.raw_socket import plain, recv, send_pieces, socket_of
from stack.constants import RAW_RECEIVE_SIZES
from stack.transport.sockopts import limit_unsent

RAW_HEADER = struct.Struct(">B3xI32x")
"""A raw request or response: op, length, padding to 40 octets (a KBTP request's size)."""
RAW_LOAD, RAW_STORE = 1, 2
RAW_HELLO = struct.Struct(">I")
"""A baseline connection's first 4 octets: the receive size both ends read with (the
server clamps it to RAW_RECEIVE_MIN..RAW_RECEIVE_MAX)."""
RAW_RECEIVE_MIN, RAW_RECEIVE_MAX = 4096, 16 << 20


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

    def feed(self, chunk: bytes | memoryview) -> list[tuple[int, int]]:
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
        room = memoryview(bytearray(receive))
        with socket_of(stream) as sock:
            while n := await recv(sock, room):
                out: list[bytes | memoryview] = []
                for op, length in parser.feed(room[:n]):
                    if op == RAW_LOAD:
                        out += [RAW_HEADER.pack(op, length), source[: min(length, max_size)]]
                    else:
                        out.append(reply)
                await send_pieces(sock, out)
                if n == receive:  # the socket may have more: let the other sessions run
                    await trio.lowlevel.checkpoint()
    except (trio.BrokenResourceError, trio.ClosedResourceError, BenchError, OSError):
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
    one run per receive size of ``receives`` (octets per ``recv_into`` at both ends), the
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
    room = memoryview(bytearray(receive))
    sock = plain(stream)
    cpu = BothEndsCpu(peer_cpu)
    start = time.perf_counter()
    sent = min(inflight, iters)
    done = 0
    try:
        await send_pieces(sock, requests(sent))
        while done < iters:
            n = await recv(sock, room)
            if not n:
                raise trio.BrokenResourceError("the baseline server closed early")
            completed = parser.feed(room[:n])
            done += len(completed)
            more = min(len(completed), iters - sent)
            if more:
                await send_pieces(sock, requests(more))
                sent += more
            if n == receive:  # the socket may have more: a checkpoint, as the driver makes
                await trio.lowlevel.checkpoint()
    finally:
        sock.detach()
        await stream.aclose()
    return time.perf_counter() - start, cpu.seconds()
