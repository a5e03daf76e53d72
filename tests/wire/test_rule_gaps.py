"""Rules no other test named: DDP-12, DDP-13, RDMAP-15, EXT-07, EXT-08, EXT-10 and SEC-02,
SEC-05, SEC-11, SEC-12, SEC-13, SEC-15, each asserted against the real stack.

The in-memory pairs of :mod:`tests.rnic.helpers` carry the real wire bytes between two
software RNICs; :class:`SharedResponder` adds a second stream into an existing RNIC (and a
PD of choice), for the rules about several streams of one RNIC.  Each test is written so
that an implementation ignoring its rule would fail it.
"""

from __future__ import annotations

import struct

import pytest
import trio

from stack.constants import (
    TERM_DDP_T_INVALID_STAG,
    TERM_DDP_T_STAG_NOT_ASSOCIATED,
    Opcode,
)
from stack.errors import DdpError, LocalError, ProtocolError
from stack.rnic import (
    Access,
    QpState,
    RecvWR,
    Rnic,
    SendFlags,
    SendWR,
    WcOpcode,
    WcStatus,
    WrOpcode,
)
from stack.rnic.memory import MemoryRegion
from stack.wire.events import AtomicResponse, PeerClosed, RdmaWrite
from stack.wire.stream import RdmapStream
from tests.rnic.helpers import Pair, SharedResponder, opcodes

RW = Access.LOCAL_WRITE | Access.REMOTE_WRITE
RR = Access.LOCAL_WRITE | Access.REMOTE_READ
RA = Access.LOCAL_WRITE | Access.REMOTE_ATOMIC
ALL = RW | RR | RA
_LE64 = struct.Struct("<Q")


def fetch_add(wr_id: int, p: Pair, result: MemoryRegion, word: MemoryRegion, add: int = 1):
    return SendWR(
        wr_id,
        WrOpcode.ATOMIC_FETCH_AND_ADD,
        (p.a.sge(result),),
        rkey=word.rkey,
        remote_addr=word.base,
        compare_add=add,
    )


def cmp_swap(wr_id: int, p: Pair, result: MemoryRegion, word: MemoryRegion, old: int, new: int):
    return SendWR(
        wr_id,
        WrOpcode.ATOMIC_CMP_AND_SWP,
        (p.a.sge(result),),
        rkey=word.rkey,
        remote_addr=word.base,
        compare_add=old,
        swap=new,
        swap_mask=(1 << 64) - 1,
    )


def read(wr_id: int, p: Pair, sink: MemoryRegion, source: MemoryRegion, offset: int = 0):
    return SendWR(
        wr_id,
        WrOpcode.RDMA_READ,
        (p.a.sge(sink),),
        rkey=source.rkey,
        remote_addr=source.base + offset,
    )


def write(wr_id: int, data: bytes, target: MemoryRegion, offset: int = 0, rkey: int | None = None):
    return SendWR(
        wr_id,
        WrOpcode.RDMA_WRITE,
        inline_data=data,
        rkey=target.rkey if rkey is None else rkey,
        remote_addr=target.base + offset,
    )


def u64(mr: MemoryRegion) -> int:
    return _LE64.unpack_from(mr.buf)[0]


# ======================================================================================
# EXT-07: atomicity against other atomics of the same RNIC (RFC 7306 §5.3)
# ======================================================================================


