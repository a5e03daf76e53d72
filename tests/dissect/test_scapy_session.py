"""Scapy users' habits on the reference captures: bind_iwarp, TCPSession reassembly
(stack.dissect.scapy.session), decoder records as packets (stack.dissect.scapy.records),
FpduSplitter across segments, lenient dissection with a verdict, and the README example."""

from __future__ import annotations

import contextlib
import io
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from scapy.layers.inet import TCP
from scapy.packet import Packet, Raw
from scapy.sendrecv import sniff
from scapy.sessions import TCPSession
from scapy.utils import rdpcap

from stack.dissect.decoder import PduRecord, dissect
from stack.dissect.scapy import (
    MPA_FPDU,
    FpduSplitter,
    IWARP_Undecoded,
    MPA_FPDU_NoCRC,
    MPA_Frame,
    MPA_Reply,
    MPA_Request,
    RDMAP_Terminate,
    bind_iwarp,
    records_to_packets,
    split_fpdus,
    to_scapy,
    unbind_iwarp,
)
from stack.errors import DecodeError
from stack.pcap import read_tcp_segments
from stack.wire.events import Terminate

ROOT = Path(__file__).resolve().parents[2]
PCAPS = sorted((ROOT / "pcaps").glob("*.pcap"))
OPS = ROOT / "pcaps" / "ops-rev2-crc.pcap"
MARKERS = ROOT / "pcaps" / "markers-both.pcap"


def _records(path: Path) -> list[PduRecord]:
    return [r for r in dissect(read_tcp_segments(path)) if isinstance(r, PduRecord)]


def _port(path: Path) -> int:
    return int(rdpcap(str(path))[0][TCP].dport)  # the SYN's destination: the listener


@contextlib.contextmanager
def _bound(port: int) -> Iterator[None]:
    bind_iwarp(port)
    try:
        yield
    finally:
        unbind_iwarp(port)


def _own(pdu: Packet) -> Packet:
    """One PDU of a TCPSession chain, without the PDUs stacked after it."""
    own = pdu.copy()
    following = own.next_pdu()
    if following is not None:
        following.underlayer.remove_payload()
    return own


def _session_pdus(path: Path) -> list[Packet]:
    with _bound(_port(path)):
        packets = sniff(offline=str(path), session=TCPSession)
    out = []
    for pkt in packets:
        layer = pkt[TCP].payload if TCP in pkt else None
        while layer:
            if getattr(layer, "starts_pdu", False):
                out.append(_own(layer))
            layer = layer.payload
    return out


def _facts(pdu: Packet) -> tuple[object, ...]:
    if isinstance(pdu, MPA_Frame):
        return (type(pdu).__name__, bytes(pdu))
    markers = tuple(m.fpduptr for _, m in pdu.wire_markers)
    return (type(pdu).__name__, bytes(pdu), pdu.crc_ok(), markers)


# --------------------------------------------------------------------------------------
# bind_iwarp: TCP payloads on the bound port dissect as MPA, both directions
# --------------------------------------------------------------------------------------


def test_bind_iwarp_ties_the_layers_to_tcp_both_directions_and_unbinds() -> None:
    port = _port(OPS)
    assert type(rdpcap(str(OPS))[3][TCP].payload) is Raw
    with _bound(port):
        packets = rdpcap(str(OPS))
        assert isinstance(packets[3][TCP].payload, MPA_Request)  # to the port
        assert isinstance(packets[4][TCP].payload, MPA_Reply)  # from the port
        assert packets[4][TCP].sport == port
        assert MPA_FPDU in packets[5] and packets[5][MPA_FPDU].crc_ok() is True
    assert type(rdpcap(str(OPS))[3][TCP].payload) is Raw


