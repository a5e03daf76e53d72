"""``iwarp rping``: an rping-compatible ping over RDMA (librdmacm's ``rping`` protocol).

Same flags and wire protocol as rdma-core's ``rping``, so either side can be the real tool
(for example on Linux siw).  Each iteration:

1. the client fills its start buffer with ``rdma-ping-<n>: ABC...`` and Sends its
   ``rping_rdma_info`` (16 bytes, big-endian: u64 buf, u32 rkey, u32 size);
2. the server RDMA-Reads the client's start buffer, then Sends a go-ahead;
3. the client Sends the info of its RDMA buffer; the server RDMA-Writes the ping data
   there, then Sends again;
4. the client checks (``-V``) that both buffers match.

``-P`` serves clients concurrently, each on its own QP, as rdma-core's ``rping -P`` (one
thread per client there); ``-I`` binds the client's source address; ``-d`` prints rping's
debug lines plus the negotiated MPA parameters (RFC 5044 §7.1, RFC 6581 §9) and any
Terminate received or sent (RFC 5040 §5.4); ``-w FILE`` records our side to a pcap.
"""

from __future__ import annotations

import argparse
import struct
import sys
from typing import Any

import trio

from stack.cli import (
    address,
    emss,
    one_line_errors,
    port_number,
    positive_seconds,
    seconds,
    trio_run,
)
from stack.cli.capture import CAPTURE_HELP, capturing_manager
from stack.cli.json_report import check_output
from stack.constants import MPA_MAX_PRIVATE_DATA, RtrType
from stack.errors import IwarpError
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
from stack.rnic.endpoint import PeerTerminated
from stack.rnic.memory import MemoryRegion
from stack.rnic.qp import QueuePair
from stack.transport.cm import ConnectFailed, ConnectRejected, ConnectRequest
from stack.transport.driver import RdmaConnection
from stack.wire.events import CrcPolicy, MpaSettings

RDMA_INFO = struct.Struct(">QII")
"""``struct rping_rdma_info``: buf, rkey, size (network byte order)."""
DEFAULT_PORT = 7174
DEFAULT_SIZE = 64
MIN_SIZE = RDMA_INFO.size + len("rdma-ping-%d: ") + 11
MAX_SIZE = 1 << 24
MAX_COUNT = (1 << 31) - 1
"""Most pings ``-C`` asks: rping's own count is a C ``int``.  0, the default, pings until
interrupted or the peer goes, as rping does: a run for ever is what it asks, so a count as
large as an int (days of pings) is not refused as a mistake either."""


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

    def __init__(self, size: int, rnic: Rnic | None = None) -> None:
        self.rnic = rnic or Rnic("rping")
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

    def close(self) -> None:
        """Give back the QP and the memory regions (a persistent server makes an Endpoint
        per client on one RNIC: without this each client's buffers stayed registered)."""
        self.rnic.destroy_qp(self.qp)
        for mr in (self.recv_mr, self.send_mr, self.rdma_mr, self.start_mr):
            if mr.valid:
                mr.dereg()

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
                    f"cq completion failed status {wc.status.value} "
                    f"({wc.status.text}, {wc.opcode.name})"
                )
            if wc.opcode is WcOpcode.SEND and opcode is not WcOpcode.SEND:
                continue  # send completions are not waited for, as in rping
            if wc.opcode is not opcode:
                raise RpingError(f"unexpected completion {wc.opcode.name}, wanted {opcode.name}")
            return wc


