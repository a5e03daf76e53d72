"""perftest's latency runs (``ib_write_lat``, ``ib_read_lat``, ``ib_send_lat``) on one QP.

As perftest 4.5's ``run_iter_lat_write``, ``run_iter_lat`` and ``run_iter_lat_send``:

* Write: ping-pong.  Each side writes ``size`` bytes from the lower half of its buffer
  into the region the peer advertised, the last byte holding its send count (mod 256),
  and waits until the last byte of its own advertised region holds the peer's count.
  The server writes first; as an MPA responder sends no FPDU before it has received one
  (MPA-25, RFC 5044 §7.1.2 step 4), our client first Writes zero bytes (before the
  last sync, :func:`open_write_lat`).  perftest's client
  sends nothing first: in RFC 6581 peer-to-peer mode its RTR opens the way; without it the
  rule would leave both waiting, so after ``send_first_after`` seconds without an FPDU our
  server Writes first, as Linux siw's responder does (MPA-25 waived, and said so).
  Latency: half the time between two of our Writes.
* Send: ping-pong Sends, the client first; each side keeps receives posted (iWARP has no
  receiver-not-ready retry, so they are posted before the sync that starts the run).
* Read: the client Reads ``size`` bytes, one at a time; the server only waits.

``-D`` (Read only here) runs for that many seconds and reports the average and the
transactions per second.
"""

from __future__ import annotations

import time

import trio

from stack.bench.results import LatResult, latency_stats
from stack.peers.perftest.channel import check_wc
from stack.peers.perftest.options import DEFAULT_RX_SEND
from stack.peers.perftest.protocol import PerftestError
from stack.peers.perftest.side import DataQp, PerftestSide
from stack.rnic import RecvWR, SendFlags, SendWR, Sge, WrOpcode

FIRST_FPDU_POLL = 0.002
"""Seconds between looks at whether the client's first FPDU has come."""


def prepare_latency(side: PerftestSide, size: int) -> None:
    """Send: post the receives of this size's run before the sync that starts it."""
    if side.opts.test != "send":
        return
    d = side.data[0]
    d.received = 0
    depth = min(side.opts.iters, DEFAULT_RX_SEND)
    d.qp.post_recv([_recv_wr(d, size)] * depth)
    d.recvs_posted = depth


async def run_latency(side: PerftestSide, size: int) -> None:
    """One latency run of ``size``; the client (and both ping-pong sides) print the row."""
    o = side.opts
    if o.test == "read" and not side.active:
        return  # perftest's read_lat server waits at the closing sync
    await trio.sleep_until(side.data[0].established + o.first_fpdu_delay * side.active)
    if o.test == "read":
        result = await _read(side, size)
    elif o.test == "write":
        result = await _write(side, size)
    else:
        result = await _send(side, size)
    side.report(result)


def _recv_wr(d: DataQp, size: int) -> RecvWR:
    assert d.buf is not None
    return RecvWR(d.qp.qp_num, (Sge(d.buf.base, size, d.buf.lkey),))


def _stats(size: int, iters: int, posted: list[float], round_trip: bool) -> LatResult:
    """perftest's figures from the post times: deltas of consecutive posts (halved for a
    ping-pong); ``iterations`` is ``-n``."""
    factor = 2 if round_trip else 1
    deltas = [(b - a) / factor for a, b in zip(posted, posted[1:], strict=False)]
    r = latency_stats(size, deltas or [0.0])
    return LatResult(size, iters, r.t_min, r.t_max, r.t_typical, r.t_avg, r.t_stdev, r.p99, r.p999)


async def _completion(side: PerftestSide, d: DataQp, what: str) -> None:
    with trio.move_on_after(side.opts.timeout) as scope:
        wc = await d.send_cq.next()
    if scope.cancelled_caught:
        raise PerftestError(
            f"no completion of our {what} within {side.opts.timeout} s{_stalled_first(side)}"
        )
    check_wc(wc.status, what)


async def _read(side: PerftestSide, size: int) -> LatResult:
    o = side.opts
    d, peer = side.data[0], side.theirs[0]
    assert d.buf is not None
    wr = SendWR(
        0,
        WrOpcode.RDMA_READ,
        (Sge(d.buf.base, size, d.buf.lkey),),
        SendFlags.SIGNALED,
        rkey=peer.rkey,
        remote_addr=peer.vaddr,
    )
    posted: list[float] = []
    start = time.perf_counter()
    deadline = start + o.duration if o.duration is not None else None
    while len(posted) < o.iters if deadline is None else time.perf_counter() < deadline:
        posted.append(time.perf_counter())
        d.qp.post_send(wr)
        await _completion(side, d, "RDMA Read")
    end = time.perf_counter()
    if deadline is None:
        posted.append(end)
        return _stats(size, o.iters, posted, round_trip=False)
    count = max(1, len(posted))
    avg = (end - start) / count * 1e6
    return LatResult(size, count, avg, avg, avg, avg, 0.0, avg, avg)


