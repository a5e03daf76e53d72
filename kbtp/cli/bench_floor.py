"""``kbtp bench --floor``: the pure-Python floor of KBTP's exchange, in the bench's run.

How fast can any pure-Python KBTP over iWARP (docs/kbtp.md §9.1: RDMAP over DDP and MPA)
move a block?  Whatever its layering, it must frame and check every FPDU with CRC32c,
copy the block into place once and exchange request and COMPLETION as FPDUs.  The floor
does that and nothing else, between this process (the initiator) and a target process
(``python -m kbtp.cli.bench_floor``; ``--in-process``: a task here), the bench's number
of requests in flight:

* **LOAD**: the initiator Sends the 40-octet request; the target RDMA-writes the block
  (tagged FPDUs) and Sends the 40-octet COMPLETION; the initiator places the block;
* **STORE** (RDMA path): the initiator Sends the request; the target Sends an RDMA Read
  Request (28-octet body); the initiator sends the Read Response (tagged FPDUs of its
  arena); the target places the block and, on the last FPDU, Sends the COMPLETION;
* **STORE** (inline path, blocks within Max Inline): one Send of request and block
  (untagged FPDUs, each placed at its MO), then the COMPLETION;
* **ALLOC_STORE**: STORE's exchange (its allocation from the ring is not modelled).

Every FPDU is real (length field, DDP header of 14 or 18 octets, RDMAP header, PAD, CRC;
segments cut as the stack cuts them, MSNs counted per queue; the layouts of
:mod:`stack.wire.ddp`, :mod:`stack.wire.headers`, :mod:`kbtp.formats`).  Each side reads
with ``recv_into`` a preallocated buffer, checks each CRC where the FPDU lies (a partial
FPDU moves to the front, as in ``iwarp bench floor``), unpacks only the headers it acts
on and sends what one read brought in one scatter-gather ``sendmsg`` pass (views of the
blocks, nothing joined or copied; at most :data:`FLUSH` octets framed ahead).  No MSN or
STag checks, no tables, no completion objects: a FIFO of the COMPLETIONs owed for RDMA
Reads is the only state.  The receiving side checks what it placed (count and content);
``--no-crc``: no CRC at either end.  A figure is the faster of one run per receive size
of ``RAW_RECEIVE_SIZES``, as the raw baseline's; its CPU is this process's and the
target's own ``process_time`` (the baseline reads its peer's from ``/proc``).
"""

from __future__ import annotations

import os
import random
import socket
import struct
import sys
import time
from collections import deque
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, NamedTuple

import trio

from kbtp.cli.bench_peer import port_process
from kbtp.constants import (
    COMMON_HEADER_LEN,
    COMPLETION_LEN,
    DATA_DESCRIPTOR_LEN,
    INITIAL_GENERATION,
    KBTP_VERSION,
    MessageOpcode,
    RequestFlag,
    Status,
)
from kbtp.formats import COMPLETION_BODY, DATA_DESCRIPTOR, HEADER, joined_codec
from stack.bench.floor_wire import RECEIVE, fpdu_wire, keep_partial, recv
from stack.bench.process import pin_to
from stack.bench.raw_socket import recv_exactly, send_pieces
from stack.cli import CliError
from stack.constants import (
    DDP_LAST,
    DDP_TAGGED,
    DDP_UNTAGGED_HDR_LEN,
    DDP_VERSION,
    MPA_CRC_LEN,
    MPA_CRC_RESIDUE,
    MPA_LENGTH_LEN,
    MULPDU_MAX,
    RAW_RECEIVE_SIZES,
    READ_REQUEST_HDR_LEN,
    TCP_NOTSENT_LOWAT_BULK,
    Opcode,
    QueueNumber,
)
from stack.crc import crc32c
from stack.transport.sockopts import limit_unsent
from stack.wire.ddp import TAGGED_HDR, UNTAGGED_HDR
from stack.wire.headers import READ_REQUEST
from stack.wire.rdmap import rdmap_ctrl

