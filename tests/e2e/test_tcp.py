"""End-to-end over loopback TCP: every operation, under every MPA negotiation variant."""

from __future__ import annotations

import struct

import pytest
import trio

from stack.constants import RtrType
from stack.rnic import Access, QpState, RecvWR, SendWR, WcOpcode, WcStatus, WrOpcode
from stack.transport.cm import ConnectionManager, ConnectRejected
from stack.wire.events import CrcPolicy, MpaSettings
from tests.e2e.helpers import make_host, tcp_pair

RWA = Access.LOCAL_WRITE | Access.REMOTE_WRITE | Access.REMOTE_READ | Access.REMOTE_ATOMIC


async def exercise_all_operations(client, server) -> None:
    """Send, Write, Write-with-imm, Read, FetchAdd, CmpSwap, Send with Invalidate."""
    target = server.mr(8192, RWA)
    exposed = server.fast_mr(16, RWA)  # remotely invalidatable
    inbox = server.mr(4096)
    server.qp.post_recv([RecvWR(i, (server.sge(inbox),)) for i in range(4)])
    payload = bytes(range(256)) * 16
    src = client.mr(payload)
    sink = client.mr(4096)
    result = client.mr(8)
    client.qp.post_send(
        [
            SendWR(
                1,
                WrOpcode.RDMA_WRITE,
                (client.sge(src),),
                rkey=target.rkey,
                remote_addr=target.base,
            ),
            SendWR(2, WrOpcode.SEND, inline_data=b"written"),
            SendWR(
                3,
                WrOpcode.RDMA_READ,
                (client.sge(sink),),
                rkey=target.rkey,
                remote_addr=target.base,
            ),
            SendWR(
                4,
                WrOpcode.ATOMIC_FETCH_AND_ADD,
                (client.sge(result),),
                rkey=target.rkey,
                remote_addr=target.base + 4096,
                compare_add=5,
            ),
            SendWR(
                5,
                WrOpcode.RDMA_WRITE_WITH_IMM,
                inline_data=b"imm",
                rkey=target.rkey,
                remote_addr=target.base + 5000,
                imm_data=77,
            ),
            SendWR(6, WrOpcode.SEND_WITH_INV, inline_data=b"bye", invalidate_rkey=exposed.rkey),
        ]
    )
    wcs = await client.cq.wait_for(6)
    assert [(wc.wr_id, wc.status) for wc in wcs] == [(i, WcStatus.SUCCESS) for i in range(1, 7)]
    assert bytes(sink.buf) == payload
    assert struct.unpack("<Q", result.buf)[0] == 0
    rwcs = await server.cq.wait_for(3)
    assert [wc.opcode for wc in rwcs] == [WcOpcode.RECV, WcOpcode.RECV_RDMA_WITH_IMM, WcOpcode.RECV]
    assert rwcs[1].imm_data == (77).to_bytes(8, "big")
    assert rwcs[2].invalidated_rkey == exposed.rkey and not exposed.valid and target.valid
    assert bytes(target.buf[:4096]) == payload
    assert struct.unpack_from("<Q", target.buf, 4096)[0] == 5
    assert bytes(target.buf[5000:5003]) == b"imm"


VARIANTS = {
    "rev2-crc": (MpaSettings(), MpaSettings()),
    "rev1-crc": (MpaSettings(rev=1), MpaSettings(rev=1)),
    "rev2-nocrc": (MpaSettings(crc=CrcPolicy.OFF), MpaSettings(crc=CrcPolicy.OFF)),
    "crc-by-responder-only": (MpaSettings(crc=CrcPolicy.OFF), MpaSettings()),
    "markers-both": (MpaSettings(want_markers=True), MpaSettings(want_markers=True)),
    "markers-to-initiator": (MpaSettings(want_markers=True), MpaSettings()),
    "markers-to-responder": (MpaSettings(), MpaSettings(want_markers=True)),
    "p2p-send-rtr": (MpaSettings(p2p=True, rtr=RtrType.SEND), MpaSettings(p2p=True)),
    "p2p-write-rtr": (MpaSettings(p2p=True, rtr=RtrType.WRITE), MpaSettings(p2p=True)),
    "p2p-read-rtr": (MpaSettings(p2p=True, rtr=RtrType.READ), MpaSettings(p2p=True)),
}


@pytest.mark.parametrize("variant", list(VARIANTS))
async def test_all_operations_over_tcp(variant: str) -> None:
    cs, ss = VARIANTS[variant]
    with trio.fail_after(20):
        async with tcp_pair(cs, ss, private_data=b"hello", accept_data=b"welcome") as (
            client,
            server,
        ):
            assert client.conn is not None
            neg = client.conn.negotiated
            assert neg is not None and neg.peer_private_data == b"welcome"
            await exercise_all_operations(client, server)


