"""Crafting helpers (stack.dissect.scapy.crafting): whole FPDUs, byte-exact and equal to the
wire encoder's (stack.wire.rdmap, stack.wire.framing); Terminates follow RFC 5040 Fig. 10."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scapy.layers.inet import IP, TCP
from scapy.layers.l2 import Ether
from scapy.packet import Packet, Raw
from scapy.utils import rdpcap, wrpcap

from stack.constants import (
    MULPDU_MAX,
    AtomicOpcode,
    Opcode,
)
from stack.dissect.scapy import (
    DDP,
    MPA_FPDU,
    MPA_Frame,
    MPA_Request,
    RDMAP_AtomicRequest,
    RDMAP_ReadResponse,
    RDMAP_Terminate,
    atomic_fetch_add_fpdu,
    atomic_response_fpdu,
    immediate_data_fpdu,
    read_request_fpdu,
    read_response_fpdu,
    send_fpdu,
    terminate_fpdu,
    write_fpdu,
)
from stack.wire import events, framing, rdmap
from tests.dissect.scapy_vectors import (
    FRAMES,
    HELLO,
    E,
    e5_offending,
    u32,
    u64,
)

# --------------------------------------------------------------------------------------
# Constructors: byte-exact, segments, Fig. 10 defaults, pcap round trip
# --------------------------------------------------------------------------------------

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


@pytest.mark.parametrize("name", sorted(CONVENIENT))
def test_mpa_01_mpa_12_examples_build_byte_exact_from_constructors(name: str) -> None:
    assert bytes(CONVENIENT[name]()) == E[name]


def test_ddp_02_read_response_and_non_last_segments() -> None:
    pkt = MPA_FPDU(bytes(read_response_fpdu(7, 0x100, b"abcd", last=False)))
    assert (pkt.tagged, pkt.last, pkt.opcode) == (1, 0, Opcode.RDMA_READ_RESPONSE)
    assert pkt.haslayer(RDMAP_ReadResponse) and pkt[Raw].load == b"abcd"
    pkt = MPA_FPDU(bytes(send_fpdu(b"z" * 5, msn=9, mo=1482, last=False)))
    assert (pkt.last, pkt.msn, pkt.mo, pkt.ulpdu_length, len(pkt.pad)) == (0, 9, 1482, 23, 3)


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


# --------------------------------------------------------------------------------------
# Cross-check with the wire core (stack.wire.rdmap encode_message / decode_ulpdu)
# --------------------------------------------------------------------------------------


def messages() -> st.SearchStrategy[events.RdmapMessage]:
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


def scapy_for(msg: events.RdmapMessage, msn: int) -> Packet:
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
def test_rdmap_02_cross_check_wire_encoder_and_layers_agree(
    msg: events.RdmapMessage, msn: int
) -> None:
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
