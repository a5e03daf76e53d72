"""Capture stream decoder (stack.dissect.decoder): every opcode, negotiation variants, markers
under any segmentation, mid-stream starts, gaps, retransmissions and findings by rule ID.

Captures are synthesized with our encoders and the capture-tap writer (tests/dissect/synth.py);
expected decodes are the ULPDUs that were sent, compared byte for byte and field by field.
"""

from __future__ import annotations

import io
import struct
from typing import TypedDict, Unpack

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stack.constants import (
    TERM_DDP_U_MSN_RANGE,
    TERM_LLP_CRC_ERROR,
    TERM_LLP_NO_MATCHING_RTR,
    TERM_RDMAP_INVALID_STAG,
    AtomicOpcode,
    RtrType,
)
from stack.crc import crc_field
from stack.dissect.decoder import (
    DissectOptions,
    Dissector,
    Note,
    PduRecord,
    SegmentView,
    dissect,
    fpdu_layout,
)
from stack.errors import IwarpError
from stack.pcap import CaptureReader, Direction, PcapWriter, parse_tcp, read_tcp_segments
from stack.wire.events import (
    AtomicRequest,
    AtomicResponse,
    ImmediateData,
    MpaFrame,
    RdmapMessage,
    RdmaWrite,
    ReadRequest,
    ReadResponse,
    Send,
    Terminate,
)
from stack.wire.framing import FpduFramer
from stack.wire.rdmap import decode_ulpdu
from stack.wire.terminate import build_terminate
from tests.dissect.synth import (
    I2R,
    R2I,
    CaptureBuilder,
    Conn,
    frames_with_payload,
    rewrite,
)

# ======================================================================================
# helpers
# ======================================================================================


def run(data: bytes, options: DissectOptions | None = None) -> tuple[list[PduRecord], list[Note]]:
    recs: list[PduRecord] = []
    notes: list[Note] = []
    for item in dissect(read_tcp_segments(data), options):
        if isinstance(item, PduRecord):
            recs.append(item)
        else:
            notes.append(item)
    return recs, notes


def fpdus(recs: list[PduRecord]) -> list[PduRecord]:
    return [r for r in recs if r.kind == "fpdu"]


def seg(rec: PduRecord) -> SegmentView:
    """``rec.segment``, asserted present (every decoded FPDU has one)."""
    assert rec.segment is not None
    return rec.segment


def mpa(rec: PduRecord) -> MpaFrame:
    """``rec.mpa``, asserted present (every MPA Request/Reply record has one)."""
    assert rec.mpa is not None
    return rec.mpa


EVERY_OPCODE: list[tuple[Direction, RdmapMessage]] = [
    (I2R, RdmaWrite(0x1234, 0x1000, bytes(range(200)))),
    (I2R, Send(b"hello")),
    (I2R, Send(b"inv", invalidate_stag=0xABCD)),
    (I2R, Send(b"se", solicited=True)),
    (I2R, Send(b"seinv", solicited=True, invalidate_stag=0x77)),
    (I2R, ReadRequest(0x11223344, 0x2000, 300, 0x55667788, 0x3000)),
    (R2I, ReadResponse(0x11223344, 0x2000, bytes(300))),
    (I2R, ImmediateData(b"\x01\x02\x03\x04\x05\x06\x07\x08")),
    (I2R, ImmediateData(b"ABCDEFGH", solicited=True)),
    (I2R, AtomicRequest.fetch_add(0xDEADBEEF, 0x0A0B0C0D, 0x4000, 1)),
    (R2I, AtomicResponse(0xDEADBEEF, 0x29)),
    (I2R, AtomicRequest.cmp_swap(7, 0x0A0B0C0D, 0x4008, 5, 6)),
    (R2I, AtomicResponse(7, 5)),
]


class ConnectionOptions(TypedDict, total=False):
    """The ``CaptureBuilder.connection`` keywords the every-opcode capture is varied by."""

    rev: int
    crc: bool
    reply_crc: bool | None
    markers_i2r: bool
    markers_r2i: bool


def build_every_opcode(
    **kw: Unpack[ConnectionOptions],
) -> tuple[bytes, list[tuple[Direction, bytes]]]:
    b = CaptureBuilder()
    c = b.connection(**kw)
    sent: list[tuple[Direction, bytes]] = []
    for direction, msg in EVERY_OPCODE:
        for u in c.send(direction, msg):
            sent.append((direction, u))
    term = build_terminate(TERM_RDMAP_INVALID_STAG, sent[5][1])  # about the Read Request
    for u in c.send(R2I, term):
        sent.append((R2I, u))
    c.close()
    return b.data(), sent


