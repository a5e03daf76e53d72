"""``kbtp target``: serve a KBTP block pool over iWARP on TCP (docs/kbtp.md).

The target is configured entirely from the command line: pool (``--block-size``,
``--pool-blocks``), the initiators it knows (``--initiator`` specs, or ``--initiators N``
generated identities ``init-0`` ...), request credits, Max Inline, the Ticket Timeout, the
MPA choices, and an optional capture of every connection (``--capture``).  It prints the
table of initiators, then one line per session event, until interrupted or
``--duration`` runs out.  With ``--pool-file`` the table, pool and rings live in a file
and sealed blocks survive a stop (docs/kbtp.md §12).

Initiator spec: ``IDENTITY[:key=value[,key=value...]]`` with keys ``handles=BASE+COUNT``
(default: the next free range of ``--handles`` handles), ``quota=N`` (default: an equal
share of the pool), ``domain=NAME`` (trust domain; blocks are cleared when they may change
domain), ``direct=none|load|alloc|both`` (direct modes offered; only to trusted
initiators, draft §6.6).  Example::

    kbtp target --block-size 64K --pool-blocks 1024 \\
        --initiator decode-7:handles=0x1000+256,quota=64,direct=both \\
        --initiator prefill-1:quota=128,domain=tenant-b

This module also holds the argument helpers the other ``kbtp`` commands share.
"""

from __future__ import annotations

import argparse
import math
import signal
import sys
from collections.abc import Awaitable, Callable
from typing import Any

import trio

from kbtp.cli import bounds
from kbtp.cli.bounds import check_target_config
from kbtp.constants import (
    DEFAULT_HELLO_TIMEOUT,
    DEFAULT_IDLE_TIMEOUT,
    DEFAULT_MAX_INLINE,
    DEFAULT_REQUEST_CREDITS,
    DEFAULT_TICKET_TIMEOUT,
    MAX_IDENTITY_LEN,
    MAX_REQUEST_CREDITS,
)
from kbtp.target import KbtpTarget
from kbtp.target_config import InitiatorConfig, TargetConfig
from kbtp.target_session import layout_size
from stack.cli import (
    CliError,
    address,
    emss,
    one_line_errors,
    port_number,
    positive_seconds,
)
from stack.errors import IwarpError, leaf_exceptions
from stack.pcap import PcapWriter
from stack.transport.tap import pcap_tap_factory
from stack.wire.events import CrcPolicy, MpaSettings

DEFAULT_PORT = 18700
DEFAULT_BLOCK_SIZE = 64 * 1024
DEFAULT_POOL_BLOCKS = 1024
DEFAULT_INITIATORS = 4
LOOPBACK_EMSS = 65483
"""TCP MSS on Linux loopback (MTU 65536 - 40 - 12 option octets): FPDUs as large as MPA
allows (MULPDU 64768, MPA-13) when both ends are on this host."""

# ======================================================================================
# Shared argument helpers (kbtp target | demo | bench)
# ======================================================================================


def add_mpa_arguments(parser: argparse.ArgumentParser, emss_default: int | None) -> None:
    """``--crc``, ``--markers`` and ``--emss`` (``emss_default`` None: each connection's MSS)."""
    shown = "from the connection's TCP MSS" if emss_default is None else emss_default
    parser.add_argument(
        "--crc",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="MPA CRC32c (default on; CRC is on when either side asks)",
    )
    parser.add_argument(
        "--markers", action="store_true", help="ask for MPA markers in FPDUs sent to us"
    )
    parser.add_argument(
        "--emss",
        type=emss,
        default=emss_default,
        metavar="OCTETS",
        help=f"EMSS the MULPDU is derived from (default {shown}; {LOOPBACK_EMSS} = loopback "
        "MSS; at least 64 and at most 65535)",
    )


def mpa_settings(args: argparse.Namespace) -> MpaSettings:
    """The MPA choices of ``args`` (``--crc``, ``--markers``, ``--emss``)."""
    crc = CrcPolicy.REQUEST if args.crc else CrcPolicy.OFF
    return MpaSettings(crc=crc, want_markers=args.markers, emss=args.emss)


