"""The MPA startup rules as data, and the RFC 6581 negotiation (RFC 5044 §7.1, RFC 6581 §9).

Theory of operation
-------------------
Every conformance rule a peer's Request or Reply can break is one row of a table
(:data:`FRAME_RULES` for any startup frame, :data:`REPLY_RULES` for a Reply against the
Request it answers): the rule ID, whether it is fatal, the Terminate or close cause it maps
to, whether it still applies to a rejecting Reply, and the condition.  The MPA engine
(:class:`~stack.wire.mpa.MpaConnection`) runs the tables strictly and acts on the first
fatal row (close, reject, or a Terminate after an unacceptable Reply); the capture decoder
and the conformance runner run them leniently and record every row that fires.  "Which
startup rules are checked" is answered by reading the two tables.

What is *not* here is local policy: whether this endpoint requires CRC, accepts revision
0, supports RFC 6581 at all, or which RTR it prefers.  Those are decisions of the engine's
:class:`~stack.wire.events.MpaSettings`, not violations by the peer.  The negotiation
arithmetic of RFC 6581 §9.1-9.2 (:func:`responder_ird_ord`, :func:`initiator_rtr`) is here
too, so the engine and the tools compute the same result.

Frames too malformed to read (wrong key, PD_Length over the limit, an S bit with no room
for the IRD/ORD word) never reach these tables: :func:`stack.wire.mpa_frames.decode_frame`
raises for them (MPA-18, MPA-21, ERC-02).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from stack.constants import (
    MPA_REV_1,
    MPA_REV_2,
    MPA_REV_RDMAC,
    MPA_V2_NO_NEGOTIATION,
    TERM_LLP_INSUFFICIENT_IRD,
    TERM_LLP_INVALID_STARTUP,
    TERM_LLP_NO_MATCHING_RTR,
    MpaFlag,
    RtrType,
    TermCode,
)
from stack.errors import LocalError, MpaError
from stack.wire.checker import Checker
from stack.wire.events import IrdOrd, MpaFrame

__all__ = [
    "DEFINED_REVISIONS",
    "FRAME_RULES",
    "REPLY_RULES",
    "RTR_ORDER",
    "StartupContext",
    "StartupRule",
    "check_startup_frame",
    "framing_of",
    "initiator_rtr",
    "responder_ird_ord",
]

DEFINED_REVISIONS = frozenset({MPA_REV_RDMAC, MPA_REV_1, MPA_REV_2})
"""Every MPA revision defined (0: pre-IETF RDMAC, 1: RFC 5044, 2: RFC 6581)."""
RTR_ORDER = (RtrType.WRITE, RtrType.READ, RtrType.SEND)
"""The RTR kinds in the order chosen when no preference decides."""


@dataclass(frozen=True, slots=True)
class StartupContext:
    """What a startup rule looks at.

    Fields: frame (the frame judged), expect ('request' or 'reply': what the receiver
    waits for; None when unknown), request (the Request a Reply answers, None if unseen),
    revisions (the revisions the judge interoperates with; a capture decoder takes every
    defined one), max_rev (the highest revision acceptable in a Reply: the Request's).
    """

    frame: MpaFrame
    expect: str | None = None
    request: MpaFrame | None = None
    revisions: frozenset[int] = DEFINED_REVISIONS
    max_rev: int | None = None


@dataclass(frozen=True, slots=True)
class StartupRule:
    """One row of a startup rule table.

    Fields: rule (rule ID), fatal (a violation the receiver acts on; False: a deviation
    that is only noted), term (the Terminate cause, or the close cause before Full
    Operation), on_reject (still applies to a Reply with R=1), check (returns the
    violation's detail, or None when the rule holds).
    """

    rule: str
    fatal: bool
    term: TermCode | None
    on_reject: bool
    check: Callable[[StartupContext], str | None]


def _wrong_key(ctx: StartupContext) -> str | None:
    if ctx.expect == "request" and ctx.frame.reply:
        return "Reply key received while waiting for a Request"
    return None


def _initiator_initiator(ctx: StartupContext) -> str | None:
    if ctx.expect == "reply" and not ctx.frame.reply:
        return "Request key received while waiting for a Reply: initiator/initiator"
    return None


def _revision(ctx: StartupContext) -> str | None:
    rev = ctx.frame.rev
    if rev not in ctx.revisions:
        return f"MPA revision {rev} is not one of {sorted(ctx.revisions)}"
    if ctx.max_rev is not None and rev > ctx.max_rev:
        return f"Reply has Rev {rev} to a Rev {ctx.max_rev} Request"
    return None


def _r_in_request(ctx: StartupContext) -> str | None:
    return "R set in an MPA Request" if not ctx.frame.reply and ctx.frame.reject else None


def _siw_gso(ctx: StartupContext) -> str | None:
    if ctx.frame.reserved & MpaFlag.SIW_GSO:
        return "reserved flag 0x08 set (siw's GSO bit)"
    return None


def _s_below_rev2(ctx: StartupContext) -> str | None:
    frame = ctx.frame
    if frame.reserved & MpaFlag.ENHANCED and frame.rev < MPA_REV_2:
        return f"S bit set in a Rev {frame.rev} frame (not enhanced)"
    return None


def _rtr_without_p2p(ctx: StartupContext) -> str | None:
    word = ctx.frame.ird_ord
    if word is not None and not word.p2p and word.rtr:
        return "RTR bits set without peer-to-peer (A=0)"
    return None


def _format_follows_s(ctx: StartupContext) -> str | None:
    req = ctx.request
    if req is not None and (req.ird_ord is None) != (ctx.frame.ird_ord is None):
        return "Reply enhanced format does not follow the Request's S bit"
    return None


def _echoes_a(ctx: StartupContext) -> str | None:
    req, rep = ctx.request, ctx.frame.ird_ord
    if req is not None and req.ird_ord is not None and rep is not None:
        if req.ird_ord.p2p != rep.p2p:
            return f"Reply A bit {int(rep.p2p)} does not echo the Request's {int(req.ird_ord.p2p)}"
    return None


def _signals_rtr(ctx: StartupContext) -> str | None:
    req, rep = ctx.request, ctx.frame.ird_ord
    if req is not None and req.ird_ord is not None and rep is not None:
        if rep.p2p and req.ird_ord.p2p and not rep.rtr:
            return "P2P Reply signals no RTR type"
    return None


def _ord_within_ird(ctx: StartupContext) -> str | None:
    req, rep = ctx.request, ctx.frame.ird_ord
    if req is None or req.ird_ord is None or rep is None:
        return None
    ird = req.ird_ord.ird
    if ird != MPA_V2_NO_NEGOTIATION and rep.ord != MPA_V2_NO_NEGOTIATION and rep.ord > ird:
        return f"responder ORD {rep.ord} exceeds initiator IRD {ird}"
    return None


_CLOSE = TERM_LLP_INVALID_STARTUP

FRAME_RULES: tuple[StartupRule, ...] = (
    StartupRule("MPA-18", True, _CLOSE, True, _wrong_key),
    StartupRule("MPA-26", True, _CLOSE, True, _initiator_initiator),
    StartupRule("MPA-20", True, _CLOSE, True, _revision),
    StartupRule("ERC-01", False, None, True, _s_below_rev2),
    StartupRule("ERC-07", False, None, True, _rtr_without_p2p),
    StartupRule("MPA-19", False, None, True, _siw_gso),
    StartupRule("MPA-19", False, None, True, _r_in_request),
)
"""Rules of one startup frame, in the order they are judged (MPA-18..20, ERC-01, ERC-07)."""

REPLY_RULES: tuple[StartupRule, ...] = (
    StartupRule("ERC-11", True, _CLOSE, True, _format_follows_s),
    StartupRule("ERC-08", True, TERM_LLP_NO_MATCHING_RTR, True, _echoes_a),
    StartupRule("ERC-04", True, TERM_LLP_INSUFFICIENT_IRD, False, _ord_within_ird),
    StartupRule("ERC-08", True, TERM_LLP_NO_MATCHING_RTR, False, _signals_rtr),
)
"""Rules of a Reply against its Request (RFC 6581 §9-10: ERC-04, ERC-08, ERC-11)."""


def check_startup_frame(
    ctx: StartupContext, chk: Checker, rules: Iterable[StartupRule] | None = None
) -> list[tuple[StartupRule, str]]:
    """Judge a startup frame by the tables (a Reply also by :data:`REPLY_RULES` when
    ``ctx.request`` is known); rows that do not apply to a rejecting Reply are skipped.

    Every violation goes to ``chk`` (strict: the first fatal one is raised as an
    :class:`~stack.errors.MpaError` with its cause) and is returned with its row, in order.
    """
    if rules is None:
        rules = FRAME_RULES + REPLY_RULES if ctx.frame.reply else FRAME_RULES
    out: list[tuple[StartupRule, str]] = []
    reject = ctx.frame.reply and ctx.frame.reject
    for row in rules:
        if reject and not row.on_reject:
            continue
        detail = row.check(ctx)
        if detail is None:
            continue
        out.append((row, detail))
        if row.fatal:
            chk.fail(MpaError(row.rule, detail, row.term))
        else:
            chk.note(row.rule, detail)
    return out


def framing_of(request: MpaFrame, reply: MpaFrame) -> tuple[bool, bool, bool]:
    """The FPDU framing an accepted startup sets up: ``(crc, markers_to_responder,
    markers_to_initiator)``.  C in either frame turns CRC on both ways (MPA-11); each side's
    M asks for markers in the FPDUs sent to it (MPA-09)."""
    return request.crc or reply.crc, reply.markers, request.markers


# ======================================================================================
# RFC 6581 §9.1-9.2: IRD/ORD and RTR negotiation
# ======================================================================================


def responder_ird_ord(
    peer: IrdOrd,
    cap_ird: int,
    cap_ord: int,
    supported: RtrType,
    preference: Iterable[RtrType],
) -> tuple[IrdOrd, int, int, RtrType]:
    """Responder side of RFC 6581 §9.1-9.2: the Reply word, final IRD/ORD, RTR kind.

    ``cap_ird``/``cap_ord``: what the responder can do; ``supported``: its RTR kinds;
    ``preference``: the order it picks a common kind in.  Our ORD never exceeds the
    initiator's IRD and our IRD never exceeds its ORD (ERC-04); 0x3FFF opts out (ERC-06).
    A P2P Request gets an A=1 Reply flagging the chosen kind, or a supported one when
    nothing offered is supported (ERC-08); a Read RTR needs an IRD credit (§9.1 lets the
    responder raise IRD from 0 to 1 for it).
    """
    preference = tuple(preference)
    if peer.ird == MPA_V2_NO_NEGOTIATION or cap_ord == MPA_V2_NO_NEGOTIATION:
        final_ord, wire_ord = cap_ord, MPA_V2_NO_NEGOTIATION
    else:
        final_ord = wire_ord = min(cap_ord, peer.ird)
    if peer.ord == MPA_V2_NO_NEGOTIATION or cap_ird == MPA_V2_NO_NEGOTIATION:
        final_ird, wire_ird = cap_ird, MPA_V2_NO_NEGOTIATION
    else:
        final_ird = wire_ird = min(cap_ird, peer.ord)
    rtr_used = RtrType.NONE
    flags = RtrType.NONE
    if peer.p2p:
        if cap_ird < 1:
            supported &= ~RtrType.READ  # a zero-length Read needs an IRD credit
        if not supported:
            raise LocalError("a responder must support at least one RTR type (ERC-08)")
        offered = RtrType(peer.rtr)
        for kind in preference:
            if kind & offered & supported:
                rtr_used = RtrType(kind)
                break
        if rtr_used:
            flags = rtr_used
        else:  # ERC-08: flag a supported type even though none was offered
            flags = next(RtrType(k) for k in (*preference, *RTR_ORDER) if k & supported)
        if rtr_used is RtrType.READ and final_ird == 0 and wire_ird == 0:
            final_ird = wire_ird = 1
    return IrdOrd(wire_ird, wire_ord, peer.p2p, flags), final_ird, final_ord, rtr_used


def initiator_rtr(
    offered: RtrType, peer: IrdOrd, ord_: int, preference: Iterable[RtrType]
) -> RtrType:
    """The one RTR kind flagged by both sides, by ``preference`` (ERC-09); a Read RTR needs
    an ORD credit.  :attr:`RtrType.NONE` when there is none (the initiator must then
    send Terminate 2/0/7)."""
    common = RtrType(offered) & RtrType(peer.rtr)
    if ord_ == 0:
        common &= ~RtrType.READ
    for kind in (*preference, *RTR_ORDER):
        if kind & common:
            return RtrType(kind)
    return RtrType.NONE
