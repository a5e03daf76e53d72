"""SEC-01, SEC-09 and EXT-10 asserted as whole rules, each part by a test that fails if that
part were not implemented.

* SEC-01 (RFC 5040 §8.1.1(1), RFC 5042 §6.1.1): a stream in one PD can never use an STag of
  another, neither through the peer's tagged accesses nor through the local ULP's work
  requests; and it is the PD that decides: a stream of the owning PD may use the same STag.
* SEC-09 (RFC 5040 §8.1.1(9, 10), RFC 5042 §7.1): one stream's failure (a protection
  error, a CQ overflow) leaves the other streams of the same RNIC and PD unharmed.
* EXT-10 (RFC 7306 §5.2.2): atomics take ORD credits at the requester (one beyond ORD
  waits) and IRD slots at the responder (one beyond the peer's IRD is a Terminate and is
  not executed).
"""

from __future__ import annotations

import struct

import pytest

from stack.constants import (
    TERM_DDP_T_STAG_NOT_ASSOCIATED,
    TERM_DDP_U_NO_BUFFER,
    TERM_RDMAP_CATASTROPHIC_STREAM,
    TERM_RDMAP_STAG_NOT_ASSOCIATED,
    Opcode,
)
from stack.rnic import (
    Access,
    AsyncEventType,
    QpState,
    RecvWR,
    SendFlags,
    SendWR,
    Sge,
    WcOpcode,
    WcStatus,
    WrOpcode,
)
from stack.rnic.memory import MemoryRegion
from tests.rnic.helpers import Pair, SharedResponder, Side, opcodes

ALL = Access.LOCAL_WRITE | Access.REMOTE_WRITE | Access.REMOTE_READ | Access.REMOTE_ATOMIC
_LE64 = struct.Struct("<Q")


def _remote_wr(op: str, p: Pair, target: MemoryRegion, sink: MemoryRegion) -> SendWR:
    if op == "write":
        return SendWR(1, WrOpcode.RDMA_WRITE, inline_data=b"intruder", rkey=target.rkey,
                      remote_addr=target.base)  # fmt: skip
    if op == "read":
        return SendWR(1, WrOpcode.RDMA_READ, (p.a.sge(sink),), rkey=target.rkey,
                      remote_addr=target.base)  # fmt: skip
    return SendWR(1, WrOpcode.ATOMIC_FETCH_AND_ADD, (p.a.sge(sink),), rkey=target.rkey,
                  remote_addr=target.base, compare_add=1)  # fmt: skip


_NOT_ASSOCIATED = {
    "write": TERM_DDP_T_STAG_NOT_ASSOCIATED,
    "read": TERM_RDMAP_STAG_NOT_ASSOCIATED,
    "atomic": TERM_RDMAP_STAG_NOT_ASSOCIATED,
}


# ======================================================================================
# SEC-01: no use of another PD's STag, inbound or local
# ======================================================================================


@pytest.mark.parametrize("op", ["write", "read", "atomic"])
def test_sec_01_the_peer_cannot_reach_another_pds_stag_through_this_stream(op: str) -> None:
    """The stream's PD is not the STag's: "STag not associated" (SEC-01 named), nothing
    written or read; the same access over a stream of the owning PD succeeds."""
    p = Pair()
    other_pd = p.b.rnic.alloc_pd()
    original = bytes(range(8))
    target = other_pd.reg_mr(bytearray(original), ALL)
    sink = p.a.mr(8)
    p.a.qp.post_send(_remote_wr(op, p, target, sink))
    p.pump()
    assert bytes(target.buf) == original and bytes(sink.buf) == bytes(8)
    error = p.b.qp.error
    assert error is not None and error.rule == "SEC-01" and error.term == _NOT_ASSOCIATED[op]
    term = p.a.qp.peer_terminate
    assert term is not None and term.cause == _NOT_ASSOCIATED[op]
    owner = SharedResponder(p.b.rnic, other_pd)
    owner_sink = owner.a.mr(8)
    owner.a.qp.post_send(_remote_wr(op, owner, target, owner_sink))
    owner.pump()
    assert [wc.status for wc in owner.a.cq.poll()] == [WcStatus.SUCCESS]
    assert owner.b.qp.state is QpState.RTS and owner.b.qp.error is None
    changed = bytes(target.buf) != original or bytes(owner_sink.buf) != bytes(8)
    assert changed


def _local_sge(side: Side, mr: MemoryRegion) -> Sge:
    return Sge(mr.base, mr.length, mr.lkey)


