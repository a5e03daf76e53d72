"""MPA startup negotiation and Full Operation through MpaConnection (RFC 5044 §7, RFC 6581)."""

from __future__ import annotations

import dataclasses
import itertools
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stack.constants import (
    MPA_V2_NO_NEGOTIATION,
    TERM_LLP_CRC_ERROR,
    TERM_LLP_INSUFFICIENT_IRD,
    TERM_LLP_LOCAL_CATASTROPHIC,
    TERM_LLP_NO_MATCHING_RTR,
    RtrType,
)
from stack.crc import crc_field
from stack.errors import ConnectionTimeout, LocalError, MpaError
from stack.wire.events import (
    NEED_DATA,
    ConnectionFailed,
    CrcPolicy,
    Established,
    IrdOrd,
    MpaEvent,
    MpaFrame,
    MpaSettings,
    PeerClosed,
    Rejected,
    RequestReceived,
    RevPolicy,
    Role,
    UlpduReceived,
)
from stack.wire.framing import FpduFramer
from stack.wire.mpa import MpaConnection, MpaState, decode_frame, encode_frame
from tests.wire.helpers_mpa import ConnectionPair, drain, of_type, reference_fpdu

S = MpaSettings


def only(events: list, kind: type):
    found = of_type(events, kind)
    assert len(found) == 1, events
    return found[0]


def established(pair: ConnectionPair, **kwargs: Any):
    ev_i, ev_r = pair.handshake(**kwargs)
    return only(ev_i, Established).negotiated, only(ev_r, Established).negotiated


def ulpdus_of(events: list[MpaEvent]) -> list[bytes]:
    """The ULPDUs carried by ``events``, every one of which must be an UlpduReceived."""
    got: list[bytes] = []
    for e in events:
        assert isinstance(e, UlpduReceived), e
        got.append(bytes(e.ulpdu))
    return got


def reply_bytes(**fields: Any) -> bytes:
    return encode_frame(MpaFrame(reply=True, **fields))


def request_bytes(**fields: Any) -> bytes:
    return encode_frame(MpaFrame(reply=False, **fields))


def initiator_after_reply(settings: MpaSettings, reply: bytes) -> list:
    conn = MpaConnection(Role.INITIATOR, settings)
    conn.initiate(0.0)
    conn.data_to_send()
    conn.receive_data(reply)
    return drain(conn)


def responder_with_request(settings: MpaSettings, request: bytes) -> MpaConnection:
    conn = MpaConnection(Role.RESPONDER, settings)
    conn.start(0.0)
    conn.receive_data(request)
    return conn


def exchange(pair: ConnectionPair, i2r: list[bytes], r2i: list[bytes]) -> tuple[list, list]:
    """Initiator sends first (MPA-25), then the responder; ULPDUs each side received."""
    pair.initiator.send_ulpdus(i2r)
    _, ev_r = pair.pump()
    pair.responder.send_ulpdus(r2i)
    ev_i, more_r = pair.pump()
    got_r = [bytes(e.ulpdu) for e in of_type(ev_r + more_r, UlpduReceived)]
    got_i = [bytes(e.ulpdu) for e in of_type(ev_i, UlpduReceived)]
    return got_i, got_r


# -- basic startup --------------------------------------------------------------------------


def test_mpa_22_rev2_handshake_defaults() -> None:
    pair = ConnectionPair()
    ev_i, ev_r = pair.start(b"hello responder")
    request = only(ev_r, RequestReceived).frame
    assert request.private_data == b"hello responder"
    assert request.ird_ord == IrdOrd(16, 16)
    assert ev_i == []
    assert pair.responder.state is MpaState.REQUEST_RECEIVED
    pair.responder.accept(b"hello initiator")
    ev_i, _ = pair.pump()
    neg_i = only(ev_i, Established).negotiated
    neg_r = pair.responder.negotiated
    assert neg_r is not None
    assert neg_i.peer_private_data == b"hello initiator"
    assert neg_r.peer_private_data == b"hello responder"
    for neg, role in ((neg_i, Role.INITIATOR), (neg_r, Role.RESPONDER)):
        assert neg.role is role
        assert neg.rev == 2 and neg.crc
        assert not neg.markers_tx and not neg.markers_rx
        assert (neg.ird, neg.ord, neg.peer_ird, neg.peer_ord) == (16, 16, 16, 16)
        assert not neg.p2p and neg.rtr is RtrType.NONE
        assert neg.mulpdu == 1442
    assert pair.initiator.state is pair.responder.state is MpaState.FULL_OPERATION
    assert pair.initiator.timer_deadline() is None and pair.responder.timer_deadline() is None


def test_mpa_03_negotiated_rev_and_mulpdu_reported() -> None:
    pair = ConnectionPair(S(rev=1, emss=8960), S(mulpdu=4000))
    neg_i, neg_r = established(pair)
    assert neg_i.rev == neg_r.rev == 1
    assert neg_i.mulpdu == pair.initiator.mulpdu == 8954
    assert neg_r.mulpdu == pair.responder.mulpdu == 4000


def test_mpa_01_ulpdus_flow_both_ways() -> None:
    pair = ConnectionPair()
    established(pair)
    i2r = [b"a" * n for n in (0, 1, 14, 1442, 5000)]
    r2i = [b"b" * n for n in (3, 100)]
    got_i, got_r = exchange(pair, i2r, r2i)
    assert got_r == i2r and got_i == r2i


def test_erc_12_rev1_initiator_sends_no_word() -> None:
    pair = ConnectionPair(S(rev=1))
    pair.start()
    wire = bytes(pair.wire_i2r)
    assert wire[16] & 0x10 == 0 and wire[17] == 1
    neg_i, neg_r = established(ConnectionPair(S(rev=1)))
    assert neg_i.peer_ird is None and neg_r.peer_ird is None
    assert neg_i.local_frame.ird_ord is None and neg_r.local_frame.ird_ord is None


