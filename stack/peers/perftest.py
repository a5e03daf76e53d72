"""``iwarp bench ib_write_bw|ib_read_bw|ib_send_bw``: perftest's ``-R`` peers on our stack.

Either side of perftest's bandwidth tests with ``-R`` (rdma_cm), so the other side can be
the real perftest, for example on Linux siw.  The command line follows perftest's: no
address makes a server, an address makes a client, and both sides take the same options::

    iwarp bench ib_write_bw -R -n 5 -s 4096              # like `ib_write_bw -R -n 5 -s 4096`
    iwarp bench ib_write_bw -R -n 5 -s 4096 10.0.2.15    # client of a perftest server

``-R`` is accepted and implied (rdma_cm is the only exchange iWARP can use).  As with
perftest, give both sides the same ``-s``/``-a``/``-n``/``-q`` (and ``-r`` if any): the
server never learns them from the client.  It sizes its buffer by ``-s`` (Write/Read target,
Send receives) and an ``ib_send_bw`` server counts ``-n`` x ``-q`` receives.

Protocol, as perftest 4.5+0.17 (Debian 12; it reports version 6.06) speaks it.  Learned
from perftest's sources and from captures of siw <-> siw runs; no perftest code here.

* Connections.  All go to the server's one port (default 18515).  First the *exchange*
  connection (MPA Rev 2, IRD=ORD=0, no ULP private data), then one *data* connection per
  QP (IRD=ORD=``-o`` for ``ib_read_bw``, else 0; no private data).  perftest's server
  closes its listener after the exchange connection and listens again only after the first
  sync below, so clients retry (perftest: 10 tries 100 ms apart).  This server keeps
  listening throughout.
* Exchange messages are Sends on the exchange connection, strictly alternating: the client
  Sends, the server receives and answers with a message of the same layout.  perftest keeps
  ONE receive posted, so no side may Send twice in a row (iWARP has no RNR retry).  Each
  exchange in order (:func:`script`, :func:`message_sizes`):

  - HELLO: version (16 bytes, ASCII, NUL-padded: "6.06"; a peer below 5.70 is refused, as
    perftest does); cycle buffer = page size (BE i32); cache line size (BE i32); both sides
    keep the larger values; MTU (2 bytes: the ``ibv_mtu`` enum in decimal ASCII and a NUL;
    siw on a 1500-byte netdev sends "3").
  - SYNC: ``ctx_hand_shake``, one ``struct pingpong_dest`` (:class:`PingpongDest`, 56
    bytes, big-endian): all zeros before the data QPs exist, then QP 0's.
  - DESTS: one hand shake per QP with that QP's pingpong_dest: its QPN, a random PSN, the
    rkey and address of the buffer the peer targets (the Write/Read region; for
    ``ib_send_bw`` on iWARP the *credit* slot), ``out_reads``.
  - REPORTS (``ib_write_bw``/``ib_read_bw``): the client's result as five Sends, size (BE
    u64), iterations (BE u64), BW peak, BW average (MB/s, MB = 2^20), message rate (Mpps),
    the last three big-endian IEEE-754 doubles.  perftest's server answers with
    uninitialised memory; this one answers with zeros.

  ``ib_write_bw``/``ib_read_bw``: HELLO, SYNC(0), connect, SYNC(0), DESTS, DESTS, SYNC,
  run, SYNC, REPORTS, SYNC.  ``ib_send_bw``: HELLO, SYNC(0), connect, SYNC(0), DESTS,
  SYNC, DESTS, SYNC (the server has posted its receives), run, SYNC.  With ``-a`` a Write
  or Read client runs every size back to back; a Send pair brackets each size with SYNCs.
* The run.  Write/Read: the client keeps ``-t`` WRs outstanding, every ``-Q``-th and the
  last signalled, all at the address the server advertised (perftest cycles through a
  page there; we stay at offset 0); the server does nothing.  Send (iWARP has no RNR
  retry, so perftest adds credits): the server keeps receives posted and, whenever its
  receive count ``n`` per QP has ``(n % rx_depth) % (rx_depth // 3) == 0``, RDMA-Writes
  ``n`` as a 4-byte LITTLE-endian u32 (x86 host order: perftest writes its memory as is)
  to the client's credit slot; the client keeps ``posted + 1 - credit < rx_depth`` and
  zeroes its credits before each size.  ``rx_depth`` is perftest's: ``min(-r, -n)``
  (default ``-r`` 512), plus one when odd (single size only).  This server keeps at least
  512 receives posted and credits every ``max(1, rx_depth // 3)``.
* The end: after the last SYNC the client disconnects its data connections, then the
  exchange connection; the server does the same.

siw stalls an FPDU that arrives right after its MPA Reply (siw-vm pitfall 3), so a client
waits ``--first-fpdu-delay`` (0.2 s) after each connection before its first FPDU on it
(perftest's own ``ib_write_bw`` client sleeps 1 s after the exchange connection).
"""

