"""``iwarp bench floor --exchange read|rtt``: the pure-Python floor of an RDMA Read.

The raw baseline of ``iwarp bench read --baseline`` is request/response: a
``RAW_REQUEST``-octet request answered with SIZE octets, the server answering every
complete request it has in one send.  What any iWARP Read must add to it in Python, and
nothing else:

* the requester frames each Read Request as an FPDU: the length field, a DDP untagged
  header (queue 1, its MSN counted), the 28 octets of RDMAP Read Request (sink STag and TO,
  size, source STag and TO) and CRC32c, 52 octets;
* the responder checks each request's CRC where it lies in its receive buffer, its header
  (DDP and RDMAP control, queue, MSN in sequence, offset 0, source STag) and bounds, and
  answers every complete request it has with tagged Read Response FPDUs of the source
  memory, MULPDU octets of payload each (:class:`~stack.bench.floor_wire.TaggedFramer`,
  scatter-gather through the driver's :class:`~stack.transport.sendq.SendQueue`);
* the requester checks every response FPDU's CRC where it lies in a preallocated receive
  buffer and copies its payload to the target at its TO
  (:func:`~stack.bench.floor_wire.place`).

Two variants, alternated ``--repeat`` times, both against the floor's sink process:

``raw``    the bench's own raw exchange: its client (``raw_pipelined``,
           ``time_round_trips``) against its server's code (``answer_requests``, all of
           :mod:`stack.bench.baseline`), the responder's socket with the driver's
           ``TCP_NOTSENT_LOWAT`` as the bench server's raw port has it
``floor``  the same exchange as FPDUs, as above

Exchanges: ``read``, pipelined Reads with the bench's default depth (``min(tx depth,
ORD)``, 128), MB/s, each variant run once per receive size of ``RAW_RECEIVE_SIZES`` and the
faster run counting, as the bench's raw baseline does (``--read-size``: the floor's one
receive size); ``rtt``, one 64 B Read at a time, the median round trip in µs (WARMUP_ITERS
first, as the bench).  ``ratio``: floor over raw of the same repeat, the median over the
repeats; above 1 is better for ``read``, below 1 for ``rtt``.
"""

from __future__ import annotations

import socket
import statistics
import struct
import sys
import time
from typing import Any, TextIO

import trio

