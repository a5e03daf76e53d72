"""One direction of a connection: its modes, buffering, gaps and startup frame.

:class:`DirectionDecoder` takes one direction's in-order bytes and runs its mode (see
:mod:`~stack.dissect.decoder`): the MPA Request or Reply at stream offset 0, the held bytes
after a Request, then Full Operation, whose FPDU walk is :class:`~.fpdu_walk.FpduWalk`, and
the mid-stream search, :class:`~.resync.Resync`.
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING

from stack.constants import (
    MPA_FRAME_HEADER_LEN,
    MPA_KEY_LEN,
    MPA_KEY_REP,
    MPA_KEY_REQ,
    MPA_MARKER_LEN,
)
from stack.dissect.decoder.checks import DirectionChecks
from stack.dissect.decoder.common import _HOLD_LIMIT, _MPA_HDR
from stack.dissect.decoder.fpdu_walk import FpduWalk
from stack.dissect.decoder.fpdu_walk import _crc32c as _crc32c  # re-exported for bulk
from stack.dissect.decoder.modes import Cause, Mode, next_mode
from stack.dissect.decoder.records import DirectionInfo
from stack.dissect.decoder.resync import Resync
from stack.wire.checker import Finding

if TYPE_CHECKING:
    from stack.dissect.decoder.connection import ConnectionDecoder

_FPDU = Mode.FPDU  # module globals: an Enum class attribute costs several times more
_DEAD = Mode.DEAD


# ======================================================================================
# Per-direction decoder
# ======================================================================================


class DirectionDecoder(FpduWalk, Resync):
    """One direction's byte stream: startup frame, then FPDUs (see module docstring)."""

    bulk = True
    """Use :meth:`walk_plain` in Full Operation (tests turn it off to compare both paths)."""

    def __init__(self, conn: ConnectionDecoder, side: int) -> None:
        self.conn = conn
        self.side = side
        self.mode = Mode.START
        self.chunks: list[bytes | bytearray | memoryview] = []
        self.buffered = 0
        self.need = MPA_KEY_LEN
        self.base = 0  # stream offset of the first buffered byte
        self.ends: deque[tuple[int, int, float]] = deque()  # (end offset, frame, ts)
        self.crc: bool | None = None
        self.markers: bool | None = None
        self.seq_start = 0
        self.aligned = False  # FPDU starts are known to be 4-aligned to seq_start
        self.seq = DirectionChecks(known=False)  # True once Full Operation starts in view
        self.searched = 0
        self._scan_base = -1
        self._bulk: tuple | None = None  # walk_plain's per-direction constants
        self._scan: dict[tuple[bool, bool], set[int] | int] = {}
        self._cut_upto: dict[int, int] = {}
        self.candidates_tried = 0
        self._tries_left = 0
        self._wants = 0
        self._phase_wake: dict[bool, list[tuple[int, int]]] = {}
        self._phase_found: dict[bool, dict[int, int]] = {}
        self._early: dict[tuple[bool, int], list] = {}
        self._grow: bytearray | None = None
        """The searched bytes, appended to in place while a search waits for more."""
        self.sent_request = False
        self.info = DirectionInfo()

    def enter(self, cause: Cause) -> None:
        """Change mode by the transition table (:data:`~.modes.TRANSITIONS`)."""
        self.mode = next_mode(self.mode, cause)

    # ---- buffering ------------------------------------------------------------------
    def push(
        self, data: bytes | bytearray | memoryview, offset: int, frame: int, ts: float
    ) -> None:
        chunks = self.chunks
        if not chunks:
            self.base = offset
            chunks.append(data)
        elif chunks[0] is self._grow and len(chunks) == 1:
            try:  # a waiting search's bytes: appended in place, no object per segment
                chunks[0] += data
            except BufferError:  # pragma: no cover - a view of them is still held
                chunks.append(data)
        else:
            chunks.append(data)
        self.buffered += len(data)
        self.ends.append((offset + len(data), frame, ts))
        if self.mode is _DEAD:
            self.info.undecoded_bytes += len(data)
            self._drop_all()
            return
        if self.buffered >= self.need:
            if self.mode is _FPDU and self.bulk:
                # the waiting partial FPDU is now complete: walk the joined bytes in bulk
                joined = self._joined()
                base = self.base
                self.chunks = []
                self.buffered = 0
                self.ends.clear()
                self.walk_plain(joined, base, frame, ts)
                return
            self.run(False)

    def _joined(self) -> memoryview:
        chunks = self.chunks
        if len(chunks) == 1:
            buf = chunks[0]
            return buf if isinstance(buf, memoryview) else memoryview(buf)
        if self.mode is Mode.SEARCH:
            # a search waiting for more bytes: the new ones are appended to the searched
            # ones in place (joining them all again per segment is quadratic in tiny ones)
            grow = self._grow
            if grow is not None and chunks[0] is grow:
                try:
                    for chunk in chunks[1:]:
                        grow += chunk
                except BufferError:  # a view of it is still held: copy it once
                    grow = None
            if grow is None or chunks[0] is not grow:
                grow = self._grow = bytearray().join(chunks)
            self.chunks = [grow]
            return memoryview(grow)
        joined = b"".join(chunks)
        self.chunks = [joined]
        return memoryview(joined)

    def _consume(self, n: int) -> None:
        """Drop the first ``n`` buffered bytes."""
        if not n:
            return
        if n == self.buffered:
            self._drop_all()
            return
        buf = self._joined()
        rest = buf[n:]
        self.chunks = [rest] if len(rest) else []
        self.buffered -= n
        self.base += n
        ends = self.ends
        while ends and ends[0][0] <= self.base:
            ends.popleft()

    def _drop_all(self) -> None:
        self.base += self.buffered
        if self.chunks:
            self.chunks = []
            self._grow = None
        self.buffered = 0
        if self.ends:
            self.ends.clear()

    def _frame_at(self, end: int) -> tuple[int, float]:
        ends = self.ends
        if len(ends) == 1:
            e, frame, ts = ends[0]
            if e >= end:
                return frame, ts
        for e, frame, ts in ends:
            if e >= end:
                return frame, ts
        last = self.ends[-1] if self.ends else (0, self.conn.last_frame, 0.0)
        return last[1], last[2]

    # ---- gaps -----------------------------------------------------------------------
    def gap(self, offset: int, length: int, frame: int) -> None:
        self.info.gap_bytes += length
        lost = self.buffered
        self._drop_all()
        self.base = offset + length
        what = f"TCP gap: {length} bytes never captured at offset {offset}"
        if lost:
            what += f"; {lost} buffered bytes of a partial PDU dropped"
        self.conn.note(self.side, frame, "gap", what, offset)
        if self.mode in (Mode.FPDU, Mode.SEARCH):
            if self.mode is Mode.FPDU:
                self.conn.pending_findings[self.side].append(Finding("TCP-GAP", what))
            self.enter(Cause.GAP)
            self.searched = 0
            self.seq.forget()
            self.need = 1
        elif self.mode in (Mode.START, Mode.HOLD):
            self.enter(Cause.GAP)
            self.aligned = False
            self.searched = 0
            self.seq.forget()
            self.need = 1

    def finish(self, frame: int) -> None:
        if self.buffered and self.mode is not Mode.DEAD:
            self.run(True)
        if self.buffered:
            if self.mode is not Mode.DEAD:
                self.conn.note(
                    self.side,
                    frame,
                    "trailing",
                    f"{self.buffered} bytes at the end of the stream do not complete a PDU",
                    self.base,
                )
            self.info.undecoded_bytes += self.buffered
            self._drop_all()

    # ---- main loop ------------------------------------------------------------------
    def run(self, final: bool) -> None:
        while self.buffered:
            mode = self.mode
            if mode is _FPDU:
                if not self._walk():
                    return
            elif mode is Mode.START:
                if not self._startup(final):
                    return
            elif mode is Mode.SEARCH:
                if not self._search(final):
                    return
            elif mode is Mode.HOLD and self.buffered >= _HOLD_LIMIT:
                self._no_reply()
            else:  # hold, dead
                return

    def hold(self) -> None:
        """This direction sent its MPA Request: what follows waits for the Reply's settings
        (HOLD), copied into one buffer as it arrives, up to :data:`_HOLD_LIMIT` bytes."""
        self.enter(Cause.REQUEST)
        self.seq_start = self.base
        grow = self._grow = bytearray(self._joined()) if self.buffered else bytearray()
        self.chunks = [grow]
        self.need = _HOLD_LIMIT

    def _no_reply(self) -> None:
        """The held bytes reached :data:`_HOLD_LIMIT` and no Reply is in view: stop waiting
        for its settings and search for the FPDUs, which begin at SeqStart (RFC 5044
        §7.1.2), detecting markers (and CRC unless the Request asked for it)."""
        conn = self.conn
        conn.note(
            self.side,
            self._frame_at(self.base + 1)[0],  # where the held bytes begin
            "no_reply",
            f"{self.buffered} bytes after the MPA Request and no Reply in view: "
            "searching for FPDUs without its settings",
            self.base,
        )
        self.enter(Cause.NO_REPLY)
        req = conn.request if conn.initiator == self.side else None
        if conn.opts.crc is None and req is not None and req.crc:
            self.crc = True  # asked for by the Request, so negotiated (RFC 5044 §7.1.1)
        self.aligned = True  # the first FPDU starts at the base, SeqStart
        self.searched = 0
        self.need = 1

    def late_reply(self, crc: bool, markers: bool) -> None:
        """The MPA Reply came after this direction's held bytes went to the search
        (:meth:`_no_reply`): its settings (RFC 5044 §7.1.1, M and C) apply from where the
        direction stands.  A search still at SeqStart frames the held bytes from there,
        as if the Reply had come in time (§7.1.2); one past it (bytes given up, a gap)
        searches with the known settings only; FPDUs already found are checked with the
        negotiated CRC setting from now on (their framing stays as found)."""
        self.crc = crc
        self.info.crc = crc
        if self.mode is not Mode.SEARCH:
            return
        self.markers = markers
        self.info.markers = markers
        self.conn.dissector.searching.discard(self)
        if self.aligned and self.base == self.seq_start:
            self.enter(Cause.FULL_OPERATION)
            self.info.seq_start = self.seq_start
            self.seq.known = True
            self.need = MPA_MARKER_LEN + 2 if markers else 2
        if self.buffered:
            self.run(False)

    # ---- startup frames -------------------------------------------------------------
    def _startup(self, final: bool) -> bool:
        conn = self.conn
        if self.base != 0 or not conn.tcp.halves[self.side].syn_seen:
            return self._begin_midstream()
        buf = self._joined()
        if len(buf) < MPA_KEY_LEN:
            self.need = MPA_KEY_LEN
            return False
        key = bytes(buf[:MPA_KEY_LEN])
        if key not in (MPA_KEY_REQ, MPA_KEY_REP):
            if conn.opts.mid_stream:
                return self._begin_midstream()
            if conn.request is not None and conn.initiator != self.side:
                why = "the answer to the MPA Request is not an MPA Reply (MPA-18)"
            else:
                why = "the connection does not start with an MPA Request"
            conn.not_iwarp(self, why, both=True)
            return False
        if len(buf) < MPA_FRAME_HEADER_LEN:
            self.need = MPA_FRAME_HEADER_LEN
            return False
        _, flags, rev, pd_len = _MPA_HDR.unpack_from(buf)
        total = MPA_FRAME_HEADER_LEN + pd_len
        if len(buf) < total:
            if pd_len > conn.opts.max_private_data and not final:
                # malformed: a receiver would close now; still show what arrived
                pass
            self.need = total
            if not final:
                return False
            total = len(buf)
        frame_no, ts = self._frame_at(self.base + total)
        raw = bytes(buf[:total])
        offset = self.base
        self._consume(total)
        conn.startup_frame(self, key == MPA_KEY_REP, raw, offset, flags, rev, pd_len, frame_no, ts)
        return True

    def _begin_midstream(self) -> bool:
        self.enter(Cause.MIDSTREAM)
        self.seq.forget()
        self.conn.midstream(self)
        self.need = 1
        return True

    def enter_fpdu(self, crc: bool, markers: bool) -> None:
        """Full Operation starts at the current base (RFC 5044 §7.1.2)."""
        self.crc = crc
        self.markers = markers
        self.seq_start = self.base
        self.aligned = True
        self.info.crc = crc
        self.info.markers = markers
        self.info.seq_start = self.base
        self.enter(Cause.FULL_OPERATION)
        self.seq.known = True
        self.need = MPA_MARKER_LEN + 2 if markers else 2
