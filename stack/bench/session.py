"""The resources of one benchmark QP on the server, as its :class:`SessionSpec` asks.

Both of the server's drivers make their sessions here: the trio one
(:class:`~stack.bench.server.BenchServer`) and the blocking one
(:mod:`stack.bench.blocking_iwarp`), from the MPA Request's private data
(:meth:`Session.for_request`: a BenchError is the Reject's reason).  Regions are anonymous
mappings (:func:`~stack.bench.memory.zeroed`): one that only receives costs no time on the
event loop and no resident memory until the peer places data (``bytearray(n)`` zeroes every
page at once, holding the GIL, so not even a worker thread would keep the loop running);
one the session sends from is populated at once, in the kernel.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass

from stack.bench.memory import REMOTE_ALL, dereg, zeroed
from stack.bench.options import DEFAULT_TX_DEPTH, BenchError
from stack.bench.protocol import MAX_SESSION_BYTES, Advert, SessionSpec
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

__all__ = ["MemoryBudget", "Session", "server_memory_limit"]


SERVER_MEMORY_SHARE = 2
"""A bench server's sessions hold at most 1/this of the machine's physical memory together
(:class:`MemoryBudget`): one session is capped (MAX_SESSION_BYTES), but a client that opens
many would have the kernel end the server (a Read session's target is real memory at once,
every other region once data lands)."""


def server_memory_limit() -> int:
    """Bytes all sessions of one server may register: half the machine's memory, and at
    least one largest session."""
    try:
        physical = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError):  # pragma: no cover - no sysconf: one session at a time
        physical = 0
    return max(physical // SERVER_MEMORY_SHARE, MAX_SESSION_BYTES)


class MemoryBudget:
    """The registered memory a server's sessions hold, both drivers' ports together (the
    blocking port's sessions run in threads: taken and given back under a lock)."""

    def __init__(self, limit: int | None = None) -> None:
        self.limit = server_memory_limit() if limit is None else limit
        self.used = 0
        self._lock = threading.Lock()

    def take(self, size: int) -> None:
        """Hold ``size`` more bytes; a BenchError (the Reject's reason) past the limit."""
        with self._lock:
            if self.used + size > self.limit:
                raise BenchError(
                    f"the server's sessions hold {self.used} bytes; {size} more would pass "
                    f"its limit of {self.limit}"
                )
            self.used += size

    def give_back(self, size: int) -> None:
        with self._lock:
            self.used -= size


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
    budget: MemoryBudget | None = None
    """The server's budget this session's memory is held in (given back at :meth:`close`)."""
    held: int = 0

    @classmethod
    def for_request(
        cls,
        rnic: Rnic,
        pd: ProtectionDomain,
        private_data: bytes,
        ports: tuple[int, int, int],
        budget: MemoryBudget,
    ) -> tuple[SessionSpec, Session]:
        """The spec an MPA Request's private data asks for and its open session; a
        BenchError when the Request is malformed, asks more than MAX_SESSION_BYTES or more
        than the server's ``budget`` has left, or cannot be mapped or made, which the
        server rejects with (MPA-23)."""
        spec = SessionSpec.decode(private_data)
        budget.take(spec.memory)
        try:
            session = cls.open(rnic, pd, spec, ports)
        except (OSError, LocalError) as exc:
            budget.give_back(spec.memory)
            raise BenchError(f"cannot open the session ({spec.memory} bytes): {exc}") from None
        except BaseException:
            budget.give_back(spec.memory)
            raise
        session.budget, session.held = budget, spec.memory
        return spec, session

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
        """Destroy the QP and deregister the regions (their memory goes back to the budget)."""
        self.rnic.destroy_qp(self.qp)
        for mr in self.regions:
            dereg(mr)
        if self.budget is not None:
            self.budget.give_back(self.held)
            self.budget = None
