"""Deferred LocalAtomics (stack.rnic.chains): a run's credit returned only once the receives
that arrived before its answer left have been examined, whatever order the send queue
reports completions in; ``qp.post_deferred`` for the application's own answers."""

from __future__ import annotations

import pytest

from stack.constants import ALL_ONES_64
from stack.errors import LocalError
from stack.rnic import (
    Branch,
    Chain,
    Cmp,
    Guard,
    LocalAtomic,
    LocalWrite,
    Patch,
    PatchField,
    QpState,
    RecvWR,
    Ref,
    SendFlags,
    SendWR,
    Sge,
    WaitRecv,
    WcOpcode,
    WrOpcode,
)
from tests.rnic.helpers import Pair, Side
from tests.rnic.test_chains import REQ, Client, Server

READ, REPLY, FALL_BACK = 1, 2, 9  # request indexes: Read then reply, reply only, no branch


class Counted:
    """Side b answers by chain, every run counted in ``out``: +1 when it starts, -1
    deferred after its reply (as kbtp.target_offload_credits counts request credits)."""

    def __init__(self, side: Side, server: Server) -> None:
        self.side = side
        self.counter = side.mr(16)
        self.out = Ref(self.counter.lkey, self.counter.base, 8, "little")
        self.spare = Ref(self.counter.lkey, self.counter.base + 8, 8, "little")
        start = LocalAtomic(self.out, Ref.run(0), 1)
        end = LocalAtomic(self.out, Ref.run(8), ALL_ONES_64, deferred=True)
        reply = SendWR(2, WrOpcode.SEND, inline_data=bytes(8), send_flags=SendFlags.NONE)
        read = SendWR(3, WrOpcode.RDMA_READ, (Sge(server.pool.base, 8, server.pool.lkey),))
        placed = LocalWrite(self.spare, bytes(8))  # after the Read: the reply waits for it
        which = Ref.recv(0, 4)
        branches = (
            Branch(
                (start, read, placed, reply, end),
                patches=(
                    Patch(1, PatchField.RKEY, Ref.recv(4, 4)),
                    Patch(1, PatchField.REMOTE_ADDR, Ref.recv(8, 8)),
                ),
                guards=(Guard(which, Cmp.EQ, READ),),
            ),
            Branch((start, reply, end), guards=(Guard(which, Cmp.EQ, REPLY),)),
        )
        side.qp.post_chain(Chain(7, WaitRecv(), branches, rearm=True, key=Ref.recv(16, 4)))

    def value(self) -> int:
        return int.from_bytes(self.counter.buf[:8], "little")


def _setup() -> tuple[Pair, Server, Client, Counted]:
    p = Pair(a_qp={"ird": 4, "ord": 4}, b_qp={"ird": 4, "ord": 4})
    server = Server(p.b)
    return p, server, Client(p.a), Counted(p.b, server)


def _send(client: Client, index: int, tag: int) -> None:
    """Post one request (``tag`` is the chain's key) and a receive for its reply."""
    side = client.side
    side.qp.post_recv(RecvWR(tag, (side.sge(client.inbox, 0, 8),)))
    request = REQ.pack(index, client.sink.rkey, client.sink.base, tag)
    side.qp.post_send(SendWR(tag, WrOpcode.SEND, inline_data=request, send_flags=SendFlags.NONE))


def _fell_back(side: Side) -> list[int]:
    return [wc.wr_id for wc in side.cq.poll(16) if wc.opcode is WcOpcode.RECV]


def test_a_credit_returns_once_the_request_that_arrived_with_it_is_examined() -> None:
    """Two requests in one read: the first is answered by a run, the second falls back.
    The run's -1 waits until the application has taken the second (ENABLE): for that
    request the answer was still out."""
    p, _server, client, counted = _setup()
    _send(client, REPLY, 1)
    _send(client, FALL_BACK, 2)
    p.pump()
    assert _fell_back(counted.side) == [1]  # receive slot 1 (the second) fell back
    assert counted.value() == 1  # answered, not yet credited to the request behind it
    counted.side.qp.post_recv(RecvWR(1, (counted.side.sge(_server.inbox, 64, 64),)))
    counted.side.qp.enable_chains()
    assert counted.value() == 0


