"""``kbtp demo``: a target and several initiators in one process, over loopback TCP.

The demo starts a KBTP target (pool, table and rings in registered memory, every
connection captured to a pcap file) and N initiators that run concurrently:

* **shared-ring initiators** (untrusted, alternating trust domains, so freed blocks are
  cleared): ALLOC_STORE of blocks of mixed sizes (INLINE and RDMA Read, zero to a full
  block, more requests than credits), LOAD (sealed, and unsealed with ALLOW_UNSEALED,
  with INVALIDATE), mapped STORE with SEAL, FREE with the generation, reuse of freed blocks;
* **trusted initiators** (DIRECT_LOAD and DIRECT_ALLOC): one-sided allocation (FetchAdd on
  the partition Head, slot reads, RDMA Write, BIND) next to target-executed ALLOC_STOREs on
  the same partition ring, DIRECT_LOAD of every block, frees and re-allocation;
* every initiator then loads (and trusted ones direct-load) the other initiators' blocks,
  sends requests that must fail (each status checked), and the last trusted initiator lets
  a direct ticket expire: the Ticket Timeout invalidates its Partition STag, the block is
  reclaimed, and the late BIND gets TICKET_ABANDONED.

Every byte read back is compared with what was stored.  The summary table counts
operations, octets and statuses; the exit status is 1 on any mismatch or unexpected
status, 0 otherwise.  ``iwarp dissect`` reads the capture.
"""

from __future__ import annotations

import argparse
import time

import trio

from kbtp.cli.demo_steps import Barrier, Demo, run_initiator
from kbtp.cli.target import (
    LOOPBACK_EMSS,
    add_mpa_arguments,
    add_target_arguments,
    mpa_settings,
    positive_float,
    positive_int,
    run_trio,
)
from kbtp.target import KbtpTarget
from kbtp.target_config import InitiatorConfig, TargetConfig
from stack.cli import CliError, one_line_errors
from stack.pcap import PcapWriter
from stack.transport.tap import pcap_tap_factory

DEFAULT_CAPTURE = "kbtp-demo.pcap"
DEFAULT_INITIATORS = 4
DEFAULT_TICKET_TIMEOUT = 1.0
HANDLES_PER_INITIATOR = 64
SHARED_QUOTA = 24
TRUSTED_QUOTA = 16
SPARE_BLOCKS = 8


def demo_config(args: argparse.Namespace) -> tuple[TargetConfig, list[tuple[str, bool]]]:
    """The target configuration and the (identity, trusted) list of the demo."""
    n = args.initiators
    trusted_count = n // 2
    roles = [(f"shared-{i}", False) for i in range(n - trusted_count)]
    roles += [(f"trusted-{i}", True) for i in range(trusted_count)]
    initiators = []
    for index, (identity, trusted) in enumerate(roles):
        initiators.append(
            InitiatorConfig(
                identity=identity.encode(),
                handle_base=0x1000 + index * HANDLES_PER_INITIATOR,
                handle_count=HANDLES_PER_INITIATOR,
                quota=TRUSTED_QUOTA if trusted else SHARED_QUOTA,
                trust_domain="trusted" if trusted else f"tenant-{'ab'[index % 2]}",
                direct_load=trusted,
                direct_alloc=trusted,
            )
        )
    pool = sum(i.quota for i in initiators) + SPARE_BLOCKS
    config = TargetConfig(
        block_size=args.block_size,
        pool_blocks=pool,
        initiators=tuple(initiators),
        table_base_handle=0x1000,
        request_credits=args.credits,
        max_inline=args.max_inline,
        ticket_timeout=args.ticket_timeout,
    )
    return config, roles


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "demo",
        help="a target and several initiators exercising every KBTP operation",
        description="Start a KBTP target and N initiators in this process over loopback TCP; "
        "exercise every operation, both direct modes and bad requests; check every byte "
        "read back; print a summary and write a capture.",
    )
    parser.add_argument(
        "-n",
        "--initiators",
        type=positive_int,
        default=DEFAULT_INITIATORS,
        metavar="N",
        help=f"initiators, half of them trusted (default {DEFAULT_INITIATORS}, at least 2)",
    )
    add_target_arguments(parser)
    parser.add_argument(
        "--ticket-timeout",
        type=positive_float,
        default=DEFAULT_TICKET_TIMEOUT,
        metavar="SECONDS",
        help=f"Ticket Timeout (default {DEFAULT_TICKET_TIMEOUT:g}; the demo waits 1.6x it)",
    )
    add_mpa_arguments(parser, LOOPBACK_EMSS)
    parser.add_argument(
        "-w",
        "--capture",
        default=DEFAULT_CAPTURE,
        metavar="PCAP",
        help=f"capture file (default {DEFAULT_CAPTURE})",
    )
    parser.add_argument("--no-capture", action="store_true", help="do not write a capture")
    parser.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    parser.add_argument(
        "--timeout",
        type=positive_float,
        default=120.0,
        metavar="SECONDS",
        help="give up after SECONDS (default 120)",
    )
    one_line_errors(parser)
    parser.set_defaults(func=run_demo)


