"""The resources of one benchmark QP on the server, as its :class:`SessionSpec` asks.

Both of the server's drivers make their sessions here: the trio one
(:class:`~stack.bench.server.BenchServer`) and the blocking one
(:mod:`stack.bench.blocking_iwarp`), from the MPA Request's private data
(:meth:`Session.for_request`: a BenchError is the Reject's reason).  Regions are anonymous
mappings (:func:`zeroed`): opening a session of a gigabyte costs no time on the event loop
and no resident memory until the peer places data (``bytearray(n)`` zeroes every page at
once, holding the GIL, so not even a worker thread would keep the loop running).
"""

from __future__ import annotations

from dataclasses import dataclass

from stack.bench.memory import REMOTE_ALL, dereg, zeroed
from stack.bench.options import DEFAULT_TX_DEPTH, BenchError
from stack.bench.protocol import Advert, SessionSpec
from stack.constants import ATOMIC_ALIGNMENT
from stack.errors import LocalError
from stack.rnic import (
    Access,
    CompletionQueue,
    QpCap,
    QueuePair,
    RecvWR,
    Rnic,
    SendFlags,
    SendWR,
    Sge,
    WcOpcode,
    WcStatus,
    WorkCompletion,
    WrOpcode,
)
from stack.rnic.memory import MemoryRegion, ProtectionDomain

__all__ = ["Session"]


@dataclass
class Session:
    """One QP's resources as its :class:`SessionSpec` asks: the QP and its CQ, a target
    region (advertised), a source region for latency pongs, an inbox with receives posted
    for Sends."""

    rnic: Rnic
    qp: QueuePair
    cq: CompletionQueue
    advert: Advert
    regions: list[MemoryRegion]
    target: MemoryRegion | None = None
    source: MemoryRegion | None = None
    inbox: MemoryRegion | None = None
    pad: int = 0
    pongs: bool = False
    """Write latency: the server answers each ping with a Write of its own."""
    recv: RecvWR | None = None
    """The receive kept posted for Sends (one per Send that completes)."""
    echo: SendWR | None = None
    """Send latency: the Send answering each Send."""
    pong: SendWR | None = None
    """Write latency: the Write answering each ping (its last byte is the ping's)."""

    @classmethod
    def for_request(
        cls, rnic: Rnic, pd: ProtectionDomain, private_data: bytes, ports: tuple[int, int, int]
    ) -> tuple[SessionSpec, Session]:
        """The spec an MPA Request's private data asks for and its open session; a
        BenchError when the Request is malformed, asks more than MAX_SESSION_BYTES or cannot
        be mapped or made, which the server rejects with (MPA-23)."""
        spec = SessionSpec.decode(private_data)
        try:
            return spec, cls.open(rnic, pd, spec, ports)
        except (OSError, LocalError) as exc:
            raise BenchError(f"cannot open the session ({spec.memory} bytes): {exc}") from None

    @classmethod
    def open(
        cls, rnic: Rnic, pd: ProtectionDomain, spec: SessionSpec, ports: tuple[int, int, int]
    ) -> Session:
        """The QP and the regions ``spec`` asks for (:attr:`SessionSpec.regions`, mapped
        by :func:`zeroed`); an OSError when the kernel refuses the mapping."""
        depth = max(spec.rx_depth, 1)
        cq = rnic.create_cq(depth + 2 * DEFAULT_TX_DEPTH)
        qp = rnic.create_qp(
            pd,
            cq,
            cap=QpCap(max_send_wr=1024, max_recv_wr=depth),
            ird=rnic.max_ird,
            ord=rnic.max_ord,
        )
        session = cls(rnic, qp, cq, Advert(0, 0, 0, *ports), [])
        try:
            session._register(pd, spec, ports)
        except BaseException:
            session.close()
            raise
        return session

    def _register(
        self, pd: ProtectionDomain, spec: SessionSpec, ports: tuple[int, int, int]
    ) -> None:
        """Map and register the regions of ``spec``; post its receives; make its answers."""
        if not spec.regions:
            return
        # Spare bytes: the advertised TO is 8-byte aligned for atomics (EXT-05).
        read = spec.test == "read"  # the target is what the client's Reads fetch
        target = self.target = self._region(pd, spec.size + ATOMIC_ALIGNMENT, REMOTE_ALL, sent=read)
        self.pad = pad = (-target.addr) % ATOMIC_ALIGNMENT
        self.advert = Advert(target.rkey, target.base + pad, spec.size, *ports)
        if "source" in spec.regions:
            self.source = self._region(pd, spec.size, Access.LOCAL_WRITE, sent=True)
        source = self.source
        if "inbox" in spec.regions:
            inbox = self.inbox = self._region(pd, spec.size, Access.LOCAL_WRITE)
            self.recv = RecvWR(0, (Sge(inbox.base, spec.size, inbox.lkey),))
            self.qp.post_recv([self.recv] * self.qp.cap.max_recv_wr)  # the QP's rx depth
            if source is not None:
                sge = (Sge(source.base, spec.size, source.lkey),)
                self.echo = SendWR(0, WrOpcode.SEND, sge, SendFlags.NONE)
        self.pongs = spec.test == "write" and spec.latency and spec.pong is not None
        if self.pongs and source is not None and spec.pong is not None:
            rkey, to, _length = spec.pong
            sge = (Sge(source.base, spec.size, source.lkey),)
            self.pong = SendWR(
                0, WrOpcode.RDMA_WRITE, sge, SendFlags.NONE, rkey=rkey, remote_addr=to
            )

    def _region(
        self, pd: ProtectionDomain, size: int, access: Access, *, sent: bool = False
    ) -> MemoryRegion:
        mr = pd.reg_mr(zeroed(size, sent=sent), access)
        self.regions.append(mr)
        return mr

    def answer(self, wcs: list[WorkCompletion]) -> bool:
        """Sends: repost a receive for each one that completed and, in latency mode, answer
        it with a Send.  False when a completion failed (the session is over)."""
        received = 0
        for wc in wcs:
            if wc.status is not WcStatus.SUCCESS:
                return False
            received += wc.opcode is WcOpcode.RECV
        if received and self.recv is not None:
            self.qp.post_recv([self.recv] * received)
            if self.echo is not None:
                self.qp.post_send([self.echo] * received)
        return True

    def pong_index(self, size: int) -> int:
        """Write latency: where in the target the ping's last byte lands."""
        return self.pad + size - 1

    def send_pong(self, value: int, size: int) -> None:
        """Write latency: answer the ping whose last byte was ``value``."""
        assert self.pong is not None and self.source is not None
        self.source.buf[size - 1] = value
        self.qp.post_send(self.pong)

    def close(self) -> None:
        """Destroy the QP and deregister the regions."""
        self.rnic.destroy_qp(self.qp)
        for mr in self.regions:
            dereg(mr)
