"""Watching and judging a data-phase session after its provocation.

:func:`watch` collects what the DUT did (:class:`Watch`); :func:`conclude` turns it into the
verdict.  When the model refuses the provocation, the DUT must not deliver it and must send
the model's Terminate (cause MUST; header copies RDMAP-12, SHOULD), then nothing (RDMAP-10);
an :class:`Alternative` is another cause it may send instead.  When the model takes it, the
DUT must answer the runner's requests (RDMAP-06) and go on working (:func:`alive`: a
zero-length Read is answered, RDMAP-07).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from stack.conform.expect import expect_silence, judge_terminate, siw_reading
from stack.conform.expected import work_verdict
from stack.conform.model import Outcome, Verdict
from stack.conform.oracle import Expectation
from stack.conform.peer_core import Eof, FramingBad, PduSeen
from stack.conform.script import converse, frame_note, terminate_line
from stack.constants import TERM_RDMAP_UNEXPECTED_OPCODE, TermCode
from stack.wire.events import ReadRequest, Terminate

if TYPE_CHECKING:
    from stack.conform.session import Session

__all__ = ["Alternative", "Watch", "alive", "conclude", "not_7306", "watch"]


@dataclass(frozen=True, slots=True)
class Alternative:
    """Another Terminate cause a DUT may send instead of the model's (``cause`` None: any
    other), and what it is worth (``means``): ``met`` (an equally conforming answer: PASS,
    ``why`` as evidence), ``declined`` (the DUT lacks an optional capability, e.g. RFC 7306:
    SKIP) or ``warn`` (not met at ``level`` under ``rule``, with ``why``)."""

    cause: TermCode | None
    why: str
    means: str = "warn"
    rule: str = "DDP-11"
    level: str = "SHOULD"

    def matches(self, got: Terminate) -> bool:
        """Whether ``got`` is this cause, also when read in siw's layout (:func:`siw_reading`)."""
        return self.cause is None or siw_reading(got, TermCode(*self.cause)).cause == self.cause

    def reading(self, got: Terminate) -> Terminate:
        """``got`` as this alternative reads it."""
        return got if self.cause is None else siw_reading(got, TermCode(*self.cause))

    def verdict(self, line: str, frame: int | None) -> Verdict:
        if self.means == "met":
            return Verdict.met(line, self.why)
        if self.means == "declined":
            return Verdict.declined(line, self.why)
        return Verdict.not_met(line, self.why, rule=self.rule, level=self.level, frame=frame)


def not_7306(why: str = "") -> Alternative:
    """0/2/0x06 for an RFC 7306 opcode: the DUT does not implement RFC 7306 (SKIP)."""
    return Alternative(
        TERM_RDMAP_UNEXPECTED_OPCODE,
        why
        or "the DUT refuses the RFC 7306 opcode as unknown: it does not implement RFC 7306 "
        "(there is no negotiation bit; a non-7306 stack must answer so, EXT-01)",
        means="declined",
    )


@dataclass
class Watch:
    """What the DUT did after a provocation.  Fields: terminate (its Terminate and frame),
    deliveries (the application showed it took a message: one line each), others (other
    PDUs), eof, framing (its bytes broke framing), stalled (quiet until the time ran out)."""

    terminate: tuple[Terminate, int | None] | None = None
    deliveries: list[str] = field(default_factory=list)
    others: list[str] = field(default_factory=list)
    eof: Eof | None = None
    framing: FramingBad | None = None
    stalled: bool = False


async def watch(
    s: Session,
    within: float | None = None,
    *,
    until: Callable[[Session], bool] | None = None,
    allow: int = 0,
) -> Watch:
    """The DUT's events until a Terminate, a close, broken framing, a delivery the
    application shows (beyond ``allow`` of them: messages before the provocation),
    ``until`` holding, or ``within`` seconds (default: the timeout)."""
    peer = s.peer
    w = Watch()
    wait = s.ctx.options.timeout if within is None else within
    while until is None or not until(s):
        event = await peer.next_event(wait)
        if event is None:
            w.stalled = True
            break
        if isinstance(event, Eof):
            w.eof = event
            break
        if isinstance(event, FramingBad):
            w.framing = event
            break
        if not isinstance(event, PduSeen):
            continue
        frame, where = frame_note(peer, event.offset, event.wire_len)
        seg = event.segment
        if seg is None:
            w.others.append(f"an undecodable FPDU ({where})")
            continue
        if isinstance(seg.header, Terminate):
            w.terminate = (seg.header, frame)
            break
        if s.absorb(seg):
            continue
        reaction = s.client.on_segment(seg)
        if reaction.delivered:
            if allow > 0:
                allow -= 1
                w.others.append(f"allowed: {reaction.delivered} ({where})")
                continue
            w.deliveries.append(f"{reaction.delivered} ({where})")
            break
        w.others.append(f"{seg.opcode_name}, {len(seg.payload)} bytes ({where})")
    return w