def test_erc_01_rev2_responder_accepts_rev1_request() -> None:
    neg_i, neg_r = established(ConnectionPair(S(rev=1), S(rev=2)))
    assert neg_i.rev == neg_r.rev == 1
    assert neg_r.local_frame.ird_ord is None


def test_erc_11_reply_follows_request_s_bit() -> None:
    pair = ConnectionPair(S(rev=2), S(rev=2))
    neg_i, neg_r = established(pair)
    assert neg_r.local_frame.enhanced and neg_i.peer_frame.enhanced
    pair = ConnectionPair(S(rev=2, p2p=False), S(rev=2))
    pair.initiator = MpaConnection(Role.INITIATOR, S(rev=1))
    neg_i, _ = established(pair)
    assert not neg_i.peer_frame.enhanced


@pytest.mark.parametrize("responder", [S(allow_enhanced=False), S(rev=1)])
def test_erc_11_non_enhanced_responder_closes_on_s_bit(responder: MpaSettings) -> None:
    pair = ConnectionPair(S(rev=2), responder)
    ev_i, ev_r = pair.start()
    failed = only(ev_r, ConnectionFailed)
    assert failed.close and failed.terminate is None
    assert isinstance(failed.error, MpaError) and failed.error.rule == "ERC-11"
    assert pair.responder.state is MpaState.FAILED
    assert ev_i == [] and pair.wire_r2i == b""
    pair.initiator.receive_data(b"")  # the responder closed TCP
    failed = only(drain(pair.initiator), ConnectionFailed)
    assert failed.close


def test_erc_11_initiator_refuses_reply_with_wrong_format() -> None:
    events = initiator_after_reply(S(rev=2), reply_bytes(rev=1))
    failed = only(events, ConnectionFailed)
    assert failed.error.rule == "ERC-11" and failed.close and failed.terminate is None
    # An enhanced Reply to a Rev 1 Request is already a revision error.
    events = initiator_after_reply(S(rev=1), reply_bytes(rev=2, ird_ord=IrdOrd(1, 1)))
    assert only(events, ConnectionFailed).error.rule == "MPA-20"


# -- CRC policies -----------------------------------------------------------------------------

SENDS_C = {CrcPolicy.REQUEST: True, CrcPolicy.REQUIRE: True, CrcPolicy.OFF: False}
SENDS_C[CrcPolicy.STRICT_OFF] = False


def refuses(policy: CrcPolicy, peer_c: bool) -> bool:
    return (policy is CrcPolicy.REQUIRE and not peer_c) or (
        policy is CrcPolicy.STRICT_OFF and peer_c
    )


@pytest.mark.parametrize(
    ("init_policy", "resp_policy"), list(itertools.product(list(CrcPolicy), repeat=2))
)
def test_mpa_11_crc_policy_matrix(init_policy: CrcPolicy, resp_policy: CrcPolicy) -> None:
    pair = ConnectionPair(S(crc=init_policy), S(crc=resp_policy))
    ev_i, ev_r = pair.start()
    init_c, resp_c = SENDS_C[init_policy], SENDS_C[resp_policy]
    assert bool(pair.wire_i2r[16] & 0x40) == init_c
    if refuses(resp_policy, init_c):  # responder rejects (R=1), TCP stays open
        failed = only(ev_r, ConnectionFailed)
        assert not failed.close and failed.error.rule == "MPA-11"
        assert pair.responder.state is MpaState.REJECTED
        assert only(ev_i, Rejected).frame.reject
        return
    only(ev_r, RequestReceived)
    pair.responder.accept()
    ev_i, ev_r = pair.pump()
    # An OFF responder echoes the initiator's C=1 (CRC runs both ways anyway; siw's
    # mpa_crc_required closes on a C=0 Reply).
    resp_c = resp_c or (init_c and resp_policy is CrcPolicy.OFF)
    assert bool(pair.wire_r2i[16] & 0x40) == resp_c
    if refuses(init_policy, resp_c):
        failed = only(ev_i, ConnectionFailed)
        assert failed.error.rule == "MPA-11" and failed.close
        assert failed.terminate == TERM_LLP_LOCAL_CATASTROPHIC  # enhanced setup: ERC-10
        return
    crc_on = init_c or resp_c  # C in either frame: CRC both ways
    assert only(ev_i, Established).negotiated.crc == crc_on
    assert pair.responder.negotiated is not None and pair.responder.negotiated.crc == crc_on
    got_i, got_r = exchange(pair, [b"ping"], [b"pong"])
    assert (got_i, got_r) == ([b"pong"], [b"ping"])
    tail = bytes(pair.wire_i2r[-12:])
    assert (tail[-4:] == crc_field(tail[:-4])) == crc_on
    if not crc_on:
        assert tail[-4:] == bytes(4)


def test_erc_10_crc_refusal_without_enhanced_setup_has_no_terminate() -> None:
    events = initiator_after_reply(S(rev=1, crc=CrcPolicy.REQUIRE), reply_bytes(rev=1, crc=False))
    failed = only(events, ConnectionFailed)
    assert failed.terminate is None and failed.close


def test_mpa_11_crc_default_is_requested() -> None:
    pair = ConnectionPair(S(), S(crc=CrcPolicy.OFF))
    neg_i, neg_r = established(pair)
    # The default initiator asks for CRC; the OFF responder echoes C=1 and CRC runs both ways.
    assert neg_i.local_frame.crc and neg_r.local_frame.crc
    assert neg_i.crc and neg_r.crc