from __future__ import annotations

import argparse
import mmap
import random
import re
import struct
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import NoReturn, TextIO

import trio

from stack.bench.rdma import (
    ALL_SIZES,
    MB,
    RESULT_LINE,
    BwResult,
    bw_header,
    format_bw,
    parse_size,
    peak_rate,
)
from stack.cli import CliError, port_number, positive_int, trio_run
from stack.errors import IwarpError, lone_exception
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
    WcStatus,
    WrOpcode,
)
from stack.rnic.memory import MemoryRegion, ProtectionDomain
from stack.transport.cm import ConnectFailed, ConnectionManager, ConnectRejected, Listener
from stack.transport.driver import RdmaConnection
from stack.wire.events import CrcPolicy, MpaSettings

PERFTEST_VERSION = "6.06"
"""What perftest 4.5+0.17 sends as its version (configure.ac's AC_INIT)."""
MIN_PEER_VERSION = 5.70
"""perftest refuses peers older than this (``check_version_compatibility``)."""
DEFAULT_PORT = 18515
VERSION_LEN = 16
"""``MAX_VERSION``: the version string's buffer, sent whole."""
DEST = struct.Struct(">5I4xQ16s2I")
"""``struct pingpong_dest`` with perftest's byte swapping (HAVE_ENDIAN): lid, out_reads,
qpn, psn, rkey, (4 bytes of x86-64 padding, uninitialised), vaddr, gid, srqn, gid_index."""
SYS_INT = struct.Struct(">i")
"""cycle buffer and cache line size (``hton_int``)."""
MTU_LEN = 2
"""perftest >= 5.31 sends 2 bytes of ``sprintf("%d", mtu_enum)``."""
IB_MTU_1024 = 3
"""The ``ibv_mtu`` value siw reports on a 1500-byte netdev, and ours."""
REPORT_U64 = struct.Struct(">Q")
REPORT_F64 = struct.Struct(">d")
CREDIT = struct.Struct("<I")
"""A Send credit: perftest's receive count, as a u32 in (x86) host order."""
REPORT_FIELDS = 5

MAX_SIZE = 1 << 23
"""``-a`` sizes go up to 8 MiB and buffers are sized for it (perftest's MAX_SIZE)."""
DEFAULT_SIZE = 65536
DEFAULT_TX_DEPTH = 128
DEFAULT_RX_SEND = 512
DEFAULT_CQ_MOD = 100
CQ_MOD_SIZE_LIMIT = 8192
"""perftest signals every WR above this size unless ``-Q`` (or ``-a``) says otherwise."""
DEFAULT_ITERS = {"write": 5000, "read": 1000, "send": 1000}
CACHE_LINE = 64
MAX_DEVICE_READS = Rnic().max_ord
CONNECT_RETRY_SECONDS = 0.1
CREDIT_POLL_SECONDS = 0.0005
WATCH_SECONDS = 0.5
"""How often a side waiting for an exchange message looks at its data connections."""
COMM_SLOTS = 4
COMM_SLOT_LEN = 64
"""Receives of the exchange connection (perftest's messages are at most 56 bytes)."""
FIRST_FPDU_DELAY = 0.2
TESTS = ("write", "read", "send")
TEST_NAMES = {"write": "RDMA_Write", "read": "RDMA_Read", "send": "Send"}
OPCODES = {"write": WrOpcode.RDMA_WRITE, "read": WrOpcode.RDMA_READ, "send": WrOpcode.SEND}
REMOTE_RW = Access.LOCAL_WRITE | Access.REMOTE_WRITE | Access.REMOTE_READ


class PerftestError(Exception):
    """The perftest exchange failed (malformed message, refused peer, timeout, error WC)."""


# --------------------------------------------------------------------------- wire formats


