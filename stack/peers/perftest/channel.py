"""perftest's exchange connection (:class:`Comm`): alternating Sends of at most 56 bytes.

perftest keeps one receive posted, so neither side may Send twice in a row (iWARP has no
receiver-not-ready retry).  A side waiting for the peer watches the bytes arriving on every
connection (:class:`ByteMeter`): a peer busy with Writes or Reads is not a silent peer.
"""

from __future__ import annotations

from collections.abc import Callable

import trio

from stack.peers.perftest.protocol import PerftestError
from stack.rnic import Access, QpCap, RecvWR, Rnic, SendWR, Sge, WcStatus, WrOpcode
from stack.rnic.memory import ProtectionDomain
from stack.transport.driver import RdmaConnection
from stack.transport.pumping import Tap, close_tap

WATCH_SECONDS = 0.5
"""How often a side waiting for an exchange message looks at its data connections."""
COMM_SLOTS = 4
COMM_SLOT_LEN = 64
"""Receives of the exchange connection (perftest's messages are at most 56 bytes)."""


def check_wc(status: WcStatus, what: str) -> None:
    """Raise PerftestError unless a work completion succeeded (a flush: the peer closed)."""
    if status is WcStatus.WR_FLUSH_ERR:
        raise PerftestError(f"{what}: the connection closed")
    if status is not WcStatus.SUCCESS:
        raise PerftestError(f"{what} completed with status '{status.text}'")


class ByteMeter:
    """A capture tap that only counts the bytes received on every connection: the progress
    a passive side sees while its peer Writes or Reads (no completions there)."""

    def __init__(self) -> None:
        self.received = 0

    def __call__(self, stream: trio.SocketStream, initiator: bool) -> ByteMeter:
        return self  # one meter for all connections (the manager's tap factory)

    def record(self, outbound: bool, data: bytes | bytearray | memoryview) -> None:
        if not outbound:
            self.received += len(data)


class TeeTap:
    """A tap factory that gives each connection to the byte meter and to a capture tap."""

    def __init__(self, meter: ByteMeter, capture: Callable[[trio.SocketStream, bool], Tap]) -> None:
        self.meter = meter
        self.capture = capture

    def __call__(self, stream: trio.SocketStream, initiator: bool) -> _Both:
        return _Both(self.meter, self.capture(stream, initiator))


class _Both:
    def __init__(self, meter: ByteMeter, tap: Tap) -> None:
        self.meter = meter
        self.tap = tap

    def record(self, outbound: bool, data: bytes | bytearray | memoryview) -> None:
        self.meter.record(outbound, data)
        self.tap.record(outbound, data)

    def close(self) -> None:
        close_tap(self.tap)


class Comm:
    """perftest's exchange connection: alternating Sends of at most 56 bytes.

    The active side (client) Sends then receives; the passive side receives then Sends.
    Waiting for the peer fails after ``timeout`` seconds without any byte arriving on any
    connection (``meter``), or at once when ``broken()`` names a broken data connection.
    """

    def __init__(
        self,
        rnic: Rnic,
        pd: ProtectionDomain,
        active: bool,
        timeout: float,
        meter: ByteMeter,
        broken: Callable[[], str],
    ) -> None:
        self.active = active
        self.timeout = timeout
        self.meter = meter
        self.broken = broken
        self.send_cq = rnic.create_cq(16)
        self.recv_cq = rnic.create_cq(16)
        cap = QpCap(max_send_wr=8, max_recv_wr=COMM_SLOTS)
        self.qp = rnic.create_qp(pd, self.send_cq, self.recv_cq, cap=cap, ird=0, ord=0)
        self.mr = pd.reg_mr(bytearray(COMM_SLOTS * COMM_SLOT_LEN), Access.LOCAL_WRITE)
        self.conn: RdmaConnection | None = None
        self.sent = 0
        self.transcript: list[tuple[bool, bytes]] = []
        """Every message in order: (sent by us, bytes)."""
        for slot in range(COMM_SLOTS):
            self._post(slot)

    def _post(self, slot: int) -> None:
        sge = Sge(self.mr.base + slot * COMM_SLOT_LEN, COMM_SLOT_LEN, self.mr.lkey)
        self.qp.post_recv(RecvWR(slot, (sge,)))

    async def xchg(self, data: bytes, what: str) -> bytes:
        """Give ``data``, get the peer's message of the same exchange."""
        if self.active:
            await self._send(data, what)
            return await self._receive(what)
        got = await self._receive(what)
        await self._send(data, what)
        return got

    async def _send(self, data: bytes, what: str) -> None:
        self.sent += 1
        self.transcript.append((True, data))
        self.qp.post_send(SendWR(self.sent, WrOpcode.SEND, (), inline_data=data))
        with trio.move_on_after(self.timeout) as scope:
            wc = await self.send_cq.next()
        if scope.cancelled_caught:
            raise PerftestError(f"our {what} Send did not complete within {self.timeout} s")
        check_wc(wc.status, f"{what} Send")

    async def _receive(self, what: str) -> bytes:
        seen, deadline = self.meter.received, trio.current_time() + self.timeout
        while True:
            with trio.move_on_after(min(WATCH_SECONDS, self.timeout)):
                wc = await self.recv_cq.next()
                break
            broken = self.broken()
            if broken:
                raise PerftestError(f"waiting for the {what}: {broken}")
            if self.meter.received != seen:  # the peer is still busy on a data connection
                seen, deadline = self.meter.received, trio.current_time() + self.timeout
            elif trio.current_time() >= deadline:
                raise PerftestError(f"no {what} from the peer within {self.timeout} s")
        check_wc(wc.status, f"receive of the {what}")
        start = wc.wr_id * COMM_SLOT_LEN
        data = bytes(self.mr.buf[start : start + wc.byte_len])
        self._post(wc.wr_id)
        self.transcript.append((False, data))
        return data
