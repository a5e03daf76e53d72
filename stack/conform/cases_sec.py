"""Security cases a remote peer can provoke (RFC 5042 §6; RFC 5040 §8.1; RFC 5041 §8.3).

Several of them need more than one connection to the DUT at once: an application that
serves several sessions, each in a protection domain of its own (``kbtp target``: one PD
per session), lets the runner aim one session's STags at another (SEC-01, SEC-02); one that
serves several lets the runner break one connection and see the others go on (SEC-09),
use an STag of a connection that has ended (SEC-06), and collect the STags it hands out to
judge how guessable they are (SEC-08, a SHOULD: WARN).  An application that serves one
connection at a time (``rping -s``) SKIPs those, with that reason.
"""

from __future__ import annotations

import socket
import struct
from collections import Counter
from collections.abc import Callable, Sequence

import trio

from stack.conform.apps import Region
from stack.conform.context import CaseContext
from stack.conform.model import Verdict
from stack.conform.peer_core import Craft
from stack.conform.provocations import FAR, fetch_add, needs, read
from stack.conform.registry import case
from stack.conform.session import (
    Alternative,
    Item,
    Session,
    alive,
    open_session,
    provoke,
    watch,
)
from stack.constants import (
    TERM_RDMAP_PROT_CANNOT_INVALIDATE,
    TERM_RDMAP_STAG_NOT_ASSOCIATED,
)
from stack.rnic.memory import Access
from stack.wire.events import RdmaWrite, Send

_D = "data"
_R, _W, _A = Access.REMOTE_READ, Access.REMOTE_WRITE, Access.REMOTE_ATOMIC


def serves(ctx: CaseContext) -> str:
    """Why a case of several connections does not apply."""
    n = ctx.app.sessions
    what = "one connection" if n == 1 else f"{n} connections"
    return f"the {ctx.app.name} application serves {what} at a time"


async def two_sessions(ctx: CaseContext, count: int = 2) -> list[Session] | Verdict:
    """``count`` connections to the DUT at once, each brought to ready."""
    app = ctx.app
    if app.sessions < count:
        return Verdict.not_applicable(serves(ctx))
    out: list[Session] = []
    for index in range(count):
        s = await open_session(ctx, index=index)
        if isinstance(s, Verdict):
            return s
        out.append(s)
    for s in out:
        s.others = [o for o in out if o is not s]
    return out


async def foreign_items(
    ctx: CaseContext,
    right: Access,
    *,
    what: str,
    build: Callable[[Session, Region], Sequence[Item]],
    alternatives: Sequence[Alternative] = (),
) -> Verdict:
    """On one connection, ``build``'s items aimed at a region with ``right`` the DUT
    advertised on another connection (SEC-01, SEC-02)."""
    app = ctx.app
    if app.sessions >= 2 and not app.own_pd:
        return Verdict.not_applicable(
            f"the {app.name} application shares one protection domain across its connections "
            "(SEC-03 allows that for streams that trust each other)"
        )
    both = await two_sessions(ctx)
    if isinstance(both, Verdict):
        return both
    a, b = both
    region = b.region(right)
    if region is None:
        return Verdict.not_applicable(b.no_region(right))
    return await provoke(a, build(a, region), what=what, alternatives=alternatives)


# ======================================================================================
# Protection domains (RFC 5042 §6.1.1; RFC 5040 §8.1.1(1), (2))
# ======================================================================================


@case(
    "SEC-01",
    "A Read with an STag of the DUT's other connection: Terminate 0/1/0x03",
    rules=("SEC-02", "RDMAP-16", "RDMAP-12"),
    phase=_D,
    sends="two connections; on the first, an 8-octet Read Request of a region the DUT "
    "advertised on the second",
    expects="no Read Response; the stack's Terminate (STag not associated with the stream), "
    "R=1; SKIP when the app shares one protection domain or serves one connection",
)
async def read_other_pd(ctx: CaseContext) -> Verdict:
    return await foreign_items(
        ctx,
        _R,
        what="Read with another connection's STag",
        build=lambda s, r: [read(s, r.stag, r.to, 8)],
    )


