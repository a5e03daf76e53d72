"""RDMAP data-phase cases with the DUT listening: versions, opcodes, queues, Sends and their
receives, Send with Invalidate, and Terminates the DUT receives (RFC 5040 §4, §5.3, §5.4,
§6.2, §7).

Header cases edit the application's first Send or put a crafted message in front of it
(its delivery is the evidence); what a conforming DUT does is the stack's own endpoint's
answer to the same bytes (:mod:`stack.conform.oracle`).  A DUT that receives a Terminate
must stop: deliver nothing more, send nothing but possibly its own Terminate, and close
the connection gracefully (RDMAP-10, RDMAP-15).
"""

from __future__ import annotations

from collections.abc import Sequence

from stack.conform.context import CaseContext
from stack.conform.expect import expect_close
from stack.conform.model import Outcome, Verdict
from stack.conform.provocations import bogus_stag, first, zero_read, zero_write
from stack.conform.registry import case
from stack.conform.session import (
    Alternative,
    Item,
    Session,
    carrier,
    open_session,
    watch,
)
from stack.conform.ulpdu import INVAL_AT, QN_AT, ctrl, set_u32, with_opcode, with_rv
from stack.constants import (
    RDMAP_RSVD_MASK,
    TERM_DDP_U_NO_BUFFER,
    TERM_RDMAP_OP_CANNOT_INVALIDATE,
    TERM_RDMAP_OP_UNSPECIFIED,
    Opcode,
)
from stack.wire.events import Send, Terminate
from stack.wire.terminate import build_terminate

_D = "data"

# ======================================================================================
# RDMAP version and opcodes (RFC 5040 §4.1, §4.2, §7.2)
# ======================================================================================


def _rv(rv: int, n: int) -> None:
    @case(
        "RDMAP-02",
        f"RV {rv} on the app's first Send: Terminate 0/2/0x05",
        n=n,
        rules=("RDMAP-16", "RDMAP-12"),
        phase=_D,
        sends=f"the app's first Send with RDMAP version {rv}",
        expects="no delivery; the stack's Terminate (Invalid RDMAP version) with the Send's "
        "DDP header",
    )
    async def body(ctx: CaseContext) -> Verdict:
        return await carrier(ctx, lambda s, u: [with_rv(u, rv)], what=f"Send with RV {rv}")


for _n, _v in ((2, 0), (3, 2), (4, 3)):
    _rv(_v, _n)


@case(
    "RDMAP-02",
    "RV 0 on a zero-length Write: Terminate 0/2/0x05",
    n=5,
    rules=("RDMAP-16",),
    phase=_D,
    sends="a zero-length RDMA Write with RDMAP version 0, then the app's first Send",
    expects="no delivery; the stack's Terminate (Invalid RDMAP version)",
)
async def rv_tagged(ctx: CaseContext) -> Verdict:
    return await carrier(ctx, lambda s, u: [with_rv(zero_write(s), 0), u], what="Write with RV 0")


@case(
    "RDMAP-02",
    "Reserved RDMAP control bits on a zero-length Write: not checked",
    n=6,
    phase=_D,
    sends="a zero-length RDMA Write with the RDMAP reserved bits (0x30) set, then the app's "
    "first Send",
    expects="both taken: the application goes on",
)
async def rsvd_tagged(ctx: CaseContext) -> Verdict:
    return await carrier(
        ctx,
        lambda s, u: [ctrl(zero_write(s), set_bits=RDMAP_RSVD_MASK, byte=1), u],
        what="Write with reserved RDMAP bits",
    )


def _t_mismatch(n: int, title: str, sends: str, build: str) -> None:
    @case(
        "RDMAP-02",
        f"{title}: Terminate 0/2/0x06",
        n=n,
        rules=("RDMAP-16",),
        phase=_D,
        sends=sends,
        expects="no delivery; the stack's Terminate for it (Unexpected OpCode)",
    )
    async def body(ctx: CaseContext) -> Verdict:
        def edit(s: Session, u: bytes) -> Sequence[Item]:
            if build == "send-tagged":
                return [with_opcode(zero_write(s), Opcode.SEND), u]
            if build == "read-tagged":
                return [with_opcode(zero_write(s), Opcode.RDMA_READ_REQUEST), u]
            if build == "write-untagged":
                return [with_opcode(u, Opcode.RDMA_WRITE)]
            return [with_opcode(u, Opcode.RDMA_READ_RESPONSE)]

        return await carrier(ctx, edit, what=title[0].lower() + title[1:])


