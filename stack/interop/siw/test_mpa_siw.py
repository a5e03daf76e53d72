"""MPA startup between Linux siw in the guest and our sans-IO engine on the host.

Guest active: ``rping -c`` in the guest connects to our responder listening on the host's
127.0.0.1 (10.0.2.2 in the guest).  Guest passive: ``rping -s`` in the guest, our initiator
connects through a hostfwd.  Each case asserts the negotiated values, goes one message past
the handshake (so siw's CRC and ours are checked against each other), and decodes the
guest's capture with our dissector.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from stack.constants import Opcode, RtrType
from stack.interop.helpers import (
    RPING_INFO,
    SIW_PASSIVE_FIRST_FPDU_DELAY,
    MpaSocketPeer,
    assert_clean_capture,
    connect_local,
    listen_local,
    rping_info_send,
)
from stack.siwvm import HOST_ADDR, SiwVM
from stack.wire.events import (
    CrcPolicy,
    Established,
    IrdOrd,
    MpaEvent,
    MpaSettings,
    Negotiated,
    PeerClosed,
    RdmaWrite,
    ReadRequest,
    Rejected,
    RequestReceived,
)
from stack.wire.rdmap import Segment, encode_message

pytestmark = pytest.mark.interop

GUEST_RPING_PORT = 7174
RPING_IRD_ORD = IrdOrd(ird=1, ord=1, p2p=False, rtr=RtrType.NONE)
"""What rping (responder_resources = initiator_depth = 1) puts in siw's IRD/ORD word."""


def _siw_active_to_our_responder(
    vm: SiwVM, case: str, settings: MpaSettings, segments: int = 1
) -> tuple[RequestReceived, MpaSocketPeer, tuple[Negotiated, Segment, Path]]:
    """Guest rping client -> our responder: the Request, the peer, and (negotiated values,
    siw's first FPDU, the capture); ``segments`` FPDUs are read (all in ``peer.segments``)."""
    srv, port = listen_local()
    with srv, vm.capture(case, ports=(port,)) as pcap:
        client = vm.run(f"rping -c -a {HOST_ADDR} -p {port} -C 1 -v", background=True, timeout=20)
        sock, _ = srv.accept()
        with sock:
            peer = MpaSocketPeer.responder(sock, settings)
            request = peer.expect(RequestReceived)
            assert isinstance(request, RequestReceived)
            negotiated = peer.accept()
            received = [peer.receive_segment() for _ in range(segments)]
        client.stop()
    peer.segments = received
    return request, peer, (negotiated, received[0], pcap)


def _check_rping_first_send(first: object) -> None:
    assert isinstance(first, Segment)
    assert first.opcode == Opcode.SEND and first.last and not first.tagged
    assert (first.qn, first.msn, first.mo) == (0, 1, 0)
    assert len(first.payload) == RPING_INFO.size
    _buf, _rkey, size = RPING_INFO.unpack(first.payload)
    assert size > 0


def test_mpa_18_erc_03_siw_active_rev2_defaults(vm: SiwVM, case: str) -> None:
    """siw's default Request: rev 2, E (enhanced), C=0, IRD/ORD 1/1; we answer without CRC."""
    request, _peer, (negotiated, first, pcap) = _siw_active_to_our_responder(
        vm, case, MpaSettings(crc=CrcPolicy.OFF)
    )
    frame = request.frame
    assert (frame.rev, frame.crc, frame.markers, frame.reject) == (2, False, False, False)
    assert frame.ird_ord == RPING_IRD_ORD
    assert frame.private_data == b""  # rping sends no ULP private data
    assert negotiated.rev == 2 and negotiated.crc is False
    assert not negotiated.markers_rx and not negotiated.markers_tx
    assert (negotiated.peer_ird, negotiated.peer_ord) == (1, 1)
    assert negotiated.p2p is False and negotiated.rtr == RtrType.NONE
    _check_rping_first_send(first)
    decode = assert_clean_capture(pcap)
    assert Opcode.SEND in decode.opcodes()


