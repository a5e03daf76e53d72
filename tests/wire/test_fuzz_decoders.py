"""Random and mutated ULPDUs into every DDP/RDMAP decoder: only the project's own errors.

Bounded budgets: each test runs a fixed number of Hypothesis examples with no deadline.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stack.errors import DecodeError, LocalError, ProtocolError
from stack.wire import ddp
from stack.wire.events import (
    AtomicRequest,
    AtomicResponse,
    ImmediateData,
    RdmapMessage,
    RdmaWrite,
    ReadRequest,
    ReadResponse,
    Send,
    Terminate,
)
from stack.wire.rdmap import decode_ulpdu, encode_message
from stack.wire.stream import RdmapStream
from stack.wire.terminate import build_terminate, decode_terminate
from tests.wire.test_rdmap import FPDUS, SEND_MSN7, ulpdu_of

SEEDS: list[bytes] = [ulpdu_of(name) for name in sorted(FPDUS)] + [SEND_MSN7]
for _msg in (
    Send(b"x" * 300, True, 5),
    ReadResponse(3, 1 << 40, b"y" * 20),
    ImmediateData(b"12345678", True),
    AtomicRequest.cmp_swap(1, 2, 8, 3, 4),
    AtomicResponse(1, 2),
    Terminate(1, 1, 3, m=True, d=True, ddp_seg_len=22, ddp_header=ulpdu_of("E2")[:14]),
    build_terminate((0, 1, 0), ulpdu_of("E3")),
):
    SEEDS += encode_message(_msg, msn=1, mulpdu=128)

# Structured ULPDU starts: every control-byte combination in front of random bytes.
ctrl_pairs = st.tuples(st.integers(0, 255), st.integers(0, 255))


@st.composite
def mutated(draw: st.DrawFn) -> bytes:
    """A seed ULPDU with a few byte flips, a truncation and/or garbage appended."""
    data = bytearray(draw(st.sampled_from(SEEDS)))
    for _ in range(draw(st.integers(0, 4))):
        if data:
            data[draw(st.integers(0, len(data) - 1))] = draw(st.integers(0, 255))
    if draw(st.booleans()):
        data = data[: draw(st.integers(0, len(data)))]
    if draw(st.booleans()):
        data += draw(st.binary(max_size=40))
    return bytes(data)


def structured() -> st.SearchStrategy[bytes]:
    return st.builds(lambda c, rest: bytes(c) + rest, ctrl_pairs, st.binary(max_size=90))


any_ulpdu = st.one_of(st.binary(max_size=120), structured(), mutated())


def decode_all_ways(data: bytes) -> None:
    for rfc7306 in (True, False):
        for siw in (None, True, False):
            try:
                seg = decode_ulpdu(data, rfc7306=rfc7306, siw_layout=siw)
            except ProtocolError:
                pass
            else:
                assert seg.ulpdu_len == len(data)
            try:
                lenient = decode_ulpdu(data, strict=False, rfc7306=rfc7306, siw_layout=siw)
            except DecodeError:
                continue  # only a missing DDP header may stop lenient decoding
            assert lenient.ulpdu_len == len(data) and lenient.payload.nbytes <= len(data)


@settings(max_examples=250, deadline=None)
@given(any_ulpdu)
def test_decode_ulpdu_raises_only_protocol_errors(data: bytes) -> None:
    decode_all_ways(data)


@settings(max_examples=200, deadline=None)
@given(any_ulpdu)
def test_lenient_decode_agrees_with_strict(data: bytes) -> None:
    try:
        lenient = decode_ulpdu(data, strict=False)
    except DecodeError as exc:
        # Only a ULPDU without a complete DDP header stops lenient decoding.
        assert exc.rule == "DDP-01"
        assert len(data) < 2 or len(data) < ddp.header_len_for(data[0])
        with pytest.raises(ProtocolError):
            decode_ulpdu(data)
        return
    fatal = [f for f in lenient.findings if f.fatal]
    try:
        strict = decode_ulpdu(data)
    except ProtocolError as exc:
        # Strict mode raises exactly the first violation lenient mode lists.
        assert fatal and (fatal[0].rule, fatal[0].term) == (exc.rule, exc.term)
        return
    assert not fatal and strict == lenient


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=80))
def test_decode_terminate_and_parse_header_raise_only_decode_errors(data: bytes) -> None:
    for siw in (None, True, False):
        try:
            decode_terminate(data, siw_layout=siw)
        except DecodeError:
            assert len(data) < 4
    try:
        ddp.parse_header(data)
    except DecodeError:
        assert len(data) < 18


@settings(max_examples=100, deadline=None)
@given(st.lists(any_ulpdu, min_size=1, max_size=12), st.booleans())
def test_stream_receive_raises_only_protocol_errors(ulpdus: list[bytes], rfc7306: bool) -> None:
    rx = RdmapStream(1442, rfc7306=rfc7306)
    for data in ulpdus:
        try:
            rx.receive_ulpdu(data)
        except ProtocolError as exc:
            # Whatever went wrong, a Terminate for it can always be built and sent.
            t = rx.terminate_message(exc, data)
            RdmapStream(128).send(t)


@settings(max_examples=100, deadline=None)
@given(any_ulpdu, st.integers(0, 1 << 33), st.sampled_from([(1, 2, 6), (0, 1, 0), (0, 2, 7)]))
def test_build_terminate_from_any_bytes_is_encodable(
    data: bytes, progress: int, cause: tuple[int, int, int]
) -> None:
    t = build_terminate(cause, data, read_progress=progress)
    (ulpdu,) = encode_message(t, msn=1, mulpdu=128)
    assert decode_ulpdu(ulpdu).header == t


@settings(max_examples=100, deadline=None)
@given(
    st.one_of(
        st.builds(RdmaWrite, st.integers(-5, 1 << 33), st.integers(-5, 1 << 65), st.binary()),
        st.builds(ReadRequest, *[st.integers(-5, 1 << 65)] * 5),
        st.builds(AtomicResponse, st.integers(-5, 1 << 33), st.integers(-5, 1 << 65)),
        st.builds(ImmediateData, st.binary(max_size=12)),
    ),
    st.integers(0, 70000),
)
def test_encoders_raise_only_local_errors(msg: RdmapMessage, mulpdu: int) -> None:
    try:
        ulpdus = encode_message(msg, msn=1, mulpdu=mulpdu)
    except LocalError:
        return
    for u in ulpdus:
        decode_ulpdu(u)


class SlowPathStream(RdmapStream):
    """The same stream with the fast path switched off (reference for the differential test)."""

    def _fast_path(self, view: memoryview) -> None:
        return None


def outcome(stream: RdmapStream, ulpdu: bytes) -> object:
    try:
        return stream.receive_ulpdu(ulpdu)
    except ProtocolError as exc:
        return (type(exc), exc.rule, exc.term)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.one_of(
                st.builds(Send, st.binary(max_size=400), st.booleans(), st.none() | st.just(7)),
                st.builds(RdmaWrite, st.just(3), st.integers(0, 1 << 20), st.binary(max_size=300)),
                st.builds(ReadResponse, st.just(4), st.just(0), st.binary(max_size=300)),
                st.just(ReadRequest(1, 0, 8, 2, 0)),
                st.builds(ReadRequest, *[st.integers(0, 2**32 - 1)] * 5),
                st.builds(
                    AtomicRequest.fetch_add,
                    st.integers(0, 9),
                    st.integers(0, 9),
                    st.integers(0, 64).map(lambda k: 8 * k),
                    st.integers(0, 2**64 - 1),
                ),
                st.builds(
                    AtomicRequest.cmp_swap,
                    *[st.integers(0, 9)] * 2,
                    st.just(8),
                    st.integers(0, 2**64 - 1),
                    st.integers(0, 2**64 - 1),
                ),  # fmt: skip
                st.builds(AtomicResponse, st.integers(0, 9), st.integers(0, 2**64 - 1)),
                st.builds(ImmediateData, st.binary(min_size=8, max_size=8), st.booleans()),
            ),
            st.lists(st.tuples(st.integers(0, 60), st.integers(0, 255)), max_size=2),
        ),
        min_size=1,
        max_size=8,
    ),
    st.booleans(),
)
def test_stream_fast_path_matches_full_validation(
    plan: list[tuple[RdmapMessage, list[tuple[int, int]]]], rfc7306: bool
) -> None:
    """Every segment, corrupted or not, gives the same events, error, findings and
    sequencing with the fast paths (tagged data, Sends, the fixed-size Read Request, atomic
    and Immediate Data messages) as with full validation; also without RFC 7306."""
    tx = RdmapStream(128)
    fast, slow = RdmapStream(1442, rfc7306=rfc7306), SlowPathStream(1442, rfc7306=rfc7306)
    for msg, flips in plan:
        for ulpdu in tx.send(msg):
            data = bytearray(ulpdu)
            for pos, value in flips:
                if pos < len(data):
                    data[pos] = value
            assert outcome(fast, bytes(data)) == outcome(slow, bytes(data))
            assert fast.recv_state == slow.recv_state and fast.findings == slow.findings
            assert fast.sequencer.next_msn == slow.sequencer.next_msn
            assert fast.sequencer.open_untagged == slow.sequencer.open_untagged
