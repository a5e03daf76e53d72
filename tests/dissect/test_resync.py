"""Mid-stream resynchronisation: a capture cut at any offset of a reference stream decodes
every FPDU that starts after the cut (stack.dissect.decoder.resync).

The reference stream holds every kind of FPDU that makes resynchronisation hard: zero-length
and STag-0 tagged FPDUs, zero-length and short Sends, Read Responses, Read and Atomic
Requests, Immediate Data, multi-segment messages, with CRC on and off, markers on and off.
The capture is cut at every byte offset (the first TCP segment starts at the cut, the rest
come one FPDU per segment, as a sender aligns them, RFC 5044 §5.1); the decoder must find
the earliest FPDU boundary after the cut from which a valid chain continues and decode
every FPDU from there.  An FPDU whose CRC covers cut-off bytes (its leading marker) cannot
be verified and is not expected.
"""

from __future__ import annotations

import struct
from collections import Counter

import pytest

from stack.constants import MPA_MARKER_INTERVAL, MPA_MARKER_LEN
from stack.dissect.decoder import DissectOptions, Dissector, Output, PduRecord, dissect, resync
from stack.dissect.decoder.common import _SEARCH_TRIES
from stack.dissect.decoder.connection import ConnectionDecoder, FinishedConnection
from stack.dissect.decoder.records import Note
from stack.dissect.decoder.resync import Resync
from stack.dissect.decoder.walker import DirectionDecoder
from stack.pcap import read_tcp_segments
from stack.wire.events import (
    AtomicRequest,
    ImmediateData,
    RdmapMessage,
    RdmaWrite,
    ReadRequest,
    ReadResponse,
    Send,
)
from stack.wire.framing import FpduFramer
from stack.wire.rdmap import encode_message, message_qn
from tests.dissect.synth import I2R, CaptureBuilder

MESSAGES: list[RdmapMessage] = [
    ReadResponse(3, 0, b"r" * 20),
    AtomicRequest(0, 1, 5, 8, 1, 0),
    RdmaWrite(0, 0, b""),  # zero-length, STag 0
    ImmediateData(b"12345678"),
    Send(b"", True, 0x55),  # zero-length Send with Invalidate
    Send(b"hi"),
    ReadRequest(1, 0, 64, 2, 0),
    RdmaWrite(5, 100, bytes(300)),
    ReadResponse(0, 0, b""),
    Send(b"q" * 7),
    Send(b"z" * 330),  # two segments at MULPDU 256
    RdmaWrite(0x1234, 0, b"x" * 3),
    Send(b"end" * 20),
]


def _stream(crc: bool, markers: bool) -> tuple[bytes, list[tuple[int, int, bytes]]]:
    """The wire bytes (offset 0 is SeqStart) and, per FPDU, (first byte incl. a leading
    marker, ULPDU_Length field offset, ULPDU)."""
    framer = FpduFramer(crc=crc, markers=markers)
    out = bytearray()
    fpdus = []
    msn = {0: 1, 1: 1}
    for msg in MESSAGES:
        qn = message_qn(msg)
        n = None
        if qn is not None:
            n = msn[qn]
            msn[qn] += 1
        for ulpdu in encode_message(msg, msn=n, mulpdu=256):
            start = len(out)
            lead = MPA_MARKER_LEN if markers and start % MPA_MARKER_INTERVAL == 0 else 0
            fpdus.append((start, start + lead, bytes(ulpdu)))
            out += framer.frame(ulpdu)
    return bytes(out), fpdus


def _cut(data: bytes, fpdus: list[tuple[int, int, bytes]], k: int) -> bytes:
    starts = [s for s, _, _ in fpdus] + [len(data)]
    builder = CaptureBuilder()
    conn = builder.connection(startup=False, handshake=False)
    following = next(s for s in starts if s > k)
    conn.raw(I2R, data[k:following])
    for a, b in zip(starts, starts[1:], strict=False):
        if a >= following:
            conn.raw(I2R, data[a:b])
    conn.close()
    return builder.data()


@pytest.mark.parametrize(
    ("crc", "markers"), [(True, False), (True, True), (False, False), (False, True)]
)
def test_a_capture_cut_at_any_offset_decodes_every_fpdu_after_the_cut(
    crc: bool, markers: bool
) -> None:
    data, fpdus = _stream(crc, markers)
    assert len(data) > 2 * MPA_MARKER_INTERVAL
    options = DissectOptions(markers_i2r=True if markers else None)
    wrong = []
    for k in range(len(data) - 64):
        # with CRC on, the leading marker is covered: an FPDU needs its first byte kept
        want = [u for first, length_at, u in fpdus if (first if crc else length_at) >= k]
        records = dissect(read_tcp_segments(_cut(data, fpdus, k)), options)
        got = [bytes(r.ulpdu) for r in records if isinstance(r, PduRecord) and r.kind == "fpdu"]
        if got != want:
            wrong.append((k, len(got), len(want)))
    assert not wrong, f"{len(wrong)} cut offsets decode wrongly, first: {wrong[:5]}"


