"""The blocking driver (stack.transport.blocking, blocking_cm) over real loopback TCP.

Against the trio stack in another process (tests.e2e.peer_process) and against itself in
another thread: every operation moves the right bytes, an orderly close leaves both QPs in
ERROR with nothing lost, protocol errors end in Terminate and flushed WRs, a pipeline of
large Reads whose responses fill both socket buffers completes (no deadlock), and a
listener survives a peer that sends garbage.
"""

from __future__ import annotations

import socket
import struct
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from stack.cli.iwarp import main as iwarp
from stack.errors import ConnectionTimeout
from stack.pcap import PcapWriter
from stack.rnic import Access, MemoryRegion, RecvWR, Rnic, SendWR, Sge, WcStatus, WrOpcode
from stack.rnic.qp import QpState
from stack.transport.blocking import BlockingConnection, ConnectionClosed
from stack.transport.blocking_cm import BlockingListener, connect
from stack.transport.cm import ConnectFailed, ConnectRejected
from stack.transport.sockopts import path_segment_size
from stack.transport.tap import socket_tap_factory
from stack.wire.connection import IwarpConnection
from stack.wire.events import Established, MpaSettings, NeedData, Role, Send, TerminateReceived
from tests.e2e.peer_process import ADVERT

REMOTE = Access.LOCAL_WRITE | Access.REMOTE_WRITE | Access.REMOTE_READ | Access.REMOTE_ATOMIC


class Side:
    """One end: an RNIC, a PD, a CQ and a QP."""

    def __init__(self, name: str, **qp_kw: object) -> None:
        self.rnic = Rnic(name)
        self.pd = self.rnic.alloc_pd()
        self.cq = self.rnic.create_cq(1024)
        self.qp = self.rnic.create_qp(self.pd, self.cq, **qp_kw)  # type: ignore[arg-type]

    def mr(self, data: int | bytes, access: Access = Access.LOCAL_WRITE) -> MemoryRegion:
        buf = bytearray(data) if isinstance(data, bytes) else bytearray(data)
        return self.pd.reg_mr(buf, access)


def sge(mr: MemoryRegion, offset: int = 0, length: int | None = None) -> Sge:
    return Sge(mr.base + offset, mr.length - offset if length is None else length, mr.lkey)


