"""TCP reassembly for captures: per connection and direction, in-order bytes with gaps reported.

Theory of operation: every direction of a connection is a :class:`HalfStream` that maps
32-bit sequence numbers onto an unbounded stream offset (offset 0 = the byte after the
SYN, or the first byte seen when the capture starts mid-connection; wrap-around is
followed by unwrapping around the next expected offset).  :meth:`HalfStream.feed` returns
events: :class:`StreamData` for bytes that are now in order (each byte exactly once, zero
copies: views into the capture buffer), :class:`Retransmission` for repeated bytes
(checked against the last :data:`RECENT_BYTES` delivered, whatever the segment sizes:
:class:`OverlapConflict` when they differ; the first copy wins, as a receiving TCP keeps
it), :class:`Gap` for bytes that never appeared, and :class:`StreamEnd` for FIN/RST.
Segments that arrive early wait, copied, in a heap by offset (O(log n) to park and to
hand on); a gap is declared only when the waiting data exceeds ``max_pending`` bytes or
``max_pending_segments`` segments, at a FIN that cannot be reached, or at
:meth:`HalfStream.flush` (end of capture) -- never guessed over.  Bytes lost to a short
snapshot length are gaps as well.

:class:`TcpReassembler` keys connections by their 4-tuple, numbers them in order of first
appearance (``stream``), knows which side sent the SYN, and starts a new connection when
a fresh SYN reuses a finished 4-tuple.
"""

from __future__ import annotations

import bisect
import heapq
from typing import NamedTuple

from stack.pcap import TCP_ACK, TCP_FIN, TCP_RST, TCP_SYN, TcpSegment

SEQ_MOD = 1 << 32
HALF_SEQ = 1 << 31
DEFAULT_MAX_PENDING = 8 << 20
"""Bytes that may wait behind a hole before it is declared a gap."""
DEFAULT_MAX_PENDING_SEGMENTS = 1 << 16
"""Segments that may wait behind a hole (each costs ~200 bytes besides its payload): tiny
segments reach this long before :data:`DEFAULT_MAX_PENDING`."""
RECENT_BYTES = 1 << 20
"""Delivered bytes kept (a ring per direction) to compare retransmissions against."""
RECENT_MASK = RECENT_BYTES - 1
MAX_HOLES = 256
"""Gaps remembered inside the ring; when more, the oldest ring bytes are not compared."""
RING_START = 256
"""The ring's first capacity: it doubles as the stream's offsets reach its end, so a
direction that carries little keeps a small ring (:data:`RECENT_BYTES` at most)."""

Payload = bytes | bytearray | memoryview
_NO_RING = bytearray()
_NO_VIEW = memoryview(_NO_RING)
"""The ring of a direction that delivered nothing yet, or was released: shared, never
written (:meth:`HalfStream._remember` makes a direction its own ring)."""
_SPECIAL = TCP_SYN | TCP_FIN | TCP_RST
_MASK32 = SEQ_MOD - 1


# The events are NamedTuples rather than frozen dataclasses: one is created per captured
# segment, and a NamedTuple is immutable and several times cheaper to build.


class StreamData(NamedTuple):
    """In-order stream bytes.  Fields: offset, data, frame (the frame that made them in order)."""

    offset: int
    data: Payload
    frame: int


class Gap(NamedTuple):
    """Bytes that were never captured; the stream resumes at offset + length.

    Fields: offset, length, frame (where the gap was declared).
    """

    offset: int
    length: int
    frame: int


class Retransmission(NamedTuple):
    """Bytes seen again with the same content.  Fields: offset, length, frame."""

    offset: int
    length: int
    frame: int


class OverlapConflict(NamedTuple):
    """Bytes seen again with *different* content (the first copy was kept).

    Fields: offset, length, frame.
    """

    offset: int
    length: int
    frame: int


class StreamEnd(NamedTuple):
    """FIN reached in order, or an RST (reset True).  Fields: offset, frame, reset."""

    offset: int
    frame: int
    reset: bool = False


StreamEvent = StreamData | Gap | Retransmission | OverlapConflict | StreamEnd