def assert_same_ulpdus(recs: list[PduRecord], sent: list[tuple[Direction, bytes]]) -> None:
    got = [(r.direction, bytes(r.ulpdu)) for r in fpdus(recs)]
    want = [("i2r" if d is I2R else "r2i", u) for d, u in sent]
    assert got == want


# ======================================================================================
# every opcode, field by field
# ======================================================================================


def test_every_opcode_decodes_field_by_field() -> None:
    data, sent = build_every_opcode()
    recs, notes = run(data)
    assert notes == []
    assert [r.kind for r in recs[:2]] == ["mpa_req", "mpa_rep"]
    assert_same_ulpdus(recs, sent)
    f = fpdus(recs)
    assert all(r.crc_ok is True and r.findings == [] for r in f), [r.rules for r in f]
    write = f[0].segment
    assert write is not None and write.tagged and write.last
    assert (write.opcode, write.stag, write.to, write.ulpdu_len) == (0, 0x1234, 0x1000, 214)
    assert bytes(write.payload) == bytes(range(200))
    send = seg(f[1])
    assert (send.opcode, send.qn, send.msn, send.mo, bytes(send.payload)) == (3, 0, 1, 0, b"hello")
    assert (seg(f[2]).opcode, seg(f[2]).inval_stag) == (4, 0xABCD)
    assert (seg(f[3]).opcode, seg(f[3]).msn) == (5, 3)
    assert (seg(f[4]).opcode, seg(f[4]).inval_stag, seg(f[4]).msn) == (6, 0x77, 4)
    rr = seg(f[5])
    assert rr.opcode == 1 and rr.qn == 1 and rr.msn == 1
    assert rr.header == ReadRequest(0x11223344, 0x2000, 300, 0x55667788, 0x3000)
    resp = seg(f[6])
    assert (resp.opcode, resp.stag, resp.to, len(resp.payload)) == (2, 0x11223344, 0x2000, 300)
    imm = seg(f[7])
    assert imm.opcode == 8 and imm.header == ImmediateData(b"\x01\x02\x03\x04\x05\x06\x07\x08")
    assert seg(f[8]).opcode == 9 and seg(f[8]).msn == 6
    atom = seg(f[9])
    assert atom.opcode == 10 and atom.qn == 1 and atom.msn == 2
    assert atom.header == AtomicRequest.fetch_add(0xDEADBEEF, 0x0A0B0C0D, 0x4000, 1)
    assert seg(f[10]).header == AtomicResponse(0xDEADBEEF, 0x29)
    assert seg(f[10]).qn == 3 and seg(f[10]).msn == 1
    cmp_swap = seg(f[11]).header
    assert isinstance(cmp_swap, AtomicRequest)
    assert cmp_swap.atomic_opcode == AtomicOpcode.CMP_SWAP
    assert seg(f[12]).msn == 2
    term = seg(f[13])
    assert term.opcode == 7 and term.qn == 2 and term.msn == 1
    t = term.header
    assert isinstance(t, Terminate)
    assert (t.layer, t.etype, t.code, t.m, t.d, t.r) == (0, 1, 0, True, True, True)
    assert t.ddp_header == sent[5][1][:18] and t.rdma_header == sent[5][1][18:46]


def test_segment_view_matches_decode_ulpdu() -> None:
    _, sent = build_every_opcode()
    for _, u in sent:
        view = SegmentView(memoryview(u), True, None)
        assert view.to_segment() == decode_ulpdu(u, strict=False)


@settings(max_examples=200, deadline=None)
@given(st.binary(min_size=14, max_size=90))
def test_segment_view_matches_decode_ulpdu_on_any_bytes(raw: bytes) -> None:
    try:
        expected = decode_ulpdu(raw, strict=False)
    except IwarpError as exc:
        with pytest.raises(type(exc)):
            SegmentView(memoryview(raw), True, None)
        return
    assert SegmentView(memoryview(raw), True, None).to_segment() == expected


