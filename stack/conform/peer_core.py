"""The scripted peer's sans-IO core: the runner's end of one connection (RFC 5044 §4-7).

:class:`PeerCore` holds no socket and no clock.  Outbound, it frames what a case asks for
with the wire core: startup frames as given (valid ones from
:class:`~stack.wire.mpa.MpaConnection`, crafted ones as raw bytes), RDMAP messages by
:func:`~stack.wire.rdmap.encode_message` with the MSN of each queue, FPDUs by
:class:`~stack.wire.framing.FpduFramer` with the negotiated CRC and markers, or
deliberately broken (:class:`Craft`: a wrong CRC, non-zero PAD, a wrong marker, a
ULPDU_Length that announces more than follows).  Inbound, the DUT's bytes are parsed as one
startup frame (:func:`~stack.wire.mpa_frames.decode_frame`, judged leniently by
:func:`~stack.wire.mpa_rules.check_startup_frame`), then deframed by
:class:`~stack.wire.framing.FpduDeframer`, decoded leniently by
:func:`~stack.wire.rdmap.decode_ulpdu` (``strict=False``) and their sequencing judged by a
lenient :class:`~stack.wire.sequence.MessageSequencer`.  What it saw comes out as
events (:class:`StartupSeen`, :class:`StartupBad`, :class:`PduSeen`, :class:`FramingBad`,
:class:`Eof`), each with its offset in the DUT's byte stream, so the driver can name frames.
"""

from __future__ import annotations

import struct
from collections import deque
from dataclasses import dataclass

from stack.constants import (
    DDP_UNTAGGED_HDR_LEN,
    DEFAULT_EMSS,
    MPA_CRC_LEN,
    MPA_MAX_PRIVATE_DATA,
)
from stack.crc import crc32c
from stack.errors import DecodeError, MpaError, ProtocolError
from stack.wire.checker import Checker, Finding
from stack.wire.events import MpaFrame, RdmapMessage
from stack.wire.framing import FpduDeframer, FpduFramer, fpdu_layout, mark_fpdu, mulpdu_for
from stack.wire.mpa_frames import decode_frame
from stack.wire.mpa_rules import DEFINED_REVISIONS, StartupContext, check_startup_frame
from stack.wire.rdmap import Segment, decode_ulpdu, encode_message, message_qn
from stack.wire.sequence import MessageSequencer

__all__ = [
    "Craft",
    "Eof",
    "FramingBad",
    "PduSeen",
    "PeerCore",
    "PeerEvent",
    "Sent",
    "StartupBad",
    "StartupSeen",
]

_LE32 = struct.Struct("<I")
_U16 = struct.Struct(">H")


# ======================================================================================
# Events
# ======================================================================================


@dataclass(frozen=True, slots=True)
class StartupSeen:
    """The DUT's Request or Reply.  Fields: frame, findings (every startup rule row that
    fired, lenient), offset/length (in the DUT's stream), raw (its bytes)."""

    frame: MpaFrame
    findings: tuple[Finding, ...]
    offset: int
    length: int
    raw: bytes


@dataclass(frozen=True, slots=True)
class StartupBad:
    """Bytes from the DUT that are no readable startup frame.  Fields: error (the
    :class:`MpaError` the wire core raises for them), raw (the bytes seen), offset."""

    error: MpaError
    raw: bytes
    offset: int


@dataclass(frozen=True, slots=True)
class PduSeen:
    """One valid FPDU from the DUT.  Fields: ulpdu (markers removed), segment (lenient
    decode; None when too short for its DDP header), error (that decode error), offset
    (stream offset of its first byte, leading marker included), wire_len, findings (the
    lenient decode's and the DUT direction's sequencing, :mod:`stack.wire.sequence`)."""

    ulpdu: bytes
    segment: Segment | None
    error: DecodeError | None
    offset: int
    wire_len: int
    findings: tuple[Finding, ...] = ()


@dataclass(frozen=True, slots=True)
class FramingBad:
    """The DUT's bytes broke FPDU framing (CRC, marker, length).  Fields: error (the wire
    core's :class:`MpaError`), offset (where the failing FPDU starts)."""

    error: MpaError
    offset: int


