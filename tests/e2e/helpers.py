"""Connected QP pairs over real loopback TCP sockets, driven by trio."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

import trio

from stack.rnic import Access, CompletionQueue, QueuePair, Rnic, Sge, reg_mr_wr
from stack.rnic.memory import MemoryRegion, ProtectionDomain
from stack.transport.cm import ConnectionManager, TapFactory
from stack.transport.driver import RdmaConnection
from stack.wire.events import MpaSettings


@dataclass
class Host:
    rnic: Rnic
    pd: ProtectionDomain
    cq: CompletionQueue
    qp: QueuePair
    conn: RdmaConnection | None = None

    def mr(self, size_or_data: int | bytes, access: Access = Access.LOCAL_WRITE) -> MemoryRegion:
        return self.pd.reg_mr(bytearray(size_or_data), access)

    def fast_mr(self, size_or_data: int | bytes, access: Access) -> MemoryRegion:
        """A fast-registered (remotely invalidatable) MR: ``alloc_mr``, then ``REG_MR``, which
        runs when the QP enters RTS if it has not yet, before any inbound message."""
        buf = bytearray(size_or_data)
        mr = self.pd.alloc_mr(len(buf))
        self.qp.post_send(reg_mr_wr(mr, buf, access))
        return mr

    def sge(self, mr: MemoryRegion, offset: int = 0, length: int | None = None) -> Sge:
        return Sge(mr.base + offset, mr.length - offset if length is None else length, mr.lkey)


def make_host(name: str, **qp_kw: object) -> Host:
    rnic = Rnic(name)
    pd = rnic.alloc_pd()
    cq = rnic.create_cq()
    return Host(rnic, pd, cq, rnic.create_qp(pd, cq, **qp_kw))  # type: ignore[arg-type]


@asynccontextmanager
async def tcp_pair(
    client_settings: MpaSettings | None = None,
    server_settings: MpaSettings | None = None,
    *,
    private_data: bytes = b"",
    accept_data: bytes = b"",
    tap_factory: TapFactory | None = None,
    client_qp: dict | None = None,
    server_qp: dict | None = None,
) -> AsyncIterator[tuple[Host, Host]]:
    """(client, server): the client is the MPA initiator; both QPs are connected."""
    client = make_host("client", **(client_qp or {}))
    server = make_host("server", **(server_qp or {}))
    async with (
        ConnectionManager.open(server.rnic) as scm,
        ConnectionManager.open(client.rnic, tap_factory=tap_factory) as ccm,
    ):
        listener = await scm.listen("127.0.0.1", 0, settings=server_settings)
        async with trio.open_nursery() as nursery:

            async def serve() -> None:
                request = await listener.get_request()
                server.conn = await request.accept(server.qp, accept_data)

            nursery.start_soon(serve)
            client.conn = await ccm.connect(
                "127.0.0.1",
                listener.port,
                client.qp,
                private_data=private_data,
                settings=client_settings,
            )
        yield client, server
        await client.conn.disconnect()
        assert server.conn is not None
        await server.conn.wait_closed()
