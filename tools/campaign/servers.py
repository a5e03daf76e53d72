"""The servers under attack, each a real subprocess on loopback TCP, and their good clients.

:class:`Server` starts ``kbtp target``, ``iwarp rping -s -P`` or ``iwarp bench server``,
knows its port and pid,
and reads its open descriptors (``/proc/PID/fd``) and resident memory
(``/proc/PID/status`` VmRSS).  A *good client* does real work after every attack: for
the KBTP target STORE then LOAD and compare, plus a LOAD of every block stored before
the attacks (the integrity check); for rping a validated ping exchange; for the bench
server an RDMA Write read back and compared, Write-latency ping-pongs answered, on its trio
and its blocking iWARP port, and a raw-TCP sink that counts every byte
(:class:`BenchClient`).
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
BENCH_SIZE = 4096
"""Bytes of the bench server's good client's Write-latency session."""


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
    """One server subprocess; ``name`` says which (``kbtp-target``, ``rping`` or
    ``bench-server``)."""

    def __init__(
        self,
        name: str,
        argv: list[str],
        *,
        nofile: int | None = None,
        port: int | None = None,
        address_space: int | None = None,
    ) -> None:
        self.name = name
        self.log = tempfile.NamedTemporaryFile(
            prefix=f"campaign-{name}-", suffix=".log", delete=False
        )
        env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))

        def limit() -> None:
            if nofile is not None:
                resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))
            if address_space is not None:  # as a host without overcommit: a mapping that
                resource.setrlimit(resource.RLIMIT_AS, (address_space, address_space))  # fails

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
        self.raw_port = 0
        """The bench server's raw-TCP baseline port (its startup line)."""
        self._port_known = port is not None
        self.baseline_fds = -1

    def ready(self) -> Server:
        """Wait until the server listens; then take its descriptor baseline."""
        if self.baseline_fds >= 0:
            return self
        if not self._port_known:
            assert self.proc.stdout is not None
            first = self.proc.stdout.readline()
            if first.startswith("PORT "):  # iwarp bench server: PORT <iwarp> <raw>
                self.port, self.raw_port = (int(p) for p in first.split()[1:3])
            elif "listening on" in first:
                self.port = int(first.rsplit(":", 1)[1])
            else:
                self.stop()
                raise RuntimeError(f"{self.name} did not start: {first!r} {self.stderr()}")
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
    offload: bool = False,
) -> Server:
    """``kbtp target`` in a subprocess; with ``offload``, ``kbtp target --offload``
    (reported as ``kbtp-target-offload``)."""
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
        *["--offload"] * offload,
    ]
    for spec in specs:
        argv += ["--initiator", spec]
    return Server("kbtp-target-offload" if offload else "kbtp-target", argv, nofile=nofile)


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


BENCH_ADDRESS_SPACE = 4 << 30
"""RLIMIT_AS of the bench server under attack: room for a 1 GiB session (MAX_SESSION_BYTES,
mapped lazily) and its threads, while an allocation a few octets of a peer ask for (4 GiB)
fails as it would on a host that does not overcommit memory."""


def bench_server(nofile: int | None = None) -> Server:
    """``iwarp bench server`` on a free loopback port (it prints ``PORT <iwarp> <raw>``),
    its address space limited to :data:`BENCH_ADDRESS_SPACE`."""
    argv = ["-m", "stack.cli.iwarp", "bench", "server", "-p", "0"]
    return Server("bench-server", argv, nofile=nofile, address_space=BENCH_ADDRESS_SPACE)


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


