"""Stream teardown (RFC 5040 §6.2, DDP-13) and the states it goes through: TERMINATE
between a Terminate and the close, CLOSING during an orderly close, ERROR at the end; and the
asynchronous events each step raises (ibv_get_async_event)."""

from __future__ import annotations

import pytest

from stack.constants import TERM_DDP_T_INVALID_STAG, Opcode
from stack.errors import LocalError
from stack.rnic import (
    Access,
    AsyncEventType,
    QpState,
    RecvWR,
    SendWR,
    WcOpcode,
    WcStatus,
    WorkCompletion,
    WrOpcode,
)
from tests.rnic.helpers import Pair, Side, opcodes

RW = Access.LOCAL_WRITE | Access.REMOTE_WRITE | Access.REMOTE_READ


def _sends(wcs: list[WorkCompletion]) -> list[tuple[int, WcStatus]]:
    return [(wc.wr_id, wc.status) for wc in wcs if not wc.opcode & WcOpcode.RECV]


def _recvs(wcs: list[WorkCompletion]) -> list[tuple[int, WcStatus]]:
    return [(wc.wr_id, wc.status) for wc in wcs if wc.opcode & WcOpcode.RECV]


def _events(side: Side) -> list[AsyncEventType]:
    out = []
    while (event := side.rnic.poll_async_event()) is not None:
        out.append(event.event_type)
    return out


def test_terminate_state_lasts_from_the_terminate_to_the_close() -> None:
    """RFC 5040 §6.2.1: the side that sends a Terminate and the side that receives it are
    both TERMINATE (nothing more is processed, posts are flushed, as IBV_QPS_SQE) until the
    stream closes; then ERROR, with no second event."""
    p = Pair()
    target = p.b.mr(8, RW)
    p.b.qp.post_recv(RecvWR(7, (p.b.sge(target),)))
    p.a.qp.post_send(
        SendWR(1, WrOpcode.RDMA_WRITE, inline_data=b"x", rkey=target.rkey ^ 0x100,
               remote_addr=target.base)
    )  # fmt: skip
    p.step(p.a, p.b)
    assert p.b.qp.state is QpState.TERMINATE and p.a.qp.state is QpState.RTS
    (event,) = [p.b.rnic.poll_async_event()]
    assert event is not None and event.event_type is AsyncEventType.QP_ACCESS_ERR
    assert event.qp is p.b.qp and event.cause == TERM_DDP_T_INVALID_STAG and not event.remote
    assert _recvs(p.b.cq.poll()) == [(7, WcStatus.WR_FLUSH_ERR)]
    p.b.qp.post_send(SendWR(2, WrOpcode.SEND, inline_data=b"late"))
    p.b.qp.post_recv(RecvWR(8, ()))
    assert [(wc.wr_id, wc.status) for wc in p.b.cq.poll()] == [
        (2, WcStatus.WR_FLUSH_ERR),
        (8, WcStatus.WR_FLUSH_ERR),
    ]
    p.step(p.b, p.a)  # the Terminate
    assert p.a.qp.state is QpState.TERMINATE
    remote = p.a.rnic.poll_async_event()
    assert remote is not None and remote.remote and remote.qp is p.a.qp
    assert remote.event_type is AsyncEventType.QP_ACCESS_ERR
    assert remote.cause == TERM_DDP_T_INVALID_STAG
    p.close_streams()
    assert p.a.qp.state is QpState.ERROR and p.b.qp.state is QpState.ERROR
    assert _events(p.a) == _events(p.b) == []


def test_local_close_sends_what_was_posted_before_fin() -> None:
    """Our orderly close: WRs posted before it (a Read held back by ORD 1, then a Send)
    still go out and complete; FIN only once the send queue is empty (SQ_DRAINED)."""
    p = Pair(a_qp={"ord": 1})
    assert p.a.endpoint is not None
    source, inbox = p.b.mr(b"0123456789abcdef", RW), p.b.mr(16)
    p.b.qp.post_recv(RecvWR(1, (p.b.sge(inbox),)))
    sinks = [p.a.mr(16), p.a.mr(16)]
    p.a.qp.post_send(
        [SendWR(i, WrOpcode.RDMA_READ, (p.a.sge(s),), rkey=source.rkey, remote_addr=source.base)
         for i, s in enumerate(sinks)]
        + [SendWR(2, WrOpcode.SEND, inline_data=b"after the reads")]
    )  # fmt: skip
    p.a.qp.close()
    assert p.a.qp.state is QpState.CLOSING and p.a.qp.has_pending
    with pytest.raises(LocalError):
        p.a.qp.post_send(SendWR(3, WrOpcode.SEND, inline_data=b"too late"))
    p.step(p.a, p.b)
    assert not p.a.endpoint.wants_close  # the second Read waits for the first's answer
    p.pump()
    assert p.a.endpoint.wants_close and _events(p.a) == [AsyncEventType.SQ_DRAINED]
    assert _sends(p.a.cq.poll()) == [(i, WcStatus.SUCCESS) for i in range(3)]
    assert [bytes(s.buf) for s in sinks] == [b"0123456789abcdef"] * 2
    assert _recvs(p.b.cq.poll()) == [(1, WcStatus.SUCCESS)]
    assert bytes(inbox.buf[:15]) == b"after the reads"