LOOKALIKE = b"\x00\x00\xff\xfc"
"""A marker of every 4-aligned phase (reserved 0, FPDUPTR 0xfffc) pointing 65532 bytes back,
before the data while the stream is shorter than that; as a ULPDU_Length, 0."""


def _lookalikes(streams: int, size: int, segment: int) -> bytes:
    builder = CaptureBuilder()
    data = LOOKALIKE * (size // 4)
    for _ in range(streams):
        conn = builder.connection(startup=False, handshake=False)
        for at in range(0, len(data), segment):
            conn.raw(I2R, data[at : at + segment])
        conn.close()
    return builder.data()


class _CountingStruct:
    """Stands in for :mod:`struct` in the resync module: counts the marker words read."""

    def __init__(self) -> None:
        self.reads = 0

    def unpack_from(self, fmt: str, buf: memoryview, offset: int = 0) -> tuple[int, ...]:
        self.reads += 1
        return struct.unpack_from(fmt, buf, offset)


@pytest.mark.parametrize(
    ("streams", "size", "segment"),
    [(4, 0xFFFC, 1448), (1, 256 * 1024, 1448), (1, 0xFFFC, 16)],
)
def test_marker_lookalikes_are_searched_in_bounded_work(
    monkeypatch: pytest.MonkeyPatch, streams: int, size: int, segment: int
) -> None:
    """Found by fuzzing: a stream of LOOKALIKE words that ends within their reach leaves
    128 marker phases whose markers all point before the data; the final search tried
    every start under each (4.2 million chain walks per 64 KiB stream, 14 s for the four
    here), and each search as the stream arrived read every phase's markers again (34
    million reads in 16-byte segments).  Now a start is tried under such a phase only where
    a complete FPDU with no marker inside passes the checks (none here), each setting's
    search examines at most _SEARCH_TRIES starts, and markers already seen are not read
    again.  Counts, not time: the work is bounded by the bytes, the stream is not iWARP."""
    walks: Counter[bool] = Counter()
    chain = Resync._chain

    def counting_chain(
        self: Resync, buf: memoryview, start: int, crc_on: bool, markers: bool, phase: int,
        final: bool,
    ) -> bool | str:  # fmt: skip
        walks[markers] += 1
        return chain(self, buf, start, crc_on, markers, phase, final)

    words = _CountingStruct()
    monkeypatch.setattr(Resync, "_chain", counting_chain)
    monkeypatch.setattr(resync, "struct", words)
    dissector = Dissector(DissectOptions())
    ended: list[ConnectionDecoder] = []  # the decoders of the connections that ended (FIN)
    retire = Dissector.retire

    def counting_retire(
        self: Dissector[Output], conn: ConnectionDecoder, done: FinishedConnection
    ) -> None:
        ended.append(conn)  # kept to count
        retire(self, conn, done)

    monkeypatch.setattr(Dissector, "retire", counting_retire)
    out = []
    for segment_ in read_tcp_segments(_lookalikes(streams, size, segment)):
        out += dissector.feed(segment_)
    out += dissector.finish()
    assert not [r for r in out if getattr(r, "kind", None) == "fpdu"]
    total = streams * size
    phases = MPA_MARKER_INTERVAL // 4  # the 4-aligned ones; the others are ruled out at once
    # under marker phases: one start per phase and CRC setting (was every 4th byte)
    assert len(ended) == streams
    tried = sum(half.candidates_tried for conn in ended for half in conn.halves)
    assert tried <= walks[True] <= streams * 2 * phases
    assert tried <= streams * 2 * _SEARCH_TRIES
    # without markers: one walk per start and CRC setting, each a single word here, and
    # the start a search waited on again by the next
    assert walks[False] <= 2 * (total + total // segment + 2)
    # every marker word once per phase, plus one per phase and search as segments arrive
    assert words.reads <= total // 2


# ---- streams in tiny TCP segments -------------------------------------------------------


def _long_stream(markers: bool, size: int) -> bytes:
    """At least ``size`` wire bytes of Writes and Sends of many lengths (CRC on), offset 0
    at SeqStart."""
    builder = CaptureBuilder()
    conn = builder.connection(startup=False, handshake=False, markers_i2r=markers)
    out = bytearray()
    i = 0
    while len(out) < size:
        msg = (
            RdmaWrite(7, i, bytes([i & 0xFF]) * (100 + i % 700))
            if i % 2
            else Send(b"s" * (i % 300))
        )
        for ulpdu in conn.ulpdus(I2R, msg):
            out += conn.wire(I2R, ulpdu)
        i += 1
    return bytes(out)


def _segmented(data: bytes, segment: int) -> bytes:
    builder = CaptureBuilder()
    conn = builder.connection(startup=False, handshake=False)
    for at in range(0, len(data), segment):
        conn.raw(I2R, data[at : at + segment])
    conn.close()
    return builder.data()


def _decoded(pcap: bytes, options: DissectOptions) -> list[tuple[object, ...]]:
    """What the dissection says of the stream, without the frames that carried it."""
    out: list[tuple[object, ...]] = []
    for r in dissect(read_tcp_segments(pcap), options):
        if isinstance(r, Note):
            out.append((r.kind, r.detail, r.offset))
        elif r.kind == "fpdu":
            out.append(("fpdu", r.offset, r.wire_len, bytes(r.ulpdu), r.crc_ok,
                        [(f.rule, f.detail) for f in r.findings]))  # fmt: skip
    return out


@pytest.mark.parametrize("markers", [False, True])
@pytest.mark.parametrize("cut", [0, 3, 517])
def test_a_stream_in_one_byte_segments_dissects_as_in_whole_ones(markers: bool, cut: int) -> None:
    """Mid-stream resync (RFC 5044 §5 markers unknown or stated): the search waits for the
    bytes it lacks however they arrive, so 1-byte TCP segments give the FPDUs, offsets and
    notes of 1460-byte ones."""
    data = _long_stream(markers, 12_000)[cut:]
    for options in (DissectOptions(), DissectOptions(markers_i2r=markers)):
        whole = _decoded(_segmented(data, 1460), options)
        assert sum(1 for r in whole if r[0] == "fpdu") > 20
        assert _decoded(_segmented(data, 1), options) == whole


class _Work:
    """Counts the searches of :class:`Resync`, the marker phases they look at, and the
    bytes copied to join what was buffered (a search that finds its buffer in a new
    object copied all of it)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.searches = self.phases = self.copied = 0
        self._last: object = None
        search, try_phase, joined = Resync._search, Resync._try_phase, DirectionDecoder._joined

        def counting_search(half: Resync, final: bool) -> bool:
            self.searches += 1
            return search(half, final)

        def counting_phase(
            half: Resync, buf: memoryview, phase: int, crc_on: bool, final: bool
        ) -> int | None | str:
            self.phases += 1
            return try_phase(half, buf, phase, crc_on, final)

        def counting_joined(half: DirectionDecoder) -> memoryview:
            buf = joined(half)
            if buf.obj is not self._last:
                self._last = buf.obj
                self.copied += len(buf)
            return buf

        monkeypatch.setattr(Resync, "_search", counting_search)
        monkeypatch.setattr(Resync, "_try_phase", counting_phase)
        monkeypatch.setattr(DirectionDecoder, "_joined", counting_joined)


@pytest.mark.parametrize("markers", [False, True])
def test_a_search_over_one_byte_segments_waits_for_the_bytes_it_lacks(
    monkeypatch: pytest.MonkeyPatch, markers: bool
) -> None:
    """A capture cut mid-stream arriving in 1-byte segments: each segment searched the
    whole buffer again (joined anew: quadratic copying) under every live marker phase, 59
    600 searches and 127 thousand phase looks for 64 KiB.  Now a search runs only once the
    bytes some candidate waits for are there (its next marker, the end of its chain's next
    FPDU), looks only at the phases due, and the buffer grows in place."""
    data = _long_stream(markers, 64 * 1024)[3:]
    work = _Work(monkeypatch)
    records = list(dissect(read_tcp_segments(_segmented(data, 1)), DissectOptions()))
    assert sum(1 for r in records if getattr(r, "kind", None) == "fpdu") > 250
    total = len(data)
    assert work.searches <= total // 64  # was one per segment
    assert work.phases <= total // 32  # was every live phase per search
    assert work.copied <= 3 * total  # was the buffer again per search


def test_marker_lookalikes_in_one_byte_segments_look_at_each_phase_once_per_marker(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """LOOKALIKE words in 1-byte segments: 128 marker phases stay undecided, each waiting for
    its next marker.  Every search looked at all of them (8.4 million phase looks for 64
    KiB); now a phase is looked at when its next marker is complete, one per 4 bytes."""
    pcap = _lookalikes(1, 0xFFFC, 1)
    work = _Work(monkeypatch)
    records = list(dissect(read_tcp_segments(pcap), DissectOptions()))
    assert not [r for r in records if getattr(r, "kind", None) == "fpdu"]
    total = 0xFFFC
    assert work.searches <= total // 4 + MPA_MARKER_INTERVAL  # every byte of the first interval
    # a look per marker and CRC setting, then every phase once more at the end
    assert work.phases <= total // 2 + 4 * MPA_MARKER_INTERVAL
    assert work.copied <= 3 * total