def test_mpa_11_siw_active_crc_required(vm: SiwVM, case: str) -> None:
    """siw with mpa_crc_required sends C=1; our Reply with C=1: CRC both ways (MPA-11/12)."""
    vm.set_siw(crc_required=True)
    request, _peer, (negotiated, first, pcap) = _siw_active_to_our_responder(
        vm, case, MpaSettings(crc=CrcPolicy.REQUEST)
    )
    assert request.frame.crc is True and request.frame.rev == 2
    assert negotiated.crc is True
    _check_rping_first_send(first)  # its CRC passed our check (MPA-12)
    decode = assert_clean_capture(pcap)
    assert [r.crc_ok for r in decode.fpdus()] and all(r.crc_ok for r in decode.fpdus())


def test_mpa_11_crc_off_responder_echoes_c_for_siw_crc_required(vm: SiwVM, case: str) -> None:
    """siw quirk: with mpa_crc_required its active side drops a Reply with C=0.

    RFC 5044 makes CRC mandatory once either frame has C=1, so a Reply with C=0 would still
    mean CRC; siw instead closes TCP and rping reports a reject.  Our responder therefore
    echoes the Request's C=1 even when its own policy is OFF, and the connection works.
    """
    vm.set_siw(crc_required=True)
    request, _peer, (negotiated, first, pcap) = _siw_active_to_our_responder(
        vm, case, MpaSettings(crc=CrcPolicy.OFF)
    )
    assert request.frame.crc is True
    assert negotiated.crc is True and negotiated.local_frame.crc is True
    _check_rping_first_send(first)
    decode = assert_clean_capture(pcap)
    assert decode.fpdus() and all(r.crc_ok for r in decode.fpdus())


def test_mpa_11_our_responder_requests_crc_from_siw(vm: SiwVM, case: str) -> None:
    """siw sends C=0; our Reply sets C=1; siw must then send CRCs (MPA-11, MPA-12)."""
    request, _peer, (negotiated, first, pcap) = _siw_active_to_our_responder(
        vm, case, MpaSettings(crc=CrcPolicy.REQUEST)
    )
    assert request.frame.crc is False
    assert negotiated.crc is True
    _check_rping_first_send(first)
    decode = assert_clean_capture(pcap)
    assert all(r.crc_ok for r in decode.fpdus())


def _our_initiator_to_siw_passive(
    vm: SiwVM, case: str, settings: MpaSettings, answered: bool = True
) -> tuple[MpaSocketPeer, tuple[MpaEvent, object], Path]:
    """Our initiator -> guest rping server: the peer, (its startup event, siw's answer to our
    rping Send: a decoded Segment, or with ``answered=False`` the next MPA event) and the
    capture."""
    host_port = vm.hostfwd(GUEST_RPING_PORT)
    with vm.capture(case, ports=(GUEST_RPING_PORT,)) as pcap:
        server = vm.run(
            f"rping -s -a 0.0.0.0 -p {GUEST_RPING_PORT} -C 1 -v", background=True, timeout=20
        )
        vm.wait_listen(GUEST_RPING_PORT)
        with connect_local(host_port) as sock:
            peer = MpaSocketPeer.initiator(sock, settings)
            event = peer.next_event()
            reply_to_send: object = None
            if not isinstance(event, Rejected):
                time.sleep(SIW_PASSIVE_FIRST_FPDU_DELAY)  # siw passive race
                peer.send(rping_info_send(0x1000, 0x1234, 64, peer.conn.mulpdu))
                reply_to_send = peer.receive_segment() if answered else peer.next_event()
        server.stop()
    return peer, (event, reply_to_send), pcap


def test_mpa_22_erc_04_our_initiator_to_siw_passive_rev2_crc(vm: SiwVM, case: str) -> None:
    """Our rev-2 Request with C=1 and IRD/ORD 4/4: siw accepts, mirrors and clamps."""
    settings = MpaSettings(crc=CrcPolicy.REQUEST, ird=4, ord=4)
    peer, (event, answer), pcap = _our_initiator_to_siw_passive(vm, case, settings)
    assert isinstance(event, Established), event
    n = event.negotiated
    assert n.rev == 2 and n.crc is True and not n.p2p
    reply = n.peer_frame
    assert reply.reply and reply.crc and not reply.reject and reply.ird_ord is not None
    # siw answers rping's accept with IRD/ORD of at least 1 and at most what we offered.
    assert 1 <= reply.ird_ord.ird <= 4 and 1 <= reply.ird_ord.ord <= 4
    # After our Send of rping_rdma_info, the rping server reads our "buffer" (RDMA Read).
    assert isinstance(answer, Segment)
    assert answer.opcode == Opcode.RDMA_READ_REQUEST and answer.qn == 1 and answer.msn == 1
    header = answer.header
    assert isinstance(header, ReadRequest), header
    assert (header.src_stag, header.src_to, header.size) == (0x1234, 0x1000, 64)
    decode = assert_clean_capture(pcap)
    assert Opcode.RDMA_READ_REQUEST in decode.opcodes()
    assert all(r.crc_ok for r in decode.fpdus())
    assert peer.conn.negotiated == n


