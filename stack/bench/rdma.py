"""``iwarp bench write|read|send|atomic``: perftest-style RDMA benchmarks over the software RNIC.

Modelled on perftest (``ib_write_bw``, ``ib_read_lat``, ...): the same options where they make
sense (``-s``, ``-a``, ``-n``, ``-D``, ``-q``, ``--post-list``, ``--cq-mod``, ``-t``), the same
table headers and dashed separators, the same split into a passive server and an active
client.  By default the client spawns the server half (``iwarp bench server``) on 127.0.0.1
and drives it; ``--server`` and ``--connect HOST:PORT`` run the halves by hand,
``--in-process`` runs both in one trio run.

Theory of operation.

* The server is generic: each QP the client connects says in its MPA Request private data
  (JSON, :class:`SessionSpec`) which test it runs and the message size.  The server
  registers a target region, keeps a receive queue full for Sends, answers latency
  ping-pongs, and advertises region, STag and its raw-TCP port in the Reply private data.
* Bandwidth: every QP keeps ``-t`` work requests outstanding, posted in lists of
  ``--post-list``, every ``--cq-mod``-th one signalled (selective signalling).  Writes and
  Sends are timed until the data is at the target: each QP ends with a zero-length RDMA
  Read, whose response cannot pass the earlier Writes and Sends (RFC 5040 §5.5).
  ``BW peak`` is the best pace over any window of at least ``max(tx depth x QPs, 5% of
  the messages)`` local completions (perftest's best single-message pace is meaningless at
  Python timer granularity); ``BW average`` and ``MsgRate`` cover the whole run.  MB is
  2^20 bytes, as in perftest.
* Latency: one WR at a time.  Read and atomic report the round trip; Write and Send
  ping-pong (the server answers each Write by polling its memory, each Send from its
  completion) and report half the round trip, as perftest does.  Memory polling spins
  for 200 us, then looks every 20 us (:func:`wait_for_byte`).
* ``--baseline`` runs raw trio TCP in the same run, against the same server process, with
  the same message count and QP (connection) count: Writes and Sends against a stream of
  the same bytes with one ``send_all`` per message (ended by the sink's byte count);
  Reads and atomics against request/response (16-byte request, SIZE-byte reply) with the
  same pipelining depth (``min(tx depth, ORD)``); latency against the same exchange one
  at a time.  ``ratio`` is iWARP over raw: for bandwidth above 1 is better, for latency
  below 1 is better.
* ``--cpu`` (perftest's ``--cpu_util``, per message here) adds the CPU time (user + system)
  each process spent per message, for iWARP and for the baseline: a figure that survives
  a busy machine better than wall-clock rates do.
* ``iwarp bench idle-qps`` connects N idle QPs to one server process and reports its RSS
  growth per QP.

Speed is measured and reported, never asserted.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import resource
import statistics
import struct
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TextIO

import trio

from stack.cli import CliError, binary_size, one_line_errors, port_number, trio_run
from stack.errors import IwarpError
from stack.rnic import (
    Access,
    CompletionQueue,
    QpCap,
    QpState,
    QueuePair,
    RecvWR,
    Rnic,
    SendFlags,
    SendWR,
    Sge,
    WcOpcode,
    WcStatus,
    WrOpcode,
)
from stack.rnic.memory import MemoryRegion, ProtectionDomain
from stack.transport.cm import ConnectFailed, ConnectionManager, ConnectRequest
from stack.transport.driver import RECEIVE_SIZE, RdmaConnection
from stack.wire.events import CrcPolicy, MpaSettings, Negotiated

TESTS = ("write", "read", "send", "atomic")
DEFAULT_PORT = 18515
"""perftest's default port."""
ALL_SIZES = tuple(2**k for k in range(1, 24))
"""``-a``: 2 bytes to 8 MiB, as perftest."""
MAX_SIZE = 1 << 30
ATOMIC_SIZE = 8
DEFAULT_TX_DEPTH = 128
DEFAULT_CQ_MOD = 100
DEFAULT_BW_ITERS = 5000
DEFAULT_LAT_ITERS = 1000
BW_BYTES_PER_SIZE = 1 << 28
"""Without ``-n``, a bandwidth run moves at most about this much per size."""
LAT_BYTES_PER_SIZE = 1 << 26
MIN_DEFAULT_ITERS = 16
WARMUP_ITERS = 16
"""Latency round trips run before recording (both iWARP and raw)."""
DEFAULT_IDLE_QPS = 1000
SPIN_SECONDS = 200e-6
BACKOFF_SECONDS = 20e-6
MB = 1 << 20
DEVICE_MAX_IRD = Rnic().max_ird
DEVICE_MAX_ORD = Rnic().max_ord

RESULT_LINE = "-" * 87
BW_HEADER = " #bytes     #iterations    BW peak[MB/sec]    BW average[MB/sec]   MsgRate[Mpps]"
LAT_HEADER = (
    " #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]"
    "    t_stdev[usec]   99% percentile[usec]   99.9% percentile[usec] "
)
BW_BASELINE_HEADER = "  raw TCP[MB/sec]   ratio"
LAT_BASELINE_HEADER = "  raw t_typical[usec]   ratio"
CPU_HEADER = "   CPU cli/srv[usec/msg]"
RAW_CPU_HEADER = "   raw CPU cli/srv[usec/msg]"
BW_COLUMNS = ("#bytes", "#iterations", "BW peak[MB/sec]", "BW average[MB/sec]", "MsgRate[Mpps]")
LAT_COLUMNS = (
    "#bytes",
    "#iterations",
    "t_min[usec]",
    "t_max[usec]",
    "t_typical[usec]",
    "t_avg[usec]",
    "t_stdev[usec]",
    "99% percentile[usec]",
    "99.9% percentile[usec]",
)
TRANSPORT = "iWARP (userspace, TCP)"
TEST_NAMES = {
    "write": "RDMA_Write",
    "read": "RDMA_Read",
    "send": "Send",
    "atomic": "Atomic FETCH_AND_ADD",
}
REMOTE_ALL = Access.LOCAL_WRITE | Access.REMOTE_WRITE | Access.REMOTE_READ | Access.REMOTE_ATOMIC
FINAL_READ_ID = -1
"""wr_id of the zero-length Read that ends a Write/Send bandwidth run."""
RAW_REQUEST = 16
"""Bytes of a raw-TCP baseline request (an RDMA Read Request FPDU is 34 to 38 bytes)."""
RX_HEADROOM = 64

# Raw-TCP control protocol of the server's second port: a 16-byte header, then the mode's
# traffic.  SINK: the client streams bytes and half-closes; the server answers with the
# byte count (u64).  REQRESP: every RAW_REQUEST-byte request is answered with SIZE bytes.
# STATS: the server answers with a JSON object (rss, qps) and closes.
_RAW_HEADER = struct.Struct(">4sBxxxII")
_RAW_MAGIC = b"IWBR"
RAW_SINK, RAW_REQRESP, RAW_STATS = 1, 2, 3
_U64 = struct.Struct(">Q")


_LIVE = (QpState.IDLE, QpState.RTS)
"""QP states of a usable connection (IDLE until the driver's first run step)."""


class BenchError(Exception):
    """A benchmark run failed (connection refused, error completion, server died)."""


# --------------------------------------------------------------------------- options


