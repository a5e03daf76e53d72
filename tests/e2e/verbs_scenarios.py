"""Verbs scenarios defined once, driven through the trio API, the sync API, or a mix.

A scenario is a generator over two hosts (client, server) that post work and check memory
and completions with the calls both APIs share (``mr``, ``sge``, ``qp.post_send``,
``qp.post_recv``, ``qp.state``, ``cq.poll``), and *yields* what must be waited for:
:class:`Wait` (completions, sent back into the generator), :class:`Disconnect` and
:class:`Closed`.  A driver does the waiting its API's way: :func:`run_sync` in plain
blocking Python, :func:`run_async` under trio (a sync host's blocking waits go to a worker
thread, as a sync program on its own thread would do them).
"""

from __future__ import annotations

import struct
from collections.abc import AsyncIterator, Callable, Generator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from typing import Any

import trio

from stack.rnic import (
    Access,
    QpState,
    RecvWR,
    SendFlags,
    SendWR,
    WcOpcode,
    WcStatus,
    WorkCompletion,
    WrOpcode,
)
from stack.transport import ConnectionManager
from stack.verbs_sync import Context
from stack.wire.events import MpaSettings
from tests.e2e.helpers import Host, make_host
from tests.e2e.sync_helpers import TIMEOUT, SyncHost, make_sync_host, sync_pair

RWA = Access.LOCAL_WRITE | Access.REMOTE_WRITE | Access.REMOTE_READ | Access.REMOTE_ATOMIC


@dataclass(frozen=True)
class Wait:
    """Wait for ``count`` completions on ``side``'s CQ ("client" or "server")."""

    side: str
    count: int = 1


@dataclass(frozen=True)
class Disconnect:
    side: str


@dataclass(frozen=True)
class Closed:
    """Wait until ``side``'s connection is down."""

    side: str


Step = Wait | Disconnect | Closed
Scenario = Generator[Step, list[WorkCompletion] | None, None]


def _ok(wcs: list[WorkCompletion] | None) -> list[WorkCompletion]:
    assert wcs is not None
    assert all(wc.status is WcStatus.SUCCESS for wc in wcs), wcs
    return wcs


def _wcs(wcs: list[WorkCompletion] | None) -> list[WorkCompletion]:
    assert wcs is not None
    return wcs


def send_recv(c: Any, s: Any) -> Scenario:
    inbox = s.mr(64)
    s.qp.post_recv(RecvWR(7, (s.sge(inbox),)))
    c.qp.post_send(SendWR(1, WrOpcode.SEND, inline_data=b"ping"))
    (sent,) = _ok((yield Wait("client")))
    (got,) = _ok((yield Wait("server")))
    assert (sent.wr_id, sent.opcode) == (1, WcOpcode.SEND)
    assert (got.wr_id, got.opcode, got.byte_len) == (7, WcOpcode.RECV, 4)
    assert bytes(inbox.buf[:4]) == b"ping"


def write_with_immediate(c: Any, s: Any) -> Scenario:
    target = s.mr(4096, Access.LOCAL_WRITE | Access.REMOTE_WRITE)
    s.qp.post_recv(RecvWR(9, ()))
    src = c.mr(b"written with imm")
    c.qp.post_send(
        SendWR(
            2,
            WrOpcode.RDMA_WRITE_WITH_IMM,
            (c.sge(src),),
            rkey=target.rkey,
            remote_addr=target.base + 100,
            imm_data=0xC0FFEE,
        )
    )
    (got,) = _ok((yield Wait("server")))
    assert (got.wr_id, got.opcode) == (9, WcOpcode.RECV_RDMA_WITH_IMM)
    assert got.imm_data == (0xC0FFEE).to_bytes(8, "big")
    assert bytes(target.buf[100:116]) == b"written with imm"  # placed before it completed
    (sent,) = _ok((yield Wait("client")))
    assert (sent.wr_id, sent.opcode) == (2, WcOpcode.RDMA_WRITE)


def rdma_read(c: Any, s: Any) -> Scenario:
    data = bytes(range(256)) * 8
    source = s.mr(data, Access.LOCAL_WRITE | Access.REMOTE_READ)
    sink = c.mr(len(data))
    c.qp.post_send(
        SendWR(3, WrOpcode.RDMA_READ, (c.sge(sink),), rkey=source.rkey, remote_addr=source.base)
    )
    (read,) = _ok((yield Wait("client")))
    assert (read.opcode, read.byte_len) == (WcOpcode.RDMA_READ, len(data))
    assert bytes(sink.buf) == data


