"""Entry point of the ``iwarp`` command: the subcommand table (name -> module)."""

from __future__ import annotations

from collections.abc import Sequence

from stack.cli import run

COMMANDS = {
    "bench": "stack.cli.bench",
    "cmatose": "stack.cli.rdmacm",
    "conform": "stack.cli.conform",
    "dissect": "stack.cli.dissect",
    "interop": "stack.cli.interop",
    "rdma-client": "stack.cli.rdmacm",
    "rdma-server": "stack.cli.rdmacm",
    "rping": "stack.cli.rping",
    "rules": "stack.cli.rules",
    "selfcheck": "stack.cli.selfcheck",
    "siwvm": "stack.cli.siwvm",
}
"""Every ``iwarp`` subcommand and the module whose ``register`` adds it."""


def main(argv: Sequence[str] | None = None) -> int:
    return run("iwarp", "Userspace iWARP (MPA/DDP/RDMAP) over TCP: tools.", COMMANDS, argv)


if __name__ == "__main__":
    raise SystemExit(main())
