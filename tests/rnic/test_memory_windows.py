"""Memory windows (SEC-05): binds and their checks, and remote access through a window's STag
checked against the window (bounds, rights, stream for type 2, PD, validity), over the real
wire bytes between two software RNICs.

Every refusal has its control: the same access through the MR itself, or through the window
before the change, succeeds, so a test fails if the window's own check were missing.
"""

from __future__ import annotations

import pytest

from stack.errors import LocalError
from stack.rnic import (
    Access,
    MemoryRegion,
    MemoryWindow,
    MwBindInfo,
    MwType,
    RecvWR,
    SendFlags,
    SendWR,
    WcFlags,
    WcOpcode,
    WcStatus,
    WrOpcode,
    inc_rkey,
)
from stack.rnic.verbs import BindMw
from tests.rnic.helpers import Pair, SharedResponder

R = Access.REMOTE_READ
W = Access.REMOTE_WRITE
BINDABLE = Access.LOCAL_WRITE | Access.REMOTE_WRITE | Access.REMOTE_READ | Access.MW_BIND
SIZE = 64


def write(wr_id: int, data: bytes, rkey: int, to: int) -> SendWR:
    return SendWR(wr_id, WrOpcode.RDMA_WRITE, inline_data=data, rkey=rkey, remote_addr=to)


def target(p: Pair, access: Access = BINDABLE) -> MemoryRegion:
    return p.b.pd.reg_mr(bytearray(b"-" * SIZE), access)


def bind1(p: Pair, mw: MemoryWindow, mr: MemoryRegion, offset: int, length: int, access: Access):
    """Bind type 1 window ``mw`` over ``mr[offset:offset+length]`` on b's QP (the verb)."""
    return p.b.qp.bind_mw(mw, MwBindInfo(mr, mr.base + offset, length, access), wr_id=50)


def bind2_wr(mw: MemoryWindow, mr: MemoryRegion, offset: int, length: int, access: Access):
    info = MwBindInfo(mr, mr.base + offset, length, access)
    return SendWR(51, WrOpcode.BIND_MW, bind_mw=BindMw(mw, inc_rkey(mw.rkey), info))


def refused(p: Pair) -> tuple[int, int, int] | None:
    term = p.a.qp.peer_terminate
    return None if term is None else term.cause


def bind_status(p: Pair) -> list[tuple[WcOpcode, WcStatus]]:
    return [(wc.opcode, wc.status) for wc in p.b.cq.poll()]


# ------------------------------------------------------------------------------ binding
def test_sec_05_type1_bind_completes_as_bind_mw_and_gives_a_new_key() -> None:
    p = Pair()
    mr = target(p)
    mw = p.b.pd.alloc_mw(1)
    assert mw.type is MwType.TYPE_1 and not mw.valid
    unbound = mw.rkey
    rkey = bind1(p, mw, mr, 0, 16, W)
    assert rkey == mw.rkey != unbound and rkey >> 8 == unbound >> 8
    assert bind_status(p) == [(WcOpcode.BIND_MW, WcStatus.SUCCESS)]
    assert mw.valid
    rebound = mw.bind(p.b.qp, MwBindInfo(mr, mr.base, 8, W))  # the same verb, from the window
    assert rebound not in (rkey, unbound) and rebound >> 8 == unbound >> 8


def test_sec_05_an_mr_registered_without_mw_bind_refuses_a_bind() -> None:
    ok, bad = Pair(), Pair()
    bind1(ok, ok.b.pd.alloc_mw(1), target(ok), 0, 16, W)
    assert bind_status(ok) == [(WcOpcode.BIND_MW, WcStatus.SUCCESS)]
    mw = bad.b.pd.alloc_mw(1)
    bind1(bad, mw, target(bad, BINDABLE & ~Access.MW_BIND), 0, 16, W)
    ((opcode, status),) = bind_status(bad)
    assert status is WcStatus.MW_BIND_ERR and status.text == "memory management operation error"
    assert opcode is WcOpcode.BIND_MW and not mw.valid


