"""The active perftest peer (:class:`PerftestClient`), like ``ib_write_bw -R <server>``.

Write/Read: the client keeps ``-t`` WRs outstanding, every ``-Q``-th and the last
signalled, all at the address the server advertised (perftest cycles through a page there;
we stay at offset 0).  Send: the client keeps ``posted + 1 - credit < rx_depth`` and zeroes
its credits before each size (perftest's ``rx_depth``: ``min(-r, -n)``, plus one when odd,
single size only).

Linux siw's passive race: siw can stall an FPDU that arrives right after its MPA Reply, so
the client waits ``--first-fpdu-delay`` (0.2 s) after each connection before its first FPDU
on it (perftest's own ``ib_write_bw`` client sleeps 1 s after the exchange connection).
"""

from __future__ import annotations

import time

import trio

from stack.bench.report import TEST_NAMES
from stack.bench.results import BwResult, peak_rate
from stack.errors import single_exception
from stack.peers.perftest.channel import check_wc
from stack.peers.perftest.latency import open_write_lat, prepare_latency, run_latency
from stack.peers.perftest.options import PerftestOptions
from stack.peers.perftest.protocol import CREDIT, BwReport, PerftestError, decode_credit
from stack.peers.perftest.side import PerftestSide, bw_result
from stack.rnic import QueuePair, SendFlags, SendWR, Sge, WrOpcode
from stack.transport.cm import ConnectFailed, ConnectionManager, ConnectRejected
from stack.transport.driver import RdmaConnection

CONNECT_RETRY_SECONDS = 0.1
CREDIT_POLL_SECONDS = 0.0005
OPCODES = {
    "write": WrOpcode.RDMA_WRITE,
    "read": WrOpcode.RDMA_READ,
    "send": WrOpcode.SEND,
    "atomic": WrOpcode.ATOMIC_FETCH_AND_ADD,
}
ATOMIC_ADD = 1
"""What ``ib_atomic_bw`` adds at the server (perftest's ATOMIC_ADD_VALUE)."""


