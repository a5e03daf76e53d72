"""What the 64 B Read round trip's work costs when it is not spread over the layers.

``python -m tools.fused_sketch [--iters 20000] [--repeat 3] [--json]``

A timing sketch, never a path the stack takes: it makes the round trip's three parts in one
function each, with the checks the engines make for this exact case, on the memory and STag
tables of real QPs, and times them against the engines doing the same parts
(:class:`tools.engine_rtt.EngineRoundTrip`'s halves, split at the same points):

``post``      the client: the SGE checked (lkey, PD, LOCAL_WRITE, bounds), ORD, the MSN of
              QN 1 taken, the Read Request's DDP and RDMAP headers packed as one record,
              the CRC; the request remembered (sink, STag, TO, size, WR ID);
``answer``    the server: the CRC, the DDP and RDMAP headers exact (L, version, RDMAP
              control, QN 1, MO 0, the expected MSN), IRD, the source STag (valid, PD,
              stream, REMOTE_READ, wrap, bounds), the Read Response's tagged header and
              CRC around a view of the source;
``complete``  the client: the CRC, the tagged header exact and matching the oldest
              outstanding Read (Sink STag, TO, size), the payload placed in the sink, the
              completion pushed.

The sketch's Request and Response are checked to be byte for byte the engines' own, and
its completion to carry the same WR ID, status, opcode and length.  What it leaves out is
what makes the engines general: any other message or state (queued output ahead of the
answer, Read Responses still viewing memory, markers, chains, Terminate, a peer's FIN), for
which an exact-case path would hand over to the layers.  So the figures bound what an
exact-case fast path of the one-segment messages could save, not what one would cost.
"""

from __future__ import annotations

import argparse
import json
import struct
import sys
import time
from collections import deque
from collections.abc import Callable

from stack.constants import (
    ALL_ONES_32,
    ALL_ONES_64,
    DDP_LAST,
    DDP_TAGGED,
    DDP_TAGGED_HDR_LEN,
    DDP_VERSION,
    MPA_LENGTH_LEN,
    Opcode,
)
from stack.crc import crc32c
from stack.rnic import Access
from stack.rnic.memory import MemoryRegion
from stack.rnic.verbs import SendWR, WcOpcode, WcStatus, WorkCompletion
from stack.wire import ddp
from stack.wire.headers import READ_REQUEST
from stack.wire.rdmap import rdmap_ctrl

if __package__:
    from tools.engine_rtt import EngineRoundTrip
else:  # run as a file
    from engine_rtt import EngineRoundTrip  # type: ignore[no-redef]

_REQUEST = struct.Struct(
    ">H" + ddp.UNTAGGED_HDR.format.lstrip(">") + READ_REQUEST.format.lstrip(">")
)
"""The Read Request FPDU's length field, DDP untagged header and RDMAP header, one record."""
_RESPONSE_HEAD = struct.Struct(">H" + ddp.TAGGED_HDR.format.lstrip(">"))
"""A Read Response FPDU's length field and DDP tagged header."""
_CRC = struct.Struct("<I")
_DDP_LAST_V1 = DDP_LAST | DDP_VERSION  # untagged, L
_DDP_TAGGED_LAST_V1 = DDP_TAGGED | DDP_LAST | DDP_VERSION
_REQUEST_CTRL = rdmap_ctrl(Opcode.RDMA_READ_REQUEST)
_RESPONSE_CTRL = rdmap_ctrl(Opcode.RDMA_READ_RESPONSE)
_ULPDU_LEN = _REQUEST.size - MPA_LENGTH_LEN
_PAYLOAD_AT = MPA_LENGTH_LEN + DDP_TAGGED_HDR_LEN  # a Read Response's payload in its FPDU


