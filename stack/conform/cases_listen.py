"""MPA startup cases with the DUT connecting: the runner is the MPA Responder (RFC 5044
§7.1, RFC 6581 §5-§10); ``iwarp conform --listen``.

The DUT's application (``rping -c`` ...) connects once per case and sends its Request; the
runner judges it and answers with a Reply: the responder engine's valid one, or that Reply
edited.  What a conforming initiator does with each Reply is asked of the wire core
(:func:`~stack.conform.expected.initiator_expects`); the runner then watches the DUT's
first FPDU, Terminate or close.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from stack.conform.context import CaseContext
from stack.conform.expect import expect_close, judge_first_terminate
from stack.conform.expected import Expected, initiator_expects
from stack.conform.model import DutRole, Verdict
from stack.conform.peer import Peer
from stack.conform.peer_core import Eof, FramingBad, PduSeen
from stack.conform.registry import case
from stack.conform.script import (
    Answer,
    Reply,
    describe_frame,
    read_request,
    reply_valid,
    terminate_line,
)
from stack.constants import (
    MPA_KEY_LEN,
    MPA_KEY_REQ,
    MPA_MAX_PRIVATE_DATA,
    MPA_RESERVED_MASK,
    MPA_V2_IRD_ORD_MAX,
    MPA_V2_NO_NEGOTIATION,
    Opcode,
    RtrType,
)
from stack.wire.events import MpaFrame, MpaSettings, Terminate
from stack.wire.mpa_frames import decode_frame, encode_frame
from stack.wire.mpa_rules import RTR_ORDER

RESPONDER = MpaSettings()
"""The runner's responder choices: RFC 6581, CRC requested, every RTR kind."""

_L = DutRole.CONNECTS


@dataclass
class _Asked:
    """The DUT's connection and its Request: peer, answer, request (the frame), raw."""

    peer: Peer
    answer: Answer
    request: MpaFrame
    raw: bytes

    def valid(self, settings: MpaSettings = RESPONDER) -> Reply:
        """The responder engine's Reply to the Request under ``settings``."""
        return reply_valid(self.raw, settings)


async def _request(ctx: CaseContext) -> _Asked | Verdict:
    """Accept the DUT's connection and read its Request; a verdict when there is no usable
    Request (the case cannot go on)."""
    peer, answer = await read_request(ctx)
    if answer.kind != "request" or answer.seen is None:
        return Verdict.broken(f"no usable Request from the DUT: {answer.describe()}")
    return _Asked(peer, answer, answer.seen.frame, answer.seen.raw)


async def _answer(
    ctx: CaseContext, asked: _Asked, valid: Reply, reply: bytes
) -> tuple[Expected, object]:
    """Send ``reply`` (``valid`` or an edit of it that keeps its C and M bits), frame as the
    responder engine negotiated ``valid``, and watch the DUT: returns what the wire core
    expects and the DUT's first event (a PDU, a framing error, the close; None: silence)."""
    expected = initiator_expects(asked.request, reply)
    await asked.peer.send_raw(reply)
    neg = valid.negotiated
    asked.peer.core.start_framing(crc=neg.crc, markers_tx=neg.markers_tx, markers_rx=neg.markers_rx)
    return expected, await asked.peer.next_event(ctx.options.timeout)


def _pdu_line(peer: Peer, pdu: PduSeen) -> tuple[str, int | None]:
    frame = peer.frame_of_dut(pdu.offset + pdu.wire_len - 1)
    seg = pdu.segment
    if seg is None:
        return f"an undecodable FPDU (frame {frame})", frame
    if isinstance(seg.header, Terminate):
        return f"{terminate_line(seg.header)} (frame {frame})", frame
    return f"{seg.opcode_name}, {len(seg.payload)} bytes (frame {frame})", frame