# -- markers ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("init_wants", "resp_wants"), list(itertools.product([False, True], [False, True]))
)
def test_mpa_09_markers_per_direction_chosen_by_receiver(
    init_wants: bool, resp_wants: bool
) -> None:
    pair = ConnectionPair(S(want_markers=init_wants), S(want_markers=resp_wants))
    neg_i, neg_r = established(pair)
    assert (neg_i.markers_rx, neg_i.markers_tx) == (init_wants, resp_wants)
    assert (neg_r.markers_rx, neg_r.markers_tx) == (resp_wants, init_wants)
    i2r = [bytes([7]) * 3000, b"x"]
    r2i = [bytes([9]) * 2000, b"y" * 5]
    got_i, got_r = exchange(pair, i2r, r2i)
    assert got_r == i2r and got_i == r2i
    # On the wire each direction carries exactly what a framer with that direction's
    # marker choice produces, starting at SeqStart = the byte after the startup frame.
    req_len = len(encode_frame(neg_i.local_frame))
    rep_len = len(encode_frame(neg_r.local_frame))
    i2r_framer = FpduFramer(markers=resp_wants)
    r2i_framer = FpduFramer(markers=init_wants)
    assert pair.wire_i2r[req_len:] == b"".join(bytes(i2r_framer.frame(u)) for u in i2r)
    assert pair.wire_r2i[rep_len:] == b"".join(bytes(r2i_framer.frame(u)) for u in r2i)
    assert (pair.wire_i2r[req_len : req_len + 4] == bytes(4)) == resp_wants


def test_mpa_17_seqstart_right_after_the_startup_frames() -> None:
    pair = ConnectionPair(S(want_markers=True), S(want_markers=True))
    neg_i, neg_r = established(pair, private_data=b"abc", reply_data=b"de")
    pair.initiator.send_ulpdu(b"first")
    pair.pump()
    pair.responder.send_ulpdu(b"second")
    pair.pump()
    req_len = 20 + 4 + 3
    rep_len = 20 + 4 + 2
    assert pair.wire_i2r[req_len:] == FpduFramer(markers=True).frame(b"first")
    assert pair.wire_r2i[rep_len:] == FpduFramer(markers=True).frame(b"second")
    assert pair.wire_i2r[req_len : req_len + 4] == bytes(4)


# -- peer-to-peer and RTR ----------------------------------------------------------------------


@pytest.mark.parametrize("kind", [RtrType.SEND, RtrType.WRITE, RtrType.READ])
def test_erc_09_each_rtr_kind_negotiated(kind: RtrType) -> None:
    pair = ConnectionPair(S(p2p=True, rtr=kind), S())
    neg_i, neg_r = established(pair)
    assert neg_i.p2p and neg_r.p2p
    assert neg_i.rtr is neg_r.rtr is kind
    request_word = neg_r.peer_frame.ird_ord
    assert request_word is not None and request_word.p2p and request_word.rtr == kind
    reply_word = neg_i.peer_frame.ird_ord
    assert reply_word is not None and reply_word.p2p and reply_word.rtr == kind


def test_erc_09_responder_picks_by_preference() -> None:
    offered = RtrType.SEND | RtrType.WRITE | RtrType.READ
    pair = ConnectionPair(
        S(p2p=True, rtr=offered),
        S(rtr=RtrType.SEND | RtrType.READ, rtr_preference=(RtrType.SEND, RtrType.READ)),
    )
    neg_i, neg_r = established(pair)
    assert neg_i.rtr is neg_r.rtr is RtrType.SEND


def test_erc_09_accept_overrides_rtr() -> None:
    pair = ConnectionPair(S(p2p=True), S())
    neg_i, neg_r = established(pair, rtr=RtrType.READ)
    assert neg_i.rtr is neg_r.rtr is RtrType.READ


def test_erc_07_erc_13_a0_request_has_no_rtr_bits_and_responder_ignores_them() -> None:
    pair = ConnectionPair(S(p2p=False, rtr=RtrType.SEND | RtrType.WRITE), S())
    neg_i, neg_r = established(pair)
    assert neg_r.peer_frame.ird_ord == IrdOrd(16, 16, False, RtrType.NONE)
    assert neg_i.rtr is neg_r.rtr is RtrType.NONE
    # A=0 with stray B/C/D bits (ERC-13 sanity): ignored, client-server.
    conn = responder_with_request(
        S(), request_bytes(rev=2, ird_ord=IrdOrd(4, 4, False, RtrType.WRITE))
    )
    only(drain(conn), RequestReceived)
    conn.accept()
    reply = decode_frame(conn.data_to_send())
    assert reply is not None
    assert reply[0].ird_ord == IrdOrd(4, 4, False, RtrType.NONE)
    assert conn.negotiated is not None and conn.negotiated.rtr is RtrType.NONE


def test_erc_08_no_match_responder_flags_a_supported_type_and_initiator_fails() -> None:
    pair = ConnectionPair(S(p2p=True, rtr=RtrType.SEND), S(rtr=RtrType.WRITE))
    ev_i, ev_r = pair.handshake()
    reply_word = decode_frame(bytes(pair.wire_r2i))
    assert reply_word is not None
    word = reply_word[0].ird_ord
    assert word is not None and word.p2p and word.rtr == RtrType.WRITE  # ERC-08
    neg_r = only(ev_r, Established).negotiated
    assert neg_r.rtr is RtrType.NONE
    failed = only(ev_i, ConnectionFailed)
    assert failed.terminate == TERM_LLP_NO_MATCHING_RTR and failed.close
    assert failed.error.rule == "ERC-09"
    assert pair.initiator.state is MpaState.ERROR
    pair.initiator.send_ulpdu(b"terminate 2/0/7")  # the Terminate can still go out
    assert pair.initiator.data_to_send() == FpduFramer().frame(b"terminate 2/0/7")


def test_erc_08_responder_must_echo_a() -> None:
    reply = reply_bytes(rev=2, ird_ord=IrdOrd(16, 16, False, RtrType.NONE))
    failed = only(initiator_after_reply(S(p2p=True), reply), ConnectionFailed)
    assert failed.error.rule == "ERC-08" and failed.terminate == TERM_LLP_NO_MATCHING_RTR


