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

import pytest

from stack.constants import MPA_MARKER_INTERVAL, MPA_MARKER_LEN
from stack.dissect.decoder import DissectOptions, dissect
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
        got = [bytes(r.ulpdu) for r in records if getattr(r, "kind", None) == "fpdu"]
        if got != want:
            wrong.append((k, len(got), len(want)))
    assert not wrong, f"{len(wrong)} cut offsets decode wrongly, first: {wrong[:5]}"