# --------------------------------------------------------------------------------------
# TCPSession: the same PDUs, verdicts and markers as the capture decoder
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("path", PCAPS, ids=lambda p: p.stem)
def test_tcp_session_gives_every_pdu_as_the_decoder_does(path: Path) -> None:
    records = _records(path)
    got = _session_pdus(path)
    assert [_facts(p) for p in got] == [_facts(to_scapy(r)) for r in records]
    fpdus = [(p, r) for p, r in zip(got, records, strict=True) if r.kind == "fpdu"]
    assert fpdus or "reject" in path.stem
    for pdu, record in fpdus:
        assert pdu.crc_ok() is record.crc_ok  # None when CRC is off
        assert [m.fpduptr for _, m in pdu.wire_markers] == list(record.marker_ptrs)
        assert isinstance(pdu, MPA_FPDU_NoCRC) is (record.crc_ok is None)
        assert pdu.iwarp_error is None


def test_tcp_session_on_marked_streams_removes_markers_and_checks_the_wire_crc() -> None:
    got = [p for p in _session_pdus(MARKERS) if isinstance(p, MPA_FPDU)]
    marked = [p for p in got if p.wire_markers]
    assert marked and all(p.crc_ok() is True for p in got)
    # the marker-free FPDU alone fails: its CRC covers the markers it held (MPA-12)
    assert all(MPA_FPDU(bytes(p)).crc_ok() is False for p in marked)
    assert "markers=" in marked[0].mysummary()


def test_tcp_session_leaves_a_rejected_connection_after_its_reply_raw() -> None:
    got = _session_pdus(ROOT / "pcaps" / "reject.pcap")
    assert [type(p) for p in got] == [MPA_Request, MPA_Reply]
    assert got[1].reject == 1


# --------------------------------------------------------------------------------------
# Records to packets
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["ops-rev2-crc", "markers-both", "rev2-nocrc"])
def test_records_to_packets_gives_the_layered_packet_of_every_pdu(name: str) -> None:
    path = ROOT / "pcaps" / f"{name}.pcap"
    records = _records(path)
    packets = records_to_packets(path)
    assert len(packets) == len(records) >= 4
    for pkt, record in zip(packets, records, strict=True):
        if record.kind == "fpdu":
            assert pkt.ulpdu_length == record.ulpdu_len and pkt.crc_ok() is record.crc_ok
            assert record.segment is not None
            assert pkt.payload.opcode == record.segment.opcode
            assert bytes(pkt.payload) == bytes(record.ulpdu)
        else:
            assert isinstance(pkt, MPA_Request if record.kind == "mpa_req" else MPA_Reply)


@pytest.mark.parametrize("path", [p for p in PCAPS if p.stem.startswith("term-")], ids=str)
def test_records_to_packets_terminates_carry_the_decoded_cause(path: Path) -> None:
    terms = [p for p in records_to_packets(path) if RDMAP_Terminate in p]
    decoded = [r for r in _records(path) if r.segment is not None and r.segment.opcode == 7]
    assert len(terms) == len(decoded) == 1
    segment = decoded[0].segment
    assert segment is not None
    header = segment.header
    assert isinstance(header, Terminate)
    term = terms[0][RDMAP_Terminate]
    assert (term.layer, term.etype, term.code) == (header.layer, header.etype, header.code)


def test_to_scapy_refuses_what_is_not_a_pdu() -> None:
    record = _records(OPS)[0]
    record.kind = "gap"
    with pytest.raises(ValueError, match="not a PDU"):
        to_scapy(record)


# --------------------------------------------------------------------------------------
# Segments ending mid-FPDU: truncation is visible; FpduSplitter completes it
# --------------------------------------------------------------------------------------


def _payloads(path: Path, port: int, *, to_port: bool) -> list[bytes]:
    key = "dport" if to_port else "sport"
    return [
        bytes(p[TCP].payload)
        for p in rdpcap(str(path))
        if TCP in p and getattr(p[TCP], key) == port and p[TCP].payload
    ]


