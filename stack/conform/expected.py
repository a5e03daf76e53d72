"""What a conforming DUT must do, asked of the wire core, and the common verdicts.

No case states its own table of "this input -> that Terminate": the expectation comes from
the engine the stack itself runs.  :func:`responder_expects` feeds the runner's Request
bytes to a responder :class:`~stack.wire.mpa.MpaConnection` (revision policy: close, as RFC
5044 §7.1.1 says for a revision it cannot work with), :func:`initiator_expects` feeds the
runner's Reply to an initiator engine set up like the DUT's Request, and
:func:`framing_expects` feeds an FPDU to a :class:`~stack.wire.framing.FpduDeframer`; the
error each raises names the rule and the Terminate cause.

The ``judge_*`` functions turn the common observations into verdicts: a Request or Reply
that must be refused by closing (:func:`judge_refusal`), one that must be accepted and then
work (:func:`judge_accepted`).
"""

from __future__ import annotations

from dataclasses import dataclass

from stack.conform.context import CaseContext
from stack.conform.expect import expect_close
from stack.conform.model import Verdict
from stack.conform.peer_core import Sent, expected_framing_error
from stack.conform.script import (
    Answer,
    Conversation,
    Startup,
    converse,
    terminate_line,
)
from stack.constants import RtrType, TermCode
from stack.wire.events import (
    ConnectionFailed,
    CrcPolicy,
    Established,
    MpaFrame,
    MpaSettings,
    NeedData,
    Rejected,
    RequestReceived,
    RevPolicy,
    Role,
)
from stack.wire.mpa import MpaConnection

__all__ = [
    "Expected",
    "framing_expects",
    "initiator_expects",
    "judge_accepted",
    "judge_refusal",
    "responder_expects",
    "settings_like",
    "startup_violations",
    "work_verdict",
]

_CLOSE_POLICY = MpaSettings(rev_policy=RevPolicy.CLOSE)


@dataclass(frozen=True, slots=True)
class Expected:
    """What the wire core does with an input.

    Fields: kind ('accept', 'close', 'wait', 'reject', 'terminate'); rule (the rule the
    input breaks, None when it breaks none); detail; term (the Terminate cause: the one to
    send for 'terminate', the close cause before Full Operation otherwise).
    """

    kind: str
    rule: str | None = None
    detail: str = ""
    term: TermCode | None = None

    def line(self) -> str:
        """``expected (wire core): close, MPA-18 invalid MPA key ...``."""
        if self.kind == "accept":
            return "expected (wire core): accept"
        why = f", {self.rule}: {self.detail}" if self.rule else ""
        if self.kind == "terminate" and self.term is not None:
            return f"expected (wire core): Terminate {self.term}{why}"
        return f"expected (wire core): {self.kind}{why}"


def _from_failure(event: ConnectionFailed) -> Expected:
    error = event.error
    rule = getattr(error, "rule", None)
    detail = getattr(error, "detail", str(error))
    term = event.terminate if event.terminate is not None else getattr(error, "term", None)
    kind = "terminate" if event.terminate is not None else ("close" if event.close else "reject")
    return Expected(kind, rule, detail, term)


def responder_expects(request: bytes) -> Expected:
    """What a responder does with the Request bytes ``request`` (RFC 5044 §7.1.2)."""
    engine = MpaConnection(Role.RESPONDER, _CLOSE_POLICY)
    engine.start(0.0)
    engine.receive_data(request)
    event = engine.next_event()
    if isinstance(event, RequestReceived):
        return Expected("accept")
    if isinstance(event, ConnectionFailed):
        return _from_failure(event)
    return Expected("wait", None, "the Request is not complete")


def settings_like(request: MpaFrame) -> MpaSettings:
    """Initiator settings that send ``request`` (the DUT's): revision, CRC, markers, the
    RFC 6581 word."""
    base = MpaSettings(
        rev=request.rev if request.rev in (1, 2) else 2,
        crc=CrcPolicy.REQUEST if request.crc else CrcPolicy.OFF,
        want_markers=request.markers,
    )
    w = request.ird_ord
    if w is None:
        return (
            base
            if base.rev == 1
            else MpaSettings(rev=1, crc=base.crc, want_markers=base.want_markers)
        )
    return MpaSettings(
        rev=2,
        crc=base.crc,
        want_markers=base.want_markers,
        ird=w.ird,
        ord=w.ord,
        p2p=w.p2p,
        rtr=RtrType(w.rtr) if w.p2p and w.rtr else base.rtr,
    )


def initiator_expects(request: MpaFrame, reply: bytes) -> Expected:
    """What an initiator that sent ``request`` does with the Reply bytes ``reply``."""
    engine = MpaConnection(Role.INITIATOR, settings_like(request))
    engine.initiate(0.0, request.private_data)
    engine.data_to_send()
    engine.receive_data(reply)
    event = engine.next_event()
    if isinstance(event, Established):
        return Expected("accept")
    if isinstance(event, Rejected):
        return Expected("reject", "MPA-24", event.reason)
    if isinstance(event, ConnectionFailed):
        return _from_failure(event)
    assert isinstance(event, NeedData)
    return Expected("wait", None, "the Reply is not complete")