_t_mismatch(
    7,
    "The Send opcode in a tagged segment",
    "a tagged zero-length segment with opcode Send (0x3), then the app's first Send",
    "send-tagged",
)
_t_mismatch(
    8,
    "The Read Request opcode in a tagged segment",
    "a tagged zero-length segment with opcode Read Request (0x1), then the app's first Send",
    "read-tagged",
)
_t_mismatch(
    9,
    "The Write opcode in an untagged segment",
    "the app's first Send with opcode RDMA Write (0x0)",
    "write-untagged",
)
_t_mismatch(
    10,
    "The Read Response opcode in an untagged segment",
    "the app's first Send with opcode Read Response (0x2)",
    "rr-untagged",
)


def _unassigned(op: int, n: int, tagged: bool = False) -> None:
    where = "a tagged zero-length segment" if tagged else "the app's first Send"

    @case(
        "RDMAP-16",
        f"Opcode 0x{op:X} (not assigned) in {where}: Terminate 0/2/0x06",
        n=n,
        rules=("RDMAP-02", "RDMAP-12"),
        phase=_D,
        sends=f"{where} with opcode 0x{op:X}" + (", then the app's first Send" if tagged else ""),
        expects="no delivery; the stack's Terminate (Unexpected OpCode)",
    )
    async def body(ctx: CaseContext) -> Verdict:
        def edit(s: Session, u: bytes) -> Sequence[Item]:
            if tagged:
                return [with_opcode(zero_write(s), op), u]
            return [with_opcode(u, op)]

        return await carrier(ctx, edit, what=f"opcode 0x{op:X}")


for _n, _op in enumerate((0xC, 0xD, 0xE, 0xF), 1):
    _unassigned(_op, _n)
_unassigned(0xC, 5, tagged=True)

# ======================================================================================
# Queue numbers per opcode (RFC 5040 §3.1)
# ======================================================================================


def _qn(qn: int, n: int) -> None:
    @case(
        "RDMAP-01",
        f"A Send on QN {qn}: Terminate 1/2/0x01",
        n=n,
        rules=("DDP-10",),
        phase=_D,
        sends=f"the app's first Send with QN {qn}",
        expects="no delivery; the stack's Terminate (Invalid QN: the QN does not match the opcode)",
    )
    async def body(ctx: CaseContext) -> Verdict:
        return await carrier(ctx, lambda s, u: [set_u32(u, QN_AT, qn)], what=f"Send on QN {qn}")


for _n, _q in ((1, 1), (2, 2), (3, 3)):
    _qn(_q, _n)


@case(
    "RDMAP-01",
    "A Read Request on QN 0: Terminate 1/2/0x01",
    n=4,
    rules=("DDP-10",),
    phase=_D,
    sends="a zero-length Read Request on QN 0, then the app's first Send",
    expects="no delivery; the stack's Terminate (Invalid QN)",
)
async def read_qn0(ctx: CaseContext) -> Verdict:
    return await carrier(
        ctx, lambda s, u: [set_u32(zero_read(s), QN_AT, 0), u], what="Read Request on QN 0"
    )


# ======================================================================================
# The Invalidate STag field (RFC 5040 §4.1, §5.3)
# ======================================================================================


@case(
    "RDMAP-03",
    "A Send (not Send with Invalidate) with a non-zero Invalidate STag field: ignored",
    phase=_D,
    sends="the app's first Send with RsvdULP[8:39] 0x12345678",
    expects="the Send delivered, nothing invalidated: the application goes on",
)
async def send_inval_field(ctx: CaseContext) -> Verdict:
    return await carrier(
        ctx,
        lambda s, u: [set_u32(u, INVAL_AT, 0x12345678)],
        what="Send with an Invalidate STag field",
    )


@case(
    "RDMAP-03",
    "A zero-length Read Request with a non-zero Invalidate STag field: ignored",
    n=2,
    rules=("RDMAP-07",),
    phase=_D,
    sends="a zero-length Read Request with RsvdULP[8:39] 0x12345678, then the app's first Send",
    expects="a zero-length Read Response and the Send delivered (SKIP for a DUT with IRD 0)",
)
async def read_inval_field(ctx: CaseContext) -> Verdict:
    def edit(s: Session, u: bytes) -> Sequence[Item] | Verdict:
        if s.ird == 0:
            return Verdict.not_applicable("the DUT takes no Read Requests (IRD 0)")
        return [set_u32(zero_read(s), INVAL_AT, 0x12345678), u]

    return await carrier(ctx, edit, what="Read Request with an Invalidate STag field")


