"""Data-phase cases with the DUT connecting (``iwarp conform --listen``): the runner is the
MPA Responder and plays the application's server (RFC 5044 §4, §8; RFC 5041 §7; RFC 5040
§5.2, §6.2, §7).

The runner answers the DUT's Request with the responder engine's valid Reply and waits for
the DUT's application to advertise its buffer (``rping -c`` Sends its start buffer's STag,
TO and length, with remote read and write access); then it sends one provocation.  What a
conforming DUT does is the stack's own endpoint's answer, set up as the same initiator
(:mod:`stack.conform.oracle`); a valid provocation must be answered and the application
must go on (the runner then plays the rest of rping's server).
"""

from __future__ import annotations

from collections.abc import Sequence

from stack.conform.context import CaseContext
from stack.conform.model import DutRole, Verdict
from stack.conform.peer_core import Craft
from stack.conform.provocations import FAR, Builder, bogus_stag, needs, read, zero_read
from stack.conform.registry import case
from stack.conform.session import Item, Session, accept_session, provoke
from stack.conform.ulpdu import with_dv, with_rv
from stack.constants import TERM_RDMAP_OP_UNSPECIFIED
from stack.rnic.memory import Access
from stack.wire.events import RdmaWrite
from stack.wire.terminate import build_terminate

_D = "data"
_C = DutRole.CONNECTS
_R, _W = Access.REMOTE_READ, Access.REMOTE_WRITE


def _connect_case(
    rule: str,
    n: int,
    title: str,
    sends: str,
    expects: str,
    rules: tuple[str, ...],
    build: Builder,
    *,
    right: Access = _R,
    what: str = "provocation",
    live: bool = True,
) -> None:
    """One DUT-connecting case: ``build(session, region)`` gives the items to send."""

    @case(rule, title, n=n, rules=rules, phase=_D, dut=_C, sends=sends, expects=expects)
    async def body(ctx: CaseContext) -> Verdict:
        return await provoke(await accept_session(ctx), needs(right)(build), what=what, live=live)


_REFUSED = "no delivery; the stack's Terminate for it, as an initiator with the DUT's Request"
_connect_case(
    "MPA-12",
    7,
    "FPDU with a bad CRC to a connecting DUT: Terminate 2/0/0x02",
    "once the DUT's rping advertised its start buffer, a Read Request of it with its CRC flipped",
    _REFUSED + " (MPA CRC error)",
    ("MPA-28",),
    lambda s, r: [(read(s, r.stag, r.to, 8), Craft(bad_crc=True))],
    what="FPDU with a bad CRC",
)
_connect_case(
    "DDP-03",
    8,
    "DV 0 on the runner's Read Request to a connecting DUT: Terminate 1/2/0x06",
    "a Read Request of the advertised buffer with DDP version 0",
    _REFUSED + " (Invalid DDP version)",
    ("DDP-11",),
    lambda s, r: [with_dv(read(s, r.stag, r.to, 8), 0)],
    what="Read Request with DV 0",
)
_connect_case(
    "RDMAP-02",
    11,
    "RV 0 on the runner's Read Request to a connecting DUT: Terminate 0/2/0x05",
    "a Read Request of the advertised buffer with RDMAP version 0",
    _REFUSED + " (Invalid RDMAP version)",
    ("RDMAP-16",),
    lambda s, r: [with_rv(read(s, r.stag, r.to, 8), 0)],
    what="Read Request with RV 0",
)
_connect_case(
    "RDMAP-16",
    11,
    "A Read from an STag a connecting DUT never advertised: Terminate 0/1/0x00",
    "an 8-octet Read Request from the start buffer's STag with its key changed",
    _REFUSED + " (Invalid STag), R=1",
    ("SEC-15", "RDMAP-12"),
    lambda s, r: [read(s, bogus_stag(r), r.to, 8)],
    what="bad Read",
)
_connect_case(
    "RDMAP-16",
    12,
    "A Read past a connecting DUT's start buffer: Terminate 0/1/0x01",
    "an 8-octet Read Request at the start buffer's TO + 2^32",
    _REFUSED + " (base or bounds), R=1",
    ("SEC-04",),
    lambda s, r: [read(s, r.stag, r.to + FAR, 8)],
    what="bad Read",
)
_connect_case(
    "DDP-10",
    8,
    "A Write to an STag a connecting DUT never advertised: Terminate 1/1/0x00",
    "an 8-octet RDMA Write to the start buffer's STag with its key changed",
    _REFUSED + " (Invalid STag)",
    ("SEC-15",),
    lambda s, r: [RdmaWrite(bogus_stag(r), r.to, bytes(8))],
    right=_W,
    what="bad Write",
)
_connect_case(
    "DDP-10",
    9,
    "A Write past a connecting DUT's start buffer: Terminate 1/1/0x01",
    "an 8-octet RDMA Write at the start buffer's TO + 2^32",
    _REFUSED + " (base or bounds)",
    ("SEC-04",),
    lambda s, r: [RdmaWrite(r.stag, r.to + FAR, bytes(8))],
    right=_W,
    what="bad Write",
)
_connect_case(
    "RDMAP-06",
    4,
    "A Read of a connecting DUT's start buffer: answered, then the app goes on",
    "an 8-octet Read Request of the advertised start buffer",
    "a Read Response of 8 octets to the runner's sink; then rping's exchange works",
    ("RDMAP-04",),
    lambda s, r: [read(s, r.stag, r.to, 8)],
    what="Read of the start buffer",
)
_connect_case(
    "RDMAP-07",
    3,
    "A zero-length Read with a bogus STag to a connecting DUT: a zero-length Read Response",
    "a zero-length Read Request from STag 0x5A5A5A01",
    "a zero-length Read Response; then rping's exchange works",
    ("RDMAP-06",),
    lambda s, r: [zero_read(s)],
    what="zero-length Read",
)