class HalfStream:
    """One direction of a TCP connection being reassembled.

    Attributes: base_seq (sequence number of offset 0, None until known), syn_seen,
    next_offset (first byte not yet delivered), ended, counters retransmitted_bytes,
    gap_bytes, conflicts, out_of_order.
    """

    def __init__(
        self,
        max_pending: int = DEFAULT_MAX_PENDING,
        max_pending_segments: int = DEFAULT_MAX_PENDING_SEGMENTS,
    ) -> None:
        self.base_seq: int | None = None
        self.syn_seen = False
        self.isn: int | None = None
        self.next_offset = 0
        self.ended = False
        self.max_pending = max_pending
        self.max_pending_segments = max_pending_segments
        self.fin_offset: int | None = None
        self.retransmitted_bytes = 0
        self.gap_bytes = 0
        self.conflicts = 0
        self.out_of_order = 0
        self.delivered_bytes = 0
        self._pending: list[tuple[int, int, bytes, int, int]] = []
        """Waiting segments, a heap of (start, arrival, data, missing, frame that carried
        them): of two at the same start the first to arrive is handed on first, and the
        later copy is then a retransmission of it (compared like any other)."""
        self._parked = 0
        self._pending_bytes = 0
        self._ring = _NO_RING
        """The delivered stream's last bytes: offset o at ``o & RECENT_MASK``, for o in
        [next_offset - RECENT_BYTES, next_offset) (it grows by doubling to RECENT_BYTES,
        its bytes never moving, then wraps)."""
        self._ring_view = _NO_VIEW
        """Written through (a bytearray's slice assignment costs twice as much); a new
        view whenever the ring grows."""
        self._hole_starts: list[int] = []
        self._hole_ends: list[int] = []
        """Gaps inside the ring, by offset (entries before ``_hole_head`` are stale)."""
        self._hole_head = 0
        self._known_from = 0  # ring bytes before this offset are not compared

    # ---- sequence mapping -----------------------------------------------------------
    def offset_of(self, seq: int) -> int:
        """Stream offset of sequence number ``seq`` (unwrapped around the next offset)."""
        assert self.base_seq is not None
        expected = (self.base_seq + self.next_offset) % SEQ_MOD
        delta = ((seq - expected + HALF_SEQ) % SEQ_MOD) - HALF_SEQ
        return self.next_offset + delta

    def seq_of(self, offset: int) -> int:
        """32-bit sequence number of stream ``offset``."""
        assert self.base_seq is not None
        return (self.base_seq + offset) % SEQ_MOD

    # ---- input ----------------------------------------------------------------------
    def feed(
        self,
        seq: int,
        payload: Payload,
        flags: int,
        frame: int,
        missing: int = 0,
    ) -> list[StreamEvent]:
        """Take one segment; return the events it causes, in stream order."""
        base_seq = self.base_seq
        if (
            not flags & _SPECIAL
            and not missing
            and base_seq is not None
            and not self._pending
            and self.fin_offset is None
        ):
            # fast path: the next bytes, in order, nothing waiting
            nxt = self.next_offset
            if seq == (base_seq + nxt) & _MASK32:
                size = len(payload)
                if not size:
                    return []
                self.next_offset = nxt + size
                self.delivered_bytes += size
                ring = self._ring_view  # _remember, inline
                pos = nxt & RECENT_MASK
                end = pos + size
                if end <= len(ring):
                    ring[pos:end] = payload
                else:
                    self._remember(nxt, payload)
                return [StreamData(nxt, payload, frame)]
        events: list[StreamEvent] = []
        if flags & TCP_SYN:
            if not self.syn_seen and self.next_offset == 0 and not self._pending:
                self.syn_seen = True
                self.isn = seq
                self.base_seq = (seq + 1) % SEQ_MOD
            seq = (seq + 1) % SEQ_MOD
        if flags & TCP_RST:
            if not self.ended:
                self.ended = True
                events.append(StreamEnd(self.next_offset, frame, reset=True))
            return events
        size = len(payload)
        total = size + missing
        if self.base_seq is None:
            if not total and not flags & TCP_FIN:
                return events
            self.base_seq = seq
        start = self.offset_of(seq)
        if start < 0:  # bytes from before the capture's first segment
            cut = min(-start, total)
            self.retransmitted_bytes += cut
            if size:
                payload = payload[min(cut, size) :]
                size = len(payload)
            missing = max(0, total - cut - size)
            total = size + missing
            start = 0
        if flags & TCP_FIN and self.fin_offset is None:
            self.fin_offset = start + total
        if total:
            end = start + total
            nxt = self.next_offset
            if end <= nxt:
                self._repeat(start, payload, frame, events)
            elif start <= nxt:
                if start < nxt:
                    self._repeat(start, payload[: nxt - start], frame, events)
                    skip = nxt - start
                    payload = payload[skip:] if skip < size else payload[:0]
                    missing = missing - max(0, skip - size)
                self._deliver(nxt, payload, missing, frame, events)
                if self._pending:
                    self._drain(frame, events)
            else:
                self._park(start, payload, missing, frame)
                self.out_of_order += 1
                if (
                    self._pending_bytes > self.max_pending
                    or len(self._pending) > self.max_pending_segments
                ):
                    self._force_gap(frame, events)
        self._check_fin(frame, events)
        return events

    def flush(self, frame: int) -> list[StreamEvent]:
        """End of capture: report holes before waiting data and deliver it."""
        events: list[StreamEvent] = []
        while self._pending:
            self._force_gap(frame, events)
        fin = self.fin_offset
        if fin is not None and not self.ended and self.next_offset < fin:
            events.append(Gap(self.next_offset, fin - self.next_offset, frame))
            self.gap_bytes += fin - self.next_offset
            self._lost(self.next_offset, fin - self.next_offset)
            self.next_offset = fin
        self._check_fin(frame, events)
        return events

    # ---- internals ------------------------------------------------------------------
    def _deliver(
        self, offset: int, payload: Payload, missing: int, frame: int, events: list[StreamEvent]
    ) -> None:
        size = len(payload)
        if size:
            events.append(StreamData(offset, payload, frame))
            self.delivered_bytes += size
            self._remember(offset, payload)
        if missing:
            events.append(Gap(offset + size, missing, frame))
            self.gap_bytes += missing
            self._lost(offset + size, missing)
        self.next_offset = offset + size + missing

    def _remember(self, offset: int, payload: Payload) -> None:
        """Put delivered bytes at ``offset`` into the ring (growing it if they lie past
        its end: a position, once written, keeps its byte until a later offset's)."""
        n = len(payload)
        if n > RECENT_BYTES:
            payload = payload[n - RECENT_BYTES :]
            offset += n - RECENT_BYTES
            n = RECENT_BYTES
        pos = offset & RECENT_MASK
        end = pos + n
        view = self._ring_view
        size = len(view)
        if end > size and size < RECENT_BYTES:
            grown = max(size, min(RING_START, RECENT_BYTES))
            while grown < end and grown < RECENT_BYTES:
                grown *= 2
            if size:
                view.release()
                self._ring += bytes(grown - size)
            else:  # the shared empty ring: a ring of its own
                self._ring = bytearray(grown)
            view = self._ring_view = memoryview(self._ring)
        if end <= RECENT_BYTES:
            view[pos:end] = payload
        else:
            split = RECENT_BYTES - pos
            view[pos:RECENT_BYTES] = payload[:split]
            view[: n - split] = payload[split:]

    def release(self) -> None:
        """The connection is over (both FINs or an RST reached, nothing waiting): free the
        ring.  A later resend of the bytes before ``next_offset`` is counted, not compared;
        bytes after the FIN (a hostile capture) fill a new ring from here."""
        self._ring = _NO_RING
        self._ring_view = _NO_VIEW
        self._hole_starts.clear()
        self._hole_ends.clear()
        self._hole_head = 0
        self._known_from = self.next_offset

    def _lost(self, offset: int, length: int) -> None:
        """Bytes [offset, offset + length) at the ring's end were never delivered."""
        starts = self._hole_starts
        ends = self._hole_ends
        head = self._hole_head
        end = offset + length
        if len(ends) > head and ends[-1] == offset:
            ends[-1] = end
        else:
            starts.append(offset)
            ends.append(end)
        floor = end - RECENT_BYTES
        while ends[head] <= floor:
            head += 1
        while len(ends) - head > MAX_HOLES:  # too many: stop comparing before the oldest
            self._known_from = ends[head]
            head += 1
        if head > 64 and head * 2 > len(ends):
            del starts[:head], ends[:head]
            head = 0
        self._hole_head = head

    def _repeat(self, start: int, payload: Payload, frame: int, events: list[StreamEvent]) -> None:
        length = len(payload)
        if not length:
            return
        self.retransmitted_bytes += length
        if self._differs(start, payload):
            self.conflicts += 1
            events.append(OverlapConflict(start, length, frame))
        else:
            events.append(Retransmission(start, length, frame))

    def _differs(self, start: int, payload: Payload) -> bool:
        """Whether ``payload`` (at ``start``) differs from the delivered bytes in the ring
        (work: that of its length, plus a bisection of the ring's gaps)."""
        nxt = self.next_offset
        lo = max(start, nxt - RECENT_BYTES, self._known_from)
        hi = min(start + len(payload), nxt)
        starts = self._hole_starts
        ends = self._hole_ends
        i = bisect.bisect_right(ends, lo, self._hole_head)  # the first gap ending after lo
        while lo < hi:
            if i < len(ends) and starts[i] < hi:
                if starts[i] > lo and self._ring_differs(lo, starts[i], start, payload):
                    return True
                lo = ends[i]
                i += 1
            else:
                return self._ring_differs(lo, hi, start, payload)
        return False

    def _ring_differs(self, lo: int, hi: int, start: int, payload: Payload) -> bool:
        ring = self._ring
        new = payload[lo - start : hi - start]
        pos = lo & RECENT_MASK
        end = pos + hi - lo
        if end <= RECENT_BYTES:
            return ring[pos:end] != new
        split = RECENT_BYTES - pos
        return ring[pos:] != new[:split] or ring[: end - RECENT_BYTES] != new[split:]

    def _park(self, start: int, payload: Payload, missing: int, frame: int) -> None:
        # a copy: a view would keep its whole capture window alive while it waits
        self._parked += 1
        heapq.heappush(self._pending, (start, self._parked, bytes(payload), missing, frame))
        self._pending_bytes += len(payload)

    def _drain(self, frame: int, events: list[StreamEvent], own: bool = False) -> None:
        """Deliver waiting segments that are now in order.

        ``frame`` is the frame that made them in order; with ``own`` (after a declared gap)
        each keeps the frame that carried it, since nothing later completed it.
        """
        pending = self._pending
        while pending and pending[0][0] <= self.next_offset:
            start, _, payload, missing, parked_frame = heapq.heappop(pending)
            if own:
                frame = parked_frame
            self._pending_bytes -= len(payload)
            nxt = self.next_offset
            end = start + len(payload) + missing
            if end <= nxt:
                self._repeat(start, payload, frame, events)
                continue
            skip = nxt - start
            if skip:
                self._repeat(start, payload[:skip], frame, events)
            size = len(payload)
            rest = payload[skip:] if skip < size else payload[:0]
            self._deliver(nxt, rest, missing - max(0, skip - size), frame, events)

    def _force_gap(self, frame: int, events: list[StreamEvent]) -> None:
        first = self._pending[0][0]
        if first > self.next_offset:
            length = first - self.next_offset
            events.append(Gap(self.next_offset, length, frame))
            self.gap_bytes += length
            self._lost(self.next_offset, length)
            self.next_offset = first
        self._drain(frame, events, own=True)

    def acked(self, ack: int, frame: int) -> list[StreamEvent]:
        """The peer acknowledged up to ``ack``: holes below it were lost by the capture only.

        Declares them as gaps at once (instead of at the end of the capture) and delivers
        the waiting data behind them.
        """
        events: list[StreamEvent] = []
        if not self._pending or self.base_seq is None:
            return events
        acked_to = self.offset_of(ack)
        pending = self._pending
        while pending and self.next_offset < pending[0][0] < acked_to:
            self._force_gap(frame, events)
        if events:
            self._check_fin(frame, events)
        return events

    def _check_fin(self, frame: int, events: list[StreamEvent]) -> None:
        fin = self.fin_offset
        if fin is None or self.ended:
            return
        if self.next_offset < fin and not self._pending:
            return  # data still missing before the FIN; wait (flush reports the gap)
        if self.next_offset >= fin:
            self.ended = True
            events.append(StreamEnd(fin, frame))


