"""Boot the siw guest under QEMU and drive it: commands, port forwards, siw knobs, captures.

Theory of operation
-------------------
QEMU runs in its own process group with ``PR_SET_PDEATHSIG`` (it dies with the Python process
that started it), and every live VM is killed by an ``atexit`` hook, so no QEMU outlives a
failed test run.  The guest's PID 1 (``files/guest-init.sh``) brings up siw and starts the
agent (``files/guest-agent.py``), which the host reaches through a hostfwd of
``127.0.0.1:<free port>`` to guest port 7000.  QEMU's QMP socket adds further forwards at run
time (:meth:`SiwVM.hostfwd`).  The serial console is logged to ``console.log`` in the VM's
work directory.

Networking is QEMU user networking only: the guest is 10.0.2.15/24 with no default route; it
reaches the host's 127.0.0.1 as 10.0.2.2; the host reaches the guest through forwards bound
to 127.0.0.1.  Nothing leaves the machine.

The guest's addresses and ports are in :mod:`stack.siwvm.net`, guest commands and their
results in :mod:`stack.siwvm.process`, captures in :mod:`stack.siwvm.capture` (mixed into
:class:`SiwVM`); this module re-exports their names.

Typical use (one boot per test session)::

    with SiwVM() as vm:
        port = vm.hostfwd(7174)                       # host 127.0.0.1:port -> guest :7174
        vm.set_siw(crc_required=True)
        with vm.capture("rping-crc") as pcap:
            server = vm.run("rping -s -a 0.0.0.0 -p 7174 -C 1 -v", background=True)
            vm.wait_listen(7174)
            ...                                       # host connects to 127.0.0.1:port
            server.wait(20)
        # pcap is now a file on the host
"""

from __future__ import annotations

import atexit
import base64
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from collections.abc import Iterable
from pathlib import Path
from typing import Literal, overload

from stack.siwvm import knobs
from stack.siwvm.agent import AgentClient, QmpClient
from stack.siwvm.capture import CAPTURE_DIR_GUEST, CaptureMixin, CaptureVia
from stack.siwvm.errors import BootError, GuestTimeout, SiwVmError
from stack.siwvm.image import Artifacts, find_artifacts
from stack.siwvm.net import AGENT_GUEST_PORT, GUEST_ADDR, HOST_ADDR, NETDEV_ID, free_port
from stack.siwvm.process import CommandResult, GuestProcess, die_with_parent, kvm_usable

__all__ = [
    "AGENT_GUEST_PORT",
    "CAPTURE_DIR_GUEST",
    "DEFAULT_BOOT_TIMEOUT",
    "GUEST_ADDR",
    "HOST_ADDR",
    "NETDEV_ID",
    "SHARE_GUEST",
    "CaptureVia",
    "CommandResult",
    "GuestProcess",
    "SiwVM",
    "free_port",
    "kvm_usable",
]

DEFAULT_BOOT_TIMEOUT = 180.0
SHARE_GUEST = "/mnt/host"
"""Where the guest mounts the host's ``<workdir>/share`` (9p), for files too big for the agent."""

_LIVE: set[SiwVM] = set()
_LIVE_LOCK = threading.Lock()