def test_a_request_arriving_after_the_answer_left_finds_the_credit_returned() -> None:
    p, server, client, counted = _setup()
    _send(client, REPLY, 1)
    p.pump()
    assert counted.value() == 0  # nothing arrived before it left: returned at once
    _send(client, FALL_BACK, 2)
    p.pump()
    assert _fell_back(counted.side) and counted.value() == 0


def test_the_credit_follows_when_the_answer_left_not_when_its_completion_is_reported() -> None:
    """A reply run whose Send left at once, but whose completion the send queue reports
    only after an earlier run's RDMA Read (submit order, RFC 5040 §5.5): a request that
    arrives with that Read's Response came after the reply and does not count it; it
    does count the Read run, which answers only now."""
    p, _server, client, counted = _setup()
    _send(client, READ, 1)
    _send(client, REPLY, 2)
    p.step(p.a, p.b)  # both requests arrive: the Read Request and reply 2 leave
    assert counted.value() == 2
    p.step(p.b, p.a)  # reply 2 lands; the Read Response is queued at the client
    _send(client, FALL_BACK, 3)  # sent after seeing reply 2
    p.step(p.a, p.b)  # the Read Response and request 3 in one read
    assert _fell_back(counted.side) == [2]
    assert counted.value() == 1  # the Read run answered after request 3 arrived: out
    counted.side.qp.enable_chains()
    p.pump()
    assert counted.value() == 0


def test_the_application_defers_its_own_answers_the_same_way() -> None:
    """``post_deferred``: an answer the application sends while a request it has not taken
    waits in the queue is returned once that request has been examined."""
    p, server, client, counted = _setup()
    _send(client, FALL_BACK, 1)
    p.pump()
    assert _fell_back(counted.side) == [0]
    _send(client, REPLY, 2)  # waits: the queue is stalled on the fallback
    p.pump()
    qp = counted.side.qp
    counted.counter.buf[:8] = (1).to_bytes(8, "little")  # the application answered 1
    qp.post_deferred(LocalAtomic(counted.out, counted.spare, ALL_ONES_64, deferred=True))
    assert counted.value() == 1  # request 2 arrived before that answer
    qp.post_recv(RecvWR(0, (counted.side.sge(server.inbox, 0, 64),)))
    qp.enable_chains()  # the fallback is examined; request 2 runs (its guard saw 1)
    p.pump()
    assert counted.value() == 0


def test_deferred_items_the_queue_cannot_run_are_refused_and_a_failed_qp_drops_them() -> None:
    p, _server, client, counted = _setup()
    qp = counted.side.qp
    with pytest.raises(LocalError, match="works on MRs"):
        qp.post_deferred(LocalAtomic(counted.out, Ref.recv(0, 8), 1, deferred=True))
    indexed = Ref(counted.counter.lkey, counted.counter.base, 8, index=Ref.recv(0, 1))
    with pytest.raises(LocalError, match="no receive"):
        qp.post_deferred(LocalAtomic(counted.out, indexed, 1, deferred=True))
    with pytest.raises(LocalError, match="8 wide"):
        qp.post_deferred(LocalAtomic(Ref(counted.counter.lkey, 0, 4), counted.spare, 1))
    without = Pair()
    with pytest.raises(LocalError, match="no chain queue"):
        without.b.qp.post_deferred(LocalAtomic(counted.out, counted.spare, 1))
    _send(client, REPLY, 1)
    _send(client, FALL_BACK, 2)
    p.pump()
    assert counted.value() == 1
    qp.fatal(None, send_terminate=False, detail="test")
    assert qp.state is not QpState.RTS
    assert qp.chains is not None and not qp.chains._deferred  # dropped with the chains
    assert counted.value() == 1