class Sketch:
    """The three parts of one Read round trip, each one function, on ``ends``' QPs."""

    def __init__(self, ends: EngineRoundTrip) -> None:
        client, server = ends.client_qp, ends.server_qp
        self._client_table, self._client_pd = client.table, client.pd
        self._server_table, self._server_pd = server.table, server.pd
        self._cq = ends.cq
        self._qp_num = client.qp_num
        self._ord, self._ird = client.ord, server.ird
        self._tx_msn = 1  # the client's next MSN on QN 1
        self._rx_msn = 1  # the server's expected MSN on QN 1
        self._outstanding: deque[tuple[int, int, int, memoryview, int]] = deque()

    def post(self, wr: SendWR, out: bytearray) -> None:
        """The client posts ``wr`` (a 64 B Read); its Request FPDU goes to ``out``."""
        if len(self._outstanding) >= self._ord:
            raise ValueError("beyond ORD")
        (sge,) = wr.sg_list
        mr = self._client_table.lookup(sge.lkey)
        if (
            not isinstance(mr, MemoryRegion)
            or not mr.valid
            or mr.pd is not self._client_pd
            or not mr.access_bits & Access.LOCAL_WRITE
        ):
            raise ValueError("bad lkey")
        if sge.length < 0 or sge.addr < mr.base or sge.addr + sge.length > mr.base + mr.length:
            raise ValueError("SGE outside its region")
        msn = self._tx_msn
        self._tx_msn = (msn + 1) & ALL_ONES_32
        fpdu = _REQUEST.pack(
            _ULPDU_LEN, _DDP_LAST_V1, _REQUEST_CTRL, 0, 1, msn, 0,
            mr.stag, sge.addr, sge.length, wr.rkey, wr.remote_addr,
        )  # fmt: skip
        out += fpdu
        out += _CRC.pack(crc32c(fpdu))
        sink = mr.view(sge.addr, sge.length)
        self._outstanding.append((mr.stag, sge.addr, sge.length, sink, wr.wr_id))

    def answer(self, fpdu: memoryview, out: bytearray) -> None:
        """The server checks the Request ``fpdu`` and puts its Response FPDU in ``out``."""
        end = len(fpdu) - 4
        if end != _REQUEST.size or _CRC.unpack_from(fpdu, end)[0] != crc32c(fpdu[:end]):
            raise ValueError("not a Read Request FPDU, or its CRC is bad")
        (length, ddp_ctrl, ctrl, inval, qn, msn, mo, sink_stag, sink_to, size, stag, to) = (
            _REQUEST.unpack_from(fpdu)
        )
        if (
            length != _ULPDU_LEN
            or ddp_ctrl != _DDP_LAST_V1
            or ctrl != _REQUEST_CTRL
            or inval
            or qn != 1
            or mo
            or msn != self._rx_msn
        ):
            raise ValueError("not the expected Read Request")
        if self._ird < 1:
            raise ValueError("beyond IRD")
        mr = self._server_table.lookup(stag)
        if (
            mr is None
            or not mr.valid
            or mr.pd is not self._server_pd
            or mr.stream is not None
            or not mr.access_bits & Access.REMOTE_READ
            or to + size > ALL_ONES_64
            or to < mr.base
            or to + size > mr.base + mr.length
        ):
            raise ValueError("the source STag refuses the Read")
        self._rx_msn = (msn + 1) & ALL_ONES_32
        data = mr.view(to, size)
        head = _RESPONSE_HEAD.pack(
            DDP_TAGGED_HDR_LEN + size, _DDP_TAGGED_LAST_V1, _RESPONSE_CTRL, sink_stag, sink_to
        )
        out += head
        out += data
        out += _CRC.pack(crc32c(data, crc32c(head)))

    def complete(self, fpdu: memoryview) -> None:
        """The client places the Response ``fpdu`` and completes its Read."""
        end = len(fpdu) - 4
        if _CRC.unpack_from(fpdu, end)[0] != crc32c(fpdu[:end]):
            raise ValueError("bad CRC")
        length, ddp_ctrl, ctrl, stag, to = _RESPONSE_HEAD.unpack_from(fpdu)
        size = length - DDP_TAGGED_HDR_LEN
        want_stag, want_to, want_size, sink, wr_id = self._outstanding[0]
        if (
            ddp_ctrl != _DDP_TAGGED_LAST_V1
            or ctrl != _RESPONSE_CTRL
            or stag != want_stag
            or to != want_to
            or size != want_size
            or end != _PAYLOAD_AT + size
        ):
            raise ValueError("not the Response of the oldest Read")
        self._outstanding.popleft()
        sink[:] = fpdu[_PAYLOAD_AT:end]
        self._cq.push(
            WorkCompletion(wr_id, WcStatus.SUCCESS, WcOpcode.RDMA_READ, self._qp_num, size)
        )


class SketchRoundTrip:
    """:class:`tools.engine_rtt.EngineRoundTrip`'s parts done by a :class:`Sketch` on a
    fresh pair of ends, for ``python -m tools.engine_rtt --kinds read-sketch``."""

    def __init__(self) -> None:
        self._ends = EngineRoundTrip("read")
        self._sketch = Sketch(self._ends)

    def post(self) -> memoryview:
        out = bytearray()
        self._sketch.post(self._ends.wr, out)
        return memoryview(out)

    def server_turn(self, request: memoryview) -> memoryview:
        out = bytearray()
        self._sketch.answer(request, out)
        return memoryview(out)

    def complete(self, answer: memoryview) -> None:
        self._sketch.complete(answer)
        self._ends.cq.poll(1)

    def client_turn(self, answer: memoryview) -> memoryview:
        self.complete(answer)
        return self.post()


