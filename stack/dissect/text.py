"""Text output of dissected PDUs: one summary line per PDU (default) and the ``-V`` tree.

:func:`summary_line` is tshark-summary style: frame, stream, direction, addresses, layers,
key fields (RFC 5041 §4 DDP header, RFC 5040 §4 RDMAP header), CRC verdict (MPA-12),
marker count and finding rule IDs; :func:`verbose_lines` is the full decode tree with
every header field, the markers (RFC 5044 §4.3) and the findings with their Terminate
causes; :func:`note_line` is a stream event (gap, resynchronisation...) as a comment.
PDU kinds and opcodes are named as in the JSON records (:mod:`stack.dissect.fields`).
"""

from __future__ import annotations

from collections.abc import Container
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from stack.constants import (
    ATOMIC_OPCODE_MASK,
    DDP_LAST,
    DDP_TAGGED,
    DDP_TAGGED_HDR_LEN,
    DDP_UNTAGGED_HDR_LEN,
    INVALIDATE_OPCODES,
    RDMAP_OPCODE_MASK,
    AtomicOpcode,
    Opcode,
    RtrType,
    TermCode,
    term_name,
)
from stack.dissect.fields import KIND_NAMES, OPCODE_NAMES_BY_VALUE, opcode_name
from stack.wire.events import (
    AtomicRequest,
    AtomicResponse,
    ImmediateData,
    ReadRequest,
    Terminate,
)

if TYPE_CHECKING:
    from stack.dissect.decoder import BriefFpdu, Note, PduRecord

__all__ = [
    "BriefLines",
    "brief_line",
    "head_text",
    "note_line",
    "rtr_text",
    "summary_line",
    "verbose_lines",
]

_NAMES = OPCODE_NAMES_BY_VALUE  # bound here: CPython compiles no fast method call on imported names
_INVALIDATE = frozenset(int(op) for op in INVALIDATE_OPCODES)
_READ_REQUEST = int(Opcode.RDMA_READ_REQUEST)
_ATOMIC_NAMES: dict[int, str] = {
    AtomicOpcode.FETCH_ADD: "FetchAdd",
    AtomicOpcode.CMP_SWAP: "CmpSwap",
}
"""AOpCode names in summaries (RFC 7306 §5.2.1)."""


def _fields(rec: PduRecord) -> str:
    """The layers' key fields of an FPDU, as its summary line shows them."""
    seg = rec.segment
    if seg is None:
        return f"undecodable ULPDU ({rec.ulpdu_len} bytes)"
    op = seg.opcode
    name = _NAMES.get(op) or opcode_name(op)
    last = " L" if seg.last else ""
    if seg.tagged:
        plen = seg.ulpdu_len - DDP_TAGGED_HDR_LEN
        return f"{name} STag=0x{seg.stag:08x} TO=0x{seg.to:x} len={plen}{last}"
    plen = seg.ulpdu_len - DDP_UNTAGGED_HDR_LEN
    base = f"{name} QN={seg.qn} MSN={seg.msn} MO={seg.mo}"
    h = seg.header
    if h is None:
        if op in _INVALIDATE:
            return f"{base} len={plen} InvSTag=0x{seg.inval_stag or 0:08x}{last}"
        return f"{base} len={plen}{last}"
    if op in _INVALIDATE:
        return f"{base} len={plen} InvSTag=0x{seg.inval_stag or 0:08x}{last}"
    if isinstance(h, ReadRequest):
        return (
            f"{base} sink=0x{h.sink_stag:08x}/0x{h.sink_to:x} size={h.size} "
            f"src=0x{h.src_stag:08x}/0x{h.src_to:x}"
        )
    if isinstance(h, Terminate):
        flags = "".join(c for c, on in (("M", h.m), ("D", h.d), ("R", h.r)) if on) or "-"
        siw = " (siw layout)" if h.siw_swapped else ""
        cause = TermCode(h.layer, h.etype, h.code)
        return f"{base} {h.layer}/{h.etype}/0x{h.code:02x} {term_name(cause)} [{flags}]{siw}"
    if isinstance(h, ImmediateData):
        return f"{base} data={h.data.hex()}"
    if isinstance(h, AtomicRequest):
        kind = _ATOMIC_NAMES.get(h.atomic_opcode & ATOMIC_OPCODE_MASK, f"AOp{h.atomic_opcode}")
        return (
            f"{base} {kind} id=0x{h.req_id:08x} 0x{h.stag:08x}/0x{h.to:x} "
            f"data=0x{h.add_swap_data:x} mask=0x{h.add_swap_mask:x}"
            + (f" cmp=0x{h.compare_data:x}" if h.atomic_opcode == AtomicOpcode.CMP_SWAP else "")
        )
    if isinstance(h, AtomicResponse):
        return f"{base} id=0x{h.req_id:08x} orig=0x{h.orig_value:x}"
    return f"{base} len={plen}{last}"


