"""Benchmark: the pure-Python floor of RDMA Writes (and Reads), against raw trio TCP in one run.

``iwarp bench floor [-s 64K,1M] [-D 3] [--repeat 3] [--emss 65483] [--batch N]
[--raw-sizes [LIST]] [--read-size N] [--exchange stream|read|rtt] [--json FILE]``
(also ``python -m stack.bench.floor``)

How fast can any pure-Python iWARP sender and receiver be?  Whatever the layering, an RDMA
Write with CRC on has to compute CRC32c over every FPDU at both ends and copy the payload
from the receive buffer into the target memory; raw TCP (the ``--baseline`` of
``iwarp bench``) does neither.  This command runs, two processes on loopback, each variant in
turn, alternated ``--repeat`` times:

``raw``    the message bytes, up to 1 MiB (or ``--batch`` messages) per ``send`` call;
           the receiver ``recv_into`` a preallocated buffer of RAW_RECEIVE_SIZE (128 KiB)
           and counts (``iwarp bench --baseline``'s exchange; both ends make the stack's
           driver's socket calls, :mod:`stack.bench.raw_socket`)
``raw@N``  ``raw`` reading N octets per call, for each N of ``--raw-sizes`` (the sweep
           that chose RAW_RECEIVE_SIZE: is ``raw`` still the fastest raw receiver here?)
``raw-some``  ``raw`` with the receiver reading through a trio stream,
           ``receive_some(--read-size)`` (a checkpoint on each side of every read and a
           new object per read: is the driver's way still the faster?)
``crc``    FPDUs of MULPDU octets (length field, a 14-octet tagged DDP header whose TO
           is written per FPDU, payload, CRC32c) sent by scatter-gather ``sendmsg``
           (header, a view of the source buffer, CRC; a payload under 2 KiB copied
           instead, ``stack.bench.floor_wire.TaggedFramer``), as many messages
           per call as ``raw``, as the stack's driver does; the receiver ``recv_into`` a
           1 MiB buffer (at most ``--read-size`` octets per call) and
           checks every FPDU's CRC where it lies (a partial FPDU at the end of a read
           moves to the front), and copies nothing
``floor``  ``crc`` with the placement copy: each FPDU's payload copied to the target
           buffer at its TO
``markers``  ``floor`` with an MPA marker every 512 octets (MPA-07): FPDUs laid out on
           the marker grid (a leading marker, then 508 octets between markers, the
           PAD and CRC in the last run; the payloads of ``floor``), made the
           cheapest way a pure-Python sender can: the length field, header and payload
           copied into a staging buffer and one ``join`` of its fixed 508-octet views
           with the marker as separator, the CRC over the result; the receiver checks
           the CRC where the FPDU lies, copies it into a word array, deletes the marker
           words with one strided ``del`` (MPA-10) and places the payload (the marker
           words are zero: the FPDUPTRs the stack writes and checks, one strided write
           and one compare per FPDU, are left out).  Its ratio to ``floor`` bounds
           what markers can cost at the least in pure Python

Nothing else: no DDP/RDMAP parsing beyond the length field and TO, no queue, no
completion.  So ``floor``'s ratio to ``raw`` is a ceiling for ``iwarp bench write
--baseline``'s ratio in pure Python on this machine, and the stack's ratio over it says how
much of the reachable speed the stack has (``raw-some`` says whether ``raw`` is the
fastest way to receive).  Each row: MB/s, messages/s, ratio to ``raw``
of the same repeat (median over repeats), CPU per message at each end (µs).  ``--json``:
the rows as one JSON document (``-``: standard output).  Speed is reported, never asserted.

``--read-size`` (default RAW_RECEIVE_SIZE, 128 KiB, what ``raw`` reads per call) caps each
``recv_into`` of ``crc`` and ``floor`` (their 1 MiB buffer) and ``raw-some``'s reads.
Measured on loopback (2 cores, 1 MiB messages, 2026-12-03, when ``raw`` read with
``receive_some`` and sent with ``send_all``): with 1 MiB per call a ``recv_into`` receiver
reached 0.55-0.65 of ``raw``, ``crc`` 0.48-0.53
and ``floor`` 0.46-0.55; with 128 KiB per call 0.86-0.92, 0.82-0.92 and 0.60-0.68.  The
bigger read does not cost the receiver more CPU but the *sender* (its ``sendmsg``, which on
loopback also runs the receiving half of TCP: 191 against 127 µs of system time per MiB
for ``floor`` against ``crc``), so what a receiver does between its reads sets the floor.
``--read-size 1M`` measures the old floor again.

``--batch N``: N messages per send for every variant (at most what fits in 1 MiB), each
its own FPDUs.  ``iwarp bench write --baseline``'s raw stream sends up to the tx depth of
messages per ``send_all`` (128 unless ``-t``; ``-l`` does not change it): ``-s 64 --batch
128`` is the raw baseline of ``iwarp bench write -s 64 -l 16 -Q 16``, ``--batch 16`` one
post list per send.
``--exchange read|rtt``: the floor of an RDMA Read (pipelined, MB/s) or of one Read's round
trip (µs) against the raw request/response of ``iwarp bench read --baseline``: Read
Request FPDUs with CRC, checked, answered as tagged FPDUs whose CRCs the requester checks
and whose payloads it places (``stack.bench.floor_exchange``; default sizes 64K,1M and 64).
"""