def test_ext_07_fetch_adds_of_two_streams_into_one_rnic_lose_no_update() -> None:
    """Two requesters FetchAdd the same word through two QPs of one RNIC, every request of
    both streams arriving before any response leaves: each add sees the previous one, so
    the originals are exactly 0..2n-1 and the word ends at 2n.  An RNIC that read the word
    on arrival but wrote it later (or per QP) would return duplicates and lose adds."""
    first = Pair()
    word = first.b.mr(8, RA)
    second = SharedResponder(first.b.rnic, first.b.pd)
    n = 12  # within the default ORD/IRD of 16: all requests of a stream go out at once
    results = {id(p): [p.a.mr(8) for _ in range(n)] for p in (first, second)}
    for p in (first, second):
        p.a.qp.post_send([fetch_add(i, p, r, word) for i, r in enumerate(results[id(p)])])
    first.step(first.a, first.b)
    second.step(second.a, second.b)  # the RNIC holds 2n requests, no response sent yet
    first.pump()
    second.pump()
    for p in (first, second):
        wcs = p.a.cq.poll()
        assert [(wc.opcode, wc.status) for wc in wcs] == [
            (WcOpcode.FETCH_ADD, WcStatus.SUCCESS)
        ] * n
    originals = sorted(u64(r) for p in (first, second) for r in results[id(p)])
    assert originals == list(range(2 * n))
    assert u64(word) == 2 * n


def test_ext_07_compare_and_swap_from_two_streams_has_exactly_one_winner() -> None:
    """Both streams try to take a lock word (0 -> their ID) at the same time: one CmpSwap
    sees 0 and wins, the other sees the winner's ID and changes nothing."""
    first = Pair()
    lock = first.b.mr(8, RA)
    second = SharedResponder(first.b.rnic, first.b.pd)
    results = {}
    for owner, p in ((0xA, first), (0xB, second)):
        results[owner] = p.a.mr(bytes([0xEE] * 8))
        p.a.qp.post_send(cmp_swap(1, p, results[owner], lock, 0, owner))
    first.step(first.a, first.b)
    second.step(second.a, second.b)
    first.pump()
    second.pump()
    seen = {owner: u64(mr) for owner, mr in results.items()}
    winner = u64(lock)
    assert winner in (0xA, 0xB)
    loser = 0xA + 0xB - winner
    assert seen == {winner: 0, loser: winner}


# ======================================================================================
# EXT-08: ordering rules of atomics (RFC 7306 §5.4)
# ======================================================================================


def test_ext_08_atomic_and_read_responses_keep_request_order() -> None:
    """Read, FetchAdd, Read of one word in one burst: the responses come back in request
    order and carry the values of that order (Read responses are zero copy, so the RNIC
    must snapshot a queued response before an atomic changes the memory under it)."""
    p = Pair()
    word = p.b.mr(_LE64.pack(40), ALL)
    before, result, after = p.a.mr(8), p.a.mr(8), p.a.mr(8)
    p.a.qp.post_send(
        [read(1, p, before, word), fetch_add(2, p, result, word, add=2), read(3, p, after, word)]
    )
    p.step(p.a, p.b)  # all three requests are at the responder before it answers any
    p.step(p.b, p.a)
    assert opcodes(p.b.sent[-1]) == [
        Opcode.RDMA_READ_RESPONSE,
        Opcode.ATOMIC_RESPONSE,
        Opcode.RDMA_READ_RESPONSE,
    ]
    p.pump()
    assert (u64(before), u64(result), u64(after), u64(word)) == (40, 40, 42, 42)
    assert [wc.wr_id for wc in p.a.cq.poll()] == [1, 2, 3]


def test_ext_08_atomic_sees_an_earlier_write() -> None:
    p = Pair()
    word = p.b.mr(8, ALL)
    result = p.a.mr(8)
    p.a.qp.post_send([write(1, _LE64.pack(40), word), fetch_add(2, p, result, word, add=2)])
    p.pump()
    assert (u64(result), u64(word)) == (40, 42)


