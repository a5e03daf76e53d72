"""MPA startup cases with the DUT listening: the runner is the MPA Initiator (RFC 5044
§7.1, RFC 6581 §5-§10).

Each case sends one Request (valid, edited or raw) and judges the DUT's answer; the ones
about valid Requests then run the application exchange to show Full Operation works.  What
a malformed Request must lead to is asked of the wire core
(:func:`~stack.conform.expected.responder_expects`).
"""

from __future__ import annotations

from dataclasses import replace

from stack.conform.context import CaseContext
from stack.conform.expect import expect_close, expect_silence
from stack.conform.expected import (
    judge_accepted,
    judge_refusal,
    responder_expects,
    startup_violations,
    work_verdict,
)
from stack.conform.model import Outcome, Verdict
from stack.conform.registry import case
from stack.conform.script import (
    Edit,
    Startup,
    converse,
    describe_frame,
    need_established,
    read_answer,
    send_request,
    start,
)
from stack.constants import (
    MPA_FRAME_HEADER_LEN,
    MPA_KEY_LEN,
    MPA_KEY_REP,
    MPA_KEY_REQ,
    MPA_MAX_PRIVATE_DATA,
    MPA_RESERVED_MASK,
    MPA_V2_NO_NEGOTIATION,
    TERM_LLP_CRC_ERROR,
    TERM_LLP_MARKER_MISMATCH,
    MpaFlag,
    Opcode,
    RtrType,
)
from stack.wire.events import ConnectionFailed, MpaFrame, MpaSettings, Role
from stack.wire.mpa import MpaConnection
from stack.wire.mpa_frames import decode_frame, encode_frame
from stack.wire.rdmap import Segment

# ======================================================================================
# Building Requests
# ======================================================================================


def valid_request(settings: MpaSettings, private_data: bytes = b"") -> bytes:
    """The initiator engine's Request for ``settings``."""
    engine = MpaConnection(Role.INITIATOR, settings)
    engine.initiate(0.0, private_data)
    return bytes(engine.data_to_send())


def set_flags(mask: int) -> Edit:
    """Set flag bits (frame byte 16) of the Request."""
    return lambda raw: raw[:16] + bytes([raw[16] | mask]) + raw[17:]


def set_rev(rev: int) -> Edit:
    """Change the Rev byte (frame byte 17) of the Request."""
    return lambda raw: raw[:17] + bytes([rev]) + raw[18:]


def with_private_data(settings: MpaSettings, total: int) -> bytes:
    """The app's Request with PD_Length ``total`` (the RFC 6581 word included), even past
    the limit of 512 (MPA-21)."""
    frame = _frame_of(valid_request(settings))
    word = 4 if frame.ird_ord is not None else 0
    pd = bytes((i * 7 + 1) & 0xFF for i in range(max(0, total - word)))
    return encode_frame(replace(frame, private_data=pd), max_private_data=None)


def _frame_of(raw: bytes) -> MpaFrame:
    decoded = decode_frame(raw, max_private_data=0xFFFF)
    assert decoded is not None
    return decoded[0]


def _app(ctx: CaseContext) -> MpaSettings:
    return ctx.app.settings


async def _refused(ctx: CaseContext, raw: bytes, *, reject_ok: bool = True) -> Verdict:
    """Send ``raw`` as the Request; the DUT must close (as the wire core does)."""
    expected = responder_expects(raw)
    if expected.kind not in ("close", "reject"):  # pragma: no cover - case definition error
        return Verdict.broken(f"the wire core does not refuse this Request: {expected.line()}")
    s = await start(ctx, raw=raw)
    return await judge_refusal(ctx, s, expected, reject_ok=reject_ok)


# ======================================================================================
# Keys (RFC 5044 §7.1.1, §7.1.2(5))
# ======================================================================================


@case(
    "MPA-18",
    "Request with a wrong key: the DUT closes the connection",
    rules=("MPA-28",),
    sends="the app's Request with the last key byte changed (MPA ID Req FramX)",
    expects="TCP closed, no Reply (an R=1 Reply first is tolerated)",
)
async def wrong_key(ctx: CaseContext) -> Verdict:
    raw = valid_request(_app(ctx))
    return await _refused(ctx, raw[: MPA_KEY_LEN - 1] + b"X" + raw[MPA_KEY_LEN:])


@case(
    "MPA-18",
    "Reply key in a Request: the DUT closes the connection",
    n=2,
    rules=("MPA-28",),
    sends="the app's Request with the Reply key (MPA ID Rep Frame)",
    expects="TCP closed, no Reply",
)
async def reply_key_as_request(ctx: CaseContext) -> Verdict:
    raw = valid_request(_app(ctx))
    return await _refused(ctx, MPA_KEY_REP + raw[MPA_KEY_LEN:])