@case(
    "RDMAP-15",
    "A Terminate to a connecting DUT: it stops and closes",
    n=3,
    rules=("RDMAP-10",),
    phase=_D,
    dut=_C,
    sends="once the DUT's rping advertised its start buffer, Terminate 0/2/0xFF",
    expects="nothing more delivered or sent (at most one Terminate), then a graceful close",
)
async def connect_terminate(ctx: CaseContext) -> Verdict:
    from stack.conform.cases_rdmap import judge_stopped

    s = await accept_session(ctx)
    if isinstance(s, Verdict):
        return s
    await s.send([build_terminate(TERM_RDMAP_OP_UNSPECIFIED, None)])
    return await judge_stopped(s)


@case(
    "RDMAP-14",
    "IRD + 1 Read Requests to a connecting DUT: Terminate 0/2/0x07",
    n=3,
    rules=("SEC-10",),
    phase=_D,
    dut=_C,
    sends="IRD + 1 zero-length Read Requests in one write (IRD from the DUT's Request)",
    expects="the last refused with the stack's Terminate (1/2/0x02 is as good); SKIP without "
    "an IRD",
)
async def connect_ird(ctx: CaseContext) -> Verdict:
    from stack.conform.cases_read import IRD_ALTERNATIVES

    def items(s: Session) -> Sequence[Item] | Verdict:
        if s.ird is None:
            return Verdict.not_applicable("the DUT's Request negotiates no IRD")
        return [zero_read(s) for _ in range(s.ird + 1)]

    return await provoke(
        await accept_session(ctx), items, what="Read beyond the IRD", alternatives=IRD_ALTERNATIVES
    )


@case(
    "MPA-15",
    "The runner's first FPDU to a connecting DUT cut in three segments: reassembled",
    n=6,
    rules=("MPA-16",),
    phase=_D,
    dut=_C,
    sends="once the DUT's rping advertised its start buffer, rping's RDMA Read of it in three "
    "TCP segments (cut after 1 and 10 octets)",
    expects="the Read answered: the application goes on",
)
async def connect_split(ctx: CaseContext) -> Verdict:
    from stack.conform.expected import work_verdict
    from stack.conform.script import converse

    s = await accept_session(ctx)
    if isinstance(s, Verdict):
        return s
    pending = s.pending
    if not pending:
        return Verdict.not_applicable("the application's server has nothing to send first")
    ulpdus = s.peer.core.ulpdus(pending[0])
    await s.peer.send_split([(ulpdus[0], None)], [1, 10], 0.02)
    conv = await converse(ctx, s.peer, client=s.client, opening=pending[1:], absorb=s.absorb)
    return work_verdict(conv, "the first FPDU split in three")
