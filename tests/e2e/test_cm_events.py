"""The librdmacm-style event channel over real TCP: CONNECT_REQUEST, ESTABLISHED (both
sides, with the peer's private data and IRD/ORD), REJECTED, UNREACHABLE, DISCONNECTED."""

from __future__ import annotations

import socket

import trio

from stack.rnic import QueuePair, Rnic
from stack.transport import CmEvent, CmEventType, ConnectionManager, EventChannel


def _qp(rnic: Rnic) -> QueuePair:
    return rnic.create_qp(rnic.alloc_pd(), rnic.create_cq())


async def _event(channel: EventChannel) -> CmEvent:
    with trio.fail_after(10):
        return await channel.get_cm_event()


async def test_connect_accept_disconnect_as_events() -> None:
    server, client = Rnic("server"), Rnic("client")
    async with ConnectionManager.open(server) as scm, ConnectionManager.open(client) as ccm:
        sch, cch = EventChannel(scm), EventChannel(ccm)
        listener = await sch.listen("127.0.0.1", 0)
        cch.connect("127.0.0.1", listener.port, _qp(client), private_data=b"hi")
        request = await _event(sch)
        assert request.type is CmEventType.CONNECT_REQUEST and request.private_data == b"hi"
        assert request.peer_ird is not None  # RFC 6581 Request
        await sch.accept(request, _qp(server), private_data=b"welcome")
        ours, theirs = await _event(sch), await _event(cch)
        assert ours.type is theirs.type is CmEventType.ESTABLISHED
        assert theirs.private_data == b"welcome" and ours.private_data == b"hi"
        assert theirs.connection is not None and theirs.peer_ord is not None
        await theirs.connection.disconnect()
        gone = {(await _event(sch)).type, (await _event(cch)).type}
        assert gone == {CmEventType.DISCONNECTED}
        await listener.aclose()


async def test_rejected_with_the_peers_private_data() -> None:
    server, client = Rnic("server"), Rnic("client")
    async with ConnectionManager.open(server) as scm, ConnectionManager.open(client) as ccm:
        sch, cch = EventChannel(scm), EventChannel(ccm)
        listener = await sch.listen("127.0.0.1", 0)
        cch.connect("127.0.0.1", listener.port, _qp(client))
        request = await _event(sch)
        assert request.request is not None
        await request.request.reject(b"not today")
        rejected = await _event(cch)
        assert rejected.type is CmEventType.REJECTED and rejected.private_data == b"not today"
        await listener.aclose()


async def test_nobody_listening_is_unreachable() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    client = Rnic("client")
    async with ConnectionManager.open(client) as ccm:
        cch = EventChannel(ccm)
        cch.connect("127.0.0.1", port, _qp(client))
        event = await _event(cch)
        assert event.type is CmEventType.UNREACHABLE and "TCP connect" in event.reason
