"""Processes: guest commands and their results, and the host's QEMU process.

A foreground guest command returns a :class:`CommandResult`; a background one is a
:class:`GuestProcess`, polled, awaited and signalled through the agent.  On the host,
:func:`kvm_usable` picks the accelerator and :func:`die_with_parent` ties QEMU's life to
the Python process that started it.
"""

from __future__ import annotations

import ctypes
import os
import signal
from dataclasses import dataclass
from typing import TYPE_CHECKING

from stack.siwvm.errors import GuestCommandError, GuestTimeout

if TYPE_CHECKING:
    from stack.siwvm.vm import SiwVM

__all__ = ["CommandResult", "GuestProcess", "die_with_parent", "kvm_usable"]


def kvm_usable() -> bool:
    """KVM only with kvm_intel/kvm_amd: a kvm_pvm-only host hangs a stock kernel (spec §2)."""
    return os.access("/dev/kvm", os.R_OK | os.W_OK) and any(
        os.path.exists(f"/sys/module/{m}") for m in ("kvm_intel", "kvm_amd")
    )


def die_with_parent() -> None:
    """preexec_fn: SIGKILL the child when the starting thread's process dies."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


@dataclass(frozen=True, slots=True)
class CommandResult:
    """A finished guest command.  Fields: cmd, rc (None on timeout), stdout, stderr,
    timed_out, seconds."""

    cmd: str
    rc: int | None
    stdout: str
    stderr: str
    timed_out: bool
    seconds: float

    @property
    def ok(self) -> bool:
        return self.rc == 0

    @property
    def output(self) -> str:
        return self.stdout + self.stderr

    def check(self) -> CommandResult:
        """Return self if rc is 0; else raise GuestCommandError with the output."""
        if self.timed_out:
            raise GuestTimeout(f"guest command timed out: {self.cmd}\n{self.output[-2000:]}")
        if self.rc != 0:
            raise GuestCommandError(
                f"guest command failed (rc {self.rc}): {self.cmd}\n{self.output[-2000:]}"
            )
        return self


class GuestProcess:
    """A background guest command started by ``vm.run(..., background=True)``.

    Its stdout and stderr go to ``log`` (a guest path); the agent kills it when its
    timeout runs out.
    """

    def __init__(self, vm: SiwVM, cmd: str, pid: int, log: str) -> None:
        self.vm = vm
        self.cmd = cmd
        self.pid = pid
        self.log = log
        self.rc: int | None = None
        self.timed_out = False

    def poll(self) -> int | None:
        """The exit status, or None while it runs."""
        return self._wait(0.0)

    def wait(self, timeout: float = 30.0) -> int:
        """Wait for the exit status; GuestTimeout if it still runs after ``timeout``."""
        rc = self._wait(timeout)
        if rc is None:
            raise GuestTimeout(
                f"guest process {self.pid} still running after {timeout} s: {self.cmd}\n"
                + self.output()[-2000:]
            )
        return rc

    def kill(self, sig: int = signal.SIGTERM) -> None:
        """Signal the process group (no error if it has exited)."""
        if self.rc is None:
            self.vm.agent.request("signal", pid=self.pid, sig=int(sig))

    def stop(self, timeout: float = 5.0) -> int | None:
        """SIGTERM, then SIGKILL after ``timeout``; return the exit status."""
        if self.poll() is not None:
            return self.rc
        self.kill(signal.SIGTERM)
        rc = self._wait(timeout)
        if rc is None:
            self.kill(signal.SIGKILL)
            rc = self._wait(5.0)
        return rc

    def output(self) -> str:
        """What the process has written so far (stdout and stderr, interleaved)."""
        return self.vm.read_file(self.log).decode(errors="replace")

    def _wait(self, timeout: float) -> int | None:
        if self.rc is not None:
            return self.rc
        reply = self.vm.agent.request("wait", pid=self.pid, timeout=timeout)
        self.timed_out = bool(reply.get("timed_out"))
        if reply["rc"] is not None:
            self.rc = int(reply["rc"])
        return self.rc

    def __repr__(self) -> str:
        return f"GuestProcess(pid={self.pid}, rc={self.rc}, cmd={self.cmd!r})"
