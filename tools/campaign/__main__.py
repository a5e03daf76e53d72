"""``python -m tools.campaign [--full] [--seed N] [--json] [--only NAME...]`` (docs/campaign.md)."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from tools.campaign.campaign import FULL_INPUTS, PARTS, run
from tools.campaign.report import table, to_json
from tools.campaign.targets import all_targets


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
