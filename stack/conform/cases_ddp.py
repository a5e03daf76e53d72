"""DDP data-phase cases with the DUT listening (RFC 5041 §4, §5, §7; RFC 5042 §6).

Untagged-header cases edit the application's first Send (a *carrier*: its delivery, the
application's answer, is the evidence); tagged-placement cases aim at a region the
application advertised (rping's RDMA buffer, the KBTP Partition, the bench target).  What a
conforming DUT does with each input is the stack's own endpoint's answer to the same
bytes, set up like the DUT (:mod:`stack.conform.oracle`); a Terminate's header copies are
:func:`~stack.wire.terminate.build_terminate`'s.
"""

from __future__ import annotations

from collections.abc import Sequence

from stack.conform.apps import Region
from stack.conform.context import CaseContext
from stack.conform.model import Verdict
from stack.conform.provocations import (
    FAR,
    WRAP_TO,
    bogus_stag,
    first,
    needs,
    split_send,
    zero_read,
    zero_write,
)
from stack.conform.registry import case
from stack.conform.session import (
    Alternative,
    Item,
    Session,
    carrier,
    open_session,
    provoke,
    watch,
)
from stack.conform.ulpdu import (
    INVAL_AT,
    MO_AT,
    MSN_AT,
    QN_AT,
    ctrl,
    set_u32,
    with_dv,
    with_last,
    with_opcode,
)
from stack.constants import (
    DDP_RSVD_MASK,
    TERM_DDP_T_BASE_BOUNDS,
    TERM_RDMAP_ACCESS_RIGHTS,
    Opcode,
)
from stack.rnic.memory import Access
from stack.wire.events import RdmaWrite, Send

_D = "data"
_W = Access.REMOTE_WRITE

# ======================================================================================
# DDP version and reserved bits (RFC 5041 §4.1)
# ======================================================================================


def _dv_untagged(dv: int, n: int) -> None:
    @case(
        "DDP-03",
        f"DV {dv} in an untagged segment (the app's first Send): Terminate 1/2/0x06",
        n=n,
        rules=("DDP-11", "RDMAP-12"),
        phase=_D,
        sends=f"the app's first Send with DDP version {dv}",
        expects="no delivery; the stack's Terminate for it (Invalid DDP version, untagged) "
        "with the Send's DDP header copied",
    )
    async def body(ctx: CaseContext) -> Verdict:
        return await carrier(ctx, lambda s, u: [with_dv(u, dv)], what=f"Send with DV {dv}")


for _n, _dv in ((2, 0), (3, 2), (4, 3)):
    _dv_untagged(_dv, _n)


def _dv_tagged(dv: int, n: int) -> None:
    @case(
        "DDP-03",
        f"DV {dv} in a tagged segment (a zero-length Write): Terminate 1/1/0x04",
        n=n,
        rules=("DDP-11", "DDP-10"),
        phase=_D,
        sends=f"a zero-length RDMA Write with DDP version {dv}, then the app's first Send, "
        "in one write",
        expects="no delivery of the Send; the stack's Terminate (Invalid DDP version, tagged)",
    )
    async def body(ctx: CaseContext) -> Verdict:
        return await carrier(
            ctx, lambda s, u: [with_dv(zero_write(s), dv), u], what=f"tagged segment with DV {dv}"
        )


for _n, _dv in ((5, 0), (6, 2)):
    _dv_tagged(_dv, _n)


@case(
    "DDP-03",
    "Reserved DDP control bits in a tagged segment: not checked",
    n=7,
    phase=_D,
    sends="a zero-length RDMA Write with the reserved bits (0x3C) set, then the app's first Send",
    expects="both taken: the application goes on",
)
async def reserved_tagged(ctx: CaseContext) -> Verdict:
    return await carrier(
        ctx,
        lambda s, u: [ctrl(zero_write(s), set_bits=DDP_RSVD_MASK), u],
        what="tagged segment with reserved bits set",
    )


# ======================================================================================
# Queue numbers, MSN and MO (RFC 5041 §4.3, §5.2, §7.2)
# ======================================================================================


def _qn(qn: int, n: int) -> None:
    @case(
        "DDP-10",
        f"A Send on QN 0x{qn:X} (no such queue): Terminate 1/2/0x01",
        n=n,
        rules=("DDP-11", "RDMAP-01"),
        phase=_D,
        sends=f"the app's first Send with QN 0x{qn:X}",
        expects="no delivery; the stack's Terminate for it (Invalid QN)",
    )
    async def body(ctx: CaseContext) -> Verdict:
        return await carrier(ctx, lambda s, u: [set_u32(u, QN_AT, qn)], what=f"Send on QN {qn:#x}")


