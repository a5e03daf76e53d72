"""MPA startup negotiation (RFC 5044 §7.1, RFC 6581): the state table and its handlers.

:class:`MpaStartup` is the startup half of :class:`~stack.wire.mpa.MpaConnection`: the
explicit state table (:data:`TRANSITIONS`), the Request/Reply exchange and its timers
(MPA-22..MPA-27), the startup rule tables of :mod:`stack.wire.mpa_rules` run strictly, and
the RFC 6581 IRD/ORD and RTR negotiation that ends in :class:`~stack.wire.events.Negotiated`.
Full Operation (FPDU framing, MPA-25 hold, FIN) is :mod:`stack.wire.mpa`'s; the connection
supplies :meth:`~MpaStartup._enter_full_operation`, :meth:`~MpaStartup._feed_fpdus` and
:meth:`~MpaStartup._report_fin`.
"""

from __future__ import annotations

import enum
from collections import deque

from stack.buffers import Buffer
from stack.constants import (
    DEFAULT_EMSS,
    MPA_REV_1,
    MPA_REV_2,
    MPA_REV_RDMAC,
    MPA_V2_NO_NEGOTIATION,
    TERM_LLP_INVALID_STARTUP,
    TERM_LLP_LOCAL_CATASTROPHIC,
    TERM_LLP_NO_MATCHING_RTR,
    RtrType,
    TermCode,
)
from stack.errors import ConnectionTimeout, LocalError, MpaError, ProtocolError
from stack.wire.checker import Checker, Finding
from stack.wire.events import (
    ConnectionFailed,
    CrcPolicy,
    IrdOrd,
    MpaEvent,
    MpaFrame,
    MpaSettings,
    Negotiated,
    Rejected,
    RequestReceived,
    RevPolicy,
    Role,
)
from stack.wire.framing import FpduFramer, mulpdu_for
from stack.wire.mpa_frames import decode_frame, encode_frame
from stack.wire.mpa_rules import (
    StartupContext,
    StartupRule,
    check_startup_frame,
    framing_of,
    initiator_rtr,
    responder_ird_ord,
)

__all__ = ["TRANSITIONS", "MpaStartup", "MpaState"]

KNOWN_REVS = frozenset({MPA_REV_1, MPA_REV_2})
_ANY_REV = frozenset(range(256))


class MpaState(enum.Enum):
    """States of :class:`~stack.wire.mpa.MpaConnection`."""

    IDLE = "idle"  # nothing sent yet
    AWAIT_REPLY = "await-reply"  # initiator: Request sent
    AWAIT_REQUEST = "await-request"  # responder: listening for the Request
    REQUEST_RECEIVED = "request-received"  # responder: the ULP must accept or reject
    FULL_OPERATION = "full-operation"  # FPDUs both ways
    REJECTED = "rejected"  # left MPA with TCP open (MPA-23/24)
    ERROR = "error"  # failed after Full Operation began; sending a Terminate still allowed
    FAILED = "failed"  # startup failed; close TCP


class MpaInput(enum.Enum):
    """Inputs of the state table (:data:`TRANSITIONS`)."""

    INITIATE = "initiate"
    START = "start"
    REQUEST = "valid Request"
    ACCEPT = "accept"
    REJECT = "reject"
    AUTO_REJECT = "policy reject"
    REPLY_ACCEPT = "accepting Reply"
    REPLY_REJECT = "rejecting Reply"
    BAD_REPLY = "unacceptable Reply"
    STARTUP_FAIL = "startup failure"
    TIMEOUT = "timeout"
    FPDU_ERROR = "FPDU error"


_S = MpaState
_I = MpaInput

