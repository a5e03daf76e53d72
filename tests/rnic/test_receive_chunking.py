"""The receive path under arbitrary TCP segmentation (MPA-15, MPA-16): fed in random chunks,
a connection places the same bytes and completes the same WRs as fed in one piece."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stack.constants import DDP_TAGGED, DDP_TAGGED_HDR_LEN
from stack.rnic import Access, RecvWR, SendWR, WcOpcode, WcStatus, WrOpcode
from stack.rnic import memory as memory_module
from stack.rnic.memory import MemoryRegion
from stack.wire.events import MpaSettings
from stack.wire.framing import FpduDeframer, FpduFramer
from tests.rnic.helpers import Pair

_TARGET = 1 << 16
_ONE_WAY = (
    st.tuples(st.just("write"), st.integers(0, 9000), st.integers(0, _TARGET - 9000)),
    st.tuples(st.just("send"), st.integers(0, 3000), st.just(0)),
    st.tuples(st.just("imm"), st.integers(0, 100), st.integers(0, 1000)),
)
_OPS = st.lists(st.one_of(*_ONE_WAY), min_size=1, max_size=12)
_OPS_AND_REQUESTS = st.lists(
    st.one_of(
        *_ONE_WAY,
        # ``b`` answers these: one-segment messages on the bulk path (a Read Request, an
        # atomic Request), their answers compared in _observe
        st.tuples(st.just("read"), st.integers(0, 9000), st.integers(0, _TARGET - 9000)),
        st.tuples(st.just("fetch_add"), st.integers(0, 2**64 - 1), st.integers(0, 64)),
    ),
    min_size=1,
    max_size=12,
)


class _Pair(Pair):
    """A :class:`Pair` with the regions the tests below use."""

    target: MemoryRegion
    inbox: MemoryRegion
    src: MemoryRegion
    read_src: MemoryRegion
    sink: MemoryRegion
    fetched: MemoryRegion
    answers: MemoryRegion


def _pair(markers: bool, seed: int, emss: int | None) -> _Pair:
    """A connected pair whose STags come from ``seed`` (two pairs of one seed agree)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(memory_module.secrets, "randbelow", random.Random(seed).randrange)
        s = MpaSettings(want_markers=markers, ird=16, ord=16, emss=emss)
        qp = {"ird": 16, "ord": 16}  # requests of both ends all go out at once
        pair = _Pair(s, s, a_qp=qp, b_qp=qp)
        pair.pump()
        pair.target = pair.b.mr(
            _TARGET,
            Access.LOCAL_WRITE
            | Access.REMOTE_WRITE
            | Access.REMOTE_READ
            | Access.REMOTE_ATOMIC
            | Access.ZERO_BASED,
        )
        pair.inbox = pair.b.mr(3000 * 12)
        pair.src = pair.a.mr(random.Random(seed).randbytes(9000))
        zero_based_read = (
            Access.LOCAL_WRITE | Access.REMOTE_READ | Access.REMOTE_ATOMIC | Access.ZERO_BASED
        )
        pair.read_src = pair.a.pd.reg_mr(pair.src.buf, zero_based_read)
        pair.sink = pair.b.mr(9000 * 3, Access.LOCAL_WRITE | Access.ZERO_BASED)
        pair.fetched = pair.b.mr(8 * 4)
        pair.answers = pair.a.mr(9000 * 12, Access.LOCAL_WRITE | Access.ZERO_BASED)
    return pair