@dataclass(frozen=True, slots=True)
class PingpongDest:
    """perftest's ``struct pingpong_dest`` (56 bytes big-endian on the wire, :data:`DEST`).

    Fields: lid, out_reads, qpn, psn, rkey, vaddr, gid (16 bytes), srqn, gid_index.  srqn and
    gid_index are not read by perftest's receiver.
    """

    lid: int = 0
    out_reads: int = 0
    qpn: int = 0
    psn: int = 0
    rkey: int = 0
    vaddr: int = 0
    gid: bytes = bytes(16)
    srqn: int = 0
    gid_index: int = 0

    def encode(self) -> bytes:
        """56 bytes, the padding zeroed."""
        try:
            return DEST.pack(
                self.lid,
                self.out_reads,
                self.qpn,
                self.psn,
                self.rkey,
                self.vaddr,
                self.gid,
                self.srqn,
                self.gid_index,
            )
        except struct.error as exc:
            raise PerftestError(f"pingpong_dest field out of range: {exc}") from None

    @classmethod
    def decode(cls, data: bytes) -> PingpongDest:
        """Parse exactly 56 bytes; the padding (bytes 20-23) is ignored."""
        if len(data) != DEST.size:
            raise PerftestError(
                f"expected a {DEST.size}-byte pingpong_dest, the peer sent {len(data)} bytes"
            )
        lid, out_reads, qpn, psn, rkey, vaddr, gid, srqn, gid_index = DEST.unpack(data)
        return cls(lid, out_reads, qpn, psn, rkey, vaddr, gid, srqn, gid_index)


ZERO_DEST = PingpongDest()


def encode_version(version: str = PERFTEST_VERSION) -> bytes:
    """The 16-byte version message (ASCII, NUL-padded)."""
    raw = version.encode("ascii")
    if len(raw) >= VERSION_LEN:
        raise PerftestError(f"version {version!r} does not fit in {VERSION_LEN - 1} bytes")
    return raw.ljust(VERSION_LEN, b"\0")


def decode_version(data: bytes) -> tuple[str, float]:
    """(the version text, its value as C's ``atof`` reads it: 0.0 when not a number)."""
    if len(data) != VERSION_LEN:
        raise PerftestError(f"expected the {VERSION_LEN}-byte version, got {len(data)} bytes")
    text = data.split(b"\0", 1)[0].decode("ascii", "replace")
    match = re.match(r"\s*([-+]?(?:\d+\.?\d*|\.\d+))", text)
    return text, float(match.group(1)) if match else 0.0


def check_peer_version(value: float, text: str) -> None:
    """Refuse a peer perftest itself would refuse (``check_version_compatibility``)."""
    if value < MIN_PEER_VERSION:
        raise PerftestError(
            f"peer perftest version {text!r} is older than {MIN_PEER_VERSION:.2f}: "
            "not compatible (perftest refuses it too)"
        )


def encode_sys_int(value: int) -> bytes:
    try:
        return SYS_INT.pack(value)
    except struct.error as exc:
        raise PerftestError(f"value {value} does not fit in 32 bits") from exc


def decode_sys_int(data: bytes, what: str) -> int:
    if len(data) != SYS_INT.size:
        raise PerftestError(f"expected the 4-byte {what}, got {len(data)} bytes")
    (value,) = SYS_INT.unpack(data)
    return value


def encode_mtu(mtu_enum: int = IB_MTU_1024) -> bytes:
    """``sprintf("%d")`` of the MTU enum, truncated to 2 bytes (a NUL after one digit)."""
    return f"{mtu_enum}".encode().ljust(MTU_LEN, b"\0")[:MTU_LEN]


def decode_mtu(data: bytes) -> int:
    """The peer's MTU enum (``strtol``: 0 when not a number)."""
    if not data or len(data) > 4:
        raise PerftestError(f"expected the {MTU_LEN}-byte MTU, got {len(data)} bytes")
    match = re.match(rb"\s*(\d+)", data.split(b"\0", 1)[0])
    return int(match.group(1)) if match else 0