TRANSITIONS: dict[tuple[MpaState, MpaInput], MpaState] = {
    (_S.IDLE, _I.INITIATE): _S.AWAIT_REPLY,
    (_S.IDLE, _I.START): _S.AWAIT_REQUEST,
    (_S.AWAIT_REQUEST, _I.REQUEST): _S.REQUEST_RECEIVED,
    (_S.AWAIT_REQUEST, _I.AUTO_REJECT): _S.REJECTED,
    (_S.AWAIT_REQUEST, _I.STARTUP_FAIL): _S.FAILED,
    (_S.AWAIT_REQUEST, _I.TIMEOUT): _S.FAILED,
    (_S.REQUEST_RECEIVED, _I.ACCEPT): _S.FULL_OPERATION,
    (_S.REQUEST_RECEIVED, _I.REJECT): _S.REJECTED,
    (_S.AWAIT_REPLY, _I.REPLY_ACCEPT): _S.FULL_OPERATION,
    (_S.AWAIT_REPLY, _I.REPLY_REJECT): _S.REJECTED,
    (_S.AWAIT_REPLY, _I.BAD_REPLY): _S.ERROR,
    (_S.AWAIT_REPLY, _I.STARTUP_FAIL): _S.FAILED,
    (_S.AWAIT_REPLY, _I.TIMEOUT): _S.FAILED,
    (_S.FULL_OPERATION, _I.FPDU_ERROR): _S.ERROR,
}
"""Every legal (state, input) -> next state; anything else is a local API error."""

WAITING = frozenset({MpaState.AWAIT_REPLY, MpaState.AWAIT_REQUEST})


