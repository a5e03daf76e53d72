"""``kbtp bench --connect``: measure a KBTP target started by hand.

The target is someone else's (``kbtp target`` on another host, or any target on the
normative binding), so the bench takes what its HELLO_ACK grants and leaves the target as
it found it:

* the block size is the target's (``--sizes`` does not apply); the requests in flight must
  fit the Request Credits granted (docs/kbtp.md §4.3);
* the bench binds handles of the identity's own range only, from its Handle Base: one per
  request in flight, then one per ALLOC_STORE of that row, as many as the Allocation Quota
  and the range allow (the row is cut to fit, and the header says so);
* a handle that is bound already (ALREADY_VALID, §6.3.1) ends the run with an error before
  anything is stored: the bench never writes a block it did not allocate;
* every handle it bound is freed at the end of each run, whatever ended it;
* there is no raw baseline, floor or Mooncake column (the target's host runs no baseline
  server of ours), and the CPU column is this process's alone.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Any

from kbtp.cli.target import DEFAULT_PORT
from kbtp.initiator import KbtpInitiator
from kbtp.initiator_errors import HelloRefused, SessionClosed
from stack.bench.cli import parse_host_port
from stack.cli import CliError
from stack.errors import IwarpError
from stack.wire.events import MpaSettings

DEFAULT_IDENTITY = "init-0"
"""The identity ``--connect`` says HELLO as by default: the first of those ``kbtp target``
makes without ``--initiator``."""

SESSION_ERRORS = (OSError, IwarpError)
"""What a session with a target started by hand may end with (refused or reset connection,
MPA reject, Terminate, a status the bench did not expect, a session closed): the run's
one-line error."""

__all__ = [
    "DEFAULT_IDENTITY",
    "RemoteTarget",
    "check_connect_options",
    "probe_target",
    "target_address",
]


def target_address(text: str) -> tuple[str, int]:
    """``--connect``'s ``HOST[:PORT]``; the port defaults to ``kbtp target``'s."""
    return parse_host_port(text, DEFAULT_PORT)


@dataclass(frozen=True, slots=True)
class RemoteTarget:
    """What a target started by hand granted the bench's identity (its HELLO_ACK)."""

    host: str
    port: int
    identity: str
    block_size: int
    quota: int
    handle_base: int
    handle_count: int
    request_credits: int
    max_inline: int

    @property
    def bindable(self) -> int:
        """Handles the bench may bind at once: the quota within the handle range."""
        return min(self.quota, self.handle_count)

    def alloc_iters(self, inflight: int, iters: int) -> int:
        """ALLOC_STOREs one row may make: ``iters``, cut to the handles left once each
        request in flight has its block."""
        return max(0, min(iters, self.bindable - inflight))

    def check(self, ops: list[str], inflight: int) -> None:
        """CliError when ``inflight`` requests cannot run under these grants."""
        where = f"the target at {self.host}:{self.port} grants {self.identity!r}"
        if inflight > self.request_credits:
            raise CliError(f"--inflight {inflight}: {where} {self.request_credits} Request Credits")
        need = inflight + (1 if "alloc_store" in ops else 0)
        if need > self.bindable:
            raise CliError(
                f"--inflight {inflight}: {where} a quota of {self.quota} blocks in "
                f"{self.handle_count} handles; the bench binds one per request in flight"
                + (" and at least one more to ALLOC_STORE" if "alloc_store" in ops else "")
            )

    def as_json(self) -> dict[str, Any]:
        return {
            "host": self.host,
            "port": self.port,
            "identity": self.identity,
            "block_size_bytes": self.block_size,
            "quota_blocks": self.quota,
            "handle_base": self.handle_base,
            "handle_count": self.handle_count,
            "request_credits": self.request_credits,
            "max_inline_bytes": self.max_inline,
        }


def check_connect_options(args: argparse.Namespace) -> None:
    """CliError for what does not go with ``--connect`` (or needs it)."""
    if args.connect is None:
        if args.identity is not None:
            raise CliError("--identity names who says HELLO to a target given by --connect")
        return
    clashes = [
        ("--sizes", args.sizes is not None, "the target's block size is measured"),
        ("--in-process", args.in_process, "the target is not this process's"),
        ("--offload", args.offload, "it starts targets of its own"),
        ("--floor", args.floor, "it needs a floor target on the target's host"),
        ("--vs", args.vs is not None, "Mooncake needs a server on the target's host"),
        ("--max-inline", args.max_inline is not None, "the target's Max Inline applies"),
    ]
    for option, given, why in clashes:
        if given:
            raise CliError(f"{option} does not go with --connect: {why}")
    if args.cpus is not None and len(args.cpus) > 1:
        raise CliError(
            f"--cpus {','.join(map(str, args.cpus))}: with --connect the target is not "
            "this bench's to place: give one CPU"
        )


async def probe_target(host: str, port: int, identity: str, settings: MpaSettings) -> RemoteTarget:
    """Say HELLO as ``identity`` and take what the HELLO_ACK grants (the session is then
    closed); a CliError saying why when there is no session."""
    where = f"the KBTP target at {host}:{port}"
    try:
        async with KbtpInitiator.connect(host, port, identity, settings=settings) as ini:
            ack = ini.ack
            assert ack is not None  # a session that started has its HELLO_ACK
    except HelloRefused as exc:
        raise CliError(f"{where} refused identity {identity!r}: {exc.status.name}") from None
    except SessionClosed as exc:
        raise CliError(f"{where}: {exc}") from None
    except SESSION_ERRORS as exc:
        raise CliError(f"cannot start a session with {where}: {exc}") from None
    return RemoteTarget(
        host,
        port,
        identity,
        ack.block_size,
        ack.quota,
        ack.handle_base,
        ack.handle_count,
        ack.request_credits,
        ack.max_inline,
    )