def add_target_arguments(parser: argparse.ArgumentParser) -> None:
    """Pool and policy options shared by ``kbtp target`` and ``kbtp demo``."""
    parser.add_argument(
        "--block-size",
        type=bounds.block_size,
        default=DEFAULT_BLOCK_SIZE,
        metavar="SIZE",
        help="octets per block, K/M suffixes allowed (default 64K, at most 64M)",
    )
    parser.add_argument(
        "--credits",
        type=bounds.request_credits,
        default=DEFAULT_REQUEST_CREDITS,
        help=f"Request Credits per session (default {DEFAULT_REQUEST_CREDITS}, "
        f"at most {MAX_REQUEST_CREDITS})",
    )
    parser.add_argument(
        "--max-inline",
        type=bounds.max_inline,
        default=DEFAULT_MAX_INLINE,
        metavar="OCTETS",
        help=f"largest INLINE store (default {DEFAULT_MAX_INLINE}, at most 64M)",
    )


def checked_target(config: TargetConfig, **options: Any) -> KbtpTarget:
    """``KbtpTarget(config, **options)`` for a command: a configuration beyond
    :mod:`kbtp.cli.bounds` or refused by the target (LocalError, ValueError), or memory
    that cannot be mapped, is a :class:`CliError`, never a traceback."""
    check_target_config(config)
    try:
        return KbtpTarget(config, **options)
    except (IwarpError, ValueError) as exc:
        raise CliError(str(exc)) from None
    except (OSError, MemoryError) as exc:
        reason = getattr(exc, "strerror", None) or exc.__class__.__name__
        size = layout_size(config)
        raise CliError(f"cannot map {size} octets of target memory: {reason}") from None


def run_trio(main: Callable[[], Awaitable[object]]) -> None:
    """``trio.run(main)``, re-raising a lone CliError or KeyboardInterrupt out of groups."""
    try:
        trio.run(main)
    except BaseExceptionGroup as group:  # newer trio wraps errors in nursery bodies
        for leaf in leaf_exceptions(group):
            if isinstance(leaf, CliError | KeyboardInterrupt):
                raise leaf from None
        raise


# ======================================================================================
# Initiator specs
# ======================================================================================

DIRECT_CHOICES = {
    "none": (False, False),
    "load": (True, False),
    "alloc": (False, True),
    "both": (True, True),
}


def identity_name(text: str) -> str:
    """argparse type: an initiator identity, 1 to MAX_IDENTITY_LEN octets of UTF-8 (§4.2)."""
    if not text:
        raise argparse.ArgumentTypeError("an identity is at least one octet")
    if len(text.encode()) > MAX_IDENTITY_LEN:
        raise argparse.ArgumentTypeError(f"identity longer than {MAX_IDENTITY_LEN} octets")
    return text


def parse_initiator(text: str) -> dict[str, object]:
    """An ``--initiator`` spec as a dict (identity, and the keys given)."""
    identity, _, options = text.partition(":")
    if not identity:
        raise argparse.ArgumentTypeError(f"initiator spec {text!r} has no identity")
    identity_name(identity)
    spec: dict[str, object] = {"identity": identity}
    for item in filter(None, options.split(",")):
        key, eq, value = item.partition("=")
        if not eq:
            raise argparse.ArgumentTypeError(f"initiator option {item!r} is not key=value")
        try:
            if key == "handles":
                base, plus, count = value.partition("+")
                if not plus:
                    raise ValueError
                spec["handles"] = (int(base, 0), int(count, 0))
                if spec["handles"][0] < 0 or spec["handles"][1] < 1:  # type: ignore[index]
                    raise ValueError
            elif key == "quota":
                spec["quota"] = int(value, 0)
                if spec["quota"] < 0:  # type: ignore[operator]
                    raise ValueError
            elif key == "domain":
                spec["domain"] = value
            elif key == "direct":
                if value not in DIRECT_CHOICES:
                    raise ValueError
                spec["direct"] = value
            else:
                raise argparse.ArgumentTypeError(
                    f"unknown initiator option {key!r} (handles, quota, domain, direct)"
                )
        except ValueError:
            raise argparse.ArgumentTypeError(f"bad value in initiator option {item!r}") from None
    return spec


