"""TCP reassembly for captures (stack.dissect.tcp)."""

from __future__ import annotations

import random
import tracemalloc

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import stack.dissect.tcp as tcp
from stack.dissect.tcp import (
    HalfStream,
    Retransmission,
    StreamData,
    TcpReassembler,
)
from stack.pcap import TCP_ACK, TCP_FIN, TCP_RST, TCP_SYN, TcpSegment

ISN = 1000


def _kinds(events: list) -> list[tuple]:
    """Events as (type name, fields...) so NamedTuples of different types never compare equal."""
    out = []
    for ev in events:
        if type(ev) is StreamData:
            out.append(("data", ev.offset, bytes(ev.data), ev.frame))
        else:
            out.append((type(ev).__name__, *ev))
    return out


def _half() -> HalfStream:
    half = HalfStream()
    assert half.feed(ISN, b"", TCP_SYN, 1) == []
    return half


def test_in_order_data_offsets_start_after_syn() -> None:
    half = _half()
    assert _kinds(half.feed(ISN + 1, b"abc", TCP_ACK, 2)) == [("data", 0, b"abc", 2)]
    assert _kinds(half.feed(ISN + 4, b"de", TCP_ACK, 3)) == [("data", 3, b"de", 3)]
    assert half.next_offset == 5 and half.syn_seen


def test_out_of_order_waits_and_is_released_by_the_filling_frame() -> None:
    half = _half()
    assert half.feed(ISN + 4, b"def", TCP_ACK, 2) == []
    events = half.feed(ISN + 1, b"abc", TCP_ACK, 3)
    assert _kinds(events) == [("data", 0, b"abc", 3), ("data", 3, b"def", 3)]
    assert half.out_of_order == 1


def test_retransmission_is_reported_not_delivered_twice() -> None:
    half = _half()
    half.feed(ISN + 1, b"abcdef", TCP_ACK, 2)
    assert _kinds(half.feed(ISN + 1, b"abc", TCP_ACK, 3)) == [("Retransmission", 0, 3, 3)]
    assert half.retransmitted_bytes == 3 and half.conflicts == 0


def test_overlap_with_different_bytes_keeps_the_first_copy() -> None:
    half = _half()
    half.feed(ISN + 1, b"abcdef", TCP_ACK, 2)
    events = half.feed(ISN + 3, b"XYZghi", TCP_ACK, 3)
    assert _kinds(events) == [("OverlapConflict", 2, 4, 3), ("data", 6, b"hi", 3)]
    assert half.conflicts == 1


def test_partial_overlap_delivers_only_new_bytes() -> None:
    half = _half()
    half.feed(ISN + 1, b"abcd", TCP_ACK, 2)
    events = half.feed(ISN + 3, b"cdefg", TCP_ACK, 3)
    assert _kinds(events) == [("Retransmission", 2, 2, 3), ("data", 4, b"efg", 3)]


def test_gap_is_reported_at_flush_never_guessed_over() -> None:
    half = _half()
    half.feed(ISN + 1, b"ab", TCP_ACK, 2)
    assert half.feed(ISN + 10, b"xyz", TCP_ACK, 3) == []
    events = half.flush(9)
    # the data behind a declared gap keeps the frame that carried it
    assert _kinds(events) == [("Gap", 2, 7, 9), ("data", 9, b"xyz", 3)]
    assert half.gap_bytes == 7


def test_a_hole_the_peer_acknowledged_is_a_gap_at_once() -> None:
    r = TcpReassembler()
    r.feed(_seg(1, "a", 1, "b", 2, 100, TCP_SYN))
    r.feed(_seg(2, "b", 2, "a", 1, 500, TCP_SYN | TCP_ACK))
    r.feed(_seg(3, "a", 1, "b", 2, 101, TCP_ACK, b"abc"))
    _, _, events = r.feed(_seg(4, "a", 1, "b", 2, 110, TCP_ACK, b"later"))
    assert events == [] and r.deferred == []
    ack = TcpSegment(5, 0.0, "b", "a", 2, 1, 501, 112, TCP_ACK, memoryview(b""))
    r.feed(ack)  # b acknowledges bytes the capture never saw
    ((conn, side, deferred),) = r.deferred
    assert side == 0 and _kinds(deferred) == [("Gap", 3, 6, 5), ("data", 9, b"later", 4)]
    r.deferred.clear()
    ack2 = TcpSegment(6, 0.0, "b", "a", 2, 1, 501, 200, TCP_ACK, memoryview(b""))
    r.feed(ack2)
    assert r.deferred == []  # nothing waits any more


