"""Peers compatible with librdmacm's example programs, on the software RNIC.

* ``iwarp rdma-server`` / ``iwarp rdma-client``: ``rdma_server`` / ``rdma_client``. The
  client posts a 16-byte receive, connects, Sends 16 bytes; the server, having posted a
  16-byte receive before accepting, answers with a 16-byte Send; both disconnect.
* ``iwarp cmatose``: ``ucmatose`` (cmatose.c). ``-c`` connections, each side posts ``-C``
  receives of ``-S`` bytes before connecting/accepting, then Sends ``-C`` messages on each
  connection, waits for its send completions, then for its receives; the server disconnects.

Output lines follow the originals, so scripts that read them work with either.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Awaitable, Callable
from typing import Any

import trio

from stack.cli import (
    CliError,
    address,
    binary_size,
    bounded_int,
    non_negative_int,
    one_line_errors,
    port_number,
    positive_seconds,
    trio_run,
)
from stack.cli.capture import CAPTURE_HELP, capturing_manager
from stack.cli.json_report import check_outputs
from stack.rnic import Access, RecvWR, Rnic, SendWR, Sge, WcStatus, WrOpcode
from stack.rnic.qp import QpCap, QueuePair
from stack.transport.cm import ConnectFailed, ConnectRejected
from stack.transport.driver import RdmaConnection

RDMA_EXAMPLES_PORT = 7471
SIW_RACE_DELAY = 0.2
"""Seconds the client holds its first FPDU after the MPA Reply (Linux siw's passive race)."""
MESSAGE_LEN = 16
MAX_MESSAGE_SIZE = 1 << 24
"""Largest ``cmatose -S`` (each side allocates -C receive buffers of it)."""
CQ_DEPTH = 65536
MAX_MESSAGES = CQ_DEPTH // 2
"""Most ``cmatose`` messages, ``-c`` x ``-C``: each takes a send and a receive completion
in one side's CQ of :data:`CQ_DEPTH`."""
MAX_TRANSFER = 1 << 28
"""Most octets of ``cmatose`` messages, ``-c`` x ``-C`` x ``-S``: each side holds them twice
(receive buffers, send data)."""
MAX_CONNECTIONS = 512
"""Most ``cmatose -c`` connections, with or without messages (``-C 0``): each is a QP and a
descriptor at each end, well under the 1024 descriptors a process may open by default, and
the client makes them one after another, each holding its first FPDU for
:data:`SIW_RACE_DELAY` (512 take under two minutes)."""


class _Side:
    """One RNIC with a PD and a CQ, making QPs with message buffers."""

    def __init__(self, name: str) -> None:
        self.rnic = Rnic(name)
        self.pd = self.rnic.alloc_pd()
        self.cq = self.rnic.create_cq(CQ_DEPTH)

    def qp(self, depth: int) -> QueuePair:
        cap = QpCap(max_send_wr=max(depth, 16), max_recv_wr=max(depth, 16))
        return self.rnic.create_qp(self.pd, self.cq, cap=cap, ird=1, ord=1)

    def buffer(self, size: int) -> tuple[Any, Sge]:
        mr = self.pd.reg_mr(bytearray(size), Access.LOCAL_WRITE)
        return mr, Sge(mr.addr, size, mr.lkey)


async def _completions(side: _Side, count: int, what: str, timeout: float) -> None:
    with trio.fail_after(timeout):
        for _ in range(count):
            wc = await side.cq.next()
            if wc.status is not WcStatus.SUCCESS:
                raise ConnectFailed(f"{what}: completion failed: {wc.status.text}")


# --------------------------------------------------------------------- rdma_server / client
async def rdma_server(args: argparse.Namespace) -> int:
    print("rdma_server: start", flush=True)
    side = _Side("rdma_server")
    qp = side.qp(1)
    _mr, recv_sge = side.buffer(MESSAGE_LEN)
    async with capturing_manager(side.rnic, args.capture) as cm:
        host = args.bind or "0.0.0.0"
        try:
            listener = await cm.listen(host, args.port)
        except OSError as exc:  # a busy port, an address not ours, a name that does not resolve
            print(f"rdma_listen: {host}:{args.port}: {exc.strerror or exc}", file=sys.stderr)
            print("rdma_server: end -1", flush=True)
            return 1
        request = await listener.get_request()
        qp.post_recv(RecvWR(1, (recv_sge,)))
        conn = await request.accept(qp)
        try:
            await _completions(side, 1, "rdma_get_recv_comp", args.timeout)
            qp.post_send(SendWR(2, WrOpcode.SEND, inline_data=bytes(MESSAGE_LEN)))
            await _completions(side, 1, "rdma_get_send_comp", args.timeout)
        except (ConnectFailed, trio.TooSlowError) as exc:
            print(f"rdma_server: {str(exc) or 'timed out'}", file=sys.stderr)
            print("rdma_server: end -1", flush=True)
            return 1
        finally:
            await conn.disconnect()
    print("rdma_server: end 0", flush=True)
    return 0


async def rdma_client(args: argparse.Namespace) -> int:
    print("rdma_client: start", flush=True)
    side = _Side("rdma_client")
    qp = side.qp(1)
    _mr, recv_sge = side.buffer(MESSAGE_LEN)
    qp.post_recv(RecvWR(1, (recv_sge,)))
    async with capturing_manager(side.rnic, args.capture) as cm:
        try:
            conn = await cm.connect(args.server, args.port, qp, first_fpdu_delay=SIW_RACE_DELAY)
        except (ConnectFailed, ConnectRejected, OSError) as exc:
            print(f"rdma_connect: {exc}", file=sys.stderr)
            print("rdma_client: end -1", flush=True)
            return 1
        try:
            qp.post_send(SendWR(2, WrOpcode.SEND, inline_data=bytes(MESSAGE_LEN)))
            await _completions(side, 2, "completions", args.timeout)
        except (ConnectFailed, trio.TooSlowError) as exc:
            print(f"rdma_client: {str(exc) or 'timed out'}", file=sys.stderr)
            print("rdma_client: end -1", flush=True)
            return 1
        finally:
            await conn.disconnect()
    print("rdma_client: end 0", flush=True)
    return 0


# --------------------------------------------------------------------- cmatose
async def _transfer(side: _Side, qps: list[QueuePair], args: argparse.Namespace) -> None:
    print("initiating data transfers", flush=True)
    for qp in qps:
        qp.post_send(
            [SendWR(i, WrOpcode.SEND, inline_data=bytes(args.size)) for i in range(args.messages)]
        )
    print("completing sends", flush=True)
    # Sends and receives share the CQ here; count both kinds together.
    total = 2 * args.messages * len(qps)
    print("receiving data transfers", flush=True)
    await _completions(side, total, "data transfer", args.timeout)
    print("data transfers complete", flush=True)


def _post_recvs(side: _Side, qp: QueuePair, args: argparse.Namespace) -> None:
    _mr, sge = side.buffer(max(args.size, 1) * max(args.messages, 1))
    qp.post_recv(
        [
            RecvWR(i, (Sge(sge.addr + i * args.size, args.size, sge.lkey),))
            for i in range(args.messages)
        ]
    )


async def cmatose(args: argparse.Namespace) -> int:
    side = _Side("cmatose")
    status = 0
    try:
        if args.server is None:
            print("cmatose: starting server", flush=True)
            async with capturing_manager(side.rnic, args.capture) as cm:
                listener = await cm.listen(args.bind or "0.0.0.0", args.port)
                conns: list[RdmaConnection] = []
                qps = []
                for _ in range(args.connections):
                    request = await listener.get_request()
                    qp = side.qp(args.messages)
                    _post_recvs(side, qp, args)
                    conns.append(await request.accept(qp))
                    qps.append(qp)
                if args.messages:
                    await _transfer(side, qps, args)
                print("cmatose: disconnecting", flush=True)
                for conn in conns:
                    await conn.disconnect()
                print("disconnected", flush=True)
        else:
            print("cmatose: starting client", flush=True)
            async with capturing_manager(side.rnic, args.capture) as cm:
                print("cmatose: connecting", flush=True)
                conns = []
                qps = []
                for _ in range(args.connections):
                    qp = side.qp(args.messages)
                    _post_recvs(side, qp, args)
                    conns.append(
                        await cm.connect(
                            args.server, args.port, qp, first_fpdu_delay=SIW_RACE_DELAY
                        )
                    )
                    qps.append(qp)
                if args.messages:
                    await _transfer(side, qps, args)
                with trio.fail_after(args.timeout):
                    for conn in conns:
                        await conn.wait_closed()
    except* (ConnectFailed, ConnectRejected, OSError, trio.TooSlowError) as group:
        print(f"cmatose: {str(group.exceptions[0]) or 'timed out'}", file=sys.stderr)
        status = 1
    print(f"test complete\nreturn status {status}", flush=True)
    return status


def _message_size(text: str) -> int:
    """``cmatose -S``: 1 octet to :data:`MAX_MESSAGE_SIZE` (K/M suffixes allowed)."""
    return binary_size(text, MAX_MESSAGE_SIZE, unit=" octets")


def _message_count(text: str) -> int:
    """``cmatose -C``: 0 (connect only) to :data:`MAX_MESSAGES`."""
    value = non_negative_int(text)
    if value > MAX_MESSAGES:
        raise argparse.ArgumentTypeError(f"must be at most {MAX_MESSAGES}, got {text}")
    return value


def _connections(text: str) -> int:
    """``cmatose -c``: 1 to :data:`MAX_CONNECTIONS`."""
    return bounded_int(text, MAX_CONNECTIONS)


def _check(args: argparse.Namespace) -> None:
    """What argparse's types do not say: -p 0 (any port) is no address to meet at; cmatose's
    -c x -C messages must fit the CQ, and their octets :data:`MAX_TRANSFER`; the -w capture
    must be writable before the run (:func:`~stack.cli.json_report.check_outputs`)."""
    if args.port == 0:
        raise CliError("argument -p: port must be 1 to 65535, got 0")
    messages = getattr(args, "messages", 0) * getattr(args, "connections", 1)
    if messages > MAX_MESSAGES:
        raise CliError(f"argument -C: -c x -C must be at most {MAX_MESSAGES}, got {messages}")
    if messages * getattr(args, "size", 0) > MAX_TRANSFER:
        raise CliError(
            f"argument -S: -c x -C x -S must be at most {MAX_TRANSFER} octets, "
            f"got {messages * args.size}"
        )
    check_outputs(("-w", args.capture))


def _checked(
    main: Callable[[argparse.Namespace], Awaitable[int]],
) -> Callable[[argparse.Namespace], int]:
    """The subcommand's function: check the arguments, then run ``main`` under trio."""

    def run(args: argparse.Namespace) -> int:
        _check(args)
        return trio_run(main, args)

    return run


def register(subparsers: Any) -> None:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "-p",
        dest="port",
        type=port_number,
        default=RDMA_EXAMPLES_PORT,
        help=f"port (default {RDMA_EXAMPLES_PORT})",
    )
    common.add_argument(
        "--timeout", type=positive_seconds, default=30.0, help="seconds to wait (default 30)"
    )
    common.add_argument("-w", dest="capture", metavar="FILE", help=CAPTURE_HELP)

    p = subparsers.add_parser("rdma-server", parents=[common], help="librdmacm rdma_server peer")
    p.add_argument("-s", dest="bind", type=address, help="address to bind (default all)")
    p.set_defaults(func=_checked(rdma_server))
    one_line_errors(p)

    p = subparsers.add_parser("rdma-client", parents=[common], help="librdmacm rdma_client peer")
    p.add_argument("-s", dest="server", type=address, required=True, help="server address")
    p.set_defaults(func=_checked(rdma_client))
    one_line_errors(p)

    p = subparsers.add_parser("cmatose", parents=[common], help="librdmacm ucmatose peer")
    p.add_argument(
        "-s", dest="server", type=address, help="server address (client mode; omit for server)"
    )
    p.add_argument("-b", dest="bind", type=address, help="bind address (server; default all)")
    p.add_argument(
        "-c",
        dest="connections",
        type=_connections,
        default=1,
        help=f"connections (default 1, at most {MAX_CONNECTIONS})",
    )
    p.add_argument(
        "-C",
        dest="messages",
        type=_message_count,
        default=10,
        help=f"messages per connection (default 10; 0: connect only; -c x -C at most "
        f"{MAX_MESSAGES})",
    )
    p.add_argument(
        "-S",
        dest="size",
        type=_message_size,
        default=100,
        help=f"message size (default 100, at most {MAX_MESSAGE_SIZE}; -c x -C x -S at most "
        f"{MAX_TRANSFER})",
    )
    p.set_defaults(func=_checked(cmatose))
    one_line_errors(p)
