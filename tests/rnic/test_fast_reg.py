"""Fast registration (SEC-05): ``alloc_mr`` regions made valid by ``REG_MR`` and invalid by
``LOCAL_INV``, a Send with Invalidate (RDMAP-09) or a Read with Invalidate; a ``reg_mr``
region is not remotely invalidatable.  Over the real wire bytes between two RNICs."""

from __future__ import annotations

import pytest

from stack.errors import LocalError
from stack.rnic import (
    Access,
    MemoryRegion,
    RecvWR,
    RegMr,
    Rnic,
    SendFlags,
    SendWR,
    WcFlags,
    WcOpcode,
    WcStatus,
    WrOpcode,
    inc_rkey,
    reg_mr_wr,
)
from tests.rnic.helpers import Pair

RW = Access.LOCAL_WRITE | Access.REMOTE_WRITE
RR = Access.LOCAL_WRITE | Access.REMOTE_READ


def write(wr_id: int, data: bytes, rkey: int, to: int) -> SendWR:
    return SendWR(wr_id, WrOpcode.RDMA_WRITE, inline_data=data, rkey=rkey, remote_addr=to)


def refused(p: Pair) -> tuple[int, int, int] | None:
    term = p.a.qp.peer_terminate
    return None if term is None else term.cause


def statuses(p: Pair) -> list[tuple[WcOpcode, WcStatus]]:
    return [(wc.opcode, wc.status) for wc in p.b.cq.poll()]


def send_invalidate(p: Pair, stag: int) -> None:
    p.b.qp.post_recv(RecvWR(7, (p.b.sge(p.b.mr(16)),)))
    p.a.qp.post_send(SendWR(1, WrOpcode.SEND_WITH_INV, inline_data=b"inv", invalidate_rkey=stag))
    p.pump()


# ------------------------------------------------------------------------------ REG_MR
def test_sec_05_an_allocated_mr_is_refused_until_reg_mr_makes_it_valid() -> None:
    p = Pair()
    mr = p.b.pd.alloc_mr(32)
    assert not mr.valid and mr.fast_reg and mr.length == 0
    buf = bytearray(32)
    reserved = mr.rkey
    p.b.qp.post_send(reg_mr_wr(mr, buf, RW, wr_id=9, send_flags=SendFlags.SIGNALED))
    assert statuses(p) == [(WcOpcode.REG_MR, WcStatus.SUCCESS)]
    assert mr.valid and mr.rkey == inc_rkey(reserved) and mr.length == 32
    p.a.qp.post_send(write(1, b"fast reg", mr.rkey, mr.base))
    p.pump()
    assert refused(p) is None and bytes(buf[:8]) == b"fast reg"
    q = Pair()
    unregistered = q.b.pd.alloc_mr(32)
    q.a.qp.post_send(write(1, b"too soon", unregistered.rkey, 0))
    q.pump()
    assert refused(q) == (1, 1, 0x00)


@pytest.mark.parametrize("zero_based", [False, True])
def test_sec_05_rkey_and_iova_show_the_reg_mr_from_the_moment_it_is_built(zero_based: bool) -> None:
    """As the kernel's ``ib_map_mr_sg`` and ``ib_update_fast_reg_key``: a request posted
    behind a ``REG_MR`` that has not run yet (here: the QP is not connected) can already
    name the new STag and TO."""
    rnic = Rnic()
    pd = rnic.alloc_pd()
    qp = rnic.create_qp(pd, rnic.create_cq())
    mr = pd.alloc_mr(8)
    reserved = mr.stag
    buf = bytearray(8)
    access = RW | Access.ZERO_BASED if zero_based else RW
    qp.post_send(reg_mr_wr(mr, buf, access))
    assert not mr.valid and mr.stag == reserved
    assert mr.rkey == mr.lkey == inc_rkey(reserved)
    planned = mr.iova
    assert planned == 0 if zero_based else planned != 0
    qp.set_rts()  # the REG_MR runs
    assert mr.valid and mr.stag == mr.rkey == inc_rkey(reserved)
    assert mr.base == mr.iova == planned


@pytest.mark.parametrize(
    "case", ["still_valid", "same_key", "other_index", "beyond_max_len", "plain_mr", "other_pd"]
)
def test_sec_05_a_reg_mr_that_breaks_a_rule_is_refused(case: str) -> None:
    p = Pair()
    mr = p.b.pd.alloc_mr(16)
    if case == "still_valid":
        p.b.qp.post_send(reg_mr_wr(mr, bytearray(16), RW))
    elif case == "plain_mr":
        mr = p.b.mr(16, RW)
    elif case == "other_pd":
        mr = p.b.rnic.alloc_pd().alloc_mr(16)
    key = {"same_key": mr.stag, "other_index": mr.stag ^ 0x100}.get(case, inc_rkey(mr.rkey))
    size = 17 if case == "beyond_max_len" else 16
    was_valid = mr.valid
    p.b.qp.post_send(SendWR(3, WrOpcode.REG_MR, reg_mr=RegMr(mr, bytearray(size), RW, key)))
    assert statuses(p) == [(WcOpcode.REG_MR, WcStatus.MW_BIND_ERR)]
    assert mr.valid is was_valid


