"""Scapy DDP and RDMAP layers (stack.dissect.scapy.ddp_rdmap) and their opcode bindings.

Byte-exact against reference FPDUs, field-exact on dissection, forced values, truncation,
random round trips and a cross-check with the wire decoder (stack.wire.rdmap)."""

from __future__ import annotations

import struct
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scapy.packet import Packet, Padding, Raw

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
    Opcode,
    QueueNumber,
)
from stack.dissect.scapy import (
    DDP,
    MPA_FPDU,
    DDP_Tagged,
    DDP_Untagged,
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
    immediate_data_fpdu,
    insert_markers,
    send_fpdu,
    split_marked_fpdus,
)
from stack.wire import rdmap, terminate
from stack.wire.events import Terminate
from tests.dissect.scapy_vectors import (
    CRC,
    DDP_EXPECT,
    E3_FIELDS,
    HELLO,
    PAD_LEN,
    ULPDU_LEN,
    E,
    bit,
    e5_offending,
    fields_of,
    u32,
    u64,
)

# Scapy's Packet(**fields) has typed positional parameters (_pkt, ...) besides **fields: field
# dicts unpacked into a layer are typed dict[str, Any] (field values are heterogeneous).
E3_KW: dict[str, Any] = E3_FIELDS


def dump(pkt: Packet) -> str:
    """``pkt.show(dump=True)``: the text Scapy returns instead of printing it."""
    text = pkt.show(dump=True)
    assert isinstance(text, str)
    return text


# --------------------------------------------------------------------------------------
# Byte-exact building from stacked layers, field-exact dissection, bindings
# --------------------------------------------------------------------------------------

STACKED = {
    "E1": lambda: MPA_FPDU() / DDP_Untagged(qn=0, msn=1) / RDMAP_Send() / Raw(HELLO),
    "E2": lambda: (
        MPA_FPDU()
        / DDP_Tagged(stag=0x00ABCDEF, to=0x1000)
        / RDMAP_Write()
        / Raw(bytes(range(1, 9)))
    ),
    "E3": lambda: MPA_FPDU() / DDP_Untagged(msn=1) / RDMAP_ReadRequest(**E3_KW),
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
            rdma_hdr=RDMAP_ReadRequest(**E3_KW),
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


@pytest.mark.parametrize("name", sorted(STACKED))
def test_mpa_01_mpa_12_examples_build_byte_exact_from_layers(name: str) -> None:
    assert bytes(STACKED[name]()) == E[name]


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
    text = dump(MPA_FPDU(E["E6"]))
    assert "Remote Protection Error" in text and "Invalid STag" in text
    text = dump(MPA_FPDU(E["E5"]))
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
    assert "CmpSwap" in dump(swap)
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
        flag_field: dict[str, Any] = {kw: 1}
        raw = bytes(RDMAP_Terminate(ddp_seg_len=None, **flag_field))
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


# --------------------------------------------------------------------------------------
# Forced values survive; truncated headers
# --------------------------------------------------------------------------------------


def test_ddp_03_rdmap_02_forced_versions_reserved_and_qn_survive() -> None:
    pkt = MPA_FPDU() / DDP_Untagged(dv=2, rsvd=5, rv=0, rsv=3, qn=7) / RDMAP_ReadRequest()
    got = MPA_FPDU(bytes(pkt))
    assert (got.dv, got.rsvd, got.rv, got.rsv, got.qn) == (2, 5, 0, 3, 7)
    assert got.opcode == Opcode.RDMA_READ_REQUEST and got.crc_ok() is True
    # An explicit opcode beats the binding: a Send layer on opcode 0xC stays 0xC.
    raw = bytes(MPA_FPDU() / DDP_Untagged(opcode=0xC) / RDMAP_Send())
    assert raw[3] & RDMAP_OPCODE_MASK == 0xC
    assert MPA_FPDU(raw)[DDP_Untagged].opcode == 0xC


def test_rdmap_11_forced_terminate_reserved_and_flags_survive() -> None:
    term = RDMAP_Terminate(layer=0xF, etype=0xE, code=0xDD, reserved=0x1FFF, d=1, ddp_seg_len=3)
    got = MPA_FPDU(bytes(MPA_FPDU() / DDP_Untagged() / term))[RDMAP_Terminate]
    got_fields = {k: got.getfieldval(k) for k in ("layer", "etype", "code", "reserved")}
    assert got_fields == dict(layer=0xF, etype=0xE, code=0xDD, reserved=0x1FFF)
    assert got.ddp_seg_len == 3 and got.ddp_hdr is None
    assert "0xdd (layer 15 etype 14 code 0xDD)" in got.show(dump=True)  # unnamed, not lost


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


# --------------------------------------------------------------------------------------
# Hypothesis: random fields round-trip; random ULPDUs never crash
# --------------------------------------------------------------------------------------


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
    ctrl: dict[str, Any] = dict(last=last, rsvd=rsvd, dv=dv, rv=rv, rsv=rsv, opcode=opcode)
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
    rr_fields: dict[str, Any] = dict(zip(E3_FIELDS, rr, strict=True))
    layers = [
        RDMAP_ReadRequest(**rr_fields),
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


# --------------------------------------------------------------------------------------
# Cross-check with the wire core (stack.wire.rdmap)
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["E5", "E6"])
def test_rdmap_11_cross_check_terminates_with_wire_decoder(name: str) -> None:
    pkt = MPA_FPDU(E[name])
    seg = rdmap.decode_ulpdu(E[name][2 : 2 + pkt.ulpdu_length])
    term = seg.header
    assert isinstance(term, Terminate)
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
