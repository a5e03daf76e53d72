"""A listener no TCP client can bring down: resets, descriptor exhaustion, startup floods,
bursts beyond the backlog (stack.transport.cm.Listener)."""

from __future__ import annotations

import errno
import socket
import struct

import trio

from stack.transport.cm import ConnectionManager, Listener
from tests.e2e.helpers import make_host


async def _good_client_connects(listener: Listener, cm: ConnectionManager) -> None:
    client, server = make_host("c"), make_host("s")

    async def accept() -> None:
        request = await listener.get_request()
        await request.accept(server.qp)

    cm.nursery.start_soon(accept)
    async with ConnectionManager.open(client.rnic) as ccm:
        with trio.fail_after(10):
            conn = await ccm.connect("127.0.0.1", listener.port, client.qp)
            await conn.disconnect()


def _reset_at_once(port: int) -> None:
    """Connect, then close with SO_LINGER 0: the kernel answers with a RST."""
    sock = socket.create_connection(("127.0.0.1", port))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


async def test_connections_reset_at_once_end_only_themselves() -> None:
    async with ConnectionManager.open() as cm:
        listener = await cm.listen("127.0.0.1", 0)
        for _ in range(30):
            _reset_at_once(listener.port)
        await trio.sleep(0.2)
        await _good_client_connects(listener, cm)


async def test_accept_out_of_descriptors_backs_off_and_keeps_serving() -> None:
    failures = [OSError(errno.EMFILE, "Too many open files")] * 3
    real_accept = trio.SocketListener.accept

    async def accept(self: trio.SocketListener) -> trio.SocketStream:
        if failures:
            raise failures.pop()
        return await real_accept(self)

    trio.SocketListener.accept = accept  # type: ignore[method-assign]
    try:
        async with ConnectionManager.open() as cm:
            listener = await cm.listen("127.0.0.1", 0)
            await _good_client_connects(listener, cm)
            assert listener.accept_errors == 3 and not failures
    finally:
        trio.SocketListener.accept = real_accept  # type: ignore[method-assign]


async def test_half_open_startups_are_bounded_per_peer() -> None:
    async with ConnectionManager.open() as cm:
        listener = await cm.listen("127.0.0.1", 0, max_startups_per_peer=2)
        silent = [await trio.open_tcp_stream("127.0.0.1", listener.port) for _ in range(2)]
        with trio.fail_after(5):
            while sum(listener.startups.values()) < 2:
                await trio.sleep(0.01)
        third = await trio.open_tcp_stream("127.0.0.1", listener.port)
        with trio.fail_after(5):
            assert await third.receive_some(100) == b""  # closed at once, no startup held
        assert listener.refused == 1
        for stream in (*silent, third):
            await stream.aclose()
        with trio.fail_after(5):
            while listener.startups:
                await trio.sleep(0.01)
        await _good_client_connects(listener, cm)


async def test_a_burst_beyond_the_backlog_queues_instead_of_refusing() -> None:
    async with ConnectionManager.open() as cm:
        listener = await cm.listen("127.0.0.1", 0, backlog=1)
        clients = [make_host(f"c{i}") for i in range(4)]
        servers = [make_host(f"s{i}") for i in range(4)]
        connected: list[object] = []

        async with ConnectionManager.open() as ccm:

            async def connect(i: int) -> None:
                conn = await ccm.connect("127.0.0.1", listener.port, clients[i].qp)
                connected.append(conn)

            for i in range(4):
                ccm.nursery.start_soon(connect, i)
            await trio.sleep(0.3)  # every request is in; the ULP has taken none
            with trio.fail_after(10):
                for server in servers:
                    request = await listener.get_request()
                    await request.accept(server.qp)
                while len(connected) < 4:
                    await trio.sleep(0.01)
