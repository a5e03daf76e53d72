"""The active half of the RDMA benchmarks: connected QPs and the measurements on them.

* Bandwidth (:func:`measure_bw`): every QP keeps ``-t`` work requests outstanding, posted
  in lists of ``--post-list``, every ``--cq-mod``-th one signalled (selective signalling).
  Writes and Sends are timed until the data is at the target: each QP ends with a
  zero-length RDMA Read, whose response cannot pass the earlier Writes and Sends (RFC 5040
  §5.5).  ``BW peak`` is the best pace over any window of at least ``max(tx depth x QPs,
  5% of the messages)`` local completions (:func:`~stack.bench.results.peak_rate`);
  ``BW average`` and ``MsgRate`` cover the whole run.
* Latency (:func:`measure_lat`): one WR at a time.  Read and atomic report the round trip;
  Write and Send ping-pong (the server answers each Write by polling its memory, each Send
  from its completion) and report half the round trip, as perftest does.  The task that
  waits for a completion drives the connection's input meanwhile
  (:meth:`~stack.transport.driver.RdmaConnection.next_completion`), as perftest polls its
  CQ.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import trio

from stack.bench.memory import REMOTE_ALL, dereg, wait_for_byte, zeroed
from stack.bench.options import ATOMIC_SIZE, WARMUP_ITERS, BenchError, BenchOptions
from stack.bench.progress import Progress
from stack.bench.protocol import RAW_STATS, Advert, SessionSpec, connect_error, open_raw
from stack.bench.results import MB, BwResult, LatResult, latency_stats, peak_rate
from stack.errors import IwarpError
from stack.rnic import (
    Access,
    CompletionQueue,
    QpCap,
    QueuePair,
    RecvWR,
    SendFlags,
    SendWR,
    Sge,
    WcStatus,
    WrOpcode,
)
from stack.rnic.memory import MemoryRegion
from stack.transport.cm import ConnectionManager
from stack.transport.driver import RdmaConnection
from stack.wire.events import MpaSettings

FINAL_READ_ID = -1
"""wr_id of the zero-length Read that ends a Write/Send bandwidth run."""


@dataclass
class ClientQp:
    """One connected client QP with its regions and the server's advertisement."""

    qp: QueuePair
    cq: CompletionQueue
    conn: RdmaConnection
    local: MemoryRegion | None
    advert: Advert
    pong: MemoryRegion | None = None
    inbox: MemoryRegion | None = None


