"""The servers under attack, each a real subprocess on loopback TCP, and their good clients.

:class:`Server` starts ``kbtp target`` or ``iwarp rping -s -P``, knows its port and pid,
and reads its open descriptors (``/proc/PID/fd``) and resident memory
(``/proc/PID/status`` VmRSS).  A *good client* does real work after every attack: for
the KBTP target STORE then LOAD and compare, plus a LOAD of every block stored before
the attacks (the integrity check); for rping a validated ping exchange.
"""

from __future__ import annotations

import contextlib
import os
import resource
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import trio

from kbtp import Capability, KbtpInitiator

ROOT = Path(__file__).resolve().parents[2]
KBTP_BLOCK = 4096


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def block_data(tag: str, n: int, size: int = KBTP_BLOCK) -> bytes:
    """Recognisable, distinct block contents for ``(tag, n)``."""
    head = f"{tag}:{n}:".encode()
    return (head * (size // len(head) + 1))[: size - (n % 97)]


class Server:
    """One server subprocess; ``name`` says which (``kbtp-target`` or ``rping``)."""

    def __init__(
        self, name: str, argv: list[str], *, nofile: int | None = None, port: int | None = None
    ) -> None:
        self.name = name
        self.log = tempfile.NamedTemporaryFile(
            prefix=f"campaign-{name}-", suffix=".log", delete=False
        )
        env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))

        def limit() -> None:
            if nofile is not None:
                resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))

        self.proc = subprocess.Popen(
            [sys.executable, *argv],
            stdout=subprocess.PIPE,
            stderr=self.log,
            env=env,
            preexec_fn=limit,
            cwd=ROOT,
            text=True,
        )
        self.port = port or 0
        self._port_known = port is not None
        self.baseline_fds = -1

    def ready(self) -> Server:
        """Wait until the server listens; then take its descriptor baseline."""
        if self.baseline_fds >= 0:
            return self
        if not self._port_known:
            assert self.proc.stdout is not None
            first = self.proc.stdout.readline()
            if "listening on" not in first:
                self.stop()
                raise RuntimeError(f"{self.name} did not start: {first!r} {self.stderr()}")
            self.port = int(first.rsplit(":", 1)[1])
            self._port_known = True
        self._wait_listening()
        self.baseline_fds = self.fds()
        return self

    def _wait_listening(self) -> None:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if not self.alive():
                raise RuntimeError(f"{self.name} exited: {self.stderr()}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                    pass
            except OSError:
                time.sleep(0.1)
                continue
            time.sleep(0.2)  # let the probe connection end before the baseline
            return
        raise RuntimeError(f"{self.name} is not listening on {self.port}")

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def fds(self) -> int:
        try:
            return len(os.listdir(f"/proc/{self.pid}/fd"))
        except OSError:
            return -1

    def rss_kib(self) -> int:
        try:
            for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
        except OSError:
            pass
        return -1

    def fds_settle(self, slack: int = 3, timeout: float = 20.0) -> int:
        """Wait until the fd count is within ``slack`` of the baseline; the last count."""
        deadline = time.monotonic() + timeout
        count = self.fds()
        while count > self.baseline_fds + slack and time.monotonic() < deadline:
            time.sleep(0.2)
            count = self.fds()
        return count

    def stderr(self) -> str:
        try:
            return Path(self.log.name).read_text()[-2000:]
        except OSError:
            return ""

    def stop(self) -> int | None:
        """SIGINT, then SIGKILL after 15 s; the exit status."""
        if self.alive():
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        self.log.close()
        with contextlib.suppress(OSError):
            os.unlink(self.log.name)
        return self.proc.returncode

    def __enter__(self) -> Server:
        return self.ready()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def kbtp_target(
    specs: Sequence[str],
    *,
    pool: int,
    block: str = "4K",
    extra: Sequence[str] = (),
    nofile: int | None = None,
) -> Server:
    argv = [
        "-m",
        "kbtp.cli",
        "target",
        "-p",
        "0",
        "--quiet",
        "--block-size",
        block,
        "-F",
        str(pool),
        *extra,
    ]
    for spec in specs:
        argv += ["--initiator", spec]
    return Server("kbtp-target", argv, nofile=nofile)


def rping_server(nofile: int | None = None, size: int = 1 << 24) -> Server:
    port = free_port()
    argv = [
        "-m",
        "stack.cli.iwarp",
        "rping",
        "-s",
        "-P",
        "-a",
        "127.0.0.1",
        "-p",
        str(port),
        "-S",
        str(size),
        "--timeout",
        "10",
    ]
    return Server("rping", argv, nofile=nofile, port=port)


# -- good clients ----------------------------------------------------------------------


def run_trio(fn: Callable[[], object], timeout: float = 60.0) -> None:
    """Run an async function to completion with a hang guard."""

    async def main() -> None:
        with trio.fail_after(timeout):
            await fn()  # type: ignore[misc]

    trio.run(main)


class KbtpKeeper:
    """The integrity check: blocks stored before the attacks must load byte-identical."""

    def __init__(self, port: int, identity: str = "keeper", count: int = 8) -> None:
        self.port = port
        self.identity = identity
        self.count = count
        self.stored: dict[int, bytes] = {}
        self.rounds = 0

    async def _session(self, body: Callable[[KbtpInitiator], object]) -> None:
        for attempt in range(40):  # the previous session may still be ending
            try:
                async with KbtpInitiator.connect(
                    "127.0.0.1", self.port, self.identity, capabilities=Capability.NONE
                ) as ini:
                    await body(ini)  # type: ignore[misc]
                    return
            except Exception as exc:
                if "SESSION_EXISTS" not in str(exc) and attempt > 3:
                    raise
                await trio.sleep(0.25)

    def store_all(self) -> None:
        async def body(ini: KbtpInitiator) -> None:
            base = ini.ack.handle_base if ini.ack else 0
            for n in range(self.count):
                data = block_data(self.identity, n)
                await ini.alloc_store(base + n, data, seal=True)
                self.stored[base + n] = data

        run_trio(lambda: self._session(body))

    def check(self) -> tuple[bool, int]:
        """(the good client's STORE/LOAD round trip worked, blocks lost or corrupted)."""
        bad = [0]
        ok = [False]

        async def body(ini: KbtpInitiator) -> None:
            for handle, data in self.stored.items():
                try:
                    if await ini.load(handle) != data:
                        bad[0] += 1
                except Exception:
                    bad[0] += 1
            assert ini.ack is not None
            spare = ini.ack.handle_base + self.count
            payload = block_data("round", self.rounds)
            await ini.alloc_store(spare, payload, seal=False)
            ok[0] = await ini.load(spare, allow_unsealed=True) == payload
            await ini.free(spare)

        self.rounds += 1
        try:
            run_trio(lambda: self._session(body))
        except Exception:
            return False, bad[0]
        return ok[0], bad[0]


def rping_ping(port: int, count: int = 2, size: int = 64) -> bool:
    """A validated rping exchange (``iwarp rping -c -V``) against the server (silent
    unless it fails: rping prints only errors without ``-v``)."""
    from stack.cli.iwarp import main

    try:
        rc = main(["rping", "-c", "-a", "127.0.0.1", "-p", str(port), "-C", str(count),
                   "-S", str(size), "-V", "--timeout", "10"])  # fmt: skip
    except SystemExit as exc:
        rc = int(exc.code or 0)
    return rc == 0
