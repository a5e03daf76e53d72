"""The driver's receive buffer: parsed in place, grown for a bulk stream (RECEIVE_MAX) and
small for everything else (round trips, a stream with markers); what crosses a growth is
placed exactly (MPA-16: a partial FPDU at the end of a read is completed by the next one,
in the new buffer); read in RECEIVE_CHUNK calls, and bytes read before a failing call are
applied before the failure is reported."""

from __future__ import annotations

import random
import socket
from typing import Any

import pytest
import trio

from stack.rnic import Access, SendFlags, SendWR, WcStatus, WrOpcode
from stack.transport.driver import RdmaConnection
from stack.transport.pumping import RECEIVE_CHUNK, RECEIVE_MAX, RECEIVE_SIZE
from stack.wire.events import MpaSettings
from tests.e2e.helpers import tcp_pair

_WRITE = 64 * 1024 + 20  # not a multiple of the MULPDU: FPDUs straddle reads
_SLOTS = 64


@pytest.mark.parametrize("markers", [False, True])
async def test_a_bulk_stream_grows_the_buffer_and_every_byte_lands(markers: bool) -> None:
    """Without markers the buffer grows to RECEIVE_MAX; with them it stays RECEIVE_SIZE."""
    settings = MpaSettings(want_markers=markers)
    async with tcp_pair(settings, settings) as (client, server):
        remote = Access.LOCAL_WRITE | Access.REMOTE_WRITE | Access.REMOTE_READ
        target = server.mr(_WRITE * _SLOTS, remote)
        rng = random.Random(7)
        src = client.mr(rng.randbytes(_WRITE * _SLOTS))
        check = client.mr(8)
        assert server.conn is not None
        assert RECEIVE_SIZE < RECEIVE_MAX
        rounds = 0
        # Bursts of 4 MiB until a read has filled the buffer up to RECEIVE_MAX (a receiver
        # slower than the kernel's loopback fills it at once; 24 bursts are the bound), or
        # with markers 6 bursts.
        limit = 6 if markers else 24
        while server.conn.receive_buffer_size < RECEIVE_MAX and rounds < limit:
            rounds += 1
            src.buf[:] = rng.randbytes(len(src.buf))  # new bytes each burst
            wrs = [
                SendWR(
                    k,
                    WrOpcode.RDMA_WRITE,
                    (client.sge(src, k * _WRITE, _WRITE),),
                    SendFlags.NONE,
                    rkey=target.rkey,
                    remote_addr=target.base + k * _WRITE,
                )
                for k in range(_SLOTS)
            ]
            # A Read after the Writes returns once they are placed (RFC 5040 §5.5); it
            # reads back the last 8 bytes written.
            last = target.base + _SLOTS * _WRITE - 8
            wrs.append(
                SendWR(99, WrOpcode.RDMA_READ, (client.sge(check),), rkey=target.rkey,
                       remote_addr=last)
            )  # fmt: skip
            client.qp.post_send(wrs)
            with trio.fail_after(30):
                wc = await client.cq.next()
            assert wc.status is WcStatus.SUCCESS and wc.wr_id == 99
            assert bytes(target.buf) == bytes(src.buf)
            assert bytes(check.buf) == bytes(src.buf[-8:])
        assert server.conn.receive_buffer_size == (RECEIVE_SIZE if markers else RECEIVE_MAX)


async def test_round_trips_keep_the_small_buffer() -> None:
    async with tcp_pair() as (client, server):
        source = server.mr(bytes(range(64)), Access.LOCAL_WRITE | Access.REMOTE_READ)
        sink = client.mr(64)
        wr = SendWR(1, WrOpcode.RDMA_READ, (client.sge(sink),), rkey=source.rkey,
                    remote_addr=source.base)  # fmt: skip
        for _ in range(200):
            client.qp.post_send(wr)
            with trio.fail_after(10):
                assert (await client.cq.next()).status is WcStatus.SUCCESS
        assert bytes(sink.buf) == bytes(range(64))
        for host in (client, server):
            assert host.conn is not None
            assert host.conn.receive_buffer_size == RECEIVE_SIZE