async def _must_close(ctx: CaseContext, asked: _Asked, valid: Reply, reply: bytes) -> Verdict:
    """The DUT must refuse ``reply`` by closing, before any FPDU of Full Operation."""
    peer = asked.peer
    expected, event = await _answer(ctx, asked, valid, reply)
    want = expected.line()
    if event is None:
        return Verdict.not_met(
            f"neither closed nor sent anything within {ctx.options.timeout:g} s", want
        )
    if isinstance(event, Eof):
        return Verdict.met("closed the connection without an FPDU", want)
    if isinstance(event, PduSeen):
        line, frame = _pdu_line(peer, event)
        seg = event.segment
        if seg is not None and seg.opcode == Opcode.TERMINATE:
            closed, _more = await expect_close(peer, ctx.options.timeout)
            if closed:
                return Verdict.met(f"sent {line}, then closed", want,
                                   "RFC 5044 §7.1.2 only asks for the close")  # fmt: skip
        return Verdict.not_met(f"went on into Full Operation: {line}", want, frame=frame)
    closed, more = await expect_close(peer, ctx.options.timeout)
    if closed:
        return Verdict.met("sent bytes that are no FPDU, then closed", want, *more)
    return Verdict.not_met("sent bytes that are no FPDU and stayed open", want, *more)


async def _must_terminate(ctx: CaseContext, asked: _Asked, valid: Reply, reply: bytes) -> Verdict:
    """The DUT must answer ``reply`` with the Terminate the wire core sends (ERC-04, ERC-09)."""
    expected, event = await _answer(ctx, asked, valid, reply)
    want = expected.line()
    if expected.kind != "terminate" or expected.term is None:  # pragma: no cover - case error
        return Verdict.broken(f"the wire core sends no Terminate here: {want}")
    verdict = judge_first_terminate(asked.peer, event, expected.term, ctx.options.timeout)
    return verdict.with_evidence(want)


async def _must_continue(
    ctx: CaseContext, asked: _Asked, valid: Reply, reply: bytes, what: str
) -> Verdict:
    """The Reply is acceptable: the DUT's first FPDU must follow and deframe cleanly."""
    peer = asked.peer
    expected, event = await _answer(ctx, asked, valid, reply)
    want = expected.line()
    if isinstance(event, PduSeen):
        line, frame = _pdu_line(peer, event)
        seg = event.segment
        if seg is not None and isinstance(seg.header, Terminate):
            return Verdict.not_met(f"refused the Reply: {line}", want, frame=frame)
        return Verdict.met(f"its first FPDU followed: {line}", want, what)
    if isinstance(event, FramingBad):
        frame = peer.frame_of_dut(event.offset)
        return Verdict.not_met(f"its first FPDU breaks framing: {event.error}", want,
                               rule=event.error.rule, frame=frame)  # fmt: skip
    if isinstance(event, Eof):
        return Verdict.not_met("closed instead of sending its first FPDU", want)
    return Verdict.not_met(f"no FPDU within {ctx.options.timeout:g} s", want)


def _edit(raw: bytes, at: int, value: int) -> bytes:
    return raw[:at] + bytes([value]) + raw[at + 1 :]


def _reframe(raw: bytes, **changes: Any) -> bytes:
    """The frame ``raw`` with fields changed, encoded even past the PD_Length limit."""
    decoded = decode_frame(raw, max_private_data=0xFFFF)
    assert decoded is not None
    return encode_frame(replace(decoded[0], **changes), max_private_data=None)


# ======================================================================================
# The DUT's Request (RFC 5044 §7.1.1, RFC 6581 §6, §9.2)
# ======================================================================================


@case(
    "MPA-19",
    "The DUT's Request: reserved bits 0, R=0, S only with Rev 2, RTR flags only with A=1",
    n=3,
    rules=("MPA-18", "ERC-01", "ERC-07", "MPA-21"),
    dut=_L,
    sends="nothing: the runner reads the DUT's Request",
    expects="a readable Request that breaks no startup rule of the lenient judge",
)
async def dut_request(ctx: CaseContext) -> Verdict:
    peer, answer = await read_request(ctx)
    if answer.kind == "request" and answer.seen is not None:
        rows = [f"{f.rule}: {f.detail}" for f in answer.seen.findings]
        if rows:
            return Verdict.not_met(answer.describe(), *rows, rule=rows[0].split(":")[0],
                                   frame=answer.frame)  # fmt: skip
        return Verdict.met(answer.describe())
    if answer.kind in ("reply", "reject"):
        return Verdict.not_met(f"sent a Reply key: {answer.describe()}", rule="MPA-18",
                               frame=answer.frame)  # fmt: skip
    if answer.bad is not None:
        return Verdict.not_met(answer.describe(), rule=answer.bad.error.rule, frame=answer.frame)
    return Verdict.broken(f"no Request: {answer.describe()}")


