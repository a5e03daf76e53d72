"""Regenerate the reference captures in ``pcaps/`` from the live stack (developer tool).

    python -m tools.make_pcaps [--out pcaps] [--only NAME ...] [--list]

The scenarios, and what each capture must decode to, are :data:`stack.scenarios.SCENARIOS`.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import trio

from stack.scenarios import SCENARIOS, run_scenario


def generate(out: Path, only: list[str] | None = None) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    written = []
    chosen = [s for s in SCENARIOS if not only or s.name in only]
    for i, scenario in enumerate(chosen, 1):
        path = out / f"{scenario.name}.pcap"
        print(f"[{i}/{len(chosen)}] {path}: {scenario.description}", file=sys.stderr)
        trio.run(run_scenario, scenario, path)
        written.append(path)
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tools.make_pcaps", description=__doc__.split("\n")[0]
    )
    parser.add_argument(
        "--out", type=Path, default=Path("pcaps"), help="output folder (default pcaps)"
    )
    parser.add_argument("--only", nargs="+", metavar="NAME", help="only these scenarios")
    parser.add_argument("--list", action="store_true", help="list the scenarios and exit")
    args = parser.parse_args(argv)
    names = {s.name for s in SCENARIOS}
    if args.list:
        for s in SCENARIOS:
            print(f"{s.name:26} {s.description}")
        return 0
    unknown = sorted(set(args.only or ()) - names)
    if unknown:
        print(f"make_pcaps: error: unknown scenario(s): {', '.join(unknown)}", file=sys.stderr)
        return 2
    generate(args.out, args.only)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
