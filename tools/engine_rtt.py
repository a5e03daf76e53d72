"""What the sans-IO engines cost a real round trip, whatever drives them.

``python -m tools.engine_rtt [--kinds read,atomic,read-sketch] [--iters 2000] [--repeat 5]
[--cpus CLIENT,SERVER] [--json] [--quiet]``

The round-trip goals (``iwarp bench goals``: ``read-lat``, ``atomic-lat`` and their
``-blk`` forms) divide the stack's round trip by raw trio's.  This tool tells the engines'
part from the driver's.  An answering process on its own CPU (the goals' raw server, on
trio: each 16-octet request answered with 64 octets) serves client loops on another CPU,
each run one after the other and again ``--repeat`` times, medians reported:

``raw-blk``          the exchange on blocking sockets (``send``, ``recv_into``);
``raw-trio``         the exchange on trio as the goals' raw ping-pong makes it
                     (:func:`~stack.bench.raw_socket.send_plain`,
                     :func:`~stack.bench.raw_socket.recv_exactly`);
``+engine``          each of them with the stack's sans-IO round trip of a 64 B Read (an
                     8 B FetchAdd) in the path, each end doing its half where a driver
                     does: the client places the answer, completes the WR and posts,
                     encodes and frames the next Request before it sends; the server
                     deframes, checks and answers it and encodes and frames the answer
                     before it sends (:class:`EngineRoundTrip`).  The other half, which
                     makes the bytes an end's own half takes, runs while the other end
                     works, off the path.  The bytes on the wire stay the raw exchange's.
``engine hot``       both halves timed in a loop in one process, for comparison.

``--kinds read-sketch`` runs the same with the Read's work done as :mod:`tools.fused_sketch`
does it (one function a part, the same checks and bytes): what an exact-case fast path of
the one-segment messages would let a driver reach.

``+engine - raw`` is what the engines' work adds to a round trip when it runs between
wake-ups, as it does when the ends are two processes.  ``raw-trio+engine / raw-trio`` is
the ratio a driver on trio that costs nothing of its own would reach with these engines
(the goal's ratio, ``bound trio``), and ``raw-blk+engine / raw-trio`` the blocking
driver's (``bound blk``); what the stack measures above them is its driver's own cost.
These are timings: run it on a quiet host and compare the figures of one run.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import socket
import statistics
import sys
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Protocol

import trio

from stack.bench.baseline import answer_requests
from stack.bench.blocking import recv_blocking
from stack.bench.process import usable_cpus
from stack.bench.protocol import RAW_REQUEST
from stack.bench.raw_socket import recv_exactly, send_plain, socket_of
from stack.rnic.endpoint import QpEndpoint
from stack.transport.sockopts import limit_unsent

if __package__:
    from tools import op_profile
else:  # run as a file
    import op_profile  # type: ignore[no-redef]

REQUEST = bytes(RAW_REQUEST)
"""The raw exchange's request."""

ANSWER = 64
"""Octets of the raw exchange's answer (the 64 B Read's payload)."""

WARMUP = 200
"""Untimed round trips before each timed loop."""

KINDS = ("read", "atomic", "read-sketch")
"""``read-sketch``: the Read's work as :mod:`tools.fused_sketch` does it, one function a part."""


