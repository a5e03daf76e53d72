"""Hosts of the synchronous verbs API, and connected pairs of them over loopback TCP."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass

from stack.rnic import Access, Sge
from stack.transport import CmEventType
from stack.verbs_sync import CQ, MR, PD, QP, CMEvent, CMEventChannel, CMId, Context
from stack.wire.events import MpaSettings

TIMEOUT = 20.0
"""Seconds any blocking call of these tests waits at most (a failure, never a hang)."""


@dataclass
class SyncHost:
    """One side: its context, PD, CQ, QP, CM channel and the id of its connection."""

    ctx: Context
    pd: PD
    cq: CQ
    qp: QP
    channel: CMEventChannel
    cmid: CMId | None = None

    def mr(self, size_or_data: int | bytes, access: Access = Access.LOCAL_WRITE) -> MR:
        return MR(self.pd, bytearray(size_or_data), access)

    def sge(self, mr: MR, offset: int = 0, length: int | None = None) -> Sge:
        return mr.sge(offset, length)

    def event(self, timeout: float = TIMEOUT) -> CMEvent:
        return self.channel.get_cm_event(timeout)

    def expect(self, kind: CmEventType) -> CMEvent:
        event = self.event()
        assert event.type is kind, (event, event.reason)
        return event

    def wait_disconnected(self) -> None:
        """Take events until this host's connection reports DISCONNECTED."""
        while True:
            event = self.event()
            if event.type is CmEventType.DISCONNECTED and event.id is self.cmid:
                return

    def listen(self, settings: MpaSettings | None = None) -> int:
        listen_id = CMId(self.channel)
        return listen_id.listen("127.0.0.1", 0, settings=settings)

    def accept_one(self, private_data: bytes = b"") -> CMEvent:
        """Accept the next CONNECT_REQUEST; returns it once ESTABLISHED."""
        request = self.expect(CmEventType.CONNECT_REQUEST)
        self.cmid = request.id
        request.id.accept(self.qp, private_data, timeout=TIMEOUT)
        self.expect(CmEventType.ESTABLISHED)
        return request

    def connect(self, port: int, private_data: bytes = b"") -> CMEvent:
        """Connect to ``port``; returns the ESTABLISHED event."""
        self.cmid = CMId(self.channel)
        self.cmid.connect("127.0.0.1", port, self.qp, private_data)
        return self.expect(CmEventType.ESTABLISHED)


def make_sync_host(ctx: Context) -> SyncHost:
    pd = PD(ctx)
    cq = CQ(ctx)
    return SyncHost(ctx, pd, cq, QP(pd, cq), CMEventChannel(ctx))


@contextmanager
def sync_pair(
    client_settings: MpaSettings | None = None, server_settings: MpaSettings | None = None
) -> Iterator[tuple[SyncHost, SyncHost]]:
    """(client, server) of the sync API, connected; both contexts closed on the way out."""
    with ExitStack() as stack:
        server = make_sync_host(stack.enter_context(Context("server")))
        client = make_sync_host(stack.enter_context(Context("client")))
        port = server.listen(server_settings)
        client.cmid = CMId(client.channel)
        client.cmid.connect("127.0.0.1", port, client.qp, b"hello", settings=client_settings)
        request = server.accept_one(b"welcome")
        assert request.private_data == b"hello"
        assert client.expect(CmEventType.ESTABLISHED).private_data == b"welcome"
        yield client, server
