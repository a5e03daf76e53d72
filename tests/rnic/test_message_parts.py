"""Large messages leave in parts, one send pass at a time (issue 16).

A Write, Read Response or Send longer than a send pass (``MAX_COALESCE``) is taken from the
QP in parts of whole DDP segments (``MessagePart``), so the transport holds at most a pass
of it.  These tests hold the parts to the whole message byte for byte, and check that the
WR completes with its last part and that a Read Response's rest is still snapshotted.
"""

from __future__ import annotations

import random

import pytest

from stack.constants import DDP_LAST, DDP_TAGGED
from stack.errors import LocalError
from stack.rnic import Access, RecvWR, SendWR, WcOpcode, WcStatus, WrOpcode
from stack.rnic.endpoint import MAX_COALESCE
from stack.wire import ddp
from stack.wire.ddp import MAX_MESSAGE_LEN
from stack.wire.events import MessagePart, MpaSettings, RdmaWrite, Send
from stack.wire.framing import FpduDeframer
from tests.rnic.helpers import Pair, record_sent_messages

_REMOTE = Access.LOCAL_WRITE | Access.REMOTE_WRITE | Access.REMOTE_READ
_SIZE = 3 * MAX_COALESCE + 12345  # four parts, the last a short one


def _passes(pair: Pair, limit: int = MAX_COALESCE) -> list[bytes]:
    """What side ``a`` sends, one produce() (send pass) at a time, until it has nothing."""
    assert pair.a.endpoint is not None
    out = []
    while data := bytes(pair.a.endpoint.produce(limit)):
        out.append(data)
    return out


def _ulpdus(wire: bytes) -> list[bytes]:
    deframer = FpduDeframer(crc=True, markers=False)
    deframer.feed(wire)
    return [bytes(u) for u in iter(deframer.next_ulpdu, None)]


@pytest.mark.parametrize("opcode", [WrOpcode.RDMA_WRITE, WrOpcode.SEND])
def test_parts_put_the_same_bytes_on_the_wire_as_the_whole_message(opcode: WrOpcode) -> None:
    """Sent in passes of 1 MiB, a large Write or Send is byte for byte what one pass of it
    would be: the same segments, L on the last only, one MSN, MOs running on."""
    data = random.Random(1).randbytes(_SIZE)
    wires = []
    for limit in (MAX_COALESCE, 2 * _SIZE):
        pair = Pair()
        src = pair.a.mr(data)
        pair.a.qp.post_send(SendWR(1, opcode, (pair.a.sge(src),), rkey=0x77, remote_addr=2**64 - 5))
        passes = _passes(pair, limit)
        wires.append(b"".join(passes))
        if limit == MAX_COALESCE:
            assert len(passes) == 4
            assert all(len(p) <= MAX_COALESCE * 1.05 for p in passes)  # FPDU framing on top
    assert wires[0] == wires[1]
    ulpdus = _ulpdus(wires[0])
    assert [u[0] & DDP_LAST for u in ulpdus] == [0] * (len(ulpdus) - 1) + [DDP_LAST]
    if opcode is WrOpcode.SEND:
        assert {u[10:14] for u in ulpdus} == {(1).to_bytes(4, "big")}  # one MSN


def test_a_write_completes_with_its_last_part_and_lands_whole() -> None:
    pair = Pair()
    data = random.Random(2).randbytes(_SIZE)
    src = pair.a.mr(data)
    target = pair.b.mr(_SIZE, _REMOTE)
    wr = SendWR(
        5, WrOpcode.RDMA_WRITE, (pair.a.sge(src),), rkey=target.rkey, remote_addr=target.base
    )
    pair.a.qp.post_send(wr)
    assert pair.a.endpoint is not None and pair.b.endpoint is not None
    for k in range(4):
        assert pair.a.cq.poll() == [], f"completed before its last part ({k} sent)"
        sent = bytes(pair.a.endpoint.produce())
        assert 0 < len(sent) <= MAX_COALESCE * 1.05
        pair.b.endpoint.feed(sent)
    [wc] = pair.a.cq.poll()
    assert (wc.wr_id, wc.status, wc.opcode) == (5, WcStatus.SUCCESS, WcOpcode.RDMA_WRITE)
    assert bytes(target.buf) == data


def test_a_large_send_is_one_receive_completion() -> None:
    pair = Pair()
    data = random.Random(3).randbytes(_SIZE)
    sink = pair.b.mr(_SIZE + 100)
    pair.b.qp.post_recv(RecvWR(9, (pair.b.sge(sink),)))
    src = pair.a.mr(data)
    pair.a.qp.post_send(SendWR(1, WrOpcode.SEND, (pair.a.sge(src),)))
    pair.pump()
    [wc] = pair.b.cq.poll()
    assert (wc.wr_id, wc.status, wc.byte_len) == (9, WcStatus.SUCCESS, _SIZE)
    assert bytes(sink.buf[:_SIZE]) == data
    assert [w.status for w in pair.a.cq.poll()] == [WcStatus.SUCCESS]