@dataclass(frozen=True, slots=True)
class BenchOptions:
    """One client run.

    Fields: test (write/read/send/atomic); sizes; iters (None: default per size) or duration
    (seconds); num_qps; post_list; cq_mod; tx_depth; rx_depth (server receives for Send,
    None: enough for two full TCP reads of the smallest Sends); crc; markers; emss (None:
    the stack's default); latency; baseline; cpu (CPU time per message columns); mode
    ("spawn", "in-process" or "connect");
    host, port (connect mode); progress (report on stderr).
    """

    test: str
    sizes: tuple[int, ...]
    iters: int | None = None
    duration: float | None = None
    num_qps: int = 1
    post_list: int = 1
    cq_mod: int = DEFAULT_CQ_MOD
    tx_depth: int = DEFAULT_TX_DEPTH
    rx_depth: int | None = None
    crc: bool = True
    markers: bool = False
    emss: int | None = None
    latency: bool = False
    baseline: bool = False
    cpu: bool = False
    mode: str = "spawn"
    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    progress: bool = True

    def iterations_for(self, size: int) -> int:
        """Iterations for ``size`` (perftest's defaults, fewer for big messages)."""
        if self.iters is not None:
            return self.iters
        if self.latency:
            return min(DEFAULT_LAT_ITERS, max(MIN_DEFAULT_ITERS, LAT_BYTES_PER_SIZE // size))
        return min(DEFAULT_BW_ITERS, max(MIN_DEFAULT_ITERS, BW_BYTES_PER_SIZE // size))

    def rx_depth_for(self, size: int) -> int:
        """Receives the server keeps posted for Sends of ``size`` bytes.

        iWARP has no receiver-not-ready retry: a Send finding no receive is fatal.  The
        server reposts after each batch of completions, and the driver reads at most
        RECEIVE_SIZE bytes per batch, so two reads' worth of the smallest FPDUs is enough.
        """
        if self.rx_depth is not None:
            return self.rx_depth
        fpdu = size + 24  # MPA length + untagged DDP/RDMAP header (18) + CRC
        return max(512, 2 * RECEIVE_SIZE // fpdu + self.tx_depth + RX_HEADROOM)

    @property
    def mpa_settings(self) -> MpaSettings:
        """The client's MPA choices (CRC requested or not, markers towards the client)."""
        return _settings(CrcPolicy.REQUEST if self.crc else CrcPolicy.OFF, self.markers, self.emss)

    @property
    def ord(self) -> int:
        """Reads and atomics outstanding per QP (perftest's ``-o``): the tx depth, capped."""
        return min(self.tx_depth, DEVICE_MAX_ORD)


def _settings(crc: CrcPolicy, markers: bool, emss: int | None) -> MpaSettings:
    """MPA settings with the device's IRD/ORD (the QPs enforce their own)."""
    if emss is None:
        return MpaSettings(crc=crc, want_markers=markers, ird=DEVICE_MAX_IRD, ord=DEVICE_MAX_ORD)
    return MpaSettings(
        crc=crc, want_markers=markers, ird=DEVICE_MAX_IRD, ord=DEVICE_MAX_ORD, emss=emss
    )


@dataclass(frozen=True, slots=True)
class SessionSpec:
    """What a client asks of the server for one QP (the MPA Request's private data, JSON).

    Fields: test (one of TESTS, or "idle": no memory at all); size; latency; rx_depth
    (receives to keep posted for Sends); pong (the client's region for Write-latency
    pongs: rkey, tagged offset, length).
    """

    test: str
    size: int
    latency: bool = False
    rx_depth: int = 0
    pong: tuple[int, int, int] | None = None

    def encode(self) -> bytes:
        obj: dict[str, object] = {"t": self.test, "s": self.size}
        if self.latency:
            obj["l"] = 1
        if self.rx_depth:
            obj["rx"] = self.rx_depth
        if self.pong is not None:
            obj["pong"] = list(self.pong)
        return json.dumps(obj, separators=(",", ":")).encode()

    @classmethod
    def decode(cls, data: bytes) -> SessionSpec:
        """Parse private data; raises BenchError on anything malformed."""
        try:
            obj = json.loads(data)
            test, size = obj["t"], obj["s"]
            latency = bool(obj.get("l", 0))
            rx_depth = obj.get("rx", 0)
            pong = obj.get("pong")
            if test not in (*TESTS, "idle"):
                raise ValueError(f"unknown test {test!r}")
            if not isinstance(size, int) or not 0 <= size <= MAX_SIZE:
                raise ValueError(f"bad size {size!r}")
            if not isinstance(rx_depth, int) or not 0 <= rx_depth <= 1 << 20:
                raise ValueError(f"bad rx depth {rx_depth!r}")
            if pong is not None:
                if len(pong) != 3 or not all(isinstance(v, int) for v in pong):
                    raise ValueError("bad pong region")
                pong = (pong[0], pong[1], pong[2])
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise BenchError(f"bad session request: {exc}") from None
        return cls(test, size, latency, rx_depth, pong)


@dataclass(frozen=True, slots=True)
class Advert:
    """The server's Reply private data: target region (rkey, TO, length) and raw-TCP port."""

    rkey: int
    addr: int
    length: int
    raw_port: int

    def encode(self) -> bytes:
        obj = {"rkey": self.rkey, "addr": self.addr, "len": self.length, "raw": self.raw_port}
        return json.dumps(obj, separators=(",", ":")).encode()

    @classmethod
    def decode(cls, data: bytes) -> Advert:
        try:
            obj = json.loads(data)
            return cls(int(obj["rkey"]), int(obj["addr"]), int(obj["len"]), int(obj["raw"]))
        except (ValueError, KeyError, TypeError) as exc:
            raise BenchError(f"server sent a malformed advertisement: {exc}") from None


# --------------------------------------------------------------------------- results


@dataclass(frozen=True, slots=True)
class CpuCost:
    """CPU time per message in microseconds: client and server processes (user + system).

    ``server`` is None when both halves share one process; ``client`` is then the total.
    """

    client: float
    server: float | None

    def __str__(self) -> str:
        if self.server is None:
            return f"{self.client:.1f}(both)"
        return f"{self.client:.1f}/{self.server:.1f}"


@dataclass(frozen=True, slots=True)
class BwResult:
    """One bandwidth row: MB/s (2^20 B/s), Mpps; raw_bw is the baseline's average.

    ``iterations`` is per QP, as perftest prints it; ``messages`` counts all QPs.
    """

    size: int
    iterations: int
    bw_peak: float
    bw_average: float
    msg_rate: float
    messages: int
    raw_bw: float | None = None
    cpu: CpuCost | None = None
    raw_cpu: CpuCost | None = None

    @property
    def ratio(self) -> float | None:
        return self.bw_average / self.raw_bw if self.raw_bw else None


@dataclass(frozen=True, slots=True)
class LatResult:
    """One latency row, microseconds; raw_typical is the baseline's median."""

    size: int
    iterations: int
    t_min: float
    t_max: float
    t_typical: float
    t_avg: float
    t_stdev: float
    p99: float
    p999: float
    raw_typical: float | None = None
    cpu: CpuCost | None = None
    raw_cpu: CpuCost | None = None

    @property
    def ratio(self) -> float | None:
        return self.t_typical / self.raw_typical if self.raw_typical else None


@dataclass(frozen=True, slots=True)
class IdleResult:
    """Idle-QP memory: server RSS before/after ``qps`` extra idle QPs, bytes."""

    qps: int
    server_before: int
    server_after: int
    client_before: int
    client_after: int
    shared_process: bool

    @property
    def per_qp(self) -> float:
        return (self.server_after - self.server_before) / self.qps

    @property
    def client_per_qp(self) -> float:
        return (self.client_after - self.client_before) / self.qps


def latency_stats(size: int, seconds: Sequence[float]) -> LatResult:
    """perftest's latency figures from per-iteration times (seconds in, microseconds out)."""
    if not seconds:
        raise BenchError("no latency samples")
    us = sorted(s * 1e6 for s in seconds)
    n = len(us)

    def percentile(q: float) -> float:
        return us[min(n - 1, max(0, math.ceil(q * n) - 1))]

    return LatResult(
        size,
        n,
        us[0],
        us[-1],
        statistics.median(us),
        statistics.fmean(us),
        statistics.pstdev(us) if n > 1 else 0.0,
        percentile(0.99),
        percentile(0.999),
    )


def peak_rate(
    samples: Sequence[Sequence[tuple[float, int]]], start: float, min_window: int
) -> float:
    """Best messages/second over any window of >= ``min_window`` completed messages.

    ``samples`` holds, per QP, (time, messages completed so far) points.  Returns 0 when
    no window is long enough.
    """
    merged = sorted((t, q, done) for q, qp_samples in enumerate(samples) for t, done in qp_samples)
    per_qp = [0] * len(samples)
    points: list[tuple[float, int]] = [(start, 0)]
    total = 0
    for t, q, done in merged:
        total += done - per_qp[q]
        per_qp[q] = done
        points.append((t, total))
    best = 0.0
    i = 0
    for j in range(1, len(points)):
        tj, nj = points[j]
        while i + 1 < j and nj - points[i + 1][1] >= min_window:
            i += 1
        ti, ni = points[i]
        if nj - ni >= min_window and tj > ti:
            best = max(best, (nj - ni) / (tj - ti))
    return best


# --------------------------------------------------------------------------- output


def _row(header: str, names: Sequence[str], values: Sequence[str]) -> str:
    """Place each value under its column name (left-aligned, perftest style)."""
    line = ""
    pos = 0
    for name, value in zip(names, values, strict=True):
        start = header.index(name, pos)
        pos = start + len(name)
        if len(line) >= start:
            line += " "
        line = line.ljust(start) + value
    return line


def _extra_header(baseline: bool, cpu: bool) -> str:
    return (CPU_HEADER if cpu else "") + (RAW_CPU_HEADER if cpu and baseline else "")


def bw_header(baseline: bool, cpu: bool = False) -> str:
    return BW_HEADER + (BW_BASELINE_HEADER if baseline else "") + _extra_header(baseline, cpu)


def lat_header(baseline: bool, cpu: bool = False) -> str:
    return LAT_HEADER + (LAT_BASELINE_HEADER if baseline else "") + _extra_header(baseline, cpu)


def _cpu_columns(
    result: BwResult | LatResult, baseline: bool, cpu: bool
) -> tuple[list[str], list[str]]:
    if not cpu:
        return [], []
    names, values = ["CPU cli/srv[usec/msg]"], [str(result.cpu or "-")]
    if baseline:
        names.append("raw CPU cli/srv[usec/msg]")
        values.append(str(result.raw_cpu or "-"))
    return names, values


def format_bw(result: BwResult, baseline: bool, cpu: bool = False) -> str:
    values = [
        str(result.size),
        str(result.iterations),
        f"{result.bw_peak:.2f}",
        f"{result.bw_average:.2f}",
        f"{result.msg_rate:.6f}",
    ]
    names = list(BW_COLUMNS)
    if baseline:
        names += ["raw TCP[MB/sec]", "ratio"]
        values += [f"{result.raw_bw or 0:.2f}", f"{result.ratio or 0:.2f}"]
    cpu_names, cpu_values = _cpu_columns(result, baseline, cpu)
    return _row(bw_header(baseline, cpu), names + cpu_names, values + cpu_values)


def format_lat(result: LatResult, baseline: bool, cpu: bool = False) -> str:
    values = [str(result.size), str(result.iterations)] + [
        f"{v:.2f}"
        for v in (
            result.t_min,
            result.t_max,
            result.t_typical,
            result.t_avg,
            result.t_stdev,
            result.p99,
            result.p999,
        )
    ]
    names = list(LAT_COLUMNS)
    if baseline:
        names += ["raw t_typical[usec]", "ratio"]
        values += [f"{result.raw_typical or 0:.2f}", f"{result.ratio or 0:.2f}"]
    cpu_names, cpu_values = _cpu_columns(result, baseline, cpu)
    return _row(lat_header(baseline, cpu), names + cpu_names, values + cpu_values)


def header_block(opts: BenchOptions, neg: Negotiated, layout: str) -> list[str]:
    """perftest's opening block: test name and the connection's parameters."""
    kind = "Latency" if opts.latency else "BW"
    title = f"{TEST_NAMES[opts.test]} {kind} Test"

    def pair(left: str, lval: object, right: str, rval: object) -> str:
        return f" {left:<16}: {lval!s:<14}{right:<15}: {rval}"

    def one(name: str, value: object) -> str:
        return f" {name:<16}: {value}"

    markers = f"{'ON' if neg.markers_tx else 'OFF'} (to server), "
    markers += f"{'ON' if neg.markers_rx else 'OFF'} (to client)"
    emss = opts.emss if opts.emss is not None else MpaSettings().emss
    return [
        RESULT_LINE,
        title.center(len(RESULT_LINE)).rstrip(),
        pair("Number of qps", opts.num_qps, "Transport type", TRANSPORT),
        pair("Connection type", "RC", "Using SRQ", "OFF"),
        pair("MPA revision", neg.rev, "CRC", "ON" if neg.crc else "OFF"),
        one("Markers", markers),
        one("Mtu", f"{emss}[B] (EMSS), MULPDU {neg.mulpdu}[B]"),
        one("TX depth", 1 if opts.latency else opts.tx_depth),
        one("Post list", opts.post_list),
        one("CQ Moderation", 1 if opts.latency else opts.cq_mod),
        one("Outstand reads", opts.ord if opts.test in ("read", "atomic") else "-"),
        one("Data ex. method", "MPA private data"),
        one("Server", layout),
        RESULT_LINE,
    ]


class Progress:
    """Progress of long runs on a stream (stderr): a line rewritten in place on a terminal,
    a line every few seconds otherwise; silent for runs shorter than ``delay`` seconds."""

    def __init__(self, stream: TextIO | None, *, delay: float = 1.0, interval: float = 0.5):
        self.stream = stream
        self.delay = delay
        self.interval = interval
        self.tty = bool(stream is not None and stream.isatty())
        self._label = ""
        self._total: int | None = None
        self._duration: float | None = None
        self._start = self._next = 0.0
        self._done = 0
        self._shown = False

    def start(self, label: str, total: int | None = None, duration: float | None = None) -> None:
        self._label, self._total, self._duration = label, total, duration
        self._start = time.perf_counter()
        self._next = self._start + self.delay
        self._done = 0
        self._shown = False

    def advance(self, count: int) -> None:
        self._done += count
        if self.stream is None:
            return
        now = time.perf_counter()
        if now < self._next:
            return
        self._next = now + (self.interval if self.tty else 5 * self.interval)
        elapsed = now - self._start
        if self._total:
            state = f"{self._done}/{self._total} ({100 * self._done // self._total}%)"
        else:
            state = f"{self._done} in {elapsed:.1f}/{self._duration or 0:.0f} s"
        text = f"bench: {self._label}: {state}"
        if self.tty:
            self.stream.write(f"\r{text}\x1b[K")
        else:
            self.stream.write(text + "\n")
        self.stream.flush()
        self._shown = True

    def note(self, text: str) -> None:
        if self.stream is not None:
            self.finish()
            self.stream.write(f"bench: {text}\n")
            self.stream.flush()

    def finish(self) -> None:
        if self.stream is not None and self._shown and self.tty:
            self.stream.write("\r\x1b[K")
            self.stream.flush()
        self._shown = False


# --------------------------------------------------------------------------- process helpers


def rss_bytes() -> int:
    """This process's resident set size (Linux /proc; ru_maxrss elsewhere)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def raise_nofile(wanted: int) -> int:
    """Raise RLIMIT_NOFILE's soft limit towards ``wanted`` (up to the hard limit)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):
            pass
    return soft if soft != resource.RLIM_INFINITY else wanted


async def _receive_exactly(stream: trio.abc.ReceiveStream, count: int) -> bytearray:
    buf = bytearray()
    while len(buf) < count:
        data = await stream.receive_some(count - len(buf))
        if not data:
            raise BenchError("raw TCP peer closed early")
        buf += data
    return buf


# --------------------------------------------------------------------------- server


class BenchServer:
    """The passive half: accepts QPs as :class:`SessionSpec` asks and serves raw TCP.

    ``crc``: request CRC (otherwise follow the client, which decides); ``markers``: want
    markers in FPDUs sent to the server.  :meth:`run` listens on ``port`` (0: any) for
    iWARP and on an ephemeral port for the raw-TCP baselines, and reports both through
    ``task_status``.
    """

    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        crc: bool = False,
        markers: bool = False,
        emss: int | None = None,
    ) -> None:
        self.host = host
        self.requested_port = port
        self.settings = _settings(CrcPolicy.REQUEST if crc else CrcPolicy.OFF, markers, emss)
        self.rnic = Rnic("bench-server")
        self.pd: ProtectionDomain = self.rnic.alloc_pd()
        self.port = 0
        self.raw_port = 0
        self.active = 0
        """QPs connected right now."""

    async def run(self, *, task_status: trio.TaskStatus[tuple[int, int]]) -> None:
        async with ConnectionManager.open(self.rnic) as cm:
            try:
                listener = await cm.listen(
                    self.host, self.requested_port, settings=self.settings, backlog=4096
                )
                raw = await trio.open_tcp_listeners(0, host=self.host)
            except OSError as exc:
                where = f"{self.host}:{self.requested_port}"
                raise BenchError(f"cannot listen on {where}: {exc}") from None
            self.port = listener.port
            self.raw_port = raw[0].socket.getsockname()[1]
            async with trio.open_nursery() as nursery:
                nursery.start_soon(trio.serve_listeners, self._raw_connection, raw)
                task_status.started((self.port, self.raw_port))
                async for request in listener:
                    nursery.start_soon(self._session, request)

    async def _session(self, request: ConnectRequest) -> None:
        try:
            spec = SessionSpec.decode(request.private_data)
        except BenchError as exc:
            await request.reject(str(exc).encode()[:200])
            return
        depth = max(spec.rx_depth, 1)
        cq = self.rnic.create_cq(depth + 2 * DEFAULT_TX_DEPTH)
        qp = self.rnic.create_qp(
            self.pd,
            cq,
            cap=QpCap(max_send_wr=1024, max_recv_wr=depth),
            ird=self.rnic.max_ird,
            ord=self.rnic.max_ord,
        )
        regions: list[MemoryRegion] = []
        advert = Advert(0, 0, 0, self.raw_port)
        target = source = inbox = None
        if spec.test != "idle":
            # ATOMIC_SIZE spare bytes: the advertised TO is 8-byte aligned (EXT-05).
            target = self.pd.reg_mr(bytearray(spec.size + ATOMIC_SIZE), REMOTE_ALL)
            regions.append(target)
            pad = (-target.addr) % ATOMIC_SIZE
            advert = Advert(target.rkey, target.base + pad, spec.size, self.raw_port)
            if spec.latency and spec.test in ("write", "send"):
                source = self.pd.reg_mr(bytearray(spec.size), Access.LOCAL_WRITE)
                regions.append(source)
            if spec.test == "send":
                inbox = self.pd.reg_mr(bytearray(spec.size), Access.LOCAL_WRITE)
                regions.append(inbox)
                qp.post_recv([RecvWR(0, (Sge(inbox.base, spec.size, inbox.lkey),))] * depth)
        try:
            conn = await request.accept(qp, advert.encode())
        except ConnectFailed:
            self.rnic.destroy_qp(qp)
            return
        self.active += 1
        try:
            async with trio.open_nursery() as nursery:
                if inbox is not None:
                    nursery.start_soon(self._serve_sends, qp, cq, inbox, source, spec)
                elif spec.test == "write" and spec.latency and target is not None:
                    assert source is not None and spec.pong is not None
                    nursery.start_soon(self._pong_writes, qp, target, pad, source, spec)
                await conn.wait_closed()
                nursery.cancel_scope.cancel()
        finally:
            self.active -= 1
            self.rnic.destroy_qp(qp)
            for mr in regions:
                _dereg(mr)

    @staticmethod
    async def _serve_sends(
        qp: QueuePair,
        cq: CompletionQueue,
        inbox: MemoryRegion,
        source: MemoryRegion | None,
        spec: SessionSpec,
    ) -> None:
        """Keep the receive queue full; in latency mode answer each Send with a Send."""
        recv = RecvWR(0, (Sge(inbox.base, spec.size, inbox.lkey),))
        echo = None
        if source is not None:
            echo = SendWR(0, WrOpcode.SEND, (Sge(source.base, spec.size, source.lkey),), 0)
        while True:
            first = await cq.next()
            received = 0
            for wc in [first, *cq.poll(len(cq))]:
                if wc.status is not WcStatus.SUCCESS:
                    return
                received += wc.opcode is WcOpcode.RECV
            if received:
                qp.post_recv([recv] * received)
                if echo is not None:
                    qp.post_send([echo] * received)

    @staticmethod
    async def _pong_writes(
        qp: QueuePair,
        target: MemoryRegion,
        pad: int,
        source: MemoryRegion,
        spec: SessionSpec,
    ) -> None:
        """Write latency: poll the last byte of the target, answer each ping with a Write."""
        assert spec.pong is not None
        rkey, to, _length = spec.pong
        last = pad + spec.size - 1
        tbuf, sbuf = target.buf, source.buf
        pong = SendWR(
            0,
            WrOpcode.RDMA_WRITE,
            (Sge(source.base, spec.size, source.lkey),),
            SendFlags.NONE,
            rkey=rkey,
            remote_addr=to,
        )
        expected = 1
        while True:
            try:
                await wait_for_byte(tbuf, last, expected, qp)
            except BenchError:
                return
            sbuf[spec.size - 1] = expected
            qp.post_send(pong)
            expected = expected % 255 + 1

    async def _raw_connection(self, stream: trio.SocketStream) -> None:
        """One raw-TCP baseline connection (see the header comment of _RAW_HEADER)."""
        try:
            header = await _receive_exactly(stream, _RAW_HEADER.size)
            magic, mode, size, request = _RAW_HEADER.unpack(header)
            if magic != _RAW_MAGIC:
                return
            if mode == RAW_SINK:
                total = 0
                while True:
                    data = await stream.receive_some(RECEIVE_SIZE)
                    if not data:
                        break
                    total += len(data)
                await stream.send_all(_U64.pack(total))
            elif mode == RAW_REQRESP and request > 0:
                reply = bytes(size)
                pending = 0
                while True:
                    data = await stream.receive_some(RECEIVE_SIZE)
                    if not data:
                        break
                    count, pending = divmod(pending + len(data), request)
                    for _ in range(count):
                        await stream.send_all(reply)
            elif mode == RAW_STATS:
                if size:  # asked to collect garbage first (memory figures)
                    gc.collect()
                stats = {
                    "rss": rss_bytes(),
                    "qps": self.active,
                    "pid": os.getpid(),
                    "cpu_ns": time.process_time_ns(),
                }
                await stream.send_all(json.dumps(stats).encode())
        except (BenchError, trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            pass
        finally:
            await trio.aclose_forcefully(stream)


async def wait_for_byte(buf: memoryview, index: int, value: int, qp: QueuePair) -> None:
    """Poll registered memory until ``buf[index] == value`` (a Write has landed).

    Busy-polls (a trio checkpoint per look, as perftest spins on memory) for SPIN_SECONDS,
    then looks every BACKOFF_SECONDS so an idle or starved process gives its CPU away.
    Raises BenchError when the QP leaves RTS.
    """
    spin_until = time.perf_counter() + SPIN_SECONDS
    while buf[index] != value:
        if qp.state not in _LIVE:
            raise BenchError(f"QP went to {qp.state.value} during Write ping-pong")
        await trio.sleep(0 if time.perf_counter() < spin_until else BACKOFF_SECONDS)


def _dereg(mr: MemoryRegion) -> None:
    try:
        mr.dereg()
    except BufferError:  # a queued message still views it; the GC frees it later
        pass


async def serve_forever(server: BenchServer, *, announce: TextIO, exit_on_stdin_eof: bool) -> None:
    """Run ``server``; print ``PORT <iwarp> <raw>``; with ``exit_on_stdin_eof``, stop at EOF."""
    async with trio.open_nursery() as nursery:
        port, raw_port = await nursery.start(server.run)
        announce.write(f"PORT {port} {raw_port}\n")
        announce.flush()
        if exit_on_stdin_eof:
            stdin = trio.lowlevel.FdStream(os.dup(sys.stdin.fileno()))
            async with stdin:
                while await stdin.receive_some(4096):
                    pass
            nursery.cancel_scope.cancel()


# --------------------------------------------------------------------------- client: QPs


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
            local = self.pd.reg_mr(bytearray(max(spec.size, ATOMIC_SIZE)), Access.LOCAL_WRITE)
        if spec.latency and spec.test == "write":
            pong = self.pd.reg_mr(bytearray(spec.size), REMOTE_ALL)
            spec = SessionSpec(spec.test, spec.size, True, 0, (pong.rkey, pong.base, spec.size))
        if spec.latency and spec.test == "send":
            inbox = self.pd.reg_mr(bytearray(spec.size), Access.LOCAL_WRITE)
            qp.post_recv([RecvWR(0, (Sge(inbox.base, spec.size, inbox.lkey),))] * 4)
        try:
            conn = await self.cm.connect(
                self.host, self.port, qp, private_data=spec.encode(), settings=settings
            )
        except IwarpError as exc:
            self.rnic.destroy_qp(qp)
            raise BenchError(f"cannot connect to {self.host}:{self.port}: {exc}") from None
        assert conn.negotiated is not None
        advert = Advert.decode(conn.negotiated.peer_private_data)
        self.raw_port = advert.raw_port
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
                    _dereg(mr)

    async def server_stats(self, *, collect: bool = False) -> dict[str, int]:
        """Ask the server for its RSS, live QP count, pid and CPU time (raw-TCP STATS).

        ``collect``: the server runs the garbage collector first (for memory figures).
        """
        stream = await _raw_open(self.host, self.raw_port, RAW_STATS, int(collect))
        async with stream:
            data = bytearray()
            while chunk := await stream.receive_some(4096):
                data += chunk
        try:
            return {k: int(v) for k, v in json.loads(data).items()}
        except (ValueError, AttributeError) as exc:
            raise BenchError(f"malformed server stats: {exc}") from None


def _check(wc_status: WcStatus, what: str) -> None:
    if wc_status is not WcStatus.SUCCESS:
        raise BenchError(f"{what} completed with status '{wc_status.value}'")


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
            batch = []
            for i in range(posted, posted + count):
                last = i + 1 == end
                batch.append(signalled(i) if last or (i + 1) % cq_mod == 0 else unsignalled)
            qp.post_send(batch)
            posted += count
        if end is not None and done >= end:
            break
        wcs = [await cq.next()]
        wcs += cq.poll(len(cq))
        before = done
        for wc in wcs:
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
            wc = await cq.next()
            t1 = clock()
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
            wc = await cq.next()
            t1 = clock()
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


# --------------------------------------------------------------------------- raw TCP baselines


async def _raw_open(host: str, port: int, mode: int, size: int = 0, request: int = 0):
    try:
        stream = await trio.open_tcp_stream(host, port)
    except OSError as exc:
        raise BenchError(f"cannot reach the raw-TCP port {host}:{port}: {exc}") from None
    await stream.send_all(_RAW_HEADER.pack(_RAW_MAGIC, mode, size, request))
    return stream


async def _raw_stream(
    stream: trio.SocketStream, size: int, count: int | None, deadline: float | None
) -> int:
    """Stream ``size``-byte messages, one send_all each; return the count once acknowledged."""
    message = bytes(size)
    sent = 0
    clock = time.perf_counter
    while (count is None or sent < count) and (deadline is None or clock() < deadline):
        await stream.send_all(message)
        sent += 1
    await stream.send_eof()
    acked = _U64.unpack(await _receive_exactly(stream, _U64.size))[0]
    if acked != sent * size:
        raise BenchError(f"raw TCP sink counted {acked} bytes, {sent * size} were sent")
    return sent


async def _raw_pipelined(
    stream: trio.SocketStream, size: int, depth: int, count: int | None, deadline: float | None
) -> int:
    """Request/response with ``depth`` outstanding requests; returns replies received."""
    clock = time.perf_counter
    target = count if count is not None else 1 << 62
    sent = min(depth, target)
    await stream.send_all(bytes(RAW_REQUEST * sent))
    received = 0
    done = 0
    while done < sent:
        data = await stream.receive_some(RECEIVE_SIZE)
        if not data:
            raise BenchError("raw TCP server closed during the request/response baseline")
        received += len(data)
        new_done = received // size
        more = new_done - done
        done = new_done
        if deadline is not None and target > sent and clock() >= deadline:
            target = sent
        more = min(more, target - sent)
        if more > 0:
            await stream.send_all(bytes(RAW_REQUEST * more))
            sent += more
    return done


async def raw_bandwidth(
    host: str, raw_port: int, opts: BenchOptions, size: int, messages: int
) -> float:
    """Baseline MB/s with ``num_qps`` TCP connections moving ``messages`` messages in all."""
    streaming = opts.test in ("write", "send")
    reply = ATOMIC_SIZE if opts.test == "atomic" else size
    n = opts.num_qps
    counts = [messages // n + (i < messages % n) for i in range(n)]
    streams = []
    for _ in range(n):
        if streaming:
            streams.append(await _raw_open(host, raw_port, RAW_SINK))
        else:
            streams.append(await _raw_open(host, raw_port, RAW_REQRESP, reply, RAW_REQUEST))
    done = [0] * n
    ends = [0.0] * n
    start = time.perf_counter()

    async def one(i: int) -> None:
        if streaming:
            done[i] = await _raw_stream(streams[i], size, counts[i], None)
        else:
            done[i] = await _raw_pipelined(streams[i], reply, opts.ord, counts[i], None)
        ends[i] = time.perf_counter()

    try:
        async with trio.open_nursery() as nursery:
            for i in range(n):
                nursery.start_soon(one, i)
    except (trio.BrokenResourceError, OSError) as exc:
        raise BenchError(f"raw TCP baseline failed: {exc}") from None
    finally:
        for s in streams:
            await trio.aclose_forcefully(s)
    return sum(done) * reply / (max(ends) - start) / MB


async def raw_latency(host: str, raw_port: int, opts: BenchOptions, size: int, count: int) -> float:
    """Baseline median latency (microseconds) of the same exchange, one at a time."""
    pingpong = opts.test in ("write", "send")
    reply = ATOMIC_SIZE if opts.test == "atomic" else size
    request = size if pingpong else RAW_REQUEST
    stream = await _raw_open(host, raw_port, RAW_REQRESP, reply, request)
    message = bytes(request)
    clock = time.perf_counter
    times = []
    try:
        for i in range(WARMUP_ITERS + count):
            t0 = clock()
            await stream.send_all(message)
            await _receive_exactly(stream, reply)
            t1 = clock()
            if i >= WARMUP_ITERS:
                times.append(t1 - t0)
    except (trio.BrokenResourceError, OSError) as exc:
        raise BenchError(f"raw TCP baseline failed: {exc}") from None
    finally:
        await trio.aclose_forcefully(stream)
    if pingpong:
        times = [t / 2 for t in times]
    return statistics.median(times) * 1e6


# --------------------------------------------------------------------------- orchestration


def _project_root() -> str:
    return str(Path(__file__).resolve().parents[2])


def server_command(crc: bool, markers: bool, emss: int | None) -> list[str]:
    """The spawned server half: ``iwarp bench server`` (run as ``python -m stack.cli.iwarp``)."""
    cmd = [sys.executable, "-m", "stack.cli.iwarp", "bench", "server", "--port", "0"]
    cmd += ["--host", "127.0.0.1", "--exit-on-stdin-eof", "--crc" if crc else "--no-crc"]
    if markers:
        cmd.append("--markers")
    if emss is not None:
        cmd += ["--mtu", str(emss)]
    return cmd


@asynccontextmanager
async def server_for(
    mode: str, *, host: str, port: int, crc: bool, markers: bool, emss: int | None
) -> AsyncIterator[tuple[str, int, str]]:
    """The server half for a run: (host, port, description of the layout)."""
    if mode == "connect":
        yield host, port, f"{host}:{port} (run by hand)"
        return
    if mode == "in-process":
        server = BenchServer(crc=crc, markers=markers, emss=emss)
        async with trio.open_nursery() as nursery:
            iwarp_port, _raw = await nursery.start(server.run)
            yield "127.0.0.1", iwarp_port, "in this process"
            nursery.cancel_scope.cancel()
        return
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [_project_root(), env.get("PYTHONPATH")]))
    proc = await trio.lowlevel.open_process(
        server_command(crc, markers, emss),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env=env,
    )
    assert proc.stdin is not None and proc.stdout is not None
    try:
        line = bytearray()
        with trio.move_on_after(60):
            while not line.endswith(b"\n"):
                chunk = await proc.stdout.receive_some(1)
                if not chunk:
                    break
                line += chunk
        words = line.split()
        if len(words) != 3 or words[0] != b"PORT":
            raise BenchError("the server process did not start (see its error above)")
        yield "127.0.0.1", int(words[1]), f"127.0.0.1:{int(words[1])} (process {proc.pid})"
    finally:
        with trio.CancelScope(shield=True):
            await proc.stdin.aclose()
            with trio.move_on_after(10):
                await proc.wait()
            if proc.returncode is None:
                proc.kill()
                await proc.wait()


async def run_benchmark(
    opts: BenchOptions, out: TextIO | None = None, err: TextIO | None = None
) -> list[BwResult | LatResult]:
    """Run ``opts`` end to end: tables on ``out`` (stdout), progress on ``err`` (stderr)."""
    out = out or sys.stdout
    progress = Progress((err or sys.stderr) if opts.progress else None)
    results: list[BwResult | LatResult] = []
    async with server_for(
        opts.mode,
        host=opts.host,
        port=opts.port,
        crc=opts.crc,
        markers=opts.markers,
        emss=opts.emss,
    ) as (host, port, layout):
        async with ConnectionManager.open(Rnic("bench-client")) as cm:
            client = Client(cm, host, port)
            tx_depth = 1 if opts.latency else opts.tx_depth
            printed = shared = False
            for size in opts.sizes:
                spec = SessionSpec(
                    opts.test,
                    size,
                    opts.latency,
                    opts.rx_depth_for(size) if opts.test == "send" and not opts.latency else 0,
                )
                qps = await client.connect_many(
                    spec, opts.mpa_settings, opts.num_qps, tx_depth=tx_depth, ord=opts.ord
                )
                if not printed:
                    neg = qps[0].conn.negotiated
                    assert neg is not None
                    lines = header_block(opts, neg, layout)
                    header = lat_header if opts.latency else bw_header
                    lines.append(header(opts.baseline, opts.cpu))
                    out.write("\n".join(lines) + "\n")
                    out.flush()
                    printed = True
                    if opts.cpu:
                        shared = (await client.server_stats())["pid"] == os.getpid()
                try:
                    result: BwResult | LatResult
                    meter = CpuMeter(client, shared) if opts.cpu else None
                    if meter:
                        await meter.start()
                    if opts.latency:
                        result = await measure_lat(qps[0], opts, size, progress)
                    else:
                        result = await measure_bw(qps, opts, size, progress)
                    if meter:
                        result = replace(result, cpu=await meter.stop(_messages(result)))
                finally:
                    await client.close(qps)
                if opts.baseline:
                    meter = CpuMeter(client, shared) if opts.cpu else None
                    if meter:
                        await meter.start()
                    if isinstance(result, LatResult):
                        count = result.iterations
                        raw = await raw_latency(host, client.raw_port, opts, size, count)
                        result = replace(result, raw_typical=raw)
                    else:
                        count = result.messages
                        raw = await raw_bandwidth(host, client.raw_port, opts, size, count)
                        result = replace(result, raw_bw=raw)
                    if meter:
                        result = replace(result, raw_cpu=await meter.stop(_messages(result)))
                results.append(result)
                if isinstance(result, LatResult):
                    out.write(format_lat(result, opts.baseline, opts.cpu) + "\n")
                else:
                    out.write(format_bw(result, opts.baseline, opts.cpu) + "\n")
                out.flush()
            out.write(RESULT_LINE + "\n")
            out.flush()
    return results


def _messages(result: BwResult | LatResult) -> int:
    """Messages (latency: round trips, warm-up included) a CPU measurement covers."""
    if isinstance(result, LatResult):
        return result.iterations + WARMUP_ITERS
    return result.messages


class CpuMeter:
    """CPU time of both processes across one measurement (``--cpu``)."""

    def __init__(self, client: Client, shared: bool) -> None:
        self.client = client
        self.shared = shared
        self._own = 0
        self._server = 0

    async def _server_ns(self) -> int:
        return 0 if self.shared else (await self.client.server_stats())["cpu_ns"]

    async def start(self) -> None:
        self._server = await self._server_ns()
        self._own = time.process_time_ns()

    async def stop(self, messages: int) -> CpuCost:
        own = time.process_time_ns() - self._own
        server = await self._server_ns() - self._server
        per = 1e-3 / max(messages, 1)
        return CpuCost(own * per, None if self.shared else server * per)


async def run_idle_qps(
    count: int,
    *,
    mode: str,
    host: str,
    port: int,
    crc: bool,
    markers: bool,
    out: TextIO | None = None,
    err: TextIO | None = None,
    progress: bool = True,
    parallel: int = 32,
) -> IdleResult:
    """Connect ``count`` idle QPs to one server process and report its RSS growth per QP."""
    out = out or sys.stdout
    report = Progress((err or sys.stderr) if progress else None)
    settings = _settings(CrcPolicy.REQUEST if crc else CrcPolicy.OFF, markers, None)
    spec = SessionSpec("idle", 0)
    async with server_for(mode, host=host, port=port, crc=crc, markers=markers, emss=None) as (
        host,
        port,
        layout,
    ):
        async with ConnectionManager.open(Rnic("bench-client")) as cm:
            client = Client(cm, host, port)
            # One QP first: the server's lazily built state (imports, caches) is not per QP.
            warm = await client.connect_many(spec, settings, 1, tx_depth=1, ord=1)
            await trio.sleep(0.1)
            before = await client.server_stats(collect=True)
            gc.collect()
            client_before = rss_bytes()
            report.start(f"connecting {count} idle QPs", count)
            qps = await client.connect_many(
                spec, settings, count, tx_depth=1, ord=1, parallel=parallel, progress=report
            )
            report.finish()
            await trio.sleep(0.2)  # let the last handshakes' buffers go
            after = await client.server_stats(collect=True)
            gc.collect()
            client_after = rss_bytes()
            if after["qps"] != count + 1:
                raise BenchError(f"server reports {after['qps']} QPs, expected {count + 1}")
            result = IdleResult(
                count,
                before["rss"],
                after["rss"],
                client_before,
                client_after,
                after["pid"] == os.getpid(),
            )
            await client.close(warm + qps)
    for line in format_idle(result, layout):
        out.write(line + "\n")
    out.flush()
    return result


IDLE_HEADER = (
    " #qps     server RSS before[KiB]   server RSS after[KiB]   per QP[KiB]   client per QP[KiB]"
)
IDLE_COLUMNS = (
    "#qps",
    "server RSS before[KiB]",
    "server RSS after[KiB]",
    "per QP[KiB]",
    "client per QP[KiB]",
)


def format_idle(r: IdleResult, layout: str) -> list[str]:
    lines = [
        RESULT_LINE,
        "Idle QP memory".center(len(RESULT_LINE)).rstrip(),
        f" {'Transport type':<16}: {TRANSPORT}",
        f" {'Server':<16}: {layout}",
        f" {'Method':<16}: server RSS growth over {r.qps} idle connected QPs / {r.qps}",
    ]
    if r.shared_process:
        lines.append(f" {'Note':<16}: client and server share one process: both ends counted")
    values = [
        str(r.qps),
        str(r.server_before // 1024),
        str(r.server_after // 1024),
        f"{r.per_qp / 1024:.2f}",
        f"{r.client_per_qp / 1024:.2f}",
    ]
    lines += [RESULT_LINE, IDLE_HEADER, _row(IDLE_HEADER, IDLE_COLUMNS, values), RESULT_LINE]
    return lines


# --------------------------------------------------------------------------- CLI


def parse_size(text: str) -> int:
    """``65536``, ``64K``, ``1M``, ``1MiB`` -> bytes (binary suffixes)."""
    return binary_size(text, MAX_SIZE, unit=" bytes")


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid integer {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {text}")
    return value


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid number {text!r}") from None
    if not value > 0 or math.isinf(value):
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value


def _emss(text: str) -> int:
    value = _positive_int(text)
    if not 64 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"EMSS must be 64 to 65535, got {text}")
    return value


def parse_host_port(text: str) -> tuple[str, int]:
    """``HOST``, ``HOST:PORT`` or ``[V6]:PORT``; the port defaults to perftest's 18515."""
    host, port = text, DEFAULT_PORT
    if text.startswith("["):
        end = text.find("]")
        if end < 0:
            raise argparse.ArgumentTypeError(f"invalid address {text!r}")
        host, rest = text[1:end], text[end + 1 :]
        if rest:
            if not rest.startswith(":"):
                raise argparse.ArgumentTypeError(f"invalid address {text!r}")
            port = port_number(rest[1:])
    elif text.count(":") == 1:
        host, port_text = text.split(":")
        port = port_number(port_text)
    if not host:
        raise argparse.ArgumentTypeError(f"invalid address {text!r}")
    return host, port


def _add_mpa_arguments(parser: argparse.ArgumentParser, crc_default: bool, who: str) -> None:
    parser.add_argument(
        "--crc",
        action=argparse.BooleanOptionalAction,
        default=crc_default,
        help=f"MPA CRC32c ({who}; CRC is on when either side asks)",
    )
    parser.add_argument(
        "--markers", action="store_true", help="MPA markers (both directions when both sides ask)"
    )
    parser.add_argument(
        "-m",
        "--mtu",
        type=_emss,
        metavar="EMSS",
        help="EMSS the MULPDU is derived from (default: the stack's, 1448)",
    )


def add_test_arguments(parser: argparse.ArgumentParser, test: str) -> None:
    sizes = parser.add_mutually_exclusive_group()
    sizes.add_argument(
        "-s",
        "--size",
        type=parse_size,
        help="message size in bytes, K/M suffixes allowed (default 65536; atomic: 8)",
    )
    sizes.add_argument("-a", "--all", action="store_true", help="all sizes from 2 to 2^23")
    count = parser.add_mutually_exclusive_group()
    count.add_argument(
        "-n",
        "--iters",
        type=_positive_int,
        help="iterations per size (default 5000 bandwidth / 1000 latency, "
        "fewer for big messages: about 256 / 64 MiB per size)",
    )
    count.add_argument(
        "-D", "--duration", type=_positive_float, metavar="SECONDS", help="run for SECONDS per size"
    )
    parser.add_argument(
        "-q", "--qps", type=_positive_int, default=1, help="number of QPs (default 1)"
    )
    parser.add_argument(
        "--post-list",
        type=_positive_int,
        default=1,
        metavar="N",
        help="post N WRs per post_send (default 1)",
    )
    parser.add_argument(
        "--cq-mod",
        type=_positive_int,
        metavar="N",
        help=f"signal every Nth WR (default {DEFAULT_CQ_MOD}, at most the tx depth)",
    )
    parser.add_argument(
        "-t",
        "--tx-depth",
        type=_positive_int,
        default=DEFAULT_TX_DEPTH,
        help=f"WRs outstanding per QP (default {DEFAULT_TX_DEPTH})",
    )
    parser.add_argument(
        "--rx-depth",
        type=_positive_int,
        metavar="N",
        help="receives the server keeps posted for Sends (default: enough for the size)",
    )
    _add_mpa_arguments(parser, True, "requested by the client; default on")
    parser.add_argument("--lat", action="store_true", help="latency test (perftest's *_lat)")
    parser.add_argument(
        "--baseline", action="store_true", help="also run raw trio TCP and print the ratio"
    )
    parser.add_argument(
        "--cpu",
        action="store_true",
        help="also print the CPU time per message of client and server (perftest --cpu_util)",
    )
    where = parser.add_mutually_exclusive_group()
    where.add_argument(
        "--server", action="store_true", help="run the server half here (as `iwarp bench server`)"
    )
    where.add_argument(
        "--connect",
        type=parse_host_port,
        metavar="HOST[:PORT]",
        help="run the client half against a server started by hand",
    )
    where.add_argument(
        "--in-process", action="store_true", help="run server and client in this process"
    )
    parser.add_argument(
        "-p",
        "--port",
        type=port_number,
        default=DEFAULT_PORT,
        help=f"--server: port to listen on (default {DEFAULT_PORT})",
    )
    parser.add_argument(
        "--host", default="127.0.0.1", help="--server: address to listen on (default 127.0.0.1)"
    )
    parser.add_argument("--quiet", action="store_true", help="no progress on stderr")
    one_line_errors(parser)


def options_from_args(args: argparse.Namespace, test: str) -> BenchOptions:
    """Check the combination of arguments; raises CliError with one clear line."""
    if test == "atomic":
        if args.all:
            raise CliError("atomic operations are 8 bytes: -a does not apply")
        if args.size not in (None, ATOMIC_SIZE):
            raise CliError(f"atomic operations are 8 bytes: -s {args.size} does not apply")
        sizes: tuple[int, ...] = (ATOMIC_SIZE,)
    elif args.all:
        sizes = ALL_SIZES
    else:
        sizes = (args.size or 65536,)
    tx_depth = args.tx_depth
    if args.lat:
        if args.qps != 1:
            raise CliError("--lat measures one QP: -q must be 1")
        if args.post_list != 1:
            raise CliError("--post-list applies to bandwidth tests, not --lat")
        if args.cq_mod is not None:
            raise CliError("--cq-mod applies to bandwidth tests, not --lat")
    if args.post_list > tx_depth:
        raise CliError(f"--post-list {args.post_list} exceeds the tx depth {tx_depth}")
    if args.cq_mod is not None and args.cq_mod > tx_depth:
        raise CliError(f"--cq-mod {args.cq_mod} exceeds the tx depth {tx_depth}")
    cq_mod = args.cq_mod if args.cq_mod is not None else min(DEFAULT_CQ_MOD, tx_depth)
    if args.rx_depth is not None and test != "send":
        raise CliError("--rx-depth applies to the send test")
    if args.connect is not None:
        mode, (host, port) = "connect", args.connect
    elif args.in_process:
        mode, host, port = "in-process", "127.0.0.1", 0
    else:
        mode, host, port = "spawn", "127.0.0.1", 0
    return BenchOptions(
        test=test,
        sizes=sizes,
        iters=args.iters,
        duration=args.duration,
        num_qps=args.qps,
        post_list=args.post_list,
        cq_mod=cq_mod,
        tx_depth=tx_depth,
        rx_depth=args.rx_depth,
        crc=args.crc,
        markers=args.markers,
        emss=args.mtu,
        latency=args.lat,
        baseline=args.baseline,
        cpu=args.cpu,
        mode=mode,
        host=host,
        port=port,
        progress=not args.quiet,
    )


def add_server_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)"
    )
    parser.add_argument(
        "-p",
        "--port",
        type=port_number,
        default=DEFAULT_PORT,
        help=f"iWARP port (default {DEFAULT_PORT}; 0: any)",
    )
    _add_mpa_arguments(parser, False, "default off: the client decides")
    parser.add_argument("--exit-on-stdin-eof", action="store_true", help=argparse.SUPPRESS)
    one_line_errors(parser)


def add_idle_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "-q",
        "--qps",
        type=_positive_int,
        default=DEFAULT_IDLE_QPS,
        help=f"idle QPs to connect (default {DEFAULT_IDLE_QPS})",
    )
    where = parser.add_mutually_exclusive_group()
    where.add_argument(
        "--connect",
        type=parse_host_port,
        metavar="HOST[:PORT]",
        help="measure a server started by hand",
    )
    where.add_argument(
        "--in-process", action="store_true", help="server in this process (counts both ends)"
    )
    parser.add_argument(
        "--crc", action=argparse.BooleanOptionalAction, default=True, help="MPA CRC32c (default on)"
    )
    parser.add_argument("--markers", action="store_true", help="MPA markers")
    parser.add_argument("--quiet", action="store_true", help="no progress on stderr")
    parser.add_argument(
        "--parallel",
        type=_positive_int,
        default=32,
        help="connections set up at a time (default 32)",
    )
    one_line_errors(parser)


def _fail(prog: str, exc: BaseException) -> int:
    print(f"{prog}: error: {exc}", file=sys.stderr)
    return 1


def run_test_command(args: argparse.Namespace) -> int:
    test = args.bench_test
    if args.server:
        server = BenchServer(
            host=args.host, port=args.port, crc=args.crc, markers=args.markers, emss=args.mtu
        )
        return _serve(server, False)
    opts = options_from_args(args, test)
    try:
        trio_run(run_benchmark, opts)
    except (BenchError, IwarpError, OSError) as exc:
        return _fail(f"iwarp bench {test}", exc)
    return 0


def run_server_command(args: argparse.Namespace) -> int:
    server = BenchServer(
        host=args.host, port=args.port, crc=args.crc, markers=args.markers, emss=args.mtu
    )
    return _serve(server, args.exit_on_stdin_eof)


def _serve(server: BenchServer, exit_on_stdin_eof: bool) -> int:
    raise_nofile(1 << 20)
    try:
        trio_run(
            lambda: serve_forever(server, announce=sys.stdout, exit_on_stdin_eof=exit_on_stdin_eof)
        )
    except (BenchError, IwarpError, OSError) as exc:
        return _fail("iwarp bench server", exc)
    return 0


def run_idle_command(args: argparse.Namespace) -> int:
    count = args.qps
    fds_per_qp = 2 if args.in_process else 1
    limit = raise_nofile(count * fds_per_qp + 256)
    usable = (limit - 256) // fds_per_qp
    if usable < count:
        print(
            f"iwarp bench idle-qps: RLIMIT_NOFILE allows {limit} descriptors: "
            f"measuring {usable} QPs",
            file=sys.stderr,
        )
        count = max(1, usable)
    if args.connect is not None:
        mode, (host, port) = "connect", args.connect
    else:
        mode, host, port = ("in-process" if args.in_process else "spawn"), "127.0.0.1", 0

    async def main() -> None:
        await run_idle_qps(
            count,
            mode=mode,
            host=host,
            port=port,
            crc=args.crc,
            markers=args.markers,
            parallel=args.parallel,
            progress=not args.quiet,
        )

    try:
        trio_run(main)
    except (BenchError, IwarpError, OSError) as exc:
        return _fail("iwarp bench idle-qps", exc)
    return 0


def register_bench(subparsers: argparse._SubParsersAction) -> None:
    """Add ``write``, ``read``, ``send``, ``atomic``, ``server`` and ``idle-qps``."""
    for test in TESTS:
        parser = subparsers.add_parser(
            test,
            help=f"{TEST_NAMES[test]} bandwidth or latency (perftest ib_{test}_bw/_lat)",
            description=f"{TEST_NAMES[test]} benchmark over the software RNIC, perftest style.",
        )
        add_test_arguments(parser, test)
        parser.set_defaults(func=run_test_command, bench_test=test)
    server = subparsers.add_parser(
        "server",
        help="the server half of the RDMA benchmarks",
        description="Serve `iwarp bench write|read|send|atomic|idle-qps` clients (and raw TCP "
        "baselines); prints `PORT <iwarp> <raw>`.",
    )
    add_server_arguments(server)
    server.set_defaults(func=run_server_command)
    idle = subparsers.add_parser(
        "idle-qps",
        help="memory of idle connected QPs (server RSS growth per QP)",
        description="Connect N idle QPs to one server process; report its RSS growth / N.",
    )
    add_idle_arguments(idle)
    idle.set_defaults(func=run_idle_command)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m stack.bench.rdma write|read|send|atomic|server|idle-qps ...``."""
    parser = argparse.ArgumentParser(prog="iwarp bench", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="benchmark", metavar="BENCHMARK")
    sub.required = True
    register_bench(sub)
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except CliError as exc:
        print(f"iwarp bench {args.benchmark}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("iwarp bench: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
