"""Expectations on the DUT's behaviour, with timeouts: a close, silence, a Terminate.

:func:`expect_close` and :func:`expect_silence` wait for what the DUT must (not) do within a
time; :func:`expect_terminate` / :func:`judge_first_terminate` want the DUT's next event to
be a given Terminate, and :func:`judge_terminate` compares one with what the wire core sends:
the cause (MUST) and :func:`~stack.wire.terminate.build_terminate`'s header copies (RDMAP-12,
SHOULD), with :func:`~stack.wire.rdmap.check_terminate_headers`' notes as evidence.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import trio

from stack.conform.model import Verdict
from stack.conform.peer import Peer
from stack.conform.peer_core import Eof, FramingBad, PduSeen, StartupBad, StartupSeen
from stack.conform.script import describe_frame, frame_note, terminate_line
from stack.constants import TermCode
from stack.wire.checker import Checker
from stack.wire.events import Terminate
from stack.wire.terminate import build_terminate, check_terminate_headers

__all__ = [
    "Quiet",
    "expect_close",
    "expect_silence",
    "expect_terminate",
    "judge_first_terminate",
    "judge_terminate",
    "siw_reading",
]


async def expect_close(peer: Peer, within: float) -> tuple[bool, list[str]]:
    """Wait up to ``within`` seconds for the DUT to close; returns (closed, lines about
    what it sent meanwhile)."""
    lines: list[str] = []
    deadline = trio.current_time() + within
    while not peer.closed_by_dut:
        left = deadline - trio.current_time()
        if left <= 0:
            return False, lines
        event = await peer.next_event(left)
        if event is None:
            return False, lines
        lines.extend(_event_lines(peer, event))
    return True, lines


@dataclass
class Quiet:
    """What the DUT sent while it should have been silent.  Fields: lines (one per event;
    empty: it was silent), frame (capture frame of the first thing it sent)."""

    lines: list[str]
    frame: int | None = None


async def expect_silence(peer: Peer, seconds: float) -> Quiet:
    """Whatever the DUT sent within ``seconds`` (a close ends the wait and is not counted
    as sending)."""
    quiet = Quiet([])
    for event in await peer.wait_for_more(seconds):
        if isinstance(event, Eof):
            continue
        quiet.lines.extend(_event_lines(peer, event))
        if quiet.frame is None:
            quiet.frame = _event_frame(peer, event)
    return quiet


def _event_frame(peer: Peer, event: object) -> int | None:
    if isinstance(event, StartupSeen):
        return peer.frame_of_dut(event.offset + event.length - 1)
    if isinstance(event, StartupBad):
        return peer.frame_of_dut(event.offset)
    if isinstance(event, PduSeen):
        return peer.frame_of_dut(event.offset + event.wire_len - 1)
    if isinstance(event, FramingBad):
        return peer.frame_of_dut(event.offset)
    return None


def _event_lines(peer: Peer, event: object) -> list[str]:
    if isinstance(event, StartupSeen):
        frame, where = frame_note(peer, event.offset, event.length)
        return [f"{describe_frame(event.frame)} ({where})"]
    if isinstance(event, StartupBad):
        _, where = frame_note(peer, event.offset, len(event.raw))
        return [f"{len(event.raw)} bytes that are no MPA frame ({where})"]
    if isinstance(event, PduSeen):
        _, where = frame_note(peer, event.offset, event.wire_len)
        seg = event.segment
        name = seg.opcode_name if seg is not None else "undecodable ULPDU"
        if seg is not None and isinstance(seg.header, Terminate):
            name = terminate_line(seg.header)
        return [f"FPDU: {name} ({where})"]
    if isinstance(event, FramingBad):
        _, where = frame_note(peer, event.offset, 1)
        return [f"bytes that break FPDU framing: {event.error} ({where})"]
    if isinstance(event, Eof) and event.pending:
        return [f"{len(event.pending)} bytes before closing"]
    return []


def judge_first_terminate(
    peer: Peer,
    event: object,
    cause: TermCode,
    timeout: float,
    offending: bytes | None = None,
) -> Verdict:
    """The DUT's first event after a provocation must be the Terminate ``cause`` about
    ``offending`` (:func:`judge_terminate`); anything else is not met."""
    if isinstance(event, PduSeen):
        frame = peer.frame_of_dut(event.offset + event.wire_len - 1)
        seg = event.segment
        if seg is not None and isinstance(seg.header, Terminate):
            return judge_terminate(seg.header, cause, offending, frame)
        what = seg.opcode_name if seg is not None else "an undecodable FPDU"
        return Verdict.not_met(f"sent {what} instead of a Terminate (frame {frame})",
                               frame=frame)  # fmt: skip
    if isinstance(event, Eof):
        return Verdict.not_met(f"closed without a Terminate {cause}")
    if isinstance(event, FramingBad):
        return Verdict.not_met(f"sent bytes that break framing: {event.error}",
                               frame=peer.frame_of_dut(event.offset))  # fmt: skip
    return Verdict.not_met(f"no Terminate within {timeout:g} s (expected {cause})")


async def expect_terminate(
    peer: Peer, cause: TermCode, within: float, offending: bytes | None = None
) -> Verdict:
    """Wait up to ``within`` seconds for the DUT's next event: it must be the Terminate the
    wire core sends for ``cause`` about ``offending``."""
    return judge_first_terminate(peer, await peer.next_event(within), cause, within, offending)


def siw_reading(got: Terminate, cause: TermCode) -> Terminate:
    """``got`` read in siw's swapped layout (RDMAP-11) when only that reading gives the
    expected ``cause``: a control word without M, D or R bits reads both ways (``00 02 ..``
    is RDMAP 0/2/0x02 as sent, MPA 2/0/0x02 read as siw writes it), so the decoder keeps
    the RFC reading; the expectation decides here.  Otherwise ``got`` unchanged."""
    if got.siw_swapped or got.cause == cause or got.m or got.d or got.r:
        return got
    if TermCode(got.etype, got.layer, got.code) != cause:
        return got
    return replace(got, layer=got.etype, etype=got.layer, siw_swapped=True)


def judge_terminate(
    got: Terminate,
    cause: TermCode,
    offending: bytes | None,
    frame: int | None,
    *,
    header_rule: str = "RDMAP-12",
) -> Verdict:
    """A received Terminate against the expected one: ``cause`` (MUST) and the header copies
    :func:`build_terminate` makes for ``offending`` (RDMAP-12, SHOULD)."""
    expected = build_terminate(cause, offending)
    where = f" (frame {frame})" if frame is not None else ""
    got = siw_reading(got, TermCode(*cause))
    notes = Checker(strict=False)
    check_terminate_headers(got, notes)
    extra = tuple(f"{f.rule}: {f.detail}" for f in notes.findings)
    if got.cause != TermCode(*cause):
        return Verdict.not_met(
            f"{terminate_line(got)}{where}",
            f"expected: {terminate_line(expected)}",
            *extra,
            frame=frame,
        )
    same = (
        (got.m, got.d, got.r) == (expected.m, expected.d, expected.r)
        and got.ddp_header == expected.ddp_header
        and got.rdma_header == expected.rdma_header
        and (not expected.m or got.ddp_seg_len == expected.ddp_seg_len)
    )
    if got.siw_swapped:
        copies = "right" if same else "not right either"
        return Verdict.not_met(
            f"{terminate_line(got)}{where}: the right cause in siw's swapped layout (Layer "
            "and EType exchanged, M/D/R in the low bits), not the layout of RFC 5040 §4.8",
            f"expected: {terminate_line(expected)}",
            f"the header copies are {copies}",
            *extra,
            rule="RDMAP-11",
            level="MUST",
            frame=frame,
        )
    if not same:
        return Verdict.not_met(
            f"{terminate_line(got)}{where}: the cause is right, the header copies are not",
            f"expected: {terminate_line(expected)}",
            *extra,
            rule=header_rule,
            level="SHOULD",
            frame=frame,
        )
    return Verdict.met(f"{terminate_line(got)}{where}", *extra)
