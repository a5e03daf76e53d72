"""The target core's registrations as actions (docs/kbtp.md §3.6, §4.2, §4.4): a HELLO
granting a direct mode asks for its session's regions, the HELLO_ACK waits for every STag,
and the regions are deregistered once the connection is gone."""

from __future__ import annotations

import pytest

from kbtp.constants import Capability, Status
from kbtp.messages import DataDescriptor, Hello, HelloAck, Load
from kbtp.target_actions import (
    CloseSession,
    DeregisterMemory,
    RegionKind,
    RegisterMemory,
    SendMessage,
)
from stack.errors import LocalError
from tests.kbtp.helpers import Harness

SA, SC = 1, 3
DIRECT = Capability.DIRECT_LOAD | Capability.DIRECT_ALLOC | Capability.MASKED_FETCH_ADD


def _hello(h: Harness, session: int, identity: bytes, caps: Capability) -> list[RegisterMemory]:
    h.core.open_session(session)
    actions = h.core.handle_message(session, Hello(5, caps, identity).encode(), h.now)
    assert all(isinstance(a, RegisterMemory) for a in actions), actions
    return actions  # type: ignore[return-value]


def test_s3_6_hello_asks_for_the_regions_of_its_direct_modes() -> None:
    h = Harness()
    lay = h.core.layout
    part = lay.partitions[0]
    asked = _hello(h, SC, b"c", DIRECT)
    assert [(a.session, a.kind, a.offset, a.length) for a in asked] == [
        (SC, RegionKind.TABLE, *lay.table_region),
        (SC, RegionKind.POOL, *lay.pool_region),
        (SC, RegionKind.RING, *lay.ring_region(part.ring)),
        (SC, RegionKind.HEAD, *lay.head_region(part.ring)),
        (SC, RegionKind.PARTITION, *lay.partition_region(part)),
    ]
    assert len({a.op_id for a in asked}) == 5
    assert _hello(h, SA, b"a", Capability.DIRECT_LOAD)[0].kind is RegionKind.TABLE


def test_s4_2_hello_ack_waits_for_every_stag() -> None:
    h = Harness()
    asked = _hello(h, SC, b"c", DIRECT)
    stags = {
        RegionKind.TABLE: 7,
        RegionKind.POOL: 8,
        RegionKind.RING: 9,
        RegionKind.HEAD: 11,
        RegionKind.PARTITION: 10,
    }
    for a in reversed(asked[1:]):
        assert h.core.memory_registered(a.op_id, stags[a.kind], h.now) == []
    assert not h.core.direct_alloc_enabled(SC)
    [send] = h.core.memory_registered(asked[0].op_id, stags[asked[0].kind], h.now)
    assert isinstance(send, SendMessage) and isinstance(send.message, HelloAck)
    ack = send.message
    assert ack.status == Status.SUCCESS and ack.request_id == 5
    assert (ack.table_stag, ack.pool_stag, ack.ring_stag, ack.partition_stag) == (7, 8, 9, 10)
    assert ack.head_stag == 11
    assert h.core.direct_alloc_enabled(SC) and h.core.pending_ops() == 0


def test_s4_2_without_direct_modes_the_hello_ack_goes_at_once() -> None:
    h = Harness()
    h.core.open_session(2)
    [send] = h.core.handle_message(2, Hello(1, DIRECT, b"b").encode(), h.now)
    assert isinstance(send, SendMessage) and send.message.status == Status.SUCCESS
    assert send.message.table_stag == 0  # type: ignore[union-attr]


def test_s4_2_messages_before_the_hello_ack_wait_for_it() -> None:
    h = Harness()
    asked = _hello(h, SA, b"a", Capability.DIRECT_LOAD)
    h.buffer(0x55, 8)
    load = Load(6, 0, DataDescriptor(0x55, 0, 8))
    assert h.core.handle_message(SA, load.encode(), h.now) == []
    assert h.core.handle_request(SA, load, h.now) == []
    assert h.core.memory_registered(asked[0].op_id, 0x11, h.now) == []
    actions = h.core.memory_registered(asked[1].op_id, 0x12, h.now)
    messages = [a.message for a in actions if isinstance(a, SendMessage)]
    assert isinstance(messages[0], HelloAck)
    assert [m.status for m in messages[1:]] == [Status.NOT_VALID, Status.NOT_VALID]


def test_s9_3_failed_registration_refuses_the_hello() -> None:
    h = Harness()
    asked = _hello(h, SC, b"c", DIRECT)
    assert h.core.memory_registered(asked[0].op_id, 0x21, h.now) == []
    actions = h.core.rdma_failed(asked[1].op_id, h.now, "no memory")
    assert [type(a) for a in actions] == [SendMessage, CloseSession]
    assert actions[0].message == HelloAck(5, Status.TARGET_FAILURE)  # type: ignore[union-attr]
    assert actions[1].status is Status.TARGET_FAILURE  # type: ignore[union-attr]
    # Registrations still under way are dropped as they are reported; the rest at the end.
    assert h.core.memory_registered(asked[2].op_id, 0x23, h.now) == [DeregisterMemory(SC, 0x23)]
    assert h.core.close_session(SC, h.now) == [DeregisterMemory(SC, 0x21)]
    assert h.core.pending_ops() == 0
    h.connect(9, b"c", DIRECT)  # the identity is free again


def test_s3_6_regions_are_deregistered_when_the_connection_is_gone() -> None:
    h = Harness()
    ack = h.connect(SC, b"c", DIRECT)
    stags = {ack.table_stag, ack.pool_stag, ack.ring_stag, ack.head_stag, ack.partition_stag}
    assert set(h.registrar.regions) == stags
    h.send(SC, Hello(6, identity=b"c"))  # a second HELLO: the core closes the session
    assert h.closed and h.closed[-1].status is Status.BAD_OPCODE
    assert h.registrar.deregistered == []  # still registered until the connection is gone
    h.absorb(h.core.close_session(SC, h.now))
    assert sorted(h.registrar.deregistered) == sorted(stags) and not h.registrar.regions
    assert h.core.close_session(SC, h.now) == []


def test_registration_reports_must_name_a_pending_registration() -> None:
    h = Harness()
    asked = _hello(h, SC, b"c", DIRECT)
    with pytest.raises(LocalError):
        h.core.memory_registered(999, 0x30, h.now)
    with pytest.raises(LocalError):
        h.core.rdma_completed(asked[0].op_id, h.now)
