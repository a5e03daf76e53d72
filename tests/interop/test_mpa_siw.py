"""MPA startup between Linux siw in the guest and our sans-IO engine on the host.

Guest active: ``rping -c`` in the guest connects to our responder listening on the host's
127.0.0.1 (10.0.2.2 in the guest).  Guest passive: ``rping -s`` in the guest, our initiator
connects through a hostfwd.  Each case asserts the negotiated values, goes one message past
the handshake (so siw's CRC and ours are checked against each other), and decodes the
guest's capture with our dissector.
"""

from __future__ import annotations

import time

import pytest

from stack.constants import Opcode, RtrType
from stack.wire.events import (
    CrcPolicy,
    IrdOrd,
    MpaSettings,
    PeerClosed,
    Rejected,
    RequestReceived,
)
from tests.interop.helpers import (
    RPING_INFO,
    SIW_PASSIVE_FIRST_FPDU_DELAY,
    MpaSocketPeer,
    assert_clean_capture,
    connect_local,
    listen_local,
    rping_info_send,
)
from tools.siwvm import HOST_ADDR, SiwVM

pytestmark = pytest.mark.interop

GUEST_RPING_PORT = 7174
RPING_IRD_ORD = IrdOrd(ird=1, ord=1, p2p=False, rtr=RtrType.NONE)
"""What rping (responder_resources = initiator_depth = 1) puts in siw's IRD/ORD word."""


def _siw_active_to_our_responder(
    vm: SiwVM, case: str, settings: MpaSettings
) -> tuple[RequestReceived, MpaSocketPeer, object]:
    """Guest rping client -> our responder: return the Request, the peer and the capture."""
    srv, port = listen_local()
    with srv, vm.capture(case, bpf=f"tcp port {port}") as pcap:
        client = vm.run(f"rping -c -a {HOST_ADDR} -p {port} -C 1 -v", background=True, timeout=20)
        sock, _ = srv.accept()
        with sock:
            peer = MpaSocketPeer.responder(sock, settings)
            request = peer.expect(RequestReceived)
            assert isinstance(request, RequestReceived)
            negotiated = peer.accept()
            first = peer.receive_segment()
        client.stop()
    return request, peer, (negotiated, first, pcap)


def _check_rping_first_send(first: object) -> None:
    from stack.wire.rdmap import Segment

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


def test_mpa_11_siw_crc_required_closes_on_reply_without_c(vm: SiwVM, case: str) -> None:
    """siw quirk: with mpa_crc_required its active side drops a Reply with C=0.

    RFC 5044 makes CRC mandatory once either frame has C=1, so a Reply with C=0 still
    means CRC; siw instead closes TCP without a Terminate and rping reports a reject.
    """
    vm.set_siw(crc_required=True)
    srv, port = listen_local()
    with srv, vm.capture(case, bpf=f"tcp port {port}") as pcap:
        client = vm.run(f"rping -c -a {HOST_ADDR} -p {port} -C 1 -v", background=True, timeout=20)
        sock, _ = srv.accept()
        with sock:
            peer = MpaSocketPeer.responder(sock, MpaSettings(crc=CrcPolicy.OFF))
            request = peer.expect(RequestReceived)
            assert isinstance(request, RequestReceived) and request.frame.crc
            negotiated = peer.accept()
            assert negotiated.crc is True and negotiated.local_frame.crc is False
            peer.expect(PeerClosed)
        assert client.wait(20) != 0
    assert "RDMA_CM_EVENT_REJECTED" in client.output()
    decode = assert_clean_capture(pcap)
    assert decode.fpdus() == []  # siw sent nothing after our Reply


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
    vm: SiwVM, case: str, settings: MpaSettings
) -> tuple[MpaSocketPeer, object, object]:
    """Our initiator -> guest rping server; return the peer, its first event and the pcap."""
    host_port = vm.hostfwd(GUEST_RPING_PORT)
    with vm.capture(case, bpf=f"tcp port {GUEST_RPING_PORT}") as pcap:
        server = vm.run(
            f"rping -s -a 0.0.0.0 -p {GUEST_RPING_PORT} -C 1 -v", background=True, timeout=20
        )
        vm.wait_listen(GUEST_RPING_PORT)
        with connect_local(host_port) as sock:
            peer = MpaSocketPeer.initiator(sock, settings)
            event = peer.next_event()
            reply_to_send: object = None
            if not isinstance(event, Rejected):
                time.sleep(SIW_PASSIVE_FIRST_FPDU_DELAY)  # siw passive race (pitfall 3)
                peer.send(rping_info_send(0x1000, 0x1234, 64, peer.conn.mulpdu))
                reply_to_send = peer.receive_segment()
        server.stop()
    return peer, (event, reply_to_send), pcap


def test_mpa_22_erc_04_our_initiator_to_siw_passive_rev2_crc(vm: SiwVM, case: str) -> None:
    """Our rev-2 Request with C=1 and IRD/ORD 4/4: siw accepts, mirrors and clamps."""
    settings = MpaSettings(crc=CrcPolicy.REQUEST, ird=4, ord=4)
    peer, (event, answer), pcap = _our_initiator_to_siw_passive(vm, case, settings)
    from stack.wire.events import Established
    from stack.wire.rdmap import Segment

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
    assert header is not None
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
    from stack.wire.events import Established
    from stack.wire.rdmap import Segment

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