@case(
    "RDMAP-09",
    "Send with Invalidate of an STag the app never advertised: Terminate 0/1/0x09",
    rules=("SEC-06", "RDMAP-12"),
    phase=_D,
    sends="the app's first Send as Send with Invalidate (opcode 0x4) of STag 0x5A5A5A01",
    expects="no delivery; the stack's Terminate (STag cannot be invalidated, remote "
    "protection; the remote-operation code 0/2/0x09 is as good)",
)
async def invalidate_unknown(ctx: CaseContext) -> Verdict:
    def edit(s: Session, u: bytes) -> Sequence[Item]:
        return [set_u32(with_opcode(u, Opcode.SEND_INVALIDATE), INVAL_AT, bogus_stag())]

    return await carrier(
        ctx,
        edit,
        what="Send with Invalidate of an unknown STag",
        alternatives=INVALIDATE_ALTERNATIVES,
    )


INVALIDATE_ALTERNATIVES = (
    Alternative(
        TERM_RDMAP_OP_CANNOT_INVALIDATE,
        "RFC 5040 §7.2 lists 'cannot invalidate' "
        "under both remote protection and remote operation errors",
        means="met",
    ),
)

# ======================================================================================
# Sends and receive buffers (RFC 5040 §5.3, RFC 5041 §7.2)
# ======================================================================================

TOO_LONG_ALTERNATIVES = (
    Alternative(
        TERM_DDP_U_NO_BUFFER,
        "a Send longer than the receive is refused with 'no "
        "buffer available' (1/2/0x02) where RFC 5041 §7.2 has 'message too long for "
        "the available buffer' (1/2/0x05): the stream ends as it must, the code names "
        "the wrong condition",
        rule="DDP-11",
        level="SHOULD",
    ),
)


@case(
    "RDMAP-08",
    "A Send longer than the posted receive: Terminate 1/2/0x05",
    rules=("DDP-11", "RDMAP-12"),
    phase=_D,
    sends="a Send one octet longer than the app's receives, then the app's first Send",
    expects="no delivery; the stack's Terminate (message too long for the buffer); 1/2/0x02 "
    "(no buffer) is a WARN",
)
async def send_too_long(ctx: CaseContext) -> Verdict:
    return await carrier(
        ctx,
        lambda s, u: [u],
        what="Send longer than the receive",
        first=lambda s: Send(bytes(s.receives.size + 1)),
        alternatives=TOO_LONG_ALTERNATIVES,
    )


@case(
    "RDMAP-08",
    "More Sends at once than the app keeps receives posted: Terminate 1/2/0x02",
    n=2,
    rules=("DDP-10", "DDP-11"),
    phase=_D,
    sends="the app's first Send, then copies of it, one more than the receives the app "
    "posts, in one write",
    expects="the Sends that found a receive delivered, the one that found none refused with "
    "the stack's Terminate (no buffer available); SKIP when the app reposted in time",
)
async def send_burst(ctx: CaseContext) -> Verdict:
    count = ctx.app.receives.count

    def edit(s: Session, u: bytes) -> Sequence[Item]:
        payload = u[18:]
        return [u, *(first(s, Send(payload)) for _ in range(s.receives.count))]

    verdict = await carrier(ctx, edit, what="Send beyond the posted receives", allow=count)
    if verdict.outcome is Outcome.NOT_MET and verdict.observed.startswith(("took", "no Term")):
        # No Terminate, or the extra Send delivered: the DUT had a receive for it (reposted
        # in time, or more posted than the application is known to keep): not visible.
        return Verdict.not_applicable(
            f"the DUT found a receive for every Send ({verdict.observed}): the application "
            "reposted in time or keeps more posted than it is known to",
            *verdict.evidence,
        )
    return verdict


# ======================================================================================
# Terminates from the runner (RFC 5040 §4.8, §5.4, §6.2.1)
# ======================================================================================


async def _terminated(
    ctx: CaseContext, *, ready: bool, terminate: Terminate, after: str = ""
) -> Verdict:
    """Send ``terminate`` (with ``after``: then the app's next message, or a second
    Terminate, in the same write) and judge with :func:`judge_stopped`."""
    opened = await open_session(ctx, ready=ready)
    if isinstance(opened, Verdict):
        return opened
    s = opened
    items: list[Item] = [terminate]
    if after == "next":
        items += s.pending if ready else s.client.opening()
    elif after == "second":
        items.append(terminate)
    await s.send(items)
    return await judge_stopped(s)


