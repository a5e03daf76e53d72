"""DIRECT_ALLOC with a plain Fetch and Add over real loopback TCP (docs/kbtp.md §4.3, §6.7).

A verbs initiator (``ibv_wr_atomic_fetch_add``: no Add Mask) asks for UNMASKED_COUNTER and
allocates directly from a partition ring in the counter format of draft §9.2.  The target's
own FetchAdds on that ring (ALLOC_STORE) go through the same RNIC atomic engine.  Several
initiators, of both formats, allocate concurrently; a hostile one corrupts its Head with
the wrong FetchAdd or tries an RDMA Write to it.
"""

from __future__ import annotations

import logging

import pytest
import trio

from kbtp.constants import (
    RING_ADD_DATA,
    RING_ADD_DATA_UNMASKED,
    Capability,
    CounterFormat,
    Status,
    counter_ticket,
    ring_add_mask,
)
from kbtp.initiator_core import FetchAddOp, WriteOp
from kbtp.initiator_errors import KbtpStatusError, SessionClosed
from kbtp.layout import read_counter
from kbtp.target import KbtpTarget
from kbtp.target_config import InitiatorConfig
from tests.kbtp.test_binding_ops import A, B, C, connect, data, serving

pytestmark = pytest.mark.both_targets  # docs/kbtp.md §8.1: the initiator cannot tell

UNMASKED = Capability.DIRECT_LOAD | Capability.DIRECT_ALLOC | Capability.UNMASKED_COUNTER
D = InitiatorConfig(b"d", 192, 64, 4, "green", direct_load=True, direct_alloc=True)
E = InitiatorConfig(b"e", 256, 64, 4, "green", direct_load=True, direct_alloc=True)
FIVE = dict(initiators=(A, B, C, D, E), pool_blocks=32)


def _head(target: KbtpTarget, identity: bytes) -> int:
    g = target.core.ring_of(identity).geometry
    return read_counter(target.core.memory, g.head_offset, g.byteorder)


async def test_s4_3_a_plain_fetch_add_initiator_allocates_directly_through_3n_tickets() -> None:
    """UNMASKED_COUNTER granted; each FetchAdd is a plain one (Add Mask 0); 3N + 1 tickets
    of direct allocations and ALLOC_STOREs on the partition, each freed after its load."""
    with trio.fail_after(60):
        async with serving() as target, connect(target, "c", UNMASKED) as c:
            assert c.granted & Capability.UNMASKED_COUNTER
            ring = target.core.ring_of(b"c")
            assert ring.counter_format is CounterFormat.UNMASKED
            slots = ring.geometry.slots
            for k in range(3 * slots + 1):
                payload = data(k, 700 + k)
                if k % 4 == 3:
                    assert (await c.alloc_store(128, payload, seal=True)).ok
                else:
                    alloc = await c.reserve(payload)
                    assert alloc.counter_format is CounterFormat.UNMASKED
                    assert alloc.ticket == k
                    assert (await c.bind(alloc, 128, seal=True)).ok
                assert _head(target, b"c") == (k + 1) << 32
                assert await c.direct_load(128) == payload
                await c.free(128)
            assert sorted(ring.available_blocks()) == sorted(
                target.core._partition_blocks(target.core.layout.partitions[0])
            )


async def test_s4_3_the_fetch_add_of_an_unmasked_session_has_no_add_mask() -> None:
    with trio.fail_after(30):
        async with serving() as target, connect(target, "c", UNMASKED) as c:
            assert c.ack is not None
            from kbtp.initiator_core import DirectAlloc

            op = DirectAlloc(c.ack, b"x").next_op()
            assert op == FetchAddOp(c.ack.head_stag, c.ack.head_offset, RING_ADD_DATA_UNMASKED, 0)
            original = await c.one_sided(op)
            assert original == 0 and _head(target, b"c") == 1 << 32


async def _worker(
    target: KbtpTarget, identity: str, caps: Capability, handle: int, rounds: int
) -> None:
    async with connect(target, identity, caps) as ini:
        async with trio.open_nursery() as nursery:
            for lane in range(3):  # three tasks race on the one Head (quota 4)

                async def run(lane: int = lane) -> None:
                    for k in range(rounds):
                        payload = data(lane * 50 + k, 300 + 97 * lane)
                        h = handle + lane
                        if k % 3 == 2:
                            await ini.alloc_store(h, payload, seal=True)
                        else:
                            await ini.direct_alloc(h, payload)
                        assert await ini.load(h) == payload
                        await ini.free(h)

                nursery.start_soon(run)


