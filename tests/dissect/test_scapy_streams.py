"""FPDU streams and markers (stack.dissect.scapy.streams): worked marked streams, CRCs
covering markers (MPA-12), and agreement with the wire framer (stack.wire.framing)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from scapy.packet import Packet, Padding, Raw

from stack.crc import crc32c
from stack.dissect.scapy import (
    MPA_FPDU,
    DDP_Tagged,
    insert_markers,
    send_fpdu,
    split_fpdus,
    split_marked_fpdus,
    strip_markers,
)
from tests.dissect.scapy_vectors import (
    E,
)

# --------------------------------------------------------------------------------------
# Markers (MPA-06..10): worked streams and cross-check with the wire framer
# --------------------------------------------------------------------------------------


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
# Back-to-back FPDUs; random streams never crash
# --------------------------------------------------------------------------------------


def test_mpa_15_split_fpdus_and_padding_holds_the_next_fpdu() -> None:
    stream = b"".join(E[f"E{i}"] for i in range(1, 10))
    got = split_fpdus(stream)
    assert [bytes(p) for p in got] == [E[f"E{i}"] for i in range(1, 10)]
    first = MPA_FPDU(stream)
    assert first[Padding].load == stream[len(E["E1"]) :]
    assert bytes(first) == stream


@settings(max_examples=60, deadline=None)
@given(data=st.binary(max_size=1200), offset=st.integers(0, 511))
def test_mpa_10_marker_helpers_never_crash_on_random_streams(data: bytes, offset: int) -> None:
    clean, markers = strip_markers(data, offset)
    assert len(clean) + 4 * len(markers) <= len(data)
    for item in split_marked_fpdus(data, offset):
        assert item.crc_ok in (True, False)
    insert_markers(data, offset)