def test_ext_08_atomic_completes_only_when_its_response_is_delivered() -> None:
    """Until the Atomic Response arrives, the atomic has not completed, its result buffer is
    untouched, and a later Send (already handed to the LLP) does not complete before it."""
    p = Pair()
    word = p.b.mr(_LE64.pack(7), RA)
    inbox = p.b.mr(8)
    p.b.qp.post_recv(RecvWR(1, (p.b.sge(inbox),)))
    result = p.a.mr(bytes([0xEE] * 8))
    p.a.qp.post_send(
        [
            fetch_add(1, p, result, word),
            SendWR(2, WrOpcode.SEND, inline_data=b"after", send_flags=SendFlags.SIGNALED),
        ]
    )
    p.step(p.a, p.b)  # request and Send delivered; the response is still at the responder
    assert u64(word) == 8  # executed at the responder ...
    assert p.a.cq.poll() == []  # ... but not complete at the requester
    assert bytes(result.buf) == bytes([0xEE] * 8)
    p.step(p.b, p.a)
    assert [(wc.wr_id, wc.opcode) for wc in p.a.cq.poll()] == [
        (1, WcOpcode.FETCH_ADD),
        (2, WcOpcode.SEND),
    ]
    assert u64(result) == 7


# ======================================================================================
# EXT-10: QN-1 buffers for Reads plus atomics, QN-3 buffers for atomics (RFC 7306 §5.2.2)
# ======================================================================================


@pytest.mark.parametrize("kinds", ["AAA", "RAA", "ARR"])
def test_ext_10_atomics_take_ird_slots_like_reads(kinds: str) -> None:
    """With IRD 2, a third outstanding request, Read or atomic, overflows the responder's
    QN-1 resources: Terminate 0/2/0x07.  Not counting atomics would accept it."""
    p = Pair(a_qp={"ord": 8}, b_qp={"ird": 2})
    word = p.b.mr(8, ALL)
    sinks = [p.a.mr(8) for _ in kinds]
    p.a.qp.post_send(
        [
            fetch_add(i, p, s, word) if k == "A" else read(i, p, s, word)
            for i, (k, s) in enumerate(zip(kinds, sinks, strict=True))
        ]
    )
    p.pump()
    term = p.a.qp.peer_terminate
    assert term is not None and term.cause == (0, 2, 0x07)
    assert p.b.qp.state is QpState.TERMINATE


def test_ext_10_atomics_count_against_ord_at_the_requester() -> None:
    """With ORD 1 a Read waits behind an unanswered atomic and vice versa: one request on
    the wire at a time, every operation completing in order."""
    p = Pair(a_qp={"ord": 1})
    word = p.b.mr(8, ALL)
    r1, sink, r2 = p.a.mr(8), p.a.mr(8), p.a.mr(8)
    p.a.qp.post_send([fetch_add(1, p, r1, word), read(2, p, sink, word), fetch_add(3, p, r2, word)])
    assert p.a.qp.outstanding_remote == 1
    p.step(p.a, p.b)
    assert opcodes(p.a.sent[-1]) == [Opcode.ATOMIC_REQUEST]
    p.step(p.b, p.a)
    p.step(p.a, p.b)
    assert opcodes(p.a.sent[-1]) == [Opcode.RDMA_READ_REQUEST]
    p.pump()
    assert [(wc.wr_id, wc.status) for wc in p.a.cq.poll()] == [
        (i, WcStatus.SUCCESS) for i in (1, 2, 3)
    ]
    assert (u64(r1), u64(sink), u64(r2), u64(word)) == (0, 1, 1, 2)


def test_ext_10_an_answered_atomic_returns_its_ird_slot() -> None:
    """IRD 1: atomics one after another all succeed, each slot returned once answered."""
    p = Pair(a_qp={"ord": 1}, b_qp={"ird": 1})
    word = p.b.mr(8, RA)
    results = [p.a.mr(8) for _ in range(5)]
    p.a.qp.post_send([fetch_add(i, p, r, word) for i, r in enumerate(results)])
    p.pump()
    assert [wc.status for wc in p.a.cq.poll()] == [WcStatus.SUCCESS] * 5
    assert [u64(r) for r in results] == [0, 1, 2, 3, 4] and u64(word) == 5