@case(
    "SEC-01",
    "A FetchAdd with an STag of the DUT's other connection: Terminate 0/1/0x03",
    n=2,
    rules=("SEC-02", "EXT-11"),
    phase=_D,
    sends="two connections; on the first, a FetchAdd of 0 to the atomic region the DUT "
    "advertised on the second",
    expects="no Atomic Response; the stack's Terminate (STag not associated); 0/2/0x06: not "
    "RFC 7306 (SKIP)",
)
async def atomic_other_pd(ctx: CaseContext) -> Verdict:
    from stack.conform.session import not_7306

    return await foreign_items(
        ctx,
        _A,
        what="FetchAdd with another connection's STag",
        build=lambda s, r: [fetch_add(s, r.stag, r.to + (-r.to % 8))],
        alternatives=[not_7306()],
    )


@case(
    "SEC-02",
    "Send with Invalidate of the DUT's other connection's STag: refused, the STag keeps working",
    rules=("RDMAP-09", "SEC-07"),
    phase=_D,
    sends="two connections; on the first, a Send with Invalidate naming a readable region of "
    "the second; then a Read of that region on the second",
    expects="the stack's Terminate on the first (STag cannot be invalidated; 0/2/0x09 as good); "
    "the Read on the second answered",
)
async def invalidate_other(ctx: CaseContext) -> Verdict:
    from stack.conform.cases_rdmap import INVALIDATE_ALTERNATIVES

    both = await two_sessions(ctx)
    if isinstance(both, Verdict):
        return both
    a, b = both
    if not ctx.app.own_pd:
        return Verdict.not_applicable(f"the {ctx.app.name} application shares one PD")
    r = b.region(_R)
    if r is None:
        return Verdict.not_applicable(b.no_region(_R))
    payload = bytes(16)
    verdict = await provoke(
        a,
        [Send(payload, invalidate_stag=r.stag)],
        what="Send with Invalidate of another connection's STag",
        alternatives=INVALIDATE_ALTERNATIVES,
    )
    if verdict.outcome.value != "met":
        return verdict
    after = await provoke(
        b, [read(b, r.stag, r.to, 8)], what="Read of the named region", live=False
    )
    if after.outcome.value != "met":
        return Verdict.not_met(
            f"the other connection lost its STag: {after.observed}", *after.evidence, rule="SEC-02"
        )
    return verdict.with_evidence(f"on the other connection: {after.observed}")


# ======================================================================================
# Revoked STags (RFC 5042 §6.2.2; RFC 5040 §8.1.1(6))
# ======================================================================================


@case(
    "SEC-06",
    "Send with Invalidate of the advertised region, then a Read of it: Terminate 0/1/0x00",
    rules=("RDMAP-09", "SEC-15"),
    phase=_D,
    sends="a Send with Invalidate naming the advertised readable region (its own stream's), "
    "then an 8-octet Read Request of it, in one write",
    expects="the Send taken and the STag invalidated, so the Read is refused with the stack's "
    "Terminate (Invalid STag); a DUT that refuses to invalidate (0/1/0x09) passes too",
)
async def invalidated_read(ctx: CaseContext) -> Verdict:
    from stack.conform.cases_rdmap import INVALIDATE_ALTERNATIVES

    @needs(_R)
    def items(s: Session, r: Region) -> Sequence[Item] | Verdict:
        if s.ird == 0:
            return Verdict.not_applicable("the DUT takes no Read Requests (IRD 0)")
        size = min(s.receives.size, 16)
        return [Send(bytes(size), invalidate_stag=r.stag), read(s, r.stag, r.to, 8)]

    refusals = (
        *INVALIDATE_ALTERNATIVES,
        Alternative(
            TERM_RDMAP_PROT_CANNOT_INVALIDATE,
            "the DUT refuses remote invalidation of this STag "
            "(RFC 5040 §5.3 lets it): the STag stays valid",
            means="met",
        ),
    )
    return await provoke(
        await open_session(ctx),
        items,
        what="Read of an invalidated STag",
        alternatives=refusals,
        allow=1,
    )


