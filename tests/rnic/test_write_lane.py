"""The sender's Write lane and the cheaper constructors of the data path (issue 16).

A Write WR makes no message object (its fields go to the engine, WriteFields), so these
tests hold that path to the one with RdmaWrite messages, byte for byte; the classes whose
``__init__`` sets slots through descriptors keep a dataclass's behaviour.
"""

from __future__ import annotations

import dataclasses

import pytest

from stack.rnic import Access, SendFlags, SendWR, WcOpcode, WcStatus, WrOpcode
from stack.rnic.verbs import WcFlags, WorkCompletion
from stack.wire.connection import IwarpConnection
from stack.wire.events import (
    AtomicRequest,
    MpaSettings,
    RdmapMessage,
    RdmaWrite,
    ReadRequest,
    ReadResponse,
    Role,
    Send,
    WriteSegment,
)
from tests.rnic.helpers import Pair, record_sent_messages

_REMOTE = Access.LOCAL_WRITE | Access.REMOTE_WRITE | Access.REMOTE_READ


def _established() -> IwarpConnection:
    a = IwarpConnection(Role.INITIATOR, MpaSettings())
    b = IwarpConnection(Role.RESPONDER, MpaSettings())
    a.initiate(0.0)
    b.start(0.0)
    b.receive_data(a.data_to_send())
    while b.next_event().__class__.__name__ != "NeedData":
        pass
    b.accept()
    a.receive_data(b.data_to_send())
    while a.next_event().__class__.__name__ != "NeedData":
        pass
    a.data_to_send()
    return a


def test_write_fields_encode_as_rdma_writes() -> None:
    """(stag, to, data) tuples and RdmaWrite messages make the same bytes, interleaved with
    other messages, one segment or many."""
    big = bytes(range(256)) * 40  # several segments
    messages: list[RdmapMessage] = [
        RdmaWrite(0x1234, 0x10, b"x" * 64),
        ReadRequest(7, 0, 64, 0x1234, 0x10),
        RdmaWrite(0x5678, 2**64 - 1, b""),
        Send(b"hello"),
        RdmaWrite(0x9ABC, 0x1000, big),
    ]
    with_objects, with_fields = _established(), _established()
    with_objects.send_messages(messages)
    with_fields.send_messages(
        [(m.stag, m.to, m.data) if isinstance(m, RdmaWrite) else m for m in messages]
    )
    assert bytes(with_fields.data_to_send()) == bytes(with_objects.data_to_send())


def test_a_send_message_hook_sees_each_write_as_an_rdma_write() -> None:
    engine = _established()
    seen = record_sent_messages(engine)
    engine.send_messages([(1, 2, b"ab"), Send(b"c")])
    assert seen == [RdmaWrite(1, 2, b"ab"), Send(b"c")]


def test_posted_writes_put_the_same_bytes_on_the_wire_as_messages() -> None:
    """A post list of Writes (one signalled) through the QP: the wire bytes are those of
    the RdmaWrite messages, the target holds the data, one completion."""
    pair = Pair()
    target = pair.b.mr(64, _REMOTE)
    src = pair.a.mr(bytes(range(64)))
    wrs = [
        SendWR(i, WrOpcode.RDMA_WRITE, (pair.a.sge(src, 8 * i, 8),), SendFlags.NONE,
               rkey=target.rkey, remote_addr=target.base + 8 * i)
        for i in range(8)
    ]  # fmt: skip
    wrs[-1] = dataclasses.replace(wrs[-1], send_flags=SendFlags.SIGNALED)
    pair.a.qp.post_send(wrs)
    assert pair.a.endpoint is not None
    wire = bytes(pair.a.endpoint.produce())
    reference = _established()
    reference.send_messages(
        [
            RdmaWrite(target.rkey, target.base + 8 * i, bytes(range(8 * i, 8 * i + 8)))
            for i in range(8)
        ]
    )
    assert wire == bytes(reference.data_to_send())
    assert pair.b.endpoint is not None
    pair.b.endpoint.feed(wire)
    assert bytes(target.buf) == bytes(range(64))
    wcs = pair.a.cq.poll(16)
    assert [(wc.wr_id, wc.status, wc.opcode, wc.byte_len) for wc in wcs] == [
        (7, WcStatus.SUCCESS, WcOpcode.RDMA_WRITE, 8)
    ]


def test_writes_after_a_read_are_flushed_when_the_peer_closes() -> None:
    """The peer's FIN dooms an unanswered Read and every WR after it, Writes queued as
    their entries included (they never reach the wire)."""
    pair = Pair()
    target = pair.b.mr(64, _REMOTE)
    src = pair.a.mr(bytes(64))
    sink = pair.a.mr(64)
    read = SendWR(1, WrOpcode.RDMA_READ, (pair.a.sge(sink),), SendFlags.SIGNALED,
                  rkey=target.rkey, remote_addr=target.base)  # fmt: skip
    write = SendWR(2, WrOpcode.RDMA_WRITE, (pair.a.sge(src),), SendFlags.SIGNALED,
                   rkey=target.rkey, remote_addr=target.base)  # fmt: skip
    pair.a.qp.post_send([read, write])
    assert pair.a.endpoint is not None
    pair.a.endpoint.feed(b"")  # FIN before anything was sent
    assert not pair.a.qp.has_outgoing
    wcs = pair.a.cq.poll(16)
    assert [(wc.wr_id, wc.status) for wc in wcs] == [
        (1, WcStatus.WR_FLUSH_ERR),
        (2, WcStatus.WR_FLUSH_ERR),
    ]


def test_work_completion_keeps_its_dataclass_behaviour() -> None:
    wc = WorkCompletion(1, WcStatus.SUCCESS, WcOpcode.RDMA_WRITE, 3, byte_len=64)
    assert wc == WorkCompletion(1, WcStatus.SUCCESS, WcOpcode.RDMA_WRITE, 3, 64)
    assert (wc.imm_data, wc.invalidated_rkey, wc.wc_flags, wc.vendor_err) == (
        None,
        None,
        WcFlags.NONE,
        "",
    )
    assert wc.extra == {} and wc.extra is not WorkCompletion(1, wc.status, wc.opcode, 3).extra
    assert WorkCompletion(1, wc.status, wc.opcode, 3, extra={"a": 1}).extra == {"a": 1}
    assert dataclasses.replace(wc, byte_len=8).byte_len == 8
    with pytest.raises(dataclasses.FrozenInstanceError):
        wc.byte_len = 0  # type: ignore[misc]


@pytest.mark.parametrize(
    "make",
    [
        lambda: RdmaWrite(1, 2, b"ab"),
        lambda: ReadRequest(1, 2, 3, 4, 5),
        lambda: ReadResponse(1, 2),
        lambda: Send(b"x", True),
        lambda: AtomicRequest(0, 1, 2, 3, 4),
        lambda: WriteSegment(1, 2, memoryview(b"ab"), True),
    ],
)
def test_events_with_slot_init_keep_their_dataclass_behaviour(make: object) -> None:
    one, two = make(), make()  # type: ignore[operator]
    assert one == two and hash(one) == hash(two)
    first = dataclasses.fields(one)[0].name
    assert dataclasses.replace(one, **{first: 9}) != one
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(one, first, 0)
    assert AtomicRequest(0, 1, 2, 3, 4).compare_mask == 2**64 - 1  # defaults kept
    assert WriteSegment(1, 2, memoryview(b""), True).ulpdu is None
