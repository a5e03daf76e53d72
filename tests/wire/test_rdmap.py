"""RDMAP codec: reference vectors, per-rule decode checks, Terminate building (RFC 5040/7306)."""

from __future__ import annotations

import struct

import pytest

from stack.constants import (
    ALL_ONES_64,
    MPA_CRC_RESIDUE,
    TERM_DDP_CATASTROPHIC,
    TERM_DDP_T_BASE_BOUNDS,
    TERM_DDP_T_INVALID_VERSION,
    TERM_DDP_U_INVALID_MO,
    TERM_DDP_U_INVALID_QN,
    TERM_DDP_U_INVALID_VERSION,
    TERM_DDP_U_MSN_RANGE,
    TERM_DDP_U_TOO_LONG,
    TERM_LLP_CRC_ERROR,
    TERM_RDMAP_CATASTROPHIC,
    TERM_RDMAP_CATASTROPHIC_STREAM,
    TERM_RDMAP_INVALID_STAG,
    TERM_RDMAP_INVALID_VERSION,
    TERM_RDMAP_OP_UNSPECIFIED,
    TERM_RDMAP_PROT_CANNOT_INVALIDATE,
    TERM_RDMAP_UNEXPECTED_OPCODE,
    AtomicOpcode,
    Opcode,
)
from stack.crc import crc32c
from stack.errors import DdpError, DecodeError, LocalError, ProtocolError, RdmapError
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
from stack.wire.rdmap import Segment, decode_ulpdu, encode_message, message_qn
from stack.wire.terminate import build_terminate, decode_terminate, encode_terminate, terminate_for

# Digest §9: whole FPDUs (CRC on, no markers) as hex.  The ULPDU is bytes [2 : 2+length].
FPDUS: dict[str, str] = {
    "E1": """
        00 1f 41 43 00 00 00 00 00 00 00 00 00 00 00 01
        00 00 00 00 48 65 6c 6c 6f 2c 20 69 57 41 52 50
        21 00 00 00 13 43 08 1e
    """,
    "E2": """
        00 16 c1 40 00 ab cd ef 00 00 00 00 00 00 10 00
        01 02 03 04 05 06 07 08 50 c1 0c dc
    """,
    "E3": """
        00 2e 41 41 00 00 00 00 00 00 00 01 00 00 00 01
        00 00 00 00 11 22 33 44 00 00 00 00 00 00 20 00
        00 00 10 00 55 66 77 88 00 00 00 00 00 00 30 00
        16 66 7b d9
    """,
    "E4": """
        00 0e c1 40 00 00 00 01 00 00 00 00 00 00 00 00 eb d3 4c 5f
    """,
    "E5": """
        00 2a 41 47 00 00 00 00 00 00 00 02 00 00 00 01
        00 00 00 00 12 03 c0 00 00 1f 41 43 00 00 00 00
        00 00 00 00 00 00 00 07 00 00 00 00 46 7c 16 52
    """,
    "E6": """
        00 46 41 47 00 00 00 00 00 00 00 02 00 00 00 01
        00 00 00 00 01 00 e0 00 00 2e 41 41 00 00 00 00
        00 00 00 01 00 00 00 01 00 00 00 00 11 22 33 44
        00 00 00 00 00 00 20 00 00 00 10 00 55 66 77 88
        00 00 00 00 00 00 30 00 ef 77 f6 c0
    """,
    "E7": """
        00 46 41 4a 00 00 00 00 00 00 00 01 00 00 00 01
        00 00 00 00 00 00 00 00 de ad be ef 0a 0b 0c 0d
        00 00 00 00 00 00 40 00 00 00 00 00 00 00 00 01
        00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00
        ff ff ff ff ff ff ff ff fa df ca 51
    """,
    "E8": """
        00 1e 41 4b 00 00 00 00 00 00 00 03 00 00 00 01
        00 00 00 00 de ad be ef 00 00 00 00 00 00 00 29 b0 f1 11 7e
    """,
    "E9": """
        00 1a 41 48 00 00 00 00 00 00 00 00 00 00 00 02
        00 00 00 00 01 02 03 04 05 06 07 08 a9 8a 5e 54
    """,
}
FPDUS = {k: "".join(v.split()) for k, v in FPDUS.items()}