@case(
    "MPA-22",
    "Truncated Request (10 bytes of the key), then silence: no Reply",
    sends="'MPA ID Req' and nothing more",
    expects="no Reply and no FPDU while the Request is incomplete (closing is allowed)",
)
async def truncated_key(ctx: CaseContext) -> Verdict:
    s = await start(ctx, raw=MPA_KEY_REQ[:10], within=ctx.options.silence)
    expected = responder_expects(MPA_KEY_REQ[:10])
    if s.answer.kind == "silence":
        return Verdict.met(f"sent nothing for {ctx.options.silence:g} s", expected.line())
    if s.answer.kind == "close":
        return Verdict.met(
            f"closed after {s.answer.seconds:.2f} s without a Reply", expected.line()
        )
    return Verdict.not_met(f"answered an incomplete Request: {s.answer.describe()}",
                           expected.line(), frame=s.answer.frame)  # fmt: skip


@case(
    "MPA-27",
    "Truncated Request, then silence: the DUT's startup timer closes the connection",
    sends="'MPA ID Req' and nothing more, for up to --startup-timeout seconds",
    expects="the DUT gives up waiting and closes the connection",
    slow=True,
)
async def startup_timer(ctx: CaseContext) -> Verdict:
    s = await start(ctx, raw=MPA_KEY_REQ[:10], within=ctx.options.startup_timeout)
    return _timer_verdict(ctx, s)


def _timer_verdict(ctx: CaseContext, s: Startup) -> Verdict:
    a = s.answer
    if a.kind == "close":
        return Verdict.met(f"closed the connection after {a.seconds:.1f} s")
    if a.kind == "silence":
        return Verdict.not_met(
            f"still waiting after {ctx.options.startup_timeout:g} s (--startup-timeout)"
        )
    return Verdict.not_met(f"answered: {a.describe()}", frame=a.frame, rule="MPA-22", level="MUST")


@case(
    "MPA-26",
    "Responder/responder: the runner connects and sends nothing; the DUT times out",
    level="SHOULD",
    sends="nothing at all after the TCP handshake, for up to --startup-timeout seconds",
    expects="the DUT gives up waiting for a Request and closes the connection",
    slow=True,
)
async def responder_responder(ctx: CaseContext) -> Verdict:
    s = await start(ctx, raw=b"", within=ctx.options.startup_timeout)
    return _timer_verdict(ctx, s)


# ======================================================================================
# Revisions (RFC 5044 §7.1.1, RFC 6581 §6, §10)
# ======================================================================================


@case(
    "ERC-01",
    "Rev 1 Request: accepted with a Rev 1 Reply without the IRD/ORD word",
    rules=("ERC-11", "MPA-20"),
    sends="the app's Request as Rev 1 (no S bit, no IRD/ORD word)",
    expects="an accepting Reply with Rev 1 and S=0; then the application works",
)
async def rev1(ctx: CaseContext) -> Verdict:
    s = await start(ctx, settings=replace(_app(ctx), rev=1))
    return await judge_accepted(ctx, s)


@case(
    "ERC-01",
    "Rev 1 Request with the S bit set: S is reserved in Rev 1 and ignored",
    n=2,
    rules=("MPA-19",),
    sends="a Rev 1 Request with flag 0x10 (S) set and 4 bytes of private data",
    expects="an accepting Rev 1 Reply without the IRD/ORD word (the 4 bytes are private data)",
)
async def rev1_s_bit(ctx: CaseContext) -> Verdict:
    settings = replace(_app(ctx), rev=1)
    s = await start(
        ctx, settings=settings, private_data=b"\x80\x01\x00\x01", edit=set_flags(MpaFlag.ENHANCED)
    )
    if s.answer.kind == "reply" and s.answer.mpa.ird_ord is not None:
        return Verdict.not_met(f"took S as enhanced: {s.answer.describe()}", frame=s.answer.frame)
    return await judge_accepted(ctx, s)


@case(
    "MPA-20",
    "Rev 0 (pre-IETF) Request: answered with Rev 0, or the connection closed",
    sends="a Rev 1-style Request with Rev 0",
    expects="close, or a Reply (accepting or R=1) with Rev 0; never a higher revision",
)
async def rev0(ctx: CaseContext) -> Verdict:
    raw = set_rev(0)(valid_request(replace(_app(ctx), rev=1)))
    s = await start(ctx, raw=raw)
    a = s.answer
    if a.kind in ("reply", "reject"):
        bad = startup_violations(a)
        if bad:
            return Verdict.not_met(a.describe(), *bad, frame=a.frame)
        return Verdict.met(f"answered in Rev 0: {a.describe()}")
    if a.kind == "close":
        return Verdict.met(f"closed after {a.seconds:.2f} s: Rev 0 is not for this DUT")
    return Verdict.not_met(a.describe(), frame=a.frame)


