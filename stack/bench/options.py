"""Options of one benchmark run (:class:`BenchOptions`) and perftest's defaults behind them.

Iteration counts, depths and the port are perftest's (``ib_write_bw`` and friends); a run
moves at most about ``BW_BYTES_PER_SIZE`` / ``LAT_BYTES_PER_SIZE`` per size unless ``-n``
says otherwise.  The MPA choices carry the device's IRD/ORD (the RFC 6581 IRD/ORD word,
ERC-03).
"""

from __future__ import annotations

from dataclasses import dataclass

from stack.cli import CliError, binary_size
from stack.rnic import Rnic
from stack.transport.cm import MAX_STARTUPS_PER_PEER
from stack.transport.pumping import RECEIVE_MAX
from stack.wire.events import CrcPolicy, MpaSettings

TESTS = ("write", "read", "send", "atomic")
DEFAULT_PORT = 18515
"""perftest's default port."""
ALL_SIZES = tuple(2**k for k in range(1, 24))
"""``-a``: 2 bytes to 8 MiB, as perftest."""
MAX_SIZE = 1 << 30
ATOMIC_SIZE = 8
"""Bytes an atomic operation moves (a 64-bit operand, RFC 7306 §4)."""
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
RX_HEADROOM = 64
DEVICE_MAX_IRD = Rnic().max_ird
DEVICE_MAX_ORD = Rnic().max_ord
MAX_QPS = 1 << 14
"""Most QPs of a run (``-q``, ``idle-qps -q``, the perftest peers' ``-q``): each is a TCP
connection from one address to one port, which Linux gives 28232 local ports by default
(``ip_local_port_range`` 32768-60999), and a descriptor at each end."""
MAX_DEPTH = 1 << 16
"""Most WRs outstanding per QP (``-t``, and so ``--post-list`` and ``--cq-mod``, which are
at most the tx depth): the RNIC has no limit of its own, a QP's queues and CQ are sized by
it (the client's CQ: two entries per WR); as the 65536-entry CQs of cmatose.  (The perftest
peer's shared receive CQ is sized by its QPs' receives, which
:data:`~stack.peers.perftest.options.MAX_POSTED_RECEIVES` bounds.)"""
MAX_RX_DEPTH = 1 << 20
"""Most receives the server keeps posted for one QP's Sends (``--rx-depth``): what
:meth:`~stack.bench.protocol.SessionSpec.decode` accepts in a session request."""
MAX_IDLE_PARALLEL = MAX_STARTUPS_PER_PEER
"""Most ``idle-qps --parallel`` connections in MPA startup at once: they come from one
address, and the listener refuses more startups from one address than this
(:data:`~stack.transport.cm.MAX_STARTUPS_PER_PEER`; docs/campaign.md)."""


