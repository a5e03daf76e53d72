"""The synchronous verbs API over loopback TCP: busy polling, threads, asyncio, completion
channels, connection events, lifetime (no leaked threads or sockets) and failures that
surface as exceptions rather than hangs."""

from __future__ import annotations

import asyncio
import gc
import os
import threading
import warnings
from collections import Counter

import numpy as np
import pytest

from stack.errors import LocalError
from stack.rnic import Access, QpState, RecvWR, SendFlags, SendWR, Sge, WcStatus, WrOpcode
from stack.transport import CmEventType
from stack.verbs_sync import (
    CQ,
    MR,
    PD,
    QP,
    SRQ,
    CMEventChannel,
    CMId,
    CompChannel,
    Context,
    RnicClosed,
    RnicFailed,
)
from tests.e2e.sync_helpers import TIMEOUT, make_sync_host, sync_pair


def _rnic_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("rnic-")]


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_busy_poll_loop_returns() -> None:
    """The loop users wrote in place of ``await cq.next()``: the RNIC progresses anyway."""
    with sync_pair() as (client, server):
        inbox = server.mr(16)
        server.qp.post_recv(RecvWR(1, (inbox.sge(),)))
        client.qp.post_send(SendWR(2, WrOpcode.SEND, inline_data=b"busy"))
        polls = 0
        while not (wcs := server.cq.poll(1)):
            polls += 1
            assert polls < 50_000_000, "the receive never completed"
        assert wcs[0].wr_id == 1 and inbox.read(4) == b"busy"