_HEADS: dict[tuple[int, str, str, str], str] = {}
_CRC_TEXT = {True: " CRC ok", None: "", False: " CRC BAD"}
"""The CRC verdict column (MPA-12): good, not negotiated, bad."""


def head_text(route: tuple[int, str, str, str]) -> str:
    """The stream, direction and addresses columns of a summary line (cached)."""
    tail = _HEADS.get(route)
    if tail is None:
        stream, direction, src, dst = route
        tail = f" {stream:>3} {direction} {src} \u2192 {dst} "
        if len(_HEADS) < 4096:
            _HEADS[route] = tail
    return tail


_Shape = tuple[tuple[int, str, str, str], int, bool, bool, bool | None, int]
_TEMPLATES: dict[_Shape, str] = {}
"""printf-style templates of brief lines by shape (route, opcode, tagged, L, CRC, markers)."""


def _template(key: _Shape) -> str:
    """The template of a brief line's shape: the fixed text with the varying fields as
    conversions (frame, time text, then STag, TO, length, or QN, MSN, MO, length and the
    Invalidate STag, which ``%.0s`` swallows for opcodes without one; a Read Request
    shows its header instead of the length, RFC 5040 §4.4)."""
    route, op, tagged, last, crc_ok, markers = key
    name = _NAMES.get(op) or opcode_name(op)
    end = _CRC_TEXT[crc_ok]
    if markers:
        end += f" markers={markers}"
    if last and op != _READ_REQUEST:
        end = " L" + end
    fixed = (head_text(route) + "MPA/DDP/RDMAP " + name).replace("%", "%%")
    end = end.replace("%", "%%")
    if tagged:
        body = " STag=0x%08x TO=0x%x len=%s"
    elif op in _INVALIDATE:
        body = " QN=%s MSN=%s MO=%s len=%s InvSTag=0x%08x"
    elif op == _READ_REQUEST:
        body = " QN=%s MSN=%s MO=%s%.0s sink=0x%08x/0x%x size=%s src=0x%08x/0x%x"
    else:
        body = " QN=%s MSN=%s MO=%s len=%s%.0s"
    template = "%6d%s" + fixed + body + end
    if len(_TEMPLATES) < 4096:
        _TEMPLATES[key] = template
    return template


def brief_line(item: BriefFpdu, time: float | None = None) -> str:
    """The summary line of an FPDU without findings given as a
    :data:`~stack.dissect.decoder.records.BriefFpdu` (``time`` as for :func:`summary_line`):
    tagged STag and TO (RFC 5041 §4.2), untagged QN, MSN, MO and the Invalidate STag of the
    Send with Invalidate kinds (RFC 5041 §4.3, RFC 5040 §4.3), DDP payload length, L (a Read
    Request: its header, RFC 5040 §4.4), the CRC verdict (MPA-12) and the marker count."""
    clock = "" if time is None else f" {time:>11.6f}"
    return BriefLines.format(item, clock)