class EngineRoundTrip:
    """The 64 B Read (``read``) or 8 B FetchAdd (``atomic``) round trip through both ends'
    sans-IO engines and QPs, no sockets, in its parts: :meth:`post` (post the WR, encode
    and frame its Request), :meth:`server_turn` (deframe and check the Request, answer it,
    encode and frame the answer) and :meth:`complete` (place the answer, complete the WR);
    :meth:`client_turn` is the client's half, :meth:`complete` then :meth:`post`.  The
    bytes are handed over in memory."""

    def __init__(self, kind: str) -> None:
        initiator, responder = op_profile._established()
        ends = op_profile._RoundTripEnds.of(kind)
        self._client = QpEndpoint(initiator, ends.client_qp)
        self._server = QpEndpoint(responder, ends.server_qp)
        initiator.mpa.keep_tail = responder.mpa.keep_tail = True  # as the drivers read
        ends.client_qp.set_rts()
        ends.server_qp.set_rts()
        self.client_qp = ends.client_qp
        self.server_qp = ends.server_qp
        self.cq = ends.client_cq
        """The client's CQ."""
        self.wr = ends.wr
        """The WR the client posts."""

    def post(self) -> memoryview:
        """Post the WR: its Request's bytes."""
        self.client_qp.post_send(self.wr)
        return memoryview(bytearray(b"".join(self._client.produce_iov())))

    def complete(self, answer: memoryview) -> None:
        """``answer`` placed and its WR completed (RuntimeError if it failed)."""
        self._client.feed(answer)
        done = self.cq.poll(1)
        if not done or done[0].status:
            why = done[0].status.text if done else "no completion"
            raise RuntimeError(f"the engine round trip failed: {why}")

    def client_turn(self, answer: memoryview) -> memoryview:
        """The client's half: ``answer`` placed and its WR completed, the next WR posted;
        the next Request's bytes."""
        self.complete(answer)
        return self.post()

    def server_turn(self, request: memoryview) -> memoryview:
        """The server's half: ``request`` checked and answered; the answer's bytes."""
        self._server.feed(request)
        return memoryview(bytearray(b"".join(self._server.produce_iov())))


class RoundTrip(Protocol):
    """What the loops need of a round trip's work: :class:`EngineRoundTrip`, or
    :class:`tools.fused_sketch.SketchRoundTrip` (``read-sketch``)."""

    def post(self) -> memoryview: ...
    def client_turn(self, answer: memoryview) -> memoryview: ...
    def server_turn(self, request: memoryview) -> memoryview: ...


def round_trip(kind: str) -> RoundTrip:
    """The round trip's work of ``kind`` (:data:`KINDS`)."""
    if kind == "read-sketch":
        if __package__:
            from tools.fused_sketch import SketchRoundTrip
        else:  # run as a file
            from fused_sketch import SketchRoundTrip  # type: ignore[no-redef]
        return SketchRoundTrip()
    return EngineRoundTrip(kind)


def hot_seconds(trip: RoundTrip, n: int) -> float:
    """Seconds per round trip of ``n`` round trips of ``trip`` in a row, both halves (a hot
    loop)."""
    request = trip.post()
    for _ in range(WARMUP):
        request = trip.client_turn(trip.server_turn(request))
    start = time.perf_counter()
    for _ in range(n):
        request = trip.client_turn(trip.server_turn(request))
    return (time.perf_counter() - start) / n


MODES = {b"-": None, b"r": "read", b"a": "atomic", b"s": "read-sketch"}
"""The byte a client sends first: what the answering end does for that connection."""


def answer(cpu: int, ready: Connection) -> None:
    """The answering process, until it is terminated: a connection whose first byte is
    ``-`` is answered by the goals' raw server (:func:`~stack.bench.baseline.answer_requests`
    on trio, as ``iwarp bench server``'s raw port answers: each 16-octet request with 64
    octets); ``r``, ``a`` or ``s`` (:data:`MODES`) the same way with the server's half of
    that round trip's work (:meth:`EngineRoundTrip.server_turn`) between a request and its
    answer, and the client's half, which makes the next request it checks, after the
    answer went out."""
    os.sched_setaffinity(0, {cpu})
    trio.run(_serve, ready)


async def _serve(ready: Connection) -> None:
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    ready.send(listeners[0].socket.getsockname()[1])

    async def serve(stream: trio.SocketStream) -> None:
        limit_unsent(stream)
        mode = await stream.receive_some(1)
        if mode not in MODES:
            return
        kind = MODES[mode]
        if kind is None:
            await answer_requests(stream, ANSWER, len(REQUEST))
            return
        halves = round_trip(kind)
        request = halves.post()  # its own client half makes what it checks
        reply = bytes(ANSWER)
        room = memoryview(bytearray(len(REQUEST)))
        with socket_of(stream) as sock:
            while await recv_exactly(sock, room):
                answer = halves.server_turn(request)  # between the request and its answer
                await send_plain(sock, reply)
                request = halves.client_turn(answer)  # after it

    await trio.serve_listeners(serve, listeners)


