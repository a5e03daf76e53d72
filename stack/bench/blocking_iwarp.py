"""iWARP on the blocking driver in the benchmarks (``--blocking``): both ends without trio.

The server half, :class:`BlockingIwarpServer`, listens on a port of its own (advertised
beside the baselines' in every :class:`~stack.bench.protocol.Advert`) and serves each
connection in a thread of its own, from its MPA startup on, with its own RNIC
(:meth:`~stack.transport.blocking_cm.BlockingListener.serve`, within the trio listener's
startup bounds, so silent connections delay no one;
:class:`~stack.transport.blocking.BlockingConnection`): the same
:class:`~stack.bench.session.Session` as the trio server makes, the same Rejects with a
reason (MPA-23), the same answers (Write pongs, Send echoes, receives kept posted) and
the same end for a client that leaves them unread (:mod:`stack.bench.session`).
The client half, :func:`blocking_latency_run`, runs the one-at-a-time exchange of
``--lat`` in a worker thread: post, then read the socket until the completion (or the
pong) is there.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from stack.bench.memory import LIVE
from stack.bench.options import ATOMIC_SIZE, WARMUP_ITERS, BenchError, BenchOptions
from stack.bench.protocol import Advert, SessionSpec, connect_error, reject_data
from stack.bench.results import LatResult, latency_stats
from stack.bench.session import STALL_TIMEOUT, MemoryBudget, Session, limit_stall, log_session_end
from stack.errors import IwarpError
from stack.rnic import Access, RecvWR, Rnic, SendFlags, SendWR, Sge, WcStatus, WrOpcode
from stack.rnic.memory import MemoryRegion
from stack.transport.blocking import BlockingConnection
from stack.transport.blocking_cm import BlockingListener, BlockingRequest, connect
from stack.wire.events import MpaSettings

__all__ = ["BlockingIwarpServer", "blocking_latency_run"]

CLOSE_TIMEOUT = 5.0
"""Seconds a blocking session's orderly close may take."""


class BlockingIwarpServer:
    """Accepts benchmark QPs on the blocking driver: a listener thread, a thread per QP
    from its MPA startup on."""

    def __init__(
        self,
        host: str,
        settings: MpaSettings,
        ports: Callable[[], tuple[int, int, int]],
        budget: MemoryBudget | None = None,
        stall_timeout: float = STALL_TIMEOUT,
    ) -> None:
        self._listener = BlockingListener(host, 0, settings=settings, backlog=64)
        self.port = self._listener.port
        self._ports = ports
        self.stall_timeout = stall_timeout
        self.budget = budget or MemoryBudget()
        """The memory its sessions hold, shared with the trio server that made it."""
        thread = threading.Thread(
            target=self._listener.serve, args=(self._session,), name="bench-iwarp-blocking"
        )
        thread.daemon = True
        thread.start()

    def close(self) -> None:
        """Stop accepting (sessions in progress end with their client)."""
        self._listener.close()

    def _session(self, request: BlockingRequest) -> None:
        """One QP, in its startup's thread: a Request that is malformed, too large or
        cannot be mapped is rejected with the reason (MPA-23), as on the trio server."""
        rnic = Rnic("bench-server-blocking")  # one per thread: an RNIC is not thread-safe
        try:
            spec, session = Session.for_request(
                rnic, rnic.alloc_pd(), request.private_data, self._ports(), self.budget
            )
        except BenchError as exc:
            request.reject(reject_data(exc))
            return
        try:
            conn = request.accept(session.qp, session.advert.encode())
        except IwarpError:
            session.close()
            return
        limit_stall(conn.sock, self.stall_timeout)
        try:
            if session.recv is not None:
                cq = session.cq
                while session.answer([conn.next_completion(cq), *cq.poll(len(cq))]):
                    pass
            elif session.pong is not None:
                _pong_writes(conn, session, spec.size)
            else:
                while conn.progress(None):
                    pass
        except (OSError, IwarpError) as exc:
            conn.abort(exc)
        finally:
            session.close()
            log_session_end("blocking iWARP", spec, conn.error, self.stall_timeout)


def _pong_writes(conn: BlockingConnection, session: Session, size: int) -> None:
    """Write latency: read until the ping's last byte lands, answer with a Write."""
    assert session.target is not None
    tbuf, last = session.target.buf, session.pong_index(size)
    expected = 1
    while True:
        while tbuf[last] != expected:
            if not conn.progress(None):
                return
        session.send_pong(expected, size)
        expected = expected % 255 + 1