class PerftestClient(PerftestSide):
    """The active side: connects to a perftest (or our) server and drives the test."""

    active = True
    _opened = False

    async def session(self) -> list[BwResult]:
        o = self.opts
        assert o.host is not None
        self.header("client")
        with single_exception():
            async with self.manager() as cm:
                self.comm.conn = await self._connect(cm, self.comm.qp, 0, "exchange")
                await trio.sleep(o.first_fpdu_delay)
                try:
                    await self.walk_explained(cm)
                finally:
                    await self.close()
        return self.results

    async def _connect(
        self, cm: ConnectionManager, qp: QueuePair, reads: int, what: str
    ) -> RdmaConnection:
        """Connect, retrying while the server is not (yet) listening.

        perftest's server listens again for the data connections only after the first sync.
        """
        o = self.opts
        assert o.host is not None
        deadline = trio.current_time() + o.timeout
        while True:
            try:
                return await cm.connect(o.host, o.port, qp, settings=o.settings(reads))
            except ConnectRejected as exc:
                raise PerftestError(f"{what} connection rejected by {o.host}:{o.port}") from exc
            except ConnectFailed as exc:
                if trio.current_time() + CONNECT_RETRY_SECONDS > deadline:
                    raise PerftestError(
                        f"cannot open the {what} connection to {o.host}:{o.port}: {exc}"
                    ) from None
            await trio.sleep(CONNECT_RETRY_SECONDS)

    async def connect_data(self, cm: ConnectionManager) -> None:
        for i in range(self.opts.num_qps):
            d = self.new_data_qp()
            d.conn = await self._connect(cm, d.qp, self.opts.cm_reads, f"data (QP {i})")
            d.established = trio.current_time()

    async def dests(self) -> None:
        """The hand shake; then ``ib_write_lat``'s zero-length Write (:func:`open_write_lat`),
        once."""
        await super().dests()
        o = self.opts
        if o.latency and o.test == "write" and not self._opened:
            self._opened = True
            await open_write_lat(self)

    def prepare(self, size: int) -> None:
        if self.opts.latency:
            prepare_latency(self, size)

    async def run(self, size: int) -> None:
        o = self.opts
        if o.latency:
            await run_latency(self, size)
            return
        settle = max(d.established for d in self.data) + o.first_fpdu_delay
        await trio.sleep_until(settle)
        if self.credit is not None:
            self.credit.buf[:] = bytes(len(self.credit.buf))  # perftest zeroes credits per size
        samples: list[list[tuple[float, int]]] = [[] for _ in self.data]
        ends = [0.0] * len(self.data)
        counts = [o.iters] * len(self.data)
        start = time.perf_counter()
        deadline = trio.current_time() + o.duration if o.duration is not None else None

        async def one(i: int) -> None:
            ends[i], counts[i] = await self._run_qp(i, size, samples[i], deadline)

        async with trio.open_nursery() as nursery:
            for i in range(len(self.data)):
                nursery.start_soon(one, i)
        peak = peak_rate(samples, start, max(o.tx_depth * len(self.data), 2))
        result = bw_result(size, min(counts), len(self.data), start, max(ends), peak)
        self.report(result)

    async def _run_qp(
        self, i: int, size: int, samples: list[tuple[float, int]], deadline: float | None
    ) -> tuple[float, int]:
        """Post ``-n`` WRs of ``size`` on QP ``i`` (``run_iter_bw``), or WRs until the ``-D``
        deadline and one more, signalled; (the end time, the WRs posted)."""
        o = self.opts
        d, peer = self.data[i], self.theirs[i]
        assert d.buf is not None
        sges = (Sge(d.buf.base, size, d.buf.lkey),)
        op = OPCODES[o.test]
        add = ATOMIC_ADD if o.test == "atomic" else 0
        rkey, raddr = (0, 0) if o.test == "send" else (peer.rkey, peer.vaddr)
        credit = None
        if self.credit is not None:
            credit = self.credit.buf[i * CREDIT.size : (i + 1) * CREDIT.size]
        posted = done = 0
        target: int | None = o.iters if deadline is None else None
        last_progress = time.monotonic()
        while target is None or done < target:
            if target is None and deadline is not None and trio.current_time() >= deadline:
                target = posted + 1
            blocked = False
            while (target is None or posted < target) and posted - done < o.tx_depth:
                if credit is not None and posted + 1 - decode_credit(credit) >= o.rx_depth:
                    blocked = True
                    break
                last = posted + 1 == target or (posted + 1) % o.cq_mod == 0
                flags = SendFlags.SIGNALED if last else SendFlags.NONE
                wr = SendWR(posted, op, sges, flags, rkey=rkey, remote_addr=raddr, compare_add=add)
                d.qp.post_send(wr)
                posted += 1
                last_progress = time.monotonic()
            wcs = d.send_cq.poll(64)
            if not wcs:
                wait = CREDIT_POLL_SECONDS if blocked or target is None else o.timeout
                with trio.move_on_after(wait):
                    wcs = [await d.send_cq.next()]
            for wc in wcs:
                try:
                    check_wc(wc.status, f"{TEST_NAMES[o.test]} WR {wc.wr_id} on QP {i}")
                except PerftestError as exc:  # raised in the run's nursery: explain it here
                    why = self.terminated()
                    raise PerftestError(f"{exc} ({why})" if why else str(exc)) from None
                done = max(done, wc.wr_id + 1)
                last_progress = time.monotonic()
            if wcs:
                samples.append((time.perf_counter(), done))
            elif time.monotonic() - last_progress > o.timeout:
                why = "no Send credit from the server" if blocked else "no completion"
                raise PerftestError(f"QP {i} stalled at {done}/{target}: {why} in {o.timeout} s")
        return time.perf_counter(), target

    def _report(self) -> BwReport:
        if not self.results:
            return BwReport()
        r = self.results[-1]
        return BwReport(r.size, r.iterations, r.bw_peak, r.bw_average, r.msg_rate)


async def run_client(opts: PerftestOptions) -> list[BwResult]:
    """Run one client session; returns its results (one per size)."""
    return await PerftestClient(opts).session()
