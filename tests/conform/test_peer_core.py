"""The scripted peer's sans-IO core and the wire-core expectations, without sockets."""

from __future__ import annotations

import pytest

from stack.conform.expected import framing_expects, initiator_expects, responder_expects
from stack.conform.peer_core import (
    Craft,
    Eof,
    FramingBad,
    PduSeen,
    PeerCore,
    PeerEvent,
    StartupBad,
    StartupSeen,
)
from stack.constants import (
    MPA_KEY_REP,
    TERM_LLP_CRC_ERROR,
    TERM_LLP_INSUFFICIENT_IRD,
    TERM_LLP_INVALID_STARTUP,
    TERM_LLP_MARKER_MISMATCH,
    Opcode,
)
from stack.crc import crc32c
from stack.wire.events import MpaFrame, MpaSettings, Role, Send
from stack.wire.framing import FpduDeframer, FpduFramer
from stack.wire.mpa import MpaConnection
from stack.wire.mpa_frames import decode_frame
from stack.wire.rdmap import decode_ulpdu

DEFAULT = MpaSettings()


def _request(settings: MpaSettings = DEFAULT) -> bytes:
    engine = MpaConnection(Role.INITIATOR, settings)
    engine.initiate(0.0)
    return bytes(engine.data_to_send())


def _reply(request: bytes, settings: MpaSettings = DEFAULT) -> bytes:
    engine = MpaConnection(Role.RESPONDER, settings)
    engine.start(0.0)
    engine.receive_data(request)
    engine.next_event()
    engine.accept()
    return bytes(engine.data_to_send())


def _events(core: PeerCore) -> list[PeerEvent]:
    out: list[PeerEvent] = []
    while (e := core.next_event()) is not None:
        out.append(e)
    return out


def _framed_core(*, crc: bool = True, markers: bool = False) -> PeerCore:
    core = PeerCore()
    core.start_framing(crc=crc, markers_tx=markers, markers_rx=markers)
    return core


# -- outbound: crafted FPDUs are what the wire core's deframer says they are --------------


def test_plain_fpdus_are_the_framers() -> None:
    core = _framed_core()
    ulpdu = core.ulpdus(Send(b"hello"))[0]
    sent = core.fpdu(ulpdu)
    assert sent.data == bytes(FpduFramer().frame(ulpdu))
    assert framing_expects(sent).kind == "accept"


def test_msns_count_per_queue() -> None:
    core = _framed_core()
    first, second = (decode_ulpdu(core.ulpdus(Send(b"x"))[0]) for _ in range(2))
    assert (first.msn, second.msn) == (1, 2)


@pytest.mark.parametrize("markers", [False, True])
def test_bad_crc_is_the_wire_cores_crc_error(markers: bool) -> None:
    core = _framed_core(markers=markers)
    sent = core.fpdu(core.ulpdus(Send(b"x" * 700))[0], Craft(bad_crc=True))
    expected = framing_expects(sent)
    assert (expected.kind, expected.rule, expected.term) == (
        "terminate",
        "MPA-12",
        TERM_LLP_CRC_ERROR,
    )


@pytest.mark.parametrize("offset_fpdus", [0, 3])
def test_pad_octets_are_covered_by_a_good_crc(offset_fpdus: int) -> None:
    core = _framed_core(markers=True)
    for _ in range(offset_fpdus):
        core.fpdu(core.ulpdus(Send(b"y" * 301))[0])
    ulpdu = core.ulpdus(Send(b"abc"))[0]  # 2 + 21 octets: 1 of PAD
    sent = core.fpdu(ulpdu, Craft(pad=b"\xff"))
    deframer = FpduDeframer(markers=True, offset=sent.seq_offset)
    deframer.feed(sent.data)
    assert bytes(deframer.next_ulpdu() or b"") == ulpdu
    plain = sent.data if offset_fpdus else sent.data[4:]  # the leading marker at SeqStart
    assert b"\xff" in plain[-5:-4]


def test_wrong_marker_pointer_is_a_marker_mismatch() -> None:
    core = _framed_core(markers=True)
    sent = core.fpdu(core.ulpdus(Send(b"z" * 20))[0], Craft(marker_ptr=4))
    assert framing_expects(sent).term == TERM_LLP_MARKER_MISMATCH


def test_an_announced_length_beyond_mulpdu_is_the_length_error() -> None:
    core = _framed_core()
    sent = core.fpdu(core.ulpdus(Send(b"q"))[0], Craft(length=0xFFFF))
    assert sent.data[:2] == b"\xff\xff"
    expected = framing_expects(sent)
    assert (expected.rule, expected.term) == ("MPA-16", TERM_LLP_CRC_ERROR)