def build_config(args: argparse.Namespace) -> TargetConfig:
    """The :class:`TargetConfig` of ``kbtp target``'s arguments (CliError when inconsistent)."""
    specs: list[dict[str, object]] = list(args.initiator or [])
    if not specs:
        direct = "both" if args.trusted else "none"
        specs = [{"identity": f"init-{i}", "direct": direct} for i in range(args.initiators)]
    pool = args.pool_blocks
    unset = [s for s in specs if "quota" not in s]
    left = pool - sum(int(s.get("quota", 0)) for s in specs)  # type: ignore[call-overload]
    if left < 0:
        raise CliError(f"the quotas add up to more than the pool's {pool} blocks (draft §3.4)")
    share = left // len(unset) if unset else 0
    cursor = 0
    initiators = []
    for spec in specs:
        quota = int(spec.get("quota", share))  # type: ignore[call-overload]
        if "handles" in spec:
            base, count = spec["handles"]  # type: ignore[misc]
        else:
            base, count = cursor, args.handles or max(4 * quota, 1)
        cursor = max(cursor, base + count)
        load, alloc = DIRECT_CHOICES[str(spec.get("direct", "none"))]
        if alloc and quota < 1:
            raise CliError(f"initiator {spec['identity']} has direct=alloc but quota 0")
        initiators.append(
            InitiatorConfig(
                identity=str(spec["identity"]).encode(),
                handle_base=base,
                handle_count=count,
                quota=quota,
                trust_domain=str(spec.get("domain", "default")),
                direct_load=load,
                direct_alloc=alloc,
            )
        )
    if len({i.identity for i in initiators}) != len(initiators):
        raise CliError("initiator identities must be distinct")
    config = TargetConfig(
        block_size=args.block_size,
        pool_blocks=pool,
        initiators=tuple(initiators),
        request_credits=args.credits,
        max_inline=args.max_inline,
        ticket_timeout=args.ticket_timeout,
        hello_timeout=getattr(args, "hello_timeout", DEFAULT_HELLO_TIMEOUT),
        idle_timeout=getattr(args, "idle_timeout", DEFAULT_IDLE_TIMEOUT),
    )
    check_target_config(config)
    return config


def describe(config: TargetConfig) -> list[str]:
    """Lines describing a target configuration (pool, then one line per initiator)."""
    lines = [
        f"pool: {config.pool_blocks} blocks of {config.block_size} octets, "
        f"{config.request_credits} credits, Max Inline {config.max_inline}, "
        f"Ticket Timeout {config.ticket_timeout:g} s",
        f"{'identity':<16} {'handles':<24} {'quota':>6}  {'domain':<10} direct",
    ]
    for i in config.initiators:
        modes = [m for m, on in (("load", i.direct_load), ("alloc", i.direct_alloc)) if on]
        handles = f"0x{i.handle_base:x}..0x{i.handle_base + i.handle_count - 1:x}"
        lines.append(
            f"{i.identity.decode(errors='replace'):<16} {handles:<24} {i.quota:>6}  "
            f"{i.trust_domain:<10} {'+'.join(modes) or '-'}"
        )
    return lines


def pool_summary(target: KbtpTarget) -> str:
    """The line saying what ``target``'s pool file held (empty without one)."""
    pool = target.pool
    if pool is None:
        return ""
    if target.recovery is None:
        return f"pool file {pool.path}: new pool initialized"
    how = "a clean stop" if pool.was_clean else "an unclean stop"
    return f"pool file {pool.path}: recovered after {how}: {target.recovery.line()}"


