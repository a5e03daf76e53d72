"""Scatter-gather sends: the send queue's partial sends and EAGAIN, and the driver over a
socket that takes a few bytes at a time (MPA-01 framing unchanged, RFC 5040 §5.5 memory)."""

from __future__ import annotations

import random
import socket
from collections.abc import Sequence
from typing import TypedDict

import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st

from stack.constants import IOV_MAX, TCP_NOTSENT_LOWAT_BULK
from stack.rnic import Access, SendWR, WcStatus, WrOpcode
from stack.rnic.endpoint import MAX_COALESCE
from stack.transport import driver
from stack.transport.sendq import SendQueue
from stack.transport.sockopts import limit_unsent
from stack.wire.events import MpaSettings
from stack.wire.framing import FpduDeframer
from tests.e2e.helpers import tcp_pair

Buffer = bytes | bytearray | memoryview


class _Remote(TypedDict):
    """The remote buffer of an RDMA Write or Read (``SendWR`` keywords)."""

    rkey: int
    remote_addr: int


class FakeSocket:
    """Takes at most ``takes[i]`` bytes on the i-th call (0: EAGAIN), then everything."""

    def __init__(self, takes: list[int]) -> None:
        self.takes = list(takes)
        self.wire = bytearray()
        self.calls: list[int] = []

    def sendmsg(self, pieces: Sequence[Buffer]) -> int:
        assert len(pieces) <= IOV_MAX
        self.calls.append(len(pieces))
        data = b"".join(pieces)
        limit = self.takes.pop(0) if self.takes else len(data)
        if not limit and data:
            raise BlockingIOError
        self.wire += data[:limit]
        return min(limit, len(data))


@settings(max_examples=200, deadline=None)
@given(
    sizes=st.lists(st.integers(0, 300), min_size=1, max_size=40),
    takes=st.lists(st.integers(0, 500), max_size=20),
)
def test_send_queue_keeps_order_under_partial_sends_and_eagain(
    sizes: list[int], takes: list[int]
) -> None:
    sock = FakeSocket(takes)
    queue = SendQueue(sock.sendmsg)
    expected = bytearray()
    memories: list[bytearray] = []
    for k, size in enumerate(sizes):
        memory = bytearray(random.Random(k).randbytes(size))
        memories.append(memory)
        expected += memory
        queue.send([b"h", memoryview(memory)])
        expected[len(expected) - size : len(expected) - size] = b"h"
        memory[:] = bytes(size)  # the memory changes once the call returned
        if k % 3 == 0:
            queue.send_backlog()
    while not queue.send_backlog():
        pass
    assert bytes(sock.wire) == bytes(expected)
    assert queue.sent == len(expected)


def test_send_queue_splits_iovecs_at_iov_max() -> None:
    sock = FakeSocket([])
    queue = SendQueue(sock.sendmsg)
    pieces: list[Buffer] = [bytes([k % 256]) for k in range(2 * IOV_MAX + 5)]
    assert queue.send(pieces)
    assert sock.calls == [IOV_MAX, IOV_MAX, 5]
    assert bytes(sock.wire) == b"".join(pieces)


def test_send_queue_passes_socket_errors_on() -> None:
    def broken(pieces: Sequence[Buffer]) -> int:
        raise BrokenPipeError

    with pytest.raises(BrokenPipeError):
        SendQueue(broken).send([b"x"])


class TrickleSocket:
    """A real socket whose ``sendmsg`` takes only part of each iovec or none (EAGAIN)."""

    def __init__(self, sock: socket.socket, seed: int) -> None:
        self.sock = sock
        self.rng = random.Random(seed)

    def sendmsg(self, pieces: Sequence[Buffer]) -> int:
        total = sum(len(p) for p in pieces)
        roll = self.rng.random()
        if roll < 0.2:
            raise BlockingIOError
        limit = total if roll > 0.8 else self.rng.randint(1, max(1, total))
        data = b"".join(pieces)[:limit]
        return self.sock.send(data)

    def recv(self, size: int) -> bytes:
        return self.sock.recv(size)

    def recv_into(self, buffer: memoryview) -> int:
        return self.sock.recv_into(buffer)

    def fileno(self) -> int:
        return self.sock.fileno()

    def getsockopt(self, level: int, option: int, size: int = 0) -> int | bytes:
        return (
            self.sock.getsockopt(level, option, size)
            if size
            else self.sock.getsockopt(level, option)
        )

    def detach(self) -> int:
        return self.sock.detach()


