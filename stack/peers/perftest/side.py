"""What a perftest client and server share (:class:`PerftestSide`): the script walk.

Both sides walk :func:`~stack.peers.perftest.protocol.script` step by step; the client and
the server differ in how they connect the data QPs and what they do in a run.  After the
last SYNC each side disconnects its data connections, then the exchange connection.
"""

from __future__ import annotations

import mmap
import random
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

import trio

from stack.bench.report import RESULT_LINE, TEST_NAMES, TRANSPORT
from stack.bench.results import MB, BwResult, LatResult
from stack.pcap import PcapWriter
from stack.peers.perftest.channel import ByteMeter, Comm, TeeTap
from stack.peers.perftest.options import PerftestOptions
from stack.peers.perftest.protocol import (
    CREDIT,
    ZERO_DEST,
    BwReport,
    PerftestError,
    PingpongDest,
    Step,
    check_peer_version,
    decode_mtu,
    decode_sys_int,
    decode_version,
    encode_mtu,
    encode_sys_int,
    encode_version,
    script,
)
from stack.peers.perftest.report import bw_header, bw_row, lat_header, lat_row, write_json
from stack.rnic import Access, CompletionQueue, QpCap, QueuePair, Rnic
from stack.rnic.memory import MemoryRegion
from stack.transport.cm import ConnectionManager
from stack.transport.driver import RdmaConnection
from stack.transport.tap import pcap_tap_factory

CACHE_LINE = 64
REMOTE_RW = Access.LOCAL_WRITE | Access.REMOTE_WRITE | Access.REMOTE_READ
REMOTE_ALL = REMOTE_RW | Access.REMOTE_ATOMIC


@dataclass
class DataQp:
    """One data QP: its CQs, connection, buffer and (Send) credit slot."""

    qp: QueuePair
    send_cq: CompletionQueue
    conn: RdmaConnection | None = None
    buf: MemoryRegion | None = None
    established: float = 0.0
    received: int = 0
    recvs_posted: int = 0


