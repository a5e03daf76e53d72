"""Part 2: hostile peers against each server process over loopback TCP.

Attacks: garbage instead of an MPA Request and garbage FPDUs after a valid one, RST storms
(connect, or connect and start MPA, then close with SO_LINGER 0), descriptor exhaustion
(the server's RLIMIT_NOFILE lowered, more connections than that), half-open floods (TCP
connect, never send MPA), slowloris (the Request one octet per interval), Terminate storms
(a valid startup, then Terminates), and against the KBTP target forged Block Offsets and
tickets in BIND, forged one-sided operations on the ring and Head STags, and malformed
KBTP requests through the initiator API.  After each attack: the server is alive, a good
client completes real work, blocks stored before the attacks load byte-identical, and
the server's descriptor count returns near its baseline.
"""

from __future__ import annotations

import contextlib
import json
import random
import socket
import struct
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING

import trio

from kbtp import Capability, HelloRefused, KbtpInitiator
from kbtp.constants import TABLE_ENTRY_LEN, Status
from kbtp.initiator_core import CompareSwapOp, DirectOp, FetchAddOp, ReadOp, WriteOp
from kbtp.messages import Bind, HelloAck
from stack.constants import MPA_KEY_REQ
from stack.transport.cm import MAX_STARTUPS, MAX_STARTUPS_PER_PEER
from stack.transport.startup_slots import STARTUP_STALE_AFTER
from stack.wire.connection import IwarpConnection
from stack.wire.events import Established, MpaSettings, NeedData, Role, Send, Terminate
from stack.wire.rdmap import encode_message
from tools.campaign.seeds import kbtp_seeds
from tools.campaign.servers import (
    BenchClient,
    KbtpKeeper,
    Server,
    bench_server,
    block_data,
    kbtp_target,
    rping_ping,
    rping_server,
    run_trio,
)

if TYPE_CHECKING:
    from stack.rnic import MemoryRegion, QueuePair, Rnic, SendWR
    from stack.transport.blocking import BlockingConnection

LINGER_0 = struct.pack("ii", 1, 0)
EMFILE_LIMIT = 32
REQUEST_DATA = b'{"t":"write","s":4096}'
"""The private data of the attacks' valid startups: the bench server's session request (a
4 KiB Write target, SessionSpec); the KBTP target and rping ignore it."""
"""RLIMIT_NOFILE of the servers of the EMFILE attack (about 3 x their baseline)."""


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


@dataclass
class HostileFigures:
    attacks: list[Attack] = field(default_factory=list)


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


# -- KBTP-specific attacks through the initiator API -----------------------------------


class _Sessions:
    """One KBTP session at a time as ``identity``, opened again after the target ends it."""

    def __init__(self, port: int, identity: str) -> None:
        self.port = port
        self.identity = identity
        self._stack: contextlib.AsyncExitStack | None = None
        self.ini: KbtpInitiator | None = None

    async def get(self) -> KbtpInitiator:
        """The open session, or a new one (retried while the target ends the last one)."""
        attempt = 0
        while self.ini is None or self.ini.closed:
            await self.drop()
            self._stack = contextlib.AsyncExitStack()
            caps = Capability.DIRECT_LOAD | Capability.DIRECT_ALLOC
            host = "127.0.0.1"
            session = KbtpInitiator.connect(host, self.port, self.identity, capabilities=caps)
            try:
                self.ini = await self._stack.enter_async_context(session)
            except HelloRefused as exc:
                attempt += 1
                if exc.status is not Status.SESSION_EXISTS or attempt > 80:
                    raise
                await trio.sleep(0.25)
        return self.ini

    async def drop(self) -> None:
        stack, self._stack, self.ini = self._stack, None, None
        if stack is not None:
            with contextlib.suppress(Exception):
                await stack.aclose()


def _cas(ack: HelloAck, swap: int) -> DirectOp:
    """A Compare and Swap on the first slot's Block Offset through the Ring STag."""
    return CompareSwapOp(ack.ring_stag, ack.ring_offset + 8, 0, swap)


def _own_entries(ack: HelloAck) -> int:
    """Where the initiator's own block table entries start (docs/kbtp.md §3.2)."""
    return ack.table_offset + TABLE_ENTRY_LEN * (ack.handle_base - ack.table_base_handle)