for _n, _qn_value in ((1, 4), (2, 0xFFFFFFFF)):
    _qn(_qn_value, _n)


def _msn(msn: int, n: int, title: str) -> None:
    @case(
        "DDP-05",
        f"{title}: Terminate 1/2/0x03",
        n=n,
        rules=("DDP-11",),
        phase=_D,
        sends=f"the app's first Send (QN 0's first message) with MSN {msn:#x}",
        expects="no delivery; the stack's Terminate for it (MSN range not valid)",
    )
    async def body(ctx: CaseContext) -> Verdict:
        return await carrier(ctx, lambda s, u: [set_u32(u, MSN_AT, msn)], what=f"MSN {msn:#x}")


_msn(2, 1, "The first Send with MSN 2 (one skipped)")
_msn(0, 2, "The first Send with MSN 0")
_msn(0x80000001, 3, "The first Send with an MSN far out of the window")


@case(
    "DDP-05",
    "A Send repeated with the same MSN: Terminate 1/2/0x03",
    n=4,
    rules=("DDP-08", "DDP-11"),
    phase=_D,
    sends="the app's first Send twice, both with MSN 1, in one write",
    expects="the first taken (the application may answer it), the second refused with the "
    "stack's Terminate (MSN range not valid): a message is delivered at most once",
)
async def msn_repeated(ctx: CaseContext) -> Verdict:
    return await carrier(ctx, lambda s, u: [u, u], what="repeated Send", allow=1)


@case(
    "DDP-05",
    "The first segment of a Send with MO 4: Terminate 1/2/0x04",
    n=5,
    rules=("DDP-11",),
    phase=_D,
    sends="the app's first Send with MO 4 (its first and only segment)",
    expects="no delivery; the stack's Terminate for it (Invalid MO)",
)
async def first_mo(ctx: CaseContext) -> Verdict:
    return await carrier(ctx, lambda s, u: [set_u32(u, MO_AT, 4)], what="Send starting at MO 4")


@case(
    "DDP-05",
    "A Read Request (QN 1) whose MSN skips one: Terminate 1/2/0x03",
    n=6,
    rules=("DDP-11", "RDMAP-06"),
    phase=_D,
    sends="a zero-length Read Request with MSN 2 (QN 1's first message), then the app's first Send",
    expects="no delivery; the stack's Terminate (MSN range not valid) about the Read Request",
)
async def read_msn(ctx: CaseContext) -> Verdict:
    return await carrier(
        ctx, lambda s, u: [set_u32(zero_read(s), MSN_AT, 2), u], what="Read Request with MSN 2"
    )


@case(
    "DDP-06",
    "A Send in two segments (MO 0, then MO 8): delivered",
    phase=_D,
    sends="the app's first Send split into two segments, L only on the second",
    expects="the message delivered whole: the application goes on",
)
async def two_segments(ctx: CaseContext) -> Verdict:
    return await carrier(ctx, lambda s, u: split_send(u, 8), what="two-segment Send")


@case(
    "DDP-06",
    "A Send in two segments with a gap (second MO 12 after 8 octets): Terminate 1/2/0x04",
    n=2,
    rules=("DDP-05", "DDP-11"),
    phase=_D,
    sends="the app's first Send split after 8 octets, the second segment at MO 12",
    expects="no delivery; the stack's Terminate for the second segment (Invalid MO)",
)
async def mo_gap(ctx: CaseContext) -> Verdict:
    return await carrier(ctx, lambda s, u: split_send(u, 8, second_mo=12), what="MO gap")


@case(
    "DDP-06",
    "A Send in two overlapping segments (second MO 4 after 8 octets): Terminate 1/2/0x04",
    n=3,
    rules=("DDP-05", "DDP-11"),
    phase=_D,
    sends="the app's first Send split after 8 octets, the second segment at MO 4",
    expects="no delivery; the stack's Terminate for the second segment (Invalid MO)",
)
async def mo_overlap(ctx: CaseContext) -> Verdict:
    return await carrier(ctx, lambda s, u: split_send(u, 8, second_mo=4), what="MO overlap")


# ======================================================================================
# The Last flag and the message's constant fields (RFC 5041 §4.1, §4.2)
# ======================================================================================


@case(
    "DDP-02",
    "A Send without L, then the next message: Terminate 1/2/0x03",
    rules=("DDP-11",),
    phase=_D,
    sends="the app's first Send with L cleared, then another Send (MSN 2), in one write",
    expects="no delivery; the stack's Terminate for the second message (the first never "
    "ended: MSN range not valid)",
)
async def no_last(ctx: CaseContext) -> Verdict:
    def edit(s: Session, u: bytes) -> Sequence[Item]:
        return [with_last(u, False), first(s, Send(bytes(len(u) - 18)))]

    return await carrier(ctx, edit, what="Send without its Last segment")


