"""Hostile and broken peers over real TCP: garbage, silence, truncation, resets, bad CRC.

None of these may crash or hang the stack: the listener records the failure and keeps
serving, a connected QP ends in ERROR with its work requests flushed, and where the RFCs
say so a Terminate goes back first.
"""

from __future__ import annotations

import socket
import struct

import trio

from stack.constants import MPA_KEY_REQ
from stack.rnic import Access, QpState, RecvWR, SendWR, WcStatus, WrOpcode
from stack.transport.cm import ConnectFailed, ConnectionManager, Listener
from stack.wire.connection import ConnectionEvent, IwarpConnection
from stack.wire.events import (
    Established,
    MpaSettings,
    NeedData,
    Role,
    Send,
    TerminateReceived,
)
from tests.e2e.helpers import Host, make_host


async def _listen(cm: ConnectionManager, settings: MpaSettings | None = None):
    return await cm.listen("127.0.0.1", 0, settings=settings)


async def _raw_initiator(port: int, settings: MpaSettings | None = None):
    """A hand-driven MPA initiator on a raw socket: returns (stream, engine) once established."""
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    engine = IwarpConnection(Role.INITIATOR, settings or MpaSettings())
    engine.initiate(trio.current_time())
    await stream.send_all(engine.data_to_send())
    while True:
        engine.receive_data(await stream.receive_some(65536))
        ev = engine.next_event()
        if isinstance(ev, Established):
            out = engine.data_to_send()
            if out:
                await stream.send_all(out)
            return stream, engine


async def _accept_one(listener: Listener, host: Host) -> None:
    request = await listener.get_request()
    host.conn = await request.accept(host.qp)


async def _read_until_closed(
    stream: trio.SocketStream, engine: IwarpConnection
) -> list[ConnectionEvent]:
    events: list[ConnectionEvent] = []
    with trio.fail_after(10):
        while True:
            data = await stream.receive_some(65536)
            engine.receive_data(data)
            while not isinstance(ev := engine.next_event(), NeedData):
                events.append(ev)
            if not data:
                return events


async def test_mpa_18_garbage_instead_of_request_is_dropped_and_listener_survives() -> None:
    async with ConnectionManager.open() as cm:
        listener = await _listen(cm)
        stream = await trio.open_tcp_stream("127.0.0.1", listener.port)
        await stream.send_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        with trio.fail_after(5):
            assert await stream.receive_some(100) == b""  # closed without a reply
        with trio.fail_after(5):
            while not listener.failures:
                await trio.sleep(0.01)
        # The listener still serves a proper initiator.
        client = make_host("c")
        server = make_host("s")
        cm.nursery.start_soon(_accept_one, listener, server)
        async with ConnectionManager.open(client.rnic) as ccm:
            conn = await ccm.connect("127.0.0.1", listener.port, client.qp)
            await conn.disconnect()


async def test_mpa_27_responder_times_out_a_silent_initiator() -> None:
    async with ConnectionManager.open() as cm:
        listener = await _listen(cm, MpaSettings(request_timeout=0.2))
        stream = await trio.open_tcp_stream("127.0.0.1", listener.port)
        with trio.fail_after(5):
            assert await stream.receive_some(100) == b""
        assert listener.failures


async def test_mpa_27_initiator_times_out_a_silent_responder() -> None:
    sock = trio.socket.socket()
    await sock.bind(("127.0.0.1", 0))
    sock.listen(1)
    port = sock.getsockname()[1]
    host = make_host("c")
    async with ConnectionManager.open(host.rnic) as cm:
        with trio.fail_after(5):
            try:
                await cm.connect(
                    "127.0.0.1", port, host.qp, settings=MpaSettings(reply_timeout=0.2)
                )
            except ConnectFailed as exc:
                assert "timed out" in str(exc) or "timeout" in str(exc).lower()
            else:
                raise AssertionError("connect to a silent responder succeeded")
    sock.close()


async def test_truncated_request_then_close() -> None:
    async with ConnectionManager.open() as cm:
        listener = await _listen(cm)
        stream = await trio.open_tcp_stream("127.0.0.1", listener.port)
        await stream.send_all(MPA_KEY_REQ[:10])
        await stream.send_eof()
        with trio.fail_after(5):
            assert await stream.receive_some(100) == b""
            while not listener.failures:
                await trio.sleep(0.01)