def test_ext_10_an_atomic_response_needs_an_outstanding_atomic() -> None:
    """QN-3 buffers exist only for the requester's outstanding atomics: an Atomic Response
    nobody asked for is an error (Terminate 0/2/0x07), not a completion."""
    p = Pair()
    p.a.engine.send_message(AtomicResponse(1, 0x29))  # b has no atomic outstanding
    p.pump()
    assert p.b.qp.state is QpState.TERMINATE
    assert p.b.qp.error is not None and p.b.qp.error.term == (0, 2, 0x07)
    term = p.a.qp.peer_terminate
    assert term is not None and term.cause == (0, 2, 0x07)
    assert p.b.cq.poll() == []


# ======================================================================================
# DDP-12 / SEC-02: STag association (RFC 5041 §8.2, RFC 5040 §8.1.1(2))
# ======================================================================================


def test_ddp_12_pd_mismatch_places_nothing_and_is_a_local_error() -> None:
    """A tagged segment for an STag of another PD of the same RNIC: no placement, a local
    DdpError with Terminate 1/1/0x02 at the sink; a stream of that PD may use it."""
    p = Pair()
    other_pd = p.b.rnic.alloc_pd()
    target = other_pd.reg_mr(bytearray(16), RW)
    p.a.qp.post_send(write(1, b"intruder", target))
    p.pump()
    assert bytes(target.buf) == bytes(16)
    error = p.b.qp.error
    assert isinstance(error, DdpError) and error.term == TERM_DDP_T_STAG_NOT_ASSOCIATED
    term = p.a.qp.peer_terminate
    assert term is not None and term.cause == TERM_DDP_T_STAG_NOT_ASSOCIATED
    owner = SharedResponder(p.b.rnic, other_pd)
    owner.a.qp.post_send(write(1, b"owner!!!", target))
    owner.pump()
    assert bytes(target.buf[:8]) == b"owner!!!" and owner.b.qp.state is QpState.RTS


def test_ddp_12_sec_02_stream_scoped_stag_is_refused_on_another_stream_of_its_pd() -> None:
    first = Pair()
    second = SharedResponder(first.b.rnic, first.b.pd)  # same RNIC, same PD
    target = first.b.pd.reg_mr(bytearray(16), RW, qp=first.b.qp)
    first.a.qp.post_send(write(1, b"stream 1", target))
    first.pump()
    second.a.qp.post_send(write(1, b"stream 2", target, offset=8))
    second.pump()
    assert bytes(target.buf) == b"stream 1" + bytes(8)
    term = second.a.qp.peer_terminate
    assert term is not None and term.cause == TERM_DDP_T_STAG_NOT_ASSOCIATED


def test_sec_02_an_stag_of_one_streams_pd_is_refused_on_another_stream_of_the_rnic() -> None:
    """Each stream with its PD (SEC-03): stream 2 cannot write, read or FetchAdd through
    stream 1's STag, and stream 1 keeps working after stream 2 was terminated."""
    first = Pair()
    mine = first.b.mr(bytes(range(16)), ALL)
    for op in ("write", "read", "atomic"):
        second = SharedResponder(first.b.rnic, first.b.rnic.alloc_pd())
        sink = second.a.mr(8)
        wr = {
            "write": write(1, b"stream 2", mine),
            "read": read(1, second, sink, mine),
            "atomic": fetch_add(1, second, sink, mine),
        }[op]
        second.a.qp.post_send(wr)
        second.pump()
        term = second.a.qp.peer_terminate
        assert term is not None and term.cause in ((1, 1, 0x02), (0, 1, 0x03)), op
        assert bytes(mine.buf) == bytes(range(16)) and bytes(sink.buf) == bytes(8), op
    first.a.qp.post_send(write(1, b"stream 1", mine))
    first.pump()
    assert bytes(mine.buf[:8]) == b"stream 1"


# ======================================================================================
# DDP-13: teardown (RFC 5041 §6.2)
# ======================================================================================


