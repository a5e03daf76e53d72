"""The passive half of the RDMA benchmarks (``iwarp bench server``): :class:`BenchServer`.

Generic: each QP's MPA Request says what it runs (:class:`~stack.bench.protocol.SessionSpec`),
within :data:`~stack.bench.protocol.MAX_SESSION_BYTES` of memory (a larger Request is
rejected, the server serves on).  The server registers a target region, keeps a receive
queue full for Sends (iWARP has no receiver-not-ready retry: a Send finding no receive is
fatal), answers latency ping-pongs, and serves the raw-TCP baselines and statistics on a
second port.  A client that leaves the server's output unread has its session alone ended,
with the reason logged, on every port alike (:mod:`stack.bench.session`: after
``stall_timeout`` seconds without progress, or at once past its send queue).
"""

from __future__ import annotations

import gc
import json
import os
import sys
import time
from typing import TextIO

import trio

from stack.bench.baseline import answer_requests
from stack.bench.blocking import BlockingServer
from stack.bench.blocking_iwarp import BlockingIwarpServer
from stack.bench.memory import wait_for_byte
from stack.bench.options import BenchError, mpa_settings
from stack.bench.process import rss_bytes
from stack.bench.protocol import (
    RAW_COUNT,
    RAW_HEADER,
    RAW_MAGIC,
    RAW_REQRESP,
    RAW_SINK,
    RAW_STATS,
    receive_exactly,
    reject_data,
)
from stack.bench.raw_socket import count_received, socket_of
from stack.bench.session import (
    STALL_TIMEOUT,
    MemoryBudget,
    Session,
    limit_stall,
    log_session_end,
    log_stall,
    stalled,
)
from stack.constants import RAW_RECEIVE_SIZE
from stack.errors import IwarpError
from stack.rnic import (
    Rnic,
)
from stack.rnic.memory import ProtectionDomain
from stack.transport.cm import ConnectFailed, ConnectionManager, ConnectRequest
from stack.transport.sockopts import limit_unsent


