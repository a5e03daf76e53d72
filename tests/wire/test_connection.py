"""IwarpConnection: MPA startup failures that still owe the peer a Terminate (ERC-09)."""

from __future__ import annotations

from stack.constants import TERM_LLP_NO_MATCHING_RTR, Opcode, RtrType
from stack.wire.connection import IwarpConnection
from stack.wire.events import ConnectionFailed, IrdOrd, MpaFrame, MpaSettings, Role, Terminate
from stack.wire.framing import FpduDeframer
from stack.wire.mpa import encode_frame
from stack.wire.rdmap import decode_ulpdu


def _initiator_after(settings: MpaSettings, reply: MpaFrame) -> IwarpConnection:
    conn = IwarpConnection(Role.INITIATOR, settings)
    conn.initiate(0.0)
    conn.data_to_send()
    conn.receive_data(encode_frame(reply))
    return conn


def test_erc_09_no_matching_rtr_sends_terminate_2_0_7_before_close() -> None:
    """Linux siw answers a Send-only RTR offer with Write RTR: Terminate 2/0/7, then close."""
    reply = MpaFrame(reply=True, rev=2, crc=True, ird_ord=IrdOrd(1, 1, True, RtrType.WRITE))
    conn = _initiator_after(MpaSettings(p2p=True, rtr=RtrType.SEND), reply)
    event = conn.next_event()
    assert isinstance(event, ConnectionFailed) and event.close
    assert event.terminate == TERM_LLP_NO_MATCHING_RTR
    deframer = FpduDeframer(crc=True, markers=False)
    deframer.feed(conn.data_to_send())
    [ulpdu] = list(deframer)
    segment = decode_ulpdu(ulpdu)
    message = segment.header
    assert segment.opcode == Opcode.TERMINATE and segment.qn == 2 and segment.msn == 1
    assert isinstance(message, Terminate)
    assert (message.layer, message.etype, message.code) == tuple(TERM_LLP_NO_MATCHING_RTR)
    assert conn.terminate_sent
    assert conn.data_to_send() == b""  # one Terminate only (RDMAP-10)


def test_erc_09_plain_reject_sends_no_terminate() -> None:
    conn = _initiator_after(MpaSettings(), MpaFrame(reply=True, rev=2, reject=True))
    conn.next_event()
    assert conn.data_to_send() == b"" and not conn.terminate_sent