async def test_peer_stops_mid_fpdu_and_closes() -> None:
    server = make_host("s")
    async with ConnectionManager.open(server.rnic) as cm:
        listener = await _listen(cm)
        cm.nursery.start_soon(_accept_one, listener, server)
        inbox = server.mr(64)
        server.qp.post_recv(RecvWR(1, (server.sge(inbox),)))
        stream, engine = await _raw_initiator(listener.port)
        engine.send_message(Send(b"a message that will be cut short"))
        fpdu = bytes(engine.data_to_send())
        await stream.send_all(fpdu[: len(fpdu) // 2])
        await stream.send_eof()
        with trio.fail_after(10):
            while server.conn is None:
                await trio.sleep(0.01)
            await server.conn.wait_closed()
        assert server.qp.state is QpState.ERROR
        assert [wc.status for wc in server.cq.poll()] == [WcStatus.WR_FLUSH_ERR]
        assert bytes(inbox.buf) == bytes(64)
        await stream.aclose()


async def test_peer_resets_connection() -> None:
    server = make_host("s")
    async with ConnectionManager.open(server.rnic) as cm:
        listener = await _listen(cm)
        cm.nursery.start_soon(_accept_one, listener, server)
        server.qp.post_recv(RecvWR(1, ()))
        stream, _engine = await _raw_initiator(listener.port)
        stream.socket.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        stream.socket.close()  # RST
        with trio.fail_after(10):
            while server.conn is None:
                await trio.sleep(0.01)
            await server.conn.wait_closed()
        assert server.qp.state is QpState.ERROR
        assert [wc.status for wc in server.cq.poll()] == [WcStatus.WR_FLUSH_ERR]


async def test_mpa_12_bad_crc_gets_terminate_llp_crc_error() -> None:
    server = make_host("s")
    async with ConnectionManager.open(server.rnic) as cm:
        listener = await _listen(cm)
        cm.nursery.start_soon(_accept_one, listener, server)
        inbox = server.mr(64)
        server.qp.post_recv(RecvWR(1, (server.sge(inbox),)))
        stream, engine = await _raw_initiator(listener.port)
        engine.send_message(Send(b"corrupted on the way"))
        fpdu = bytearray(engine.data_to_send())
        fpdu[-1] ^= 0xFF  # break the CRC
        await stream.send_all(fpdu)
        events = await _read_until_closed(stream, engine)
        terms = [e for e in events if isinstance(e, TerminateReceived)]
        assert terms and terms[0].terminate.cause == (2, 0, 0x02)
        assert bytes(inbox.buf) == bytes(64)


async def test_garbage_after_established_gets_terminate() -> None:
    server = make_host("s")
    async with ConnectionManager.open(server.rnic) as cm:
        listener = await _listen(cm, MpaSettings())
        cm.nursery.start_soon(_accept_one, listener, server)
        stream, engine = await _raw_initiator(listener.port)
        # A well-framed FPDU whose DDP version is 3: Terminate 1/2/0x06 expected.
        engine.mpa.send_ulpdu(bytes([0x43, 0x43]) + bytes(16))
        await stream.send_all(engine.data_to_send())
        events = await _read_until_closed(stream, engine)
        terms = [e for e in events if isinstance(e, TerminateReceived)]
        assert terms and terms[0].terminate.layer == 1


async def test_write_to_unregistered_memory_over_tcp_leaves_memory_alone() -> None:
    server = make_host("s")
    async with ConnectionManager.open(server.rnic) as cm:
        listener = await _listen(cm)
        cm.nursery.start_soon(_accept_one, listener, server)
        mr = server.mr(32, Access.LOCAL_WRITE | Access.REMOTE_WRITE)
        client = make_host("c")
        async with ConnectionManager.open(client.rnic) as ccm:
            conn = await ccm.connect("127.0.0.1", listener.port, client.qp)
            client.qp.post_send(
                SendWR(
                    1,
                    WrOpcode.RDMA_WRITE,
                    inline_data=b"x" * 8,
                    rkey=mr.rkey + 1,
                    remote_addr=mr.base,
                )
            )
            with trio.fail_after(10):
                await conn.wait_closed()
        assert bytes(mr.buf) == bytes(32)
        assert client.qp.peer_terminate is not None
