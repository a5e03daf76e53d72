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
import os
import time
from typing import Any

import trio

from kbtp.cli import bounds
from kbtp.cli.demo_steps import Barrier, Demo, run_initiator
from kbtp.cli.target import (
    LOOPBACK_EMSS,
    add_mpa_arguments,
    add_target_arguments,
    checked_target,
    mpa_settings,
    run_trio,
)
from kbtp.initiator import OpStats
from kbtp.target_config import InitiatorConfig, TargetConfig
from stack.cli import CliError, one_line_errors, positive_seconds
from stack.cli.json_report import (
    add_json_argument,
    check_json_path,
    schema,
    text_to_stderr_if_json_stdout,
    write_json,
)
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
        type=bounds.demo_initiators,
        default=DEFAULT_INITIATORS,
        metavar="N",
        help=f"initiators, half of them trusted (default {DEFAULT_INITIATORS}, at least 2, "
        f"at most {bounds.MAX_DEMO_INITIATORS})",
    )
    add_target_arguments(parser)
    parser.add_argument(
        "--ticket-timeout",
        type=bounds.ticket_timeout,
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
    parser.add_argument(
        "--offload",
        action="store_true",
        help="run the target with LOADs and mapped STOREs offloaded (docs/kbtp.md §8)",
    )
    parser.add_argument(
        "--unmasked-counter",
        action="store_true",
        help="trusted initiators ask for their partition ring in the unmasked counter format "
        "(UNMASKED_COUNTER, docs/kbtp.md §3.7): DIRECT_ALLOC with a plain FetchAdd",
    )
    parser.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    add_json_argument(parser)
    parser.add_argument(
        "--timeout",
        type=positive_seconds,
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
    problem = check_json_path(args.json)
    if problem:
        raise CliError(problem)
    config, roles = demo_config(args)
    bounds.check_target_config(config)  # before the capture file is created
    writer = None
    if not args.no_capture:
        try:
            writer = PcapWriter(args.capture)
        except OSError as exc:
            raise CliError(f"cannot write {args.capture}: {exc.strerror or exc}") from None
    settings = mpa_settings(args)
    target = checked_target(
        config,
        settings=settings,
        tap_factory=pcap_tap_factory(writer) if writer else None,
        offload=args.offload,
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
    status = 1 if demo.failures else 0
    with text_to_stderr_if_json_stdout(args.json):
        print_summary(demo, roles, writer, elapsed)
    if args.json:
        write_json(args.json, demo_document(demo, roles, writer, elapsed, status))
    return status


def _counts(stats: dict[tuple[str, str], OpStats]) -> list[dict[str, Any]]:
    return [
        {"operation": op, "status": status, "count": e.count, "octets": e.octets}
        for (op, status), e in sorted(stats.items())
    ]


def demo_document(
    demo: Demo,
    roles: list[tuple[str, bool]],
    writer: PcapWriter | None,
    elapsed: float,
    exit_status: int,
) -> dict[str, Any]:
    """``kbtp demo --json``: per-initiator counts, checks, bad requests, capture, verdict."""
    config = demo.target.config
    return {
        "schema": schema("kbtp demo"),
        "command": "kbtp demo",
        "parameters": {
            "initiators": len(roles),
            "block_size_bytes": config.block_size,
            "pool_blocks": config.pool_blocks,
            "request_credits": config.request_credits,
            "max_inline_bytes": config.max_inline,
            "ticket_timeout_s": config.ticket_timeout,
            "emss_bytes": demo.settings.emss,
            "offload": demo.args.offload,
            "counter_format": "unmasked" if demo.args.unmasked_counter else "masked",
        },
        "initiators": [
            {
                "identity": identity,
                "trusted": trusted,
                "operations": _counts(demo.per_initiator.get(identity, {})),
            }
            for identity, trusted in roles
        ],
        "totals": _counts(demo.stats),
        "checks": {
            "read_backs": demo.checks,
            "bytes_verified": demo.verified_octets,
            "bad_requests_as_expected": demo.bad_ok,
            "failures": len(demo.failures),
        },
        "bad_requests": [
            {
                "initiator": b.who,
                "request": b.what,
                "expected_status": b.expected,
                "observed_status": b.observed,
                "ok": b.ok,
            }
            for b in demo.bad_requests
        ],
        "capture": None
        if writer is None
        else {"path": os.path.abspath(demo.args.capture), "packets": writer.packets},
        "failures": demo.failures,
        "elapsed_s": elapsed,
        "exit_status": exit_status,
        "verdict": "FAIL" if exit_status else "PASS",
    }


def print_summary(
    demo: Demo, roles: list[tuple[str, bool]], writer: PcapWriter | None, elapsed: float
) -> None:
    shared = sum(1 for _, t in roles if not t)
    print(
        f"kbtp demo: {len(roles)} initiators ({shared} shared-ring, {len(roles) - shared} "
        f"trusted), {demo.target.config.pool_blocks} blocks of {demo.target.config.block_size} "
        f"octets, loopback TCP{', offloaded target' * demo.args.offload}; partition rings "
        f"in the {'unmasked' if demo.args.unmasked_counter else 'masked'} counter format"
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
        print(
            f"  the deliberately malformed requests among the bad requests show up as findings "
            f"(KBTP-5.1) in {demo.args.capture}: iwarp dissect {demo.args.capture} -Y findings"
        )
    verdict = "FAIL" if demo.failures else "PASS"
    print(f"result: {verdict} in {elapsed:.2f} s")
    for line in demo.failures:
        print(f"  {line}")