async def _forbidden(
    sessions: _Sessions, build: Callable[[HelloAck], DirectOp], readable: bool
) -> int:
    """1 if the target let a forbidden one-sided operation through, else 0.

    A Read or an atomic that completes got through.  An RDMA Write completes at the sender
    whatever the target does, so the session must end before a Read of the initiator's own
    table entries that follows it; where the Write aimed at memory the initiator may read
    (``readable``), a fresh session must find the old contents there."""
    ini = await sessions.get()
    ack = ini.ack
    assert ack is not None
    op = build(ack)  # STags are per session (docs/kbtp.md §3.6): built for this one
    own = ReadOp(
        ack.table_stag,
        ack.table_offset + TABLE_ENTRY_LEN * (ack.handle_base - ack.table_base_handle),
        TABLE_ENTRY_LEN,
    )
    probe = ReadOp(op.stag, op.to, len(op.data)) if isinstance(op, WriteOp) else own
    try:
        before = await ini.one_sided(probe) if readable else b""
        with trio.fail_after(10):
            await ini.one_sided(op)
            if isinstance(op, WriteOp):
                await ini.one_sided(own)
        return 1  # completed, or the session outlived the forbidden Write
    except Exception:
        await sessions.drop()  # refused: the session is over, as it should be
    if not (isinstance(op, WriteOp) and readable):
        return 0
    ini = await sessions.get()
    assert ini.ack is not None
    again = build(ini.ack)  # the same memory under the new session's STag
    assert isinstance(again, WriteOp)
    return int(await ini.one_sided(ReadOp(again.stag, again.to, len(again.data))) != before)


async def _forged_kbtp(port: int, rng: random.Random, rounds: int) -> tuple[int, int]:
    """Forged BINDs, one-sided operations the STags' rights forbid, malformed requests.

    Returns (tried, accepted): a forged BIND that succeeded or a forbidden one-sided
    operation that completed is *accepted* (a finding).  A refused one-sided operation
    ends the session (the RNIC terminates it), as do some malformed requests: the next
    step opens a new one."""
    tried = accepted = 0
    sessions = _Sessions(port, "mallory")
    try:
        for r in range(rounds):
            ini = await sessions.get()
            ack = ini.ack
            assert ack is not None
            # BINDs with forged tickets and Block Offsets: table, past the memory,
            # misaligned, random (docs/kbtp.md §6.6: BAD_BIND)
            for block in (ack.table_offset, ack.pool_offset + (1 << 40), ack.pool_offset + 1,
                          rng.getrandbits(64)):  # fmt: skip
                tried += 1
                with contextlib.suppress(Exception):
                    ini = await sessions.get()
                    bind = Bind(0, ack.handle_base, rng.getrandbits(32), 10, block)
                    completion = await ini.request(bind, check=False)
                    accepted += completion.status == Status.SUCCESS
            # malformed requests (mutated KBTP encodings) with request IDs of their own
            for k, raw in enumerate(kbtp_seeds()):
                data = bytearray(raw)
                data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
                rid = 1 << 40 | r << 8 | k
                data[8:16] = rid.to_bytes(8, "big")
                tried += 1
                try:
                    ini = await sessions.get()
                    with trio.move_on_after(2):
                        await ini.send_raw(bytes(data), rid)
                except Exception:
                    await sessions.drop()
            # one-sided operations the STags' rights forbid (docs/kbtp.md §3.6)
            forbidden: list[tuple[Callable[[HelloAck], DirectOp], bool]] = [
                (partial(_cas, swap=rng.getrandbits(64)), False),
                (lambda a: FetchAddOp(a.ring_stag, a.ring_offset, 1, 0), False),
                (lambda a: ReadOp(a.head_stag, a.head_offset, 8), False),
                (lambda a: WriteOp(a.ring_stag, a.ring_offset, b"\xff" * 16), True),
                (lambda a: WriteOp(a.table_stag, _own_entries(a), b"\xee" * 32), True),
                (lambda a: WriteOp(a.table_stag, a.table_offset, bytes(TABLE_ENTRY_LEN)), False),
            ]
            tried += 1
            accepted += await _forbidden(sessions, *forbidden[r % len(forbidden)])
    finally:
        await sessions.drop()
    return tried, accepted


