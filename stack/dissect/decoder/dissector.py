"""The dissector: TCP segments in, PDU records and notes out."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any, Generic, Literal, TypeVar, overload

from stack.dissect.decoder.bulk import ingest_lean
from stack.dissect.decoder.common import _TCP_SPECIAL
from stack.dissect.decoder.connection import ConnectionDecoder, FinishedConnection
from stack.dissect.decoder.modes import Mode
from stack.dissect.decoder.records import (
    BriefFpdu,
    BriefText,
    DissectOptions,
    Note,
    PduRecord,
    StreamInfo,
)
from stack.dissect.decoder.walker import DirectionDecoder
from stack.dissect.tcp import (
    RECENT_MASK,
    Connection,
    HalfStream,
    TcpReassembler,
)
from stack.pcap import LeanSegment, TcpSegment

if TYPE_CHECKING:
    from stack.dissect.text import BriefLines

# ======================================================================================
# The dissector
# ======================================================================================

Output = PduRecord | Note
BriefOutput = PduRecord | Note | BriefFpdu | BriefText
"""What ``Dissector(brief=True)`` yields (:data:`~.records.BriefText` only when given
:attr:`Dissector.text`)."""
_Route = tuple[HalfStream, HalfStream, "ConnectionDecoder", "DirectionDecoder"]
"""(sender's TCP half, the other TCP half, MPA connection, sender's MPA half)."""


_FPDU = Mode.FPDU  # a module global: an Enum class attribute costs several times more


def _frame_of(item: BriefOutput) -> int:
    return item[0] if type(item) is tuple else item.frame  # type: ignore[union-attr]


OutputT = TypeVar("OutputT", Output, BriefOutput)


class Dissector(Generic[OutputT]):
    """Feed TCP segments in capture order; collect :class:`PduRecord` and :class:`Note`.

    ``feed(segment)`` returns the records completed by that segment; ``finish()``
    flushes the reassembly and returns what the end of the capture completes.
    ``streams()`` lists :class:`StreamInfo` of every connection seen.  ``brief``: clean
    FPDUs of the bulk path come out as :data:`~.records.BriefFpdu` tuples instead of
    records (the one-line summary needs no more; every other FPDU is still a record).
    """

    @overload
    def __init__(
        self: Dissector[Output], options: DissectOptions | None = None, brief: Literal[False] = ...
    ) -> None: ...
    @overload
    def __init__(
        self: Dissector[BriefOutput], options: DissectOptions | None, brief: bool
    ) -> None: ...
    def __init__(self, options: DissectOptions | None = None, brief: bool = False) -> None:
        self.options = options or DissectOptions()
        self.brief = brief
        self.tcp = TcpReassembler()
        self._routes: dict[
            tuple[str, int, str, int],
            tuple[HalfStream, HalfStream, ConnectionDecoder, DirectionDecoder],
        ] = {}
        self._conns: dict[int, ConnectionDecoder | FinishedConnection] = {}
        self._out: list[Any] = []  # OutputT items
        self.searching: set[DirectionDecoder] = set()
        self._held = False
        self.last_frame = 0
        self.last_ts = 0.0
        self.text: BriefLines | None = None
        """The printer's line maker (brief only): the fused path of :meth:`ingest_lean`
        then yields the summary lines of its FPDUs (:data:`~.records.BriefText`)."""

    def _emit(self, item: Output) -> None:
        self._out.append(item)

    def _conn(self, tcp_conn: Connection) -> ConnectionDecoder | FinishedConnection:
        conn = tcp_conn.user
        if conn is None:
            conn = self._conns[tcp_conn.stream] = ConnectionDecoder(self, tcp_conn)
            tcp_conn.user = conn
        assert isinstance(conn, ConnectionDecoder | FinishedConnection)
        return conn

    def feed(self, segment: TcpSegment) -> list[OutputT]:
        """Decode ``segment``; return what it completes (see :meth:`take`)."""
        self.ingest(segment)
        return self.take()

    def take(self) -> list[OutputT]:
        """The records and notes completed so far, in capture order; none while a
        direction is still looking for FPDUs (held, then sorted by frame)."""
        if not self._out:
            return []
        if self.searching:
            self._held = True
            return []
        return self._release()

    def ingest(self, segment: TcpSegment) -> None:
        """Decode ``segment``, keeping what it completes for :meth:`take` (a caller
        that takes the output of many segments at once saves a call per segment)."""
        self.ingest_many((segment,))

    def ingest_many(
        self, segments: Iterable[TcpSegment], cut: Callable[[TcpSegment], object] | None = None
    ) -> int:
        """:meth:`ingest` every segment of ``segments`` in turn; return how many there were.

        One call for a batch: the bulk path (the next in-order bytes of a known connection
        go straight to MPA) runs without a call per segment.  ``cut`` is called with each
        segment whose snapshot length cut its payload, before it is decoded.
        """
        routes = self._routes
        count = 0
        frame = self.last_frame
        ts = self.last_ts
        try:
            for segment in segments:
                count += 1
                frame = segment.frame
                ts = segment.timestamp
                if not segment.flags & _TCP_SPECIAL and not segment.missing:
                    # bulk path (the same steps as TcpReassembler.feed's fast path, without
                    # event objects)
                    route = routes.get((segment.src, segment.sport, segment.dst, segment.dport))
                    if route is not None:
                        half, other, conn, mpa_half = route
                        base_seq = half.base_seq
                        if (
                            base_seq is not None
                            and half.fin_offset is None
                            and not half._pending
                            and not other._pending
                        ):
                            nxt = half.next_offset
                            if segment.seq == (base_seq + nxt) & 0xFFFFFFFF:
                                payload = segment.payload
                                size = len(payload)
                                if size:
                                    half.next_offset = nxt + size
                                    half.delivered_bytes += size
                                    ring = half._ring_view  # HalfStream._remember
                                    pos = nxt & RECENT_MASK
                                    end = pos + size
                                    if end <= len(ring):
                                        ring[pos:end] = payload
                                    else:
                                        half._remember(nxt, payload)
                                    if frame > conn.last_frame:
                                        conn.last_frame = frame
                                    if (
                                        mpa_half.mode is _FPDU
                                        and not mpa_half.chunks
                                        and mpa_half.bulk
                                    ):
                                        mpa_half.walk_plain(payload, nxt, frame, ts)
                                    else:
                                        mpa_half.push(payload, nxt, frame, ts)
                                continue
                elif cut is not None and segment.missing:
                    cut(segment)
                self._general(segment, ts)
        finally:
            self.last_frame = frame
            self.last_ts = ts
        return count

    def ingest_lean(
        self, segments: Iterable[LeanSegment], cut: Callable[[TcpSegment], object] | None = None
    ) -> int:
        """:meth:`ingest_many` of :data:`~stack.pcap.packet.LeanSegment` tuples
        (:meth:`CaptureReader.lean <stack.pcap.CaptureReader.lean>`), by the fused path of
        :func:`~.bulk.ingest_lean`: the same records, notes and counters."""
        return ingest_lean(self, segments, cut)

    def _general(self, segment: TcpSegment, ts: float) -> None:
        """The general path of one segment: TCP reassembly events, then MPA."""
        tcp_conn, side, events = self.tcp.feed(segment)
        user = tcp_conn.user
        conn = user if isinstance(user, ConnectionDecoder) else self._conn(tcp_conn)
        if isinstance(conn, ConnectionDecoder):
            # the route the bulk path takes for this direction from now on
            self._routes[(segment.src, segment.sport, segment.dst, segment.dport)] = (
                tcp_conn.halves[side],
                tcp_conn.halves[1 - side],
                conn,
                conn.halves[side],
            )
        if events:
            conn.events(side, events, ts)
        deferred = self.tcp.deferred
        if deferred:
            for other_conn, other_side, other_events in deferred:
                self._conn(other_conn).events(other_side, other_events, ts)
            deferred.clear()

    def retire(self, conn: ConnectionDecoder, finished: FinishedConnection) -> None:
        """``conn`` is over: keep ``finished`` (its statistics) in its place and drop the
        bulk path's routes (both directions), so that its decoder state is freed."""
        tcp_conn = conn.tcp
        tcp_conn.user = self._conns[conn.stream] = finished
        (a_ip, a_port), (b_ip, b_port) = tcp_conn.endpoints
        self._routes.pop((a_ip, a_port, b_ip, b_port), None)
        self._routes.pop((b_ip, b_port, a_ip, a_port), None)

    def _release(self) -> list[OutputT]:
        items = self._out[:]
        self._out.clear()
        if self._held:  # held output from several directions: back into capture order
            self._held = False
            items.sort(key=_frame_of)
        return items

    def finish(self) -> list[OutputT]:
        for tcp_conn, side, events in self.tcp.flush(self.last_frame):
            self._conn(tcp_conn).events(side, events, self.last_ts)
        for conn in self._conns.values():
            conn.finish(self.last_frame)
        self.searching.clear()
        return self._release()

    def streams(self) -> list[StreamInfo]:
        return [self._conns[k].info for k in sorted(self._conns)]


def dissect(
    segments: Iterable[TcpSegment], options: DissectOptions | None = None
) -> Iterator[Output]:
    """Decode TCP segments into records and notes, in capture order."""
    dissector = Dissector(options)
    for segment in segments:
        out = dissector.feed(segment)
        if out:
            yield from out
    yield from dissector.finish()