@dataclass(frozen=True, slots=True)
class Eof:
    """The DUT closed its sending half (FIN) or reset the connection.  Fields: offset
    (bytes it had sent), reset, pending (bytes received but not part of a whole PDU)."""

    offset: int
    reset: bool = False
    pending: bytes = b""


PeerEvent = StartupSeen | StartupBad | PduSeen | FramingBad | Eof


@dataclass(frozen=True, slots=True)
class Craft:
    """How to break one outbound FPDU on purpose.

    Fields: crc (None: as negotiated; an int: this CRC field value, sent low byte first);
    bad_crc (flip the computed CRC, MPA-12); pad (PAD octets to send instead of zeros,
    covered by a correct CRC, MPA-04); marker_ptr (FPDUPTR of every inner or leading marker,
    MPA-08); truncate (send only this many bytes of the FPDU); length (ULPDU_Length field
    value to announce instead of the real one); ulpdu (send these ULPDU bytes instead, e.g.
    with reserved header bits set); crc_xor (XOR the computed CRC with this, e.g. one bit);
    flip ((offset into the FPDU, XOR mask): change an octet after the CRC was computed);
    marker_rsvd (the RESERVED half of every marker, MPA-06); marker_ptr_or (bits ORed into
    every marker's FPDUPTR, e.g. its low two, MPA-06).
    """

    crc: int | None = None
    bad_crc: bool = False
    pad: bytes | None = None
    marker_ptr: int | None = None
    truncate: int | None = None
    length: int | None = None
    ulpdu: bytes | None = None
    crc_xor: int = 0
    flip: tuple[int, int] | None = None
    marker_rsvd: int | None = None
    marker_ptr_or: int = 0


@dataclass(frozen=True, slots=True)
class Sent:
    """One FPDU the runner sent.  Fields: ulpdu, data (the wire bytes), offset (in the
    runner's stream, from its first byte), seq_offset (from SeqStart, as the framer counts),
    markers and crc (the framing it was sent with), crafted."""

    ulpdu: bytes
    data: bytes
    offset: int
    seq_offset: int
    markers: bool
    crc: bool
    crafted: Craft | None = None


# ======================================================================================
# The core
# ======================================================================================