def ulpdu_of(name: str) -> bytes:
    fpdu = bytes.fromhex(FPDUS[name])
    (length,) = struct.unpack_from(">H", fpdu)
    return fpdu[2 : 2 + length]


SEND_MSN7 = bytes.fromhex("4143 00000000 00000000 00000007 00000000") + b"Hello, iWARP!"
"""The peer Send of E5: E1 with MSN 7 (ULPDU_Length 31)."""

# (message, msn) each vector encodes, and the header / payload it decodes to.
MESSAGES: dict[str, tuple[RdmapMessage, int | None]] = {
    "E1": (Send(b"Hello, iWARP!"), 1),
    "E2": (RdmaWrite(0x00ABCDEF, 0x1000, bytes(range(1, 9))), None),
    "E3": (ReadRequest(0x11223344, 0x2000, 0x1000, 0x55667788, 0x3000), 1),
    "E4": (RdmaWrite(1, 0, b""), None),
    "E7": (AtomicRequest.fetch_add(0xDEADBEEF, 0x0A0B0C0D, 0x4000, 1, 0), 1),
    "E8": (AtomicResponse(0xDEADBEEF, 0x29), 1),
    "E9": (ImmediateData(bytes(range(1, 9))), 2),
}


def untagged(op: int, qn: int, msn: int = 1, mo: int = 0, last: bool = True, body=b"") -> bytes:
    """A hand-made untagged ULPDU (RV=1, DV=1) for negative tests."""
    ctrl = 0x41 if last else 0x01
    return struct.pack(">BBIIII", ctrl, 0x40 | op, 0, qn, msn, mo) + bytes(body)


def tagged(op: int, stag: int = 1, to: int = 0, last: bool = True, body=b"") -> bytes:
    ctrl = 0xC1 if last else 0x81
    return struct.pack(">BBIQ", ctrl, 0x40 | op, stag, to) + bytes(body)


RR_BODY = struct.pack(">IQIIQ", 1, 2, 3, 4, 5)


# --------------------------------------------------------------------------------------
# §9 byte-exact vectors
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(FPDUS))
def test_vectors_transcribed_with_valid_crc(name: str) -> None:
    fpdu = bytes.fromhex(FPDUS[name])
    assert crc32c(fpdu) == MPA_CRC_RESIDUE  # MPA-12 residue: the transcription is exact
    assert len(fpdu) % 4 == 0


@pytest.mark.parametrize("name", sorted(MESSAGES))
def test_vectors_encode_byte_exact(name: str) -> None:
    msg, msn = MESSAGES[name]
    assert encode_message(msg, msn=msn, mulpdu=1442) == [ulpdu_of(name)]


@pytest.mark.parametrize("name", sorted(MESSAGES))
def test_vectors_decode_back(name: str) -> None:
    msg, msn = MESSAGES[name]
    seg = decode_ulpdu(ulpdu_of(name))
    assert seg.findings == ()
    assert seg.last and seg.ddp_version == 1 and seg.rdmap_version == 1
    assert seg.ulpdu_len == len(ulpdu_of(name))
    if isinstance(msg, RdmaWrite):
        assert (seg.tagged, seg.opcode, seg.stag, seg.to) == (True, 0, msg.stag, msg.to)
        assert bytes(seg.payload) == bytes(msg.data)
        assert seg.qn is None and seg.msn is None and seg.header is None
    elif isinstance(msg, Send):
        assert (seg.opcode, seg.qn, seg.msn, seg.mo) == (Opcode.SEND, 0, msn, 0)
        assert bytes(seg.payload) == msg.data and seg.header is None
    else:
        assert not seg.tagged and seg.msn == msn and seg.mo == 0
        assert seg.header == msg and bytes(seg.payload) == b""


def test_rdmap_11_e5_decodes() -> None:
    seg = decode_ulpdu(ulpdu_of("E5"))
    t = seg.header
    assert isinstance(t, Terminate)
    assert (seg.qn, seg.msn, seg.mo) == (2, 1, 0)
    assert t.cause == TERM_DDP_U_MSN_RANGE and (t.m, t.d, t.r) == (True, True, False)
    assert t.ddp_seg_len == 31 and t.ddp_header == SEND_MSN7[:18] and not t.siw_swapped


def test_rdmap_12_e5_built_from_offending_send() -> None:
    t = build_terminate(TERM_DDP_U_MSN_RANGE, SEND_MSN7)
    assert encode_message(t, msn=1, mulpdu=1442) == [ulpdu_of("E5")]
    assert decode_ulpdu(ulpdu_of("E5")).header == t