def test_erc_08_responder_without_rtr_support_is_a_local_error() -> None:
    pair = ConnectionPair(S(p2p=True), S(rtr=RtrType.NONE))
    pair.start()
    with pytest.raises(LocalError):
        pair.responder.accept()
    assert pair.responder.state is MpaState.REQUEST_RECEIVED


def test_erc_09_read_rtr_needs_an_ird_credit() -> None:
    """Initiator ORD 0 + Read RTR: the responder raises its IRD to 1 (RFC 6581 §9.1)."""
    conn = responder_with_request(
        S(ird=4), request_bytes(rev=2, ird_ord=IrdOrd(4, 0, True, RtrType.READ))
    )
    drain(conn)
    conn.accept()
    assert conn.negotiated is not None
    assert conn.negotiated.rtr is RtrType.READ and conn.negotiated.ird == 1
    # A responder with IRD 0 cannot take a Read RTR and flags another type.
    conn = responder_with_request(
        S(ird=0), request_bytes(rev=2, ird_ord=IrdOrd(4, 4, True, RtrType.READ))
    )
    drain(conn)
    conn.accept()
    assert conn.negotiated is not None and conn.negotiated.rtr is RtrType.NONE


def test_erc_07_p2p_initiator_must_offer_an_rtr_type() -> None:
    conn = MpaConnection(Role.INITIATOR, S(p2p=True, rtr=RtrType.NONE))
    with pytest.raises(LocalError):
        conn.initiate(0.0)
    assert conn.state is MpaState.IDLE


# -- IRD / ORD -------------------------------------------------------------------------------


def test_erc_04_ird_ord_negotiated_down() -> None:
    pair = ConnectionPair(S(ird=4, ord=8), S(ird=16, ord=16))
    neg_i, neg_r = established(pair)
    assert (neg_r.ird, neg_r.ord) == (8, 4)  # responder ORD <= initiator IRD (MUST)
    assert (neg_i.peer_ird, neg_i.peer_ord) == (8, 4)
    assert (neg_i.ird, neg_i.ord) == (4, 8)
    assert neg_i.ord <= neg_r.ird and neg_r.ord <= neg_i.ird


def test_erc_04_accept_overrides_ird_ord() -> None:
    pair = ConnectionPair(S(ird=8, ord=8), S())
    neg_i, neg_r = established(pair, ird=2, ord=1)
    assert (neg_r.ird, neg_r.ord) == (2, 1)
    assert (neg_i.ird, neg_i.ord) == (8, 2)


def test_erc_04_insufficient_ird_fails_with_terminate_2_0_6() -> None:
    reply = reply_bytes(rev=2, ird_ord=IrdOrd(16, 20))  # ORD 20 > our IRD 4
    conn = MpaConnection(Role.INITIATOR, S(ird=4))
    conn.initiate(0.0)
    conn.data_to_send()
    conn.receive_data(reply)
    failed = only(drain(conn), ConnectionFailed)
    assert failed.terminate == TERM_LLP_INSUFFICIENT_IRD and failed.close
    assert failed.error.rule == "ERC-04"
    assert conn.state is MpaState.ERROR and conn.negotiated is None
    conn.send_ulpdu(b"terminate")
    assert conn.data_to_send() == FpduFramer().frame(b"terminate")


def test_erc_06_initiator_ord_3fff_responder_keeps_ird() -> None:
    pair = ConnectionPair(S(ird=4, ord=MPA_V2_NO_NEGOTIATION), S(ird=32, ord=32))
    neg_i, neg_r = established(pair)
    assert neg_i.peer_ird == MPA_V2_NO_NEGOTIATION  # replied IRD 0x3FFF
    assert neg_r.ird == 32  # kept
    assert neg_i.ord == MPA_V2_NO_NEGOTIATION  # initiator keeps its own ORD
    assert neg_r.ord == 4  # normal rule for the other half


def test_erc_06_initiator_ird_3fff_responder_keeps_ord() -> None:
    pair = ConnectionPair(S(ird=MPA_V2_NO_NEGOTIATION, ord=4), S(ird=32, ord=32))
    neg_i, neg_r = established(pair)
    assert neg_i.peer_ord == MPA_V2_NO_NEGOTIATION
    assert neg_r.ord == 32
    assert neg_i.ird == MPA_V2_NO_NEGOTIATION
    assert neg_r.ird == 4


def test_erc_06_initiator_keeps_values_when_reply_has_3fff() -> None:
    reply = reply_bytes(rev=2, ird_ord=IrdOrd(MPA_V2_NO_NEGOTIATION, MPA_V2_NO_NEGOTIATION))
    neg = only(initiator_after_reply(S(ird=3, ord=5), reply), Established).negotiated
    assert (neg.ird, neg.ord) == (3, 5)


def test_erc_05_peer_ird_ord_reported_on_reject() -> None:
    pair = ConnectionPair(S(ird=2, ord=2), S(ird=7, ord=9))
    ev_i, ev_r = pair.start()
    only(ev_r, RequestReceived)
    pair.responder.reject(b"need ORD 9")
    ev_i, _ = pair.pump()
    rejected = only(ev_i, Rejected)
    assert rejected.frame.private_data == b"need ORD 9"
    assert rejected.frame.ird_ord is not None
    assert (rejected.frame.ird_ord.ird, rejected.frame.ird_ord.ord) == (7, 9)
    assert "IRD 7" in rejected.reason


