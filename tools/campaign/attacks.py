"""The hostile part's generic attacks on any MPA listener, over loopback TCP.

Garbage instead of an MPA Request and garbage FPDUs after a valid one, RST storms (connect,
or connect and start MPA, then close with SO_LINGER 0), half-open floods (TCP connect, never
send MPA), slowloris (the Request one octet per interval), Terminate storms (a valid
startup, then Terminates) and descriptor exhaustion (the server's RLIMIT_NOFILE lowered,
more connections than that); with the socket helpers and the hand-driven MPA initiator
(:func:`raw_session`) they and the other parts share, and :class:`Attack`, one outcome.
"""

from __future__ import annotations

import contextlib
import random
import socket
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass

from stack.constants import MPA_KEY_REQ
from stack.transport.cm import MAX_STARTUPS, MAX_STARTUPS_PER_PEER
from stack.wire.connection import IwarpConnection
from stack.wire.events import Established, MpaSettings, NeedData, Role, Send, Terminate
from stack.wire.rdmap import encode_message
from tools.campaign.servers import Server

LINGER_0 = struct.pack("ii", 1, 0)
REQUEST_DATA = b'{"t":"write","s":4096}'
"""The private data of the attacks' valid startups: the bench server's session request (a
4 KiB Write target, SessionSpec); the KBTP target and rping ignore it."""


@dataclass
class Attack:
    """The outcome of one attack on one server."""

    server: str
    name: str
    tried: int = 0
    alive: bool = True
    served: bool = True
    lost: int = 0
    fds_before: int = 0
    fds_after: int = 0
    note: str = ""

    @property
    def fds_ok(self) -> bool:
        return self.fds_after <= self.fds_before + 3


def _reset(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, LINGER_0)
    sock.close()


def _connect(port: int, source: str = "127.0.0.1", timeout: float = 5.0) -> socket.socket:
    sock = socket.socket()
    sock.settimeout(timeout)
    sock.bind((source, 0))
    sock.connect(("127.0.0.1", port))
    return sock


def _wait_closed(sock: socket.socket, timeout: float) -> bool:
    """True if the peer closes (EOF or reset) within ``timeout`` seconds."""
    sock.settimeout(0.5)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if sock.recv(65536) == b"":
                return True
        except TimeoutError:
            continue
        except OSError:
            return True
    return False


def raw_session(
    port: int,
    settings: MpaSettings | None = None,
    source: str = "127.0.0.1",
    private_data: bytes | None = None,
) -> tuple[socket.socket, IwarpConnection]:
    """A hand-driven MPA initiator on a plain socket, in Full Operation; its Request carries
    ``private_data`` (default :data:`REQUEST_DATA`)."""
    sock = _connect(port, source)
    engine = IwarpConnection(Role.INITIATOR, settings or MpaSettings())
    engine.initiate(time.monotonic(), REQUEST_DATA if private_data is None else private_data)
    sock.sendall(engine.data_to_send())
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        data = sock.recv(65536)
        if not data:
            break
        engine.receive_data(data)
        while not isinstance(event := engine.next_event(), NeedData):
            if isinstance(event, Established):
                out = engine.data_to_send()
                if out:
                    sock.sendall(out)
                return sock, engine
    sock.close()
    raise ConnectionError("no MPA Reply from the server")


# -- the attacks (each returns how many connections or messages it tried) ---------------


