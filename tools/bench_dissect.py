"""Benchmark: ``iwarp dissect`` against tshark on the same generated capture, in the same run.

``python -m tools.bench_dissect [--fpdus 100000] [--markers] [--repeat 3] [--keep FILE]``

The capture holds one connection (MPA rev 2 with CRC) carrying a mix of Sends, RDMA Writes
of varied sizes (segmented at MULPDU into several FPDUs), Read Requests and Read
Responses, recorded through the capture-tap writer with an MSS of 1460 bytes, so FPDUs
share segments and straddle segment boundaries.  Both tools run as subprocesses writing
to /dev/null, interpreter and program start-up included; the best of ``--repeat`` runs is
kept.  Pairs compared: the one-line summary (tshark ``-Y iwarp_mpa``) and JSON
(tshark ``-T json -J "iwarp_mpa iwarp_ddp_rdmap"``), tshark with its iWARP dissectors
enabled and the port decoded as iWARP.  Speed is reported, never asserted.
"""

from __future__ import annotations

import argparse
import os
import random
import resource
import shutil
import subprocess
import sys
import tempfile
import time

from stack.constants import MPA_MAX_PRIVATE_DATA
from stack.pcap import Direction, PcapWriter
from stack.wire.events import IrdOrd, MpaFrame, RdmaWrite, ReadRequest, ReadResponse, Send
from stack.wire.framing import FpduFramer, mulpdu_for
from stack.wire.mpa import encode_frame
from stack.wire.rdmap import encode_message

TSHARK_OPTS = [
    "--disable-heuristic",
    "rpcrdma_iwarp",
    "--disable-heuristic",
    "smb_direct_iwarp",
    "-o",
    "iwarp_ddp_rdmap.reassemble_iwarp_rdma_send:FALSE",
]


def generate(path: str, fpdus: int, markers: bool = False, seed: int = 1) -> int:
    """Write a capture with at least ``fpdus`` FPDUs; return the exact FPDU count."""
    rng = random.Random(seed)
    mss = 1460
    mulpdu = mulpdu_for(mss, markers)
    with PcapWriter(path) as writer:
        conn = writer.connection(("192.0.2.1", 40000), ("192.0.2.2", 4791), mss=mss)
        now = 0.0
        word = IrdOrd(16, 16)
        request = MpaFrame(reply=False, crc=True, markers=markers, rev=2, ird_ord=word)
        reply = MpaFrame(reply=True, crc=True, markers=markers, rev=2, ird_ord=word)
        conn.record(
            Direction.SENT, encode_frame(request, max_private_data=MPA_MAX_PRIVATE_DATA), now
        )
        conn.record(Direction.RECEIVED, encode_frame(reply), now)
        tx = FpduFramer(crc=True, markers=markers)
        rx = FpduFramer(crc=True, markers=markers)
        msn_send = msn_read = 1
        count = 0
        to = 0
        while count < fpdus:
            now += 1e-5
            kind = rng.random()
            if kind < 0.45:
                msg = Send(bytes(rng.randrange(0, 256)))
                ulpdus = encode_message(msg, msn=msn_send, mulpdu=mulpdu)
                msn_send += 1
            elif kind < 0.85:
                size = rng.choice((64, 512, 1024, 4096, 8192))
                ulpdus = encode_message(RdmaWrite(0x100, to, bytes(size)), msn=None, mulpdu=mulpdu)
                to += size
            else:
                size = rng.choice((128, 2048))
                req = ReadRequest(0x200, 0x1000, size, 0x300, 0x2000)
                ulpdus = encode_message(req, msn=msn_read, mulpdu=mulpdu)
                msn_read += 1
                conn.record(Direction.SENT, b"".join(tx.frame(u) for u in ulpdus), now)
                count += len(ulpdus)
                resp = ReadResponse(0x200, 0x1000, bytes(size))
                ulpdus = encode_message(resp, msn=None, mulpdu=mulpdu)
                conn.record(Direction.RECEIVED, b"".join(rx.frame(u) for u in ulpdus), now)
                count += len(ulpdus)
                continue
            conn.record(Direction.SENT, b"".join(tx.frame(u) for u in ulpdus), now)
            count += len(ulpdus)
        conn.close(now)
    return count


