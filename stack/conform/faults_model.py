"""What one deliberately broken behaviour of the DUT is: :class:`Fault` (the catalogue is
:data:`stack.conform.faults.FAULTS`)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from stack.conform.faults_qp import QpFault
from stack.wire.connection import IwarpConnection

__all__ = ["DUT_COMMANDS", "Fault", "fault_table_markdown", "turns"]


@dataclass(frozen=True)
class Fault:
    """One way to break the stack.  Fields: name, description, fails (the case IDs that must
    not pass with it, with the status they get: ``{"MPA-12": "FAIL"}``), apply (patches one
    new engine of the DUT), apply_qp (patches one new queue pair of the DUT), app (the
    in-process DUT the tests break: rping, kbtp, bench...; rping means its server and its
    client), also (further DUTs they break with it), scope (the cases the tests run with
    it: its ``fails`` and these selection patterns), patches ((object, attribute,
    replacement) set for the block: class-level fault points)."""

    name: str
    description: str
    fails: dict[str, str]
    apply: Callable[[IwarpConnection], None] | None = None
    apply_qp: QpFault | None = None
    app: str = "rping"
    also: tuple[str, ...] = ()
    scope: tuple[str, ...] = ()
    patches: tuple[tuple[Any, str, Any], ...] = field(default=())


def turns(*ids: str, status: str = "FAIL") -> dict[str, str]:
    """A :attr:`Fault.fails` mapping: each case of ``ids`` gets ``status``."""
    return dict.fromkeys(ids, status)


DUT_COMMANDS = {
    "rping": "`rping -s` / `-c`",
    "rping-markers": "`rping -s --markers`",
    "rping-client": "`rping -c`",
    "rping-client-p2p": "`rping -c --p2p write`",
    "rping-client-patient": "`rping -c --timeout 30`",
    "kbtp": "`kbtp target --trusted`",
    "bench": "`iwarp bench server`",
    "perftest": "`ib_write_bw -R`",
}
"""How each in-process DUT a fault breaks (:attr:`Fault.app`, :attr:`Fault.also`) is run."""


def fault_table_markdown(faults: Iterable[Fault]) -> str:
    """The fault table of docs/conform.md: fault, what is broken, DUT, the cases it turns."""
    rows = ["| fault | what is broken | DUT | cases |", "|---|---|---|---|"]
    for f in faults:
        duts = ", ".join(DUT_COMMANDS[d] for d in (f.app, *f.also))
        by_status: dict[str, list[str]] = {}
        for cid, status in f.fails.items():
            by_status.setdefault(status, []).append(cid)
        cases = "; ".join(f"{', '.join(ids)} {status}" for status, ids in by_status.items())
        rows.append(f"| `{f.name}` | {f.description} | {duts} | {cases} |")
    return "\n".join(rows) + "\n"
