"""Part 1: decoder fuzzing with generated and mutated inputs, random chunking, a watchdog.

Each input runs in-process under a per-input watchdog (``signal.setitimer``): an input
still running after :data:`HANG_SECONDS` is a *hang*.  An exception other than the
target's documented error types, or a broken decoder promise (:class:`Invariant`), is a
*crash*.  A stream engine whose outcome changes with the chunking of its input has
*diverged* (counted with the crashes).  Every crashing, hanging or diverging input is
written to the corpus directory as ``<target>-<content id>.bin``; the corpus is replayed first
on every run.
"""

from __future__ import annotations

import random
import signal
import time
import traceback
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

from tools.campaign.targets import Target, all_targets, split

HANG_SECONDS = 5.0
CORPUS = Path(__file__).resolve().parent / "corpus"
INTERESTING_8 = (0x00, 0x01, 0x7F, 0x80, 0xFE, 0xFF)
INTERESTING_16 = (
    0,
    1,
    2,
    3,
    4,
    0x7F,
    0x80,
    0xFF,
    0x100,
    0x200,
    0x201,
    0x7FFF,
    0x8000,
    0xFFFE,
    0xFFFF,
)
INTERESTING_32 = (0, 1, 0x7FFFFFFF, 0x80000000, 0xFFFFFFFE, 0xFFFFFFFF, 0x10000, 0xFFFF)


def content_id(data: bytes) -> str:
    """A short name derived from the bytes (SHA-1 based UUID 5, its first 12 hex digits)."""
    return uuid.uuid5(uuid.NAMESPACE_OID, data.hex()).hex[:12]


class Hang(BaseException):
    """Raised by the watchdog inside an input that ran too long (never caught by decoders)."""


@dataclass
class Finding:
    """One crashing, hanging or diverging input."""

    target: str
    kind: str  # crash | hang | diverged
    detail: str
    path: str | None = None


@dataclass
class TargetFigures:
    """What fuzzing one target gave."""

    name: str
    inputs: int = 0
    replayed: int = 0
    crashes: int = 0
    hangs: int = 0
    diverged: int = 0
    slowest_ms: float = 0.0
    seconds: float = 0.0
    findings: list[Finding] = field(default_factory=list)


def _alarm(signum: int, frame: FrameType | None) -> None:
    raise Hang(f"input still running after {HANG_SECONDS:g} s")


def mutate(rng: random.Random, data: bytes, pool: list[bytes], max_len: int) -> bytes:
    """``data`` with 1-4 random edits: flips, interesting values, inserts, cuts, splices."""
    buf = bytearray(data)
    for _ in range(rng.choice((1, 1, 2, 2, 3, 4))):
        n = len(buf)
        op = rng.randrange(12)
        pos = rng.randrange(n) if n else 0
        if op == 0 and n:
            buf[pos] ^= 1 << rng.randrange(8)
        elif op == 1 and n:
            buf[pos] = rng.randrange(256)
        elif op == 2 and n:
            buf[pos] = rng.choice(INTERESTING_8)
        elif op == 3 and n >= 2:
            pos = min(pos, n - 2)
            buf[pos : pos + 2] = rng.choice(INTERESTING_16).to_bytes(2, "big")
        elif op == 4 and n >= 4:
            pos = min(pos, n - 4)
            buf[pos : pos + 4] = rng.choice(INTERESTING_32).to_bytes(
                4, rng.choice(("big", "little"))
            )
        elif op == 5:
            buf[pos:pos] = rng.randbytes(rng.randint(1, 16))
        elif op == 6 and n:
            del buf[pos : pos + rng.randint(1, 32)]
        elif op == 7 and n:
            end = min(n, pos + rng.randint(1, 64))
            buf[pos:pos] = buf[pos:end]
        elif op == 8:
            del buf[rng.randint(0, n) :]
        elif op == 9:
            buf += rng.randbytes(rng.randint(1, 64))
        elif op == 10 and pool:
            other = rng.choice(pool)
            buf = buf[: rng.randint(0, n)] + other[rng.randint(0, len(other)) :]
        elif op == 11 and n and pool:
            other = rng.choice(pool)
            if other:
                start = rng.randrange(len(other))
                piece = other[start : start + rng.randint(1, 32)]
                buf[pos : pos + len(piece)] = piece
    return bytes(buf[:max_len])


def generate(rng: random.Random, target: Target) -> bytes:
    """A generated input: random bytes, or a seed's valid prefix then random bytes."""
    if rng.random() < 0.4 or not target.seeds:
        return rng.randbytes(rng.randint(0, min(target.max_len, 256)))
    seed = rng.choice(target.seeds)
    return seed[: rng.randint(0, len(seed))] + rng.randbytes(rng.randint(0, 128))


def random_cuts(rng: random.Random, n: int) -> list[int]:
    """Cut points for a stream of ``n`` bytes: a few anywhere, or byte by byte at the start."""
    if n <= 1:
        return []
    if rng.random() < 0.15:
        return list(range(1, min(n, 96)))
    return sorted(rng.randint(1, n - 1) for _ in range(rng.randint(1, 8)))