_ENV: dict[str, str] | None = None


Timing = tuple[float, float]  # (wall seconds, CPU seconds of the child: user + system)


def _once(cmd: list[str]) -> Timing:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.run(
        cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False, env=_ENV
    )
    elapsed = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise SystemExit(f"command failed ({proc.returncode}): {' '.join(cmd)}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return elapsed, cpu


def _race(mine: list[str], theirs: list[str] | None, repeat: int) -> tuple[Timing, Timing | None]:
    """Best wall and CPU time of each command; runs alternate so both see the same load."""
    best_mine = (float("inf"), float("inf"))
    best_theirs: Timing | None = (float("inf"), float("inf")) if theirs else None
    for _ in range(repeat):
        wall, cpu = _once(mine)
        best_mine = (min(best_mine[0], wall), min(best_mine[1], cpu))
        if theirs and best_theirs is not None:
            wall, cpu = _once(theirs)
            best_theirs = (min(best_theirs[0], wall), min(best_theirs[1], cpu))
    return best_mine, best_theirs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.bench_dissect", description=__doc__)
    parser.add_argument("--fpdus", type=int, default=100_000)
    parser.add_argument("--markers", action="store_true", help="markers in both directions")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--keep", metavar="FILE", help="write the capture here and keep it")
    parser.add_argument("--no-json", action="store_true", help="compare the summaries only")
    args = parser.parse_args(argv)
    tshark = shutil.which("tshark")
    global _ENV
    with tempfile.TemporaryDirectory() as tmp:
        # Byte-compiled modules as an installed package has them (a session may run with
        # PYTHONDONTWRITEBYTECODE, which would recompile every module at each start);
        # the cache goes to the temporary directory, not into the source tree.
        _ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
        _ENV["PYTHONPYCACHEPREFIX"] = os.path.join(tmp, "pycache")
        _once([sys.executable, "-m", "stack.cli.iwarp", "dissect", "--help"])
        path = args.keep or os.path.join(tmp, "bench.pcap")
        t0 = time.perf_counter()
        count = generate(path, args.fpdus, args.markers)
        size = os.path.getsize(path)
        print(
            f"capture: {count} FPDUs, {size / 1e6:.1f} MB, markers "
            f"{'on' if args.markers else 'off'} (generated in {time.perf_counter() - t0:.1f} s)"
        )
        ours = [sys.executable, "-m", "stack.cli.iwarp", "dissect", path]
        pairs = [("summary", ours, [tshark, "-n", "-r", path, *TSHARK_OPTS, "-Y", "iwarp_mpa"])]
        if not args.no_json:
            pairs.append(
                (
                    "json",
                    [*ours, "--json"],
                    [tshark, "-n", "-r", path, *TSHARK_OPTS, "-Y", "iwarp_mpa", "-T", "json",
                     "-J", "iwarp_mpa iwarp_ddp_rdmap"],
                )
            )  # fmt: skip
        for label, mine, theirs in pairs:
            (w_ours, c_ours), ts = _race(mine, theirs if tshark else None, args.repeat)
            line = (
                f"{label:8} iwarp dissect {w_ours:6.2f} s wall {c_ours:6.2f} s CPU "
                f"({count / w_ours:7.0f} FPDU/s)"
            )
            if ts is not None:
                w_ts, c_ts = ts
                line += (
                    f" | tshark {w_ts:6.2f} s wall {c_ts:6.2f} s CPU ({count / w_ts:7.0f} FPDU/s)"
                    f" | tshark/ours wall {w_ts / w_ours:.2f} CPU {c_ts / c_ours:.2f}"
                )
            else:
                line += " | tshark not installed"
            print(line)
        if tshark:
            version = subprocess.run(
                [tshark, "--version"], capture_output=True, text=True, check=False
            ).stdout.splitlines()
            print(f"tshark: {version[0] if version else 'unknown version'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
