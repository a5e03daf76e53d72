"""A responder that sends first on purpose (MPA-25 waived), as Linux siw's responder does."""

from __future__ import annotations

import pytest

from stack.errors import LocalError
from stack.wire.events import Established, MpaSettings, Role, UlpduReceived
from stack.wire.framing import FpduFramer
from stack.wire.mpa import MpaConnection
from tests.wire.helpers_mpa import ConnectionPair, drain, of_type


def test_send_first_releases_held_fpdus_and_sends_at_once() -> None:
    pair = ConnectionPair()
    pair.handshake()
    responder = pair.responder
    assert responder.awaiting_first_fpdu
    responder.send_ulpdu(b"held")
    assert responder.data_to_send() == b""
    responder.send_first()
    assert not responder.awaiting_first_fpdu
    responder.send_ulpdu(b"then")
    framer = FpduFramer()
    assert responder.data_to_send() == b"".join(bytes(framer.frame(u)) for u in (b"held", b"then"))


def test_send_first_reaches_an_initiator_that_has_sent_nothing() -> None:
    pair = ConnectionPair()
    pair.handshake()
    pair.responder.send_first()
    pair.responder.send_ulpdu(b"server first")
    ev_i, _ = pair.pump()
    assert [bytes(e.ulpdu) for e in of_type(ev_i, UlpduReceived)] == [b"server first"]
    pair.initiator.send_ulpdu(b"answer")
    _, ev_r = pair.pump()
    assert [bytes(e.ulpdu) for e in of_type(ev_r, UlpduReceived)] == [b"answer"]


def test_first_fpdu_ends_the_wait_without_send_first() -> None:
    pair = ConnectionPair()
    pair.handshake()
    pair.initiator.send_ulpdu(b"initiator first")
    pair.pump()
    assert not pair.responder.awaiting_first_fpdu
    pair.responder.send_first()  # nothing held: no effect
    assert pair.responder.data_to_send() == b""


def test_send_first_refused_in_peer_to_peer_mode() -> None:
    """ERC-09: with P2P the initiator's RTR is the first FPDU."""
    pair = ConnectionPair(MpaSettings(p2p=True), MpaSettings(p2p=True))
    pair.start()
    pair.responder.accept()
    assert pair.responder.negotiated is not None and pair.responder.negotiated.p2p
    with pytest.raises(LocalError, match="peer-to-peer"):
        pair.responder.send_first()
    assert pair.responder.awaiting_first_fpdu


def test_send_first_refused_for_the_initiator_and_before_full_operation() -> None:
    initiator = MpaConnection(Role.INITIATOR)
    with pytest.raises(LocalError, match="responder"):
        initiator.send_first()
    responder = MpaConnection(Role.RESPONDER)
    responder.start(0.0)
    with pytest.raises(LocalError, match="Full Operation"):
        responder.send_first()
    assert not responder.awaiting_first_fpdu


def test_initiator_never_awaits_a_first_fpdu() -> None:
    pair = ConnectionPair()
    ev_i, _ = pair.handshake()
    assert of_type(ev_i, Established)
    assert not pair.initiator.awaiting_first_fpdu
    assert drain(pair.initiator) == []