def test_crc_field_value_and_replaced_ulpdu() -> None:
    core = _framed_core(crc=False)
    sent = core.fpdu(b"\x41\x43" + bytes(16), Craft(crc=0xDEADBEEF, ulpdu=b"\x41\x7f" + bytes(16)))
    assert sent.ulpdu[1] == 0x7F
    assert sent.data[-4:] == (0xDEADBEEF).to_bytes(4, "little")
    assert crc32c(sent.data[:-4]) != 0xDEADBEEF


# -- inbound: startup frames, FPDUs, framing errors, the close ------------------------------


def test_reply_is_parsed_and_judged_against_the_request() -> None:
    request = _request()
    reply = bytearray(_reply(request))
    reply[17] = 3  # Rev 3 to a Rev 2 Request
    core = PeerCore()
    core.expect_startup("reply", _frame(request))
    core.receive(bytes(reply[:7]))
    assert _events(core) == []
    core.receive(bytes(reply[7:]))
    (seen,) = _events(core)
    assert isinstance(seen, StartupSeen) and seen.frame.rev == 3
    assert [f.rule for f in seen.findings if f.fatal] == ["MPA-20"]


def _frame(raw: bytes) -> MpaFrame:
    decoded = decode_frame(raw)
    assert decoded is not None
    return decoded[0]


def test_unreadable_startup_bytes() -> None:
    core = PeerCore()
    core.expect_startup("request")
    core.receive(b"GET / HTTP/1.1\r\n")
    (bad,) = _events(core)
    assert isinstance(bad, StartupBad) and bad.error.rule == "MPA-18"


def test_fpdus_after_the_frame_in_the_same_chunk_wait_for_framing() -> None:
    request = _request()
    reply = _reply(request)
    fpdu = bytes(FpduFramer().frame(b"\x41\x43" + bytes(16)))
    core = PeerCore()
    core.expect_startup("reply", _frame(request))
    core.receive(reply + fpdu)
    (seen,) = _events(core)
    assert isinstance(seen, StartupSeen) and seen.length == len(reply)
    core.start_framing(crc=True, markers_tx=False, markers_rx=False)
    (pdu,) = _events(core)
    assert isinstance(pdu, PduSeen) and pdu.offset == len(reply)
    assert pdu.segment is not None and pdu.segment.opcode == Opcode.SEND
    core.receive(b"\x00\x10garbage-and-more-bytes-here")
    (bad,) = _events(core)
    assert isinstance(bad, FramingBad) and bad.offset == len(reply) + len(fpdu)
    core.receive(b"")
    (eof,) = _events(core)
    assert isinstance(eof, Eof) and not eof.reset


# -- what the engines expect ----------------------------------------------------------------


def test_responder_expectations() -> None:
    request = _request()
    assert responder_expects(request).kind == "accept"
    assert responder_expects(request[:10]).kind == "wait"
    wrong = responder_expects(MPA_KEY_REP + request[16:])
    assert (wrong.kind, wrong.rule, wrong.term) == ("close", "MPA-18", TERM_LLP_INVALID_STARTUP)
    rev = responder_expects(request[:17] + b"\x07" + request[18:])
    assert (rev.kind, rev.rule) == ("close", "MPA-20")


def test_initiator_expectations() -> None:
    request = _request(MpaSettings(ird=1, ord=1))
    frame = _frame(request)
    reply = _reply(request)
    assert initiator_expects(frame, reply).kind == "accept"
    big = _reply(request, MpaSettings(ird=1, ord=1))
    ord_bytes = bytearray(big)
    ord_bytes[22:24] = (5).to_bytes(2, "big")  # Reply ORD 5 > our IRD 1
    expected = initiator_expects(frame, bytes(ord_bytes))
    assert (expected.kind, expected.term) == ("terminate", TERM_LLP_INSUFFICIENT_IRD)


def test_the_duts_sequencing_is_judged_leniently() -> None:
    """A DUT whose first Send carries MSN 2 breaks DDP-05: the finding rides on the PDU."""
    sender = _framed_core()
    sender.ulpdus(Send(b"skipped"))  # MSN 1 is never sent
    second = sender.ulpdus(Send(b"x"))[0]
    core = _framed_core()
    core.receive(bytes(FpduFramer().frame(second)))
    (pdu,) = _events(core)
    assert isinstance(pdu, PduSeen)
    assert [(f.rule, f.fatal) for f in pdu.findings] == [("DDP-05", True)]
