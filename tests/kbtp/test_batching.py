"""KBTP with many requests in flight: answers and requests leave as post lists (§9.2).

The target answers every message of one drain of its completion queue with one post list
per session, its receives reposted first; the initiator sends the requests submitted while
others are outstanding together; ``kbtp bench`` moves blocks through one arena (no
registration per request); the raw baseline's scatter-gather send delivers every octet.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial

import pytest
import trio

from kbtp.arena import Arena
from kbtp.batch import BlockRef, build_loads, build_stores
from kbtp.cli.bench import bench_kbtp_size
from kbtp.cli.bench_peer import IDENTITY, bench_config
from kbtp.constants import Status
from kbtp.initiator import KbtpInitiator
from kbtp.initiator_errors import SessionClosed
from kbtp.messages import Completion
from kbtp.target import KbtpTarget
from stack.bench.raw_socket import send_pieces, socket_of
from stack.constants import IOV_MAX
from stack.rnic import ProtectionDomain, QueuePair, SendWR
from stack.wire.events import MpaSettings

BLOCK = 4096
CREDITS = 8


class PostSpy:
    """Counts ``post_send`` calls and the work requests they carry, on one QP."""

    def __init__(self, qp: QueuePair) -> None:
        self.calls = 0
        self.wrs: list[SendWR] = []
        original = qp.post_send

        def post_send(wr: SendWR | list[SendWR]) -> None:
            self.calls += 1
            self.wrs += wr if isinstance(wr, list) else [wr]
            original(wr)

        qp.post_send = post_send  # type: ignore[method-assign]


@asynccontextmanager
async def session(blocks: int = 2 * CREDITS) -> AsyncIterator[tuple[KbtpTarget, KbtpInitiator]]:
    config = bench_config(BLOCK, blocks, CREDITS, 1024)
    async with (
        KbtpTarget(config).running() as target,
        KbtpInitiator.connect("127.0.0.1", target.port, IDENTITY) as ini,
    ):
        yield target, ini


async def test_target_answers_a_drain_with_one_post_list_per_session() -> None:
    """LOADs that arrive together: each one's RDMA Write and COMPLETION in order, and fewer
    posts than work requests (before: one post per work request)."""
    with trio.fail_after(60):
        async with session() as (target, ini):
            data = [os.urandom(BLOCK) for _ in range(CREDITS)]
            for handle, block in enumerate(data):
                await ini.alloc_store(handle, block, seal=True)
            (sess,) = target.sessions.values()
            spy = PostSpy(sess.qp)
            memory = bytearray(CREDITS * BLOCK)
            arena = Arena.register(ini.pd, memory)
            refs = [BlockRef(h, h * BLOCK, BLOCK) for h in range(CREDITS)]
            loads = build_loads(arena, refs, BLOCK)
            async with trio.open_nursery() as nursery:
                for load in loads:
                    nursery.start_soon(ini.request, load)
            assert bytes(memory) == b"".join(data)
            kinds = [wr.opcode.name for wr in spy.wrs]
            assert kinds == ["RDMA_WRITE", "SEND"] * CREDITS
            assert spy.calls <= CREDITS < len(spy.wrs)


async def test_initiator_sends_requests_submitted_together_in_one_post() -> None:
    """The first request of an idle session goes out at once; those submitted while it is
    outstanding leave together, and every one completes."""
    with trio.fail_after(60):
        async with session() as (_target, ini):
            spy = PostSpy(ini.qp)
            results: list[Status] = []

            async def one(handle: int) -> None:
                done = await ini.alloc_store(handle, bytes([handle]) * 100)
                results.append(Status(done.status))

            async with trio.open_nursery() as nursery:
                for handle in range(CREDITS):
                    nursery.start_soon(one, handle)
            assert results == [Status.SUCCESS] * CREDITS
            assert len(spy.wrs) == CREDITS and spy.calls < CREDITS


async def test_submit_hands_each_completion_to_its_function() -> None:
    """``submit``: every result goes to its function, whatever the status, and is counted;
    a function may submit the next request; once the session has ended, submit raises
    SessionClosed."""
    results: list[tuple[int, Status | None, bool]] = []
    with trio.fail_after(60):
        async with session() as (_target, ini):
            arena = Arena.register(ini.pd, bytearray(CREDITS * BLOCK))
            refs = [BlockRef(h, h * BLOCK, BLOCK) for h in range(2 * CREDITS)]
            stores = build_stores(arena, refs[:CREDITS] * 2, BLOCK, 1024, inline=False)
            finished = trio.Event()

            def on_done(i: int, c: Completion | None, e: SessionClosed | None) -> None:
                results.append((i, None if c is None else Status(c.status), e is not None))
                if i < CREDITS:  # the second round, from the completion of the first
                    j = i + CREDITS
                    ini.submit(stores[j], partial(on_done, j))
                if len(results) == 2 * CREDITS:
                    finished.set()

            for i in range(CREDITS):
                ini.submit(stores[i], partial(on_done, i))
            await finished.wait()
            ok = sorted(results)
            assert ok[:CREDITS] == [(i, Status.SUCCESS, False) for i in range(CREDITS)]
            assert ok[CREDITS:] == [(i, Status.ALREADY_VALID, False) for i in range(CREDITS, 16)]
            assert ini.stats[("ALLOC_STORE", "ALREADY_VALID")].count == CREDITS
            load = build_loads(arena, refs[:1], BLOCK)[0]
        with pytest.raises(SessionClosed):
            ini.submit(load, lambda c, e: None)


@pytest.mark.parametrize("per_request", [False, True])
async def test_bench_arena_registers_nothing_per_request(
    monkeypatch: pytest.MonkeyPatch, per_request: bool
) -> None:
    """``kbtp bench`` registers one arena; ``--per-request`` one MR per LOAD and STORE."""
    registered: list[int] = []
    original = ProtectionDomain.reg_mr

    def reg_mr(self: ProtectionDomain, buf: object, *args: object, **kwargs: object) -> object:
        registered.append(1)
        return original(self, buf, *args, **kwargs)  # type: ignore[arg-type]

    iters = 32
    config = bench_config(BLOCK, iters + 4, 4, 1024)
    with trio.fail_after(60):
        async with KbtpTarget(config).running() as target:
            monkeypatch.setattr(ProtectionDomain, "reg_mr", reg_mr)
            rows = await bench_kbtp_size(
                BLOCK,
                ["store", "load"],
                iters,
                4,
                MpaSettings(),
                False,
                1024,
                port=target.port,
                per_request=per_request,
            )
    assert [r.op for r in rows] == ["store", "load"] and all(r.iters == iters for r in rows)
    # Session setup registers a few MRs at both ends; per request adds one per operation.
    if per_request:
        assert len(registered) >= 2 * iters
    else:
        assert len(registered) < iters


async def test_baseline_scatter_gather_send_delivers_every_octet_in_order() -> None:
    """More pieces than one ``sendmsg`` takes, small and large, more than the socket takes
    at once (a piece sent in part goes on from where it stopped): the peer reads them all."""
    pieces: list[bytes | memoryview] = [
        os.urandom(n) for n in [1, 40, 0, 70000, *([40] * (IOV_MAX + 5)), 1 << 20]
    ]
    pieces.append(memoryview(os.urandom(5000))[100:200])
    want = b"".join(bytes(p) for p in pieces)
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]
    got = bytearray()

    async def read_all(stream: trio.SocketStream) -> None:
        while len(got) < len(want):
            chunk = await stream.receive_some(1 << 20)
            assert chunk
            got.extend(chunk)

    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            client = await trio.open_tcp_stream("127.0.0.1", port)
            server = await listeners[0].accept()
            nursery.start_soon(read_all, server)
            with socket_of(client) as sock:
                await send_pieces(sock, pieces)
        await client.aclose()
        await server.aclose()
        await listeners[0].aclose()
    assert bytes(got) == want