def test_rdmap_12_e6_built_from_offending_read_request() -> None:
    t = build_terminate(TERM_RDMAP_INVALID_STAG, ulpdu_of("E3"))
    assert (t.m, t.d, t.r) == (True, True, True)
    assert t.rdma_header == ulpdu_of("E3")[18:]
    assert encode_message(t, msn=1, mulpdu=1442) == [ulpdu_of("E6")]
    assert decode_ulpdu(ulpdu_of("E6")).header == t


# --------------------------------------------------------------------------------------
# Per-opcode layout rules
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("msg", "opcode", "qn"),
    [
        (Send(b"a"), Opcode.SEND, 0),
        (Send(b"a", solicited=True), Opcode.SEND_SE, 0),
        (Send(b"a", invalidate_stag=9), Opcode.SEND_INVALIDATE, 0),
        (Send(b"a", True, 9), Opcode.SEND_SE_INVALIDATE, 0),
        (ReadRequest(1, 2, 3, 4, 5), Opcode.RDMA_READ_REQUEST, 1),
        (Terminate(0, 0, 0), Opcode.TERMINATE, 2),
        (ImmediateData(b"12345678", True), Opcode.IMMEDIATE_DATA_SE, 0),
        (AtomicRequest.cmp_swap(1, 2, 8, 3, 4), Opcode.ATOMIC_REQUEST, 1),
        (AtomicResponse(1, 2), Opcode.ATOMIC_RESPONSE, 3),
    ],
)
def test_rdmap_01_untagged_queue_numbers(msg: RdmapMessage, opcode: int, qn: int) -> None:
    (ulpdu,) = encode_message(msg, msn=5, mulpdu=128)
    seg = decode_ulpdu(ulpdu)
    assert not seg.tagged and seg.opcode == opcode and seg.qn == qn == message_qn(msg)
    assert ulpdu[1] == 0x40 | opcode  # RDMAP-02: RV=01, Rsv=0


@pytest.mark.parametrize("msg", [RdmaWrite(7, 9, b"abc"), ReadResponse(7, 9, b"abc")])
def test_rdmap_05_write_and_read_response_are_tagged(msg: RdmapMessage) -> None:
    (ulpdu,) = encode_message(msg, msn=None, mulpdu=128)
    seg = decode_ulpdu(ulpdu)
    assert seg.tagged and (seg.stag, seg.to, bytes(seg.payload)) == (7, 9, b"abc")
    assert message_qn(msg) is None


def test_rdmap_03_invalidate_stag_only_in_opcodes_4_and_6() -> None:
    (plain,) = encode_message(Send(b"x"), msn=1, mulpdu=128)
    (inval,) = encode_message(Send(b"x", invalidate_stag=0xCAFEBABE), msn=1, mulpdu=128)
    assert plain[2:6] == b"\0\0\0\0" and inval[2:6] == bytes.fromhex("cafebabe")
    assert decode_ulpdu(inval).inval_stag == 0xCAFEBABE
    # Non-zero on a plain Send: ignored on receive, noted as a non-fatal finding.
    odd = bytearray(plain)
    odd[2:6] = b"\x00\x00\x00\x05"
    seg = decode_ulpdu(odd)
    assert seg.inval_stag == 5
    assert [(f.rule, f.fatal) for f in seg.findings] == [("RDMAP-03", False)]


def test_rdmap_04_read_request_header_layout() -> None:
    (ulpdu,) = encode_message(ReadRequest(0x1, 0x2, 0x3, 0x4, 0x5), msn=9, mulpdu=128)
    assert len(ulpdu) == 46 and ulpdu[:18] == untagged(Opcode.RDMA_READ_REQUEST, 1, msn=9)
    assert ulpdu[18:] == bytes.fromhex(
        "00000001 0000000000000002 00000003 00000004 0000000000000005"
    )


def test_ddp_03_reserved_bits_noted_not_checked() -> None:
    ulpdu = bytearray(ulpdu_of("E1"))
    ulpdu[0] |= 0x3C
    ulpdu[1] |= 0x30
    seg = decode_ulpdu(ulpdu)
    assert (seg.ddp_rsvd, seg.rdmap_rsvd) == (0x3C, 0x30)
    assert {f.rule for f in seg.findings} == {"DDP-03", "RDMAP-02"}
    assert not any(f.fatal for f in seg.findings)


