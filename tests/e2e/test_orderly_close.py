"""Orderly close over real TCP (RFC 5040 §6.2, DDP-13): ``disconnect()`` sends every WR
posted before it, then FIN; the peer places and completes what arrived before the FIN and
flushes, in order, the receives nothing will fill."""

from __future__ import annotations

import trio

from stack.rnic import Access, QpState, RecvWR, SendWR, WcStatus, WrOpcode
from tests.e2e.helpers import tcp_pair

RW = Access.LOCAL_WRITE | Access.REMOTE_WRITE | Access.REMOTE_READ


async def test_disconnect_sends_wrs_held_back_by_ord_before_fin() -> None:
    """ORD 1: the second Read and the Send behind it are still waiting when disconnect()
    is called; they go out once the first Read is answered, and only then the FIN.  The
    Send sent right before the FIN is placed and completed at the peer, not flushed."""
    async with tcp_pair(client_qp={"ord": 1}) as (client, server):
        source = server.mr(b"sixteen octets!!", RW)
        inbox = server.mr(64)
        server.qp.post_recv([RecvWR(i, (server.sge(inbox),)) for i in range(3)])
        sinks = [client.mr(16), client.mr(16)]
        client.qp.post_send(
            [
                SendWR(i, WrOpcode.RDMA_READ, (client.sge(s),), rkey=source.rkey,
                       remote_addr=source.base)
                for i, s in enumerate(sinks)
            ]
            + [SendWR(2, WrOpcode.SEND, inline_data=b"after the reads")]
        )  # fmt: skip
        assert client.conn is not None and server.conn is not None
        with trio.fail_after(20):
            await client.conn.disconnect()
            await server.conn.wait_closed()
        assert [(wc.wr_id, wc.status) for wc in client.cq.poll()] == [
            (i, WcStatus.SUCCESS) for i in range(3)
        ]
        assert [bytes(s.buf) for s in sinks] == [b"sixteen octets!!"] * 2
        assert [(wc.wr_id, wc.status) for wc in server.cq.poll()] == [
            (0, WcStatus.SUCCESS),
            (1, WcStatus.WR_FLUSH_ERR),
            (2, WcStatus.WR_FLUSH_ERR),
        ]
        assert bytes(inbox.buf[:15]) == b"after the reads"
        assert client.qp.state is QpState.ERROR and server.qp.state is QpState.ERROR


async def test_writes_and_sends_right_before_fin_all_land() -> None:
    """Many Writes and Sends posted, then disconnect() at once: every one is placed at the
    peer and completes there in order; the spare receives are flushed after them."""
    count = 20
    async with tcp_pair() as (client, server):
        target = server.mr(count * 8, RW)
        inbox = server.mr(16)
        server.qp.post_recv([RecvWR(i, (server.sge(inbox),)) for i in range(count + 2)])
        wrs: list[SendWR] = []
        for i in range(count):
            wrs.append(SendWR(2 * i, WrOpcode.RDMA_WRITE, inline_data=b"%08d" % i,
                              rkey=target.rkey, remote_addr=target.base + 8 * i))  # fmt: skip
            wrs.append(SendWR(2 * i + 1, WrOpcode.SEND, inline_data=b"%d" % i))
        client.qp.post_send(wrs)
        assert client.conn is not None and server.conn is not None
        with trio.fail_after(20):
            await client.conn.disconnect()
            await server.conn.wait_closed()
    assert bytes(target.buf) == b"".join(b"%08d" % i for i in range(count))
    statuses = [(wc.wr_id, wc.status) for wc in server.cq.poll(100)]
    assert statuses == [(i, WcStatus.SUCCESS) for i in range(count)] + [
        (count, WcStatus.WR_FLUSH_ERR),
        (count + 1, WcStatus.WR_FLUSH_ERR),
    ]
    assert all(wc.status is WcStatus.SUCCESS for wc in client.cq.poll(100))