@settings(max_examples=300, deadline=None)
@given(
    st.sampled_from([0x01, 0x41, 0x81, 0xC1, 0x45, 0xC2, 0x00]),
    st.sampled_from([0x40, 0x42, 0x43, 0x44, 0x45, 0x46, 0x47, 0x48, 0x41, 0x53, 0x83]),
    st.sampled_from([0, 0, 1, 0xFFFFFFFF]),
    st.sampled_from([0, 0, 1, 3, 7]),
    st.integers(min_value=0, max_value=2**32 - 1),
    st.binary(max_size=40),
)
def test_segment_view_fast_path_matches_decode_ulpdu(
    ctrl: int, uctrl: int, inval: int, qn: int, msn: int, tail: bytes
) -> None:
    untagged = bytes([ctrl, uctrl]) + struct.pack(">IIII", inval, qn, msn, msn // 3) + tail
    tagged = bytes([ctrl, uctrl]) + struct.pack(">IQ", inval, msn * 7) + tail
    for raw in (untagged, tagged):
        try:
            expected = decode_ulpdu(raw, strict=False)
        except IwarpError:
            continue
        assert SegmentView(memoryview(raw), True, None).to_segment() == expected


# ======================================================================================
# negotiation variants
# ======================================================================================


@pytest.mark.parametrize(
    "rev, crc, reply_crc, expect_crc",
    [
        (1, True, True, True),
        (2, True, False, True),
        (2, False, True, True),
        (1, False, False, None),
    ],
)
def test_mpa_11_crc_negotiated_if_either_side_sets_c(
    rev: int, crc: bool, reply_crc: bool, expect_crc: bool | None
) -> None:
    data, sent = build_every_opcode(rev=rev, crc=crc, reply_crc=reply_crc)
    recs, _ = run(data)
    req, rep = recs[0], recs[1]
    assert (req.rev, rep.rev) == (rev, rev)
    assert mpa(req).crc is crc and mpa(rep).crc is reply_crc
    assert mpa(req).enhanced is (rev == 2) and mpa(rep).enhanced is (rev == 2)
    assert_same_ulpdus(recs, sent)
    assert {r.crc_ok for r in fpdus(recs)} == {expect_crc}


@pytest.mark.parametrize("markers_i2r", [False, True])
@pytest.mark.parametrize("markers_r2i", [False, True])
def test_mpa_07_markers_each_way(markers_i2r: bool, markers_r2i: bool) -> None:
    data, sent = build_every_opcode(markers_i2r=markers_i2r, markers_r2i=markers_r2i)
    recs, notes = run(data)
    assert notes == []
    assert mpa(recs[0]).markers is markers_r2i and mpa(recs[1]).markers is markers_i2r
    assert_same_ulpdus(recs, sent)
    for r in fpdus(recs):
        marked = markers_i2r if r.direction == "i2r" else markers_r2i
        assert r.findings == [] and r.crc_ok
        if not marked:
            assert r.marker_ptrs == ()
    # the first FPDU of a marked direction opens with a marker, FPDUPTR 0 (MPA-07)
    first_i2r = next(r for r in fpdus(recs) if r.direction == "i2r")
    assert (first_i2r.marker_ptrs[:1] == (0,)) is markers_i2r


@pytest.mark.parametrize(
    "offer, reply, first, ok",
    [
        (RtrType.SEND, RtrType.SEND, Send(b""), True),
        (RtrType.WRITE | RtrType.READ, RtrType.WRITE, RdmaWrite(1, 0, b""), True),
        (RtrType.READ, RtrType.READ, ReadRequest(1, 0, 0, 2, 0), True),
        (RtrType.WRITE, RtrType.WRITE, Send(b"not an rtr"), False),
        (RtrType.READ | RtrType.WRITE, RtrType.READ, RdmaWrite(1, 0, b""), False),
        # no RTR in common (siw flags Write to a Send-only offer): Terminate 2/0/7 is due
        (RtrType.SEND, RtrType.WRITE, build_terminate(TERM_LLP_NO_MATCHING_RTR, None), True),
        (RtrType.SEND, RtrType.WRITE, Send(b""), False),
    ],
)
def test_erc_09_p2p_first_fpdu_is_the_negotiated_rtr(
    offer: RtrType, reply: RtrType, first: RdmapMessage, ok: bool
) -> None:
    b = CaptureBuilder()
    c = b.connection(p2p=True, rtr_offer=offer, rtr_reply=reply)
    c.send(I2R, first)
    terminated = isinstance(first, Terminate)
    if not terminated:  # nothing may follow a Terminate (RDMAP-10)
        c.send(I2R, Send(b"after"))
    recs, _ = run(b.data())
    req, rep = recs[0], recs[1]
    offered, replied = mpa(req).ird_ord, mpa(rep).ird_ord
    assert offered is not None and replied is not None
    assert offered.p2p and offered.rtr == offer
    assert replied.rtr == reply
    assert ("ERC-09" in recs[2].rules) is not ok
    assert len(recs) == 3 if terminated else recs[3].findings == []


def test_mpa_23_reject_ends_mpa() -> None:
    b = CaptureBuilder()
    c = b.connection(reject=True, rep_pd=b"no thanks")
    c.raw(I2R, b"anything after a reject is not MPA")
    recs, notes = run(b.data())
    assert [r.kind for r in recs] == ["mpa_req", "mpa_rep"]
    assert mpa(recs[1]).reject and mpa(recs[1]).private_data == b"no thanks"
    assert [n.kind for n in notes] == ["rejected"]


def test_startup_frame_findings() -> None:
    b = CaptureBuilder()
    rec = b.writer.connection(("10.9.0.1", 1), ("10.9.0.2", 2))
    bad_req = b"MPA ID Req Frame" + bytes([0x60, 3, 0x02, 0x10]) + bytes(0x210)  # R set, rev 3
    rec.record(Direction.SENT, bad_req, 1.0)
    recs, _ = run(b.data())
    assert recs[0].kind == "mpa_req"
    assert {"MPA-19", "MPA-20", "MPA-21"} <= set(recs[0].rules)


def test_erc_11_and_erc_04_reply_checks() -> None:
    b = CaptureBuilder()
    rec = b.writer.connection(("10.9.0.1", 1), ("10.9.0.2", 2))
    req = b"MPA ID Req Frame" + bytes([0x50, 2, 0, 4]) + struct.pack(">I", (2 << 16) | 4)
    rep = b"MPA ID Rep Frame" + bytes([0x40, 2, 0, 0])  # not enhanced
    rec.record(Direction.SENT, req, 1.0)
    rec.record(Direction.RECEIVED, rep, 1.1)
    rec2 = b.writer.connection(("10.9.0.1", 3), ("10.9.0.2", 2))
    rep2 = b"MPA ID Rep Frame" + bytes([0x50, 2, 0, 4]) + struct.pack(">I", (8 << 16) | 9)
    rec2.record(Direction.SENT, req, 1.2)
    rec2.record(Direction.RECEIVED, rep2, 1.3)
    recs, _ = run(b.data())
    assert "ERC-11" in recs[1].rules
    assert "ERC-04" in recs[3].rules  # responder ORD 9 > initiator IRD 2


def test_not_iwarp_tcp_is_a_note() -> None:
    out = io.BytesIO()
    with PcapWriter(out) as w:
        c = w.connection(("10.0.0.1", 5555), ("10.0.0.2", 80))
        c.record(Direction.SENT, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", 1.0)
        c.record(Direction.RECEIVED, b"HTTP/1.1 200 OK\r\n\r\n", 1.1)
    recs, notes = run(out.getvalue())
    assert recs == [] and [n.kind for n in notes] == ["not_iwarp"]


# ======================================================================================
# Terminate kinds
# ======================================================================================

TERMINATES = [
    Terminate(0, 0, 0x00),  # RDMAP local catastrophic
    Terminate(0, 2, 0x06, m=True, d=True, ddp_seg_len=23,
              ddp_header=bytes.fromhex("414300000000000000000000000000010000000000")[:18]),
    Terminate(1, 1, 0x00, m=True, d=True, ddp_seg_len=18,
              ddp_header=bytes.fromhex("c14000001234000000000000100000")[:14]),
    Terminate(1, 2, 0x03, m=True, d=True, ddp_seg_len=31,
              ddp_header=bytes.fromhex("41430000000000000000000000000007000000")[:18]),
    Terminate(2, 0, 0x02),  # LLP CRC error
    Terminate(2, 0, 0x07),  # no matching RTR
]  # fmt: skip


@pytest.mark.parametrize("term", TERMINATES, ids=lambda t: f"{t.layer}-{t.etype}-{t.code}")
def test_rdmap_11_every_terminate_kind(term: Terminate) -> None:
    b = CaptureBuilder()
    c = b.connection()
    c.send(I2R, Send(b"x"))
    (u,) = c.send(R2I, term)
    recs, _ = run(b.data())
    last = fpdus(recs)[-1]
    assert bytes(last.ulpdu) == u and last.findings == []
    assert seg(last).header == term


def test_rdmap_11_siw_swapped_terminate_is_decoded_and_flagged() -> None:
    b = CaptureBuilder()
    c = b.connection()
    c.send(I2R, Send(b"x"))
    # siw's layout of 1/2/0x03 with M=D=1 and the copied header: 21 03 03 00
    hdr = bytes.fromhex("4143000000000000000000000000000700000000")[:18]
    body = bytes.fromhex("21030300") + struct.pack(">H", 5) + hdr
    ulpdu = bytes([0x41, 0x47]) + bytes(4) + struct.pack(">III", 2, 1, 0) + body
    c.raw(R2I, c.wire(R2I, ulpdu))
    recs, _ = run(b.data())
    t = seg(fpdus(recs)[-1]).header
    assert isinstance(t, Terminate)
    assert t.siw_swapped and (t.layer, t.etype, t.code, t.m, t.d) == (1, 2, 3, True, True)
    assert "RDMAP-11" in fpdus(recs)[-1].rules


def test_rdmap_12_terminate_header_inclusion() -> None:
    b = CaptureBuilder()
    c = b.connection()
    c.send(I2R, Send(b"x"))
    c.send(R2I, Terminate(2, 0, 0x02, m=True, d=True, ddp_seg_len=18, ddp_header=bytes(18)))
    recs, _ = run(b.data())
    assert "RDMAP-12" in fpdus(recs)[-1].rules


def test_rdmap_10_nothing_after_a_terminate() -> None:
    b = CaptureBuilder()
    c = b.connection()
    c.send(I2R, Terminate(2, 0, 0x05))
    c.send(I2R, Send(b"too late"))
    recs, _ = run(b.data())
    assert fpdus(recs)[0].findings == [] and "RDMAP-10" in fpdus(recs)[1].rules


# ======================================================================================
# segmentation edge cases (markers under any segmentation)
# ======================================================================================


def _marker_stream(c: Conn) -> list[bytes]:
    """Messages chosen to hit every marker position case on a marked direction."""
    sent: list[bytes] = []
    sent += c.send(I2R, Send(bytes(3)), together=True)  # leading marker, FPDUPTR 0
    framer = c.framers[I2R]
    sent += c.send(I2R, RdmaWrite(5, 0, bytes(1200)))  # 2+ markers inside one FPDU
    room = 512 - framer.offset % 512
    if room < 30:
        sent += c.send(I2R, Send(bytes(2)))
        room = 512 - framer.offset % 512
    # an FPDU whose PAD ends exactly on a boundary: marker between PAD and CRC
    body = room  # length field + ULPDU + pad fill the rest of the interval
    n = body - 2 - 18
    sent += c.send(I2R, Send(bytes(n)))
    assert framer.offset % 512 == 8  # marker, then the CRC
    # an FPDU that ends exactly on a 512 boundary: the next one opens with a marker
    room = 512 - framer.offset % 512
    n = room - 4 - 2 - 18
    sent += c.send(I2R, Send(bytes(n)))
    assert framer.offset % 512 == 0
    sent += c.send(I2R, Send(b"after the boundary"))
    return sent


@pytest.mark.parametrize("mss", [1460, 97, 13, 1])
@pytest.mark.parametrize("together", [False, True])
def test_mpa_15_markers_under_any_segmentation(mss: int, together: bool) -> None:
    b = CaptureBuilder()
    c = b.connection(markers_i2r=True, mss=mss)
    sent = _marker_stream(c)
    if together:  # everything again as one large write: several FPDUs per segment
        more = [c.ulpdus(I2R, Send(bytes(i * 37))) for i in range(1, 9)]
        wire = b"".join(c.wire(I2R, u) for group in more for u in group)
        c.raw(I2R, wire)
        sent += [u for group in more for u in group]
    c.close()
    recs, notes = run(b.data())
    assert notes == []
    got = fpdus(recs)
    assert [bytes(r.ulpdu) for r in got] == sent
    assert all(r.crc_ok and r.findings == [] for r in got), [r.rules for r in got]
    kinds = {len(r.marker_ptrs) for r in got}
    assert max(kinds) >= 2
    # a marker between PAD and CRC: its FPDUPTR points past the whole body
    assert any(r.marker_ptrs and r.marker_offsets[-1] == r.offset + r.wire_len - 8 for r in got)


def test_fpdu_layout_closed_form_matches_the_framer() -> None:
    for start in range(0, 1024, 4):
        for ulen in (14, 18, 19, 100, 490, 491, 492, 493, 494, 1000, 4000):
            framer = FpduFramer(markers=True, offset=start)
            wire = framer.frame(bytes([0xC1, 0x40]) + bytes(ulen - 2))
            lead, size, marks = fpdu_layout(start, ulen, True)
            assert size == len(wire)
            for m in marks:
                ptr = struct.unpack_from(">HH", wire, m)[1]
                assert ptr == (0 if (m == 0 and lead) else m - lead)


def test_first_fpdu_in_the_replys_segment() -> None:
    b = CaptureBuilder()
    framer = FpduFramer(crc=True)
    from stack.wire.rdmap import encode_message

    (u,) = encode_message(Send(b"early bird"), msn=1, mulpdu=1000)
    c = b.connection(reply_with=framer.frame(u))
    c.framers[R2I].offset += len(framer.frame(u))  # keep the builder's framer in step
    c.send(I2R, Send(b"initiator"))
    recs, _ = run(b.data())
    f = fpdus(recs)
    assert f[0].direction == "r2i" and bytes(f[0].ulpdu) == bytes(u)
    assert f[0].frame == recs[1].frame  # same segment as the Reply
    assert "MPA-25" in f[0].rules  # the responder spoke first


# ======================================================================================
# mid-stream captures, gaps, retransmissions, reordering
# ======================================================================================


def _long_capture(markers: bool = False, crc: bool = True, n: int = 40) -> tuple[bytes, Conn]:
    b = CaptureBuilder()
    c = b.connection(markers_i2r=markers, markers_r2i=markers, crc=crc, reply_crc=crc)
    for i in range(n):
        c.send(I2R, Send(bytes([i]) * (30 + 17 * i)))
        c.send(I2R, RdmaWrite(9, i * 4096, bytes(100 + 50 * i)))
        c.send(R2I, Send(bytes([i]) * 9))
    c.close()
    return b.data(), c


OPENER = ("10.1.0.1", 50001)  # the first connection a CaptureBuilder records


@pytest.mark.parametrize(
    "markers, crc, options",
    [
        (False, True, DissectOptions(initiator=OPENER)),
        (True, True, DissectOptions(initiator=OPENER)),
        (False, False, DissectOptions(initiator=OPENER)),
        (True, False, DissectOptions(crc=False, markers_i2r=True, markers_r2i=True,
                                     initiator=OPENER)),
    ],
)  # fmt: skip
def test_mid_stream_capture_finds_the_fpdu_chain(
    markers: bool, crc: bool, options: DissectOptions
) -> None:
    data, _ = _long_capture(markers, crc)
    full, _ = run(data)
    cut = frames_with_payload(data)[10]  # drop the handshake, MPA frames and some FPDUs
    partial = rewrite(data, lambda n, f: f if n >= cut else None)
    recs, notes = run(partial, options)
    assert recs and all(r.kind == "fpdu" for r in recs)
    assert {n.kind for n in notes} == {"resync"}
    # every FPDU that lies wholly in the kept frames is decoded, with the right direction
    expected = [(r.direction, bytes(r.ulpdu)) for r in fpdus(full) if r.frame >= cut + 2]
    got = [(r.direction, bytes(r.ulpdu)) for r in recs]
    assert got[-len(expected) :] == expected
    assert len(got) <= len(expected) + 2
    assert all(r.crc_ok is (True if crc else None) for r in recs)
    assert not any(r.findings for r in recs), [r.rules for r in recs if r.findings]


def test_mid_stream_direction_defaults_to_the_first_sender() -> None:
    data, _ = _long_capture()
    cut = frames_with_payload(data)[10]
    partial = rewrite(data, lambda n, f: f if n >= cut else None)
    first = read_tcp_segments(partial)[0]
    recs, _ = run(partial)
    assert recs[0].src == f"{first.src}:{first.sport}" and recs[0].direction == "i2r"


def test_gap_is_reported_and_decoding_resumes() -> None:
    data, _ = _long_capture(markers=True)
    full, _ = run(data)
    victim = frames_with_payload(data)[30]
    lost = {bytes(r.ulpdu) for r in fpdus(full) if r.frame == victim}
    recs, notes = run(rewrite(data, lambda n, f: None if n == victim else f))
    assert "gap" in {n.kind for n in notes} and "resync" in {n.kind for n in notes}
    got = [bytes(r.ulpdu) for r in fpdus(recs)]
    assert len(got) == len(fpdus(full)) - len(lost)
    assert not lost & set(got)
    gapped = [r for r in fpdus(recs) if "TCP-GAP" in r.rules]
    assert len(gapped) == 1
    # MSN knowledge was dropped at the gap: no false DDP-05 findings
    assert all(set(r.rules) <= {"TCP-GAP"} for r in fpdus(recs))


def test_retransmitted_and_reordered_frames() -> None:
    data, _ = _long_capture()
    full, _ = run(data)
    frames = frames_with_payload(data)
    a, b_ = frames[20], frames[21]
    store: dict[int, bytes] = {}

    def shuffle(n: int, f: bytes) -> bytes | None:
        if n == a:
            store[n] = f
            return None  # delayed: sent after b
        if n == b_:
            return f + b""  # placeholder, the swap happens below
        return f

    swapped = bytearray()
    body = rewrite(data, shuffle)
    # append frame a after b by rebuilding: simplest is a second pass inserting it
    out = bytearray(body[:24])
    pos = 24
    count = 0
    while pos < len(body):
        incl = struct.unpack_from("<I", body, pos + 8)[0]
        rec = body[pos : pos + 16 + incl]
        out += rec
        count += 1
        pos += 16 + incl
        if count == b_ - 1:  # b was just written (a is missing before it)
            out += struct.pack("<IIII", 0, 0, len(store[a]), len(store[a])) + store[a]
            out += struct.pack("<IIII", 0, 0, len(store[a]), len(store[a])) + store[a]  # dup
    swapped += out
    recs, notes = run(bytes(swapped))
    assert [bytes(r.ulpdu) for r in fpdus(recs)] == [bytes(r.ulpdu) for r in fpdus(full)]
    assert notes == []


# ======================================================================================
# validation findings by rule ID
# ======================================================================================


def _with_ulpdus(*ulpdus: bytes, markers: bool = False) -> list[PduRecord]:
    b = CaptureBuilder()
    c = b.connection(markers_i2r=markers)
    for u in ulpdus:
        c.raw(I2R, c.wire(I2R, u))
    recs, _ = run(b.data())
    return fpdus(recs)


def _send(msn: int, mo: int = 0, last: bool = True, qn: int = 0, data: bytes = b"abcd",
          ctrl: int | None = None, op: int = 0x43, inv: int = 0) -> bytes:  # fmt: skip
    c = ctrl if ctrl is not None else (0x41 if last else 0x01)
    return bytes([c, op]) + struct.pack(">IIII", inv, qn, msn, mo) + data


def test_mpa_12_bad_crc() -> None:
    b = CaptureBuilder()
    c = b.connection()
    wire = bytearray(c.wire(I2R, _send(1)))
    wire[-6] ^= 0xFF  # a payload byte
    c.raw(I2R, bytes(wire))
    c.send(I2R, Send(b"next"), msn=2)
    recs, _ = run(b.data())
    f = fpdus(recs)
    assert f[0].crc_ok is False and "MPA-12" in f[0].rules
    assert f[0].findings[0].term == TERM_LLP_CRC_ERROR
    assert f[1].crc_ok is True and f[1].findings == []


def test_ddp_05_msn_sequence_per_queue() -> None:
    f = _with_ulpdus(_send(1), _send(2), _send(4), _send(5))
    assert [r.rules for r in f] == [[], [], ["DDP-05"], []]


def test_ddp_05_first_msn_is_one() -> None:
    f = _with_ulpdus(_send(7))
    assert f[0].rules == ["DDP-05"]


def test_ddp_06_mo_continuity_and_ddp_02_last_flag() -> None:
    f = _with_ulpdus(
        _send(1, mo=0, last=False),
        _send(1, mo=4, last=False),
        _send(1, mo=9, last=True),  # MO should be 8
        _send(2, mo=0, last=False),
        _send(3, mo=0, last=True),  # MSN 2 never got its Last segment
    )
    assert [r.rules for r in f] == [[], [], ["DDP-06"], [], ["DDP-02"]]


def test_ddp_04_opcode_changes_mid_message() -> None:
    f = _with_ulpdus(_send(1, last=False), _send(1, mo=4, op=0x45))
    assert f[1].rules == ["DDP-04"]


def test_rdmap_01_qn_opcode_pairing_and_versions() -> None:
    f = _with_ulpdus(
        _send(1, qn=1),  # Send on the Read Request queue
        _send(1, ctrl=0x42),  # DV = 2
        _send(2, op=0x83),  # RV = 2
        _send(3, ctrl=0x45),  # reserved DDP bit
        _send(4, inv=0x1234),  # Invalidate STag on a plain Send
    )
    assert "RDMAP-01" in f[0].rules
    assert "DDP-03" in f[1].rules
    assert "RDMAP-02" in f[2].rules
    assert "DDP-03" in f[3].rules
    assert "RDMAP-03" in f[4].rules


def test_mpa_04_pad_and_mpa_08_marker_findings() -> None:
    b = CaptureBuilder()
    c = b.connection(markers_i2r=True)
    c.send(I2R, Send(b"x"))
    offset = c.framers[I2R].offset
    wire = bytearray(c.wire(I2R, _send(2, data=bytes(700))))
    marker_at = 512 - offset % 512
    wire[marker_at + 2 : marker_at + 4] = struct.pack(">H", 8)  # wrong FPDUPTR
    wire[marker_at] = 1  # reserved bits
    body_end = len(wire) - 4
    wire[-5] = 0xAA  # a PAD byte (ULPDU 722 + 2 = 724: pad is 0 -> use the last data byte?)
    wire[body_end:] = crc_field(bytes(wire[:body_end]))
    c.raw(I2R, bytes(wire))
    recs, _ = run(b.data())
    last = fpdus(recs)[-1]
    assert last.crc_ok
    assert {"MPA-06", "MPA-08"} <= set(last.rules)


def test_mpa_04_nonzero_pad() -> None:
    b = CaptureBuilder()
    c = b.connection()
    u = _send(1, data=b"abc")  # ULPDU 21 -> 1 pad byte
    wire = bytearray(c.wire(I2R, u))
    wire[-5] = 0x55
    wire[-4:] = crc_field(bytes(wire[:-4]))
    c.raw(I2R, bytes(wire))
    recs, _ = run(b.data())
    assert fpdus(recs)[0].rules == ["MPA-04"] and fpdus(recs)[0].crc_ok


def test_rdmap_04_read_response_must_match_the_request() -> None:
    b = CaptureBuilder()
    c = b.connection()
    c.send(I2R, ReadRequest(0x10, 0x100, 64, 0x20, 0x200))
    c.send(R2I, ReadResponse(0x11, 0x100, bytes(64)))  # wrong sink STag
    c.send(I2R, ReadRequest(0x10, 0x100, 64, 0x20, 0x200))
    c.send(R2I, ReadResponse(0x10, 0x100, bytes(32)))  # short
    recs, _ = run(b.data())
    f = fpdus(recs)
    assert "RDMAP-04" in f[1].rules and "RDMAP-04" in f[3].rules


def test_ext_03_atomic_responses_in_request_order() -> None:
    b = CaptureBuilder()
    c = b.connection()
    c.send(I2R, AtomicRequest.fetch_add(1, 5, 8, 1))
    c.send(I2R, AtomicRequest.fetch_add(2, 5, 8, 1))
    c.send(R2I, AtomicResponse(2, 0))
    recs, _ = run(b.data())
    assert "EXT-03" in fpdus(recs)[-1].rules


def test_term_code_of_a_ddp_terminate_round_trips() -> None:
    b = CaptureBuilder()
    c = b.connection()
    (bad,) = c.send(I2R, Send(b"x"), msn=7)
    term = build_terminate(TERM_DDP_U_MSN_RANGE, bad)
    c.send(R2I, term)
    recs, _ = run(b.data())
    f = fpdus(recs)
    assert f[0].rules == ["DDP-05"]
    assert seg(f[1]).header == term and f[1].findings == []


# ======================================================================================
# robustness
# ======================================================================================


@settings(max_examples=120, deadline=None)
@given(st.binary(max_size=300), st.integers(min_value=0, max_value=10_000))
def test_corrupted_streams_never_raise_foreign_errors(noise: bytes, where: int) -> None:
    data, _ = build_every_opcode(markers_i2r=True)
    segs = read_tcp_segments(data)
    target = [s for s in segs if len(s.payload)]
    seg = target[where % len(target)]
    payload = bytearray(seg.payload)
    at = where % len(payload)
    payload[at : at + len(noise)] = noise
    seg.payload = memoryview(bytes(payload))
    d = Dissector()
    for s in segs:
        d.feed(s)
    d.finish()


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(min_value=1, max_value=700), min_size=1, max_size=12))
def test_random_marked_segmentation_round_trips(cuts: list[int]) -> None:
    b = CaptureBuilder()
    c = b.connection(markers_i2r=True, markers_r2i=True)
    ulpdus = [u for n in (5, 600, 1100, 40, 3) for u in c.ulpdus(I2R, Send(bytes(n)))]
    wire = b"".join(c.wire(I2R, u) for u in ulpdus)
    pos = 0
    i = 0
    while pos < len(wire):
        size = cuts[i % len(cuts)]
        c.raw(I2R, wire[pos : pos + size])
        pos += size
        i += 1
    recs, notes = run(b.data())
    assert notes == []
    assert [bytes(r.ulpdu) for r in fpdus(recs)] == ulpdus
    assert all(r.findings == [] for r in fpdus(recs))


