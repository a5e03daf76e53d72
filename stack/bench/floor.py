"""Benchmark: the pure-Python floor of a bulk RDMA Write, against raw trio TCP in one run.

``iwarp bench floor [-s 64K,1M] [-D 3] [--repeat 3] [--emss 65483] [--raw-sizes [LIST]]
[--read-size N] [--json FILE]`` (also ``python -m stack.bench.floor``)

How fast can any pure-Python iWARP sender and receiver be?  Whatever the layering, an RDMA
Write with CRC on has to compute CRC32c over every FPDU at both ends and copy the payload
from the receive buffer into the target memory; raw TCP (the ``--baseline`` of
``iwarp bench``) does neither.  This command runs, two processes on loopback, each variant in
turn, alternated ``--repeat`` times:

``raw``    a trio stream of the message bytes, up to 1 MiB per ``send_all``; the receiver
           ``receive_some(RAW_RECEIVE_SIZE)`` (128 KiB) and counts (``iwarp bench
           --baseline``'s exchange)
``raw@N``  ``raw`` with ``receive_some(N)``, for each N of ``--raw-sizes`` (the sweep that
           chose RAW_RECEIVE_SIZE: is ``raw`` still the fastest raw receiver here?)
``raw-into``  ``raw`` with the receiver reading by ``recv_into`` a preallocated buffer of
           ``--read-size`` octets (no new bytes object per read, as the stack's driver
           reads)
``crc``    FPDUs of MULPDU octets (length field, a 14-octet tagged DDP header whose TO
           is written per FPDU, payload, CRC32c) sent by scatter-gather ``sendmsg``
           (header, a view of the source buffer, CRC) up to 1 MiB per call, as the stack's
           driver does; the receiver ``recv_into`` a 1 MiB buffer (at most ``--read-size``
           octets per call, as ``raw-into``) and checks every
           FPDU's CRC where it lies (a partial FPDU at the end of a read moves to the
           front), and copies nothing
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
much of the reachable speed the stack has (``raw-into`` says whether ``raw`` is the
fastest way to receive).  Each row: MB/s, messages/s, ratio to ``raw``
of the same repeat (median over repeats), CPU per message at each end (µs).  ``--json``:
the rows as one JSON document (``-``: standard output).  Speed is reported, never asserted.

``--read-size`` (default RAW_RECEIVE_SIZE, 128 KiB, what ``raw`` reads per ``receive_some``)
caps each ``recv_into`` (the 1 MiB buffer of ``crc`` and ``floor``; ``raw-into``'s buffer is
that size).  Measured on loopback (2 cores, 1 MiB messages,
2026-12-03): with 1 MiB per call ``raw-into`` reached 0.55-0.65 of ``raw``, ``crc`` 0.48-0.53
and ``floor`` 0.46-0.55; with 128 KiB per call 0.86-0.92, 0.82-0.92 and 0.60-0.68.  The
bigger read does not cost the receiver more CPU but the *sender* (its ``sendmsg``, which on
loopback also runs the receiving half of TCP: 191 against 127 µs of system time per MiB
for ``floor`` against ``crc``), so what a receiver does between its reads sets the floor.
``--read-size 1M`` measures the old floor again.
"""

from __future__ import annotations

import argparse
import socket
import statistics
import struct
import subprocess
import sys
import time
from array import array
from typing import Any, TextIO

import trio

from stack.bench.options import MAX_SIZE, BenchError
from stack.bench.protocol import receive_exactly
from stack.cli import (
    ERROR_PROG,
    MAX_DURATION,
    MAX_EMSS,
    MAX_REPEAT,
    MIN_EMSS,
    binary_size,
    call,
    duration,
    one_line_errors,
    repeat_count,
    size_label,
)
from stack.cli import emss as emss_type
from stack.cli.json_report import add_json_argument, check_outputs, schema, write_json
from stack.constants import (
    DDP_TAGGED_HDR_LEN,
    MPA_CRC_RESIDUE,
    MPA_MARKER_INTERVAL,
    MPA_MARKER_LEN,
    RAW_RECEIVE_SIZE,
)
from stack.crc import crc32c
from stack.transport.driver import RECEIVE_MAX, _raw_socket
from stack.transport.sendq import SendQueue
from stack.transport.sockopts import limit_unsent
from stack.wire.framing import mulpdu_for
from stack.wire.markers import MARKER_DATA

__all__ = [
    "HELP",
    "MIN_SIZE",
    "VARIANTS",
    "add_arguments",
    "format_table",
    "main",
    "measure",
    "run",
]

