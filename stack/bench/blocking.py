"""The blocking-socket baseline (``--baseline``, second column): ``socket.sendall``/``recv_into``.

The fastest plain way to move the same bytes in Python: both ends are blocking sockets, the
server a thread per connection in the server's process, the client a worker thread.  It
speaks the raw-TCP protocol of :mod:`stack.bench.protocol` (``RAW_SINK``, ``RAW_REQRESP``) on
a port of its own, advertised beside the trio one.  Shapes match the trio baseline
(:mod:`stack.bench.baseline`): streams send what is available (up to the tx depth of
messages, at most :data:`BATCH_BYTES`, per ``sendall``); request/response keeps the same
number of requests in flight and the server answers every complete request it has in one
``sendall``.
"""

from __future__ import annotations

import socket
import statistics
import threading
import time
from collections.abc import Iterator

from stack.bench.memory import zeroed
from stack.bench.options import ATOMIC_SIZE, WARMUP_ITERS, BenchError, BenchOptions
from stack.bench.protocol import (
    RAW_COUNT,
    RAW_HEADER,
    RAW_MAGIC,
    RAW_REQRESP,
    RAW_REQUEST,
    RAW_SINK,
)
from stack.bench.results import MB
from stack.bench.session import STALL_TIMEOUT, limit_stall, log_stall, stalled

BATCH_BYTES = 1 << 20
"""Most bytes one baseline send hands to the kernel."""
RECV_BYTES = 1 << 20
"""The receive buffer of either end."""


def latency_shape(opts: BenchOptions, size: int) -> tuple[bool, int, int]:
    """(ping-pong, reply octets, request octets) of the one-at-a-time exchange of ``opts``:
    Writes and Sends ping-pong ``size`` octets (half a round trip is the latency); Reads
    and atomics send a ``RAW_REQUEST``-octet request for a ``size`` (atomics: 8) reply."""
    pingpong = opts.test in ("write", "send")
    reply = ATOMIC_SIZE if opts.test == "atomic" else size
    return pingpong, reply, size if pingpong else RAW_REQUEST


