"""Mid-stream resynchronisation: finding FPDU boundaries without the stream start.

The search stays linear in the bytes searched whatever they hold: a pass over the same
bytes resumes where the last one stopped (dead marker phases, markers that point before the
data, the first unmarked start not ruled out), a phase whose markers all point before the
data tries only the starts where a complete FPDU with no marker inside passes the checks
(found in one scan shared by every phase), and each search of one setting examines at
most :data:`~stack.dissect.decoder.common._SEARCH_TRIES` candidate starts by its marker
phases.  :attr:`Resync.candidates_tried` counts them.

The work per TCP segment is that of its bytes, however small the segments: a search that
waits is run again only once the bytes it waits for are there (:attr:`Resync._wants`: the
next marker of a phase, RFC 5044 §5, or the end of the next FPDU of a chain, §4), the
unaligned marker phases are looked at only when due (:meth:`Resync._search_phases`), and
the buffered bytes grow in place rather than being joined again.
"""

from __future__ import annotations

import heapq
import struct
from typing import TYPE_CHECKING, cast

from stack.constants import (
    DDP_UNTAGGED_HDR_LEN,
    MPA_CRC_LEN,
    MPA_FPDUPTR_MASK,
    MPA_LENGTH_LEN,
    MPA_MARKER_INTERVAL,
    MPA_MARKER_LEN,
)
from stack.crc import crc32c
from stack.dissect.decoder.checks import _plausible_ulpdu
from stack.dissect.decoder.common import (
    _LE32,
    _MIN_ULPDU,
    _SEARCH_GIVE_UP,
    _SEARCH_MIN_FPDUS,
    _SEARCH_SPAN,
    _SEARCH_TRIES,
)
from stack.dissect.decoder.modes import Cause
from stack.wire.framing import fpdu_layout, unmarked_body

if TYPE_CHECKING:
    from stack.dissect.decoder.checks import DirectionChecks
    from stack.dissect.decoder.connection import ConnectionDecoder
    from stack.dissect.decoder.records import DirectionInfo
    from stack.dissect.decoder.walker import DirectionDecoder