@case(
    "SEC-06",
    "A Read with an STag of a connection that has ended: refused",
    n=2,
    rules=("SEC-15", "SEC-05"),
    phase=_D,
    sends="a connection that learns a readable region, is closed; on a second connection an "
    "8-octet Read Request of that region",
    expects="the stack's Terminate (Invalid STag: the region went with its connection; 'not "
    "associated' 0/1/0x03 is as good); SKIP when the app serves one connection",
)
async def ended_read(ctx: CaseContext) -> Verdict:
    if ctx.app.sessions < 2:
        return Verdict.not_applicable(serves(ctx))
    a = await open_session(ctx)
    if isinstance(a, Verdict):
        return a
    old = a.region(_R)
    if old is None:
        return Verdict.not_applicable(a.no_region(_R))
    await a.peer.close()
    await trio.sleep(ctx.options.silence)
    b = await open_session(ctx, index=1)
    if isinstance(b, Verdict):
        return b
    alt = Alternative(
        TERM_RDMAP_STAG_NOT_ASSOCIATED,
        "the old STag is kept in the old connection's protection domain: as safe",
        means="met",
    )
    return await provoke(
        b, [read(b, old.stag, old.to, 8)], what="Read with an ended STag", alternatives=[alt]
    )


# ======================================================================================
# STags hard to guess (RFC 5040 §8.1.1(8), RFC 5042 §6.1.1)
# ======================================================================================


@case(
    "SEC-08",
    "The STags the app advertises over several connections are not sequential",
    level="SHOULD",
    rules=("SEC-05",),
    phase=_D,
    sends="as many connections at once as the app serves (up to 4), each brought to where "
    "its STags are advertised",
    expects="STags that do not follow from each other: no step between successive ones (each "
    "connection's in order) that repeats for two thirds of them (WARN otherwise); SKIP with "
    "fewer than 3 STags",
)
async def guessable(ctx: CaseContext) -> Verdict:
    count = min(ctx.app.sessions, 4)
    sessions = await two_sessions(ctx, count) if count >= 2 else None
    if isinstance(sessions, Verdict):
        return sessions
    if sessions is None:
        s = await open_session(ctx)
        if isinstance(s, Verdict):
            return s
        sessions = [s]
    stags = [stag for s in sessions for stag in sorted(r.stag for r in s.regions)]
    line = ", ".join(f"0x{x:08X}" for x in stags)
    if len(stags) < 3:
        return Verdict.not_applicable(
            f"{len(stags)} STag(s) from {len(sessions)} connection(s): too few to judge ({line})"
        )
    steps = [(b - a) & 0xFFFFFFFF for a, b in zip(stags, stags[1:], strict=False)]
    step, count = Counter(steps).most_common(1)[0]
    if count * 3 >= len(steps) * 2:
        return Verdict.not_met(
            f"{count} of {len(steps)} successive STags differ by the same 0x{step:X}: the next "
            "one is guessable",
            f"STags in the order advertised: {line}",
        )
    return Verdict.met(
        f"{len(stags)} STags, no step between successive ones repeats "
        f"({count} of {len(steps)} at most)",
        f"STags: {line}",
    )


# ======================================================================================
# One stream's failure leaves the others alone (RFC 5040 §8.1.1(9), (10); RFC 5042 §6.4.6)
# ======================================================================================


async def _break_one(ctx: CaseContext, how: str) -> Verdict:
    both = await two_sessions(ctx)
    if isinstance(both, Verdict):
        return both
    a, b = both
    if how == "crc":
        await a.send([(a.ulpdus(Send(bytes(8)))[0], Craft(bad_crc=True))])
        w = await watch(a)
        what = "an FPDU with a bad CRC"
        if w.terminate is None and w.eof is None:
            return Verdict.broken(f"the first connection did not end after {what}")
    else:
        sock = a.peer.stream.socket
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        await a.peer.close(grace=0)
        what = "a TCP reset"
    await trio.sleep(ctx.options.silence)
    after = await alive(b, what=f"{what} on the other connection")
    return after


