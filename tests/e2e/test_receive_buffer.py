"""The driver's receive buffer: parsed in place, grown for a bulk stream (RECEIVE_MAX) and
small for everything else (round trips, a stream with markers); what crosses a growth is
placed exactly (MPA-16: a partial FPDU at the end of a read is completed by the next one,
in the new buffer)."""

from __future__ import annotations

import random

import pytest
import trio

from stack.rnic import Access, SendFlags, SendWR, WcStatus, WrOpcode
from stack.transport.driver import RECEIVE_MAX, RECEIVE_SIZE
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
