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
    DEFAULT_CQ_MOD,
    DEFAULT_PORT,
    DEFAULT_TX_DEPTH,
    DEVICE_MAX_ORD,
)
from stack.peers.perftest.protocol import TESTS, PerftestError
from stack.wire.events import CrcPolicy, MpaSettings

MAX_SIZE = ALL_SIZES[-1]
"""``-a`` sizes go up to 8 MiB and buffers are sized for it (perftest's MAX_SIZE)."""
DEFAULT_SIZE = 65536
DEFAULT_RX_SEND = 512
CQ_MOD_SIZE_LIMIT = 8192
"""perftest signals every WR above this size unless ``-Q`` (or ``-a``) says otherwise."""
DEFAULT_ITERS = {"write": 5000, "read": 1000, "send": 1000}
MAX_DEVICE_READS = DEVICE_MAX_ORD
FIRST_FPDU_DELAY = 0.2
"""Seconds a client holds its first FPDU on a new connection (Linux siw's passive race)."""


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
