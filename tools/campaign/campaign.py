"""Run the campaign's parts and summarise them (the CLI and the CI test call :func:`run`)."""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence

from tools.campaign.faults import run_faults
from tools.campaign.fuzz import run_fuzz
from tools.campaign.hostile import run_hostile
from tools.campaign.load import run_load
from tools.campaign.report import (
    PartSummary,
    faults_summary,
    fuzz_summary,
    hostile_summary,
    load_summary,
)

PARTS = ("fuzz", "hostile", "load", "faults")
DEFAULT_INPUTS = 20_000
FULL_INPUTS = 1_050_000


def run(
    full: bool = False,
    seed: int = 1,
    only: Sequence[str] = (),
    inputs: int | None = None,
    save: bool = True,
    progress: bool = True,
) -> tuple[list[PartSummary], dict[str, object]]:
    """Run the selected parts; (summaries, parameters)."""
    targets = [n for n in only if n not in PARTS]
    named = {p for p in PARTS if p in only} | ({"fuzz"} if targets else set())
    parts = [p for p in PARTS if p in named] or list(PARTS)
    total = inputs or (FULL_INPUTS if full else DEFAULT_INPUTS)
    started = time.monotonic()

    def say(line: str) -> None:
        if progress:
            print(f"[{time.monotonic() - started:7.1f} s] {line}", file=sys.stderr, flush=True)

    out: list[PartSummary] = []
    for part in parts:
        t0 = time.monotonic()
        say(f"part {part} starts")
        if part == "fuzz":
            figures = run_fuzz(total, seed, say, only=targets or None, save=save)
            out.append(fuzz_summary(figures, time.monotonic() - t0))
        elif part == "hostile":
            out.append(hostile_summary(run_hostile(full, seed, say), time.monotonic() - t0))
        elif part == "load":
            out.append(load_summary(run_load(full, seed, say)))
        else:
            out.append(faults_summary(run_faults(full, seed, say), time.monotonic() - t0))
        say(f"part {part}: {'ok' if out[-1].ok else 'FAIL'} in {time.monotonic() - t0:.1f} s")
    params: dict[str, object] = {
        "full": full,
        "seed": seed,
        "parts": parts,
        "fuzz_inputs": total,
        "targets": targets or "all",
    }
    return out, params