__all__ = ["bench_floor", "describe", "floor_process", "floor_target", "kind_of", "serve_floor"]

LOAD, STORE_READ, STORE_INLINE = 0, 1, 2
"""The exchanges (:func:`kind_of`): LOAD, STORE by RDMA Read, STORE inline."""
FLUSH = TCP_NOTSENT_LOWAT_BULK
"""Octets framed before they are handed to ``sendmsg`` (a send pass of 1 MiB)."""
TIMEOUT = 600.0
"""Seconds one floor measurement may take."""
START_TIMEOUT = 60.0
"""Seconds the target process may take to print its port, and a connection its hello."""
ARENA_STAG, POOL_STAG = 1, 2
"""STags of the initiator's arena and the target's pool (TO 0: each one's first octet)."""

_ALIGN = 4  # FPDUs are 4-aligned (the PAD, MPA-04)
_LE32 = struct.Struct("<I")  # the CRC field, as the stack writes it
_TAGGED = struct.Struct(">H" + TAGGED_HDR.format[1:])  # length field and tagged header
_UNTAGGED = struct.Struct(">H" + UNTAGGED_HDR.format[1:])  # length field, untagged header
_KBTP_REQUEST = joined_codec(HEADER, DATA_DESCRIPTOR)  # LOAD, STORE, ALLOC_STORE: 40 octets
_REQUEST = struct.Struct(_UNTAGGED.format + _KBTP_REQUEST.format[1:])
_COMPLETION = struct.Struct(_UNTAGGED.format + joined_codec(HEADER, COMPLETION_BODY).format[1:])
_READ_REQUEST = struct.Struct(_UNTAGGED.format + READ_REQUEST.format[1:])
_TO = 4  # in _TAGGED: length, DDP control, RDMAP control, STag, TO
_QN, _MO = 4, 6  # in _UNTAGGED: length, DDP control, RDMAP control, Inv. STag, QN, MSN, MO
_AT = {name: _MO + 1 + i for i, name in enumerate(HEADER.names + DATA_DESCRIPTOR.names)}
_OPC, _RID, _HANDLE = _AT["opcode"], _AT["request_id"], _AT["handle"]
_STAG, _LENGTH = _AT["stag"], _AT["length"]  # the Data Descriptor's; its TO at _STAG + 1
_RID_AT = _UNTAGGED.size + next(f.offset for f in HEADER.fields if f.name == "request_id")
_U64 = struct.Struct(">Q")
_SEND = rdmap_ctrl(Opcode.SEND)
_CTRL, _CTRL_LAST = DDP_VERSION, DDP_LAST | DDP_VERSION
_TCTRL, _TCTRL_LAST = DDP_TAGGED | _CTRL, DDP_TAGGED | _CTRL_LAST
_PADS = [bytes(n) for n in range(_ALIGN)]
_OPCODES = {
    "load": MessageOpcode.LOAD,
    "store": MessageOpcode.STORE,
    "alloc_store": MessageOpcode.ALLOC_STORE,
}
_UNTAGGED_LEAD = MPA_LENGTH_LEN + DDP_UNTAGGED_HDR_LEN
assert _REQUEST.size == _UNTAGGED_LEAD + COMMON_HEADER_LEN + DATA_DESCRIPTOR_LEN
assert _COMPLETION.size == _UNTAGGED_LEAD + COMPLETION_LEN
assert _READ_REQUEST.size == _UNTAGGED_LEAD + READ_REQUEST_HDR_LEN


class _Run(NamedTuple):
    """One floor run: what the initiator's hello tells the target."""

    kind: int
    crc: int
    opcode: int
    size: int
    inflight: int
    iters: int
    mulpdu: int
    read: int
    seed: int


_HELLO = struct.Struct("!BBHIIIIIQ")  # a _Run
_READY = b"R"  # the target's answer to the hello: the measured exchange starts
_RESULT = struct.Struct("!QQB")  # the target's octets placed, CPU ns, content as sent