from __future__ import annotations

import argparse
import socket
import struct
import sys
import time
from array import array
from typing import Any, TextIO

import trio

from stack.bench import floor_exchange
from stack.bench.blocking import batch_messages
from stack.bench.floor_wire import (
    CRC,
    HEAD,
    HELLO,
    RECEIVE,
    RESULT,
    TARGET_STAG,
    TaggedFramer,
    connect,
    fpdu_payload,
    fpdu_wire,
    keep_partial,
    median_row,
    place,
    recv,
    result,
    send_all,
    sink_process,
)
from stack.bench.options import MAX_DEPTH, MAX_SIZE, BenchError
from stack.bench.process import cpu_list, pin_to
from stack.bench.protocol import receive_exactly
from stack.bench.raw_socket import count_received, send_plain, socket_of
from stack.cli import (
    ERROR_PROG,
    MAX_DURATION,
    MAX_EMSS,
    MAX_REPEAT,
    MIN_EMSS,
    CliError,
    binary_size,
    call,
    counted,
    duration,
    one_line_errors,
    repeat_count,
    size_label,
)
from stack.cli import emss as emss_type
from stack.cli.json_report import add_json_argument, check_outputs, schema, write_json
from stack.constants import (
    DDP_LAST,
    DDP_TAGGED,
    DDP_TAGGED_HDR_LEN,
    DDP_VERSION,
    MPA_CRC_RESIDUE,
    MPA_MARKER_INTERVAL,
    MPA_MARKER_LEN,
    RAW_RECEIVE_SIZE,
    Opcode,
)
from stack.crc import crc32c
from stack.transport.sendq import SendQueue
from stack.wire.markers import MARKER_DATA
from stack.wire.rdmap import rdmap_ctrl

__all__ = [
    "EXCHANGES",
    "HELP",
    "MIN_SIZE",
    "VARIANTS",
    "add_arguments",
    "format_table",
    "main",
    "measure",
    "run",
]

VARIANTS = ("raw", "raw-some", "crc", "floor", "markers")
MARKED = 4  # the index of "markers" in VARIANTS
EXCHANGES = ("stream", *floor_exchange.EXCHANGES)
_U16 = struct.Struct("!H")


MIN_SIZE = 64
"""Smallest message size ``-s`` takes (a tagged FPDU's header and CRC alone are 20 octets)."""
RAW_SIZES = "64K,256K,1M"
"""The receive sizes of ``--raw-sizes`` given without a list."""


def _sizes(text: str, minimum: int, maximum: int) -> list[int]:
    """``64K,1M`` -> octets (K/M/G suffixes), at least one, each ``minimum`` to ``maximum``."""
    sizes = [binary_size(word, maximum) for word in text.split(",") if word.strip()]
    if not sizes:
        raise argparse.ArgumentTypeError(f"no size in {text!r}")
    if min(sizes) < minimum:
        raise argparse.ArgumentTypeError(f"size must be {minimum} to {maximum}, got {text!r}")
    return sizes


def _message_sizes(text: str) -> list[int]:
    """argparse type of ``-s``: message sizes of :data:`MIN_SIZE` octets to 1 GiB."""
    return _sizes(text, MIN_SIZE, MAX_SIZE)