def _post(pair: _Pair, ops: list[tuple[str, int, int]]) -> bytes:
    a, b = pair.a, pair.b
    target, inbox, src = pair.target, pair.inbox, pair.src
    recvs = [
        RecvWR(100 + k, (b.sge(inbox, 3000 * k, 3000),))
        for k, op in enumerate(ops)
        if op[0] in ("send", "imm")
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
        elif kind == "read":
            sink = a.sge(pair.answers, 9000 * k, size)
            wrs.append(
                SendWR(
                    k,
                    WrOpcode.RDMA_READ,
                    (sink,),
                    rkey=target.rkey,
                    remote_addr=target.base + offset,
                )
            )
        elif kind == "fetch_add":
            wrs.append(
                SendWR(
                    k,
                    WrOpcode.ATOMIC_FETCH_AND_ADD,
                    (a.sge(pair.answers, 9000 * k, 8),),
                    rkey=target.rkey,
                    remote_addr=target.base + offset * 8,
                    compare_add=size,
                )
            )
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


_Completion = tuple[int, WcStatus, WcOpcode, int, bytes | None]


def _outcome(pair: _Pair) -> tuple[bytes, bytes, list[_Completion]]:
    wcs = pair.b.cq.poll(1000)
    done = [(wc.wr_id, wc.status, wc.opcode, wc.byte_len, wc.imm_data) for wc in wcs]
    return bytes(pair.target.buf), bytes(pair.inbox.buf), done


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
    src = whole.src.buf
    for kind, size, offset in ops:
        if kind != "send":
            target[offset : offset + size] = src[:size]
    assert expected[0] == bytes(target)
    assert len(expected[2]) == sum(kind != "write" for kind, _, _ in ops)


# -- the bulk path against the reference path ---------------------------------------------
# The same wire, cut into the same chunks, goes to two identical pairs: one places tagged
# segments as they are deframed from borrowed views of a reused buffer (the driver's
# recv_into), the other turns every ULPDU into an event from its own bytes.  Placements,
# completions, async events, errors and the Terminate sent must be the same, for good
# streams and for bad ones (CRC, STag, bounds, Send MSN and MO out of sequence,
# truncation and FIN mid-FPDU).

_FAULTS = st.sampled_from(["none", "flip", "stag", "bounds", "truncate", "msn", "mo"])
_READS = st.lists(st.integers(0, 9000), max_size=3)


def _with_reads(pair: _Pair, reads: list[int], atomics: int = 0) -> None:
    """``b`` posts RDMA Reads of ``a``'s source into its sink, and ``atomics`` FetchAdds on
    it; ``a`` gets the requests."""
    a, b = pair.a, pair.b
    src = pair.read_src
    wrs = [
        SendWR(
            500 + k,
            WrOpcode.RDMA_READ,
            (b.sge(pair.sink, 9000 * k, size),),
            rkey=src.rkey,
            remote_addr=src.base,
        )
        for k, size in enumerate(reads)
    ]
    wrs += [
        SendWR(
            600 + k,
            WrOpcode.ATOMIC_FETCH_AND_ADD,
            (b.sge(pair.fetched, 8 * k, 8),),
            rkey=src.rkey,
            remote_addr=8 * k,
            compare_add=k + 1,
        )
        for k in range(atomics)
    ]
    if wrs:
        b.engine.mpa.send_first()  # the Read Requests go before anything came from ``a``
        b.qp.post_send(wrs)
        assert b.endpoint is not None and a.endpoint is not None
        assert a.endpoint.feed(bytes(b.endpoint.produce()))


def _ulpdus(wire: bytes, offset: int, markers: bool) -> list[bytes]:
    deframer = FpduDeframer(markers=markers, offset=offset)
    deframer.feed(wire)
    out = [bytes(u) for u in deframer]
    assert not deframer.pending
    return out


def _faulty(wire: bytes, offset: int, markers: bool, fault: str, where: int) -> bytes:
    """``wire`` (FPDUs from stream offset ``offset``) with one fault in it."""
    if fault == "none" or not wire:
        return wire
    if fault == "flip":  # any byte: a length, CRC or marker error, or a header the checks refuse
        at = where % len(wire)
        return wire[:at] + bytes([wire[at] ^ 0x41]) + wire[at + 1 :]
    if fault == "truncate":
        return wire[: where % len(wire)]
    ulpdus = _ulpdus(wire, offset, markers)
    if fault in ("msn", "mo"):  # a Send segment out of sequence (DDP-04, DDP-05)
        untagged = [k for k, u in enumerate(ulpdus) if not u[0] & DDP_TAGGED]
        if not untagged:
            return wire
        k = untagged[where % len(untagged)]
        field = 10 if fault == "msn" else 14  # ctrl(2) RsvdULP(4) QN(4) MSN(4) MO(4)
        seg = bytearray(ulpdus[k])
        seg[field : field + 4] = (int.from_bytes(seg[field : field + 4], "big") + 1).to_bytes(
            4, "big"
        )
        ulpdus[k] = bytes(seg)
        framer = FpduFramer(markers=markers, offset=offset)
        return b"".join(bytes(framer.frame(u)) for u in ulpdus)
    tagged = [k for k, u in enumerate(ulpdus) if u[0] & DDP_TAGGED]
    if not tagged:
        return wire
    k = tagged[where % len(tagged)]
    header = bytearray(ulpdus[k][:DDP_TAGGED_HDR_LEN])
    if fault == "stag":
        header[4:8] = (int.from_bytes(header[4:8], "big") ^ 0x0100).to_bytes(4, "big")
    else:  # bounds: past the end of the tagged buffer
        to = int.from_bytes(header[8:16], "big") + _TARGET
        header[8:16] = to.to_bytes(8, "big")
    ulpdus[k] = bytes(header) + ulpdus[k][DDP_TAGGED_HDR_LEN:]
    framer = FpduFramer(markers=markers, offset=offset)
    return b"".join(bytes(framer.frame(u)) for u in ulpdus)


def _observe(pair: _Pair, results: list[bool]) -> tuple[object, ...]:
    b = pair.b
    assert b.endpoint is not None
    err = b.endpoint.error
    error = None if err is None else (type(err).__name__, getattr(err, "rule", None), str(err))
    wcs = [(wc.wr_id, wc.status, wc.opcode, wc.byte_len, wc.imm_data) for wc in b.cq.poll(1000)]
    asyncs = []
    while (event := b.rnic.async_events.poll()) is not None:
        asyncs.append(repr(event))
    return (
        results,
        bytes(pair.target.buf),
        bytes(pair.inbox.buf),
        bytes(pair.sink.buf),
        bytes(pair.fetched.buf),
        wcs,
        asyncs,
        error,
        b.qp.state,
        bytes(b.endpoint.produce()),  # the Terminate, if any
    )


@settings(max_examples=50, deadline=None)
@given(
    ops=_OPS_AND_REQUESTS,
    reads=_READS,
    atomics=st.integers(0, 3),
    markers=st.booleans(),
    small_fpdus=st.booleans(),
    seed=st.integers(0, 2**32),
    cuts=st.lists(st.integers(1, 5000), max_size=60),
    fault=_FAULTS,
    where=st.integers(0, 2**32),
)
def test_bulk_placement_matches_the_event_path(
    ops: list[tuple[str, int, int]],
    reads: list[int],
    atomics: int,
    markers: bool,
    small_fpdus: bool,
    seed: int,
    cuts: list[int],
    fault: str,
    where: int,
) -> None:
    emss = 600 if small_fpdus else None
    fast, reference = _pair(markers, seed, emss), _pair(markers, seed, emss)
    assert reference.b.endpoint is not None and fast.b.endpoint is not None
    reference.b.endpoint.bulk = False  # every ULPDU an event: the reference path
    for pair in (fast, reference):
        _with_reads(pair, reads, atomics)
    framer = fast.a.engine.mpa._framer  # noqa: SLF001 - where the wire starts (markers)
    assert framer is not None
    start = framer.offset
    wire = _post(fast, ops)
    assert _post(reference, ops) == wire
    wire = _faulty(wire, start, markers, fault, where)
    chunks, at = [], 0
    for cut in cuts:
        if at >= len(wire):
            break
        chunks.append(wire[at : at + cut])
        at += cut
    if at < len(wire):
        chunks.append(wire[at:])
    if fault == "truncate":
        chunks.append(b"")  # the peer closes mid-FPDU
    rx = bytearray(max(map(len, chunks), default=0))
    fast_results, reference_results = [], []
    for chunk in chunks:
        reference_results.append(reference.b.endpoint.feed(chunk))
        rx[: len(chunk)] = chunk
        fast_results.append(fast.b.endpoint.feed(memoryview(rx)[: len(chunk)]))
        assert fast.b.endpoint.stalled is None
        rx[:] = bytes([0xEE]) * len(rx)  # reused at once: nothing may still view it
    assert _observe(fast, fast_results) == _observe(reference, reference_results)


def test_a_send_on_the_bulk_path_never_shows_through_an_earlier_read() -> None:
    """RFC 5040 §5.5: a Read Response queued at the responder still views its memory; a Send
    that arrives after the Read Request and lands in that memory must not change what the
    Read returns.  The Send takes the event path then (the responses are snapshotted)."""
    p = Pair()
    region = p.b.mr(bytes([7]) * 4096, Access.LOCAL_WRITE | Access.REMOTE_READ)
    p.b.qp.post_recv(RecvWR(5, (p.b.sge(region, 0, 64),)))
    sink = p.a.mr(4096)
    p.a.qp.post_send(
        SendWR(1, WrOpcode.RDMA_READ, (p.a.sge(sink),), rkey=region.rkey, remote_addr=region.base)
    )
    assert p.a.endpoint is not None and p.b.endpoint is not None and p.b.endpoint.bulk
    p.b.endpoint.feed(memoryview(bytes(p.a.endpoint.produce())))  # the Read Request
    p.a.qp.post_send(SendWR(2, WrOpcode.SEND, inline_data=b"\x01" * 64))
    p.b.endpoint.feed(memoryview(bytes(p.a.endpoint.produce())))  # the Send, on its own
    assert bytes(region.buf[:64]) == b"\x01" * 64  # the Send landed...
    p.pump()
    assert bytes(sink.buf) == bytes([7]) * 4096  # ...after the Read, which saw before
    assert [wc.wr_id for wc in p.b.cq.poll(8)] == [5]
