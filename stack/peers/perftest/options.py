"""Options of one perftest ``-R`` peer (:class:`PerftestOptions`), defaulted as perftest's.

As with perftest, both sides take the same ``-s``/``-a``/``-n``/``-q`` (and ``-r`` if any):
the server never learns them from the client.  Depths and the signalling period are
clamped as perftest's ``force_dependecies`` clamps them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TextIO

from stack.bench.options import (
    ALL_SIZES,
    ATOMIC_SIZE,
    DEFAULT_CQ_MOD,
    DEFAULT_PORT,
    DEFAULT_TX_DEPTH,
    DEVICE_MAX_ORD,
)
from stack.peers.perftest.protocol import LAT_TESTS, TESTS, PerftestError
from stack.wire.events import CrcPolicy, MpaSettings

MAX_SIZE = ALL_SIZES[-1]
"""``-a`` sizes go up to 8 MiB and buffers are sized for it (perftest's MAX_SIZE)."""
DEFAULT_SIZE = 65536
DEFAULT_RX_SEND = 512
RECV_HEADROOM = 16
MAX_POSTED_RECEIVES = 1 << 24
"""Most receives all data QPs of a Send test hold posted at once (``-q`` x ``-r``, at least
512 per QP): each is an entry of a QP's receive queue and a slot of the shared receive CQ,
so past this a run would exhaust memory before it sent a byte (a real RNIC refuses such a
``max_recv_wr`` x QPs as well)."""
"""Receives a data QP may hold beyond its receive depth (:attr:`PerftestOptions.recv_slots`)."""
CQ_MOD_SIZE_LIMIT = 8192
"""perftest signals every WR above this size unless ``-Q`` (or ``-a``) says otherwise."""
DEFAULT_ITERS = {"write": 5000, "read": 1000, "send": 1000, "atomic": 1000}
"""Bandwidth tests' ``-n`` default (perftest: 5000 for ib_write_bw, else 1000)."""
DEFAULT_LAT_ITERS = 1000
LAT_SIZE = 2
"""perftest's latency tests default to 2-byte messages."""
DURATION_MODE_TESTS = {False: TESTS, True: ("read",)}
"""Tests with ``-D`` here: the ping-pong latency tests run ``-n`` iterations only."""
MAX_DEVICE_READS = DEVICE_MAX_ORD
FIRST_FPDU_DELAY = 0.2
"""Seconds a client holds its first FPDU on a new connection (Linux siw's passive race)."""
SEND_FIRST_AFTER = 1.0
"""Seconds an ``ib_write_lat`` server waits for its client's first FPDU on a data connection
without RFC 6581 peer-to-peer mode before it Writes first anyway (MPA-25 waived)."""


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
    cq_mod; out_reads (Read, Atomic: IRD/ORD of the data connections); host (None:
    server); port; bind (server address); crc (request MPA CRC); emss; timeout (seconds
    without progress); first_fpdu_delay; send_first_after (``ib_write_lat`` server: None
    keeps MPA-25 strictly); latency (``ib_*_lat``); duration (``-D``
    seconds instead of ``-n``); report_gbits; out_json (file for the JSON results);
    capture (pcap of our side); out (where the report goes).
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
    send_first_after: float | None = SEND_FIRST_AFTER
    latency: bool = False
    duration: float | None = None
    report_gbits: bool = False
    out_json: str | None = None
    capture: str | None = None
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
        latency = bool(kwargs.get("latency", False))
        if test not in (LAT_TESTS if latency else TESTS):
            raise PerftestError(f"unknown {'latency' if latency else 'bandwidth'} test {test!r}")
        if kwargs.get("duration") is not None:
            if test not in DURATION_MODE_TESTS[latency]:
                raise PerftestError(f"-D applies to {_tests(DURATION_MODE_TESTS[latency])} here")
            if all_sizes:
                raise PerftestError("-D runs one size: -a does not apply")
        if test == "atomic":
            if all_sizes or size not in (None, ATOMIC_SIZE):
                raise PerftestError(f"atomics are {ATOMIC_SIZE} bytes: -s/-a do not apply")
            size = ATOMIC_SIZE
        n = iters if iters is not None else DEFAULT_LAT_ITERS if latency else DEFAULT_ITERS[test]
        default_size = LAT_SIZE if latency else DEFAULT_SIZE
        sizes = ALL_SIZES if all_sizes else (size if size is not None else default_size,)
        tx = min(tx_depth or DEFAULT_TX_DEPTH, n)
        if cq_mod is None:
            big = not all_sizes and sizes[0] > CQ_MOD_SIZE_LIMIT
            cq_mod = 1 if big else DEFAULT_CQ_MOD
        if test in ("read", "atomic"):
            reads = min(out_reads or MAX_DEVICE_READS, MAX_DEVICE_READS)
        else:
            reads = 1
        rx = default_rx_depth(n, all_sizes, rx_depth)
        qps = int(kwargs.get("num_qps", 1))  # type: ignore[call-overload]
        posted = qps * max(rx, DEFAULT_RX_SEND)
        if test == "send" and not latency and posted > MAX_POSTED_RECEIVES:
            raise PerftestError(
                f"-q {qps} QPs x {max(rx, DEFAULT_RX_SEND)} receives each = {posted} receives"
                f" posted at once; at most {MAX_POSTED_RECEIVES} (lower -q or -r)"
            )
        return cls(
            test,
            tuple(sizes),
            all_sizes,
            n,
            tx_depth=tx,
            rx_depth=rx,
            cq_mod=max(1, min(cq_mod, tx)),
            out_reads=reads,
            **kwargs,  # type: ignore[arg-type]
        )

    @property
    def buffer_size(self) -> int:
        """The largest message (``-a``: 8 MiB)."""
        return MAX_SIZE if self.all_sizes else max(self.sizes)

    @property
    def recv_slots(self) -> int:
        """Receives one data QP may hold (``max_recv_wr``): the server keeps ``-r`` (at
        least 512) posted for Sends, with room to repost; latency tests post fewer."""
        return max(self.rx_depth, DEFAULT_RX_SEND) + RECV_HEADROOM

    @property
    def recv_cq_size(self) -> int:
        """Entries of the receive CQ all data QPs share: every receive they may hold, as
        perftest sizes it (``rx_depth`` x ``num_qps``).  Each posted receive completes once,
        flushed or not, so the CQ cannot overflow, which would be fatal (SEC-09)."""
        return self.num_qps * self.recv_slots

    @property
    def cm_reads(self) -> int:
        """IRD and ORD of the data connections (perftest's conn_param; 0 unless Read/Atomic)."""
        return self.out_reads if self.test in ("read", "atomic") else 0

    @property
    def name(self) -> str:
        """perftest's program name (``ib_write_bw``, ``ib_read_lat``, ...)."""
        return f"ib_{self.test}_{'lat' if self.latency else 'bw'}"

    def settings(self, reads: int) -> MpaSettings:
        crc = CrcPolicy.REQUEST if self.crc else CrcPolicy.OFF
        if self.emss is None:
            return MpaSettings(crc=crc, ird=reads, ord=reads)
        return MpaSettings(crc=crc, ird=reads, ord=reads, emss=self.emss)


def _tests(tests: tuple[str, ...]) -> str:
    return ", ".join(tests)
