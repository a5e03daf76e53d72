"""Errors of the siw VM harness: one small hierarchy, each message says what to do next."""

from __future__ import annotations


class SiwVmError(Exception):
    """Base class of every harness error."""


class BuildError(SiwVmError):
    """The guest image could not be built (apt, debootstrap, the siw.ko build)."""


class BootError(SiwVmError):
    """QEMU did not start, the guest did not reach its agent, or it died."""


class AgentError(SiwVmError):
    """The guest agent could not be reached or reported a failure."""


class GuestTimeout(SiwVmError):
    """A guest command or wait ran out of time."""


class GuestCommandError(SiwVmError):
    """A guest command exited non-zero under ``check=True``."""


class CaptureError(SiwVmError):
    """A capture (QEMU netdev dump or guest tcpdump) did not start or did not come out whole."""