@pytest.mark.parametrize(
    "case",
    ["rights_beyond_the_mr", "local_right", "past_the_mr_end", "before_the_mr", "other_pd_mr"],
)
def test_sec_05_a_bind_beyond_the_mr_is_refused(case: str) -> None:
    """A window grants a subset of its MR's remote rights over a range inside the MR."""
    p = Pair()
    mr = target(p, Access.LOCAL_WRITE | Access.REMOTE_READ | Access.MW_BIND)
    mw = p.b.pd.alloc_mw(1)
    offset, length, access = {
        "rights_beyond_the_mr": (0, 16, W),
        "local_right": (0, 16, R | Access.LOCAL_WRITE),
        "past_the_mr_end": (SIZE - 8, 9, R),
        "before_the_mr": (-1, 8, R),
        "other_pd_mr": (0, 16, R),
    }[case]
    if case == "other_pd_mr":
        mr = p.b.rnic.alloc_pd().reg_mr(bytearray(SIZE), BINDABLE)
    bind1(p, mw, mr, offset, length, access)
    assert bind_status(p) == [(WcOpcode.BIND_MW, WcStatus.MW_BIND_ERR)]
    assert not mw.valid


def test_sec_05_the_largest_window_inside_the_mr_is_accepted() -> None:
    """The control of the refusals above: the whole MR, with every right it has."""
    p = Pair()
    mr = target(p, Access.LOCAL_WRITE | Access.REMOTE_READ | Access.MW_BIND)
    mw = p.b.pd.alloc_mw(1)
    bind1(p, mw, mr, 0, SIZE, R)
    assert bind_status(p) == [(WcOpcode.BIND_MW, WcStatus.SUCCESS)] and mw.valid


def test_sec_05_each_type_is_bound_its_own_way() -> None:
    """Type 1 by the verb ``bind_mw``, type 2 by a ``BIND_MW`` work request; not crosswise."""
    p = Pair()
    mr = target(p)
    with pytest.raises(LocalError, match="type 2"):
        p.b.qp.bind_mw(p.b.pd.alloc_mw(2), MwBindInfo(mr, mr.base, 8, W))
    two = p.b.pd.alloc_mw(2)
    p.b.qp.post_send(bind2_wr(two, mr, 0, 8, W))
    assert bind_status(p) == [(WcOpcode.BIND_MW, WcStatus.SUCCESS)] and two.valid
    one = p.b.pd.alloc_mw(1)
    p.b.qp.post_send(bind2_wr(one, mr, 0, 8, W))
    assert bind_status(p) == [(WcOpcode.BIND_MW, WcStatus.MW_BIND_ERR)] and not one.valid


def test_alloc_mw_refuses_an_unknown_type() -> None:
    with pytest.raises(LocalError, match="type must be 1 or 2"):
        Pair().b.pd.alloc_mw(3)


# ------------------------------------------------------------------------------ bounds, rights
def test_sec_04_a_window_bounds_accesses_inside_its_mr() -> None:
    """Window [16, 32) of a 64-octet MR: a Write inside lands at the MR's offset 16; one
    running past the window's end is refused (1/1/0x01) although the MR would hold it."""
    p = Pair()
    mr = target(p)
    mw = p.b.pd.alloc_mw(1)
    rkey = bind1(p, mw, mr, 16, 16, W)
    p.a.qp.post_send(write(1, b"inside!!", rkey, mr.base + 16))
    p.pump()
    assert refused(p) is None and bytes(mr.buf[16:24]) == b"inside!!"
    p.a.qp.post_send(write(2, b"x" * 8, rkey, mr.base + 28))
    p.pump()
    assert refused(p) == (1, 1, 0x01) and bytes(mr.buf[24:]) == b"-" * 40


def test_sec_04_an_access_before_the_window_is_refused() -> None:
    p = Pair()
    mr = target(p)
    rkey = bind1(p, p.b.pd.alloc_mw(1), mr, 16, 16, W)
    p.a.qp.post_send(write(1, b"x", rkey, mr.base + 15))
    p.pump()
    assert refused(p) == (1, 1, 0x01) and bytes(mr.buf) == b"-" * SIZE


