"""Faults of a broken DUT's MPA startup and negotiation (RFC 5044 §4, §7.1; RFC 6581 §5-§10).

Each function (or the function a factory returns) patches one engine of the DUT
(:class:`~stack.wire.connection.IwarpConnection`) at the points :mod:`stack.conform.faults`
documents:

* the startup rule tables its MPA engine runs (``frame_rules``, ``reply_rules``): a row left
  out (:func:`rules_without`), made fatal (:func:`rules_fatal`) or added
  (:func:`rule_added`) -- the runner judges with the real tables, so only the DUT changes;
* its MPA ``settings`` (:func:`mpa_settings`);
* the peer's startup frame on its way in (:func:`startup_in`, through ``receive_data``) and
  its own startup frame on its way out (:func:`startup_out`, through ``data_to_send``);
* its startup timer (``timer_deadline``), and the MPA engine's FPDU framer and deframer.

:data:`stack.conform.faults.FAULTS` names them and the cases each turns.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from stack.conform.faults_engine import after_established
from stack.constants import (
    MPA_FRAME_HEADER_LEN,
    MPA_IRD_ORD_LEN,
    MPA_KEY_LEN,
    MPA_KEY_REP,
    MPA_KEY_REQ,
    MPA_LENGTH_LEN,
    MPA_REV_2,
    MPA_V2_NO_NEGOTIATION,
    TERM_LLP_INVALID_STARTUP,
    MpaFlag,
    RtrType,
)
from stack.errors import MpaError
from stack.wire.connection import IwarpConnection
from stack.wire.events import CrcPolicy, MpaFrame, Role
from stack.wire.framing import FpduDeframer
from stack.wire.mpa import MpaConnection, MpaState, decode_frame, encode_frame
from stack.wire.mpa_frames import decode_ird_ord, encode_ird_ord
from stack.wire.mpa_rules import StartupContext, StartupRule

__all__ = [
    "EngineFault",
    "crc_checked_when_off",
    "crc_from_peer",
    "crc_own_preference",
    "early_fpdus_dropped",
    "first_segment_is_request",
    "key_prefix_only",
    "marker_pointers_unchecked",
    "mpa_settings",
    "no_startup_timer",
    "ord_not_lowered",
    "p2p_ignored",
    "pad_taken_as_zero",
    "reject_ignored",
    "reply_own_rev",
    "request_gso_bit",
    "rev2_needs_s",
    "rtr_from_own_offer",
    "rule_added",
    "rules_fatal",
    "rules_without",
    "s_without_room_ignored",
    "startup_in",
    "startup_out",
    "three_fff_refused",
]

EngineFault = Callable[[IwarpConnection], None]
"""Patches one DUT engine."""

_WAITING = (MpaState.AWAIT_REQUEST, MpaState.AWAIT_REPLY)
_ANY_LENGTH = 0xFFFF

# -- the startup rule tables ---------------------------------------------------------------


def rules_without(*rules: str) -> EngineFault:
    """The engine runs its startup tables without the rows of ``rules`` (not checked)."""

    def apply(engine: IwarpConnection) -> None:
        mpa = engine.mpa
        mpa.frame_rules = tuple(r for r in mpa.frame_rules if r.rule not in rules)
        mpa.reply_rules = tuple(r for r in mpa.reply_rules if r.rule not in rules)

    return apply


def rules_fatal(*rules: str) -> EngineFault:
    """Deviations the tables only note (``rules``) close the connection instead."""

    def fatal(row: StartupRule) -> StartupRule:
        if row.rule not in rules:
            return row
        return replace(row, fatal=True, term=TERM_LLP_INVALID_STARTUP)

    def apply(engine: IwarpConnection) -> None:
        mpa = engine.mpa
        mpa.frame_rules = tuple(fatal(r) for r in mpa.frame_rules)
        mpa.reply_rules = tuple(fatal(r) for r in mpa.reply_rules)

    return apply


def rule_added(rule: str, check: Callable[[StartupContext], str | None]) -> EngineFault:
    """A startup frame for which ``check`` returns a detail closes the connection (a rule
    the DUT enforces that the RFCs do not have; ``rule`` is the one it misreads)."""
    row = StartupRule(rule, True, TERM_LLP_INVALID_STARTUP, True, check)

    def apply(engine: IwarpConnection) -> None:
        engine.mpa.frame_rules = (*engine.mpa.frame_rules, row)

    return apply


def _three_fff(ctx: StartupContext) -> str | None:
    word = ctx.frame.ird_ord
    if word is not None and MPA_V2_NO_NEGOTIATION in (word.ird, word.ord):
        return "IRD or ORD 0x3FFF taken as a value beyond this endpoint's limits"
    return None


def _rev2_without_s(ctx: StartupContext) -> str | None:
    if ctx.frame.rev == MPA_REV_2 and ctx.frame.ird_ord is None:
        return "Rev 2 frame without the IRD/ORD word"
    return None


three_fff_refused = rule_added("ERC-06", _three_fff)
"""IRD or ORD 0x3FFF (no negotiation, ERC-06) refused as out of range."""
rev2_needs_s = rule_added("ERC-12", _rev2_without_s)
"""A Rev 2 frame without the S bit refused (MPA-21: it is valid)."""


def mpa_settings(**changes: Any) -> EngineFault:
    """The MPA engine's settings changed after it was built (its checks are bypassed)."""

    def apply(engine: IwarpConnection) -> None:
        engine.mpa.settings = replace(engine.mpa.settings, **changes)

    return apply


