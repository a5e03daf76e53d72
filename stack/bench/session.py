"""The resources of one benchmark QP on the server, as its :class:`SessionSpec` asks.

Both of the server's drivers make their sessions here: the trio one
(:class:`~stack.bench.server.BenchServer`) and the blocking one
(:mod:`stack.bench.blocking_iwarp`), from the MPA Request's private data
(:meth:`Session.for_request`: a BenchError is the Reject's reason).  Regions are anonymous
mappings (:func:`~stack.bench.memory.zeroed`): one that only receives costs no time on the
event loop and no resident memory until the peer places data (``bytearray(n)`` zeroes every
page at once, holding the GIL, so not even a worker thread would keep the loop running);
one the session sends from is populated at once, in the kernel.

A client that never reads what the server sends (the answers of a ping-pong, Read
Responses) meets one policy on every port of the server, both iWARP drivers' and both raw
baselines': its session alone is ended, with the reason logged, once either bound is passed.

* Time: none of the server's bytes acknowledged for :data:`STALL_TIMEOUT` seconds while some
  wait (the client's TCP window closed, or the client gone): the kernel ends the connection
  (``TCP_USER_TIMEOUT``, :func:`limit_stall`) and the session sees ``ETIMEDOUT``
  (:func:`stalled`).  A client that takes its answers slowly, or that is idle with nothing
  of the server's waiting, is not ended.
* Space: the answers an iWARP session has queued unsent are at most its send queue
  (:data:`SEND_QUEUE_DEPTH` Sends or Writes) and its IRD (Read Responses), which view its
  registered memory; one answer more ends the session (past the send queue at once, a Read
  past the IRD by the QP's Terminate, or the stall timeout).  Of them, the transport copies
  at most one send pass it could not hand to the kernel, and the session's QP copies no
  queued Read Response for a later Write (``max_snapshot_bytes`` 0: its reader waits for
  them to leave instead) but the rest of the one already going out in parts, at most one
  message (both in :func:`unsent_bound`, counted in the server's :class:`MemoryBudget`), so
  a never-reading session holds its regions, those copies and its socket's kernel buffers.
"""

from __future__ import annotations

import errno
import logging
import os
import socket
import threading
from dataclasses import dataclass
from typing import Protocol

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
from stack.rnic.endpoint import MAX_COALESCE
from stack.rnic.memory import MemoryRegion, ProtectionDomain

__all__ = [
    "STALL_TIMEOUT",
    "MemoryBudget",
    "Session",
    "limit_stall",
    "log_session_end",
    "log_stall",
    "server_memory_limit",
    "stalled",
    "unsent_bound",
]

STALL_TIMEOUT = 10.0
"""Seconds a client may leave every byte the server sends it unacknowledged (it reads none
of them) before its session is ended (:func:`limit_stall`)."""
log = logging.getLogger(__name__)

SEND_QUEUE_DEPTH = 1024
"""Answers (Sends, Writes) one session may have queued unsent; one more ends it."""
LARGEST_SESSION = 2 * MAX_SESSION_BYTES + MAX_COALESCE
"""What one session may hold at most: its regions and, of a Read of all of them, the copy
of the Response the transport could not hand to the kernel (:func:`unsent_bound`)."""


class _Settable(Protocol):
    def setsockopt(self, level: int, option: int, value: int, /) -> None: ...


def limit_stall(sock: _Settable, seconds: float = STALL_TIMEOUT) -> None:
    """End ``sock``'s connection (ETIMEDOUT) once bytes it sent stay unacknowledged, or
    unsent behind a closed window, for ``seconds`` (``TCP_USER_TIMEOUT``); a no-op where
    the platform has no such option (there a never-reading client's session waits for it)."""
    option = getattr(socket, "TCP_USER_TIMEOUT", None)
    if option is None:  # pragma: no cover - not Linux
        return
    try:
        sock.setsockopt(socket.IPPROTO_TCP, option, max(1, round(seconds * 1000)))
    except OSError:  # pragma: no cover - the socket is gone already
        pass


def stalled(error: BaseException | None) -> bool:
    """Whether a session's connection ended with ``error`` because its client took none of
    the server's output for the stall timeout (ETIMEDOUT, :func:`limit_stall`), directly or
    as the cause of the error seen."""
    seen = 0
    while error is not None and seen < 8:
        if isinstance(error, OSError) and error.errno == errno.ETIMEDOUT:
            return True
        error = error.__cause__ or error.__context__
        seen += 1
    return False


def log_stall(port: str, timeout: float) -> None:
    """Log the end of a session on ``port`` whose client took none of its output."""
    log.warning("%s session ended: the client took none of its output for %s s", port, timeout)


def log_session_end(
    port: str, spec: SessionSpec, error: BaseException | None, timeout: float
) -> None:
    """Log why an iWARP session ended when the server ended it: its client took none of
    its output for ``timeout`` s, or left more answers unsent than its send queue holds."""
    if stalled(error):
        log_stall(f"{port} {spec.test}", timeout)
    elif isinstance(error, LocalError):
        log.warning(
            "%s %s session ended: its answers pass its send queue: %s", port, spec.test, error
        )


def unsent_bound(spec: SessionSpec, ird: int) -> int:
    """Bytes the transport may hold copied for a session of ``spec`` whose client does not
    read: one send pass it could not hand to the kernel (MAX_COALESCE bytes of messages),
    and one message more (the last of that pass, or the rest of a Read Response going out
    in parts that a Write made the QP copy), at most every answer the session can have
    queued (``ird`` Read Responses, or :data:`SEND_QUEUE_DEPTH` Sends or Writes of
    ``size``); 0 for a session that sends no answers."""
    if spec.test == "read":
        depth = ird
    elif "source" in spec.regions:  # the latency answers of Writes and Sends
        depth = SEND_QUEUE_DEPTH
    else:
        return 0
    return min(depth * spec.size, MAX_COALESCE + spec.size)


SERVER_MEMORY_SHARE = 2
"""A bench server's sessions hold at most 1/this of the machine's physical memory together
(:class:`MemoryBudget`): one session is capped (MAX_SESSION_BYTES), but a client that opens
many would have the kernel end the server (a Read session's target is real memory at once,
every other region once data lands)."""


def server_memory_limit() -> int:
    """Bytes all sessions of one server may hold: half the machine's memory, and at least
    one largest session (:data:`LARGEST_SESSION`)."""
    try:
        physical = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError):  # pragma: no cover - no sysconf: one session at a time
        physical = 0
    return max(physical // SERVER_MEMORY_SHARE, LARGEST_SESSION)


class MemoryBudget:
    """The memory a server's sessions hold, both drivers' ports together: their registered
    regions and what the transport may copy of their unsent answers (:func:`unsent_bound`).
    The blocking port's sessions run in threads: taken and given back under a lock."""

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
        held = spec.memory + unsent_bound(spec, rnic.max_ird)
        budget.take(held)
        try:
            session = cls.open(rnic, pd, spec, ports)
        except (OSError, LocalError) as exc:
            budget.give_back(held)
            raise BenchError(f"cannot open the session ({spec.memory} bytes): {exc}") from None
        except BaseException:
            budget.give_back(held)
            raise
        session.budget, session.held = budget, held
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
            cap=QpCap(max_send_wr=SEND_QUEUE_DEPTH, max_recv_wr=depth),
            ird=rnic.max_ird,
            ord=rnic.max_ord,
        )
        qp.max_snapshot_bytes = 0  # a Write waits for queued Read Responses, copies none,
        qp.max_stalled_snapshot_bytes = 0  # however long it waits (the stall timeout ends it)
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