async def conclude(
    s: Session,
    exp: Expectation,
    *,
    what: str,
    alternatives: Sequence[Alternative] = (),
    check: Callable[[Session], Verdict | None] | None = None,
    live: bool = True,
    allow: int = 0,
) -> Verdict:
    """The verdict on the DUT after the provocation ``what``: when the model refuses it,
    the DUT must not deliver it (``allow``: deliveries of messages sent before it) and must
    send the model's Terminate (then nothing); when the model takes it, the DUT must answer
    the runner's requests (``check`` judges the answers) and, with ``live``, go on working
    (:func:`alive`)."""
    if exp.accepts:
        return await _accepted(s, exp, what=what, check=check, live=live, alternatives=alternatives)
    if exp.term is None:  # pragma: no cover - every data-phase error has a Terminate
        return Verdict.broken(f"the model refuses the {what} without a Terminate: {exp.error}")
    w = await watch(s, allow=allow)
    return await _judge_refused(s, w, exp, what=what, alternatives=alternatives)


async def _judge_refused(
    s: Session, w: Watch, exp: Expectation, *, what: str, alternatives: Sequence[Alternative]
) -> Verdict:
    want = exp.line()
    if w.deliveries:
        return Verdict.not_met(f"took the {what}: {w.deliveries[0]}", want, *w.others)
    if w.terminate is not None:
        assert exp.term is not None
        got, frame = w.terminate
        verdict = judge_terminate(got, exp.term, exp.offending, frame)
        alt = next((a for a in alternatives if a.matches(got)), None)
        if verdict.outcome is Outcome.NOT_MET and alt is not None and verdict.rule is None:
            read = alt.reading(got)
            layout = " in siw's swapped layout" if read.siw_swapped else ""
            line = f"{terminate_line(read)} (frame {frame}){layout}, not {exp.term}"
            verdict = alt.verdict(line, frame)
        quiet = await expect_silence(s.peer, s.ctx.options.silence)
        if quiet.lines and verdict.outcome is Outcome.MET:
            return Verdict.not_met(
                f"{verdict.observed}; then sent more: {quiet.lines[0]}",
                want,
                rule="RDMAP-10",
                frame=quiet.frame,
            )
        return verdict.with_evidence(want, *w.others)
    if w.framing is not None:
        return Verdict.not_met(
            f"answered with bytes that break framing: {w.framing.error}",
            want,
            rule=w.framing.error.rule,
        )
    if w.eof is not None:
        return Verdict.not_met(
            f"closed without a Terminate (expected {exp.term})",
            want,
            *w.others,
            rule="RDMAP-12",
            level="MUST",
        )
    return Verdict.not_met(
        f"no Terminate within {s.ctx.options.timeout:g} s (expected {exp.term})",
        want,
        *w.others,
        rule="RDMAP-12",
        level="MUST",
    )


async def _accepted(
    s: Session,
    exp: Expectation,
    *,
    what: str,
    check: Callable[[Session], Verdict | None] | None,
    live: bool,
    alternatives: Sequence[Alternative] = (),
) -> Verdict:
    want = exp.line()
    if s.outstanding():
        w = await watch(s, until=lambda x: not x.outstanding())
        if w.terminate is not None:
            t, frame = w.terminate
            declined = [a for a in alternatives if a.means == "declined" and a.matches(t)]
            if declined:
                return declined[0].verdict(f"{terminate_line(t)} (frame {frame})", frame)
            return Verdict.not_met(
                f"terminated the {what}: {terminate_line(t)} (frame {frame})", want, frame=frame
            )
        if s.outstanding():
            how = "closed" if w.eof is not None else f"nothing within {s.ctx.options.timeout:g} s"
            return Verdict.not_met(
                f"did not answer the {what}: {how}",
                want,
                *w.deliveries,
                *w.others,
                rule="RDMAP-06",
            )
    if s.findings:
        f = s.findings[0]
        return Verdict.not_met(
            f"its answer to the {what} breaks {f.rule}: {f.detail}", want, rule=f.rule
        )
    verdict = check(s) if check is not None else None
    if verdict is not None and verdict.outcome is not Outcome.MET:
        return verdict.with_evidence(want)
    if not live:
        return verdict.with_evidence(want) if verdict is not None else Verdict.met(what, want)
    after = await alive(s, what=what)
    if verdict is not None and after.outcome is Outcome.MET:
        return verdict.with_evidence(*after.evidence, after.observed, want)
    return after.with_evidence(want)


async def alive(s: Session, *, what: str) -> Verdict:
    """After the ``what``, the DUT must go on: the application's exchange continues (or
    starts) and works; once it is complete, a zero-length Read must be answered (RDMAP-07)."""
    head = f"after the {what}"
    if s.conv is None or s.pending or not s.conv.done:
        opening = None if s.conv is None else s.pending
        conv = await converse(s.ctx, s.peer, client=s.client, opening=opening, absorb=s.absorb)
        return work_verdict(conv, head)
    ird = s.ird
    if ird == 0:
        return Verdict.met(f"{head}, no Terminate ({s.ctx.app.name} has no exchange left)")
    await s.send([ReadRequest(0x1A2B3C7F, 0x1000, 0, 0, 0)])
    w = await watch(s, until=lambda x: not x.outstanding())
    if w.terminate is not None:
        t, frame = w.terminate
        return Verdict.not_met(
            f"{head}: it terminated: {terminate_line(t)} (frame {frame})",
            rule="MPA-03",
            frame=frame,
        )
    if s.outstanding():
        return Verdict.not_met(
            f"{head}: no answer to a zero-length Read", *w.others, rule="RDMAP-07"
        )
    return Verdict.met(f"{head}, a zero-length Read was answered: the stream goes on")
