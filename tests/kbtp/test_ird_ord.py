"""IRD/ORD below the minimums of docs/kbtp.md §4.1 (RFC 6581 enhanced MPA negotiation).

The target issues RDMA Reads (STORE, ALLOC_STORE), so its ORD on the stream, which the
initiator's IRD bounds, must be at least 1: below it HELLO is answered IRD_ORD_TOO_LOW and
the stream closed, since every non-inline store would wait for ever.  The direct modes need
the initiator's RDMA Reads and atomics, which the target's IRD (bounded by the initiator's
ORD) must admit: with a target IRD of 0 they are not granted.  Any ORD of at least 1 is
served with the full credits: the RNIC queues Reads beyond ORD (RDMAP-14).
"""

from __future__ import annotations

import pytest
import trio

from kbtp.constants import Capability, Status
from kbtp.initiator_errors import HelloRefused, KbtpStatusError
from kbtp.messages import Hello, HelloAck
from kbtp.target_actions import CloseSession, SendMessage
from stack.wire.events import MpaSettings
from tests.kbtp.helpers import Harness
from tests.kbtp.test_binding_ops import connect, data, serving
from tests.kbtp.test_target_core import DIRECT, SA, SC, inline_alloc

# ======================================================================================
# The core: what open_session was told the stream negotiated
# ======================================================================================


def _hello(h: Harness, session: int, identity: bytes, **limits: int) -> HelloAck:
    h.core.open_session(session, h.now, **limits)
    caps = DIRECT | Capability.MASKED_FETCH_ADD
    actions = h.registered(h.core.handle_message(session, Hello(5, caps, identity).encode(), h.now))
    h.absorb(actions[1:], auto=False)
    first = actions[0]
    assert isinstance(first, SendMessage) and isinstance(first.message, HelloAck)
    return first.message


def test_s4_1_a_target_ord_of_zero_refuses_hello_and_frees_the_identity() -> None:
    h = Harness()
    ack = _hello(h, SA, b"a", ird=16, ord=0)
    assert ack.status == Status.IRD_ORD_TOO_LOW
    closing = h.closed[-1]
    assert isinstance(closing, CloseSession) and closing.session == SA
    assert closing.status is Status.IRD_ORD_TOO_LOW and "ORD 0" in closing.reason
    assert h.core.session_identity(SA) is None
    # The identity was never taken: the next stream, with an ORD of 1, is served.
    ack = _hello(h, 9, b"a", ird=16, ord=1)
    assert ack.status == Status.SUCCESS
    assert h.request(9, inline_alloc(1, 1, b"served")).ok


def test_s4_1_a_target_ird_of_zero_withholds_the_direct_modes_only() -> None:
    h = Harness()
    ack = _hello(h, SC, b"c", ird=0, ord=4)
    assert ack.status == Status.SUCCESS
    assert ack.capabilities == Capability.NONE
    assert (ack.table_stag, ack.head_stag, ack.ring_stag) == (0, 0, 0)
    assert h.request(SC, inline_alloc(1, 32, b"still stores")).ok
    assert not h.closed


def test_s4_1_the_minimums_met_or_unknown_grant_everything() -> None:
    h = Harness()
    assert _hello(h, SA, b"c", ird=1, ord=1).capabilities == DIRECT
    h.core.close_session(SA, h.now)
    assert _hello(h, SC, b"c").capabilities == DIRECT  # no RFC 6581: nothing to check


def test_s4_1_an_unknown_identity_is_refused_before_its_ird_ord() -> None:
    h = Harness()
    assert _hello(h, SA, b"nobody", ord=0).status == Status.UNKNOWN_INITIATOR


# ======================================================================================
# Over loopback TCP: an initiator that negotiates less
# ======================================================================================


@pytest.mark.both_targets
async def test_s4_1_an_initiator_with_ird_zero_is_refused_ird_ord_too_low() -> None:
    with trio.fail_after(30):
        async with serving() as target:
            try:
                async with connect(target, "a", settings=MpaSettings(ird=0, ord=16)):
                    raise AssertionError("HELLO accepted with a target ORD of 0")
            except HelloRefused as exc:
                assert exc.status is Status.IRD_ORD_TOO_LOW
            # The target goes on; an initiator with IRD 1 is served.
            async with connect(target, "a", settings=MpaSettings(ird=1, ord=16)) as a:
                assert (await a.alloc_store(1, data(1, 3000), seal=True)).ok


@pytest.mark.both_targets
async def test_s4_1_an_initiator_with_ord_zero_gets_no_direct_mode() -> None:
    with trio.fail_after(30):
        async with serving() as target:
            async with connect(target, "c", settings=MpaSettings(ird=16, ord=0)) as c:
                assert c.granted == Capability.NONE
                assert (await c.alloc_store(128, data(2, 3000), seal=True)).ok
                assert await c.load(128) == data(2, 3000)
                try:
                    await c.direct_load(128)
                    raise AssertionError("DIRECT_LOAD without the grant")
                except KbtpStatusError as exc:
                    assert exc.status is Status.NOT_OFFERED


@pytest.mark.both_targets
async def test_s4_1_a_target_ord_of_one_serves_every_credit() -> None:
    """Initiator IRD 1: the target's Reads of four concurrent non-inline stores (four
    credits) are queued by its RNIC one at a time, and all complete."""
    with trio.fail_after(60):
        async with serving() as target:
            async with connect(target, "a", settings=MpaSettings(ird=1, ord=16)) as a:
                assert a.ack is not None and a.ack.request_credits == 4
                (sess,) = target.sessions.values()
                assert sess.qp.ord == 1
                payloads = {h: data(h, 5000 + h) for h in range(1, 9)}

                async def store(handle: int) -> None:
                    assert (await a.alloc_store(handle, payloads[handle], seal=True)).ok

                async with trio.open_nursery() as nursery:
                    for handle in payloads:
                        nursery.start_soon(store, handle)
                for handle, payload in payloads.items():
                    assert await a.load(handle) == payload
