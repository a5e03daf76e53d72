"""Scapy layers: byte-exact against the digest's examples (iwarp-wire.md §2.5, §3.6, §9),
field-exact on dissection, forced values, CRC verdicts, markers, robustness, and
cross-checks with the wire core (stack.wire.rdmap, stack.wire.framing)."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scapy.layers.inet import IP, TCP
from scapy.layers.l2 import Ether
from scapy.packet import Packet, Padding, Raw
from scapy.utils import rdpcap, wrpcap

from stack.constants import (
    ALL_ONES_64,
    ATOMIC_REQUEST_HDR_LEN,
    ATOMIC_RESPONSE_HDR_LEN,
    DDP_DV_MASK,
    DDP_LAST,
    DDP_RSVD_MASK,
    DDP_TAGGED,
    DDP_TAGGED_HDR_LEN,
    DDP_UNTAGGED_HDR_LEN,
    IMMEDIATE_DATA_LEN,
    MPA_CRC_RESIDUE,
    MPA_KEY_REP,
    MPA_KEY_REQ,
    MPA_RESERVED_MASK,
    MPA_V2_PEER_TO_PEER,
    MPA_V2_RTR_READ,
    MPA_V2_RTR_SEND,
    MPA_V2_RTR_WRITE,
    MULPDU_MAX,
    OPCODE_QN,
    RDMAP_OPCODE_MASK,
    RDMAP_RSVD_MASK,
    RDMAP_RV_MASK,
    READ_REQUEST_HDR_LEN,
    TERM_FLAG_D,
    TERM_FLAG_M,
    TERM_FLAG_R,
    TERMINATE_CTRL_LEN,
    AtomicOpcode,
    MpaFlag,
    Opcode,
    QueueNumber,
)
from stack.crc import crc32c
from stack.dissect.layers import (
    DDP,
    MPA_FPDU,
    DDP_Tagged,
    DDP_Untagged,
    MPA_FPDU_NoCRC,
    MPA_Frame,
    MPA_Marker,
    MPA_Reply,
    MPA_Request,
    RDMAP_AtomicRequest,
    RDMAP_AtomicResponse,
    RDMAP_ImmediateData,
    RDMAP_ImmediateDataSE,
    RDMAP_ReadRequest,
    RDMAP_ReadResponse,
    RDMAP_Send,
    RDMAP_SendInvalidate,
    RDMAP_SendSE,
    RDMAP_SendSEInvalidate,
    RDMAP_Terminate,
    RDMAP_Write,
    atomic_cmp_swap_fpdu,
    atomic_fetch_add_fpdu,
    atomic_response_fpdu,
    immediate_data_fpdu,
    insert_markers,
    read_request_fpdu,
    read_response_fpdu,
    send_fpdu,
    split_fpdus,
    split_marked_fpdus,
    strip_markers,
    terminate_fpdu,
    write_fpdu,
)
from stack.errors import DecodeError

# --------------------------------------------------------------------------------------
# Digest vectors
# --------------------------------------------------------------------------------------


def hx(text: str) -> bytes:
    return bytes.fromhex(text.replace("\n", " "))


HELLO = b"Hello, iWARP!"
E = {
    "E1": hx(
        "00 1f 41 43 00 00 00 00 00 00 00 00 00 00 00 01 00 00 00 00 48 65 6c 6c 6f 2c 20 69"
        " 57 41 52 50 21 00 00 00 13 43 08 1e"
    ),
    "E2": hx("00 16 c1 40 00 ab cd ef 00 00 00 00 00 00 10 00 01 02 03 04 05 06 07 08 50 c1 0c dc"),
    "E3": hx(
        "00 2e 41 41 00 00 00 00 00 00 00 01 00 00 00 01 00 00 00 00 11 22 33 44 00 00 00 00"
        " 00 00 20 00 00 00 10 00 55 66 77 88 00 00 00 00 00 00 30 00 16 66 7b d9"
    ),
    "E4": hx("00 0e c1 40 00 00 00 01 00 00 00 00 00 00 00 00 eb d3 4c 5f"),
    "E5": hx(
        "00 2a 41 47 00 00 00 00 00 00 00 02 00 00 00 01 00 00 00 00 12 03 c0 00 00 1f 41 43"
        " 00 00 00 00 00 00 00 00 00 00 00 07 00 00 00 00 46 7c 16 52"
    ),
    "E6": hx(
        "00 46 41 47 00 00 00 00 00 00 00 02 00 00 00 01 00 00 00 00 01 00 e0 00 00 2e 41 41"
        " 00 00 00 00 00 00 00 01 00 00 00 01 00 00 00 00 11 22 33 44 00 00 00 00 00 00 20 00"
        " 00 00 10 00 55 66 77 88 00 00 00 00 00 00 30 00 ef 77 f6 c0"
    ),
    "E7": hx(
        "00 46 41 4a 00 00 00 00 00 00 00 01 00 00 00 01 00 00 00 00 00 00 00 00 de ad be ef"
        " 0a 0b 0c 0d 00 00 00 00 00 00 40 00 00 00 00 00 00 00 00 01 00 00 00 00 00 00 00 00"
        " 00 00 00 00 00 00 00 00 ff ff ff ff ff ff ff ff fa df ca 51"
    ),
    "E8": hx(
        "00 1e 41 4b 00 00 00 00 00 00 00 03 00 00 00 01 00 00 00 00 de ad be ef 00 00 00 00"
        " 00 00 00 29 b0 f1 11 7e"
    ),
    "E9": hx(
        "00 1a 41 48 00 00 00 00 00 00 00 00 00 00 00 02 00 00 00 00 01 02 03 04 05 06 07 08"
        " a9 8a 5e 54"
    ),
    "E10": hx("00000000 002a 4143 00000000 00000000 00000001 00000000" + " 00" * 24 + " 52239983"),
}
KEY_TAIL = "4d 50 41 20 49 44 20 52 65 {} 20 46 72 61 6d 65"
FRAMES = {
    "req": hx(KEY_TAIL.format("71") + " 50 02 00 04 80 10 c0 10"),
    "rep": hx(KEY_TAIL.format("70") + " 50 02 00 04 80 10 80 10"),
    "rej": hx(KEY_TAIL.format("70") + " 60 01 00 00"),
}

E3_FIELDS = dict(sink_stag=0x11223344, sink_to=0x2000, size=0x1000, src_stag=0x55667788)
E3_FIELDS["src_to"] = 0x3000


def e5_offending() -> Packet:
    return send_fpdu(HELLO, msn=7)


STACKED = {
    "E1": lambda: MPA_FPDU() / DDP_Untagged(qn=0, msn=1) / RDMAP_Send() / Raw(HELLO),
    "E2": lambda: (
        MPA_FPDU()
        / DDP_Tagged(stag=0x00ABCDEF, to=0x1000)
        / RDMAP_Write()
        / Raw(bytes(range(1, 9)))
    ),
    "E3": lambda: MPA_FPDU() / DDP_Untagged(msn=1) / RDMAP_ReadRequest(**E3_FIELDS),
    "E4": lambda: MPA_FPDU() / DDP_Tagged(stag=1, to=0) / RDMAP_Write(),
    "E5": lambda: (
        MPA_FPDU()
        / DDP_Untagged(msn=1)
        / RDMAP_Terminate(
            layer=1,
            etype=2,
            code=3,
            m=1,
            d=1,
            ddp_seg_len=31,
            ddp_hdr=DDP_Untagged(qn=0, msn=7, opcode=Opcode.SEND),
        )
    ),
    "E6": lambda: (
        MPA_FPDU()
        / DDP_Untagged()
        / RDMAP_Terminate(
            layer=0,
            etype=1,
            code=0,
            m=1,
            d=1,
            r=1,
            ddp_seg_len=46,
            ddp_hdr=DDP_Untagged(qn=1, msn=1, opcode=Opcode.RDMA_READ_REQUEST),
            rdma_hdr=RDMAP_ReadRequest(**E3_FIELDS),
        )
    ),
    "E7": lambda: (
        MPA_FPDU()
        / DDP_Untagged()
        / RDMAP_AtomicRequest(
            req_id=0xDEADBEEF, remote_stag=0x0A0B0C0D, remote_to=0x4000, add_swap_data=1
        )
    ),
    "E8": lambda: (
        MPA_FPDU() / DDP_Untagged() / RDMAP_AtomicResponse(orig_req_id=0xDEADBEEF, orig_value=0x29)
    ),
    "E9": lambda: MPA_FPDU() / DDP_Untagged(msn=2) / RDMAP_ImmediateData(data=bytes(range(1, 9))),
}

CONVENIENT = {
    "E1": lambda: send_fpdu(HELLO),
    "E2": lambda: write_fpdu(0x00ABCDEF, 0x1000, bytes(range(1, 9))),
    "E3": lambda: read_request_fpdu(0x11223344, 0x2000, 0x1000, 0x55667788, 0x3000),
    "E4": lambda: write_fpdu(1, 0),
    "E5": lambda: terminate_fpdu(1, 2, 3, offending=e5_offending()),
    "E6": lambda: terminate_fpdu(0, 1, 0, offending=E["E3"]),
    "E7": lambda: atomic_fetch_add_fpdu(0xDEADBEEF, 0x0A0B0C0D, 0x4000, 1),
    "E8": lambda: atomic_response_fpdu(0xDEADBEEF, 0x29),
    "E9": lambda: immediate_data_fpdu(bytes(range(1, 9)), msn=2),
}


def fields_of(pkt: Packet) -> dict[str, object]:
    """Every field value of one layer (payload excluded)."""
    return {f.name: pkt.getfieldval(f.name) for f in pkt.fields_desc}


# --------------------------------------------------------------------------------------
# Byte-exact building (digest §9, §3.6)
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(STACKED))
def test_mpa_01_mpa_12_examples_build_byte_exact_from_layers(name: str) -> None:
    assert bytes(STACKED[name]()) == E[name]


@pytest.mark.parametrize("name", sorted(CONVENIENT))
def test_mpa_01_mpa_12_examples_build_byte_exact_from_constructors(name: str) -> None:
    assert bytes(CONVENIENT[name]()) == E[name]


@pytest.mark.parametrize("name", sorted(E))
def test_mpa_12_examples_satisfy_crc_residue(name: str) -> None:
    assert crc32c(E[name]) == MPA_CRC_RESIDUE


def test_mpa_08_e10_rfc5044_fig5_marker_opens_the_fpdu() -> None:
    fpdu = send_fpdu(bytes(24))
    marked = insert_markers(fpdu, 0)
    assert marked == E["E10"]
    [got] = split_marked_fpdus(marked, 0)
    assert got.offset == 4 and got.crc_ok is True
    assert [(pos, m.fpduptr) for pos, m in got.markers] == [(0, 0)]
    assert bytes(got.fpdu) == marked[4:]  # the CRC on the wire covers the marker
    assert bytes(got.fpdu)[:-4] == bytes(fpdu)[:-4]
    # The FPDU alone fails its CRC: the leading marker is covered (MPA-12).
    assert got.fpdu.crc_ok() is False


def test_erc_03_erc_07_rfc6581_request_and_reply_byte_exact() -> None:
    req = MPA_Request(p2p=1, rtr_write=1, rtr_read=1, ird=16, ord=16)
    rep = MPA_Reply(p2p=1, rtr_write=1, ird=16, ord=16)
    assert bytes(req) == FRAMES["req"]
    assert bytes(rep) == FRAMES["rep"]


def test_mpa_23_reject_reply_rev1_no_private_data_byte_exact() -> None:
    assert bytes(MPA_Reply(rev=1, reject=1, enhanced=0)) == FRAMES["rej"]


# --------------------------------------------------------------------------------------
# Field-exact dissection
# --------------------------------------------------------------------------------------

DDP_EXPECT: dict[str, tuple[type[Packet], dict[str, int]]] = {
    "E1": (DDP_Untagged, dict(opcode=3, qn=0, msn=1, mo=0, inval_stag=0)),
    "E2": (DDP_Tagged, dict(opcode=0, stag=0x00ABCDEF, to=0x1000)),
    "E3": (DDP_Untagged, dict(opcode=1, qn=1, msn=1, mo=0)),
    "E4": (DDP_Tagged, dict(opcode=0, stag=1, to=0)),
    "E5": (DDP_Untagged, dict(opcode=7, qn=2, msn=1, mo=0)),
    "E6": (DDP_Untagged, dict(opcode=7, qn=2, msn=1, mo=0)),
    "E7": (DDP_Untagged, dict(opcode=0xA, qn=1, msn=1, mo=0)),
    "E8": (DDP_Untagged, dict(opcode=0xB, qn=3, msn=1, mo=0)),
    "E9": (DDP_Untagged, dict(opcode=8, qn=0, msn=2, mo=0)),
}
ULPDU_LEN = dict(E1=31, E2=22, E3=46, E4=14, E5=42, E6=70, E7=70, E8=30, E9=26)
PAD_LEN = dict(E1=3)
CRC = dict(
    E1=0x1E084313,
    E2=0xDC0CC150,
    E3=0xD97B6616,
    E4=0x5F4CD3EB,
    E5=0x52167C46,
    E6=0xC0F677EF,
    E7=0x51CADFFA,
    E8=0x7E11F1B0,
    E9=0x545E8AA9,
)


@pytest.mark.parametrize("name", sorted(DDP_EXPECT))
def test_ddp_01_rdmap_02_examples_dissect_every_field(name: str) -> None:
    pkt = MPA_FPDU(E[name])
    assert pkt.ulpdu_length == ULPDU_LEN[name]
    assert pkt.pad == bytes(PAD_LEN.get(name, 0))
    assert pkt.crc == CRC[name]
    assert pkt.crc_ok() is True
    cls, expect = DDP_EXPECT[name]
    ddp = pkt.payload
    assert type(ddp) is cls
    common = dict(tagged=int(cls is DDP_Tagged), last=1, rsvd=0, dv=1, rv=1, rsv=0)
    assert {k: ddp.getfieldval(k) for k in {**common, **expect}} == {**common, **expect}
    assert bytes(pkt) == E[name]


def test_rdmap_02_e1_send_payload_and_layers() -> None:
    pkt = MPA_FPDU(E["E1"])
    assert pkt.haslayer(RDMAP_Send)
    assert pkt[Raw].load == HELLO
    assert not pkt.haslayer(Padding)


def test_ddp_07_e4_zero_length_write_keeps_its_rdmap_layer() -> None:
    pkt = MPA_FPDU(E["E4"])
    assert pkt.haslayer(RDMAP_Write) and not pkt.haslayer(Raw)


def test_rdmap_04_e3_read_request_fields() -> None:
    rr = MPA_FPDU(E["E3"])[RDMAP_ReadRequest]
    assert fields_of(rr) == E3_FIELDS
    assert len(rr) == READ_REQUEST_HDR_LEN


def test_rdmap_11_e5_terminate_fields_and_copied_untagged_header() -> None:
    term = MPA_FPDU(E["E5"])[RDMAP_Terminate]
    assert (term.layer, term.etype, term.code) == (1, 2, 3)
    assert (term.m, term.d, term.r, term.reserved) == (1, 1, 0, 0)
    assert term.ddp_seg_len == 31
    hdr = term.ddp_hdr
    assert type(hdr) is DDP_Untagged and len(hdr) == DDP_UNTAGGED_HDR_LEN
    assert (hdr.opcode, hdr.qn, hdr.msn, hdr.mo) == (Opcode.SEND, 0, 7, 0)
    assert term.rdma_hdr is None


def test_rdmap_11_e6_terminate_copies_read_request_header_by_t_bit() -> None:
    term = MPA_FPDU(E["E6"])[RDMAP_Terminate]
    assert (term.layer, term.etype, term.code, term.m, term.d, term.r) == (0, 1, 0, 1, 1, 1)
    assert term.ddp_seg_len == 46
    # 18 bytes because the copied header is untagged, although EType 1 (Wireshark bug).
    assert type(term.ddp_hdr) is DDP_Untagged
    assert term.ddp_hdr.opcode == Opcode.RDMA_READ_REQUEST
    assert fields_of(term.rdma_hdr) == E3_FIELDS


def test_rdmap_11_terminate_names_from_constants_tables() -> None:
    text = MPA_FPDU(E["E6"]).show(dump=True)
    assert "Remote Protection Error" in text and "Invalid STag" in text
    text = MPA_FPDU(E["E5"]).show(dump=True)
    assert "Untagged Buffer Error" in text and "Invalid MSN - MSN range is not valid" in text
    assert "layer     = DDP" in text


def test_ext_04_e7_atomic_request_fields_and_names() -> None:
    ar = MPA_FPDU(E["E7"])[RDMAP_AtomicRequest]
    assert fields_of(ar) == dict(
        reserved=0,
        aopcode=AtomicOpcode.FETCH_ADD,
        req_id=0xDEADBEEF,
        remote_stag=0x0A0B0C0D,
        remote_to=0x4000,
        add_swap_data=1,
        add_swap_mask=0,
        compare_data=0,
        compare_mask=ALL_ONES_64,
    )
    assert len(ar) == ATOMIC_REQUEST_HDR_LEN
    assert "FetchAdd" in ar.show(dump=True)
    swap = atomic_cmp_swap_fpdu(1, 2, 8, compare=3, swap=4)
    assert "CmpSwap" in swap.show(dump=True)
    got = MPA_FPDU(bytes(swap))[RDMAP_AtomicRequest]
    assert (got.aopcode, got.compare_data, got.add_swap_data) == (AtomicOpcode.CMP_SWAP, 3, 4)


def test_ext_03_e8_atomic_response_original_value_labelled_correctly() -> None:
    resp = MPA_FPDU(E["E8"])[RDMAP_AtomicResponse]
    assert fields_of(resp) == dict(orig_req_id=0xDEADBEEF, orig_value=0x29)
    assert len(resp) == ATOMIC_RESPONSE_HDR_LEN
    text = resp.show(dump=True)
    assert "orig_req_id= 0xdeadbeef" in text and "orig_value= 0x29" in text


def test_ext_09_e9_immediate_data_and_se_variant() -> None:
    imm = MPA_FPDU(E["E9"])[RDMAP_ImmediateData]
    assert imm.data == bytes(range(1, 9)) and len(imm) == IMMEDIATE_DATA_LEN
    se = MPA_FPDU(bytes(immediate_data_fpdu(b"ABCDEFGH", solicited=True)))
    assert type(se[DDP_Untagged].payload) is RDMAP_ImmediateDataSE
    assert se.opcode == Opcode.IMMEDIATE_DATA_SE and se.qn == QueueNumber.SEND


def test_erc_03_frames_dissect_ird_ord_word() -> None:
    req = MPA_Frame(FRAMES["req"])
    assert type(req) is MPA_Request
    assert fields_of(req) == dict(
        key=MPA_KEY_REQ, markers=0, crc=1, reject=0, enhanced=1, res=0, rev=2, pd_length=4,
        p2p=1, rtr_send=0, ird=16, rtr_write=1, rtr_read=1, ord=16, private_data=b"",
    )  # fmt: skip
    rep = MPA_Frame(FRAMES["rep"])
    assert type(rep) is MPA_Reply and rep.key == MPA_KEY_REP
    assert (rep.p2p, rep.rtr_send, rep.rtr_write, rep.rtr_read) == (1, 0, 1, 0)
    rej = MPA_Frame(FRAMES["rej"])
    assert (rej.rev, rej.reject, rej.enhanced, rej.pd_length) == (1, 1, 0, 0)
    assert not rej.has_ird_ord() and "ird" not in rej.fields  # no word without S
    assert req.has_ird_ord() and rep.has_ird_ord()
    for name, raw in FRAMES.items():
        assert bytes(MPA_Frame(raw)) == raw, name


def test_erc_02_private_data_after_the_word_and_pd_length_auto() -> None:
    frame = MPA_Request(ird=5, ord=7, private_data=b"ulp!")
    raw = bytes(frame)
    assert struct.unpack_from(">H", raw, 18)[0] == 8
    assert struct.unpack_from(">I", raw, 20)[0] == (5 << 16) | 7
    got = MPA_Frame(raw)
    assert (got.ird, got.ord, got.private_data) == (5, 7, b"ulp!")
    plain = MPA_Request(rev=1, enhanced=0, private_data=b"abc")
    got = MPA_Frame(bytes(plain))
    assert (got.pd_length, got.private_data, got.has_ird_ord()) == (3, b"abc", False)


def test_erc_02_enhanced_flag_without_room_for_the_word() -> None:
    raw = bytes(MPA_Request(enhanced=1, pd_length=2, private_data=b"xy"))
    got = MPA_Frame(raw)
    assert got.enhanced == 1 and not got.has_ird_ord() and "ird" not in got.fields
    assert got.private_data == b"xy" and bytes(got) == raw


def test_mpa_flags_and_word_bits_match_constants() -> None:
    flag = bytes(MPA_Request(markers=1, crc=0, reject=1, enhanced=1, res=0))[16]
    assert flag == MpaFlag.MARKERS | MpaFlag.REJECT | MpaFlag.ENHANCED
    assert bytes(MPA_Request(crc=1, enhanced=0))[16] == MpaFlag.CRC
    assert bytes(MPA_Request(crc=0, enhanced=0, res=0xF))[16] == MPA_RESERVED_MASK
    for field, bit in [
        ("p2p", MPA_V2_PEER_TO_PEER),
        ("rtr_send", MPA_V2_RTR_SEND),
        ("rtr_write", MPA_V2_RTR_WRITE),
        ("rtr_read", MPA_V2_RTR_READ),
    ]:
        raw = bytes(MPA_Request(ird=0, ord=0, **{field: 1}))
        assert struct.unpack_from(">I", raw, 20)[0] == bit, field


def test_ddp_and_rdmap_bits_and_lengths_match_constants() -> None:
    assert len(DDP_Tagged()) == DDP_TAGGED_HDR_LEN
    assert len(DDP_Untagged()) == DDP_UNTAGGED_HDR_LEN
    raw = bytes(DDP_Tagged(tagged=1, last=0, rsvd=0, dv=0, rv=0, rsv=0, opcode=0))
    assert raw[0] == DDP_TAGGED and raw[1] == 0
    assert bytes(DDP_Untagged(tagged=0, last=1, dv=0, rsvd=0))[0] == DDP_LAST
    assert bytes(DDP_Untagged(last=0, rsvd=0xF, dv=0))[0] == DDP_RSVD_MASK
    assert bytes(DDP_Untagged(last=0, dv=3))[0] == DDP_DV_MASK
    ctrl = bytes(DDP_Untagged(rv=3, rsv=0, opcode=0))[1]
    assert ctrl == RDMAP_RV_MASK
    assert bytes(DDP_Untagged(rv=0, rsv=3, opcode=0))[1] == RDMAP_RSVD_MASK
    assert bytes(DDP_Untagged(rv=0, rsv=0, opcode=0xF))[1] == RDMAP_OPCODE_MASK
    for flag, kw in [(TERM_FLAG_M, "m"), (TERM_FLAG_D, "d"), (TERM_FLAG_R, "r")]:
        raw = bytes(RDMAP_Terminate(ddp_seg_len=None, **{kw: 1}))
        assert struct.unpack_from(">I", raw)[0] == flag, kw
    assert len(RDMAP_Terminate()) == TERMINATE_CTRL_LEN


def test_ddp_01_dispatch_on_t_bit() -> None:
    tagged, untagged = E["E2"][2:16], E["E1"][2:20]
    assert type(DDP(tagged)) is DDP_Tagged
    assert type(DDP(untagged)) is DDP_Untagged
    assert type(DDP()) is DDP_Untagged
    assert MPA_FPDU(E["E2"])[DDP].stag == 0x00ABCDEF  # DDP matches both subclasses


@pytest.mark.parametrize(
    ("ddp", "rdmap", "opcode", "qn"),
    [
        (DDP_Tagged, RDMAP_Write, Opcode.RDMA_WRITE, None),
        (DDP_Tagged, RDMAP_ReadResponse, Opcode.RDMA_READ_RESPONSE, None),
        (DDP_Untagged, RDMAP_ReadRequest, Opcode.RDMA_READ_REQUEST, 1),
        (DDP_Untagged, RDMAP_Send, Opcode.SEND, 0),
        (DDP_Untagged, RDMAP_SendInvalidate, Opcode.SEND_INVALIDATE, 0),
        (DDP_Untagged, RDMAP_SendSE, Opcode.SEND_SE, 0),
        (DDP_Untagged, RDMAP_SendSEInvalidate, Opcode.SEND_SE_INVALIDATE, 0),
        (DDP_Untagged, RDMAP_Terminate, Opcode.TERMINATE, 2),
        (DDP_Untagged, RDMAP_ImmediateData, Opcode.IMMEDIATE_DATA, 0),
        (DDP_Untagged, RDMAP_ImmediateDataSE, Opcode.IMMEDIATE_DATA_SE, 0),
        (DDP_Untagged, RDMAP_AtomicRequest, Opcode.ATOMIC_REQUEST, 1),
        (DDP_Untagged, RDMAP_AtomicResponse, Opcode.ATOMIC_RESPONSE, 3),
    ],
)
def test_rdmap_01_stacking_sets_opcode_and_qn_and_dissects_back(
    ddp: type[Packet], rdmap: type[Packet], opcode: int, qn: int | None
) -> None:
    pkt = MPA_FPDU() / ddp() / rdmap()
    raw = bytes(pkt)
    assert raw[3] & RDMAP_OPCODE_MASK == opcode
    if qn is not None:
        assert qn == OPCODE_QN[opcode]
        assert struct.unpack_from(">I", raw, 8)[0] == qn
    got = MPA_FPDU(raw)
    assert type(got[ddp].payload) is rdmap
    assert got.crc_ok() is True


def test_rdmap_03_send_with_invalidate_carries_stag_in_rsvdulp() -> None:
    pkt = send_fpdu(b"x", inval_stag=0x12345678, solicited=True)
    raw = bytes(pkt)
    assert raw[3] == 0x40 | Opcode.SEND_SE_INVALIDATE and raw[4:8] == bytes.fromhex("12345678")
    got = MPA_FPDU(raw)
    assert got.inval_stag == 0x12345678 and got.haslayer(RDMAP_SendSEInvalidate)


def test_ddp_02_read_response_and_non_last_segments() -> None:
    pkt = MPA_FPDU(bytes(read_response_fpdu(7, 0x100, b"abcd", last=False)))
    assert (pkt.tagged, pkt.last, pkt.opcode) == (1, 0, Opcode.RDMA_READ_RESPONSE)
    assert pkt.haslayer(RDMAP_ReadResponse) and pkt[Raw].load == b"abcd"
    pkt = MPA_FPDU(bytes(send_fpdu(b"z" * 5, msn=9, mo=1482, last=False)))
    assert (pkt.last, pkt.msn, pkt.mo, pkt.ulpdu_length, len(pkt.pad)) == (0, 9, 1482, 23, 3)


# --------------------------------------------------------------------------------------
# Forced values survive (any field can be wrong on purpose)
# --------------------------------------------------------------------------------------


def test_mpa_04_mpa_12_forced_length_pad_crc_survive() -> None:
    pkt = MPA_FPDU(ulpdu_length=999, pad=b"\xaa\xbb", crc=0x11223344) / DDP_Untagged()
    raw = bytes(pkt)
    assert raw[:2] == (999).to_bytes(2, "big")
    assert raw[20:22] == b"\xaa\xbb" and raw[22:] == bytes.fromhex("44332211")
    pkt = MPA_FPDU(pad=b"") / DDP_Untagged() / Raw(b"x")
    assert len(bytes(pkt)) == 2 + 19 + 4  # no pad at all, on purpose


def test_ddp_03_rdmap_02_forced_versions_reserved_and_qn_survive() -> None:
    pkt = MPA_FPDU() / DDP_Untagged(dv=2, rsvd=5, rv=0, rsv=3, qn=7) / RDMAP_ReadRequest()
    got = MPA_FPDU(bytes(pkt))
    assert (got.dv, got.rsvd, got.rv, got.rsv, got.qn) == (2, 5, 0, 3, 7)
    assert got.opcode == Opcode.RDMA_READ_REQUEST and got.crc_ok() is True
    # An explicit opcode beats the binding: a Send layer on opcode 0xC stays 0xC.
    raw = bytes(MPA_FPDU() / DDP_Untagged(opcode=0xC) / RDMAP_Send())
    assert raw[3] & RDMAP_OPCODE_MASK == 0xC
    assert MPA_FPDU(raw)[DDP_Untagged].opcode == 0xC


def test_mpa_19_mpa_20_mpa_21_forced_frame_fields_survive() -> None:
    frame = MPA_Request(key=b"MPA ID Xyz Frame", res=0xA, rev=7, pd_length=600, reject=1)
    raw = bytes(frame)
    assert raw[:16] == b"MPA ID Xyz Frame"
    assert raw[16] & MPA_RESERVED_MASK == 0xA and raw[16] & MpaFlag.REJECT
    assert raw[17] == 7 and raw[18:20] == (600).to_bytes(2, "big")
    got = MPA_Frame(raw)
    assert type(got) is MPA_Frame  # unknown key: generic frame
    assert (got.res, got.rev, got.pd_length) == (0xA, 7, 600) and bytes(got) == raw


def test_rdmap_11_forced_terminate_reserved_and_flags_survive() -> None:
    term = RDMAP_Terminate(layer=0xF, etype=0xE, code=0xDD, reserved=0x1FFF, d=1, ddp_seg_len=3)
    got = MPA_FPDU(bytes(MPA_FPDU() / DDP_Untagged() / term))[RDMAP_Terminate]
    got_fields = {k: got.getfieldval(k) for k in ("layer", "etype", "code", "reserved")}
    assert got_fields == dict(layer=0xF, etype=0xE, code=0xDD, reserved=0x1FFF)
    assert got.ddp_seg_len == 3 and got.ddp_hdr is None
    assert "0xdd (layer 15 etype 14 code 0xDD)" in got.show(dump=True)  # unnamed, not lost


# --------------------------------------------------------------------------------------
# CRC verdict (MPA-05, MPA-12)
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(DDP_EXPECT))
def test_mpa_12_crc_verdict_flips_with_any_bit(name: str) -> None:
    raw = bytearray(E[name])
    assert MPA_FPDU(bytes(raw)).crc_ok() is True
    for bit in (0, 8 * 5 + 3, 8 * len(raw) - 1):  # length field, header, CRC field
        flipped = bytearray(raw)
        flipped[bit // 8] ^= 0x80 >> (bit % 8)
        assert MPA_FPDU(bytes(flipped)).crc_ok() is False, bit


def test_mpa_12_crc_covers_nonzero_pad_and_modified_fields() -> None:
    raw = bytearray(E["E1"])
    raw[33] = 0x55  # PAD byte: ignored on receive but covered by the CRC (MPA-04)
    pkt = MPA_FPDU(bytes(raw))
    assert pkt.pad == b"\x55\x00\x00" and pkt.crc_ok() is False and bytes(pkt) == bytes(raw)
    pkt = MPA_FPDU(E["E1"])
    pkt[DDP_Untagged].msn = 2
    assert pkt.crc_ok() is False  # stored CRC no longer matches
    pkt.crc = None
    assert pkt.crc_ok() is True


def test_mpa_05_no_crc_variant_sends_zero_and_is_never_checked() -> None:
    pkt = send_fpdu(HELLO, crc=False)
    raw = bytes(pkt)
    assert raw[:-4] == E["E1"][:-4] and raw[-4:] == bytes(4)
    got = MPA_FPDU_NoCRC(raw)
    assert got.crc == 0 and got.crc_ok() is None
    assert MPA_FPDU(raw).crc_ok() is False
    assert MPA_FPDU_NoCRC(E["E1"]).crc == CRC["E1"]  # any value allowed, kept as received
    assert (Raw(b"") / got)[MPA_FPDU] is not None  # the variant is found as MPA_FPDU


# --------------------------------------------------------------------------------------
# Markers (MPA-06..10), the digest's Appendix A stream and cross-check with the framer
# --------------------------------------------------------------------------------------


def appendix_a_fpdus() -> tuple[Packet, Packet]:
    payload = bytes(i & 0xFF for i in range(488))  # 00 01 .. ff 00 .. e7
    return send_fpdu(payload, msn=1), send_fpdu(b"tail", msn=2)


def test_mpa_07_mpa_08_appendix_a_worked_example() -> None:
    a, b = appendix_a_fpdus()
    assert len(a[Raw].load) == 488 and a[Raw].load[-4:] == bytes.fromhex("e4e5e6e7")
    marked = insert_markers([a, b], 0)
    assert marked[0:4] == bytes(4)
    assert marked[4:8] == bytes.fromhex("01fa4143")
    assert marked[508:512] == bytes.fromhex("e4e5e6e7")
    assert marked[512:516] == bytes.fromhex("000001fc")  # between PAD and CRC, FPDUPTR 508
    assert marked[516:520] == (0xE0C2A868).to_bytes(4, "little")
    assert marked[520:524] == bytes.fromhex("00164143")
    assert marked[-4:] == (0x1E4729C4).to_bytes(4, "little")
    got = split_marked_fpdus(marked, 0)
    assert [g.offset for g in got] == [4, 520]
    assert [g.crc_ok for g in got] == [True, True]
    assert [(p, m.fpduptr) for p, m in got[0].markers] == [(0, 0), (512, 508)]
    assert got[1].markers == ()
    assert bytes(got[0].fpdu)[:-4] == bytes(a)[:-4] and bytes(got[1].fpdu) == bytes(b)


def test_mpa_10_strip_markers_inverts_insert() -> None:
    a, b = appendix_a_fpdus()
    marked = insert_markers([a, b], 0, adjust_crc=False)
    clean, markers = strip_markers(marked, 0)
    assert clean == bytes(a) + bytes(b)
    assert [(p, m.reserved, m.fpduptr) for p, m in markers] == [(0, 0, 0), (512, 0, 508)]
    assert [bytes(f) for f in split_fpdus(clean)] == [bytes(a), bytes(b)]


def test_mpa_12_insert_markers_keeps_a_forced_bad_crc_bad() -> None:
    a, _ = appendix_a_fpdus()
    a.crc = 0xBAD
    marked = insert_markers(a, 0)
    [got] = split_marked_fpdus(marked, 0)
    assert got.crc_ok is False
    fixed = bytearray(marked)
    fixed[-4:] = (int.from_bytes(marked[-4:], "little") ^ 0xBAD ^ crc32c(bytes(a)[:-4])).to_bytes(
        4, "little"
    )
    assert split_marked_fpdus(bytes(fixed), 0)[0].crc_ok is True


def test_mpa_08_fpdu_ending_on_a_512_boundary_gets_no_phantom_marker() -> None:
    a = send_fpdu(bytes(484))  # 2 + 502 + 0 + 4 = 508 bytes: with its marker, ends at 512
    b = send_fpdu(b"next", msn=2)
    marked = insert_markers([a, b], 0)
    assert len(marked) == 4 + len(bytes(a)) + 4 + len(bytes(b))
    assert marked[512:516] == bytes(4)  # FPDUPTR 0: the marker belongs to B
    got = split_marked_fpdus(marked, 0)
    assert [g.crc_ok for g in got] == [True, True]
    assert [[(p, m.fpduptr) for p, m in g.markers] for g in got] == [[(0, 0)], [(512, 0)]]
    assert got[1].fpdu[Raw].load == b"next"


def test_mpa_06_marker_layer_fields() -> None:
    m = MPA_Marker(bytes.fromhex("000001fc"))
    assert (m.reserved, m.fpduptr) == (0, 508)
    assert bytes(MPA_Marker(reserved=0xFFFF, fpduptr=3)) == bytes.fromhex("ffff0003")


@settings(max_examples=40, deadline=None)
@given(
    sizes=st.lists(st.integers(min_value=0, max_value=1500), min_size=1, max_size=6),
    start=st.integers(min_value=0, max_value=127),
)
def test_mpa_07_insert_markers_matches_wire_framer(sizes: list[int], start: int) -> None:
    from stack.wire.framing import FpduFramer

    offset = 4 * start
    ulpdus = [bytes(DDP_Tagged(stag=i, to=n)) + bytes([i & 0xFF]) * n for i, n in enumerate(sizes)]
    framer = FpduFramer(markers=True, offset=offset)
    wire = b"".join(bytes(framer.frame(u)) for u in ulpdus)
    plain = FpduFramer(markers=False)
    clean = b"".join(bytes(plain.frame(u)) for u in ulpdus)
    assert insert_markers(clean, offset) == wire
    got = split_marked_fpdus(wire, offset)
    # Same FPDUs; only CRCs of FPDUs holding markers differ (they cover the markers).
    assert [bytes(g.fpdu)[:-4] for g in got] == [bytes(f)[:-4] for f in split_fpdus(clean)]
    assert all(g.crc_ok for g in got)
    assert strip_markers(wire, offset)[0] == b"".join(bytes(g.fpdu) for g in got)


# --------------------------------------------------------------------------------------
# Streams, MPA Reply sharing a segment, truncation and robustness
# --------------------------------------------------------------------------------------


def test_mpa_15_split_fpdus_and_padding_holds_the_next_fpdu() -> None:
    stream = b"".join(E[f"E{i}"] for i in range(1, 10))
    got = split_fpdus(stream)
    assert [bytes(p) for p in got] == [E[f"E{i}"] for i in range(1, 10)]
    first = MPA_FPDU(stream)
    assert first[Padding].load == stream[len(E["E1"]) :]
    assert bytes(first) == stream


def test_mpa_25_reply_shares_its_segment_with_an_fpdu() -> None:
    seg = FRAMES["rep"] + E["E2"]
    pkt = MPA_Frame(seg)
    assert type(pkt) is MPA_Reply
    assert pkt[MPA_FPDU].crc_ok() is True and pkt[DDP_Tagged].stag == 0x00ABCDEF
    assert bytes(pkt) == seg
    marked = FRAMES["rep"] + insert_markers(E["E2"], 0)
    pkt = MPA_Frame(marked)
    assert pkt[MPA_Marker].fpduptr == 0 and pkt[DDP_Tagged].stag == 0x00ABCDEF
    rejected = MPA_Frame(FRAMES["rej"] + b"junk")
    assert rejected[Raw].load == b"junk"


def test_mpa_16_truncated_fpdu_keeps_its_bytes_and_fails_crc() -> None:
    for cut in (3, 20, 35, 38):
        raw = E["E1"][:cut]
        pkt = MPA_FPDU(raw)
        assert pkt.is_truncated() and pkt.crc_ok() is False
        assert bytes(pkt) == raw and bytes(pkt.copy()) == raw
    assert not MPA_FPDU(E["E1"]).is_truncated()


@pytest.mark.parametrize(
    ("cls", "raw"),
    [
        (MPA_FPDU, b"\x00"),
        (MPA_Frame, FRAMES["req"][:19]),
        (MPA_Marker, b"\x00\x00\x01"),
        (DDP, b"\x41\x43\x00"),
        (RDMAP_ReadRequest, bytes(27)),
    ],
)
def test_mpa_16_ddp_10_truncated_headers_raise_decode_error(cls: type[Packet], raw: bytes) -> None:
    with pytest.raises(DecodeError):
        cls(raw)


def test_rdmap_04_truncated_rdmap_header_inside_fpdu_becomes_raw() -> None:
    pkt = MPA_FPDU(bytes(MPA_FPDU() / DDP_Untagged(opcode=Opcode.RDMA_READ_REQUEST) / Raw(b"ab")))
    assert not pkt.haslayer(RDMAP_ReadRequest) and pkt[Raw].load == b"ab"


def test_rdmap_11_terminate_copies_bounded_by_available_bytes() -> None:
    # R=1 with no RDMA header (siw's Send protection errors): absent, not invented.
    siw_like = MPA_FPDU() / DDP_Untagged() / RDMAP_Terminate(layer=0, etype=1, code=9, r=1)
    got = MPA_FPDU(bytes(siw_like))[RDMAP_Terminate]
    assert got.r == 1 and got.rdma_hdr is None and got.ddp_hdr is None
    # D=1 with the copied header cut after 5 bytes: a Raw partial copy.
    term = RDMAP_Terminate(layer=1, etype=2, code=1, m=1, d=1, ddp_seg_len=9)
    raw = bytes(MPA_FPDU() / DDP_Untagged() / term / Raw(E["E1"][2:7]))
    got = MPA_FPDU(raw)[RDMAP_Terminate]
    assert isinstance(got.ddp_hdr, Raw) and got.ddp_hdr.load == E["E1"][2:7]
    assert bytes(MPA_FPDU(raw)) == raw
    # D=1 but only the control word: seg len and header absent.
    ctrl_only = bytes(RDMAP_Terminate(layer=1, etype=2, code=3, m=1, d=1))[:TERMINATE_CTRL_LEN]
    raw = bytes(MPA_FPDU() / DDP_Untagged(opcode=Opcode.TERMINATE, qn=2) / Raw(ctrl_only))
    got = MPA_FPDU(raw)[RDMAP_Terminate]
    assert got.d == 1 and "ddp_seg_len" not in got.fields and got.ddp_hdr is None
    assert bytes(MPA_FPDU(raw)) == raw


def test_rdmap_11_terminate_fpdu_follows_fig10_defaults() -> None:
    llp = terminate_fpdu(2, 0, 2, offending=E["E1"])
    assert (llp.m, llp.d, llp.r, llp.ddp_hdr) == (0, 0, 0, None)
    catastrophic = terminate_fpdu(1, 0, 0, offending=E["E1"])
    assert catastrophic[RDMAP_Terminate].d == 0
    op_err = terminate_fpdu(0, 2, 6, offending=E["E3"])
    assert (op_err[RDMAP_Terminate].d, op_err[RDMAP_Terminate].r) == (1, 0)
    forced = terminate_fpdu(0, 1, 9, offending=E["E1"], r=True)
    assert forced[RDMAP_Terminate].r == 1 and forced[RDMAP_Terminate].rdma_hdr is None


def test_pcap_roundtrip_through_tcp(tmp_path: Path) -> None:
    frames = [
        Ether() / IP() / TCP(sport=4000, dport=5000) / MPA_Request(),
        Ether() / IP() / TCP(sport=5000, dport=4000) / Raw(FRAMES["rep"] + E["E2"]),
        Ether() / IP() / TCP(sport=4000, dport=5000) / send_fpdu(HELLO),
    ]
    path = tmp_path / "iwarp.pcap"
    wrpcap(str(path), frames)
    back = rdpcap(str(path))
    assert bytes(back[0][TCP].payload) == bytes(MPA_Request())
    assert MPA_Frame(bytes(back[1][TCP].payload))[MPA_FPDU].crc_ok() is True
    fpdu = MPA_FPDU(bytes(back[2][TCP].payload))
    assert fpdu[Raw].load == HELLO and bytes(fpdu) == E["E1"]


def test_summaries_name_layers() -> None:
    assert "crc=good" in MPA_FPDU(E["E1"]).mysummary()
    assert "crc=BAD" in MPA_FPDU(E["E1"][:-1] + b"\x00").mysummary()
    assert "Send" in MPA_FPDU(E["E1"])[DDP_Untagged].mysummary()
    assert "IRD=16" in MPA_Frame(FRAMES["req"]).mysummary()


# --------------------------------------------------------------------------------------
# Hypothesis: random fields round-trip; random bytes never crash
# --------------------------------------------------------------------------------------

u32 = st.integers(min_value=0, max_value=0xFFFFFFFF)
u64 = st.integers(min_value=0, max_value=ALL_ONES_64)
bit = st.integers(min_value=0, max_value=1)


@settings(max_examples=60, deadline=None)
@given(
    tagged=st.booleans(),
    last=bit,
    rsvd=st.integers(0, 15),
    dv=st.integers(0, 3),
    rv=st.integers(0, 3),
    rsv=st.integers(0, 3),
    opcode=st.integers(0, 15),
    a=u32,
    b=u64,
    qn=u32,
    msn=u32,
    mo=u32,
    payload=st.binary(max_size=40),
)
def test_ddp_01_random_headers_round_trip(
    tagged: bool,
    last: int,
    rsvd: int,
    dv: int,
    rv: int,
    rsv: int,
    opcode: int,
    a: int,
    b: int,
    qn: int,
    msn: int,
    mo: int,
    payload: bytes,
) -> None:
    ctrl = dict(last=last, rsvd=rsvd, dv=dv, rv=rv, rsv=rsv, opcode=opcode)
    if tagged:
        ddp: Packet = DDP_Tagged(stag=a, to=b, **ctrl)
    else:
        ddp = DDP_Untagged(inval_stag=a, qn=qn, msn=msn, mo=mo, **ctrl)
    raw = bytes(MPA_FPDU() / ddp / Raw(payload)) if payload else bytes(MPA_FPDU() / ddp)
    got = MPA_FPDU(raw)
    assert got.crc_ok() is True and bytes(got) == raw
    assert fields_of(got[DDP]) == fields_of(ddp)


@settings(max_examples=40, deadline=None)
@given(
    rr=st.tuples(u32, u64, u32, u32, u64),
    atomic=st.tuples(st.integers(0, (1 << 28) - 1), st.integers(0, 15), u32, u32, u64, u64, u64),
    masks=st.tuples(u64, u64),
    resp=st.tuples(u32, u64),
    imm=st.binary(min_size=8, max_size=8),
)
def test_rdmap_04_ext_04_random_rdmap_headers_round_trip(
    rr: tuple[int, ...],
    atomic: tuple[int, ...],
    masks: tuple[int, int],
    resp: tuple[int, int],
    imm: bytes,
) -> None:
    layers = [
        RDMAP_ReadRequest(**dict(zip(E3_FIELDS, rr, strict=True))),
        RDMAP_AtomicRequest(
            reserved=atomic[0],
            aopcode=atomic[1],
            req_id=atomic[2],
            remote_stag=atomic[3],
            remote_to=atomic[4],
            add_swap_data=atomic[5],
            add_swap_mask=atomic[6],
            compare_data=masks[0],
            compare_mask=masks[1],
        ),
        RDMAP_AtomicResponse(orig_req_id=resp[0], orig_value=resp[1]),
        RDMAP_ImmediateData(data=imm),
    ]
    for layer in layers:
        got = MPA_FPDU(bytes(MPA_FPDU() / DDP_Untagged() / layer))[type(layer)]
        assert fields_of(got) == fields_of(layer)


@settings(max_examples=40, deadline=None)
@given(
    cause=st.tuples(st.integers(0, 15), st.integers(0, 15), st.integers(0, 255)),
    flags=st.tuples(bit, bit, bit),
    reserved=st.integers(0, 0x1FFF),
    seg_len=st.integers(0, 0xFFFF),
    copied=st.sampled_from(["E1", "E2", "E3"]),
)
def test_rdmap_11_random_terminates_round_trip(
    cause: tuple[int, int, int],
    flags: tuple[int, int, int],
    reserved: int,
    seg_len: int,
    copied: str,
) -> None:
    m, d, r = flags
    offending = MPA_FPDU(E[copied])
    hdr = offending[DDP].copy()
    hdr.remove_payload()
    rdma = offending[RDMAP_ReadRequest].copy() if copied == "E3" else None
    term = RDMAP_Terminate(
        layer=cause[0],
        etype=cause[1],
        code=cause[2],
        m=m,
        d=d,
        r=r,
        reserved=reserved,
        ddp_seg_len=seg_len,
        ddp_hdr=hdr,
        rdma_hdr=rdma,
    )
    raw = bytes(MPA_FPDU() / DDP_Untagged() / term)
    got = MPA_FPDU(raw)[RDMAP_Terminate]
    assert (got.layer, got.etype, got.code, got.m, got.d, got.r, got.reserved) == (
        *cause,
        m,
        d,
        r,
        reserved,
    )
    if d:
        assert got.ddp_seg_len == seg_len and bytes(got.ddp_hdr) == bytes(hdr)
    if r and rdma is not None:
        assert fields_of(got.rdma_hdr) == fields_of(rdma)
    got.show(dump=True)


@settings(max_examples=60, deadline=None)
@given(
    reply=st.booleans(),
    flags=st.tuples(bit, bit, bit, bit, st.integers(0, 15)),
    rev=st.integers(0, 255),
    word=st.tuples(bit, bit, st.integers(0, 0x3FFF), bit, bit, st.integers(0, 0x3FFF)),
    private=st.binary(max_size=64),
)
def test_erc_03_random_mpa_frames_round_trip(
    reply: bool,
    flags: tuple[int, ...],
    rev: int,
    word: tuple[int, ...],
    private: bytes,
) -> None:
    names = ("p2p", "rtr_send", "ird", "rtr_write", "rtr_read", "ord")
    kw = dict(zip(("markers", "crc", "reject", "enhanced", "res"), flags, strict=True))
    kw.update(zip(names, word, strict=True))
    frame = (MPA_Reply if reply else MPA_Request)(rev=rev, private_data=private, **kw)
    raw = bytes(frame)
    got = MPA_Frame(raw)
    assert type(got) is type(frame) and bytes(got) == raw
    assert got.pd_length == len(private) + (4 if kw["enhanced"] else 0)
    expect = {k: v for k, v in fields_of(frame).items() if k != "pd_length"}
    if not kw["enhanced"]:
        expect = {k: v for k, v in expect.items() if k not in names}
    assert {k: got.getfieldval(k) for k in expect} == expect


@settings(max_examples=200, deadline=None)
@given(
    data=st.binary(max_size=120),
    cls=st.sampled_from([MPA_FPDU, MPA_FPDU_NoCRC, MPA_Frame, MPA_Marker, DDP, RDMAP_Terminate]),
)
def test_mpa_16_random_bytes_dissect_or_decode_error_and_rebuild_exactly(
    data: bytes, cls: type[Packet]
) -> None:
    if not data:
        return  # Scapy: cls(b"") is the default packet, not a dissection
    try:
        pkt = cls(data)
    except DecodeError:
        return
    assert bytes(pkt) == data
    pkt.show(dump=True)
    pkt.summary()
    if isinstance(pkt, MPA_FPDU):
        assert pkt.crc_ok() in (True, False, None)


@settings(max_examples=100, deadline=None)
@given(
    head=st.sampled_from(sorted(DDP_EXPECT)),
    tail=st.binary(max_size=60),
    opcode=st.integers(0, 15),
    tagged=st.booleans(),
)
def test_ddp_10_random_ulpdus_inside_valid_fpdus_never_crash(
    head: str, tail: bytes, opcode: int, tagged: bool
) -> None:
    ulpdu = bytearray(E[head][2 : 2 + ULPDU_LEN[head]] + tail)
    ulpdu[0] = (ulpdu[0] & ~DDP_TAGGED & 0xFF) | (DDP_TAGGED if tagged else 0)
    ulpdu[1] = (ulpdu[1] & 0xF0) | opcode
    raw = bytes(MPA_FPDU() / Raw(bytes(ulpdu)))
    pkt = MPA_FPDU(raw)
    assert pkt.crc_ok() is True and bytes(pkt) == raw
    pkt.show(dump=True)
    assert split_marked_fpdus(insert_markers(raw, 7 * 4), 7 * 4)[0].crc_ok is True


@settings(max_examples=60, deadline=None)
@given(data=st.binary(max_size=1200), offset=st.integers(0, 511))
def test_mpa_10_marker_helpers_never_crash_on_random_streams(data: bytes, offset: int) -> None:
    clean, markers = strip_markers(data, offset)
    assert len(clean) + 4 * len(markers) <= len(data)
    for item in split_marked_fpdus(data, offset):
        assert item.crc_ok in (True, False)
    insert_markers(data, offset)


# --------------------------------------------------------------------------------------
# Cross-checks with the wire core (stack.wire.rdmap encode_message / decode_ulpdu)
# --------------------------------------------------------------------------------------

rdmap = pytest.importorskip("stack.wire.rdmap")
events = pytest.importorskip("stack.wire.events")
framing = pytest.importorskip("stack.wire.framing")
terminate = pytest.importorskip("stack.wire.terminate")


def messages() -> st.SearchStrategy:
    data = st.binary(max_size=48)
    return st.one_of(
        st.builds(events.RdmaWrite, u32, u64, data),
        st.builds(events.ReadResponse, u32, u64, data),
        st.builds(events.ReadRequest, u32, u64, u32, u32, u64),
        st.builds(events.Send, data, st.booleans(), st.none() | u32),
        st.builds(events.ImmediateData, st.binary(min_size=8, max_size=8), st.booleans()),
        st.builds(
            events.AtomicRequest,
            st.sampled_from([AtomicOpcode.FETCH_ADD, AtomicOpcode.CMP_SWAP]),
            u32,
            u32,
            u64,
            u64,
            u64,
            u64,
            u64,
        ),
        st.builds(events.AtomicResponse, u32, u64),
    )


def scapy_for(msg: object, msn: int) -> Packet:
    """The same message built with the layers' convenience constructors."""
    if isinstance(msg, events.RdmaWrite):
        return write_fpdu(msg.stag, msg.to, bytes(msg.data))
    if isinstance(msg, events.ReadResponse):
        return read_response_fpdu(msg.stag, msg.to, bytes(msg.data))
    if isinstance(msg, events.ReadRequest):
        return read_request_fpdu(
            msg.sink_stag, msg.sink_to, msg.size, msg.src_stag, msg.src_to, msn=msn
        )
    if isinstance(msg, events.Send):
        return send_fpdu(
            bytes(msg.data), msn=msn, solicited=msg.solicited, inval_stag=msg.invalidate_stag
        )
    if isinstance(msg, events.ImmediateData):
        return immediate_data_fpdu(msg.data, msn=msn, solicited=msg.solicited)
    if isinstance(msg, events.AtomicRequest):
        pkt = atomic_fetch_add_fpdu(msg.req_id, msg.stag, msg.to, msg.add_swap_data, msn=msn)
        pkt[RDMAP_AtomicRequest].setfieldval("aopcode", msg.atomic_opcode)
        pkt[RDMAP_AtomicRequest].add_swap_mask = msg.add_swap_mask
        pkt[RDMAP_AtomicRequest].compare_data = msg.compare_data
        pkt[RDMAP_AtomicRequest].compare_mask = msg.compare_mask
        return pkt
    assert isinstance(msg, events.AtomicResponse)
    return atomic_response_fpdu(msg.req_id, msg.orig_value, msn=msn)