@case(
    "DDP-02",
    "A Send whose Last segment never comes: not delivered",
    n=2,
    rules=("DDP-08",),
    phase=_D,
    sends="the app's first Send with L cleared, then nothing",
    expects="no delivery for --silence seconds (the message is not complete; the DUT may "
    "wait or end the stream)",
)
async def never_last(ctx: CaseContext) -> Verdict:
    opened = await open_session(ctx, ready=False)
    if isinstance(opened, Verdict):
        return opened
    s = opened
    await s.send([with_last(s.ulpdus(s.client.opening()[0])[0], False)])
    w = await watch(s, ctx.options.silence)
    if w.deliveries:
        return Verdict.not_met(f"took the message without its Last segment: {w.deliveries[0]}")
    if w.terminate is not None:
        return Verdict.met(
            f"delivered nothing; ended the stream (Terminate, frame {w.terminate[1]})"
        )
    how = "closed" if w.eof is not None else f"waited {ctx.options.silence:g} s"
    return Verdict.met(f"delivered nothing and {how}")


@case(
    "DDP-04",
    "The opcode changes between two segments of one Send: Terminate 0/2/0x06",
    rules=("DDP-11",),
    phase=_D,
    sends="the app's first Send in two segments, the second one with opcode Send-SE",
    expects="no delivery; the stack's Terminate for the second segment",
)
async def opcode_changes(ctx: CaseContext) -> Verdict:
    def edit(s: Session, u: bytes) -> Sequence[Item]:
        one, two = split_send(u, 8)
        return [one, with_opcode(two, Opcode.SEND_SE)]

    return await carrier(ctx, edit, what="opcode change mid-message")


@case(
    "DDP-04",
    "The Invalidate STag field changes between two segments of one Send: Terminate 0/2/0xFF",
    n=2,
    rules=("DDP-11", "RDMAP-03"),
    phase=_D,
    sends="the app's first Send in two segments, the second with RsvdULP[8:39] 0x00C0FFEE",
    expects="no delivery; the stack's Terminate for the second segment (RsvdULP not constant)",
)
async def rsvdulp_changes(ctx: CaseContext) -> Verdict:
    def edit(s: Session, u: bytes) -> Sequence[Item]:
        one, two = split_send(u, 8)
        return [one, set_u32(two, INVAL_AT, 0x00C0FFEE)]

    return await carrier(ctx, edit, what="RsvdULP change mid-message")


@case(
    "DDP-07",
    "A zero-length Write with a bogus STag and TO: not checked",
    rules=("DDP-10",),
    phase=_D,
    sends="a zero-length RDMA Write to STag 0xFFFFFFFF, TO 2^64-1, then the app's first Send",
    expects="both taken (a zero-length segment's STag and TO are not validated): the "
    "application goes on",
)
async def zero_length_bogus(ctx: CaseContext) -> Verdict:
    return await carrier(ctx, lambda s, u: [zero_write(s), u], what="zero-length Write")


@case(
    "DDP-07",
    "A zero-length Write to STag 0: not checked",
    n=2,
    rules=("DDP-10",),
    phase=_D,
    sends="a zero-length RDMA Write to STag 0, TO 0, then the app's first Send",
    expects="both taken: the application goes on",
)
async def zero_length_stag0(ctx: CaseContext) -> Verdict:
    return await carrier(ctx, lambda s, u: [zero_write(s, 0, 0), u], what="zero-length Write")


@case(
    "DDP-01",
    "A ULPDU of 10 octets (shorter than any DDP header): the stream ends",
    rules=("DDP-11",),
    phase=_D,
    sends="an FPDU carrying 10 octets of an untagged DDP header, then the app's first Send",
    expects="no delivery; the stack's Terminate (DDP local catastrophic: RFC 5041 §7.2 has "
    "no code for it, so another cause is a WARN)",
)
async def short_ulpdu(ctx: CaseContext) -> Verdict:
    return await carrier(
        ctx, lambda s, u: [u[:10], u], what="10-octet ULPDU", alternatives=[_ANY_CAUSE]
    )


_ANY_CAUSE = Alternative(
    None,
    "RFC 5041 §7.2 defines no error code for a ULPDU shorter than its header: the stream "
    "ended as it must, with another cause than this stack's",
)

# ======================================================================================
# Tagged placement: the STag, its bounds and its rights (RFC 5041 §7.1, RFC 5042 §6)
# ======================================================================================


