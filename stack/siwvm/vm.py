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
import ctypes
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, overload

from stack.siwvm import knobs
from stack.siwvm.agent import AgentClient, QmpClient
from stack.siwvm.errors import (
    BootError,
    CaptureError,
    GuestCommandError,
    GuestTimeout,
    SiwVmError,
)
from stack.siwvm.image import Artifacts, find_artifacts
from stack.siwvm.pcap import check_capture, filter_tcp_ports

GUEST_ADDR = "10.0.2.15"
"""The guest's address on QEMU user networking (eth0; siw0 sits on it)."""
HOST_ADDR = "10.0.2.2"
"""The host's 127.0.0.1 as the guest sees it."""
AGENT_GUEST_PORT = 7000
"""Guest port of the agent: tests must not use it (the agent owns it)."""
NETDEV_ID = "n0"
CaptureVia = Literal["netdev", "tcpdump"]
"""How :meth:`SiwVM.capture` captures: QEMU's dump of the guest NIC, or tcpdump in the guest."""
DEFAULT_BOOT_TIMEOUT = 180.0
CAPTURE_DIR_GUEST = "/tmp/siwvm-cap"
SHARE_GUEST = "/mnt/host"
"""Where the guest mounts the host's ``<workdir>/share`` (9p), for files too big for the agent."""

_LIVE: set[SiwVM] = set()
_LIVE_LOCK = threading.Lock()


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def kvm_usable() -> bool:
    """KVM only with kvm_intel/kvm_amd: a kvm_pvm-only host hangs a stock kernel (spec §2)."""
    return os.access("/dev/kvm", os.R_OK | os.W_OK) and any(
        os.path.exists(f"/sys/module/{m}") for m in ("kvm_intel", "kvm_amd")
    )


def _die_with_parent() -> None:
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


