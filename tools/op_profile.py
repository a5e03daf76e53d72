"""Load-independent cost of small operations: work counted, not time measured.

``python -m tools.op_profile [--iters 2000] [--post-list 16] [--lists 2000] [--baseline DIR]
[--instructions]``

On a shared machine wall-clock latencies and message rates say more about the load than
about the code, so this counts what a small operation costs:

``raw``                what ``read`` is measured against: ``iwarp bench read -s 64 --lat
                       --baseline``'s raw exchange, a 16-octet request answered with 64
                       octets, one at a time, made with the driver's socket calls and no
                       iWARP (:func:`stack.bench.baseline.time_round_trips` against
                       :func:`~stack.bench.baseline.answer_requests`), both ends in this
                       process; ``read / raw`` is the round trip's load-free ratio
``raw-blk``            the same exchange on plain blocking sockets (``send`` and
                       ``recv_into``), both ends in this process and this thread, stepped
                       in the exchange's order, as ``read-blk`` is: what moving the bytes
                       costs in Python without a scheduler (``raw - raw-blk`` is what
                       trio's two passes cost the raw exchange)
``read`` / ``atomic``  one 64-byte RDMA Read or 8-byte FetchAdd round trip over loopback
                       TCP, both ends in this process (the real trio driver): Python
                       calls (cProfile), socket calls (``send``/``sendmsg``/``recv``/
                       ``recv_into`` of both ends), scheduler passes (trio run-loop
                       iterations) and task steps, each per round trip.
``read-blk`` /         the same round trips on the blocking driver
``atomic-blk``         (:mod:`stack.transport.blocking`, ``--lat --blocking``), both ends in
                       this process and this thread, stepped in the exchange's order: the
                       client posts (its Request leaves in the post), the server reads and
                       answers (``progress``), the client reads its completion
                       (``next_completion``); no scheduler.
``write``              the sender's work per 64-byte RDMA Write posted in lists of
                       ``--post-list`` WRs, the last of each list signalled (selective
                       signalling): posting, the send queue engine, DDP/RDMAP encoding
                       and MPA framing, with no socket (sans-IO, the bytes are dropped).
``write-recv``         the receiver's work per 64-byte tagged FPDU of such Writes, fed
                       ``--post-list`` FPDUs per read as the driver feeds a view of its
                       receive buffer: deframing (CRC), DDP/RDMAP validation, the
                       protection checks and the placement, with no socket (sans-IO).

``--instructions`` adds what a case costs the CPU, load-free: the user-space instructions
per round trip (``write``: per WR, ``write-recv``: per FPDU), counted by valgrind's
callgrind (which must be installed) over the case's own loop run twice, ``--iters``
(``--lists``) apart, in two processes, the difference divided by that count, so start-up
and set-up cancel out.  The
same binary and inputs give the same count whatever else the machine does, where a timing
moves by tens of percent on a shared machine.  It takes a minute or two per case.

``--baseline DIR`` runs the same in another source tree of the project (before and after a
change, in one run).  Counts are reported, never asserted.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import socket
import sys
from collections.abc import Callable
from typing import NamedTuple

import trio

from stack.rnic import (
    Access,
    CompletionQueue,
    QpCap,
    QueuePair,
    Rnic,
    SendFlags,
    SendWR,
    Sge,
    WrOpcode,
)
from stack.rnic.endpoint import QpEndpoint
from stack.rnic.memory import MemoryRegion
from stack.transport.cm import ConnectionManager
from stack.transport.driver import RdmaConnection
from stack.wire.connection import IwarpConnection
from stack.wire.events import Established, MpaSettings, NeedData, RequestReceived, Role

if __package__:
    from tools import profiling
else:  # run as a file, by --baseline: this checkout's sibling (tools.profiling)
    import profiling  # type: ignore[no-redef]

_REMOTE = Access.LOCAL_WRITE | Access.REMOTE_WRITE | Access.REMOTE_READ | Access.REMOTE_ATOMIC


def round_trip(kind: str, iters: int, count: bool = True) -> dict[str, float]:
    """Per round trip of a 64 B Read (``read``) or 8 B FetchAdd (``atomic``): python calls
    (counted without the instruments), socket calls, scheduler passes, task steps.
    ``count=False``: only the warm-up and ``iters`` round trips, nothing counted (the loop
    callgrind counts, :func:`instructions`)."""
    return trio.run(_round_trip, kind, iters, count)


async def _round_trip(kind: str, iters: int, count: bool) -> dict[str, float]:
    settings = MpaSettings()  # CRC requested (the default)
    server_rnic, client_rnic, sqp, cqp, ccq, wr = _RoundTripEnds.of(kind)

    conn: RdmaConnection | None = None

    async def loop(n: int) -> None:
        # The bench's wait: the waiting task drives the input (next_completion; cq.next()
        # on a tree from before it, --baseline).
        assert conn is not None
        wait = getattr(conn, "next_completion", None)
        for _ in range(n):
            cqp.post_send(wr)
            wc = await (wait(ccq) if wait is not None else ccq.next())
            if wc.status:
                raise RuntimeError(f"{kind} completed with {wc.status.text}")

    steps = profiling.Steps()
    out: dict[str, float] = {}
    # Count from before the connection: the driver binds the socket's methods when it starts.
    with profiling.counting_sockets() as sockets:
        async with (
            ConnectionManager.open(server_rnic) as scm,
            ConnectionManager.open(client_rnic) as ccm,
        ):
            listener = await scm.listen("127.0.0.1", 0, settings=settings)
            async with trio.open_nursery() as nursery:

                async def serve() -> None:
                    request = await listener.get_request()
                    await request.accept(sqp)

                nursery.start_soon(serve)
                conn = await ccm.connect("127.0.0.1", listener.port, cqp, settings=settings)
            await loop(200)  # warm up
            if not count:
                await loop(iters)
                await conn.disconnect()
                return out
            profile = cProfile.Profile()
            sockets[0] = 0
            profile.enable()
            await loop(iters)
            profile.disable()
            # Less this tool's own wrapper, one Python call per socket call counted.
            out["python_calls"] = (_calls(profile) - sockets[0]) / iters
            trio.lowlevel.add_instrument(steps)
            sockets[0] = 0
            steps.counting = True
            await loop(iters)
            steps.counting = False
            out["socket_calls"] = sockets[0] / iters
            trio.lowlevel.remove_instrument(steps)
            out["scheduler_passes"] = steps.passes / iters
            out["task_steps"] = steps.steps / iters
            await conn.disconnect()
    return out


def blocking_round_trip(kind: str, iters: int, count: bool = True) -> dict[str, float]:
    """Per round trip of a 64 B Read (``read``) or 8 B FetchAdd (``atomic``) on the blocking
    driver, both ends in this thread (``read-blk``, the module docstring): Python calls and
    socket calls (``count=False``: only the round trips)."""
    import threading

    from stack.transport.blocking_cm import BlockingListener, connect

    settings = MpaSettings()
    _server_rnic, _client_rnic, sqp, cqp, ccq, wr = _RoundTripEnds.of(kind)
    out: dict[str, float] = {}
    with (
        profiling.counting_sockets() as sockets,
        BlockingListener("127.0.0.1", 0, settings=settings) as listener,
    ):
        accepted = []
        server = threading.Thread(
            target=lambda: accepted.append(listener.get_request(30).accept(sqp))
        )
        server.start()
        client = connect("127.0.0.1", listener.port, cqp, settings=settings)
        server.join()
        (served,) = accepted

        def loop(n: int) -> None:
            for _ in range(n):
                cqp.post_send(wr)
                served.progress(None)
                wc = client.next_completion(ccq)
                if wc.status:
                    raise RuntimeError(f"{kind} completed with {wc.status.text}")

        loop(200)  # warm up
        if count:
            out = _count_threaded(loop, iters, sockets)
        else:
            loop(iters)
        client.abort()  # an orderly close would wait here for the server's FIN
        served.abort()
    return out


class _RoundTripEnds(NamedTuple):
    """The two ends of a round trip case, before they connect: the server's and the
    client's RNIC and QP, the client's CQ and the WR it posts."""

    server_rnic: Rnic
    client_rnic: Rnic
    server_qp: QueuePair
    client_qp: QueuePair
    client_cq: CompletionQueue
    wr: SendWR

    @classmethod
    def of(cls, kind: str) -> _RoundTripEnds:
        server_rnic, client_rnic = Rnic("server"), Rnic("client")
        spd, cpd = server_rnic.alloc_pd(), client_rnic.alloc_pd()
        scq, ccq = server_rnic.create_cq(), client_rnic.create_cq()
        sqp, cqp = server_rnic.create_qp(spd, scq), client_rnic.create_qp(cpd, ccq)
        target = spd.reg_mr(bytearray(64), _REMOTE)
        local = cpd.reg_mr(bytearray(64), Access.LOCAL_WRITE)
        return cls(server_rnic, client_rnic, sqp, cqp, ccq, _round_trip_wr(kind, local, target))


def _round_trip_wr(kind: str, local: MemoryRegion, target: MemoryRegion) -> SendWR:
    """The WR of a round trip case: a 64 B Read or an 8 B FetchAdd of ``target``."""
    size = 64 if kind == "read" else 8
    sge = (Sge(local.base, size, local.lkey),)
    if kind == "read":
        return SendWR(1, WrOpcode.RDMA_READ, sge, rkey=target.rkey, remote_addr=target.base)
    return SendWR(
        1,
        WrOpcode.ATOMIC_FETCH_AND_ADD,
        sge,
        rkey=target.rkey,
        remote_addr=target.base,
        compare_add=1,
    )


def raw_round_trip(iters: int, count: bool = True) -> dict[str, float]:
    """Per round trip of the ``read`` case's raw exchange (``raw``, the module docstring):
    the same figures as :func:`round_trip` (``count=False``: only the round trips)."""
    return trio.run(_raw_round_trip, iters, count)


async def _raw_round_trip(iters: int, count: bool) -> dict[str, float]:
    from stack.bench.baseline import answer_requests, time_round_trips
    from stack.bench.options import WARMUP_ITERS
    from stack.bench.protocol import RAW_REQUEST
    from stack.transport.sockopts import limit_unsent

    request = bytes(RAW_REQUEST)
    steps = profiling.Steps()
    out: dict[str, float] = {}
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]
    with profiling.counting_sockets() as sockets:
        async with trio.open_nursery() as nursery:

            async def serve(stream: trio.SocketStream) -> None:
                limit_unsent(stream)  # as the bench server's raw port
                await answer_requests(stream, 64, RAW_REQUEST)

            nursery.start_soon(trio.serve_listeners, serve, listeners)
            stream = await trio.open_tcp_stream("127.0.0.1", port)
            limit_unsent(stream)
            await time_round_trips(stream, request, 64, 200)  # warm up
            trips = iters + WARMUP_ITERS  # time_round_trips' untimed first trips too
            if not count:
                await time_round_trips(stream, request, 64, iters)
            else:
                profile = cProfile.Profile()
                sockets[0] = 0
                profile.enable()
                await time_round_trips(stream, request, 64, iters)
                profile.disable()
                out["python_calls"] = (_calls(profile) - sockets[0]) / trips
                trio.lowlevel.add_instrument(steps)
                sockets[0] = 0
                steps.counting = True
                await time_round_trips(stream, request, 64, iters)
                steps.counting = False
                trio.lowlevel.remove_instrument(steps)
                out["socket_calls"] = sockets[0] / trips
                out["scheduler_passes"] = steps.passes / trips
                out["task_steps"] = steps.steps / trips
            await stream.aclose()
            nursery.cancel_scope.cancel()
    return out


def raw_blocking_round_trip(iters: int, count: bool = True) -> dict[str, float]:
    """Per round trip of the ``raw`` exchange on blocking sockets, both ends in this thread
    and stepped in the exchange's order (``raw-blk``, the module docstring): Python calls
    and socket calls (``count=False``: only the round trips)."""
    from stack.bench.protocol import RAW_REQUEST

    request = bytes(RAW_REQUEST)
    reply = bytes(64)
    out: dict[str, float] = {}
    with (
        profiling.counting_sockets() as sockets,
        socket.create_server(("127.0.0.1", 0)) as listener,
        socket.create_connection(listener.getsockname()) as client,
    ):
        server, _ = listener.accept()
        with server:
            for sock in (client, server):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            room = memoryview(bytearray(max(len(request), len(reply))))

            def send(sock: socket.socket, data: bytes) -> None:
                sent = 0
                while sent < len(data):
                    sent += sock.send(data[sent:])

            def receive(sock: socket.socket, size: int) -> None:
                got = 0
                while got < size:
                    n = sock.recv_into(room[got:size])
                    if not n:
                        raise RuntimeError("raw-blk: the peer closed early")
                    got += n

            def loop(n: int) -> None:
                for _ in range(n):
                    send(client, request)
                    receive(server, len(request))
                    send(server, reply)
                    receive(client, len(reply))

            loop(200)  # warm up
            if not count:
                loop(iters)
                return out
            return _count_threaded(loop, iters, sockets)


def _count_threaded(
    loop: Callable[[int], None], iters: int, sockets: list[int]
) -> dict[str, float]:
    """Python calls and socket calls per round trip of ``loop(iters)``, a loop of one
    thread with no scheduler (``sockets``: :func:`profiling.counting_sockets`' count)."""
    profile = cProfile.Profile()
    sockets[0] = 0
    profile.enable()
    loop(iters)
    profile.disable()
    return {
        "python_calls": (_calls(profile) - sockets[0]) / iters,
        "socket_calls": sockets[0] / iters,
        "scheduler_passes": 0.0,
        "task_steps": 0.0,
    }


def _calls(profile: cProfile.Profile) -> int:
    """Calls ``profile`` saw."""
    total: int = pstats.Stats(profile).total_calls  # type: ignore[attr-defined]
    return total


def _drain(engine: IwarpConnection) -> list[object]:
    events: list[object] = []
    while not isinstance(event := engine.next_event(), NeedData):
        events.append(event)
    return events


def post_list_writes(post_list: int, lists: int, count: bool = True) -> dict[str, float]:
    """Python calls per 64 B Write WR on the sender, posted ``post_list`` at a time
    (``count=False``: the warm-up and ``lists`` post lists, nothing counted)."""
    a, _b = _established()
    rnic = Rnic("sender")
    pd = rnic.alloc_pd()
    cq = rnic.create_cq()
    qp = rnic.create_qp(pd, cq, cap=QpCap(max_send_wr=max(256, 2 * post_list)))
    endpoint = QpEndpoint(a, qp)
    qp.set_rts()
    src = pd.reg_mr(bytearray(64), Access.LOCAL_WRITE)
    sge = (Sge(src.base, 64, src.lkey),)
    quiet = SendWR(0, WrOpcode.RDMA_WRITE, sge, SendFlags.NONE, rkey=0x100, remote_addr=0)
    signalled = SendWR(1, WrOpcode.RDMA_WRITE, sge, SendFlags.SIGNALED, rkey=0x100)
    batch = [quiet] * (post_list - 1) + [signalled]

    def run(n: int) -> None:
        for _ in range(n):
            qp.post_send(batch)
            endpoint.produce_iov()  # the driver's send pass; the bytes are dropped here
            cq.poll(len(cq))

    run(100)
    if not count:
        run(lists)
        return {}
    profile = cProfile.Profile()
    profile.enable()
    run(lists)
    profile.disable()
    return {"python_calls": _calls(profile) / (lists * post_list)}


def _established() -> tuple[IwarpConnection, IwarpConnection]:
    """An initiator and a responder engine in Full Operation (CRC on, no markers)."""
    settings = MpaSettings()  # CRC requested (the default)
    a, b = IwarpConnection(Role.INITIATOR, settings), IwarpConnection(Role.RESPONDER, settings)
    a.initiate(0.0)
    b.start(0.0)
    b.receive_data(a.data_to_send())
    if not any(isinstance(e, RequestReceived) for e in _drain(b)):
        raise RuntimeError("no MPA Request")
    b.accept()
    a.receive_data(b.data_to_send())
    if not any(isinstance(e, Established) for e in _drain(a)):
        raise RuntimeError("no MPA Reply")
    return a, b


def received_writes(per_read: int, reads: int, count: bool = True) -> dict[str, float]:
    """Python calls per 64 B tagged Write FPDU on the receiver, ``per_read`` FPDUs fed at a
    time as a view of one receive buffer (the driver's ``recv_into`` buffer, its budget):
    deframing with CRC, DDP/RDMAP validation, the protection checks and the placement
    (``count=False``: the warm-up and ``reads`` feeds, nothing counted)."""
    # From the driver, which binds it too: a --baseline tree from before
    # stack.transport.pumping has it only there.
    from stack.transport.driver import FEED_BUDGET
    from stack.wire.events import RdmaWrite

    a, b = _established()
    rnic = Rnic("receiver")
    pd = rnic.alloc_pd()
    cq = rnic.create_cq()
    qp = rnic.create_qp(pd, cq)
    target = pd.reg_mr(bytearray(64), _REMOTE)
    endpoint = QpEndpoint(b, qp)
    b.mpa.keep_tail = True  # as the driver reads
    qp.set_rts()
    write = RdmaWrite(target.rkey, target.base, bytes(range(64)))
    a.send_messages([write] * per_read)
    # Without markers an FPDU does not depend on its stream offset: the same bytes again
    # are the next FPDUs of the stream.
    buffer = memoryview(bytearray(a.data_to_send()))

    def run(n: int) -> None:
        for _ in range(n):
            if not endpoint.feed(buffer, FEED_BUDGET):
                raise RuntimeError(f"receiver failed: {endpoint.error}")
            while endpoint.events_pending:
                endpoint.feed(None, FEED_BUDGET)

    run(100)
    if bytes(target.buf) != bytes(range(64)):
        raise RuntimeError("the Writes were not placed")
    if not count:
        run(reads)
        return {}
    profile = cProfile.Profile()
    profile.enable()
    run(reads)
    profile.disable()
    return {"python_calls": _calls(profile) / (reads * per_read)}


def measure(
    iters: int, post_list: int, lists: int, with_instructions: bool = False
) -> dict[str, dict[str, float]]:
    """Every figure of this tool, by case."""
    cases: dict[str, dict[str, float]] = {}
    for case, (kind, size) in _cases(post_list).items():
        if kind == "raw":
            figures, n, per = raw_round_trip(iters), iters, iters
        elif kind == "raw-blk":
            figures, n, per = raw_blocking_round_trip(iters), iters, iters
        elif kind.endswith("-blk"):
            figures, n, per = blocking_round_trip(kind[:-4], iters), iters, iters
        elif size is None:
            figures, n, per = round_trip(kind, iters), iters, iters
        elif kind == "write-recv":
            figures, n, per = received_writes(size, lists), lists, lists * size
        else:
            figures, n, per = post_list_writes(size, lists), lists, lists * size
        if with_instructions:
            figures["instructions"] = instructions(kind, n, size or 0) / per
        cases[case] = figures
    return cases


def _cases(post_list: int) -> dict[str, tuple[str, int | None]]:
    """Case name -> (loop kind, WRs per post list; None for a round trip)."""
    return {
        "raw": ("raw", None),
        "raw-blk": ("raw-blk", None),
        "read": ("read", None),
        "atomic": ("atomic", None),
        "read-blk": ("read-blk", None),
        "atomic-blk": ("atomic-blk", None),
        f"write post list {post_list}": ("write", post_list),
        "write post list 1": ("write", 1),
        f"write-recv per FPDU ({post_list}/read)": ("write-recv", post_list),
    }


def _run_loop(kind: str, n: int, post_list: int) -> None:
    """One case's loop, nothing counted (what runs under callgrind)."""
    if kind == "write":
        post_list_writes(post_list, n, count=False)
    elif kind == "write-recv":
        received_writes(post_list, n, count=False)
    elif kind == "raw":
        raw_round_trip(n, count=False)
    elif kind == "raw-blk":
        raw_blocking_round_trip(n, count=False)
    elif kind.endswith("-blk"):
        blocking_round_trip(kind[:-4], n, count=False)
    else:
        round_trip(kind, n, count=False)


def instructions(kind: str, n: int, post_list: int = 0) -> int:
    """User-space instructions of ``n`` more repetitions of a case's loop: callgrind's
    total over the loop run ``n`` + 50 times less its total over 50 (set-up cancels)."""
    script = os.path.abspath(__file__)
    totals = [
        profiling.callgrind_instructions(
            "op_profile", [script, "--loop", kind, str(reps), str(post_list)], f"{kind} x {reps}"
        )
        for reps in (50, n + 50)
    ]
    return totals[1] - totals[0]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.op_profile", description=__doc__)
    parser.add_argument("--iters", type=int, default=2000, help="round trips per case")
    parser.add_argument("--post-list", type=int, default=16, help="WRs per post_send")
    parser.add_argument("--lists", type=int, default=2000, help="post lists measured")
    profiling.add_common_arguments(parser)
    parser.add_argument(
        "--loop", nargs=3, metavar=("KIND", "N", "POST_LIST"), help=argparse.SUPPRESS
    )
    args = parser.parse_args(argv)
    if args.loop:  # one case's loop alone, for callgrind (instructions)
        _run_loop(args.loop[0], int(args.loop[1]), int(args.loop[2]))
        return 0
    ours = measure(args.iters, args.post_list, args.lists, args.instructions)
    if args.json:
        print(json.dumps(ours))
        return 0
    rows = {"": ours}
    if args.baseline:
        own = ["--iters", str(args.iters), "--post-list", str(args.post_list)]
        own += ["--instructions"] if args.instructions else []
        rows = {
            "baseline": profiling.measure_in_tree(
                __file__, args.baseline, own + ["--lists", str(args.lists)]
            ),
            "": ours,
        }
    columns: tuple[str, ...] = ("python_calls", "socket_calls", "scheduler_passes", "task_steps")
    if args.instructions:
        columns += ("instructions",)
    print(f"{'case':<28}" + "".join(f"{c:>18}" for c in columns))
    for case in ours:
        for label, figures in rows.items():
            name = f"{case}@{label}" if label else case
            cells = "".join(
                f"{figures[case][c]:>18.2f}" if c in figures[case] else f"{'-':>18}"
                for c in columns
            )
            print(f"{name:<28}{cells}")
    # The round trip's load-free ratio (what the goal times), and the blocking driver's
    # against the blocking exchange.
    for case, base in (("read", "raw"), ("read-blk", "raw"), ("read-blk", "raw-blk")):
        stack, raw = ours.get(case), ours.get(base)
        if raw and stack:
            cells = "".join(
                f"{stack[c] / raw[c]:>18.2f}" if raw.get(c) and c in stack else f"{'-':>18}"
                for c in columns
            )
            print(f"{case + ' / ' + base:<28}{cells}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