class BriefLines:
    """Summary lines of a run of :data:`~stack.dissect.decoder.records.BriefFpdu` tuples,
    as :func:`brief_line` writes them, with the time column relative to ``t0``: the
    formatted time is reused while the timestamp repeats (the FPDUs of one segment).

    Given to the decoder (:attr:`Dissector.text <stack.dissect.decoder.Dissector.text>`),
    it lets the fused path write the lines of unmarked FPDUs itself from the templates of
    :meth:`shapes`; ``plain_sends`` holds the streams whose Sends need no upper-layer look
    (None: no stream's do), the Sends of any other stream still come as tuples."""

    __slots__ = ("t0", "_ts", "_clock", "_shapes", "plain_sends")

    def __init__(self, t0: float, plain_sends: Container[int] | None = None) -> None:
        self.t0 = t0
        self._ts: float | None = None
        self._clock = ""
        self._shapes: dict[tuple[tuple[int, str, str, str], bool | None], dict[int, str]] = {}
        self.plain_sends = plain_sends

    def shapes(self, route: tuple[int, str, str, str], crc_ok: bool | None) -> dict[int, str]:
        """The templates of one direction's unmarked brief lines by ``ctrl << 8 | uc`` (the
        DDP and RDMAP control bytes of a canonical header), filled by :meth:`shape`."""
        key = (route, crc_ok)
        shapes = self._shapes.get(key)
        if shapes is None:
            shapes = self._shapes[key] = {}
        return shapes

    @staticmethod
    def shape(
        shapes: dict[int, str], route: tuple[int, str, str, str], crc_ok: bool | None, cu: int
    ) -> str:
        """The template of the control bytes ``cu`` (DDP ``ctrl << 8`` with T and L, RFC 5041
        §4.2, and the RDMAP byte with the opcode, RFC 5040 §4.2), kept in ``shapes``: the
        one :meth:`format` uses."""
        ctrl = cu >> 8
        key = (route, cu & RDMAP_OPCODE_MASK, bool(ctrl & DDP_TAGGED), bool(ctrl & DDP_LAST),
               crc_ok, 0)  # fmt: skip
        template = shapes[cu] = _TEMPLATES.get(key) or _template(key)
        return template

    @staticmethod
    def format(item: BriefFpdu, clock: str) -> str:
        """The line of ``item`` with ``clock`` as its time column (text, or "")."""
        frame, _, route, op, tagged, f1, f2, f3, f4, plen, last, crc_ok, markers, _, _ = item
        key = (route, op, tagged, last, crc_ok, markers)
        template = _TEMPLATES.get(key) or _template(key)
        if tagged:
            return template % (frame, clock, f1, f2, plen)
        if op == _READ_REQUEST:  # f4: the header
            return template % (frame, clock, f1, f2, f3, plen, *f4)  # type: ignore[misc]
        return template % (frame, clock, f1, f2, f3, plen, f4 or 0)

    def line(self, item: BriefFpdu) -> str:
        """The summary line of ``item`` (time column: its timestamp minus ``t0``)."""
        ts = item[1]
        if ts != self._ts:
            self._ts = ts
            self._clock = " %11.6f" % (ts - self.t0)
        return self.format(item, self._clock)


def summary_line(rec: PduRecord, time: float | None = None) -> str:
    """One line per PDU, tshark-summary style; ``time`` (seconds since the capture's first
    segment) adds tshark's time column after the frame number."""
    route = (rec.stream, rec.direction, rec.src, rec.dst)
    seg = rec.segment
    if seg is not None and seg.header is None and not rec.findings:
        # the bulk of any capture: Write, Read Response and Send segments without findings
        if seg.tagged:
            plen = seg.ulpdu_len - DDP_TAGGED_HDR_LEN
            f1, f2, f3, f4 = seg.stag, seg.to, None, None
        else:
            plen = seg.ulpdu_len - DDP_UNTAGGED_HDR_LEN
            f1, f2, f3, f4 = seg.qn, seg.msn, seg.mo, seg.inval_stag
        item = (rec.frame, rec.timestamp, route, seg.opcode, seg.tagged, f1, f2, f3, f4, plen,
                seg.last, rec.crc_ok, len(rec.marker_ptrs), None, rec.wire_len)  # fmt: skip
        return brief_line(item, time)
    frame = f"{rec.frame:>6}" if time is None else f"{rec.frame:>6} {time:>11.6f}"
    tail = head_text(route)
    head = f"{frame}{tail}"
    if rec.kind != "fpdu":
        mpa = rec.mpa
        assert mpa is not None
        flags = "".join(
            c for c, on in (("M", mpa.markers), ("C", mpa.crc), ("R", mpa.reject)) if on
        )
        text = f"{KIND_NAMES[rec.kind]} rev={rec.rev} flags={flags or '-'} PD={rec.pd_len}"
        if mpa.ird_ord is not None:
            io = mpa.ird_ord
            text += f" IRD={io.ird} ORD={io.ord}"
            if io.p2p:
                text += f" P2P RTR={rtr_text(io.rtr)}"
    else:
        ok = rec.crc_ok
        crc = " CRC ok" if ok else "" if ok is None else " CRC BAD"
        marks = f" markers={len(rec.marker_ptrs)}" if rec.marker_ptrs else ""
        text = f"MPA/DDP/RDMAP {_fields(rec)}{crc}{marks}"
    if rec.findings:
        text += " [" + " ".join(rec.rules) + "]"
    return head + text


