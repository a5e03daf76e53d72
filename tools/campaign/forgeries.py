"""The hostile part's server-specific attacks, each a (tried, accepted) count of findings.

Against the KBTP target, through the initiator API: forged Block Offsets and tickets in
BIND, one-sided operations the ring's and Head's STags forbid, malformed KBTP requests.
Against the bench server: session requests it must reject over MPA, clients that ping and
vanish or never read, bad headers on its raw-TCP baseline ports.
"""

from __future__ import annotations

import contextlib
import json
import random
import socket
import time
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING

import trio

from kbtp import Capability, HelloRefused, KbtpInitiator
from kbtp.constants import TABLE_ENTRY_LEN, Status
from kbtp.initiator_core import CompareSwapOp, DirectOp, FetchAddOp, ReadOp, WriteOp
from kbtp.messages import Bind, HelloAck
from tools.campaign.attacks import LINGER_0, _connect, _reset, _wait_closed
from tools.campaign.seeds import kbtp_seeds
from tools.campaign.servers import BenchClient, Server

if TYPE_CHECKING:
    from stack.rnic import MemoryRegion, QueuePair, Rnic, SendWR
    from stack.transport.blocking import BlockingConnection


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
