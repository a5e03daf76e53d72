"""Part 4: faults: initiators killed mid-operation, silent peers, a reset mid-transfer.

* ``kill -9`` of initiator processes (:mod:`tools.campaign.peer`) while they hold tickets
  and have ALLOC_STOREs in flight: afterwards the same identity FREEs what it had bound
  and allocates its whole quota again (so nothing of it leaked).
* Peer silence during MPA startup: a TCP connection that never sends the Request is
  closed by the server (MPA-26); for the KBTP target also a session that never says HELLO.
* A reset (SO_LINGER 0) in the middle of a large RDMA Write: into a KBTP block by
  DIRECT_ALLOC (64 MiB blocks in the full form, 8 MiB bounded), and the rping server's RDMA
  Write of the ping buffer and its RDMA Read of ours (16 MiB, the most rping allows; 4 MiB
  bounded).  The server
  survives and serves the next client, whose data is verified.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import trio

from kbtp import Capability, KbtpInitiator
from stack.cli.rping import Endpoint
from stack.rnic import WcOpcode
from stack.transport.cm import ConnectionManager
from tools.campaign.attacks import LINGER_0, _wait_closed, raw_session
from tools.campaign.servers import ROOT, Server, kbtp_target, rping_ping, rping_server, run_trio


@dataclass
class Fault:
    server: str
    name: str
    tried: int = 0
    alive: bool = True
    served: bool = True
    lost: int = 0
    note: str = ""


@dataclass
class FaultFigures:
    faults: list[Fault] = field(default_factory=list)


class ResettingRelay:
    """A loopback TCP relay in front of a server that resets both connections (RST,
    SO_LINGER 0) once ``limit`` octets went the watched way (``upstream`` True: towards
    the server).  The server sees a peer vanish in the middle of a transfer."""

    def __init__(self, server_port: int, upstream: bool, limit: int) -> None:
        self.server_port = server_port
        self.upstream = upstream
        self.limit = limit
        self.seen = 0
        self.fired = False
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        try:
            client, _ = self._listener.accept()
        except OSError:
            return
        server = socket.create_connection(("127.0.0.1", self.server_port))
        done = threading.Event()

        def pump(src: socket.socket, dst: socket.socket, watched: bool) -> None:
            try:
                while not done.is_set():
                    data = src.recv(1 << 16)
                    if not data:
                        break
                    dst.sendall(data)
                    if watched:
                        self.seen += len(data)
                        if self.seen >= self.limit:
                            self.fired = True
                            break
            except OSError:
                pass
            done.set()

        threads = [
            threading.Thread(target=pump, args=(client, server, self.upstream), daemon=True),
            threading.Thread(target=pump, args=(server, client, not self.upstream), daemon=True),
        ]
        for t in threads:
            t.start()
        done.wait()
        for sock in (server, client):
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, LINGER_0)
            with contextlib.suppress(OSError):  # wakes the other pump's recv (no FIN)
                sock.shutdown(socket.SHUT_RD)
        for t in threads:
            t.join(5)
        for sock in (server, client):
            sock.close()  # the last reference: with SO_LINGER 0 the kernel sends a RST

    def close(self) -> None:
        self._listener.close()
        self._thread.join(10)


async def _connect_retry(port: int, identity: str, caps: Capability, **kw: Any) -> Any:
    """KbtpInitiator.connect as a context manager, retried while the old session ends."""
    for attempt in range(60):
        cm = KbtpInitiator.connect("127.0.0.1", port, identity, capabilities=caps, **kw)
        try:
            ini = await cm.__aenter__()
        except Exception as exc:
            if attempt == 59 or "SESSION_EXISTS" not in str(exc):
                raise
            await trio.sleep(0.25)
            continue
        return cm, ini
    raise AssertionError("unreachable")


HOG_QUOTA = 6


def hogs_of(full: bool) -> int:
    return 4 if full else 2


def kill_target(full: bool) -> Server:
    """The KBTP target of the kill and silence faults (identities hog-0.., and k)."""
    specs = [f"hog-{i}:quota={HOG_QUOTA},direct=both" for i in range(hogs_of(full))]
    return kbtp_target(
        [*specs, "k:quota=4"],
        pool=hogs_of(full) * HOG_QUOTA + 4,
        block="256K",
        extra=["--ticket-timeout", "2", "--hello-timeout", "3"],
    )


def kill_initiators(
    server: Server, full: bool, seed: int, progress: Callable[[str], None]
) -> Fault:
    hogs = hogs_of(full)
    rounds = 6 if full else 2
    quota = HOG_QUOTA
    fault = Fault("kbtp-target", f"kill -9 of {hogs} initiators mid-operation, {rounds} rounds")
    rng = random.Random(f"{seed}:kill")
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    for r in range(rounds):
        procs = [
            subprocess.Popen(
                [sys.executable, "-m", "tools.campaign.peer", str(server.port), f"hog-{i}"],
                stdout=subprocess.PIPE,
                text=True,
                env=env,
                cwd=ROOT,
            )
            for i in range(hogs)
        ]
        for proc in procs:
            assert proc.stdout is not None
            proc.stdout.readline()  # "ready" (or EOF if it died)
        time.sleep(rng.uniform(0.05, 0.5))
        for proc in procs:
            proc.send_signal(signal.SIGKILL)
        for proc in procs:
            proc.wait()
            if proc.stdout is not None:
                proc.stdout.close()
        fault.tried += hogs
        results: list[int] = []

        async def reclaim(i: int, results: list[int] = results) -> None:
            cm, ini = await _connect_retry(server.port, f"hog-{i}", Capability.NONE)
            try:
                base, count = ini.ack.handle_base, ini.ack.handle_count
                for h in range(base, base + count):  # whatever the killed one had bound
                    await ini.free(h, check=False)
                ok = 0
                for k in range(quota):
                    c = await ini.alloc_store(base + k, b"again", check=False)
                    ok += c.status == 0
                for k in range(quota):
                    await ini.free(base + k, check=False)
                results.append(ok)
            finally:
                await cm.__aexit__(None, None, None)

        async def all_reclaim() -> None:
            async with trio.open_nursery() as nursery:
                for i in range(hogs):
                    nursery.start_soon(reclaim, i)

        try:
            run_trio(all_reclaim, timeout=120)
        except Exception as exc:
            fault.note = f"reclaim failed: {type(exc).__name__}: {exc}"
        short = sum(quota - ok for ok in results) + quota * (hogs - len(results))
        fault.lost += short
        progress(
            f"faults: kill -9 round {r + 1}/{rounds}: quota back "
            f"{hogs * quota - short}/{hogs * quota}"
        )
        if not server.alive():
            break
    fault.alive = server.alive()
    fault.served = fault.alive and fault.lost == 0
    fault.note = fault.note or f"quota released: {fault.lost} blocks short in total"
    return fault


class Silent:
    """A silent peer watched in the background: a TCP connection that never sends the MPA
    Request, or (``session``) a valid startup that never says HELLO."""

    def __init__(self, server: Server, session: bool = False) -> None:
        self.server = server
        self.session = session
        self.closed_after: float | None = None
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        started = time.monotonic()
        try:
            if self.session:
                sock, _ = raw_session(self.server.port)
            else:
                sock = socket.create_connection(("127.0.0.1", self.server.port))
        except OSError:
            return
        started = time.monotonic() if self.session else started
        if _wait_closed(sock, 30.0):
            self.closed_after = time.monotonic() - started
        sock.close()

    def join(self) -> None:
        self._thread.join(40)

    def text(self) -> str:
        what = "session without HELLO" if self.session else "connection without MPA Request"
        if self.closed_after is None:
            return f"{what} NOT closed within 30 s"
        return f"{what} closed by the server after {self.closed_after:.1f} s"


def silence_result(server: Server, watchers: list[Silent], check: Callable[[], bool]) -> Fault:
    fault = Fault(server.name, "peer silence during MPA startup", tried=len(watchers))
    for w in watchers:
        w.join()
    fault.note = "; ".join(w.text() for w in watchers)
    fault.alive = server.alive()
    closed = all(w.closed_after is not None for w in watchers)
    fault.served = closed and fault.alive and check()
    return fault


def _kbtp_round(port: int, identity: str, size: int = 4096) -> bool:
    ok = [False]

    async def body() -> None:
        cm, ini = await _connect_retry(port, identity, Capability.NONE)
        try:
            data = os.urandom(min(size, ini.ack.block_size))
            await ini.alloc_store(ini.ack.handle_base, data)
            ok[0] = await ini.load(ini.ack.handle_base, allow_unsealed=True) == data
            await ini.free(ini.ack.handle_base)
        finally:
            await cm.__aexit__(None, None, None)

    try:
        run_trio(body, timeout=120)
    except Exception:
        return False
    return ok[0]


def reset_size(full: bool) -> int:
    """Octets of the KBTP block written when the reset comes (64 MiB in the full form)."""
    return (64 if full else 8) << 20


def rping_size(full: bool) -> int:
    """rping's buffer (-S) for the resets: 16 MiB (rping's limit) in the full form."""
    return (16 if full else 4) << 20


def reset_target(full: bool) -> Server:
    size = reset_size(full)
    return kbtp_target(
        ["w:quota=2,direct=both"], pool=2, block=f"{size >> 20}M", extra=["--max-inline", "4096"]
    )


def reset_mid_write_kbtp(server: Server, full: bool, progress: Callable[[str], None]) -> Fault:
    size = reset_size(full)
    fault = Fault(
        "kbtp-target", f"reset in the middle of a {size >> 20} MiB RDMA Write (DIRECT_ALLOC)"
    )
    caps = Capability.DIRECT_LOAD | Capability.DIRECT_ALLOC
    rss_before = server.rss_kib()
    relay = ResettingRelay(server.port, True, size // 2)

    async def attack() -> None:
        cm, ini = await _connect_retry(relay.port, "w", caps, max_block_size=size)
        try:
            with contextlib.suppress(Exception):
                await ini.reserve(os.urandom(1024) * (size // 1024))
        finally:
            with contextlib.suppress(BaseException):
                await cm.__aexit__(None, None, None)

    with contextlib.suppress(Exception):
        run_trio(attack, timeout=300)
    relay.close()
    fault.tried = 1
    fired = relay.fired
    # The next client: both blocks of the quota, a whole block written and read back.
    verified = [0]

    async def after() -> None:
        cm, ini = await _connect_retry(server.port, "w", caps, max_block_size=size)
        try:
            base = ini.ack.handle_base
            for k in range(2):
                data = os.urandom(1 << 20) * (size >> 20)
                await ini.direct_alloc(base + k, data)
                got = await ini.load(base + k)
                verified[0] += got == data
            for k in range(2):
                await ini.free(base + k)
        finally:
            await cm.__aexit__(None, None, None)

    try:
        run_trio(after, timeout=600)
    except Exception as exc:
        fault.note = f"next client failed: {type(exc).__name__}: {exc}; "
    fault.alive = server.alive()
    fault.served = fault.alive and verified[0] == 2 and fired
    fault.lost = 2 - verified[0]
    fault.note += (
        f"reset {'after ' + str(relay.seen >> 20) + ' MiB written' if fired else 'DID NOT FIRE'}; "
        f"next client wrote and read back {verified[0]}/2 whole blocks; "
        f"RSS {rss_before} -> {server.rss_kib()} KiB"
    )
    progress(f"faults: {fault.name}: {fault.note}")
    return fault


def reset_mid_write_rping(
    server: Server, size: int, progress: Callable[[str], None]
) -> list[Fault]:
    """The rping server RDMA Reads our buffer, then RDMA Writes its copy back: reset in
    the middle of each."""
    out = []
    for outbound, what in (
        (True, "RDMA Read Response (ours)"),
        (False, "RDMA Write (the server's)"),
    ):
        fault = Fault("rping", f"reset in the middle of a {size >> 20} MiB {what}")
        relay = ResettingRelay(server.port, outbound, size // 2)

        async def attack(relay: ResettingRelay = relay) -> None:
            ep = Endpoint(size)
            async with ConnectionManager.open(ep.rnic) as cm:
                conn = await cm.connect("127.0.0.1", relay.port, ep.qp, first_fpdu_delay=0.2)
                ep.start_mr.buf[:] = b"y" * size  # no NUL: the server writes it all back
                ep.send_info(ep.start_mr)
                with trio.fail_after(120):
                    await ep.expect(WcOpcode.RECV)
                    ep.send_info(ep.rdma_mr)
                    await ep.expect(WcOpcode.RECV)
                await conn.disconnect()

        with contextlib.suppress(BaseException):
            run_trio(attack, timeout=180)
        relay.close()
        fired = relay.fired
        fault.tried = 1
        fault.alive = server.alive()
        fault.served = fault.alive and fired and rping_ping(server.port, size=1 << 20)
        fault.note = (f"reset after {relay.seen >> 20} MiB" if fired else "reset DID NOT FIRE") + (
            "; the next client's 1 MiB validated ping worked" if fault.served else ""
        )
        out.append(fault)
        progress(f"faults: rping: {fault.name}: {fault.note}")
    return out


def run_faults(full: bool, seed: int, progress: Callable[[str], None]) -> FaultFigures:
    figures = FaultFigures()
    servers = [kill_target(full), reset_target(full), rping_server(size=rping_size(full))]
    try:
        kill, reset, rping = (server.ready() for server in servers)
        silent_kbtp = [Silent(kill), Silent(kill, session=True)]
        silent_rping = [Silent(rping)]
        figures.faults.append(kill_initiators(kill, full, seed, progress))
        figures.faults.append(reset_mid_write_kbtp(reset, full, progress))
        figures.faults.append(
            silence_result(kill, silent_kbtp, lambda: _kbtp_round(kill.port, "k"))
        )
        figures.faults.append(silence_result(rping, silent_rping, lambda: rping_ping(rping.port)))
        for fault in figures.faults[-2:]:
            progress(f"faults: {fault.server}: {fault.name}: {fault.note}")
        figures.faults += reset_mid_write_rping(rping, rping_size(full), progress)
    finally:
        for server in servers:
            server.stop()
    return figures
