"""The initiator's bytes after an MPA Request wait for the Reply's settings (the ``hold``
mode, stack.dissect.decoder): in one buffer, at most _HOLD_LIMIT bytes, then searched."""

from __future__ import annotations

import pytest

from stack.constants import RtrType
from stack.dissect.decoder import Dissector, Note, PduRecord
from stack.dissect.decoder.common import _HOLD_LIMIT, _SEARCH_GIVE_UP
from stack.dissect.decoder.connection import ConnectionDecoder
from stack.dissect.decoder.modes import Mode
from stack.pcap import read_tcp_segments
from stack.wire.events import IrdOrd, MpaFrame, RdmaWrite, Send
from stack.wire.mpa import encode_frame
from tests.dissect.synth import I2R, R2I, CaptureBuilder, Conn

WRITE = 1000


def _request(b: CaptureBuilder, crc: bool = True, markers_i2r: bool = False) -> Conn:
    """A connection whose initiator sends its Request; no Reply is recorded."""
    conn = b.connection(startup=False, crc=crc, markers_i2r=markers_i2r)
    req = MpaFrame(False, False, crc, rev=2, ird_ord=IrdOrd(16, 16, False, RtrType.NONE))
    conn.raw(I2R, encode_frame(req))
    return conn


def _writes(conn: Conn, count: int, segment: int) -> int:
    """``count`` Writes from the initiator, recorded in ``segment``-byte TCP segments;
    returns their wire bytes."""
    wire = b"".join(
        conn.wire(I2R, u)
        for i in range(count)
        for u in conn.ulpdus(I2R, RdmaWrite(7, i * WRITE, bytes([i & 0xFF]) * WRITE))
    )
    for pos in range(0, len(wire), segment):
        conn.rec.segment(I2R, wire[pos : pos + segment], conn.tick())
    return len(wire)


def _run(data: bytes) -> tuple[list, list[tuple[Mode, int, int]]]:
    """Output, and after each segment the initiator's (mode, buffered bytes, chunks)."""
    d = Dissector()
    out: list = []
    seen = []
    for seg in read_tcp_segments(data):
        out += d.feed(seg)
        for conn in d._conns.values():
            assert isinstance(conn, ConnectionDecoder)
            half = conn.halves[0]
            seen.append((half.mode, half.buffered, len(half.chunks)))
    return out + d.finish(), seen


def _fpdus(out: list, direction: str) -> list[PduRecord]:
    return [r for r in out if isinstance(r, PduRecord) and r.kind == "fpdu"
            and r.direction == direction]  # fmt: skip


@pytest.mark.parametrize("markers", [False, True])
@pytest.mark.parametrize("crc", [False, True])
def test_bytes_after_an_unanswered_request_are_bounded_then_searched(
    crc: bool, markers: bool
) -> None:
    b = CaptureBuilder()
    conn = _request(b, crc=crc, markers_i2r=markers)
    count = 2 * _SEARCH_GIVE_UP // WRITE
    _writes(conn, count, 200)
    out, seen = _run(b.data())
    # held up to the limit, never the stream; then the search's own bound
    assert max(n for mode, n, _ in seen if mode is Mode.HOLD) < _HOLD_LIMIT
    assert max(n for _, n, _ in seen) < _SEARCH_GIVE_UP + 200
    notes = [n for n in out if isinstance(n, Note)]
    assert [n.kind for n in notes[:2]] == ["no_reply", "resync"]
    assert f"(CRC {'on' if crc else 'off'}, markers {'on' if markers else 'off'})" in (
        notes[1].detail
    )
    writes = _fpdus(out, "i2r")
    assert len(writes) == count and not any(w.findings for w in writes)
    assert [w.segment and w.segment.to for w in writes] == [i * WRITE for i in range(count)]
    assert writes[0].offset == notes[0].offset == notes[1].offset  # SeqStart, none skipped


def test_held_bytes_are_copied_into_one_buffer() -> None:
    b = CaptureBuilder()
    conn = _request(b)
    held = _writes(conn, 20, 1)  # 1-byte segments: no view (capture window) kept per segment
    out, seen = _run(b.data())
    assert seen[-1] == (Mode.HOLD, held, 1) and max(chunks for *_, chunks in seen) == 1
    (note,) = [n for n in out if isinstance(n, Note)]
    assert note.kind == "trailing" and note.detail.startswith(f"{held} bytes after")


