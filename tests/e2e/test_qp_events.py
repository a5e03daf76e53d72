"""Asynchronous QP events over real TCP: a Terminate, sent or received, reaches the
application as an ``ibv_get_async_event``-style event naming the QP and the cause."""

from __future__ import annotations

import socket
import struct

import trio

from stack.constants import (
    TERM_DDP_T_INVALID_STAG,
    TERM_DDP_U_NO_BUFFER,
    TERM_RDMAP_CATASTROPHIC_STREAM,
)
from stack.rnic import (
    Access,
    AsyncEvent,
    AsyncEventType,
    CompletionQueue,
    QpState,
    RecvWR,
    Rnic,
    SendWR,
    WrOpcode,
)
from tests.e2e.helpers import Host, tcp_pair


async def _event(rnic: Rnic) -> AsyncEvent:
    with trio.fail_after(10):
        return await rnic.get_async_event()


async def _closed(*hosts: Host) -> None:
    with trio.fail_after(10):
        for host in hosts:
            assert host.conn is not None
            await host.conn.wait_closed()


async def test_protection_error_is_qp_access_err_on_both_sides() -> None:
    """A Write to an STag without REMOTE_WRITE: the server terminates (its event: local,
    with the error), the client receives the Terminate (its event: remote); both name the
    QP and carry the Terminate's cause; conn.error still says the same."""
    async with tcp_pair() as (client, server):
        assert client.rnic.poll_async_event() is None
        target = server.mr(16, Access.LOCAL_WRITE | Access.REMOTE_READ)
        client.qp.post_send(
            SendWR(1, WrOpcode.RDMA_WRITE, inline_data=b"x" * 8, rkey=target.rkey,
                   remote_addr=target.base)
        )  # fmt: skip
        ours, theirs = await _event(server.rnic), await _event(client.rnic)
        await _closed(client, server)
        assert ours.event_type is theirs.event_type is AsyncEventType.QP_ACCESS_ERR
        assert ours.event_type == 3 and str(ours.event_type) == "IBV_EVENT_QP_ACCESS_ERR"
        assert ours.qp is server.qp and ours.qp_num == server.qp.qp_num
        assert theirs.qp is client.qp and theirs.qp_num == client.qp.qp_num
        assert ours.cause == theirs.cause == TERM_DDP_T_INVALID_STAG
        assert not ours.remote and theirs.remote
        assert ours.error is server.qp.error and ours.error is not None
        assert "REMOTE_WRITE" in str(ours)
        assert client.qp.state is QpState.ERROR and server.qp.state is QpState.ERROR
        assert client.rnic.poll_async_event() is None  # one event per failure


async def test_send_without_receive_is_qp_req_err() -> None:
    """An untagged message with no receive posted is an invalid request (DDP 1/2/0x02)."""
    async with tcp_pair() as (client, server):
        client.qp.post_send(SendWR(1, WrOpcode.SEND, inline_data=b"nobody listens"))
        ours, theirs = await _event(server.rnic), await _event(client.rnic)
        await _closed(client, server)
    assert ours.event_type is theirs.event_type is AsyncEventType.QP_REQ_ERR
    assert ours.cause == theirs.cause == TERM_DDP_U_NO_BUFFER and theirs.remote


async def test_cq_overflow_is_cq_err_and_a_fatal_qp() -> None:
    """SEC-09: a CQ overflow raises CQ_ERR naming the CQ and QP_FATAL for the QP that hit
    it (Terminate 0/2/0x07); the peer's QP is QP_FATAL too (remote)."""
    small = CompletionQueue(1)
    async with tcp_pair(server_qp={"recv_cq": small}) as (client, server):
        inbox = server.mr(64)
        server.qp.post_recv([RecvWR(i, (server.sge(inbox),)) for i in range(2)])
        client.qp.post_send([SendWR(i, WrOpcode.SEND, inline_data=b"hi") for i in range(2)])
        cq_err, fatal = await _event(server.rnic), await _event(server.rnic)
        remote = await _event(client.rnic)
        await _closed(client, server)
    assert cq_err.event_type is AsyncEventType.CQ_ERR and cq_err.cq is small
    assert cq_err.qp_num == server.qp.qp_num
    assert fatal.event_type is AsyncEventType.QP_FATAL and fatal.qp is server.qp
    assert fatal.cause == TERM_RDMAP_CATASTROPHIC_STREAM and not fatal.remote
    assert remote.event_type is AsyncEventType.QP_FATAL and remote.remote
    assert remote.cause == TERM_RDMAP_CATASTROPHIC_STREAM


async def test_async_iteration_and_polling() -> None:
    """``async for`` yields the events as they come; polling an empty queue returns None at
    once (it never waits)."""
    async with tcp_pair() as (client, server):
        assert server.rnic.poll_async_event() is None
        client.qp.post_send(SendWR(1, WrOpcode.SEND, inline_data=b"no receive"))
        seen: list[AsyncEvent] = []
        with trio.fail_after(10):
            async for event in server.rnic.async_events:
                seen.append(event)
                break
        await _closed(client, server)
    assert [(ev.qp, ev.event_type) for ev in seen] == [(server.qp, AsyncEventType.QP_REQ_ERR)]
    assert server.rnic.poll_async_event() is None


async def test_orderly_disconnect_raises_sq_drained_not_an_error() -> None:
    async with tcp_pair() as (client, server):
        inbox = server.mr(16)
        server.qp.post_recv(RecvWR(1, (server.sge(inbox),)))
        client.qp.post_send(SendWR(1, WrOpcode.SEND, inline_data=b"bye"))
        assert client.conn is not None
        await client.conn.disconnect()
        await _closed(server)
        drained = client.rnic.poll_async_event()
        assert drained is not None and drained.event_type is AsyncEventType.SQ_DRAINED
        assert drained.qp is client.qp and client.rnic.poll_async_event() is None
        server_events = [server.rnic.poll_async_event() for _ in range(2)]
        assert [e.event_type if e else None for e in server_events] == [
            AsyncEventType.SQ_DRAINED,
            None,
        ]
        assert bytes(inbox.buf[:3]) == b"bye"


async def test_a_stream_lost_without_a_terminate_is_qp_fatal_without_cause() -> None:
    """The peer's socket resets (no Terminate, no FIN): the QP is QP_FATAL with no cause and
    the reason in the detail, then ERROR."""
    async with tcp_pair() as (client, server):
        assert server.conn is not None
        sock = server.conn.stream.socket  # type: ignore[attr-defined]
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        await trio.aclose_forcefully(server.conn.stream)  # SO_LINGER 0: RST, not FIN
        event = await _event(client.rnic)
        await _closed(client)
    assert event.event_type is AsyncEventType.QP_FATAL and event.qp is client.qp
    assert event.cause is None and not event.remote and "stream lost" in event.detail
    assert client.qp.state is QpState.ERROR
