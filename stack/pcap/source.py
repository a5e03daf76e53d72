"""The bytes of a capture, read from its source through a bounded window.

A :class:`CaptureInput` wraps a path (``-`` is standard input), an open binary file, a
pipe or in-memory bytes.  Its window holds the bytes read and not yet walked; the walkers
of :mod:`stack.pcap.reader` ask for a new window starting at the record they stand on
whenever that record is not complete in the current one.  Windows are fresh buffers, never
reused, so the ``memoryview`` slices handed out stay valid as long as someone holds them,
and nothing else keeps old windows alive: memory is bounded by :data:`CHUNK` or by the
longest record (at most :data:`~stack.pcap.format.MAX_RECORD_LEN`), not by the file.
"""

from __future__ import annotations

import io
import os
import stat
import sys
from collections.abc import Callable
from typing import IO, Any

from stack.pcap.errors import CaptureError

CHUNK = 1 << 20
"""Bytes asked of the source per read; a window holds at most this or one record."""

Source = (
    str
    | os.PathLike[str]
    | bytes
    | bytearray
    | memoryview
    | IO[bytes]
    | io.RawIOBase
    | io.BufferedIOBase
)
"""A path (``-``: standard input), an open binary file or pipe, or the capture's bytes."""


class CaptureInput:
    """The bytes of a capture as a window that refills from its source, chunk by chunk.

    ``window`` is what was read and not yet walked at open; ``base`` the file offset of
    the window's first byte; ``peak`` the largest window allocated.  In-memory input is
    one window holding everything (``peak`` 0: nothing is buffered).
    """

    __slots__ = ("name", "window", "base", "peak", "_readinto", "_close", "_wait", "_eof")

    def __init__(
        self,
        name: str | None,
        readinto: Callable[[memoryview], int | None] | None = None,
        close: Callable[[], None] | None = None,
        wait: Callable[[], object] | None = None,
        data: memoryview | None = None,
    ) -> None:
        self.name = name
        self.base = 0
        self.peak = 0
        self._readinto = readinto
        self._close = close
        self._wait = wait
        self._eof = readinto is None
        self.window = memoryview(b"") if data is None else data

    def refill(self, buf: memoryview, pos: int, need: int) -> memoryview:
        """A new window starting at ``buf[pos]`` with at least ``need`` bytes (fewer at EOF).

        Reads until ``need`` bytes are there, so a pipe gives back each record as soon as
        it is complete; ``wait`` (the caller's hook) runs before each read from a source
        that may block.  The window grows by at most a chunk beyond what has arrived, so
        a length field promising more than the file holds costs no memory.  The old
        window is left intact for the views into it.
        """
        self.base += pos
        if self._eof:
            return buf[pos:]
        readinto = self._readinto
        assert readinto is not None
        tail = len(buf) - pos
        new = bytearray(tail + CHUNK)
        new[:tail] = buf[pos:]
        filled = tail
        while filled < need:
            if filled == len(new):
                new.extend(bytes(min(CHUNK, need - filled)))
            if self._wait is not None:
                self._wait()
            try:
                with memoryview(new) as view:
                    count = readinto(view[filled:])
            except (OSError, ValueError) as exc:
                raise CaptureError(f"cannot read ({_reason(exc)})", self.name) from None
            if count is None:
                raise CaptureError("non-blocking input is not supported", self.name)
            if not count:
                self._eof = True
                break
            filled += count
        self.peak = max(self.peak, len(new))
        del new[filled:]
        return memoryview(new)

    @property
    def closed(self) -> bool:
        return self._eof and self._close is None

    def close(self) -> None:
        close, self._close = self._close, None
        self._eof = True
        if close is not None:
            close()


def _reason(exc: BaseException) -> str:
    return exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)


def open_capture(source: Source, wait: Callable[[], object] | None) -> CaptureInput:
    """The capture ``source`` opened, its first bytes read (at least 4 unless it is shorter)."""
    if isinstance(source, bytes | bytearray | memoryview):
        return CaptureInput(None, data=memoryview(source).cast("B"))
    close: Callable[[], None] | None = None
    name: str | None
    if isinstance(source, str | os.PathLike):
        name = os.fspath(source)
        if name == "-":
            if sys.stdin is None:
                raise CaptureError("no standard input", "<stdin>")
            name, stream = "<stdin>", sys.stdin.buffer
        else:
            try:
                stream = open(name, "rb", buffering=0)  # noqa: SIM115 - closed by CaptureInput
            except FileNotFoundError:
                raise CaptureError("no such file", name) from None
            except IsADirectoryError:
                raise CaptureError("is a directory", name) from None
            except OSError as exc:
                raise CaptureError(f"cannot read ({_reason(exc)})", name) from None
            close = stream.close
    else:
        stream = source
        if isinstance(stream, io.TextIOBase):
            buffer = getattr(stream, "buffer", None)
            if buffer is None:
                raise CaptureError("a text stream: open the capture in binary mode")
            stream = buffer
        label = getattr(stream, "name", None)
        name = label if isinstance(label, str) else None
    inp = CaptureInput(name, _reader_of(stream), close, None if _never_blocks(stream) else wait)
    try:
        inp.window = inp.refill(inp.window, 0, 4)
    except BaseException:
        inp.close()
        raise
    return inp


def _reader_of(stream: Any) -> Callable[[memoryview], int | None]:
    """At most one read of the stream into a buffer: readinto1, readinto, or read."""
    readinto = getattr(stream, "readinto1", None) or getattr(stream, "readinto", None)
    if readinto is not None:
        bound: Callable[[memoryview], int | None] = readinto
        return bound
    read = getattr(stream, "read", None)
    if read is None:
        raise CaptureError(f"cannot read a {type(stream).__name__}: not a binary file")

    def read_into(view: memoryview) -> int | None:
        data = read(len(view))
        if data is None:
            return None
        view[: len(data)] = data
        return len(data)

    return read_into


def _never_blocks(stream: Any) -> bool:
    """True for regular files and in-memory streams: a read there never waits."""
    try:
        return stat.S_ISREG(os.fstat(stream.fileno()).st_mode)
    except (AttributeError, OSError, ValueError):  # io.UnsupportedOperation is both
        return True
