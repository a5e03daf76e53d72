"""A listener no TCP client can bring down: resets, descriptor exhaustion, startup floods,
bursts beyond the backlog (stack.transport.cm.Listener)."""

from __future__ import annotations

import errno
import socket
import struct

import trio

from stack.transport.cm import ConnectionManager, Listener
from stack.transport.startup_slots import StartupSlots
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


# ------------------------------------------------------------------ fair startup slots
def test_full_slots_go_to_a_quieter_address_and_the_busiest_is_refused() -> None:
    slots = StartupSlots(total=4, per_peer=4)
    evicted: list[str] = []
    flood = [slots.admit("10.0.0.1", lambda i=i: evicted.append(f"a{i}")) for i in range(3)]
    other = slots.admit("10.0.0.2", lambda: evicted.append("b0"))
    assert all(flood) and other is not None and len(slots) == 4
    assert slots.admit("10.0.0.1", lambda: evicted.append("a3")) is None  # busiest: refused
    good = slots.admit("10.0.0.3", lambda: evicted.append("c0"))
    assert good is not None and evicted == ["a0"]  # the flood's oldest slot went
    assert slots.counts() == {"10.0.0.1": 2, "10.0.0.2": 1, "10.0.0.3": 1}
    assert slots.evicted == 1 and len(slots) == 4
    # 2 against 0 for a fourth address: evict again; 1 against 1 would not
    assert slots.admit("10.0.0.4", lambda: None) is not None and evicted == ["a0", "a1"]
    assert slots.admit("10.0.0.5", lambda: None) is None
    slots.release(flood[0])  # the evicted connection's own release is a no-op
    assert len(slots) == 4
    slots.release(good)
    assert len(slots) == 3 and "10.0.0.3" not in slots.counts()


def test_a_request_waiting_for_the_ulp_is_never_evicted() -> None:
    slots = StartupSlots(total=2, per_peer=2)
    a, b = (slots.admit("10.0.0.1", lambda: None) for _ in range(2))
    assert a is not None and b is not None
    a.evictable = b.evictable = False
    assert slots.admit("10.0.0.2", lambda: None) is None


def test_a_stale_slot_goes_when_every_address_holds_one() -> None:
    """MPA-23: a flood spread one connection per address has no busiest address; the
    oldest slot still without a Request goes once it is stale, a fresh one never, and an
    address already holding as many as any other is refused rather than churn."""
    slots = StartupSlots(total=3, per_peer=3, stale_after=1.0)
    evicted: list[str] = []
    held = [
        slots.admit(f"10.0.0.{i}", lambda i=i: evicted.append(f"f{i}"), i * 0.1) for i in (1, 2, 3)
    ]
    assert all(held)
    assert slots.admit("10.0.1.1", lambda: None, 0.9) is None  # nothing stale yet
    held[0].evictable = False  # its Request arrived: it waits for the ULP, never evicted
    assert slots.admit("10.0.0.2", lambda: None, 5.0) is None  # 1 against 1: no churn
    good = slots.admit("10.0.1.1", lambda: None, 1.25)
    assert good is not None and evicted == ["f2"] and slots.evicted_stale == 1
    assert slots.counts() == {"10.0.0.1": 1, "10.0.0.3": 1, "10.0.1.1": 1}
    assert slots.admit("10.0.1.2", lambda: None, 1.26) is None  # f3 is 1.06 s old ...
    assert slots.admit("10.0.1.2", lambda: None, 1.31) is not None and evicted == ["f2", "f3"]


def _silent_from(source: str, port: int) -> socket.socket:
    sock = socket.socket()
    sock.bind((source, 0))
    sock.connect(("127.0.0.1", port))
    return sock


async def test_a_silent_flood_from_other_addresses_does_not_lock_a_good_client_out() -> None:
    """Every slot held by half-open connections from 127.0.0.2-5: a client from 127.0.0.1
    takes one of the busiest address's slots and connects at once, not after the flood's
    startup timeout."""
    async with ConnectionManager.open() as cm:
        listener = await cm.listen("127.0.0.1", 0, max_startups=8, max_startups_per_peer=4)
        flood = [_silent_from(f"127.0.0.{2 + i % 4}", listener.port) for i in range(8)]
        with trio.fail_after(5):
            while sum(listener.startups.values()) < 8:
                await trio.sleep(0.01)
        extra = _silent_from("127.0.0.2", listener.port)  # 2 against 2: refused
        with trio.fail_after(5):
            while listener.refused < 1:
                await trio.sleep(0.01)
        with trio.fail_after(3):  # well inside the startup timeout
            await _good_client_connects(listener, cm)
        assert listener.slots.evicted == 1 and listener.refused == 1
        for sock in (*flood, extra):
            sock.close()


async def test_a_silent_flood_one_connection_per_address_does_not_lock_a_good_client_out() -> None:
    """Every slot held by one half-open connection from each of 127.0.0.2-9: once they are
    stale, a client from 127.0.0.1 takes the oldest and connects well inside the startup
    timeout (MPA-23)."""
    async with ConnectionManager.open() as cm:
        listener = await cm.listen("127.0.0.1", 0, max_startups=8, max_startups_per_peer=4)
        listener.slots.stale_after = 0.3
        flood = [_silent_from(f"127.0.0.{2 + i}", listener.port) for i in range(8)]
        with trio.fail_after(5):
            while sum(listener.startups.values()) < 8:
                await trio.sleep(0.01)
        await trio.sleep(0.4)
        with trio.fail_after(3):  # well inside the startup timeout
            await _good_client_connects(listener, cm)
        assert listener.slots.evicted_stale >= 1
        for sock in flood:
            sock.close()