class SiwVM:
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
            preexec_fn=_die_with_parent,
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

    # ------------------------------------------------------------------ captures

    @contextmanager
    def capture(
        self,
        name: str,
        *,
        iface: str = "eth0",
        ports: Iterable[int] = (),
        bpf: str | None = None,
        via: CaptureVia | None = None,
        dest: Path | str | None = None,
        start_timeout: float = 15.0,
    ) -> Iterator[Path]:
        """Capture guest traffic for the ``with`` block; yield the host pcap path.

        ``via``: ``"netdev"`` (the default for ``eth0``) dumps every frame that crosses the
        guest's NIC from inside QEMU (a ``filter-dump`` object added and removed over QMP):
        the host<->guest wire, lossless, since QEMU writes each frame before delivering it.
        ``"tcpdump"`` (the default for ``lo``, siw<->siw inside the guest) runs tcpdump in
        the guest to its tmpfs and copies the pcap out; under TCG tcpdump can miss segments
        of long bursts without counting them as drops, so the interop suite uses netdev.
        The agent's own port is always left out; ``ports`` keeps only TCP segments with one
        of these ports (both methods); ``bpf`` adds a tcpdump filter expression (tcpdump
        only).  The pcap is checked to be well formed when the block ends without error.
        """
        self._require_running()
        method = via or ("netdev" if iface == "eth0" else "tcpdump")
        if method not in ("netdev", "tcpdump"):
            raise CaptureError(f"unknown capture method {method!r} (netdev or tcpdump)")
        if method == "netdev" and iface != "eth0":
            raise CaptureError(f"netdev captures see eth0 only, not {iface!r}: use via='tcpdump'")
        if method == "netdev" and bpf:
            raise CaptureError("netdev captures take ports=, not a bpf expression")
        safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", name).strip("_") or "capture"
        host_path = Path(dest) if dest else self.capture_dir / f"{safe}.pcap"
        host_path.parent.mkdir(parents=True, exist_ok=True)
        wanted = tuple(ports)
        if method == "netdev":
            with self._netdev_dump(safe, host_path, wanted):
                yield host_path
            return
        port_expr = " or ".join(f"tcp port {p}" for p in wanted)
        expr = " and ".join(
            [f"not tcp port {AGENT_GUEST_PORT}", *(f"({e})" for e in (port_expr, bpf) if e)]
        )
        gpcap = f"{CAPTURE_DIR_GUEST}/{safe}.pcap"
        glog = f"{CAPTURE_DIR_GUEST}/{safe}.tcpdump.log"
        tcpdump = self.run(
            f"exec tcpdump -i {shlex.quote(iface)} -s 0 -U --immediate-mode -Z root"
            f" -w {gpcap} {shlex.quote(expr)}",
            background=True,
            timeout=3600,
            log=glog,
        )
        self._wait_tcpdump(tcpdump, start_timeout)
        failed = True
        try:
            yield host_path
            failed = False
        finally:
            self._finish_capture(tcpdump, gpcap, host_path, check=not failed)

    @contextmanager
    def _netdev_dump(self, safe: str, host_path: Path, ports: tuple[int, ...]) -> Iterator[None]:
        """QEMU's filter-dump on the guest NIC for the block, then keep ``ports``' frames."""
        self._dumps += 1
        dump_id = f"cap{self._dumps}"
        raw = self.workdir / f"{safe}.{dump_id}.netdev.pcap"
        try:
            self.qmp.execute(
                "object-add",
                **{"qom-type": "filter-dump", "id": dump_id, "netdev": NETDEV_ID, "file": str(raw)},
            )
        except SiwVmError as exc:
            raise CaptureError(f"QEMU filter-dump did not start: {exc}") from exc
        failed = True
        try:
            yield
            failed = False
        finally:
            self._finish_netdev_dump(dump_id, raw, host_path, ports, check=not failed)

    def _finish_netdev_dump(
        self, dump_id: str, raw: Path, host_path: Path, ports: tuple[int, ...], check: bool
    ) -> None:
        # The peers have exited; let their last segments (FIN, final ACKs) cross the NIC.
        last, deadline = -1, time.monotonic() + 5.0
        while time.monotonic() < deadline:
            size = raw.stat().st_size if raw.exists() else 0
            if size == last:
                break
            last = size
            time.sleep(0.3)
        try:
            self.qmp.execute("object-del", id=dump_id)
            filter_tcp_ports(raw, host_path, ports=ports, exclude=(AGENT_GUEST_PORT,))
        except (SiwVmError, OSError) as exc:
            if check:
                raise CaptureError(f"capture {host_path.name} did not come out: {exc}") from exc
        finally:
            raw.unlink(missing_ok=True)

    def _wait_tcpdump(self, tcpdump: GuestProcess, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while True:
            text = tcpdump.output()
            if "listening on" in text:
                return
            if tcpdump.poll() is not None:
                raise CaptureError(f"tcpdump exited (rc {tcpdump.rc}): {text.strip()[-500:]}")
            if time.monotonic() > deadline:
                tcpdump.stop()
                raise CaptureError(f"tcpdump did not start within {timeout} s: {text[-500:]}")
            time.sleep(0.1)

    def _finish_capture(
        self, tcpdump: GuestProcess, gpcap: str, host_path: Path, check: bool
    ) -> None:
        # tcpdump drops packets it has not yet written when interrupted:
        # wait until the file stops growing, then SIGINT, then copy from tmpfs.
        try:
            last, deadline = -1, time.monotonic() + 10.0
            while time.monotonic() < deadline:
                size = self.file_size(gpcap)
                if size == last:
                    break
                last = size
                time.sleep(0.2)
            tcpdump.kill(signal.SIGINT)
            if tcpdump._wait(10.0) is None:
                tcpdump.stop(2.0)
            self.copy_out(gpcap, host_path)
        except SiwVmError as exc:
            if check:
                raise CaptureError(f"capture {host_path.name} did not come out: {exc}") from exc
            return
        if check:
            check_capture(host_path)

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