class Debug:
    """rping's ``-d`` output (its DEBUG_LOG lines), on stderr; silent without ``-d``."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled

    def __call__(self, line: str) -> None:
        if self.enabled:
            print(line, file=sys.stderr, flush=True)

    def negotiated(self, conn: RdmaConnection) -> None:
        """The MPA outcome (RFC 5044 §7.1, RFC 6581 §9): rev, CRC, markers, IRD/ORD, RTR."""
        neg = conn.negotiated
        if not self.enabled or neg is None:
            return
        peer = f" (peer IRD {neg.peer_ird} ORD {neg.peer_ord})" if neg.peer_ird is not None else ""
        rtr = f"P2P on, RTR {neg.rtr.name}" if neg.p2p else "P2P off"
        data = neg.peer_private_data
        self(
            f"MPA rev {neg.rev}, CRC {'on' if neg.crc else 'off'}, markers "
            f"tx {'on' if neg.markers_tx else 'off'} rx {'on' if neg.markers_rx else 'off'}, "
            f"IRD {neg.ird} ORD {neg.ord}{peer}, {rtr}, MULPDU {neg.mulpdu}"
        )
        self(f"MPA peer private data ({len(data)} bytes): {data!r}")

    def terminates(self, conn: RdmaConnection) -> None:
        """A Terminate the peer sent, or one we sent (RFC 5040 §5.4)."""
        if not self.enabled:
            return
        if isinstance(conn.error, PeerTerminated):
            self(f"Terminate received: {conn.error.terminate}")
        if conn.engine.terminate_sent:
            self(f"Terminate sent: {conn.error}")


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
    debug = Debug(args.debug)
    rnic = Rnic("rping")
    async with capturing_manager(rnic, args.capture) as cm:
        listener = await cm.listen(args.addr or "0.0.0.0", args.port, settings=settings_from(args))
        debug("rdma_bind_addr successful")
        debug(f"rping: listening on port {listener.port}")
        if getattr(args, "persistent", False):
            async with trio.open_nursery() as nursery:
                while True:
                    request = await listener.get_request()
                    nursery.start_soon(_serve_client, rnic, request, args, debug)
        with trio.move_on_after(args.timeout) as scope:
            request = await listener.get_request()
        if scope.cancelled_caught:
            print(f"rping: no client connected within {args.timeout:g} s", file=sys.stderr)
            return 1
        return await _serve_client(rnic, request, args, debug)
    return 1  # pragma: no cover - the persistent loop only ends by cancellation


async def _serve_client(
    rnic: Rnic, request: ConnectRequest, args: argparse.Namespace, debug: Debug
) -> int:
    """One client, rping's ``rping_test_server`` loop; its exit status."""
    debug(f"cma_event type RDMA_CM_EVENT_CONNECT_REQUEST from {request.remote[0]}")
    ep = Endpoint(args.size, rnic)
    try:
        return await _serve_endpoint(ep, request, args, debug)
    finally:
        ep.close()


async def _serve_endpoint(
    ep: Endpoint, request: ConnectRequest, args: argparse.Namespace, debug: Debug
) -> int:
    try:
        conn = await request.accept(ep.qp, args.private_data.encode())
    except IwarpError as exc:
        print(f"rping: accept error: {exc}", file=sys.stderr)
        return 1
    debug("cma_event type RDMA_CM_EVENT_ESTABLISHED (child)")
    debug.negotiated(conn)
    status = 0
    try:
        await _server_loop(ep, conn, args, debug)
    except* Disconnected:
        debug("cma_event type RDMA_CM_EVENT_DISCONNECTED (child)")  # the client is done
    except* (RpingError, trio.TooSlowError) as group:
        print(f"rping: {group.exceptions[0] or 'timed out'}", file=sys.stderr)
        status = 1
    finally:
        await conn.disconnect()
    debug.terminates(conn)
    if status == 0 and conn.error is not None:
        # the peer's Terminate, or the connection reset or broken mid-transfer
        print(f"rping: {conn.error or type(conn.error).__name__}", file=sys.stderr)
        status = 1
    return status