# --------------------------------------------------------------------------------------
# Decode errors: rule IDs and Terminate causes
# --------------------------------------------------------------------------------------


def expect(
    exc_type: type[ProtocolError], rule: str, term: object, ulpdu: bytes, **kw: bool
) -> None:
    with pytest.raises(exc_type) as info:
        decode_ulpdu(ulpdu, **kw)
    assert info.value.rule == rule and info.value.term == term


def test_ddp_03_invalid_ddp_version_tagged_and_untagged() -> None:
    for dv in (0, 2, 3):
        t = bytearray(ulpdu_of("E2"))
        t[0] = (t[0] & 0xFC) | dv
        expect(DdpError, "DDP-03", TERM_DDP_T_INVALID_VERSION, bytes(t))
        u = bytearray(ulpdu_of("E1"))
        u[0] = (u[0] & 0xFC) | dv
        expect(DdpError, "DDP-03", TERM_DDP_U_INVALID_VERSION, bytes(u))


def test_ddp_01_too_short_for_ddp_header() -> None:
    for cut in (0, 1, 2, 13):
        expect(DecodeError, "DDP-01", TERM_DDP_CATASTROPHIC, ulpdu_of("E2")[:cut])
    expect(DecodeError, "DDP-01", TERM_DDP_CATASTROPHIC, ulpdu_of("E1")[:17])
    assert decode_ulpdu(ulpdu_of("E4")).payload.nbytes == 0  # 14 bytes is enough


def test_ddp_10_invalid_queue_number() -> None:
    expect(DdpError, "DDP-10", TERM_DDP_U_INVALID_QN, untagged(Opcode.SEND, qn=4))
    expect(DdpError, "DDP-10", TERM_DDP_U_INVALID_QN, untagged(Opcode.SEND, qn=0xFFFFFFFF))
    atomic_resp = untagged(Opcode.ATOMIC_RESPONSE, 3, body=bytes(12))
    expect(DdpError, "DDP-10", TERM_DDP_U_INVALID_QN, atomic_resp, rfc7306=False)


@pytest.mark.parametrize(
    ("opcode", "qn", "body"),
    [
        (Opcode.SEND, 1, b""),
        (Opcode.RDMA_READ_REQUEST, 0, RR_BODY),
        (Opcode.TERMINATE, 0, bytes(4)),
        (Opcode.IMMEDIATE_DATA, 1, bytes(8)),
        (Opcode.ATOMIC_REQUEST, 3, bytes(52)),
        (Opcode.ATOMIC_RESPONSE, 1, bytes(12)),
    ],
)
def test_rdmap_01_queue_must_match_opcode(opcode: int, qn: int, body: bytes) -> None:
    expect(DdpError, "RDMAP-01", TERM_DDP_U_INVALID_QN, untagged(opcode, qn, body=body))


def test_rdmap_02_invalid_rdmap_version() -> None:
    for rv in (0, 2, 3):
        for base in ("E1", "E2", "E3"):
            u = bytearray(ulpdu_of(base))
            u[1] = (u[1] & 0x3F) | (rv << 6)
            expect(RdmapError, "RDMAP-02", TERM_RDMAP_INVALID_VERSION, bytes(u))


def test_rdmap_16_unassigned_opcodes() -> None:
    for op in range(0xC, 0x10):
        expect(RdmapError, "RDMAP-16", TERM_RDMAP_UNEXPECTED_OPCODE, untagged(op, 0))
        expect(RdmapError, "RDMAP-16", TERM_RDMAP_UNEXPECTED_OPCODE, tagged(op))


def test_ext_01_rfc7306_opcodes_need_rfc7306() -> None:
    for name in ("E7", "E9"):
        expect(RdmapError, "EXT-01", TERM_RDMAP_UNEXPECTED_OPCODE, ulpdu_of(name), rfc7306=False)
        assert decode_ulpdu(ulpdu_of(name), rfc7306=True).header is not None
    # QN 3 does not exist without RFC 7306: DDP rejects it before RDMAP sees the opcode.
    expect(DdpError, "DDP-10", TERM_DDP_U_INVALID_QN, ulpdu_of("E8"), rfc7306=False)
    imm_se = untagged(Opcode.IMMEDIATE_DATA_SE, 0, body=bytes(8))
    expect(RdmapError, "EXT-01", TERM_RDMAP_UNEXPECTED_OPCODE, imm_se, rfc7306=False)