def test_ddp_13_graceful_close_flushes_queued_messages_and_fails_new_requests() -> None:
    p = Pair()
    inbox = p.b.mr(8)
    p.b.qp.post_recv(RecvWR(1, (p.b.sge(inbox),)))
    p.a.qp.post_send(SendWR(1, WrOpcode.SEND, inline_data=b"last"))
    p.a.qp.close()
    with pytest.raises(LocalError):
        p.a.qp.post_send(SendWR(2, WrOpcode.SEND, inline_data=b"too late"))
    assert p.a.endpoint is not None and not p.a.endpoint.wants_close  # the Send is queued
    p.pump()
    assert bytes(inbox.buf[:4]) == b"last"
    assert [wc.wr_id for wc in p.b.cq.poll()] == [1]
    assert p.a.endpoint.wants_close


def test_ddp_13_fin_is_reported_and_later_data_is_an_error() -> None:
    """The peer's graceful close is reported to the ULP; bytes claimed to arrive after it
    are refused, never decoded."""
    p = Pair()
    engine = p.b.engine
    engine.receive_data(b"")
    assert isinstance(engine.next_event(), PeerClosed)
    with pytest.raises(LocalError):
        engine.receive_data(b"\x00\x10")


def test_ddp_13_half_close_keeps_the_other_direction_working() -> None:
    """The peer's FIN ends reading only: what was posted before it still goes out and
    completes.  The QP is CLOSING (RFC 5040 §6.2): no new WRs, FIN once all is sent."""
    p = Pair()
    assert p.a.endpoint is not None and p.b.endpoint is not None
    target = p.b.mr(8, RW)
    p.a.qp.post_send(write(1, b"goodbye!", target))  # queued, not handed to TCP yet
    assert p.a.endpoint.feed(b"") is False  # the responder closed its sending half
    assert p.a.endpoint.peer_closed and p.a.qp.state is QpState.CLOSING
    assert not p.a.endpoint.wants_close  # the Write is still to go
    with pytest.raises(LocalError):
        p.a.qp.post_send(write(2, b"too late", target))
    p.b.endpoint.feed(bytes(p.a.endpoint.produce()))
    assert bytes(target.buf) == b"goodbye!" and p.b.qp.state is QpState.RTS
    assert [(wc.wr_id, wc.status) for wc in p.a.cq.poll()] == [(1, WcStatus.SUCCESS)]
    assert p.a.endpoint.wants_close


def test_ddp_13_invalid_ddp_header_is_fatal_but_the_terminate_still_goes_out() -> None:
    """A bad DDP version: reported, later segments refused, outstanding requests failed,
    and the transmit side stays open for the Terminate."""
    stream = RdmapStream(1442)
    bad = bytes([0x43, 0x43]) + bytes(16)  # untagged, DV 3
    with pytest.raises(DdpError) as info:
        stream.receive_ulpdu(bad)
    good = RdmapStream(1442).send(RdmaWrite(0x1234, 0, b"valid"))[0]
    with pytest.raises(DdpError) as again:
        stream.receive_ulpdu(good)  # DDP-10: nothing more is placed after the error
    assert again.value.term == info.value.term
    assert stream.send(stream.terminate_message(info.value, bad))  # transmit still open
    p = Pair()
    p.b.qp.post_recv(RecvWR(7, ()))
    assert p.b.endpoint is not None
    p.a.engine.mpa.send_ulpdu(bad)
    p.b.endpoint.feed(bytes(p.a.engine.data_to_send()))
    assert isinstance(p.b.endpoint.error, DdpError)
    assert [(wc.wr_id, wc.status) for wc in p.b.cq.poll()] == [(7, WcStatus.WR_FLUSH_ERR)]
    p.step(p.b, p.a)
    term = p.a.qp.peer_terminate
    assert term is not None and term.layer == 1 and term.cause == (1, 2, 0x06)


# ======================================================================================
# RDMAP-15: Terminate on errors, then a graceful LLP close (RFC 5040 §6.2.1)
# ======================================================================================