@pytest.mark.parametrize("op", ["send", "write", "read", "local_inv"])
def test_sec_01_the_local_ulp_cannot_use_another_pds_stag_on_this_stream(op: str) -> None:
    """A WR on a QP of PD X naming an lkey (or STag) of PD Y on the same RNIC: LOC_PROT_ERR,
    nothing sent from or into that memory, the STag still valid."""
    p = Pair()
    foreign = p.a.rnic.alloc_pd().reg_mr(bytearray(b"secret!!"), ALL)
    remote = p.b.mr(8, ALL)
    p.b.qp.post_recv(RecvWR(9, (p.b.sge(remote),)))
    sge = _local_sge(p.a, foreign)
    wr = {
        "send": SendWR(1, WrOpcode.SEND, (sge,)),
        "write": SendWR(1, WrOpcode.RDMA_WRITE, (sge,), rkey=remote.rkey,
                        remote_addr=remote.base),
        "read": SendWR(1, WrOpcode.RDMA_READ, (sge,), rkey=remote.rkey,
                       remote_addr=remote.base),
        "local_inv": SendWR(1, WrOpcode.LOCAL_INV, invalidate_rkey=foreign.rkey),
    }[op]  # fmt: skip
    p.a.qp.post_send(wr)
    p.pump()
    (wc,) = [wc for wc in p.a.cq.poll() if wc.wr_id == 1]
    assert wc.status is WcStatus.LOC_PROT_ERR
    assert bytes(foreign.buf) == b"secret!!" and foreign.valid
    assert bytes(remote.buf) == bytes(8)
    sent = b"".join(p.a.sent)
    assert not any(o in opcodes(sent) for o in (Opcode.SEND, Opcode.RDMA_WRITE,
                                                 Opcode.RDMA_READ_REQUEST))  # fmt: skip


def test_sec_01_a_receive_buffer_of_another_pd_is_never_filled() -> None:
    """A receive WR whose SGE names another PD's memory: the Send that would land there is
    refused (the receive completes LOC_PROT_ERR, a Terminate goes out), the memory stays."""
    p = Pair()
    foreign = p.b.rnic.alloc_pd().reg_mr(bytearray(8), ALL)
    p.b.qp.post_recv(RecvWR(1, (_local_sge(p.b, foreign),)))
    p.a.qp.post_send(SendWR(1, WrOpcode.SEND, inline_data=b"overflow"))
    p.pump()
    assert bytes(foreign.buf) == bytes(8)
    (wc,) = p.b.cq.poll()
    assert (wc.wr_id, wc.status, wc.opcode) == (1, WcStatus.LOC_PROT_ERR, WcOpcode.RECV)
    assert p.a.qp.peer_terminate is not None


# ======================================================================================
# SEC-09: one stream's failure leaves the other streams of the RNIC and PD working
# ======================================================================================


def _works(stream: Pair, shared: MemoryRegion) -> None:
    """Write, Read, FetchAdd and Send over ``stream`` into ``shared`` all complete."""
    inbox = stream.b.mr(16)
    stream.b.qp.post_recv(RecvWR(5, (stream.b.sge(inbox),)))
    sink, old = stream.a.mr(8), stream.a.mr(8)
    stream.a.qp.post_send(
        [
            SendWR(1, WrOpcode.RDMA_WRITE, inline_data=b"still ok", rkey=shared.rkey,
                   remote_addr=shared.base),
            SendWR(2, WrOpcode.RDMA_READ, (stream.a.sge(sink),), rkey=shared.rkey,
                   remote_addr=shared.base),
            SendWR(3, WrOpcode.ATOMIC_FETCH_AND_ADD, (stream.a.sge(old),), rkey=shared.rkey,
                   remote_addr=shared.base + 8, compare_add=1),
            SendWR(4, WrOpcode.SEND, inline_data=b"alive"),
        ]
    )  # fmt: skip
    stream.pump()
    assert [(wc.wr_id, wc.status) for wc in stream.a.cq.poll()] == [
        (i, WcStatus.SUCCESS) for i in range(1, 5)
    ]
    assert bytes(sink.buf) == b"still ok" and _LE64.unpack(shared.buf[8:16])[0] >= 1
    assert [(wc.wr_id, wc.status) for wc in stream.b.cq.poll()] == [(5, WcStatus.SUCCESS)]
    assert stream.a.qp.state is stream.b.qp.state is QpState.RTS


def test_sec_09_a_protection_error_ends_only_that_stream() -> None:
    """Two streams into one RNIC and one PD: the first hits a protection error (Terminate,
    TERMINATE, one QP_ACCESS_ERR naming it); the second uses the PD's memory as before."""
    first = Pair()
    second = SharedResponder(first.b.rnic, first.b.pd)
    shared = first.b.pd.reg_mr(bytearray(16), ALL)
    first.a.qp.post_send(
        SendWR(1, WrOpcode.RDMA_WRITE, inline_data=b"bad", rkey=shared.rkey ^ 0xFF,
               remote_addr=shared.base)
    )  # fmt: skip
    first.pump()
    assert first.b.qp.state is QpState.TERMINATE and first.a.qp.peer_terminate is not None
    _works(second, shared)
    first.close_streams()
    _works(second, shared)
    events = list(iter(first.b.rnic.poll_async_event, None))
    assert [(e.qp, e.event_type) for e in events] == [(first.b.qp, AsyncEventType.QP_ACCESS_ERR)]
    assert shared.valid and second.b.qp.error is None