class BenchServer:
    """The passive half: accepts QPs as :class:`SessionSpec` asks and serves raw TCP.

    ``crc``: request CRC (otherwise follow the client, which decides); ``markers``: want
    markers in FPDUs sent to the server; ``stall_timeout``: seconds a client may take none
    of its session's output before the session is ended.  :meth:`run` listens on ``port``
    (0: any) for iWARP and on an ephemeral port for the raw-TCP baselines, and reports both
    through ``task_status``.
    """

    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        crc: bool = False,
        markers: bool = False,
        emss: int | None = None,
        stall_timeout: float = STALL_TIMEOUT,
    ) -> None:
        self.host = host
        self.stall_timeout = stall_timeout
        self.requested_port = port
        self.settings = mpa_settings(crc, markers, emss)
        self.rnic = Rnic("bench-server")
        self.pd: ProtectionDomain = self.rnic.alloc_pd()
        self.port = 0
        self.raw_port = 0
        self.blocking_port = 0
        self.iwarp_blocking_port = 0
        self.active = 0
        """QPs connected right now."""
        self.budget = MemoryBudget()
        """The registered memory every session holds, on both drivers' ports together."""

    async def run(self, *, task_status: trio.TaskStatus[tuple[int, int]]) -> None:
        async with ConnectionManager.open(self.rnic) as cm:
            try:
                listener = await cm.listen(
                    self.host, self.requested_port, settings=self.settings, backlog=4096
                )
                raw = await trio.open_tcp_listeners(0, host=self.host)
            except OSError as exc:
                where = f"{self.host}:{self.requested_port}"
                raise BenchError(f"cannot listen on {where}: {exc}") from None
            self.port = listener.port
            self.raw_port = raw[0].socket.getsockname()[1]
            blocking = BlockingServer(self.host, self.stall_timeout)
            self.blocking_port = blocking.port
            try:
                iwarp_blocking = BlockingIwarpServer(
                    self.host, self.settings, self.advert_ports, self.budget, self.stall_timeout
                )
            except OSError as exc:
                blocking.close()
                raise BenchError(f"cannot listen on {self.host}: {exc}") from None
            self.iwarp_blocking_port = iwarp_blocking.port
            try:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(trio.serve_listeners, self._raw_connection, raw)
                    task_status.started((self.port, self.raw_port))
                    async for request in listener:
                        nursery.start_soon(self._session, request)
            finally:
                blocking.close()
                iwarp_blocking.close()

    async def _session(self, request: ConnectRequest) -> None:
        """One QP: a Request that is malformed, asks more than MAX_SESSION_BYTES or cannot be
        mapped is rejected with the reason (MPA-23); the others run until the client ends."""
        try:
            spec, session = Session.for_request(
                self.rnic, self.pd, request.private_data, self.advert_ports(), self.budget
            )
        except BenchError as exc:
            await request.reject(reject_data(exc))
            return
        try:
            conn = await request.accept(session.qp, session.advert.encode())
        except ConnectFailed:
            session.close()
            return
        if isinstance(conn.stream, trio.SocketStream):
            limit_stall(conn.stream, self.stall_timeout)
        self.active += 1
        try:
            async with trio.open_nursery() as nursery:
                if session.recv is not None:
                    nursery.start_soon(self._serve_sends, session)
                elif session.pong is not None:
                    nursery.start_soon(self._pong_writes, session, spec.size)
                await conn.wait_closed()
                nursery.cancel_scope.cancel()
        except* IwarpError as group:  # a WR refused at posting (a full send queue): this one
            conn.abort(group.exceptions[0])  # session ends, as on the blocking port
            with trio.CancelScope(shield=True), trio.move_on_after(5.0):
                await conn.wait_closed()
        finally:
            self.active -= 1
            session.close()
            log_session_end("iWARP", spec, conn.error, self.stall_timeout)

    def advert_ports(self) -> tuple[int, int, int]:
        """The ports every Advert names: raw trio, blocking sockets, blocking iWARP."""
        return self.raw_port, self.blocking_port, self.iwarp_blocking_port

    @staticmethod
    async def _serve_sends(session: Session) -> None:
        """Keep the receive queue full; in latency mode answer each Send with a Send."""
        cq = session.cq
        while session.answer([await cq.next(), *cq.poll(len(cq))]):
            pass

    @staticmethod
    async def _pong_writes(session: Session, size: int) -> None:
        """Write latency: poll the last byte of the target, answer each ping with a Write."""
        assert session.target is not None
        tbuf, last = session.target.buf, session.pong_index(size)
        expected = 1
        while True:
            try:
                await wait_for_byte(tbuf, last, expected, session.qp)
            except BenchError:
                return
            session.send_pong(expected, size)
            expected = expected % 255 + 1

    async def _raw_connection(self, stream: trio.SocketStream) -> None:
        """One raw-TCP connection: a baseline or the statistics (:mod:`stack.bench.protocol`)."""
        limit_unsent(stream)  # as the iWARP driver does with its sockets
        limit_stall(stream, self.stall_timeout)
        try:
            header = await receive_exactly(stream, RAW_HEADER.size)
            magic, mode, size, request = RAW_HEADER.unpack(header)
            if magic != RAW_MAGIC:
                return
            if mode == RAW_SINK:
                with socket_of(stream) as sock:
                    total = await count_received(sock, RAW_RECEIVE_SIZE)
                await stream.send_all(RAW_COUNT.pack(total))
            elif mode == RAW_REQRESP and request > 0:
                await answer_requests(stream, size, request)
            elif mode == RAW_STATS:
                if size:  # asked to collect garbage first (memory figures)
                    gc.collect()
                stats = {
                    "rss": rss_bytes(),
                    "qps": self.active,
                    "pid": os.getpid(),
                    "cpu_ns": time.process_time_ns(),
                }
                await stream.send_all(json.dumps(stats).encode())
        except (BenchError, trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
            if stalled(exc):
                log_stall("raw TCP", self.stall_timeout)
        finally:
            await trio.aclose_forcefully(stream)


async def serve_forever(server: BenchServer, *, announce: TextIO, exit_on_stdin_eof: bool) -> None:
    """Run ``server``; print ``PORT <iwarp> <raw>``; with ``exit_on_stdin_eof``, stop at EOF."""
    async with trio.open_nursery() as nursery:
        port, raw_port = await nursery.start(server.run)
        announce.write(f"PORT {port} {raw_port}\n")
        announce.flush()
        if exit_on_stdin_eof:
            stdin = trio.lowlevel.FdStream(os.dup(sys.stdin.fileno()))
            async with stdin:
                while await stdin.receive_some(4096):
                    pass
            nursery.cancel_scope.cancel()