def test_rdmap_15_an_error_sends_one_terminate_and_then_asks_to_close() -> None:
    """After a Read of an invalid STag the responder sends exactly one FPDU, a Terminate,
    wants the connection closed, and sends nothing more however the ULP posts."""
    p = Pair()
    sink = p.a.mr(8)
    p.a.qp.post_send(SendWR(1, WrOpcode.RDMA_READ, (p.a.sge(sink),), rkey=0xBAD00, remote_addr=0))
    p.step(p.a, p.b)
    assert p.b.endpoint is not None and p.b.endpoint.wants_close
    wire = bytes(p.b.endpoint.produce())
    assert opcodes(wire) == [Opcode.TERMINATE]
    p.b.qp.post_send(SendWR(2, WrOpcode.SEND, inline_data=b"more"))
    assert bytes(p.b.endpoint.produce()) == b""
    assert [wc.status for wc in p.b.cq.poll()] == [WcStatus.WR_FLUSH_ERR]


async def test_rdmap_15_over_tcp_the_terminate_is_followed_by_fin_not_reset() -> None:
    """Over TCP the peer reads the Terminate and then an orderly end of stream (FIN): a
    reset would make the read fail, possibly before the Terminate was read."""
    from stack.transport.cm import ConnectionManager
    from stack.wire.events import TerminateReceived
    from tests.e2e.helpers import make_host
    from tests.e2e.test_hostile import _accept_one, _raw_initiator, _read_until_closed

    server = make_host("s")
    async with ConnectionManager.open(server.rnic) as cm:
        listener = await cm.listen("127.0.0.1", 0)
        cm.nursery.start_soon(_accept_one, listener, server)
        stream, engine = await _raw_initiator(listener.port)
        engine.send_message(RdmaWrite(0xBAD00, 0, b"no such STag"))
        await stream.send_all(engine.data_to_send())
        events = await _read_until_closed(stream, engine)  # raises on a reset
        terms = [e for e in events if isinstance(e, TerminateReceived)]
        assert [t.terminate.cause for t in terms] == [TERM_DDP_T_INVALID_STAG]
        assert isinstance(events[-1], PeerClosed)
        await stream.aclose()
        assert server.conn is not None
        with trio.fail_after(10):
            await server.conn.wait_closed()
        assert server.qp.state is QpState.ERROR


# ======================================================================================
# SEC-05, SEC-11, SEC-12, SEC-13, SEC-15 (RFC 5042, RFC 5040 §8, RFC 5041 §8)
# ======================================================================================


@pytest.mark.parametrize(
    ("case", "cause"),
    [
        ("inside", None),
        ("one_past_the_end", (1, 1, 0x01)),
        ("before_the_start", (1, 1, 0x01)),
        ("without_the_right", (0, 1, 0x02)),
        ("after_invalidate", (1, 1, 0x00)),
        ("after_dereg", (1, 1, 0x00)),
    ],
)
def test_sec_05_an_stag_binds_exactly_its_buffer_range_and_rights_until_unbound(
    case: str, cause: tuple[int, int, int] | None
) -> None:
    """An STag registered for 16 octets in the middle of a larger buffer, remote write
    only: a Write inside lands; one octet outside it, a Read (a right it lacks), or any
    access after invalidation or deregistration is refused and changes nothing."""
    p = Pair()
    backing = bytearray(b"-" * 48)
    mr = p.b.pd.reg_mr(memoryview(backing)[16:32], RW)
    stag = mr.rkey
    if case == "after_invalidate":
        mr.invalidate()
    elif case == "after_dereg":
        mr.dereg()
        assert p.b.rnic.table.lookup(stag) is None
    sink = p.a.mr(16)
    wr = {
        "one_past_the_end": write(1, b"x" * 16, mr, offset=1, rkey=stag),
        "before_the_start": write(1, b"x", mr, offset=-1, rkey=stag),
        "without_the_right": read(1, p, sink, mr),
    }.get(case, write(1, b"x" * 16, mr, rkey=stag))
    p.a.qp.post_send(wr)
    p.pump()
    term = p.a.qp.peer_terminate
    if cause is None:
        assert term is None and bytes(backing) == b"-" * 16 + b"x" * 16 + b"-" * 16
        return
    assert term is not None and term.cause == cause
    assert bytes(backing) == b"-" * 48 and bytes(sink.buf) == bytes(16)