def _mode(kind: str | None) -> bytes:
    return next(mode for mode, of in MODES.items() if of == kind)


def blocking_loop(port: int, n: int, kind: str | None) -> float:
    """Seconds per round trip of ``n`` raw exchanges on a blocking socket; with ``kind``,
    each end runs its half of the engines' round trip on the path (the client's before
    each request, the server's before each answer) and the other half, which makes the
    bytes its own half takes, while the other end works."""
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.sendall(_mode(kind))
        halves = None if kind is None else round_trip(kind)
        answer = None if halves is None else halves.server_turn(halves.post())

        def trips(count: int) -> None:
            nonlocal answer
            for _ in range(count):
                if halves is not None and answer is not None:
                    request = halves.client_turn(answer)
                sock.sendall(REQUEST)
                if halves is not None:
                    answer = halves.server_turn(request)
                recv_blocking(sock, ANSWER)  # as the blocking baseline reads

        trips(WARMUP)
        start = time.perf_counter()
        trips(n)
        return (time.perf_counter() - start) / n


async def _trio_loop(port: int, n: int, kind: str | None) -> float:
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    async with stream:
        await stream.send_all(_mode(kind))
        halves = None if kind is None else round_trip(kind)
        answer = None if halves is None else halves.server_turn(halves.post())
        with socket_of(stream) as sock:
            room = memoryview(bytearray(ANSWER))

            async def trips(count: int) -> None:
                nonlocal answer
                for _ in range(count):
                    if halves is not None and answer is not None:
                        request = halves.client_turn(answer)
                    await send_plain(sock, REQUEST)
                    if halves is not None:
                        answer = halves.server_turn(request)
                    if not await recv_exactly(sock, room):
                        raise RuntimeError("the answering process closed")

            await trips(WARMUP)
            start = time.perf_counter()
            await trips(n)
            return (time.perf_counter() - start) / n


def trio_loop(port: int, n: int, kind: str | None) -> float:
    """:func:`blocking_loop` on trio, as the goals' raw ping-pong sends and reads."""
    return trio.run(_trio_loop, port, n, kind)


def cpus_to_use(given: str | None) -> tuple[int, int]:
    """(client CPU, server CPU): ``given`` as ``CLIENT,SERVER``, else the first two this
    process may use (as ``iwarp bench goals`` places its round trips).  Two distinct CPUs
    or ValueError: each end runs the other end's half while that end works, which only
    stays off the path when the ends do not share a CPU."""
    if given is not None:
        try:
            client, server = (int(p) for p in given.split(","))
        except ValueError:
            raise ValueError(f"--cpus takes CLIENT,SERVER, not {given!r}") from None
        allowed = os.sched_getaffinity(0)
        if client not in allowed or server not in allowed:
            raise ValueError(f"--cpus {given}: this process may use CPUs {sorted(allowed)}")
    else:
        allowed_cpus = usable_cpus()
        if len(allowed_cpus) < 2:
            raise ValueError("needs two CPUs, one per end; this process may use one")
        client, server = allowed_cpus[:2]
    if client == server:
        raise ValueError("needs the two ends on two CPUs (--cpus CLIENT,SERVER)")
    return client, server