def default_cq_mod(tx_depth: int) -> int:
    """``--cq-mod`` when not given: perftest's 100, but at most half the tx depth.

    The client refills its window when a signalled WR completes; with perftest's 100 of
    128 it refills in bursts of 100 while only 28 WRs are left in flight, and pipelined
    Reads drain between bursts (hardware polls fast enough to hide it, a software stack
    does not).  Measured on loopback (medians of 3 to 5 runs): 64 KiB Reads went from
    1.28-1.42 to 1.78-1.91 GB/s with 64 of 128, 0.38x to 0.52x the raw baseline; Writes,
    Sends and 1 MiB Reads did not change."""
    return max(1, min(DEFAULT_CQ_MOD, tx_depth // 2))


class BenchError(Exception):
    """A benchmark run failed (connection refused, error completion, server died)."""


@dataclass(frozen=True, slots=True)
class BenchOptions:
    """One client run.

    Fields: test (write/read/send/atomic); sizes; iters (None: default per size) or duration
    (seconds); num_qps; post_list; cq_mod; tx_depth; rx_depth (server receives for Send,
    None: enough for two full TCP reads of the smallest Sends); crc; markers; emss (None:
    the stack's default); latency; baseline; cpu (CPU time per message columns); capture
    (-w FILE: the client's pcap); cpus (--cpus: client, server); mode
    ("spawn", "in-process" or "connect");
    host, port (connect mode); progress (report on stderr).
    """

    test: str
    sizes: tuple[int, ...]
    iters: int | None = None
    duration: float | None = None
    num_qps: int = 1
    post_list: int = 1
    cq_mod: int = default_cq_mod(DEFAULT_TX_DEPTH)
    tx_depth: int = DEFAULT_TX_DEPTH
    rx_depth: int | None = None
    crc: bool = True
    markers: bool = False
    emss: int | None = None
    latency: bool = False
    baseline: bool = False
    cpu: bool = False
    capture: str | None = None
    """``-w FILE``: the client's capture of every connection (pcap)."""
    mode: str = "spawn"
    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    progress: bool = True
    repeat: int = 1
    """``--repeat``: runs per size, each iWARP then its baselines (:func:`median_run`)."""
    blocking: bool = False
    """``--blocking``: the latency exchange runs on the blocking driver at both ends
    (:mod:`stack.bench.blocking_iwarp`), not on trio."""
    cpus: tuple[int, ...] | None = None
    """``--cpus``: the CPU the client runs on and the one of the server it spawns (one
    CPU: both ends on it); None: wherever the kernel puts them."""

    @property
    def server_cpu(self) -> int | None:
        """The CPU of the spawned server (``--cpus``' second, else its only one)."""
        if self.cpus is None or self.mode == "connect":
            return None  # a server started by hand is pinned by its own --cpus
        return self.cpus[-1]

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
        RECEIVE_MAX bytes per batch (its grown receive buffer), so two reads' worth of the
        smallest FPDUs is enough.
        """
        if self.rx_depth is not None:
            return self.rx_depth
        fpdu = size + 24  # MPA length + untagged DDP/RDMAP header (18) + CRC
        return max(512, 2 * RECEIVE_MAX // fpdu + self.tx_depth + RX_HEADROOM)

    @property
    def mpa_settings(self) -> MpaSettings:
        """The client's MPA choices (CRC requested or not, markers towards the client)."""
        return mpa_settings(self.crc, self.markers, self.emss)

    def check_sessions(self) -> None:
        """Refuse, as a :class:`~stack.cli.CliError`, a run whose largest size asks the
        server for more registered memory per QP than it gives (``SessionSpec.memory``
        against ``MAX_SESSION_BYTES``): the server would reject the connection (MPA-23)."""
        # Here, not at the top: stack.bench.protocol imports this module.
        from stack.bench.protocol import MAX_SESSION_BYTES, SessionSpec

        size = max(self.sizes)
        spec = SessionSpec(self.test, size, self.latency)
        if spec.memory > MAX_SESSION_BYTES:
            what = f"{self.test}{' --lat' if self.latency else ''}"
            raise CliError(
                f"-s {size}: {what} needs {len(spec.regions)} regions of that size at the "
                f"server, {spec.memory} bytes ({_gib(spec.memory)}), more than the "
                f"{MAX_SESSION_BYTES} ({_gib(MAX_SESSION_BYTES)}) it registers for one QP: "
                f"at most {MAX_SESSION_BYTES // len(spec.regions)} bytes"
            )

    @property
    def ord(self) -> int:
        """Reads and atomics outstanding per QP (perftest's ``-o``): the tx depth, capped."""
        return min(self.tx_depth, DEVICE_MAX_ORD)


def _gib(octets: int) -> str:
    return f"{octets / (1 << 30):g} GiB"


def mpa_settings(crc: bool, markers: bool, emss: int | None) -> MpaSettings:
    """MPA settings with the device's IRD/ORD (the QPs enforce their own).

    ``crc``: request CRC, else offer none (MPA-11); ``markers``: want markers in the FPDUs
    sent to this end (MPA-09); ``emss``: None leaves the stack's default (MPA-13).
    """
    policy = CrcPolicy.REQUEST if crc else CrcPolicy.OFF
    if emss is None:
        return MpaSettings(crc=policy, want_markers=markers, ird=DEVICE_MAX_IRD, ord=DEVICE_MAX_ORD)
    return MpaSettings(
        crc=policy, want_markers=markers, ird=DEVICE_MAX_IRD, ord=DEVICE_MAX_ORD, emss=emss
    )


def parse_size(text: str) -> int:
    """``65536``, ``64K``, ``1M``, ``1MiB`` -> bytes (binary suffixes), 1 to MAX_SIZE."""
    return binary_size(text, MAX_SIZE, unit=" bytes")