def test_sec_05_reregistering_a_buffer_binds_a_new_stag_and_the_old_stays_dead() -> None:
    p = Pair()
    backing = bytearray(16)
    old = p.b.pd.reg_mr(backing, RW)
    old_stag = old.rkey
    old.dereg()
    new = p.b.pd.reg_mr(backing, RW)
    assert new.rkey != old_stag
    p.a.qp.post_send([write(1, b"new stag", new), write(2, b"old stag", new, 8, rkey=old_stag)])
    p.pump()
    assert bytes(backing) == b"new stag" + bytes(8)
    term = p.a.qp.peer_terminate
    assert term is not None and term.cause == (1, 1, 0x00)


def test_sec_11_the_device_caps_every_qps_ird_and_ord_and_enforces_them() -> None:
    """The RNIC, not the ULP, decides the IRD/ORD resources: a QP asking for 64 gets the
    device's 2, and a third inbound Read is refused (Terminate 0/2/0x07)."""
    rnic = Rnic("capped", max_ird=2, max_ord=3)
    pd = rnic.alloc_pd()
    qp = rnic.create_qp(pd, rnic.create_cq(), ird=64, ord=64)
    assert (qp.ird, qp.ord) == (2, 3)
    p = SharedResponder(rnic, pd, a_qp={"ord": 8}, b_qp={"ird": 64})
    source = p.b.mr(8, RR)
    sinks = [p.a.mr(8) for _ in range(3)]
    p.a.qp.post_send([read(i, p, s, source) for i, s in enumerate(sinks)])
    p.pump()
    term = p.a.qp.peer_terminate
    assert term is not None and term.cause == (0, 2, 0x07)


def test_sec_11_registration_refuses_memory_the_caller_cannot_write() -> None:
    """An STag is bound only to memory the registering process owns writably."""
    pd = Rnic().alloc_pd()
    for buffer in (b"read-only bytes", memoryview(bytearray(8)).toreadonly()):
        with pytest.raises(LocalError):
            pd.reg_mr(buffer, RW)


def test_sec_12_a_write_only_buffer_takes_writes_and_refuses_reads_and_atomics() -> None:
    writes = Pair()
    target = writes.b.mr(8, RW)
    writes.a.qp.post_send(write(1, b"written!", target))
    writes.pump()
    assert bytes(target.buf) == b"written!" and writes.a.qp.peer_terminate is None
    for op in ("read", "atomic"):
        p = Pair()
        mr = p.b.mr(b"written!", RW)
        sink = p.a.mr(8)
        p.a.qp.post_send(read(1, p, sink, mr) if op == "read" else fetch_add(1, p, sink, mr))
        p.pump()
        term = p.a.qp.peer_terminate
        assert term is not None and term.cause == (0, 1, 0x02), op
        assert isinstance(p.b.qp.error, ProtocolError) and p.b.qp.error.rule == "SEC-12"
        assert bytes(sink.buf) == bytes(8) and bytes(mr.buf) == b"written!", op


@pytest.mark.parametrize(("offset", "length"), [(0, 8), (0, 9), (-1, 1), (8, 1)])
def test_sec_13_exposed_bounds_are_exact_within_a_larger_buffer(offset: int, length: int) -> None:
    """Only the exposed 8 octets can be read, not the secrets on either side of them."""
    p = Pair()
    backing = bytearray(b"secret!!" + b"public.." + b"secret!!")
    exposed = p.b.pd.reg_mr(memoryview(backing)[8:16], RR)
    sink = p.a.mr(length)
    p.a.qp.post_send(read(1, p, sink, exposed, offset))
    p.pump()
    if (offset, length) == (0, 8):
        assert bytes(sink.buf) == b"public.." and p.a.qp.peer_terminate is None
    else:
        term = p.a.qp.peer_terminate
        assert term is not None and term.cause == (0, 1, 0x01)
        assert b"secret" not in bytes(sink.buf)