def framing_expects(sent: Sent) -> Expected:
    """What a receiver's deframer does with the FPDU ``sent`` (same CRC, markers, offset)."""
    error = expected_framing_error(
        sent.data, crc=sent.crc, markers=sent.markers, offset=sent.seq_offset
    )
    if error is None:
        return Expected("accept")
    return Expected("terminate", error.rule, error.detail, error.term)


# ======================================================================================
# Common verdicts
# ======================================================================================


def startup_violations(answer: Answer) -> list[str]:
    """The fatal startup rule rows the DUT's frame fires (lenient judge, MPA-18..26, ERC-*)."""
    if answer.seen is None:
        return []
    return [f"{f.rule}: {f.detail}" for f in answer.seen.findings if f.fatal]


async def judge_refusal(
    ctx: CaseContext, s: Startup, expected: Expected, *, reject_ok: bool = True
) -> Verdict:
    """The Request must be refused by closing the connection (RFC 5044 §7.1.2); a
    rejecting Reply before the close is allowed when ``reject_ok``."""
    a = s.answer
    want = expected.line()
    if a.kind == "close":
        return Verdict.met(f"closed the connection after {a.seconds:.2f} s, no Reply", want)
    if a.kind == "silence":
        return Verdict.not_met(
            f"neither closed nor answered within {ctx.options.timeout:g} s", want
        )
    if a.kind == "reply":
        return Verdict.not_met(f"accepted: {a.describe()}", want, frame=a.frame)
    closed, lines = await expect_close(s.peer, ctx.options.timeout)
    first = f"rejected: {a.describe()}" if a.kind == "reject" else f"sent {a.describe()}"
    if a.kind == "reject" and not reject_ok:
        return Verdict.not_met(first, want, *lines, frame=a.frame)
    if not closed:
        return Verdict.not_met(
            f"{first}, then did not close within {ctx.options.timeout:g} s",
            want,
            *lines,
            frame=a.frame,
        )
    note = "an R=1 Reply before closing is allowed (MPA-23)" if a.kind == "reject" else ""
    return Verdict.met(f"{first}, then closed", want, *filter(None, (note, *lines)))


async def judge_accepted(
    ctx: CaseContext,
    s: Startup,
    *,
    reject_ok: str | None = None,
    exchange: bool = True,
) -> Verdict:
    """The Request is valid and must be accepted: an accepting Reply that breaks no startup
    rule, with which the runner's initiator engine enters Full Operation, and (``exchange``)
    the application then works.  ``reject_ok``: why an R=1 Reply is acceptable too (the
    ULP's choice); without it a rejection is not met.  A close without any Reply is a
    refusal without the Reply that should say so (MPA-23, SHOULD)."""
    a = s.answer
    if a.kind == "reject":
        if reject_ok:
            return Verdict.met(f"rejected: {a.describe()}", f"allowed: {reject_ok}")
        return Verdict.not_met(f"rejected a valid Request: {a.describe()}", frame=a.frame)
    if a.kind == "close":
        return Verdict.not_met(
            f"closed without a Reply after {a.seconds:.2f} s",
            "a responder that refuses a Request should say so with an R=1 Reply",
            rule="MPA-23",
            level="SHOULD",
        )
    if a.kind != "reply":
        return Verdict.not_met(a.describe(), frame=a.frame)
    bad = startup_violations(a)
    if bad:
        return Verdict.not_met(f"{a.describe()}", *bad, rule=bad[0].split(":")[0], frame=a.frame)
    if not s.established:
        why = getattr(s.outcome, "error", s.outcome)
        return Verdict.not_met(
            f"{a.describe()}: the initiator engine refuses it: {why}", frame=a.frame
        )
    reply_line = a.describe()
    if not exchange:
        return Verdict.met(reply_line)
    conv = await converse(ctx, s.peer)
    return work_verdict(conv, reply_line)


def work_verdict(conv: Conversation, reply_line: str) -> Verdict:
    """The verdict on an application exchange over valid traffic: it must be delivered, and
    the DUT's own PDUs must break no rule (lenient decode and sequencing)."""
    lines = conv.delivery_lines() + conv.unexpected
    if conv.violations:
        finding, frame = conv.violations[0]
        return Verdict.not_met(
            f"{reply_line}; then the DUT sent a PDU that breaks {finding.rule}: "
            f"{finding.detail} (frame {frame})",
            *lines,
            rule=finding.rule,
            frame=frame,
        )
    if conv.terminate is not None:
        t, _pdu = conv.terminate
        return Verdict.not_met(
            f"{reply_line}; then it terminated valid traffic: {terminate_line(t)}",
            *lines,
            rule="MPA-03",
            frame=conv.terminate_frame,
        )
    if conv.framing is not None:
        return Verdict.not_met(
            f"{reply_line}; then its bytes broke FPDU framing: {conv.framing.error}",
            *lines,
            rule=conv.framing.error.rule,
        )
    if conv.done or conv.deliveries:
        return Verdict.met(f"{reply_line}; the application worked", *lines)
    if conv.eof is not None:
        return Verdict.not_met(f"{reply_line}; then it closed without delivering", *lines,
                               rule="MPA-03")  # fmt: skip
    return Verdict.not_met(f"{reply_line}; then no answer to valid traffic", *lines, rule="MPA-03")
