"""Progress of long benchmark runs on stderr (:class:`Progress`); tables go to stdout."""

from __future__ import annotations

import time
from typing import TextIO


class Progress:
    """Progress of long runs on a stream (stderr): a line rewritten in place on a terminal,
    a line every few seconds otherwise; silent for runs shorter than ``delay`` seconds."""

    def __init__(self, stream: TextIO | None, *, delay: float = 1.0, interval: float = 0.5):
        self.stream = stream
        self.delay = delay
        self.interval = interval
        self.tty = bool(stream is not None and stream.isatty())
        self._label = ""
        self._total: int | None = None
        self._duration: float | None = None
        self._start = self._next = 0.0
        self._done = 0
        self._shown = False

    def start(self, label: str, total: int | None = None, duration: float | None = None) -> None:
        self._label, self._total, self._duration = label, total, duration
        self._start = time.perf_counter()
        self._next = self._start + self.delay
        self._done = 0
        self._shown = False

    def advance(self, count: int) -> None:
        self._done += count
        if self.stream is None:
            return
        now = time.perf_counter()
        if now < self._next:
            return
        self._next = now + (self.interval if self.tty else 5 * self.interval)
        elapsed = now - self._start
        if self._total:
            state = f"{self._done}/{self._total} ({100 * self._done // self._total}%)"
        else:
            state = f"{self._done} in {elapsed:.1f}/{self._duration or 0:.0f} s"
        text = f"bench: {self._label}: {state}"
        if self.tty:
            self.stream.write(f"\r{text}\x1b[K")
        else:
            self.stream.write(text + "\n")
        self.stream.flush()
        self._shown = True

    def note(self, text: str) -> None:
        if self.stream is not None:
            self.finish()
            self.stream.write(f"bench: {text}\n")
            self.stream.flush()

    def finish(self) -> None:
        if self.stream is not None and self._shown and self.tty:
            self.stream.write("\r\x1b[K")
            self.stream.flush()
        self._shown = False