def test_rdmap_02_t_bit_must_match_opcode() -> None:
    expect(RdmapError, "RDMAP-02", TERM_RDMAP_UNEXPECTED_OPCODE, tagged(Opcode.SEND))
    expect(RdmapError, "RDMAP-02", TERM_RDMAP_UNEXPECTED_OPCODE, tagged(Opcode.TERMINATE))
    expect(RdmapError, "RDMAP-02", TERM_RDMAP_UNEXPECTED_OPCODE, untagged(Opcode.RDMA_WRITE, 0))
    rresp = untagged(Opcode.RDMA_READ_RESPONSE, 0)
    expect(RdmapError, "RDMAP-02", TERM_RDMAP_UNEXPECTED_OPCODE, rresp)


def test_rdmap_04_read_request_length_and_single_segment() -> None:
    rr = Opcode.RDMA_READ_REQUEST
    expect(DecodeError, "RDMAP-04", TERM_RDMAP_OP_UNSPECIFIED, untagged(rr, 1, body=RR_BODY[:27]))
    long_rr = untagged(rr, 1, body=RR_BODY + b"x")
    expect(DdpError, "RDMAP-04", TERM_DDP_U_TOO_LONG, long_rr)
    not_last = untagged(rr, 1, last=False, body=RR_BODY)
    expect(RdmapError, "RDMAP-04", TERM_RDMAP_OP_UNSPECIFIED, not_last)
    expect(DdpError, "RDMAP-04", TERM_DDP_U_INVALID_MO, untagged(rr, 1, mo=28, body=RR_BODY))


@pytest.mark.parametrize("size", [0, 7, 9, 16])
def test_ext_09_immediate_data_exactly_8_bytes(size: int) -> None:
    for op in (Opcode.IMMEDIATE_DATA, Opcode.IMMEDIATE_DATA_SE):
        ulpdu = untagged(op, 0, body=bytes(size))
        expect(RdmapError, "EXT-09", TERM_RDMAP_OP_UNSPECIFIED, ulpdu)
    with pytest.raises(LocalError):
        encode_message(ImmediateData(bytes(size)), msn=1, mulpdu=128)


def test_ext_02_atomic_request_layout_and_length() -> None:
    req = AtomicRequest.cmp_swap(7, 0x1234, 0x40, compare=5, swap=6, compare_mask=3, swap_mask=4)
    (ulpdu,) = encode_message(req, msn=3, mulpdu=128)
    assert len(ulpdu) == 70 and ulpdu[18:22] == b"\0\0\0\x02"
    assert decode_ulpdu(ulpdu).header == req
    expect(DecodeError, "EXT-02", TERM_RDMAP_OP_UNSPECIFIED, ulpdu[:-1])
    expect(DdpError, "EXT-02", TERM_DDP_U_TOO_LONG, ulpdu + b"\0")
    # Reserved bits of the AOpCode word are ignored (noted); unknown AOpCodes decode as-is.
    odd = bytearray(ulpdu)
    odd[18:22] = b"\xff\x00\x00\x05"
    seg = decode_ulpdu(odd)
    assert isinstance(seg.header, AtomicRequest) and seg.header.atomic_opcode == 5
    assert [(f.rule, f.fatal) for f in seg.findings] == [("EXT-02", False)]


def test_ext_03_atomic_response_layout_and_length() -> None:
    (ulpdu,) = encode_message(AtomicResponse(1, ALL_ONES_64), msn=4, mulpdu=128)
    assert len(ulpdu) == 30 and decode_ulpdu(ulpdu).qn == 3
    expect(DecodeError, "EXT-03", TERM_RDMAP_OP_UNSPECIFIED, ulpdu[:-2])
    expect(DdpError, "EXT-03", TERM_DDP_U_TOO_LONG, ulpdu + b"\0\0")


def test_rdmap_11_terminate_too_short_and_single_segment() -> None:
    t = Opcode.TERMINATE
    expect(DecodeError, "RDMAP-11", TERM_RDMAP_OP_UNSPECIFIED, untagged(t, 2, body=bytes(3)))
    expect(
        RdmapError, "RDMAP-11", TERM_RDMAP_OP_UNSPECIFIED, untagged(t, 2, last=False, body=bytes(4))
    )
    expect(DdpError, "RDMAP-11", TERM_DDP_U_INVALID_MO, untagged(t, 2, mo=4, body=bytes(4)))


