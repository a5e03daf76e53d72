"""The campaign's figures: one summary per part, the detail rows, a table and a JSON object."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from tools.campaign.faults import FaultFigures
from tools.campaign.fuzz import TargetFigures
from tools.campaign.hostile import HostileFigures
from tools.campaign.load import LoadFigures


@dataclass
class PartSummary:
    """The headline figures of one part (the columns of the final table)."""

    part: str
    inputs: int = 0
    crashes: int = 0
    hangs: int = 0
    servers_alive: bool | None = None
    not_served: int = 0
    lost_or_corrupted: int = 0
    seconds: float = 0.0
    rows: list[dict[str, Any]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return (
            not self.crashes
            and not self.hangs
            and self.servers_alive is not False
            and not self.not_served
            and not self.lost_or_corrupted
        )


def fuzz_summary(figures: list[TargetFigures], seconds: float) -> PartSummary:
    s = PartSummary("1 decoder fuzzing", seconds=seconds)
    for f in figures:
        s.inputs += f.inputs
        s.crashes += f.crashes + f.diverged
        s.hangs += f.hangs
        row = dataclasses.asdict(f)
        row["findings"] = [dataclasses.asdict(x) for x in f.findings]
        s.rows.append(row)
    return s


def hostile_summary(figures: HostileFigures, seconds: float) -> PartSummary:
    s = PartSummary("2 hostile peers", servers_alive=True, seconds=seconds)
    for a in figures.attacks:
        s.inputs += a.tried
        s.crashes += not a.alive
        s.servers_alive = s.servers_alive and a.alive
        s.not_served += not a.served or not a.fds_ok
        s.lost_or_corrupted += a.lost
        s.rows.append(dataclasses.asdict(a) | {"fds_ok": a.fds_ok})
    return s


def load_summary(figures: list[LoadFigures]) -> PartSummary:
    s = PartSummary("3 KBTP load", servers_alive=True)
    for f in figures:
        s.inputs += f.operations
        s.seconds += f.seconds
        s.servers_alive = s.servers_alive and f.alive
        s.crashes += int(not f.alive)
        s.not_served += len(f.errors) + int(not f.accounting_ok)
        s.lost_or_corrupted += f.corrupted
        s.rows.append(dataclasses.asdict(f) | {"accounting_ok": f.accounting_ok})
    return s


def faults_summary(figures: FaultFigures, seconds: float) -> PartSummary:
    s = PartSummary("4 faults", servers_alive=True, seconds=seconds)
    for x in figures.faults:
        s.inputs += x.tried
        s.crashes += not x.alive
        s.servers_alive = s.servers_alive and x.alive
        s.not_served += not x.served
        s.lost_or_corrupted += x.lost
        s.rows.append(dataclasses.asdict(x))
    return s


def to_json(parts: list[PartSummary], params: dict[str, Any]) -> dict[str, Any]:
    return {
        "parameters": params,
        "ok": all(p.ok for p in parts),
        "parts": [
            {k: v for k, v in dataclasses.asdict(p).items() if k != "rows"}
            | {"ok": p.ok, "detail": p.rows}
            for p in parts
        ],
    }


def _yes(value: bool | None) -> str:
    return "-" if value is None else ("yes" if value else "NO")


def table(parts: list[PartSummary]) -> str:
    """The final table: one line per part, then the detail lines."""
    head = (
        f"{'part':<20} {'inputs':>9} {'crashes':>7} {'hangs':>5} {'alive':>5} "
        f"{'unserved':>8} {'lost':>4} {'seconds':>8}  verdict"
    )
    lines = [head, "-" * len(head)]
    for p in parts:
        lines.append(
            f"{p.part:<20} {p.inputs:>9} {p.crashes:>7} {p.hangs:>5} {_yes(p.servers_alive):>5} "
            f"{p.not_served:>8} {p.lost_or_corrupted:>4} {p.seconds:>8.1f}  "
            f"{'ok' if p.ok else 'FAIL'}"
        )
    for p in parts:
        lines.append("")
        lines.append(f"{p.part}:")
        for r in p.rows:
            if "findings" in r:
                lines.append(
                    f"  {r['name']:<16} {r['inputs']:>8} inputs ({r['replayed']} from the corpus), "
                    f"{r['crashes']} crashes, {r['hangs']} hangs, {r['diverged']} diverged, "
                    f"slowest {r['slowest_ms']:.1f} ms"
                )
                for x in r["findings"][:5]:
                    lines.append(f"      {x['kind']}: {x['detail'][:160]} -> {x['path']}")
            elif "attack" in r or "fds_before" in r:
                lines.append(
                    f"  {r['server']:<12} {r['name']:<48} tried {r['tried']:>5}  alive "
                    f"{_yes(r['alive'])}  served {_yes(r['served'])}  lost {r['lost']}  fds "
                    f"{r['fds_before']}->{r['fds_after']}{'  ' + r['note'] if r['note'] else ''}"
                )
            elif "initiators" in r:
                lines.append(
                    f"  {r['target']}: {r['initiators']} initiators, {r['operations']} operations, "
                    f"{r['bytes_verified']} bytes verified, {r['corrupted']} corrupted; pool "
                    f"{r['reallocated']}/{r['pool_blocks']} reallocated at the end, "
                    f"{r['over_quota_refused']}/{r['initiators']} over-quota allocations refused; "
                    f"target RSS {r['rss_start_kib']} -> {r['rss_end_kib']} KiB"
                )
                for e in r["errors"][:5]:
                    lines.append(f"      error: {e}")
            else:
                lines.append(
                    f"  {r['server']:<12} {r['name']:<48} tried {r['tried']:>3}  alive "
                    f"{_yes(r['alive'])}  served {_yes(r['served'])}  lost {r['lost']}  {r['note']}"
                )
    return "\n".join(lines)
