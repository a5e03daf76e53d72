"""The EMSS follows TCP's segment size (MPA-13: MULPDU may change during a connection).

Linux starts a connection's segment size at half the peer's initial window when the path's
is larger (loopback: about 32 KiB of a 65483-octet path), and grows it as the window
opens.  A connection whose EMSS came from its socket reads it again as it sends, so bulk
messages are cut into FPDUs for the path, not for the first few round trips; an EMSS or
MULPDU the caller fixed stays."""

from __future__ import annotations

import socket

import pytest
import trio

from stack.rnic import Access, SendWR, WcStatus, WrOpcode
from stack.transport.driver import RdmaConnection
from stack.transport.sockopts import path_segment_size, segment_size
from stack.wire.connection import IwarpConnection
from stack.wire.events import Established, MpaSettings, RdmaWrite, RequestReceived, Role
from stack.wire.framing import mulpdu_for
from tests.e2e.helpers import Host, tcp_pair

BLOCK = 1 << 20


def _established(settings: MpaSettings) -> IwarpConnection:
    """An initiator in Full Operation (its responder driven to accept in memory)."""
    a, b = IwarpConnection(Role.INITIATOR, settings), IwarpConnection(Role.RESPONDER, settings)
    a.initiate(0.0)
    b.start(0.0)
    b.receive_data(a.data_to_send())
    assert isinstance(b.next_event(), RequestReceived)
    b.accept()
    a.receive_data(b.data_to_send())
    while not isinstance(event := a.next_event(), Established):
        assert event is not None
    return a


def test_a_new_emss_cuts_later_messages_for_it() -> None:
    engine = _established(MpaSettings(emss=32741))
    assert engine.stream is not None
    write = RdmaWrite(0x100, 0, bytes(65536))
    assert len(engine.stream.send_parts(write)) == 3  # 32734-octet MULPDU: 2 full, 68 left
    assert engine.update_emss(65483) == 64768 == engine.stream.mulpdu
    assert len(engine.stream.send_parts(write)) == 2
    assert engine.settings.emss == 65483 == engine.mpa.settings.emss
    fixed = _established(MpaSettings(emss=32741, mulpdu=1000))
    assert fixed.update_emss(65483) == 1000 and fixed.stream is not None
    assert fixed.stream.mulpdu == 1000  # a fixed MULPDU stays


def test_socket_segment_sizes_on_loopback() -> None:
    with socket.create_server(("127.0.0.1", 0)) as server:
        client = socket.create_connection(server.getsockname())
        peer, _ = server.accept()
        with client, peer:
            size, path = segment_size(client), path_segment_size(client)
            assert size is not None and size > 0
            if path is None:
                pytest.skip("TCP_INFO is not Linux's here")
            assert path >= size  # Linux bounds the first to half the peer's window


def _conn(host: Host) -> RdmaConnection:
    assert host.conn is not None
    return host.conn


def _path_segment_size(conn: RdmaConnection) -> int | None:
    """:func:`path_segment_size` of the connection's socket."""
    stream = conn.stream
    assert isinstance(stream, trio.SocketStream)
    # path_segment_size is annotated for a socket.socket; it only calls getsockopt, which
    # trio's socket has too
    return path_segment_size(stream.socket)


async def _write_until(client: Host, server: Host, limit: int) -> int:
    """Write BLOCK-sized WRs until the client's MULPDU stops growing or ``limit`` blocks;
    every byte is checked at the target.  Returns the blocks written."""
    target = server.mr(BLOCK, Access.LOCAL_WRITE | Access.REMOTE_WRITE)
    src = client.mr(BLOCK)
    ceiling = _path_segment_size(_conn(client))
    for k in range(limit):
        src.buf[:] = bytes([k % 251]) * BLOCK
        wr = SendWR(k, WrOpcode.RDMA_WRITE, (client.sge(src),), rkey=target.rkey,
                    remote_addr=target.base)  # fmt: skip
        client.qp.post_send(wr)
        with trio.fail_after(20):
            assert (await client.cq.next()).status is WcStatus.SUCCESS
        if _conn(client).engine.settings.emss == ceiling:
            return k + 1
    return limit


async def test_the_mulpdu_follows_the_socket_as_its_segment_size_grows() -> None:
    async with tcp_pair() as (client, server):
        conn = _conn(client)
        stream = conn.engine.stream
        assert stream is not None
        first = stream.mulpdu
        ceiling = _path_segment_size(conn)
        if ceiling is None or mulpdu_for(ceiling, False) <= first:
            pytest.skip(f"this path's segment size does not grow (MULPDU {first})")
        await _write_until(client, server, 32)
        assert conn.engine.settings.emss == ceiling
        assert stream.mulpdu == mulpdu_for(ceiling, False) > first


async def test_a_fixed_emss_is_not_followed() -> None:
    fixed = MpaSettings(emss=8960)
    async with tcp_pair(fixed, fixed) as (client, server):
        assert await _write_until(client, server, 8) == 8
        conn = _conn(client)
        assert conn.engine.settings.emss == 8960
        assert conn.engine.stream is not None
        assert conn.engine.stream.mulpdu == mulpdu_for(8960, False)