def trickle_sockets(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every connection the driver makes from now on sends through a :class:`TrickleSocket`
    (seeded 0, 1, 2, ... in the order they are made)."""
    seeds = iter(range(1_000_000))
    real = driver._raw_socket

    def trickle(stream: trio.abc.Stream) -> TrickleSocket | None:
        sock = real(stream)
        return None if sock is None else TrickleSocket(sock, next(seeds))

    monkeypatch.setattr(driver, "_raw_socket", trickle)


@pytest.mark.parametrize("markers", [False, True])
async def test_partial_sends_deliver_what_was_posted_not_what_memory_became(
    monkeypatch: pytest.MonkeyPatch, markers: bool
) -> None:
    """Writes of 200 KiB through a socket taking random parts: the target holds the source
    bytes as posted, although the source is overwritten as soon as each Write completes."""
    trickle_sockets(monkeypatch)
    settings = MpaSettings(want_markers=markers)
    async with tcp_pair(settings, settings) as (client, server):
        size = 200 * 1024
        target = server.mr(4 * size, Access.LOCAL_WRITE | Access.REMOTE_WRITE | Access.REMOTE_READ)
        src = client.mr(size)
        expected = bytearray()
        for k in range(4):
            pattern = random.Random(k).randbytes(size)
            src.buf[:] = pattern
            expected += pattern
            client.qp.post_send(
                SendWR(
                    k,
                    WrOpcode.RDMA_WRITE,
                    (client.sge(src),),
                    rkey=target.rkey,
                    remote_addr=target.base + k * size,
                )
            )
            with trio.fail_after(20):
                wc = await client.cq.next()
            assert wc.status is WcStatus.SUCCESS
            src.buf[:] = bytes(size)  # reuse the buffer at once, as a completion allows
        sink = client.mr(4 * size)
        client.qp.post_send(
            SendWR(
                9,
                WrOpcode.RDMA_READ,
                (client.sge(sink),),
                rkey=target.rkey,
                remote_addr=target.base,
            )
        )
        with trio.fail_after(20):
            wc = await client.cq.next()
        assert wc.status is WcStatus.SUCCESS
        assert bytes(target.buf) == bytes(expected)
        assert bytes(sink.buf) == bytes(expected)


@pytest.mark.skipif(not hasattr(socket, "TCP_NOTSENT_LOWAT"), reason="no TCP_NOTSENT_LOWAT")
async def test_connections_queue_a_whole_send_pass_not_trios_16_kib() -> None:
    """trio's streams limit unsent data to 16 KiB (a sendmsg and a writable wait per 16 KiB
    of a bulk send); the driver's sockets, both ends, take a whole send pass (1 MiB)."""
    option = socket.TCP_NOTSENT_LOWAT
    async with tcp_pair() as (client, server):
        source = server.mr(64, Access.LOCAL_WRITE | Access.REMOTE_READ)
        sink = client.sge(client.mr(64))
        wr = SendWR(1, WrOpcode.RDMA_READ, (sink,), rkey=source.rkey, remote_addr=source.base)
        client.qp.post_send(wr)  # a Read answered: both pumps have started
        with trio.fail_after(10):
            assert (await client.cq.next()).status is WcStatus.SUCCESS
        for host in (client, server):
            assert host.conn is not None
            trio_sock = host.conn.stream.socket  # type: ignore[attr-defined]
            assert trio_sock.getsockopt(socket.IPPROTO_TCP, option) == TCP_NOTSENT_LOWAT_BULK
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        async with (
            listeners[0],
            await trio.open_tcp_stream("127.0.0.1", listeners[0].socket.getsockname()[1]) as plain,
        ):
            assert plain.socket.getsockopt(socket.IPPROTO_TCP, option) == 16384  # trio's
            limit_unsent(plain)
            assert plain.socket.getsockopt(socket.IPPROTO_TCP, option) == TCP_NOTSENT_LOWAT_BULK


class CountingSocket(TrickleSocket):
    """A real socket that counts its ``sendmsg`` calls and sends everything."""

    def __init__(self, sock: socket.socket) -> None:
        super().__init__(sock, 0)
        self.sendmsgs = 0

    def sendmsg(self, pieces: Sequence[Buffer]) -> int:
        self.sendmsgs += 1
        return self.sock.sendmsg(pieces)