def test_mpa_09_reject_reason_names_markers_we_asked_for() -> None:
    """A reject by siw, which supports no markers, says we asked for them (M=1)."""
    settings = S(rev=1, want_markers=True, crc=CrcPolicy.REQUEST)
    rejected = only(
        initiator_after_reply(settings, reply_bytes(rev=1, reject=True, crc=False)), Rejected
    )
    assert "markers (M=1), the Reply has M=0" in rejected.reason
    plain = only(initiator_after_reply(S(crc=CrcPolicy.OFF), reply_bytes(reject=True)), Rejected)
    assert "markers" not in plain.reason and "CRC" not in plain.reason


def test_mpa_24_reject_reason_is_the_peers_not_crc() -> None:
    """An OFF responder rejecting our C=1 Request for its own reason sends C=0: the reason
    is its private data, and the C bit of a Reject is not named as a CRC refusal (MPA-11)."""
    pair = ConnectionPair(S(crc=CrcPolicy.REQUEST), S(crc=CrcPolicy.OFF))
    pair.start()
    pair.responder.reject(b"no room for you")
    ev_i, _ = pair.pump()
    rejected = only(ev_i, Rejected)
    assert rejected.frame.reject and not rejected.frame.crc
    assert rejected.reason.startswith("peer rejected the connection (peer IRD")
    assert rejected.reason.endswith("reason (its private data): 'no room for you'")
    assert "CRC" not in rejected.reason and "C=" not in rejected.reason


def test_mpa_24_reject_reason_without_or_with_binary_private_data() -> None:
    """siw's crc_strict reject (R=1, C=0, no private data) says no reason was given;
    private data that is not text is shown in hex, at most 64 octets of it."""
    crc_req = S(rev=1, crc=CrcPolicy.REQUEST)
    bare = only(initiator_after_reply(crc_req, reply_bytes(rev=1, reject=True)), Rejected)
    assert bare.reason == "peer rejected the connection, no reason given (no private data)"
    binary = only(
        initiator_after_reply(crc_req, reply_bytes(rev=1, reject=True, private_data=b"\xff\x00")),
        Rejected,
    )
    assert binary.reason.endswith("private data (2 octets): ff00")
    long = bytes(range(100))
    cut = only(
        initiator_after_reply(crc_req, reply_bytes(rev=1, reject=True, private_data=long)),
        Rejected,
    )
    assert cut.reason.endswith(f"private data (100 octets): {long[:64].hex()}...")


@pytest.mark.parametrize(
    ("policy", "reply_c", "text"),
    [
        (CrcPolicy.REQUIRE, False, "the accepting Reply has C=0 (no CRC) to our C=1"),
        (CrcPolicy.STRICT_OFF, True, "the accepting Reply has C=1 (CRC) to our C=0"),
    ],
)
def test_mpa_11_accepting_reply_c_bit_conflict_is_named(
    policy: CrcPolicy, reply_c: bool, text: str
) -> None:
    """Where the C bit is the cause (an accepting Reply against our policy), the error
    names both C bits (RFC 5044 §7.1, MPA-11)."""
    events = initiator_after_reply(S(rev=1, crc=policy), reply_bytes(rev=1, crc=reply_c))
    failed = only(events, ConnectionFailed)
    assert failed.error.rule == "MPA-11" and text in str(failed.error)


# -- reject ----------------------------------------------------------------------------------


@pytest.mark.parametrize("rev", [1, 2])
def test_mpa_23_mpa_24_reject_with_private_data(rev: int) -> None:
    pair = ConnectionPair(S(rev=rev), S())
    pair.start(b"may I?")
    pair.responder.reject(b"no, thanks")
    ev_i, ev_r = pair.pump()
    assert ev_r == []
    rejected = only(ev_i, Rejected)
    assert rejected.frame.reject and rejected.frame.private_data == b"no, thanks"
    assert pair.initiator.state is pair.responder.state is MpaState.REJECTED
    assert pair.initiator.timer_deadline() is None
    with pytest.raises(LocalError):
        pair.initiator.send_ulpdu(b"x")
    # TCP stays open: later bytes are not MPA's business and raise nothing.
    pair.initiator.receive_data(b"ULP bytes after the reject")
    pair.responder.receive_data(b"ULP bytes after the reject")
    pair.initiator.receive_data(b"")
    assert drain(pair.initiator) == [PeerClosed()]


def test_mpa_19_r_bit_in_request_not_checked() -> None:
    conn = responder_with_request(S(), request_bytes(rev=1, reject=True))
    only(drain(conn), RequestReceived)
    conn.accept()
    assert conn.state is MpaState.FULL_OPERATION


def test_mpa_19_reserved_bits_accepted() -> None:
    conn = responder_with_request(S(), request_bytes(rev=2, reserved=0x0F, ird_ord=IrdOrd(1, 1)))
    only(drain(conn), RequestReceived)
    events = initiator_after_reply(S(), reply_bytes(rev=2, reserved=0x08, ird_ord=IrdOrd(1, 1)))
    assert only(events, Established).negotiated.peer_frame.reserved == 0x08


# -- revisions -------------------------------------------------------------------------------


@pytest.mark.parametrize("rev", [0, 3])
def test_mpa_20_rev_policy_reject(rev: int) -> None:
    conn = responder_with_request(S(rev_policy=RevPolicy.REJECT), request_bytes(rev=rev))
    failed = only(drain(conn), ConnectionFailed)
    assert failed.error.rule == "MPA-20" and not failed.close
    assert conn.state is MpaState.REJECTED
    result = decode_frame(conn.data_to_send())
    assert result is not None and result[0].reply and result[0].reject


@pytest.mark.parametrize("rev", [0, 3])
def test_mpa_20_rev_policy_close(rev: int) -> None:
    conn = responder_with_request(S(rev_policy=RevPolicy.CLOSE), request_bytes(rev=rev))
    failed = only(drain(conn), ConnectionFailed)
    assert failed.error.rule == "MPA-20" and failed.close and failed.terminate is None
    assert conn.state is MpaState.FAILED and conn.data_to_send() == b""


