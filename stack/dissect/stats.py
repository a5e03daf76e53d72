"""Statistics of a dissection (``-z``): PDUs per kind and opcode, findings, per-stream totals.

:class:`Statistics` (``-z iwarp``, ``--stats``) counts over the PDUs shown (after ``-Y``):
per type/opcode and direction, PDUs with a bad CRC (MPA-12), PDUs per finding rule,
stream events; then, per iWARP connection, the negotiated settings of each direction
(CRC, markers; RFC 5044 §7.1.1) and its byte counters.  :class:`TcpConversations`
(``-z conv,tcp``) counts every TCP segment per connection; :class:`IoStatistics`
(``-z io,stat,SECONDS``) the PDUs shown per time interval, of :data:`MIN_IO_INTERVAL`
(a microsecond, the resolution of a pcap timestamp) or more.  :func:`parse_stat` reads a
``-z`` argument and raises :class:`StatError` for one it does not take.  Kinds and opcodes
are named as in the JSON records (:mod:`stack.dissect.fields`).
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Iterable
from typing import TYPE_CHECKING

from stack.dissect.fields import KIND_NAMES, opcode_name
from stack.dissect.text import rtr_text
from stack.errors import IwarpError

if TYPE_CHECKING:
    from stack.dissect.decoder import Note, PduRecord, StreamInfo
    from stack.pcap import TcpSegment

__all__ = [
    "MIN_IO_INTERVAL",
    "IoStatistics",
    "StatError",
    "Statistics",
    "TcpConversations",
    "parse_stat",
]

STAT_NAMES = ("iwarp", "iwarp,stat", "conv,tcp", "io,stat,SECONDS")
"""The ``-z`` arguments understood."""


MIN_IO_INTERVAL = 1e-6
"""The shortest ``-z io,stat`` interval, in seconds: a microsecond, as tshark (a pcap
timestamp's resolution; relative times of a capture hold little below it as floats)."""

_DECIMAL = re.compile(r"(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][-+]?[0-9]+)?")
"""A ``-z io,stat`` interval as written: a decimal number, no sign, nan, inf or hex."""


class StatError(IwarpError):
    """A ``-z`` argument that names no statistics, or an io,stat interval out of range."""


def _check_interval(interval: float, written: object) -> float:
    """``interval`` if it is a usable ``-z io,stat`` interval, else :class:`StatError`."""
    if not (math.isfinite(interval) and interval >= MIN_IO_INTERVAL):
        raise StatError(
            f"-z io,stat wants a positive interval in seconds, at least {MIN_IO_INTERVAL:g} "
            f"(a microsecond), got {written!r}"
        )
    return interval


def parse_stat(text: str) -> tuple[str, float | None]:
    """``-z`` argument -> (kind 'iwarp', 'conv' or 'io', interval of 'io')."""
    if text in ("iwarp", "iwarp,stat"):
        return "iwarp", None
    if text == "conv,tcp":
        return "conv", None
    parts = text.split(",")
    if parts[:2] == ["io", "stat"]:
        if len(parts) != 3:
            raise StatError(
                f"-z io,stat takes one argument, the interval in seconds (io,stat,SECONDS; "
                f"no filter), got {text!r}"
            )
        number = parts[2].strip()
        interval = float(number) if _DECIMAL.fullmatch(number) else math.nan
        return "io", _check_interval(interval, parts[2])
    raise StatError(
        f"unknown statistics {text!r} (-z takes one of: {', '.join(STAT_NAMES)}; "
        "--stats is -z iwarp)"
    )


class Statistics:
    """Counts over the displayed PDUs plus per-stream totals."""

    def __init__(self) -> None:
        self.opcodes: Counter[str] = Counter()
        self.per_direction: Counter[tuple[str, str]] = Counter()
        self.findings: Counter[str] = Counter()
        self.crc_bad = 0
        self.pdus = 0
        self.notes: Counter[str] = Counter()

    def add(self, rec: PduRecord) -> None:
        self.pdus += 1
        if rec.kind == "fpdu":
            seg = rec.segment
            name = opcode_name(seg.opcode) if seg is not None else "(undecodable)"
            if rec.crc_ok is False:
                self.crc_bad += 1
        else:
            name = KIND_NAMES[rec.kind]
        self.opcodes[name] += 1
        self.per_direction[(name, rec.direction)] += 1
        for rule in rec.rules:
            self.findings[rule] += 1

    def add_note(self, note: Note) -> None:
        self.notes[note.kind] += 1

    def render(self, streams: Iterable[StreamInfo]) -> list[str]:
        lines = ["=" * 72, "iWARP statistics", "=" * 72]
        streams = list(streams)
        iwarp = [s for s in streams if s.state not in ("not_iwarp", "start")]
        lines.append(
            f"TCP connections: {len(streams)}, iWARP: {len(iwarp)}, "
            f"PDUs shown: {self.pdus}, bad CRC: {self.crc_bad}"
        )
        for s in iwarp:
            lines.append(
                f"Stream {s.stream}: {s.endpoints[0]} <-> {s.endpoints[1]}  state={s.state}"
                + (f" rev={s.rev}" if s.rev is not None else "")
                + (f" P2P RTR={rtr_text(s.rtr)}" if s.p2p else "")
            )
            for name in ("i2r", "r2i"):
                d = s.directions.get(name)
                if d is None:
                    continue
                crc = "?" if d.crc is None else "on" if d.crc else "off"
                mk = "?" if d.markers is None else "on" if d.markers else "off"
                lines.append(
                    f"  {name} {d.src} -> {d.dst}: CRC {crc}, markers {mk}; "
                    f"{d.pdus} PDUs ({d.fpdus} FPDUs), {d.wire_bytes} wire bytes, "
                    f"{d.ulpdu_bytes} ULPDU bytes, {d.payload_bytes} payload bytes"
                )
                extra = [
                    f"{label} {value}"
                    for label, value in (
                        ("gap bytes", d.gap_bytes),
                        ("retransmitted bytes", d.retransmitted_bytes),
                        ("undecoded bytes", d.undecoded_bytes),
                    )
                    if value
                ]
                if extra:
                    lines.append("    " + ", ".join(extra))
        lines.append("PDUs per type/opcode:           total     i2r     r2i")
        for name, count in sorted(self.opcodes.items(), key=lambda kv: (-kv[1], kv[0])):
            i2r = self.per_direction[(name, "i2r")]
            r2i = self.per_direction[(name, "r2i")]
            lines.append(f"  {name:<28} {count:>7} {i2r:>7} {r2i:>7}")
        if self.findings:
            lines.append("Findings (PDUs per rule):")
            for rule, count in sorted(self.findings.items()):
                lines.append(f"  {rule:<12} {count:>7}")
        else:
            lines.append("Findings: none")
        if self.notes:
            lines.append(
                "Stream events: " + ", ".join(f"{k} {v}" for k, v in sorted(self.notes.items()))
            )
        lines.append("=" * 72)
        return lines


def _ends(a: tuple[str, int], b: tuple[str, int]) -> str:
    def text(e: tuple[str, int]) -> str:
        return f"[{e[0]}]:{e[1]}" if ":" in e[0] else f"{e[0]}:{e[1]}"

    return f"{text(a)} <-> {text(b)}"


class TcpConversations:
    """``-z conv,tcp``: segments and TCP payload bytes per connection and direction."""

    def __init__(self) -> None:
        # (A, B) as first seen -> [segments A->B, bytes A->B, segments B->A, bytes B->A,
        # first timestamp, last timestamp]
        self.table: dict[tuple[tuple[str, int], tuple[str, int]], list[float]] = {}

    def add(self, seg: TcpSegment) -> None:
        a, b = (seg.src, seg.sport), (seg.dst, seg.dport)
        row = self.table.get((a, b))
        i = 0
        if row is None:
            row = self.table.get((b, a))
            i = 2
            if row is None:
                row = self.table[(a, b)] = [0, 0, 0, 0, seg.timestamp, seg.timestamp]
                i = 0
        row[i] += 1
        row[i + 1] += len(seg.payload) + seg.missing
        row[5] = seg.timestamp

    def render(self, t0: float | None) -> list[str]:
        lines = ["=" * 100, "TCP Conversations (segments, TCP payload bytes)", "=" * 100]
        lines.append(
            f"{'A <-> B':<48} {'A->B':>6} {'bytes':>10} {'B->A':>6} {'bytes':>10} "
            f"{'rel start':>11} {'duration':>10}"
        )
        base = t0 or 0.0
        for (a, b), (n1, b1, n2, b2, first, last) in self.table.items():
            lines.append(
                f"{_ends(a, b):<48} {int(n1):>6} {int(b1):>10} {int(n2):>6} {int(b2):>10} "
                f"{first - base:>11.6f} {last - first:>10.6f}"
            )
        lines.append("=" * 100)
        return lines


class IoStatistics:
    """``-z io,stat,SECONDS``: PDUs shown and their wire bytes per interval since ``t0``."""

    def __init__(self, interval: float) -> None:
        self.interval = _check_interval(interval, interval)
        # decimals of the interval's bounds: enough to tell adjacent ones apart
        self.decimals = next(
            (d for d in range(6) if abs(round(interval, d) - interval) <= interval * 1e-9), 6
        )
        self.bins: Counter[int] = Counter()
        self.bytes: Counter[int] = Counter()

    def add(self, rec: PduRecord, t0: float | None) -> None:
        self.add_at(rec.timestamp, rec.wire_len, t0)

    def add_at(self, timestamp: float, wire_len: int, t0: float | None) -> None:
        """Count a PDU of ``wire_len`` bytes on the wire, seen at ``timestamp``."""
        start = timestamp if t0 is None else t0  # a capture may start at time 0.0
        index = int(max(0.0, timestamp - start) // self.interval)
        self.bins[index] += 1
        self.bytes[index] += wire_len

    def render(self) -> list[str]:
        lines = ["=" * 48, f"IO Statistics (interval {self.interval:g} s, PDUs shown)", "=" * 48]
        lines.append(f"{'interval (s)':<24} {'PDUs':>8} {'bytes':>12}")
        last = max(self.bins, default=-1)
        for i in range(last + 1) if last < 10000 else sorted(self.bins):  # else: non-empty
            span = f"{self._bound(i)} <> {self._bound(i + 1)}"
            lines.append(f"{span:<24} {self.bins[i]:>8} {self.bytes[i]:>12}")
        lines.append("=" * 48)
        return lines

    def _bound(self, i: int) -> str:
        """The start of interval ``i`` in seconds, as its row shows it."""
        at = i * self.interval
        return f"{at:.{self.decimals}f}" if at < 1e15 else f"{at:g}"
