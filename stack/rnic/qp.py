"""Reliable-connected queue pairs: the RDMAP consumer side of the software RNIC.

Theory of operation.  A :class:`QueuePair` is a synchronous engine (no I/O):

* Work requests go in with :meth:`post_send` / :meth:`post_recv`.  The send queue is
  processed in order (RFC 5040 §5.5 rule 13): each WR becomes one or more RDMAP messages
  on the *outbound queue*.  A Read or atomic waits at the head while ORD credits are used
  up (RDMAP-14), and a fenced WR waits for every earlier Read and atomic to finish.
* The transport drains the outbound queue with :meth:`take_outgoing` and encodes the
  messages.  Payloads are memoryviews of registered memory, read when the message is
  encoded, as an RNIC reads memory when it transmits.  A Send or Write completes when it
  has been handed to the transport (rule 14); a Read when its response is delivered (rule
  19); an atomic when its response arrives.  Completions of one send queue are reported in
  submit order (rule 15), signalled ones only (selective signalling).
* Inbound RDMAP events (already validated in form by :class:`stack.wire.stream.RdmapStream`)
  go in with :meth:`handle_event`.  Every protection check happens here, before any byte
  is placed (RFC 5042 §6.1-6.2, DDP-10); a failure raises a :class:`ProtocolError` carrying the
  Terminate cause, and the caller sends the Terminate and calls :meth:`fatal`, which moves
  the QP to TERMINATE and flushes every outstanding WR (WR_FLUSH_ERR); a Terminate from the
  peer does the same.  The QP reaches ERROR when the stream closes (:meth:`stream_closed`).
* Orderly close (RFC 5040 §6.2, DDP-13): :meth:`close` (ours) keeps sending what was posted
  before it, then the transport sends FIN; :meth:`peer_closed` (the peer's FIN) keeps what
  arrived before it and sends what can still complete, and flushes, in submit order, the
  WRs that needed an answer from the peer and every WR after them.  Both are CLOSING.
* State changes that the application must hear of raise asynchronous events
  (:mod:`stack.rnic.events`) on the RNIC's queue, naming the QP and the Terminate's cause.
* Inbound Read Requests and Atomic Requests occupy an IRD slot until their response has been
  drained by the transport; one more than IRD is a Terminate 0/2/0x07 (SEC-10).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from stack.constants import (
    SOLICITED_OPCODES,
    TERM_DDP_U_NO_BUFFER,
    TERM_DDP_U_TOO_LONG,
    TERM_RDMAP_CATASTROPHIC_STREAM,
    Opcode,
)
from stack.errors import DdpError, ProtocolError, RdmapError
from stack.rnic.memory import (
    DDP_TAGGED_CODES,
    RDMAP_REMOTE_CODES,
    MemoryOpError,
    check_remote_access,
    local_invalidate,
    remote_invalidate,
)
from stack.rnic.qp_base import (
    _FAILED,
    _LE64,
    _LOCAL_WRITE,
    _REMOTE_ATOMIC,
    _REMOTE_READ,
    _REMOTE_WRITE,
    MAX_SNAPSHOT_BYTES,
    MAX_STALLED_SNAPSHOT_BYTES,
    QpCap,
    QpState,
    SharedReceiveQueue,
    _LocalWrError,
    _RecvInProgress,
    _scatter,
    _SqEntry,
)
from stack.rnic.qp_send import QpSend
from stack.rnic.verbs import (
    RecvWR,
    WcFlags,
    WcOpcode,
    WcStatus,
    WrOpcode,
)
from stack.wire.events import (
    AtomicRequest,
    AtomicRequestReceived,
    AtomicResponse,
    AtomicResponseReceived,
    ImmediateDataReceived,
    MessageEvent,
    RdmapEvent,
    ReadRequest,
    ReadRequestReceived,
    ReadResponse,
    ReadResponseSegment,
    SendSegment,
    TerminateReceived,
    WriteSegment,
)

__all__ = [
    "MAX_SNAPSHOT_BYTES",
    "MAX_STALLED_SNAPSHOT_BYTES",
    "QpCap",
    "QpState",
    "QueuePair",
    "SharedReceiveQueue",
]


class QueuePair(QpSend):
    """An RC queue pair on one RDMAP stream."""

    bulk_messages_left = -1
    """How many more one-segment messages :meth:`place_message` may apply (negative: no
    limit; 0: none, they become events); the endpoint sets it per feed from its budget."""

    # ------------------------------------------------------------------ receive side
    def handle_event(self, event: RdmapEvent) -> None:
        """Apply one inbound RDMAP event.  Raises ProtocolError (with Terminate cause), which
        names the event's ULPDU (``ulpdu``) for the Terminate's header copies."""
        if self.state in _FAILED:
            return
        if self._lazy and type(event) is not ReadRequestReceived:
            self._snapshot_reads()
        try:
            _RECEIVE_HANDLERS[type(event)](self, event)
        except ProtocolError as exc:
            if exc.ulpdu is None and not isinstance(event, TerminateReceived):
                exc.ulpdu = event.ulpdu
            raise

    def place_tagged(
        self, write: bool, last: bool, stag: int, to: int, payload: memoryview, ulpdu: memoryview
    ) -> bool:
        """The bulk path: place a tagged Write or Read Response segment with no event (a
        :data:`~stack.wire.stream.TaggedPlacer`), by the same checks and placement as
        :meth:`handle_event`.  False (nothing done) when :meth:`handle_event` would do more
        than place: queued Read Responses still view memory (snapshot first, RFC 5040
        §5.5), or the QP has failed (dropped there)."""
        if self._lazy or self.state in _FAILED:
            return False
        try:
            if write:  # _place_write, inline: the bulk of a receiver's segments
                if payload:
                    check_remote_access(
                        self.table,
                        self.pd,
                        stag,
                        to,
                        len(payload),
                        _REMOTE_WRITE,
                        DDP_TAGGED_CODES,
                        self,
                    )[:] = payload
                if self.on_remote_write is not None:
                    self.on_remote_write()
            else:
                self._place_read_response(stag, to, payload, last)
        except ProtocolError as exc:
            if exc.ulpdu is None:
                exc.ulpdu = ulpdu
            raise
        return True

    def place_message(self, event: MessageEvent) -> bool:
        """The bulk path for a one-segment message (Read Request, atomic Request or
        Response, Immediate Data; a :data:`~stack.wire.stream.MessagePlacer`): applied as
        :meth:`handle_event` applies it, one of :attr:`bulk_messages_left`.  False (nothing
        done) when none is left, or when :meth:`handle_event` would do more: queued Read
        Responses still view memory (snapshot first, RFC 5040 §5.5), or the QP has failed
        (dropped there)."""
        if self._lazy or not self.bulk_messages_left or self.state in _FAILED:
            return False
        self.bulk_messages_left -= 1
        self.handle_event(event)  # no snapshot to take, not failed: the handler alone
        return True

    def _on_write_segment(self, seg: WriteSegment) -> None:
        self._place_write(seg.stag, seg.to, seg.data)

    def _place_write(self, stag: int, to: int, data: memoryview) -> None:
        """Tagged placement (RFC 5041 §4.1): checked, then copied into the tagged buffer
        (the bulk path, :meth:`place_tagged`, has these lines inline)."""
        if data:
            view = check_remote_access(
                self.table, self.pd, stag, to, len(data), _REMOTE_WRITE, DDP_TAGGED_CODES, self
            )
            view[:] = data
        if self.on_remote_write is not None:
            self.on_remote_write()

    def _on_read_request_received(self, event: ReadRequestReceived) -> None:
        self._take_ird("Read Request")
        self._on_read_request(event.request)

    def _on_atomic_request_received(self, event: AtomicRequestReceived) -> None:
        self._take_ird("Atomic Request")
        self._on_atomic_request(event.request)

    def _on_atomic_response_received(self, event: AtomicResponseReceived) -> None:
        self._on_atomic_response(event.response)

    def _on_immediate_data(self, event: ImmediateDataReceived) -> None:
        wr = self._take_recv()
        flags = WcFlags.WITH_IMM | (WcFlags.SOLICITED if event.solicited else WcFlags.NONE)
        self._complete_recv(
            wr, WcStatus.SUCCESS, WcOpcode.RECV_RDMA_WITH_IMM, imm=event.data, flags=flags
        )

    def _on_terminate(self, event: TerminateReceived) -> None:
        self.peer_terminate = event.terminate
        self.fatal(None, send_terminate=False)

    def _take_ird(self, what: str) -> None:
        if self.ird_full:
            raise RdmapError(
                "RDMAP-14",
                f"{what} beyond IRD {self.ird} (peer exceeded its ORD)",
                TERM_RDMAP_CATASTROPHIC_STREAM,
            )
        self._inbound_pending += 1

    def _take_recv(self) -> RecvWR:
        queue = self.srq._queue if self.srq is not None else self._rq
        if not queue:
            raise DdpError(
                "RDMAP-08", "untagged message with no receive posted", TERM_DDP_U_NO_BUFFER
            )
        return queue.popleft()

    def place_send(
        self,
        opcode: Opcode,
        msn: int,
        mo: int,
        payload: memoryview,
        last: bool,
        invalidate_stag: int | None,
        ulpdu: memoryview,
    ) -> bool:
        """The bulk path for Send segments (a :data:`~stack.wire.stream.SendPlacer`): the
        same placement and completion as :meth:`handle_event` of the segment's event, or
        False (nothing done) where that would do more (:meth:`place_tagged`)."""
        if self._lazy or self.state in _FAILED:
            return False
        try:
            self._place_send(opcode, msn, mo, payload, last, invalidate_stag)
        except ProtocolError as exc:
            if exc.ulpdu is None:
                exc.ulpdu = ulpdu
            raise
        return True

    def _on_send_segment(self, seg: SendSegment) -> None:
        self._place_send(seg.opcode, seg.msn, seg.mo, seg.data, seg.last, seg.invalidate_stag)

    def _place_send(
        self,
        opcode: Opcode,
        msn: int,
        mo: int,
        data: memoryview,
        last: bool,
        invalidate_stag: int | None,
    ) -> None:
        """Untagged placement (RFC 5041 §4.2): at ``mo`` of the receive that MSN ``msn``
        consumes (RDMAP-08), completed with the last segment."""
        recv = self._recv
        if recv is None or recv.msn != msn:
            wr = self._take_recv()
            recv = _RecvInProgress(msn, wr)
            try:
                for sge in wr.sg_list:
                    _mr, view = self._local(sge, _LOCAL_WRITE)
                    recv.views.append(view)
                    recv.capacity += sge.length
            except _LocalWrError as exc:
                self._complete_recv(wr, exc.status, WcOpcode.RECV)
                raise RdmapError("RDMAP-08", str(exc), TERM_RDMAP_CATASTROPHIC_STREAM) from None
            self._recv = recv
        end = mo + len(data)
        if end > recv.capacity:
            raise DdpError(
                "RDMAP-08",
                f"Send of at least {end} bytes exceeds the {recv.capacity}-byte receive buffer",
                TERM_DDP_U_TOO_LONG,
            )
        _scatter(recv.views, mo, data)
        if not last:
            return
        flags = WcFlags.SOLICITED if opcode in SOLICITED_OPCODES else WcFlags.NONE
        invalidated = None
        if invalidate_stag is not None:  # refused: the receive is flushed with the rest
            remote_invalidate(self.table, self.pd, invalidate_stag, self)
            invalidated = invalidate_stag
            flags |= WcFlags.WITH_INV
        self._recv = None
        self._complete_recv(
            recv.wr, WcStatus.SUCCESS, WcOpcode.RECV, byte_len=end, flags=flags, inval=invalidated
        )

    def _on_read_request(self, req: ReadRequest) -> None:
        if req.size == 0:  # RDMAP-07: no validation, zero-length response
            self._queue_response(ReadResponse(req.sink_stag, req.sink_to, b""))
            return
        view = check_remote_access(
            self.table,
            self.pd,
            req.src_stag,
            req.src_to,
            req.size,
            _REMOTE_READ,
            RDMAP_REMOTE_CODES,
            self,
        )
        self._queue_response(ReadResponse(req.sink_stag, req.sink_to, view))

    def _on_read_response(self, seg: ReadResponseSegment) -> None:
        self._place_read_response(seg.stag, seg.to, seg.data, seg.last)

    def _place_read_response(self, stag: int, to: int, data: memoryview, last: bool) -> None:
        """Place a Read Response segment in its Read's sink (matched by the request tracker,
        RDMAP-04: Sink STag, continuing Sink TO, the requested size)."""
        size = len(data)
        match = self._requests.read_response(stag, to, size, last, self._checker)
        assert match is not None  # strict: no outstanding Read raises
        request, offset = match
        entry = request.context
        assert isinstance(entry, _SqEntry) and entry.sink is not None
        if size:
            entry.sink[offset : offset + size] = data
            entry.received += size
        if last:
            entry.byte_len = entry.received
            if entry.wr.opcode is _READ_WITH_INV:
                try:  # the sink STag, invalidated locally once the Read completes
                    local_invalidate(self.table, self.pd, entry.sink_stag)
                except MemoryOpError as exc:  # the sink went away meanwhile
                    entry.status = exc.status
            entry.done = True
            self._reap_sq()
            if self._pending:  # WRs the Read held (ORD, a fence); else nothing to progress
                self._progress_sq()

    def _on_atomic_request(self, req: AtomicRequest) -> None:
        view = check_remote_access(
            self.table,
            self.pd,
            req.stag,
            req.to,
            8,
            _REMOTE_ATOMIC,
            RDMAP_REMOTE_CODES,
            self,
        )
        del view  # validated; the MR's atomic engine does the access
        mr = self.table.lookup(req.stag)
        assert mr is not None
        self._queue_response(AtomicResponse(req.req_id, mr.atomic(req)))

    def _on_atomic_response(self, resp: AtomicResponse) -> None:
        """Return an atomic's original value to its WR (matched in order, EXT-03)."""
        _matched, entry = self._requests.atomic_response(resp.req_id, self._checker)
        assert isinstance(entry, _SqEntry) and entry.sink is not None
        entry.sink[:] = _LE64.pack(resp.orig_value)
        entry.done = True
        self._reap_sq()
        if self._pending:  # WRs the atomic held (ORD, a fence); else nothing to progress
            self._progress_sq()


_READ_WITH_INV = WrOpcode.RDMA_READ_WITH_INV  # a module global: Enum.MEMBER is slow

_RECEIVE_HANDLERS: dict[type, Callable[[QueuePair, Any], None]] = {
    WriteSegment: QueuePair._on_write_segment,
    SendSegment: QueuePair._on_send_segment,
    ReadResponseSegment: QueuePair._on_read_response,
    ReadRequestReceived: QueuePair._on_read_request_received,
    AtomicRequestReceived: QueuePair._on_atomic_request_received,
    AtomicResponseReceived: QueuePair._on_atomic_response_received,
    ImmediateDataReceived: QueuePair._on_immediate_data,
    TerminateReceived: QueuePair._on_terminate,
}
"""Receive dispatch by event type (every :data:`~stack.wire.events.RdmapEvent` kind)."""
