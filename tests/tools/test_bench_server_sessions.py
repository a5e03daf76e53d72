"""A bench server session that fails ends alone: the server serves the next client (the
project rule on hostile peers), and a session request's pong region must fit its wire fields
(RFC 5040 §4: STag 32 bits, tagged offset 64)."""

from __future__ import annotations

import pytest
import trio

from stack.bench import BenchError, SessionSpec
from stack.bench.memory import REMOTE_ALL
from stack.bench.protocol import Advert
from stack.bench.server import BenchServer
from stack.bench.session import Session
from stack.errors import LocalError
from stack.rnic import Access, Rnic, SendFlags, SendWR, Sge, WrOpcode
from stack.transport.blocking_cm import connect
from stack.transport.cm import ConnectionManager, ConnectRejected


async def _write_ping_and_leave(port: int) -> None:
    """A Write-latency client that writes one ping and disconnects at once: the server's
    pong then meets a closing QP."""
    rnic = Rnic("client")
    pd = rnic.alloc_pd()
    qp = rnic.create_qp(pd, rnic.create_cq())
    pong = pd.reg_mr(bytearray(64), REMOTE_ALL)
    ping = pd.reg_mr(bytearray(64), Access.LOCAL_WRITE)
    ping.buf[63] = 1  # the first ping's value
    spec = SessionSpec("write", 64, True, 0, (pong.rkey, pong.base, 64))
    async with ConnectionManager.open(rnic) as cm:
        conn = await cm.connect("127.0.0.1", port, qp, private_data=spec.encode())
        assert conn.negotiated is not None
        advert = Advert.decode(conn.negotiated.peer_private_data)
        sge = (Sge(ping.base, 64, ping.lkey),)
        qp.post_send(
            SendWR(0, WrOpcode.RDMA_WRITE, sge, SendFlags.NONE, rkey=advert.rkey,
                   remote_addr=advert.addr)
        )  # fmt: skip
        await conn.disconnect(timeout=2.0)


async def _read_session(port: int) -> int:
    """A Read session's advertised length (the server still serves)."""
    rnic = Rnic("client")
    qp = rnic.create_qp(rnic.alloc_pd(), rnic.create_cq())
    async with ConnectionManager.open(rnic) as cm:
        conn = await cm.connect(
            "127.0.0.1", port, qp, private_data=SessionSpec("read", 4096).encode()
        )
        assert conn.negotiated is not None
        length = Advert.decode(conn.negotiated.peer_private_data).length
        await conn.disconnect(timeout=2.0)
    return length


async def test_a_client_that_leaves_right_after_a_ping_does_not_end_the_server() -> None:
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            server = BenchServer(host="127.0.0.1", port=0)
            port, _raw = await nursery.start(server.run)
            for _ in range(5):
                await _write_ping_and_leave(port)
            await trio.sleep(0.2)  # the sessions' pongs
            assert await _read_session(port) == 4096
            nursery.cancel_scope.cancel()


async def test_a_session_whose_pong_cannot_be_posted_ends_alone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``post_send`` refuses a WR (LocalError: a full send queue, a closing QP): that session
    ends, its connection is torn down, and the server serves the next client."""

    def refused(self: Session, value: int, size: int) -> None:
        raise LocalError("send queue full (1024 WRs)")

    monkeypatch.setattr(Session, "send_pong", refused)
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            server = BenchServer(host="127.0.0.1", port=0)
            port, _raw = await nursery.start(server.run)
            await _write_ping_and_leave(port)
            with trio.fail_after(5):
                while server.active:  # the session ended
                    await trio.sleep(0.02)
            assert await _read_session(port) == 4096
            nursery.cancel_scope.cancel()


@pytest.mark.parametrize(
    "pong",
    [[1 << 32, 0, 64], [-1, 0, 64], [1, 1 << 64, 64], [1, 0, -1], [1, 0, 1 << 40], [1, 0]],
    ids=["rkey-33-bits", "rkey-negative", "to-65-bits", "length-negative", "length-huge", "short"],
)
def test_a_pong_region_that_fits_no_wire_field_is_refused(pong: list[int]) -> None:
    data = b'{"t": "write", "s": 64, "l": 1, "pong": %s}' % str(pong).encode()
    with pytest.raises(BenchError, match="bad session request"):
        SessionSpec.decode(data)


async def test_the_servers_sessions_share_one_memory_budget_on_both_ports() -> None:
    """One session is capped (MAX_SESSION_BYTES); many together stay within the server's
    budget, the trio and the blocking port alike: past it a Request gets a Reject with the
    reason, and what a closed session held can be taken again."""
    spec = SessionSpec("write", 4096)
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            server = BenchServer(host="127.0.0.1", port=0)
            server.budget.limit = spec.memory  # room for one session
            port, _raw = await nursery.start(server.run)
            rnic = Rnic("client")
            pd = rnic.alloc_pd()
            async with ConnectionManager.open(rnic) as cm:
                first = await cm.connect(
                    "127.0.0.1", port, rnic.create_qp(pd, rnic.create_cq()),
                    private_data=spec.encode(),
                )  # fmt: skip
                with pytest.raises(ConnectRejected) as info:
                    await cm.connect("127.0.0.1", port, rnic.create_qp(pd, rnic.create_cq()),
                                     private_data=spec.encode())  # fmt: skip
                assert b"would pass its limit" in info.value.private_data
                other = Rnic("blocking")
                qp = other.create_qp(other.alloc_pd(), other.create_cq())
                with pytest.raises(ConnectRejected) as info:
                    await trio.to_thread.run_sync(
                        lambda: connect("127.0.0.1", server.iwarp_blocking_port, qp,
                                        private_data=spec.encode(), timeout=5.0)
                    )  # fmt: skip
                assert b"would pass its limit" in info.value.private_data
                await first.disconnect(timeout=5.0)
                while server.budget.used:  # the session closed: its memory is back
                    await trio.sleep(0.02)
                again = await cm.connect(
                    "127.0.0.1", port, rnic.create_qp(pd, rnic.create_cq()),
                    private_data=spec.encode(),
                )  # fmt: skip
                await again.disconnect(timeout=5.0)
            nursery.cancel_scope.cancel()