class PerftestSide:
    """What client and server share: the script walk and the exchange steps."""

    active = False

    def __init__(self, opts: PerftestOptions) -> None:
        self.opts = opts
        self.out = opts.out or sys.stdout
        self.rnic = Rnic("perftest")
        self.pd = self.rnic.alloc_pd()
        self.meter = ByteMeter()
        self.comm = Comm(self.rnic, self.pd, self.active, opts.timeout, self.meter, self.broken)
        self.data: list[DataQp] = []
        self.recv_cq = self.rnic.create_cq(opts.recv_cq_size)
        self.credit: MemoryRegion | None = None
        self.mine: list[PingpongDest] = []
        self.theirs: list[PingpongDest] = []
        self.peer_version = ""
        self.cycle_buffer = mmap.PAGESIZE
        self.cache_line = CACHE_LINE
        self.peer_mtu = 0
        self.results: list[BwResult] = []
        self.lat_results: list[LatResult] = []
        self.peer_report: BwReport | None = None
        self._run = 0
        self._printed = False
        self.closing = False

    def say(self, line: str = "") -> None:
        print(line, file=self.out, flush=True)

    def report(self, result: BwResult | LatResult) -> None:
        """Print a result row (and rewrite ``--out_json``'s file, as perftest does)."""
        o = self.opts
        if isinstance(result, BwResult):
            self.results.append(result)
            self.say(bw_row(result, o.report_gbits))
        else:
            self.lat_results.append(result)
            self.say(lat_row(result, o.duration is not None))
        if o.out_json is not None:
            try:
                write_json(o.out_json, o, result)
            except OSError as exc:
                raise PerftestError(f"cannot write --out_json {o.out_json}: {exc}") from None

    @asynccontextmanager
    async def manager(self) -> AsyncIterator[ConnectionManager]:
        """The connection manager: the byte meter on every connection, and ``-w FILE``."""
        if self.opts.capture is None:
            async with ConnectionManager.open(self.rnic, tap_factory=self.meter) as cm:
                yield cm
            return
        try:
            writer = PcapWriter(self.opts.capture)
        except OSError as exc:
            raise PerftestError(f"cannot write -w {self.opts.capture}: {exc}") from None
        with writer:
            taps = TeeTap(self.meter, pcap_tap_factory(writer))
            async with ConnectionManager.open(self.rnic, tap_factory=taps) as cm:
                yield cm

    async def walk(self, cm: ConnectionManager) -> None:
        """Run every step of the script in order."""
        o = self.opts
        steps = script(o.test, len(o.sizes), o.all_sizes, o.latency)
        for index, step in enumerate(steps):
            # The closing sync: the peer may tear its data connections down right after it.
            self.closing = index == len(steps) - 1
            if step is Step.HELLO:
                await self.hello()
            elif step is Step.SYNC:
                await self.sync()
            elif step is Step.CONNECT:
                await self.connect_data(cm)
            elif step is Step.SET_UP:
                self.set_up()
            elif step is Step.DESTS:
                await self.dests()
            elif step is Step.PREPARE:
                self.prepare(o.sizes[self._run])
            elif step is Step.RUN:
                await self.run(o.sizes[self._run])
                self._run += 1
            elif step is Step.REPORTS:
                await self.reports()

    def broken(self) -> str:
        """The data connections that closed before the end ('' when none)."""
        if self.closing:
            return ""
        return "; ".join(
            f"data QP {i} is {d.qp.state.value}: {d.conn.error or d.qp.error or 'closed'}"
            for i, d in enumerate(self.data)
            if d.conn is not None and d.conn.closed.is_set()
        )

    async def walk_explained(self, cm: ConnectionManager) -> None:
        """:meth:`walk`; a failure names the data connections that went wrong."""
        try:
            await self.walk(cm)
        except PerftestError as exc:
            broken = self.broken() or self.terminated()
            if broken and broken not in str(exc):
                raise PerftestError(f"{exc} ({broken})") from None
            raise

    def terminated(self) -> str:
        """The peer's Terminate on each data QP that got one, while it is still closing
        ('' when none)."""
        return "; ".join(
            f"data QP {i}: the peer sent Terminate {d.qp.peer_terminate.cause}"
            for i, d in enumerate(self.data)
            if d.qp.peer_terminate is not None
        )

    async def hello(self) -> None:
        """Version, cycle buffer, cache line and MTU (``exchange_versions`` ... ``check_mtu``)."""
        text, value = decode_version(await self.comm.xchg(encode_version(), "version"))
        check_peer_version(value, text)
        self.peer_version = text
        got = await self.comm.xchg(encode_sys_int(self.cycle_buffer), "cycle buffer size")
        self.cycle_buffer = max(self.cycle_buffer, decode_sys_int(got, "cycle buffer size"))
        got = await self.comm.xchg(encode_sys_int(self.cache_line), "cache line size")
        self.cache_line = max(self.cache_line, decode_sys_int(got, "cache line size"))
        self.peer_mtu = decode_mtu(await self.comm.xchg(encode_mtu(), "MTU"))

    async def sync(self) -> None:
        """``ctx_hand_shake`` with QP 0's dest (zeros before SET_UP)."""
        mine = self.mine[0] if self.mine else ZERO_DEST
        theirs = PingpongDest.decode(await self.comm.xchg(mine.encode(), "sync"))
        if self.mine:
            self.theirs[0] = theirs

    def set_up(self) -> None:
        """Register buffers and describe each QP (``set_up_connection``, ``ctx_alloc_credit``)."""
        o = self.opts
        length = max(o.buffer_size, self.cycle_buffer)
        if o.test == "send" and not o.latency:
            self.credit = self.pd.reg_mr(bytearray(CREDIT.size * o.num_qps), REMOTE_RW)
        # ib_write_lat writes from the lower half and is written into the upper half.
        halves = 2 if o.latency and o.test == "write" else 1
        for i, d in enumerate(self.data):
            d.buf = self.pd.reg_mr(_pattern(length * halves, i), REMOTE_ALL)
            rkey, vaddr = d.buf.rkey, d.buf.base + (halves - 1) * length
            if self.credit is not None:
                rkey, vaddr = self.credit.rkey, self.credit.base + i * CREDIT.size
            self.mine.append(
                PingpongDest(
                    out_reads=o.out_reads,
                    qpn=d.qp.qp_num,
                    psn=random.getrandbits(24),
                    rkey=rkey,
                    vaddr=vaddr,
                )
            )
        self.theirs = [ZERO_DEST] * len(self.mine)

    async def dests(self) -> None:
        """One hand shake per QP; print both ends like perftest."""
        for i, mine in enumerate(self.mine):
            got = await self.comm.xchg(mine.encode(), f"pingpong_dest of QP {i}")
            self.theirs[i] = PingpongDest.decode(got)
        o = self.opts
        if not self._printed:
            self._printed = True
            self.say(RESULT_LINE)
            for side, dests in (("local", self.mine), ("remote", self.theirs)):
                for d in dests:
                    self.say(_address_line(side, d, self.opts.test))
            self.say(RESULT_LINE)
            if o.latency:
                self.say(lat_header(o.duration is not None))
            else:
                self.say(bw_header(o.report_gbits))

    async def reports(self) -> None:
        """``xchg_bw_reports``: five exchanges; the client's figures reach the server."""
        mine = self._report()
        parts = [await self.comm.xchg(p, "bandwidth report") for p in mine.encode()]
        self.peer_report = BwReport.decode(parts)
        self.on_peer_report(self.peer_report)

    def _report(self) -> BwReport:
        return BwReport()

    def on_peer_report(self, report: BwReport) -> None:
        pass

    async def connect_data(self, cm: ConnectionManager) -> None:
        raise NotImplementedError

    def prepare(self, size: int) -> None:
        pass

    async def run(self, size: int) -> None:
        pass

    def new_data_qp(self) -> DataQp:
        o = self.opts
        send_cq = self.rnic.create_cq(2 * o.tx_depth + o.rx_depth + 64)
        cap = QpCap(
            max_send_wr=o.tx_depth + o.rx_depth + 64,
            max_recv_wr=o.recv_slots,
        )
        reads = max(1, o.cm_reads)
        qp = self.rnic.create_qp(self.pd, send_cq, self.recv_cq, cap=cap, ird=reads, ord=reads)
        d = DataQp(qp, send_cq)
        self.data.append(d)
        return d

    def header(self, role: str) -> None:
        o = self.opts
        self.say(RESULT_LINE)
        kind = "Latency" if o.latency else "BW"
        self.say(f"                    {TEST_NAMES[o.test]} {kind} Test")
        self.say(f" Number of qps   : {o.num_qps}\t\tTransport type : {TRANSPORT}")
        self.say(f" Connection type : RC\t\tRole           : {role}")
        if role == "client":
            self.say(f" TX depth        : {o.tx_depth}")
        if o.test == "send":
            self.say(f" RX depth        : {o.rx_depth}")
        self.say(f" CQ Moderation   : {o.cq_mod}")
        if o.test == "read":
            self.say(f" Outstand reads  : {o.out_reads}")
        self.say(" rdma_cm QPs\t : ON")
        self.say(" Data ex. method : rdma_cm")

    async def close(self) -> None:
        """Disconnect the data connections, then the exchange connection."""
        with trio.move_on_after(10):
            async with trio.open_nursery() as nursery:
                for d in self.data:
                    if d.conn is not None:
                        nursery.start_soon(d.conn.disconnect)
            if self.comm.conn is not None:
                await self.comm.conn.disconnect()


def _pattern(length: int, salt: int) -> bytearray:
    """A recognisable buffer (perftest fills its buffers with random bytes)."""
    unit = bytes((i * 7 + salt * 31 + 1) & 0xFF for i in range(251))
    return bytearray((unit * (length // len(unit) + 1))[:length])


def _address_line(side: str, d: PingpongDest, test: str) -> str:
    line = f" {side} address: LID {d.lid:#06x} QPN {d.qpn:#06x} PSN {d.psn:#08x}"
    if test == "read":
        line += f" OUT {d.out_reads:#04x}"
    return line + f" RKey {d.rkey:#010x} VAddr {d.vaddr:#018x}"


def bw_result(
    size: int, iters: int, num_qps: int, start: float, end: float, peak: float
) -> BwResult:
    """A result row; perftest counts the iterations of all QPs together."""
    messages = iters * num_qps
    elapsed = max(end - start, 1e-9)
    rate = messages / elapsed
    peak_bw, avg_bw = (peak or rate) * size / MB, rate * size / MB
    return BwResult(size, messages, peak_bw, avg_bw, rate / 1e6, messages)