class FloorError(Exception):
    """A floor exchange went wrong (a CRC, a count, the content, a closed peer)."""


def kind_of(op: str, path: str) -> int:
    """The exchange of a bench row: LOAD, STORE_READ or STORE_INLINE (ALLOC_STORE: STORE's)."""
    if op == "load":
        return LOAD
    return STORE_INLINE if path == "inline" else STORE_READ


def describe(op: str, path: str) -> str:
    """The floor exchange of a bench row, in words (``--json``)."""
    what = {
        LOAD: "Send request, RDMA Write of the block, Send COMPLETION",
        STORE_READ: "Send request, RDMA Read Request, Read Response of the block, Send COMPLETION",
        STORE_INLINE: "Send of request and block, Send COMPLETION",
    }[kind_of(op, path)]
    return what + (" (STORE's: the allocation is not modelled)" if op == "alloc_store" else "")


def _segments(size: int, mulpdu: int, header: int, first: int = 0) -> list[Any]:
    """DDP segments (as the stack cuts them) of a ``size``-octet payload behind
    ``header``-octet DDP headers: (start, end, last, PAD); the first carries ``first``
    octets before its payload (the KBTP request of an inline STORE)."""
    cuts, at = [], 0
    while True:
        end = min(size, at + mulpdu - header - first)
        pad = _PADS[-(MPA_LENGTH_LEN + header + first + end - at) % _ALIGN]
        cuts.append((at, end, end == size, pad))
        if end == size:
            return cuts
        at, first = end, 0


def _framed(head: bytes, crc: bool) -> bytes:
    """An FPDU of ``head`` (length field and a 4-aligned ULPDU) and its CRC."""
    return head + _LE32.pack(crc32c(head) if crc else 0)


def _append(out: list[Any], head: bytes, body: memoryview, pad: bytes, crc: bool) -> None:
    """Append an FPDU of ``head`` (length field, headers), ``body`` and ``pad`` to ``out``."""
    if crc:
        c = crc32c(body, crc32c(head))
        out += (head, body, pad + _LE32.pack(crc32c(pad, c) if pad else c))
    else:
        out += (head, body, pad + bytes(MPA_CRC_LEN))


def _tagged(out: list[Any], segs: list[Any], op: int, stag: int, to: int, src: memoryview,
            crc: bool) -> None:  # fmt: skip
    """Append the FPDUs of one tagged message (RDMA Write, Read Response) to ``out``."""
    pack = _TAGGED.pack
    for start, end, last, pad in segs:
        head = pack(TAGGED_HDR.size + end - start, _TCTRL_LAST if last else _TCTRL, op, stag,
                    to + start)  # fmt: skip
        _append(out, head, src[start:end], pad, crc)


async def _exactly(sock: socket.socket, count: int) -> bytes:
    """``count`` octets (FloorError when the peer closes first)."""
    buf = bytearray(count)
    if not await recv_exactly(sock, memoryview(buf)):
        raise FloorError("the peer closed the connection early")
    return bytes(buf)


def _pattern(seed: int, size: int) -> bytes:
    """The block both ends expect: ``size`` octets made from ``seed``."""
    return random.Random(seed).randbytes(size)


def _same(memory: bytearray, size: int, blocks: int, pattern: bytes) -> bool:
    """Whether the first ``blocks`` blocks of ``memory`` all hold ``pattern``."""
    view = memoryview(memory)
    return all(view[w * size : (w + 1) * size] == pattern for w in range(blocks))


def _plain(sock: trio.socket.SocketType) -> socket.socket:
    """A connected trio socket as a non-blocking standard one, set as the stack's sockets
    (TCP_NODELAY, a send pass of unsent octets)."""
    plain = socket.socket(sock.family, sock.type, sock.proto, sock.detach())
    plain.setblocking(False)
    plain.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    limit_unsent(plain)
    return plain


