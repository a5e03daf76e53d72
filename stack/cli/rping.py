"""``iwarp rping``: an rping-compatible ping over RDMA (librdmacm's ``rping`` protocol).

Same flags and wire protocol as rdma-core's ``rping``, so either side can be the real tool
(for example on Linux siw).  Each iteration:

1. the client fills its start buffer with ``rdma-ping-<n>: ABC...`` and Sends its
   ``rping_rdma_info`` (16 bytes, big-endian: u64 buf, u32 rkey, u32 size);
2. the server RDMA-Reads the client's start buffer, then Sends a go-ahead;
3. the client Sends the info of its RDMA buffer; the server RDMA-Writes the ping data
   there, then Sends again;
4. the client checks (``-V``) that both buffers match.
"""

from __future__ import annotations

import argparse
import struct
import sys
from typing import Any

import trio

from stack.cli import CliError, trio_run
from stack.constants import RtrType
from stack.rnic import (
    Access,
    RecvWR,
    Rnic,
    SendWR,
    Sge,
    WcOpcode,
    WcStatus,
    WorkCompletion,
    WrOpcode,
)
from stack.rnic.cq import CompletionQueue
from stack.rnic.memory import MemoryRegion
from stack.rnic.qp import QueuePair
from stack.transport.cm import ConnectFailed, ConnectionManager, ConnectRejected
from stack.transport.driver import RdmaConnection
from stack.wire.events import CrcPolicy, MpaSettings

RDMA_INFO = struct.Struct(">QII")
"""``struct rping_rdma_info``: buf, rkey, size (network byte order)."""
DEFAULT_PORT = 7174
DEFAULT_SIZE = 64
MIN_SIZE = RDMA_INFO.size + len("rdma-ping-%d: ") + 11
MAX_SIZE = 1 << 24


class RpingError(Exception):
    """A protocol or completion failure during the ping loop."""


class Disconnected(RpingError):
    """The peer went away (outstanding work was flushed)."""


def ping_pattern(ping: int, size: int) -> bytes:
    """The start-buffer contents rping writes for iteration ``ping`` (NUL-terminated)."""
    head = f"rdma-ping-{ping}: ".encode()
    out = bytearray(head[: size - 1])
    c = 65 + ping % (123 - 65)
    while len(out) < size - 1:
        out.append(c)
        c = c + 1 if c < 122 else 65
    out.append(0)
    return bytes(out)


class Endpoint:
    """Buffers and QP of one rping side."""

    def __init__(self, size: int) -> None:
        self.rnic = Rnic("rping")
        self.pd = self.rnic.alloc_pd()
        self.cq: CompletionQueue = self.rnic.create_cq()
        self.qp: QueuePair = self.rnic.create_qp(self.pd, self.cq, ird=1, ord=1)
        self.size = size
        self.recv_mr = self.pd.reg_mr(bytearray(RDMA_INFO.size), Access.LOCAL_WRITE)
        self.send_mr = self.pd.reg_mr(bytearray(RDMA_INFO.size), Access.LOCAL_WRITE)
        rw = Access.LOCAL_WRITE | Access.REMOTE_WRITE | Access.REMOTE_READ
        self.rdma_mr = self.pd.reg_mr(bytearray(size), rw)
        self.start_mr = self.pd.reg_mr(bytearray(size), rw)
        self.qp.post_recv(self._recv_wr())

    def _recv_wr(self) -> RecvWR:
        return RecvWR(1, (Sge(self.recv_mr.addr, RDMA_INFO.size, self.recv_mr.lkey),))

    def send_info(self, mr: MemoryRegion | None) -> None:
        info = RDMA_INFO.pack(mr.addr, mr.rkey, mr.length) if mr else bytes(RDMA_INFO.size)
        self.send_mr.buf[:] = info
        self.qp.post_send(
            SendWR(2, WrOpcode.SEND, (Sge(self.send_mr.addr, RDMA_INFO.size, self.send_mr.lkey),))
        )

    async def expect(self, opcode: WcOpcode) -> None:
        """Wait for the next completion; it must be ``opcode`` and succeed."""
        if opcode is WcOpcode.RECV:
            await self.receive_info()
        else:
            await self._completion(opcode)

    async def receive_info(self) -> tuple[int, int, int]:
        """Wait for the peer's buffer info (a RECV completion): (addr, rkey, length)."""
        wc = await self._completion(WcOpcode.RECV)
        if wc.byte_len != RDMA_INFO.size:
            raise RpingError(f"Received bogus data, size {wc.byte_len}")
        addr, rkey, length = RDMA_INFO.unpack(bytes(self.recv_mr.buf))
        self.qp.post_recv(self._recv_wr())
        return addr, rkey, length

    async def _completion(self, opcode: WcOpcode) -> WorkCompletion:
        while True:
            wc = await self.cq.next()
            if wc.status is WcStatus.WR_FLUSH_ERR:
                raise Disconnected("connection closed by the peer")
            if wc.status is not WcStatus.SUCCESS:
                raise RpingError(
                    f"cq completion failed status {wc.status.value} ({wc.opcode.value})"
                )
            if wc.opcode is WcOpcode.SEND and opcode is not WcOpcode.SEND:
                continue  # send completions are not waited for, as in rping
            if wc.opcode is not opcode:
                raise RpingError(f"unexpected completion {wc.opcode.value}, wanted {opcode.value}")
            return wc