async def test_disconnect_aborts_after_its_timeout_when_a_read_is_never_answered() -> None:
    """ORD 1 and a peer that swallows Read Requests (alive, never answers, never closes):
    the second Read waits for ORD, so the FIN can never go out and the orderly close cannot
    finish.  disconnect() aborts after its timeout, both Reads and the Send behind them
    complete with WR_FLUSH_ERR, and the connection's error says why."""
    from stack.errors import ConnectionTimeout
    from stack.wire.events import ReadRequestReceived

    async with tcp_pair(client_qp={"ord": 1}) as (client, server):
        source = server.mr(b"never read", RW)
        server.qp.post_recv(RecvWR(9, (server.sge(server.mr(64)),)))
        real = server.qp.handle_event

        def swallow_reads(event: object) -> None:
            if not isinstance(event, ReadRequestReceived):
                real(event)  # type: ignore[arg-type]

        server.qp.handle_event = swallow_reads  # type: ignore[method-assign]
        sinks = [client.mr(16), client.mr(16)]
        client.qp.post_send(
            [
                SendWR(i, WrOpcode.RDMA_READ, (client.sge(s),), rkey=source.rkey,
                       remote_addr=source.base)
                for i, s in enumerate(sinks, 1)
            ]
            + [SendWR(3, WrOpcode.SEND, inline_data=b"behind the reads")]
        )  # fmt: skip
        assert client.conn is not None and server.conn is not None
        with trio.fail_after(10):
            started = trio.current_time()
            await client.conn.disconnect(timeout=0.5)
            assert trio.current_time() - started >= 0.5  # it did wait for the close
            await server.conn.wait_closed()
        assert isinstance(client.conn.error, ConnectionTimeout)
        assert [(wc.wr_id, wc.status) for wc in client.cq.poll()] == [
            (i, WcStatus.WR_FLUSH_ERR) for i in (1, 2, 3)
        ]
        assert client.qp.state is QpState.ERROR


async def test_mpa_25_a_responder_send_completes_only_once_it_can_go_out() -> None:
    """The responder's Send, posted before the initiator's first FPDU, stays queued (not
    completed: it has not been handed to TCP) until that FPDU arrives; then it goes out and
    both Sends complete and are placed."""
    async with tcp_pair() as (client, server):
        client.qp.post_recv(RecvWR(7, (client.sge(client.mr(64)),)))
        server.qp.post_recv(RecvWR(8, (server.sge(server.mr(64)),)))
        server.qp.post_send(SendWR(1, WrOpcode.SEND, inline_data=b"reply first"))
        await trio.sleep(0.2)
        assert server.cq.poll() == [] and client.cq.poll() == []
        client.qp.post_send(SendWR(2, WrOpcode.SEND, inline_data=b"hello"))
        with trio.fail_after(10):
            while len(client.cq) < 2 or len(server.cq) < 2:
                await trio.sleep(0.01)
        assert sorted((wc.wr_id, wc.status) for wc in server.cq.poll()) == [
            (1, WcStatus.SUCCESS),
            (8, WcStatus.SUCCESS),
        ]
        assert sorted((wc.wr_id, wc.byte_len) for wc in client.cq.poll()) == [(2, 5), (7, 11)]


async def test_mpa_25_an_initiator_closing_before_its_first_fpdu_flushes_the_responder_send() -> (
    None
):
    """The initiator closes without ever sending an FPDU: the responder's Send could never
    go out (MPA-25), so it completes WR_FLUSH_ERR, not SUCCESS."""
    async with tcp_pair() as (client, server):
        server.qp.post_send(SendWR(1, WrOpcode.SEND, inline_data=b"never sent"))
        assert client.conn is not None and server.conn is not None
        with trio.fail_after(10):
            await client.conn.disconnect()
            await server.conn.wait_closed()
        assert [(wc.wr_id, wc.status) for wc in server.cq.poll()] == [(1, WcStatus.WR_FLUSH_ERR)]