class Resync:
    """Mid-stream synchronisation of a :class:`~stack.dissect.decoder.walker.DirectionDecoder`:
    finding FPDU boundaries when the capture starts mid-connection or a TCP gap lost them
    (the ``search`` mode)."""

    # The direction's state, kept by DirectionDecoder (declared here for the type checker).
    conn: ConnectionDecoder
    side: int
    base: int
    buffered: int
    need: int
    crc: bool | None
    markers: bool | None
    seq_start: int
    aligned: bool
    seq: DirectionChecks
    searched: int
    info: DirectionInfo
    _scan_base: int
    _scan: dict[tuple[bool, bool], set[int] | int]
    _cut_upto: dict[int, int]
    """Per marker phase: the first of its markers not yet seen pointing before the data."""
    candidates_tried: int
    """Candidate FPDU starts examined by marker phases, over the direction's life (each
    search of one setting adds at most :data:`_SEARCH_TRIES`)."""
    _tries_left: int
    _wants: int
    """The fewest buffered bytes at which a waiting candidate of the current search can
    change (the end of the next FPDU or marker it lacks); the search waits until then."""
    _phase_wake: dict[bool, list[tuple[int, int]]]
    """Per CRC setting, unaligned marker phases still waiting, as a heap of (bytes at
    which the phase can change, phase): a search looks only at the phases due."""
    _phase_found: dict[bool, dict[int, int]]
    """Per CRC setting: marker phases whose markers point at a start whose chain holds."""
    _early: dict[tuple[bool, int], list]
    """Per (CRC setting, found phase): the earlier-start search's progress, [next start
    not yet tried, earliest start whose chain holds or None, heap of (bytes, start) of
    starts whose chain waits]."""

    @property
    def _decoder(self) -> DirectionDecoder:
        return cast("DirectionDecoder", self)

    if TYPE_CHECKING:

        def enter(self, cause: Cause) -> None: ...
        def _joined(self) -> memoryview: ...
        def _consume(self, n: int) -> None: ...
        def _drop_all(self) -> None: ...
        def _frame_at(self, end: int) -> tuple[int, float]: ...

    def _next_plausible(self, buf: memoryview, pos: int) -> bool:
        """Whether an FPDU plausibly starts at ``pos`` (True when the bytes are not there)."""
        if self.markers and (self.base + pos - self.seq_start) % MPA_MARKER_INTERVAL == 0:
            pos += MPA_MARKER_LEN
        if pos + 2 + _MIN_ULPDU > len(buf):
            return True
        ulen = (buf[pos] << 8) | buf[pos + 1]
        return ulen >= _MIN_ULPDU and _plausible_ulpdu(
            buf[pos + 2 : pos + 2 + min(ulen, DDP_UNTAGGED_HDR_LEN)], self.conn.opts.rfc7306
        )

    def _lose_sync(self) -> None:
        self.enter(Cause.LOST_SYNC)
        self.searched = 0
        self.seq.forget()
        self.need = 1
        # skip the bad start itself
        self._consume(min(self.buffered, 4 if self.aligned else 1))

    # ---- mid-stream search ----------------------------------------------------------
    def _settings(self) -> list[tuple[bool, bool]]:
        opts = self.conn.opts
        crcs = (
            [self.crc]
            if self.crc is not None
            else ([opts.crc] if opts.crc is not None else [True, False])
        )
        stated = self.conn.stated_markers(self.side)
        if self.markers is not None:
            marks = [self.markers]
        elif stated is not None:
            marks = [stated]
        else:
            marks = [True, False]
        return [(c, m) for c in crcs for m in marks]  # CRC-verified and marked chains first

    def _search(self, final: bool) -> bool:
        searching = self.conn.dissector.searching
        searching.discard(self)
        buf = self._joined()
        n = len(buf)
        decided = final or n >= _SEARCH_GIVE_UP
        # Every setting is tried; CRC-verified chains win over unverified ones (CRCs that
        # hold are far stronger evidence), then the earliest first ULPDU_Length, then the
        # chain that reaches furthest, then the settings' order (markers first).
        found_all: list[tuple[bool, int, int, int, int, bool, bool, int]] = []
        for rank, (crc_on, markers) in enumerate(self._settings()):
            found = self._search_one(buf, crc_on, markers, decided)
            if found is None:
                continue
            if found == "wait":
                # nothing this search looked at changes before the bytes it waits for
                self.need = max(n + 1, min(self._wants, _SEARCH_GIVE_UP))
                searching.add(self._decoder)  # output waits, so that it stays in capture order
                return False
            assert not isinstance(found, str)
            start, seq_start = found
            phase = (seq_start - self.base) % MPA_MARKER_INTERVAL
            lead = MPA_MARKER_LEN if markers and (start - phase) % MPA_MARKER_INTERVAL == 0 else 0
            # the chain that reaches furthest explains the most bytes (a leading "marker" of
            # zero bytes before an unmarked FPDU is no evidence of markers)
            end = self._walk_chain(buf, start, crc_on, markers, phase, stop=False)[1]
            found_all.append((not crc_on, start + lead, -end, rank, start, crc_on, markers,
                              seq_start))  # fmt: skip
        best: tuple[int, bool, bool, int] | None = None  # start, crc, markers, seq_start
        if found_all:
            *_, start, crc_on, markers, seq_start = min(found_all)
            best = (start, crc_on, markers, seq_start)
        if best is not None:
            start, crc_on, markers, seq_start = best
            skipped = start
            self._grow = None  # the buffer is not appended to in place any more
            self._consume(start)
            self.crc = crc_on
            self.markers = markers
            self.seq_start = seq_start
            self.aligned = True
            self.info.crc = crc_on
            self.info.markers = markers
            if self.info.seq_start is None:
                self.info.seq_start = seq_start
            self.enter(Cause.SYNCED)
            self.info.undecoded_bytes += skipped
            self.conn.note(
                self.side,
                self._frame_at(self.base + 1)[0],
                "resync",
                f"FPDU chain found at offset {self.base} after {skipped} skipped bytes "
                f"(CRC {'on' if crc_on else 'off'}, markers {'on' if markers else 'off'})",
                self.base,
            )
            return True
        if final or n >= _SEARCH_GIVE_UP:
            if self.conn.ever_synced(self.side):
                self.info.undecoded_bytes += n
                self._drop_all()
                return False
            self.conn.not_iwarp(self._decoder, "no consistent chain of FPDUs found")
            return False
        # every setting is ruled out: only giving up is left (at the end or at the limit)
        self.need = max(n + 1, _SEARCH_GIVE_UP)
        searching.add(self._decoder)
        return False

    def _search_one(
        self, buf: memoryview, crc_on: bool, markers: bool, final: bool
    ) -> tuple[int, int] | str | None:
        """Earliest consistent chain start under one setting; 'wait' if undecided."""
        n = len(buf)
        base = self.base
        final = final or n >= _SEARCH_GIVE_UP
        # What earlier passes over the same bytes ruled out (the bytes never change while
        # searching): dead marker phases, and the first start not yet ruled out.  Keeps the
        # search linear in the data however it arrives.
        if self._scan_base != base:
            self._scan_base = base
            self._scan.clear()
            self._cut_upto.clear()
            self._phase_wake.clear()
            self._phase_found.clear()
            self._early.clear()
        self._tries_left = _SEARCH_TRIES
        self._wants = 1 << 62
        if markers and not self.aligned and not final:
            return self._search_phases(buf, crc_on)
        if markers:
            if self.aligned:
                phases = [(self.seq_start - base) % MPA_MARKER_INTERVAL]
            else:
                phases = list(range(min(MPA_MARKER_INTERVAL, n)))
                # A phase whose first marker would lie past the data: no marker to see, so
                # one phase per 4-byte residue stands for them all.
                for residue in range(4):
                    beyond = max(n - 3, 0)
                    beyond += (residue - beyond) % 4
                    if beyond < MPA_MARKER_INTERVAL and beyond not in phases:
                        phases.append(beyond)
            dead = self._scan.setdefault((crc_on, True), set())
            assert isinstance(dead, set)
            waiting = False
            best: tuple[int, int] | None = None
            unmarked: dict[int, list[tuple[int, int]]] = {}  # per start mod 4, once
            for phase in phases:
                if phase in dead:
                    continue
                res = self._try_phase(buf, phase, crc_on, final)
                if res == "cut" and final:
                    # every marker seen belongs to an FPDU that began before the data: the
                    # phase is unconfirmed, so try the starts it allows (the capture's tail)
                    residue = phase % 4
                    if residue not in unmarked:
                        unmarked[residue] = self._unmarked_fpdus(buf, residue, crc_on)
                    res = self._cut_start(buf, phase, crc_on, unmarked[residue])
                if res is None or res == "cut":
                    dead.add(phase)
                elif res == "wait":
                    waiting = True
                elif isinstance(res, int):
                    # the markers only point at FPDUs they sit in: look for an earlier start
                    for start in range(phase % 4, res, 4):
                        if not self._try_candidate():
                            break
                        if self._chain(buf, start, crc_on, True, phase, final) is True:
                            res = start
                            break
                    if best is None or res < best[0]:
                        best = (res, base + phase)
            if best is not None:
                return best
            return "wait" if waiting else None
        step = 4 if self.aligned else 1
        first = (self.seq_start - base) % 4 if self.aligned else 0
        resume = self._scan.get((crc_on, False), first)
        assert isinstance(resume, int)
        for start in range(resume, max(resume, n - 7), step):
            res = self._chain(buf, start, crc_on, False, 0, final)
            if res == "wait":
                self._scan[(crc_on, False)] = start
                return "wait"
            if res:
                return start, base + start
        self._scan[(crc_on, False)] = max(resume, n - 7 - (n - 7 - resume) % step)
        nxt = max(resume, n - 7)
        nxt += (resume - nxt) % step
        self._wants = min(self._wants, nxt + 8)  # the next start has its 8 bytes
        return "wait" if n < _SEARCH_GIVE_UP and not final else None

    def _search_phases(self, buf: memoryview, crc_on: bool) -> tuple[int, int] | str | None:
        """:meth:`_search_one` under markers before the framing is known, while undecided.

        The same result as trying every live marker phase (RFC 5044 §5: a marker every
        512 bytes of the stream, at a phase unknown mid-stream), but a phase is looked at
        again only once the bytes it waited for are there (its next marker, or the next
        FPDU of the chain its markers point to): the work per search is that of the phases
        due, not of the 512, so a stream that arrives in tiny segments costs no more.
        """
        n = len(buf)
        wake = self._phase_wake.get(crc_on)
        if wake is None:  # each phase first needs its first marker
            wake = self._phase_wake[crc_on] = [
                (phase + MPA_MARKER_LEN, phase) for phase in range(MPA_MARKER_INTERVAL)
            ]
        found = self._phase_found.setdefault(crc_on, {})
        dead = self._scan.setdefault((crc_on, True), set())
        assert isinstance(dead, set)
        while wake and wake[0][0] <= n:
            phase = heapq.heappop(wake)[1]
            self._wants = 1 << 62
            res = self._try_phase(buf, phase, crc_on, False)
            if res is None:
                dead.add(phase)
            elif isinstance(res, int):
                found[phase] = res
            else:
                heapq.heappush(wake, (self._wants, phase))
        best: tuple[int, int] | None = None
        for phase in sorted(found):
            start = self._earliest(buf, crc_on, phase, found[phase])
            if best is None or start < best[0]:
                best = (start, self.base + phase)
        if best is not None:
            return best
        if wake:
            self._wants = wake[0][0]
            return "wait"
        return None

    def _earliest(self, buf: memoryview, crc_on: bool, phase: int, res: int) -> int:
        """The earliest start before ``res`` (where the markers of ``phase`` point) whose
        chain holds, else ``res``: the markers only point at FPDUs they sit in.  A start
        whose chain broke is not tried again, one that waits only once its bytes are there.
        """
        n = len(buf)
        early = self._early.get((crc_on, phase))
        if early is None:
            early = self._early[(crc_on, phase)] = [phase % 4, None, []]
        nxt, first, waits = early
        while waits and waits[0][0] <= n:
            start = waits[0][1]
            if first is not None and start > first:
                heapq.heappop(waits)  # it can come first no more
                continue
            if not self._try_candidate():
                break
            heapq.heappop(waits)
            self._wants = 1 << 62
            chained = self._chain(buf, start, crc_on, True, phase, False)
            if chained is True:
                first = start if first is None else min(first, start)
            elif chained == "wait":
                heapq.heappush(waits, (self._wants, start))
        end = res if first is None else min(res, first)
        while nxt < end:
            if not self._try_candidate():
                break
            self._wants = 1 << 62
            chained = self._chain(buf, nxt, crc_on, True, phase, False)
            if chained is True:
                first = nxt
                nxt = end
                break
            if chained == "wait":
                heapq.heappush(waits, (self._wants, nxt))
            nxt += 4
        early[0] = nxt
        early[1] = first
        return res if first is None else min(res, first)

    def _try_candidate(self) -> bool:
        """Count one candidate start examined by a marker phase; False once the search of
        this setting has examined :data:`_SEARCH_TRIES` (a hostile stream's cost is bounded;
        the starts left unexamined are not taken)."""
        if self._tries_left <= 0:
            return False
        self._tries_left -= 1
        self.candidates_tried += 1
        return True

    def _unmarked_fpdus(self, buf: memoryview, residue: int, crc_on: bool) -> list[tuple[int, int]]:
        """(start, wire length) of every complete FPDU that passes the checks as if no
        marker sat inside it, at the starts after 0 that are ``residue`` mod 4, in order.

        One scan for every marker phase whose markers all point before the data (see
        :meth:`_cut_start`); an FPDU a marker would sit in is left out (it needs more than
        a marker interval's room).
        """
        n = len(buf)
        rfc7306 = self.conn.opts.rfc7306
        room = MPA_MARKER_INTERVAL - MPA_MARKER_LEN  # the most bytes between two markers
        found = []
        for start in range(residue or 4, n - 7, 4):
            ulen = (buf[start] << 8) | buf[start + 1]
            if ulen < _MIN_ULPDU:
                continue
            end_body = start + ((MPA_LENGTH_LEN + ulen + 3) & ~3)
            wire = end_body + MPA_CRC_LEN - start
            if wire > room or start + wire > n:
                continue
            if not _plausible_ulpdu(buf[start + 2 : start + 2 + ulen], rfc7306):
                continue
            if crc_on and crc32c(buf[start:end_body]) != _LE32.unpack_from(buf, end_body)[0]:
                continue
            found.append((start, wire))
        return found

    def _cut_start(
        self, buf: memoryview, phase: int, crc_on: bool, unmarked: list[tuple[int, int]]
    ) -> int | None:
        """The earliest start of a chain under a marker ``phase`` all of whose markers point
        before the data (``unmarked``: :meth:`_unmarked_fpdus` of the phase's residue).

        Such a marker points at no FPDU beginning after offset 0, so a chain starting after
        0 holds as its first FPDU a complete one with no marker of the phase inside (nor a
        leading one): only those starts are tried.  Offset 0 is tried as it is (a marker
        pointing exactly at it, from an FPDU whose leading marker was cut off, may hold).
        """
        if phase % 4 == 0 and self._try_candidate():
            if self._chain(buf, 0, crc_on, True, phase, True) is True:
                return 0
        for start, wire in unmarked:
            rel = (start - phase) % MPA_MARKER_INTERVAL
            if rel == 0 or rel + wire - MPA_CRC_LEN >= MPA_MARKER_INTERVAL:
                continue  # a leading marker, or one inside the body (MPA-07)
            if not self._try_candidate():
                return None
            if self._chain(buf, start, crc_on, True, phase, True) is True:
                return start
        return None

    def _try_phase(
        self, buf: memoryview, phase: int, crc_on: bool, final: bool
    ) -> int | None | str:
        """A marker phase: the first FPDU start its markers point to, if its chain holds.

        None: the phase is ruled out; 'wait': undecided; 'cut': its markers look right but
        all point before the data, so no FPDU start was found by them.
        """
        n = len(buf)
        pos = self._cut_upto.get(phase, phase)  # the markers before it point before the data
        cut = pos != phase
        while pos + MPA_MARKER_LEN <= n:
            reserved, ptr = struct.unpack_from(">HH", buf, pos)
            if reserved or ptr & 3:
                return None
            start = pos - ptr
            if ptr and (start - phase) % MPA_MARKER_INTERVAL == MPA_MARKER_LEN:
                start -= MPA_MARKER_LEN  # the FPDU opens with a marker (FPDUPTR 0)
            if start >= 0:
                res = self._chain(buf, start, crc_on, True, phase, final)
                if res == "wait":
                    return "wait"
                return start if res else None
            cut = True
            pos += MPA_MARKER_INTERVAL
        self._cut_upto[phase] = pos
        if not final:
            self._wants = min(self._wants, pos + MPA_MARKER_LEN)  # its next marker
            return "wait"
        return "cut" if cut or phase + MPA_MARKER_LEN > n else None

    def _chain(
        self, buf: memoryview, start: int, crc_on: bool, markers: bool, phase: int, final: bool
    ) -> bool | str:
        """Whether a consistent FPDU chain begins at ``start`` (phase: a marker position)."""
        count, pos, broken = self._walk_chain(buf, start, crc_on, markers, phase, stop=True)
        if broken:
            return False
        if count >= _SEARCH_MIN_FPDUS and pos - start >= _SEARCH_SPAN:
            return True
        n = len(buf)
        if final or n >= _SEARCH_GIVE_UP:
            return count >= (1 if crc_on else 2) or (count >= 1 and pos == n)
        return "wait"

    def _walk_chain(
        self, buf: memoryview, start: int, crc_on: bool, markers: bool, phase: int, *,
        stop: bool,
    ) -> tuple[int, int, bool]:  # fmt: skip
        """Walk consistent FPDUs from ``start``: (FPDUs, end of the last one, whether one
        failed the checks).  ``stop``: stop once the chain is long enough to be trusted."""
        n = len(buf)
        pos = start
        count = 0
        rfc7306 = self.conn.opts.rfc7306
        while True:
            rel = (pos - phase) % MPA_MARKER_INTERVAL if markers else 1
            lead = MPA_MARKER_LEN if markers and rel == 0 else 0
            if pos + lead + 2 > n:
                if pos + lead + 2 < self._wants:
                    self._wants = pos + lead + 2
                return count, pos, False
            ulen = (buf[pos + lead] << 8) | buf[pos + lead + 1]
            if ulen < _MIN_ULPDU:
                return count, pos, True
            lead, wire, marks = fpdu_layout(rel, ulen, markers)
            if pos + wire > n:
                if pos + wire < self._wants:
                    self._wants = pos + wire
                return count, pos, False
            end_body = pos + wire - MPA_CRC_LEN
            if markers:
                for m in marks:
                    at = pos + m
                    reserved, ptr = struct.unpack_from(">HH", buf, at)
                    want = 0 if m == 0 and lead else m - lead
                    if reserved or (ptr & MPA_FPDUPTR_MASK) != want:
                        return count, pos, True
                body = unmarked_body(buf, pos, lead, end_body, marks)
                ulpdu: bytes | memoryview = body[2 : 2 + ulen]
            else:
                ulpdu = buf[pos + 2 : pos + 2 + ulen]
            if not _plausible_ulpdu(ulpdu, rfc7306):
                return count, pos, True
            if crc_on:
                if crc32c(buf[pos:end_body]) != _LE32.unpack_from(buf, end_body)[0]:
                    return count, pos, True
            count += 1
            pos += wire
            if stop and count >= _SEARCH_MIN_FPDUS and pos - start >= _SEARCH_SPAN:
                return count, pos, False
