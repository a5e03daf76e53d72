"""Build the siw guest image into the cache and locate what a boot needs.

The work is done by ``files/build.sh`` (apt, debootstrap, the out-of-tree siw.ko, the ext4
image and the initramfs); this module runs it with a timeout and reads its result.  The
cache lives outside the repository: ``$SIWVM_CACHE``, by default
``${XDG_CACHE_HOME:-~/.cache}/siw-vm``.  A warm build only checks a stamp and returns.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from stack.siwvm.errors import BuildError

FILES_DIR = Path(__file__).resolve().parent / "files"
BUILD_SCRIPT = FILES_DIR / "build.sh"
DEFAULT_BUILD_TIMEOUT = 900.0


def cache_dir() -> Path:
    """The build cache: ``$SIWVM_CACHE`` or ``${XDG_CACHE_HOME:-~/.cache}/siw-vm``."""
    explicit = os.environ.get("SIWVM_CACHE")
    if explicit:
        return Path(explicit)
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg) / "siw-vm"


@dataclass(frozen=True, slots=True)
class Artifacts:
    """What a boot needs.  Fields: kver, kernel, initrd, rootfs, siw_ko, cache."""

    kver: str
    kernel: Path
    initrd: Path
    rootfs: Path
    siw_ko: Path
    cache: Path


def find_artifacts(cache: Path | None = None) -> Artifacts:
    """The artifacts of the last successful build in ``cache``; BuildError if there are none."""
    cache = cache or cache_dir()
    env_file = cache / "current.env"
    try:
        lines = env_file.read_text().splitlines()
    except OSError as exc:
        raise BuildError(f"no siw VM image in {cache} (run `iwarp siwvm build`): {exc}") from exc
    env = dict(line.split("=", 1) for line in lines if "=" in line)
    kver = env.get("KVER", "")
    out = cache / kver
    arts = Artifacts(
        kver=kver,
        kernel=out / "vmlinuz",
        initrd=out / "initrd.gz",
        rootfs=out / "rootfs.ext4",
        siw_ko=out / "siw.ko",
        cache=cache,
    )
    missing = [p.name for p in (arts.kernel, arts.initrd, arts.rootfs) if not p.is_file()]
    if not kver or missing:
        raise BuildError(f"incomplete siw VM image in {out} (missing {missing or 'KVER'})")
    return arts


def build(
    cache: Path | None = None,
    *,
    refresh: bool = False,
    timeout: float = DEFAULT_BUILD_TIMEOUT,
    progress: Callable[[str], None] | None = None,
) -> Artifacts:
    """Build (or check) the guest image; return its artifacts.

    ``progress`` receives each output line of the build (default: none).  Raises
    :class:`BuildError` with the tail of the output when the build fails or times out.
    """
    cache = cache or cache_dir()
    env = dict(os.environ, SIWVM_CACHE=str(cache))
    argv = ["bash", str(BUILD_SCRIPT)] + (["--refresh"] if refresh else [])
    tail: deque[str] = deque(maxlen=40)
    try:
        proc = subprocess.Popen(
            argv,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
    except OSError as exc:
        raise BuildError(f"cannot run {BUILD_SCRIPT}: {exc}") from exc
    expired = threading.Event()

    def expire() -> None:
        expired.set()
        _kill_group(proc.pid)

    watchdog = threading.Timer(timeout, expire)
    watchdog.daemon = True
    watchdog.start()
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            tail.append(line.rstrip("\n"))
            if progress:
                progress(line.rstrip("\n"))
        rc: int | None = proc.wait()
    finally:
        watchdog.cancel()
        if proc.poll() is None:  # interrupted (KeyboardInterrupt): leave nothing behind
            _kill_group(proc.pid)
            proc.wait()
    if expired.is_set():
        rc = None
    if rc != 0:
        what = f"timed out after {timeout:.0f} s" if rc is None else f"exit status {rc}"
        raise BuildError(f"siw VM build failed ({what}):\n" + "\n".join(tail))
    return find_artifacts(cache)


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def print_progress(line: str) -> None:
    """A ``progress`` callback that echoes build lines to stderr."""
    print(line, file=sys.stderr, flush=True)