def test_peer_fin_places_what_came_before_and_flushes_in_submit_order() -> None:
    """DDP-13 half-close: the Send that arrived just before the peer's FIN is placed and
    completed, the receives after it are flushed; of our own WRs, a Write queued before the
    FIN still goes out and completes, while a Read that can never be answered and the Send
    posted after it complete with WR_FLUSH_ERR, in order; CLOSING, then ERROR."""
    p = Pair()
    assert p.a.endpoint is not None and p.b.endpoint is not None
    inbox, remote, sink = p.b.mr(16), p.a.mr(16, RW), p.b.mr(16)
    p.b.qp.post_recv([RecvWR(i, (p.b.sge(inbox),)) for i in range(3)])
    p.b.qp.post_send(
        [
            SendWR(10, WrOpcode.RDMA_WRITE, inline_data=b"still goes", rkey=remote.rkey,
                   remote_addr=remote.base),
            SendWR(11, WrOpcode.RDMA_READ, (p.b.sge(sink),), rkey=remote.rkey,
                   remote_addr=remote.base),
            SendWR(12, WrOpcode.SEND, inline_data=b"behind the read"),
        ]
    )  # fmt: skip
    p.a.qp.post_send(SendWR(1, WrOpcode.SEND, inline_data=b"last words"))
    data = bytes(p.a.endpoint.produce())
    assert p.b.endpoint.feed(data) and p.b.endpoint.feed(b"") is False  # data, then FIN
    assert p.b.qp.state is QpState.CLOSING
    wcs = p.b.cq.poll()
    assert _recvs(wcs) == [(0, WcStatus.SUCCESS), (1, WcStatus.WR_FLUSH_ERR),
                           (2, WcStatus.WR_FLUSH_ERR)]  # fmt: skip
    assert bytes(inbox.buf[:10]) == b"last words" and _sends(wcs) == []
    with pytest.raises(LocalError):
        p.b.qp.post_send(SendWR(13, WrOpcode.SEND, inline_data=b"no"))
    p.b.qp.post_recv(RecvWR(3, ()))  # nothing more can arrive: flushed at once
    assert _recvs(p.b.cq.poll()) == [(3, WcStatus.WR_FLUSH_ERR)]
    wire = bytes(p.b.endpoint.produce())
    assert opcodes(wire) == [Opcode.RDMA_WRITE]  # not the Read Request, not the Send
    assert _sends(p.b.cq.poll()) == [(10, WcStatus.SUCCESS), (11, WcStatus.WR_FLUSH_ERR),
                                     (12, WcStatus.WR_FLUSH_ERR)]  # fmt: skip
    assert p.b.endpoint.wants_close and _events(p.b) == [AsyncEventType.SQ_DRAINED]
    p.a.endpoint.feed(wire)  # our half is still open: the peer reads the Write
    assert bytes(remote.buf[:10]) == b"still goes"
    p.close_streams()
    assert p.b.qp.state is QpState.ERROR and _events(p.b) == []
    assert p.b.cq.poll() == []


def test_srq_qp_reports_last_wqe_reached_when_it_stops() -> None:
    """A QP with an SRQ raises QP_LAST_WQE_REACHED once it takes no more receives from it
    (after its QP_FATAL), and the SRQ's receives stay posted for the other QPs."""
    p = Pair()
    srq = p.b.rnic.create_srq(p.b.pd)
    qp = p.b.rnic.create_qp(p.b.pd, p.b.cq, srq=srq)
    srq.post_recv(RecvWR(1, ()))
    qp.fatal(None, send_terminate=False, detail="test")
    assert [e.event_type for e in iter(p.b.rnic.poll_async_event, None)] == [
        AsyncEventType.QP_FATAL,
        AsyncEventType.QP_LAST_WQE_REACHED,
    ]
    assert qp.state is QpState.ERROR and len(srq) == 1
