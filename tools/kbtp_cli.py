"""Entry point of the ``kbtp`` command (subcommands live in ``tools/kbtp_*.py``)."""

from __future__ import annotations

from collections.abc import Sequence

from tools.cli import run


def main(argv: Sequence[str] | None = None) -> int:
    return run("kbtp", "KV-cache Block Transfer Protocol over iWARP: target, demo, bench.", argv)


if __name__ == "__main__":
    raise SystemExit(main())