# --------------------------------------------------------------------------------------
# Lenient mode
# --------------------------------------------------------------------------------------


def test_lenient_mode_reports_every_violation() -> None:
    u = bytearray(untagged(0xD, 9, body=b"payload"))
    u[0] = (u[0] & 0xFC) | 2  # DV 2
    u[1] = (u[1] & 0x3F) | 0x80  # RV 2
    seg = decode_ulpdu(u, strict=False)
    assert isinstance(seg, Segment)
    assert [(f.rule, f.term) for f in seg.findings] == [
        ("DDP-03", TERM_DDP_U_INVALID_VERSION),
        ("DDP-10", TERM_DDP_U_INVALID_QN),
        ("RDMAP-02", TERM_RDMAP_INVALID_VERSION),
        ("RDMAP-16", TERM_RDMAP_UNEXPECTED_OPCODE),
    ]
    assert all(f.fatal for f in seg.findings)
    assert (seg.ddp_version, seg.rdmap_version, seg.opcode, seg.qn) == (2, 2, 0xD, 9)
    assert bytes(seg.payload) == b"payload" and seg.opcode_name == "Unknown opcode 0xD"


def test_lenient_mode_truncated_rdmap_header() -> None:
    seg = decode_ulpdu(untagged(Opcode.RDMA_READ_REQUEST, 1, body=RR_BODY[:10]), strict=False)
    assert seg.header is None and bytes(seg.payload) == RR_BODY[:10]
    assert [f.rule for f in seg.findings] == ["RDMAP-04"]
    long_seg = decode_ulpdu(untagged(Opcode.ATOMIC_RESPONSE, 3, body=bytes(14)), strict=False)
    assert long_seg.header == AtomicResponse(0, 0) and bytes(long_seg.payload) == b"\0\0"
    assert [f.term for f in long_seg.findings] == [TERM_DDP_U_TOO_LONG]


def test_lenient_mode_still_needs_a_ddp_header() -> None:
    with pytest.raises(DecodeError):
        decode_ulpdu(ulpdu_of("E1")[:10], strict=False)


# --------------------------------------------------------------------------------------
# Terminate codec, siw layout, build_terminate (RDMAP-11, RDMAP-12)
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "term",
    [
        Terminate(0, 0, 0),
        Terminate(2, 0, 2),
        Terminate(1, 1, 1, m=True, d=True, ddp_seg_len=22, ddp_header=ulpdu_of("E2")[:14]),
        Terminate(0, 1, 0, True, True, True, 46, ulpdu_of("E3")[:18], ulpdu_of("E3")[18:]),
        Terminate(0, 1, 9, m=True, d=True, r=True, ddp_seg_len=31, ddp_header=SEND_MSN7[:18]),
        Terminate(0, 2, 0xFF, r=True),
    ],
)
def test_rdmap_11_terminate_round_trip(term: Terminate) -> None:
    body = encode_terminate(term)
    assert decode_terminate(body) == term
    (ulpdu,) = encode_message(term, msn=1, mulpdu=128)
    seg = decode_ulpdu(ulpdu)
    assert seg.header == term and seg.payload.nbytes == 0


def test_rdmap_11_copied_header_length_follows_copied_t_bit() -> None:
    # Tagged copy (14 B) although the EType is RDMAP protection, and untagged copy (18 B).
    t = decode_terminate(encode_terminate(build_terminate(TERM_DDP_T_BASE_BOUNDS, ulpdu_of("E2"))))
    assert len(t.ddp_header) == 14 and t.ddp_seg_len == 22
    body = bytes.fromhex("01000000") + b"\x00\x1f" + SEND_MSN7[:18]
    body = body[:2] + b"\xc0" + body[3:]
    assert len(decode_terminate(body).ddp_header) == 18