def rtr_text(rtr: RtrType) -> str:
    """The RTR types of an RFC 6581 IRD/ORD word (ERC-07): ``Send+Write``, or ``none``."""
    names = [n for n, bit in (("Send", RtrType.SEND), ("Write", RtrType.WRITE),
                              ("Read", RtrType.READ)) if rtr & bit]  # fmt: skip
    return "+".join(names) or "none"


def note_line(note: Note, time_column: bool = False) -> str:
    """A stream event that is not a PDU, as a comment line (``time_column``: aligned with
    summary lines that have one)."""
    pad = " " * 12 if time_column else ""
    return f"{note.frame:>6}{pad} {note.stream:>3} {note.direction} # {note.detail}"


def _utc(timestamp: float) -> str:
    """A capture timestamp as UTC date and time with microseconds."""
    try:
        when = datetime.fromtimestamp(timestamp, UTC)
    except (OverflowError, OSError, ValueError):
        return f"{timestamp:.6f} (epoch seconds)"
    return when.strftime("%Y-%m-%d %H:%M:%S.%f UTC")


def _hexdump(data: bytes | memoryview, limit: int = 64) -> str:
    raw = bytes(data[:limit])
    text = raw.hex(" ")
    return text + (" ..." if len(data) > limit else "")


def verbose_lines(rec: PduRecord, time: float | None = None) -> list[str]:
    """The full decode tree of one PDU; ``time``: seconds since the capture's first segment."""
    lines = [
        f"Frame {rec.frame}, stream {rec.stream}, {rec.direction}: {rec.src} \u2192 {rec.dst}, "
        f"stream offset {rec.offset}, {rec.wire_len} bytes on the wire",
        f"  Frame time: {_utc(rec.timestamp)}"
        + ("" if time is None else f" ({time:.6f} s since the first segment)"),
    ]
    if rec.kind != "fpdu":
        mpa = rec.mpa
        assert mpa is not None
        lines.append(f"  {KIND_NAMES[rec.kind]} Frame")
        lines.append(f"    Key: {'MPA ID Rep Frame' if mpa.reply else 'MPA ID Req Frame'}")
        lines.append(
            f"    Flags: 0x{rec.mpa_flags:02x} (M={int(mpa.markers)} C={int(mpa.crc)} "
            f"R={int(mpa.reject)} S={int(mpa.enhanced)} Res=0x{mpa.reserved:x})"
        )
        lines.append(f"    Revision: {rec.rev}")
        lines.append(f"    PD_Length: {rec.pd_len}")
        if mpa.ird_ord is not None:
            io = mpa.ird_ord
            lines.append(
                f"    IRD/ORD word: IRD={io.ird} ORD={io.ord} P2P={int(io.p2p)} "
                f"RTR={rtr_text(io.rtr)}"
            )
        if mpa.private_data:
            lines.append(f"    Private data: {_hexdump(mpa.private_data)}")
    else:
        lines.append("  MPA FPDU")
        lines.append(f"    ULPDU_Length: {rec.ulpdu_len}")
        for off, ptr, res in zip(
            rec.marker_offsets, rec.marker_ptrs, rec.marker_reserved, strict=True
        ):
            lines.append(f"    Marker at stream offset {off}: reserved 0x{res:04x} FPDUPTR {ptr}")
        lines.append(f"    PAD: {rec.pad.hex() or '(none)'}")
        verdict = (
            "not checked (CRC not negotiated)"
            if rec.crc_ok is None
            else "good"
            if rec.crc_ok
            else f"BAD, should be 0x{rec.crc_value:08x}"
        )
        lines.append(f"    CRC: 0x{rec.crc_field:08x} [{verdict}]")
        seg = rec.segment
        if seg is not None:
            plen = seg.ulpdu_len - seg.ddp_header_len
            ctrl = (
                f"T={int(seg.tagged)} L={int(seg.last)} Rsvd=0x{seg.ddp_rsvd:x} "
                f"DV={seg.ddp_version}"
            )
            if seg.tagged:
                lines.append(f"  DDP tagged segment ({ctrl})")
                lines.append(f"    STag: 0x{seg.stag:08x}")
                lines.append(f"    TO: 0x{seg.to:016x}")
            else:
                lines.append(f"  DDP untagged segment ({ctrl})")
                lines.append(f"    RsvdULP (Invalidate STag field): 0x{seg.inval_stag or 0:08x}")
                lines.append(f"    QN: {seg.qn}  MSN: {seg.msn}  MO: {seg.mo}")
            lines.append(f"    DDP payload length: {plen}")
            lines.append(
                f"  RDMAP (RV={seg.rdmap_version} Rsv=0x{seg.rdmap_rsvd:x} "
                f"opcode=0x{seg.opcode:x} {opcode_name(seg.opcode)})"
            )
            lines.extend(_header_lines(seg.header))
            if len(seg.payload):
                lines.append(f"    Payload ({len(seg.payload)} bytes): {_hexdump(seg.payload)}")
        else:
            lines.append(f"  ULPDU (undecodable): {_hexdump(rec.ulpdu)}")
    if rec.findings:
        lines.append("  Findings:")
        for f in rec.findings:
            term = f" [Terminate {f.term}]" if f.term is not None else ""
            lines.append(f"    {f.rule}: {f.detail}{term}")
    return lines


