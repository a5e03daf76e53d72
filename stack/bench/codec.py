"""``iwarp bench codec``: FPDU encode/decode throughput against a crc32c + copy baseline.

For each ULPDU size (default 4 KiB and the 64768-byte maximum ULPDU) and markers off/on,
with CRC on, it measures in one run:

* encode: :meth:`FpduFramer.frame` on the same ULPDU, FPDU after FPDU;
* decode: :class:`FpduDeframer` fed an encoded stream as ``bytes`` chunks of ``--chunk``
  bytes (as TCP reads arrive; chunks are cut before timing), draining every ULPDU;
* baseline: one CRC32c over the ULPDU plus one copy of it (``bytearray``), per FPDU.

All three work on cache-resident data, so the comparison is about the code, not about
memory bandwidth: encode reuses one ULPDU, decode replays a stream of about
``WORKING_SET`` bytes with a fresh deframer per pass, the baseline reuses one ULPDU.
Throughput counts ULPDU bytes.  Each figure is the best of ``--repeat`` runs, timed by
this thread's CPU time by default (``--clock wall`` for elapsed time).  ``ratio`` is
the slower codec direction over the baseline; the goal is >= 0.5 at 64 KiB.  Also runnable
as ``python -m stack.bench.codec``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from stack.cli import (
    MAX_REPEAT,
    CliError,
    bounded_int,
    call,
    one_line_errors,
    positive_int,
    repeat_count,
)
from stack.cli.json_report import add_json_argument, check_json_path, write_json
from stack.constants import MULPDU_MAX
from stack.crc import BACKEND, crc32c
from stack.transport.pumping import RECEIVE_SIZE
from stack.wire.framing import FpduDeframer, FpduFramer

DEFAULT_SIZES = (4096, MULPDU_MAX)
MAX_MIB = 1 << 14
"""Most MiB per measurement (``--mib``): 16 GiB, about half a minute per figure at 4 KiB."""
WORKING_SET = 1 << 20
"""Bytes of encoded stream the decode measurement replays (fits in L2/L3 caches)."""


@dataclass(frozen=True, slots=True)
class CodecResult:
    """One table row.  Fields: size, markers, encode/decode/baseline in MB/s (10^6 B/s)."""

    size: int
    markers: bool
    encode: float
    decode: float
    baseline: float

    @property
    def ratio(self) -> float:
        return min(self.encode, self.decode) / self.baseline


CLOCKS: dict[str, Callable[[], float]] = {"cpu": time.thread_time, "wall": time.perf_counter}
"""``cpu`` (this thread's CPU time) is robust on a busy machine; ``wall`` is elapsed time."""


def _best_of(repeat: int, fn: Callable[[], None], clock: Callable[[], float]) -> float:
    best = float("inf")
    for _ in range(repeat):
        start = clock()
        fn()
        best = min(best, clock() - start)
    return best


def measure(
    size: int,
    markers: bool,
    *,
    count: int,
    repeat: int,
    chunk: int,
    clock: Callable[[], float] = time.thread_time,
    progress: Callable[[str], None] = lambda _: None,
) -> CodecResult:
    """Measure encode, decode and baseline for ``count`` FPDUs of ``size`` ULPDU bytes."""
    ulpdu = os.urandom(size)
    label = f"{size} B, markers {'on' if markers else 'off'}"

    def encode() -> None:
        frame = FpduFramer(crc=True, markers=markers).frame
        for _ in range(count):
            frame(ulpdu)

    per_pass = max(1, min(count, WORKING_SET // size))
    passes = -(-count // per_pass)
    framer = FpduFramer(crc=True, markers=markers)
    stream = b"".join(bytes(framer.frame(ulpdu)) for _ in range(per_pass))
    chunks = [stream[i : i + chunk] for i in range(0, len(stream), chunk)]
    del stream

    def decode() -> None:
        got = 0
        for _ in range(passes):
            deframer = FpduDeframer(crc=True, markers=markers)
            feed = deframer.feed
            for piece in chunks:
                feed(piece)
                for _ in deframer:
                    got += 1
        if got != passes * per_pass:
            raise RuntimeError(f"decoded {got} of {passes * per_pass} FPDUs")

    def baseline() -> None:
        for _ in range(count):
            crc32c(ulpdu)
            bytearray(ulpdu)

    total = size * count / 1e6
    progress(f"{label}: encode")
    t_enc = _best_of(repeat, encode, clock)
    progress(f"{label}: decode")
    t_dec = _best_of(repeat, decode, clock)
    progress(f"{label}: baseline")
    t_base = _best_of(repeat, baseline, clock)
    decoded = size * passes * per_pass / 1e6
    return CodecResult(size, markers, total / t_enc, decoded / t_dec, total / t_base)


def format_table(results: Sequence[CodecResult]) -> str:
    header = ("size", "markers", "encode MB/s", "decode MB/s", "baseline MB/s", "ratio")
    rows = [
        (
            str(r.size),
            "on" if r.markers else "off",
            f"{r.encode:,.0f}",
            f"{r.decode:,.0f}",
            f"{r.baseline:,.0f}",
            f"{r.ratio:.2f}",
        )
        for r in results
    ]
    widths = [max(len(h), *(len(row[i]) for row in rows)) for i, h in enumerate(header)]
    lines = ["  ".join(h.rjust(w) for h, w in zip(header, widths, strict=True))]
    lines += ["  ".join(c.rjust(w) for c, w in zip(row, widths, strict=True)) for row in rows]
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    sizes = args.sizes or list(DEFAULT_SIZES)
    for size in sizes:
        if not 0 < size <= MULPDU_MAX:
            raise CliError(f"ULPDU size must be 1..{MULPDU_MAX}, got {size}")
    problem = check_json_path(args.json)
    if problem:
        raise CliError(problem)
    combos = [(size, markers) for size in sizes for markers in (False, True)]
    tty = sys.stderr.isatty()

    def progress(step: int) -> Callable[[str], None]:
        def show(what: str) -> None:
            text = f"[{step}/{len(combos)}] {what}"
            print(f"\r\033[K{text}" if tty else text, end="" if tty else "\n", file=sys.stderr)

        return show

    print(
        f"iwarp bench codec: CRC on, crc32c backend '{BACKEND}', "
        f"~{args.mib} MiB per measurement, best of {args.repeat}, "
        f"decode chunks of {args.chunk} B, {args.clock} clock",
        file=sys.stderr,
    )
    results = []
    for step, (size, markers) in enumerate(combos, 1):
        count = max(16, args.mib * (1 << 20) // size)
        results.append(
            measure(
                size,
                markers,
                count=count,
                repeat=args.repeat,
                chunk=args.chunk,
                clock=CLOCKS[args.clock],
                progress=progress(step),
            )
        )
    if tty:
        print("\r\033[K", end="", file=sys.stderr)
    print(format_table(results), file=sys.stderr if args.json == "-" else sys.stdout)
    if args.json:
        from stack.bench.export import codec_document

        parameters = {
            "sizes_bytes": sizes,
            "crc": True,
            "crc32c_backend": BACKEND,
            "mib_per_measurement": args.mib,
            "repeat": args.repeat,
            "chunk_bytes": args.chunk,
            "clock": args.clock,
        }
        write_json(args.json, codec_document(parameters, results, 0))
    return 0


def _mib(text: str) -> int:
    """``--mib``: 1 to :data:`MAX_MIB`."""
    return bounded_int(text, MAX_MIB)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--size",
        dest="sizes",
        type=int,
        action="append",
        metavar="BYTES",
        help=f"ULPDU size (repeatable; default {' and '.join(map(str, DEFAULT_SIZES))})",
    )
    parser.add_argument(
        "--mib",
        type=_mib,
        default=32,
        help=f"MiB per measurement (default 32, at most {MAX_MIB})",
    )
    parser.add_argument(
        "--repeat",
        type=repeat_count,
        default=5,
        help=f"best of N runs (default 5, at most {MAX_REPEAT})",
    )
    parser.add_argument(
        "--chunk",
        type=positive_int,
        default=RECEIVE_SIZE,
        help=f"decode input chunk size (default {RECEIVE_SIZE}, the trio driver's receive size)",
    )
    parser.add_argument(
        "--clock",
        choices=sorted(CLOCKS),
        default="cpu",
        help="cpu: thread CPU time, robust under load (default); wall: elapsed time",
    )
    add_json_argument(parser)
    parser.set_defaults(func=run)


def register_bench(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "codec",
        help="FPDU encode/decode throughput vs a crc32c + copy baseline",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
    )
    add_arguments(parser)
    one_line_errors(parser)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench_codec")
    add_arguments(parser)
    return call(parser.parse_args(argv), parser.prog)


if __name__ == "__main__":
    raise SystemExit(main())