async def test_a_burst_of_posts_leaves_in_one_send_after_the_first(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The first post of a task step is sent at once, from the posting task (no wake-up:
    latency); the posts after it in the same step wait for the writer, which sends them all
    in one ``sendmsg`` once the task yields (what a post list would do).  Once the driver's
    reader has run, the next post is sent at once again."""
    made: list[CountingSocket] = []
    real = driver._raw_socket

    def counting(stream: trio.abc.Stream) -> CountingSocket | None:
        sock = real(stream)
        if sock is None:
            return None
        made.append(CountingSocket(sock))
        return made[-1]

    monkeypatch.setattr(driver, "_raw_socket", counting)
    async with tcp_pair() as (client, server):
        target = server.mr(4096, Access.LOCAL_WRITE | Access.REMOTE_WRITE | Access.REMOTE_READ)
        src = client.mr(64)
        src.buf[:] = bytes(range(64))
        sink = client.mr(64)
        read = SendWR(
            99, WrOpcode.RDMA_READ, (client.sge(sink),), rkey=target.rkey, remote_addr=target.base
        )
        client.qp.post_send(read)  # both pumps have started once it is answered
        with trio.fail_after(10):
            assert (await client.cq.next()).status is WcStatus.SUCCESS
        (sock,) = [s for s in made if s.sock.fileno() == client.conn.stream.socket.fileno()]  # type: ignore[union-attr]

        def write(k: int) -> SendWR:
            return SendWR(
                k,
                WrOpcode.RDMA_WRITE,
                (client.sge(src),),
                rkey=target.rkey,
                remote_addr=target.base + 64 * k,
            )

        before = sock.sendmsgs
        client.qp.post_send(write(0))
        assert sock.sendmsgs == before + 1  # at once, before the task yields
        for k in range(1, 21):
            client.qp.post_send(write(k))
        assert sock.sendmsgs == before + 1  # the rest waits for the task to yield
        with trio.fail_after(10):
            done = [await client.cq.next() for _ in range(21)]
        assert [wc.wr_id for wc in done] == list(range(21))
        assert sock.sendmsgs == before + 2  # the 20 in one send
        client.qp.post_send(read)
        with trio.fail_after(10):
            assert (await client.cq.next()).status is WcStatus.SUCCESS
        assert bytes(target.buf[: 21 * 64]) == bytes(range(64)) * 21
        sent = sock.sendmsgs
        client.qp.post_send(write(30))  # the reader ran since: at once again
        assert sock.sendmsgs == sent + 1


class InboundTap:
    """Records what the connection read from its socket."""

    def __init__(self) -> None:
        self.inbound = bytearray()

    def record(self, outbound: bool, data: bytes | bytearray | memoryview) -> None:
        if not outbound:
            self.inbound += data


async def test_partial_fpdus_read_again_are_recorded_once() -> None:
    """A partial FPDU at the end of a read is parsed again at the front of the next (no
    copy); the capture tap still records each received byte once: the recorded stream
    deframes into exactly the Read Responses' FPDUs."""
    taps: list[InboundTap] = []

    def factory(stream: trio.abc.Stream, active: bool) -> InboundTap:
        taps.append(InboundTap())
        return taps[-1]

    size = 3 << 20
    async with tcp_pair(tap_factory=factory) as (client, server):
        source = server.mr(size, Access.LOCAL_WRITE | Access.REMOTE_READ)
        source.buf[:] = random.Random(5).randbytes(size)
        sink = client.mr(size)
        wr = SendWR(1, WrOpcode.RDMA_READ, (client.sge(sink),), rkey=source.rkey,
                    remote_addr=source.base)  # fmt: skip
        client.qp.post_send(wr)
        with trio.fail_after(20):
            assert (await client.cq.next()).status is WcStatus.SUCCESS
        assert bytes(sink.buf) == bytes(source.buf)
    (tap,) = taps
    reply = 20 + int.from_bytes(tap.inbound[18:20], "big")  # the MPA Reply, then FPDUs
    deframer = FpduDeframer(crc=True)
    deframer.feed(bytes(tap.inbound[reply:]))
    payload = b"".join(bytes(ulpdu[14:]) for ulpdu in deframer)  # tagged DDP header: 14
    assert deframer.pending == 0 and payload == bytes(source.buf)


@pytest.mark.parametrize("markers", [False, True])
async def test_a_large_write_through_a_trickling_socket_keeps_at_most_a_pass_unsent(
    monkeypatch: pytest.MonkeyPatch, markers: bool
) -> None:
    """A 5 MiB Write leaves in parts of a send pass: what the socket does not take is copied
    (the backlog), but never more than about one pass of it, where the whole unsent rest of
    the message used to be copied; the target gets the bytes as posted."""
    trickle_sockets(monkeypatch)
    most = [0]
    send = SendQueue.send

    def recorded(self: SendQueue, pieces: list[Buffer]) -> bool:
        done = send(self, pieces)
        most[0] = max(most[0], self.backlog)
        return done

    monkeypatch.setattr(SendQueue, "send", recorded)
    settings = MpaSettings(want_markers=markers)
    async with tcp_pair(settings, settings) as (client, server):
        size = 5 * MAX_COALESCE + 777
        target = server.mr(size, Access.LOCAL_WRITE | Access.REMOTE_WRITE | Access.REMOTE_READ)
        pattern = random.Random(7).randbytes(size)
        src, sink = client.mr(pattern), client.mr(size)
        for op, local in ((WrOpcode.RDMA_WRITE, src), (WrOpcode.RDMA_READ, sink)):
            at: _Remote = {"rkey": target.rkey, "remote_addr": target.base}
            client.qp.post_send(SendWR(1, op, (client.sge(local),), **at))
            with trio.fail_after(60):
                assert (await client.cq.next()).status is WcStatus.SUCCESS
            src.buf[:] = bytes(size)  # reusable once complete: the rest must not show it
        assert bytes(target.buf) == pattern
        assert bytes(sink.buf) == pattern
    assert 0 < most[0] <= MAX_COALESCE * 1.05


@pytest.mark.parametrize("size", [16 << 20, 64 << 20])
async def test_two_ends_reading_large_regions_of_each_other_then_writing_both_finish(
    size: int,
) -> None:
    """Each end Reads a large region of the other and then Writes to it: each responder gets
    a Write while its large Read Response is going out in parts.  The rest of the response
    is copied (RFC 5040 §5.5), not waited for: two ends that both stop reading until their
    responses are out would wait for each other for ever."""
    async with tcp_pair() as (a, b):
        remote = Access.LOCAL_WRITE | Access.REMOTE_WRITE | Access.REMOTE_READ
        regions = [a.mr(size, remote), b.mr(size, remote)]
        for k, region in enumerate(regions):
            region.buf[:] = bytes([k + 1]) * size
        sinks = [a.mr(size), b.mr(size)]
        for k, host in enumerate((a, b)):
            peer = regions[1 - k]
            at: _Remote = {"rkey": peer.rkey, "remote_addr": peer.base}
            host.qp.post_send(
                [
                    SendWR(1, WrOpcode.RDMA_READ, (host.sge(sinks[k]),), **at),
                    SendWR(2, WrOpcode.RDMA_WRITE, (host.sge(host.mr(b"\xff" * 64)),), **at),
                ]
            )
        with trio.fail_after(30):
            for host in (a, b):
                wcs = [await host.cq.next() for _ in range(2)]
                assert [(w.wr_id, w.status) for w in wcs] == [
                    (1, WcStatus.SUCCESS),
                    (2, WcStatus.SUCCESS),
                ]
        for k in range(2):
            assert bytes(sinks[k].buf) == bytes([2 - k]) * size  # the bytes before the Write
            assert bytes(regions[k].buf[:64]) == b"\xff" * 64


@pytest.mark.parametrize(("reads", "size"), [(8, 1 << 20), (4, 3 << 20)])
async def test_two_ends_stalled_on_each_others_reads_release_the_stall(
    reads: int, size: int
) -> None:
    """Each end Reads ``reads`` blocks from the other, then Writes to it: each responder has
    more than max_snapshot_bytes of responses queued when the Write arrives, and waits for
    them to go out before it reads again, as the other does.  Once none of its output has
    moved for STALL_RELEASE_AFTER, each copies them (up to max_stalled_snapshot_bytes) and
    applies the Write: both finish, each Read with the bytes from before the Write."""
    qp = {"ord": 16, "ird": 16}
    async with tcp_pair(client_qp=qp, server_qp=qp) as (a, b):
        remote = Access.LOCAL_WRITE | Access.REMOTE_WRITE | Access.REMOTE_READ
        regions = [a.mr(reads * size, remote), b.mr(reads * size, remote)]
        for k, region in enumerate(regions):
            region.buf[:] = bytes([k + 1]) * (reads * size)
        sinks = [a.mr(reads * size), b.mr(reads * size)]
        for k, host in enumerate((a, b)):
            peer = regions[1 - k]
            wrs = [
                SendWR(
                    i,
                    WrOpcode.RDMA_READ,
                    (host.sge(sinks[k], i * size, size),),
                    rkey=peer.rkey,
                    remote_addr=peer.base + i * size,
                )
                for i in range(reads)
            ]
            at: _Remote = {"rkey": peer.rkey, "remote_addr": peer.base}
            wrs.append(SendWR(99, WrOpcode.RDMA_WRITE, (host.sge(host.mr(b"\xff" * 64)),), **at))
            host.qp.post_send(wrs)
        with trio.fail_after(20):
            for host in (a, b):
                wcs = [await host.cq.next() for _ in range(reads + 1)]
                assert all(w.status is WcStatus.SUCCESS for w in wcs), wcs
        for k in range(2):
            assert bytes(sinks[k].buf) == bytes([2 - k]) * (reads * size)
            assert bytes(regions[k].buf[:64]) == b"\xff" * 64