def settings_from(args: argparse.Namespace) -> MpaSettings:
    rtr = {"send": RtrType.SEND, "write": RtrType.WRITE, "read": RtrType.READ}
    kwargs: dict[str, Any] = {
        "rev": args.mpa_rev,
        "crc": CrcPolicy.REQUEST if args.crc else CrcPolicy.OFF,
        "want_markers": args.markers,
        "ird": 1,
        "ord": 1,
        "emss": args.emss,
    }
    if args.p2p:
        kwargs["p2p"] = True
        kwargs["rtr"] = rtr[args.p2p]
    return MpaSettings(**kwargs)


async def run_server(args: argparse.Namespace) -> int:
    ep = Endpoint(args.size)
    async with ConnectionManager.open(ep.rnic) as cm:
        listener = await cm.listen(args.addr or "0.0.0.0", args.port, settings=settings_from(args))
        if args.debug:
            print(f"rping: listening on port {listener.port}", file=sys.stderr, flush=True)
        request = await listener.get_request()
        conn = await request.accept(ep.qp, args.private_data.encode())
        status = 0
        try:
            await _server_loop(ep, conn, args)
        except* Disconnected:
            pass  # the client is done: rping's server exits normally
        except* RpingError as group:
            print(f"rping: {group.exceptions[0]}", file=sys.stderr)
            status = 1
        finally:
            await conn.disconnect()
        if status == 0 and conn.error is not None:
            # the peer's Terminate, or the connection reset or broken mid-transfer
            print(f"rping: {conn.error or type(conn.error).__name__}", file=sys.stderr)
            status = 1
    return status


async def _server_loop(ep: Endpoint, conn: RdmaConnection, args: argparse.Namespace) -> None:
    async with trio.open_nursery() as nursery:

        async def watch() -> None:
            await conn.wait_closed()
            nursery.cancel_scope.cancel()

        nursery.start_soon(watch)
        while True:
            addr, rkey, length = await ep.receive_info()
            if length > ep.size:
                raise RpingError(f"client buffer of {length} bytes exceeds -S {ep.size}")
            ep.qp.post_send(
                SendWR(3, WrOpcode.RDMA_READ, (Sge(ep.rdma_mr.addr, length, ep.rdma_mr.lkey),),
                       rkey=rkey, remote_addr=addr)
            )  # fmt: skip
            await ep.expect(WcOpcode.RDMA_READ)
            data = bytes(ep.rdma_mr.buf[:length]).split(b"\0", 1)[0]
            if args.verbose:
                print(f"server ping data: {data.decode(errors='replace')}", flush=True)
            ep.send_info(None)
            addr, rkey, length = await ep.receive_info()
            ep.qp.post_send(
                SendWR(4, WrOpcode.RDMA_WRITE,
                       (Sge(ep.rdma_mr.addr, min(len(data) + 1, length), ep.rdma_mr.lkey),),
                       rkey=rkey, remote_addr=addr)
            )  # fmt: skip
            await ep.expect(WcOpcode.RDMA_WRITE)
            ep.send_info(None)