@dataclass(frozen=True, slots=True)
class BwReport:
    """``struct bw_report_data`` as ``xchg_bw_reports`` sends it (five Sends, big-endian).

    Fields: size (bytes), iters, bw_peak, bw_avg (MB/s, 2^20), msg_rate (Mpps).
    """

    size: int = 0
    iters: int = 0
    bw_peak: float = 0.0
    bw_avg: float = 0.0
    msg_rate: float = 0.0

    def encode(self) -> list[bytes]:
        try:
            return [
                REPORT_U64.pack(self.size),
                REPORT_U64.pack(self.iters),
                REPORT_F64.pack(self.bw_peak),
                REPORT_F64.pack(self.bw_avg),
                REPORT_F64.pack(self.msg_rate),
            ]
        except struct.error as exc:
            raise PerftestError(f"report field out of range: {exc}") from None

    @classmethod
    def decode(cls, parts: Sequence[bytes]) -> BwReport:
        if len(parts) != REPORT_FIELDS or any(len(p) != 8 for p in parts):
            raise PerftestError(f"malformed bandwidth report: sizes {[len(p) for p in parts]}")
        (size,), (iters,) = REPORT_U64.unpack(parts[0]), REPORT_U64.unpack(parts[1])
        peak, avg, rate = (REPORT_F64.unpack(p)[0] for p in parts[2:])
        return cls(size, iters, peak, avg, rate)


def encode_credit(received: int) -> bytes:
    return CREDIT.pack(received & 0xFFFFFFFF)


def decode_credit(data: bytes | memoryview) -> int:
    return CREDIT.unpack(bytes(data))[0]


# --------------------------------------------------------------------------- the script


class Step(Enum):
    """One stage of a perftest ``-R`` session (see the module docstring)."""

    HELLO = "hello"
    SYNC = "sync"
    CONNECT = "connect"
    SET_UP = "set-up"
    DESTS = "dests"
    PREPARE = "prepare"
    RUN = "run"
    REPORTS = "reports"


def script(test: str, sizes: int, all_sizes: bool = False) -> tuple[Step, ...]:
    """The stages both sides walk for ``test`` and ``sizes`` runs (perftest's ``main``)."""
    if test not in TESTS:
        raise PerftestError(f"unknown test {test!r}")
    head = (Step.HELLO, Step.SYNC, Step.CONNECT, Step.SYNC, Step.SET_UP, Step.DESTS)
    if test == "send":
        per_size = (Step.PREPARE, Step.SYNC, Step.RUN) + ((Step.SYNC,) if all_sizes else ())
        return head + (Step.SYNC, Step.DESTS) + per_size * sizes + (Step.SYNC,)
    return (
        head
        + (Step.DESTS, Step.SYNC)
        + (Step.PREPARE, Step.RUN) * sizes
        + (Step.SYNC, Step.REPORTS, Step.SYNC)
    )


HELLO_SIZES = (VERSION_LEN, SYS_INT.size, SYS_INT.size, MTU_LEN)


def message_sizes(
    test: str, sizes: int = 1, num_qps: int = 1, all_sizes: bool = False
) -> list[int]:
    """The length of every Send each side makes on the exchange connection, in order."""
    out: list[int] = []
    for step in script(test, sizes, all_sizes):
        if step is Step.HELLO:
            out += HELLO_SIZES
        elif step is Step.SYNC:
            out.append(DEST.size)
        elif step is Step.DESTS:
            out += [DEST.size] * num_qps
        elif step is Step.REPORTS:
            out += [REPORT_U64.size] * REPORT_FIELDS
    return out


# --------------------------------------------------------------------------- options


def default_rx_depth(iters: int, all_sizes: bool, rx_depth: int | None = None) -> int:
    """perftest's Send receive depth: ``min(-r, -n)``, made even for a single size."""
    depth = min(rx_depth or DEFAULT_RX_SEND, iters)
    if depth % 2 and not all_sizes:
        depth += 1
    return depth