class Runner:
    """Runs inputs through targets with the watchdog and records the figures."""

    def __init__(self, corpus: Path = CORPUS, save: bool = True) -> None:
        self.corpus = corpus
        self.save = save

    def _save(self, target: Target, data: bytes) -> str | None:
        if not self.save:
            return None
        self.corpus.mkdir(parents=True, exist_ok=True)
        path = self.corpus / f"{target.name}-{content_id(data)}.bin"
        if not path.exists():
            path.write_bytes(data)
        return str(path)

    def _timed(self, target: Target, data: bytes, chunks: list[bytes]) -> tuple[Any, float]:
        start = time.perf_counter()
        signal.setitimer(signal.ITIMER_REAL, HANG_SECONDS)
        try:
            outcome = target.run(data, chunks)
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
        return outcome, time.perf_counter() - start

    def one(self, target: Target, data: bytes, figures: TargetFigures, rng: random.Random) -> None:
        """Run one input (and, for stream engines, once more cut at random points)."""
        figures.inputs += 1
        try:
            stream = data[1:] if target.config_octet else data
            whole, took = self._timed(target, data, [stream] if stream else [])
            figures.slowest_ms = max(figures.slowest_ms, took * 1000)
            if target.chunked and len(stream) > 1:
                chunks = split(stream, random_cuts(rng, len(stream)))
                cut, took = self._timed(target, data, chunks)
                figures.slowest_ms = max(figures.slowest_ms, took * 1000)
                if cut != whole:
                    figures.diverged += 1
                    self._record(
                        figures,
                        target,
                        data,
                        "diverged",
                        f"outcome depends on the chunking: {_short(whole)} vs {_short(cut)}",
                    )
        except Hang as exc:
            figures.hangs += 1
            self._record(figures, target, data, "hang", str(exc))
        except target.allowed:
            pass  # documented error escaping a runner that does not catch it itself
        except Exception as exc:  # Invariant is an AssertionError
            figures.crashes += 1
            where = traceback.extract_tb(exc.__traceback__)[-1]
            self._record(
                figures,
                target,
                data,
                "crash",
                f"{type(exc).__name__}: {exc} at {Path(where.filename).name}:{where.lineno}",
            )

    def _record(
        self, figures: TargetFigures, target: Target, data: bytes, kind: str, detail: str
    ) -> None:
        if len(figures.findings) < 20:
            figures.findings.append(Finding(target.name, kind, detail, self._save(target, data)))

    def corpus_inputs(self, target: Target) -> list[bytes]:
        if not self.corpus.is_dir():
            return []
        return [p.read_bytes() for p in sorted(self.corpus.glob(f"{target.name}-*.bin"))]

    def fuzz(
        self,
        target: Target,
        count: int,
        rng: random.Random,
        progress: Callable[[str], None] | None = None,
    ) -> TargetFigures:
        """Replay the corpus, the seeds, then ``count`` generated and mutated inputs."""
        figures = TargetFigures(target.name)
        started = time.perf_counter()
        previous = signal.signal(signal.SIGALRM, _alarm)
        try:
            target.seeds = target.make_seeds()
            replay = self.corpus_inputs(target)
            figures.replayed = len(replay)
            for data in replay + target.seeds:
                self.one(target, data, figures, rng)
            pool = target.seeds + replay
            step = max(count // 10, 1)
            for i in range(count):
                if rng.random() < 0.25:
                    data = generate(rng, target)
                else:
                    data = mutate(rng, rng.choice(pool), pool, target.max_len)
                self.one(target, data, figures, rng)
                if progress is not None and (i + 1) % step == 0:
                    progress(
                        f"{target.name}: {i + 1}/{count} inputs, {figures.crashes} crashes, "
                        f"{figures.hangs} hangs, {figures.diverged} diverged"
                    )
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)
        figures.seconds = time.perf_counter() - started
        return figures


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) < 200 else text[:200] + "..."


def run_fuzz(
    total: int,
    seed: int,
    progress: Callable[[str], None] | None = None,
    only: list[str] | None = None,
    save: bool = True,
) -> list[TargetFigures]:
    """Fuzz every target (or those named in ``only``), ``total`` inputs split by weight."""
    targets = [t for t in all_targets() if not only or t.name in only]
    weights = sum(t.weight for t in targets) or 1.0
    runner = Runner(save=save)
    out = []
    for k, target in enumerate(targets):
        rng = random.Random(f"{seed}:{target.name}")
        count = max(int(total * target.weight / weights), 50)
        out.append(runner.fuzz(target, count, rng, progress))
        if progress is not None:
            f = out[-1]
            progress(
                f"{target.name}: done, {f.inputs} inputs in {f.seconds:.1f} s "
                f"({k + 1}/{len(targets)} targets)"
            )
    return out