# ======================================================================================
# kbtp target
# ======================================================================================


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "target",
        help="serve a KBTP block pool over iWARP/TCP",
        description="Serve a KBTP block pool, block table and free-block ring over iWARP "
        "(MPA/DDP/RDMAP on TCP).",
        epilog="Initiator spec: IDENTITY[:handles=BASE+COUNT,quota=N,domain=NAME,"
        "direct=none|load|alloc|both]",
    )
    parser.add_argument(
        "--host", type=address, default="127.0.0.1", help="address to listen on (default 127.0.0.1)"
    )
    parser.add_argument(
        "-p",
        "--port",
        type=port_number,
        default=DEFAULT_PORT,
        help=f"TCP port (default {DEFAULT_PORT}; 0: any free)",
    )
    add_target_arguments(parser)
    parser.add_argument(
        "--pool-blocks",
        "-F",
        type=bounds.pool_blocks,
        default=DEFAULT_POOL_BLOCKS,
        metavar="F",
        help=f"blocks in the pool (default {DEFAULT_POOL_BLOCKS}, at most "
        f"{bounds.MAX_POOL_BLOCKS} and 4 GiB)",
    )
    parser.add_argument(
        "--initiator",
        action="append",
        type=parse_initiator,
        metavar="SPEC",
        help="an initiator identity and its grants (repeatable; see below)",
    )
    parser.add_argument(
        "--initiators",
        type=bounds.initiators,
        default=DEFAULT_INITIATORS,
        metavar="N",
        help=f"without --initiator: N identities init-0 .. (default {DEFAULT_INITIATORS}, "
        f"at most {bounds.MAX_INITIATORS})",
    )
    parser.add_argument(
        "--trusted",
        action="store_true",
        help="without --initiator: offer both direct modes to the generated identities",
    )
    parser.add_argument(
        "--handles",
        type=bounds.handles,
        metavar="N",
        help="handles per initiator without handles= (default 4 x quota, at most "
        f"{bounds.MAX_TABLE_ENTRIES} in the table)",
    )
    parser.add_argument(
        "--ticket-timeout",
        type=bounds.ticket_timeout,
        default=DEFAULT_TICKET_TIMEOUT,
        metavar="SECONDS",
        help=f"Ticket Timeout of direct allocations (default {DEFAULT_TICKET_TIMEOUT:g})",
    )
    parser.add_argument(
        "--hello-timeout",
        type=positive_seconds,
        default=DEFAULT_HELLO_TIMEOUT,
        metavar="SECONDS",
        help=f"close a connection without HELLO after this (default {DEFAULT_HELLO_TIMEOUT:g})",
    )
    parser.add_argument(
        "--idle-timeout",
        type=positive_seconds,
        default=DEFAULT_IDLE_TIMEOUT,
        metavar="SECONDS",
        help=f"close a silent session after this (default {DEFAULT_IDLE_TIMEOUT:g})",
    )
    parser.add_argument(
        "--pool-file",
        metavar="PATH",
        help="keep the table, pool and rings in PATH (memory-mapped): created if absent, "
        "else checked against this configuration and recovered; sealed blocks survive a stop",
    )
    parser.add_argument(
        "--pool-sync",
        action="store_true",
        help="with --pool-file: flush every seal and free to the file before its COMPLETION "
        "(survives power loss; default: flushed at a clean stop, survives a killed process)",
    )
    parser.add_argument(
        "--offload",
        action="store_true",
        help="the RNIC answers LOADs by pre-posted chains, without the target application "
        "(docs/kbtp.md §8); everything else is processed in software",
    )
    add_mpa_arguments(parser, None)
    parser.add_argument("--capture", metavar="PCAP", help="record every connection to PCAP")
    parser.add_argument(
        "--duration",
        type=positive_seconds,
        metavar="SECONDS",
        help="stop after SECONDS (default: run until interrupted)",
    )
    parser.add_argument("--quiet", action="store_true", help="no session event lines")
    one_line_errors(parser)
    parser.set_defaults(func=run_target)


def run_target(args: argparse.Namespace) -> int:
    config = build_config(args)
    if args.pool_sync and not args.pool_file:
        raise CliError("--pool-sync needs --pool-file")
    writer = None
    if args.capture:
        try:
            writer = PcapWriter(args.capture)
        except OSError as exc:
            raise CliError(f"cannot write {args.capture}: {exc.strerror or exc}") from None

    def event(line: str) -> None:
        if not args.quiet:
            print(f"kbtp target: {line}", flush=True)

    target = checked_target(
        config,
        settings=mpa_settings(args),
        tap_factory=pcap_tap_factory(writer) if writer else None,
        on_event=event,
        pool_file=args.pool_file,
        pool_sync=args.pool_sync,
        offload=args.offload,
    )
    pool_line = pool_summary(target)

    stopped_by: list[int] = []

    async def main() -> None:
        # SIGINT/SIGTERM stop the target in order: every session ends (and says so) and
        # the capture is complete, rather than a KeyboardInterrupt landing mid-cleanup.
        with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            try:
                async with target.running(args.host, args.port):
                    print(f"kbtp target: listening on {target.host}:{target.port}", flush=True)
                    for line in describe(target.config):
                        print(f"  {line}", flush=True)
                    if pool_line:
                        print(f"kbtp target: {pool_line}", flush=True)
                    with trio.move_on_after(args.duration or math.inf):
                        async for signum in signals:
                            stopped_by.append(signum)
                            break
            except OSError as exc:
                raise CliError(
                    f"cannot listen on {args.host}:{args.port}: {exc.strerror or exc}"
                ) from None

    try:
        run_trio(main)
    finally:
        if writer is not None:
            writer.close()
            print(f"kbtp target: capture written to {args.capture}", file=sys.stderr)
    if stopped_by:
        name = signal.Signals(stopped_by[0]).name
        print(f"kbtp target: stopped by {name}", file=sys.stderr)
        return 128 + stopped_by[0]
    return 0