def check_against_engines() -> None:
    """The sketch's Request, Response and completion are the engines' own (ValueError
    otherwise): the first Read of a fresh pair of ends, made by both on the same QPs (the
    sketch keeps its own sequence numbers and outstanding Reads)."""
    ends = EngineRoundTrip("read")
    sketch = Sketch(ends)
    mine = bytearray()
    sketch.post(ends.wr, mine)
    request = bytes(ends.post())
    if bytes(mine) != request:
        raise ValueError("the sketch's Read Request is not the engines'")
    mine_answer = bytearray()
    sketch.answer(memoryview(bytearray(request)), mine_answer)
    answer = bytes(ends.server_turn(memoryview(bytearray(request))))
    if bytes(mine_answer) != answer:
        raise ValueError("the sketch's Read Response is not the engines'")
    theirs = _completion_of(ends, lambda: ends._client.feed(memoryview(bytearray(answer))))
    ours = _completion_of(ends, lambda: sketch.complete(memoryview(mine_answer)))
    if theirs != ours:
        raise ValueError(f"completions differ: {theirs} against {ours}")


def _completion_of(ends: EngineRoundTrip, place: Callable[[], object]) -> tuple[object, ...]:
    place()
    (wc,) = ends.cq.poll(1)
    return wc.wr_id, wc.status, wc.opcode, wc.byte_len


def measure(iters: int, repeat: int) -> dict[str, dict[str, float]]:
    """µs per call of each part, layered (the engines) and sketched, medians of
    ``repeat`` runs of ``iters`` round trips."""
    check_against_engines()
    runs: dict[str, list[float]] = {}
    for _ in range(repeat):
        for name, seconds in _layered(iters).items():
            runs.setdefault(f"layered-{name}", []).append(seconds)
        for name, seconds in _sketched(iters).items():
            runs.setdefault(f"sketch-{name}", []).append(seconds)
    med = {k: sorted(v)[len(v) // 2] * 1e6 for k, v in runs.items()}
    out = {}
    for part in ("post", "answer", "complete", "total"):
        layered, sketch = med[f"layered-{part}"], med[f"sketch-{part}"]
        out[part] = {"layered_us": layered, "sketch_us": sketch, "ratio": layered / sketch}
    return out


def _layered(n: int) -> dict[str, float]:
    ends = EngineRoundTrip("read")
    return _timed(n, ends.post, ends.server_turn, ends.complete)


def _sketched(n: int) -> dict[str, float]:
    trip = SketchRoundTrip()
    return _timed(n, trip.post, trip.server_turn, trip.complete)


def _timed(
    n: int,
    post: Callable[[], memoryview],
    answer: Callable[[memoryview], memoryview],
    complete: Callable[[memoryview], None],
) -> dict[str, float]:
    """Seconds per call of each part over ``n`` round trips (after 200 untimed)."""
    clock = time.perf_counter
    spent = dict.fromkeys(("post", "answer", "complete"), 0.0)
    for i in range(n + 200):
        t0 = clock()
        request = post()
        t1 = clock()
        reply = answer(request)
        t2 = clock()
        complete(reply)
        t3 = clock()
        if i >= 200:
            spent["post"] += t1 - t0
            spent["answer"] += t2 - t1
            spent["complete"] += t3 - t2
    out = {k: v / n for k, v in spent.items()}
    out["total"] = sum(out.values())
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.fused_sketch", description=__doc__)
    parser.add_argument("--iters", type=int, default=20000, help="round trips per run")
    parser.add_argument("--repeat", type=int, default=3, help="runs")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args(argv)
    if args.iters < 1 or args.repeat < 1:
        parser.error("--iters and --repeat must be at least 1")
    figures = measure(args.iters, args.repeat)
    if args.json:
        print(json.dumps(figures))
        return 0
    print(f"{'part':<10}{'layered µs':>12}{'sketch µs':>12}{'ratio':>8}")
    for part, row in figures.items():
        print(f"{part:<10}{row['layered_us']:>12.2f}{row['sketch_us']:>12.2f}{row['ratio']:>8.1f}")
    print("the 64 B Read round trip's work, hot, one process; sketch: one function per part")
    return 0


__all__ = ["Sketch", "SketchRoundTrip", "check_against_engines", "measure"]

if __name__ == "__main__":
    sys.exit(main())