def test_rdmap_11_terminate_bounded_by_length() -> None:
    # R set but no 28-byte block (siw's habit for Send protection errors): accepted, noted.
    body = bytes.fromhex("0109e000") + b"\x00\x1f" + SEND_MSN7[:18]
    (ulpdu,) = encode_message(Terminate(0, 0, 0), msn=1, mulpdu=128)
    seg = decode_ulpdu(ulpdu[:18] + body)
    t = seg.header
    assert isinstance(t, Terminate) and t.cause == TERM_RDMAP_PROT_CANNOT_INVALIDATE
    assert (t.m, t.d, t.r, t.rdma_header, len(t.ddp_header)) == (True, True, True, b"", 18)
    assert [(f.rule, f.fatal) for f in seg.findings] == [("RDMAP-11", False)]
    # D set but nothing follows: accepted with empty header.
    t2 = decode_terminate(bytes.fromhex("12034000"))
    assert t2.d and t2.ddp_header == b"" and t2.ddp_seg_len == 0
    # Extra bytes after the headers are reported as payload, not an error.
    seg3 = decode_ulpdu(ulpdu + b"zz")
    assert bytes(seg3.payload) == b"zz" and seg3.findings[0].rule == "RDMAP-11"
    with pytest.raises(DecodeError):
        decode_terminate(b"\x12\x03\xc0")


def test_rdmap_11_siw_swapped_terminate_worked_example() -> None:
    # Digest §10.2 item 8: layer 1 etype 2 code 3 M=D=1 as laid out by siw on x86-64.
    t = decode_terminate(bytes.fromhex("21030300"))
    assert t.siw_swapped and t.cause == TERM_DDP_U_MSN_RANGE and (t.m, t.d, t.r) == (1, 1, 0)
    rfc = decode_terminate(bytes.fromhex("1203c000"))
    assert not rfc.siw_swapped and rfc.cause == t.cause and (rfc.m, rfc.d) == (True, True)
    # With siw's segment length and copied header following, inside a full ULPDU.
    body = bytes.fromhex("21030300") + b"\x00\x0d" + SEND_MSN7[:18]
    seg = decode_ulpdu(ulpdu_of("E5")[:18] + body)
    assert isinstance(seg.header, Terminate) and seg.header.siw_swapped
    assert seg.header.ddp_header == SEND_MSN7[:18] and seg.header.ddp_seg_len == 13
    assert any(f.rule == "RDMAP-11" and "siw" in f.detail for f in seg.findings)


def test_rdmap_11_siw_layout_heuristic_without_flags() -> None:
    # No flags: the RFC reading wins unless its (layer, etype) pair does not exist.
    assert decode_terminate(bytes.fromhex("20060000")).cause == (2, 0, 6)
    assert not decode_terminate(bytes.fromhex("20060000")).siw_swapped
    swapped = decode_terminate(bytes.fromhex("21010000"))  # RFC: LLP etype 1 (no such)
    assert swapped.siw_swapped and swapped.cause == (1, 2, 1)
    # The caller's hint decides ambiguous words either way.
    assert decode_terminate(bytes.fromhex("20060000"), siw_layout=True).cause == (0, 2, 6)
    hinted = decode_terminate(bytes.fromhex("21030300"), siw_layout=False)
    assert not hinted.siw_swapped and hinted.cause == (2, 1, 3)
    # RFC flag positions are never mistaken for siw's.
    assert not decode_terminate(bytes.fromhex("0206e000")).siw_swapped


def test_rdmap_11_siw_crc_error_is_read_in_siw_layout() -> None:
    """siw's Terminate for an MPA CRC error, 02 02 00 00 on the wire (an LLP error carries
    no M/D/R flags): both nibble orders name an existing (layer, etype), but RFC 5040
    defines no RDMAP Remote Operation code 0x02, so the word is siw's 2/0/0x02."""
    siw_crc = decode_terminate(bytes.fromhex("02020000"))
    assert siw_crc.siw_swapped and siw_crc.cause == TERM_LLP_CRC_ERROR
    # Where the RFC reading names a defined error, it still wins.
    rfc = decode_terminate(bytes.fromhex("02060000"))  # RDMAP Remote Operation 0x06
    assert not rfc.siw_swapped and rfc.cause == (0, 2, 6)
    assert decode_terminate(bytes.fromhex("20020000")).cause == TERM_LLP_CRC_ERROR
    assert not decode_terminate(bytes.fromhex("20020000")).siw_swapped
    assert decode_terminate(bytes.fromhex("01020000")).cause == (0, 1, 2)


