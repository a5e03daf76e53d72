"""The fused bulk path: lean segments straight from the reader to brief FPDUs.

:func:`ingest_lean` is :meth:`~.dissector.Dissector.ingest_many` for
:data:`~stack.pcap.packet.LeanSegment` tuples.  While segments keep coming on the same
direction (the reader hands out one key object per direction, so a change is one
identity test), that direction's TCP half, MPA walker and per-direction constants stay in
local variables, and a segment that carries the next in-order bytes (RFC 9293 §3.10.7.4:
no SYN, FIN or RST, nothing cut by the snapshot length, nothing waiting in either
direction) is walked FPDU by FPDU in the same loop when the direction is in Full
Operation without markers (RFC 5044 §7.1.2) and the decoder is brief: ULPDU_Length, CRC
(MPA-12), PAD (MPA-04), a canonical DDP/RDMAP header (RFC 5041 §4, RFC 5040 §4; Read
Requests too, §4.4) and the stateful checks (:class:`~.checks.DirectionChecks`) give a
:data:`~.records.BriefFpdu` per FPDU, exactly as :meth:`~.walker.DirectionDecoder.walk_plain`
makes it, or, given the printer's templates (:attr:`~.dissector.Dissector.text`), its
summary line (:data:`~.records.BriefText`).  Anything else goes where it went before,
from the byte where it starts: a short or odd FPDU to ``walk_plain`` (its general path),
markers or a non-brief decoder to ``walk_plain`` for the whole segment, buffered bytes to
``push``, and any other segment to the general path (TCP reassembly events); the cached
state is then read again.  The tests compare this path with the segment-by-segment one.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from stack.constants import (
    DDP_TAGGED_HDR_LEN,
    DDP_UNTAGGED_HDR_LEN,
    MPA_CRC_LEN,
    MULPDU_MAX,
    RDMAP_OPCODE_MASK,
    RDMAP_VERSION,
    READ_REQUEST_HDR_LEN,
    Opcode,
    QueueNumber,
)
from stack.dissect.decoder.common import (
    _CTRL_TAGGED_LAST,
    _CTRL_UNTAGGED_LAST,
    _FAST_INVALIDATE_OPS,
    _FAST_SEND_OPS,
    _FAST_TAGGED,
    _FAST_TAGGED_OPS,
    _FAST_UNTAGGED,
    _LE32,
    _OP_READ_REQUEST,
    _TCP_SPECIAL,
    _U32,
)
from stack.dissect.decoder.modes import Mode
from stack.dissect.decoder.records import PduRecord, SegmentView
from stack.dissect.decoder.walker import DirectionDecoder, _crc32c
from stack.dissect.tcp import RECENT_MASK
from stack.pcap import LeanSegment, TcpSegment, full_segment
from stack.wire.checker import Finding

if TYPE_CHECKING:
    from stack.dissect.decoder.dissector import Dissector

_FPDU = Mode.FPDU  # a module global: an Enum class attribute costs several times more
_LE32_UNPACK = _LE32.unpack_from
_BE32_UNPACK = _U32.unpack_from
_PAD_MASKS = (0, 0xFF, 0xFFFF, 0xFFFFFF)
"""The PAD bytes of a big-endian word ending where the PAD ends, by PAD length (MPA-04)."""
_TAGGED_AT = struct.Struct(">4xIQ").unpack_from
"""STag and TO of a tagged DDP header (RFC 5041 §4.2), from the FPDU's start."""
_UNTAGGED_AT = struct.Struct(">4xIIII").unpack_from
"""Invalidate STag (RsvdULP), QN, MSN and MO of an untagged DDP header (RFC 5041 §4.3)."""
_READ_REQUEST_AT = struct.Struct(">4xIIII" + "IQIIQ").unpack_from
"""An untagged DDP header and a Read Request header (RFC 5040 §4.4)."""
_SEND_AT = 2 + DDP_UNTAGGED_HDR_LEN
"""Where a Send's payload starts in its FPDU."""
_TAGGED_CU = frozenset(c << 8 | u for c in _FAST_TAGGED for u in _FAST_TAGGED_OPS)
"""The DDP and RDMAP control bytes (``ctrl << 8 | uc``) of the canonical tagged headers."""
_SEND_CU = frozenset(c << 8 | u for c in _FAST_UNTAGGED for u in _FAST_SEND_OPS)
_INVALIDATE_CU = frozenset(c << 8 | u for c in _FAST_UNTAGGED for u in _FAST_INVALIDATE_OPS)
_CU_READ_REQUEST = _CTRL_UNTAGGED_LAST << 8 | (RDMAP_VERSION << 6) | Opcode.RDMA_READ_REQUEST
_READ_REQUEST_ULEN = DDP_UNTAGGED_HDR_LEN + READ_REQUEST_HDR_LEN
_QN_READ = int(QueueNumber.READ_REQUEST)
_FRAMING = 2 + MPA_CRC_LEN
"""The ULPDU_Length field and the CRC: an FPDU's bytes besides its ULPDU and PAD."""
_WIRE_ROUND = _FRAMING + 3
"""(ULPDU_Length + this) & ~3 is an unmarked FPDU's wire length: PAD to 4 bytes, CRC."""