def test_threads_poll_one_cq_concurrently_and_share_out_every_completion() -> None:
    count, pollers = 240, 4
    with sync_pair() as (client, server):
        server.qp.post_recv([RecvWR(i, ()) for i in range(count)])
        taken: list[int] = []
        lock = threading.Lock()

        def poll() -> None:
            while True:
                with lock:
                    if len(taken) >= count:
                        return
                for wc in server.cq.poll(3):
                    assert wc.status is WcStatus.SUCCESS
                    with lock:
                        taken.append(wc.wr_id)

        threads = [threading.Thread(target=poll) for _ in range(pollers)]
        for t in threads:
            t.start()

        # Two threads post concurrently too: each post is handed to the RNIC thread.
        def post(base: int) -> None:
            for i in range(count // 2):
                client.qp.post_send(SendWR(base + i, WrOpcode.SEND_IMM, imm_data=base + i))

        posters = [threading.Thread(target=post, args=(base,)) for base in (0, count // 2)]
        for t in posters:
            t.start()
        for t in posters + threads:
            t.join(TIMEOUT)
            assert not t.is_alive()
        assert sorted(taken) == list(range(count))  # each exactly once, none lost
        sends = client.cq.wait(count, TIMEOUT)
        per_poster = Counter(wc.wr_id < count // 2 for wc in sends)
        assert per_poster == {True: count // 2, False: count // 2}


def test_completion_channel_reports_armed_and_solicited_events() -> None:
    with Context("server") as sctx, Context("client") as cctx:
        channel = CompChannel(sctx)
        server = make_sync_host(sctx)
        server.cq = CQ(sctx, channel=channel)
        server.qp = QP(server.pd, server.cq)
        client = make_sync_host(cctx)
        port = server.listen()
        server.qp.post_recv([RecvWR(i, ()) for i in range(3)])
        threading.Thread(target=server.accept_one).start()
        client.connect(port)
        server.cq.req_notify()
        client.qp.post_send(SendWR(1, WrOpcode.SEND_IMM, imm_data=1))
        assert channel.get_cq_event(TIMEOUT) is server.cq
        assert [wc.wr_id for wc in server.cq.poll()] == [0]
        # Solicited only: a plain Send completes without an event, a Send with SE fires one.
        server.cq.req_notify(solicited_only=True)
        client.qp.post_send(SendWR(2, WrOpcode.SEND_IMM, imm_data=2))
        assert [wc.wr_id for wc in server.cq.wait(1, TIMEOUT)] == [1]
        with pytest.raises(TimeoutError):
            channel.get_cq_event(timeout=0)
        client.qp.post_send(
            SendWR(
                3,
                WrOpcode.SEND_IMM,
                imm_data=3,
                send_flags=SendFlags.SIGNALED | SendFlags.SOLICITED,
            )
        )
        assert channel.get_cq_event(TIMEOUT) is server.cq
        assert [wc.wr_id for wc in server.cq.poll()] == [2]


def test_reject_and_unreachable_as_cm_events() -> None:
    with Context("server") as sctx, Context("client") as cctx:
        server, client = make_sync_host(sctx), make_sync_host(cctx)
        port = server.listen()
        CMId(client.channel).connect("127.0.0.1", port, client.qp, b"let me in")
        request = server.expect(CmEventType.CONNECT_REQUEST)
        assert request.private_data == b"let me in" and request.listen_id is not None
        assert request.listen_id.port == port
        request.id.reject(b"go away")
        rejected = client.expect(CmEventType.REJECTED)
        assert rejected.private_data == b"go away"
        with pytest.raises(LocalError):
            request.id.accept(server.qp)  # answered already
        request.listen_id.close()  # returns once the listening socket is closed
        CMId(client.channel).connect("127.0.0.1", port, QP(client.pd, client.cq))
        assert "TCP connect" in client.expect(CmEventType.UNREACHABLE).reason


def test_asyncio_waits_never_block_the_event_loop() -> None:
    """The awaiting task and the task that posts the Send share one event loop: if a wait
    blocked the loop, the Send would never be posted."""

    async def main() -> None:
        loop = asyncio.get_running_loop()
        with Context("server") as sctx, Context("client") as cctx:
            channel = CompChannel(sctx)
            server, client = make_sync_host(sctx), make_sync_host(cctx)
            server.cq = CQ(sctx, channel=channel)
            server.qp = QP(server.pd, server.cq)
            listen_id = CMId(server.channel)
            port = listen_id.listen()
            CMId(client.channel).connect("127.0.0.1", port, client.qp)
            request = await server.channel.wait_cm_event(TIMEOUT)
            assert request.type is CmEventType.CONNECT_REQUEST
            await loop.run_in_executor(None, request.id.accept, server.qp, b"", TIMEOUT)
            established = await client.channel.wait_cm_event(TIMEOUT)
            assert established.type is CmEventType.ESTABLISHED
            inbox = server.mr(8)
            server.qp.post_recv([RecvWR(i, (inbox.sge(),)) for i in (1, 2, 3)])

            async def send_later() -> None:
                await asyncio.sleep(0)
                client.qp.post_send(SendWR(10, WrOpcode.SEND, inline_data=b"asyncio"))

            poster = asyncio.create_task(send_later())
            (wc,) = await server.cq.wait_async(1, TIMEOUT)
            await poster
            assert wc.wr_id == 1 and inbox.read(7) == b"asyncio"
            server.cq.req_notify()
            poster = asyncio.create_task(send_later())
            assert await channel.wait_cq_event(TIMEOUT) is server.cq
            await poster
            assert [(w.wr_id, w.status) for w in server.cq.poll()] == [(2, WcStatus.SUCCESS)]
            client.qp.post_send(SendWR(11, WrOpcode.SEND_IMM, imm_data=1))
            (wc,) = await loop.run_in_executor(None, server.cq.wait, 1, TIMEOUT)
            assert wc.wr_id == 3
            with pytest.raises(TimeoutError):
                await server.cq.wait_async(1, timeout=0)
            assert established.id.connected
            await loop.run_in_executor(None, established.id.disconnect, TIMEOUT)
            gone = await server.channel.wait_cm_event(TIMEOUT)
            assert gone.type is CmEventType.ESTABLISHED  # the accept's, then DISCONNECTED
            gone = await server.channel.wait_cm_event(TIMEOUT)
            assert gone.type is CmEventType.DISCONNECTED and gone.id is request.id

    asyncio.run(main())


def test_register_numpy_and_memoryview_buffers() -> None:
    with sync_pair() as (client, server):
        array = np.zeros(16, dtype=np.uint32)
        target = MR(server.pd, array, Access.LOCAL_WRITE | Access.REMOTE_WRITE)
        src = MR(client.pd, memoryview(bytearray(np.arange(16, dtype=np.uint32).tobytes())))
        server.qp.post_recv(RecvWR(9, ()))
        client.qp.post_send(
            [
                SendWR(
                    1, WrOpcode.RDMA_WRITE, (src.sge(),), rkey=target.rkey, remote_addr=target.base
                ),  # fmt: skip
                SendWR(2, WrOpcode.SEND_IMM, imm_data=0),
            ]
        )
        assert [wc.wr_id for wc in client.cq.wait(2, TIMEOUT)] == [1, 2]
        server.cq.wait(1, TIMEOUT)  # the Immediate Data follows the Write: it is placed
        assert array.tolist() == list(range(16))


def test_close_leaks_no_thread_or_socket_and_flushes_outstanding_work() -> None:
    before = _open_fds()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ResourceWarning)
        with sync_pair() as (client, server):
            server.qp.post_recv(RecvWR(1, ()))
            assert len(_rnic_threads()) == 2
        gc.collect()
    # Leaving the block closed both contexts while connected (and listening): the QP is in
    # error and its receive flushed, the threads are gone, every socket was closed by the
    # stack rather than by the garbage collector.
    assert [str(w.message) for w in caught if w.category is ResourceWarning] == []
    assert server.qp.state is QpState.ERROR
    assert [(wc.wr_id, wc.status) for wc in server.cq.poll()] == [(1, WcStatus.WR_FLUSH_ERR)]
    assert _rnic_threads() == []
    assert _open_fds() == before
    with pytest.raises(RnicClosed):
        server.qp.post_recv(RecvWR(2, ()))
    with pytest.raises(RnicClosed):  # events queued before the close first, then the error
        while True:
            server.channel.get_cm_event(TIMEOUT)
    server.ctx.close()  # idempotent


def test_close_wakes_threads_blocked_in_waits() -> None:
    ctx = Context("lonely")
    channel = CompChannel(ctx)
    cq = CQ(ctx, channel=channel)
    cm_channel = CMEventChannel(ctx)
    errors: list[BaseException] = []

    def block(wait: object) -> None:
        try:
            wait()  # type: ignore[operator]
        except BaseException as exc:
            errors.append(exc)

    waits = [lambda: channel.get_cq_event(None), lambda: cq.wait(1, None), cm_channel.get_cm_event]
    threads = [threading.Thread(target=block, args=(w,)) for w in waits]
    for t in threads:
        t.start()
    ctx.close()
    for t in threads:
        t.join(TIMEOUT)
        assert not t.is_alive()
    assert len(errors) == 3 and all(isinstance(e, RnicClosed) for e in errors)


def test_a_failure_in_the_rnic_thread_surfaces_and_nothing_hangs() -> None:
    def broken_tap(stream: object, active: bool) -> None:
        raise ValueError("capture disk full")

    with Context("server") as sctx, Context("client", tap_factory=broken_tap) as cctx:
        server, client = make_sync_host(sctx), make_sync_host(cctx)
        port = server.listen()
        CMId(client.channel).connect("127.0.0.1", port, client.qp)
        with pytest.raises(RnicClosed) as info:
            client.channel.get_cm_event(TIMEOUT)
        assert "capture disk full" in repr(info.value.__cause__)
        with pytest.raises(RnicFailed) as failed:
            PD(cctx)
        assert "capture disk full" in repr(failed.value.__cause__)
        assert cctx.closed and not sctx.closed


def test_local_errors_are_raised_in_the_calling_thread() -> None:
    with Context("solo") as ctx:
        host = make_sync_host(ctx)
        too_many = tuple(Sge(0, 0, 0) for _ in range(host.qp.qp.cap.max_send_sge + 1))
        with pytest.raises(LocalError, match="max_send_sge"):
            host.qp.post_send(SendWR(1, WrOpcode.SEND, too_many))
        with pytest.raises(LocalError, match="not a buffer"):
            MR(host.pd, "text")
        with pytest.raises(LocalError, match="read-only"):
            MR(host.pd, b"immutable")
        with pytest.raises(LocalError, match="not connected"):
            CMId(host.channel).disconnect()
        with pytest.raises(TimeoutError):
            host.channel.get_cm_event(timeout=0.01)
        with pytest.raises(TimeoutError):
            host.cq.wait(1, timeout=0.01)
        with pytest.raises(RuntimeError, match="deadlock"):
            ctx.thread.run_sync(PD, ctx)


def test_shared_receive_queue_feeds_qps_of_the_sync_api() -> None:
    with Context("server") as sctx, Context("client") as cctx:
        server, client = make_sync_host(sctx), make_sync_host(cctx)
        srq = SRQ(server.pd, max_wr=8)
        server.qp = QP(server.pd, server.cq, srq=srq)
        inbox = server.mr(32)
        srq.post_recv([RecvWR(i, (inbox.sge(8 * i, 8),)) for i in range(4)])
        with pytest.raises(LocalError, match="SRQ"):
            server.qp.post_recv(RecvWR(9, ()))
        port = server.listen()
        accepting = threading.Thread(target=server.accept_one)
        accepting.start()
        client.connect(port)
        accepting.join(TIMEOUT)
        client.qp.post_send([SendWR(i, WrOpcode.SEND, inline_data=b"srq%d" % i) for i in range(3)])
        assert [wc.wr_id for wc in server.cq.wait(3, TIMEOUT)] == [0, 1, 2]
        assert inbox.read(20) == b"srq0\0\0\0\0srq1\0\0\0\0srq2"
        assert len(srq) == 1


def test_a_context_nobody_closed_stops_its_thread_once_unreachable() -> None:
    ctx = Context("forgotten")
    (thread,) = [t for t in _rnic_threads() if t.name == "rnic-forgotten"]
    PD(ctx)
    del ctx
    gc.collect()
    thread.join(TIMEOUT)
    assert not thread.is_alive()


def test_listening_on_a_port_in_use_raises() -> None:
    with Context("a") as actx, Context("b") as bctx:
        port = CMId(CMEventChannel(actx)).listen()
        with pytest.raises(OSError):
            CMId(CMEventChannel(bctx)).listen("127.0.0.1", port)