async def run_client(args: argparse.Namespace) -> int:
    ep = Endpoint(args.size)
    async with ConnectionManager.open(ep.rnic) as cm:
        try:
            with trio.fail_after(args.timeout):
                conn = await cm.connect(
                    args.addr, args.port, ep.qp, private_data=args.private_data.encode(),
                    settings=settings_from(args), first_fpdu_delay=args.first_fpdu_delay,
                )  # fmt: skip
        except (ConnectFailed, ConnectRejected, trio.TooSlowError) as exc:
            print(f"rping: connect error: {exc}", file=sys.stderr)
            return 1
        failures = 0
        try:
            ping = 0
            while not args.count or ping < args.count:
                pattern = ping_pattern(ping, ep.size)
                ep.start_mr.buf[:] = pattern
                ep.send_info(ep.start_mr)
                with trio.fail_after(args.timeout):
                    await ep.expect(WcOpcode.RECV)
                    ep.rdma_mr.buf[:] = bytes(ep.size)
                    ep.send_info(ep.rdma_mr)
                    await ep.expect(WcOpcode.RECV)
                got = bytes(ep.rdma_mr.buf)
                if args.validate and got != pattern:
                    print(f"data mismatch!\n  sent {pattern!r}\n  got  {got!r}", file=sys.stderr)
                    failures += 1
                if args.verbose:
                    text = got.split(b"\0", 1)[0].decode(errors="replace")
                    print(f"ping data: {text}", flush=True)
                ping += 1
        except (RpingError, trio.TooSlowError) as exc:
            print(f"rping: {str(exc) or 'timed out'}", file=sys.stderr)
            return 1
        finally:
            await conn.disconnect()
        return 1 if failures else 0


def run(args: argparse.Namespace) -> int:
    if args.server == args.client:
        raise CliError("exactly one of -s (server) or -c (client) is required")
    if args.client and not args.addr:
        raise CliError("-c needs -a ADDRESS of the server")
    if not MIN_SIZE <= args.size <= MAX_SIZE:
        raise CliError(f"-S size must be in {MIN_SIZE}..{MAX_SIZE}")
    if args.count < 0:
        raise CliError("-C count must be >= 0")
    return trio_run(run_server if args.server else run_client, args)


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "rping", help="rping-compatible RDMA ping (client or server)",
        description="rping-compatible ping: Send, RDMA Read, RDMA Write (rdma-core protocol).",
    )  # fmt: skip
    p.add_argument("-s", dest="server", action="store_true", help="server")
    p.add_argument("-c", dest="client", action="store_true", help="client")
    p.add_argument("-a", dest="addr", help="address (server: bind, default all; client: server)")
    p.add_argument("-p", dest="port", type=int, default=DEFAULT_PORT, help="port (default 7174)")
    p.add_argument("-C", dest="count", type=int, default=0, help="ping count (0 = forever)")
    p.add_argument("-S", dest="size", type=int, default=DEFAULT_SIZE, help="ping data size")
    p.add_argument("-v", dest="verbose", action="store_true", help="display ping data")
    p.add_argument("-V", dest="validate", action="store_true", help="validate ping data")
    p.add_argument("-d", dest="debug", action="store_true", help="debug output")
    p.add_argument(
        "--mpa-rev", type=int, choices=(1, 2), default=2, help="MPA revision (default 2)"
    )
    p.add_argument("--crc", action=argparse.BooleanOptionalAction, default=True,
                   help="request MPA CRC (default on, RFC 5044)")  # fmt: skip
    p.add_argument("--markers", action="store_true", help="ask for MPA markers")
    p.add_argument(
        "--emss", type=int, help="EMSS for MULPDU (default: the socket's MSS; 1448 for Ethernet)"
    )
    p.add_argument("--p2p", choices=("send", "write", "read"), help="peer-to-peer with this RTR")
    p.add_argument("--private-data", default="", help="MPA private data to send")
    p.add_argument(
        "--first-fpdu-delay", type=float, default=0.2, metavar="S",
        help="client: wait S seconds after the MPA Reply before the first FPDU (default 0.2; "
        "avoids Linux siw's passive-side race, 0 to disable)",
    )  # fmt: skip
    p.add_argument("--timeout", type=float, default=30.0, help="seconds per step (default 30)")
    p.set_defaults(func=run)