def batch_messages(size: int, available: int) -> int:
    """Messages of ``size`` bytes one send carries when ``available`` are posted."""
    return max(1, min(available, BATCH_BYTES // max(size, 1)))


ZEROS = memoryview(zeroed(BATCH_BYTES, sent=True))
"""What both request/response servers answer with, one send at most: the reply size is the
peer's header (up to 4 GiB), so no reply is allocated per connection (``bytes(size)`` was:
a MemoryError that ended the trio server where memory is not overcommitted)."""


def zero_replies(size: int, count: int) -> Iterator[memoryview]:
    """The sends that carry ``count`` replies of ``size`` zero bytes, from :data:`ZEROS`."""
    left = size * count
    while left > 0:
        piece = min(left, BATCH_BYTES)
        yield ZEROS[:piece]
        left -= piece


def recv_blocking(sock: socket.socket, count: int) -> bytes:
    """``count`` octets from a blocking socket (``recv_into`` until they are in), as the
    blocking baseline reads; BenchError if the peer closes first."""
    buf = bytearray(count)
    view = memoryview(buf)
    got = 0
    while got < count:
        n = sock.recv_into(view[got:])
        if not n:
            raise BenchError("blocking TCP peer closed early")
        got += n
    return bytes(buf)


class BlockingServer:
    """Serves the blocking baseline: a listening socket and a daemon thread per connection;
    a connection whose client takes none of its replies for ``stall_timeout`` seconds is
    ended (:mod:`stack.bench.session`)."""

    def __init__(self, host: str, stall_timeout: float = STALL_TIMEOUT) -> None:
        self.stall_timeout = stall_timeout
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self._sock = socket.socket(family, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind((host, 0))
        self._sock.listen(64)
        self.port: int = self._sock.getsockname()[1]
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._accept, name="bench-blocking", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop accepting (connections in progress end with their client)."""
        self._closed.set()
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._sock.close()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        limit_stall(conn, self.stall_timeout)
        buf = bytearray(RECV_BYTES)
        try:
            magic, mode, size, request = RAW_HEADER.unpack(recv_blocking(conn, RAW_HEADER.size))
            if magic != RAW_MAGIC:
                return
            if mode == RAW_SINK:
                total = 0
                while n := conn.recv_into(buf):
                    total += n
                conn.sendall(RAW_COUNT.pack(total))
            elif mode == RAW_REQRESP and request > 0:
                pending = 0
                while n := conn.recv_into(buf):
                    count, pending = divmod(pending + n, request)
                    while count:
                        k = batch_messages(size, count)
                        for piece in zero_replies(size, k):
                            conn.sendall(piece)
                        count -= k
        except (OSError, BenchError) as exc:
            if stalled(exc):
                log_stall("blocking TCP", self.stall_timeout)
        finally:
            conn.close()


def _connect(host: str, port: int, mode: int, size: int, request: int) -> socket.socket:
    try:
        sock = socket.create_connection((host, port))
    except OSError as exc:
        raise BenchError(f"cannot reach the blocking-TCP port {host}:{port}: {exc}") from None
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.sendall(RAW_HEADER.pack(RAW_MAGIC, mode, size, request))
    return sock


def _stream(sock: socket.socket, size: int, count: int, depth: int) -> None:
    batch = batch_messages(size, depth)
    chunk = memoryview(zeroed(size * batch, sent=True))
    sent = 0
    while sent < count:
        k = min(batch, count - sent)
        sock.sendall(chunk if k == batch else chunk[: size * k])
        sent += k
    sock.shutdown(socket.SHUT_WR)
    acked = RAW_COUNT.unpack(recv_blocking(sock, RAW_COUNT.size))[0]
    if acked != count * size:
        raise BenchError(f"blocking TCP sink counted {acked} bytes, {count * size} were sent")


def _pipelined(sock: socket.socket, reply: int, depth: int, count: int) -> None:
    buf = bytearray(RECV_BYTES)
    sent = min(depth, count)
    sock.sendall(bytes(RAW_REQUEST * sent))
    received = done = 0
    while done < count:
        n = sock.recv_into(buf)
        if not n:
            raise BenchError("blocking TCP server closed during the request/response baseline")
        received += n
        new_done = received // reply
        more = min(new_done - done, count - sent)
        done = new_done
        if more > 0:
            sock.sendall(bytes(RAW_REQUEST * more))
            sent += more


def blocking_bandwidth(host: str, port: int, opts: BenchOptions, size: int, messages: int) -> float:
    """MB/s of the same exchange over ``num_qps`` blocking sockets, one thread each."""
    streaming = opts.test in ("write", "send")
    reply = ATOMIC_SIZE if opts.test == "atomic" else size
    n = opts.num_qps
    counts = [messages // n + (i < messages % n) for i in range(n)]
    mode, request = (RAW_SINK, 0) if streaming else (RAW_REQRESP, RAW_REQUEST)
    socks = [_connect(host, port, mode, 0 if streaming else reply, request) for _ in range(n)]
    errors: list[BaseException] = []

    def one(i: int) -> None:
        try:
            if streaming:
                _stream(socks[i], size, counts[i], opts.tx_depth)
            else:
                _pipelined(socks[i], reply, opts.ord, counts[i])
        except (OSError, BenchError) as exc:
            errors.append(exc)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    start = time.perf_counter()
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        for s in socks:
            s.close()
    elapsed = time.perf_counter() - start
    if errors:
        raise BenchError(f"blocking TCP baseline failed: {errors[0]}")
    return messages * reply / elapsed / MB


def blocking_latency(host: str, port: int, opts: BenchOptions, size: int, count: int) -> float:
    """Median microseconds of the same exchange, one at a time, over a blocking socket."""
    pingpong, reply, request = latency_shape(opts, size)
    sock = _connect(host, port, RAW_REQRESP, reply, request)
    message = bytes(request)
    clock = time.perf_counter
    times = []
    try:
        for i in range(WARMUP_ITERS + count):
            t0 = clock()
            sock.sendall(message)
            recv_blocking(sock, reply)
            if i >= WARMUP_ITERS:
                times.append(clock() - t0)
    except OSError as exc:
        raise BenchError(f"blocking TCP baseline failed: {exc}") from None
    finally:
        sock.close()
    median = statistics.median(times) * 1e6
    return median / 2 if pingpong else median
