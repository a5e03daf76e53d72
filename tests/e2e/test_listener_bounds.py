"""A listener no TCP client can bring down: resets, descriptor exhaustion, startup floods,
bursts beyond the backlog (stack.transport.cm.Listener)."""

from __future__ import annotations

import errno
import socket
import struct
from functools import partial

import trio

from stack.transport.cm import MAX_STARTUPS_PER_PEER, ConnectionManager, Listener
from stack.transport.startup_slots import StartupSlots
from stack.wire.events import MpaSettings
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
    flood = [slots.admit("10.0.0.1", partial(evicted.append, f"a{i}")) for i in range(3)]
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
    assert flood[0] is not None
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
        slots.admit(f"10.0.0.{i}", partial(evicted.append, f"f{i}"), i * 0.1) for i in (1, 2, 3)
    ]
    assert all(held)
    assert slots.admit("10.0.1.1", lambda: None, 0.9) is None  # nothing stale yet
    assert held[0] is not None
    held[0].evictable = False  # its Request arrived: it waits for the ULP, never evicted
    assert slots.admit("10.0.0.2", lambda: None, 5.0) is None  # 1 against 1: no churn
    good = slots.admit("10.0.1.1", lambda: None, 1.25)
    assert good is not None and evicted == ["f2"] and slots.evicted_stale == 1
    assert slots.counts() == {"10.0.0.1": 1, "10.0.0.3": 1, "10.0.1.1": 1}
    assert slots.admit("10.0.1.2", lambda: None, 1.26) is None  # f3 is 1.06 s old ...
    assert slots.admit("10.0.1.2", lambda: None, 1.31) is not None and evicted == ["f2", "f3"]


def test_an_address_at_its_bound_gives_its_own_stale_slot_to_a_new_connection() -> None:
    """MPA-23: at ``per_peer`` an address is refused while its slots are fresh; once its
    oldest slot without a Request is stale, a new connection takes it (one at a time)."""
    slots = StartupSlots(total=8, per_peer=2, stale_after=1.0)
    evicted: list[str] = []
    held = [slots.admit("10.0.0.1", partial(evicted.append, f"a{i}"), i * 0.5) for i in (0, 1)]
    assert all(held)
    assert slots.admit("10.0.0.1", lambda: None, 0.9) is None  # nothing stale yet
    assert slots.admit("10.0.0.1", lambda: evicted.append("a2"), 1.2) is not None
    assert evicted == ["a0"] and slots.evicted_stale == 1 and slots.counts() == {"10.0.0.1": 2}
    assert slots.admit("10.0.0.1", lambda: None, 1.3) is None  # a1 is 0.8 s old
    assert held[1] is not None
    held[1].evictable = False  # its Request arrived: never taken
    newest = slots.admit("10.0.0.1", lambda: None, 9.0)
    assert newest is not None and evicted == ["a0", "a2"]
    newest.evictable = False
    assert slots.admit("10.0.0.1", lambda: None, 99.0) is None and len(slots) == 2


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


async def _all_held(listener: Listener, count: int) -> None:
    with trio.fail_after(10):
        while sum(listener.startups.values()) < count:
            await trio.sleep(0.01)


async def test_silent_startups_from_one_address_give_their_slots_back_at_the_timeout() -> None:
    """MPA-26: the address's whole bound held by connections that never send a Request;
    each times out, its slot is released and its socket closed, and the address is served
    again."""
    async with ConnectionManager.open() as cm:
        settings = MpaSettings(request_timeout=0.3)
        listener = await cm.listen("127.0.0.1", 0, settings=settings)
        listener.slots.stale_after = 3600.0  # only the timeout frees them here
        silent = [_silent_from("127.0.0.1", listener.port) for _ in range(MAX_STARTUPS_PER_PEER)]
        await _all_held(listener, MAX_STARTUPS_PER_PEER)
        with trio.fail_after(10):
            while listener.startups:
                await trio.sleep(0.01)
        assert len(listener.failures) == MAX_STARTUPS_PER_PEER and not listener.slots.evicted_stale
        await _good_client_connects(listener, cm)
        for sock in silent:
            sock.settimeout(5)
            assert sock.recv(1) == b""  # closed by the server
            sock.close()


async def test_silent_startups_from_one_address_do_not_lock_it_out_for_the_timeout() -> None:
    """MPA-23: the address's whole bound held by silent connections; once they are stale a
    good client from the same address takes the oldest one's slot and connects, every other
    silent startup still waiting for its (long) timeout."""
    async with ConnectionManager.open() as cm:
        settings = MpaSettings(request_timeout=600.0)
        listener = await cm.listen("127.0.0.1", 0, settings=settings)
        listener.slots.stale_after = 0.3
        silent = [_silent_from("127.0.0.1", listener.port) for _ in range(MAX_STARTUPS_PER_PEER)]
        await _all_held(listener, MAX_STARTUPS_PER_PEER)
        await trio.sleep(0.4)
        await _good_client_connects(listener, cm)
        assert listener.slots.evicted_stale == 1 and listener.refused == 0
        assert not listener.failures  # no startup timed out
        assert listener.startups == {"127.0.0.1": MAX_STARTUPS_PER_PEER - 1}
        silent[0].settimeout(5)
        assert silent[0].recv(1) == b""  # the oldest gave its slot up
        for sock in silent:
            sock.close()