def _receive_sizes(text: str) -> list[int]:
    """argparse type of ``--raw-sizes``: receive sizes of 1 octet to 1 GiB."""
    return _sizes(text, 1, MAX_SIZE)


def _read_size(text: str) -> int:
    """argparse type of ``--read-size``: 1 octet to the receive buffer (RECEIVE, 1 MiB)."""
    return binary_size(text, RECEIVE)


# ---------------------------------------------------------------------------- receiver
async def _sink(port_out: Any) -> None:
    """Serve one client at a time for ever; a client that goes early ends its connection
    only (a CRC mismatch or another fault of the exchange is one line on stderr)."""
    listener = (await trio.open_tcp_listeners(0, host="127.0.0.1"))[0]
    print(listener.socket.getsockname()[1], file=port_out, flush=True)
    while True:
        stream = await listener.accept()
        try:
            await _serve(stream)
        except (BenchError, OSError, trio.BrokenResourceError, trio.ClosedResourceError):
            pass  # the client went (or never said what to measure)
        except (RuntimeError, ValueError) as exc:
            print(f"python -m stack.bench.floor --sink: {exc}", file=sys.stderr, flush=True)
        finally:
            await trio.aclose_forcefully(stream)


async def _serve(stream: trio.SocketStream) -> None:
    """One client: its hello says what it measures; once it half-closes, :data:`RESULT`."""
    variant, size, payload, raw_receive = HELLO.unpack(await receive_exactly(stream, HELLO.size))
    cpu = time.process_time_ns()
    if variant >= len(VARIANTS):
        got = await floor_exchange.respond(stream, variant, size, payload, raw_receive)
    elif variant == 1:  # raw-some: a trio stream's receive_some
        got = 0
        while data := await stream.receive_some(raw_receive):
            got += len(data)
    else:
        with socket_of(stream) as raw:
            if variant == 0:  # the bench's raw sink
                got = await count_received(raw, raw_receive)
            elif variant == MARKED:
                got = await _receive_marked(raw, size, payload, raw_receive)
            else:
                got = await _receive_fpdus(raw, size, payload, raw_receive, copy=variant == 3)
    cpu = time.process_time_ns() - cpu
    await stream.send_all(RESULT.pack(got, cpu))


async def _receive_fpdus(
    sock: socket.socket, size: int, payload: int, read: int, *, copy: bool
) -> int:
    """Receive FPDUs into a RECEIVE-byte buffer, at most ``read`` octets per ``recv_into``;
    check each CRC in place, place the payload when ``copy``
    (:func:`~stack.bench.floor_wire.place`)."""
    view = memoryview(bytearray(RECEIVE))
    target = memoryview(bytearray(size)) if copy else None
    frame = fpdu_wire(DDP_TAGGED_HDR_LEN + payload)  # the longest FPDU on the wire
    got = start = end = 0
    while n := await recv(sock, view[end : end + read]):
        got += n
        end += n
        pos, _ = place(view, start, end, target)
        start, end = keep_partial(view, pos, end, frame)
        await trio.lowlevel.checkpoint()
    return got