@pytest.mark.parametrize(("rev", "reply_rev"), [(0, 0), (3, 2)])
def test_mpa_20_rev_policy_accept(rev: int, reply_rev: int) -> None:
    conn = responder_with_request(S(rev_policy=RevPolicy.ACCEPT), request_bytes(rev=rev))
    only(drain(conn), RequestReceived)
    conn.accept()
    result = decode_frame(conn.data_to_send())
    assert result is not None and result[0].rev == reply_rev and not result[0].reject


def test_mpa_20_initiator_refuses_unknown_reply_rev() -> None:
    failed = only(initiator_after_reply(S(rev=1), reply_bytes(rev=2)), ConnectionFailed)
    assert failed.error.rule == "MPA-20" and failed.close
    failed = only(initiator_after_reply(S(rev=2), reply_bytes(rev=7)), ConnectionFailed)
    assert failed.error.rule == "MPA-20"
    events = initiator_after_reply(S(rev=1, rev_policy=RevPolicy.ACCEPT), reply_bytes(rev=0))
    assert only(events, Established).negotiated.rev == 0


# -- malformed startup frames ----------------------------------------------------------------


def test_mpa_18_wrong_key_closes_responder() -> None:
    conn = responder_with_request(S(), b"MPA ID Rex Frame\x40\x01\x00\x00")
    failed = only(drain(conn), ConnectionFailed)
    assert failed.close and failed.terminate is None and failed.error.rule == "MPA-18"
    assert conn.state is MpaState.FAILED and conn.timer_deadline() is None


def test_mpa_18_reply_key_to_responder_closes() -> None:
    conn = responder_with_request(S(), reply_bytes(rev=1))
    failed = only(drain(conn), ConnectionFailed)
    assert failed.close and failed.error.rule == "MPA-18"


def test_mpa_18_bad_reply_key_closes_and_later_bytes_are_ignored() -> None:
    """siw sends a Terminate 2/0/4 after a bad key; the FPDU must not disturb anything."""
    events = initiator_after_reply(S(), b"MPA ID Rop Frame\x40\x02\x00\x00")
    failed = only(events, ConnectionFailed)
    assert failed.close and failed.terminate is None
    conn = MpaConnection(Role.INITIATOR, S())
    conn.initiate(0.0)
    conn.receive_data(b"XPA ID Rep Frame" + reference_fpdu(b"terminate 2/0/4"))
    conn.receive_data(reference_fpdu(b"more"))
    assert len(of_type(drain(conn), ConnectionFailed)) == 1
    assert conn.state is MpaState.FAILED


def test_mpa_21_private_data_over_limit_closes() -> None:
    conn = responder_with_request(
        S(max_private_data=256), request_bytes(rev=1, private_data=bytes(300))
    )
    failed = only(drain(conn), ConnectionFailed)
    assert failed.close and failed.error.rule == "MPA-21"


def test_mpa_21_local_private_data_limit() -> None:
    conn = MpaConnection(Role.INITIATOR, S(max_private_data=256))
    with pytest.raises(LocalError):
        conn.initiate(0.0, bytes(253))  # 4 bytes go to the IRD/ORD word
    assert conn.state is MpaState.IDLE
    conn.initiate(0.0, bytes(252))
    pair = ConnectionPair()
    pair.start()
    with pytest.raises(LocalError):
        pair.responder.accept(bytes(509))
    assert pair.responder.state is MpaState.REQUEST_RECEIVED


# -- MPA-25 and bytes around the startup frames -----------------------------------------------


def test_mpa_25_responder_holds_fpdus_until_first_fpdu_arrives() -> None:
    pair = ConnectionPair()
    pair.start()
    pair.responder.accept()
    reply = pair.responder.data_to_send()
    pair.responder.send_ulpdu(b"early")
    pair.responder.send_ulpdus([b"and", b"more"])
    assert pair.responder.data_to_send() == b""
    pair.initiator.receive_data(bytes(reply))
    only(drain(pair.initiator), Established)
    pair.initiator.send_ulpdu(b"rtr")
    pair.responder.receive_data(bytes(pair.initiator.data_to_send()))
    assert [bytes(e.ulpdu) for e in of_type(drain(pair.responder), UlpduReceived)] == [b"rtr"]
    released = bytes(pair.responder.data_to_send())
    framer = FpduFramer()
    assert released == b"".join(bytes(framer.frame(u)) for u in (b"early", b"and", b"more"))


def test_mpa_25_held_fpdus_released_after_a_receive_error() -> None:
    pair = ConnectionPair()
    pair.handshake()
    pair.responder.send_ulpdu(b"terminate")
    assert pair.responder.data_to_send() == b""
    bad = bytearray(reference_fpdu(b"garbled"))
    bad[3] ^= 1
    pair.responder.receive_data(bytes(bad))
    failed = only(drain(pair.responder), ConnectionFailed)
    assert failed.terminate == TERM_LLP_CRC_ERROR and not failed.close
    assert pair.responder.data_to_send() == FpduFramer().frame(b"terminate")


def test_mpa_initiator_accepts_fpdus_in_the_reply_chunk() -> None:
    reply = reply_bytes(rev=2, ird_ord=IrdOrd(16, 16))
    chunk = reply + reference_fpdu(b"one") + reference_fpdu(b"two")[:5]
    conn = MpaConnection(Role.INITIATOR, S())
    conn.initiate(0.0)
    conn.receive_data(chunk)
    conn.receive_data(reference_fpdu(b"two")[5:])
    events = drain(conn)
    assert isinstance(events[0], Established)
    assert ulpdus_of(events[1:]) == [b"one", b"two"]


