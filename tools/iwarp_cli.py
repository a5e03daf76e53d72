"""Entry point of the ``iwarp`` command (subcommands live in ``tools/iwarp_*.py``)."""

from __future__ import annotations

from collections.abc import Sequence

from tools.cli import run


def main(argv: Sequence[str] | None = None) -> int:
    return run("iwarp", "Userspace iWARP (MPA/DDP/RDMAP) over TCP: tools.", argv)


if __name__ == "__main__":
    raise SystemExit(main())