class PeerCore:
    """The runner's end of one connection, sans-IO (see the module docstring).

    Fields: ``out_offset`` / ``in_offset`` (bytes sent / received so far),
    ``startup_frame`` (the DUT's, once seen), ``full_operation`` (framing set up).
    """

    def __init__(self) -> None:
        self.out_offset = 0
        self.in_offset = 0
        self.startup_frame: MpaFrame | None = None
        self.full_operation = False
        self._in = bytearray()  # bytes before framing is set up, or after startup failed
        self._in_base = 0  # stream offset of self._in[0]
        self._expect: tuple[str, MpaFrame | None] | None = None
        self._events: deque[PeerEvent] = deque()
        self._framer: FpduFramer | None = None
        self._deframer: FpduDeframer | None = None
        self._rx_base = 0  # stream offset of SeqStart of the DUT's direction
        self._tx_base = 0
        self._msn: dict[int, int] = {}
        self._sequencer = MessageSequencer()  # the DUT's direction, judged leniently
        self._eof = False
        self._dead = False  # framing failed: nothing more is decoded
        self.mulpdu = mulpdu_for(DEFAULT_EMSS, False)

    # -- outbound --------------------------------------------------------------------

    def raw(self, data: bytes) -> bytes:
        """Bytes sent as they are (startup frames, garbage); returns them."""
        self.out_offset += len(data)
        return data

    def start_framing(self, *, crc: bool, markers_tx: bool, markers_rx: bool) -> None:
        """Enter Full Operation both ways (:meth:`start_tx` and :meth:`start_rx`)."""
        self.start_tx(crc=crc, markers=markers_tx)
        self.start_rx(crc=crc, markers=markers_rx)

    def start_tx(self, *, crc: bool, markers: bool) -> None:
        """Frame outbound FPDUs from here; SeqStart is the next byte sent (MPA-07)."""
        self._framer = FpduFramer(crc=crc, markers=markers)
        self._tx_base = self.out_offset
        self.mulpdu = mulpdu_for(DEFAULT_EMSS, markers)

    def start_rx(self, *, crc: bool, markers: bool) -> None:
        """Deframe the DUT's bytes from here; SeqStart is the first byte after its startup
        frame, and bytes already received after the frame are deframed now."""
        self._deframer = FpduDeframer(crc=crc, markers=markers)
        self.full_operation = True
        self._rx_base = self._in_base
        early = bytes(self._in)
        self._in.clear()
        if early:
            self._deframe(early)
        if self._eof:
            self._push_eof(False)

    @property
    def framer(self) -> FpduFramer:
        if self._framer is None:
            raise RuntimeError("framing is not set up (start_framing)")
        return self._framer

    def ulpdus(self, message: RdmapMessage) -> list[bytes]:
        """The ULPDUs of ``message``, with the next MSN of its queue (DDP-05)."""
        qn = message_qn(message)
        msn = None
        if qn is not None:
            msn = self._msn.get(qn, 1)
            self._msn[qn] = (msn + 1) & 0xFFFFFFFF
        return encode_message(message, msn=msn, mulpdu=self.mulpdu)

    def fpdu(self, ulpdu: bytes, craft: Craft | None = None) -> Sent:
        """Frame one ULPDU (optionally broken by ``craft``) and count it as sent."""
        framer = self.framer
        offset, seq_offset = self.out_offset, framer.offset
        if craft is not None and craft.ulpdu is not None:
            ulpdu = craft.ulpdu
        if craft is None:
            data = bytes(framer.frame(ulpdu))
        else:
            data = self._crafted(framer, ulpdu, craft)
        self.out_offset += len(data)
        return Sent(bytes(ulpdu), data, offset, seq_offset, framer.markers, framer.crc, craft)

    def _crafted(self, framer: FpduFramer, ulpdu: bytes, craft: Craft) -> bytes:
        """An FPDU as :class:`FpduFramer` frames it, then broken as ``craft`` says; the
        framer's stream offset advances by what is actually sent."""
        at = framer.offset
        n = len(ulpdu) if craft.length is None else craft.length
        body = _U16.pack(n) + bytes(ulpdu)
        pad_len = -len(body) & 3
        body += (
            craft.pad[:pad_len].ljust(pad_len, b"\0") if craft.pad is not None else bytes(pad_len)
        )
        plain = body + bytes(MPA_CRC_LEN)  # unmarked FPDU, CRC slot zero
        data = mark_fpdu(plain, at) if framer.markers else bytearray(plain)
        touches = craft.marker_ptr is not None or craft.marker_rsvd is not None
        if framer.markers and (touches or craft.marker_ptr_or):
            _lead, _wire, marks = fpdu_layout(at, len(ulpdu), True)
            for m in marks:
                if m + 4 <= len(data) - MPA_CRC_LEN:
                    if craft.marker_rsvd is not None:
                        _U16.pack_into(data, m, craft.marker_rsvd)
                    ptr = _U16.unpack_from(data, m + 2)[0]
                    if craft.marker_ptr is not None:
                        ptr = craft.marker_ptr
                    _U16.pack_into(data, m + 2, ptr | craft.marker_ptr_or)
        if craft.crc is not None:
            value = craft.crc
        elif framer.crc or craft.bad_crc:
            value = crc32c(memoryview(data)[:-MPA_CRC_LEN])
            if craft.bad_crc:
                value ^= 0xFFFFFFFF
            value ^= craft.crc_xor
        else:
            value = 0
        _LE32.pack_into(data, len(data) - MPA_CRC_LEN, value)
        if craft.flip is not None:
            at_byte, mask = craft.flip
            data[at_byte] ^= mask
        if craft.truncate is not None:
            data = data[: craft.truncate]
        framer.offset += len(data)
        return bytes(data)

    # -- inbound ---------------------------------------------------------------------

    def expect_startup(self, kind: str, request: MpaFrame | None = None) -> None:
        """Parse the next inbound bytes as the DUT's ``'request'`` or ``'reply'`` (the
        Reply judged against our ``request``)."""
        self._expect = (kind, request)
        self._parse_startup()

    def receive(self, data: bytes) -> None:
        """Bytes from the DUT; ``b""`` is its FIN."""
        if not data:
            if not self._eof:
                self._eof = True
                self._parse_startup()
                self._push_eof(False)
            return
        self.in_offset += len(data)
        if self._deframer is not None:
            self._deframe(data)
            return
        self._in += data
        self._parse_startup()

    def reset(self) -> None:
        """The connection was reset by the DUT."""
        if not self._eof:
            self._eof = True
            self._push_eof(True)

    def next_event(self) -> PeerEvent | None:
        return self._events.popleft() if self._events else None

    @property
    def pending(self) -> bytes:
        """Bytes received that no event has accounted for yet."""
        return bytes(self._in)

    def _push_eof(self, reset: bool) -> None:
        # Bytes no parser took (after a failed startup): the startup parser and the
        # deframer report their own.
        raw = self._deframer is None and self._expect is None
        self._events.append(Eof(self.in_offset, reset, bytes(self._in) if raw else b""))

    def _parse_startup(self) -> None:
        if self._expect is None or not self._in:
            return
        kind, request = self._expect
        buf = bytes(self._in)
        try:
            decoded = decode_frame(buf, max_private_data=MPA_MAX_PRIVATE_DATA)
        except MpaError as exc:
            self._expect = None
            self._events.append(StartupBad(exc, buf, self._in_base))
            self._consume(len(buf))
            return
        if decoded is None:
            if self._eof:
                self._expect = None
                self._events.append(
                    StartupBad(
                        MpaError("MPA-28", f"connection closed after {len(buf)} bytes of a frame"),
                        buf,
                        self._in_base,
                    )
                )
                self._consume(len(buf))
            return
        frame, used = decoded
        ctx = StartupContext(
            frame,
            expect=kind,
            request=request,
            revisions=DEFINED_REVISIONS,
            max_rev=request.rev if request is not None else None,
        )
        found = check_startup_frame(ctx, Checker(strict=False))
        findings = tuple(Finding(row.rule, detail, row.term, row.fatal) for row, detail in found)
        self._expect = None
        self.startup_frame = frame
        self._events.append(StartupSeen(frame, findings, self._in_base, used, buf[:used]))
        self._consume(used)

    def _consume(self, n: int) -> None:
        del self._in[:n]
        self._in_base += n

    def _deframe(self, data: bytes) -> None:
        deframer = self._deframer
        assert deframer is not None
        if self._dead:
            return
        deframer.feed(data)
        try:
            for ulpdu in deframer:
                raw = bytes(ulpdu)
                try:
                    seg: Segment | None = decode_ulpdu(raw, strict=False)
                    err = None
                except DecodeError as exc:
                    seg, err = None, exc
                findings = () if seg is None else seg.findings + self._sequence(seg, raw)
                self._events.append(
                    PduSeen(
                        raw,
                        seg,
                        err,
                        self._rx_base + deframer.fpdu_offset,
                        deframer.fpdu_wire_length,
                        findings,
                    )
                )
        except MpaError as exc:
            self._dead = True
            self._events.append(FramingBad(exc, self._rx_base + deframer.offset))

    def _sequence(self, seg: Segment, raw: bytes) -> tuple[Finding, ...]:
        """MSN, MO and message continuity of the DUT's segments (DDP-02, DDP-04..06)."""
        chk = Checker(strict=False)
        if seg.tagged:
            assert seg.stag is not None and seg.to is not None
            self._sequencer.tagged(seg.stag, seg.to, seg.opcode, len(seg.payload), seg.last, chk)
        elif seg.qn is not None and seg.msn is not None and seg.mo is not None:
            self._sequencer.untagged(
                seg.qn,
                seg.msn,
                seg.mo,
                raw[1],
                seg.inval_stag or 0,
                len(raw) - DDP_UNTAGGED_HDR_LEN,
                seg.last,
                chk,
            )
        return tuple(chk.findings)


def expected_framing_error(
    data: bytes, *, crc: bool, markers: bool, offset: int
) -> ProtocolError | None:
    """The error the wire core's deframer raises for the FPDU bytes ``data`` sent at stream
    ``offset`` (from SeqStart) with this CRC and marker setting; None when it accepts them
    (or waits for more)."""
    deframer = FpduDeframer(crc=crc, markers=markers, offset=offset)
    deframer.feed(data)
    try:
        for _ in deframer:
            pass
    except MpaError as exc:
        return exc
    return None