class MpaStartup:
    """The startup negotiation of one MPA endpoint (RFC 5044 §7.1, RFC 6581 §9).

    The state and buffers it works on are set up by
    :class:`~stack.wire.mpa.MpaConnection`, which inherits this.
    """

    role: Role
    settings: MpaSettings
    state: MpaState
    negotiated: Negotiated | None
    peer_frame: MpaFrame | None
    frame_rules: tuple[StartupRule, ...]
    reply_rules: tuple[StartupRule, ...]
    peer_findings: list[Finding]
    _local_frame: MpaFrame | None
    _events: deque[MpaEvent]
    _out: bytearray
    _inbuf: bytearray
    _deadline: float | None
    _framer: FpduFramer | None
    _held: bytearray | None
    _fin: bool

    # -- hooks of the Full Operation half ------------------------------------------------

    def _enter_full_operation(self, negotiated: Negotiated) -> None:
        raise NotImplementedError

    def _feed_fpdus(self, data: Buffer, borrow: bool = False) -> None:
        raise NotImplementedError

    def _report_fin(self) -> None:
        raise NotImplementedError

    # -- startup API ---------------------------------------------------------------------

    def timer_deadline(self) -> float | None:
        """When :meth:`handle_timer` must be called next, or None (MPA-27)."""
        return self._deadline if self.state in WAITING else None

    def _check_allowed(self, event: MpaInput) -> None:
        if (self.state, event) not in TRANSITIONS:
            raise LocalError(
                f"{event.value} is not allowed in state {self.state.value} ({self.role.value})"
            )

    def _transition(self, event: MpaInput) -> None:
        self._check_allowed(event)
        self.state = TRANSITIONS[self.state, event]

    def _require_role(self, role: Role, what: str) -> None:
        if self.role is not role:
            raise LocalError(f"{what}() is for the {role.value}, this is the {self.role.value}")

    def initiate(self, now: float, private_data: bytes = b"") -> None:
        """Initiator: queue the Request and arm the Reply timer (RFC 5044 §7.1.2 step 1)."""
        self._require_role(Role.INITIATOR, "initiate")
        self._check_allowed(MpaInput.INITIATE)
        s = self.settings
        ird_ord = None
        if s.rev >= MPA_REV_2:  # ERC-12: rev 2 is chosen only to use the enhanced word
            offered = RtrType(s.rtr) if s.p2p else RtrType.NONE  # ERC-07
            if s.p2p and not offered:
                raise LocalError("a peer-to-peer initiator must offer at least one RTR type")
            ird_ord = IrdOrd(s.ird, s.ord, s.p2p, offered)
        frame = MpaFrame(
            reply=False,
            markers=s.want_markers,
            crc=s.crc in (CrcPolicy.REQUEST, CrcPolicy.REQUIRE),
            rev=s.rev,
            ird_ord=ird_ord,
            private_data=bytes(private_data),
        )
        data = encode_frame(frame, max_private_data=s.max_private_data)
        self._transition(MpaInput.INITIATE)
        self._local_frame = frame
        self._out += data
        self._deadline = now + s.reply_timeout
        self._process_startup()

    def start(self, now: float) -> None:
        """Responder: start waiting for the Request and arm the Request timer (MPA-26/27)."""
        self._require_role(Role.RESPONDER, "start")
        self._transition(MpaInput.START)
        self._deadline = now + self.settings.request_timeout
        self._process_startup()

    def accept(
        self,
        private_data: bytes = b"",
        *,
        ird: int | None = None,
        ord: int | None = None,
        rtr: RtrType | None = None,
    ) -> None:
        """Responder: send the accepting Reply and enter Full Operation (§7.1.2 step 2).

        ``ird``/``ord``/``rtr`` override the settings for this connection.
        """
        self._require_role(Role.RESPONDER, "accept")
        self._check_allowed(MpaInput.ACCEPT)
        request = self.peer_frame
        assert request is not None
        s = self.settings
        cap_ird = s.ird if ird is None else ird
        cap_ord = s.ord if ord is None else ord
        supported = RtrType(s.rtr if rtr is None else rtr)
        reply_word = None
        final_ird, final_ord, rtr_used = cap_ird, cap_ord, RtrType.NONE
        peer = request.ird_ord
        if peer is not None:
            reply_word, final_ird, final_ord, rtr_used = responder_ird_ord(
                peer, cap_ird, cap_ord, supported, s.rtr_preference
            )
        frame = MpaFrame(
            reply=True,
            markers=s.want_markers,
            # A Request with C=1 means CRC both ways anyway (MPA-11); echoing C=1 keeps
            # peers that insist on seeing it (siw's mpa_crc_required) happy.
            crc=s.crc in (CrcPolicy.REQUEST, CrcPolicy.REQUIRE) or request.crc,
            rev=self._reply_rev(request),
            ird_ord=reply_word,
            private_data=bytes(private_data),
        )
        data = encode_frame(frame, max_private_data=s.max_private_data)
        self._transition(MpaInput.ACCEPT)
        self._local_frame = frame
        self._out += data
        self._held = bytearray()
        negotiated = self._negotiated(
            local=frame,
            peer=request,
            ird=final_ird,
            ord=final_ord,
            peer_word=peer,
            rtr=rtr_used,
        )
        self._enter_full_operation(negotiated)
        early = bytes(self._inbuf)
        self._inbuf.clear()
        self._feed_fpdus(early)
        if self._fin:
            self._report_fin()

    def reject(self, private_data: bytes = b"") -> None:
        """Responder: Reply with R=1 and leave MPA with TCP open (MPA-23, ERC-05)."""
        self._require_role(Role.RESPONDER, "reject")
        self._check_allowed(MpaInput.REJECT)
        request = self.peer_frame
        assert request is not None
        data = self._reject_frame(request, bytes(private_data))
        self._transition(MpaInput.REJECT)
        self._out += data
        self._inbuf.clear()
        if self._fin:
            self._report_fin()

    def handle_timer(self, now: float) -> None:
        """Fire the startup timer if due (MPA-27); responder/responder shows up here (MPA-26)."""
        deadline = self.timer_deadline()
        if deadline is None or now < deadline:
            return
        waiting_for = "Reply" if self.state is MpaState.AWAIT_REPLY else "Request"
        rule = "MPA-27" if self.role is Role.INITIATOR else "MPA-26"
        self._transition(MpaInput.TIMEOUT)
        self._deadline = None
        self._events.append(
            ConnectionFailed(
                ConnectionTimeout(f"{rule}: no MPA {waiting_for} within the startup timeout"),
                close=True,
                terminate=None,
            )
        )

    # -- internals: startup --------------------------------------------------------------

    def _fail_startup(self, error: ProtocolError) -> None:
        self._transition(MpaInput.STARTUP_FAIL)
        self._deadline = None
        self._inbuf.clear()
        self._events.append(ConnectionFailed(error, close=True, terminate=None))

    def _process_startup(self) -> None:
        if self.state not in WAITING or not self._inbuf:
            return
        try:
            decoded = decode_frame(self._inbuf, max_private_data=self.settings.max_private_data)
        except MpaError as exc:
            self._fail_startup(exc)
            return
        if decoded is None:
            return
        frame, used = decoded
        del self._inbuf[:used]
        self.peer_frame = frame
        self._deadline = None
        if self.state is MpaState.AWAIT_REQUEST:
            self._on_request(frame)
        else:
            self._on_reply(frame)

    def _reply_rev(self, request: MpaFrame) -> int:
        """Rev of our Reply: enhanced replies are Rev 2 (ERC-11); else echo, capped."""
        if request.ird_ord is not None:
            return MPA_REV_2
        if request.rev == MPA_REV_RDMAC:
            return MPA_REV_RDMAC
        return min(request.rev, self.settings.rev)

    def _reject_frame(self, request: MpaFrame, private_data: bytes) -> bytes:
        """A rejecting Reply; enhanced (with our IRD/ORD) if the Request was (ERC-05/11)."""
        s = self.settings
        word = None
        if request.ird_ord is not None and self._supports_enhanced():
            word = IrdOrd(s.ird, s.ord, request.ird_ord.p2p, RtrType.NONE)
        if word is not None:
            rev = MPA_REV_2
        elif request.rev in (MPA_REV_RDMAC, *KNOWN_REVS):
            rev = min(request.rev, s.rev)
        else:
            rev = s.rev
        frame = MpaFrame(
            reply=True,
            markers=s.want_markers,
            crc=s.crc in (CrcPolicy.REQUEST, CrcPolicy.REQUIRE),
            reject=True,
            rev=rev,
            ird_ord=word,
            private_data=private_data,
        )
        self._local_frame = frame
        return encode_frame(frame, max_private_data=s.max_private_data)

    def _supports_enhanced(self) -> bool:
        return self.settings.allow_enhanced and self.settings.rev >= MPA_REV_2

    def _auto_reject(self, request: MpaFrame, error: MpaError) -> None:
        """Refuse a well-formed Request by policy: R=1 Reply, TCP stays open (MPA-23)."""
        self._out += self._reject_frame(request, b"")
        self._transition(MpaInput.AUTO_REJECT)
        self._inbuf.clear()
        self._events.append(ConnectionFailed(error, close=False, terminate=None))

    def _on_request(self, frame: MpaFrame) -> None:
        """Validate a Request (MPA-22) by :data:`~stack.wire.mpa_rules.FRAME_RULES`, then
        apply the responder's policies (revisions, RFC 6581, CRC)."""
        s = self.settings
        chk = Checker(strict=False)
        ctx = StartupContext(frame, expect="request", revisions=KNOWN_REVS)
        for row, detail in check_startup_frame(ctx, chk, self.frame_rules):
            if not row.fatal:
                continue
            error = MpaError(row.rule, detail, row.term)
            if row.rule != "MPA-20" or s.rev_policy is RevPolicy.CLOSE:
                self._fail_startup(error)
                return
            if s.rev_policy is RevPolicy.REJECT:
                self._auto_reject(frame, error)
                return
        self.peer_findings = chk.findings
        if frame.ird_ord is not None and not self._supports_enhanced():
            self._fail_startup(
                MpaError(
                    "ERC-11",
                    "enhanced (S=1) Request but RFC 6581 is disabled here",
                    TERM_LLP_INVALID_STARTUP,
                )
            )
            return
        if s.crc is CrcPolicy.REQUIRE and not frame.crc:
            self._auto_reject(
                frame, MpaError("MPA-11", "peer asked for no CRC; CRC is required here")
            )
            return
        if s.crc is CrcPolicy.STRICT_OFF and frame.crc:
            self._auto_reject(
                frame, MpaError("MPA-11", "peer asked for CRC; CRC is strictly off here")
            )
            return
        self._transition(MpaInput.REQUEST)
        self._events.append(RequestReceived(frame))

    def _on_reply(self, frame: MpaFrame) -> None:
        """Validate a Reply (MPA-24) by the startup rule tables and finish negotiation on the
        initiator side (RFC 6581 §9.1-9.2)."""
        s = self.settings
        local = self._local_frame
        assert local is not None
        if not frame.reply:
            ctx = StartupContext(frame, expect="reply")
            for row, detail in check_startup_frame(ctx, Checker(strict=False), self.frame_rules):
                if row.fatal:
                    self._fail_startup(MpaError(row.rule, detail, row.term))
                    return
        if frame.reject:
            self._transition(MpaInput.REPLY_REJECT)
            self._inbuf.clear()
            self._events.append(Rejected(frame, _reject_reason(local, frame)))
            return
        chk = Checker(strict=False)
        ctx = StartupContext(
            frame,
            expect="reply",
            request=local,
            revisions=KNOWN_REVS if s.rev_policy is not RevPolicy.ACCEPT else _ANY_REV,
            max_rev=s.rev if s.rev_policy is not RevPolicy.ACCEPT else None,
        )
        rules = self.frame_rules + self.reply_rules if frame.reply else self.frame_rules
        fatal = [
            row_detail for row_detail in check_startup_frame(ctx, chk, rules) if row_detail[0].fatal
        ]
        self.peer_findings = chk.findings
        # Before Full Operation: a malformed Reply closes TCP (2/0/4, MPA-28).
        for row, detail in fatal:
            if row.term == TERM_LLP_INVALID_STARTUP:
                self._fail_startup(MpaError(row.rule, detail, row.term))
                return
        # From here the Reply is valid: Full Operation has begun for sending, so a
        # refusal is reported with the Terminate the ULP should send (ERC-04/09/10).
        enhanced = frame.ird_ord is not None
        crc = local.crc or frame.crc
        if s.crc is CrcPolicy.REQUIRE and not frame.crc:
            self._bad_reply(
                MpaError(
                    "MPA-11",
                    "the accepting Reply has C=0 (no CRC) to our C=1; CRC is required here",
                ),
                TERM_LLP_LOCAL_CATASTROPHIC if enhanced else None,
                crc,
                frame,
            )
            return
        if s.crc is CrcPolicy.STRICT_OFF and frame.crc:
            self._bad_reply(
                MpaError(
                    "MPA-11",
                    "the accepting Reply has C=1 (CRC) to our C=0; CRC is strictly off here",
                ),
                TERM_LLP_LOCAL_CATASTROPHIC if enhanced else None,
                crc,
                frame,
            )
            return
        if fatal:
            row, detail = fatal[0]
            self._bad_reply(MpaError(row.rule, detail, row.term), row.term, crc, frame)
            return
        ird, ord_ = s.ird, s.ord
        rtr_used = RtrType.NONE
        peer = frame.ird_ord
        if peer is not None:
            assert local.ird_ord is not None
            if peer.ird != MPA_V2_NO_NEGOTIATION and ord_ != MPA_V2_NO_NEGOTIATION:
                ord_ = min(ord_, peer.ird)
            if peer.p2p:
                rtr_used = initiator_rtr(local.ird_ord.rtr, peer, ord_, s.rtr_preference)
                if not rtr_used:
                    self._bad_reply(
                        MpaError(
                            "ERC-09",
                            f"no RTR type in common: offered {local.ird_ord.rtr!r}, "
                            f"responder flagged {peer.rtr!r}",
                            TERM_LLP_NO_MATCHING_RTR,
                        ),
                        TERM_LLP_NO_MATCHING_RTR,
                        crc,
                        frame,
                    )
                    return
        self._transition(MpaInput.REPLY_ACCEPT)
        negotiated = self._negotiated(
            local=local, peer=frame, ird=ird, ord=ord_, peer_word=peer, rtr=rtr_used
        )
        self._enter_full_operation(negotiated)
        rest = bytes(self._inbuf)
        self._inbuf.clear()
        self._feed_fpdus(rest)

    def _bad_reply(
        self, error: MpaError, terminate: TermCode | None, crc: bool, frame: MpaFrame
    ) -> None:
        """A valid Reply we cannot live with: Full Operation (to send the Terminate) + fail."""
        self._transition(MpaInput.BAD_REPLY)
        self._inbuf.clear()
        if terminate is not None:
            self._framer = FpduFramer(crc=crc, markers=frame.markers)
        self._events.append(ConnectionFailed(error, close=True, terminate=terminate))

    def _negotiated(
        self,
        *,
        local: MpaFrame,
        peer: MpaFrame,
        ird: int,
        ord: int,
        peer_word: IrdOrd | None,
        rtr: RtrType,
    ) -> Negotiated:
        reply = peer if peer.reply else local
        request = local if peer.reply else peer
        crc, to_responder, to_initiator = framing_of(request, reply)
        initiator = self.role is Role.INITIATOR
        markers_tx = to_responder if initiator else to_initiator  # the receiver decides
        mulpdu = self.settings.mulpdu
        if mulpdu is None:
            mulpdu = mulpdu_for(self.settings.emss or DEFAULT_EMSS, markers_tx)
        return Negotiated(
            role=self.role,
            rev=reply.rev,
            crc=crc,
            markers_tx=markers_tx,
            markers_rx=to_initiator if initiator else to_responder,
            ird=ird,
            ord=ord,
            peer_ird=None if peer_word is None else peer_word.ird,
            peer_ord=None if peer_word is None else peer_word.ord,
            p2p=peer_word is not None and peer_word.p2p,
            rtr=rtr,
            peer_private_data=peer.private_data,
            mulpdu=mulpdu,
            local_frame=local,
            peer_frame=peer,
        )


