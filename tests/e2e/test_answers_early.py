"""Answers leave early: the driver answers a read full of requests a budget at a time
(FEED_BUDGET), and a consumer answering a drain in halves sends each half at once (uncork).

Many Read Requests that arrive in one read are not all applied before the first Read
Responses leave: after every FEED_BUDGET requests the answers go to the socket, so the
requester works on them while the rest are applied (no batch bouncing between two idle
ends).  Every Read still returns its own bytes, in order.
"""

from __future__ import annotations

import socket
from typing import Any

import trio

from stack.rnic import Access, SendWR, WcStatus, WrOpcode
from stack.transport.pumping import FEED_BUDGET, drain_halves
from stack.wire.events import MpaSettings
from tests.e2e.helpers import tcp_pair

_DEPTH = 2 * FEED_BUDGET + 8  # three budgets' worth: 64 + 64 + 8 requests
_SIZE = 64
_FPDU = 2 + 14 + _SIZE + 4  # a Read Response of 64 octets: length, tagged header, CRC
_REQUEST = 2 + 18 + 28 + 4  # a Read Request: length, untagged header, RDMAP fields, CRC


def _peek(sock: socket.socket) -> bytes:
    """What waits in ``sock``'s receive buffer, left there."""
    try:
        return sock.recv(1 << 20, socket.MSG_PEEK | socket.MSG_DONTWAIT)
    except BlockingIOError:
        return b""


class _HeldSocket:
    """A connection's socket: reads find nothing while ``hold`` (the bytes wait in the
    kernel); every ``sendmsg`` is recorded (octets per call)."""

    def __init__(self, sock: Any) -> None:
        self.sock = sock
        self.hold = False
        self.sent: list[int] = []

    def recv_into(self, buf: Any) -> int:
        if self.hold:
            raise BlockingIOError
        n: int = self.sock.recv_into(buf)
        return n

    def sendmsg(self, buffers: Any) -> int:
        n: int = self.sock.sendmsg(buffers)
        self.sent.append(n)
        return n

    def fileno(self) -> int:
        return int(self.sock.fileno())

    def __getattr__(self, name: str) -> Any:
        return getattr(self.sock, name)


async def _read(client: Any, sink: Any, source: Any, k: int) -> None:
    client.qp.post_send(_wr(client, sink, source, k))
    with trio.fail_after(10):
        assert (await client.cq.next()).status is WcStatus.SUCCESS


def _wr(client: Any, sink: Any, source: Any, k: int) -> SendWR:
    """Read the ``k``-th ``_SIZE``-octet slice of ``source`` into the same slice of ``sink``."""
    return SendWR(
        k,
        WrOpcode.RDMA_READ,
        (client.sge(sink, k * _SIZE, _SIZE),),
        rkey=source.rkey,
        remote_addr=source.base + k * _SIZE,
    )


async def test_a_read_of_many_requests_is_answered_a_budget_at_a_time() -> None:
    settings = MpaSettings(ird=_DEPTH, ord=_DEPTH)
    async with tcp_pair(
        settings, settings, client_qp={"ord": _DEPTH}, server_qp={"ird": _DEPTH}
    ) as (client, server):
        data = bytes(range(256)) * (_DEPTH * _SIZE // 256)
        source = server.mr(data, Access.LOCAL_WRITE | Access.REMOTE_READ)
        sink = client.mr(len(data))
        await _read(client, sink, source, 0)  # the server's driver has started (its socket)
        conn = server.conn
        assert conn is not None
        held = _HeldSocket(conn._sock)
        conn._sock = held  # type: ignore[assignment]
        assert conn._sendq is not None
        conn._sendq._sendmsg = held.sendmsg  # the send queue bound the socket's at start
        wrs = [_wr(client, sink, source, k) for k in range(_DEPTH)]
        held.hold = True
        client.qp.post_send(wrs)
        with trio.fail_after(30):  # every request waits in the server's kernel buffer
            while len(_peek(held.sock)) < _DEPTH * _REQUEST:
                await trio.sleep(0.01)
        held.hold = False  # one read takes them all
        done: list[int] = []
        with trio.fail_after(30):
            while len(done) < _DEPTH:
                wc = await client.cq.next()
                assert wc.status is WcStatus.SUCCESS
                done.append(wc.wr_id)
        assert done == list(range(_DEPTH))
        assert bytes(sink.buf) == data
        # One send per budget of requests applied, the first before the rest were applied
        # (a single send of everything without the budget).
        assert held.sent[:3] == [FEED_BUDGET * _FPDU, FEED_BUDGET * _FPDU, 8 * _FPDU]


def test_drain_halves_splits_a_drain_in_two_in_order() -> None:
    assert drain_halves([]) == ([],)
    assert drain_halves([1]) == ([1],)
    assert drain_halves([1, 2]) == ([1], [2])
    assert drain_halves([1, 2, 3]) == ([1, 2], [3])
    first, second = drain_halves(list(range(16)))
    assert (list(first), list(second)) == (list(range(8)), list(range(8, 16)))


async def test_uncork_lets_a_task_send_again_in_the_same_step() -> None:
    """A task's first post goes out at once, its next ones wait for the writer (corked)
    until it yields; ``uncork`` sends them, and the task's next post goes out at once."""
    async with tcp_pair() as (client, server):
        source = server.mr(bytes(range(_SIZE)) * 4, Access.LOCAL_WRITE | Access.REMOTE_READ)
        sink = client.mr(4 * _SIZE)
        await _read(client, sink, source, 0)  # the client's driver has started
        conn = client.conn
        assert conn is not None
        assert conn._sendq is not None
        recorded = _HeldSocket(conn._sock)
        conn._sendq._sendmsg = recorded.sendmsg  # the send queue bound the socket's at start
        sent = recorded.sent
        await trio.sleep(0)  # a new scheduler step: nothing sent in it yet
        client.qp.post_send(_wr(client, sink, source, 1))
        assert sent == [_REQUEST]  # at once
        client.qp.post_send(_wr(client, sink, source, 2))
        assert sent == [_REQUEST]  # corked: the writer sends it once this task yields
        conn.uncork()
        assert sent == [_REQUEST, _REQUEST]  # the corked one, now
        client.qp.post_send(_wr(client, sink, source, 3))
        assert sent == [_REQUEST, _REQUEST, _REQUEST]  # at once
        with trio.fail_after(10):
            for _ in range(3):
                assert (await client.cq.next()).status is WcStatus.SUCCESS
        assert bytes(sink.buf) == bytes(range(_SIZE)) * 4