def run_demo(args: argparse.Namespace) -> int:
    if args.initiators < 2:
        raise CliError("the demo needs at least 2 initiators (one shared-ring, one trusted)")
    if args.block_size < 64:
        raise CliError("the demo needs blocks of at least 64 octets")
    config, roles = demo_config(args)
    writer = None
    if not args.no_capture:
        try:
            writer = PcapWriter(args.capture)
        except OSError as exc:
            raise CliError(f"cannot write {args.capture}: {exc.strerror or exc}") from None
    settings = mpa_settings(args)
    target = KbtpTarget(
        config, settings=settings, tap_factory=pcap_tap_factory(writer) if writer else None
    )
    demo = Demo(args, target, 0, settings, time.perf_counter())

    async def main() -> None:
        async with target.running("127.0.0.1", 0):
            demo.port = target.port
            demo.progress(
                "target",
                f"127.0.0.1:{target.port}: {config.pool_blocks} blocks of "
                f"{config.block_size} octets, {len(roles)} initiators",
            )
            demo.barriers = [Barrier(len(roles)), Barrier(len(roles))]
            with trio.move_on_after(args.timeout) as scope:
                async with trio.open_nursery() as nursery:
                    last_trusted = max(i for i, (_, t) in enumerate(roles) if t)
                    for index, (identity, trusted) in enumerate(roles):
                        nursery.start_soon(
                            run_initiator, demo, identity, trusted, index == last_trusted
                        )
            if scope.cancelled_caught:
                demo.fail("demo", f"did not finish within {args.timeout:g} s")

    try:
        run_trio(main)
    finally:
        if writer is not None:
            writer.close()
    elapsed = time.perf_counter() - demo.started
    print_summary(demo, roles, writer, elapsed)
    return 1 if demo.failures else 0


def print_summary(
    demo: Demo, roles: list[tuple[str, bool]], writer: PcapWriter | None, elapsed: float
) -> None:
    shared = sum(1 for _, t in roles if not t)
    print(
        f"kbtp demo: {len(roles)} initiators ({shared} shared-ring, {len(roles) - shared} "
        f"trusted), {demo.target.config.pool_blocks} blocks of {demo.target.config.block_size} "
        "octets, loopback TCP"
    )
    print()
    print(f"{'operation':<14} {'status':<24} {'count':>7} {'octets':>13}")
    print(f"{'-' * 14} {'-' * 24} {'-' * 7} {'-' * 13}")
    order = ["ALLOC_STORE", "STORE", "LOAD", "DIRECT_LOAD", "BIND", "FREE"]
    keys = sorted(
        demo.stats,
        key=lambda k: (order.index(k[0]) if k[0] in order else len(order), k[1] != "SUCCESS", k),
    )
    for op, status in keys:
        entry = demo.stats[(op, status)]
        print(f"{op:<14} {status:<24} {entry.count:>7} {entry.octets:>13,}")
    total_ops = sum(e.count for e in demo.stats.values())
    total_octets = sum(e.octets for e in demo.stats.values())
    print(f"{'-' * 14} {'-' * 24} {'-' * 7} {'-' * 13}")
    print(f"{'total':<14} {'':<24} {total_ops:>7} {total_octets:>13,}")
    print()
    print(
        f"checks: {demo.checks} byte-exact read-backs, {demo.bad_ok} bad requests answered "
        f"with the expected status, {len(demo.failures)} failures"
    )
    if writer is not None:
        print(f"capture: {demo.args.capture} ({writer.packets} packets)")
    verdict = "FAIL" if demo.failures else "PASS"
    print(f"result: {verdict} in {elapsed:.2f} s")
    for line in demo.failures:
        print(f"  {line}")