@pytest.fixture
def peer_port() -> Iterator[int]:
    """A trio peer in its own process (tests.e2e.peer_process): one connection, Sends echoed."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.e2e.peer_process"], stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None
        yield int(proc.stdout.readline().split()[1])
        assert proc.wait(20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_every_operation_against_the_trio_stack_in_another_process(peer_port: int) -> None:
    me = Side("blocking")
    conn = connect("127.0.0.1", peer_port, me.qp)
    stag, to, length = ADVERT.unpack(conn.negotiated.peer_private_data)
    assert length == 65536 and me.qp.state is QpState.RTS
    data = bytes(range(256)) * 200
    src, sink, result, reply = me.mr(data), me.mr(len(data)), me.mr(8), me.mr(64)
    me.qp.post_recv(RecvWR(100, (sge(reply),)))
    me.qp.post_send(
        [
            SendWR(1, WrOpcode.RDMA_WRITE, (sge(src),), rkey=stag, remote_addr=to),
            SendWR(2, WrOpcode.RDMA_READ, (sge(sink),), rkey=stag, remote_addr=to),
            SendWR(
                3,
                WrOpcode.ATOMIC_FETCH_AND_ADD,
                (sge(result),),
                rkey=stag,
                remote_addr=to + 40000,
                compare_add=41,
            ),
            SendWR(4, WrOpcode.SEND, inline_data=b"ping"),
        ]
    )
    wcs = [conn.next_completion(me.cq, timeout=20) for _ in range(5)]
    assert {wc.wr_id: wc.status for wc in wcs} == {i: WcStatus.SUCCESS for i in (1, 2, 3, 4, 100)}
    assert bytes(sink.buf) == data
    assert struct.unpack("<Q", result.buf)[0] == struct.unpack_from("<Q", data, 40000)[0]
    assert bytes(reply.buf[:4]) == b"gnip"
    # The FetchAdd added 41 where the Write put the data: read it back.
    check = me.mr(8)
    me.qp.post_send(SendWR(5, WrOpcode.RDMA_READ, (sge(check),), rkey=stag, remote_addr=to + 40000))
    assert conn.next_completion(me.cq, timeout=20).status is WcStatus.SUCCESS
    expected = (struct.unpack_from("<Q", data, 40000)[0] + 41) % (1 << 64)
    assert struct.unpack("<Q", check.buf)[0] == expected
    conn.disconnect(10)
    assert conn.closed and conn.error is None and me.qp.state is QpState.ERROR


def test_round_trips_one_at_a_time_each_answered_before_the_next(peer_port: int) -> None:
    me = Side("blocking")
    conn = connect("127.0.0.1", peer_port, me.qp)
    stag, to, _ = ADVERT.unpack(conn.negotiated.peer_private_data)
    src, sink = me.mr(8), me.mr(8)
    for i in range(200):
        src.buf[:8] = i.to_bytes(8, "little")
        me.qp.post_send(SendWR(i, WrOpcode.RDMA_WRITE, (sge(src),), rkey=stag, remote_addr=to))
        me.qp.post_send(SendWR(i, WrOpcode.RDMA_READ, (sge(sink),), rkey=stag, remote_addr=to))
        wcs = [conn.next_completion(me.cq, timeout=10) for _ in range(2)]
        assert [wc.status for wc in wcs] == [WcStatus.SUCCESS] * 2
        assert int.from_bytes(sink.buf, "little") == i  # the Read saw the Write before it
        assert not len(me.cq)
    conn.disconnect(10)


def serve_in_thread(
    listener: BlockingListener,
    serve: Callable[[BlockingConnection, Side], None],
    region_size: int = 1 << 20,
    **qp_kw: object,
) -> tuple[threading.Thread, list[BaseException]]:
    """Accept one connection in a thread, advertise a region (1 MiB), run ``serve``."""
    errors: list[BaseException] = []

    def run() -> None:
        try:
            side = Side("server", **qp_kw)
            region = side.mr(region_size, REMOTE)
            region.buf[:] = bytes(range(256)) * (region_size // 256)
            request = listener.get_request(timeout=20)
            assert request.private_data == b"hello"
            conn = request.accept(side.qp, ADVERT.pack(region.rkey, region.base, region.length))
            serve(conn, side)
        except BaseException as exc:  # reported by the test
            errors.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, errors


def answer_until_closed(conn: BlockingConnection, side: Side) -> None:
    while conn.progress(None):
        pass


def test_both_ends_blocking_a_pipeline_of_large_reads_fills_the_sockets() -> None:
    """64 Reads of 256 KiB, posted at once: the responses (16 MiB) outrun both socket
    buffers while the requester is still sending requests; both ends keep going."""
    with BlockingListener("127.0.0.1", 0) as listener:
        thread, errors = serve_in_thread(listener, answer_until_closed, ird=64)
        me = Side("client", ord=64)
        conn = connect("127.0.0.1", listener.port, me.qp, private_data=b"hello")
        stag, to, length = ADVERT.unpack(conn.negotiated.peer_private_data)
        chunk = 256 * 1024
        sink = me.mr(64 * chunk)
        me.qp.post_send(
            [
                SendWR(
                    i,
                    WrOpcode.RDMA_READ,
                    (sge(sink, i * chunk, chunk),),
                    rkey=stag,
                    remote_addr=to + (i % 4) * chunk,
                )
                for i in range(64)
            ]
        )
        wcs = [conn.next_completion(me.cq, timeout=30) for _ in range(64)]
        assert [wc.wr_id for wc in wcs] == list(range(64))
        assert all(wc.status is WcStatus.SUCCESS for wc in wcs)
        pattern = bytes(range(256)) * 1024
        assert all(bytes(sink.buf[i * chunk : (i + 1) * chunk]) == pattern for i in range(64))
        conn.disconnect(10)
        thread.join(10)
        assert not errors and not thread.is_alive()


def test_a_large_write_to_the_trio_stack_leaves_through_the_backlog(peer_port: int) -> None:
    me = Side("blocking")
    conn = connect("127.0.0.1", peer_port, me.qp)
    stag, to, length = ADVERT.unpack(conn.negotiated.peer_private_data)
    data = bytes(range(251)) * (length // 251)
    src, sink = me.mr(data), me.mr(len(data))
    wrs = [
        SendWR(i, WrOpcode.RDMA_WRITE, (sge(src),), rkey=stag, remote_addr=to) for i in range(64)
    ]
    me.qp.post_send(wrs)  # 4 MiB at once: more than the socket takes without waiting
    me.qp.post_send(SendWR(99, WrOpcode.RDMA_READ, (sge(sink),), rkey=stag, remote_addr=to))
    wcs = [conn.next_completion(me.cq, timeout=30) for _ in range(65)]
    assert [wc.wr_id for wc in wcs] == [*range(64), 99]
    assert all(wc.status is WcStatus.SUCCESS for wc in wcs) and bytes(sink.buf) == data
    conn.disconnect(10)


def test_both_ends_blocking_a_large_write_and_read_leave_in_parts() -> None:
    """A 6 MiB Write and a 6 MiB Read between two blocking ends: each message leaves a send
    pass at a time (MessagePart), and the bytes arrive as posted although the source is
    overwritten once the Write completes."""
    size = 6 << 20
    with BlockingListener("127.0.0.1", 0) as listener:
        thread, errors = serve_in_thread(listener, answer_until_closed, region_size=size)
        me = Side("client")
        conn = connect("127.0.0.1", listener.port, me.qp, private_data=b"hello")
        stag, to, length = ADVERT.unpack(conn.negotiated.peer_private_data)
        assert length == size
        data = bytes(range(7, 256)) * (size // 249) + bytes(size % 249)
        src, sink = me.mr(data), me.mr(size)
        me.qp.post_send(SendWR(1, WrOpcode.RDMA_WRITE, (sge(src),), rkey=stag, remote_addr=to))
        assert conn.next_completion(me.cq, timeout=30).status is WcStatus.SUCCESS
        src.buf[:] = bytes(size)
        me.qp.post_send(SendWR(2, WrOpcode.RDMA_READ, (sge(sink),), rkey=stag, remote_addr=to))
        assert conn.next_completion(me.cq, timeout=30).status is WcStatus.SUCCESS
        assert bytes(sink.buf) == data
        conn.disconnect(10)
        thread.join(10)
        assert not errors and not thread.is_alive()


def test_two_blocking_ends_stalled_on_each_others_reads_release_the_stall() -> None:
    """Each end Reads 8 MiB from the other in 1 MiB Reads, then Writes to it: each waits for
    its responses to go out before it reads again, as the other does, until none of its
    output has moved for STALL_RELEASE_AFTER; then it copies them and applies the Write."""
    reads, size = 8, 1 << 20
    with BlockingListener("127.0.0.1", 0) as listener:
        me = Side("client", ord=16, ird=16)
        mine = me.mr(bytes([1]) * (reads * size), REMOTE)
        served: list[bytes] = []

        def read_then_write(conn: BlockingConnection, side: Side) -> None:
            sink = side.mr(reads * size)
            side.qp.post_send(_reads_then_write(side, sink, mine.rkey, mine.base, reads, size))
            wcs = [conn.next_completion(side.cq, timeout=20) for _ in range(reads + 1)]
            assert all(wc.status is WcStatus.SUCCESS for wc in wcs), wcs
            served.append(bytes(sink.buf))
            answer_until_closed(conn, side)

        thread, errors = serve_in_thread(
            listener, read_then_write, region_size=reads * size, ord=16, ird=16
        )
        conn = connect("127.0.0.1", listener.port, me.qp, private_data=b"hello")
        stag, to, _length = ADVERT.unpack(conn.negotiated.peer_private_data)
        sink = me.mr(reads * size)
        me.qp.post_send(_reads_then_write(me, sink, stag, to, reads, size))
        wcs = [conn.next_completion(me.cq, timeout=20) for _ in range(reads + 1)]
        assert all(wc.status is WcStatus.SUCCESS for wc in wcs), wcs
        assert bytes(sink.buf) == (bytes(range(256)) * (size // 256)) * reads
        assert bytes(mine.buf[:64]) == b"\xff" * 64
        conn.disconnect(10)
        thread.join(20)
        assert not errors and not thread.is_alive()
        assert served == [bytes([1]) * (reads * size)]  # the bytes from before the Write


def _reads_then_write(
    side: Side, sink: MemoryRegion, rkey: int, addr: int, reads: int, size: int
) -> list[SendWR]:
    wrs = [
        SendWR(
            i,
            WrOpcode.RDMA_READ,
            (sge(sink, i * size, size),),
            rkey=rkey,
            remote_addr=addr + i * size,
        )
        for i in range(reads)
    ]
    source = side.mr(b"\xff" * 64)
    wrs.append(SendWR(99, WrOpcode.RDMA_WRITE, (sge(source),), rkey=rkey, remote_addr=addr))
    return wrs


def test_a_wrong_stag_is_a_terminate_and_flushes_what_follows() -> None:
    with BlockingListener("127.0.0.1", 0) as listener:
        thread, errors = serve_in_thread(listener, answer_until_closed)
        me = Side("client")
        conn = connect("127.0.0.1", listener.port, me.qp, private_data=b"hello")
        stag, to, _ = ADVERT.unpack(conn.negotiated.peer_private_data)
        sink = me.mr(64)
        me.qp.post_send(
            [
                SendWR(1, WrOpcode.RDMA_READ, (sge(sink),), rkey=stag ^ 0x100, remote_addr=to),
                SendWR(2, WrOpcode.RDMA_READ, (sge(sink),), rkey=stag, remote_addr=to),
            ]
        )
        first = conn.next_completion(me.cq, timeout=10)
        second = conn.next_completion(me.cq, timeout=10)
        assert first.wr_id == 1 and first.status is WcStatus.REM_ACCESS_ERR
        assert second.wr_id == 2 and second.status is WcStatus.WR_FLUSH_ERR
        with pytest.raises(ConnectionClosed):
            conn.next_completion(me.cq, timeout=10)
        assert conn.closed and me.qp.state is QpState.ERROR
        assert not conn.progress(0)
        thread.join(10)
        assert not errors and not thread.is_alive()


def test_nothing_to_wait_for_times_out() -> None:
    with BlockingListener("127.0.0.1", 0) as listener:
        thread, errors = serve_in_thread(listener, answer_until_closed)
        me = Side("client")
        conn = connect("127.0.0.1", listener.port, me.qp, private_data=b"hello")
        with pytest.raises(ConnectionTimeout):
            conn.next_completion(me.cq, timeout=0.2)
        assert conn.poll_cq(me.cq) == [] and not conn.closed
        conn.disconnect(10)
        thread.join(10)
        assert not errors


def test_the_peer_closing_flushes_an_outstanding_read() -> None:
    """The server closes its half while our Read waits (DDP-13): it completes flushed."""

    def close_after_request(conn: BlockingConnection, side: Side) -> None:
        conn.disconnect(10)  # our FIN; it reads until the client's FIN

    with BlockingListener("127.0.0.1", 0) as listener:
        thread, errors = serve_in_thread(listener, close_after_request)
        me = Side("client")
        conn = connect("127.0.0.1", listener.port, me.qp, private_data=b"hello")
        while not conn.peer_closed:
            conn.progress(10)
        sink = me.mr(64)
        stag, to, _ = ADVERT.unpack(conn.negotiated.peer_private_data)
        me.qp.post_send(SendWR(7, WrOpcode.RDMA_READ, (sge(sink),), rkey=stag, remote_addr=to))
        wc = conn.next_completion(me.cq, timeout=10)
        assert wc.wr_id == 7 and wc.status is WcStatus.WR_FLUSH_ERR
        thread.join(10)
        assert not errors and conn.closed and me.qp.state is QpState.ERROR


def test_a_rejected_connection_carries_the_private_data() -> None:
    with BlockingListener("127.0.0.1", 0) as listener:

        def reject() -> None:
            listener.get_request(timeout=20).reject(b"go away")

        thread = threading.Thread(target=reject, daemon=True)
        thread.start()
        me = Side("client")
        with pytest.raises(ConnectRejected) as caught:
            connect("127.0.0.1", listener.port, me.qp, private_data=b"hello")
        assert caught.value.private_data == b"go away"
        thread.join(10)


def test_the_listener_survives_garbage_and_takes_the_next_peer() -> None:
    with BlockingListener("127.0.0.1", 0) as listener:
        thread, errors = serve_in_thread(listener, answer_until_closed)
        with socket.create_connection(("127.0.0.1", listener.port)) as bad:
            bad.sendall(b"GET / HTTP/1.1\r\n\r\n" + bytes(64))  # not an MPA Request
            assert bad.recv(100) == b""  # closed on us
        me = Side("client")
        conn = connect("127.0.0.1", listener.port, me.qp, private_data=b"hello")
        sink = me.mr(16)
        stag, to, _ = ADVERT.unpack(conn.negotiated.peer_private_data)
        me.qp.post_send(SendWR(1, WrOpcode.RDMA_READ, (sge(sink),), rkey=stag, remote_addr=to))
        assert conn.next_completion(me.cq, timeout=10).status is WcStatus.SUCCESS
        assert bytes(sink.buf) == bytes(range(16))
        conn.disconnect(10)
        thread.join(10)
        assert not errors and listener.failures


def test_connect_to_nothing_fails_cleanly() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(ConnectFailed):
        connect("127.0.0.1", port, Side("client").qp, timeout=5)


def test_the_emss_follows_the_socket_as_its_segment_size_grows() -> None:
    """MPA-13: as on the trio driver, the MULPDU is derived again as TCP's segment size
    grows (loopback starts at about half the path's), unless the settings fix it."""
    with BlockingListener("127.0.0.1", 0) as listener:
        thread, errors = serve_in_thread(listener, answer_until_closed)
        me = Side("client")
        conn = connect("127.0.0.1", listener.port, me.qp, private_data=b"hello")
        first = conn.engine.settings.emss
        assert first is not None
        stag, to, length = ADVERT.unpack(conn.negotiated.peer_private_data)
        src = me.mr(length)
        for i in range(16):  # 16 MiB: far past the first checks
            me.qp.post_send(SendWR(i, WrOpcode.RDMA_WRITE, (sge(src),), rkey=stag, remote_addr=to))
        me.qp.post_send(
            SendWR(99, WrOpcode.RDMA_READ, (sge(src, 0, 8),), rkey=stag, remote_addr=to)
        )
        assert [conn.next_completion(me.cq, 30).wr_id for _ in range(17)] == [*range(16), 99]
        path = path_segment_size(conn.sock)
        grown = conn.engine.settings.emss
        assert grown is not None and grown >= first
        if path is not None and first < path:
            assert grown > first  # it was read again and grew
        conn.disconnect(10)
        thread.join(10)
        assert not errors


def test_a_fixed_mulpdu_stays() -> None:
    with BlockingListener("127.0.0.1", 0) as listener:
        thread, errors = serve_in_thread(listener, answer_until_closed)
        me = Side("client")
        settings = MpaSettings(mulpdu=1024)
        conn = connect("127.0.0.1", listener.port, me.qp, private_data=b"hello", settings=settings)
        assert conn.negotiated.mulpdu == 1024 and conn.engine.settings.emss is None
        stag, to, length = ADVERT.unpack(conn.negotiated.peer_private_data)
        src = me.mr(1 << 20)
        me.qp.post_send(SendWR(1, WrOpcode.RDMA_WRITE, (sge(src),), rkey=stag, remote_addr=to))
        assert conn.next_completion(me.cq, 30).status is WcStatus.SUCCESS
        assert conn.engine.settings.emss is None and conn.engine.mpa.mulpdu == 1024
        conn.disconnect(10)
        thread.join(10)
        assert not errors


def test_writes_through_the_backlog_complete_with_nothing_coming_back() -> None:
    """Writes the socket cannot take at once complete as the backlog drains, though the
    peer sends nothing: a wait for the CQ wakes when the socket takes more, not only when
    bytes arrive (it waited for the peer here, for ever with no timeout)."""
    with BlockingListener("127.0.0.1", 0) as listener:
        thread, errors = serve_in_thread(listener, answer_until_closed)
        me = Side("client")
        conn = connect("127.0.0.1", listener.port, me.qp, private_data=b"hello")
        stag, to, length = ADVERT.unpack(conn.negotiated.peer_private_data)
        src = me.mr(length)
        done: list[int] = []

        def write_all() -> None:
            for i in range(32):  # 32 MiB: far more than both socket buffers hold
                me.qp.post_send(
                    SendWR(i, WrOpcode.RDMA_WRITE, (sge(src),), rkey=stag, remote_addr=to)
                )
            done.extend(conn.next_completion(me.cq).wr_id for _ in range(32))  # no timeout

        writer = threading.Thread(target=write_all, daemon=True)
        writer.start()
        writer.join(60)
        assert done == list(range(32))
        conn.disconnect(10)
        thread.join(10)
        assert not errors


def _raw_initiator(port: int) -> tuple[socket.socket, IwarpConnection]:
    """A hand-driven MPA initiator on a plain socket, established."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    engine = IwarpConnection(Role.INITIATOR, MpaSettings())
    engine.initiate(0.0, b"hello")
    sock.sendall(engine.data_to_send())
    while not isinstance(engine.next_event(), Established):
        engine.receive_data(sock.recv(65536))
    return sock, engine


def test_a_corrupt_fpdu_is_answered_with_a_terminate_and_the_server_ends_cleanly() -> None:
    """MPA-12 on the blocking driver: a CRC error gets a Terminate (2/0/2) back, the QP ends
    in ERROR, the serving loop returns instead of raising."""
    ended: list[BlockingConnection] = []

    def serve(conn: BlockingConnection, side: Side) -> None:
        answer_until_closed(conn, side)
        ended.append(conn)

    with BlockingListener("127.0.0.1", 0) as listener:
        thread, errors = serve_in_thread(listener, serve)
        sock, engine = _raw_initiator(listener.port)
        engine.send_message(Send(b"x" * 40))
        fpdu = bytearray(engine.data_to_send())
        fpdu[10] ^= 0xFF  # inside the ULPDU: the CRC no longer matches
        sock.sendall(fpdu)
        received = bytearray()
        while chunk := sock.recv(65536):
            received += chunk
        sock.close()
        engine.receive_data(bytes(received))
        events = []
        while not isinstance(event := engine.next_event(), NeedData):
            events.append(event)
        [term] = [e for e in events if isinstance(e, TerminateReceived)]
        assert term.terminate.cause == (2, 0, 0x02)  # LLP, MPA CRC error
        thread.join(10)
        assert not errors and not thread.is_alive()
        [conn] = ended
        assert conn.closed and conn.qp.state is QpState.ERROR
        assert conn.error is not None and "MPA-12" in str(conn.error)


def test_as_a_context_manager_it_disconnects_and_aborts_on_an_error() -> None:
    with BlockingListener("127.0.0.1", 0) as listener:
        thread, errors = serve_in_thread(listener, answer_until_closed)
        me = Side("client")
        with connect("127.0.0.1", listener.port, me.qp, private_data=b"hello") as conn:
            assert me.qp.state is QpState.RTS
        assert conn.closed and conn.error is None and me.qp.state is QpState.ERROR
        thread.join(10)
        assert not errors and not thread.is_alive()

        thread, errors = serve_in_thread(listener, answer_until_closed)
        other = Side("client")
        with pytest.raises(RuntimeError, match="the application failed"):
            with connect("127.0.0.1", listener.port, other.qp, private_data=b"hello") as conn:
                raise RuntimeError("the application failed")
        assert conn.closed and other.qp.state is QpState.ERROR
        thread.join(10)
        assert not errors and not thread.is_alive()  # the server saw the abort as a close


def test_a_capture_tap_records_both_directions_for_the_dissector(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``tap_factory`` on both ends' managers of the blocking driver: the pcap holds the MPA
    startup and every FPDU as exchanged, and `iwarp dissect` decodes it (CRC ok)."""
    path = tmp_path / "blocking.pcap"
    with path.open("wb") as f:
        writer = PcapWriter(f)
        with BlockingListener("127.0.0.1", 0) as listener:
            thread, errors = serve_in_thread(listener, answer_until_closed)
            me = Side("client")
            conn = connect(
                "127.0.0.1",
                listener.port,
                me.qp,
                private_data=b"hello",
                tap_factory=socket_tap_factory(writer),
            )
            stag, to, _ = ADVERT.unpack(conn.negotiated.peer_private_data)
            src, sink = me.mr(b"x" * 100), me.mr(100)
            me.qp.post_send(
                [
                    SendWR(1, WrOpcode.RDMA_WRITE, (sge(src),), rkey=stag, remote_addr=to),
                    SendWR(2, WrOpcode.RDMA_READ, (sge(sink),), rkey=stag, remote_addr=to),
                ]
            )
            assert [conn.next_completion(me.cq, 10).wr_id for _ in range(2)] == [1, 2]
            conn.disconnect(10)
            thread.join(10)
            assert not errors
    capsys.readouterr()
    assert iwarp(["dissect", str(path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    kinds = [line.split("MPA/DDP/RDMAP ")[-1].split(" STag")[0].split(" QN")[0] for line in lines]
    # b"hello" after the 4 octets of RFC 6581 IRD/ORD; the Reply carries the 16-octet advert
    assert any("MPA Request" in line and "PD=9" in line for line in lines)
    assert any("MPA Reply" in line and "PD=20" in line for line in lines)
    assert [k for k in kinds if k.startswith("RDMA")] == [
        "RDMA Write",
        "RDMA Read Request",
        "RDMA Read Response",
    ]
    assert all("CRC ok" in line for line in lines if "RDMAP" in line)