@dataclass(frozen=True, slots=True)
class PerftestOptions:
    """One side of a session; defaults and clamps as perftest's ``force_dependecies``.

    Fields: test; sizes; all_sizes (``-a``); iters; num_qps; tx_depth; rx_depth (Send);
    cq_mod; out_reads (Read: IRD/ORD of the data connections); host (None: server);
    port; bind (server address); crc (request MPA CRC); emss; timeout (seconds without
    progress); first_fpdu_delay; out (where the report goes).
    """

    test: str
    sizes: tuple[int, ...] = (DEFAULT_SIZE,)
    all_sizes: bool = False
    iters: int = 1000
    num_qps: int = 1
    tx_depth: int = DEFAULT_TX_DEPTH
    rx_depth: int = DEFAULT_RX_SEND
    cq_mod: int = DEFAULT_CQ_MOD
    out_reads: int = 1
    host: str | None = None
    port: int = DEFAULT_PORT
    bind: str = "0.0.0.0"
    crc: bool = True
    emss: int | None = None
    timeout: float = 30.0
    first_fpdu_delay: float = FIRST_FPDU_DELAY
    out: TextIO | None = field(default=None, compare=False)

    @classmethod
    def build(
        cls,
        test: str,
        *,
        size: int | None = None,
        all_sizes: bool = False,
        iters: int | None = None,
        tx_depth: int | None = None,
        rx_depth: int | None = None,
        cq_mod: int | None = None,
        out_reads: int | None = None,
        **kwargs: object,
    ) -> PerftestOptions:
        """Options with perftest's defaults for what is not given."""
        if test not in TESTS:
            raise PerftestError(f"unknown test {test!r}")
        n = iters if iters is not None else DEFAULT_ITERS[test]
        sizes = ALL_SIZES if all_sizes else (size if size is not None else DEFAULT_SIZE,)
        tx = min(tx_depth or DEFAULT_TX_DEPTH, n)
        if cq_mod is None:
            big = not all_sizes and sizes[0] > CQ_MOD_SIZE_LIMIT
            cq_mod = 1 if big else DEFAULT_CQ_MOD
        if test == "read":
            reads = min(out_reads or MAX_DEVICE_READS, MAX_DEVICE_READS)
        else:
            reads = 1
        return cls(
            test,
            tuple(sizes),
            all_sizes,
            n,
            tx_depth=tx,
            rx_depth=default_rx_depth(n, all_sizes, rx_depth),
            cq_mod=max(1, min(cq_mod, tx)),
            out_reads=reads,
            **kwargs,  # type: ignore[arg-type]
        )

    @property
    def buffer_size(self) -> int:
        """The largest message (``-a``: 8 MiB)."""
        return MAX_SIZE if self.all_sizes else max(self.sizes)

    @property
    def cm_reads(self) -> int:
        """IRD and ORD of the data connections (perftest's conn_param; 0 unless Read)."""
        return self.out_reads if self.test == "read" else 0

    def settings(self, reads: int) -> MpaSettings:
        crc = CrcPolicy.REQUEST if self.crc else CrcPolicy.OFF
        if self.emss is None:
            return MpaSettings(crc=crc, ird=reads, ord=reads)
        return MpaSettings(crc=crc, ird=reads, ord=reads, emss=self.emss)


# --------------------------------------------------------------------------- exchange channel


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
        _check(wc.status, f"{what} Send")

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
        _check(wc.status, f"receive of the {what}")
        start = wc.wr_id * COMM_SLOT_LEN
        data = bytes(self.mr.buf[start : start + wc.byte_len])
        self._post(wc.wr_id)
        self.transcript.append((False, data))
        return data


def _check(status: WcStatus, what: str) -> None:
    if status is WcStatus.WR_FLUSH_ERR:
        raise PerftestError(f"{what}: the connection closed")
    if status is not WcStatus.SUCCESS:
        raise PerftestError(f"{what} completed with status '{status.value}'")


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


# --------------------------------------------------------------------------- both sides