# -------------------------------------------------------------------------------- target
async def serve_floor(listener: trio.socket.SocketType) -> None:
    """Serve floor runs on ``listener`` until cancelled, each connection in a task of its
    own; one that fails is closed."""
    async with trio.open_nursery() as nursery:
        while True:
            conn, _ = await listener.accept()
            nursery.start_soon(_serve, _plain(conn))


async def _serve(sock: socket.socket) -> None:
    try:
        with trio.fail_after(START_TIMEOUT):
            run = _Run(*_HELLO.unpack(await _exactly(sock, _HELLO.size)))
        if not (run.kind <= STORE_INLINE and 0 < run.read <= RECEIVE and run.size) or not (
            _REQUEST.size < run.mulpdu <= MULPDU_MAX and run.inflight
        ):
            raise FloorError("a hello of no floor run")
        pattern = _pattern(run.seed, run.size)
        pool = bytearray(pattern * run.inflight if run.kind == LOAD else run.size * run.inflight)
        await send_pieces(sock, [_READY])
        cpu = time.process_time_ns()
        placed = await _target(sock, run, pool)
        cpu = time.process_time_ns() - cpu
        stored = run.kind == LOAD or _same(pool, run.size, min(run.inflight, run.iters), pattern)
        await send_pieces(sock, [_RESULT.pack(placed, cpu, stored)])
    except (FloorError, OSError, MemoryError, ValueError, IndexError, trio.TooSlowError):
        pass  # the initiator learns it from the closed connection
    finally:
        sock.close()


def _completion(msn: int, done: tuple[int, int, int, int], size: int, crc: bool) -> bytes:
    """The COMPLETION FPDU of ``done``: (request ID, handle, opcode, block offset)."""
    rid, handle, op, block = done
    length = _COMPLETION.size - MPA_LENGTH_LEN
    return _framed(_COMPLETION.pack(length, _CTRL_LAST, _SEND, 0, QueueNumber.SEND, msn, 0,
        KBTP_VERSION, MessageOpcode.COMPLETION, 0, rid, handle, INITIAL_GENERATION,
        Status.SUCCESS, size, op, block), crc)  # fmt: skip