def atomics(c: Any, s: Any) -> Scenario:
    target = s.mr(struct.pack("<Q", 10), RWA)
    results = c.mr(24)

    def atomic(wr_id: int, opcode: WrOpcode, offset: int, compare: int, swap: int = 0) -> SendWR:
        sge = c.sge(results, offset, 8)
        return SendWR(
            wr_id, opcode, (sge,), rkey=target.rkey, remote_addr=target.base,
            compare_add=compare, swap=swap,
        )  # fmt: skip

    c.qp.post_send(
        [
            atomic(1, WrOpcode.ATOMIC_FETCH_AND_ADD, 0, compare=5),  # the addend
            atomic(2, WrOpcode.ATOMIC_CMP_AND_SWP, 8, compare=15, swap=99),
            atomic(3, WrOpcode.ATOMIC_CMP_AND_SWP, 16, compare=1, swap=7),  # no match
        ]
    )
    wcs = _ok((yield Wait("client", 3)))
    assert [wc.opcode for wc in wcs] == [WcOpcode.FETCH_ADD] + [WcOpcode.COMP_SWAP] * 2
    assert struct.unpack("<3Q", results.buf) == (10, 15, 99)  # the original values
    assert struct.unpack("<Q", target.buf)[0] == 99


def protection_error(c: Any, s: Any) -> Scenario:
    target = s.mr(16, Access.LOCAL_WRITE | Access.REMOTE_READ)  # no REMOTE_WRITE
    s.qp.post_recv(RecvWR(5, ()))
    sink = c.mr(16)
    c.qp.post_send(
        [
            SendWR(
                1,
                WrOpcode.RDMA_WRITE,
                inline_data=b"x" * 8,
                rkey=target.rkey,
                remote_addr=target.base,
                send_flags=SendFlags.NONE,
            ),  # fmt: skip
            SendWR(
                2, WrOpcode.RDMA_READ, (c.sge(sink),), rkey=target.rkey, remote_addr=target.base
            ),  # fmt: skip
        ]
    )
    yield Closed("client")
    yield Closed("server")
    assert bytes(target.buf) == bytes(16)
    assert c.qp.state is QpState.ERROR and s.qp.state is QpState.ERROR
    term = c.qp.peer_terminate
    assert term is not None and term.cause == (1, 1, 0x00)  # RDMAP-16 / DDP-10 rights
    (read,) = c.cq.poll()
    assert read.wr_id == 2 and read.status is not WcStatus.SUCCESS
    assert [(wc.wr_id, wc.status) for wc in s.cq.poll()] == [(5, WcStatus.WR_FLUSH_ERR)]


def disconnect_flushes_receives(c: Any, s: Any) -> Scenario:
    c.qp.post_recv(RecvWR(1, ()))
    s.qp.post_recv([RecvWR(2, ()), RecvWR(3, ())])
    yield Disconnect("client")
    yield Closed("server")
    assert c.qp.state is QpState.ERROR and s.qp.state is QpState.ERROR
    assert [(wc.wr_id, wc.status) for wc in c.cq.poll()] == [(1, WcStatus.WR_FLUSH_ERR)]
    assert [(wc.wr_id, wc.status) for wc in s.cq.poll()] == [
        (2, WcStatus.WR_FLUSH_ERR),
        (3, WcStatus.WR_FLUSH_ERR),
    ]
    c.qp.post_send(SendWR(9, WrOpcode.SEND, inline_data=b"too late"))
    (late,) = _wcs((yield Wait("client")))
    assert (late.wr_id, late.status) == (9, WcStatus.WR_FLUSH_ERR)


SCENARIOS: dict[str, Callable[[Any, Any], Scenario]] = {
    "send-recv": send_recv,
    "write-with-immediate": write_with_immediate,
    "rdma-read": rdma_read,
    "atomics": atomics,
    "protection-error": protection_error,
    "disconnect-flushes-receives": disconnect_flushes_receives,
}
"""Each scenario runs under every mode of :data:`MODES`."""

MODES = {
    "trio": ("trio", "trio"),
    "sync-client-trio-server": ("sync", "trio"),
    "trio-client-sync-server": ("trio", "sync"),
}
"""(client API, server API) of each mode :func:`run_async` drives; :func:`run_sync` drives
sync against sync in plain Python."""