def test_sec_09_a_cq_overflow_ends_only_the_stream_completing_into_it() -> None:
    """A CQ of capacity 1 overflows: its QP is terminated (0/2/0x07, CQ_ERR then QP_FATAL),
    and a second stream of the same RNIC and PD with its own CQ keeps working."""
    first = Pair(cq_capacity=1)
    second = SharedResponder(first.b.rnic, first.b.pd)
    shared = first.b.pd.reg_mr(bytearray(16), ALL)
    inbox = first.b.mr(8)
    first.b.qp.post_recv([RecvWR(i, (first.b.sge(inbox),)) for i in range(2)])
    first.a.qp.post_send(
        [SendWR(i, WrOpcode.SEND, inline_data=b"x", send_flags=SendFlags.NONE) for i in range(2)]
    )
    first.pump()
    assert first.b.qp.state is QpState.TERMINATE
    term = first.a.qp.peer_terminate
    assert term is not None and term.cause == TERM_RDMAP_CATASTROPHIC_STREAM
    events = list(iter(first.b.rnic.poll_async_event, None))
    assert [(e.event_type, e.qp_num) for e in events] == [
        (AsyncEventType.CQ_ERR, first.b.qp.qp_num),
        (AsyncEventType.QP_FATAL, first.b.qp.qp_num),
    ]
    assert events[0].cq is first.b.cq
    _works(second, shared)


def test_sec_09_a_send_without_receive_on_one_stream_spares_the_srq_of_another() -> None:
    """The failing stream's error (no receive: 1/2/0x02) consumes nothing of the other
    stream's receives."""
    first = Pair()
    second = SharedResponder(first.b.rnic, first.b.pd)
    inbox = second.b.mr(8)
    second.b.qp.post_recv(RecvWR(1, (second.b.sge(inbox),)))
    first.a.qp.post_send(SendWR(1, WrOpcode.SEND, inline_data=b"nobody"))
    first.pump()
    error = first.b.qp.error
    assert error is not None and error.term == TERM_DDP_U_NO_BUFFER
    second.a.qp.post_send(SendWR(2, WrOpcode.SEND, inline_data=b"somebody"))
    second.pump()
    assert [(wc.wr_id, wc.status) for wc in second.b.cq.poll()] == [(1, WcStatus.SUCCESS)]
    assert bytes(inbox.buf) == b"somebody"


# ======================================================================================
# EXT-10: atomics count against ORD (requester) and IRD (responder)
# ======================================================================================


def _fetch_adds(p: Pair, word: MemoryRegion, count: int) -> list[MemoryRegion]:
    results = [p.a.mr(8) for _ in range(count)]
    p.a.qp.post_send(
        [SendWR(i, WrOpcode.ATOMIC_FETCH_AND_ADD, (p.a.sge(r),), rkey=word.rkey,
                remote_addr=word.base, compare_add=1) for i, r in enumerate(results)]
    )  # fmt: skip
    return results


def test_ext_10_an_atomic_beyond_ord_waits_for_an_answer() -> None:
    """ORD 2, four FetchAdds: exactly two Atomic Requests leave before any answer; each
    answer lets one more go; all complete in order with the values in order."""
    p = Pair(a_qp={"ord": 2})
    word = p.b.mr(8, ALL)
    results = _fetch_adds(p, word, 4)
    assert p.a.qp.outstanding_remote == 2 and p.a.qp.has_pending
    p.step(p.a, p.b)
    assert opcodes(p.a.sent[-1]) == [Opcode.ATOMIC_REQUEST] * 2
    p.step(p.b, p.a)  # two answers
    p.step(p.a, p.b)
    assert opcodes(p.a.sent[-1]) == [Opcode.ATOMIC_REQUEST] * 2
    p.pump()
    assert [(wc.wr_id, wc.status) for wc in p.a.cq.poll()] == [
        (i, WcStatus.SUCCESS) for i in range(4)
    ]
    assert [_LE64.unpack(r.buf)[0] for r in results] == [0, 1, 2, 3]
    assert _LE64.unpack(word.buf)[0] == 4


def test_ext_10_an_atomic_beyond_the_peers_ird_is_a_terminate_and_not_executed() -> None:
    """The requester's ORD (8) exceeds the responder's IRD (2), as with a peer that ignored
    the negotiated IRD: the third Atomic Request is a Terminate 0/2/0x07 at the responder,
    and only the first two change memory."""
    p = Pair(a_qp={"ord": 8}, b_qp={"ird": 2})
    word = p.b.mr(8, ALL)
    _fetch_adds(p, word, 3)
    p.step(p.a, p.b)  # all three arrive before any answer went out
    assert p.b.qp.state is QpState.TERMINATE
    error = p.b.qp.error
    assert error is not None and error.term == TERM_RDMAP_CATASTROPHIC_STREAM
    assert _LE64.unpack(word.buf)[0] == 2
    p.pump()
    term = p.a.qp.peer_terminate
    assert term is not None and term.cause == TERM_RDMAP_CATASTROPHIC_STREAM
    fatal = [e.event_type for e in iter(p.b.rnic.poll_async_event, None)]
    assert fatal == [AsyncEventType.QP_FATAL]