@case(
    "MPA-20",
    "Request with Rev 3 (not defined): the DUT closes the connection",
    n=2,
    sends="the app's Request with Rev 3",
    expects="TCP closed (an R=1 Reply first is tolerated); never an accepting Reply",
)
async def rev3(ctx: CaseContext) -> Verdict:
    return await _refused(ctx, set_rev(3)(valid_request(_app(ctx))))


@case(
    "MPA-20",
    "Request with Rev 255: the DUT closes the connection",
    n=3,
    sends="the app's Request with Rev 255",
    expects="TCP closed (an R=1 Reply first is tolerated); never an accepting Reply",
)
async def rev255(ctx: CaseContext) -> Verdict:
    return await _refused(ctx, set_rev(255)(valid_request(_app(ctx))))


# ======================================================================================
# Reserved bits (RFC 5044 §7.1.1)
# ======================================================================================


@case(
    "MPA-19",
    "Reserved flag bits (0x0F) set in the Request: not checked",
    sends="the app's Request with flag bits 0x0F set",
    expects="an accepting Reply; then the application works",
)
async def reserved_flags(ctx: CaseContext) -> Verdict:
    s = await start(ctx, edit=set_flags(MPA_RESERVED_MASK))
    return await judge_accepted(ctx, s)


@case(
    "MPA-19",
    "R bit set in a Request: not checked there",
    n=2,
    sends="the app's Request with R (0x20) set",
    expects="an accepting Reply; then the application works",
)
async def r_in_request(ctx: CaseContext) -> Verdict:
    s = await start(ctx, edit=set_flags(MpaFlag.REJECT))
    return await judge_accepted(ctx, s)


# ======================================================================================
# Private data (RFC 5044 §7.1.1, §7.1.2(9); RFC 6581 §6)
# ======================================================================================


@case(
    "MPA-21",
    "Rev 2 Request without the S bit, PD_Length 0: accepted without the IRD/ORD word",
    rules=("ERC-11", "ERC-12"),
    sends="a Rev 2 Request with S=0 and no private data",
    expects="an accepting Reply without the IRD/ORD word; then the application works",
)
async def pd_zero(ctx: CaseContext) -> Verdict:
    raw = set_rev(2)(valid_request(replace(_app(ctx), rev=1)))
    s = await start(ctx, raw=raw)
    return await judge_accepted(ctx, s)


@case(
    "MPA-21",
    "PD_Length 256: accepted",
    n=2,
    sends="the app's Request with 256 bytes of private data (IRD/ORD word included)",
    expects="an accepting Reply (or an R=1 Reply: the ULP's choice); then the app works",
)
async def pd_256(ctx: CaseContext) -> Verdict:
    s = await start(ctx, raw=with_private_data(_app(ctx), 256))
    return await judge_accepted(ctx, s, reject_ok="the ULP may refuse private data it cannot use")


@case(
    "MPA-21",
    "PD_Length 512, the maximum: accepted",
    n=3,
    sends="the app's Request with 512 bytes of private data (IRD/ORD word included)",
    expects="an accepting Reply (or an R=1 Reply: the ULP's choice); not a close",
)
async def pd_512(ctx: CaseContext) -> Verdict:
    s = await start(ctx, raw=with_private_data(_app(ctx), MPA_MAX_PRIVATE_DATA))
    if s.answer.kind == "close":
        return Verdict.not_met(f"closed after {s.answer.seconds:.2f} s: a valid Request refused")
    return await judge_accepted(ctx, s, reject_ok="the ULP may refuse private data it cannot use")


@case(
    "MPA-21",
    "PD_Length 513, one over the limit: the DUT closes the connection",
    n=4,
    sends="the app's Request with 513 bytes of private data",
    expects="TCP closed; never an accepting Reply",
)
async def pd_513(ctx: CaseContext) -> Verdict:
    return await _refused(ctx, with_private_data(_app(ctx), MPA_MAX_PRIVATE_DATA + 1))


@case(
    "MPA-21",
    "PD_Length 65535 with all its bytes: the DUT closes the connection",
    n=5,
    sends="the app's Request with 65535 bytes of private data",
    expects="TCP closed; never an accepting Reply",
)
async def pd_65535(ctx: CaseContext) -> Verdict:
    return await _refused(ctx, with_private_data(_app(ctx), 0xFFFF))