class SiwVM(CaptureMixin):
    """One QEMU guest running Linux siw, driven through its agent.

    Arguments: artifacts (default: the last build in the cache); forwards (extra
    ``(host_port, guest_port)`` hostfwds at boot); links (siw links as ``NAME:NETDEV``);
    append (extra kernel command line, e.g. ``siw.mpa_crc_required=1``); smp, mem; accel
    (``auto``: KVM only with kvm_intel/kvm_amd, else TCG); boot_timeout; capture_dir (where
    :meth:`capture` puts pcaps; default ``<workdir>/captures``); workdir (default: a new temp
    directory, removed by :meth:`stop` unless ``keep_workdir``); echo_console (copy the
    serial console to stderr); qemu_args (extra QEMU arguments).
    """

    def __init__(
        self,
        artifacts: Artifacts | None = None,
        *,
        forwards: Iterable[tuple[int, int]] = (),
        links: Iterable[str] = ("siw0:eth0",),
        append: str = "",
        smp: int | None = None,
        mem: int = 1024,
        accel: str = "auto",
        boot_timeout: float = DEFAULT_BOOT_TIMEOUT,
        capture_dir: Path | str | None = None,
        workdir: Path | str | None = None,
        keep_workdir: bool = False,
        echo_console: bool = False,
        qemu_args: Iterable[str] = (),
    ) -> None:
        self.artifacts = artifacts or find_artifacts()
        self._own_workdir = workdir is None
        self.workdir = Path(workdir or tempfile.mkdtemp(prefix="siwvm-"))
        self.keep_workdir = keep_workdir
        self.share = self.workdir / "share"
        self.console_path = self.workdir / "console.log"
        self.qmp_path = self.workdir / "qmp.sock"
        self.capture_dir = Path(capture_dir) if capture_dir else self.workdir / "captures"
        self.links = list(links)
        self.append = append
        self.smp = smp or int(os.environ.get("SIWVM_SMP", "1"))
        self.mem = mem
        self.accel = ("kvm" if kvm_usable() else "tcg") if accel == "auto" else accel
        self.boot_timeout = boot_timeout
        self.echo_console = echo_console
        self.qemu_args = list(qemu_args)
        self.agent_port = free_port()
        self.forwards: dict[int, int] = {g: h for h, g in forwards}  # guest port -> host port
        self.boot_seconds: float | None = None
        self.proc: subprocess.Popen[bytes] | None = None
        self.agent = AgentClient(self.agent_port)
        self.qmp = QmpClient(str(self.qmp_path))
        self._console: deque[str] = deque(maxlen=400)
        self._agent_up = threading.Event()
        self._failed: str | None = None
        self._pump: threading.Thread | None = None
        self._stopped = False
        self._fwd_lock = threading.Lock()
        self._dumps = 0

    # ------------------------------------------------------------------ lifecycle

    def qemu_argv(self) -> list[str]:
        """The QEMU command line of this VM."""
        arts = self.artifacts
        cmdline = " ".join(
            [
                "console=ttyS0 quiet panic=-1",
                f"siwvm.links={','.join(self.links)}",
                f"siwvm.agent={AGENT_GUEST_PORT}",
                self.append,
            ]
        ).strip()
        fwds = [(self.agent_port, AGENT_GUEST_PORT), *((h, g) for g, h in self.forwards.items())]
        netdev = f"user,id={NETDEV_ID}" + "".join(
            f",hostfwd=tcp:127.0.0.1:{h}-:{g}" for h, g in fwds
        )
        cpu = "host" if self.accel == "kvm" else "max"
        accel = ["-accel", self.accel, "-cpu", cpu]
        return [
            "qemu-system-x86_64",
            *accel,
            "-nodefaults",
            "-m", str(self.mem),
            "-smp", str(self.smp),
            "-display", "none",
            "-serial", "stdio",
            "-no-reboot",
            "-kernel", str(arts.kernel),
            "-initrd", str(arts.initrd),
            "-append", cmdline,
            "-drive", f"file={arts.rootfs},format=raw,if=virtio,snapshot=on",
            "-netdev", netdev,
            "-device", f"virtio-net-pci,netdev={NETDEV_ID}",
            "-device", "virtio-rng-pci",
            "-virtfs", f"local,path={self.share},mount_tag=host,security_model=none,id=host",
            "-qmp", f"unix:{self.qmp_path},server=on,wait=off",
            *self.qemu_args,
        ]  # fmt: skip

    def start(self) -> SiwVM:
        """Boot and wait for the agent; BootError (with the console tail) on failure."""
        if self.proc is not None:
            raise BootError("this SiwVM was already started")
        if shutil.which("qemu-system-x86_64") is None:
            raise BootError("qemu-system-x86_64 not found (run `iwarp siwvm build` as root)")
        self.share.mkdir(parents=True, exist_ok=True)
        t0 = time.monotonic()
        self.proc = subprocess.Popen(
            self.qemu_argv(),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=die_with_parent,
        )
        with _LIVE_LOCK:
            _LIVE.add(self)
        self._pump = threading.Thread(target=self._read_console, name="siwvm-console", daemon=True)
        self._pump.start()
        try:
            deadline = t0 + self.boot_timeout
            while not self._agent_up.wait(0.1):
                if self.proc.poll() is not None or self._failed:
                    raise BootError(self._boot_failure("the guest stopped during boot"))
                if time.monotonic() > deadline:
                    raise BootError(self._boot_failure(f"no agent after {self.boot_timeout:.0f} s"))
            self.agent.connect(max(5.0, deadline - time.monotonic()))
        except BaseException:
            self.kill()
            raise
        self.boot_seconds = time.monotonic() - t0
        return self

    def stop(self) -> None:
        """Kill leftover guest jobs, quit QEMU, remove the work directory.  Idempotent."""
        if self._stopped:
            return
        self._stopped = True
        if self.proc is not None and self.proc.poll() is None:
            try:
                self.qmp.execute("quit")
            except SiwVmError:
                pass
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                pass
        self.kill()
        if self._own_workdir and not self.keep_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def kill(self) -> None:
        """Kill QEMU's whole process group at once (safe from atexit and finalizers)."""
        self.agent.close()
        proc = self.proc
        if proc is not None:
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                pass
            if proc.stdout:
                proc.stdout.close()
        with _LIVE_LOCK:
            _LIVE.discard(self)

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def __enter__(self) -> SiwVM:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def console_tail(self, lines: int = 40) -> str:
        """The last lines the guest printed on its serial console."""
        return "".join(list(self._console)[-lines:])

    def _read_console(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        with open(self.console_path, "w", encoding="utf-8", errors="replace") as log:
            for raw in self.proc.stdout:
                line = raw.decode(errors="replace")
                self._console.append(line)
                log.write(line)
                log.flush()
                if self.echo_console:
                    sys.stderr.write(line)
                if "SIWVM AGENT listening" in line:
                    self._agent_up.set()
                elif "SIWVM FAIL" in line:
                    self._failed = line.strip()

    def _boot_failure(self, what: str) -> str:
        rc = self.proc.poll() if self.proc else None
        return (
            f"siw VM boot failed: {what} (qemu rc={rc}, accel={self.accel}); console tail:\n"
            + self.console_tail(30)
        )

    # ------------------------------------------------------------------ commands

    @overload
    def run(
        self,
        cmd: str,
        *,
        timeout: float = ...,
        check: bool = ...,
        background: Literal[False] = ...,
        log: str | None = ...,
    ) -> CommandResult: ...

    @overload
    def run(
        self,
        cmd: str,
        *,
        timeout: float = ...,
        check: bool = ...,
        background: Literal[True],
        log: str | None = ...,
    ) -> GuestProcess: ...

    def run(
        self,
        cmd: str,
        *,
        timeout: float = 60.0,
        check: bool = False,
        background: bool = False,
        log: str | None = None,
    ) -> CommandResult | GuestProcess:
        """Run a shell command in the guest.

        Foreground: wait up to ``timeout`` seconds (then the guest kills the process group)
        and return a :class:`CommandResult` (``check=True`` raises on non-zero/timeout).
        Background: return a :class:`GuestProcess` at once; the guest kills it after
        ``timeout``; its output goes to ``log`` (default ``/tmp/siwvm-job-<n>.log``).
        """
        self._require_running()
        if background:
            log = log or f"/tmp/siwvm-job-{time.monotonic_ns()}.log"
            reply = self.agent.request("spawn", cmd=cmd, timeout=timeout, log=log)
            return GuestProcess(self, cmd, int(reply["pid"]), log)
        t0 = time.monotonic()
        reply = self.agent.request("run", cmd=cmd, timeout=timeout)
        result = CommandResult(
            cmd=cmd,
            rc=reply["rc"],
            stdout=reply["stdout"],
            stderr=reply["stderr"],
            timed_out=bool(reply["timed_out"]),
            seconds=time.monotonic() - t0,
        )
        return result.check() if check else result

    def reap(self) -> list[int]:
        """Kill every background job still running in the guest; return their pids."""
        return [int(p) for p in self.agent.request("reap")["killed"]]

    def read_file(self, path: str, limit: int = 16 << 20, offset: int = 0) -> bytes:
        """The contents of a guest file (up to ``limit`` bytes from ``offset``)."""
        reply = self.agent.request("read", path=path, offset=offset, limit=limit)
        return base64.b64decode(reply["data"])

    def file_size(self, path: str) -> int:
        """The size of a guest file (AgentError if it does not exist)."""
        return int(self.agent.request("read", path=path, limit=0)["size"])

    def write_file(self, path: str, data: bytes, mode: int = 0o644) -> None:
        """Create or replace a guest file."""
        self.agent.request("write", path=path, data=base64.b64encode(data).decode(), mode=mode)

    def copy_out(self, guest_path: str, host_path: Path | str, chunk: int = 4 << 20) -> Path:
        """Copy a guest file to the host through the agent (no guest process); return the path."""
        dest = Path(host_path)
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = dest.with_name(dest.name + ".part")
        with open(tmp, "wb") as out:
            offset = 0
            while True:
                data = self.read_file(guest_path, limit=chunk, offset=offset)
                out.write(data)
                offset += len(data)
                if len(data) < chunk:
                    break
        tmp.replace(dest)
        return dest

    def wait_listen(self, port: int, timeout: float = 10.0) -> None:
        """Wait until something in the guest listens on TCP ``port`` (siw's kernel socket too).

        Needed before connecting through a hostfwd: slirp accepts the host's connection
        even when nothing listens in the guest (QEMU's user network accepts for it).
        """
        deadline = time.monotonic() + timeout
        while not self.listening(port):
            if time.monotonic() > deadline:
                raise GuestTimeout(f"nothing listens on guest port {port} after {timeout} s")
            time.sleep(0.1)

    def listening(self, port: int) -> bool:
        """Whether a TCP socket listens on ``port`` in the guest (reads /proc/net/tcp{,6}:
        no guest process, kernel sockets included)."""
        needle = f":{int(port):04X} "
        for table in ("/proc/net/tcp", "/proc/net/tcp6"):
            for line in self.read_file(table).decode().splitlines()[1:]:
                fields = line.split()
                if len(fields) > 3 and (fields[1] + " ").endswith(needle) and fields[3] == "0A":
                    return True
        return False

    # ------------------------------------------------------------------ forwarding

    def hostfwd(self, guest_port: int, host_port: int | None = None) -> int:
        """Forward ``127.0.0.1:<host port>`` on the host to ``guest_port``; return the host port.

        Idempotent per guest port.  The guest reaches the host without any forward, as
        :data:`HOST_ADDR` (10.0.2.2 = the host's 127.0.0.1).
        """
        if guest_port == AGENT_GUEST_PORT:
            raise SiwVmError(f"guest port {AGENT_GUEST_PORT} belongs to the agent")
        with self._fwd_lock:
            if guest_port in self.forwards and host_port in (None, self.forwards[guest_port]):
                return self.forwards[guest_port]
            self._require_running()
            last = ""
            for _ in range(5):
                port = host_port or free_port()
                out = self.qmp.hmp(f"hostfwd_add {NETDEV_ID} tcp:127.0.0.1:{port}-:{guest_port}")
                if not out.strip():
                    self.forwards[guest_port] = port
                    return port
                last = out.strip()
                if host_port:
                    break
            raise SiwVmError(f"hostfwd to guest port {guest_port} failed: {last}")

    def remove_hostfwd(self, guest_port: int) -> None:
        """Drop the forward to ``guest_port`` (no error if there is none)."""
        with self._fwd_lock:
            port = self.forwards.pop(guest_port, None)
            if port is not None and self.running:
                self.qmp.hmp(f"hostfwd_remove {NETDEV_ID} tcp:127.0.0.1:{port}")

    # ------------------------------------------------------------------ siw knobs

    def siw_params(self) -> dict[str, str]:
        """Current values of siw's parameters, as sysfs prints them (Y/N, numbers)."""
        return self._siw_exchange({})[1]

    def set_siw(self, **values: bool | int | str) -> dict[str, str]:
        """Set siw knobs (full names or aliases: crc_required, crc_strict, p2p, ...).

        Verifies the values by reading them back; returns the previous values of the
        knobs it changed (pass them back to restore).  Takes effect on new connections.
        One agent round trip.
        """
        wanted = knobs.normalize(values)
        if not wanted:
            return {}
        before, after = self._siw_exchange(wanted)
        wrong = {n: after.get(n) for n, v in wanted.items() if after.get(n) != v}
        if wrong:
            raise SiwVmError(f"siw knobs did not take: wanted {wanted}, sysfs says {wrong}")
        return {name: before[name] for name in wanted}

    def _siw_exchange(self, wanted: dict[str, str]) -> tuple[dict[str, str], dict[str, str]]:
        """Read all knobs, write ``wanted``, read all again (one guest command, two forks:
        a fork costs about 0.1 s under TCG)."""
        dump = f"grep -H . {' '.join(knobs.SIW_DEFAULTS)}"
        writes = "".join(f"echo {v} > {name} && " for name, v in wanted.items())
        out = self.run(
            f"cd {knobs.SIW_PARAM_DIR} && {dump} && echo -- && {writes}{dump}",
            timeout=10,
            check=True,
        ).stdout
        first, _, second = out.partition("--")
        before = dict(line.split(":", 1) for line in first.split())
        after = dict(line.split(":", 1) for line in second.split())
        return before, after

    def reset_siw(self, **overrides: bool | int | str) -> None:
        """Restore upstream defaults (:data:`knobs.SIW_DEFAULTS`), then apply ``overrides``."""
        values: dict[str, bool | int | str] = dict(knobs.SIW_DEFAULTS)
        values.update(knobs.normalize(overrides))
        self.set_siw(**values)

    # ------------------------------------------------------------------ helpers

    def _require_running(self) -> None:
        if not self.running:
            tail = f"; console tail:\n{self.console_tail(20)}" if self.proc else ""
            raise BootError("the siw VM is not running" + tail)


def _kill_all_live() -> None:
    with _LIVE_LOCK:
        live = list(_LIVE)
    for vm in live:
        try:
            vm.kill()
        except Exception:  # atexit: best effort, never raise
            pass


atexit.register(_kill_all_live)