def ingest_lean(
    dissector: Dissector[Any],
    segments: Iterable[LeanSegment],
    cut: Callable[[TcpSegment], object] | None = None,
) -> int:
    """Decode every segment of ``segments``; return how many there were (see the module
    docstring; ``cut`` as for :meth:`~.dissector.Dissector.ingest_many`)."""
    routes = dissector._routes
    brief = dissector.brief
    count = 0
    frame = dissector.last_frame
    ts = dissector.last_ts
    last_key = None  # the direction whose state the locals below hold
    fast = inline = False  # in-order bytes go to MPA; FPDUs are walked here
    fpdus = wire_bytes = ulpdu_bytes = payload_bytes = 0  # not yet added to the walker's info
    # the cached state of last_key (read only when fast, or inline)
    half: Any = None
    other: Any = None
    conn: Any = None
    mpa_half: Any = None
    emit: Any = None
    route: Any = None
    check_tagged: Any = None
    check_untagged: Any = None
    peer: Any = None
    ring: Any = None
    requests: Any = None
    base_seq = 0
    verdict: bool | None = None
    # the printer's templates: FPDUs become finished lines (shapes; sends: those of Sends
    # with MO 0, None while an upper layer wants to read them)
    text = dissector.text if brief else None
    t0 = text.t0 if text is not None else 0.0
    shape: Any = text.shape if text is not None else None  # a template made and kept
    clock_ts = None  # the timestamp of clock, the time column's text
    clock = ""
    shapes: dict[int, str] | None = None
    sends: dict[int, str] | None = None
    try:
        for frame, ts, key, seq, ack, flags, payload, missing in segments:
            count += 1
            if key is not last_key:
                if fpdus:
                    mpa_half._count(fpdus, wire_bytes, ulpdu_bytes, payload_bytes)
                    fpdus = wire_bytes = ulpdu_bytes = payload_bytes = 0
                last_key = key
                fast = inline = False
                entry = routes.get(key)
                if entry is not None:
                    half, other, conn, mpa_half = entry
                    if (
                        half.base_seq is not None
                        and half.fin_offset is None
                        and not half._pending
                        and not other._pending
                    ):
                        fast = True
                        base_seq = half.base_seq
                        ring = half._ring_view
                        side = mpa_half.side
                        inline = (
                            brief
                            and mpa_half.mode is _FPDU
                            and not mpa_half.chunks
                            and mpa_half.bulk
                            and not mpa_half.markers
                            and not conn.pending_findings[side]
                            and conn.first_fpdu_frame[side] is not None
                        )
                        if inline:
                            ctx = mpa_half._bulk
                            if ctx is None or ctx[0] != conn.initiator:
                                ctx = mpa_half.bulk_context()
                            emit = ctx[1]
                            check_tagged = ctx[7]
                            check_untagged = ctx[8]
                            peer = ctx[9]
                            requests = mpa_half.seq.requests
                            route = ctx[14]
                            verdict = True if mpa_half.crc else None
                            if text is not None:
                                shapes = text.shapes(route, verdict)
                                plain = text.plain_sends
                                sends = shapes if plain is None or route[0] in plain else None
            if fast and not flags & _TCP_SPECIAL and not missing:
                nxt = half.next_offset
                if seq == (base_seq + nxt) & 0xFFFFFFFF:
                    n = len(payload)
                    if not n:
                        continue
                    half.next_offset = nxt + n
                    half.delivered_bytes += n
                    pos = nxt & RECENT_MASK  # HalfStream._remember, inline
                    end = pos + n
                    if end <= len(ring):
                        ring[pos:end] = payload
                    else:
                        half._remember(nxt, payload)
                        ring = half._ring_view  # a new view when the ring grew
                    if frame > conn.last_frame:
                        conn.last_frame = frame
                    if not inline:
                        if mpa_half.mode is _FPDU and not mpa_half.chunks and mpa_half.bulk:
                            mpa_half.walk_plain(payload, nxt, frame, ts)
                        else:
                            mpa_half.push(payload, nxt, frame, ts)
                        last_key = None  # the walker may have changed its mode
                        continue
                    # the FPDUs of the segment, walked as walk_plain's brief branch does;
                    # the time column of their lines, once per timestamp (BriefLines)
                    if shapes is not None and ts != clock_ts:
                        clock_ts = ts
                        clock = " %11.6f" % (ts - t0)
                    pos = 0
                    while pos + 4 <= n:  # ULPDU_Length and the DDP and RDMAP control bytes
                        head = _BE32_UNPACK(payload, pos)[0]
                        ulen = head >> 16
                        wire = (ulen + _WIRE_ROUND) & ~3  # length, ULPDU, PAD, CRC (MPA-04)
                        end = pos + wire
                        if end > n or ulen > MULPDU_MAX or ulen < DDP_UNTAGGED_HDR_LEN:
                            break
                        end_body = end - MPA_CRC_LEN
                        if verdict and (
                            _crc32c(payload[pos:end_body]) != _LE32_UNPACK(payload, end_body)[0]
                        ):
                            break
                        pad_len = wire - _FRAMING - ulen
                        if pad_len and _BE32_UNPACK(payload, end_body - 4)[0] & _PAD_MASKS[pad_len]:
                            break
                        cu = head & 0xFFFF  # DDP control byte, RDMAP control byte
                        if cu in _TAGGED_CU:
                            stag, to = _TAGGED_AT(payload, pos)
                            size = ulen - DDP_TAGGED_HDR_LEN
                            last = cu >> 8 == _CTRL_TAGGED_LAST
                            op = cu & RDMAP_OPCODE_MASK
                            flagged: list[Finding] = []
                            check_tagged(op, stag, to, size, last, flagged, peer)
                            if not flagged:
                                if shapes is None:
                                    emit((frame, ts, route, op, True, stag, to, None, None, size,
                                          last, verdict, 0, None, wire))  # fmt: skip
                                else:  # as BriefLines.line
                                    template = shapes.get(cu) or shape(shapes, route, verdict, cu)
                                    emit((frame, template % (frame, clock, stag, to, size)))
                        elif cu in _SEND_CU:
                            inval, qn, msn, mo = _UNTAGGED_AT(payload, pos)
                            if qn or (inval and cu not in _INVALIDATE_CU):
                                break
                            size = ulen - DDP_UNTAGGED_HDR_LEN
                            last = cu >> 8 == _CTRL_UNTAGGED_LAST
                            op = cu & RDMAP_OPCODE_MASK
                            flagged = []
                            check_untagged(qn, msn, mo, cu & 0xFF, inval, size, last, flagged)
                            if not flagged:
                                lines = shapes if mo else sends  # MO 0: what an upper layer reads
                                if lines is None:
                                    emit((frame, ts, route, op, False, qn, msn, mo, inval, size,
                                          last, verdict, 0,
                                          payload[pos + _SEND_AT : pos + 2 + ulen],
                                          wire))  # fmt: skip
                                else:
                                    template = lines.get(cu) or shape(lines, route, verdict, cu)
                                    line = template % (frame, clock, qn, msn, mo, size, inval)
                                    emit((frame, line))
                        elif cu == _CU_READ_REQUEST and ulen == _READ_REQUEST_ULEN:
                            # DirectionChecks.check of a canonical Read Request, written out
                            (inval, qn, msn, mo, sink_stag, sink_to, rsize, src_stag,
                             src_to) = _READ_REQUEST_AT(payload, pos)  # fmt: skip
                            if qn != _QN_READ or inval or mo:
                                break
                            size = 0
                            flagged = []
                            check_untagged(qn, msn, mo, cu & 0xFF, 0, READ_REQUEST_HDR_LEN, True,
                                           flagged)  # fmt: skip
                            requests.read_request(sink_stag, sink_to, rsize)
                            if not flagged:
                                if shapes is None:
                                    emit((frame, ts, route, _OP_READ_REQUEST, False, qn, msn, 0,
                                          (sink_stag, sink_to, rsize, src_stag, src_to), 0, True,
                                          verdict, 0, None, wire))  # fmt: skip
                                else:
                                    template = shapes.get(cu) or shape(shapes, route, verdict, cu)
                                    fields = (qn, msn, 0, 0, sink_stag, sink_to, rsize,
                                              src_stag, src_to)  # fmt: skip
                                    line = template % (frame, clock, *fields)
                                    emit((frame, line))
                        else:
                            break
                        if flagged:  # checked already: the record, with its findings
                            _record_flagged(mpa_half, payload, nxt, pos, ulen, wire, flagged,
                                            frame, ts)  # fmt: skip
                        fpdus += 1
                        ulpdu_bytes += ulen
                        payload_bytes += size
                        pos = end
                    if pos == n:
                        wire_bytes += n
                        mpa_half.base = nxt + n
                        continue
                    # the rest from the first FPDU this loop does not take: walk_plain
                    wire_bytes += pos
                    if fpdus:
                        mpa_half._count(fpdus, wire_bytes, ulpdu_bytes, payload_bytes)
                        fpdus = wire_bytes = ulpdu_bytes = payload_bytes = 0
                    mpa_half.walk_plain(payload[pos:], nxt + pos, frame, ts)
                    last_key = None
                    continue
            if fpdus:
                mpa_half._count(fpdus, wire_bytes, ulpdu_bytes, payload_bytes)
                fpdus = wire_bytes = ulpdu_bytes = payload_bytes = 0
            last_key = None
            segment = full_segment((frame, ts, key, seq, ack, flags, payload, missing))
            if missing and cut is not None:
                cut(segment)
            dissector._general(segment, ts)
    finally:
        if fpdus:
            mpa_half._count(fpdus, wire_bytes, ulpdu_bytes, payload_bytes)
        dissector.last_frame = frame
        dissector.last_ts = ts
    return count


