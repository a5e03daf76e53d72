"""Linux soft-iWARP (siw) in a QEMU guest, for interop tests against our stack.

Build from Debian packages (:func:`build`), boot once (:class:`SiwVM`), run guest commands
through an agent, forward ports both ways, set siw's knobs per case and capture each case
(QEMU's lossless dump of the guest NIC, or tcpdump in the guest).  ``iwarp siwvm --help``
gives the command line; the README's "Interop with Linux siw" what was learned about siw.
"""

from stack.siwvm.errors import (
    AgentError,
    BootError,
    BuildError,
    CaptureError,
    GuestCommandError,
    GuestTimeout,
    SiwVmError,
)
from stack.siwvm.image import Artifacts, build, cache_dir, find_artifacts
from stack.siwvm.knobs import SIW_DEFAULTS
from stack.siwvm.net import AGENT_GUEST_PORT, GUEST_ADDR, HOST_ADDR, free_port
from stack.siwvm.process import CommandResult, GuestProcess
from stack.siwvm.vm import SiwVM

__all__ = [
    "AGENT_GUEST_PORT",
    "GUEST_ADDR",
    "HOST_ADDR",
    "SIW_DEFAULTS",
    "AgentError",
    "Artifacts",
    "BootError",
    "BuildError",
    "CaptureError",
    "CommandResult",
    "GuestCommandError",
    "GuestProcess",
    "GuestTimeout",
    "SiwVM",
    "SiwVmError",
    "build",
    "cache_dir",
    "find_artifacts",
    "free_port",
]