# -- the startup frames on the wire --------------------------------------------------------


def startup_in(edit: Callable[[bytearray, IwarpConnection], None]) -> EngineFault:
    """The peer's startup frame is held until it has arrived whole (or cannot be a frame),
    then edited in place by ``edit`` before the engine reads it."""

    def apply(engine: IwarpConnection) -> None:
        receive_data = engine.receive_data
        held = bytearray()
        done = False

        def release(data: Any) -> None:
            nonlocal done
            done = True
            if held:
                chunk = bytes(held)
                held.clear()
                receive_data(chunk)
            if data is not None:
                receive_data(data)

        def hooked(data: Any) -> None:
            if done or engine.mpa.state not in _WAITING or not len(data):
                release(data)
                return
            held.extend(data)
            try:
                whole = decode_frame(held, max_private_data=_ANY_LENGTH) is not None
            except MpaError:
                whole = True
            if whole:
                edit(held, engine)
                release(None)

        engine.receive_data = hooked  # type: ignore[method-assign]

    return apply


def startup_out(edit: Callable[[MpaFrame, IwarpConnection], MpaFrame]) -> EngineFault:
    """The engine's own startup frame (the first bytes it sends) goes out as ``edit``
    makes it."""

    def apply(engine: IwarpConnection) -> None:
        data_to_send = engine.data_to_send
        done = False

        def hooked() -> bytearray:
            nonlocal done
            out = data_to_send()
            if done or not out:
                return out
            done = True
            decoded = decode_frame(out, max_private_data=_ANY_LENGTH)
            assert decoded is not None, "the engine queues its startup frame whole"
            frame, used = decoded
            return bytearray(encode_frame(edit(frame, engine), max_private_data=None)) + out[used:]

        engine.data_to_send = hooked  # type: ignore[method-assign]

    return apply


def _expected_key(engine: IwarpConnection) -> bytes:
    return MPA_KEY_REQ if engine.role is Role.RESPONDER else MPA_KEY_REP


def _key_prefix(buf: bytearray, engine: IwarpConnection) -> None:
    key = _expected_key(engine)
    if len(buf) >= MPA_KEY_LEN and buf[: MPA_KEY_LEN - 1] == key[:-1]:
        buf[MPA_KEY_LEN - 1] = key[-1]


key_prefix_only = startup_in(_key_prefix)
"""Only the first 15 octets of the key are compared (MPA-18)."""


def _pd_length(buf: bytearray) -> int:
    return int.from_bytes(buf[MPA_FRAME_HEADER_LEN - 2 : MPA_FRAME_HEADER_LEN], "big")


def _s_without_room(buf: bytearray, engine: IwarpConnection) -> None:
    if len(buf) < MPA_FRAME_HEADER_LEN or buf[MPA_KEY_LEN + 1] < MPA_REV_2:
        return
    if buf[MPA_KEY_LEN] & MpaFlag.ENHANCED and _pd_length(buf) < MPA_IRD_ORD_LEN:
        buf[MPA_KEY_LEN] &= ~MpaFlag.ENHANCED & 0xFF


s_without_room_ignored = startup_in(_s_without_room)
"""An S bit without room for the IRD/ORD word is ignored instead of refused (ERC-02)."""


def _reject_bit(buf: bytearray, engine: IwarpConnection) -> None:
    if engine.role is Role.INITIATOR and len(buf) > MPA_KEY_LEN:
        buf[MPA_KEY_LEN] &= ~MpaFlag.REJECT & 0xFF


reject_ignored = startup_in(_reject_bit)
"""The initiator reads a rejecting Reply's R bit as 0 and goes on (MPA-24)."""


