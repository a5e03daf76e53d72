"""MPA framing cases in Full Operation with the DUT listening (RFC 5044 §3, §4, §5.2, §6, §8).

The application's first FPDU is sent broken in one more way than
:mod:`stack.conform.cases_framing` covers (a CRC off by one bit, an octet changed after the
CRC, a wrong ULPDU_Length, markers with reserved bits), cut across TCP segments (which a
receiver must reassemble, MPA-15), or next to FPDUs a receiver must refuse (an empty or
too-short ULPDU, ULPDU_Length above the largest MULPDU).  The expected Terminate is the
stack's own endpoint's answer to the same bytes (:mod:`stack.conform.oracle`).
"""

from __future__ import annotations

from collections.abc import Sequence

from stack.conform.context import CaseContext
from stack.conform.expected import work_verdict
from stack.conform.model import Verdict
from stack.conform.peer_core import Craft
from stack.conform.provocations import first, zero_write
from stack.conform.registry import case
from stack.conform.script import converse
from stack.conform.session import (
    Alternative,
    Item,
    Session,
    carrier,
    open_session,
)
from stack.constants import (
    DDP_UNTAGGED_HDR_LEN,
    MPA_CRC_LEN,
    MULPDU_MAX,
    TERM_DDP_U_NO_BUFFER,
    TERM_DDP_U_TOO_LONG,
    TERM_LLP_CRC_ERROR,
)
from stack.wire.events import Send

_D = "data"
_SPLIT_PAUSE = 0.02
"""Seconds between the pieces of a split FPDU (each goes out in its own TCP segment)."""


# ======================================================================================
# CRC errors at other positions (RFC 5044 §4.4, §8)
# ======================================================================================


def _bad_crc(n: int, title: str, sends: str, craft: Craft, *, prefix: bool = False) -> None:
    @case(
        "MPA-12",
        title,
        n=n,
        rules=("MPA-28", "RDMAP-12"),
        phase=_D,
        sends=sends,
        expects="no delivery; the stack's Terminate for it (MPA CRC error, no header copies)",
    )
    async def body(ctx: CaseContext) -> Verdict:
        def edit(s: Session, u: bytes) -> Sequence[Item] | Verdict:
            if not s.negotiated.crc:
                return Verdict.not_applicable("CRC is off on this connection")
            return [zero_write(s), (u, craft)] if prefix else [(u, craft)]

        return await carrier(ctx, edit, what="FPDU with a bad CRC")


_bad_crc(
    2,
    "FPDU with one bit of its CRC flipped: Terminate 2/0/0x02",
    "the app's first FPDU with the lowest bit of its CRC field flipped",
    Craft(crc_xor=1),
)
_bad_crc(
    3,
    "FPDU with a payload octet changed after the CRC: Terminate 2/0/0x02",
    "the app's first FPDU with its last ULPDU octet changed after the CRC was computed",
    Craft(flip=(-MPA_CRC_LEN - 1, 0x01)),
)
_bad_crc(
    4,
    "FPDU with a CRC field of zero (CRC on): Terminate 2/0/0x02",
    "the app's first FPDU with its CRC field 0x00000000",
    Craft(crc=0),
)
_bad_crc(
    5,
    "The second FPDU of the connection with a bad CRC: Terminate 2/0/0x02",
    "a valid zero-length RDMA Write, then the app's first FPDU with its CRC flipped, in one write",
    Craft(bad_crc=True),
    prefix=True,
)


@case(
    "MPA-12",
    "FPDU whose ULPDU_Length says 4 octets less: Terminate 2/0/0x02",
    n=6,
    rules=("MPA-16", "MPA-28"),
    phase=_D,
    sends="the app's first FPDU (all its octets) announcing ULPDU_Length 4 less than it carries",
    expects="no delivery; the stack's Terminate (the CRC then sits elsewhere: MPA CRC error)",
)
async def short_length(ctx: CaseContext) -> Verdict:
    def edit(s: Session, u: bytes) -> Sequence[Item] | Verdict:
        if not s.negotiated.crc:
            return Verdict.not_applicable("CRC is off on this connection")
        return [(u, Craft(length=len(u) - 4))]

    return await carrier(ctx, edit, what="FPDU with a wrong ULPDU_Length")