@case(
    "MPA-21",
    "PD_Length 100 with 40 bytes sent, then silence: no Reply",
    n=6,
    rules=("MPA-22",),
    sends="a Request announcing 100 bytes of private data, and only 40 of them",
    expects="no Reply while the frame is incomplete (closing is allowed)",
)
async def pd_short(ctx: CaseContext) -> Verdict:
    raw = with_private_data(_app(ctx), 100)[: MPA_FRAME_HEADER_LEN + 40]
    expected = responder_expects(raw)
    s = await start(ctx, raw=raw, within=ctx.options.silence)
    if s.answer.kind in ("silence", "close"):
        what = "sent nothing" if s.answer.kind == "silence" else "closed without a Reply"
        return Verdict.met(f"{what} (waited {s.answer.seconds:.2f} s)", expected.line())
    return Verdict.not_met(f"answered an incomplete Request: {s.answer.describe()}",
                           expected.line(), frame=s.answer.frame)  # fmt: skip


@case(
    "ERC-02",
    "S bit with PD_Length 2 (no room for the IRD/ORD word): the DUT closes",
    sends="a Rev 2 Request with S=1, PD_Length 2 and 2 bytes",
    expects="TCP closed; never an accepting Reply",
)
async def s_without_word(ctx: CaseContext) -> Verdict:
    raw = valid_request(_app(ctx))
    raw = raw[:18] + (2).to_bytes(2, "big") + raw[20:22]
    return await _refused(ctx, raw)


# ======================================================================================
# IRD/ORD (RFC 6581 §9.1)
# ======================================================================================


@case(
    "ERC-04",
    "Request with IRD 0: the Reply's ORD is 0",
    sends="the app's Request with IRD 0 (the runner takes no RDMA Read Requests)",
    expects="an accepting Reply with ORD <= 0, or an R=1 Reply",
)
async def ird_zero(ctx: CaseContext) -> Verdict:
    s = await start(ctx, settings=replace(_app(ctx), ird=0))
    return await judge_accepted(
        ctx, s, exchange=False, reject_ok="a DUT that must issue RDMA Reads may refuse"
    )


@case(
    "ERC-06",
    "IRD and ORD 0x3FFF (no negotiation): accepted",
    sends="the app's Request with IRD = ORD = 0x3FFF",
    expects="an accepting Reply (or R=1), no IRD/ORD rule broken; then the application works",
)
async def no_negotiation(ctx: CaseContext) -> Verdict:
    no = MPA_V2_NO_NEGOTIATION
    s = await start(ctx, settings=replace(_app(ctx), ird=no, ord=no))
    return await judge_accepted(ctx, s, reject_ok="0x3FFF leaves IRD and ORD to the ULP")


# ======================================================================================
# Peer-to-peer RTR (RFC 6581 §5, §9.2)
# ======================================================================================


async def _p2p(ctx: CaseContext, kind: RtrType) -> Verdict:
    app = _app(ctx)
    settings = replace(app, p2p=True, rtr=kind, ird=max(app.ird, 1), ord=max(app.ord, 1))
    s = await start(ctx, settings=settings)
    a = s.answer
    if a.kind == "reject":
        return Verdict.declined(f"refused peer-to-peer: {a.describe()}")
    if a.kind != "reply" or a.seen is None:
        return await judge_accepted(ctx, s)
    bad = startup_violations(a)
    if bad:
        return Verdict.not_met(a.describe(), *bad, rule=bad[0].split(":")[0], frame=a.frame)
    if isinstance(s.outcome, ConnectionFailed):
        # no RTR in common: the runner sent Terminate 2/0/7, as an initiator must (ERC-09)
        return Verdict.declined(
            f"does not take {kind.name} RTRs: {a.describe()}",
            f"the runner sent Terminate {s.outcome.terminate} (ERC-09): {s.outcome.error}",
        )
    broken = need_established(s)
    if broken is not None:
        return broken
    answers: list[Segment] = []

    def rtr_answer(seg: Segment) -> bool:
        if kind is RtrType.READ and not answers and seg.opcode == Opcode.RDMA_READ_RESPONSE:
            answers.append(seg)
            return True
        return False

    conv = await converse(ctx, s.peer, absorb=rtr_answer)
    verdict = work_verdict(conv, f"{a.describe()}; the runner sent the {kind.name} RTR")
    if kind is RtrType.READ and verdict.outcome is Outcome.MET:
        if not answers or len(answers[0].payload):
            got = f"{len(answers[0].payload)} bytes" if answers else "none"
            return Verdict.not_met(
                f"the zero-length Read RTR got no zero-length Read Response ({got})",
                rule="RDMAP-07",
            )
        return verdict.with_evidence("a zero-length Read Response answered the Read RTR")
    return verdict


