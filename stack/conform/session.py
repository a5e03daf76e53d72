"""Data-phase cases: a valid startup, the application brought to a known state, one
provocation, and the verdict of the stack's own endpoint set up like the DUT.

A :class:`Session` is one connection in Full Operation with the application's client
(:mod:`stack.conform.apps`) played up to the point a case needs: just established (the
*carrier* cases edit the application's first message, so its delivery is the evidence), or
*ready* (the application waits, with the regions it advertises known: rping's RDMA buffer
from its Read Request, KBTP's STags from HELLO_ACK, the bench target from the MPA Reply).
The case sends ULPDUs the stack's encoder builds, edited (:mod:`stack.conform.ulpdu`) or
broken in framing (:class:`~stack.conform.peer_core.Craft`), and :meth:`Session.expect`
replays the connection into :class:`~stack.conform.oracle.ModelDut`: its first error is the
Terminate the DUT must send (cause MUST; Fig. 10 header copies RDMAP-12, SHOULD), or, when
the model takes everything, the DUT must go on (:func:`alive`); watching and judging:
:mod:`stack.conform.session_judge`.  The runner's own Read and Atomic Requests are matched
with the DUT's responses by a lenient :class:`~stack.wire.sequence.RequestTracker`
(RDMAP-04, RDMAP-06, EXT-03).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from stack.conform.apps import AppClient, Receives, Region
from stack.conform.context import CaseContext
from stack.conform.expected import work_verdict
from stack.conform.model import Outcome, Verdict
from stack.conform.oracle import Expectation, ModelDut, ModelError
from stack.conform.peer import Peer
from stack.conform.peer_core import Craft, Sent
from stack.conform.script import (
    Conversation,
    converse,
    need_established,
    read_request,
    reply_valid,
    start,
)
from stack.conform.session_judge import (
    Alternative,
    Watch,
    alive,
    conclude,
    not_7306,
    watch,
)
from stack.conform.session_judge import _accepted as _accepted
from stack.conform.session_judge import _judge_refused as _judge_refused
from stack.constants import MPA_V2_NO_NEGOTIATION, Opcode
from stack.rnic.memory import Access
from stack.wire.checker import Checker, Finding
from stack.wire.events import (
    AtomicRequest,
    AtomicResponse,
    MpaFrame,
    MpaSettings,
    Negotiated,
    RdmapMessage,
    ReadRequest,
)
from stack.wire.rdmap import Segment
from stack.wire.sequence import RequestTracker

__all__ = [
    "Alternative",
    "Item",
    "Session",
    "Watch",
    "accept_session",
    "alive",
    "carrier",
    "conclude",
    "not_7306",
    "open_session",
    "provoke",
    "watch",
]

Item = RdmapMessage | bytes | tuple[bytes, Craft | None]
"""What a case sends: a message (encoded with the next MSN of its queue), or ULPDU bytes
(with a framing :class:`Craft`)."""


@dataclass
class Session:
    """One connection in Full Operation (see the module docstring).

    Fields: ctx, peer, client (the application's client or, the DUT connecting, its
    server), negotiated (the runner's side), dut_listens, request_raw and reply (the
    runner's Request bytes and the DUT's Reply frame), dut_request and reply_raw (the
    other way round), conv (the exchange that brought the application to its state),
    others (the case's other sessions with the same DUT), reads (the runner's Read and
    Atomic Requests, matched with the DUT's responses), read_data (octets returned per
    Read, in request order), atomic_values (original values returned), findings (rules the
    DUT's responses broke).
    """

    ctx: CaseContext
    peer: Peer
    client: AppClient
    negotiated: Negotiated
    dut_listens: bool = True
    request_raw: bytes = b""
    reply: MpaFrame | None = None
    dut_request: MpaFrame | None = None
    reply_raw: bytes = b""
    conv: Conversation | None = None
    others: list[Session] = field(default_factory=list)
    reads: RequestTracker = field(default_factory=RequestTracker)
    read_data: list[bytearray] = field(default_factory=list)
    atomic_values: list[int] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)

    # -- what the DUT advertised -----------------------------------------------------------

    @property
    def regions(self) -> list[Region]:
        return self.client.regions

    @property
    def receives(self) -> Receives:
        return self.client.receives or self.ctx.app.receives

    @property
    def pending(self) -> list[RdmapMessage]:
        return self.conv.pending if self.conv is not None else []

    def region(self, right: Access, *, scratch: bool = False, exact: bool = False) -> Region | None:
        """The first advertised region with ``right`` (and scratch / exact when asked)."""
        for r in self.regions:
            if r.allows(right) and (r.scratch or not scratch) and (r.exact or not exact):
                return r
        return None

    def without(self, right: Access) -> Region | None:
        """An advertised region that lacks ``right`` (for access-rights cases)."""
        for r in self.regions:
            if not r.allows(right) and r.access & (Access.REMOTE_READ | Access.REMOTE_WRITE):
                return r
        return None

    def no_region(self, right: Access, *, scratch: bool = False, exact: bool = False) -> str:
        """The SKIP reason of a case needing a region with ``right``."""
        kinds = (
            (Access.REMOTE_READ, "read"),
            (Access.REMOTE_WRITE, "write"),
            (Access.REMOTE_ATOMIC, "atomic"),
        )
        name = "remote " + " and ".join(n for a, n in kinds if right & a)
        extra = " the runner may change" if scratch else (" of exact length" if exact else "")
        seen = "; ".join(r.line() for r in self.regions) or "nothing"
        return (
            f"the {self.ctx.app.name} application advertises no STag with {name} access"
            f"{extra} (advertised: {seen})"
        )

    @property
    def ird(self) -> int | None:
        """The DUT's IRD (its Reply's, or connecting its Request's, RFC 6581 word); None
        when it sent none or 0x3FFF (no limit negotiated)."""
        frame = self.reply if self.dut_listens else self.dut_request
        if frame is None or frame.ird_ord is None:
            return None
        value = self.negotiated.peer_ird
        return None if value is None or value == MPA_V2_NO_NEGOTIATION else value

    # -- the model ---------------------------------------------------------------------------

    def model(self) -> ModelDut:
        """The stack's endpoint set up like the DUT on this connection."""
        reserved = {r.stag for r in self.regions}
        for other in self.others:
            reserved |= {r.stag for r in other.regions}
        return ModelDut(
            dut_listens=self.dut_listens,
            request_raw=self.request_raw,
            reply=self.reply,
            request=self.dut_request,
            reply_raw=self.reply_raw,
            regions=self.regions,
            foreign=[o.regions for o in self.others],
            own_pd=self.ctx.app.own_pd,
            receives=self.receives,
            reserved=reserved,
        )

    def expect(self) -> Expectation:
        """What the model does with everything sent and received so far."""
        return self.model().replay(self.peer.log)

    # -- sending -----------------------------------------------------------------------------

    def ulpdus(self, message: RdmapMessage) -> list[bytes]:
        """The ULPDUs of ``message`` with the next MSN of its queue; the runner's Read and
        Atomic Requests are remembered to match the DUT's responses."""
        if isinstance(message, ReadRequest):
            self.reads.read_request(message.sink_stag, message.sink_to, message.size)
            self.read_data.append(bytearray())
        elif isinstance(message, AtomicRequest):
            self.reads.atomic_request(message.req_id)
        return self.peer.core.ulpdus(message)

    def frames(self, items: Sequence[Item]) -> list[tuple[bytes, Craft | None]]:
        out: list[tuple[bytes, Craft | None]] = []
        for item in items:
            if isinstance(item, bytes):
                out.append((item, None))
            elif isinstance(item, tuple):
                out.append(item)
            else:
                out.extend((u, None) for u in self.ulpdus(item))
        return out

    async def send(self, items: Sequence[Item]) -> list[Sent]:
        """Send ``items`` in one write (the DUT gets them together)."""
        return await self.peer.send_fpdus(self.frames(items))

    def outstanding(self) -> int:
        return len(self.reads)

    def absorb(self, seg: Segment) -> bool:
        """A DUT response to one of the runner's requests: matched and recorded."""
        chk = Checker(strict=False)
        if seg.opcode == Opcode.RDMA_READ_RESPONSE and self.reads.reads:
            assert seg.stag is not None and seg.to is not None
            index = len(self.read_data) - len(self.reads.reads)
            self.reads.read_response(seg.stag, seg.to, len(seg.payload), seg.last, chk)
            self.read_data[index] += bytes(seg.payload)
        elif isinstance(seg.header, AtomicResponse) and self.reads.atomics:
            self.reads.atomic_response(seg.header.req_id, chk)
            self.atomic_values.append(seg.header.orig_value)
        else:
            return False
        self.findings += chk.findings
        return True


# ======================================================================================
# Opening sessions
# ======================================================================================


async def open_session(
    ctx: CaseContext,
    *,
    ready: bool = True,
    index: int = 0,
    settings: MpaSettings | None = None,
) -> Session | Verdict:
    """A valid startup with the DUT listening (one more connection for ``index`` > 0),
    then, with ``ready``, the application's exchange up to the point it waits with its
    regions advertised.  A verdict when that cannot be done (the case is an ERROR)."""
    s = await start(ctx, settings=settings, extra=index > 0)
    broken = need_established(s)
    if broken is not None:
        return broken
    assert s.negotiated is not None and s.answer.seen is not None
    client = ctx.app.new_client(index)
    reply = s.answer.seen.frame
    client.on_reply(reply.private_data)
    session = Session(ctx, s.peer, client, s.negotiated, True, s.request.raw, reply)
    if ready and not client.ready:
        return await _bring_up(session)
    return session


async def accept_session(ctx: CaseContext, *, ready: bool = True) -> Session | Verdict:
    """The DUT connects: its Request answered with the responder engine's valid Reply,
    then (``ready``) the application's server side played until the DUT's application has
    advertised its regions.  A verdict when that cannot be done."""
    peer, answer = await read_request(ctx)
    if answer.kind != "request" or answer.seen is None:
        return Verdict.broken(f"no usable Request from the DUT: {answer.describe()}")
    request = answer.seen.frame
    valid = reply_valid(answer.seen.raw, MpaSettings())
    await peer.send_raw(valid.raw)
    neg = valid.negotiated
    peer.core.start_framing(crc=neg.crc, markers_tx=neg.markers_tx, markers_rx=neg.markers_rx)
    server = ctx.app.new_server()
    if server is None:
        return Verdict.not_applicable(
            f"the runner cannot play the {ctx.app.name} server for a connecting DUT"
        )
    server.on_reply(request.private_data)
    session = Session(ctx, peer, server, neg, False, dut_request=request, reply_raw=valid.raw)
    if ready and not server.ready:
        return await _bring_up(session)
    return session


async def _bring_up(s: Session) -> Session | Verdict:
    conv = await converse(s.ctx, s.peer, client=s.client, stop=lambda c: c.ready, absorb=s.absorb)
    s.conv = conv
    if s.client.ready and conv.terminate is None and conv.eof is None and conv.framing is None:
        return s
    verdict = work_verdict(conv, "a valid startup")
    what = verdict.observed if verdict.outcome is not Outcome.MET else "the exchange ended"
    return Verdict.broken(
        f"the {s.ctx.app.name} application did not reach the state the case needs: {what}",
        *verdict.evidence,
    )


# ======================================================================================
# The two shapes of data-phase case
# ======================================================================================


async def carrier(
    ctx: CaseContext,
    edit: Callable[[Session, bytes], Sequence[Item] | Verdict],
    *,
    what: str,
    alternatives: Sequence[Alternative] = (),
    settings: MpaSettings | None = None,
    allow: int = 0,
    first: Callable[[Session], RdmapMessage] | None = None,
) -> Verdict:
    """Startup, then the application's first message as ``edit`` turns its first ULPDU
    into ULPDUs (changed, split, preceded or followed by others), in one write; the rest
    of the exchange follows when the DUT takes it.  Judged by the model (:func:`conclude`;
    ``allow``: deliveries that precede the offending ULPDU).  ``edit`` may return a verdict
    instead: the case does not apply to this DUT.  ``first``: the message to edit instead
    of the application's (which then follows it, with the next MSN: its delivery is the
    evidence)."""
    opened = await open_session(ctx, ready=False, settings=settings)
    if isinstance(opened, Verdict):
        return opened
    s = opened
    head, *rest = s.client.opening()
    if first is not None:
        rest = [head, *rest]
        head = first(s)
    ulpdus = s.ulpdus(head)
    made = edit(s, ulpdus[0])
    if isinstance(made, Verdict):
        return made
    items = list(made) + ulpdus[1:]
    await s.send(items)
    for message in rest:
        await s.send([message])
    return await _model_verdict(
        s, what=what, alternatives=alternatives, carrier_sent=True, allow=allow
    )


async def provoke(
    s: Session | Verdict,
    items: Sequence[Item] | Verdict | Callable[[Session], Sequence[Item] | Verdict],
    *,
    what: str,
    alternatives: Sequence[Alternative] = (),
    check: Callable[[Session], Verdict | None] | None = None,
    live: bool = True,
    allow: int = 0,
) -> Verdict:
    """With the application ready, send ``items`` (or what the callable makes of the
    session; a verdict: the case does not apply) in one write and judge (:func:`conclude`)."""
    if isinstance(s, Verdict):
        return s
    made = items(s) if callable(items) else items
    if isinstance(made, Verdict):
        return made
    await s.send(made)
    return await _model_verdict(
        s, what=what, alternatives=alternatives, check=check, live=live, allow=allow
    )


async def _model_verdict(
    s: Session,
    *,
    what: str,
    alternatives: Sequence[Alternative] = (),
    check: Callable[[Session], Verdict | None] | None = None,
    live: bool = True,
    carrier_sent: bool = False,
    allow: int = 0,
) -> Verdict:
    try:
        exp = s.expect()
    except ModelError as exc:
        return Verdict.broken(str(exc))
    if carrier_sent and exp.accepts and check is None:
        conv = await converse(s.ctx, s.peer, client=s.client, opening=[], absorb=s.absorb)
        s.conv = conv
        return work_verdict(conv, f"the {what}").with_evidence(exp.line())
    return await conclude(
        s, exp, what=what, alternatives=alternatives, check=check, live=live, allow=allow
    )