def test_sec_05_reg_mr_needs_a_buffer_it_can_pin() -> None:
    p = Pair()
    mr = p.b.pd.alloc_mr(16)
    p.b.qp.post_send(
        SendWR(3, WrOpcode.REG_MR, reg_mr=RegMr(mr, b"read-only", RW, inc_rkey(mr.rkey)))
    )
    assert statuses(p) == [(WcOpcode.REG_MR, WcStatus.MW_BIND_ERR)] and not mr.valid


def test_alloc_mr_refuses_a_bad_length() -> None:
    pd = Pair().b.pd
    for bad in (-1, 1.5, True, "8"):
        with pytest.raises(LocalError, match="max_len"):
            pd.alloc_mr(bad)  # type: ignore[arg-type]


# ------------------------------------------------------------------------------ invalidation
def test_sec_06_local_inv_revokes_a_fast_registered_mr_and_reg_mr_gives_it_a_new_key() -> None:
    p = Pair()
    mr = p.b.fast_mr(16, RW)
    first = mr.rkey
    p.b.qp.post_send(SendWR(4, WrOpcode.LOCAL_INV, invalidate_rkey=first))
    assert statuses(p) == [(WcOpcode.LOCAL_INV, WcStatus.SUCCESS)] and not mr.valid
    buf = bytearray(16)
    p.b.qp.post_send(reg_mr_wr(mr, buf, RW))
    second = mr.rkey
    assert mr.valid and second != first and second >> 8 == first >> 8
    p.a.qp.post_send(write(1, b"second!!", second, mr.base))
    p.pump()
    assert refused(p) is None and bytes(buf[:8]) == b"second!!"
    p.a.qp.post_send(write(2, b"first!!!", first, mr.base + 8))
    p.pump()
    assert refused(p) == (1, 1, 0x00) and bytes(buf[8:]) == bytes(8)


def test_rdmap_09_a_fast_registered_mr_is_remotely_invalidated() -> None:
    p = Pair()
    mr = p.b.fast_mr(16, RW)
    send_invalidate(p, mr.rkey)
    assert refused(p) is None and not mr.valid
    (wc,) = p.b.cq.poll()
    assert wc.opcode is WcOpcode.RECV and wc.invalidated_rkey == mr.rkey
    assert wc.wc_flags & WcFlags.WITH_INV and WcFlags.WITH_INV == 8  # IBV_WC_WITH_INV
    p.a.qp.post_send(write(2, b"too late", mr.rkey, mr.base))
    p.pump()
    assert refused(p) == (1, 1, 0x00) and bytes(mr.buf) == bytes(16)


def test_rdmap_09_a_plain_mr_is_not_remotely_invalidatable() -> None:
    """A ``reg_mr`` region: the Send with Invalidate is refused with Terminate 0/1/0x09 and
    the region keeps working (only fast-registered regions and type 2 windows qualify)."""
    p = Pair()
    mr = p.b.mr(16, RW)
    send_invalidate(p, mr.rkey)
    assert refused(p) == (0, 1, 0x09)
    assert p.b.qp.error is not None and p.b.qp.error.rule == "RDMAP-09"
    assert mr.valid
    assert [wc.status for wc in p.b.cq.poll()] == [WcStatus.WR_FLUSH_ERR]  # not delivered


# ---------------------------------------------------------------------- Read with Invalidate
def _read(opcode: WrOpcode) -> tuple[Pair, MemoryRegion, bytes]:
    p = Pair()
    source = p.b.mr(b"read me, then forget the sink!!!", RR)
    sink = p.a.fast_mr(32, Access.LOCAL_WRITE)
    p.a.qp.post_send(SendWR(1, opcode, (p.a.sge(sink),), rkey=source.rkey, remote_addr=source.base))
    p.pump()
    (wc,) = p.a.cq.poll()
    assert wc.status is WcStatus.SUCCESS and wc.opcode is WcOpcode.RDMA_READ
    assert wc.byte_len == 32
    return p, sink, bytes(sink.buf)


def test_read_with_invalidate_invalidates_the_sink_when_the_read_completes() -> None:
    p, sink, data = _read(WrOpcode.RDMA_READ_WITH_INV)
    assert data == b"read me, then forget the sink!!!"
    assert not sink.valid
    p.a.qp.post_send(SendWR(2, WrOpcode.SEND, (p.a.sge(sink),)))
    assert [wc.status for wc in p.a.cq.poll()] == [WcStatus.LOC_PROT_ERR]


def test_a_plain_read_leaves_the_sink_valid() -> None:
    """The control of the test above: the same Read without Invalidate."""
    _p, sink, data = _read(WrOpcode.RDMA_READ)
    assert data == b"read me, then forget the sink!!!" and sink.valid


def test_wc_opcodes_of_the_memory_operations_are_the_verbs_values() -> None:
    assert (WcOpcode.BIND_MW, WcOpcode.LOCAL_INV, WcOpcode.REG_MR) == (5, 6, 10)