RECEIVE = RECEIVE_MAX  # the driver's bulk receive buffer
BATCH = 1024 * 1024
VARIANTS = ("raw", "raw-into", "crc", "floor", "markers")
MARKED = 4  # the index of "markers" in VARIANTS
_HELLO = struct.Struct("!BIII")  # variant index, message size, FPDU payload, octets per read
_RESULT = struct.Struct("!QQ")  # octets received, receiver CPU ns
_HEAD = struct.Struct("!H2xIII")  # length, (control, STag, TO high), TO: 14 octets + 2
_CRC = struct.Struct("<I")
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


def _plain(stream: trio.SocketStream) -> socket.socket:
    """The stream's descriptor as a non-blocking standard socket, made as the stack's driver
    makes it (:func:`stack.transport.driver._raw_socket`; release it with ``detach``)."""
    sock = _raw_socket(stream)
    if sock is None:
        raise RuntimeError("not a TCP socket stream")
    return sock


# ---------------------------------------------------------------------------- receiver
async def _sink(port_out: Any) -> None:
    listener = (await trio.open_tcp_listeners(0, host="127.0.0.1"))[0]
    print(listener.socket.getsockname()[1], file=port_out, flush=True)
    while True:
        stream = await listener.accept()
        try:
            hello = await receive_exactly(stream, _HELLO.size)
        except BenchError:  # closed before saying what to measure
            await stream.aclose()
            continue
        variant, size, payload, raw_receive = _HELLO.unpack(hello)
        cpu = time.process_time_ns()
        if variant == 0:
            got = 0
            while data := await stream.receive_some(raw_receive):
                got += len(data)
        else:
            raw = _plain(stream)
            try:
                if variant == 1:
                    got = await _receive_into(raw, raw_receive)
                elif variant == MARKED:
                    got = await _receive_marked(raw, size, payload, raw_receive)
                else:
                    got = await _receive_fpdus(raw, size, payload, raw_receive, place=variant == 3)
            finally:
                raw.detach()
        cpu = time.process_time_ns() - cpu
        await stream.send_all(_RESULT.pack(got, cpu))
        await stream.aclose()


async def _recv(sock: socket.socket, room: memoryview) -> int:
    """``recv_into`` ``room``, waiting while the socket has nothing (0: end of stream)."""
    while True:
        try:
            return sock.recv_into(room)
        except BlockingIOError:
            await trio.lowlevel.wait_readable(sock)


async def _receive_into(sock: socket.socket, read: int) -> int:
    """Count what arrives, read with ``recv_into`` a preallocated buffer of ``read`` octets."""
    view = memoryview(bytearray(read))
    got = 0
    while n := await _recv(sock, view):
        got += n
        await trio.lowlevel.checkpoint()
    return got


async def _receive_fpdus(
    sock: socket.socket, size: int, payload: int, read: int, *, place: bool
) -> int:
    """Receive FPDUs into a RECEIVE-byte buffer, at most ``read`` octets per ``recv_into``;
    check each CRC in place, place the payload."""
    buf = bytearray(RECEIVE)
    view = memoryview(buf)
    target = memoryview(bytearray(size))
    frame = 2 + DDP_TAGGED_HDR_LEN + payload + 8  # the longest FPDU on the wire
    got = start = end = 0
    unpack = _HEAD.unpack_from
    while n := await _recv(sock, view[end : end + read]):
        got += n
        end += n
        pos = start
        while end - pos >= _HEAD.size:
            length, _stag, _high, to = unpack(buf, pos)
            wire = 2 + length + (-(2 + length) & 3) + 4
            if end - pos < wire:
                break
            if crc32c(view[pos : pos + wire]) != MPA_CRC_RESIDUE:
                raise RuntimeError("CRC mismatch")
            if place:
                data = length - DDP_TAGGED_HDR_LEN
                target[to : to + data] = view[pos + _HEAD.size : pos + _HEAD.size + data]
            pos += wire
        start, end = _keep_partial(view, pos, end, frame)
        await trio.lowlevel.checkpoint()
    return got


def _keep_partial(view: memoryview, start: int, end: int, frame: int) -> tuple[int, int]:
    """The receive buffer's new ``(start, end)`` once a read's whole FPDUs are done: empty,
    or a partial FPDU moved to the front when ``frame`` octets no longer fit behind it."""
    if start == end:
        return 0, 0
    if RECEIVE - end < frame:
        view[: end - start] = view[start:end]
        return 0, end - start
    return start, end


