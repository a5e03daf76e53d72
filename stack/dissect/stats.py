"""Statistics of a dissection (``-z``): PDUs per kind and opcode, findings, per-stream totals.

Counted over the PDUs shown (after ``-Y``): per type/opcode and direction, PDUs with a
bad CRC (MPA-12), PDUs per finding rule, stream events; then, per iWARP connection, the
negotiated settings of each direction (CRC, markers; RFC 5044 §7.1.1) and its byte
counters.  Kinds and opcodes are named as in the JSON records (:mod:`stack.dissect.fields`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from typing import TYPE_CHECKING

from stack.dissect.fields import KIND_NAMES, opcode_name
from stack.dissect.text import rtr_text

if TYPE_CHECKING:
    from stack.dissect.decoder import Note, PduRecord, StreamInfo

__all__ = ["Statistics"]


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