from stack.bench.baseline import answer_requests, raw_pipelined, time_round_trips
from stack.bench.blocking import batch_messages
from stack.bench.floor_wire import (
    RECEIVE,
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
from stack.bench.options import WARMUP_ITERS, BenchOptions
from stack.bench.protocol import RAW_REQUEST
from stack.bench.raw_socket import socket_of
from stack.constants import (
    DDP_LAST,
    DDP_TAGGED_HDR_LEN,
    DDP_UNTAGGED_HDR_LEN,
    DDP_VERSION,
    MPA_CRC_LEN,
    MPA_CRC_RESIDUE,
    RAW_RECEIVE_SIZE,
    RAW_RECEIVE_SIZES,
    READ_REQUEST_HDR_LEN,
    Opcode,
    QueueNumber,
)
from stack.crc import crc32c
from stack.transport.sendq import SendQueue
from stack.transport.sockopts import limit_unsent
from stack.wire.ddp import UNTAGGED_HDR
from stack.wire.headers import READ_REQUEST
from stack.wire.rdmap import rdmap_ctrl

__all__ = [
    "DEFAULT_SIZES",
    "EXCHANGES",
    "READ_DEPTH",
    "VARIANTS",
    "format_table",
    "measure_exchange",
    "read_requests",
    "respond",
]

EXCHANGES = ("read", "rtt")
VARIANTS = ("raw", "floor")
DEFAULT_SIZES = {"read": [65536, 1 << 20], "rtt": [64]}
"""Sizes each exchange measures when none are given (the goals' sizes)."""
READ_DEPTH = BenchOptions("read", ()).ord
"""Reads in flight: ``iwarp bench read``'s default, ``min(tx depth, ORD)``."""
RAW_RESPONDER, FLOOR_RESPONDER = 0x10, 0x11
"""The sink's modes (the hello's first field) answering ``raw`` and ``floor`` requests."""
SOURCE_STAG = 2
"""The responder's source region's STag (any; the responder checks requests name it)."""

_ULPDU = DDP_UNTAGGED_HDR_LEN + READ_REQUEST_HDR_LEN
_REQUEST = struct.Struct(">H" + UNTAGGED_HDR.format[1:] + READ_REQUEST.format[1:])
"""A Read Request FPDU but its CRC: length field, DDP untagged header, RDMAP Read Request."""
REQUEST_WIRE = fpdu_wire(_ULPDU)
assert REQUEST_WIRE == _REQUEST.size + MPA_CRC_LEN  # no PAD: 2 + 18 + 28 octets
_CRC = struct.Struct("<I")
_DDP_CTRL = DDP_LAST | DDP_VERSION  # untagged, one segment
_RDMAP_CTRL = rdmap_ctrl(Opcode.RDMA_READ_REQUEST)


def read_requests(size: int, first_msn: int, count: int) -> bytearray:
    """``count`` Read Request FPDUs for ``size`` octets of the source region from offset 0
    to the target at TO 0, MSNs from ``first_msn``: one buffer, one ``crc32c`` each."""
    out = bytearray()
    pack, crc_pack = _REQUEST.pack, _CRC.pack
    queue = QueueNumber.READ_REQUEST
    for msn in range(first_msn, first_msn + count):
        fpdu = pack(
            _ULPDU, _DDP_CTRL, _RDMAP_CTRL, 0, queue, msn, 0, TARGET_STAG, 0, size, SOURCE_STAG, 0
        )
        out += fpdu
        out += crc_pack(crc32c(fpdu))
    return out


# --------------------------------------------------------------------------- responder
async def respond(stream: trio.SocketStream, mode: int, size: int, payload: int, read: int) -> int:
    """The sink's half: answer requests until the client half-closes; octets of replies
    sent.  ``raw``: the bench server's code (``payload``: the request's octets);
    ``floor``: Read Requests of a ``size``-octet source answered as above."""
    limit_unsent(stream)  # as the bench server's raw port (and the driver) send
    if mode == RAW_RESPONDER and payload > 0:
        return size * await answer_requests(stream, size, payload)
    if mode != FLOOR_RESPONDER:
        raise RuntimeError(f"unknown mode {mode}")
    with socket_of(stream) as sock:
        return await _respond(sock, size, payload, read)


async def _respond(sock: socket.socket, size: int, payload: int, read: int) -> int:
    source = memoryview(bytearray(b"\x5a" * size))
    framer = TaggedFramer(source, payload, Opcode.RDMA_READ_RESPONSE)
    queue = SendQueue(sock.sendmsg)
    buf = bytearray(RECEIVE)
    view = memoryview(buf)
    unpack = _REQUEST.unpack_from
    header = (_ULPDU, _DDP_CTRL, _RDMAP_CTRL, QueueNumber.READ_REQUEST)
    msn = 1
    sent = start = end = 0
    while n := await recv(sock, view[end : end + read]):
        end += n
        pos = start
        asked: list[tuple[int, int, int, int]] = []
        while end - pos >= REQUEST_WIRE:
            if crc32c(view[pos : pos + REQUEST_WIRE]) != MPA_CRC_RESIDUE:
                raise RuntimeError("CRC mismatch")
            fields = unpack(buf, pos)
            length, ctrl, rdmap, _, qn, got, mo, stag, to, octets, src_stag, src_to = fields
            if (length, ctrl, rdmap, qn) != header or (got, mo, src_stag) != (msn, 0, SOURCE_STAG):
                raise RuntimeError(f"not the Read Request expected (MSN {msn})")
            if src_to + octets > size:
                raise RuntimeError("a Read Request beyond the source region")
            asked.append((src_to, octets, stag, to))
            sent += octets
            msn += 1
            pos += REQUEST_WIRE
        start, end = keep_partial(view, pos, end, REQUEST_WIRE)
        while asked:  # every complete request answered, up to BATCH octets per send
            k = batch_messages(size, len(asked))
            await send_all(queue, sock, framer.frame(asked[:k]))
            del asked[:k]
        await trio.lowlevel.checkpoint()
    return sent


# --------------------------------------------------------------------------- requester
async def _reads(
    port: int, variant: str, size: int, payload: int, seconds: float, receive: int
) -> dict[str, Any]:
    """One run of pipelined Reads; MB/s, Reads/s and CPU per Read at each end."""
    floor = variant == "floor"
    mode, asks = (FLOOR_RESPONDER, payload) if floor else (RAW_RESPONDER, RAW_REQUEST)
    stream = await connect(port, mode, size, asks, RAW_RECEIVE_SIZE)
    clock = time.perf_counter
    cpu = time.process_time_ns()
    start = clock()
    if floor:
        with socket_of(stream) as sock:
            done = await _floor_reads(sock, size, payload, start + seconds, receive)
    else:
        done = await raw_pipelined(stream, size, READ_DEPTH, None, start + seconds, receive)
    elapsed = clock() - start
    cpu = time.process_time_ns() - cpu
    replied, sink_cpu = await result(stream)
    if replied != done * size:
        raise RuntimeError(f"the responder sent {replied} octets, {done * size} arrived")
    return {
        "MBps": done * size / elapsed / 1e6,
        "msgps": done / elapsed,
        "cpu_requester_us": cpu / done / 1e3,
        "cpu_responder_us": sink_cpu / done / 1e3,
        "receive": receive,
    }


async def _floor_reads(
    sock: socket.socket, size: int, payload: int, deadline: float, read: int
) -> int:
    """:func:`~stack.bench.baseline.raw_pipelined` as Read Requests and Responses: READ_DEPTH
    in flight, a new Request per Read done until ``deadline``; the Reads done."""
    buf = bytearray(RECEIVE)
    view = memoryview(buf)
    target = memoryview(bytearray(size))
    frame = fpdu_wire(DDP_TAGGED_HDR_LEN + payload)  # the longest FPDU on the wire
    queue = SendQueue(sock.sendmsg)
    clock = time.perf_counter
    limit = 1 << 62
    sent = READ_DEPTH
    await send_all(queue, sock, [read_requests(size, 1, sent)])
    done = placed = start = end = 0
    while done < sent:
        n = await recv(sock, view[end : end + read])
        if not n:
            raise RuntimeError("the responder closed the connection during the Reads")
        end += n
        pos, octets = place(view, start, end, target)
        placed += octets
        more = placed // size - done
        done += more
        if limit > sent and clock() >= deadline:
            limit = sent
        more = min(more, limit - sent)
        if more > 0:
            await send_all(queue, sock, [read_requests(size, sent + 1, more)])
            sent += more
        start, end = keep_partial(view, pos, end, frame)
        await trio.lowlevel.checkpoint()
    return done


async def _round_trips(
    port: int, variant: str, size: int, payload: int, seconds: float, receive: int
) -> dict[str, Any]:
    """One run of one Read at a time; the median round trip (µs) and CPU per round trip."""
    floor = variant == "floor"
    mode, asks = (FLOOR_RESPONDER, payload) if floor else (RAW_RESPONDER, RAW_REQUEST)
    stream = await connect(port, mode, size, asks, RAW_RECEIVE_SIZE)
    cpu = time.process_time_ns()
    deadline = time.perf_counter() + seconds
    if floor:
        with socket_of(stream) as sock:
            times = await _floor_round_trips(sock, size, payload, deadline, receive)
    else:
        times = await time_round_trips(stream, bytes(RAW_REQUEST), size, None, deadline)
    cpu = time.process_time_ns() - cpu
    replied, sink_cpu = await result(stream)
    trips = WARMUP_ITERS + len(times)
    if replied != trips * size:
        raise RuntimeError(f"the responder sent {replied} octets, {trips * size} arrived")
    return {
        "us": statistics.median(times) * 1e6,
        "round_trips": len(times),
        "cpu_requester_us": cpu / trips / 1e3,
        "cpu_responder_us": sink_cpu / trips / 1e3,
    }


async def _floor_round_trips(
    sock: socket.socket, size: int, payload: int, deadline: float, read: int
) -> list[float]:
    """:func:`~stack.bench.baseline.time_round_trips` as Read Requests and Responses: each
    round trip frames its Request, sends it and places the whole Response."""
    buf = bytearray(RECEIVE)
    view = memoryview(buf)
    target = memoryview(bytearray(size))
    frame = fpdu_wire(DDP_TAGGED_HDR_LEN + payload)
    queue = SendQueue(sock.sendmsg)
    clock = time.perf_counter
    times: list[float] = []
    msn = 1
    start = end = 0
    while not times or clock() < deadline:
        t0 = clock()
        await send_all(queue, sock, [read_requests(size, msn, 1)])
        placed = 0
        while placed < size:
            n = await recv(sock, view[end : end + read])
            if not n:
                raise RuntimeError("the responder closed the connection during a Read")
            end += n
            pos, octets = place(view, start, end, target)
            placed += octets
            start, end = keep_partial(view, pos, end, frame)
        t1 = clock()
        if msn > WARMUP_ITERS:
            times.append(t1 - t0)
        msn += 1
    return times


# --------------------------------------------------------------------------------- main
def measure_exchange(
    exchange: str,
    sizes: list[int],
    seconds: float,
    repeat: int,
    emss: int,
    read_sizes: tuple[int, ...] | None = None,
    *,
    progress: TextIO | None = sys.stderr,
    sink_cpu: int | None = None,
) -> list[dict[str, Any]]:
    """Both variants of ``exchange`` (``read`` or ``rtt``) at each size, alternated
    ``repeat`` times; medians per row, each with ``ratio``, floor over raw of the same
    repeat.  ``emss``: the MULPDU of the Read Responses derives from it; ``read_sizes``: the floor's
    receive sizes (``read``: the faster run counts; None: as raw, RAW_RECEIVE_SIZES;
    ``rtt`` reads the first, RAW_RECEIVE_SIZE by default); ``progress``: where a line per
    run goes (None: nowhere).  The responder is the floor's sink process (on ``sink_cpu``
    only, if given)."""
    if exchange not in EXCHANGES:
        raise ValueError(f"unknown exchange {exchange!r}")
    latency = exchange == "rtt"
    key = "us" if latency else "MBps"
    receives = {"raw": RAW_RECEIVE_SIZES, "floor": read_sizes or RAW_RECEIVE_SIZES}
    if latency:
        receives = {"raw": (RAW_RECEIVE_SIZE,), "floor": receives["floor"][:1]}
    payload = fpdu_payload(emss)
    rows = []
    with sink_process(sink_cpu) as port:
        for size in sizes:
            runs: dict[str, list[dict[str, Any]]] = {v: [] for v in VARIANTS}
            for _ in range(repeat):
                for variant in VARIANTS:
                    tries = [
                        trio.run(
                            _round_trips if latency else _reads,
                            port,
                            variant,
                            size,
                            payload,
                            seconds,
                            receive,
                        )
                        for receive in receives[variant]
                    ]
                    one = max(tries, key=lambda r: r["MBps"]) if not latency else tries[0]
                    runs[variant].append(one)
                    if progress is not None:
                        unit = "us" if latency else "MB/s"
                        print(
                            f"  {exchange} {size} {variant}: {one[key]:.1f} {unit}", file=progress
                        )
            rows += [median_row(size, v, runs[v], runs["raw"], key) for v in VARIANTS]
    return rows


def format_table(exchange: str, rows: list[dict[str, Any]]) -> str:
    """The rows of :func:`measure_exchange` as the command prints them."""
    cpu = f"{'CPU req/resp [us/' + ('trip' if exchange == 'rtt' else 'Read') + ']':>24}"
    if exchange == "rtt":
        lines = [f"{'size':>8} {'variant':8} {'us':>8} {'trips':>9} {'ratio':>6} {cpu}"]
        lines += [
            f"{r['size']:>8} {r['variant']:8} {r['us']:8.1f} {r['round_trips']:9.0f} "
            f"{r['ratio']:6.2f} {r['cpu_requester_us']:11.1f}/{r['cpu_responder_us']:.1f}"
            for r in rows
        ]
        return "\n".join(lines)
    lines = [f"{'size':>8} {'variant':8} {'MB/s':>8} {'Reads/s':>9} {'ratio':>6} {cpu}"]
    lines += [
        f"{r['size']:>8} {r['variant']:8} {r['MBps']:8.0f} {r['msgps']:9.0f} "
        f"{r['ratio']:6.2f} {r['cpu_requester_us']:11.1f}/{r['cpu_responder_us']:.1f}"
        for r in rows
    ]
    return "\n".join(lines)