def measure(
    kinds: tuple[str, ...],
    iters: int,
    repeat: int,
    cpus: tuple[int, int],
    progress: Callable[[str], None] | None = None,
) -> dict[str, dict[str, float]]:
    """Per kind, microseconds per round trip of each loop (medians of ``repeat``), the
    engine's hot time and what it adds, and the two bounds (module docstring);
    ``progress`` hears of each run."""
    context = multiprocessing.get_context("spawn")
    here, ready = context.Pipe(duplex=False)
    server = context.Process(target=answer, args=(cpus[1], ready), daemon=True)
    server.start()
    saved = os.sched_getaffinity(0)
    try:
        if not here.poll(60):
            raise RuntimeError("the answering process did not start")
        port: int = here.recv()
        os.sched_setaffinity(0, {cpus[0]})
        times: dict[str, list[float]] = {}
        for run in range(repeat):
            if progress is not None:
                progress(f"run {run + 1}/{repeat}: {iters} round trips per loop")
            times.setdefault("raw-blk", []).append(blocking_loop(port, iters, None))
            times.setdefault("raw-trio", []).append(trio_loop(port, iters, None))
            for kind in kinds:
                times.setdefault(f"{kind}-blk", []).append(blocking_loop(port, iters, kind))
                times.setdefault(f"{kind}-trio", []).append(trio_loop(port, iters, kind))
                hot = hot_seconds(round_trip(kind), iters)
                times.setdefault(f"{kind}-hot", []).append(hot)
    finally:
        os.sched_setaffinity(0, saved)
        server.terminate()
        server.join(10)
    us = {name: statistics.median(values) * 1e6 for name, values in times.items()}
    out: dict[str, dict[str, float]] = {}
    for kind in kinds:
        blk, trio_ = us[f"{kind}-blk"], us[f"{kind}-trio"]
        out[kind] = {
            "raw_blk_us": us["raw-blk"],
            "raw_blk_engine_us": blk,
            "raw_trio_us": us["raw-trio"],
            "raw_trio_engine_us": trio_,
            "engine_hot_us": us[f"{kind}-hot"],
            "engine_adds_blk_us": blk - us["raw-blk"],
            "engine_adds_trio_us": trio_ - us["raw-trio"],
            "bound_trio": trio_ / us["raw-trio"],
            "bound_blocking": blk / us["raw-trio"],
        }
    return out


COLUMNS = (
    ("raw_blk_us", "raw-blk"),
    ("raw_blk_engine_us", "+engine"),
    ("raw_trio_us", "raw-trio"),
    ("raw_trio_engine_us", "+engine"),
    ("engine_hot_us", "engine hot"),
    ("engine_adds_blk_us", "adds blk"),
    ("engine_adds_trio_us", "adds trio"),
    ("bound_trio", "bound trio"),
    ("bound_blocking", "bound blk"),
)


def format_table(figures: dict[str, dict[str, float]]) -> str:
    """The figures as a table, µs per round trip and the two bounds."""
    lines = [f"{'kind':<12}" + "".join(f"{label:>11}" for _, label in COLUMNS)]
    for kind, row in figures.items():
        lines.append(f"{kind:<12}" + "".join(f"{row[key]:>11.2f}" for key, _ in COLUMNS))
    lines.append(
        "µs per round trip (medians of the runs); bound: the round trip with the engines' "
        "work and no driver cost of its own, over raw trio's (the goals' ratio, target <= 1.5)"
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.engine_rtt", description=__doc__)
    parser.add_argument(
        "--kinds", default="read,atomic", help="read, atomic, read-sketch (default read,atomic)"
    )
    parser.add_argument("--iters", type=int, default=2000, help="round trips per loop")
    parser.add_argument("--repeat", type=int, default=5, help="runs of each loop")
    parser.add_argument(
        "--cpus", metavar="CLIENT,SERVER", help="the ends' two CPUs (default: the first two)"
    )
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    parser.add_argument("--quiet", action="store_true", help="no progress on stderr")
    args = parser.parse_args(argv)
    kinds = tuple(k.strip() for k in args.kinds.split(",") if k.strip())
    unknown = [k for k in kinds if k not in KINDS]
    if unknown or not kinds:
        listed = ", ".join(unknown) or "none given"
        parser.error(f"--kinds: unknown {listed}; kinds: {', '.join(KINDS)}")
    if args.iters < 1 or args.repeat < 1:
        parser.error("--iters and --repeat must be at least 1")
    try:
        cpus = cpus_to_use(args.cpus)
    except ValueError as exc:
        parser.error(str(exc))

    def progress(line: str) -> None:
        print(f"engine_rtt: {line}", file=sys.stderr, flush=True)

    figures = measure(kinds, args.iters, args.repeat, cpus, None if args.quiet else progress)
    print(json.dumps(figures) if args.json else format_table(figures))
    return 0


__all__ = ["EngineRoundTrip", "format_table", "measure"]

if __name__ == "__main__":
    sys.exit(main())