def test_sec_12_a_window_grants_only_its_own_rights() -> None:
    """The MR allows remote Reads and Writes; a read-only window over it allows Reads only."""
    p = Pair()
    mr = target(p)
    mw = p.b.pd.alloc_mw(1)
    rkey = bind1(p, mw, mr, 0, 16, R)
    sink = p.a.mr(8)
    p.a.qp.post_send(
        SendWR(1, WrOpcode.RDMA_READ, (p.a.sge(sink),), rkey=rkey, remote_addr=mr.base)
    )
    p.pump()
    assert refused(p) is None and bytes(sink.buf) == b"-" * 8
    p.a.qp.post_send(write(2, b"written!", mr.rkey, mr.base))  # the MR itself: allowed
    p.a.qp.post_send(write(3, b"through!", rkey, mr.base + 8))  # the window: no Write right
    p.pump()
    assert refused(p) == (1, 1, 0x00)  # DDP has no rights code
    assert bytes(mr.buf[:16]) == b"written!" + b"-" * 8


def test_a_zero_based_window_starts_at_to_zero_and_serves_atomics() -> None:
    p = Pair()
    mr = target(p, BINDABLE | Access.REMOTE_ATOMIC)
    mr.buf[32:40] = (5).to_bytes(8, "little")
    mw = p.b.pd.alloc_mw(1)
    rkey = bind1(p, mw, mr, 32, 16, W | Access.REMOTE_ATOMIC | Access.ZERO_BASED)
    result = p.a.mr(8)
    p.a.qp.post_send(
        [
            SendWR(
                1, WrOpcode.ATOMIC_FETCH_AND_ADD, (p.a.sge(result),), rkey=rkey, remote_addr=0,
                compare_add=2,
            ),
            write(2, b"window+8", rkey, 8),
        ]
    )  # fmt: skip
    p.pump()
    assert refused(p) is None
    assert int.from_bytes(result.buf, "little") == 5
    assert int.from_bytes(mr.buf[32:40], "little") == 7 and bytes(mr.buf[40:48]) == b"window+8"


# ------------------------------------------------------------------------------ association
def test_sec_02_a_type2_window_serves_only_the_stream_that_bound_it() -> None:
    first = Pair()
    second = SharedResponder(first.b.rnic, first.b.pd)  # another stream of the same PD
    mr = target(first)
    mw = first.b.pd.alloc_mw(2)
    first.b.qp.post_send(bind2_wr(mw, mr, 0, 32, W))
    assert mw.stream is first.b.qp
    first.a.qp.post_send(write(1, b"own one!", mw.rkey, mr.base))
    first.pump()
    assert refused(first) is None and bytes(mr.buf[:8]) == b"own one!"
    second.a.qp.post_send(write(1, b"stranger", mw.rkey, mr.base + 8))
    second.pump()
    assert refused(second) == (1, 1, 0x02)  # STag not associated with this stream
    assert second.b.qp.error is not None and second.b.qp.error.rule == "SEC-02"
    assert bytes(mr.buf[8:16]) == b"-" * 8


def test_sec_02_a_type1_window_serves_every_stream_of_its_pd() -> None:
    first = Pair()
    second = SharedResponder(first.b.rnic, first.b.pd)
    mr = target(first)
    rkey = bind1(first, first.b.pd.alloc_mw(1), mr, 0, 32, W)
    second.a.qp.post_send(write(1, b"any one!", rkey, mr.base))
    second.pump()
    assert refused(second) is None and bytes(mr.buf[:8]) == b"any one!"


def test_sec_01_a_window_is_refused_on_a_stream_of_another_pd() -> None:
    first = Pair()
    other = SharedResponder(first.b.rnic, first.b.rnic.alloc_pd())  # same RNIC, another PD
    mr = target(first)
    rkey = bind1(first, first.b.pd.alloc_mw(1), mr, 0, 32, W)
    first.a.qp.post_send(write(1, b"same pd!", rkey, mr.base))
    first.pump()
    assert refused(first) is None
    other.a.qp.post_send(write(1, b"other pd", rkey, mr.base + 8))
    other.pump()
    assert refused(other) == (1, 1, 0x02) and bytes(mr.buf[8:16]) == b"-" * 8
    assert other.b.qp.error is not None and other.b.qp.error.rule == "SEC-01"