def test_a_reply_after_a_search_that_found_its_fpdus_frames_the_responder_too() -> None:
    b = CaptureBuilder()
    conn = _request(b)
    count = _HOLD_LIMIT // WRITE + 10
    _writes(conn, count, 1460)
    rep = MpaFrame(True, False, True, rev=2, ird_ord=IrdOrd(16, 16, False, RtrType.NONE))
    conn.raw(R2I, encode_frame(rep))
    conn.send(R2I, Send(b"answer"))
    conn.send(I2R, Send(b"after"))
    out, _ = _run(b.data())
    assert [r.kind for r in out if isinstance(r, PduRecord)][:2] == ["mpa_req", "fpdu"]
    assert len(_fpdus(out, "i2r")) == count + 1 and len(_fpdus(out, "r2i")) == 1
    assert [n.kind for n in out if isinstance(n, Note)] == ["no_reply", "resync"]


def test_a_reply_within_the_limit_frames_the_held_bytes_as_before() -> None:
    b = CaptureBuilder()
    conn = _request(b)
    _writes(conn, 10, 1460)
    rep = MpaFrame(True, False, True, rev=2, ird_ord=IrdOrd(16, 16, False, RtrType.NONE))
    conn.raw(R2I, encode_frame(rep))
    d = Dissector()
    out = [r for s in read_tcp_segments(b.data()) for r in d.feed(s)] + d.finish()
    assert len(_fpdus(out, "i2r")) == 10 and not [n for n in out if isinstance(n, Note)]
    conn0 = d._conns[0]
    assert isinstance(conn0, ConnectionDecoder)
    assert conn0.halves[0].mode is Mode.FPDU and not conn0.halves[0].chunks


def _late_reply(corrupt: bool) -> tuple[list, Dissector]:
    """A Request without CRC, then three 30000-byte Writes from the initiator (framed with
    CRC, as the Reply negotiates); the Reply (C=1) comes after the hold limit, while the
    search still waits for a third FPDU to trust a chain.  ``corrupt``: the first Write's
    CRC is wrong."""
    b = CaptureBuilder()
    conn = b.connection(startup=False, crc=False, reply_crc=True)
    req = MpaFrame(False, False, False, rev=2, ird_ord=IrdOrd(16, 16, False, RtrType.NONE))
    conn.raw(I2R, encode_frame(req))
    conn.mulpdu = 30000
    wire = bytearray(
        b"".join(
            conn.wire(I2R, u)
            for i in range(3)
            for u in conn.ulpdus(I2R, RdmaWrite(7, i * 30000, bytes([i + 1]) * 29900))
        )
    )
    if corrupt:
        first = ((wire[0] << 8) | wire[1]) + 2
        wire[first + (-first % 4)] ^= 0xFF  # the first byte of the first FPDU's CRC
    cut = _HOLD_LIMIT + 1460
    for pos in range(0, cut, 1460):
        conn.rec.segment(I2R, wire[pos : min(pos + 1460, cut)], conn.tick())
    rep = MpaFrame(True, False, True, rev=2, ird_ord=IrdOrd(16, 16, False, RtrType.NONE))
    conn.raw(R2I, encode_frame(rep))
    for pos in range(cut, len(wire), 1460):
        conn.rec.segment(I2R, wire[pos : pos + 1460], conn.tick())
    d = Dissector()
    out = [r for s in read_tcp_segments(b.data()) for r in d.feed(s)] + d.finish()
    return out, d


def test_a_late_reply_frames_a_waiting_search_with_its_settings() -> None:
    # as if the Reply had come in time: Full Operation at SeqStart, CRC checked (RFC 5044
    # §7.1.1: one side asking for CRC is enough); before, the search went on and chose the
    # chain that ignores the CRCs
    out, d = _late_reply(corrupt=True)
    assert [n.kind for n in out if isinstance(n, Note)] == ["no_reply"]
    writes = _fpdus(out, "i2r")
    assert [w.segment and w.segment.to for w in writes] == [0, 30000, 60000]
    assert [[f.rule for f in w.findings] for w in writes] == [["MPA-12"], [], []]
    info = d.streams()[0].directions["i2r"]
    assert (info.crc, info.markers, info.undecoded_bytes) == (True, False, 0)


def test_a_late_reply_matches_a_reply_in_time_but_for_the_no_reply_note() -> None:
    late, _ = _late_reply(corrupt=False)
    notes = [n for n in late if isinstance(n, Note)]
    assert [n.kind for n in notes] == ["no_reply"]  # no resync: the framing is known
    writes = _fpdus(late, "i2r")
    assert len(writes) == 3 and not any(w.findings for w in writes)
    assert writes[0].offset == notes[0].offset  # SeqStart