# ---------------------------------------------------------------------- client half
def blocking_latency_run(
    host: str,
    port: int,
    settings: MpaSettings,
    opts: BenchOptions,
    size: int,
    iterations: int | None,
    advance: Callable[[int], None],
) -> LatResult:
    """``--lat --blocking``: connect one QP on the blocking driver to the server's blocking
    port and time the exchange of ``opts.test`` one at a time (Read and atomic: the round
    trip; Write and Send ping-pong: half of it), ``iterations`` times after the warm-up or
    for ``opts.duration`` seconds.  Runs in a worker thread; ``advance`` reports progress."""
    rnic = Rnic("bench-client-blocking")
    pd = rnic.alloc_pd()
    cq = rnic.create_cq(256)
    qp = rnic.create_qp(pd, cq, ord=1)
    local = pd.reg_mr(bytearray(max(size, ATOMIC_SIZE)), Access.LOCAL_WRITE)
    pong: MemoryRegion | None = None
    inbox: MemoryRegion | None = None
    spec = SessionSpec(opts.test, size, True)
    if opts.test == "write":
        pong = pd.reg_mr(bytearray(size), Access.REMOTE_WRITE | Access.LOCAL_WRITE)
        spec = SessionSpec(opts.test, size, True, 0, (pong.rkey, pong.base, size))
    if opts.test == "send":
        inbox = pd.reg_mr(bytearray(size), Access.LOCAL_WRITE)
        qp.post_recv([RecvWR(0, (Sge(inbox.base, size, inbox.lkey),))] * 4)
    try:
        conn = connect(host, port, qp, private_data=spec.encode(), settings=settings)
    except IwarpError as exc:
        raise connect_error(f"the blocking iWARP port {host}:{port}", exc) from None
    try:
        times = _exchange(conn, opts, size, iterations, local, pong, inbox, advance)
        conn.disconnect(CLOSE_TIMEOUT)
    except (OSError, IwarpError) as exc:
        conn.abort()
        raise BenchError(f"{opts.test} latency on the blocking driver failed: {exc}") from None
    if opts.test in ("write", "send"):
        times = [t / 2 for t in times]
    return latency_stats(size, times)


def _exchange(
    conn: BlockingConnection,
    opts: BenchOptions,
    size: int,
    iterations: int | None,
    local: MemoryRegion,
    pong: MemoryRegion | None,
    inbox: MemoryRegion | None,
    advance: Callable[[int], None],
) -> list[float]:
    """The timed loop: one WR, then read until it is answered."""
    advert = Advert.decode(conn.negotiated.peer_private_data)
    qp, cq = conn.qp, conn.qp.send_cq
    clock = time.perf_counter
    total = WARMUP_ITERS + (iterations or 0)
    deadline = None
    times: list[float] = []
    sge = (Sge(local.base, ATOMIC_SIZE if opts.test == "atomic" else size, local.lkey),)
    if opts.test == "read":
        wr = SendWR(1, WrOpcode.RDMA_READ, sge, rkey=advert.rkey, remote_addr=advert.addr)
    elif opts.test == "atomic":
        wr = SendWR(
            1,
            WrOpcode.ATOMIC_FETCH_AND_ADD,
            sge,
            rkey=advert.rkey,
            remote_addr=advert.addr,
            compare_add=1,
        )
    elif opts.test == "send":
        wr = SendWR(0, WrOpcode.SEND, sge, SendFlags.NONE)
    else:
        wr = SendWR(
            0, WrOpcode.RDMA_WRITE, sge, SendFlags.NONE, rkey=advert.rkey, remote_addr=advert.addr
        )
    recv = None if inbox is None else RecvWR(0, (Sge(inbox.base, size, inbox.lkey),))
    sbuf, last = local.buf, size - 1
    i = 0
    while True:
        if i == WARMUP_ITERS and opts.duration is not None:
            deadline = clock() + opts.duration
        if (deadline is None and i >= total) or (deadline is not None and clock() >= deadline):
            break
        if pong is not None:
            value = i % 255 + 1
            sbuf[last] = value
            t0 = clock()
            qp.post_send(wr)
            pbuf = pong.buf
            while pbuf[last] != value:
                if not conn.progress(None) or qp.state not in LIVE:
                    raise BenchError(f"QP went to {qp.state.value} during Write ping-pong")
        else:
            t0 = clock()
            qp.post_send(wr)
            wc = conn.next_completion(cq)
            if wc.status is not WcStatus.SUCCESS:
                raise BenchError(f"{opts.test} WR completed with {wc.status.name}")
            if recv is not None:
                qp.post_recv(recv)
        t1 = clock()
        if i >= WARMUP_ITERS:
            times.append(t1 - t0)
            advance(1)
        i += 1
    return times
