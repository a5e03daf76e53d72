"""Protection matrix (RFC 5042 §6, RFC 5040 §7.2, SEC-01..SEC-06): each failing check of an inbound
tagged or atomic access gives its Terminate (layer, type, code, M/D/R, header copies), leaves
target memory untouched, moves both QPs to ERROR and flushes outstanding work requests."""

from __future__ import annotations

import struct
from typing import Literal

import pytest

from stack.constants import READ_REQUEST_HDR_LEN
from stack.rnic import Access, MemoryRegion, QpState, RecvWR, SendWR, WcStatus, WrOpcode
from stack.wire.events import Terminate
from tests.rnic.helpers import Pair

U64 = 1 << 64
ALL = Access.LOCAL_WRITE | Access.REMOTE_WRITE | Access.REMOTE_READ | Access.REMOTE_ATOMIC

# case -> (access of the target MR, use another PD?, STag mutation, TO delta, length)
CASES: dict[str, tuple[Access, bool, str | None, int | Literal["wrap"], int]] = {
    "invalid_stag": (ALL, False, "bogus", 0, 8),
    "invalidated_stag": (ALL, False, "invalidated", 0, 8),
    "pd_mismatch": (ALL, True, None, 0, 8),
    "no_access_right": (Access.LOCAL_WRITE, False, None, 0, 8),
    "beyond_bounds": (ALL, False, None, 60, 8),
    "below_base": (ALL, False, None, -8, 8),
    "to_wrap": (ALL, False, None, "wrap", 8),
}
WRITE_CODES = {
    "invalid_stag": (1, 1, 0x00),
    "invalidated_stag": (1, 1, 0x00),
    "pd_mismatch": (1, 1, 0x02),
    "no_access_right": (1, 1, 0x00),
    "beyond_bounds": (1, 1, 0x01),
    "below_base": (1, 1, 0x01),
    "to_wrap": (1, 1, 0x03),
}
READ_CODES = {
    "invalid_stag": (0, 1, 0x00),
    "invalidated_stag": (0, 1, 0x00),
    "pd_mismatch": (0, 1, 0x03),
    "no_access_right": (0, 1, 0x02),
    "beyond_bounds": (0, 1, 0x01),
    "below_base": (0, 1, 0x01),
    "to_wrap": (0, 1, 0x04),
}


def _target(p: Pair, case: str) -> tuple[MemoryRegion, int, int, int]:
    access, other_pd, mutation, delta, length = CASES[case]
    pd = p.b.rnic.alloc_pd() if other_pd else p.b.pd
    mr = pd.reg_mr(bytearray(b"\x5a" * 64), access)
    stag = mr.rkey
    if mutation == "bogus":
        stag ^= 0x5A5A5A00
    elif mutation == "invalidated":
        mr.invalidate()
    to = U64 - 4 if delta == "wrap" else mr.base + delta
    return mr, stag, to, length


def _assert_aftermath(
    p: Pair, mr: MemoryRegion, cause: tuple[int, int, int], statuses: list[WcStatus]
) -> Terminate:
    """Memory untouched, both QPs in TERMINATE, the Terminate, and the requester's completions.

    A Write completes successfully once handed to the LLP (RFC 5040 §5.5 rule 14), so only
    WRs still waiting for the peer fail; later posts are flushed at once.
    """
    assert bytes(mr.buf) == b"\x5a" * 64, "target memory changed"
    assert p.a.qp.state is QpState.TERMINATE and p.b.qp.state is QpState.TERMINATE
    term = p.a.qp.peer_terminate
    assert term is not None and term.cause == cause
    assert [wc.status for wc in p.a.cq.poll()] == statuses
    p.a.qp.post_send(SendWR(99, WrOpcode.SEND, inline_data=b"after the error"))
    assert [wc.status for wc in p.a.cq.poll()] == [WcStatus.WR_FLUSH_ERR]
    (rwc,) = p.b.cq.poll()
    assert rwc.status is WcStatus.WR_FLUSH_ERR
    p.close_streams()  # ERROR once the stream has closed (RFC 5040 §6.2.1)
    assert p.a.qp.state is QpState.ERROR and p.b.qp.state is QpState.ERROR
    return term


@pytest.mark.parametrize("case", list(CASES))
def test_sec_04_ddp_10_write_protection(case: str) -> None:
    p = Pair()
    p.b.qp.post_recv(RecvWR(1, ()))
    mr, stag, to, length = _target(p, case)
    p.a.qp.post_send(
        [
            SendWR(1, WrOpcode.RDMA_WRITE, inline_data=b"\xff" * length, rkey=stag, remote_addr=to),
        ]
    )
    p.pump()
    term = _assert_aftermath(p, mr, WRITE_CODES[case], [WcStatus.SUCCESS])
    assert (term.m, term.d, term.r) == (True, True, False)
    assert term.ddp_seg_len == 14 + length
    assert term.ddp_header == b"\xc1\x40" + struct.pack(">IQ", stag, to)


@pytest.mark.parametrize("case", list(CASES))
def test_rdmap_16_read_source_protection(case: str) -> None:
    p = Pair()
    p.b.qp.post_recv(RecvWR(1, ()))
    mr, stag, to, length = _target(p, case)
    sink = p.a.mr(length)
    p.a.qp.post_send(
        [
            SendWR(1, WrOpcode.RDMA_READ, (p.a.sge(sink),), rkey=stag, remote_addr=to),
            SendWR(2, WrOpcode.RDMA_READ, (p.a.sge(sink),), rkey=stag, remote_addr=to),
        ]
    )
    p.pump()
    flushed = [WcStatus.REM_ACCESS_ERR, WcStatus.WR_FLUSH_ERR]
    term = _assert_aftermath(p, mr, READ_CODES[case], flushed)
    assert (term.m, term.d, term.r) == (True, True, True)
    assert term.ddp_seg_len == 18 + READ_REQUEST_HDR_LEN
    assert term.ddp_header[:2] == b"\x41\x41"
    assert term.rdma_header == struct.pack(">IQIIQ", sink.rkey, sink.base, length, stag, to)
    assert bytes(sink.buf) == bytes(length)


@pytest.mark.parametrize(
    "case", ["invalid_stag", "pd_mismatch", "no_access_right", "beyond_bounds"]
)
def test_ext_11_atomic_target_protection(case: str) -> None:
    p = Pair()
    p.b.qp.post_recv(RecvWR(1, ()))
    mr, stag, to, _ = _target(p, case)
    result = p.a.mr(8)
    p.a.qp.post_send(
        [
            SendWR(
                1,
                WrOpcode.ATOMIC_FETCH_AND_ADD,
                (p.a.sge(result),),
                rkey=stag,
                remote_addr=to,
                compare_add=1,
            ),
        ]
    )
    p.pump()
    term = _assert_aftermath(p, mr, READ_CODES[case], [WcStatus.REM_ACCESS_ERR])
    assert (term.m, term.d, term.r) == (True, True, False)  # RFC 7306 §8.1: no RDMA header


def test_sec_01_stag_of_another_qp_same_pd_is_usable_but_other_pd_is_not() -> None:
    p = Pair()
    shared = p.b.mr(8, ALL)
    p.a.qp.post_send(
        SendWR(
            1,
            WrOpcode.RDMA_WRITE,
            inline_data=b"samepd!!",
            rkey=shared.rkey,
            remote_addr=shared.base,
        )
    )
    p.pump()
    assert bytes(shared.buf) == b"samepd!!"
