"""Receive-side sequencing of one direction of a stream, strict or lenient (RFC 5041 §4-5).

Theory of operation
-------------------
Two small state machines hold every stateful receive rule of DDP and RDMAP, once:

* :class:`MessageSequencer` follows the messages one direction sends: per untagged queue
  the next MSN (starting at 1, +1 per message, wrapping at 2^32; DDP-05), the MO of the next
  segment of an open message (first MO 0, then previous MO + previous payload; DDP-05,
  DDP-06), the RsvdULP (RDMAP control byte and Invalidate STag) that stays the same within a
  message (DDP-04), and messages that end without their Last segment (DDP-02).  Tagged
  continuity (the next TO of an open tagged message, DDP-06) is tracked too; tagged segments
  are self-describing, so only the capture decoder asks for it.
* :class:`RequestTracker` holds the Read and Atomic Requests one side sent, in order, and
  matches the responses the other side returns: a Read Response carries the request's Sink
  STag and continues its Sink TO (RDMAP-04), delivers exactly the requested size, and
  responses come in request order (RDMAP-06, EXT-03).  Each request may carry a ``context``
  (the RNIC's work request), so the tracker is the only queue of outstanding requests.

Both report through a :class:`~stack.wire.checker.Checker`: the endpoint runs them strictly
(the first violation is raised as a :class:`~stack.errors.ProtocolError` with its Terminate
cause, and the state does not advance), the capture decoder leniently (every violation is
recorded as a finding and the state follows what was actually sent, so one error does not
cascade).  ``known=False`` starts either machine mid-stream: after a resynchronisation no MSN
or outstanding request is known until the stream shows one.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from stack.constants import (
    ALL_ONES_32,
    RDMAP_OPCODE_MASK,
    TERM_DDP_T_BASE_BOUNDS,
    TERM_DDP_T_INVALID_STAG,
    TERM_DDP_U_INVALID_MO,
    TERM_DDP_U_MSN_RANGE,
    TERM_RDMAP_CATASTROPHIC_STREAM,
    TERM_RDMAP_OP_UNSPECIFIED,
    TERM_RDMAP_UNEXPECTED_OPCODE,
    QueueNumber,
)
from stack.errors import DdpError, RdmapError
from stack.wire.checker import Checker

__all__ = ["MessageSequencer", "OutstandingRead", "RequestTracker"]

_MASK64 = (1 << 64) - 1
_TERMINATE_QN = int(QueueNumber.TERMINATE)


class MessageSequencer:
    """MSN, MO, RsvdULP and Last-flag tracking of one sending direction (DDP-02, DDP-04..06).

    Fields: ``known`` (the start of the stream was seen, so MSNs start at 1), ``next_msn``
    (QN -> MSN of the next message), ``open_untagged`` (QN -> (MSN, next MO, RDMAP control
    byte, Invalidate STag) of a message still waiting for its Last segment),
    ``open_tagged`` ((STag, next TO, opcode) of an unfinished tagged message).
    """

    __slots__ = ("known", "next_msn", "open_untagged", "open_tagged")

    def __init__(self, known: bool = True) -> None:
        self.known = known
        self.next_msn: dict[int, int] = {}
        self.open_untagged: dict[int, tuple[int, int, int, int]] = {}
        self.open_tagged: tuple[int, int, int] | None = None

    def expected_msn(self, qn: int) -> int | None:
        """The MSN the next message on ``qn`` must carry (None: not known mid-stream)."""
        return self.next_msn.get(qn, 1 if self.known else None)

    def next_mo(self, qn: int) -> int:
        """The MO the next segment on ``qn`` must carry (0 unless a message is open)."""
        open_msg = self.open_untagged.get(qn)
        return 0 if open_msg is None else open_msg[1]

    def open_rsvdulp(self, qn: int) -> tuple[int, int] | None:
        """(RDMAP control byte, Invalidate STag) of the message open on ``qn``, or None."""
        open_msg = self.open_untagged.get(qn)
        return None if open_msg is None else (open_msg[2], open_msg[3])

    def forget(self) -> None:
        """After lost data: MSNs and open messages are no longer known."""
        self.known = False
        self.next_msn.clear()
        self.open_untagged.clear()
        self.open_tagged = None

    def advance(self, qn: int, msn: int, mo: int, ulp_ctrl: int, inval: int, end: int,
                last: bool) -> None:  # fmt: skip
        """Record a segment that passed the checks (or a lenient decode): ``end`` is its MO
        plus its payload length."""
        if last:
            self.open_untagged.pop(qn, None)
            self.next_msn[qn] = (msn + 1) & ALL_ONES_32
        else:
            self.open_untagged[qn] = (msn, end, ulp_ctrl, inval)

    def untagged(
        self,
        qn: int,
        msn: int,
        mo: int,
        ulp_ctrl: int,
        inval: int,
        payload_len: int,
        last: bool,
        chk: Checker,
    ) -> None:
        """Check one untagged segment, then advance (DDP-02, DDP-04, DDP-05, DDP-06).

        ``payload_len``: the bytes after the 18-byte DDP header (an RDMAP header counts).
        A wrong MSN on the Terminate queue is only noted: a Terminate is always delivered
        (RDMAP-10).  Strict: the first violation is raised and nothing advances.
        """
        open_msg = self.open_untagged.get(qn)
        if open_msg is not None and open_msg[0] == msn:
            if mo != open_msg[1]:
                chk.fail(
                    DdpError(
                        "DDP-06",
                        f"QN {qn} MSN {msn}: MO {mo}, expected {open_msg[1]}",
                        TERM_DDP_U_INVALID_MO,
                    )
                )
            if ulp_ctrl != open_msg[2] or inval != open_msg[3]:
                same_op = (open_msg[2] & RDMAP_OPCODE_MASK) == (ulp_ctrl & RDMAP_OPCODE_MASK)
                chk.fail(
                    RdmapError(
                        "DDP-04",
                        f"QN {qn} MSN {msn}: opcode or RsvdULP changed mid-message",
                        TERM_RDMAP_OP_UNSPECIFIED if same_op else TERM_RDMAP_UNEXPECTED_OPCODE,
                    )
                )
        else:
            if open_msg is not None:
                chk.fail(
                    DdpError(
                        "DDP-02",
                        f"QN {qn} MSN {open_msg[0]} ended without a Last segment",
                        TERM_DDP_U_MSN_RANGE,
                    )
                )
                self.next_msn[qn] = (open_msg[0] + 1) & ALL_ONES_32
            expected = self.expected_msn(qn)
            if expected is not None and msn != expected:
                detail = f"QN {qn}: MSN {msn}, expected {expected}"
                if qn == _TERMINATE_QN:
                    chk.note("DDP-05", detail)
                else:
                    chk.fail(DdpError("DDP-05", detail, TERM_DDP_U_MSN_RANGE))
            if mo != 0 and (expected is not None or open_msg is not None):
                chk.fail(
                    DdpError(
                        "DDP-05", f"QN {qn} MSN {msn}: first segment has MO {mo}",
                        TERM_DDP_U_INVALID_MO,
                    )
                )  # fmt: skip
        self.advance(qn, msn, mo, ulp_ctrl, inval, mo + payload_len, last)

    def tagged(self, stag: int, to: int, opcode: int, payload_len: int, last: bool,
               chk: Checker) -> None:  # fmt: skip
        """Continuity of a tagged message's segments (DDP-02, DDP-06): the same STag and
        opcode until Last, each TO following the previous segment."""
        ot = self.open_tagged
        if ot is not None:
            if stag != ot[0] or opcode != ot[2]:
                chk.fail(
                    DdpError(
                        "DDP-02",
                        f"tagged message to STag 0x{ot[0]:08X} ended without a Last segment",
                        TERM_DDP_T_INVALID_STAG,
                    )
                )
            elif to != ot[1]:
                chk.fail(
                    DdpError(
                        "DDP-06",
                        f"STag 0x{stag:08X}: TO 0x{to:X}, expected 0x{ot[1]:X}",
                        TERM_DDP_T_BASE_BOUNDS,
                    )
                )
        self.open_tagged = None if last else (stag, (to + payload_len) & _MASK64, opcode)


@dataclass(slots=True)
class OutstandingRead:
    """A Read Request waiting for its response.  Fields: sink_stag, sink_to, size, done
    (bytes already returned), context (the requester's own record, e.g. its work request)."""

    sink_stag: int
    sink_to: int
    size: int
    done: int = 0
    context: object = None


class RequestTracker:
    """Read and Atomic Requests one side sent, matched with the responses (RDMAP-04/06, EXT-03).

    ``known=False``: requests sent before the capture started are unknown, so a response
    with nothing outstanding is not a finding.  Fields: ``reads`` (deque of
    :class:`OutstandingRead`), ``atomics`` (deque of (Request ID, context)), ``known``.
    """

    __slots__ = ("reads", "atomics", "known")

    def __init__(self, known: bool = True) -> None:
        self.reads: deque[OutstandingRead] = deque()
        self.atomics: deque[tuple[int, object]] = deque()
        self.known = known

    def __len__(self) -> int:
        """Requests outstanding (what ORD bounds, RDMAP-14)."""
        return len(self.reads) + len(self.atomics)

    def forget(self) -> None:
        """After lost data: which requests are outstanding is no longer known."""
        self.known = False
        self.reads.clear()
        self.atomics.clear()

    def read_request(self, sink_stag: int, sink_to: int, size: int, context: object = None) -> None:
        """A Read Request was sent (RDMAP-06: answered in order)."""
        self.reads.append(OutstandingRead(sink_stag, sink_to, size, 0, context))

    def atomic_request(self, req_id: int, context: object = None) -> None:
        """An Atomic Request was sent (EXT-03: answered in order)."""
        self.atomics.append((req_id, context))

    def read_response(
        self, stag: int, to: int, size: int, last: bool, chk: Checker
    ) -> tuple[OutstandingRead, int] | None:
        """Match one Read Response segment with the oldest outstanding Read (RDMAP-04).

        Returns ``(request, offset)``, the request and where this segment's bytes go in its
        sink, or None when nothing is outstanding (a finding when that is known).  A
        zero-length segment is not checked against the sink (DDP-07).  On the Last segment
        the request is done and leaves the queue.
        """
        if not self.reads:
            if self.known:
                chk.fail(
                    DdpError(
                        "RDMAP-04",
                        "Read Response without an outstanding Read Request",
                        TERM_DDP_T_INVALID_STAG,
                    )
                )
            return None
        req = self.reads[0]
        offset = req.done
        if size:
            want_to = (req.sink_to + offset) & _MASK64
            if stag != req.sink_stag:
                chk.fail(
                    DdpError(
                        "RDMAP-04",
                        f"Read Response to 0x{stag:08X}/0x{to:X}, the request's sink is "
                        f"0x{req.sink_stag:08X}/0x{want_to:X}",
                        TERM_DDP_T_INVALID_STAG,
                    )
                )
            elif to != want_to:
                chk.fail(
                    DdpError(
                        "RDMAP-04",
                        f"Read Response to 0x{stag:08X}/0x{to:X}, the request's sink is "
                        f"0x{req.sink_stag:08X}/0x{want_to:X}",
                        TERM_DDP_T_BASE_BOUNDS,
                    )
                )
            if offset + size > req.size:
                chk.fail(
                    DdpError(
                        "RDMAP-04",
                        f"Read Response exceeds the {req.size} bytes requested",
                        TERM_DDP_T_BASE_BOUNDS,
                    )
                )
        req.done = offset + size
        if last:
            if req.done != req.size:
                chk.fail(
                    RdmapError(
                        "RDMAP-04",
                        f"Read Response carried {req.done} bytes, {req.size} requested",
                        TERM_RDMAP_OP_UNSPECIFIED,
                    )
                )
            self.reads.popleft()
        return req, offset

    def atomic_response(self, req_id: int, chk: Checker) -> tuple[bool, object]:
        """Match an Atomic Response with the oldest outstanding Atomic Request (EXT-03).

        Returns ``(matched, context)``; the oldest request leaves the queue either way.
        """
        if not self.atomics:
            if self.known:
                chk.fail(
                    RdmapError(
                        "EXT-03",
                        "Atomic Response without an outstanding request",
                        TERM_RDMAP_CATASTROPHIC_STREAM,
                    )
                )
            return False, None
        want, context = self.atomics[0]
        if req_id != want:
            chk.fail(
                RdmapError(
                    "EXT-03",
                    f"Atomic Response for request 0x{req_id:08X}, expected 0x{want:08X} "
                    "(responses go in request order)",
                    TERM_RDMAP_CATASTROPHIC_STREAM,
                )
            )
        self.atomics.popleft()
        return req_id == want, context
