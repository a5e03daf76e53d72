"""Errors of capture reading: one base class, and the cut-short file as its own case."""

from __future__ import annotations

from stack.errors import IwarpError


class CaptureError(IwarpError):
    """The capture cannot be read (not a capture, unsupported format, corrupt).

    Fields: message (what is wrong), source (the file's name, or None for bytes); the
    text is ``source: message``.
    """

    def __init__(self, message: str, source: str | None = None) -> None:
        super().__init__(f"{source}: {message}" if source else message)
        self.message = message
        self.source = source

    def named(self, source: str | None) -> CaptureError:
        """This error naming ``source`` (itself when it has a name or there is none)."""
        if source is None or self.source is not None:
            return self
        return type(self)(self.message, source)


class TruncatedCapture(CaptureError):
    """The file ends in the middle of a record; every complete record was yielded first."""
