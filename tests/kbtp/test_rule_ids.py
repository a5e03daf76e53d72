"""The KBTP rule IDs (docs/kbtp.md §5, §5.1, §5.2, §9.3) that errors and findings carry:
each failure names the rule it broke, and a session-ending error names KBTP-9.3 in the
Terminate the target sends."""

from __future__ import annotations

import pytest
import trio

from kbtp.constants import KBTP_VERSION, RequestFlag, Status
from kbtp.messages import DataDescriptor, KbtpError, Load, Store, decode_message
from kbtp.target import TargetSession
from stack.constants import TERM_RDMAP_OP_UNSPECIFIED
from stack.errors import RdmapError
from stack.rules import rule
from tests.kbtp.test_binding_ops import connect, serving

LOAD = Load(7, 3, DataDescriptor(1, 2, 3)).encode()


def _error(data: bytes) -> KbtpError:
    with pytest.raises(KbtpError) as info:
        decode_message(data)
    assert rule(info.value.rule)  # a catalogued ID
    return info.value


def test_kbtp_5_a_message_longer_than_its_format_is_malformed() -> None:
    error = _error(LOAD + b"\x00")
    assert (error.rule, error.status, error.fatal) == ("KBTP-5", Status.MALFORMED, False)


def test_kbtp_5_1_common_header_checks_name_their_rule() -> None:
    version = _error(bytes([KBTP_VERSION + 1]) + LOAD[1:])
    assert (version.rule, version.status, version.fatal) == ("KBTP-5.1", Status.BAD_VERSION, True)
    short = _error(LOAD[:23])
    assert (short.rule, short.status, short.fatal) == ("KBTP-5.1", Status.MALFORMED, True)


def test_kbtp_5_2_inline_store_with_an_stag_is_malformed() -> None:
    store = Store(1, 2, DataDescriptor(5, 0, 4), data=b"abcd", flags=RequestFlag.INLINE)
    error = _error(store.encode())
    assert (error.rule, error.status) == ("KBTP-5.2", Status.MALFORMED)


@pytest.mark.both_targets
async def test_kbtp_9_3_a_fatal_request_ends_the_session_with_terminate_0_2_0xff() -> None:
    """BAD_VERSION is answered, then the target terminates the stream; the error it
    records on the session's QP names KBTP-9.3."""
    with trio.fail_after(30):
        async with serving() as target, connect(target, "a") as a:
            (session,) = target.sessions.values()
            assert isinstance(session, TargetSession)
            bad = bytes([KBTP_VERSION + 1]) + LOAD[1:]
            answer = await a.send_raw(bad, 7)
            assert answer is not None and answer.status == Status.BAD_VERSION
            assert a.conn is not None
            await a.conn.wait_closed()
            term = a.qp.peer_terminate
            assert term is not None and term.cause == TERM_RDMAP_OP_UNSPECIFIED
            error = session.qp.error
            assert isinstance(error, RdmapError) and error.rule == "KBTP-9.3"
            assert error.term in rule("KBTP-9.3").terminates


def test_kbtp_5_1_invalidate_with_inline_is_bad_flags_before_any_field_rule() -> None:
    """A flag rule comes before the field rules (§5.1 order): INLINE + INVALIDATE with a
    non-zero STag is BAD_FLAGS, not the MALFORMED of the STag rule."""
    flags = RequestFlag.INLINE | RequestFlag.INVALIDATE
    store = Store(1, 2, DataDescriptor(5, 0, 4), data=b"abcd", flags=flags)
    error = _error(store.encode())
    assert (error.rule, error.status) == ("KBTP-5.1", Status.BAD_FLAGS)