def test_pending_limit_forces_a_gap() -> None:
    half = HalfStream(max_pending=10)
    half.feed(ISN, b"", TCP_SYN, 1)
    assert half.feed(ISN + 101, b"x" * 8, TCP_ACK, 2) == []
    events = half.feed(ISN + 109, b"y" * 8, TCP_ACK, 3)
    assert _kinds(events)[0] == ("Gap", 0, 100, 3)
    assert b"".join(bytes(e.data) for e in events if type(e) is StreamData) == b"x" * 8 + b"y" * 8


def test_sequence_wrap_is_followed() -> None:
    half = HalfStream()
    half.feed(0xFFFFFFF0, b"", TCP_SYN, 1)
    half.feed(0xFFFFFFF1, b"a" * 20, TCP_ACK, 2)
    events = half.feed(5, b"bc", TCP_ACK, 3)  # 0xFFFFFFF1 + 20 wraps to 5
    assert _kinds(events) == [("data", 20, b"bc", 3)]
    assert half.seq_of(20) == 5


def test_fin_in_order_and_fin_before_missing_data() -> None:
    half = _half()
    events = half.feed(ISN + 1, b"ab", TCP_ACK | TCP_FIN, 2)
    assert _kinds(events) == [("data", 0, b"ab", 2), ("StreamEnd", 2, 2, False)]
    other = _half()
    assert other.feed(ISN + 5, b"", TCP_ACK | TCP_FIN, 2) == []
    assert _kinds(other.flush(4)) == [("Gap", 0, 4, 4), ("StreamEnd", 4, 4, False)]


def test_rst_ends_the_stream() -> None:
    half = _half()
    assert _kinds(half.feed(ISN + 1, b"", TCP_RST, 2)) == [("StreamEnd", 0, 2, True)]


def test_mid_stream_start_and_bytes_from_before_the_capture() -> None:
    half = HalfStream()
    assert _kinds(half.feed(5000, b"later", TCP_ACK, 1)) == [("data", 0, b"later", 1)]
    assert not half.syn_seen
    assert _kinds(half.feed(4990, b"0123456789", TCP_ACK, 2)) == []
    assert half.retransmitted_bytes == 10


def test_snaplen_cut_is_a_gap() -> None:
    half = _half()
    events = half.feed(ISN + 1, b"abc", TCP_ACK, 2, missing=5)
    assert _kinds(events) == [("data", 0, b"abc", 2), ("Gap", 3, 5, 2)]
    assert _kinds(half.feed(ISN + 9, b"z", TCP_ACK, 3)) == [("data", 8, b"z", 3)]


def _seg(frame: int, src: str, sport: int, dst: str, dport: int, seq: int, flags: int,
         data: bytes = b"") -> TcpSegment:  # fmt: skip
    return TcpSegment(frame, 0.0, src, dst, sport, dport, seq, 0, flags, memoryview(data))


def test_reassembler_numbers_connections_and_orients_by_syn() -> None:
    r = TcpReassembler()
    # the SYN-ACK is captured first: the SYN-ACK sender is still side 1
    conn, side, _ = r.feed(_seg(1, "b", 2, "a", 1, 50, TCP_SYN | TCP_ACK))
    assert side == 1 and conn.endpoints == (("a", 1), ("b", 2)) and conn.stream == 0
    conn2, side2, _ = r.feed(_seg(2, "c", 3, "d", 4, 7, TCP_ACK, b"x"))
    assert conn2.stream == 1 and side2 == 0
    conn3, side3, events = r.feed(_seg(3, "a", 1, "b", 2, 10, TCP_ACK, b"hi"))
    assert conn3 is conn and side3 == 0 and _kinds(events) == [("data", 0, b"hi", 3)]


def test_reassembler_port_reuse_starts_a_new_connection() -> None:
    r = TcpReassembler()
    r.feed(_seg(1, "a", 1, "b", 2, 100, TCP_SYN))
    r.feed(_seg(2, "a", 1, "b", 2, 101, TCP_ACK, b"data"))
    r.feed(_seg(3, "a", 1, "b", 2, 105, TCP_FIN | TCP_ACK))
    r.feed(_seg(4, "b", 2, "a", 1, 500, TCP_FIN | TCP_ACK))
    conn, _, _ = r.feed(_seg(5, "a", 1, "b", 2, 9000, TCP_SYN))
    assert conn.stream == 1 and len(r.connections) == 2