def test_the_rest_of_a_read_response_is_snapshotted_before_a_later_write() -> None:
    """A Read Response half sent when a Write to its source arrives: the rest still carries
    the bytes from before the Write (RFC 5040 §5.5)."""
    pair = Pair()
    assert pair.a.endpoint is not None and pair.b.endpoint is not None
    before = random.Random(4).randbytes(_SIZE)
    source = pair.b.mr(before, _REMOTE)
    sink = pair.a.mr(_SIZE)
    pair.a.qp.post_send(
        SendWR(
            1, WrOpcode.RDMA_READ, (pair.a.sge(sink),), rkey=source.rkey, remote_addr=source.base
        )
    )
    pair.step(pair.a, pair.b)  # the Read Request reaches the responder
    pair.step(pair.b, pair.a)  # the first part of its response goes out
    assert pair.b.qp.has_outgoing  # the rest is queued
    after = pair.a.mr(b"\xff" * _SIZE)
    pair.a.qp.post_send(
        SendWR(
            2, WrOpcode.RDMA_WRITE, (pair.a.sge(after),), rkey=source.rkey, remote_addr=source.base
        )
    )
    pair.pump()
    assert bytes(source.buf) == b"\xff" * _SIZE  # the Write was placed
    assert bytes(sink.buf) == before  # and the Read returned what came before it
    assert sorted(w.wr_id for w in pair.a.cq.poll() if w.status is WcStatus.SUCCESS) == [1, 2]


def test_a_send_message_hook_sees_a_large_message_whole() -> None:
    pair = Pair()
    seen = record_sent_messages(pair.a.engine)
    src = pair.a.mr(_SIZE)
    pair.a.qp.post_send(SendWR(1, WrOpcode.RDMA_WRITE, (pair.a.sge(src),), rkey=3, remote_addr=0))
    assert len(_passes(pair)) == 1
    assert [(type(m), len(m.data)) for m in seen] == [(RdmaWrite, _SIZE)]  # type: ignore[union-attr]


def test_segmenting_a_part_clears_l_and_runs_mo_on() -> None:
    tagged = ddp.segment_tagged_parts(1, 100, 0, bytes(300), 128, last=False)
    assert [h[0] & (DDP_TAGGED | DDP_LAST) for h, _ in tagged] == [DDP_TAGGED] * 3
    single = ddp.segment_tagged_parts(1, 100, 0, bytes(10), 128, last=False)
    assert single[0][0][0] & DDP_LAST == 0
    untagged = ddp.segment_untagged_parts(0, 1, 0, bytes(300), 128, mo=1000, last=False)
    mos = [int.from_bytes(h[14:18], "big") for h, _ in untagged]
    assert mos == [1000, 1110, 1220]
    assert all(not h[0] & DDP_LAST for h, _ in untagged)
    last = ddp.segment_untagged_parts(0, 1, 0, bytes(300), 128, mo=1000)
    assert [h[0] & DDP_LAST for h, _ in last] == [0, 0, DDP_LAST]
    with pytest.raises(LocalError, match="out of range"):
        ddp.segment_untagged_parts(0, 1, 0, bytes(300), 128, mo=MAX_MESSAGE_LEN - 100)


def test_message_parts_encode_like_the_message_they_cut() -> None:
    """Encoded one after the other, the parts of a Send are the Send's segments."""
    pair_whole, pair_parts = Pair(), Pair()
    data = bytes(range(256)) * 700
    room = pair_whole.a.engine.part_mulpdu() - 18
    pair_whole.a.engine.send_messages([Send(data, True, 0x1234)])
    pair_parts.a.engine.send_messages(
        [
            MessagePart(Send(data[: 2 * room], True, 0x1234), 0, False),
            MessagePart(Send(data[2 * room :], True, 0x1234), 2 * room, True),
            Send(b"next"),
        ]
    )
    whole = bytes(pair_whole.a.engine.data_to_send())
    parts = bytes(pair_parts.a.engine.data_to_send())
    assert parts.startswith(whole)
    assert _ulpdus(parts[len(whole) :])[0][10:14] == (2).to_bytes(4, "big")  # the next MSN


def test_a_large_write_with_immediate_completes_once_after_its_immediate_data() -> None:
    pair = Pair()
    data = random.Random(5).randbytes(_SIZE)
    src = pair.a.mr(data)
    target = pair.b.mr(_SIZE, _REMOTE)
    pair.b.qp.post_recv(RecvWR(7, ()))
    pair.a.qp.post_send(
        SendWR(
            3,
            WrOpcode.RDMA_WRITE_WITH_IMM,
            (pair.a.sge(src),),
            imm_data=0xABCD,
            rkey=target.rkey,
            remote_addr=target.base,
        )
    )
    passes = 0
    while pair.step(pair.a, pair.b):  # the Write's parts, the Immediate Data with the last
        passes += 1
        pair.step(pair.b, pair.a)
    assert passes == 4
    assert [(w.wr_id, w.status) for w in pair.a.cq.poll()] == [(3, WcStatus.SUCCESS)]
    [wc] = pair.b.cq.poll()
    assert (wc.wr_id, wc.status, wc.imm_data) == (7, WcStatus.SUCCESS, (0xABCD).to_bytes(8, "big"))
    assert bytes(target.buf) == data


def test_a_pass_limit_below_a_segment_still_cuts_whole_segments() -> None:
    """A send pass of fewer bytes than a segment takes one segment per pass, and a message
    that is not longer than a segment whole: never an empty last part."""
    data = random.Random(6).randbytes(3000)
    wires = []
    for limit in (100, 2 * len(data)):
        pair = Pair(MpaSettings(mulpdu=1024))
        src = pair.a.mr(data)
        pair.a.qp.post_send(SendWR(1, WrOpcode.SEND, (pair.a.sge(src),)))
        passes = _passes(pair, limit)
        wires.append(b"".join(passes))
        assert len(passes) == (3 if limit == 100 else 1)
    assert wires[0] == wires[1]
    assert all(len(u) > 18 for u in _ulpdus(wires[0]))  # no empty segment
