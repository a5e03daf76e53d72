"""A client that never reads the bench server's output: one policy on every port
(:mod:`stack.bench.session`).  Its session alone is ended once none of the server's bytes
were taken for the stall timeout (or at once past its send queue), the server's memory stays
within what the session was charged, and a well-behaved client is served meanwhile and
afterwards.  The timeouts below are hang guards only."""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
import trio

from stack.bench import SessionSpec
from stack.bench.memory import REMOTE_ALL
from stack.bench.process import rss_bytes
from stack.bench.protocol import RAW_HEADER, RAW_MAGIC, RAW_REQRESP, Advert
from stack.bench.server import BenchServer
from stack.bench.session import MemoryBudget, Session
from stack.rnic import Rnic, SendFlags, SendWR, Sge, WcStatus, WrOpcode
from stack.rnic.endpoint import MAX_COALESCE
from stack.transport.blocking import BlockingConnection
from stack.transport.blocking_cm import connect
from stack.transport.cm import ConnectionManager

STALL = 1.0
"""The servers' stall timeout here (seconds)."""
SIZE = 4 << 20
"""A Read session's size: 128 Reads of it are 512 MiB the client never reads."""
GUARD = 40
"""Seconds after which a test counts as hung."""


@asynccontextmanager
async def stall_server() -> AsyncIterator[BenchServer]:
    async with trio.open_nursery() as nursery:
        server = BenchServer(host="127.0.0.1", port=0, stall_timeout=STALL)
        await nursery.start(server.run)
        yield server
        nursery.cancel_scope.cancel()


def _never_reading_reads(port: int, writes: bool = False) -> BlockingConnection:
    """A Read session whose client posts 128 Reads of SIZE (and, with ``writes``, a 1-byte
    Write after each) and never reads its socket: the blocking driver sends at posting and
    reads only when asked."""
    rnic = Rnic("never-reads")
    pd = rnic.alloc_pd()
    local = pd.reg_mr(bytearray(SIZE), REMOTE_ALL)
    qp = rnic.create_qp(pd, rnic.create_cq(1024), ord=128)
    conn = connect("127.0.0.1", port, qp, private_data=SessionSpec("read", SIZE).encode())
    advert = Advert.decode(conn.negotiated.peer_private_data)
    sge = (Sge(local.base, SIZE, local.lkey),)
    read = SendWR(1, WrOpcode.RDMA_READ, sge, SendFlags.NONE, rkey=advert.rkey,
                  remote_addr=advert.addr)  # fmt: skip
    write = SendWR(2, WrOpcode.RDMA_WRITE, (Sge(local.base, 1, local.lkey),), SendFlags.NONE,
                   rkey=advert.rkey, remote_addr=advert.addr)  # fmt: skip
    for _ in range(128):
        qp.post_send(read)
        if writes:
            qp.post_send(write)
            time.sleep(0.005)  # each Write meets the Responses queued before it
    return conn


async def _good_read(server: BenchServer, port: int) -> None:
    """A well-behaved client: one 4 KiB Read on ``port``, completed, then an orderly close."""
    rnic = Rnic("good")
    pd = rnic.alloc_pd()
    local = pd.reg_mr(bytearray(4096), REMOTE_ALL)
    cq = rnic.create_cq()
    qp = rnic.create_qp(pd, cq)
    spec = SessionSpec("read", 4096).encode()
    if port == server.port:
        async with ConnectionManager.open(rnic) as cm:
            conn = await cm.connect("127.0.0.1", port, qp, private_data=spec)
            assert conn.negotiated is not None
            advert = Advert.decode(conn.negotiated.peer_private_data)
            qp.post_send(SendWR(1, WrOpcode.RDMA_READ, (Sge(local.base, 4096, local.lkey),),
                                rkey=advert.rkey, remote_addr=advert.addr))  # fmt: skip
            assert (await cq.next()).status is WcStatus.SUCCESS
            await conn.disconnect(timeout=5.0)
        return

    def blocking() -> None:
        with connect("127.0.0.1", port, qp, private_data=spec, timeout=5.0) as conn:
            advert = Advert.decode(conn.negotiated.peer_private_data)
            qp.post_send(SendWR(1, WrOpcode.RDMA_READ, (Sge(local.base, 4096, local.lkey),),
                                rkey=advert.rkey, remote_addr=advert.addr))  # fmt: skip
            assert conn.next_completion(cq, timeout=5.0).status is WcStatus.SUCCESS

    await trio.to_thread.run_sync(blocking)