@settings(max_examples=80, deadline=None)
@given(msg=messages(), msn=u32)
def test_rdmap_02_cross_check_wire_encoder_and_layers_agree(msg: object, msn: int) -> None:
    [ulpdu] = rdmap.encode_message(msg, msn=msn, mulpdu=MULPDU_MAX)
    wire = bytes(framing.FpduFramer().frame(ulpdu))
    ours = bytes(scapy_for(msg, msn))
    assert ours == wire
    pkt = MPA_FPDU(wire)
    seg = rdmap.decode_ulpdu(bytes(pkt)[2 : 2 + pkt.ulpdu_length])
    ddp = pkt[DDP]
    assert (seg.tagged, seg.last, seg.opcode) == (bool(ddp.tagged), bool(ddp.last), ddp.opcode)
    if seg.tagged:
        assert (seg.stag, seg.to) == (ddp.stag, ddp.to)
    else:
        assert (seg.qn, seg.msn, seg.mo, seg.inval_stag) == (
            ddp.qn,
            ddp.msn,
            ddp.mo,
            ddp.inval_stag,
        )
    assert pkt.crc_ok() is True


@pytest.mark.parametrize("name", ["E5", "E6"])
def test_rdmap_11_cross_check_terminates_with_wire_decoder(name: str) -> None:
    pkt = MPA_FPDU(E[name])
    seg = rdmap.decode_ulpdu(E[name][2 : 2 + pkt.ulpdu_length])
    term = seg.header
    ours = pkt[RDMAP_Terminate]
    assert (term.layer, term.etype, term.code) == (ours.layer, ours.etype, ours.code)
    assert (term.m, term.d, term.r) == (bool(ours.m), bool(ours.d), bool(ours.r))
    assert term.ddp_seg_len == ours.ddp_seg_len
    assert term.ddp_header == bytes(ours.ddp_hdr)
    assert term.rdma_header == (bytes(ours.rdma_hdr) if ours.rdma_hdr is not None else b"")
    offending = E["E3"] if name == "E6" else bytes(e5_offending())
    cause = (ours.layer, ours.etype, ours.code)
    built = terminate.build_terminate(cause, offending[2 : 2 + MPA_FPDU(offending).ulpdu_length])
    assert terminate.encode_terminate(built) == bytes(ours)