@case(
    "MPA-28",
    "A valid FPDU right behind one with a bad CRC: not delivered",
    rules=("MPA-12", "RDMAP-10"),
    phase=_D,
    sends="the app's first FPDU with its CRC flipped, then the same message again (next MSN) "
    "with a valid CRC, in one write",
    expects="neither delivered; the stack's Terminate for the first (MPA CRC error), nothing "
    "after it",
)
async def after_bad_crc(ctx: CaseContext) -> Verdict:
    def edit(s: Session, u: bytes) -> Sequence[Item] | Verdict:
        if not s.negotiated.crc:
            return Verdict.not_applicable("CRC is off on this connection")
        again = first(s, Send(u[DDP_UNTAGGED_HDR_LEN:]))
        return [(u, Craft(bad_crc=True)), again]

    return await carrier(ctx, edit, what="FPDU after a CRC error")


# ======================================================================================
# ULPDUs a receiver must refuse (RFC 5044 §3, §6; RFC 5041 §7)
# ======================================================================================

_ANY = Alternative(
    None,
    "the stream ended as it must; RFC 5044 and RFC 5041 name no error "
    "code for this FPDU, and this stack's differs",
)
_DDP_REFUSES = (
    Alternative(
        TERM_DDP_U_TOO_LONG,
        "the DUT took the FPDU and refused its message at DDP "
        "(too long for the receive): nothing delivered either way",
        means="met",
    ),
    Alternative(
        TERM_DDP_U_NO_BUFFER,
        "the DUT took the FPDU and refused its message at DDP: nothing delivered either way",
        means="met",
    ),
    Alternative(
        TERM_LLP_CRC_ERROR,
        "the DUT refuses FPDUs above the largest MULPDU at MPA: nothing delivered either way",
        means="met",
    ),
    _ANY,
)


@case(
    "MPA-01",
    "An FPDU with ULPDU_Length 0: the stream ends",
    rules=("DDP-01", "MPA-03"),
    phase=_D,
    sends="an FPDU carrying no ULPDU (ULPDU_Length 0, valid CRC), then the app's first FPDU",
    expects="no delivery; the stack's Terminate (an empty ULPDU has no DDP header: DDP local "
    "catastrophic; another cause is a WARN)",
)
async def empty_ulpdu(ctx: CaseContext) -> Verdict:
    return await carrier(ctx, lambda s, u: [b"", u], what="empty ULPDU", alternatives=[_ANY])


@case(
    "MPA-02",
    "ULPDU_Length 65535 with every octet and a valid CRC: not delivered",
    rules=("MPA-16", "MPA-28"),
    phase=_D,
    sends="instead of the app's first FPDU, a Send in one FPDU of 65535 octets (above any "
    "MULPDU), CRC valid",
    expects="no delivery; the stack's Terminate (beyond its receive tolerance: MPA); a refusal "
    "at DDP (too long) passes too, another cause is a WARN",
)
async def huge_fpdu(ctx: CaseContext) -> Verdict:
    def edit(s: Session, u: bytes) -> Sequence[Item] | Verdict:
        if s.negotiated.markers_tx:
            return Verdict.not_applicable(
                "the DUT asks for markers: an FPDU of 65535 octets has marker FPDUPTRs "
                "beyond 16 bits, it cannot be sent"
            )
        big = u[:DDP_UNTAGGED_HDR_LEN] + bytes(0xFFFF - DDP_UNTAGGED_HDR_LEN)
        return [(big, Craft())]

    return await carrier(ctx, edit, what="65535-octet FPDU", alternatives=_DDP_REFUSES)


@case(
    "MPA-02",
    "ULPDU_Length one above the largest MULPDU (64769), complete: not delivered",
    n=2,
    rules=("MPA-13", "RDMAP-08"),
    phase=_D,
    sends=f"instead of the app's first FPDU, a Send in one FPDU of {MULPDU_MAX + 1} octets",
    expects="no delivery; the stack's Terminate (it takes the FPDU, then the message is too "
    "long for the receive); an MPA-level refusal passes too",
)
async def over_mulpdu(ctx: CaseContext) -> Verdict:
    def edit(s: Session, u: bytes) -> Sequence[Item]:
        big = u[:DDP_UNTAGGED_HDR_LEN] + bytes(MULPDU_MAX + 1 - DDP_UNTAGGED_HDR_LEN)
        return [(big, Craft())]

    return await carrier(ctx, edit, what="over-MULPDU FPDU", alternatives=_DDP_REFUSES)


# ======================================================================================
# FPDUs cut across TCP segments (RFC 5044 §5.2, §6, Appendix A)
# ======================================================================================