@pytest.mark.parametrize("step", [1, 5, 1000])
def test_mpa_responder_buffers_bytes_after_request_until_accept(step: int) -> None:
    """siw drops the connection here; we keep the bytes and parse them after accept()."""
    data = request_bytes(rev=2, ird_ord=IrdOrd(4, 4), private_data=b"pd")
    data += reference_fpdu(b"eager") + reference_fpdu(b"beaver")
    conn = MpaConnection(Role.RESPONDER, S())
    conn.start(0.0)
    for i in range(0, len(data), step):
        conn.receive_data(data[i : i + step])
    assert [type(e) for e in drain(conn)] == [RequestReceived]
    conn.accept()
    events = drain(conn)
    assert isinstance(events[0], Established)
    assert ulpdus_of(events[1:]) == [b"eager", b"beaver"]


def test_mpa_responder_bytes_before_start_are_kept() -> None:
    conn = MpaConnection(Role.RESPONDER, S())
    conn.receive_data(request_bytes(rev=1))
    assert drain(conn) == []
    conn.start(0.0)
    only(drain(conn), RequestReceived)


def test_mpa_one_byte_at_a_time_handshake() -> None:
    pair = ConnectionPair(S(want_markers=True), S(want_markers=True))
    pair.responder.start(0.0)
    pair.initiator.initiate(0.0, b"tiny steps")
    request = bytes(pair.initiator.data_to_send())
    for b in request:
        pair.responder.receive_data(bytes([b]))
    assert only(drain(pair.responder), RequestReceived).frame.private_data == b"tiny steps"
    pair.responder.accept(b"ok")
    reply = bytes(pair.responder.data_to_send())
    for b in reply:
        pair.initiator.receive_data(bytes([b]))
    assert only(drain(pair.initiator), Established).negotiated.peer_private_data == b"ok"


# -- initiator/initiator, responder/responder, timeouts --------------------------------------


def test_mpa_26_initiator_initiator_detected_by_key() -> None:
    a = MpaConnection(Role.INITIATOR, S())
    b = MpaConnection(Role.INITIATOR, S())
    a.initiate(0.0)
    b.initiate(0.0)
    a.receive_data(bytes(b.data_to_send()))
    b.receive_data(bytes(a.data_to_send()))
    for conn in (a, b):
        failed = only(drain(conn), ConnectionFailed)
        assert failed.close and failed.error.rule == "MPA-26"
        assert conn.state is MpaState.FAILED


def test_mpa_26_responder_responder_times_out() -> None:
    a = MpaConnection(Role.RESPONDER, S())
    b = MpaConnection(Role.RESPONDER, S(request_timeout=2.5))
    a.start(100.0)
    b.start(100.0)
    assert a.data_to_send() == b.data_to_send() == b""
    assert a.timer_deadline() == 105.0 and b.timer_deadline() == 102.5
    a.handle_timer(104.9)
    assert drain(a) == [] and a.state is MpaState.AWAIT_REQUEST
    a.handle_timer(105.0)
    failed = only(drain(a), ConnectionFailed)
    assert isinstance(failed.error, ConnectionTimeout) and failed.close
    assert "MPA-26" in str(failed.error)
    assert a.state is MpaState.FAILED and a.timer_deadline() is None
    a.handle_timer(200.0)
    assert drain(a) == []


def test_mpa_27_reply_timeout() -> None:
    conn = MpaConnection(Role.INITIATOR, S())
    conn.initiate(50.0)
    assert conn.timer_deadline() == 60.0
    conn.receive_data(reply_bytes(rev=2, ird_ord=IrdOrd(1, 1))[:10])
    conn.handle_timer(59.0)
    assert drain(conn) == []
    conn.handle_timer(60.5)
    failed = only(drain(conn), ConnectionFailed)
    assert isinstance(failed.error, ConnectionTimeout) and "MPA-27" in str(failed.error)
    conn.receive_data(reply_bytes(rev=2, ird_ord=IrdOrd(1, 1))[10:])
    assert drain(conn) == []


def test_mpa_27_timer_stops_when_frame_arrives() -> None:
    pair = ConnectionPair(S(reply_timeout=1.0), S(request_timeout=1.0))
    pair.start()
    assert pair.responder.timer_deadline() is None
    assert pair.initiator.timer_deadline() == 1.0
    pair.responder.accept()
    pair.pump()
    pair.initiator.handle_timer(10.0)
    assert pair.initiator.timer_deadline() is None
    assert drain(pair.initiator) == [] and pair.initiator.state is MpaState.FULL_OPERATION


# -- Full Operation errors and teardown ------------------------------------------------------


def test_mpa_28_crc_error_in_full_operation() -> None:
    pair = ConnectionPair()
    pair.handshake()
    bad = bytearray(reference_fpdu(b"second"))
    bad[-1] ^= 0x55
    pair.initiator.receive_data(reference_fpdu(b"first") + bytes(bad) + reference_fpdu(b"3rd"))
    events = drain(pair.initiator)
    first = events[0]
    assert isinstance(first, UlpduReceived)
    assert bytes(first.ulpdu) == b"first"
    failed = events[1]
    assert isinstance(failed, ConnectionFailed)
    assert not failed.close and failed.terminate == TERM_LLP_CRC_ERROR  # MPA does not close
    assert len(events) == 2
    assert pair.initiator.state is MpaState.ERROR
    pair.initiator.receive_data(reference_fpdu(b"4th"))
    assert drain(pair.initiator) == []
    pair.initiator.send_ulpdu(b"terminate 2/0/2")
    assert pair.initiator.data_to_send() == FpduFramer().frame(b"terminate 2/0/2")


def test_mpa_28_fin_during_startup_fails() -> None:
    conn = MpaConnection(Role.INITIATOR, S())
    conn.initiate(0.0)
    conn.receive_data(b"MPA ID Rep")
    conn.receive_data(b"")
    failed = only(drain(conn), ConnectionFailed)
    assert failed.close and failed.error.rule == "MPA-28"
    conn = MpaConnection(Role.RESPONDER, S())
    conn.start(0.0)
    conn.receive_data(b"")
    assert only(drain(conn), ConnectionFailed).close