def _marked_wire(length: int) -> int:
    """Wire octets of an FPDU of ULPDU ``length`` on the marker grid (``markers``): a
    marker, then 508-octet runs between markers, the last ending with the PAD and CRC."""
    body = (2 + length + 3) // 4 * 4 + 4
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
    unpack = _HEAD.unpack_from
    words_per_interval = MPA_MARKER_INTERVAL // 4
    while n := await _recv(sock, view[end : end + read]):
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
            length, _stag, _high, to = unpack(body)
            data = length - DDP_TAGGED_HDR_LEN
            target[to : to + data] = body[_HEAD.size : _HEAD.size + data]
            pos += wire
        start, end = _keep_partial(view, pos, end, frame)
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

    def frame(self, to: int, body: memoryview) -> bytearray:
        length = DDP_TAGGED_HDR_LEN + len(body)
        end = _HEAD.size + len(body)
        padded = (end + 3) // 4 * 4
        stage, staged = self.stage, self.staged
        _HEAD.pack_into(stage, 0, length, 0, 0, to)
        staged[_HEAD.size : end] = body
        staged[end : padded + 4] = bytes(padded + 4 - end)  # PAD and the CRC slot
        full = (padded + 4) // MARKER_DATA
        pieces: list[Any] = [b"", *self.runs[:full]]
        if (padded + 4) % MARKER_DATA:
            pieces.append(staged[full * MARKER_DATA : padded + 4])
        fpdu = self.marker.join(pieces)
        _CRC.pack_into(fpdu, len(fpdu) - 4, crc32c(memoryview(fpdu)[:-4]))
        return fpdu