def test_mpa_11_our_initiator_without_crc(vm: SiwVM, case: str) -> None:
    """C=0 from both sides: no CRC; siw's Read Request arrives with a zero CRC field."""
    peer, (event, answer), pcap = _our_initiator_to_siw_passive(
        vm, case, MpaSettings(crc=CrcPolicy.OFF, ird=1, ord=1)
    )
    assert isinstance(event, Established), event
    assert event.negotiated.crc is False and event.negotiated.rev == 2
    assert isinstance(answer, Segment) and answer.opcode == Opcode.RDMA_READ_REQUEST
    decode = assert_clean_capture(pcap)
    assert all(r.crc_ok is None for r in decode.fpdus())


def test_mpa_23_siw_crc_strict_rejects_our_crc_request(vm: SiwVM, case: str) -> None:
    """siw with mpa_crc_strict (and crc_required N) refuses C=1: Reply with R=1 (MPA-23)."""
    vm.set_siw(crc_strict=True)
    _peer, (event, answer), pcap = _our_initiator_to_siw_passive(
        vm, case, MpaSettings(crc=CrcPolicy.REQUEST)
    )
    assert isinstance(event, Rejected), event
    assert event.frame.reject and event.frame.reply and event.frame.rev == 2
    assert answer is None
    decode = assert_clean_capture(pcap, allowed_notes=("trailing", "rejected"))
    reply = next(r for r in decode.records if r.kind == "mpa_rep")
    assert reply.mpa is not None and reply.mpa.reject


def _rtr_write(mulpdu: int) -> bytes:
    """A zero-length tagged RDMA Write: the RFC 6581 Write RTR (STag 0, TO 0)."""
    [ulpdu] = encode_message(RdmaWrite(stag=0, to=0, data=b""), msn=None, mulpdu=mulpdu)
    return ulpdu


def test_erc_07_erc_09_siw_active_p2p_sends_write_rtr(vm: SiwVM, case: str) -> None:
    """siw peer_to_peer: P2P with Write|Read RTR offered; we pick Write; its RTR comes first
    as a zero-length RDMA Write with STag 1 (siw quirk: Chelsio hardware refuses STag 0)."""
    vm.set_siw(p2p=True)
    settings = MpaSettings(crc=CrcPolicy.REQUEST, p2p=True, ird=1, ord=1)
    request, peer, (negotiated, first, pcap) = _siw_active_to_our_responder(
        vm, case, settings, segments=2
    )
    word = request.frame.ird_ord
    assert word is not None and word.p2p
    assert word.rtr & RtrType.WRITE and word.rtr & RtrType.READ
    assert negotiated.p2p and negotiated.rtr == RtrType.WRITE
    assert isinstance(first, Segment)
    assert first.tagged and first.opcode == Opcode.RDMA_WRITE and len(first.payload) == 0
    assert first.stag == 1 and first.last
    _check_rping_first_send(peer.segments[1])  # rping's Send follows the RTR
    assert_clean_capture(pcap)


def test_erc_09_our_p2p_initiator_write_rtr_to_siw_passive(vm: SiwVM, case: str) -> None:
    """Our P2P Request offering only the Write RTR: siw echoes P2P + Write, takes our RTR
    and then answers rping's Send with its Read Request."""
    settings = MpaSettings(crc=CrcPolicy.REQUEST, p2p=True, rtr=RtrType.WRITE, ird=1, ord=1)
    host_port = vm.hostfwd(GUEST_RPING_PORT)
    with vm.capture(case, ports=(GUEST_RPING_PORT,)) as pcap:
        server = vm.run(
            f"rping -s -a 0.0.0.0 -p {GUEST_RPING_PORT} -C 1 -v", background=True, timeout=20
        )
        vm.wait_listen(GUEST_RPING_PORT)
        with connect_local(host_port) as sock:
            peer = MpaSocketPeer.initiator(sock, settings)
            negotiated = peer.established()
            assert negotiated.p2p and negotiated.rtr == RtrType.WRITE
            reply_word = negotiated.peer_frame.ird_ord
            assert reply_word is not None and reply_word.p2p and reply_word.rtr == RtrType.WRITE
            time.sleep(SIW_PASSIVE_FIRST_FPDU_DELAY)
            mulpdu = peer.conn.mulpdu
            peer.send(_rtr_write(mulpdu), rping_info_send(0x1000, 0x1234, 64, mulpdu))
            answer = peer.receive_segment()
            assert answer.opcode == Opcode.RDMA_READ_REQUEST
        server.stop()
    decode = assert_clean_capture(pcap)
    assert decode.opcodes()[:2] == [Opcode.RDMA_WRITE, Opcode.SEND]


