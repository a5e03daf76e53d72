"""Load-independent cost of KBTP operations: work counted, not time measured.

``python -m tools.kbtp_op_profile [--ops store,load,alloc_store] [--size 64K] [--inflight 16]
[--iters 1000] [--instructions] [--top N] [--baseline DIR] [--json]``

What ``kbtp bench`` does per row, counted instead of timed: one session, the target and
the initiator in this one process over loopback TCP (the real trio driver, CRC on, the
loopback EMSS), the buffers spans of one arena registered once, ``--inflight`` requests
outstanding, each completion submitting the next (:func:`kbtp.cli.bench_kbtp._pipelined`).
Per operation, both ends together:

``python_calls``     Python function calls (cProfile), the tool's own counting wrappers
                     excluded;
``socket_calls``     ``send``/``sendmsg``/``recv``/``recv_into`` of both ends;
``scheduler_passes`` trio run-loop iterations (each waits for I/O once);
``task_steps``       trio task steps (each wake-up of a task: a checkpoint's cost);
``instructions``     (``--instructions``) user-space instructions counted by valgrind's
                     callgrind over the row run twice, ``--iters`` operations apart, in
                     two processes; the difference divided by ``--iters`` (set-up,
                     imports and the warm-up cancel out; the pool is the same size in
                     both, the set-up's objects frozen out of the garbage collector).
                     The same tree gives the same count whatever the machine's
                     load; it takes a few minutes per operation.

``--top N`` prints the N functions with the most own time and the N most called per
operation (cProfile, per operation).  ``--baseline DIR`` measures another source tree the
same way in the same run (before and after a change).  Counts are reported, never asserted.
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import json
import os
import pstats
import sys
from contextlib import nullcontext
from typing import Any

import trio

from kbtp.arena import Arena
from kbtp.cli import bounds
from kbtp.cli.bench_cpu import no_peer
from kbtp.cli.bench_kbtp import _arena_requests, _pipelined
from kbtp.cli.bench_peer import IDENTITY, bench_config
from kbtp.cli.target import LOOPBACK_EMSS, checked_target
from kbtp.constants import DEFAULT_MAX_INLINE
from kbtp.initiator import KbtpInitiator
from stack.wire.events import MpaSettings

if __package__:
    from tools import profiling
else:  # run as a file, by --baseline: this checkout's sibling (tools.profiling)
    import profiling  # type: ignore[no-redef]

OPS = ("store", "load", "alloc_store")
WARMUP = 64


def row(
    op: str, size: int, inflight: int, iters: int, pool_iters: int, mode: str, top: int = 0
) -> dict[str, Any]:
    """Run ``iters`` operations ``op`` after a warm-up (``mode`` "count": the figures per
    operation; "loop": nothing counted, for callgrind).  ``pool_iters``: the pool is sized
    for that many ALLOC_STOREs whatever ``iters`` is (the same set-up in both runs)."""
    return trio.run(_row, op, size, inflight, iters, pool_iters, mode, top)


async def _row(
    op: str, size: int, inflight: int, iters: int, pool_iters: int, mode: str, top: int
) -> dict[str, Any]:
    settings = MpaSettings(emss=LOOPBACK_EMSS)  # CRC requested (the default), as the bench
    fresh = WARMUP + 2 * pool_iters if op == "alloc_store" else 0  # a block per ALLOC_STORE
    blocks = inflight + 16 + fresh
    config = bench_config(size, blocks, inflight, DEFAULT_MAX_INLINE)
    data = bytearray(os.urandom(size))
    out: dict[str, Any] = {}
    with profiling.counting_sockets() if mode == "count" else nullcontext([0]) as sockets:
        target = checked_target(config, settings=settings)
        async with (
            target.running() as target,
            KbtpInitiator.connect(
                "127.0.0.1", target.port, IDENTITY.decode(), settings=settings
            ) as ini,
        ):
            for w in range(inflight):
                await ini.alloc_store(w, data)
            memory = bytearray(data * inflight)
            arena = Arena.register(ini.pd, memory)
            requests = _arena_requests(ini, arena, 0, inflight, size, None)
            request_for = requests[op]
            base = [inflight]

            def shifted(w: int, i: int) -> Any:  # ALLOC_STORE handles never repeat
                return request_for(w, i + base[0] - inflight)

            async def run(n: int) -> None:
                await _pipelined(ini, inflight, n, shifted, no_peer)
                base[0] += n

            if op == "load":
                for w in range(inflight):
                    await ini.store(w, data, seal=True)
            await run(WARMUP)
            # The set-up's objects out of the collector's way: a full collection over them
            # landing inside or outside the counted operations would move the count by
            # thousands of instructions per operation from one tree to the next.
            gc.collect()
            gc.freeze()
            if mode == "loop":
                await run(iters)
            else:
                profile = cProfile.Profile()
                sockets[0] = 0
                profile.enable()
                await run(iters)
                profile.disable()
                stats = pstats.Stats(profile)
                total: int = stats.total_calls  # type: ignore[attr-defined]
                out["python_calls"] = (total - sockets[0]) / iters
                out["by_area"] = _by_area(stats, iters)
                if top:
                    out["top"] = _top(stats, iters, top)
                steps = profiling.Steps()
                trio.lowlevel.add_instrument(steps)
                sockets[0] = 0
                steps.counting = True
                await run(iters)
                steps.counting = False
                trio.lowlevel.remove_instrument(steps)
                out["socket_calls"] = sockets[0] / iters
                out["scheduler_passes"] = steps.passes / iters
                out["task_steps"] = steps.steps / iters
            arena.close()
    return out


def _top(stats: pstats.Stats, iters: int, n: int) -> dict[str, list[tuple[str, float, float]]]:
    """The ``n`` functions with the most own time and the ``n`` most called: (name, calls
    per operation, own µs per operation under the profiler)."""
    rows = []
    for (path, line, name), (_cc, calls, tottime, _ct, _callers) in stats.stats.items():  # type: ignore[attr-defined]
        short = f"{_short(path)}:{line}({name})"
        rows.append((short, calls / iters, tottime * 1e6 / iters))
    by_time = sorted(rows, key=lambda r: -r[2])[:n]
    by_calls = sorted(rows, key=lambda r: -r[1])[:n]
    return {"tottime": by_time, "calls": by_calls}


def _area(path: str) -> str:
    """The part of the code a function belongs to: kbtp, stack, trio, tools or other."""
    for root in ("kbtp", "stack", "trio", "tools"):
        if f"/{root}/" in path:
            return root
    return "other"


def _by_area(stats: pstats.Stats, iters: int) -> dict[str, float]:
    """Calls per operation by the area of the caller: a Python function counts for its own
    area, a built-in one (``len``, ``struct.pack``) for the areas of its callers."""
    areas: dict[str, float] = {}
    for (path, _line, _name), (_cc, calls, _tt, _ct, callers) in stats.stats.items():  # type: ignore[attr-defined]
        if path != "~":
            areas[_area(path)] = areas.get(_area(path), 0) + calls / iters
            continue
        for (cpath, _cl, _cn), caller in callers.items():
            area = _area(cpath)
            areas[area] = areas.get(area, 0) + caller[1] / iters
    return dict(sorted(areas.items()))


def _short(path: str) -> str:
    for root in ("/kbtp/", "/stack/", "/trio/", "/tools/"):
        if root in path:
            return root.strip("/") + "/" + path.split(root, 1)[1]
    return os.path.basename(path) if path.startswith("/") else path


def instructions(op: str, size: int, inflight: int, iters: int) -> int:
    """User-space instructions of ``iters`` more operations: callgrind's total over the
    row with ``iters`` + 100 operations less its total over 100 (set-up cancels)."""
    env = dict(os.environ, PYTHONHASHSEED="0")  # the same dict layouts in both runs
    script = os.path.abspath(__file__)
    totals = []
    for n in (100, iters + 100):
        loop = [script, "--loop", op, str(size), str(inflight), str(n), str(iters + 100)]
        totals.append(profiling.callgrind_instructions("kbtp_op_profile", loop, f"{op} x {n}", env))
    return totals[1] - totals[0]


def measure(
    ops: list[str], size: int, inflight: int, iters: int, with_instructions: bool, top: int
) -> dict[str, dict[str, Any]]:
    """Every figure of this tool, by operation."""
    out: dict[str, dict[str, Any]] = {}
    for op in ops:
        figures = row(op, size, inflight, iters, iters, "count", top)
        if with_instructions:
            figures["instructions"] = instructions(op, size, inflight, iters) / iters
        out[op] = figures
    return out


COLUMNS = ("python_calls", "socket_calls", "scheduler_passes", "task_steps", "instructions")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.kbtp_op_profile", description=__doc__)
    parser.add_argument("--ops", default=",".join(OPS), help="operations, comma separated")
    parser.add_argument("--size", type=bounds.block_size, default=64 << 10, help="block size")
    parser.add_argument("--inflight", type=int, default=16, help="requests in flight")
    parser.add_argument("--iters", type=int, default=1000, help="operations counted")
    parser.add_argument("--top", type=int, default=0, help="show the top N functions")
    profiling.add_common_arguments(parser)
    parser.add_argument("--loop", nargs=5, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.loop:  # one row alone, for callgrind
        op, size, inflight, n, pool = args.loop
        row(op, int(size), int(inflight), int(n), int(pool), "loop")
        return 0
    ops = [o.strip() for o in args.ops.split(",") if o.strip()]
    unknown = [o for o in ops if o not in OPS]
    if unknown:
        parser.error(f"unknown operation {unknown[0]!r}")
    ours = measure(ops, args.size, args.inflight, args.iters, args.instructions, args.top)
    if args.json:
        print(json.dumps(ours))
        return 0
    rows = {"": ours}
    if args.baseline:
        own = ["--ops", args.ops, "--size", str(args.size), "--inflight", str(args.inflight)]
        own += ["--iters", str(args.iters)] + (["--instructions"] if args.instructions else [])
        rows = {"baseline": profiling.measure_in_tree(__file__, args.baseline, own), "": ours}
    columns = [c for c in COLUMNS if c != "instructions" or args.instructions]
    print(f"{'op':<22}" + "".join(f"{c:>18}" for c in columns))
    for op in ours:
        for label, figures in rows.items():
            name = f"{op}@{label}" if label else op
            cells = "".join(
                f"{figures[op][c]:>18.1f}" if c in figures[op] else f"{'-':>18}" for c in columns
            )
            print(f"{name:<22}{cells}")
    print("\ncalls per operation by area (built-ins counted for their callers):")
    for op in ours:
        for label, figures in rows.items():
            name = f"{op}@{label}" if label else op
            areas = figures[op].get("by_area", {})
            print(f"  {name:<20}" + "  ".join(f"{a} {c:.1f}" for a, c in areas.items()))
    for op, figures in ours.items():
        if "top" not in figures:
            continue
        for key, title in (("tottime", "own time"), ("calls", "calls")):
            print(f"\n{op}: top {args.top} by {title} (per operation: calls, own µs profiled)")
            for name, calls, us in figures["top"][key]:
                print(f"  {calls:8.2f} {us:8.2f}  {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