async def _target(sock: socket.socket, run: _Run, pool: bytearray) -> int:
    """Answer requests until the initiator ends the stream; the octets placed."""
    kind, crc, size, mulpdu, read = run.kind, bool(run.crc), run.size, run.mulpdu, run.read
    buf = bytearray(RECEIVE)
    view = memoryview(buf)
    blocks = memoryview(pool)
    frame = fpdu_wire(mulpdu)
    write_segs = _segments(size, mulpdu, TAGGED_HDR.size)
    write_op = rdmap_ctrl(Opcode.RDMA_WRITE)
    read_op = rdmap_ctrl(Opcode.RDMA_READ_REQUEST)
    owed: deque[tuple[int, int, int, int]] = deque()  # the COMPLETIONs of Reads in flight
    unpack_request, unpack_untagged = _REQUEST.unpack_from, _UNTAGGED.unpack_from
    unpack_tagged, pack_read = _TAGGED.unpack_from, _READ_REQUEST.pack
    read_len = _READ_REQUEST.size - MPA_LENGTH_LEN
    tag_at, data_at, more_at = _TAGGED.size, _REQUEST.size, _UNTAGGED.size
    msn = read_msn = 1
    placed = start = end = 0
    inline = (0, 0, 0)  # request ID, handle and opcode of the inline STORE being received
    while n := await recv(sock, view[end : end + read]):
        end += n
        pos = start
        out: list[Any] = []
        queued = 0
        while end - pos >= MPA_LENGTH_LEN:
            length = buf[pos] << 8 | buf[pos + 1]
            wire = fpdu_wire(length)
            if end - pos < wire:
                if wire > frame:
                    raise FloorError(f"an FPDU of {wire} octets, more than the MULPDU")
                break
            if crc and crc32c(view[pos : pos + wire]) != MPA_CRC_RESIDUE:
                raise FloorError("CRC mismatch at the target")
            ctrl = buf[pos + MPA_LENGTH_LEN]
            done = None
            if ctrl & DDP_TAGGED:  # a Read Response segment: place it
                to = unpack_tagged(buf, pos)[_TO]
                data = length - TAGGED_HDR.size
                blocks[to : to + data] = view[pos + tag_at : pos + tag_at + data]
                placed += data
                if ctrl & DDP_LAST:
                    done = owed.popleft()
            elif kind == STORE_INLINE:  # a segment of the Send of a request and its block
                mo = unpack_untagged(buf, pos)[_MO]
                if mo == 0:
                    f = unpack_request(buf, pos)
                    inline = (f[_RID], f[_HANDLE], f[_OPC])
                    at, dest = data_at, f[_HANDLE] * size
                else:
                    at, dest = more_at, inline[1] * size + mo - _KBTP_REQUEST.size
                data = MPA_LENGTH_LEN + length - at
                blocks[dest : dest + data] = view[pos + at : pos + at + data]
                placed += data
                if ctrl & DDP_LAST:
                    done = (*inline, inline[1] * size)
            else:  # a request: a LOAD, or a STORE whose block the target RDMA-reads
                f = unpack_request(buf, pos)
                block = f[_HANDLE] * size
                if kind == LOAD:
                    want = min(f[_LENGTH], size)
                    segs = write_segs if want == size else _segments(want, mulpdu, TAGGED_HDR.size)
                    source = blocks[block : block + want]
                    _tagged(out, segs, write_op, f[_STAG], f[_STAG + 1], source, crc)
                    queued += want
                    done = (f[_RID], f[_HANDLE], f[_OPC], block)
                else:
                    out.append(_framed(pack_read(read_len, _CTRL_LAST, read_op, 0,
                        QueueNumber.READ_REQUEST, read_msn, 0, POOL_STAG, block, f[_LENGTH],
                        f[_STAG], f[_STAG + 1]), crc))  # fmt: skip
                    read_msn += 1
                    owed.append((f[_RID], f[_HANDLE], f[_OPC], block))
            if done is not None:
                out.append(_completion(msn, done, size, crc))
                msn += 1
            pos += wire
            if queued >= FLUSH:
                await send_pieces(sock, out)
                out, queued = [], 0
        if out:
            await send_pieces(sock, out)
        start, end = keep_partial(view, pos, end, frame)
    return placed


# ----------------------------------------------------------------------------- initiator
async def bench_floor(
    port: int,
    op: str,
    path: str,
    size: int,
    iters: int,
    inflight: int,
    *,
    mulpdu: int,
    crc: bool = True,
    peer_cpu: bool = True,
    receives: tuple[int, ...] = RAW_RECEIVE_SIZES,
) -> tuple[float, float]:
    """(seconds, CPU seconds of both ends) of ``iters`` floor exchanges of the bench row
    ``op``/``path`` at ``size``, ``inflight`` outstanding, against the floor target at
    ``port``: one run per receive size of ``receives`` (octets per ``recv_into`` at both
    ends), the faster run's figures.  ``peer_cpu``: add the target's CPU (False when it
    runs in this process).  A CRC mismatch, a wrong count or content, a target gone:
    :class:`CliError`."""
    kind = kind_of(op, path)
    try:
        with trio.fail_after(TIMEOUT):
            runs = []
            for read in receives:
                seed = int.from_bytes(os.urandom(8))
                run = _Run(kind, crc, _OPCODES[op], size, inflight, iters, mulpdu, read, seed)
                runs.append(await _initiate(port, run, peer_cpu))
            return min(runs)
    except trio.TooSlowError:
        raise CliError(f"the floor run took more than {TIMEOUT:.0f} s") from None
    except (FloorError, OSError) as exc:
        raise CliError(f"the floor of {op.upper()} at {size} octets failed: {exc}") from None