# ======================================================================================
# Replies the DUT must refuse (RFC 5044 §7.1.1, §7.1.2(3), (5), (8))
# ======================================================================================


@case(
    "MPA-18",
    "Reply with a wrong key: the DUT closes the connection",
    n=3,
    rules=("MPA-28",),
    dut=_L,
    sends="the responder engine's Reply with the last key byte changed",
    expects="TCP closed before any FPDU (a Terminate first is tolerated)",
)
async def reply_wrong_key(ctx: CaseContext) -> Verdict:
    asked = await _request(ctx)
    if isinstance(asked, Verdict):
        return asked
    valid = asked.valid()
    reply = valid.raw[: MPA_KEY_LEN - 1] + b"X" + valid.raw[MPA_KEY_LEN:]
    return await _must_close(ctx, asked, valid, reply)


@case(
    "MPA-26",
    "Request key in the Reply (initiator/initiator): the DUT closes the connection",
    n=2,
    level="MUST",
    dut=_L,
    sends="the responder engine's Reply with the Request key",
    expects="TCP closed before any FPDU",
)
async def reply_request_key(ctx: CaseContext) -> Verdict:
    asked = await _request(ctx)
    if isinstance(asked, Verdict):
        return asked
    valid = asked.valid()
    return await _must_close(ctx, asked, valid, MPA_KEY_REQ + valid.raw[MPA_KEY_LEN:])


@case(
    "MPA-20",
    "Reply with a revision above the Request's: the DUT closes the connection",
    n=4,
    dut=_L,
    sends="the responder engine's Reply with Rev = the Request's Rev + 1",
    expects="TCP closed before any FPDU",
)
async def reply_high_rev(ctx: CaseContext) -> Verdict:
    asked = await _request(ctx)
    if isinstance(asked, Verdict):
        return asked
    valid = asked.valid()
    return await _must_close(ctx, asked, valid, _edit(valid.raw, 17, asked.request.rev + 1))


@case(
    "MPA-21",
    "Reply with PD_Length 513: the DUT closes the connection",
    n=7,
    dut=_L,
    sends="the responder engine's Reply with 513 bytes of private data",
    expects="TCP closed before any FPDU",
)
async def reply_pd_513(ctx: CaseContext) -> Verdict:
    asked = await _request(ctx)
    if isinstance(asked, Verdict):
        return asked
    valid = asked.valid()
    word = 4 if valid.frame.ird_ord is not None else 0
    reply = _reframe(valid.raw, private_data=bytes(MPA_MAX_PRIVATE_DATA + 1 - word))
    return await _must_close(ctx, asked, valid, reply)


@case(
    "MPA-24",
    "Rejecting Reply (R=1): the DUT sends no FPDU",
    dut=_L,
    sends="a Reply with R=1 (the responder engine's reject)",
    expects="no FPDU; the DUT leaves MPA (closing is allowed)",
)
async def reply_reject(ctx: CaseContext) -> Verdict:
    asked = await _request(ctx)
    if isinstance(asked, Verdict):
        return asked
    valid = asked.valid()
    peer = asked.peer
    expected, event = await _answer(ctx, asked, valid, _reframe(valid.raw, reject=True))
    if event is None:
        return Verdict.met(f"sent nothing for {ctx.options.timeout:g} s", expected.line())
    if isinstance(event, Eof):
        return Verdict.met("closed without an FPDU", expected.line())
    if isinstance(event, PduSeen):
        line, frame = _pdu_line(peer, event)
        return Verdict.not_met(f"sent an FPDU after the rejection: {line}", expected.line(),
                               frame=frame)  # fmt: skip
    return Verdict.not_met("sent bytes after the rejection", expected.line())