class Client:
    """The active half: one RNIC and connection manager for the whole run."""

    def __init__(self, cm: ConnectionManager, host: str, port: int) -> None:
        self.cm = cm
        self.rnic = cm.rnic
        self.pd = self.rnic.alloc_pd()
        self.host = host
        self.port = port
        self.raw_port = 0
        self.blocking_port = 0
        self.iwarp_blocking_port = 0

    async def connect(
        self, spec: SessionSpec, settings: MpaSettings, *, tx_depth: int, ord: int
    ) -> ClientQp:
        """Create and connect one QP for ``spec``; raises BenchError on failure."""
        cq = self.rnic.create_cq(2 * tx_depth + 64)
        qp = self.rnic.create_qp(
            self.pd, cq, cap=QpCap(max_send_wr=tx_depth + 64, max_recv_wr=64), ord=ord
        )
        local = pong = inbox = None
        if spec.test != "idle":
            sent = spec.test in ("write", "send")  # the source of the run's messages
            local = self.pd.reg_mr(
                zeroed(max(spec.size, ATOMIC_SIZE), sent=sent), Access.LOCAL_WRITE
            )
        if spec.latency and spec.test == "write":
            pong = self.pd.reg_mr(zeroed(spec.size), REMOTE_ALL)
            spec = SessionSpec(spec.test, spec.size, True, 0, (pong.rkey, pong.base, spec.size))
        if spec.latency and spec.test == "send":
            inbox = self.pd.reg_mr(zeroed(spec.size), Access.LOCAL_WRITE)
            qp.post_recv([RecvWR(0, (Sge(inbox.base, spec.size, inbox.lkey),))] * 4)
        try:
            conn = await self.cm.connect(
                self.host, self.port, qp, private_data=spec.encode(), settings=settings
            )
        except IwarpError as exc:
            self.rnic.destroy_qp(qp)
            raise connect_error(f"{self.host}:{self.port}", exc) from None
        assert conn.negotiated is not None
        advert = Advert.decode(conn.negotiated.peer_private_data)
        self.raw_port = advert.raw_port
        self.blocking_port = advert.blocking_port
        self.iwarp_blocking_port = advert.iwarp_blocking_port
        return ClientQp(qp, cq, conn, local, advert, pong, inbox)

    async def connect_many(
        self,
        spec: SessionSpec,
        settings: MpaSettings,
        count: int,
        *,
        tx_depth: int,
        ord: int,
        parallel: int = 1,
        progress: Progress | None = None,
    ) -> list[ClientQp]:
        """Connect ``count`` QPs, ``parallel`` at a time."""
        out: list[ClientQp] = []
        for first in range(0, count, parallel):
            batch = min(parallel, count - first)
            slots: list[ClientQp | None] = [None] * batch

            async def one(i: int, slots: list[ClientQp | None] = slots) -> None:
                slots[i] = await self.connect(spec, settings, tx_depth=tx_depth, ord=ord)

            async with trio.open_nursery() as nursery:
                for i in range(batch):
                    nursery.start_soon(one, i)
            out += [c for c in slots if c is not None]
            if progress is not None:
                progress.advance(batch)
        return out

    async def close(self, qps: Sequence[ClientQp], parallel: int = 64) -> None:
        """Disconnect gracefully and free everything."""
        for first in range(0, len(qps), parallel):
            async with trio.open_nursery() as nursery:
                for c in qps[first : first + parallel]:
                    nursery.start_soon(c.conn.disconnect)
        for c in qps:
            self.rnic.destroy_qp(c.qp)
            for mr in (c.local, c.pong, c.inbox):
                if mr is not None:
                    dereg(mr)

    async def server_stats(self, *, collect: bool = False) -> dict[str, int]:
        """Ask the server for its RSS, live QP count, pid and CPU time (raw-TCP STATS).

        ``collect``: the server runs the garbage collector first (for memory figures).
        """
        stream = await open_raw(self.host, self.raw_port, RAW_STATS, int(collect))
        async with stream:
            data = bytearray()
            while chunk := await stream.receive_some(4096):
                data += chunk
        try:
            return {k: int(v) for k, v in json.loads(data).items()}
        except (ValueError, AttributeError) as exc:
            raise BenchError(f"malformed server stats: {exc}") from None


def _check(wc_status: WcStatus, what: str) -> None:
    """Raise BenchError unless a work completion succeeded."""
    if wc_status is not WcStatus.SUCCESS:
        raise BenchError(f"{what} completed with status '{wc_status.text}'")


def _bw_work_requests(test: str, c: ClientQp, size: int) -> tuple[SendWR, Callable[[int], SendWR]]:
    """(the shared unsignalled WR, a factory of signalled WRs by index) for one QP."""
    assert c.local is not None
    op = {
        "write": WrOpcode.RDMA_WRITE,
        "read": WrOpcode.RDMA_READ,
        "send": WrOpcode.SEND,
        "atomic": WrOpcode.ATOMIC_FETCH_AND_ADD,
    }[test]
    length = ATOMIC_SIZE if test == "atomic" else size
    sges = (Sge(c.local.base, length, c.local.lkey),)
    rkey, addr = c.advert.rkey, c.advert.addr
    add = 1 if test == "atomic" else 0
    unsignalled = SendWR(0, op, sges, SendFlags.NONE, rkey=rkey, remote_addr=addr, compare_add=add)

    def signalled(index: int) -> SendWR:
        return SendWR(
            index, op, sges, SendFlags.SIGNALED, rkey=rkey, remote_addr=addr, compare_add=add
        )

    return unsignalled, signalled


