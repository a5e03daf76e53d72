"""docs/kbtp.md §6.8: the edge cases a second implementer must not guess, over real TCP."""

from __future__ import annotations

import pytest
import trio

from kbtp.constants import Capability, RequestFlag, Status
from kbtp.messages import DataDescriptor, Hello, HelloAck, Load, Store, decode_message
from kbtp.target import TargetSession
from kbtp.target_actions import SendMessage
from stack.constants import TERM_RDMAP_OP_UNSPECIFIED
from stack.errors import DdpError
from tests.kbtp.helpers import Harness
from tests.kbtp.test_binding_ops import MAX_INLINE, connect, serving


def test_s6_8_hello_handle_and_generation_are_ignored() -> None:
    raw = bytearray(Hello(1, identity=b"a").encode())
    raw[12:20] = (5).to_bytes(8, "big")  # Handle
    raw[20:22] = (3).to_bytes(2, "big")  # Generation
    assert decode_message(bytes(raw)) == Hello(1, identity=b"a")


@pytest.mark.both_targets
async def test_s6_8_an_inline_store_beyond_the_receive_buffer_ends_only_that_session() -> None:
    size = MAX_INLINE + 17  # 40 + size > 56 + Max Inline: no receive buffer holds it
    big = Store(900, 2, DataDescriptor(0, 0, size), data=bytes(size), flags=RequestFlag.INLINE)
    with trio.fail_after(30):
        async with serving() as target:
            async with connect(target, "a") as a:
                (session,) = target.sessions.values()
                assert isinstance(session, TargetSession)
                with trio.move_on_after(10):
                    try:
                        await a.send_raw(big.encode(), 900)
                    except Exception:  # noqa: BLE001 - the session ends either way
                        pass
                term = a.qp.peer_terminate
                assert term is not None and (term.layer, term.etype, term.code) == (1, 2, 0x05)
                assert isinstance(session.qp.error, DdpError) and "RDMAP-08" in str(
                    session.qp.error
                )
            async with connect(target, "b") as b:  # the target serves the next session
                assert b.ack is not None
                done = await b.alloc_store(b.ack.handle_base, b"fine")
                assert done.status == Status.SUCCESS


@pytest.mark.both_targets
async def test_s6_8_the_9_3_terminate_copies_no_header() -> None:
    load = Load(901, 0, DataDescriptor(1, 2, 3)).encode()
    unknown = load[:1] + b"\x7f" + load[2:]
    with trio.fail_after(30):
        async with serving() as target, connect(target, "b") as b:
            answer = await b.send_raw(unknown, 901)
            assert answer is not None and answer.status == Status.BAD_OPCODE
            assert b.conn is not None
            await b.conn.wait_closed()
            term = b.qp.peer_terminate
            assert term is not None and term.cause == TERM_RDMAP_OP_UNSPECIFIED
            assert (term.m, term.d, term.r) == (False, False, False)


def test_s4_3_direct_alloc_needs_the_masked_fetch_add_capability() -> None:
    """Standard verbs have only the unmasked FetchAdd, which would carry into the ring
    counter (§3.3): DIRECT_ALLOC is granted only to a HELLO that says it can mask."""

    def granted(caps: Capability) -> Capability:
        h = Harness()
        identity = next(i.identity for i in h.core.config.initiators if i.direct_alloc)
        h.core.open_session(1)
        actions = h.registered(h.core.handle_message(1, Hello(5, caps, identity).encode(), 0.0))
        [send] = actions
        assert isinstance(send, SendMessage) and isinstance(send.message, HelloAck)
        assert send.message.status == Status.SUCCESS
        return send.message.capabilities

    both = Capability.DIRECT_LOAD | Capability.DIRECT_ALLOC
    assert granted(both) == Capability.DIRECT_LOAD
    assert granted(both | Capability.MASKED_FETCH_ADD) == both  # never echoed