def test_sec_05_a_window_of_another_pd_is_not_bound() -> None:
    p = Pair()
    mw = p.b.rnic.alloc_pd().alloc_mw(1)
    bind1(p, mw, target(p), 0, 16, W)
    assert bind_status(p) == [(WcOpcode.BIND_MW, WcStatus.MW_BIND_ERR)]


# ------------------------------------------------------------------------------ revocation
def test_sec_06_rebinding_changes_the_key_and_the_old_stag_is_refused() -> None:
    p = Pair()
    mr = target(p)
    mw = p.b.pd.alloc_mw(1)
    old = bind1(p, mw, mr, 0, 16, W)
    new = bind1(p, mw, mr, 16, 16, W)
    assert new != old and new >> 8 == old >> 8
    p.a.qp.post_send(write(1, b"new key!", new, mr.base + 16))
    p.pump()
    assert refused(p) is None and bytes(mr.buf[16:24]) == b"new key!"
    p.a.qp.post_send(write(2, b"old key!", old, mr.base))
    p.pump()
    assert refused(p) == (1, 1, 0x00) and bytes(mr.buf[:16]) == b"-" * 16


def test_sec_06_a_type2_bind_needs_a_new_key_and_an_unbound_window() -> None:
    p = Pair()
    mr = target(p)
    mw = p.b.pd.alloc_mw(2)
    info = MwBindInfo(mr, mr.base, 16, W)
    p.b.qp.post_send(SendWR(1, WrOpcode.BIND_MW, bind_mw=BindMw(mw, mw.rkey, info)))
    assert bind_status(p) == [(WcOpcode.BIND_MW, WcStatus.MW_BIND_ERR)]  # the same key
    q = Pair()
    mr = target(q)
    mw = q.b.pd.alloc_mw(2)
    q.b.qp.post_send(bind2_wr(mw, mr, 0, 16, W))
    q.b.qp.post_send(bind2_wr(mw, mr, 0, 16, W))  # still bound
    assert bind_status(q) == [
        (WcOpcode.BIND_MW, WcStatus.SUCCESS),
        (WcOpcode.BIND_MW, WcStatus.MW_BIND_ERR),
    ]


def test_sec_06_a_locally_invalidated_type2_window_is_refused_and_can_be_bound_again() -> None:
    p = Pair()
    mr = target(p)
    mw = p.b.pd.alloc_mw(2)
    p.b.qp.post_send(bind2_wr(mw, mr, 0, 32, W))
    first = mw.rkey
    p.a.qp.post_send(write(1, b"bound!!!", first, mr.base))
    p.pump()
    assert refused(p) is None and bytes(mr.buf[:8]) == b"bound!!!"
    p.b.qp.post_send(SendWR(2, WrOpcode.LOCAL_INV, invalidate_rkey=first))
    assert not mw.valid
    p.b.qp.post_send(bind2_wr(mw, mr, 0, 32, W))  # invalid again: may be bound anew
    assert [s for _op, s in bind_status(p)] == [WcStatus.SUCCESS] * 3 and mw.rkey != first
    p.a.qp.post_send(write(3, b"revoked!", first, mr.base + 8))
    p.pump()
    assert refused(p) == (1, 1, 0x00) and bytes(mr.buf[8:16]) == b"-" * 8


def test_sec_06_a_type1_window_is_not_locally_invalidated() -> None:
    p = Pair()
    mw = p.b.pd.alloc_mw(1)
    rkey = bind1(p, mw, target(p), 0, 16, W)
    p.b.qp.post_send(SendWR(2, WrOpcode.LOCAL_INV, invalidate_rkey=rkey))
    assert bind_status(p) == [
        (WcOpcode.BIND_MW, WcStatus.SUCCESS),
        (WcOpcode.LOCAL_INV, WcStatus.MW_BIND_ERR),
    ]


def test_sec_06_a_zero_length_bind_unbinds_a_type1_window() -> None:
    p = Pair()
    mr = target(p)
    mw = p.b.pd.alloc_mw(1)
    rkey = bind1(p, mw, mr, 0, 16, W)
    bind1(p, mw, mr, 0, 0, W)
    assert not mw.valid
    p.a.qp.post_send(write(1, b"unbound!", rkey, mr.base))
    p.pump()
    assert refused(p) == (1, 1, 0x00) and bytes(mr.buf) == b"-" * SIZE