async def _write(side: PerftestSide, size: int) -> LatResult:
    o = side.opts
    d, peer = side.data[0], side.theirs[0]
    assert d.buf is not None
    buf = d.buf.buf
    half = len(buf) // 2
    post_at, poll_at = size - 1, half + size - 1
    wr = SendWR(
        0,
        WrOpcode.RDMA_WRITE,
        (Sge(d.buf.base, size, d.buf.lkey),),
        SendFlags.SIGNALED,
        rkey=peer.rkey,
        remote_addr=peer.vaddr,
    )
    if not side.active:
        await _may_write_first(side, d)
    posted: list[float] = []
    received = 0
    for sent in range(1, o.iters + 1):
        if sent > 1 or side.active:  # the server writes first
            received += 1
            await _wait_byte(side, buf, poll_at, received & 0xFF)
        posted.append(time.perf_counter())
        buf[post_at] = sent & 0xFF
        d.qp.post_send(wr)
        await _completion(side, d, "RDMA Write")
    if not side.active:
        await _wait_byte(side, buf, poll_at, (received + 1) & 0xFF)  # the client's last
    return _stats(size, o.iters, posted, round_trip=True)


async def open_write_lat(side: PerftestSide) -> None:
    """``ib_write_lat`` client, once the server's pingpong_dest is known: the first FPDU on
    the data connection, a zero-length Write, before the syncs that start the run.

    MPA-25 (RFC 5044 §7.1.2 step 4) holds the server's FPDUs until it has received one, and
    the server writes first: this lets it start, and it is on the wire well before a
    perftest server (which sends anyway, as siw does) starts writing."""
    d, peer = side.data[0], side.theirs[0]
    await trio.sleep_until(d.established + side.opts.first_fpdu_delay)
    wr = SendWR(
        0, WrOpcode.RDMA_WRITE, (), SendFlags.SIGNALED, rkey=peer.rkey, remote_addr=peer.vaddr
    )
    await _open_write(side, d, wr)


async def _open_write(side: PerftestSide, d: DataQp, wr: SendWR) -> None:
    d.qp.post_send(wr)
    await _completion(side, d, "zero-length RDMA Write")


async def _may_write_first(side: PerftestSide, d: DataQp) -> None:
    """Server: wait ``send_first_after`` seconds for the client's first FPDU (MPA-25), then,
    without peer-to-peer mode, waive the rule as Linux siw does (module docstring)."""
    conn, after = d.conn, side.opts.send_first_after
    if conn is None or conn.negotiated is None or conn.negotiated.p2p or after is None:
        return  # P2P: the RTR releases our Writes; None: keep MPA-25
    deadline = trio.current_time() + after
    while conn.awaiting_first_fpdu and trio.current_time() < deadline:
        await trio.sleep(FIRST_FPDU_POLL)
    if conn.awaiting_first_fpdu and not conn.closed.is_set():
        side.say(
            f" Note: no FPDU from the client within {after:g} s and no RFC 6581 peer-to-peer"
            " mode: writing first, as Linux siw does (MPA-25 waived)"
        )
        conn.send_first()


def _stalled_first(side: PerftestSide) -> str:
    """Why a server waiting for the first Write gets none: MPA-25 holds ours (or '')."""
    d = side.data[0]
    if side.active or d.conn is None or not d.conn.awaiting_first_fpdu:
        return ""
    if d.conn.negotiated is not None and d.conn.negotiated.p2p:
        return ": the client negotiated RFC 6581 peer-to-peer mode but sent no RTR (ERC-09)"
    return (
        ": the client sent no FPDU and did not negotiate RFC 6581 peer-to-peer mode, so"
        " MPA-25 holds our first Write while it waits for it (--send-first-after never);"
        " run the client peer-to-peer (Linux siw: peer_to_peer=Y) or let us write first"
    )


async def _wait_byte(side: PerftestSide, buf: memoryview, index: int, value: int) -> None:
    """Spin (yielding to the connection) until ``buf[index] == value``, as perftest does."""
    seen, deadline = side.meter.received, trio.current_time() + side.opts.timeout
    while buf[index] != value:
        await trio.sleep(0)
        if side.meter.received != seen:
            seen, deadline = side.meter.received, trio.current_time() + side.opts.timeout
        elif trio.current_time() >= deadline:
            raise PerftestError(
                f"no RDMA Write from the peer within {side.opts.timeout} s{_stalled_first(side)}"
            )
        broken = side.broken()
        if broken:
            raise PerftestError(f"waiting for the peer's RDMA Write: {broken}")


async def _send(side: PerftestSide, size: int) -> LatResult:
    o = side.opts
    d = side.data[0]
    assert d.buf is not None
    wr = SendWR(0, WrOpcode.SEND, (Sge(d.buf.base, size, d.buf.lkey),), SendFlags.SIGNALED)
    posted: list[float] = []
    for _sent in range(o.iters):
        if not side.active or posted:  # the client sends first
            await _receive(side, d, size)
        posted.append(time.perf_counter())
        d.qp.post_send(wr)
        await _completion(side, d, "Send")
    if side.active:
        await _receive(side, d, size)  # the server's last
    return _stats(size, o.iters, posted, round_trip=True)


async def _receive(side: PerftestSide, d: DataQp, size: int) -> None:
    o = side.opts
    with trio.move_on_after(o.timeout) as scope:
        wc = await side.recv_cq.next()
    if scope.cancelled_caught:
        raise PerftestError(f"no Send from the peer within {o.timeout} s")
    check_wc(wc.status, "receive")
    d.received += 1
    if d.recvs_posted < o.iters:
        d.qp.post_recv(_recv_wr(d, size))
        d.recvs_posted += 1