def test_mpa_20_our_rev1_request_to_siw(vm: SiwVM, case: str) -> None:
    """Rev 1 (RFC 5044 only): siw answers Rev 1 without the IRD/ORD word."""
    _peer, (event, answer), pcap = _our_initiator_to_siw_passive(
        vm, case, MpaSettings(rev=1, crc=CrcPolicy.REQUEST), answered=False
    )
    assert isinstance(event, Established), event
    n = event.negotiated
    assert n.rev == 1 and n.crc and n.peer_frame.ird_ord is None and n.peer_ird is None
    # with Rev 1 siw gives rping IRD/ORD 0, so its RDMA Read fails and it
    # closes instead of sending a Read Request.
    assert isinstance(answer, PeerClosed), answer
    decode = assert_clean_capture(pcap)
    assert Opcode.RDMA_READ_REQUEST not in decode.opcodes()


def test_mpa_09_siw_rejects_our_markers_request(vm: SiwVM, case: str) -> None:
    """siw implements no markers: a Request with M=1 gets a Reply with R=1 (RFC 5044 §4.3 says
    every sender must be able to), which our initiator reports as a rejection."""
    _peer, (event, answer), pcap = _our_initiator_to_siw_passive(
        vm, case, MpaSettings(rev=1, crc=CrcPolicy.REQUEST, want_markers=True)
    )
    assert isinstance(event, Rejected), event
    assert event.frame.reject and not event.frame.markers
    assert answer is None
    assert_clean_capture(pcap, allowed_notes=("trailing", "rejected"))


def test_mpa_21_our_private_data_reaches_siw(vm: SiwVM, case: str) -> None:
    """Rev 2 with 6 bytes of ULP private data after the IRD/ORD word: siw accepts."""
    host_port = vm.hostfwd(GUEST_RPING_PORT)
    with vm.capture(case, ports=(GUEST_RPING_PORT,)) as pcap:
        server = vm.run(
            f"rping -s -a 0.0.0.0 -p {GUEST_RPING_PORT} -C 1 -v", background=True, timeout=20
        )
        vm.wait_listen(GUEST_RPING_PORT)
        with connect_local(host_port) as sock:
            peer = MpaSocketPeer.initiator(
                sock,
                MpaSettings(crc=CrcPolicy.REQUEST, ird=1, ord=1),
                bytes.fromhex("deadbeefcafe"),
            )
            negotiated = peer.established()
        server.stop()
    assert negotiated.local_frame.private_data == bytes.fromhex("deadbeefcafe")
    decode = assert_clean_capture(pcap)
    request = next(r for r in decode.records if r.kind == "mpa_req")
    assert request.mpa is not None and request.mpa.private_data == bytes.fromhex("deadbeefcafe")


def test_mpa_19_siw_active_rev1_and_gso_bit(vm: SiwVM, case: str) -> None:
    """siw mpa_version=1 with try_gso: Rev 1, no IRD/ORD word, siw's private 0x08 flag kept
    as a reserved bit and otherwise ignored (MPA-19)."""
    vm.set_siw(mpa_version=1, try_gso=True)
    request, _peer, (negotiated, first, pcap) = _siw_active_to_our_responder(
        vm, case, MpaSettings(rev=1, crc=CrcPolicy.REQUEST)
    )
    frame = request.frame
    assert frame.rev == 1 and frame.ird_ord is None and frame.reserved & 0x08
    assert negotiated.rev == 1 and negotiated.crc
    _check_rping_first_send(first)
    decode = assert_clean_capture(pcap, allowed_rules=("MPA-19",))
    assert [rule for rule, _ in decode.findings()] == ["MPA-19"]  # the dissector notes 0x08