async def _initiate(port: int, run: _Run, peer_cpu: bool) -> tuple[float, float]:
    pattern = _pattern(run.seed, run.size)
    slots = min(run.inflight, run.iters)
    fill = bytes(run.size) if run.kind == LOAD else pattern
    arena = bytearray(fill * run.inflight)
    conn = trio.socket.socket()
    try:
        await conn.connect(("127.0.0.1", port))
    except OSError:
        conn.close()
        raise
    sock = _plain(conn)
    try:
        await send_pieces(sock, [_HELLO.pack(*run)])
        if await _exactly(sock, len(_READY)) != _READY:
            raise FloorError("the floor target did not answer its hello")
        cpu = time.process_time()
        started = time.perf_counter()
        placed = await _initiator(sock, run, slots, arena)
        seconds = time.perf_counter() - started
        cpu = time.process_time() - cpu
        sock.shutdown(socket.SHUT_WR)
        stored, target_cpu, same = _RESULT.unpack(await _exactly(sock, _RESULT.size))
    finally:
        sock.close()
    if run.kind == LOAD:
        stored, same = placed, _same(arena, run.size, slots, pattern)
    where = "the initiator" if run.kind == LOAD else "the target"
    if stored != run.iters * run.size:
        raise FloorError(f"{where} placed {stored} octets, {run.iters * run.size} were sent")
    if not same:
        raise FloorError(f"{where} got other octets than were sent")
    return seconds, cpu + (target_cpu / 1e9 if peer_cpu else 0.0)


async def _initiator(sock: socket.socket, run: _Run, slots: int, arena: bytearray) -> int:
    """Keep ``slots`` requests outstanding until ``run.iters`` are complete (request ID and
    handle: the slot); the octets placed."""
    kind, crc, size, mulpdu, read = run.kind, bool(run.crc), run.size, run.mulpdu, run.read
    iters = run.iters
    buf = bytearray(RECEIVE)
    view = memoryview(buf)
    source = memoryview(arena)
    frame = fpdu_wire(mulpdu)
    response_segs = _segments(size, mulpdu, TAGGED_HDR.size)
    inline_segs = _segments(size, mulpdu, DDP_UNTAGGED_HDR_LEN, _KBTP_REQUEST.size)
    response_op = rdmap_ctrl(Opcode.RDMA_READ_RESPONSE)
    flags, opcode = (RequestFlag.INLINE if kind == STORE_INLINE else 0), run.opcode
    pack_request, pack_untagged = _REQUEST.pack, _UNTAGGED.pack
    request_len, more_len = _REQUEST.size - MPA_LENGTH_LEN, _UNTAGGED.size - MPA_LENGTH_LEN
    unpack_tagged, unpack_untagged = _TAGGED.unpack_from, _UNTAGGED.unpack_from
    unpack_read, unpack_rid = _READ_REQUEST.unpack_from, _U64.unpack_from
    tag_at, send, read_queue = _TAGGED.size, QueueNumber.SEND, QueueNumber.READ_REQUEST
    msn = 1
    done = placed = start = end = 0

    def request(out: list[Any], w: int) -> None:
        """Append the FPDUs of slot ``w``'s request."""
        nonlocal msn
        block = w * size
        if kind != STORE_INLINE:
            head = pack_request(request_len, _CTRL_LAST, _SEND, 0, send, msn, 0, KBTP_VERSION,
                opcode, flags, w, w, 0, 0, ARENA_STAG, block, size)  # fmt: skip
            out.append(_framed(head, crc))
        else:  # the Send of the request and the block (Data Descriptor: STag 0, TO 0)
            for at, stop, last, pad in inline_segs:
                ctrl = _CTRL_LAST if last else _CTRL
                if at == 0:
                    head = pack_request(request_len + stop, ctrl, _SEND, 0, send, msn, 0,
                        KBTP_VERSION, opcode, flags, w, w, 0, 0, 0, 0, size)  # fmt: skip
                else:
                    mo = _KBTP_REQUEST.size + at
                    head = pack_untagged(more_len + stop - at, ctrl, _SEND, 0, send, msn, mo)
                _append(out, head, source[block + at : block + stop], pad, crc)
        msn += 1

    out: list[Any] = []
    for w in range(slots):
        request(out, w)
    await send_pieces(sock, out)
    issued = slots
    while done < iters:
        n = await recv(sock, view[end : end + read])
        if not n:
            raise FloorError("the floor target closed the connection early")
        end += n
        pos = start
        out = []
        queued = 0
        while end - pos >= MPA_LENGTH_LEN:
            length = buf[pos] << 8 | buf[pos + 1]
            wire = fpdu_wire(length)
            if end - pos < wire:
                if wire > frame:
                    raise FloorError(f"an FPDU of {wire} octets, more than the MULPDU")
                break
            if crc and crc32c(view[pos : pos + wire]) != MPA_CRC_RESIDUE:
                raise FloorError("CRC mismatch at the initiator")
            if buf[pos + MPA_LENGTH_LEN] & DDP_TAGGED:  # an RDMA Write segment: place it
                to = unpack_tagged(buf, pos)[_TO]
                data = length - TAGGED_HDR.size
                arena[to : to + data] = view[pos + tag_at : pos + tag_at + data]
                placed += data
            elif unpack_untagged(buf, pos)[_QN] == read_queue:  # a Read Request: respond
                sink_stag, sink_to, want, _stag, src_to = unpack_read(buf, pos)[_MO + 1 :]
                segs = response_segs if want == size else _segments(want, mulpdu, TAGGED_HDR.size)
                _tagged(out, segs, response_op, sink_stag, sink_to, source[src_to:], crc)
                queued += want
            else:  # a COMPLETION: its slot's next request
                done += 1
                if issued < iters:
                    request(out, unpack_rid(buf, pos + _RID_AT)[0])
                    issued += 1
            pos += wire
            if queued >= FLUSH:
                await send_pieces(sock, out)
                out, queued = [], 0
        if out:
            await send_pieces(sock, out)
        start, end = keep_partial(view, pos, end, frame)
    return placed