class BenchClient:
    """The bench server's good client, on the blocking driver (no trio, bounded by
    timeouts): a QP asking a Write-latency session of :data:`BENCH_SIZE` bytes, an RDMA
    Write of distinct contents read back by an RDMA Read and compared, then ping-pongs whose
    pongs must come back; and a raw-TCP sink whose byte count must be what was sent.
    ``blocking_port`` (the server's blocking-driver iWARP port) is learnt from the first
    session's Advert."""

    def __init__(self, server: Server) -> None:
        self.server = server
        self.rounds = 0
        self.blocking_port = 0
        self.blocking_raw_port = 0
        """The server's blocking-socket baseline port (its Advert)."""

    def session(self, port: int, pings: int = 5, timeout: float = 10.0) -> None:
        """One validated session on ``port``; raises on anything wrong."""
        from stack.bench.protocol import Advert, SessionSpec
        from stack.rnic import Access, Rnic, SendFlags, SendWR, Sge, WcStatus, WrOpcode
        from stack.transport.blocking_cm import connect

        size = BENCH_SIZE
        rnic = Rnic("campaign-bench-client")
        pd = rnic.alloc_pd()
        cq = rnic.create_cq(64)
        qp = rnic.create_qp(pd, cq, ord=1)
        local = pd.reg_mr(bytearray(size), Access.LOCAL_WRITE)
        back = pd.reg_mr(bytearray(size), Access.LOCAL_WRITE)
        pong = pd.reg_mr(bytearray(size), Access.REMOTE_WRITE | Access.LOCAL_WRITE)
        spec = SessionSpec("write", size, True, 0, (pong.rkey, pong.base, size))
        conn = connect("127.0.0.1", port, qp, private_data=spec.encode(), timeout=timeout)
        try:
            advert = Advert.decode(conn.negotiated.peer_private_data)
            self.blocking_port = advert.iwarp_blocking_port
            self.blocking_raw_port = advert.blocking_port
            self.rounds += 1
            data = block_data("bench", self.rounds, 2 * size)[: size - 1] + b"\x00"  # no ping
            local.buf[:] = data
            sge = (Sge(local.base, size, local.lkey),)
            write = SendWR(0, WrOpcode.RDMA_WRITE, sge, SendFlags.NONE,
                           rkey=advert.rkey, remote_addr=advert.addr)  # fmt: skip
            read = SendWR(1, WrOpcode.RDMA_READ, (Sge(back.base, size, back.lkey),),
                          rkey=advert.rkey, remote_addr=advert.addr)  # fmt: skip
            qp.post_send([write, read])
            wc = conn.next_completion(cq, timeout)
            if wc.status is not WcStatus.SUCCESS or bytes(back.buf) != data:
                raise RuntimeError(f"Write read back wrong ({wc.status.name})")
            deadline = time.monotonic() + timeout
            for value in range(1, pings + 1):  # Write latency: each ping answered
                local.buf[size - 1] = value
                qp.post_send(write)
                while pong.buf[size - 1] != value:
                    if time.monotonic() > deadline or not conn.progress(0.5) and not conn.closed:
                        raise RuntimeError(f"ping {value} not answered")
                    if conn.closed:
                        raise RuntimeError(f"connection closed: {conn.error}")
            conn.disconnect(timeout)
        finally:
            conn.abort()
            rnic.destroy_qp(qp)

    def sink(self, count: int = 1 << 16, timeout: float = 10.0) -> None:
        """The raw-TCP baseline port: ``count`` bytes sent, the server's count must match."""
        from stack.bench.protocol import RAW_COUNT, RAW_HEADER, RAW_MAGIC, RAW_SINK

        with socket.create_connection(("127.0.0.1", self.server.raw_port), timeout) as sock:
            sock.sendall(RAW_HEADER.pack(RAW_MAGIC, RAW_SINK, 0, 0) + bytes(count))
            sock.shutdown(socket.SHUT_WR)
            answer = b""
            while len(answer) < RAW_COUNT.size:
                more = sock.recv(RAW_COUNT.size - len(answer))
                if not more:
                    break
                answer += more
        if len(answer) != RAW_COUNT.size or RAW_COUNT.unpack(answer)[0] != count:
            raise RuntimeError(f"raw sink answered {answer!r} for {count} bytes")

    def check(self) -> tuple[bool, int]:
        """(every port served its good client, 0): nothing is stored across attacks."""
        try:
            self.session(self.server.port)
            if self.blocking_port:
                self.session(self.blocking_port)
            self.sink()
        except Exception:
            return False, 0
        return True, 0