def test_mpa_28_fin_in_full_operation_reported_after_data() -> None:
    pair = ConnectionPair()
    pair.handshake()
    pair.initiator.receive_data(reference_fpdu(b"last words"))
    pair.initiator.receive_data(b"")
    events = drain(pair.initiator)
    assert [type(e) for e in events] == [UlpduReceived, PeerClosed]
    pair.initiator.receive_data(b"")
    assert drain(pair.initiator) == []
    with pytest.raises(LocalError):
        pair.initiator.receive_data(b"after FIN")
    pair.initiator.send_ulpdu(b"half-open sending still works")


def test_mpa_28_fin_while_ulp_decides_is_reported_after_accept() -> None:
    conn = responder_with_request(S(), request_bytes(rev=1) + reference_fpdu(b"x"))
    conn.receive_data(b"")
    assert [type(e) for e in drain(conn)] == [RequestReceived]
    conn.accept()
    assert [type(e) for e in drain(conn)] == [Established, UlpduReceived, PeerClosed]


# -- API misuse ------------------------------------------------------------------------------


def test_local_errors_for_api_misuse() -> None:
    initiator = MpaConnection(Role.INITIATOR, S())
    responder = MpaConnection(Role.RESPONDER, S())
    with pytest.raises(LocalError):
        initiator.start(0.0)
    with pytest.raises(LocalError):
        responder.initiate(0.0)
    with pytest.raises(LocalError):
        initiator.accept()
    with pytest.raises(LocalError):
        responder.accept()  # no Request yet
    with pytest.raises(LocalError):
        responder.reject()
    with pytest.raises(LocalError):
        initiator.send_ulpdu(b"too early")
    initiator.initiate(0.0)
    with pytest.raises(LocalError):
        initiator.initiate(0.0)
    with pytest.raises(LocalError):
        MpaConnection(Role.INITIATOR, S(rev=3))
    assert initiator.next_event() is NEED_DATA


def test_settings_are_not_mutated() -> None:
    settings_ = S(ird=3)
    pair = ConnectionPair(settings_, settings_)
    established(pair)
    assert dataclasses.replace(settings_) == S(ird=3)


# -- properties ------------------------------------------------------------------------------


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    markers=st.tuples(st.booleans(), st.booleans()),
    crc=st.sampled_from([CrcPolicy.REQUEST, CrcPolicy.OFF]),
    ulpdus=st.lists(st.binary(max_size=1500), min_size=1, max_size=5),
    cuts=st.lists(st.integers(1, 700), max_size=20),
)
def test_mpa_15_chunking_of_the_whole_connection_never_changes_events(
    markers: tuple[bool, bool], crc: CrcPolicy, ulpdus: list[bytes], cuts: list[int]
) -> None:
    pair = ConnectionPair(S(want_markers=markers[0], crc=crc), S(want_markers=markers[1]))
    pair.handshake()
    pair.responder.send_ulpdus(ulpdus)  # held until the initiator's first FPDU (MPA-25)
    pair.initiator.send_ulpdus(ulpdus)
    stream = bytes(pair.initiator.data_to_send())
    pos = 0
    for cut in [*cuts, len(stream)]:
        if stream[pos : pos + cut]:  # b"" would mean FIN
            pair.responder.receive_data(stream[pos : pos + cut])
        pos += cut
    got = ulpdus_of(drain(pair.responder))
    assert got == ulpdus
    back = bytes(pair.responder.data_to_send())
    pair.initiator.receive_data(back)
    assert ulpdus_of(drain(pair.initiator)) == ulpdus


@settings(max_examples=150, deadline=None)
@given(
    role=st.sampled_from([Role.INITIATOR, Role.RESPONDER]),
    data=st.lists(st.binary(max_size=300), max_size=5),
    prefix=st.sampled_from([b"", b"MPA ID Req Frame", b"MPA ID Rep Frame"]),
)
def test_mpa_random_bytes_never_raise(role: Role, data: list[bytes], prefix: bytes) -> None:
    conn = MpaConnection(role, S())
    if role is Role.INITIATOR:
        conn.initiate(0.0)
    else:
        conn.start(0.0)
    chunks = [prefix + data[0], *data[1:]] if data else [prefix]
    for chunk in chunks:
        if chunk:
            conn.receive_data(chunk)
        events = drain(conn)
        if any(isinstance(e, RequestReceived) for e in events):
            conn.accept()
    for event in drain(conn):
        if isinstance(event, ConnectionFailed):
            assert isinstance(event.error, MpaError | ConnectionTimeout)


@settings(max_examples=150, deadline=None)
@given(
    flips=st.lists(st.tuples(st.integers(0, 10**6), st.integers(1, 255)), min_size=1, max_size=3),
    markers=st.booleans(),
)
def test_mpa_mutated_handshake_and_stream_never_raise(
    flips: list[tuple[int, int]], markers: bool
) -> None:
    pair = ConnectionPair(S(want_markers=markers, p2p=True), S(want_markers=markers))
    pair.responder.start(0.0)
    pair.initiator.initiate(0.0, b"private")
    request = bytearray(pair.initiator.data_to_send())
    framer = FpduFramer(markers=markers)
    stream = request + b"".join(bytes(framer.frame(bytes([i]) * 600)) for i in range(3))
    for where, xor in flips:
        stream[where % len(stream)] ^= xor
    pair.responder.receive_data(bytes(stream))
    for event in drain(pair.responder):
        if isinstance(event, RequestReceived):
            pair.responder.accept()
    drain(pair.responder)
    reply = bytearray(pair.responder.data_to_send())
    if reply:
        reply[flips[0][0] % len(reply)] ^= flips[0][1]
        pair.initiator.receive_data(bytes(reply))
    for event in drain(pair.initiator):
        assert not isinstance(event, UlpduReceived)