async def _split(
    ctx: CaseContext,
    cuts: list[int] | None,
    what: str,
    *,
    prefix: bool = False,
    pause: float = _SPLIT_PAUSE,
) -> Verdict:
    """Startup, then the app's first FPDU (after a zero-length Write with ``prefix``) cut at
    ``cuts`` (see :meth:`~stack.conform.peer.Peer.send_split`): it must be delivered."""
    opened = await open_session(ctx, ready=False)
    if isinstance(opened, Verdict):
        return opened
    s = opened
    u = s.ulpdus(s.client.opening()[0])[0]
    items: list[tuple[bytes, Craft | None]] = [(u, None)]
    if prefix:
        items.insert(0, (zero_write(s), None))
    await s.peer.send_split(items, cuts, pause)
    conv = await converse(ctx, s.peer, client=s.client, opening=[], absorb=s.absorb)
    return work_verdict(conv, what)


@case(
    "MPA-15",
    "The app's first FPDU cut after its first octet: reassembled",
    rules=("MPA-16", "MPA-14"),
    phase=_D,
    sends="the app's first FPDU in two TCP segments: 1 octet, then the rest",
    expects="the FPDU delivered: the application goes on",
)
async def split_length(ctx: CaseContext) -> Verdict:
    return await _split(ctx, [1], "FPDU split inside ULPDU_Length")


@case(
    "MPA-15",
    "The app's first FPDU cut inside its DDP header: reassembled",
    n=2,
    rules=("MPA-16",),
    phase=_D,
    sends="the app's first FPDU in two TCP segments, cut 8 octets in (inside the DDP header)",
    expects="the FPDU delivered: the application goes on",
)
async def split_header(ctx: CaseContext) -> Verdict:
    return await _split(ctx, [8], "FPDU split inside its DDP header")


@case(
    "MPA-15",
    "The app's first FPDU with its CRC in a segment of its own: reassembled",
    n=3,
    rules=("MPA-16",),
    phase=_D,
    sends="the app's first FPDU in two TCP segments, the 4 CRC octets alone in the second",
    expects="the FPDU delivered: the application goes on",
)
async def split_crc(ctx: CaseContext) -> Verdict:
    return await _split(ctx, [-MPA_CRC_LEN], "FPDU with its CRC in a separate segment")


@case(
    "MPA-15",
    "The app's first FPDU one octet per TCP segment: reassembled",
    n=4,
    rules=("MPA-16",),
    phase=_D,
    sends="the app's first FPDU one octet at a time, each octet its own write",
    expects="the FPDU delivered: the application goes on",
)
async def split_every_octet(ctx: CaseContext) -> Verdict:
    return await _split(ctx, None, "FPDU sent one octet at a time", pause=0.002)


@case(
    "MPA-15",
    "Two FPDUs in one segment, the second cut in the middle: both taken",
    n=5,
    rules=("MPA-16",),
    phase=_D,
    sends="a zero-length RDMA Write and the app's first FPDU, the TCP segment boundary in the "
    "middle of the second",
    expects="both taken: the application goes on",
)
async def split_second(ctx: CaseContext) -> Verdict:
    return await _split(ctx, [-20], "FPDUs split across segments", prefix=True)


# ======================================================================================
# Markers (RFC 5044 §4.2, §4.3): only when the DUT asks for them
# ======================================================================================


def _marker(n: int, title: str, sends: str, craft: Craft) -> None:
    @case(
        "MPA-06",
        title,
        n=n,
        rules=("MPA-10",),
        phase=_D,
        sends=sends,
        expects="the FPDU delivered (the RESERVED half and FPDUPTR's low two bits are not "
        "checked); SKIP unless the DUT's Reply asks for markers",
    )
    async def body(ctx: CaseContext) -> Verdict:
        def edit(s: Session, u: bytes) -> Sequence[Item] | Verdict:
            if not s.negotiated.markers_tx:
                return Verdict.not_applicable("the DUT does not ask for markers")
            return [(u, craft)]

        return await carrier(ctx, edit, what="FPDU with odd marker bits")


_marker(
    1,
    "Markers with their RESERVED half set: ignored",
    "the app's first FPDU with every marker's RESERVED half 0xFFFF",
    Craft(marker_rsvd=0xFFFF),
)
_marker(
    2,
    "Markers with FPDUPTR's low two bits set: read as 0",
    "the app's first FPDU with every marker's FPDUPTR ORed with 0x0003",
    Craft(marker_ptr_or=3),
)
