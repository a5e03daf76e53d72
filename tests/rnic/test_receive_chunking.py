"""The receive path under arbitrary TCP segmentation (MPA-15, MPA-16): fed in random chunks,
a connection places the same bytes and completes the same WRs as fed in one piece."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stack.rnic import Access, RecvWR, SendWR, WrOpcode
from stack.rnic import memory as memory_module
from stack.wire.events import MpaSettings
from tests.rnic.helpers import Pair

_TARGET = 1 << 16
_OPS = st.lists(
    st.one_of(
        st.tuples(st.just("write"), st.integers(0, 9000), st.integers(0, _TARGET - 9000)),
        st.tuples(st.just("send"), st.integers(0, 3000), st.just(0)),
        st.tuples(st.just("imm"), st.integers(0, 100), st.integers(0, 1000)),
    ),
    min_size=1,
    max_size=12,
)


def _pair(markers: bool, seed: int, emss: int | None) -> Pair:
    """A connected pair whose STags come from ``seed`` (two pairs of one seed agree)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(memory_module.secrets, "randbelow", random.Random(seed).randrange)
        kw = {} if emss is None else {"emss": emss}
        s = MpaSettings(want_markers=markers, **kw)  # type: ignore[arg-type]
        pair = Pair(s, s)
        pair.pump()
        pair.target = pair.b.mr(
            _TARGET, Access.LOCAL_WRITE | Access.REMOTE_WRITE | Access.ZERO_BASED
        )  # type: ignore[attr-defined]
        pair.inbox = pair.b.mr(3000 * 12)  # type: ignore[attr-defined]
        pair.src = pair.a.mr(random.Random(seed).randbytes(9000))  # type: ignore[attr-defined]
    return pair


def _post(pair: Pair, ops: list[tuple[str, int, int]]) -> bytes:
    a, b = pair.a, pair.b
    target, inbox, src = pair.target, pair.inbox, pair.src  # type: ignore[attr-defined]
    recvs = [
        RecvWR(100 + k, (b.sge(inbox, 3000 * k, 3000),))
        for k, op in enumerate(ops)
        if op[0] != "write"
    ]
    if recvs:
        b.qp.post_recv(recvs)
    wrs = []
    for k, (kind, size, offset) in enumerate(ops):
        if kind == "write":
            wrs.append(
                SendWR(
                    k,
                    WrOpcode.RDMA_WRITE,
                    (a.sge(src, 0, size),),
                    rkey=target.rkey,
                    remote_addr=target.base + offset,
                )
            )
        elif kind == "send":
            wrs.append(SendWR(k, WrOpcode.SEND, (a.sge(src, 0, size),)))
        else:
            wrs.append(
                SendWR(
                    k,
                    WrOpcode.RDMA_WRITE_WITH_IMM,
                    (a.sge(src, 0, size),),
                    rkey=target.rkey,
                    remote_addr=target.base + offset,
                    imm_data=k,
                )
            )
    a.qp.post_send(wrs)
    assert a.endpoint is not None
    return bytes(a.endpoint.produce())


def _outcome(pair: Pair) -> tuple[bytes, bytes, list[tuple[object, ...]]]:
    wcs = pair.b.cq.poll(1000)
    done = [(wc.wr_id, wc.status, wc.opcode, wc.byte_len, wc.imm_data) for wc in wcs]
    return bytes(pair.target.buf), bytes(pair.inbox.buf), done  # type: ignore[attr-defined]


@settings(max_examples=60, deadline=None)
@given(
    ops=_OPS,
    markers=st.booleans(),
    small_fpdus=st.booleans(),
    seed=st.integers(0, 2**32),
    cuts=st.lists(st.integers(1, 5000), max_size=60),
)
def test_mpa_15_chunking_never_changes_placement_or_completions(
    ops: list[tuple[str, int, int]], markers: bool, small_fpdus: bool, seed: int, cuts: list[int]
) -> None:
    emss = 600 if small_fpdus else None
    whole, chunked = _pair(markers, seed, emss), _pair(markers, seed, emss)
    wire = _post(whole, ops)
    assert _post(chunked, ops) == wire  # the same connection twice
    assert whole.b.endpoint is not None and chunked.b.endpoint is not None
    assert whole.b.endpoint.feed(wire)
    at = 0
    for cut in cuts:
        if at >= len(wire):
            break
        assert chunked.b.endpoint.feed(wire[at : at + cut])
        at += cut
    if at < len(wire):
        assert chunked.b.endpoint.feed(wire[at:])
    expected = _outcome(whole)
    assert _outcome(chunked) == expected
    # ... and what was placed is what was posted.
    target = bytearray(_TARGET)
    src = whole.src.buf  # type: ignore[attr-defined]
    for kind, size, offset in ops:
        if kind != "send":
            target[offset : offset + size] = src[:size]
    assert expected[0] == bytes(target)
    assert len(expected[2]) == sum(kind != "write" for kind, _, _ in ops)