async def _server_loop(
    ep: Endpoint, conn: RdmaConnection, args: argparse.Namespace, debug: Debug
) -> None:
    async with trio.open_nursery() as nursery:

        async def watch() -> None:
            await conn.wait_closed()
            nursery.cancel_scope.cancel()

        nursery.start_soon(watch)
        while True:
            addr, rkey, length = await ep.receive_info()
            debug(f"Received rkey {rkey:x} addr {addr:x} len {length} from peer")
            debug("server received sink adv")
            if length > ep.size:
                raise RpingError(f"client buffer of {length} bytes exceeds -S {ep.size}")
            ep.qp.post_send(
                SendWR(3, WrOpcode.RDMA_READ, (Sge(ep.rdma_mr.addr, length, ep.rdma_mr.lkey),),
                       rkey=rkey, remote_addr=addr)
            )  # fmt: skip
            debug("server posted rdma read req")
            with trio.fail_after(args.timeout):
                await ep.expect(WcOpcode.RDMA_READ)
            debug("server received read complete")
            data = bytes(ep.rdma_mr.buf[:length]).split(b"\0", 1)[0]
            if args.verbose:
                print(f"server ping data: {data.decode(errors='replace')}", flush=True)
            ep.send_info(None)
            debug("server posted go ahead")
            with trio.fail_after(args.timeout):
                addr, rkey, length = await ep.receive_info()
            debug(f"Received rkey {rkey:x} addr {addr:x} len {length} from peer")
            debug("server received sink adv")
            size = min(len(data) + 1, length)
            ep.qp.post_send(
                SendWR(4, WrOpcode.RDMA_WRITE, (Sge(ep.rdma_mr.addr, size, ep.rdma_mr.lkey),),
                       rkey=rkey, remote_addr=addr)
            )  # fmt: skip
            debug(f"rdma write from lkey {ep.rdma_mr.lkey:x} laddr {ep.rdma_mr.addr:x} len {size}")
            with trio.fail_after(args.timeout):
                await ep.expect(WcOpcode.RDMA_WRITE)
            debug("server rdma write complete")
            ep.send_info(None)
            debug("server posted go ahead")


async def run_client(args: argparse.Namespace) -> int:
    debug = Debug(args.debug)
    ep = Endpoint(args.size)
    async with capturing_manager(ep.rnic, args.capture) as cm:
        try:
            with trio.fail_after(args.timeout):
                conn = await cm.connect(
                    args.addr, args.port, ep.qp, private_data=args.private_data.encode(),
                    settings=settings_from(args), first_fpdu_delay=args.first_fpdu_delay,
                    local_address=getattr(args, "source", None),
                )  # fmt: skip
        except trio.TooSlowError:
            print(f"rping: connect error: no answer within {args.timeout:g} s", file=sys.stderr)
            return 1
        except (ConnectFailed, ConnectRejected) as exc:
            print(f"rping: connect error: {exc}", file=sys.stderr)
            return 1
        debug("rdma_connect successful")
        debug.negotiated(conn)
        status = await _client_loop(ep, args, debug)
        await conn.disconnect()
        debug.terminates(conn)
        return status


async def _client_loop(ep: Endpoint, args: argparse.Namespace, debug: Debug) -> int:
    failures = 0
    try:
        ping = 0
        while not args.count or ping < args.count:
            pattern = ping_pattern(ping, ep.size)
            ep.start_mr.buf[:] = pattern
            ep.send_info(ep.start_mr)
            debug(f"RDMA addr {ep.start_mr.addr:x} rkey {ep.start_mr.rkey:x} len {ep.size}")
            with trio.fail_after(args.timeout):
                await ep.expect(WcOpcode.RECV)
                debug("recv completion")
                ep.rdma_mr.buf[:] = bytes(ep.size)
                ep.send_info(ep.rdma_mr)
                debug(f"RDMA addr {ep.rdma_mr.addr:x} rkey {ep.rdma_mr.rkey:x} len {ep.size}")
                await ep.expect(WcOpcode.RECV)
                debug("recv completion")
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
    return 1 if failures else 0


def _port(text: str) -> int:
    """argparse type: a TCP port to listen on or connect to, 1 to 65535."""
    value = port_number(text)
    if value == 0:
        raise argparse.ArgumentTypeError("port must be 1 to 65535, got 0")
    return value


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid integer {text!r}") from None


def _count(text: str) -> int:
    """``-C``: 0 (for ever) to :data:`MAX_COUNT`."""
    value = _int(text)
    if not 0 <= value <= MAX_COUNT:
        raise argparse.ArgumentTypeError(f"must be 0 to {MAX_COUNT}, got {text}")
    return value


def _private_data(text: str) -> str:
    if len(text.encode()) > MPA_MAX_PRIVATE_DATA:
        raise argparse.ArgumentTypeError(
            f"at most {MPA_MAX_PRIVATE_DATA} bytes of private data (MPA-05), got {len(text)}"
        )
    return text