@case(
    "ERC-08",
    "Peer-to-peer Request offering the Send RTR",
    rules=("ERC-09",),
    sends="the app's Request with A=1 and B (zero-length Send) flagged; then that RTR",
    expects="a Reply with A=1 flagging an RTR it supports; a Send RTR absorbed, the app works",
)
async def p2p_send(ctx: CaseContext) -> Verdict:
    return await _p2p(ctx, RtrType.SEND)


@case(
    "ERC-08",
    "Peer-to-peer Request offering the Write RTR",
    n=2,
    rules=("ERC-09",),
    sends="the app's Request with A=1 and C (zero-length Write) flagged; then that RTR",
    expects="a Reply with A=1 flagging an RTR it supports; a Write RTR absorbed, the app works",
)
async def p2p_write(ctx: CaseContext) -> Verdict:
    return await _p2p(ctx, RtrType.WRITE)


@case(
    "ERC-08",
    "Peer-to-peer Request offering the Read RTR",
    n=3,
    rules=("ERC-09", "RDMAP-07"),
    sends="the app's Request with A=1 and D (zero-length Read) flagged; then that RTR",
    expects="a Reply with A=1 flagging an RTR; a zero-length Read Response, then the app works",
)
async def p2p_read(ctx: CaseContext) -> Verdict:
    return await _p2p(ctx, RtrType.READ)


# ======================================================================================
# Ordering of startup and Full Operation (RFC 5044 §7.1, §7.1.2(4))
# ======================================================================================


@case(
    "MPA-25",
    "After its Reply the DUT sends nothing before the runner's first FPDU",
    sends="a valid Request; after the Reply, nothing for --silence seconds",
    expects="no FPDU from the DUT until the runner's first FPDU",
)
async def responder_waits(ctx: CaseContext) -> Verdict:
    s = await start(ctx)
    broken = need_established(s)
    if broken is not None:
        return broken
    quiet = await expect_silence(s.peer, ctx.options.silence)
    if quiet.lines:
        return Verdict.not_met(
            f"sent before the initiator's first FPDU: {quiet.lines[0]}",
            *quiet.lines[1:],
            frame=quiet.frame,
        )
    return Verdict.met(f"sent nothing for {ctx.options.silence:g} s after its Reply")


@case(
    "MPA-17",
    "An FPDU right after the Request, before the Reply",
    sends="a valid Request and, in the same write, the app's first FPDU (CRC on, no markers)",
    expects="either Full Operation from the octet after the Request (the FPDU is delivered) "
    "or a refusal (close, R=1 Reply); never a misframed stream",
)
async def early_fpdu(ctx: CaseContext) -> Verdict:
    peer = await ctx.connect()
    settings = _app(ctx)
    async with peer.one_write():
        request = await send_request(peer, settings)
        # Before the Reply the runner relies on what its Request makes certain: CRC on.
        peer.core.start_tx(crc=True, markers=False)
        for message in ctx.app.new_client().opening():
            for ulpdu in peer.core.ulpdus(message):
                await peer.send_fpdu(ulpdu)
    answer = await read_answer(peer, request.frame, ctx.options.timeout)
    if answer.kind in ("close", "reject"):
        closed, lines = (
            (True, []) if answer.kind == "close" else await expect_close(peer, ctx.options.timeout)
        )
        if closed:
            return Verdict.met(f"refused: {answer.describe()}", *lines)
    if answer.kind != "reply" or answer.seen is None:
        return Verdict.not_met(answer.describe(), frame=answer.frame)
    if answer.seen.frame.markers:
        return Verdict.not_applicable(
            f"the DUT asks for markers ({describe_frame(answer.seen.frame)}): the early FPDU "
            "went without them"
        )
    peer.core.start_rx(crc=True, markers=settings.want_markers)
    conv = await converse(ctx, peer, opening=[])
    if conv.terminate is not None:
        t = conv.terminate[0]
        if t.cause in (TERM_LLP_CRC_ERROR, TERM_LLP_MARKER_MISMATCH):
            return Verdict.not_met(
                f"misframed the stream: Terminate {t.cause}", frame=conv.terminate_frame
            )
        return Verdict.met(f"refused the early FPDU with a Terminate {t.cause}")
    return work_verdict(conv, answer.describe())