async def test_s6_6_concurrent_initiators_of_both_formats_allocate_directly() -> None:
    """c (masked), d and e (unmasked) at once, three tasks each racing on their Head,
    mixed with target-executed ALLOC_STOREs on the same partitions: every load returns
    what was stored, and every partition's blocks are back in its ring at the end."""
    with trio.fail_after(120):
        async with serving(**FIVE) as target:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(_worker, target, "c", Capability.DIRECT_ALLOC, 128, 8)
                nursery.start_soon(_worker, target, "d", UNMASKED, 192, 8)
                nursery.start_soon(_worker, target, "e", UNMASKED, 256, 8)
            core = target.core
            for index, identity in enumerate((b"c", b"d", b"e")):
                ring = core.ring_of(identity)
                blocks = core._partition_blocks(core.layout.partitions[index])
                assert sorted(ring.available_blocks()) == sorted(blocks)


@pytest.mark.parametrize(
    "attack",
    ["masked FetchAdd on the unmasked Head", "plain FetchAdd of 1", "RDMA Write to the Head"],
)
async def test_s6_7_a_hostile_initiator_corrupts_only_its_own_ring(
    attack: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A corrupted unmasked Head is detected at the next look: NO_SPACE, the session is
    Terminated and logged, the partition ring rebuilt; the masked c and the other
    unmasked e go on.  A Write to the Head is refused by the target's RNIC (the Head STag
    is remote atomic only) and changes nothing."""
    with trio.fail_after(60):
        async with (
            serving(**FIVE) as target,
            connect(target, "c", Capability.DIRECT_ALLOC) as c,
            connect(target, "e", UNMASKED) as e,
        ):
            await c.direct_alloc(128, data(1, 400))
            await e.direct_alloc(256, data(2, 400))
            c_head, e_head = _head(target, b"c"), _head(target, b"e")
            with caplog.at_level(logging.INFO, logger="kbtp.target"):
                async with connect(target, "d", UNMASKED) as d:
                    assert d.ack is not None
                    await d.direct_alloc(192, data(3, 400))
                    head, to = d.ack.head_stag, d.ack.head_offset
                    n = d.ack.ring_order
                    if attack.startswith("RDMA Write"):
                        # A Write completes when handed to TCP (§6.8 item 2); the target's
                        # RNIC answers it with a Terminate.
                        await d.one_sided(WriteOp(head, to, b"\x5a" * 8))
                        assert d.conn is not None
                        await d.conn.wait_closed()
                        assert d.qp.peer_terminate is not None
                        # Not placed: the Head holds the one ticket taken, or 0 once the
                        # target has ended the session and rebuilt the partition ring.
                        assert _head(target, b"d") in (1 << 32, 0)
                    else:
                        if attack.startswith("masked"):
                            op = FetchAddOp(head, to, RING_ADD_DATA, ring_add_mask(n))
                        else:
                            op = FetchAddOp(head, to, 1, 0)
                        await d.one_sided(op)
                        # The target's next look at the Head: its FetchAdd of an ALLOC_STORE
                        # (or its tick, whichever comes first).
                        with pytest.raises((KbtpStatusError, SessionClosed)) as info:
                            await d.alloc_store(193, data(4, 10))
                        if isinstance(info.value, KbtpStatusError):
                            assert info.value.status is Status.NO_SPACE
                while any(s.identity == b"d" for s in target.sessions.values()):
                    await trio.sleep(0.01)
            ended = [r.getMessage() for r in caplog.records if "(d): ended" in r.getMessage()]
            assert ended
            if not attack.startswith("RDMA Write"):
                assert "NO_SPACE" in ended[-1] and "corrupt" in ended[-1]
                d_ring = target.core.ring_of(b"d")
                assert (
                    counter_ticket(
                        _head(target, b"d"), d_ring.geometry.order, d_ring.counter_format
                    )
                    == 0
                )
            # The others never noticed.
            assert (_head(target, b"c"), _head(target, b"e")) == (c_head, e_head)
            assert await c.load(128) == data(1, 400)
            await e.direct_alloc(257, data(5, 400))
            assert await e.load(257) == data(5, 400)
            async with connect(target, "d", UNMASKED) as again:
                assert await again.load(192) == data(3, 400)
                await again.direct_alloc(193, data(6, 400))
                assert await again.direct_load(193) == data(6, 400)