def garbage(port: int, rng: random.Random, n: int) -> int:
    for i in range(n):
        try:
            sock = _connect(port)
            if i % 3 == 0:
                payload = rng.randbytes(rng.randint(1, 4096))
            elif i % 3 == 1:  # a Request key, then nonsense
                payload = MPA_KEY_REQ + rng.randbytes(rng.randint(0, 600))
            else:  # a PD_Length far beyond the limit (MPA-21)
                payload = MPA_KEY_REQ + bytes([0x40, 0x00, 0xFF, 0xFF]) + rng.randbytes(64)
            sock.sendall(payload)
            if i % 10 == 0:
                _wait_closed(sock, 1.0)
            sock.close()
        except OSError:
            pass
    for i in range(max(n // 5, 1)):  # valid startup, then garbage FPDUs
        try:
            sock, _engine = raw_session(port)
            body = rng.randbytes(rng.randint(8, 3000))
            if i % 2:  # a whole FPDU by its length field, failing its CRC at once
                body = (
                    struct.pack(">H", len(body) - 6 + (-len(body) % 4))
                    + body
                    + bytes(-len(body) % 4)
                )
            sock.sendall(body)
            if i % 2:
                _wait_closed(sock, 2.0)
            sock.close()
        except OSError:
            pass
    return n + max(n // 5, 1)


def rst_storm(port: int, rng: random.Random, n: int) -> int:
    for i in range(n):
        try:
            sock = _connect(port)
            if i % 4 == 1:
                sock.sendall(MPA_KEY_REQ[: rng.randint(1, 16)])
            elif i % 4 == 2:
                sock.sendall(MPA_KEY_REQ + b"\x40\x00\x00\x08" + bytes(8)[: rng.randint(0, 8)])
            _reset(sock)
        except OSError:
            pass
    for _ in range(max(n // 10, 1)):  # established, then reset
        try:
            sock, engine = raw_session(port)
            engine.send_message(Send(b"about to vanish", False, None))
            sock.sendall(engine.data_to_send())
            _reset(sock)
        except OSError:
            pass
    return n + max(n // 10, 1)


def half_open_flood(
    port: int, n: int, check: Callable[[], bool], sources: int = 3, settle: float = 0.5
) -> tuple[int, bool, bool]:
    """``n`` silent connections from ``sources`` other loopback addresses, then, ``settle``
    seconds later, the good client (from 127.0.0.1) while they are held.  Returns
    (connections made, good client ok, the flood stayed within the listener's bounds).
    The good client must be served either way: within the bounds (MAX_STARTUPS_PER_PEER per
    address, MAX_STARTUPS in all) a slot is free; beyond them it takes a slot of the busiest
    flooding address, or, a flood spread one connection per address, the oldest slot once
    it is stale (stack.transport.startup_slots)."""
    held: list[socket.socket] = []
    for i in range(n):
        k = i % sources
        try:
            held.append(_connect(port, f"127.0.{k // 250}.{2 + k % 250}"))
        except OSError:
            pass
    time.sleep(settle)
    ok = check()
    for sock in held:
        sock.close()
    per_source = -(-len(held) // sources)
    within = min(per_source, MAX_STARTUPS_PER_PEER) * sources < MAX_STARTUPS
    return len(held), ok, within


def slowloris(port: int, n: int, interval: float) -> tuple[int, int]:
    """``n`` connections sending the Request one octet per ``interval``; how many the
    server closed before the whole Request was sent (MPA-26 startup timeout)."""
    socks = []
    for i in range(n):
        with contextlib.suppress(OSError):
            socks.append(_connect(port, f"127.0.0.{2 + i % 4}"))
    request = MPA_KEY_REQ + b"\x40\x00\x00\x40" + bytes(64)  # rev 1, 64 octets private data
    closed: set[int] = set()
    for octet in request:
        if len(closed) == len(socks):
            break
        for k, sock in enumerate(socks):
            if k in closed:
                continue
            try:
                sock.send(bytes([octet]))
            except OSError:
                closed.add(k)
        time.sleep(interval)
    for k, sock in enumerate(socks):
        if k not in closed and _wait_closed(sock, 0.1):
            closed.add(k)
        sock.close()
    return len(socks), len(closed)


def terminate_storm(port: int, n: int, per_connection: int = 20) -> int:
    """Valid startups, then one Terminate or a burst of them (RDMAP-10 forbids all but
    the first, so they are framed past the sending stream's own check)."""
    sent = 0
    term = Terminate(layer=2, etype=1, code=3)
    for i in range(n):
        try:
            sock, engine = raw_session(port)
            for k in range(1 if i % 2 else per_connection):
                for ulpdu in encode_message(term, msn=1 + k, mulpdu=engine.mpa.mulpdu):
                    engine.mpa.send_ulpdu(ulpdu)
                sent += 1
            sock.sendall(engine.data_to_send())
            _wait_closed(sock, 2.0)
            sock.close()
        except OSError:
            pass
    return sent


def emfile(server: Server, check: Callable[[Server], bool], limit: int, n: int) -> Attack:
    """``n`` connections held against a server started with RLIMIT_NOFILE ``limit``."""
    server.ready()
    attack = Attack(server.name, f"EMFILE (RLIMIT_NOFILE {limit}, {n} connections)")
    try:
        attack.fds_before = server.baseline_fds
        held = []
        for i in range(n):
            with contextlib.suppress(OSError):
                held.append(_connect(server.port, f"127.0.0.{2 + i % 8}"))
        time.sleep(1.0)
        attack.note = f"{server.fds()} fds held at the limit"
        for sock in held:
            sock.close()
        attack.tried = len(held)
        attack.fds_after = server.fds_settle()
        attack.alive = server.alive()
        attack.served = attack.alive and check(server)
    finally:
        server.stop()
    return attack
