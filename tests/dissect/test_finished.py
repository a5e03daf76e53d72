"""Connections that ended (both directions FIN or RST, every byte decoded) keep only their
statistics (stack.dissect.decoder.FinishedConnection); the TCP rings start small."""

from __future__ import annotations

import gc
import tracemalloc

from stack.dissect import tcp
from stack.dissect.decoder import Dissector, Note, PduRecord
from stack.dissect.decoder.connection import ConnectionDecoder, FinishedConnection
from stack.dissect.decoder.walker import DirectionDecoder
from stack.pcap import read_tcp_segments
from stack.wire.events import RdmaWrite, Send
from tests.dissect.synth import I2R, R2I, CaptureBuilder

COUNT = 300


def _short_connections(count: int, close: bool = True) -> bytes:
    b = CaptureBuilder()
    for _ in range(count):
        c = b.connection()
        c.send(I2R, Send(b"hello" * 10))
        c.send(R2I, RdmaWrite(0xABCDEF, 0x1000, bytes(range(200))))
        if close:
            c.close()
    return b.data()


def _alive(kind: type) -> int:
    gc.collect()
    return sum(type(o) is kind for o in gc.get_objects())


def test_finished_connections_keep_only_their_statistics() -> None:
    segments = list(read_tcp_segments(_short_connections(COUNT)))
    d = Dissector()
    records = notes = 0
    gc.collect()
    tracemalloc.start()
    try:
        before, _ = tracemalloc.get_traced_memory()
        for seg in segments:
            for item in d.feed(seg):  # taken and dropped, as the printer does
                records += isinstance(item, PduRecord)
                notes += isinstance(item, Note)
        gc.collect()
        after, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # before the end of the capture: no decoder, no route, no ring is left
    assert _alive(ConnectionDecoder) == 0 and _alive(DirectionDecoder) == 0
    assert not d._routes
    assert all(h._ring is tcp._NO_RING for c in d.tcp.connections for h in c.halves)
    # what stays per connection (its statistics, TCP's 4-tuples and counters): was 22.5 KB
    assert (after - before) / COUNT < 6000
    assert not d.finish()
    streams = d.streams()
    assert [s.stream for s in streams] == list(range(COUNT))
    assert all(isinstance(c, FinishedConnection) for c in d._conns.values())
    for info in streams:
        assert info.state == "fpdu" and list(info.directions) == ["i2r", "r2i"]
        i2r, r2i = info.directions["i2r"], info.directions["r2i"]
        assert (i2r.fpdus, r2i.fpdus, r2i.payload_bytes, i2r.undecoded_bytes) == (1, 1, 200, 0)
    assert (records, notes) == (4 * COUNT, 0)


def test_open_connections_are_not_released_and_rings_stay_small() -> None:
    d = Dissector()
    for seg in read_tcp_segments(_short_connections(5, close=False)):
        d.feed(seg)
    assert _alive(DirectionDecoder) == 2 * 5 and len(d._routes) == 2 * 5
    for conn in d.tcp.connections:
        # a direction that carried a few hundred bytes has a ring of as many (was 4 KiB)
        for half in conn.halves:
            assert half.next_offset <= len(half._ring) <= 2 * max(half.next_offset, 256)
    d.finish()


def test_bytes_after_the_end_are_noted_and_a_late_ack_is_the_same_stream() -> None:
    b = CaptureBuilder()
    c = b.connection()
    c.send(I2R, Send(b"x" * 40))
    c.close()
    c.rec.segment(I2R, b"after the FIN", c.tick())  # a hostile capture: data after the end
    (ulpdu,) = c.ulpdus(I2R, Send(b"y" * 40))
    c.rec.segment(I2R, c.wire(I2R, ulpdu), c.tick())  # and a whole FPDU
    d = Dissector()
    out: list = []
    for seg in read_tcp_segments(b.data()):
        out += d.feed(seg)
    out += d.finish()
    notes = [r for r in out if isinstance(r, Note)]
    assert [(n.kind, n.direction) for n in notes] == [("after_end", "i2r")] * 2
    assert "13 bytes after the connection ended" in notes[0].detail
    (info,) = d.streams()  # the final ACK and the late bytes: still stream 0
    assert info.directions["i2r"].undecoded_bytes == 13 + 64  # the FPDU: 2 + 58 + CRC
    assert [r.kind for r in out if isinstance(r, PduRecord)] == ["mpa_req", "mpa_rep", "fpdu"]