class _Side:
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
        self.recv_cq = self.rnic.create_cq(1 << 16)
        self.credit: MemoryRegion | None = None
        self.mine: list[PingpongDest] = []
        self.theirs: list[PingpongDest] = []
        self.peer_version = ""
        self.cycle_buffer = mmap.PAGESIZE
        self.cache_line = CACHE_LINE
        self.peer_mtu = 0
        self.results: list[BwResult] = []
        self.peer_report: BwReport | None = None
        self._run = 0
        self._printed = False
        self.closing = False

    def say(self, line: str = "") -> None:
        print(line, file=self.out, flush=True)

    async def walk(self, cm: ConnectionManager) -> None:
        """Run every step of the script in order."""
        o = self.opts
        steps = script(o.test, len(o.sizes), o.all_sizes)
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
            broken = self.broken()
            if broken and broken not in str(exc):
                raise PerftestError(f"{exc} ({broken})") from None
            raise

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
        if o.test == "send":
            self.credit = self.pd.reg_mr(bytearray(CREDIT.size * o.num_qps), REMOTE_RW)
        for i, d in enumerate(self.data):
            d.buf = self.pd.reg_mr(_pattern(length, i), REMOTE_RW)
            rkey, vaddr = d.buf.rkey, d.buf.base
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
        if not self._printed:
            self._printed = True
            self.say(RESULT_LINE)
            for side, dests in (("local", self.mine), ("remote", self.theirs)):
                for d in dests:
                    self.say(_address_line(side, d, self.opts.test))
            self.say(RESULT_LINE)
            self.say(bw_header(False))

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
            max_recv_wr=max(o.rx_depth, DEFAULT_RX_SEND) + 16,
        )
        reads = max(1, o.cm_reads)
        qp = self.rnic.create_qp(self.pd, send_cq, self.recv_cq, cap=cap, ird=reads, ord=reads)
        d = DataQp(qp, send_cq)
        self.data.append(d)
        return d

    def header(self, role: str) -> None:
        o = self.opts
        self.say(RESULT_LINE)
        self.say(f"                    {TEST_NAMES[o.test]} BW Test")
        self.say(f" Number of qps   : {o.num_qps}\t\tTransport type : iWARP (userspace, TCP)")
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


def _reraise_lone(group: BaseExceptionGroup) -> NoReturn:
    """Raise the one error inside trio's exception groups (else the group itself)."""
    inner = lone_exception(group)
    if inner is group:
        raise group
    raise inner from None