# ------------------------------------------------------------------------------ sender
async def _run(
    port: int, variant: int, size: int, payload: int, seconds: float, raw_receive: int
) -> dict[str, Any]:
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    stream.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    limit_unsent(stream)
    await stream.send_all(_HELLO.pack(variant, size, payload, raw_receive))
    per_batch = max(1, BATCH // size)
    source = memoryview(bytearray(b"\x5a" * size))
    marked = _MarkedFramer(payload) if variant == MARKED else None
    fpdus = range(0, size, payload)
    clock = time.perf_counter
    cpu = time.process_time_ns()
    start = clock()
    deadline = start + seconds
    sent = 0
    if variant <= 1:
        chunk = bytes(source) * per_batch  # real memory, as the other variants send from
        while clock() < deadline:
            await stream.send_all(chunk)
            sent += per_batch
    else:
        sock = _plain(stream)
        queue = SendQueue(sock.sendmsg)
        while clock() < deadline:
            pieces: list[Any] = []
            for _ in range(per_batch):
                if marked is not None:
                    pieces += [marked.frame(to, source[to : to + payload]) for to in fpdus]
                    continue
                for to in fpdus:
                    body = source[to : to + payload]
                    n = DDP_TAGGED_HDR_LEN + len(body)
                    head = _HEAD.pack(n, 0, 0, to)
                    pad = b"\0" * (-(2 + n) & 3)
                    c = crc32c(body, crc32c(head))
                    pieces += (head, body, pad + _CRC.pack(crc32c(pad, c) if pad else c))
            sent += per_batch
            await _send_all(queue, sock, pieces)
        sock.detach()
    elapsed = clock() - start
    cpu = time.process_time_ns() - cpu
    await stream.send_eof()
    result = await receive_exactly(stream, _RESULT.size)
    got, sink_cpu = _RESULT.unpack(result)
    await stream.aclose()
    if variant <= 1 and got != sent * size:
        raise RuntimeError(f"the receiver counted {got} octets, {sent * size} were sent")
    return {
        "MBps": sent * size / elapsed / 1e6,
        "msgps": sent / elapsed,
        "cpu_send_us": cpu / sent / 1e3,
        "cpu_recv_us": sink_cpu / sent / 1e3,
    }


async def _send_all(queue: SendQueue, sock: socket.socket, pieces: list[Any]) -> None:
    """Send the pieces through the driver's :class:`~stack.transport.sendq.SendQueue`
    (scatter-gather, IOV_MAX pieces per call, what the socket does not take copied), waiting
    while the socket is full."""
    if not queue.send(pieces):
        await trio.lowlevel.wait_writable(sock)
        while not queue.send_backlog():
            await trio.lowlevel.wait_writable(sock)


# --------------------------------------------------------------------------------- main
def measure(
    sizes: list[int],
    seconds: float,
    repeat: int,
    emss: int,
    raw_sizes: list[int] | None = None,
    read_size: int = RAW_RECEIVE_SIZE,
    *,
    progress: TextIO | None = sys.stderr,
) -> list[dict[str, Any]]:
    """Each variant at each size, alternated ``repeat`` times; medians per row.  ``raw_sizes``:
    a ``raw@N`` row per receive size N besides ``raw`` (ratios are to ``raw``); ``read_size``:
    octets per ``recv_into`` of the other receivers (``raw`` reads RAW_RECEIVE_SIZE);
    ``progress``: where a line per run goes (None: nowhere).  The receiver is a process of
    its own, ``python -m stack.bench.floor --sink``."""
    plan = [(v, i, read_size if i else RAW_RECEIVE_SIZE) for i, v in enumerate(VARIANTS)]
    plan[1:1] = [(f"raw@{size_label(n)}", 0, n) for n in raw_sizes or ()]
    payload = mulpdu_for(emss, False) - DDP_TAGGED_HDR_LEN
    payload -= payload % 4
    sink = subprocess.Popen(
        [sys.executable, "-m", "stack.bench.floor", "--sink"], stdout=subprocess.PIPE, text=True
    )
    try:
        assert sink.stdout is not None
        line = sink.stdout.readline()
        if not line.strip().isdigit():
            raise RuntimeError("the receiver (python -m stack.bench.floor --sink) did not start")
        port = int(line)
        rows = []
        for size in sizes:
            runs: dict[str, list[dict[str, Any]]] = {v: [] for v, _, _ in plan}
            for _ in range(repeat):
                for variant, index, receive in plan:
                    one = trio.run(_run, port, index, size, payload, seconds, receive)
                    runs[variant].append(one)
                    if progress is not None:
                        print(f"  {size} {variant}: {one['MBps']:.0f} MB/s", file=progress)
            for variant, _, _ in plan:
                ratios = [
                    r["MBps"] / raw["MBps"]
                    for r, raw in zip(runs[variant], runs["raw"], strict=True)
                ]
                row: dict[str, Any] = {"size": size, "variant": variant}
                for key in ("MBps", "msgps", "cpu_send_us", "cpu_recv_us"):
                    row[key] = statistics.median(r[key] for r in runs[variant])
                row["ratio"] = statistics.median(ratios)
                rows.append(row)
        return rows
    finally:
        sink.kill()
        sink.wait()


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


HELP = "the pure-Python floor of a bulk RDMA Write (CRC, placement, markers) against raw TCP"
"""The one line ``iwarp bench --help`` shows for ``floor``."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``iwarp bench floor``; their types refuse a bad value (one usage error,
    before anything runs)."""
    parser.add_argument(
        "-s",
        "--sizes",
        type=_message_sizes,
        default="64K,1M",
        metavar="LIST",
        help=f"message sizes, comma-separated, K/M suffixes, {MIN_SIZE} octets to 1G each "
        "(default 64K,1M)",
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
        default=RAW_RECEIVE_SIZE,
        metavar="N",
        help="octets per recv_into of the receivers but raw, at most "
        f"{size_label(RECEIVE)}, the receive buffer "
        f"(default {size_label(RAW_RECEIVE_SIZE)}, as raw reads)",
    )
    add_json_argument(parser)


def run(args: argparse.Namespace) -> int:
    """``iwarp bench floor``: measure, print the table (on stderr with ``--json -``), write
    the JSON; a failed run is one error line and status 1 (its JSON says so)."""
    check_outputs(("--json", args.json))
    prog = getattr(args, ERROR_PROG, "iwarp bench floor")
    rows: list[dict[str, Any]] = []
    status, error = 0, None
    try:
        rows = measure(
            args.sizes, args.duration, args.repeat, args.emss, args.raw_sizes, args.read_size
        )
    except (BenchError, OSError, RuntimeError, trio.BrokenResourceError) as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        status, error = 1, str(exc)
    if rows:
        print(format_table(rows), file=sys.stderr if args.json == "-" else sys.stdout)
    if args.json:
        document: dict[str, Any] = {
            "schema": schema("iwarp bench floor"),
            "command": "iwarp bench floor",
            "emss": args.emss,
            "read_size": args.read_size,
            "rows": rows,
            "exit_status": status,
        }
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
        trio.run(_sink, sys.stdout)
        return 0
    return call(args, parser.prog)


if __name__ == "__main__":
    sys.exit(main())