# ---------------------------------------------------------------------- plain sync driver
def run_sync(
    scenario: Callable[[Any, Any], Scenario],
    client_settings: MpaSettings | None = None,
    server_settings: MpaSettings | None = None,
) -> None:
    """Drive ``scenario`` with blocking calls only (no trio in this thread), over a
    connection negotiated with the given MPA settings."""
    with sync_pair(client_settings, server_settings) as (client, server):
        hosts = {"client": client, "server": server}
        steps = scenario(client, server)
        reply: list[WorkCompletion] | None = None
        try:
            while True:
                step = steps.send(reply)
                host = hosts[step.side]
                reply = None
                if isinstance(step, Wait):
                    reply = host.cq.wait(step.count, TIMEOUT)
                elif isinstance(step, Disconnect):
                    assert host.cmid is not None
                    host.cmid.disconnect(TIMEOUT)
                    host.wait_disconnected()
                else:
                    host.wait_disconnected()
        except StopIteration:
            pass


# ---------------------------------------------------------------------- trio driver
class TrioSide:
    """A trio-API host in the test's trio loop."""

    def __init__(self, name: str, stack: AsyncExitStack) -> None:
        self.host: Host = make_host(name)
        self.stack = stack
        self.cm: ConnectionManager | None = None

    async def open(self) -> None:
        self.cm = await self.stack.enter_async_context(ConnectionManager.open(self.host.rnic))

    async def listen(self) -> int:
        assert self.cm is not None
        self.listener = await self.cm.listen("127.0.0.1", 0)
        return self.listener.port

    async def accept_one(self) -> None:
        request = await self.listener.get_request()
        self.host.conn = await request.accept(self.host.qp, b"welcome")

    async def connect(self, port: int) -> None:
        assert self.cm is not None
        self.host.conn = await self.cm.connect("127.0.0.1", port, self.host.qp)

    async def wait(self, count: int) -> list[WorkCompletion]:
        return await self.host.cq.wait_for(count)

    async def disconnect(self) -> None:
        assert self.host.conn is not None
        await self.host.conn.disconnect()

    async def closed(self) -> None:
        assert self.host.conn is not None
        await self.host.conn.wait_closed()


class SyncSide:
    """A sync-API host; its blocking waits run in worker threads."""

    def __init__(self, name: str, stack: AsyncExitStack) -> None:
        self.name = name
        self.stack = stack

    async def open(self) -> None:
        ctx = self.stack.enter_context(Context(self.name))
        self.host: SyncHost = make_sync_host(ctx)

    async def listen(self) -> int:
        return self.host.listen()

    async def accept_one(self) -> None:
        await trio.to_thread.run_sync(self.host.accept_one, b"welcome")

    async def connect(self, port: int) -> None:
        await trio.to_thread.run_sync(self.host.connect, port)

    async def wait(self, count: int) -> list[WorkCompletion]:
        return await trio.to_thread.run_sync(self.host.cq.wait, count, TIMEOUT)

    async def disconnect(self) -> None:
        assert self.host.cmid is not None
        await trio.to_thread.run_sync(self.host.cmid.disconnect, TIMEOUT)
        await self.closed()

    async def closed(self) -> None:
        await trio.to_thread.run_sync(self.host.wait_disconnected)


@asynccontextmanager
async def async_pair(client_api: str, server_api: str) -> AsyncIterator[dict[str, Any]]:
    """Connected sides of the given APIs, by role."""
    async with AsyncExitStack() as stack:
        kinds: dict[str, type[TrioSide] | type[SyncSide]] = {"trio": TrioSide, "sync": SyncSide}
        server = kinds[server_api]("server", stack)
        client = kinds[client_api]("client", stack)
        await server.open()
        await client.open()
        port = await server.listen()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(server.accept_one)
            await client.connect(port)
        yield {"client": client, "server": server}


async def run_async(
    scenario: Callable[[Any, Any], Scenario], client_api: str, server_api: str
) -> None:
    """Drive ``scenario`` from a trio task, whatever API each side uses."""
    with trio.fail_after(2 * TIMEOUT):
        async with async_pair(client_api, server_api) as sides:
            steps = scenario(sides["client"].host, sides["server"].host)
            reply: list[WorkCompletion] | None = None
            try:
                while True:
                    step = steps.send(reply)
                    side = sides[step.side]
                    reply = None
                    if isinstance(step, Wait):
                        reply = await side.wait(step.count)
                    elif isinstance(step, Disconnect):
                        await side.disconnect()
                    else:
                        await side.closed()
            except StopIteration:
                pass