def _own_rtr(buf: bytearray, engine: IwarpConnection) -> None:
    at = MPA_FRAME_HEADER_LEN
    if engine.role is not Role.INITIATOR or len(buf) < at + MPA_IRD_ORD_LEN:
        return
    if not buf[MPA_KEY_LEN] & MpaFlag.ENHANCED or buf[MPA_KEY_LEN + 1] < MPA_REV_2:
        return
    word = decode_ird_ord(buf[at : at + MPA_IRD_ORD_LEN])
    if word.p2p:
        offered = RtrType(engine.mpa.settings.rtr)
        buf[at : at + MPA_IRD_ORD_LEN] = encode_ird_ord(replace(word, rtr=word.rtr | offered))


rtr_from_own_offer = startup_in(_own_rtr)
"""The initiator takes the RTR kinds it offered as flagged by the Reply too (ERC-09)."""


def _reply_rev(frame: MpaFrame, engine: IwarpConnection) -> MpaFrame:
    return replace(frame, rev=engine.mpa.settings.rev) if frame.reply else frame


reply_own_rev = startup_out(_reply_rev)
"""The Reply carries the DUT's own revision, not the Request's (MPA-20, ERC-01)."""


def _ord_kept(frame: MpaFrame, engine: IwarpConnection) -> MpaFrame:
    word = frame.ird_ord
    if not frame.reply or word is None or word.ord == MPA_V2_NO_NEGOTIATION:
        return frame
    return replace(frame, ird_ord=replace(word, ord=max(word.ord, engine.mpa.settings.ord)))


ord_not_lowered = startup_out(_ord_kept)
"""The Reply's ORD is the DUT's own, not lowered to the initiator's IRD (ERC-04)."""


def _no_p2p(frame: MpaFrame, engine: IwarpConnection) -> MpaFrame:
    word = frame.ird_ord
    if not frame.reply or word is None or not word.p2p:
        return frame
    return replace(frame, ird_ord=replace(word, p2p=False, rtr=RtrType.NONE))


p2p_ignored = startup_out(_no_p2p)
"""A peer-to-peer Request is answered as a client-server one: A=0, no RTR (ERC-08)."""


def _gso_bit(frame: MpaFrame, engine: IwarpConnection) -> MpaFrame:
    if frame.reply:
        return frame
    return replace(frame, reserved=frame.reserved | MpaFlag.SIW_GSO)


request_gso_bit = startup_out(_gso_bit)
"""The DUT's Request sets reserved flag 0x08, as siw does for GSO (MPA-19)."""


def first_segment_is_request(engine: IwarpConnection) -> None:
    """The responder takes the first TCP segment for the whole Request and answers it at
    once: missing header octets are its own defaults, missing private data zeros
    (MPA-22: the Reply waits for the complete Request)."""
    receive_data = engine.receive_data
    first = True

    def hooked(data: Any) -> None:
        nonlocal first
        if not first or engine.mpa.state is not MpaState.AWAIT_REQUEST or not len(data):
            receive_data(data)
            return
        first = False
        buf = bytes(data)
        try:
            if decode_frame(buf, max_private_data=engine.mpa.settings.max_private_data):
                receive_data(buf)
                return
        except MpaError:
            receive_data(buf)
            return
        template = MpaConnection(Role.INITIATOR, engine.mpa.settings)
        template.initiate(0.0)
        request = bytes(template.data_to_send())
        if len(buf) < MPA_FRAME_HEADER_LEN:
            buf += request[len(buf) :]
        else:
            buf += bytes(MPA_FRAME_HEADER_LEN + _pd_length(bytearray(buf)) - len(buf))
        receive_data(buf)

    engine.receive_data = hooked  # type: ignore[method-assign]


def early_fpdus_dropped(engine: IwarpConnection) -> None:
    """Bytes after the Request that arrive before the responder's Reply are discarded
    (MPA-17: Full Operation starts at the octet after the Request)."""
    receive_data = engine.receive_data
    startup = bytearray()

    def hooked(data: Any) -> None:
        state = engine.mpa.state
        if state is MpaState.REQUEST_RECEIVED and len(data):
            return
        if state is MpaState.AWAIT_REQUEST and len(data):
            before = len(startup)
            startup.extend(data)
            try:
                decoded = decode_frame(startup, max_private_data=_ANY_LENGTH)
            except MpaError:
                decoded = None
            if decoded is not None:
                data = bytes(data)[: decoded[1] - before]
        receive_data(data)

    engine.receive_data = hooked  # type: ignore[method-assign]