def test_rdmap_12_header_inclusion_table() -> None:
    send_inv = encode_message(Send(b"abc", invalidate_stag=5), msn=1, mulpdu=128)[0]
    atomic = ulpdu_of("E7")
    cases = [
        (TERM_RDMAP_CATASTROPHIC, ulpdu_of("E3"), (False, False, False)),
        (TERM_LLP_CRC_ERROR, ulpdu_of("E1"), (False, False, False)),
        (TERM_DDP_CATASTROPHIC, ulpdu_of("E1"), (False, False, False)),
        (TERM_DDP_T_BASE_BOUNDS, ulpdu_of("E2"), (True, True, False)),
        (TERM_RDMAP_INVALID_VERSION, ulpdu_of("E3"), (True, True, False)),  # no R for 0/2
        (TERM_RDMAP_PROT_CANNOT_INVALIDATE, send_inv, (True, True, False)),  # §5.4 conflict
        (TERM_RDMAP_INVALID_STAG, atomic, (True, True, False)),  # EXT-11: no R for atomics
        (TERM_RDMAP_CATASTROPHIC_STREAM, atomic, (True, True, False)),
        (TERM_RDMAP_INVALID_STAG, None, (False, False, False)),  # §7.1 case 1
        (TERM_DDP_U_INVALID_QN, ulpdu_of("E1")[:10], (False, False, False)),  # no full header
    ]
    for cause, offending, flags in cases:
        t = build_terminate(cause, offending)
        assert t.cause == cause
        assert (t.m, t.d, t.r) == flags, cause
        if t.d:
            assert offending is not None and t.ddp_seg_len == len(offending)
            assert t.ddp_header == offending[: len(t.ddp_header)]
        else:
            assert t.ddp_header == b"" and t.ddp_seg_len == 0
        encode_message(t, msn=1, mulpdu=128)  # always encodable


def test_rdmap_12_partly_served_read_adjusts_rdma_header() -> None:
    t = build_terminate(TERM_RDMAP_INVALID_STAG, ulpdu_of("E3"), read_progress=0x400)
    assert struct.unpack(">IQIIQ", t.rdma_header) == (
        0x11223344,
        0x2400,
        0xC00,
        0x55667788,
        0x3400,
    )
    over = build_terminate(TERM_RDMAP_INVALID_STAG, ulpdu_of("E3"), read_progress=1 << 40)
    assert struct.unpack(">IQIIQ", over.rdma_header)[2] == 0


def test_terminate_for_falls_back_to_local_catastrophic() -> None:
    assert terminate_for(None) == TERM_RDMAP_CATASTROPHIC
    assert terminate_for(DdpError("DDP-05", "x", TERM_DDP_U_MSN_RANGE)) == TERM_DDP_U_MSN_RANGE
    assert terminate_for(RdmapError("RDMAP-10", "x")) == TERM_RDMAP_CATASTROPHIC


# --------------------------------------------------------------------------------------
# Encoder argument checks
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "msg",
    [
        RdmaWrite(1 << 32, 0, b""),
        RdmaWrite(1, -1, b""),
        Send(b"", invalidate_stag=1 << 32),
        ReadRequest(1, 2, 1 << 32, 4, 5),
        AtomicRequest(16, 1, 2, 3, 4),
        AtomicRequest(AtomicOpcode.FETCH_ADD, 1, 2, 3, 1 << 64),
        AtomicResponse(1, -1),
        Terminate(16, 0, 0),
        Terminate(1, 2, 3, d=True, ddp_header=b"short"),
        Terminate(1, 2, 3, ddp_header=bytes(18)),
        Terminate(0, 1, 0, r=False, rdma_header=bytes(28)),
        "not a message",
    ],
)
def test_encode_message_rejects_bad_fields(msg: object) -> None:
    with pytest.raises(LocalError):
        encode_message(msg, msn=1, mulpdu=128)  # type: ignore[arg-type]


@pytest.mark.parametrize("mulpdu", [0, 127, 64769])
def test_mpa_02_mulpdu_range(mulpdu: int) -> None:
    with pytest.raises(LocalError):
        encode_message(Send(b"x"), msn=1, mulpdu=mulpdu)


def test_encode_message_msn_none_means_first() -> None:
    assert encode_message(Send(b"x"), msn=None, mulpdu=128) == encode_message(
        Send(b"x"), msn=1, mulpdu=128
    )
    with pytest.raises(LocalError):
        encode_message(Send(b"x"), msn=1 << 32, mulpdu=128)