def _write(region: Region, to: int, n: int = 8) -> RdmaWrite:
    return RdmaWrite(region.stag, to, bytes(range(n)))


@case(
    "DDP-10",
    "A Write to an STag the app never advertised: Terminate 1/1/0x00",
    n=3,
    rules=("SEC-15", "DDP-11", "RDMAP-12"),
    phase=_D,
    sends="an 8-octet RDMA Write to the advertised region's STag with its key changed",
    expects="nothing placed; the stack's Terminate (Invalid STag) with the Write's DDP header",
)
async def write_bogus(ctx: CaseContext) -> Verdict:
    @needs(_W)
    def items(s: Session, r: Region) -> Sequence[Item]:
        return [RdmaWrite(bogus_stag(r), r.to, bytes(8))]

    return await provoke(await open_session(ctx), items, what="Write to an unknown STag")


@case(
    "DDP-10",
    "A Write far past the advertised region: Terminate 1/1/0x01",
    n=4,
    rules=("SEC-04", "DDP-11"),
    phase=_D,
    sends="an 8-octet RDMA Write at the region's TO + 2^32",
    expects="nothing placed; the stack's Terminate (base or bounds violation)",
)
async def write_far(ctx: CaseContext) -> Verdict:
    @needs(_W)
    def items(s: Session, r: Region) -> Sequence[Item]:
        return [_write(r, r.to + FAR)]

    return await provoke(await open_session(ctx), items, what="Write past the region")


@case(
    "DDP-10",
    "A Write one octet below the advertised region: Terminate 1/1/0x01",
    n=5,
    rules=("SEC-04", "DDP-11"),
    phase=_D,
    sends="an 8-octet RDMA Write at the region's TO - 1",
    expects="nothing placed; the stack's Terminate (base or bounds violation)",
)
async def write_below(ctx: CaseContext) -> Verdict:
    @needs(_W)
    def items(s: Session, r: Region) -> Sequence[Item]:
        return [_write(r, r.to - 1)]

    return await provoke(await open_session(ctx), items, what="Write below the region")


@case(
    "DDP-10",
    "A Write whose TO wraps 2^64: Terminate 1/1/0x03",
    n=6,
    rules=("DDP-11", "SEC-04"),
    phase=_D,
    sends="an 8-octet RDMA Write to the advertised STag at TO 2^64-4",
    expects="nothing placed; the stack's Terminate (TO wrap; base or bounds is a WARN)",
)
async def write_wrap(ctx: CaseContext) -> Verdict:
    @needs(_W)
    def items(s: Session, r: Region) -> Sequence[Item]:
        return [_write(r, WRAP_TO)]

    alt = Alternative(
        TERM_DDP_T_BASE_BOUNDS,
        "the wrapping access is out of bounds too, but "
        "RFC 5041 §7.2 has its own code for a TO wrap",
    )
    return await provoke(await open_session(ctx), items, what="wrapping Write", alternatives=[alt])


@case(
    "DDP-10",
    "A Write to a region without remote write access: Terminate 1/1/0x00",
    n=7,
    rules=("SEC-12", "DDP-11"),
    phase=_D,
    sends="an 8-octet RDMA Write into an advertised read-only region (the KBTP Table)",
    expects="nothing placed; the stack's Terminate (DDP has no access-rights code: Invalid "
    "STag; the RDMAP access-rights code is a WARN)",
)
async def write_readonly(ctx: CaseContext) -> Verdict:
    def items(s: Session) -> Sequence[Item] | Verdict:
        r = s.without(_W)
        if r is None:
            return Verdict.not_applicable(
                "the application advertises no region without remote write access"
            )
        return [_write(r, r.to)]

    alt = Alternative(
        TERM_RDMAP_ACCESS_RIGHTS,
        "the right condition, reported at the RDMAP layer for a tagged DDP segment",
    )
    return await provoke(
        await open_session(ctx), items, what="Write to a read-only region", alternatives=[alt]
    )


@case(
    "DDP-12",
    "A Write with an STag of the DUT's other connection: Terminate 1/1/0x02",
    rules=("SEC-01", "SEC-02", "DDP-11"),
    phase=_D,
    sends="two connections; on the first, an 8-octet RDMA Write to a writable region the "
    "DUT advertised on the second",
    expects="nothing placed; the stack's Terminate (STag not associated with this stream); "
    "SKIP when the app shares one protection domain across connections or serves one",
)
async def write_other_pd(ctx: CaseContext) -> Verdict:
    from stack.conform.cases_sec import foreign_items

    return await foreign_items(
        ctx, _W, what="Write with another connection's STag", build=lambda s, r: [_write(r, r.to)]
    )