class _Recorded:
    """The driver's socket, with each ``recv_into`` recorded; ``hold`` makes the calls find
    nothing (the bytes wait in the kernel), ``fail_after`` fails the call after that many
    more calls that read bytes."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.asked: list[int] = []
        self.hold = False
        self.fail_after: int | None = None

    def recv_into(self, buf: Any) -> int:
        if self.hold:
            raise BlockingIOError
        if self.fail_after == 0:
            raise ConnectionResetError("reset by the test")
        self.asked.append(len(buf))
        n = self.sock.recv_into(buf)
        if self.fail_after is not None and n:
            self.fail_after -= 1
        return n

    def fileno(self) -> int:
        return self.sock.fileno()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.sock, name)


async def _record(client: Any, server: Any) -> _Recorded:
    """Record the server's socket calls from its next read on (a round trip first: the
    driver takes its socket when it starts; one after: the read under way when the socket
    was swapped used the old one)."""
    await _round_trip(client, server)
    conn: RdmaConnection = server.conn
    recorded = _Recorded(conn._sock)  # type: ignore[arg-type]
    conn._sock = recorded  # type: ignore[assignment]
    await _round_trip(client, server)
    return recorded


async def _one(client: Any, opcode: WrOpcode, local: Any, remote: Any) -> None:
    """Post one RDMA Write or Read of all of ``local`` to ``remote`` and await its success."""
    client.qp.post_send(
        SendWR(7, opcode, (client.sge(local),), rkey=remote.rkey, remote_addr=remote.base)
    )
    with trio.fail_after(30):
        assert (await client.cq.next()).status is WcStatus.SUCCESS


async def _round_trip(client: Any, server: Any) -> None:
    """One 8-byte Read: the server's reader has read once more (with the recorded socket)."""
    source = server.mr(8, Access.LOCAL_WRITE | Access.REMOTE_READ)
    await _one(client, WrOpcode.RDMA_READ, client.mr(8), source)


async def test_a_read_is_made_of_chunked_calls_and_still_fills_the_buffer() -> None:
    """No ``recv_into`` asks for more than RECEIVE_CHUNK, yet the buffer grows to
    RECEIVE_MAX (a read filled 256 KiB and more: several calls joined, parsed as one)."""
    async with tcp_pair() as (client, server):
        assert server.conn is not None
        recorded = await _record(client, server)
        size = 4 * 1024 * 1024
        remote = Access.LOCAL_WRITE | Access.REMOTE_WRITE
        target = server.mr(size, remote)
        rng = random.Random(3)
        src = client.mr(rng.randbytes(size))
        for _ in range(24):
            await _one(client, WrOpcode.RDMA_WRITE, src, target)
            await _round_trip(client, server)  # the Writes are placed before its response
            if server.conn.receive_buffer_size == RECEIVE_MAX:
                break
        assert bytes(target.buf) == bytes(src.buf)
        assert recorded.asked and max(recorded.asked) <= RECEIVE_CHUNK < RECEIVE_SIZE
        assert server.conn.receive_buffer_size == RECEIVE_MAX


async def test_bytes_read_before_a_failing_call_are_applied_first() -> None:
    async with tcp_pair() as (client, server):
        assert server.conn is not None
        recorded = await _record(client, server)
        size = 1024 * 1024
        target = server.mr(size, Access.LOCAL_WRITE | Access.REMOTE_WRITE)
        src = client.mr(random.Random(5).randbytes(size))
        recorded.hold = True  # the Write waits in the kernel, more than one chunk of it
        await _one(client, WrOpcode.RDMA_WRITE, src, target)  # sent: the sender completes it
        await trio.sleep(0.2)
        assert bytes(target.buf) == bytes(size)  # nothing read yet
        recorded.asked.clear()
        recorded.fail_after = 1
        recorded.hold = False
        with trio.fail_after(10):
            while server.conn.error is None:
                await trio.sleep(0.01)
        assert isinstance(server.conn.error, ConnectionResetError)
        assert recorded.asked[0] == RECEIVE_CHUNK  # one full call, then the failing one
        # The FPDUs of that first chunk were placed before the failure ended the stream.
        half = RECEIVE_CHUNK // 2
        assert bytes(target.buf[:half]) == bytes(src.buf[:half])
