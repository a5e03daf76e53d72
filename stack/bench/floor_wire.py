"""What both processes of ``iwarp bench floor`` share: the sink's hello and result, the
socket calls of the stack's driver, tagged FPDU framing, and the in-place CRC check and
placement of a receiver (:mod:`stack.bench.floor`, :mod:`stack.bench.floor_exchange`).

Only what any pure-Python iWARP implementation must do on the wire: an FPDU's length field,
its DDP tagged header (with the RDMAP control byte), PAD and CRC32c at the sender; at the
receiver the CRC checked where the FPDU lies in the receive buffer and the payload copied
to the target at its TO.  Nothing else is parsed: no STag is looked up (the slice
assignment of the placement refuses a TO beyond the target).
"""

from __future__ import annotations

import socket
import statistics
import struct
import subprocess
import sys
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import trio

from stack.bench.blocking import BATCH_BYTES
from stack.bench.options import BenchError
from stack.bench.protocol import receive_exactly
from stack.bench.raw_socket import recv
from stack.constants import (
    DDP_LAST,
    DDP_TAGGED,
    DDP_TAGGED_HDR_LEN,
    DDP_VERSION,
    IOV_MIN_PAYLOAD,
    MPA_CRC_LEN,
    MPA_CRC_RESIDUE,
    MPA_LENGTH_LEN,
    Opcode,
)
from stack.crc import crc32c
from stack.transport.pumping import RECEIVE_MAX
from stack.transport.sendq import SendQueue
from stack.transport.sockopts import limit_unsent
from stack.wire.ddp import TAGGED_HDR
from stack.wire.framing import mulpdu_for
from stack.wire.rdmap import rdmap_ctrl

__all__ = [
    "BATCH",
    "CRC",
    "HEAD",
    "HELLO",
    "RECEIVE",
    "RESULT",
    "TARGET_STAG",
    "TaggedFramer",
    "connect",
    "fpdu_payload",
    "fpdu_wire",
    "keep_partial",
    "place",
    "recv",
    "result",
    "median_row",
    "send_all",
    "sink_process",
]

RECEIVE = RECEIVE_MAX
"""Octets of a receive buffer (the driver's bulk receive buffer, 1 MiB)."""
BATCH = BATCH_BYTES
"""Most octets of messages one send carries (as the bench's raw baselines, 1 MiB)."""
HELLO = struct.Struct("!BIII")
"""What a client tells the sink: its mode, message size, FPDU payload, octets per read."""
RESULT = struct.Struct("!QQ")
"""The sink's answer once the client half-closes: octets it received (or sent), CPU ns."""
HEAD = struct.Struct(">H" + TAGGED_HDR.format[1:])
"""An FPDU's length field and DDP tagged header (control, RDMAP control, STag, TO): 16."""
_LENGTH_TO = struct.Struct(">H6xQ")  # the length field and the TO of HEAD
CRC = struct.Struct("<I")
TARGET_STAG = 1
"""The STag the FPDUs name (any: the receivers place by the TO alone)."""
_ROUND = MPA_LENGTH_LEN + 3 + MPA_CRC_LEN  # (ULPDU + _ROUND) & ~3: an FPDU's wire octets
_PADS = (b"", bytes(1), bytes(2), bytes(3))
_SINK = "stack.bench.floor"


def fpdu_payload(emss: int) -> int:
    """Payload octets of a full tagged FPDU at ``emss``: the MULPDU (MPA-13) less the DDP
    tagged header, rounded down to a multiple of 4 (no PAD)."""
    payload = mulpdu_for(emss, False) - DDP_TAGGED_HDR_LEN
    return payload - payload % 4


def fpdu_wire(ulpdu: int) -> int:
    """Wire octets of an FPDU of ``ulpdu`` octets: length field, ULPDU, PAD, CRC."""
    return (ulpdu + _ROUND) & ~3


async def send_all(queue: SendQueue, sock: socket.socket, pieces: list[Any]) -> None:
    """Send the pieces through the driver's :class:`~stack.transport.sendq.SendQueue`
    (scatter-gather, IOV_MAX pieces per call, what the socket does not take copied), waiting
    while the socket is full."""
    if not queue.send(pieces):
        await trio.lowlevel.wait_writable(sock)
        while not queue.send_backlog():
            await trio.lowlevel.wait_writable(sock)


def keep_partial(view: memoryview, start: int, end: int, frame: int) -> tuple[int, int]:
    """The receive buffer's new ``(start, end)`` once a read's whole FPDUs are done: empty,
    or a partial FPDU moved to the front when ``frame`` octets no longer fit behind it."""
    if start == end:
        return 0, 0
    if len(view) - end < frame:
        view[: end - start] = view[start:end]
        return 0, end - start
    return start, end


def place(view: memoryview, start: int, end: int, target: memoryview | None) -> tuple[int, int]:
    """Check the CRC of each whole tagged FPDU in ``view[start:end]`` where it lies and copy
    its payload into ``target`` at its TO (None: no copy); ``(where the whole FPDUs end,
    payload octets)``.  Raises RuntimeError on a CRC mismatch."""
    pos = start
    octets = 0
    unpack, check = _LENGTH_TO.unpack_from, crc32c  # locals: the loop runs per FPDU
    residue, head, header, round_up = MPA_CRC_RESIDUE, HEAD.size, DDP_TAGGED_HDR_LEN, _ROUND
    while end - pos >= head:
        length, to = unpack(view, pos)
        stop = pos + ((length + round_up) & ~3)
        if stop > end:
            break
        if check(view[pos:stop]) != residue:
            raise RuntimeError("CRC mismatch")
        data = length - header
        if target is not None:
            body = pos + head
            target[to : to + data] = view[body : body + data]
        octets += data
        pos = stop
    return pos, octets


