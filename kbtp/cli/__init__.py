"""Entry point of the ``kbtp`` command: the subcommand table (name -> module)."""

from __future__ import annotations

from collections.abc import Sequence

from stack.cli import run

COMMANDS = {
    "bench": "kbtp.cli.bench",
    "conform": "kbtp.cli.conform",
    "demo": "kbtp.cli.demo",
    "target": "kbtp.cli.target",
}
"""Every ``kbtp`` subcommand and the module whose ``register`` adds it."""

__all__ = ["COMMANDS", "main"]


def main(argv: Sequence[str] | None = None) -> int:
    return run(
        "kbtp",
        "KV-cache Block Transfer Protocol over iWARP: target, demo, bench, conform.",
        COMMANDS,
        argv,
    )


if __name__ == "__main__":
    raise SystemExit(main())
