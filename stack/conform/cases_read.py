"""RDMA Read cases with the DUT listening: Read Request checks, Read Responses to the DUT's
own Reads, the IRD, and the ordering a peer can see (RFC 5040 §4.4, §5.2, §5.5, §6.1, §7.2).

A valid Read of an advertised region must be answered at the runner's sink with exactly
the octets asked for, in request order (the runner's lenient
:class:`~stack.wire.sequence.RequestTracker` checks RDMAP-04 and RDMAP-06); a Write before a
Read of the same octets must be seen by the Read, and a Write after a Read must not
(RFC 5040 §5.5).  Refusals are the stack's own endpoint's answer to the same bytes
(:mod:`stack.conform.oracle`), with the Read Request's header copied into the Terminate
(R=1, RFC 5040 Fig. 10).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from stack.conform.apps import Region
from stack.conform.context import CaseContext
from stack.conform.model import Verdict
from stack.conform.provocations import (
    FAR,
    WRAP_TO,
    bogus_stag,
    needs,
    read,
    zero_read,
)
from stack.conform.registry import case
from stack.conform.session import (
    Alternative,
    Item,
    Session,
    carrier,
    open_session,
    provoke,
)
from stack.conform.ulpdu import MO_AT, TO_AT, set_u32, set_u64, with_last
from stack.constants import (
    DDP_TAGGED_HDR_LEN,
    TERM_DDP_U_NO_BUFFER,
    TERM_RDMAP_BASE_BOUNDS,
)
from stack.rnic.memory import Access
from stack.wire.events import RdmaWrite, ReadResponse

_D = "data"
_R = Access.REMOTE_READ
_RW = Access.REMOTE_READ | Access.REMOTE_WRITE


def _data(index: int, want: bytes, what: str) -> Callable[[Session], Verdict | None]:
    """A check: the ``index``-th Read returned ``want``."""

    def check(s: Session) -> Verdict | None:
        got = bytes(s.read_data[index])
        if got != want:
            return Verdict.not_met(
                f"the Read returned {got[:16].hex()}... ({len(got)} octets), "
                f"expected {want[:16].hex()}... ({len(want)}): {what}",
                rule="RDMAP-13",
            )
        return Verdict.met(f"the Read returned the {len(want)} octets expected: {what}")

    return check


def _sizes(*sizes: int) -> Callable[[Session], Verdict | None]:
    def check(s: Session) -> Verdict | None:
        got = [len(d) for d in s.read_data]
        if got != list(sizes):
            return Verdict.not_met(
                f"Read Responses of {got} octets, {list(sizes)} requested", rule="RDMAP-04"
            )
        return Verdict.met(f"Read Responses of {got} octets at the runner's sinks, in order")

    return check


def _ird_open(s: Session) -> Verdict | None:
    if s.ird == 0:
        return Verdict.not_applicable("the DUT takes no Read Requests (IRD 0)")
    return None


# ======================================================================================
# Valid Reads (RFC 5040 §5.2, §5.2.1)
# ======================================================================================


@case(
    "RDMAP-06",
    "A Read of the advertised region: answered at the runner's sink, the size asked for",
    rules=("RDMAP-04", "RDMAP-05"),
    phase=_D,
    sends="an RDMA Read Request of up to 32 octets of a region with remote read access",
    expects="one Read Response to the runner's Sink STag and TO, of exactly that size; the "
    "application goes on",
)
async def read_valid(ctx: CaseContext) -> Verdict:
    sizes: list[int] = []

    @needs(_R)
    def items(s: Session, r: Region) -> Sequence[Item]:
        sizes.append(min(r.length, 32))
        return [read(s, r.stag, r.to, sizes[0])]

    s = await open_session(ctx)
    return await provoke(s, items, what="Read of the region", check=lambda x: _sizes(*sizes)(x))


@case(
    "RDMAP-06",
    "Three Reads at once: answered in order, each at its own sink",
    n=2,
    rules=("RDMAP-04", "RDMAP-13"),
    phase=_D,
    sends="three RDMA Read Requests of 8, 16 and 24 octets (capped by the region) to "
    "different sinks, in one write",
    expects="three Read Responses in request order, each to its Sink STag and TO with its size",
)
async def reads_in_order(ctx: CaseContext) -> Verdict:
    sizes: list[int] = []

    @needs(_R)
    def items(s: Session, r: Region) -> Sequence[Item] | Verdict:
        if s.ird is not None and s.ird < 3:
            return Verdict.not_applicable(f"the DUT's IRD is {s.ird}: three Reads exceed it")
        sizes.extend(min(r.length, n) for n in (8, 16, 24))
        return [read(s, r.stag, r.to, n, sink=i) for i, n in enumerate(sizes)]

    return await provoke(
        await open_session(ctx), items, what="three Reads", check=lambda x: _sizes(*sizes)(x)
    )


@case(
    "RDMAP-06",
    "A Read of 2048 octets: a Read Response in several segments, in order",
    n=3,
    rules=("DDP-06", "RDMAP-04"),
    phase=_D,
    sends="an RDMA Read Request of 2048 octets (more than one segment) of a region that long",
    expects="the Read Response's segments at consecutive TOs, L on the last, 2048 octets in "
    "all (SKIP when no advertised region is that long)",
)
async def read_segmented(ctx: CaseContext) -> Verdict:
    def items(s: Session) -> Sequence[Item] | Verdict:
        for r in s.regions:
            if r.allows(_R) and r.length >= 2048:
                return [read(s, r.stag, r.to, 2048)]
        seen = "; ".join(r.line() for r in s.regions) or "nothing"
        return Verdict.not_applicable(
            f"no region with remote read access of 2048 octets or more (advertised: {seen})"
        )

    return await provoke(await open_session(ctx), items, what="2048-octet Read", check=_sizes(2048))


@case(
    "RDMAP-07",
    "A zero-length Read with a bogus source STag: a zero-length Read Response",
    rules=("RDMAP-06",),
    phase=_D,
    sends="a zero-length RDMA Read Request from STag 0x5A5A5A01",
    expects="a zero-length Read Response to the runner's sink (the source is not validated); "
    "SKIP for a DUT with IRD 0",
)
async def zero_read_bogus(ctx: CaseContext) -> Verdict:
    def items(s: Session) -> Sequence[Item] | Verdict:
        return _ird_open(s) or [zero_read(s)]

    return await provoke(await open_session(ctx), items, what="zero-length Read", check=_sizes(0))


@case(
    "RDMAP-07",
    "A zero-length Read whose source TO would wrap: a zero-length Read Response",
    n=2,
    rules=("RDMAP-06",),
    phase=_D,
    sends="a zero-length RDMA Read Request from STag 0, TO 2^64-1",
    expects="a zero-length Read Response (no bounds or wrap check for zero octets)",
)
async def zero_read_wrap(ctx: CaseContext) -> Verdict:
    def items(s: Session) -> Sequence[Item] | Verdict:
        return _ird_open(s) or [zero_read(s, 0, (1 << 64) - 1)]

    return await provoke(await open_session(ctx), items, what="zero-length Read", check=_sizes(0))


# ======================================================================================
# Read Request source checks (RFC 5040 §7.2, RFC 5042 §6)
# ======================================================================================


def _bad_read(
    n: int,
    title: str,
    sends: str,
    aim: Callable[[Session, Region], tuple[int, int]],
    rules: tuple[str, ...],
    alternatives: Sequence[Alternative] = (),
) -> None:
    @case(
        "RDMAP-16",
        title,
        n=n,
        rules=(*rules, "RDMAP-12"),
        phase=_D,
        sends=sends,
        expects="no Read Response; the stack's Terminate (remote protection error) with the "
        "Read Request's DDP and RDMA headers copied (R=1)",
    )
    async def body(ctx: CaseContext) -> Verdict:
        @needs(_R)
        def items(s: Session, r: Region) -> Sequence[Item] | Verdict:
            stag, to = aim(s, r)
            return _ird_open(s) or [read(s, stag, to, 8)]

        return await provoke(
            await open_session(ctx), items, what="bad Read Request", alternatives=alternatives
        )


_bad_read(
    6,
    "A Read from an STag the app never advertised: Terminate 0/1/0x00",
    "an 8-octet RDMA Read Request from the advertised STag with its key changed",
    lambda s, r: (bogus_stag(r), r.to),
    ("SEC-15",),
)
_bad_read(
    7,
    "A Read far past the advertised region: Terminate 0/1/0x01",
    "an 8-octet RDMA Read Request at the region's TO + 2^32",
    lambda s, r: (r.stag, r.to + FAR),
    ("SEC-04",),
)
_bad_read(
    8,
    "A Read one octet below the advertised region: Terminate 0/1/0x01",
    "an 8-octet RDMA Read Request at the region's TO - 1",
    lambda s, r: (r.stag, r.to - 1),
    ("SEC-04",),
)
_bad_read(
    9,
    "A Read whose source TO wraps 2^64: Terminate 0/1/0x04",
    "an 8-octet RDMA Read Request from the advertised STag at TO 2^64-4",
    lambda s, r: (r.stag, WRAP_TO),
    ("SEC-04",),
    (
        Alternative(
            TERM_RDMAP_BASE_BOUNDS,
            "the wrapping Read is out of bounds too, but "
            "RFC 5040 §7.2 has its own code for a TO wrap",
        ),
    ),
)


@case(
    "RDMAP-16",
    "A Read from a region without remote read access: Terminate 0/1/0x02",
    n=10,
    rules=("SEC-12", "RDMAP-12"),
    phase=_D,
    sends="an 8-octet RDMA Read Request from an advertised write-only region (the KBTP Partition)",
    expects="no Read Response; the stack's Terminate (access rights violation), R=1",
)
async def read_no_rights(ctx: CaseContext) -> Verdict:
    def items(s: Session) -> Sequence[Item] | Verdict:
        r = s.without(_R)
        if r is None:
            return Verdict.not_applicable(
                "the application advertises no region without remote read access"
            )
        return _ird_open(s) or [read(s, r.stag, r.to, 8)]

    return await provoke(await open_session(ctx), items, what="Read of a write-only region")


# ======================================================================================
# Read Request layout (RFC 5040 §4.4): single segment, exact header
# ======================================================================================


def _form(n: int, title: str, sends: str, edit: Callable[[bytes], bytes]) -> None:
    @case(
        "RDMAP-04",
        title,
        n=n,
        rules=("RDMAP-06", "DDP-11"),
        phase=_D,
        sends=sends + ", then the app's first Send",
        expects="no delivery; the stack's Terminate for the Read Request",
    )
    async def body(ctx: CaseContext) -> Verdict:
        return await carrier(ctx, lambda s, u: [edit(zero_read(s)), u], what="malformed Read")


_form(
    1,
    "A Read Request without L: Terminate 0/2/0xFF",
    "a zero-length Read Request with L cleared",
    lambda u: with_last(u, False),
)
_form(
    2,
    "A Read Request with MO 4: Terminate 1/2/0x04",
    "a zero-length Read Request with MO 4",
    lambda u: set_u32(u, MO_AT, 4),
)
_form(
    3,
    "A Read Request cut to 20 octets of its 28-octet header: Terminate 0/2/0xFF",
    "a Read Request whose RDMAP header is 20 octets",
    lambda u: u[:-8],
)
_form(
    4,
    "A Read Request with 4 octets after its header: Terminate 1/2/0x05",
    "a zero-length Read Request followed by 4 extra octets",
    lambda u: u + bytes(4),
)


# ======================================================================================
# Read Responses to the DUT's own Read (RFC 5040 §4.4, §5.2.2): rping
# ======================================================================================


def _dut_read(s: Session) -> ReadResponse | Verdict:
    """The Read Response the application waits for (rping's RDMA Read of our buffer)."""
    for message in s.pending:
        if isinstance(message, ReadResponse):
            return message
    return Verdict.not_applicable(
        f"the {s.ctx.app.name} application issues no RDMA Read of its own"
    )


def _response(
    n: int,
    title: str,
    sends: str,
    edit: Callable[[Session, ReadResponse], Sequence[Item]],
    expects: str,
    rules: tuple[str, ...] = ("DDP-11", "RDMAP-12"),
) -> None:
    @case(
        "RDMAP-04", title, n=n, rules=rules, phase=_D, sends=sends, expects=expects, apps=("rping",)
    )
    async def body(ctx: CaseContext) -> Verdict:
        def items(s: Session) -> Sequence[Item] | Verdict:
            rr = _dut_read(s)
            if isinstance(rr, Verdict):
                return rr
            assert s.conv is not None
            s.conv.pending = [m for m in s.conv.pending if m is not rr]
            return edit(s, rr)

        return await provoke(await open_session(ctx), items, what="Read Response")


def _two_segments(s: Session, rr: ReadResponse) -> list[Item]:
    u = s.ulpdus(rr)[0]
    cut = DDP_TAGGED_HDR_LEN + len(rr.data) // 2
    one = with_last(u[:cut], False)
    two = set_u64(u[:DDP_TAGGED_HDR_LEN] + u[cut:], TO_AT, rr.to + len(rr.data) // 2)
    return [one, two]


_response(
    5,
    "A Read Response to another sink STag: Terminate 1/1/0x00",
    "the Read Response the rping server waits for, to its Sink STag with the key changed",
    lambda s, rr: [ReadResponse(rr.stag ^ 0x80, rr.to, rr.data)],
    "nothing placed; the stack's Terminate (Invalid STag: not the Read's sink)",
)
_response(
    6,
    "A Read Response at a wrong sink TO: Terminate 1/1/0x01",
    "the Read Response the rping server waits for, at its Sink TO + 8",
    lambda s, rr: [ReadResponse(rr.stag, rr.to + 8, rr.data)],
    "nothing placed; the stack's Terminate (base or bounds violation)",
)
_response(
    7,
    "A Read Response longer than the Read: Terminate 1/1/0x01",
    "the Read Response the rping server waits for, with 8 octets more",
    lambda s, rr: [ReadResponse(rr.stag, rr.to, bytes(rr.data) + bytes(8))],
    "nothing placed past the sink; the stack's Terminate (base or bounds)",
)
_response(
    8,
    "A Read Response shorter than the Read: Terminate 0/2/0xFF",
    "the Read Response the rping server waits for, 8 octets short",
    lambda s, rr: [ReadResponse(rr.stag, rr.to, bytes(rr.data)[:-8])],
    "the Read not completed; the stack's Terminate (the response ended early)",
)
_response(
    9,
    "A Read Response in two segments: placed whole",
    "the Read Response the rping server waits for, in two segments (L on the second)",
    _two_segments,
    "the data placed: the application goes on",
    rules=("DDP-06",),
)


@case(
    "RDMAP-04",
    "A Read Response nobody asked for: Terminate 1/1/0x00",
    n=10,
    rules=("DDP-11", "RDMAP-05"),
    phase=_D,
    sends="an 8-octet Read Response to STag 0x5A5A5A01 before the app's first Send",
    expects="nothing placed, no delivery; the stack's Terminate (no Read outstanding: "
    "Invalid STag)",
)
async def unsolicited(ctx: CaseContext) -> Verdict:
    return await carrier(
        ctx,
        lambda s, u: [s.ulpdus(ReadResponse(bogus_stag(), 0, bytes(8)))[0], u],
        what="unsolicited Read Response",
    )


# ======================================================================================
# IRD (RFC 5040 §6.1, RFC 6581 §9.1)
# ======================================================================================

IRD_ALTERNATIVES = (
    Alternative(
        TERM_DDP_U_NO_BUFFER,
        "RFC 5040 §5.2.1: a Read Request beyond the IRD finds "
        "no QN-1 buffer, which RFC 5041 reports as 'no buffer available'",
        means="met",
    ),
)


@case(
    "RDMAP-14",
    "One more Read Request at once than the DUT's IRD: Terminate 0/2/0x07",
    rules=("SEC-10", "RDMAP-12"),
    phase=_D,
    sends="IRD + 1 zero-length RDMA Read Requests in one write (IRD from the DUT's Reply)",
    expects="the first IRD answered (or not), the last refused with the stack's Terminate "
    "(catastrophic, localized to the stream; 1/2/0x02, the RFC's 'no buffer', is as good); "
    "SKIP without an IRD",
)
async def ird_overflow(ctx: CaseContext) -> Verdict:
    def items(s: Session) -> Sequence[Item] | Verdict:
        if s.ird is None:
            return Verdict.not_applicable("the DUT's Reply negotiates no IRD")
        return [zero_read(s) for _ in range(s.ird + 1)]

    s = await open_session(ctx)
    allow = 0 if isinstance(s, Verdict) else (s.ird or 0)
    return await provoke(
        s, items, what="Read beyond the IRD", alternatives=IRD_ALTERNATIVES, allow=allow
    )


@case(
    "RDMAP-14",
    "As many Read Requests at once as the DUT's IRD: all answered",
    n=2,
    rules=("RDMAP-06",),
    phase=_D,
    sends="IRD zero-length RDMA Read Requests in one write",
    expects="IRD zero-length Read Responses, in order; SKIP without an IRD or with IRD 0",
)
async def ird_full(ctx: CaseContext) -> Verdict:
    count: list[int] = []

    def items(s: Session) -> Sequence[Item] | Verdict:
        if not s.ird:
            return Verdict.not_applicable(f"the DUT's IRD is {s.ird}")
        count.append(s.ird)
        return [zero_read(s) for _ in range(s.ird)]

    return await provoke(
        await open_session(ctx),
        items,
        what="IRD Reads",
        check=lambda x: _sizes(*([0] * count[0]))(x),
    )


# ======================================================================================
# Ordering a peer can see (RFC 5040 §5.5)
# ======================================================================================

_A = bytes(range(0x40, 0x50))
_B = bytes(range(0x70, 0x80))


@case(
    "RDMAP-13",
    "A Write, then a Read of the same octets: the Read returns the Write's data",
    rules=("RDMAP-05", "DDP-08"),
    phase=_D,
    sends="a 16-octet RDMA Write and an RDMA Read of those octets, in one write, to a region "
    "with remote read and write the runner may change",
    expects="the Read Response carries the written octets (the Write is placed before the "
    "later Read is served)",
)
async def write_then_read(ctx: CaseContext) -> Verdict:
    @needs(_RW, scratch=True)
    def items(s: Session, r: Region) -> Sequence[Item] | Verdict:
        if r.length < len(_A):
            return Verdict.not_applicable(f"the region has {r.length} octets, fewer than 16")
        return [RdmaWrite(r.stag, r.to, _A), read(s, r.stag, r.to, len(_A))]

    return await provoke(
        await open_session(ctx),
        items,
        what="Write then Read",
        check=_data(0, _A, "the Write's octets"),
    )


@case(
    "RDMAP-13",
    "Write A, Read, Write B, Read: each Read sees only the Writes before it",
    n=2,
    rules=("RDMAP-05",),
    phase=_D,
    sends="RDMA Write of 16 octets A, Read of them, Write of B over them, Read again, in one write",
    expects="the first Read Response carries A, the second B (a later Write never shows "
    "through an earlier Read)",
)
async def write_read_write_read(ctx: CaseContext) -> Verdict:
    @needs(_RW, scratch=True)
    def items(s: Session, r: Region) -> Sequence[Item] | Verdict:
        if r.length < len(_A):
            return Verdict.not_applicable(f"the region has {r.length} octets, fewer than 16")
        if s.ird is not None and s.ird < 2:
            return Verdict.not_applicable(f"the DUT's IRD is {s.ird}: two Reads exceed it")
        return [
            RdmaWrite(r.stag, r.to, _A),
            read(s, r.stag, r.to, 16),
            RdmaWrite(r.stag, r.to, _B),
            read(s, r.stag, r.to, 16, sink=1),
        ]

    def check(s: Session) -> Verdict | None:
        first = _data(0, _A, "the first Read")(s)
        if first is not None and first.outcome.value != "met":
            return first
        return _data(1, _B, "the second Read")(s)

    return await provoke(await open_session(ctx), items, what="Writes and Reads", check=check)


@case(
    "RDMAP-05",
    "A Write in two tagged segments: placed whole (read back)",
    rules=("DDP-06", "RDMAP-13"),
    phase=_D,
    sends="a 16-octet RDMA Write in two segments (TO, TO + 8; L on the second), then a Read",
    expects="the Read Response carries the 16 octets",
)
async def write_two_segments(ctx: CaseContext) -> Verdict:
    @needs(_RW, scratch=True)
    def items(s: Session, r: Region) -> Sequence[Item] | Verdict:
        if r.length < len(_B):
            return Verdict.not_applicable(f"the region has {r.length} octets, fewer than 16")
        u = s.ulpdus(RdmaWrite(r.stag, r.to, _B))[0]
        cut = DDP_TAGGED_HDR_LEN + 8
        one = with_last(u[:cut], False)
        two = set_u64(u[:DDP_TAGGED_HDR_LEN] + u[cut:], TO_AT, r.to + 8)
        return [one, two, read(s, r.stag, r.to, 16)]

    return await provoke(
        await open_session(ctx),
        items,
        what="two-segment Write",
        check=_data(0, _B, "both segments"),
    )
