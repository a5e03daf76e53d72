"""The passive perftest peer (:class:`PerftestServer`), like ``ib_write_bw -R``: one session.

Write/Read: the server does nothing during a run.  Send: it keeps at least 512 receives
posted and, whenever its receive count ``n`` on a QP has ``(n % rx_depth) % (rx_depth //
3) == 0``, RDMA-Writes ``n`` to the client's credit slot (perftest's Send credits).
Unlike perftest's server it keeps listening throughout.  perftest's server answers the
bandwidth reports with uninitialised memory; this one answers with zeros.
"""

from __future__ import annotations

import time

import trio

from stack.bench.report import RESULT_LINE
from stack.bench.results import BwResult, peak_rate
from stack.errors import IwarpError, single_exception
from stack.peers.perftest.channel import check_wc
from stack.peers.perftest.latency import prepare_latency, run_latency
from stack.peers.perftest.options import DEFAULT_RX_SEND
from stack.peers.perftest.protocol import BwReport, PerftestError, Step, encode_credit, script
from stack.peers.perftest.side import DataQp, PerftestSide, bw_result
from stack.rnic import RecvWR, SendFlags, SendWR, Sge, WrOpcode
from stack.transport.cm import ConnectionManager, Listener

LINGER_SECONDS = 2.0
"""How long a server whose script ends with a run waits for the client to close first: Linux
siw's client can fail its last Write's completion when our FIN comes right after the Write."""
DURATION_QUIET_SECONDS = 1.0
"""``-D`` Send server: the run ends this long after the last Send past the deadline."""


class PerftestServer(PerftestSide):
    """The passive side: one session, like perftest's server, then it returns."""

    listener: Listener

    async def session(
        self, *, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED
    ) -> None:
        self.header("server")
        with single_exception():
            async with self.manager() as cm:
                await self._serve(cm, task_status)

    async def _serve(self, cm: ConnectionManager, task_status: trio.TaskStatus[int]) -> None:
        o = self.opts
        self.listener = listener = await cm.listen(o.bind, o.port, settings=o.settings(0))
        self.say(RESULT_LINE)
        self.say(" Waiting for client to connect...")
        task_status.started(listener.port)
        request = await listener.get_request()
        try:
            self.comm.conn = await request.accept(self.comm.qp, ird=0, ord=0)
        except IwarpError as exc:
            raise PerftestError(f"accepting the exchange connection failed: {exc}") from None
        try:
            await self.walk_explained(cm)
            await self._linger()
        finally:
            await self.close()
            await listener.aclose()

    async def _linger(self) -> None:
        """``ib_write_lat`` ends with the client's last Write (no closing sync): let the
        client close first, for up to :data:`LINGER_SECONDS`."""
        o = self.opts
        if script(o.test, len(o.sizes), o.all_sizes, o.latency)[-1] is not Step.RUN:
            return
        with trio.move_on_after(LINGER_SECONDS):
            for d in self.data:
                if d.conn is not None:
                    await d.conn.closed.wait()

    async def connect_data(self, cm: ConnectionManager) -> None:
        o = self.opts
        for i in range(o.num_qps):
            with trio.move_on_after(o.timeout) as scope:
                request = await self.listener.get_request()
            if scope.cancelled_caught:
                raise PerftestError(f"no data connection (QP {i}) within {o.timeout} s")
            d = self.new_data_qp()
            try:
                d.conn = await request.accept(d.qp, ird=o.cm_reads, ord=o.cm_reads)
            except IwarpError as exc:
                raise PerftestError(f"accepting data connection {i} failed: {exc}") from None
            d.established = trio.current_time()

    def prepare(self, size: int) -> None:
        """Send: fill every receive queue before the sync that starts the run."""
        if self.opts.latency:
            prepare_latency(self, size)
            return
        if self.opts.test != "send":
            return
        for d in self.data:
            missing = max(self.opts.rx_depth, DEFAULT_RX_SEND) - d.recvs_posted
            if missing > 0:
                d.qp.post_recv([self._recv_wr(d)] * missing)
                d.recvs_posted += missing

    def _recv_wr(self, d: DataQp) -> RecvWR:
        assert d.buf is not None
        return RecvWR(d.qp.qp_num, (Sge(d.buf.base, d.buf.length, d.buf.lkey),))

    async def run(self, size: int) -> None:
        """Write/Read: nothing to do.  Send: count receives, repost, grant credits."""
        o = self.opts
        if o.latency:
            await run_latency(self, size)
            return
        if o.test != "send":
            return
        by_qpn = {d.qp.qp_num: (i, d) for i, d in enumerate(self.data)}
        expected = o.iters * len(self.data)
        every = max(1, o.rx_depth // 3)
        counts = [0] * len(self.data)
        total = 0
        start = end = time.perf_counter()  # the sync before this run has just ended
        samples: list[list[tuple[float, int]]] = [[] for _ in self.data]
        # -D: count until the client's deadline has passed and its Sends have stopped.
        deadline = trio.current_time() + o.duration if o.duration is not None else None
        while deadline is not None or total < expected:
            quiet = DURATION_QUIET_SECONDS if deadline is not None else o.timeout
            with trio.move_on_after(quiet) as scope:
                wcs = [await self.recv_cq.next()]
            if scope.cancelled_caught:
                if deadline is not None and trio.current_time() >= deadline:
                    break
                if deadline is not None:
                    continue
                raise PerftestError(f"received {total} of {expected} Sends; none for {o.timeout} s")
            wcs += self.recv_cq.poll(len(self.recv_cq))
            now = time.perf_counter()
            for wc in wcs:
                check_wc(wc.status, "receive")
                i, d = by_qpn[wc.qp_num]
                d.qp.post_recv(self._recv_wr(d))  # the consumed receive, at once
                counts[i] += 1
                total += 1
                if (counts[i] % o.rx_depth) % every == 0:
                    peer = self.theirs[i]
                    d.qp.post_send(
                        SendWR(
                            0,
                            WrOpcode.RDMA_WRITE,
                            (),
                            SendFlags.NONE,
                            inline_data=encode_credit(counts[i]),
                            rkey=peer.rkey,
                            remote_addr=peer.vaddr,
                        )
                    )
                samples[i].append((now, counts[i]))
            end = now
        for i, d in enumerate(self.data):
            d.received = counts[i]
        peak = peak_rate(samples, start, max(2, o.rx_depth))
        iters = o.iters if deadline is None else min(counts)
        self.report(bw_result(size, iters, len(self.data), start, end, peak))

    def on_peer_report(self, report: BwReport) -> None:
        """perftest's server prints the client's figures."""
        result = BwResult(
            report.size, report.iters, report.bw_peak, report.bw_avg, report.msg_rate, report.iters
        )
        self.report(result)