async def judge_stopped(s: Session) -> Verdict:
    """After the runner's Terminate the DUT must deliver nothing more, send nothing but
    possibly one Terminate of its own (RDMAP-10), and close the connection gracefully
    (FIN, RDMAP-15, SHOULD)."""
    ctx = s.ctx
    w = await watch(s)
    lines = []
    if w.deliveries:
        return Verdict.not_met(
            f"went on after the runner's Terminate: {w.deliveries[0]}", rule="RDMAP-10"
        )
    if w.others:
        return Verdict.not_met(f"sent after the runner's Terminate: {w.others[0]}", rule="RDMAP-10")
    if w.terminate is not None:
        _t, frame = w.terminate
        lines.append(f"it answered with its own Terminate (frame {frame}): allowed, one per stream")
        closed, more = await expect_close(s.peer, ctx.options.timeout)
        if more:
            return Verdict.not_met(f"sent more after its Terminate: {more[0]}", rule="RDMAP-10")
    else:
        closed = w.eof is not None
    if not closed:
        return Verdict.not_met(
            f"did not close the connection within {ctx.options.timeout:g} s",
            *lines,
            rule="RDMAP-15",
            level="SHOULD",
        )
    if s.peer.reset_by_dut:
        return Verdict.not_met(
            "reset the connection instead of closing it gracefully",
            *lines,
            rule="RDMAP-15",
            level="SHOULD",
        )
    return Verdict.met("delivered and sent nothing more, closed the connection (FIN)", *lines)


_TERMINATE = build_terminate(TERM_RDMAP_OP_UNSPECIFIED, None)
"""The runner's Terminate: an unspecified remote operation error, no headers."""


@case(
    "RDMAP-15",
    "A Terminate as the runner's first FPDU: the DUT stops and closes",
    rules=("RDMAP-10",),
    phase=_D,
    sends="Terminate 0/2/0xFF (no headers) as the first FPDU of Full Operation",
    expects="nothing delivered or sent (at most one Terminate of its own), then a graceful "
    "close (FIN)",
)
async def terminate_first(ctx: CaseContext) -> Verdict:
    return await _terminated(ctx, ready=False, terminate=_TERMINATE)


@case(
    "RDMAP-15",
    "A Terminate in the middle of the app's exchange: the DUT stops and closes",
    n=2,
    rules=("RDMAP-10",),
    phase=_D,
    sends="once the app is ready (rping: its RDMA Read outstanding; KBTP: after HELLO_ACK), "
    "Terminate 0/2/0xFF",
    expects="nothing more delivered or sent (at most one Terminate), then a graceful close",
)
async def terminate_ready(ctx: CaseContext) -> Verdict:
    return await _terminated(ctx, ready=True, terminate=_TERMINATE)


@case(
    "RDMAP-10",
    "A valid message right after the runner's Terminate: not delivered",
    rules=("RDMAP-15",),
    phase=_D,
    sends="Terminate 0/2/0xFF and the app's first Send, in one write",
    expects="the Send not delivered (nothing follows a Terminate), then a graceful close",
)
async def after_terminate(ctx: CaseContext) -> Verdict:
    return await _terminated(ctx, ready=False, terminate=_TERMINATE, after="next")


@case(
    "RDMAP-10",
    "Two Terminates from the runner: the second ignored, the DUT closes",
    n=2,
    rules=("RDMAP-15",),
    phase=_D,
    sends="Terminate 0/2/0xFF twice, in one write",
    expects="nothing delivered or sent (at most one Terminate), then a graceful close",
)
async def two_terminates(ctx: CaseContext) -> Verdict:
    return await _terminated(ctx, ready=False, terminate=_TERMINATE, after="second")


def _copying(n: int, title: str, term: Terminate, sends: str) -> None:
    @case(
        "RDMAP-11",
        f"{title}: the DUT stops and closes",
        n=n,
        rules=("RDMAP-10", "RDMAP-15"),
        phase=_D,
        sends=sends,
        expects="taken as a Terminate: nothing more delivered or sent, then a graceful close",
    )
    async def body(ctx: CaseContext) -> Verdict:
        return await _terminated(ctx, ready=False, terminate=term)


_SEND_HDR = bytes([0x41, 0x43]) + bytes(16)
_copying(
    1,
    "A Terminate copying a DDP header (M, D)",
    Terminate(1, 2, 0x03, m=True, d=True, ddp_seg_len=34, ddp_header=_SEND_HDR),
    "Terminate 1/2/0x03 with M=D=1, a segment length and an untagged DDP header",
)
_copying(
    2,
    "A Terminate copying a Read Request's headers (M, D, R)",
    Terminate(
        0,
        1,
        0x00,
        m=True,
        d=True,
        r=True,
        ddp_seg_len=46,
        ddp_header=bytes([0x41, 0x41]) + bytes(16),
        rdma_header=bytes(28),
    ),
    "Terminate 0/1/0x00 with M=D=R=1, the DDP and the 28-octet Read Request headers",
)