def test_capture_reader_fast_path_equals_generic_path() -> None:
    data, _ = build_every_opcode(markers_i2r=True)
    reader = CaptureReader(data)
    fast = [(s.frame, s.src, s.dst, s.sport, s.seq, s.flags, bytes(s.payload)) for s in reader]
    parsed = (parse_tcp(frame) for frame in CaptureReader(data).frames())
    generic = [
        (s.frame, s.src, s.dst, s.sport, s.seq, s.flags, bytes(s.payload))
        for s in parsed
        if s is not None
    ]
    assert fast == generic


@pytest.mark.parametrize("markers", [False, True])
def test_bulk_path_decodes_exactly_like_the_general_path(monkeypatch, markers: bool) -> None:
    from stack.dissect import record_json

    b = CaptureBuilder()
    c = b.connection(mss=300, markers_i2r=markers, markers_r2i=markers)
    for direction, msg in EVERY_OPCODE:
        c.send(direction, msg, together=True)
    wire = bytearray(c.wire(I2R, _send(9, data=b"abc")))  # MSN gap, then a bad CRC
    wire[-1] ^= 1
    c.raw(I2R, bytes(wire))
    c.send(I2R, Send(bytes(2000)))
    data = b.data()

    def records() -> list[object]:
        d = Dissector()
        items = [i for s in read_tcp_segments(data) for i in d.feed(s)] + d.finish()
        out: list[object] = [record_json(i) if isinstance(i, PduRecord) else i for i in items]
        return out + [repr(info) for info in d.streams()]  # per-direction counters too

    fast = records()
    monkeypatch.setattr("stack.dissect.decoder.walker.DirectionDecoder.bulk", False)
    assert records() == fast
    assert any("MPA-12" in r["findings"] for r in fast if isinstance(r, dict))
