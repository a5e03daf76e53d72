"""Full Operation cases with the DUT listening: CRC and marker negotiation, broken FPDUs,
reserved header bits (RFC 5044 §4, §6, §8; RFC 5041 §4.1; RFC 5040 §4.1).

Each case completes a valid startup, then plays the application's client with one FPDU
broken on purpose (:class:`~stack.conform.peer_core.Craft`).  The expected Terminate is the
one the wire core derives for the same bytes: the cause is the ``term`` of the error a
:class:`~stack.wire.framing.FpduDeframer` raises for them
(:func:`~stack.conform.expected.framing_expects`), the header copies are
:func:`~stack.wire.terminate.build_terminate`'s.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from stack.conform.context import CaseContext
from stack.conform.expect import expect_silence, judge_terminate
from stack.conform.expected import framing_expects, judge_accepted, work_verdict
from stack.conform.model import Outcome, Verdict
from stack.conform.peer import Peer
from stack.conform.peer_core import Craft, Sent
from stack.conform.registry import case
from stack.conform.script import (
    Conversation,
    converse,
    need_established,
    start,
)
from stack.constants import DDP_RSVD_MASK, MPA_LENGTH_LEN, RDMAP_RSVD_MASK, TermCode
from stack.errors import ProtocolError
from stack.wire.events import CrcPolicy, Negotiated
from stack.wire.rdmap import decode_ulpdu

# ======================================================================================
# Negotiation (RFC 5044 §4.3, §4.4, §7.1.1)
# ======================================================================================


@case(
    "MPA-09",
    "Request with M=1: the DUT puts markers in the FPDUs it sends",
    rules=("MPA-07", "MPA-08"),
    phase="data",
    sends="the app's Request with M=1; then the application's traffic",
    expects="FPDUs with a marker every 512 octets from SeqStart (or an R=1 Reply: markers "
    "declined, SKIP)",
)
async def markers_requested(ctx: CaseContext) -> Verdict:
    s = await start(ctx, settings=replace(ctx.app.settings, want_markers=True))
    a = s.answer
    if a.kind == "reject":
        return Verdict.declined(f"declined markers: {a.describe()}")
    if a.kind == "close":
        return Verdict.declined(f"declined markers by closing after {a.seconds:.2f} s")
    verdict = await judge_accepted(ctx, s)
    if verdict.outcome is Outcome.MET:
        return verdict.with_evidence("its FPDUs carried valid markers (checked by the deframer)")
    return verdict


@case(
    "MPA-11",
    "Request with C=1: CRC both ways",
    phase="data",
    sends="the app's Request with C=1; then the application's traffic with CRCs",
    expects="valid CRCs on every FPDU the DUT sends (whatever C its Reply has)",
)
async def crc_requested(ctx: CaseContext) -> Verdict:
    s = await start(ctx, settings=replace(ctx.app.settings, crc=CrcPolicy.REQUEST))
    return await judge_accepted(ctx, s)


@case(
    "MPA-11",
    "Request with C=0: CRC iff the Reply asks for it",
    n=2,
    phase="data",
    sends="the app's Request with C=0; then traffic with CRCs iff the Reply has C=1",
    expects="an accepting Reply (or R=1: CRC required, SKIP); FPDUs as the Reply's C says",
)
async def crc_declined(ctx: CaseContext) -> Verdict:
    s = await start(ctx, settings=replace(ctx.app.settings, crc=CrcPolicy.OFF))
    if s.answer.kind == "reject":
        return Verdict.declined(f"requires CRC: {s.answer.describe()}")
    verdict = await judge_accepted(ctx, s)
    if s.negotiated is not None and verdict.outcome is Outcome.MET:
        how = "on" if s.negotiated.crc else "off"
        return verdict.with_evidence(f"CRC {how} both ways")
    return verdict


@case(
    "MPA-05",
    "CRC off both ways: the CRC field is not checked",
    phase="data",
    sends="a Request with C=0; if the Reply has C=0, FPDUs whose CRC field is 0xDEADBEEF",
    expects="the FPDUs delivered (SKIP when the DUT asks for CRC)",
)
async def crc_off(ctx: CaseContext) -> Verdict:
    s = await start(ctx, settings=replace(ctx.app.settings, crc=CrcPolicy.OFF))
    if s.answer.kind == "reject":
        return Verdict.declined(f"requires CRC: {s.answer.describe()}")
    broken = need_established(s)
    if broken is not None:
        return broken
    assert s.negotiated is not None
    if s.negotiated.crc:
        return Verdict.declined(f"asks for CRC: {s.answer.describe()}; CRC is on both ways")
    conv = await converse(ctx, s.peer, craft=lambda i, u: Craft(crc=0xDEADBEEF))
    return work_verdict(conv, f"{s.answer.describe()}; CRC fields 0xDEADBEEF")


# ======================================================================================
# Broken FPDUs (RFC 5044 §4.1, §4.3, §4.4, §6, §8)
# ======================================================================================


async def _broken_fpdu(
    ctx: CaseContext,
    craft: Craft,
    *,
    what: str,
    need: Callable[[Negotiated], str | None] = lambda neg: None,
) -> Verdict:
    """Startup, then the app's first FPDU broken by ``craft``: the DUT must deliver nothing
    and send the Terminate the wire core derives for those bytes (RDMAP-12), then nothing
    more (RDMAP-10).  ``need``: why the case does not apply to this negotiation, or None."""
    s = await start(ctx)
    broken = need_established(s)
    if broken is not None:
        return broken
    assert s.negotiated is not None
    why = need(s.negotiated)
    if why is not None:
        return Verdict.not_applicable(f"{why}: {s.answer.describe()}")
    conv = await converse(ctx, s.peer, craft=lambda i, u: craft if i == 0 else None,
                          stop_at_delivery=True)  # fmt: skip
    first = conv.sent[0]
    expected = framing_expects(first)
    return await _judge_error(ctx, s.peer, conv, first, expected.term, what=what,
                              wait_ok=expected.rule == "MPA-16")  # fmt: skip


async def _judge_error(
    ctx: CaseContext,
    peer: Peer,
    conv: Conversation,
    offending: Sent,
    cause: TermCode | None,
    *,
    what: str,
    wait_ok: bool = False,
) -> Verdict:
    if conv.deliveries:
        return Verdict.not_met(f"delivered the {what}: " + "; ".join(conv.delivery_lines()),
                               frame=conv.deliveries[0][1])  # fmt: skip
    if cause is None:
        return Verdict.broken(f"the wire core accepts the {what}: nothing to test")
    if conv.terminate is not None:
        t, _ = conv.terminate
        verdict = judge_terminate(t, cause, offending.ulpdu, conv.terminate_frame)
        quiet = await expect_silence(peer, ctx.options.silence)
        if quiet.lines and verdict.outcome is Outcome.MET:
            return Verdict.not_met(
                f"{verdict.observed}; then sent more: {quiet.lines[0]}",
                rule="RDMAP-10",
                frame=quiet.frame,
            )
        return verdict
    if conv.framing is not None:
        return Verdict.not_met(f"answered with bytes that break framing: {conv.framing.error}")
    if conv.eof is not None:
        return Verdict.not_met(
            f"closed without a Terminate (expected {cause})", rule="RDMAP-12", level="MUST"
        )
    if wait_ok:
        return Verdict.met(
            f"delivered nothing and waited for the rest of the FPDU ({ctx.options.timeout:g} s)",
            f"a Terminate {cause} would be right too",
        )
    return Verdict.not_met(f"no Terminate within {ctx.options.timeout:g} s (expected {cause})",
                           rule="RDMAP-12", level="MUST")  # fmt: skip


@case(
    "MPA-12",
    "FPDU with a bad CRC: Terminate 2/0/0x02, nothing delivered",
    rules=("MPA-28", "RDMAP-12", "RDMAP-10"),
    phase="data",
    sends="the app's first FPDU with every bit of its CRC field flipped",
    expects="no delivery; a Terminate with the wire core's cause for it (MPA CRC error) and "
    "header copies as RFC 5040 Fig. 10 (none for an LLP error); nothing after it",
)
async def bad_crc(ctx: CaseContext) -> Verdict:
    return await _broken_fpdu(
        ctx,
        Craft(bad_crc=True),
        what="FPDU with a bad CRC",
        need=lambda neg: None if neg.crc else "CRC is off on this connection",
    )


@case(
    "MPA-04",
    "Non-zero PAD (covered by the CRC): ignored",
    phase="data",
    sends="the first FPDU of the app's exchange that needs PAD, with PAD octets 0xFF",
    expects="the FPDU delivered: the application goes on (SKIP if no FPDU needs PAD)",
)
async def bad_pad(ctx: CaseContext) -> Verdict:
    s = await start(ctx)
    broken = need_established(s)
    if broken is not None:
        return broken
    padded: list[int] = []

    def craft(index: int, ulpdu: bytes) -> Craft | None:
        if padded or not (MPA_LENGTH_LEN + len(ulpdu)) & 3:
            return None
        padded.append(index)
        return Craft(pad=b"\xff\xff\xff")

    conv = await converse(ctx, s.peer, craft=craft)
    if not padded:
        return Verdict.not_applicable(
            f"no FPDU of the {ctx.app.name} exchange needs PAD "
            f"(ULPDU lengths {[len(x.ulpdu) for x in conv.sent]})"
        )
    index = padded[0]
    verdict = work_verdict(conv, f"PAD 0xFF in FPDU {index + 1} of the exchange")
    later = [d for d in conv.deliveries if d[2] > index]
    if verdict.outcome is Outcome.MET and not (conv.done or later):
        return Verdict.not_met("nothing delivered after the FPDU with non-zero PAD")
    return verdict


@case(
    "MPA-16",
    "ULPDU_Length 65535 (above MULPDU) with fewer bytes: nothing delivered",
    rules=("MPA-02", "MPA-28"),
    phase="data",
    sends="the app's first FPDU announcing ULPDU_Length 65535",
    expects="no delivery; the DUT waits for the rest, or sends a Terminate with the wire "
    "core's cause for it (MPA CRC error)",
)
async def long_length(ctx: CaseContext) -> Verdict:
    return await _broken_fpdu(ctx, Craft(length=0xFFFF), what="FPDU announcing 65535 bytes")


@case(
    "MPA-08",
    "Marker with a wrong FPDUPTR (when the DUT asks for markers): Terminate 2/0/0x03",
    rules=("MPA-28", "RDMAP-12"),
    phase="data",
    sends="the app's first FPDU with every marker's FPDUPTR set to 0x0004",
    expects="no delivery; the wire core's Terminate (marker mismatch); SKIP unless the DUT's "
    "Reply has M=1",
)
async def bad_marker(ctx: CaseContext) -> Verdict:
    return await _broken_fpdu(
        ctx,
        Craft(marker_ptr=4),
        what="FPDU with a wrong marker",
        need=lambda neg: None if neg.markers_tx else "the DUT does not ask for markers",
    )


# ======================================================================================
# Reserved header bits (RFC 5041 §4.1, RFC 5040 §4.1)
# ======================================================================================


async def _reserved(ctx: CaseContext, byte: int, mask: int, what: str) -> Verdict:
    s = await start(ctx)
    broken = need_established(s)
    if broken is not None:
        return broken

    def craft(index: int, ulpdu: bytes) -> Craft | None:
        if index:
            return None
        changed = bytearray(ulpdu)
        changed[byte] |= mask
        return Craft(ulpdu=bytes(changed))

    conv = await converse(ctx, s.peer, craft=craft)
    try:
        decode_ulpdu(conv.sent[0].ulpdu, strict=True)
    except ProtocolError as exc:  # pragma: no cover - case definition error
        return Verdict.broken(f"the wire core rejects the ULPDU: {exc}")
    return work_verdict(conv, f"{what} set in the first ULPDU")


@case(
    "DDP-03",
    "Reserved DDP control bits set: not checked",
    phase="data",
    sends="the app's first ULPDU with the DDP control byte's reserved bits (0x3C) set",
    expects="the message delivered: the application goes on",
)
async def ddp_reserved(ctx: CaseContext) -> Verdict:
    return await _reserved(ctx, 0, DDP_RSVD_MASK, "DDP reserved bits 0x3C")


@case(
    "RDMAP-02",
    "Reserved RDMAP control bits set: not checked",
    phase="data",
    sends="the app's first ULPDU with the RDMAP control byte's reserved bits (0x30) set",
    expects="the message delivered: the application goes on",
)
async def rdmap_reserved(ctx: CaseContext) -> Verdict:
    return await _reserved(ctx, 1, RDMAP_RSVD_MASK, "RDMAP reserved bits 0x30")