@pytest.mark.parametrize("which", ["trio", "blocking"])
async def test_a_never_reading_session_is_ended_alone_and_others_are_served(
    which: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, "stack.bench")
    with trio.fail_after(GUARD):
        async with stall_server() as server:
            port = server.port if which == "trio" else server.iwarp_blocking_port
            bad = await trio.to_thread.run_sync(_never_reading_reads, port)
            try:
                await _good_read(server, port)  # served while the other one is stuck
                while server.budget.used or server.active:  # the stuck session ended
                    await trio.sleep(0.05)
                await _good_read(server, port)  # and afterwards
            finally:
                bad.abort()
    assert "read session ended: the client took none of its output" in caplog.text


async def test_a_never_reading_session_holds_no_copies_of_its_queued_reads() -> None:
    """Reads of a 4 MiB target, each followed by a Write: every Write used to copy the
    Read Responses queued before it (up to 4 MiB a time, about 480 MiB in all here), none
    of which could leave."""
    with trio.fail_after(GUARD):
        async with stall_server() as server:
            before = rss_bytes()
            bad = await trio.to_thread.run_sync(_never_reading_reads, server.port, True)
            try:
                await trio.sleep(0.5)
                assert rss_bytes() - before < 64 << 20
                while server.budget.used:
                    await trio.sleep(0.05)
            finally:
                bad.abort()


def _never_reading_raw(port: int) -> socket.socket:
    """A raw request/response client asking 1 MiB replies and never reading them."""
    sock = socket.create_connection(("127.0.0.1", port))
    sock.sendall(RAW_HEADER.pack(RAW_MAGIC, RAW_REQRESP, 1 << 20, 16) + bytes(16 * 64))
    return sock


def _ended(sock: socket.socket) -> bool:
    """Whether the server's end of ``sock`` is gone: a send is answered with a reset."""
    sock.settimeout(0.2)
    for _ in range(int(GUARD / 0.25)):
        try:
            sock.send(bytes(16))
        except TimeoutError:  # the server's receive window is full: it is still there
            pass
        except OSError:
            return True
        time.sleep(0.05)
    return False


@pytest.mark.parametrize("which", ["trio", "blocking"])
async def test_a_never_reading_raw_client_is_ended_and_others_are_served(
    which: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, "stack.bench")
    with trio.fail_after(GUARD + 10):
        async with stall_server() as server:
            port = server.raw_port if which == "trio" else server.blocking_port
            bad = await trio.to_thread.run_sync(_never_reading_raw, port)
            try:
                await _good_read(server, server.port)
                assert await trio.to_thread.run_sync(_ended, bad)
                await _good_read(server, server.port)
                good = await trio.to_thread.run_sync(socket.create_connection,
                                                     ("127.0.0.1", port))  # fmt: skip
                with good:
                    good.sendall(RAW_HEADER.pack(RAW_MAGIC, RAW_REQRESP, 8, 16) + bytes(16))
                    assert await trio.to_thread.run_sync(good.recv, 8) == bytes(8)
            finally:
                bad.close()
    assert "TCP session ended: the client took none of its output" in caplog.text


def test_a_session_is_charged_the_copy_of_its_unsent_answers() -> None:
    """The budget counts what the transport may copy of answers a client leaves unread
    (one send pass; a Read of the whole target is one Response) besides the regions."""
    rnic = Rnic("server")
    pd = rnic.alloc_pd()
    budget = MemoryBudget(1 << 40)
    cases = [
        (SessionSpec("read", SIZE), SIZE + MAX_COALESCE + SIZE),
        (SessionSpec("read", 64), 64 + rnic.max_ird * 64),
        (SessionSpec("send", 4096, True), 3 * 4096 + MAX_COALESCE + 4096),
        (SessionSpec("write", SIZE), SIZE),  # no answers: its regions only
    ]
    for spec, held in cases:
        _spec, session = Session.for_request(rnic, pd, spec.encode(), (0, 0, 0), budget)
        assert budget.used == held
        session.close()
        assert budget.used == 0


def test_server_command_takes_the_stall_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    """``iwarp bench server --stall-timeout`` reaches the server (whose sessions the tests
    above end by it); the default is STALL_TIMEOUT."""
    import stack.bench.cli as bench_cli
    from stack.bench.session import STALL_TIMEOUT
    from stack.cli.iwarp import main

    served: list[BenchServer] = []

    def serve(server: BenchServer, _eof: bool, _cpu: int | None = None) -> int:
        served.append(server)
        return 0

    monkeypatch.setattr(bench_cli, "_serve", serve)
    assert main(["bench", "server", "--stall-timeout", "2.5"]) == 0
    assert main(["bench", "server"]) == 0
    assert [s.stall_timeout for s in served] == [2.5, STALL_TIMEOUT]