@case(
    "MPA-27",
    "No Reply: the DUT's startup timer closes the connection",
    n=2,
    dut=_L,
    sends="nothing after the DUT's Request, for up to --startup-timeout seconds",
    expects="the DUT gives up waiting for the Reply and closes",
    slow=True,
)
async def no_reply(ctx: CaseContext) -> Verdict:
    asked = await _request(ctx)
    if isinstance(asked, Verdict):
        return asked
    closed, lines = await expect_close(asked.peer, ctx.options.startup_timeout)
    if closed:
        return Verdict.met("closed the connection", *lines)
    return Verdict.not_met(f"still waiting after {ctx.options.startup_timeout:g} s", *lines)


# ======================================================================================
# Replies the DUT must take (RFC 5044 §4.3, §4.4, §7.1.1)
# ======================================================================================


@case(
    "MPA-19",
    "Reply with reserved flag bits (0x0F) set: not checked",
    n=4,
    dut=_L,
    sends="the responder engine's Reply with flag bits 0x0F set",
    expects="the DUT's first FPDU follows",
)
async def reply_reserved(ctx: CaseContext) -> Verdict:
    asked = await _request(ctx)
    if isinstance(asked, Verdict):
        return asked
    valid = asked.valid()
    reply = _edit(valid.raw, 16, valid.raw[16] | MPA_RESERVED_MASK)
    return await _must_continue(ctx, asked, valid, reply, "reserved bits were ignored")


@case(
    "MPA-09",
    "Reply with M=1: the DUT puts markers in its FPDUs",
    n=2,
    rules=("MPA-07", "MPA-08"),
    dut=_L,
    sends="the responder engine's Reply asking for markers (M=1)",
    expects="the DUT's FPDUs carry a marker every 512 octets from SeqStart (FPDUPTR 0 "
    "before its first FPDU); a close without FPDU declines markers (SKIP)",
)
async def reply_markers(ctx: CaseContext) -> Verdict:
    asked = await _request(ctx)
    if isinstance(asked, Verdict):
        return asked
    valid = asked.valid(replace(RESPONDER, want_markers=True))
    verdict = await _must_continue(ctx, asked, valid, valid.raw, "its markers were valid")
    events = asked.peer.events
    if asked.peer.closed_by_dut and not any(isinstance(e, PduSeen | FramingBad) for e in events):
        return Verdict.declined("closed without an FPDU: markers declined")
    return verdict


@case(
    "MPA-11",
    "Reply with C=1: CRC both ways",
    n=3,
    dut=_L,
    sends="the responder engine's Reply with C=1",
    expects="the DUT's first FPDU carries a valid CRC",
)
async def reply_crc(ctx: CaseContext) -> Verdict:
    asked = await _request(ctx)
    if isinstance(asked, Verdict):
        return asked
    valid = asked.valid()
    assert valid.frame.crc and valid.negotiated.crc
    return await _must_continue(ctx, asked, valid, valid.raw, "its CRC was valid")


# ======================================================================================
# RFC 6581 (§9.1, §9.2)
# ======================================================================================


def _enhanced(asked: _Asked) -> Verdict | None:
    if asked.request.ird_ord is None:
        return Verdict.not_applicable(
            f"the DUT's Request is not enhanced: {asked.answer.describe()}"
        )
    return None