def test_sec_13_read_access_ends_when_the_ulp_revokes_it() -> None:
    """Read access granted for one transfer: after the ULP invalidates the STag the same
    Read is refused (Terminate 0/1/0x00)."""
    p = Pair()
    exposed = p.b.mr(b"for once", RR)
    sink = p.a.mr(8)
    p.a.qp.post_send(read(1, p, sink, exposed))
    p.pump()
    assert bytes(sink.buf) == b"for once"
    exposed.invalidate()
    sink.buf[:] = bytes(8)
    p.a.qp.post_send(read(2, p, sink, exposed))
    p.pump()
    term = p.a.qp.peer_terminate
    assert term is not None and term.cause == (0, 1, 0x00) and bytes(sink.buf) == bytes(8)


def test_sec_15_invalid_stag_use_reaches_the_ulp_and_ends_the_stream() -> None:
    """A Write with an invalid STag: the sink's ULP sees the error (the QP's error and its
    receive flushed), the stream ends on both sides, and later work is flushed."""
    p = Pair()
    p.b.qp.post_recv(RecvWR(5, ()))
    target = p.b.mr(8, RW)
    p.a.qp.post_send(write(1, b"bad stag", target, rkey=target.rkey ^ 0x5A5A5A00))
    p.pump()
    error = p.b.qp.error
    assert isinstance(error, DdpError) and error.term == TERM_DDP_T_INVALID_STAG
    assert [(wc.wr_id, wc.status) for wc in p.b.cq.poll()] == [(5, WcStatus.WR_FLUSH_ERR)]
    assert p.a.qp.state is QpState.TERMINATE and p.b.qp.state is QpState.TERMINATE
    term = p.a.qp.peer_terminate
    assert term is not None and term.cause == TERM_DDP_T_INVALID_STAG
    p.a.qp.post_send(write(2, b"again!!!", target))
    assert [wc.status for wc in p.a.cq.poll()][-1] is WcStatus.WR_FLUSH_ERR
    assert bytes(target.buf) == bytes(8)
    p.close_streams()
    assert p.a.qp.state is QpState.ERROR and p.b.qp.state is QpState.ERROR


# ======================================================================================
# SEC-07: an STag several streams can use is not remotely invalidatable (RFC 5042 §6.4.5)
# ======================================================================================


def _send_invalidate(wr_id: int, stag: int) -> SendWR:
    return SendWR(
        wr_id, WrOpcode.SEND_WITH_INV, inline_data=b"x", send_flags=SendFlags.INLINE,
        invalidate_rkey=stag,
    )  # fmt: skip


def test_sec_07_a_pd_shared_by_two_streams_refuses_remote_invalidation() -> None:
    first = Pair()
    second = SharedResponder(first.b.rnic, first.b.pd)  # the PD now serves two streams
    shared = first.b.fast_mr(16, RW)  # remotely invalidatable, were it not shared
    second.b.qp.post_recv(RecvWR(1, (second.b.sge(second.b.mr(16)),)))
    second.a.qp.post_send(_send_invalidate(1, shared.rkey))
    second.pump()
    term = second.a.qp.peer_terminate
    assert term is not None and term.cause == (0, 1, 0x09)  # cannot invalidate
    assert shared.valid  # stream 1 still uses it
    first.a.qp.post_send(write(1, b"still ok", shared))
    first.pump()
    assert bytes(shared.buf[:8]) == b"still ok"


def test_sec_07_a_stream_scoped_stag_is_invalidated_by_its_own_streams_peer() -> None:
    first = Pair()
    SharedResponder(first.b.rnic, first.b.pd)
    own = first.b.fast_mr(16, RW, scoped=True)
    first.b.qp.post_recv(RecvWR(1, (first.b.sge(first.b.mr(16)),)))
    first.a.qp.post_send(_send_invalidate(1, own.rkey))
    first.pump()
    assert first.a.qp.peer_terminate is None
    assert not own.valid