@case(
    "SEC-09",
    "One connection ended by an error: the DUT's other connection goes on",
    rules=("SEC-15", "RDMAP-15"),
    phase=_D,
    sends="two connections; on the first, an FPDU with a bad CRC; then the second's exchange",
    expects="the first ended (Terminate), the second works; SKIP when the app serves one "
    "connection",
)
async def other_survives_error(ctx: CaseContext) -> Verdict:
    return await _break_one(ctx, "crc")


@case(
    "SEC-09",
    "One connection reset: the DUT's other connection goes on",
    n=2,
    rules=("SEC-15",),
    phase=_D,
    sends="two connections; the first reset (RST); then the second's exchange",
    expects="the second works; SKIP when the app serves one connection",
)
async def other_survives_reset(ctx: CaseContext) -> Verdict:
    return await _break_one(ctx, "reset")


# ======================================================================================
# Base and bounds to the octet (RFC 5042 §6.2.1; RFC 5040 §8.1.1(3))
# ======================================================================================


@case(
    "SEC-04",
    "A Read of the last octet of an exactly advertised region: answered",
    rules=("RDMAP-06",),
    phase=_D,
    sends="a 1-octet Read Request at the last octet of a readable region of known length "
    "(the KBTP Pool)",
    expects="a 1-octet Read Response; SKIP without a region of exact length",
)
async def last_octet(ctx: CaseContext) -> Verdict:
    from stack.conform.cases_read import _sizes

    @needs(_R, exact=True)
    def items(s: Session, r: Region) -> Sequence[Item]:
        return [read(s, r.stag, r.to + r.length - 1, 1)]

    return await provoke(
        await open_session(ctx), items, what="Read of the last octet", check=_sizes(1)
    )


@case(
    "SEC-04",
    "A Read of the last octet and one past: Terminate 0/1/0x01",
    n=2,
    rules=("RDMAP-16", "RDMAP-12"),
    phase=_D,
    sends="a 2-octet Read Request at the last octet of a readable region of known length",
    expects="no Read Response; the stack's Terminate (base or bounds violation)",
)
async def one_past(ctx: CaseContext) -> Verdict:
    @needs(_R, exact=True)
    def items(s: Session, r: Region) -> Sequence[Item]:
        return [read(s, r.stag, r.to + r.length - 1, 2)]

    return await provoke(await open_session(ctx), items, what="Read one octet past the end")


@case(
    "SEC-04",
    "A Write straddling the end of an exactly advertised region: Terminate 1/1/0x01",
    n=3,
    rules=("DDP-10", "DDP-11"),
    phase=_D,
    sends="an 8-octet RDMA Write at the last 4 octets of a writable region of known length "
    "(the KBTP Partition)",
    expects="nothing placed (not even the 4 octets inside); the stack's Terminate (base or bounds)",
)
async def write_straddle(ctx: CaseContext) -> Verdict:
    @needs(_W, exact=True)
    def items(s: Session, r: Region) -> Sequence[Item]:
        return [RdmaWrite(r.stag, r.to + r.length - 4, bytes(8))]

    return await provoke(await open_session(ctx), items, what="Write past the end")


@case(
    "SEC-15",
    "After an invalid-STag error nothing more is delivered",
    rules=("DDP-10", "RDMAP-10"),
    phase=_D,
    sends="once the app is ready, an RDMA Write far past the advertised region and, in the "
    "same write, the app's next message",
    expects="the stack's Terminate for the Write; the next message not delivered (the stream "
    "is over)",
)
async def nothing_after(ctx: CaseContext) -> Verdict:
    @needs(_W)
    def items(s: Session, r: Region) -> Sequence[Item]:
        nxt = s.pending or s.client.opening()
        return [RdmaWrite(r.stag, r.to + FAR, bytes(8)), *nxt]

    return await provoke(await open_session(ctx), items, what="Write past the region")