@case(
    "ERC-04",
    "Reply ORD above the DUT's IRD: the DUT sends Terminate 2/0/0x06",
    n=2,
    dut=_L,
    sends="the responder engine's Reply with ORD = the DUT's IRD + 1",
    expects="the wire core's Terminate for it (Insufficient IRD resources), no headers",
)
async def reply_ord_too_big(ctx: CaseContext) -> Verdict:
    asked = await _request(ctx)
    if isinstance(asked, Verdict):
        return asked
    skip = _enhanced(asked)
    if skip is not None:
        return skip
    word = asked.request.ird_ord
    assert word is not None
    if word.ird >= MPA_V2_IRD_ORD_MAX - 1 or word.ird == MPA_V2_NO_NEGOTIATION:
        return Verdict.not_applicable(f"the DUT's IRD {word.ird:#x} leaves no larger ORD")
    valid = asked.valid()
    assert valid.frame.ird_ord is not None
    reply = _reframe(valid.raw, ird_ord=replace(valid.frame.ird_ord, ord=word.ird + 1))
    return await _must_terminate(ctx, asked, valid, reply)


def _p2p(asked: _Asked) -> RtrType | Verdict:
    """The RTR kinds the DUT offers, or the SKIP verdict of a DUT that is not peer-to-peer."""
    skip = _enhanced(asked)
    if skip is not None:
        return skip
    word = asked.request.ird_ord
    assert word is not None
    if not word.p2p:
        return Verdict.not_applicable(
            f"the DUT's Request is not peer-to-peer: {asked.answer.describe()}"
        )
    return RtrType(word.rtr)


@case(
    "ERC-08",
    "Peer-to-peer Request, Reply with A=0: the DUT sends Terminate 2/0/0x07",
    n=4,
    dut=_L,
    sends="the responder engine's Reply with the A bit cleared",
    expects="the wire core's Terminate for it (No matching RTR model)",
)
async def reply_no_a(ctx: CaseContext) -> Verdict:
    asked = await _request(ctx)
    if isinstance(asked, Verdict):
        return asked
    offered = _p2p(asked)
    if isinstance(offered, Verdict):
        return offered
    valid = asked.valid()
    assert valid.frame.ird_ord is not None
    word = replace(valid.frame.ird_ord, p2p=False, rtr=RtrType.NONE)
    return await _must_terminate(ctx, asked, valid, _reframe(valid.raw, ird_ord=word))


@case(
    "ERC-09",
    "Peer-to-peer: the DUT's first FPDU is the RTR both sides flagged",
    dut=_L,
    sends="a Reply flagging exactly one RTR kind the DUT offered",
    expects="the DUT's first FPDU is that zero-length RTR (the capture decoder's ERC-09 check)",
)
async def first_fpdu_rtr(ctx: CaseContext) -> Verdict:
    asked = await _request(ctx)
    if isinstance(asked, Verdict):
        return asked
    offered = _p2p(asked)
    if isinstance(offered, Verdict):
        return offered
    kind = next((k for k in RTR_ORDER if k & offered), None)
    if kind is None:
        return Verdict.not_met(f"offers no RTR kind: {asked.answer.describe()}", rule="ERC-07")
    valid = asked.valid(replace(RESPONDER, rtr=kind))
    verdict = await _must_continue(ctx, asked, valid, valid.raw, f"{kind.name} RTR flagged")
    found = [f for f in asked.peer.capture.dut_findings() if f.rule == "ERC-09"]
    if found and verdict.outcome.value == "met":
        return Verdict.not_met(str(found[0]), describe_frame(valid.frame), frame=found[0].frame)
    return verdict


@case(
    "ERC-09",
    "Peer-to-peer, no RTR kind in common: the DUT sends Terminate 2/0/0x07",
    n=2,
    dut=_L,
    sends="a Reply flagging only an RTR kind the DUT did not offer",
    expects="the wire core's Terminate for it (No matching RTR model)",
)
async def no_common_rtr(ctx: CaseContext) -> Verdict:
    asked = await _request(ctx)
    if isinstance(asked, Verdict):
        return asked
    offered = _p2p(asked)
    if isinstance(offered, Verdict):
        return offered
    other = next((k for k in RTR_ORDER if not k & offered), None)
    if other is None:
        return Verdict.not_applicable("the DUT offers every RTR kind: none can be missing")
    valid = asked.valid()
    assert valid.frame.ird_ord is not None
    reply = _reframe(valid.raw, ird_ord=replace(valid.frame.ird_ord, rtr=other))
    return await _must_terminate(ctx, asked, valid, reply)