def _pattern(length: int, salt: int) -> bytearray:
    """A recognisable buffer (perftest fills its buffers with random bytes)."""
    unit = bytes((i * 7 + salt * 31 + 1) & 0xFF for i in range(251))
    return bytearray((unit * (length // len(unit) + 1))[:length])


def _address_line(side: str, d: PingpongDest, test: str) -> str:
    line = f" {side} address: LID {d.lid:#06x} QPN {d.qpn:#06x} PSN {d.psn:#08x}"
    if test == "read":
        line += f" OUT {d.out_reads:#04x}"
    return line + f" RKey {d.rkey:#010x} VAddr {d.vaddr:#018x}"


def _result(size: int, iters: int, num_qps: int, start: float, end: float, peak: float) -> BwResult:
    """A result row; perftest counts the iterations of all QPs together."""
    messages = iters * num_qps
    elapsed = max(end - start, 1e-9)
    rate = messages / elapsed
    peak_bw, avg_bw = (peak or rate) * size / MB, rate * size / MB
    return BwResult(size, messages, peak_bw, avg_bw, rate / 1e6, messages)


# --------------------------------------------------------------------------- client


class PerftestClient(_Side):
    """The active side: connects to a perftest (or our) server and drives the test."""

    active = True

    async def session(self) -> list[BwResult]:
        o = self.opts
        assert o.host is not None
        self.header("client")
        try:
            async with ConnectionManager.open(self.rnic, tap_factory=self.meter) as cm:
                self.comm.conn = await self._connect(cm, self.comm.qp, 0, "exchange")
                await trio.sleep(o.first_fpdu_delay)
                try:
                    await self.walk_explained(cm)
                finally:
                    await self.close()
        except BaseExceptionGroup as group:
            _reraise_lone(group)
        return self.results

    async def _connect(
        self, cm: ConnectionManager, qp: QueuePair, reads: int, what: str
    ) -> RdmaConnection:
        """Connect, retrying while the server is not (yet) listening (siw-vm pitfall 9)."""
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

    async def run(self, size: int) -> None:
        o = self.opts
        settle = max(d.established for d in self.data) + o.first_fpdu_delay
        await trio.sleep_until(settle)
        if self.credit is not None:
            self.credit.buf[:] = bytes(len(self.credit.buf))  # perftest zeroes credits per size
        samples: list[list[tuple[float, int]]] = [[] for _ in self.data]
        ends = [0.0] * len(self.data)
        start = time.perf_counter()

        async def one(i: int) -> None:
            ends[i] = await self._run_qp(i, size, samples[i])

        async with trio.open_nursery() as nursery:
            for i in range(len(self.data)):
                nursery.start_soon(one, i)
        peak = peak_rate(samples, start, max(o.tx_depth * len(self.data), 2))
        result = _result(size, o.iters, len(self.data), start, max(ends), peak)
        self.results.append(result)
        self.say(format_bw(result, False))

    async def _run_qp(self, i: int, size: int, samples: list[tuple[float, int]]) -> float:
        """Post ``-n`` WRs of ``size`` on QP ``i`` (``run_iter_bw``); the end time."""
        o = self.opts
        d, peer = self.data[i], self.theirs[i]
        assert d.buf is not None
        sges = (Sge(d.buf.base, size, d.buf.lkey),)
        op = OPCODES[o.test]
        rkey, raddr = (0, 0) if o.test == "send" else (peer.rkey, peer.vaddr)
        credit = None
        if self.credit is not None:
            credit = self.credit.buf[i * CREDIT.size : (i + 1) * CREDIT.size]
        posted = done = 0
        last_progress = time.monotonic()
        while done < o.iters:
            blocked = False
            while posted < o.iters and posted - done < o.tx_depth:
                if credit is not None and posted + 1 - decode_credit(credit) >= o.rx_depth:
                    blocked = True
                    break
                last = posted + 1 == o.iters or (posted + 1) % o.cq_mod == 0
                flags = SendFlags.SIGNALED if last else SendFlags.NONE
                d.qp.post_send(SendWR(posted, op, sges, flags, rkey=rkey, remote_addr=raddr))
                posted += 1
                last_progress = time.monotonic()
            wcs = d.send_cq.poll(64)
            if not wcs:
                wait = CREDIT_POLL_SECONDS if blocked else o.timeout
                with trio.move_on_after(wait):
                    wcs = [await d.send_cq.next()]
            for wc in wcs:
                _check(wc.status, f"{TEST_NAMES[o.test]} WR {wc.wr_id} on QP {i}")
                done = max(done, wc.wr_id + 1)
                last_progress = time.monotonic()
            if wcs:
                samples.append((time.perf_counter(), done))
            elif time.monotonic() - last_progress > o.timeout:
                why = "no Send credit from the server" if blocked else "no completion"
                raise PerftestError(f"QP {i} stalled at {done}/{o.iters}: {why} in {o.timeout} s")
        return time.perf_counter()

    def _report(self) -> BwReport:
        if not self.results:
            return BwReport()
        r = self.results[-1]
        return BwReport(r.size, r.iterations, r.bw_peak, r.bw_average, r.msg_rate)


# --------------------------------------------------------------------------- server


class PerftestServer(_Side):
    """The passive side: one session, like perftest's server, then it returns."""

    listener: Listener

    async def session(
        self, *, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED
    ) -> None:
        self.header("server")
        try:
            async with ConnectionManager.open(self.rnic, tap_factory=self.meter) as cm:
                await self._serve(cm, task_status)
        except BaseExceptionGroup as group:
            _reraise_lone(group)

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
        finally:
            await self.close()
            await listener.aclose()

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
        if o.test != "send":
            return
        by_qpn = {d.qp.qp_num: (i, d) for i, d in enumerate(self.data)}
        expected = o.iters * len(self.data)
        every = max(1, o.rx_depth // 3)
        counts = [0] * len(self.data)
        total = 0
        start = end = time.perf_counter()  # the sync before this run has just ended
        samples: list[list[tuple[float, int]]] = [[] for _ in self.data]
        while total < expected:
            with trio.move_on_after(o.timeout) as scope:
                wcs = [await self.recv_cq.next()]
            if scope.cancelled_caught:
                raise PerftestError(f"received {total} of {expected} Sends; none for {o.timeout} s")
            wcs += self.recv_cq.poll(len(self.recv_cq))
            now = time.perf_counter()
            for wc in wcs:
                _check(wc.status, "receive")
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
        result = _result(size, o.iters, len(self.data), start, end, peak)
        self.results.append(result)
        self.say(format_bw(result, False))

    def on_peer_report(self, report: BwReport) -> None:
        """perftest's server prints the client's figures."""
        result = BwResult(
            report.size, report.iters, report.bw_peak, report.bw_avg, report.msg_rate, report.iters
        )
        self.results.append(result)
        self.say(format_bw(result, False))


async def run_client(opts: PerftestOptions) -> list[BwResult]:
    """Run one client session; returns its results (one per size)."""
    return await PerftestClient(opts).session()


# --------------------------------------------------------------------------- CLI


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid number {text!r}") from None
    if not 0 <= value < 1e6:
        raise argparse.ArgumentTypeError(f"must be 0 or more seconds, got {text}")
    return value


def _timeout(text: str) -> float:
    value = _seconds(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be more than 0 seconds, got {text}")
    return value


def _size(text: str) -> int:
    value = parse_size(text)
    if value > MAX_SIZE:
        raise argparse.ArgumentTypeError(f"size must be at most {MAX_SIZE} bytes, got {text!r}")
    return value


def add_arguments(parser: argparse.ArgumentParser, test: str) -> None:
    parser.add_argument("server", nargs="?", help="server address: run as client (else server)")
    parser.add_argument(
        "-R", "--rdma_cm", action="store_true", help="rdma_cm exchange (always on; accepted)"
    )
    sizes = parser.add_mutually_exclusive_group()
    sizes.add_argument("-s", "--size", type=_size, help="message size (default 65536)")
    sizes.add_argument("-a", "--all", action="store_true", help="sizes 2 to 2^23")
    parser.add_argument(
        "-n",
        "--iters",
        type=positive_int,
        help=f"iterations (default {DEFAULT_ITERS[test]}; give the server the same)",
    )
    parser.add_argument("-q", "--qp", type=positive_int, default=1, help="number of QPs")
    parser.add_argument(
        "-p",
        "--port",
        type=port_number,
        default=DEFAULT_PORT,
        help=f"port (default {DEFAULT_PORT})",
    )
    parser.add_argument("-t", "--tx-depth", type=positive_int, help="WRs outstanding (128)")
    parser.add_argument("-Q", "--cq-mod", type=positive_int, help="signal every Nth WR (100)")
    if test == "send":
        parser.add_argument("-r", "--rx-depth", type=positive_int, help="receives (512)")
    if test == "read":
        parser.add_argument(
            "-o", "--outs", type=positive_int, help=f"outstanding reads ({MAX_DEVICE_READS})"
        )
    parser.add_argument(
        "--bind", default="0.0.0.0", help="server: address to listen on (default all)"
    )
    parser.add_argument(
        "--crc",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="request MPA CRC (default: client on, server off; CRC is on if either asks)",
    )
    parser.add_argument("--emss", type=positive_int, help="EMSS for the MULPDU (MPA-13)")
    parser.add_argument(
        "--timeout", type=_timeout, default=30.0, help="seconds without progress (default 30)"
    )
    parser.add_argument(
        "--first-fpdu-delay",
        type=_seconds,
        default=FIRST_FPDU_DELAY,
        help="client: seconds between a connection and its first FPDU (siw-vm pitfall 3)",
    )


def options_from_args(args: argparse.Namespace, test: str) -> PerftestOptions:
    try:
        return PerftestOptions.build(
            test,
            size=args.size,
            all_sizes=args.all,
            iters=args.iters,
            tx_depth=args.tx_depth,
            rx_depth=getattr(args, "rx_depth", None),
            cq_mod=args.cq_mod,
            out_reads=getattr(args, "outs", None),
            num_qps=args.qp,
            host=args.server,
            port=args.port,
            bind=args.bind,
            crc=args.crc if args.crc is not None else args.server is not None,
            emss=args.emss,
            timeout=args.timeout,
            first_fpdu_delay=args.first_fpdu_delay,
        )
    except PerftestError as exc:
        raise CliError(str(exc)) from None


def run_command(args: argparse.Namespace) -> int:
    test = args.perftest_test
    opts = options_from_args(args, test)
    prog = f"iwarp bench ib_{test}_bw"
    try:
        if opts.host is None:
            trio_run(PerftestServer(opts).session)
        else:
            trio_run(run_client, opts)
    except (PerftestError, IwarpError, OSError) as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 1
    return 0


def register_bench(subparsers: argparse._SubParsersAction) -> None:
    """Add ``ib_write_bw``, ``ib_read_bw`` and ``ib_send_bw`` (perftest ``-R`` peers)."""
    for test in TESTS:
        parser = subparsers.add_parser(
            f"ib_{test}_bw",
            help=f"perftest ib_{test}_bw -R peer (server, or client with an address)",
            description=f"{TEST_NAMES[test]} bandwidth against perftest's ib_{test}_bw -R "
            "(rdma_cm exchange, perftest 4.5 / version 6.06): a server without an address, "
            "a client with one.",
        )
        add_arguments(parser, test)
        parser.set_defaults(func=run_command, perftest_test=test)