async def _bw_one_qp(
    c: ClientQp,
    opts: BenchOptions,
    size: int,
    iters: int | None,
    deadline: float | None,
    samples: list[tuple[float, int]],
    progress: Progress,
) -> tuple[int, float]:
    """Run one QP's share; returns (messages, time the data was known at the target)."""
    qp, cq = c.qp, c.cq
    unsignalled, signalled = _bw_work_requests(opts.test, c, size)
    tx_depth, post_list, cq_mod = opts.tx_depth, opts.post_list, opts.cq_mod
    clock = time.perf_counter
    end = iters
    posted = done = 0
    while True:
        if end is None and deadline is not None and clock() >= deadline:
            end = posted
            if posted % cq_mod:  # the last WR was unsignalled: one more, signalled
                qp.post_send(signalled(posted))
                posted = end = posted + 1
        while (end is None or posted < end) and posted - done < tx_depth:
            count = min(post_list, tx_depth - (posted - done))
            if end is not None:
                count = min(count, end - posted)
            # Every cq_mod-th WR and the last one signalled; no per-WR work in this loop
            # beyond what the baseline's sender does per message (bench overhead stays low).
            batch = [unsignalled] * count
            for i in range(posted + (-(posted + 1)) % cq_mod, posted + count, cq_mod):
                batch[i - posted] = signalled(i)
            if end is not None and posted + count == end:
                batch[-1] = signalled(end - 1)
            qp.post_send(batch)
            posted += count
        if end is not None and done >= end:
            break
        wcs = [await cq.next()]
        wcs += cq.poll(len(cq))
        before = done
        for wc in wcs:
            if wc.status is not WcStatus.SUCCESS:
                _check(wc.status, f"{opts.test} WR {wc.wr_id}")
            done = wc.wr_id + 1
        samples.append((clock(), done))
        progress.advance(done - before)
    if opts.test in ("write", "send"):
        assert c.local is not None
        qp.post_send(
            SendWR(
                FINAL_READ_ID,
                WrOpcode.RDMA_READ,
                (Sge(c.local.base, 0, c.local.lkey),),
                rkey=c.advert.rkey,
                remote_addr=c.advert.addr,
            )
        )
        wc = await cq.next()
        _check(wc.status, "final zero-length Read")
    return done, clock()