def test_split_fpdus_says_when_a_segment_ends_mid_fpdu() -> None:
    segments = _payloads(OPS, _port(OPS), to_port=True)
    first = segments[1]  # after the Request: two Sends and the start of a Write
    *whole, cut = split_fpdus(first)
    assert [p.crc_ok() for p in whole] == [True, True]
    assert cut.is_truncated() and cut.missing_bytes() > 0 and cut.crc_ok() is False
    assert "TRUNCATED" in cut.summary()
    shown = cut.show(dump=True)
    assert shown is not None and "truncated" in shown
    assert cut.iwarp_error.startswith("MPA-16")
    with pytest.raises(DecodeError, match="MPA-16"):
        MPA_FPDU.strict(bytes(cut))
    # the next segment alone starts mid-FPDU: without the partial one it decodes as garbage
    assert split_fpdus(segments[2])[0].crc_ok() is not True


@pytest.mark.parametrize(("path", "markers"), [(OPS, False), (MARKERS, True)])
def test_fpdu_splitter_keeps_the_partial_fpdu_across_segments(path: Path, markers: bool) -> None:
    port = _port(path)
    expect = [r for r in _records(path) if r.kind == "fpdu" and r.direction == "i2r"]
    splitter = FpduSplitter(crc=True, markers=markers)
    got: list[Packet] = []
    for data in _payloads(path, port, to_port=True)[1:]:  # after the MPA Request
        got += splitter.feed(data)
    assert splitter.pending == 0 and splitter.flush() == []
    assert [p.ulpdu_length for p in got] == [r.ulpdu_len for r in expect]
    assert [p.crc_ok() for p in got] == [True] * len(expect)
    assert [[m.fpduptr for _, m in p.wire_markers] for p in got] == [
        list(r.marker_ptrs) for r in expect
    ]
    assert any(p.wire_markers for p in got) is markers


def test_fpdu_splitter_flush_gives_the_partial_fpdu_as_truncated() -> None:
    data = _payloads(OPS, _port(OPS), to_port=True)[1]
    splitter = FpduSplitter()
    assert len(splitter.feed(data)) == 2 and splitter.pending > 0
    [cut] = splitter.flush()
    assert cut.is_truncated() and "TRUNCATED" in cut.summary()
    assert splitter.pending == 0 and splitter.offset == len(data)


# --------------------------------------------------------------------------------------
# Lenient dissection of garbage: the verdict instead of an exception
# --------------------------------------------------------------------------------------


def test_garbage_decodes_what_it_can_with_the_verdict() -> None:
    pkt = MPA_FPDU(b"\x00")
    assert pkt.iwarp_error is not None and pkt.iwarp_error.startswith("MPA-16")
    assert pkt[IWARP_Undecoded].load == b"\x00" and bytes(pkt) == b"\x00"
    shown = pkt.show(dump=True)
    assert shown is not None and "iwarp_error" in shown
    with pytest.raises(DecodeError):
        MPA_FPDU.strict(b"\x00")
    # a real FPDU whose ULPDU stops inside the DDP header: the header part is Undecoded
    real = bytes(records_to_packets(OPS)[2])
    head = real[:2] + real[2:9]
    pkt = MPA_FPDU(head)
    assert pkt.is_truncated() and pkt[IWARP_Undecoded].load == real[2:9]
    assert "DDP-10" in pkt[IWARP_Undecoded].iwarp_error
    assert MPA_FPDU.strict(real).iwarp_error is None


# --------------------------------------------------------------------------------------
# The README's Scapy example runs as written
# --------------------------------------------------------------------------------------


def _readme_example() -> str:
    text = (ROOT / "README.md").read_text()
    code = text.split("# scapy-readme-example\n", 1)[1].split("```", 1)[0]
    assert "bind_iwarp" in code and "TCPSession" in code and "wrpcap" in code
    return code


def test_readme_scapy_example_runs_and_prints_what_it_says(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    code = _readme_example()
    expected = code.strip().splitlines()[-1].removeprefix("# ")
    monkeypatch.chdir(tmp_path)
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out):
            exec(compile(code, "README.md Scapy example", "exec"), {})
    finally:
        unbind_iwarp(7174)
    assert out.getvalue().strip() == expected == "False 0xabcdef b'payload' True"
    assert (tmp_path / "bad.pcap").stat().st_size > 0
    shutil.rmtree(tmp_path, ignore_errors=True)