# -- bench-server-specific attacks: session requests over MPA, the raw baseline ports -------


def _bad_session_requests(rng: random.Random) -> list[bytes]:
    """MPA Request private data the bench server must reject (SessionSpec.decode)."""
    from stack.bench.options import MAX_RX_DEPTH, MAX_SIZE
    from stack.bench.protocol import SessionSpec

    big = [  # over MAX_SESSION_BYTES counted over every region the session would map
        SessionSpec("send", MAX_SIZE),
        SessionSpec("send", MAX_SIZE // 3 + 1, True),
        SessionSpec("write", MAX_SIZE // 2 + 1, True, 0, (1, 0, 64)),
        SessionSpec("read", MAX_SIZE + 1),
    ]
    pongs = [[1 << 32, 0, 64], [1, 1 << 64, 64], [1, 0, MAX_SIZE + 1], [1, 2], [True, 0, 64],
             [1.5, 0, 64], [-1, 0, 64], "abc", {"a": 1}, [1, 0, 64, 4]]  # fmt: skip
    texts = [b"", b"{", b"not json", b"[]", b"null", b"\xff\xfe\x00", b"{}", b'{"t":"write"}',
             b'{"t":"nuke","s":4096}', b'{"t":"write","s":-1}', b'{"t":"write","s":"4096"}',
             b'{"t":"write","s":1e9}', b'{"t":["write"],"s":64}',
             f'{{"t":"send","s":64,"rx":{MAX_RX_DEPTH + 1}}}'.encode(),
             b'{"t":"send","s":64,"rx":-1}', b"{" * 500, rng.randbytes(64),
             b'{"t":"write","s":' + b"9" * 400 + b"}"]  # fmt: skip
    forged = [json.dumps({"t": "write", "s": 64, "l": 1, "pong": pong}).encode() for pong in pongs]
    return texts + forged + [spec.encode() for spec in big]


def _bench_qp(size: int = 0) -> tuple[Rnic, QueuePair, MemoryRegion | None]:
    """A client RNIC, QP and (with ``size``) a pong region for a Write-latency session."""
    from stack.rnic import Access, Rnic

    rnic = Rnic("campaign-hostile-bench")
    pd = rnic.alloc_pd()
    qp = rnic.create_qp(pd, rnic.create_cq(64), ord=1)
    pong = pd.reg_mr(bytearray(size), Access.REMOTE_WRITE | Access.LOCAL_WRITE) if size else None
    return rnic, qp, pong


def _opened(port: int, private_data: bytes) -> int:
    """1 if the server opened a session for ``private_data`` (a Reject or a close: 0)."""
    from stack.errors import IwarpError
    from stack.transport.blocking_cm import connect

    _rnic, qp, _ = _bench_qp()
    try:
        conn = connect("127.0.0.1", port, qp, private_data=private_data, timeout=10)
    except IwarpError:
        return 0
    conn.abort()
    return 1


def _pinger(port: int, size: int) -> tuple[BlockingConnection, MemoryRegion, SendWR]:
    """A Write-latency session of ``size`` bytes on the blocking driver, and its ping WR."""
    from stack.bench.protocol import Advert, SessionSpec
    from stack.rnic import Access, SendFlags, SendWR, Sge, WrOpcode
    from stack.transport.blocking_cm import connect

    _rnic, qp, pong = _bench_qp(size)
    assert pong is not None
    spec = SessionSpec("write", size, True, 0, (pong.rkey, pong.base, size))
    conn = connect("127.0.0.1", port, qp, private_data=spec.encode(), timeout=10)
    advert = Advert.decode(conn.negotiated.peer_private_data)
    local = qp.pd.reg_mr(bytearray(size), Access.LOCAL_WRITE)
    sge = (Sge(local.base, size, local.lkey),)
    wr = SendWR(0, WrOpcode.RDMA_WRITE, sge, SendFlags.NONE, rkey=advert.rkey,
                remote_addr=advert.addr)  # fmt: skip
    return conn, local, wr


def _ping_and_vanish(port: int, n: int) -> int:
    """Write-latency clients that ping once and are gone at once (closed or reset)."""
    for i in range(n):
        with contextlib.suppress(Exception):
            conn, local, wr = _pinger(port, 4096)
            local.buf[-1] = 1
            conn.qp.post_send(wr)
            if i % 2:
                conn.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, LINGER_0)
            conn.abort()
    return n


def _never_reads(port: int, seconds: float, check: Callable[[], bool]) -> tuple[int, bool, bool]:
    """A Write-latency client that pings on and never reads its socket (the blocking
    driver posts at once; never calling progress is never reading), so the server's pongs
    back up and its send queue fills.  Returns (pings posted, the good client was served
    while it pinged, the server ended that session: it does once its send queue is full,
    or once none of its output is acknowledged for ``STALL_TIMEOUT``, which a short run may
    not reach; either way it serves others, docs/campaign.md)."""
    conn, local, wr = _pinger(port, 65536)
    posted = 0
    deadline = time.monotonic() + seconds
    try:
        while time.monotonic() < deadline and not conn.closed:
            local.buf[-1] = posted % 255 + 1
            try:
                conn.qp.post_send(wr)
            except Exception:  # our own send queue is full: the server stopped reading
                time.sleep(0.05)
                continue
            posted += 1
            time.sleep(0.0005)  # each ping seen on its own, so each is answered
        served = check()
        ended = conn.closed or _wait_closed(conn.sock, 1.0)
    finally:
        conn.abort()
    return posted, served, ended


def _raw_headers(port: int, rng: random.Random, n: int) -> tuple[int, int]:
    """Bad headers on a raw-TCP baseline port; (tried, connections the server kept open
    for a header it must refuse: bad magic, unknown mode, a request/response of 0)."""
    from stack.bench.protocol import RAW_HEADER, RAW_MAGIC, RAW_REQRESP, RAW_STATS

    refuse = [
        RAW_HEADER.pack(b"XXXX", 1, 0, 0),
        RAW_HEADER.pack(RAW_MAGIC, 0, 0, 0),
        RAW_HEADER.pack(RAW_MAGIC, 255, 1 << 20, 1),
        RAW_HEADER.pack(RAW_MAGIC, RAW_REQRESP, 64, 0),
    ]
    serve = [
        RAW_HEADER.pack(RAW_MAGIC, RAW_REQRESP, 0xFFFFFFFF, 1) + b"x",  # a 4 GiB reply
        RAW_HEADER.pack(RAW_MAGIC, RAW_REQRESP, 0, 1) + bytes(4096),  # empty replies
        RAW_HEADER.pack(RAW_MAGIC, RAW_STATS, 1, 0),  # garbage collection on demand
        RAW_HEADER.pack(RAW_MAGIC, RAW_REQRESP, 1 << 20, 1) + bytes(64),  # replies never read
    ]
    tried = kept = 0
    held: list[socket.socket] = []
    for i in range(n):
        for header in refuse:
            tried += 1
            with contextlib.suppress(OSError):
                sock = _connect(port)
                sock.sendall(header)
                kept += not _wait_closed(sock, 3.0)
                sock.close()
        for header in serve:
            tried += 1
            with contextlib.suppress(OSError):
                sock = _connect(port)
                sock.sendall(header)
                held.append(sock)
        with contextlib.suppress(OSError):  # a truncated header, a reset, random octets
            tried += 3
            sock = _connect(port)
            sock.sendall(RAW_MAGIC + b"\x02")
            sock.close()
            sock = _connect(port)
            sock.sendall(RAW_HEADER.pack(RAW_MAGIC, RAW_REQRESP, 64, 16) + bytes(i))
            _reset(sock)
            sock = _connect(port)
            sock.sendall(rng.randbytes(RAW_HEADER.size))
            _wait_closed(sock, 1.0)
            sock.close()
    time.sleep(0.5)
    for sock in held:
        _reset(sock)
    return tried, kept


def _forged_bench(
    server: Server, client: BenchClient, rng: random.Random, scale: int
) -> tuple[int, int, str]:
    """Hostile session requests on both iWARP ports, pings then gone, a client that never
    reads, bad raw-TCP headers on both baseline ports.  Returns (tried, accepted, note):
    *accepted* counts sessions opened for a Request the server must reject, a good client
    not served while a never-reading client pings, and raw connections kept open for a
    header the server must refuse."""
    tried = accepted = 0
    notes = []
    client.check()  # learns the blocking ports from the Advert
    iwarp_ports = [p for p in (server.port, client.blocking_port) if p]
    for port in iwarp_ports:
        for data in _bad_session_requests(rng):
            tried += 1
            accepted += _opened(port, data)
        tried += _ping_and_vanish(port, 6 * scale)
    for port in iwarp_ports:
        posted, served, ended = _never_reads(port, 1.5 * scale, lambda: client.check()[0])
        tried += posted
        accepted += not served
        notes.append(
            f"never-reading client: {posted} pings, "
            f"{'ended' if ended else 'not ended'} by the server"
            + ("" if served else ", good client refused meanwhile")
        )
    for port in (server.raw_port, client.blocking_raw_port):
        if port:
            more, kept = _raw_headers(port, rng, scale)
            tried += more
            accepted += kept
    return tried, accepted, "; ".join(notes)


# -- the part ----------------------------------------------------------------------------


def _during(ok: bool) -> str:
    return f"good client during the flood: {'ok' if ok else 'refused'}"


def _slow_note(closed: int, n: int) -> str:
    return f"{closed}/{n} closed by the server before the Request was complete"


def _kbtp_specs() -> list[str]:
    return ["keeper:quota=16", "mallory:quota=16,direct=both"]


def _attack_server(
    server: Server,
    check: Callable[[], tuple[bool, int]],
    rng: random.Random,
    scale: int,
    progress: Callable[[str], None],
    extra: Callable[[int], tuple[int, int, str]] | None = None,
    *,
    port: int | None = None,
    where: str = "",
    extra_name: str = "forged BIND / one-sided ops / malformed requests",
) -> list[Attack]:
    """Every attack in turn against one running server (on ``port``, by default its own;
    ``where`` prefixes the attacks' names), ``check`` after each."""
    attacks: list[Attack] = []

    def after(name: str, tried: int, note: str = "", ok: bool = True) -> None:
        name = where + name
        attack = Attack(server.name, name, tried, fds_before=server.baseline_fds, note=note)
        attack.fds_after = server.fds_settle()
        attack.alive = server.alive()
        attack.served, attack.lost = check() if attack.alive else (False, 0)
        attack.served = attack.served and ok
        attacks.append(attack)
        progress(
            f"hostile {server.name}: {name}: tried {tried}, alive {attack.alive}, served "
            f"{attack.served}, lost {attack.lost}, fds {attack.fds_before}->{attack.fds_after}"
            f"{', ' + note if note else ''}"
        )

    port = port or server.port
    after("garbage", garbage(port, rng, 40 * scale))
    after("RST storm", rst_storm(port, rng, 200 * scale))
    made, ok, within = half_open_flood(port, 100 * scale, lambda: check()[0])
    after("half-open flood", made, _during(ok), ok)
    if scale > 1:  # beyond the listener's bound in all: the good client takes a flood's slot
        made, ok, within = half_open_flood(port, 100 * scale, lambda: check()[0], sources=6)
        note = _during(ok) + ("" if within else f" (flood beyond MAX_STARTUPS {MAX_STARTUPS})")
        after("half-open flood beyond the bound", made, note, ok)
        spread = 60 * scale  # one connection per address: no busiest address to take from
        settle = STARTUP_STALE_AFTER + 0.5
        made, ok, within = half_open_flood(port, spread, lambda: check()[0], spread, settle)
        note = _during(ok) + ("" if within else f" (one per address, beyond {MAX_STARTUPS})")
        after("half-open flood from many addresses", made, note, ok)
    n, closed = slowloris(port, 8 * scale, 0.1)
    after("slowloris", n, _slow_note(closed, n), closed == n)
    after("Terminate storm", terminate_storm(port, 10 * scale))
    if extra is not None:
        try:
            tried, accepted, more = extra(port)
            note, ok = f"{accepted} forged requests or forbidden operations accepted", not accepted
            note += f"; {more}" if more else ""
        except Exception as exc:  # the attack itself could not go on: report, never crash
            tried, note, ok = 0, f"attack failed: {type(exc).__name__}: {exc}", False
        after(extra_name, tried, note, ok)
    return attacks


def _hostile_kbtp(
    full: bool, seed: int, progress: Callable[[str], None], offload: bool = False
) -> list[Attack]:
    """The attacks on ``kbtp target``; with ``offload``, on ``kbtp target --offload``, whose
    chains answer the requests (mallory's ALLOC_STORE and FREE too, DIRECT_ALLOC) without
    the target application (docs/kbtp.md §8.1); its listener is the same, so the EMFILE
    attack runs once, on the software target."""
    scale = 5 if full else 1
    stream = "kbtp-target-offload" if offload else "kbtp"  # the software's seeds as before
    rng = random.Random(f"{seed}:hostile:{stream}")

    def factory(nofile: int | None) -> Server:
        extra = ["--hello-timeout", "3", "--idle-timeout", "20"]
        return kbtp_target(_kbtp_specs(), pool=64, extra=extra, nofile=nofile, offload=offload)

    low = None if offload else factory(EMFILE_LIMIT)  # starts while the other is attacked
    try:
        with factory(None) as server:
            keeper = KbtpKeeper(server.port)
            keeper.store_all()

            def forged(port: int) -> tuple[int, int, str]:
                result = [(0, 0)]

                async def body() -> None:
                    result[0] = await _forged_kbtp(port, rng, 6 * scale)

                run_trio(body, timeout=300)
                return (*result[0], "")

            attacks = _attack_server(server, keeper.check, rng, scale, progress, forged)
        if low is not None:
            fresh = lambda s: KbtpKeeper(s.port, "keeper", 2).check()[0]  # noqa: E731
            attacks.append(emfile(low, fresh, EMFILE_LIMIT, 60 * scale))
            progress(f"hostile {low.name}: {attacks[-1].name}: served {attacks[-1].served}")
    finally:
        if low is not None:
            low.stop()
    return attacks


def _hostile_rping(full: bool, seed: int, progress: Callable[[str], None]) -> list[Attack]:
    scale = 5 if full else 1
    rng = random.Random(f"{seed}:hostile:rping")
    low = rping_server(EMFILE_LIMIT)
    try:
        with rping_server() as server:
            attacks = _attack_server(
                server, lambda: (rping_ping(server.port), 0), rng, scale, progress
            )
        attacks.append(emfile(low, lambda s: rping_ping(s.port), EMFILE_LIMIT, 60 * scale))
        progress(f"hostile rping: {attacks[-1].name}: served {attacks[-1].served}")
    finally:
        low.stop()
    return attacks


def _hostile_bench(full: bool, seed: int, progress: Callable[[str], None]) -> list[Attack]:
    """The generic attacks on the bench server's trio iWARP port and on its blocking-driver
    iWARP port, then hostile session requests and raw-TCP headers (:func:`_forged_bench`)."""
    scale = 5 if full else 1
    rng = random.Random(f"{seed}:hostile:bench")
    low = bench_server(EMFILE_LIMIT)
    try:
        with bench_server() as server:
            client = BenchClient(server)
            if not client.check()[0]:
                raise RuntimeError(f"bench-server does not serve: {server.stderr()}")
            forged = lambda _port: _forged_bench(server, client, rng, scale)  # noqa: E731
            attacks = _attack_server(
                server, client.check, rng, scale, progress, forged,
                extra_name="hostile session requests / pingers / raw headers",
            )  # fmt: skip
            attacks += _attack_server(
                server, client.check, rng, scale, progress,
                port=client.blocking_port, where="blocking iWARP port: ",
            )  # fmt: skip
        attacks.append(emfile(low, lambda s: BenchClient(s).check()[0], EMFILE_LIMIT, 60 * scale))
        progress(f"hostile bench-server: {attacks[-1].name}: served {attacks[-1].served}")
    finally:
        low.stop()
    return attacks


def run_hostile(full: bool, seed: int, progress: Callable[[str], None]) -> HostileFigures:
    """The attacks on the KBTP target (software and offloaded), the rping server and the
    bench server, the four in parallel."""
    with ThreadPoolExecutor(4) as pool:
        kbtp = pool.submit(_hostile_kbtp, full, seed, progress)
        offload = pool.submit(_hostile_kbtp, full, seed, progress, True)
        rping = pool.submit(_hostile_rping, full, seed, progress)
        bench = pool.submit(_hostile_bench, full, seed, progress)
        results = (kbtp, offload, rping, bench)
        return HostileFigures([a for r in results for a in r.result()])


__all__ = ["Attack", "HostileFigures", "block_data", "run_hostile"]