def _marked_wire(length: int) -> int:
    """Wire octets of an FPDU of ULPDU ``length`` on the marker grid (``markers``): a
    marker, then 508-octet runs between markers, the last ending with the PAD and CRC."""
    body = fpdu_wire(length)
    return body + MPA_MARKER_LEN * -(-body // MARKER_DATA)


async def _receive_marked(sock: socket.socket, size: int, payload: int, read: int) -> int:
    """Receive FPDUs laid out on the marker grid (``markers``): check each CRC in place,
    delete the marker words from a word-array copy, place the payload."""
    buf = bytearray(RECEIVE)
    view = memoryview(buf)
    target = memoryview(bytearray(size))
    frame = _marked_wire(DDP_TAGGED_HDR_LEN + payload)  # the longest FPDU on the wire
    got = start = end = 0
    length_at = _U16.unpack_from
    unpack = HEAD.unpack_from
    words_per_interval = MPA_MARKER_INTERVAL // 4
    while n := await recv(sock, view[end : end + read]):
        got += n
        end += n
        pos = start
        while end - pos >= MPA_MARKER_LEN + 2:
            wire = _marked_wire(length_at(buf, pos + MPA_MARKER_LEN)[0])
            if end - pos < wire:
                break
            fpdu = view[pos : pos + wire]
            if crc32c(fpdu) != MPA_CRC_RESIDUE:
                raise RuntimeError("CRC mismatch")
            words = array("I")
            words.frombytes(fpdu)
            del words[::words_per_interval]
            body = memoryview(words).cast("B")
            length, _ctrl, _rdmap, _stag, to = unpack(body)
            data = length - DDP_TAGGED_HDR_LEN
            target[to : to + data] = body[HEAD.size : HEAD.size + data]
            pos += wire
        start, end = keep_partial(view, pos, end, frame)
        await trio.lowlevel.checkpoint()
    return got


class _MarkedFramer:
    """FPDUs on the marker grid (``markers``), the cheapest pure-Python way: the length
    field, header and payload staged, one ``join`` of the stage's fixed 508-octet views
    with the marker as separator, then the CRC over the result."""

    def __init__(self, payload: int) -> None:
        self.stage = bytearray(_marked_wire(DDP_TAGGED_HDR_LEN + payload))
        self.staged = memoryview(self.stage)
        step = range(0, len(self.stage) - MARKER_DATA + 1, MARKER_DATA)
        self.runs = [self.staged[k : k + MARKER_DATA] for k in step]
        self.marker = bytearray(MPA_MARKER_LEN)  # so join makes a bytearray
        self.rdmap = rdmap_ctrl(Opcode.RDMA_WRITE)

    def frame(self, to: int, body: memoryview, last: bool = True) -> bytearray:
        length = DDP_TAGGED_HDR_LEN + len(body)
        end = HEAD.size + len(body)
        padded = (end + 3) // 4 * 4
        stage, staged = self.stage, self.staged
        ctrl = DDP_TAGGED | DDP_VERSION | (DDP_LAST if last else 0)
        HEAD.pack_into(stage, 0, length, ctrl, self.rdmap, TARGET_STAG, to)
        staged[HEAD.size : end] = body
        staged[end : padded + 4] = bytes(padded + 4 - end)  # PAD and the CRC slot
        full = (padded + 4) // MARKER_DATA
        pieces: list[Any] = [b"", *self.runs[:full]]
        if (padded + 4) % MARKER_DATA:
            pieces.append(staged[full * MARKER_DATA : padded + 4])
        fpdu = self.marker.join(pieces)
        CRC.pack_into(fpdu, len(fpdu) - 4, crc32c(memoryview(fpdu)[:-4]))
        return fpdu


# ------------------------------------------------------------------------------ sender
async def _run(
    port: int, variant: int, size: int, payload: int, seconds: float, raw_receive: int, batch: int
) -> dict[str, Any]:
    """One run of one variant, ``batch`` messages per send; MB/s, messages/s, CPU each end."""
    stream = await connect(port, variant, size, payload, raw_receive)
    source = memoryview(bytearray(b"\x5a" * size))
    fpdus = range(0, size, payload)
    clock = time.perf_counter
    cpu = time.process_time_ns()
    start = clock()
    deadline = start + seconds
    sent = 0
    if variant <= 1:  # the bench's raw stream (stack.bench.baseline)
        chunk = bytes(source) * batch  # real memory, as the other variants send from
        with socket_of(stream) as sock:
            while clock() < deadline:
                await send_plain(sock, chunk)
                sent += batch
    else:
        with socket_of(stream) as sock:
            queue = SendQueue(sock.sendmsg)
            if variant == MARKED:
                marked = _MarkedFramer(payload)
                while clock() < deadline:
                    pieces = [
                        marked.frame(to, source[to : to + payload], to + payload >= size)
                        for _ in range(batch)
                        for to in fpdus
                    ]
                    sent += batch
                    await send_all(queue, sock, pieces)
            else:
                framer = TaggedFramer(source, payload, Opcode.RDMA_WRITE)
                messages = [(0, size, TARGET_STAG, 0)] * batch
                while clock() < deadline:
                    pieces = framer.frame(messages)
                    sent += batch
                    await send_all(queue, sock, pieces)
    elapsed = clock() - start
    cpu = time.process_time_ns() - cpu
    got, sink_cpu = await result(stream)
    wire = sent * size if variant <= 1 else queue.sent
    if got != wire:
        raise RuntimeError(f"the receiver counted {got} octets, {wire} were sent")
    return {
        "MBps": sent * size / elapsed / 1e6,
        "msgps": sent / elapsed,
        "cpu_send_us": cpu / sent / 1e3,
        "cpu_recv_us": sink_cpu / sent / 1e3,
    }


# --------------------------------------------------------------------------------- main
def measure(
    sizes: list[int],
    seconds: float,
    repeat: int,
    emss: int,
    raw_sizes: list[int] | None = None,
    read_size: int = RAW_RECEIVE_SIZE,
    *,
    batch: int | None = None,
    progress: TextIO | None = sys.stderr,
    sink_cpu: int | None = None,
) -> list[dict[str, Any]]:
    """Each variant at each size, alternated ``repeat`` times; medians per row.  ``raw_sizes``:
    a ``raw@N`` row per receive size N besides ``raw`` (ratios are to ``raw``); ``read_size``:
    octets per ``recv_into`` of the other receivers (``raw`` reads RAW_RECEIVE_SIZE);
    ``batch``: messages per send (None: as many as fit in 1 MiB; at most that many);
    ``progress``: where a line per run goes (None: nowhere).  The receiver is a process of
    its own, ``python -m stack.bench.floor --sink`` (on ``sink_cpu`` only, if given)."""
    plan = [(v, i, read_size if i else RAW_RECEIVE_SIZE) for i, v in enumerate(VARIANTS)]
    plan[1:1] = [(f"raw@{size_label(n)}", 0, n) for n in raw_sizes or ()]
    payload = fpdu_payload(emss)
    rows = []
    with sink_process(sink_cpu) as port:
        for size in sizes:
            per_send = batch_messages(size, batch or MAX_SIZE)
            runs: dict[str, list[dict[str, Any]]] = {v: [] for v, _, _ in plan}
            for _ in range(repeat):
                for variant, index, receive in plan:
                    one = trio.run(_run, port, index, size, payload, seconds, receive, per_send)
                    runs[variant].append(one)
                    if progress is not None:
                        print(f"  {size} {variant}: {one['MBps']:.0f} MB/s", file=progress)
            rows += [median_row(size, v, runs[v], runs["raw"], "MBps") for v, _, _ in plan]
    return rows


def format_table(rows: list[dict[str, Any]]) -> str:
    """The rows of :func:`measure` as the command prints them."""
    lines = [
        f"{'size':>8} {'variant':8} {'MB/s':>8} {'msg/s':>9} {'ratio':>6} "
        f"{'CPU send/recv [us/msg]':>24}"
    ]
    lines += [
        f"{r['size']:>8} {r['variant']:8} {r['MBps']:8.0f} {r['msgps']:9.0f} "
        f"{r['ratio']:6.2f} {r['cpu_send_us']:11.1f}/{r['cpu_recv_us']:.1f}"
        for r in rows
    ]
    return "\n".join(lines)


HELP = "the pure-Python floor of RDMA Writes and Reads (CRC, placement, markers) against raw TCP"
"""The one line ``iwarp bench --help`` shows for ``floor``."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``iwarp bench floor``; their types refuse a bad value (one usage error,
    before anything runs)."""
    parser.add_argument(
        "-s",
        "--sizes",
        type=_message_sizes,
        metavar="LIST",
        help=f"message sizes, comma-separated, K/M suffixes, {MIN_SIZE} octets to 1G each "
        "(default 64K,1M; --exchange rtt: 64)",
    )
    parser.add_argument(
        "-D",
        "--duration",
        type=duration,
        default=3.0,
        metavar="SECONDS",
        help=f"seconds per run (default 3, at most {MAX_DURATION:g})",
    )
    parser.add_argument(
        "--repeat",
        type=repeat_count,
        default=3,
        metavar="N",
        help=f"alternated runs per row, the median reported (default 3, at most {MAX_REPEAT})",
    )
    parser.add_argument(
        "--emss",
        type=emss_type,
        default=65483,
        help=f"EMSS the MULPDU derives from, at least {MIN_EMSS} and at most {MAX_EMSS} "
        "(default 65483)",
    )
    parser.add_argument(
        "--batch",
        type=counted(MAX_DEPTH),
        metavar="N",
        help=f"messages per send of every variant, at most {MAX_DEPTH} and at most what "
        "fits in 1M, each message its own FPDUs (default: as many as fit in 1M)",
    )
    parser.add_argument(
        "--raw-sizes",
        type=_receive_sizes,
        nargs="?",
        const=RAW_SIZES,
        metavar="LIST",
        help="also run raw with each of these receive sizes, a raw@N row each "
        f"(1 octet to 1G; the option alone: {RAW_SIZES})",
    )
    parser.add_argument(
        "--read-size",
        type=_read_size,
        metavar="N",
        help="octets per recv_into of the receivers but raw, at most "
        f"{size_label(RECEIVE)}, the receive buffer "
        f"(default {size_label(RAW_RECEIVE_SIZE)}, as raw reads; --exchange read: the "
        "faster of the sizes raw tries)",
    )
    parser.add_argument(
        "--exchange",
        choices=EXCHANGES,
        default="stream",
        help="stream: RDMA Writes; read: pipelined RDMA Reads; rtt: one Read's round trip "
        "(default stream)",
    )
    parser.add_argument(
        "--cpus",
        type=cpu_list,
        metavar="CLIENT[,SINK]",
        help="run the sender and requester on CPU CLIENT and the receiver and responder (its "
        "own process) on CPU SINK (one CPU: both there), as iwarp bench --cpus",
    )
    add_json_argument(parser)


def run(args: argparse.Namespace) -> int:
    """``iwarp bench floor``: measure, print the table (on stderr with ``--json -``), write
    the JSON; a failed run is one error line and status 1 (its JSON says so)."""
    check_outputs(("--json", args.json))
    for option, value in (("--batch", args.batch), ("--raw-sizes", args.raw_sizes)):
        if value is not None and args.exchange != "stream":
            raise CliError(f"{option}: only with --exchange stream, not {args.exchange}")
    prog = getattr(args, ERROR_PROG, "iwarp bench floor")
    stream = args.exchange == "stream"
    sizes = args.sizes or (
        [65536, 1 << 20] if stream else floor_exchange.DEFAULT_SIZES[args.exchange]
    )
    read_size = args.read_size or RAW_RECEIVE_SIZE
    rows: list[dict[str, Any]] = []
    status, error = 0, None
    common = (sizes, args.duration, args.repeat, args.emss)
    sink_cpu = None if args.cpus is None else args.cpus[-1]
    try:
        if args.cpus is not None:
            pin_to(args.cpus[0])
        if stream:
            rows = measure(*common, args.raw_sizes, read_size, batch=args.batch, sink_cpu=sink_cpu)
        else:
            reads = None if args.read_size is None else (args.read_size,)
            rows = floor_exchange.measure_exchange(args.exchange, *common, reads, sink_cpu=sink_cpu)
    except (BenchError, OSError, RuntimeError, trio.BrokenResourceError) as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        status, error = 1, str(exc)
    if rows:
        table = format_table(rows) if stream else floor_exchange.format_table(args.exchange, rows)
        print(table, file=sys.stderr if args.json == "-" else sys.stdout)
    if args.json:
        document: dict[str, Any] = {
            "schema": schema("iwarp bench floor"),
            "command": "iwarp bench floor",
        }
        if not stream:
            document["exchange"] = args.exchange
        document["emss"] = args.emss
        document["read_size"] = read_size if stream else args.read_size
        if args.batch is not None:
            document["batch"] = args.batch
        if args.cpus is not None:
            document["cpus"] = {"client": args.cpus[0], "sink": sink_cpu}
        document |= {"rows": rows, "exit_status": status}
        if error is not None:
            document["error"] = error
        write_json(args.json, document)
    return status


def main(argv: list[str] | None = None) -> int:
    """``python -m stack.bench.floor``: ``iwarp bench floor``; ``--sink`` runs the receiver
    that :func:`measure` starts, printing its port."""
    parser = argparse.ArgumentParser(
        prog="python -m stack.bench.floor",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_arguments(parser)
    parser.add_argument("--sink", action="store_true", help=argparse.SUPPRESS)
    parser.set_defaults(func=run)
    one_line_errors(parser)
    args = parser.parse_args(argv)
    if args.sink:
        if args.cpus is not None:
            pin_to(args.cpus[-1])
        trio.run(_sink, sys.stdout)
        return 0
    return call(args, parser.prog)


if __name__ == "__main__":
    sys.exit(main())