def test_sec_06_a_window_stops_working_with_its_mr_and_when_deallocated() -> None:
    p = Pair()
    mr = target(p)
    mw = p.b.pd.alloc_mw(1)
    rkey = bind1(p, mw, mr, 0, 16, W)
    assert mw.valid
    mr.invalidate()
    assert not mw.valid
    q = Pair()
    mr = target(q)
    mw = q.b.pd.alloc_mw(1)
    rkey = bind1(q, mw, mr, 0, 16, W)
    mw.dealloc()
    assert q.b.rnic.table.lookup(rkey) is None
    q.a.qp.post_send(write(1, b"dealloc!", rkey, mr.base))
    q.pump()
    assert refused(q) == (1, 1, 0x00) and bytes(mr.buf) == b"-" * SIZE


# ----------------------------------------------------------------------- remote invalidation
def _send_invalidate(p: Pair, stag: int) -> None:
    p.b.qp.post_recv(RecvWR(7, (p.b.sge(p.b.mr(16)),)))
    p.a.qp.post_send(
        SendWR(
            1, WrOpcode.SEND_WITH_INV, inline_data=b"inv", invalidate_rkey=stag,
            send_flags=SendFlags.SIGNALED,
        )
    )  # fmt: skip
    p.pump()


def test_rdmap_09_a_type2_window_is_invalidated_by_its_streams_peer() -> None:
    p = Pair()
    mr = target(p)
    mw = p.b.pd.alloc_mw(2)
    p.b.qp.post_send(bind2_wr(mw, mr, 0, 16, W))
    p.b.cq.poll()
    _send_invalidate(p, mw.rkey)
    assert refused(p) is None and not mw.valid
    (wc,) = p.b.cq.poll()
    assert wc.wc_flags & WcFlags.WITH_INV and wc.invalidated_rkey == mw.rkey
    p.a.qp.post_send(write(2, b"too late", mw.rkey, mr.base))
    p.pump()
    assert refused(p) == (1, 1, 0x00) and bytes(mr.buf) == b"-" * SIZE


def test_rdmap_09_a_type1_window_is_not_remotely_invalidatable() -> None:
    p = Pair()
    mr = target(p)
    mw = p.b.pd.alloc_mw(1)
    rkey = bind1(p, mw, mr, 0, 16, W)
    _send_invalidate(p, rkey)
    assert refused(p) == (0, 1, 0x09)  # STag cannot be invalidated
    assert p.b.qp.error is not None and p.b.qp.error.rule == "RDMAP-09"
    assert mw.valid


# ------------------------------------------------------------------------------ dereg
def test_sec_06_dereg_of_an_mr_with_a_bound_window_is_refused_until_the_window_goes() -> None:
    p = Pair()
    mr = target(p)
    mw = p.b.pd.alloc_mw(1)
    bind1(p, mw, mr, 0, 16, W)
    assert bind_status(p) == [(WcOpcode.BIND_MW, WcStatus.SUCCESS)]
    with pytest.raises(LocalError, match="1 bound memory window"):
        mr.dereg()
    assert mr.valid and p.b.pd.table.lookup(mr.stag) is mr  # nothing changed
    mw.dealloc()
    mr.dereg()
    assert not mr.valid and p.b.pd.table.lookup(mr.stag) is None


def test_sec_06_dereg_succeeds_once_a_type2_window_is_invalidated() -> None:
    p = Pair()
    mr = target(p)
    mw = p.b.pd.alloc_mw(2)
    p.b.qp.post_send(bind2_wr(mw, mr, 0, 16, W))
    assert bind_status(p) == [(WcOpcode.BIND_MW, WcStatus.SUCCESS)]
    with pytest.raises(LocalError, match="bound memory window"):
        mr.dereg()
    p.b.qp.post_send(
        SendWR(52, WrOpcode.LOCAL_INV, invalidate_rkey=mw.rkey, send_flags=SendFlags.SIGNALED)
    )
    assert bind_status(p) == [(WcOpcode.LOCAL_INV, WcStatus.SUCCESS)]
    mr.dereg()
    assert not mr.valid