@settings(max_examples=60, deadline=None)
@given(
    st.binary(min_size=1, max_size=3000),
    st.lists(st.integers(min_value=1, max_value=400), min_size=1, max_size=40),
    st.integers(min_value=0, max_value=2**32 - 1),
    st.integers(min_value=0, max_value=10_000),
)
def test_any_segmentation_order_and_duplication_rebuilds_the_stream(
    data: bytes, sizes: list[int], isn: int, seed: int
) -> None:
    rng = random.Random(seed)
    cuts = []
    pos = 0
    for size in sizes * (len(data) // max(1, sum(sizes)) + 1):
        if pos >= len(data):
            break
        cuts.append((pos, data[pos : pos + size]))
        pos += size
    if pos < len(data):
        cuts.append((pos, data[pos:]))
    segments = cuts + rng.sample(cuts, k=min(3, len(cuts)))  # duplicates
    rng.shuffle(segments)
    half = HalfStream()
    half.feed(isn, b"", TCP_SYN, 0)
    out = bytearray()
    for frame, (offset, chunk) in enumerate(segments, 1):
        for ev in half.feed((isn + 1 + offset) % 2**32, chunk, TCP_ACK, frame):
            assert type(ev) in (StreamData, Retransmission), ev
            if type(ev) is StreamData:
                assert ev.offset == len(out)
                out += ev.data
    assert not half.flush(len(segments) + 1)
    assert bytes(out) == data


# ---- bounds: segments waiting behind a hole, the bytes resends are compared with ---------


def _park_tiny(half: HalfStream, count: int) -> list:
    """``count`` 1-byte segments at offsets 1.. behind a hole at offset 0 (frames 2..)."""
    events: list = []
    for i in range(1, count + 1):
        events += half.feed(ISN + 1 + i, bytes([i & 0xFF]), TCP_ACK, i + 1)
    return events


def test_waiting_segments_are_limited_by_count_as_well_as_bytes() -> None:
    limit = tcp.DEFAULT_MAX_PENDING_SEGMENTS
    half = _half()
    assert _park_tiny(half, limit) == [] and len(half._pending) == limit
    assert half._pending_bytes < half.max_pending // 100  # far below the byte limit
    # one segment more: the hole is declared a gap, as at the byte limit
    events = half.feed(ISN + 2 + limit, b"z", TCP_ACK, 99)
    assert _kinds(events[:2]) == [("Gap", 0, 1, 99), ("data", 1, b"\x01", 2)]
    assert len(events) == limit + 2 and events[-1].offset == limit + 1
    assert half.next_offset == limit + 2 and not half._pending and half.gap_bytes == 1


def test_a_small_segment_limit_forces_one_gap_per_hole() -> None:
    half = HalfStream(max_pending_segments=3)
    half.feed(ISN, b"", TCP_SYN, 1)
    for i, off in enumerate((10, 20, 30)):  # three holes, three waiting segments
        assert half.feed(ISN + 1 + off, b"abc", TCP_ACK, 2 + i) == []
    events = half.feed(ISN + 41, b"d", TCP_ACK, 5)
    assert _kinds(events) == [("Gap", 0, 10, 5), ("data", 10, b"abc", 2)]
    assert len(half._pending) == 3


def test_waiting_segments_keep_no_capture_window_alive() -> None:
    half = _half()
    tracemalloc.start()
    try:
        for i in range(1, 201):
            window = bytearray(64 << 10)  # a reader's window; the segment is one byte of it
            half.feed(ISN + 1 + i, memoryview(window)[i : i + 1], TCP_ACK, i + 1)
            del window
        held, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(half._pending) == 200
    assert held < 256 << 10  # views would keep 200 windows: 12.5 MiB


def test_waiting_segments_go_on_in_order_however_they_arrived() -> None:
    half = _half()
    n = 3000
    for i in range(n, 0, -1):  # backwards: each lands before all that wait
        assert half.feed(ISN + 1 + i, bytes([i & 0xFF]), TCP_ACK, n - i + 2) == []
    half.feed(ISN + 3, b"\xee", TCP_ACK, 9000)  # a later copy at the same start: not kept
    events = half.feed(ISN + 1, b"\x00", TCP_ACK, 9001)
    assert [(type(e).__name__, e.offset) for e in events[:4]] == [
        ("StreamData", 0),
        ("StreamData", 1),
        ("StreamData", 2),
        ("OverlapConflict", 2),
    ]
    assert _kinds(events[2:4]) == [("data", 2, b"\x02", 9001), ("OverlapConflict", 2, 1, 9001)]
    data = [e for e in events if type(e) is StreamData]
    assert [e.offset for e in data] == list(range(n + 1))
    assert not half._pending and half._pending_bytes == 0


def test_a_conflicting_resend_far_back_in_tiny_segments_is_found() -> None:
    half = _half()
    for i in range(5000):
        half.feed(ISN + 1 + i, b"a", TCP_ACK, i + 2)
    # 5000 segments back, 5000 bytes back: within the bytes kept however small the segments
    assert _kinds(half.feed(ISN + 1, b"X", TCP_ACK, 9000)) == [("OverlapConflict", 0, 1, 9000)]
    assert _kinds(half.feed(ISN + 1, b"a", TCP_ACK, 9001)) == [("Retransmission", 0, 1, 9001)]


def test_resends_are_compared_with_the_last_recent_bytes_in_bounded_memory() -> None:
    recent = tcp.RECENT_BYTES
    rng = random.Random(7)
    data = rng.randbytes(3 * recent + 1000)
    half = _half()
    for frame, pos in enumerate(range(0, len(data), 1460), 2):
        half.feed(ISN + 1 + pos, data[pos : pos + 1460], TCP_ACK, frame)
    nxt = len(data)
    assert half.next_offset == nxt and len(half._ring) == recent

    def resend(offset: int, length: int) -> list[tuple]:
        bad = bytes(b ^ 1 for b in data[offset : offset + length])
        return _kinds(half.feed(ISN + 1 + offset, bad, TCP_ACK, 1))

    oldest = nxt - recent
    assert resend(oldest, 8) == [("OverlapConflict", oldest, 8, 1)]
    assert resend(oldest - 8, 8) == [("Retransmission", oldest - 8, 8, 1)]  # not kept
    wrap = 3 * recent  # where the ring wraps: both sides compared
    assert resend(wrap - 4, 8) == [("OverlapConflict", wrap - 4, 8, 1)]
    same = data[wrap - 4 : wrap + 4]
    assert _kinds(half.feed(ISN + 1 + wrap - 4, same, TCP_ACK, 1)) == [
        ("Retransmission", wrap - 4, 8, 1)
    ]


def test_resend_checks_match_a_model_of_the_last_bytes(monkeypatch: pytest.MonkeyPatch) -> None:
    """A 64-byte ring, gaps from cut segments inside it, resends of every age."""
    size = 64
    monkeypatch.setattr(tcp, "RECENT_BYTES", size)
    monkeypatch.setattr(tcp, "RECENT_MASK", size - 1)
    monkeypatch.setattr(tcp, "MAX_HOLES", 1 << 20)
    for seed in range(40):
        rng = random.Random(seed)
        half = _half()
        delivered: dict[int, int] = {}
        nxt = 0
        for frame in range(2, 400):
            if nxt and rng.random() < 0.4:  # a resend of bytes before nxt
                start = rng.randrange(max(0, nxt - 2 * size), nxt)
                length = rng.randint(1, min(12, nxt - start))
                old = bytes(delivered.get(o, 0) for o in range(start, start + length))
                new = bytearray(old)
                if rng.random() < 0.5:
                    new[rng.randrange(length)] ^= 0x80
                window = range(max(start, nxt - size), start + length)
                differs = any(o in delivered and delivered[o] != new[o - start] for o in window)
                kind = "OverlapConflict" if differs else "Retransmission"
                events = half.feed(ISN + 1 + start, bytes(new), TCP_ACK, frame)
                assert _kinds(events) == [(kind, start, length, frame)], (seed, frame)
                continue
            chunk = rng.randbytes(rng.randint(1, 30))
            missing = rng.choice((0, 0, 0, rng.randint(1, 40)))
            half.feed(ISN + 1 + nxt, chunk, TCP_ACK, frame, missing)
            delivered.update(zip(range(nxt, nxt + len(chunk)), chunk, strict=True))
            nxt += len(chunk) + missing
        assert half.next_offset == nxt and len(half._ring) == size


def test_gaps_kept_inside_the_ring_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tcp, "MAX_HOLES", 4)
    half = _half()
    for i in range(10):  # 1 byte, then 1 byte cut off: 10 gaps
        half.feed(ISN + 1 + 2 * i, b"a", TCP_ACK, i + 2, missing=1)
    assert len(half._hole_ends) - half._hole_head == 4
    # bytes before the oldest gap remembered are not compared any more; the later ones are
    assert _kinds(half.feed(ISN + 1, b"X", TCP_ACK, 50)) == [("Retransmission", 0, 1, 50)]
    assert _kinds(half.feed(ISN + 1 + 18, b"X", TCP_ACK, 51)) == [("OverlapConflict", 18, 1, 51)]


def test_of_two_waiting_copies_at_one_start_the_first_is_kept() -> None:
    half = _half()
    assert half.feed(ISN + 4, b"def", TCP_ACK, 2) == []
    assert half.feed(ISN + 4, b"XYZ", TCP_ACK, 3) == []  # differs: a conflict, not kept
    assert half.feed(ISN + 4, b"def", TCP_ACK, 4) == []  # the same: a retransmission
    assert half.feed(ISN + 4, b"dXfgh", TCP_ACK, 5) == []  # longer: its tail is new
    events = half.feed(ISN + 1, b"abc", TCP_ACK, 6)
    assert _kinds(events) == [
        ("data", 0, b"abc", 6),
        ("data", 3, b"def", 6),
        ("OverlapConflict", 3, 3, 6),
        ("Retransmission", 3, 3, 6),
        ("OverlapConflict", 3, 3, 6),
        ("data", 6, b"gh", 6),
    ]
    assert half.conflicts == 2 and half.retransmitted_bytes == 9 and half.next_offset == 8