def _header_lines(h: object) -> list[str]:
    if isinstance(h, ReadRequest):
        return [
            f"    Data Sink STag: 0x{h.sink_stag:08x}  TO: 0x{h.sink_to:016x}",
            f"    RDMA Read Message Size: {h.size}",
            f"    Data Source STag: 0x{h.src_stag:08x}  TO: 0x{h.src_to:016x}",
        ]
    if isinstance(h, Terminate):
        out = [
            f"    Terminate: layer {h.layer} etype {h.etype} code 0x{h.code:02x} "
            f"({term_name(TermCode(h.layer, h.etype, h.code))})",
            f"    M={int(h.m)} D={int(h.d)} R={int(h.r)}"
            + ("  [control word in siw's swapped layout]" if h.siw_swapped else ""),
        ]
        if h.d:
            out.append(f"    DDP Segment Length: {h.ddp_seg_len}")
        if h.ddp_header:
            out.append(f"    Terminated DDP header: {h.ddp_header.hex(' ')}")
        if h.rdma_header:
            out.append(f"    Terminated RDMA header: {h.rdma_header.hex(' ')}")
        return out
    if isinstance(h, ImmediateData):
        return [f"    Immediate data: {h.data.hex(' ')}"]
    if isinstance(h, AtomicRequest):
        return [
            f"    AOpCode: {h.atomic_opcode}  Request ID: 0x{h.req_id:08x}",
            f"    Remote STag: 0x{h.stag:08x}  Remote TO: 0x{h.to:016x}",
            f"    Add/Swap data: 0x{h.add_swap_data:016x}  mask: 0x{h.add_swap_mask:016x}",
            f"    Compare data: 0x{h.compare_data:016x}  mask: 0x{h.compare_mask:016x}",
        ]
    if isinstance(h, AtomicResponse):
        return [
            f"    Original Request ID: 0x{h.req_id:08x}",
            f"    Original remote data value: 0x{h.orig_value:016x}",
        ]
    return []