async def test_mpa_23_reject_with_private_data_over_tcp() -> None:
    client = make_host("client")
    async with ConnectionManager.open() as scm, ConnectionManager.open(client.rnic) as ccm:
        listener = await scm.listen("127.0.0.1", 0)

        async def refuse() -> None:
            request = await listener.get_request()
            assert request.private_data == b"let me in"
            await request.reject(b"go away")

        scm.nursery.start_soon(refuse)
        with pytest.raises(ConnectRejected) as info:
            await ccm.connect("127.0.0.1", listener.port, client.qp, private_data=b"let me in")
        assert info.value.private_data == b"go away"


async def test_protection_error_over_tcp_terminates_both_and_flushes() -> None:
    async with tcp_pair() as (client, server):
        target = server.mr(16, Access.LOCAL_WRITE | Access.REMOTE_READ)  # no REMOTE_WRITE
        client.qp.post_send(
            [
                SendWR(
                    1,
                    WrOpcode.RDMA_WRITE,
                    inline_data=b"x" * 8,
                    rkey=target.rkey,
                    remote_addr=target.base,
                ),
                SendWR(2, WrOpcode.SEND, inline_data=b"after"),
            ]
        )
        assert client.conn is not None and server.conn is not None
        with trio.fail_after(10):
            await client.conn.wait_closed()
            await server.conn.wait_closed()
        assert bytes(target.buf) == bytes(16)
        assert client.qp.state is QpState.ERROR and server.qp.state is QpState.ERROR
        term = client.qp.peer_terminate
        assert term is not None and term.cause == (1, 1, 0x00)
        assert term.ddp_header[:2] == b"\xc1\x40"


class CountingTap:
    def __init__(self) -> None:
        self.writes: list[int] = []

    def record(self, outbound: bool, data: bytes | bytearray | memoryview) -> None:
        if outbound:
            self.writes.append(len(data))


async def test_small_fpdus_are_coalesced_into_few_socket_writes() -> None:
    taps: list[CountingTap] = []

    def factory(stream, is_active):  # noqa: ANN001, ANN202
        taps.append(CountingTap())
        return taps[-1]

    async with tcp_pair(tap_factory=factory) as (client, server):
        target = server.mr(64 * 100, Access.LOCAL_WRITE | Access.REMOTE_WRITE)
        before = len(taps[0].writes)
        client.qp.post_send(
            [
                SendWR(
                    i,
                    WrOpcode.RDMA_WRITE,
                    inline_data=bytes([i]) * 64,
                    rkey=target.rkey,
                    remote_addr=target.base + 64 * i,
                )
                for i in range(100)
            ]
        )
        await client.cq.wait_for(100)
        writes = taps[0].writes[before:]
        # A Read cannot pass earlier Writes: once it completes, they are all placed.
        sink = client.mr(1)
        client.qp.post_send(
            SendWR(999, WrOpcode.RDMA_READ, (client.sge(sink, 0, 0),), rkey=0, remote_addr=0)
        )
        await client.cq.next()
        assert sum(writes) >= 100 * (64 + 20)  # all 100 FPDUs went out
        assert len(writes) <= 3, writes  # ... in very few socket writes
        assert bytes(target.buf) == b"".join(bytes([i]) * 64 for i in range(100))


async def test_disconnect_flushes_outstanding_receives_on_both_sides() -> None:
    async with tcp_pair() as (client, server):
        client.qp.post_recv(RecvWR(1, ()))
        server.qp.post_recv([RecvWR(2, ()), RecvWR(3, ())])
    # Leaving tcp_pair disconnected the client and waited for the server to close.
    assert client.qp.state is QpState.ERROR and server.qp.state is QpState.ERROR
    assert [(wc.wr_id, wc.status) for wc in client.cq.poll()] == [(1, WcStatus.WR_FLUSH_ERR)]
    assert [wc.wr_id for wc in server.cq.poll()] == [2, 3]
    client.qp.post_send(SendWR(9, WrOpcode.SEND, inline_data=b"too late"))
    assert client.cq.poll()[0].status is WcStatus.WR_FLUSH_ERR


async def test_first_fpdu_delay_holds_the_rtr_after_the_reply() -> None:
    """siw-vm.md pitfall 3: the initiator can hold its first FPDU after the MPA Reply."""
    events: list[tuple[float, bool]] = []

    class TimedTap:
        def record(self, outbound: bool, data: bytes | bytearray | memoryview) -> None:
            events.append((trio.current_time(), outbound))

    client = make_host("client")
    server = make_host("server")
    settings = MpaSettings(p2p=True, rtr=RtrType.WRITE)
    async with (
        ConnectionManager.open(server.rnic) as scm,
        ConnectionManager.open(client.rnic, tap_factory=lambda stream, active: TimedTap()) as ccm,
    ):
        listener = await scm.listen("127.0.0.1", 0, settings=MpaSettings(p2p=True))

        async def serve() -> None:
            request = await listener.get_request()
            server.conn = await request.accept(server.qp)

        scm.nursery.start_soon(serve)
        conn = await ccm.connect(
            "127.0.0.1", listener.port, client.qp, settings=settings, first_fpdu_delay=0.2
        )
        (reply_at,) = [t for t, out in events if not out]
        rtr_at = [t for t, out in events if out][1]  # [0] is the Request
        assert rtr_at - reply_at >= 0.19
        await conn.disconnect()
