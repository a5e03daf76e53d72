"""perftest's ``-R`` out-of-band protocol: the exchange messages and their order.

As perftest 4.5+0.17 (Debian 12; it reports version 6.06) speaks it.  Learned from
perftest's sources and from captures of siw <-> siw runs; no perftest code here.

* Connections.  All go to the server's one port (default 18515).  First the *exchange*
  connection (MPA Rev 2, IRD=ORD=0, no ULP private data), then one *data* connection per
  QP (IRD=ORD=``-o`` for ``ib_read_bw``, else 0; no private data).  perftest's server
  closes its listener after the exchange connection and listens again only after the first
  sync below, so clients retry (perftest: 10 tries 100 ms apart).
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
    the last three big-endian IEEE-754 doubles (:class:`BwReport`).

  ``ib_write_bw``/``ib_read_bw``/``ib_atomic_bw``: HELLO, SYNC(0), connect, SYNC(0),
  DESTS, DESTS, SYNC, run, SYNC, REPORTS, SYNC.  ``ib_send_bw``: HELLO, SYNC(0), connect,
  SYNC(0), DESTS, SYNC, DESTS, SYNC (the server has posted its receives), run, SYNC.
  With ``-a`` a Write or Read client runs every size back to back; a Send pair brackets
  each size with SYNCs.
  Latency tests: ``ib_write_lat``/``ib_read_lat``: HELLO, SYNC(0), connect, SYNC(0), SYNC,
  DESTS, DESTS, SYNC, run (``ib_read_lat``: then SYNC).  ``ib_send_lat``: HELLO, SYNC(0),
  connect, SYNC(0), DESTS, SYNC, DESTS, SYNC (receives posted), run, SYNC.
* Latency runs.  ``ib_write_lat``: ping-pong RDMA Writes; each side writes into the region
  the peer advertised and spins on the last byte of its own region until it holds the
  peer's iteration count (mod 256); the server writes first.  ``ib_send_lat``: ping-pong
  Sends, the client first.  ``ib_read_lat``: the client Reads, one at a time.
* Send credits (iWARP has no RNR retry, so perftest adds them): the receiver RDMA-Writes
  its receive count as a 4-byte LITTLE-endian u32 (x86 host order: perftest writes its
  memory as is) to the sender's credit slot (:func:`encode_credit`).
"""

from __future__ import annotations

import re
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum

TESTS = ("write", "read", "send", "atomic")
"""The perftest bandwidth tests with a ``-R`` peer here (``ib_<test>_bw``)."""
LAT_TESTS = ("write", "read", "send")
"""The perftest latency tests with a ``-R`` peer here (``ib_<test>_lat``)."""
PERFTEST_VERSION = "6.06"
"""What perftest 4.5+0.17 sends as its version (configure.ac's AC_INIT)."""
MIN_PEER_VERSION = 5.70
"""perftest refuses peers older than this (``check_version_compatibility``)."""
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


class PerftestError(Exception):
    """The perftest exchange failed (malformed message, refused peer, timeout, error WC)."""


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


def script(
    test: str, sizes: int, all_sizes: bool = False, latency: bool = False
) -> tuple[Step, ...]:
    """The stages both sides walk for ``test`` and ``sizes`` runs (perftest's ``main``).

    Latency tests (perftest 4.5's ``*_lat.c``) sync once more after SET_UP; ``ib_write_lat``
    ends with its last run, ``ib_read_lat`` and ``ib_send_lat`` with a closing sync.
    ``ib_atomic_bw`` walks ``ib_write_bw``'s stages.
    """
    if test not in (LAT_TESTS if latency else TESTS):
        kind = "latency" if latency else "bandwidth"
        raise PerftestError(f"unknown {kind} test {test!r}")
    head: tuple[Step, ...] = (Step.HELLO, Step.SYNC, Step.CONNECT, Step.SYNC, Step.SET_UP)
    per_size: tuple[Step, ...]
    if latency:
        if test == "send":
            per_size = (Step.PREPARE, Step.SYNC, Step.RUN)
            return head + (Step.DESTS, Step.SYNC, Step.DESTS) + per_size * sizes + (Step.SYNC,)
        runs = (Step.PREPARE, Step.RUN) * sizes
        tail = (Step.SYNC,) if test == "read" else ()
        return head + (Step.SYNC, Step.DESTS, Step.DESTS, Step.SYNC) + runs + tail
    head += (Step.DESTS,)
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
    test: str, sizes: int = 1, num_qps: int = 1, all_sizes: bool = False, latency: bool = False
) -> list[int]:
    """The length of every Send each side makes on the exchange connection, in order."""
    out: list[int] = []
    for step in script(test, sizes, all_sizes, latency):
        if step is Step.HELLO:
            out += HELLO_SIZES
        elif step is Step.SYNC:
            out.append(DEST.size)
        elif step is Step.DESTS:
            out += [DEST.size] * num_qps
        elif step is Step.REPORTS:
            out += [REPORT_U64.size] * REPORT_FIELDS
    return out
