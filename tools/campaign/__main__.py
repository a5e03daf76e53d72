"""``python -m tools.campaign [--full] [--seed N] [--json] [--only NAME...]`` (docs/campaign.md)."""

from __future__ import annotations

import argparse
import json
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
    table,
    to_json,
)
from tools.campaign.targets import all_targets

PARTS = ("fuzz", "hostile", "load", "faults")
DEFAULT_INPUTS = 30_000
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
    parts = [p for p in PARTS if p in only] or list(PARTS)
    if targets and "fuzz" not in parts:
        parts = ["fuzz"] if not any(p in only for p in PARTS) else ["fuzz", *parts]
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


def main(argv: Sequence[str] | None = None) -> int:
    names = [t.name for t in all_targets()]
    parser = argparse.ArgumentParser(
        prog="python -m tools.campaign",
        description="Robustness campaign: decoder fuzzing, hostile peers, KBTP load, faults.",
        epilog=f"NAME: a part ({', '.join(PARTS)}) or a fuzz target ({', '.join(names)})",
    )
    parser.add_argument(
        "--full",
        action="store_true",
        help=f"the full form ({FULL_INPUTS} fuzz inputs, 64 initiators, ...)",
    )
    parser.add_argument("--seed", type=int, default=1, help="random seed (default 1)")
    parser.add_argument(
        "--json",
        action="store_true",
        help="print one JSON object on stdout (the table goes to stderr)",
    )
    parser.add_argument(
        "--only",
        nargs="+",
        metavar="NAME",
        default=[],
        choices=[*PARTS, *names],
        help="run only these parts or fuzz targets",
    )
    parser.add_argument("--inputs", type=int, metavar="N", help="fuzz inputs in total")
    args = parser.parse_args(argv)
    parts, params = run(args.full, args.seed, args.only, args.inputs)
    text = table(parts)
    if args.json:
        print(text, file=sys.stderr)
        json.dump(to_json(parts, params), sys.stdout, indent=1)
        print()
    else:
        print(text)
    return 0 if all(p.ok for p in parts) else 1


if __name__ == "__main__":
    sys.exit(main())