# ------------------------------------------------------------------------ target process
@asynccontextmanager
async def floor_target(in_process: bool = False, cpu: int | None = None) -> AsyncIterator[int]:
    """A floor target for the block, its port yielded: a process of its own
    (:func:`floor_process`, on ``cpu`` only if given), or ``in_process`` a task of this one."""
    if not in_process:
        async with floor_process(cpu) as port:
            yield port
        return
    listener = trio.socket.socket()
    try:
        await listener.bind(("127.0.0.1", 0))
        listener.listen()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(serve_floor, listener)
            yield listener.getsockname()[1]
            nursery.cancel_scope.cancel()
    finally:
        listener.close()


@asynccontextmanager
async def floor_process(cpu: int | None = None) -> AsyncIterator[int]:
    """Start the floor target (``python -m kbtp.cli.bench_floor [CPU]``: on CPU only, if
    given) and yield its port; it ends when the block is left (its standard input closed;
    killed after 10 s)."""
    argv = [sys.executable, "-m", "kbtp.cli.bench_floor", *([] if cpu is None else [str(cpu)])]
    async with port_process(argv, "the floor target", 1) as (port,):
        yield port


async def _serve_until_stdin_ends() -> None:
    async with floor_target(in_process=True) as port:
        print(f"PORT {port}", flush=True)
        async with trio.lowlevel.FdStream(os.dup(sys.stdin.fileno())) as stdin:
            while await stdin.receive_some(4096):
                pass


def main(argv: list[str] | None = None) -> int:
    """``python -m kbtp.cli.bench_floor [CPU]``: the floor target, until standard input
    ends (on CPU only, if given)."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) > 1 or not all(a.isdigit() for a in args):
        print("usage: python -m kbtp.cli.bench_floor [CPU]", file=sys.stderr)
        return 2
    try:
        if args:
            pin_to(int(args[0]))
        trio.run(_serve_until_stdin_ends)
    except OSError as exc:
        print(f"kbtp bench floor target: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