def run(args: argparse.Namespace) -> int:
    problem = _check(args) or check_output("-w", args.capture)
    if problem:
        print(f"{args.parser.prog}: error: {problem}", file=sys.stderr)
        return 2
    try:
        return trio_run(run_server if args.server else run_client, args)
    except OSError as exc:  # cannot listen, bind -I, or write -w FILE
        print(f"rping: {exc}", file=sys.stderr)
        return 1


def _check(args: argparse.Namespace) -> str:
    """What is wrong with the combination of options ('' when nothing)."""
    if args.server == args.client:
        return "exactly one of -s (server) or -c (client) is required"
    if args.client and not args.addr:
        return "-c needs -a ADDRESS of the server"
    if args.persistent and not args.server:
        return "-P (persistent server) applies to -s"
    if args.source and not args.client:
        return "-I (source address) applies to -c"
    if not MIN_SIZE <= args.size <= MAX_SIZE:
        return f"-S size must be in {MIN_SIZE}..{MAX_SIZE}, got {args.size}"
    return ""


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "rping", help="rping-compatible RDMA ping (client or server)",
        description="rping-compatible ping: Send, RDMA Read, RDMA Write (rdma-core protocol).",
    )  # fmt: skip
    p.add_argument("-s", dest="server", action="store_true", help="server")
    p.add_argument("-c", dest="client", action="store_true", help="client")
    p.add_argument(
        "-a", dest="addr", type=address,
        help="address (server: bind, default all; client: server)",
    )  # fmt: skip
    p.add_argument(
        "-I", dest="source", type=address, metavar="ADDR",
        help="client: source address to bind to",
    )  # fmt: skip
    p.add_argument(
        "-P", dest="persistent", action="store_true",
        help="persistent server: serve clients, concurrently, until interrupted",
    )  # fmt: skip
    p.add_argument(
        "-p", dest="port", type=_port, default=DEFAULT_PORT, help=f"port (default {DEFAULT_PORT})"
    )
    p.add_argument(
        "-C", dest="count", type=_count, default=0,
        help=f"ping count (default 0: forever, until interrupted; at most {MAX_COUNT}, "
        "rping's int)",
    )  # fmt: skip
    p.add_argument(
        "-S", dest="size", type=_int, default=DEFAULT_SIZE,
        help=f"ping data size, {MIN_SIZE} to {MAX_SIZE} (default {DEFAULT_SIZE})",
    )  # fmt: skip
    p.add_argument("-v", dest="verbose", action="store_true", help="display ping data")
    p.add_argument("-V", dest="validate", action="store_true", help="validate ping data")
    p.add_argument("-d", dest="debug", action="store_true",
                   help="debug output, the negotiated MPA and Terminates (stderr)")  # fmt: skip
    p.add_argument("-w", dest="capture", metavar="FILE", help=CAPTURE_HELP)
    p.add_argument(
        "--mpa-rev", type=int, choices=(1, 2), default=2, help="MPA revision (default 2)"
    )
    p.add_argument("--crc", action=argparse.BooleanOptionalAction, default=True,
                   help="request MPA CRC (default on, RFC 5044)")  # fmt: skip
    p.add_argument("--markers", action="store_true", help="ask for MPA markers")
    p.add_argument(
        "--emss",
        type=emss,
        help="EMSS for MULPDU, at least 64 and at most 65535 (default: the socket's MSS; 1448 "
        "for Ethernet)",
    )
    p.add_argument("--p2p", choices=("send", "write", "read"), help="peer-to-peer with this RTR")
    p.add_argument("--private-data", type=_private_data, default="",
                   help="MPA private data to send (default none)")  # fmt: skip
    p.add_argument(
        "--first-fpdu-delay", type=seconds, default=0.2, metavar="S",
        help="client: wait S seconds after the MPA Reply before the first FPDU (avoids Linux "
        "siw's passive-side race, 0 to disable; default 0.2)",
    )  # fmt: skip
    p.add_argument("--timeout", type=positive_seconds, default=30.0, metavar="S",
                   help="seconds per step, and for a server (without -P) to wait for its "
                   "client (default 30)")  # fmt: skip
    one_line_errors(p)
    p.set_defaults(func=run, parser=p)