def no_startup_timer(role: Role) -> EngineFault:
    """The ``role`` side arms no startup timer: it waits for the Request (responder) or the
    Reply (initiator) for ever (MPA-26, MPA-27)."""

    def apply(engine: IwarpConnection) -> None:
        if engine.role is role:
            engine.timer_deadline = lambda: None  # type: ignore[method-assign]

    return apply


# -- CRC, PAD and markers in Full Operation -----------------------------------------------


def _framing(engine: IwarpConnection, action: Callable[[MpaConnection], None]) -> None:
    """Run ``action`` on the MPA engine once Full Operation has begun."""
    after_established(engine, lambda: action(engine.mpa))


def crc_own_preference(engine: IwarpConnection) -> None:
    """A DUT that wants no CRC uses none, whatever the peer's C bit says (MPA-11: C in
    either frame turns CRC on both ways)."""
    mpa = engine.mpa
    mpa.settings = replace(mpa.settings, crc=CrcPolicy.OFF)

    def off(mpa: MpaConnection) -> None:
        if mpa._framer is not None and mpa._deframer is not None:  # noqa: SLF001
            mpa._framer.crc = mpa._deframer.crc = False  # noqa: SLF001 - fault point

    _framing(engine, off)


def crc_from_peer(engine: IwarpConnection) -> None:
    """CRC is used iff the peer's frame asked for it; the DUT's own C bit is forgotten
    (MPA-11)."""

    def peer_only(mpa: MpaConnection) -> None:
        neg = mpa.negotiated
        if neg is not None and mpa._framer is not None and mpa._deframer is not None:  # noqa: SLF001
            mpa._framer.crc = mpa._deframer.crc = neg.peer_frame.crc  # noqa: SLF001

    _framing(engine, peer_only)


def crc_checked_when_off(engine: IwarpConnection) -> None:
    """The CRC field is checked even when CRC was negotiated off (MPA-05)."""

    def on(mpa: MpaConnection) -> None:
        if mpa._deframer is not None:  # noqa: SLF001
            mpa._deframer.crc = True  # noqa: SLF001 - documented fault point

    _framing(engine, on)


class _PointerBlindDeframer(FpduDeframer):
    """Markers are removed where they sit, their FPDUPTR never compared (MPA-08)."""

    __slots__ = ()

    def _check_markers(self, marks: bytes, index: int) -> None:
        return None


def marker_pointers_unchecked(engine: IwarpConnection) -> None:
    """Markers are stripped but their FPDUPTR is not checked (MPA-08)."""

    def blind(mpa: MpaConnection) -> None:
        deframer = mpa._deframer  # noqa: SLF001 - documented fault point
        if deframer is not None and deframer.markers:
            deframer.__class__ = _PointerBlindDeframer

    _framing(engine, blind)


class _PadZeroer:
    """Walks an unmarked FPDU stream and zeroes each FPDU's PAD octets."""

    def __init__(self) -> None:
        self.length = bytearray()  # the length field read so far
        self.pos = 0  # position in the current FPDU after its length field
        self.pad = (0, 0)  # [start, end) of the PAD after the length field
        self.left = 0  # octets of the current FPDU still to come after the length field

    def edit(self, data: Any) -> bytes:
        buf = bytearray(data)
        i = 0
        while i < len(buf):
            if not self.left:
                self.length.append(buf[i])
                i += 1
                if len(self.length) == MPA_LENGTH_LEN:
                    n = int.from_bytes(self.length, "big")
                    body = (MPA_LENGTH_LEN + n + 3) & ~3
                    self.length.clear()
                    self.pos, self.pad = 0, (n, body - MPA_LENGTH_LEN)
                    self.left = body - MPA_LENGTH_LEN + 4
                continue
            take = min(self.left, len(buf) - i)
            lo, hi = max(self.pad[0], self.pos), min(self.pad[1], self.pos + take)
            if lo < hi:
                buf[i + lo - self.pos : i + hi - self.pos] = bytes(hi - lo)
            self.pos += take
            self.left -= take
            i += take
        return bytes(buf)


def pad_taken_as_zero(engine: IwarpConnection) -> None:
    """The CRC is computed with zero PAD instead of the PAD received, so a non-zero PAD is
    a CRC error (MPA-04: PAD is covered by the CRC as sent, and otherwise ignored)."""
    receive_data = engine.receive_data
    walker = _PadZeroer()

    def hooked(data: Any) -> None:
        neg = engine.negotiated
        if engine.stream is None or neg is None or neg.markers_rx or not neg.crc:
            receive_data(data)
            return
        receive_data(walker.edit(data))

    engine.receive_data = hooked  # type: ignore[method-assign]