class TaggedFramer:
    """Tagged FPDUs of messages from ``source``, ``payload`` octets of it per FPDU at most.

    The cheapest pure-Python framing measured: a payload of IOV_MIN_PAYLOAD (2 KiB) or more
    goes by reference, three pieces per FPDU for ``sendmsg`` (header, a view of the source,
    PAD and CRC; two ``crc32c`` calls), as the stack's driver sends it; a smaller one is
    copied, header and payload joined in one bytes object with one ``crc32c`` over it, and
    the FPDUs of a send appended to one buffer, one piece.  Measured (2 cores, loopback,
    ``-s 64``, 3 runs, sender CPU per message): 16 per send, ``floor`` at 0.89-0.93 of
    ``raw`` with one buffer, 0.83-0.87 with two pieces per FPDU (joined FPDU, CRC) and
    0.66-0.73 with three (0.75, 0.87 and 1.05 µs); 128 per send 0.19, 0.15 and 0.12 (0.47,
    0.60 and 0.80 µs).  Copying 1 KiB payloads: 0.92 against 1.27 µs by reference; at
    4 KiB even, at 16 KiB 6.8 against 4.9 µs.
    """

    def __init__(self, source: memoryview, payload: int, opcode: Opcode) -> None:
        self.source = source
        self.payload = payload
        self.rdmap = rdmap_ctrl(opcode)

    def frame(self, messages: Iterable[tuple[int, int, int, int]]) -> list[Any]:
        """The pieces of the FPDUs of ``messages``, each (source offset, length, STag,
        TO), the last FPDU of each with DDP's Last flag."""
        source, payload, rdmap = self.source, self.payload, self.rdmap
        pack, crc_pack = HEAD.pack, CRC.pack
        middle, last = DDP_TAGGED | DDP_VERSION, DDP_TAGGED | DDP_LAST | DDP_VERSION
        pieces: list[Any] = []
        out = bytearray()
        for at, length, stag, to in messages:
            if length < IOV_MIN_PAYLOAD and length <= payload:  # one FPDU, copied
                n = DDP_TAGGED_HDR_LEN + length
                fpdu = pack(n, last, rdmap, stag, to) + source[at : at + length]
                c = crc32c(fpdu)
                out += fpdu
                if pad := _PADS[-(MPA_LENGTH_LEN + n) & 3]:
                    out += pad
                    c = crc32c(pad, c)
                out += crc_pack(c)
                continue
            end = at + length
            ctrl = middle
            while ctrl == middle:
                stop = at + payload
                if stop >= end:
                    stop, ctrl = end, last
                n = DDP_TAGGED_HDR_LEN + stop - at
                head = pack(n, ctrl, rdmap, stag, to)
                body = source[at:stop]
                pad = _PADS[-(MPA_LENGTH_LEN + n) & 3]
                if stop - at < IOV_MIN_PAYLOAD:
                    fpdu = head + body + pad
                    out += fpdu
                    out += crc_pack(crc32c(fpdu))
                else:
                    if out:
                        pieces.append(out)
                        out = bytearray()
                    c = crc32c(body, crc32c(head))
                    pieces += (head, body, pad + crc_pack(crc32c(pad, c) if pad else c))
                to += stop - at
                at = stop
        if out:
            pieces.append(out)
        return pieces


# ----------------------------------------------------------------------- the sink
@contextmanager
def sink_process(cpu: int | None = None) -> Iterator[int]:
    """The sink, ``python -m stack.bench.floor --sink``, for the block (on ``cpu`` only, if
    given): its port; killed when the block is left."""
    pinned = [] if cpu is None else ["--cpus", str(cpu)]
    sink = subprocess.Popen(
        [sys.executable, "-m", _SINK, "--sink", *pinned], stdout=subprocess.PIPE, text=True
    )
    try:
        assert sink.stdout is not None
        line = sink.stdout.readline()
        if not line.strip().isdigit():
            raise RuntimeError(f"the receiver (python -m {_SINK} --sink) did not start")
        yield int(line)
    finally:
        sink.kill()
        sink.wait()


def median_row(
    size: int, variant: str, runs: list[dict[str, Any]], raw: list[dict[str, Any]], key: str
) -> dict[str, Any]:
    """A row of ``variant`` at ``size`` from its repeats ``runs``: the median of each figure,
    and ``ratio``, the median over the repeats of ``key`` over the ``raw`` run of the same
    repeat."""
    row: dict[str, Any] = {"size": size, "variant": variant}
    for name in runs[0]:
        row[name] = statistics.median(r[name] for r in runs)
    row["ratio"] = statistics.median(r[key] / w[key] for r, w in zip(runs, raw, strict=True))
    return row


async def connect(port: int, mode: int, size: int, payload: int, read: int) -> trio.SocketStream:
    """A connection to the sink, with the driver's ``TCP_NOTSENT_LOWAT``, that has said
    what to measure (:data:`HELLO`)."""
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    stream.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    limit_unsent(stream)
    await stream.send_all(HELLO.pack(mode, size, payload, read))
    return stream


async def result(stream: trio.SocketStream) -> tuple[int, int]:
    """Half-close, then the sink's :data:`RESULT` (octets, CPU ns); closes the stream."""
    try:
        await stream.send_eof()
        got = await receive_exactly(stream, RESULT.size)
    except BenchError:
        raise RuntimeError("the sink closed the connection without its count") from None
    finally:
        await stream.aclose()
    octets, cpu = RESULT.unpack(got)
    return octets, cpu