class Connection:
    """One TCP connection: two half streams and who opened it.

    Attributes: stream (0-based index in order of first appearance), endpoints
    ((ip, port) of side 0, side 1; side 0 sent the SYN when one was seen, else the first
    segment), halves (side 0's sending direction first), syn_seen, first_frame.
    """

    __slots__ = ("stream", "endpoints", "halves", "syn_seen", "first_frame", "user")

    def __init__(
        self,
        stream: int,
        first: tuple[str, int],
        second: tuple[str, int],
        frame: int,
        max_pending: int,
        max_pending_segments: int = DEFAULT_MAX_PENDING_SEGMENTS,
    ) -> None:
        self.stream = stream
        self.endpoints = (first, second)
        self.halves = (
            HalfStream(max_pending, max_pending_segments),
            HalfStream(max_pending, max_pending_segments),
        )
        self.syn_seen = False
        self.first_frame = frame
        self.user: object = None  # slot for the consumer (the MPA tracker)

    def side_of(self, src: tuple[str, int]) -> int:
        """0 when ``src`` is endpoint 0, else 1."""
        return 0 if src == self.endpoints[0] else 1

    @property
    def finished(self) -> bool:
        return self.halves[0].ended and self.halves[1].ended


class TcpReassembler:
    """Routes TCP segments to connections and half streams.

    ``feed(segment)`` returns ``(connection, side, events)`` where ``side`` is the index of
    the sending endpoint; ``flush(frame)`` ends the capture and yields the remaining
    ``(connection, side, events)``.
    """

    def __init__(
        self,
        max_pending: int = DEFAULT_MAX_PENDING,
        max_pending_segments: int = DEFAULT_MAX_PENDING_SEGMENTS,
    ) -> None:
        self.max_pending = max_pending
        self.max_pending_segments = max_pending_segments
        self.connections: list[Connection] = []
        self._by_key: dict[tuple[str, int, str, int], Connection] = {}
        self._sides: dict[tuple[str, int, str, int], tuple[Connection, int]] = {}
        self.deferred: list[tuple[Connection, int, list[StreamEvent]]] = []
        """(connection, side, events) caused in the *other* direction by ACKs; the caller
        drains this list after each :meth:`feed`."""

    def connection_for(self, segment: TcpSegment) -> tuple[Connection, int]:
        if not segment.flags & TCP_SYN:
            entry = self._sides.get((segment.src, segment.sport, segment.dst, segment.dport))
            if entry is not None:
                return entry
        src = (segment.src, segment.sport)
        dst = (segment.dst, segment.dport)
        key = (segment.src, segment.sport, segment.dst, segment.dport)
        conn = self._by_key.get(key)
        fresh_syn = segment.flags & (TCP_SYN | TCP_ACK) == TCP_SYN
        if conn is not None and fresh_syn:
            half = conn.halves[conn.side_of(src)]
            reused = conn.finished or (
                half.isn is not None and half.isn != segment.seq and half.next_offset > 0
            )
            if reused:
                conn = None
        if conn is None:
            conn = Connection(
                len(self.connections),
                src,
                dst,
                segment.frame,
                self.max_pending,
                self.max_pending_segments,
            )
            self.connections.append(conn)
            self._by_key[key] = conn
            self._by_key[(segment.dst, segment.dport, segment.src, segment.sport)] = conn
        side = conn.side_of(src)
        self._sides[key] = (conn, side)
        self._sides[(segment.dst, segment.dport, segment.src, segment.sport)] = (conn, 1 - side)
        syn_ack = segment.flags & (TCP_SYN | TCP_ACK) == TCP_SYN | TCP_ACK
        if (fresh_syn or syn_ack) and not conn.syn_seen:
            conn.syn_seen = True
            if side == (1 if fresh_syn else 0):  # the SYN sender is the opener: put it first
                conn.endpoints = (conn.endpoints[1], conn.endpoints[0])
                conn.halves = (conn.halves[1], conn.halves[0])
                side = 1 - side
                self._sides[key] = (conn, side)
                rev = (segment.dst, segment.dport, segment.src, segment.sport)
                self._sides[rev] = (conn, 1 - side)
        return conn, side

    def feed(self, segment: TcpSegment) -> tuple[Connection, int, list[StreamEvent]]:
        """Events of the sending direction; events this segment's ACK causes in the other
        direction (holes the peer acknowledged) are appended to :attr:`deferred`."""
        conn, side = self.connection_for(segment)
        events = conn.halves[side].feed(
            segment.seq, segment.payload, segment.flags, segment.frame, segment.missing
        )
        if segment.flags & TCP_ACK:
            other = conn.halves[1 - side]
            if other._pending:
                acked = other.acked(segment.ack, segment.frame)
                if acked:
                    self.deferred.append((conn, 1 - side, acked))
        return conn, side, events

    def flush(self, frame: int) -> list[tuple[Connection, int, list[StreamEvent]]]:
        out = []
        for conn in self.connections:
            for side in (0, 1):
                events = conn.halves[side].flush(frame)
                if events:
                    out.append((conn, side, events))
        return out