async def measure_bw(
    qps: Sequence[ClientQp], opts: BenchOptions, size: int, progress: Progress
) -> BwResult:
    """Bandwidth over all ``qps`` at once."""
    iters = None if opts.duration is not None else opts.iterations_for(size)
    progress.start(f"{opts.test} {size} B", iters * len(qps) if iters else None, opts.duration)
    samples: list[list[tuple[float, int]]] = [[] for _ in qps]
    outcomes: list[tuple[int, float]] = [(0, 0.0)] * len(qps)
    start = time.perf_counter()
    deadline = start + opts.duration if opts.duration is not None else None

    async def one(i: int) -> None:
        outcomes[i] = await _bw_one_qp(qps[i], opts, size, iters, deadline, samples[i], progress)

    async with trio.open_nursery() as nursery:
        for i in range(len(qps)):
            nursery.start_soon(one, i)
    progress.finish()
    messages = sum(n for n, _ in outcomes)
    elapsed = max(t for _, t in outcomes) - start
    moved = ATOMIC_SIZE if opts.test == "atomic" else size
    window = max(opts.tx_depth * len(qps), messages // 20)
    peak = peak_rate(samples, start, window) or messages / elapsed
    return BwResult(
        size,
        messages // len(qps),
        peak * moved / MB,
        messages * moved / elapsed / MB,
        messages / elapsed / 1e6,
        messages,
    )


async def measure_lat(c: ClientQp, opts: BenchOptions, size: int, progress: Progress) -> LatResult:
    """One WR at a time on one QP; Write and Send ping-pong (half round trip)."""
    iters = None if opts.duration is not None else opts.iterations_for(size)
    progress.start(f"{opts.test} latency {size} B", iters, opts.duration)
    qp, cq = c.qp, c.cq
    assert c.local is not None
    clock = time.perf_counter
    rkey, addr = c.advert.rkey, c.advert.addr
    # The waiting task drives the connection's input (manual progress, as perftest polls
    # its CQ): the answer is applied where it is awaited, with no hand-off between tasks.
    next_completion = c.conn.next_completion
    times: list[float] = []
    halve = opts.test in ("write", "send")
    deadline = None
    total = WARMUP_ITERS + (iters or 0)
    i = 0
    if opts.test in ("read", "atomic"):
        op = WrOpcode.RDMA_READ if opts.test == "read" else WrOpcode.ATOMIC_FETCH_AND_ADD
        length = size if opts.test == "read" else ATOMIC_SIZE
        wr = SendWR(1, op, (Sge(c.local.base, length, c.local.lkey),), rkey=rkey, remote_addr=addr)
        if opts.test == "atomic":
            wr = SendWR(1, op, wr.sg_list, rkey=rkey, remote_addr=addr, compare_add=1)
        while True:
            if i == WARMUP_ITERS and opts.duration is not None:
                deadline = clock() + opts.duration
            if (deadline is None and i >= total) or (deadline is not None and clock() >= deadline):
                break
            t0 = clock()
            qp.post_send(wr)
            wc = await next_completion(cq)
            t1 = clock()
            if wc.status is not WcStatus.SUCCESS:
                _check(wc.status, f"{opts.test} WR")
            if i >= WARMUP_ITERS:
                times.append(t1 - t0)
                progress.advance(1)
            i += 1
    elif opts.test == "send":
        assert c.inbox is not None
        ping = SendWR(0, WrOpcode.SEND, (Sge(c.local.base, size, c.local.lkey),), SendFlags.NONE)
        recv = RecvWR(0, (Sge(c.inbox.base, size, c.inbox.lkey),))
        while True:
            if i == WARMUP_ITERS and opts.duration is not None:
                deadline = clock() + opts.duration
            if (deadline is None and i >= total) or (deadline is not None and clock() >= deadline):
                break
            t0 = clock()
            qp.post_send(ping)
            wc = await next_completion(cq)
            t1 = clock()
            if wc.status is not WcStatus.SUCCESS:
                _check(wc.status, "Send ping-pong")
            qp.post_recv(recv)
            if i >= WARMUP_ITERS:
                times.append(t1 - t0)
                progress.advance(1)
            i += 1
    else:  # write: poll the last byte of our pong region, as perftest polls memory
        assert c.pong is not None
        sbuf, pbuf = c.local.buf, c.pong.buf
        last = size - 1
        ping = SendWR(
            0,
            WrOpcode.RDMA_WRITE,
            (Sge(c.local.base, size, c.local.lkey),),
            SendFlags.NONE,
            rkey=rkey,
            remote_addr=addr,
        )
        while True:
            if i == WARMUP_ITERS and opts.duration is not None:
                deadline = clock() + opts.duration
            if (deadline is None and i >= total) or (deadline is not None and clock() >= deadline):
                break
            value = i % 255 + 1
            sbuf[last] = value
            t0 = clock()
            qp.post_send(ping)
            await wait_for_byte(pbuf, last, value, qp)
            t1 = clock()
            if i >= WARMUP_ITERS:
                times.append(t1 - t0)
                progress.advance(1)
            i += 1
    progress.finish()
    if halve:
        times = [t / 2 for t in times]
    return latency_stats(size, times)
