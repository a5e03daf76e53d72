"""Memory registration over any Python buffer, STags, invalidation and deregistration."""

from __future__ import annotations

import mmap

import numpy as np
import pytest

from stack.errors import LocalError
from stack.rnic import Access, Rnic, SendWR, WrOpcode
from stack.rnic.memory import StagTable
from tests.rnic.helpers import Pair

RW = Access.LOCAL_WRITE | Access.REMOTE_WRITE | Access.REMOTE_READ


@pytest.mark.parametrize("kind", ["bytearray", "memoryview", "mmap", "numpy"])
def test_remote_write_into_any_registered_buffer(kind: str) -> None:
    p = Pair()
    buf: bytearray | memoryview | mmap.mmap | np.ndarray
    if kind == "bytearray":
        buf = bytearray(64)
    elif kind == "memoryview":
        buf = memoryview(bytearray(128))[32:96]
    elif kind == "mmap":
        buf = mmap.mmap(-1, 64)
    else:
        buf = np.zeros(16, dtype=np.uint32)
    mr = p.b.pd.reg_mr(buf, RW)
    assert mr.length == 64
    p.a.qp.post_send(
        SendWR(
            1,
            WrOpcode.RDMA_WRITE,
            inline_data=b"\x01\x02\x03\x04",
            rkey=mr.rkey,
            remote_addr=mr.addr + 8,
        )
    )
    p.pump()
    # numpy's stubs give ndarray __buffer__ only for Python >= 3.12 (mypy checks 3.11)
    view = memoryview(buf)  # type: ignore[arg-type]
    assert bytes(view.cast("B")[8:12]) == b"\x01\x02\x03\x04"
    if kind == "numpy":
        assert buf[2] == 0x04030201


def test_va_based_addr_is_the_real_buffer_address() -> None:
    arr = np.zeros(8, dtype=np.uint64)
    mr = Rnic().alloc_pd().reg_mr(arr, Access.LOCAL_WRITE)
    assert mr.addr == arr.ctypes.data


def test_read_only_and_non_buffers_are_refused() -> None:
    pd = Rnic().alloc_pd()
    with pytest.raises(LocalError):
        pd.reg_mr(b"immutable", Access.LOCAL_WRITE)
    with pytest.raises(LocalError):
        pd.reg_mr(12345, Access.LOCAL_WRITE)


def test_sec_08_stags_are_unique_and_rekeyed_on_reuse() -> None:
    pd = Rnic().alloc_pd()
    stags = [pd.reg_mr(bytearray(8)).stag for _ in range(200)]
    assert len(set(stags)) == 200 and len({s >> 8 for s in stags}) == 200
    # not guessable from the previous one (SEC-08): the 8-bit key starts random per index,
    # so successive keys do not follow a counter's constant step
    key_steps = [(b - a) & 0xFF for a, b in zip(stags, stags[1:], strict=False)]
    assert max(key_steps.count(step) for step in set(key_steps)) < 20
    assert len({s & 0xFF for s in stags}) > 64


def test_sec_08_indices_are_random_not_sequential() -> None:
    """The 24-bit index is drawn at random too: successive indices share no step (a
    sequential allocator has step 1 every time) and spread over the whole space."""
    pd = Rnic().alloc_pd()
    indices = [pd.reg_mr(bytearray(8)).stag >> 8 for _ in range(200)]
    steps = [(b - a) & 0xFFFFFF for a, b in zip(indices, indices[1:], strict=False)]
    assert max(steps.count(step) for step in set(steps)) < 5
    assert 0 not in indices
    # 200 uniform draws from 2^24 land in most of 16 equal slices of the space
    assert len({i >> 20 for i in indices}) >= 12


def test_sec_08_a_freed_stag_is_not_handed_out_again_as_it_was() -> None:
    """Deregister and register again: never the STag just freed, even when the same index
    comes back (its key then differs from the last one)."""
    pd = Rnic().alloc_pd()
    for _ in range(300):
        mr = pd.reg_mr(bytearray(8))
        freed = mr.stag
        mr.dereg()
        assert pd.reg_mr(bytearray(8)).stag != freed
    table = StagTable()
    table._random_free_index = lambda: 0x123456  # type: ignore[method-assign]
    mr = pd.reg_mr(bytearray(8))
    last = table.register(mr)
    for _ in range(300):
        table._in_use.discard(last >> 8)  # as unregister does
        stag = table.register(mr)
        assert stag >> 8 == 0x123456 and stag != last
        last = stag


def test_sec_06_deregistered_stag_no_longer_reachable() -> None:
    p = Pair()
    mr = p.b.mr(16, RW)
    stag = mr.rkey
    mr.dereg()
    assert p.b.rnic.table.lookup(stag) is None
    p.a.qp.post_send(SendWR(1, WrOpcode.RDMA_WRITE, inline_data=b"x", rkey=stag, remote_addr=0))
    p.pump()
    assert p.a.qp.peer_terminate is not None and p.a.qp.peer_terminate.cause == (1, 1, 0)


def test_registered_bytearray_cannot_be_resized() -> None:
    buf = bytearray(16)
    Rnic().alloc_pd().reg_mr(buf, Access.LOCAL_WRITE)
    with pytest.raises(BufferError):
        buf.extend(b"more")