def _record_flagged(
    half: DirectionDecoder,
    data: memoryview,
    offset: int,
    pos: int,
    ulen: int,
    wire: int,
    findings: list[Finding],
    frame: int,
    ts: float,
) -> None:
    """The record of an unmarked FPDU at ``data[pos:]`` (stream offset ``offset + pos``)
    whose framing, CRC, PAD and canonical header passed the brief tests but whose stateful
    checks found ``findings``, as ``walk_plain`` makes it (the caller counts it)."""
    conn = half.conn
    side = half.side
    end_body = pos + wire - MPA_CRC_LEN
    crc_field = _LE32_UNPACK(data, end_body)[0]
    crc_value = _crc32c(data[pos:end_body])
    ulpdu = data[pos + 2 : pos + 2 + ulen]
    segment = SegmentView(ulpdu, conn.rfc7306, conn.siw_layout)
    pad_len = end_body - pos - 2 - ulen
    pad = bytes(data[end_body - pad_len : end_body]) if pad_len else b""
    conn.emit(
        PduRecord(conn.stream, frame, ts, conn.direction(side), conn.names[side],
                  conn.names[1 - side], "fpdu", offset + pos, wire, findings, None, 0, 0, 0,
                  b"", ulen, True if half.crc else None, crc_field, crc_value, pad, (), (), (),
                  segment, ulpdu)
    )  # fmt: skip
