"""RFC 7306 cases with the DUT listening: atomic operations and Immediate Data (RFC 7306
§4-§8).

There is no negotiation bit for RFC 7306: a DUT shows it implements it by answering an
Atomic Request, and shows it does not by refusing the opcode as unknown (Terminate
0/2/0x06, as RFC 5040 requires of an unassigned opcode).  Every case here judges with the
stack's own endpoint (an RFC 7306 stack) and treats 0/2/0x06 where the model says
otherwise as "does not implement RFC 7306": SKIP, with that Terminate as the evidence.
Atomic cases aim at a region the application advertises with remote atomic access (the
bench target; the KBTP Ring, whose Head only takes FetchAdds of 0 here); arithmetic is
checked with the stack's own atomic functions (:mod:`stack.wire.atomics`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from stack.conform.apps import Region
from stack.conform.context import CaseContext
from stack.conform.model import Outcome, Verdict
from stack.conform.provocations import (
    FAR,
    WRAP_TO,
    atomic,
    bogus_stag,
    fetch_add,
    needs,
    read,
)
from stack.conform.registry import case
from stack.conform.session import (
    Alternative,
    Item,
    Session,
    carrier,
    not_7306,
    open_session,
    provoke,
)
from stack.conform.ulpdu import QN_AT, set_u32, with_last
from stack.constants import (
    IMMEDIATE_DATA_LEN,
    TERM_DDP_U_NO_BUFFER,
    TERM_RDMAP_BASE_BOUNDS,
)
from stack.rnic.memory import Access
from stack.wire.atomics import apply_atomic
from stack.wire.events import AtomicRequest, ImmediateData, RdmaWrite

_D = "data"
_A = Access.REMOTE_ATOMIC
_NOT_7306 = (not_7306(),)
_UNDEFINED_AOPCODE = 3
"""An AOpCode RFC 7306 §5.2.1 does not define (0 FetchAdd, 2 CmpSwap, 1 reserved)."""


def _values(*want: int) -> Callable[[Session], Verdict | None]:
    def check(s: Session) -> Verdict | None:
        if s.atomic_values != list(want):
            got = [f"0x{v:X}" for v in s.atomic_values]
            return Verdict.not_met(
                f"original values {got}, expected {[f'0x{v:X}' for v in want]}", rule="EXT-06"
            )
        return Verdict.met(
            f"Atomic Responses in order with original values {[f'0x{v:X}' for v in want]}"
        )

    return check


def _word(s: Session, r: Region) -> int:
    """The 8-aligned TO of the region's first atomic word (the KBTP Ring's Head)."""
    head = getattr(s.client, "ack", None)
    if head is not None and r.stag == head.ring_stag:
        return int(head.head_offset)
    return r.to + (-r.to % 8)


# ======================================================================================
# The probe and the computations (RFC 7306 §5.1, §5.2)
# ======================================================================================


@case(
    "EXT-01",
    "RFC 7306 probe: a FetchAdd of 0 answered (or refused as unknown: not RFC 7306)",
    rules=("EXT-03", "EXT-04"),
    phase=_D,
    sends="a FetchAdd of 0 to the advertised atomic word, or (none advertised) to an STag "
    "the app never advertised",
    expects="an Atomic Response with the word's value (or, no atomic region, the stack's "
    "Terminate 0/1/0x00); 0/2/0x06 means the DUT does not implement RFC 7306 (SKIP)",
)
async def probe(ctx: CaseContext) -> Verdict:
    def items(s: Session) -> Sequence[Item]:
        r = s.region(_A)
        if r is None:
            return [fetch_add(s, bogus_stag(), 0)]
        return [fetch_add(s, r.stag, _word(s, r))]

    return await provoke(
        await open_session(ctx), items, what="FetchAdd of 0", alternatives=_NOT_7306
    )


def _arith(
    n: int,
    title: str,
    sends: str,
    build: Callable[[Session, Region], tuple[list[Item], list[int]]],
    rule: str = "EXT-06",
) -> None:
    @case(
        rule,
        title,
        n=n,
        rules=("EXT-03", "EXT-08"),
        phase=_D,
        sends=sends,
        expects="Atomic Responses in request order with the original values the stack's "
        "atomic functions give; SKIP without a scratch atomic region or without RFC 7306",
    )
    async def body(ctx: CaseContext) -> Verdict:
        want: list[int] = []

        @needs(_A | Access.REMOTE_WRITE, scratch=True)
        def items(s: Session, r: Region) -> Sequence[Item] | Verdict:
            made, values = build(s, r)
            want.extend(values)
            return made

        return await provoke(
            await open_session(ctx),
            items,
            what="atomics",
            alternatives=_NOT_7306,
            check=lambda s: _values(*want)(s),
        )


_K = 0x0123456789ABCDEF


def _init(s: Session, r: Region) -> tuple[int, Item]:
    to = _word(s, r)
    return to, RdmaWrite(r.stag, to, _K.to_bytes(8, "little"))


def _fetch_add_twice(s: Session, r: Region) -> tuple[list[Item], list[int]]:
    to, init = _init(s, r)
    return [init, fetch_add(s, r.stag, to, 5), fetch_add(s, r.stag, to, 0)], [_K, _K + 5]


def _swap(match: bool) -> Callable[[Session, Region], tuple[list[Item], list[int]]]:
    def build(s: Session, r: Region) -> tuple[list[Item], list[int]]:
        to, init = _init(s, r)
        req = AtomicRequest.cmp_swap(0, r.stag, to, _K if match else _K + 1, 0x42)
        after = apply_atomic(req, _K)
        return [init, atomic(s, req), fetch_add(s, r.stag, to, 0)], [_K, after]

    return build


_CARRIES = 0x00FF00FF00FF00FF
"""A value whose every other octet carries when 0x01 is added to each."""


def _masked(s: Session, r: Region) -> tuple[list[Item], list[int]]:
    to = _word(s, r)
    init = RdmaWrite(r.stag, to, _CARRIES.to_bytes(8, "little"))
    req = AtomicRequest.fetch_add(0, r.stag, to, 0x0101010101010101, 0x8080808080808080)
    after = apply_atomic(req, _CARRIES)
    return [init, atomic(s, req), fetch_add(s, r.stag, to, 0)], [_CARRIES, after]


_arith(
    1,
    "FetchAdd: the original value returned, the sum stored",
    "an 8-octet Write of a known value, FetchAdd 5, FetchAdd 0, in one write",
    _fetch_add_twice,
)
_arith(
    2,
    "Compare and Swap that matches: swapped",
    "a Write of a known value, CmpSwap comparing with it, FetchAdd 0",
    _swap(True),
)
_arith(
    3,
    "Compare and Swap that does not match: unchanged",
    "a Write of a known value, CmpSwap comparing with another, FetchAdd 0",
    _swap(False),
)
_arith(
    4,
    "FetchAdd with an Add Mask: carries stop at the mask's boundaries",
    "a Write of a known value, FetchAdd of 0x0101.. with Add Mask 0x8080.., FetchAdd 0",
    _masked,
)


@case(
    "EXT-08",
    "A Write, then a FetchAdd of the same word: the FetchAdd sees the Write",
    rules=("EXT-06", "RDMAP-13"),
    phase=_D,
    sends="an 8-octet RDMA Write and a FetchAdd of 0 to the same word, then a Read of it",
    expects="the Atomic Response carries the written value, and the Read too",
)
async def write_then_atomic(ctx: CaseContext) -> Verdict:
    @needs(_A | Access.REMOTE_WRITE | Access.REMOTE_READ, scratch=True)
    def items(s: Session, r: Region) -> Sequence[Item] | Verdict:
        to, init = _init(s, r)
        return [init, fetch_add(s, r.stag, to, 0), read(s, r.stag, to, 8)]

    def check(s: Session) -> Verdict | None:
        v = _values(_K)(s)
        if v is not None and v.outcome is not Outcome.MET:
            return v
        if bytes(s.read_data[0]) != _K.to_bytes(8, "little"):
            return Verdict.not_met(
                f"the Read returned {bytes(s.read_data[0]).hex()}", rule="RDMAP-13"
            )
        return v

    return await provoke(
        await open_session(ctx),
        items,
        what="Write and FetchAdd",
        alternatives=_NOT_7306,
        check=check,
    )


@case(
    "EXT-03",
    "Two FetchAdds of 0 at once: Atomic Responses in request order",
    rules=("EXT-10",),
    phase=_D,
    sends="two FetchAdds of 0 to the advertised atomic word, in one write",
    expects="two Atomic Responses echoing the Request IDs in order, the same value",
)
async def two_atomics(ctx: CaseContext) -> Verdict:
    @needs(_A)
    def items(s: Session, r: Region) -> Sequence[Item] | Verdict:
        if s.ird is not None and s.ird < 2:
            return Verdict.not_applicable(f"the DUT's IRD is {s.ird}")
        to = _word(s, r)
        return [fetch_add(s, r.stag, to), fetch_add(s, r.stag, to)]

    def check(s: Session) -> Verdict | None:
        if len(s.atomic_values) != 2 or s.atomic_values[0] != s.atomic_values[1]:
            return Verdict.not_met(f"original values {s.atomic_values}", rule="EXT-06")
        return Verdict.met(f"two Atomic Responses in order, value 0x{s.atomic_values[0]:X}")

    return await provoke(
        await open_session(ctx), items, what="two FetchAdds", alternatives=_NOT_7306, check=check
    )


# ======================================================================================
# Refused atomics (RFC 7306 §5.1, §8)
# ======================================================================================


def _bad(
    rule: str,
    n: int,
    title: str,
    sends: str,
    aim: Callable[[Session], Sequence[Item] | Verdict],
    rules: tuple[str, ...] = ("RDMAP-12",),
    alternatives: Sequence[Alternative] = (),
) -> None:
    @case(
        rule,
        title,
        n=n,
        rules=rules,
        phase=_D,
        sends=sends,
        expects="no Atomic Response, nothing changed; the stack's Terminate for it with "
        "the request's DDP header (never R=1, EXT-11); 0/2/0x06: not RFC 7306 (SKIP)",
    )
    async def body(ctx: CaseContext) -> Verdict:
        return await provoke(
            await open_session(ctx),
            aim,
            what="Atomic Request",
            alternatives=(*alternatives, *_NOT_7306),
        )


def _unknown(s: Session) -> Sequence[Item]:
    return [fetch_add(s, bogus_stag(s.region(_A) or (s.regions[0] if s.regions else None)), 0)]


def _no_rights(s: Session) -> Sequence[Item] | Verdict:
    r = s.without(_A)
    if r is None:
        return Verdict.not_applicable(
            "the application advertises no region without remote atomic access"
        )
    return [fetch_add(s, r.stag, r.to + (-r.to % 8))]


@needs(_A)
def _past(s: Session, r: Region) -> Sequence[Item]:
    return [fetch_add(s, r.stag, _word(s, r) + FAR)]


@needs(_A)
def _wrap(s: Session, r: Region) -> Sequence[Item]:
    return [fetch_add(s, r.stag, WRAP_TO)]


@needs(_A)
def _misaligned(s: Session, r: Region) -> Sequence[Item]:
    return [fetch_add(s, r.stag, _word(s, r) + 4)]


@needs(_A)
def _bad_aopcode(s: Session, r: Region) -> Sequence[Item]:
    req = AtomicRequest(_UNDEFINED_AOPCODE, 0, r.stag, _word(s, r), 0)
    return [atomic(s, req)]


_bad(
    "EXT-11",
    1,
    "A FetchAdd to an STag the app never advertised: Terminate 0/1/0x00",
    "a FetchAdd of 0 to an STag the application never advertised",
    _unknown,
    ("SEC-15", "RDMAP-12"),
)
_bad(
    "EXT-11",
    2,
    "A FetchAdd to a region without remote atomic access: Terminate 0/1/0x02",
    "a FetchAdd of 0 to an advertised region without atomic rights (rping's buffer, the "
    "KBTP Table)",
    _no_rights,
    ("SEC-12",),
)
_bad(
    "EXT-11",
    3,
    "A FetchAdd far past the atomic region: Terminate 0/1/0x01",
    "a FetchAdd of 0 at the atomic word's TO + 2^32",
    _past,
    ("SEC-04",),
)
_bad(
    "EXT-11",
    4,
    "A FetchAdd whose TO wraps 2^64: Terminate 0/1/0x04",
    "a FetchAdd of 0 to the atomic STag at TO 2^64-4",
    _wrap,
    ("SEC-04",),
    (
        Alternative(
            TERM_RDMAP_BASE_BOUNDS,
            "out of bounds too, but RFC 7306 §8 uses RFC 5040's TO wrap code",
        ),
    ),
)
_bad(
    "EXT-05",
    1,
    "A FetchAdd to a TO not 8-octet aligned: Terminate 0/2/0x07",
    "a FetchAdd of 0 at the atomic word's TO + 4",
    _misaligned,
    ("EXT-11",),
)
_bad(
    "EXT-04",
    1,
    "An Atomic Request with an undefined AOpCode (3): Terminate 0/2/0x06",
    "an Atomic Request with AOpCode 3 to the atomic word",
    _bad_aopcode,
)


_IRD_OK = Alternative(
    TERM_DDP_U_NO_BUFFER,
    "a request beyond the IRD finds no QN-1 buffer (RFC 5040 §5.2.1, RFC 7306 §5.2.2)",
    means="met",
)


@case(
    "EXT-10",
    "One more Atomic Request at once than the DUT's IRD: Terminate 0/2/0x07",
    rules=("RDMAP-14", "SEC-10"),
    phase=_D,
    sends="IRD + 1 FetchAdds of 0 to the atomic word in one write",
    expects="the last refused with the stack's Terminate (atomics count against the IRD with "
    "Reads; 1/2/0x02 is as good); SKIP without an atomic region or an IRD",
)
async def atomic_ird(ctx: CaseContext) -> Verdict:
    @needs(_A)
    def items(s: Session, r: Region) -> Sequence[Item] | Verdict:
        if s.ird is None:
            return Verdict.not_applicable("the DUT's Reply negotiates no IRD")
        to = _word(s, r)
        return [fetch_add(s, r.stag, to) for _ in range(s.ird + 1)]

    return await provoke(
        await open_session(ctx),
        items,
        what="Atomic Request beyond the IRD",
        alternatives=(_IRD_OK, *_NOT_7306),
    )


# ======================================================================================
# Atomic Request and Immediate Data layout (RFC 7306 §5.2.1, §6.3): carriers
# ======================================================================================


def _form(rule: str, n: int, title: str, sends: str, build: Callable[[Session], bytes]) -> None:
    @case(
        rule,
        title,
        n=n,
        rules=("DDP-11",),
        phase=_D,
        sends=sends + ", then the app's first Send",
        expects="no delivery; the stack's Terminate for it; 0/2/0x06 for the opcode: "
        "not RFC 7306 (SKIP)",
    )
    async def body(ctx: CaseContext) -> Verdict:
        return await carrier(
            ctx,
            lambda s, u: [build(s), u],
            what="malformed RFC 7306 message",
            alternatives=_NOT_7306,
        )


def _imm_form(n: int, size: int) -> None:
    @case(
        "EXT-09",
        f"Immediate Data of {size} octets: Terminate 0/2/0xFF",
        n=n,
        rules=("DDP-11",),
        phase=_D,
        sends=f"an Immediate Data message with {size} octets of data (QN 0's first message), "
        "then the app's first Send",
        expects="no delivery; the stack's Terminate for it; 0/2/0x06 for the opcode: not "
        "RFC 7306 (SKIP)",
    )
    async def body(ctx: CaseContext) -> Verdict:
        def edit(s: Session, u: bytes) -> Sequence[Item]:
            cut = len(u) - IMMEDIATE_DATA_LEN + size
            return [u[:cut] + bytes(max(0, size - IMMEDIATE_DATA_LEN))]

        return await carrier(
            ctx,
            edit,
            what="Immediate Data of the wrong length",
            first=lambda s: ImmediateData(bytes(IMMEDIATE_DATA_LEN)),
            alternatives=_NOT_7306,
        )


def _atomic_u(s: Session) -> bytes:
    return fetch_add(s, bogus_stag(), 0)


_form(
    "EXT-02",
    1,
    "An Atomic Request without L: Terminate 0/2/0xFF",
    "a FetchAdd with L cleared",
    lambda s: with_last(_atomic_u(s), False),
)
_form(
    "EXT-02",
    2,
    "An Atomic Request on QN 0: Terminate 1/2/0x01",
    "a FetchAdd on QN 0",
    lambda s: set_u32(_atomic_u(s), QN_AT, 0),
)
_form(
    "EXT-02",
    3,
    "An Atomic Request cut to 40 octets of its 52-octet header: Terminate 0/2/0xFF",
    "a FetchAdd whose header is 12 octets short",
    lambda s: _atomic_u(s)[:-12],
)
_imm_form(1, 7)
_imm_form(2, 9)
