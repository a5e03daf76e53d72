"""Scripted steps of a case: MPA startup either way, the application exchange, expectations.

The steps a case is written in, packetdrill style (send this, expect that within T):

* DUT listens: :func:`send_request` (a valid Request from
  :class:`~stack.wire.mpa.MpaConnection` with chosen settings, edited bytes, or raw bytes),
  :func:`read_answer` (the DUT's Reply, a close, silence, or unreadable bytes) and
  :func:`establish` (the runner's initiator engine judges the Reply as a conforming
  initiator would, then framing starts with the negotiated CRC and markers and the RTR, if
  any, goes out);
* DUT connects: :func:`read_request`, then :func:`reply_valid` or a crafted Reply;
* Full Operation: :func:`converse` plays the application's client (:mod:`stack.conform.apps`)
  and records deliveries, a Terminate, framing errors and the close;
* expectations (a close, silence, a Terminate within a time): :mod:`stack.conform.expect`.

Every expected Terminate comes from the wire core: the cause is the ``term`` of the error
the wire core raises for the same input, the header copies are
:func:`~stack.wire.terminate.build_terminate`'s.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace

import trio

from stack.conform.apps import AppClient
from stack.conform.context import CaseContext, SetupError
from stack.conform.model import Verdict
from stack.conform.peer import Peer
from stack.conform.peer_core import Craft, Eof, FramingBad, PduSeen, Sent, StartupBad, StartupSeen
from stack.constants import MPA_MAX_PRIVATE_DATA, Opcode, RtrType, term_name
from stack.errors import IwarpError
from stack.wire.checker import Finding
from stack.wire.connection import WRITE_RTR_STAG
from stack.wire.events import (
    ConnectionFailed,
    CrcPolicy,
    Established,
    MpaFrame,
    MpaSettings,
    NeedData,
    Negotiated,
    RdmapMessage,
    RdmaWrite,
    ReadRequest,
    Rejected,
    RequestReceived,
    Role,
    Send,
    Terminate,
)
from stack.wire.mpa import MpaConnection
from stack.wire.mpa_frames import decode_frame
from stack.wire.mpa_rules import framing_of
from stack.wire.rdmap import Segment
from stack.wire.terminate import build_terminate

__all__ = [
    "Answer",
    "Conversation",
    "Request",
    "Startup",
    "converse",
    "describe_frame",
    "frame_note",
    "establish",
    "read_answer",
    "read_request",
    "reply_valid",
    "rtr_message",
    "send_request",
    "start",
    "terminate_line",
]

Edit = Callable[[bytes], bytes]


# ======================================================================================
# Describing what was seen
# ======================================================================================


def describe_frame(frame: MpaFrame) -> str:
    """``Reply Rev 2 M=0 C=1 R=0 Res=0x0 (IRD 1, ORD 1, A=0), PD 0 bytes``."""
    kind = "Reply" if frame.reply else "Request"
    word = ""
    if frame.ird_ord is not None:
        w = frame.ird_ord
        kinds = ((RtrType.SEND, "send"), (RtrType.WRITE, "write"), (RtrType.READ, "read"))
        rtr = "+".join(name for kind, name in kinds if kind & w.rtr) or "-"
        word = f" (IRD {w.ird}, ORD {w.ord}, A={int(w.p2p)}, RTR {rtr})"
    return (
        f"{kind} Rev {frame.rev} M={int(frame.markers)} C={int(frame.crc)} "
        f"R={int(frame.reject)} Res=0x{frame.reserved:X}{word}, "
        f"{len(frame.private_data)} bytes of private data"
    )


def terminate_line(t: Terminate) -> str:
    """``Terminate 2/0/0x02 MPA CRC error, M=0 D=0 R=0``."""
    return (
        f"Terminate {t.layer}/{t.etype}/0x{t.code:02X} {term_name(t.cause)}, "
        f"M={int(t.m)} D={int(t.d)} R={int(t.r)}"
    )


def frame_note(peer: Peer, offset: int, length: int) -> tuple[int | None, str]:
    frame = peer.frame_of_dut(offset + max(length, 1) - 1)
    return frame, (f"frame {frame}" if frame is not None else f"stream offset {offset}")


# ======================================================================================
# Startup, DUT listening (the runner is the MPA Initiator)
# ======================================================================================


@dataclass
class Request:
    """The Request the runner sent.  Fields: raw (bytes sent), frame (as decoded, None if
    the bytes are not a readable frame), engine (the initiator engine that made it, None for
    crafted bytes the engine could not have sent)."""

    raw: bytes
    frame: MpaFrame | None
    engine: MpaConnection | None


@dataclass
class Answer:
    """What the DUT answered to a Request (or sent first, when it connects).

    Fields: kind ('reply', 'reject', 'close', 'silence', 'bad'); seen (the frame event);
    bad (unreadable bytes); eof (the close, when it came); frame (capture frame number);
    seconds (how long it took).
    """

    kind: str
    seen: StartupSeen | None = None
    bad: StartupBad | None = None
    eof: Eof | None = None
    frame: int | None = None
    seconds: float = 0.0

    @property
    def mpa(self) -> MpaFrame:
        assert self.seen is not None
        return self.seen.frame

    def describe(self) -> str:
        where = f" (frame {self.frame})" if self.frame is not None else ""
        if self.seen is not None:
            return describe_frame(self.seen.frame) + where
        if self.bad is not None:
            return f"{len(self.bad.raw)} bytes that are no MPA frame: {self.bad.error}{where}"
        if self.kind == "close":
            how = "reset" if self.eof is not None and self.eof.reset else "closed"
            return f"{how} the connection after {self.seconds:.2f} s without a startup frame"
        return f"sent nothing for {self.seconds:.2f} s"


async def send_request(
    peer: Peer,
    settings: MpaSettings,
    *,
    private_data: bytes = b"",
    edit: Edit | None = None,
    raw: bytes | None = None,
) -> Request:
    """Send an MPA Request: the initiator engine's for ``settings`` and ``private_data``,
    then ``edit``-ed if given; or ``raw`` bytes as they are."""
    engine: MpaConnection | None = None
    if raw is None:
        engine = MpaConnection(Role.INITIATOR, settings)
        engine.initiate(trio.current_time(), private_data)
        raw = bytes(engine.data_to_send())
        if edit is not None:
            raw = edit(raw)
            engine = None
    try:
        decoded = decode_frame(raw, max_private_data=0xFFFF)
    except IwarpError:
        decoded = None
    frame = decoded[0] if decoded is not None and decoded[1] == len(raw) else None
    if engine is None and frame is not None:
        engine = _engine_for(frame, settings)
    await peer.send_raw(raw)
    return Request(raw, frame, engine)


def _engine_for(frame: MpaFrame, settings: MpaSettings) -> MpaConnection | None:
    """An initiator engine in the state of having sent ``frame`` (a crafted Request), so
    the Reply is judged as that initiator would; None when the engine cannot send such a
    frame (Rev 0 or unknown, Rev 2 without the RFC 6581 word: ERC-12)."""
    if frame.rev not in (1, 2) or (frame.rev == 2 and frame.ird_ord is None):
        return None
    s = replace(
        settings,
        rev=frame.rev,
        crc=CrcPolicy.REQUEST if frame.crc else CrcPolicy.OFF,
        want_markers=frame.markers,
        max_private_data=MPA_MAX_PRIVATE_DATA,
    )
    if frame.ird_ord is not None:
        w = frame.ird_ord
        s = replace(s, ird=w.ird, ord=w.ord, p2p=w.p2p, rtr=w.rtr if w.p2p else s.rtr)
    engine = MpaConnection(Role.INITIATOR, s)
    try:
        engine.initiate(trio.current_time(), frame.private_data)
    except IwarpError:
        return None
    engine.data_to_send()
    return engine


async def read_answer(
    peer: Peer, request: MpaFrame | None, within: float, *, kind: str = "reply"
) -> Answer:
    """Wait up to ``within`` seconds for the DUT's startup frame (a Reply to ``request``,
    or with ``kind='request'`` its Request), a close, or unreadable bytes."""
    peer.core.expect_startup(kind, request)
    start = trio.current_time()
    event = await peer.next_event(within)
    seconds = trio.current_time() - start
    if event is None:
        return Answer("silence", seconds=seconds)
    if isinstance(event, StartupSeen):
        frame, _ = frame_note(peer, event.offset, event.length)
        what = "reject" if event.frame.reply and event.frame.reject else "reply"
        if kind == "request" and not event.frame.reply:
            what = "request"
        return Answer(what, seen=event, frame=frame, seconds=seconds)
    if isinstance(event, StartupBad):
        frame, _ = frame_note(peer, event.offset, len(event.raw))
        return Answer("bad", bad=event, frame=frame, seconds=seconds)
    if isinstance(event, Eof):
        return Answer("close", eof=event, seconds=seconds)
    return Answer("bad", seconds=seconds)  # pragma: no cover - no FPDU before framing


@dataclass
class Startup:
    """A DUT-listening startup.  Fields: peer, request, answer, outcome (the runner's
    initiator engine's event for the Reply: Established, Rejected or ConnectionFailed; None
    when there was no Reply or no engine could judge), negotiated (the engine's outcome),
    established (Full Operation began: by the engine, or for a Request no engine sends, by
    the frames' C and M bits when the Reply breaks no startup rule), rtr_sent."""

    peer: Peer
    request: Request
    answer: Answer
    outcome: object = None
    negotiated: Negotiated | None = None
    established: bool = False
    rtr_sent: list[Sent] = field(default_factory=list)


def rtr_message(kind: RtrType) -> RdmapMessage:
    """The zero-length RTR of ``kind`` (RFC 6581 §5, ERC-09), as the wire core sends it."""
    if kind is RtrType.WRITE:
        return RdmaWrite(WRITE_RTR_STAG, 0, b"")
    if kind is RtrType.READ:
        return ReadRequest(0, 0, 0, 0, 0)
    return Send(b"")


async def establish(startup: Startup, *, send_rtr: bool = True) -> Startup:
    """Judge the DUT's Reply with the runner's initiator engine; on acceptance start
    framing with the negotiated CRC and markers and send the RTR (peer-to-peer).  A Reply
    the engine refuses after Full Operation began gets its Terminate (ERC-04, ERC-09)."""
    answer, engine, peer = startup.answer, startup.request.engine, startup.peer
    if answer.seen is None:
        return startup
    if engine is None:
        return _establish_by_frames(startup)
    engine.receive_data(answer.seen.raw)
    event = engine.next_event()
    while isinstance(event, NeedData | RequestReceived):  # pragma: no cover - defensive
        event = engine.next_event()
        if isinstance(event, NeedData):
            return startup
    startup.outcome = event
    if isinstance(event, Established):
        neg = event.negotiated
        startup.negotiated = neg
        startup.established = True
        peer.core.start_framing(crc=neg.crc, markers_tx=neg.markers_tx, markers_rx=neg.markers_rx)
        if send_rtr and neg.p2p and neg.rtr:
            startup.rtr_sent = await peer.send_message(rtr_message(neg.rtr))
    elif isinstance(event, ConnectionFailed) and event.terminate is not None:
        request = startup.request.frame
        assert request is not None
        reply = answer.seen.frame
        crc, to_dut, to_us = framing_of(request, reply)
        peer.core.start_framing(crc=crc, markers_tx=to_dut, markers_rx=to_us)
        await peer.send_message(build_terminate(event.terminate, None))
    return startup


def _establish_by_frames(startup: Startup) -> Startup:
    """Full Operation for a Request no engine sends (Rev 2 without the word): C on either
    side turns CRC on, each side's M asks for markers towards it (MPA-09, MPA-11)."""
    request, seen = startup.request.frame, startup.answer.seen
    assert seen is not None
    reply = seen.frame
    if request is None or not reply.reply or reply.reject or any(f.fatal for f in seen.findings):
        return startup
    crc, to_dut, to_us = framing_of(request, reply)
    startup.peer.core.start_framing(crc=crc, markers_tx=to_dut, markers_rx=to_us)
    startup.established = True
    return startup


async def start(
    ctx: CaseContext,
    *,
    settings: MpaSettings | None = None,
    private_data: bytes | None = None,
    edit: Edit | None = None,
    raw: bytes | None = None,
    within: float | None = None,
    send_rtr: bool = True,
    extra: bool = False,
) -> Startup:
    """Connect to the DUT, send a Request (with the app's private data unless
    ``private_data`` is given), read its answer, judge and establish.  ``extra``: on one
    more connection of the case (:meth:`CaseContext.connect`)."""
    peer = await ctx.connect(extra=extra)
    pd = ctx.app.private_data if private_data is None else private_data
    request = await send_request(
        peer, settings or ctx.app.settings, private_data=pd, edit=edit, raw=raw
    )
    answer = await read_answer(
        peer, request.frame, ctx.options.timeout if within is None else within
    )
    return await establish(Startup(peer, request, answer), send_rtr=send_rtr)


def need_established(s: Startup) -> Verdict | None:
    """None when the startup reached Full Operation; otherwise the ERROR verdict of a case
    that needs it (the DUT refused a valid Request it should have taken)."""
    if s.established:
        return None
    what = s.answer.describe()
    if isinstance(s.outcome, Rejected | ConnectionFailed):
        what += (
            f"; the runner's initiator engine: {getattr(s.outcome, 'error', None) or 'rejected'}"
        )
    return Verdict.broken(f"no Full Operation to test in: the DUT {what}")


# ======================================================================================
# Startup, DUT connecting (the runner is the MPA Responder)
# ======================================================================================


async def read_request(ctx: CaseContext) -> tuple[Peer, Answer]:
    """Wait for the DUT to connect and send its Request."""
    where = ctx.listener.socket.getsockname() if ctx.listener is not None else ("?", 0)
    how = ctx.app.connect_command or f"start the {ctx.app.name} client"
    hint = (
        "started by the restart command"
        if ctx.restarting
        else ("run: " + how.format(host="THIS-HOST", port=where[1]))
    )
    ctx.progress(f"waiting up to {ctx.options.wait:g} s for the DUT to connect ({hint})")
    peer = await ctx.accept()
    return peer, await read_answer(peer, None, ctx.options.timeout, kind="request")


@dataclass
class Reply:
    """The runner's accepting Reply: raw bytes, frame, negotiated (what the engine made of it)."""

    raw: bytes
    frame: MpaFrame
    negotiated: Negotiated


def reply_valid(request_raw: bytes, settings: MpaSettings, private_data: bytes = b"") -> Reply:
    """The Reply the responder engine sends to the DUT's Request bytes under ``settings``.

    Raises :class:`SetupError` when the engine itself would not accept the Request.
    """
    engine = MpaConnection(Role.RESPONDER, settings)
    engine.start(trio.current_time())
    engine.receive_data(request_raw)
    event = engine.next_event()
    if not isinstance(event, RequestReceived):
        raise SetupError(f"the runner's responder engine refuses the DUT's Request: {event}")
    engine.accept(private_data)
    raw = bytes(engine.data_to_send())
    established = engine.next_event()
    assert isinstance(established, Established)
    decoded = decode_frame(raw)
    assert decoded is not None
    return Reply(raw, decoded[0], established.negotiated)


# ======================================================================================
# Full Operation: the application exchange
# ======================================================================================


@dataclass
class Conversation:
    """What happened in Full Operation.

    Fields: sent (every FPDU the runner sent); deliveries ((evidence, frame, FPDUs sent
    by then) of each delivery the application showed); done (the exchange completed);
    terminate ((the Terminate, its PDU) if the DUT sent one); framing (the DUT's bytes
    broke framing); eof; unexpected (lines about segments outside the application's
    protocol); pdus (every PDU from the DUT); stalled (the DUT went quiet for the timeout
    while the runner waited); terminate_frame (the capture frame of the Terminate);
    violations ((finding, frame) of every fatal rule finding on the DUT's PDUs: lenient
    decode and sequencing).
    """

    sent: list[Sent] = field(default_factory=list)
    deliveries: list[tuple[str, int | None, int]] = field(default_factory=list)
    done: bool = False
    terminate: tuple[Terminate, PduSeen] | None = None
    framing: FramingBad | None = None
    eof: Eof | None = None
    unexpected: list[str] = field(default_factory=list)
    pdus: list[PduSeen] = field(default_factory=list)
    stalled: bool = False
    terminate_frame: int | None = None
    violations: list[tuple[Finding, int | None]] = field(default_factory=list)
    client: AppClient | None = None
    pending: list[RdmapMessage] = field(default_factory=list)

    def delivered(self) -> bool:
        return bool(self.deliveries)

    def delivery_lines(self) -> list[str]:
        return [f"{what} (frame {f})" if f is not None else what for what, f, _ in self.deliveries]


CraftFor = Callable[[int, bytes], Craft | None]
"""Given the index of an outbound ULPDU (0: the first) and its bytes, how to break it."""


async def converse(
    ctx: CaseContext,
    peer: Peer,
    *,
    craft: CraftFor | None = None,
    stop_at_delivery: bool = False,
    opening: list[RdmapMessage] | None = None,
    within: float | None = None,
    absorb: Callable[[Segment], bool] | None = None,
    client: AppClient | None = None,
    stop: Callable[[AppClient], bool] | None = None,
) -> Conversation:
    """Play the application's client until the exchange completes, the DUT sends a
    Terminate, breaks framing or closes, or is quiet for ``within`` (default: the timeout).
    ``absorb``: segments that belong to the case, not the application (an RTR's answer).
    ``client``: go on with this client (default: a new one); ``stop``: return as soon as
    it holds for the client, its replies kept in ``pending``.
    """
    client = client if client is not None else ctx.app.new_client()
    conv = Conversation(client=client)
    wait = ctx.options.timeout if within is None else within
    index = 0

    async def send(messages: list[RdmapMessage]) -> None:
        nonlocal index
        for message in messages:
            for ulpdu in peer.core.ulpdus(message):
                conv.sent.append(
                    await peer.send_fpdu(ulpdu, craft(index, ulpdu) if craft else None)
                )
                index += 1

    await send(client.opening() if opening is None else opening)
    while True:
        event = await peer.next_event(wait)
        if event is None:
            conv.stalled = True
            return conv
        if isinstance(event, Eof):
            conv.eof = event
            return conv
        if isinstance(event, FramingBad):
            conv.framing = event
            return conv
        if not isinstance(event, PduSeen):
            continue
        conv.pdus.append(event)
        seg = event.segment
        frame = peer.frame_of_dut(event.offset + event.wire_len - 1)
        conv.violations += [(f, frame) for f in event.findings if f.fatal]
        if seg is None:
            conv.unexpected.append(f"undecodable ULPDU at frame {frame}: {event.error}")
            continue
        if seg.opcode == Opcode.TERMINATE and isinstance(seg.header, Terminate):
            conv.terminate = (seg.header, event)
            conv.terminate_frame = frame
            return conv
        if absorb is not None and absorb(seg):
            continue
        reaction = client.on_segment(seg)
        if reaction.unexpected:
            conv.unexpected.append(f"{reaction.unexpected} (frame {frame})")
        if reaction.delivered:
            conv.deliveries.append((reaction.delivered, frame, len(conv.sent)))
            if stop_at_delivery:
                return conv
        if stop is not None and not reaction.done and stop(client):
            conv.pending = list(reaction.replies)
            return conv
        await send(list(reaction.replies))
        if reaction.done:
            conv.done = True
            return conv