_REASON_PREVIEW = 64
"""Octets of a Reject's private data shown in hex when it is not printable text."""


def _reject_reason(local: MpaFrame, reply: MpaFrame) -> str:
    """What a rejecting Reply (R=1, MPA-24) says: the peer's IRD/ORD (ERC-05) and its
    private data, where a responder puts its reason (MPA-23).  A Reject's C bit is not a
    CRC answer (MPA-11 applies to accepting Replies), so it is not named as a cause; the
    markers we asked for and the Reply lacks still are (siw's Reject of markers, MPA-09)."""
    reason = "peer rejected the connection"
    if reply.ird_ord is not None:
        reason += f" (peer IRD {reply.ird_ord.ird}, ORD {reply.ird_ord.ord})"
    data = bytes(reply.private_data)
    try:
        text = data.decode()
    except UnicodeDecodeError:
        text = None
    if not data:
        reason += ", no reason given (no private data)"
    elif text is not None and text.isprintable():
        reason += f", reason (its private data): {text!r}"
    else:
        shown = data[:_REASON_PREVIEW].hex()
        more = "..." if len(data) > _REASON_PREVIEW else ""
        reason += f", private data ({len(data)} octets): {shown}{more}"
    if local.markers and not reply.markers:
        reason += "; we asked for markers (M=1), the Reply has M=0"
    return reason
