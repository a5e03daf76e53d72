"""Presentation of dissected PDUs: summary lines, ``-V`` trees, JSON records, statistics, filter.

* :func:`record_json` builds the JSON object of one PDU with exactly the keys of issue #4
  (plus ``timestamp``, ``wire_len``, ``offset``, ``finding_details`` and, for MPA frames,
  ``ulp_private_data`` and ``reserved``).  Keys that "do not apply" are ``null``; the
  per-opcode keys appear only on their opcodes.
* :func:`summary_line` is one line per PDU (frame, stream, direction, addresses, layers,
  key fields, findings); :func:`verbose_lines` is the full tree.
* :class:`Statistics` counts PDUs per opcode, bytes per direction and findings (``-z``).
* :func:`compile_filter` turns a display filter into a predicate over JSON records.  The
  language is small and safe (no ``eval``): ``and``/``or``/``not`` (``&&``, ``||``,
  ``!``), parentheses, comparisons ``== != < <= > >=``, ``contains`` (substring or list
  element) and ``in (a, b, ...)``, literals (decimal or ``0x`` integers, quoted strings,
  ``true``, ``false``, ``null``), and field names (the JSON keys).  A bare field is true
  when present and truthy; a missing field compares unequal to everything but ``null``.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any

from stack.constants import (
    ATOMIC_OPCODE_MASK,
    DDP_TAGGED,
    INVALIDATE_OPCODES,
    OPCODE_NAMES,
    RDMAP_OPCODE_MASK,
    AtomicOpcode,
    Opcode,
    RtrType,
    TermCode,
    term_name,
)
from stack.dissect.decoder import Note, PduRecord, StreamInfo
from stack.errors import IwarpError
from stack.wire.events import (
    AtomicRequest,
    AtomicResponse,
    ImmediateData,
    ReadRequest,
    Terminate,
)

__all__ = [
    "FIELDS",
    "FilterError",
    "Statistics",
    "compile_filter",
    "note_line",
    "record_json",
    "summary_line",
    "verbose_lines",
]

# Keys of issue #4 (the contract), then our additions.
COMMON_KEYS = ("stream", "frame", "direction", "src", "dst", "type")
MPA_KEYS = ("rev", "marker_flag", "crc_flag", "rej_flag", "enhanced", "pd_len", "private_data")
ENHANCED_KEYS = ("ird", "ord", "p2p", "rtr_send", "rtr_write", "rtr_read")
FPDU_KEYS = (
    "ulpdu_len",
    "crc_ok",
    "markers",
    "marker_ptrs",
    "tagged",
    "last",
    "ddp_version",
    "rdmap_version",
    "opcode",
    "opcode_name",
    "stag",
    "to",
    "qn",
    "msn",
    "mo",
    "ddp_payload_len",
)
INVAL_KEYS = ("inval_stag",)
READ_KEYS = ("read_sink_stag", "read_sink_to", "read_size", "read_src_stag", "read_src_to")
IMMEDIATE_KEYS = ("immediate_data",)
ATOMIC_REQ_KEYS = (
    "atomic_opcode",
    "atomic_req_id",
    "atomic_remote_stag",
    "atomic_remote_to",
    "atomic_add_swap_data",
    "atomic_add_swap_mask",
    "atomic_compare_data",
    "atomic_compare_mask",
)
ATOMIC_RESP_KEYS = ("atomic_orig_req_id", "atomic_orig_value")
TERM_KEYS = (
    "term_layer",
    "term_etype",
    "term_errcode",
    "term_m",
    "term_d",
    "term_r",
    "term_ddp_seg_len",
    "term_ddp_hdr",
    "term_rdmap_hdr",
)
EXTRA_KEYS = (
    "findings",
    "timestamp",
    "wire_len",
    "offset",
    "finding_details",
    "ulp_private_data",
    "reserved",
    "term_siw_layout",
)
FIELDS = frozenset(
    COMMON_KEYS
    + MPA_KEYS
    + ENHANCED_KEYS
    + FPDU_KEYS
    + INVAL_KEYS
    + READ_KEYS
    + IMMEDIATE_KEYS
    + ATOMIC_REQ_KEYS
    + ATOMIC_RESP_KEYS
    + TERM_KEYS
    + EXTRA_KEYS
)
"""Every key a JSON record can have (and so every name a display filter may use)."""

_NULL_FPDU = dict.fromkeys(FPDU_KEYS[4:])


def _hex(data: bytes | memoryview | None) -> str | None:
    return None if data is None else bytes(data).hex()


# ======================================================================================
# JSON records
# ======================================================================================


def record_json(rec: PduRecord) -> dict[str, Any]:
    """The JSON object of one PDU (issue #4's keys; see the module docstring)."""
    out: dict[str, Any] = {
        "stream": rec.stream,
        "frame": rec.frame,
        "direction": rec.direction,
        "src": rec.src,
        "dst": rec.dst,
        "type": rec.kind,
    }
    if rec.kind != "fpdu":
        mpa = rec.mpa
        assert mpa is not None
        out["rev"] = rec.rev
        out["marker_flag"] = mpa.markers
        out["crc_flag"] = mpa.crc
        out["rej_flag"] = mpa.reject
        out["enhanced"] = mpa.enhanced
        out["pd_len"] = rec.pd_len
        out["private_data"] = rec.private_data.hex()
        io = mpa.ird_ord
        if io is not None:
            out["ird"] = io.ird
            out["ord"] = io.ord
            out["p2p"] = io.p2p
            out["rtr_send"] = bool(io.rtr & RtrType.SEND)
            out["rtr_write"] = bool(io.rtr & RtrType.WRITE)
            out["rtr_read"] = bool(io.rtr & RtrType.READ)
        out["ulp_private_data"] = bytes(mpa.private_data).hex()
        out["reserved"] = rec.mpa_flags & 0x1F if not mpa.enhanced else rec.mpa_flags & 0x0F
    else:
        out["ulpdu_len"] = rec.ulpdu_len
        out["crc_ok"] = rec.crc_ok
        out["markers"] = len(rec.marker_ptrs)
        out["marker_ptrs"] = list(rec.marker_ptrs)
        seg = rec.segment
        if seg is None:
            out.update(_NULL_FPDU)
            if len(rec.ulpdu) >= 2:
                ctrl, uctrl = rec.ulpdu[0], rec.ulpdu[1]
                out["tagged"] = bool(ctrl & DDP_TAGGED)
                out["opcode"] = uctrl & RDMAP_OPCODE_MASK
                out["opcode_name"] = _opname(uctrl & RDMAP_OPCODE_MASK)
        else:
            op = seg.opcode
            out["tagged"] = seg.tagged
            out["last"] = seg.last
            out["ddp_version"] = seg.ddp_version
            out["rdmap_version"] = seg.rdmap_version
            out["opcode"] = op
            out["opcode_name"] = _opname(op)
            out["stag"] = seg.stag
            out["to"] = seg.to
            out["qn"] = seg.qn
            out["msn"] = seg.msn
            out["mo"] = seg.mo
            out["ddp_payload_len"] = seg.ulpdu_len - seg.ddp_header_len
            _opcode_fields(out, op, seg.header, seg.inval_stag)
    out["findings"] = rec.rules
    out["timestamp"] = rec.timestamp
    out["wire_len"] = rec.wire_len
    out["offset"] = rec.offset
    out["finding_details"] = [f"{f.rule}: {f.detail}" for f in rec.findings]
    return out


_NAMES = {int(op): name for op, name in OPCODE_NAMES.items()}
_INVALIDATE = frozenset(int(op) for op in INVALIDATE_OPCODES)


def _opname(op: int) -> str:
    name = _NAMES.get(op)
    return name if name is not None else f"Unknown (0x{op:X})"


def _opcode_fields(out: dict[str, Any], op: int, header: object, inval: int | None) -> None:
    if op in INVALIDATE_OPCODES:
        out["inval_stag"] = inval
    elif op == Opcode.RDMA_READ_REQUEST:
        h = header if isinstance(header, ReadRequest) else None
        out["read_sink_stag"] = h.sink_stag if h else None
        out["read_sink_to"] = h.sink_to if h else None
        out["read_size"] = h.size if h else None
        out["read_src_stag"] = h.src_stag if h else None
        out["read_src_to"] = h.src_to if h else None
    elif op in (Opcode.IMMEDIATE_DATA, Opcode.IMMEDIATE_DATA_SE):
        out["immediate_data"] = header.data.hex() if isinstance(header, ImmediateData) else None
    elif op == Opcode.ATOMIC_REQUEST:
        a = header if isinstance(header, AtomicRequest) else None
        out["atomic_opcode"] = a.atomic_opcode if a else None
        out["atomic_req_id"] = a.req_id if a else None
        out["atomic_remote_stag"] = a.stag if a else None
        out["atomic_remote_to"] = a.to if a else None
        out["atomic_add_swap_data"] = a.add_swap_data if a else None
        out["atomic_add_swap_mask"] = a.add_swap_mask if a else None
        out["atomic_compare_data"] = a.compare_data if a else None
        out["atomic_compare_mask"] = a.compare_mask if a else None
    elif op == Opcode.ATOMIC_RESPONSE:
        r = header if isinstance(header, AtomicResponse) else None
        out["atomic_orig_req_id"] = r.req_id if r else None
        out["atomic_orig_value"] = r.orig_value if r else None
    elif op == Opcode.TERMINATE:
        t = header if isinstance(header, Terminate) else None
        out["term_layer"] = t.layer if t else None
        out["term_etype"] = t.etype if t else None
        out["term_errcode"] = t.code if t else None
        out["term_m"] = t.m if t else None
        out["term_d"] = t.d if t else None
        out["term_r"] = t.r if t else None
        out["term_ddp_seg_len"] = t.ddp_seg_len if t and t.d else None
        out["term_ddp_hdr"] = t.ddp_header.hex() if t and t.ddp_header else None
        out["term_rdmap_hdr"] = t.rdma_header.hex() if t and t.rdma_header else None
        out["term_siw_layout"] = t.siw_swapped if t else None


def json_line(rec: PduRecord) -> str:
    """One JSON line for ``rec`` (compact, keys in the documented order)."""
    return json.dumps(record_json(rec), separators=(",", ":"))


# ======================================================================================
# Summary and tree
# ======================================================================================


def _fields(rec: PduRecord) -> str:
    seg = rec.segment
    if seg is None:
        return f"undecodable ULPDU ({rec.ulpdu_len} bytes)"
    op = seg.opcode
    name = _NAMES.get(op) or _opname(op)
    last = " L" if seg.last else ""
    if seg.tagged:
        plen = seg.ulpdu_len - 14
        return f"{name} STag=0x{seg.stag:08x} TO=0x{seg.to:x} len={plen}{last}"
    plen = seg.ulpdu_len - 18
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
        kind = {AtomicOpcode.FETCH_ADD: "FetchAdd", AtomicOpcode.CMP_SWAP: "CmpSwap"}.get(
            h.atomic_opcode & ATOMIC_OPCODE_MASK, f"AOp{h.atomic_opcode}"
        )
        return (
            f"{base} {kind} id=0x{h.req_id:08x} 0x{h.stag:08x}/0x{h.to:x} "
            f"data=0x{h.add_swap_data:x} mask=0x{h.add_swap_mask:x}"
            + (f" cmp=0x{h.compare_data:x}" if h.atomic_opcode == AtomicOpcode.CMP_SWAP else "")
        )
    if isinstance(h, AtomicResponse):
        return f"{base} id=0x{h.req_id:08x} orig=0x{h.orig_value:x}"
    return f"{base} len={plen}{last}"


_HEADS: dict[tuple[int, str, str, str], str] = {}


def summary_line(rec: PduRecord) -> str:
    """One line per PDU, tshark-summary style."""
    key = (rec.stream, rec.direction, rec.src, rec.dst)
    tail = _HEADS.get(key)
    if tail is None:
        tail = f" {rec.stream:>3} {rec.direction} {rec.src} \u2192 {rec.dst} "
        if len(_HEADS) < 4096:
            _HEADS[key] = tail
    seg = rec.segment
    if seg is not None and seg.header is None and not rec.findings:
        # the bulk of any capture: Write, Read Response and Send segments without findings
        ok = rec.crc_ok
        crc = " CRC ok" if ok else "" if ok is None else " CRC BAD"
        if rec.marker_ptrs:
            crc += f" markers={len(rec.marker_ptrs)}"
        last = " L" if seg.last else ""
        name = _NAMES.get(seg.opcode) or _opname(seg.opcode)
        if seg.tagged:
            return (
                f"{rec.frame:>6}{tail}MPA/DDP/RDMAP {name} STag=0x{seg.stag:08x} "
                f"TO=0x{seg.to:x} len={seg.ulpdu_len - 14}{last}{crc}"
            )
        if seg.opcode not in _INVALIDATE:
            return (
                f"{rec.frame:>6}{tail}MPA/DDP/RDMAP {name} QN={seg.qn} MSN={seg.msn} "
                f"MO={seg.mo} len={seg.ulpdu_len - 18}{last}{crc}"
            )
    head = f"{rec.frame:>6}{tail}"
    if rec.kind != "fpdu":
        mpa = rec.mpa
        assert mpa is not None
        what = "Request" if rec.kind == "mpa_req" else "Reply"
        flags = "".join(
            c for c, on in (("M", mpa.markers), ("C", mpa.crc), ("R", mpa.reject)) if on
        )
        text = f"MPA {what} rev={rec.rev} flags={flags or '-'} PD={rec.pd_len}"
        if mpa.ird_ord is not None:
            io = mpa.ird_ord
            text += f" IRD={io.ird} ORD={io.ord}"
            if io.p2p:
                text += f" P2P RTR={_rtr(io.rtr)}"
    else:
        ok = rec.crc_ok
        crc = " CRC ok" if ok else "" if ok is None else " CRC BAD"
        marks = f" markers={len(rec.marker_ptrs)}" if rec.marker_ptrs else ""
        text = f"MPA/DDP/RDMAP {_fields(rec)}{crc}{marks}"
    if rec.findings:
        text += " [" + " ".join(rec.rules) + "]"
    return head + text


def _rtr(rtr: RtrType) -> str:
    names = [n for n, bit in (("Send", RtrType.SEND), ("Write", RtrType.WRITE),
                              ("Read", RtrType.READ)) if rtr & bit]  # fmt: skip
    return "+".join(names) or "none"


def note_line(note: Note) -> str:
    """A stream event that is not a PDU, as a comment line."""
    return f"{note.frame:>6} {note.stream:>3} {note.direction} # {note.detail}"


def _hexdump(data: bytes | memoryview, limit: int = 64) -> str:
    raw = bytes(data[:limit])
    text = raw.hex(" ")
    return text + (" ..." if len(data) > limit else "")


def verbose_lines(rec: PduRecord) -> list[str]:
    """The full decode tree of one PDU."""
    lines = [
        f"Frame {rec.frame}, stream {rec.stream}, {rec.direction}: {rec.src} \u2192 {rec.dst}, "
        f"stream offset {rec.offset}, {rec.wire_len} bytes on the wire"
    ]
    if rec.kind != "fpdu":
        mpa = rec.mpa
        assert mpa is not None
        lines.append(f"  MPA {'Request' if rec.kind == 'mpa_req' else 'Reply'} Frame")
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
                f"    IRD/ORD word: IRD={io.ird} ORD={io.ord} P2P={int(io.p2p)} RTR={_rtr(io.rtr)}"
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
                f"opcode=0x{seg.opcode:x} {_opname(seg.opcode)})"
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


# ======================================================================================
# Statistics (-z)
# ======================================================================================


class Statistics:
    """Counts over the displayed PDUs plus per-stream totals."""

    def __init__(self) -> None:
        self.opcodes: Counter[str] = Counter()
        self.per_direction: Counter[tuple[str, str]] = Counter()
        self.findings: Counter[str] = Counter()
        self.crc_bad = 0
        self.pdus = 0
        self.notes: Counter[str] = Counter()

    def add(self, rec: PduRecord) -> None:
        self.pdus += 1
        if rec.kind == "fpdu":
            seg = rec.segment
            name = _opname(seg.opcode) if seg is not None else "(undecodable)"
            if rec.crc_ok is False:
                self.crc_bad += 1
        else:
            name = "MPA Request" if rec.kind == "mpa_req" else "MPA Reply"
        self.opcodes[name] += 1
        self.per_direction[(name, rec.direction)] += 1
        for rule in rec.rules:
            self.findings[rule] += 1

    def add_note(self, note: Note) -> None:
        self.notes[note.kind] += 1

    def render(self, streams: Iterable[StreamInfo]) -> list[str]:
        lines = ["=" * 72, "iWARP statistics", "=" * 72]
        streams = list(streams)
        iwarp = [s for s in streams if s.state not in ("not_iwarp", "start")]
        lines.append(
            f"TCP connections: {len(streams)}, iWARP: {len(iwarp)}, "
            f"PDUs shown: {self.pdus}, bad CRC: {self.crc_bad}"
        )
        for s in iwarp:
            lines.append(
                f"Stream {s.stream}: {s.endpoints[0]} <-> {s.endpoints[1]}  state={s.state}"
                + (f" rev={s.rev}" if s.rev is not None else "")
                + (f" P2P RTR={_rtr(s.rtr)}" if s.p2p else "")
            )
            for name in ("i2r", "r2i"):
                d = s.directions.get(name)
                if d is None:
                    continue
                crc = "?" if d.crc is None else "on" if d.crc else "off"
                mk = "?" if d.markers is None else "on" if d.markers else "off"
                lines.append(
                    f"  {name} {d.src} -> {d.dst}: CRC {crc}, markers {mk}; "
                    f"{d.pdus} PDUs ({d.fpdus} FPDUs), {d.wire_bytes} wire bytes, "
                    f"{d.ulpdu_bytes} ULPDU bytes, {d.payload_bytes} payload bytes"
                )
                extra = [
                    f"{label} {value}"
                    for label, value in (
                        ("gap bytes", d.gap_bytes),
                        ("retransmitted bytes", d.retransmitted_bytes),
                        ("undecoded bytes", d.undecoded_bytes),
                    )
                    if value
                ]
                if extra:
                    lines.append("    " + ", ".join(extra))
        lines.append("PDUs per type/opcode:           total     i2r     r2i")
        for name, count in sorted(self.opcodes.items(), key=lambda kv: (-kv[1], kv[0])):
            i2r = self.per_direction[(name, "i2r")]
            r2i = self.per_direction[(name, "r2i")]
            lines.append(f"  {name:<28} {count:>7} {i2r:>7} {r2i:>7}")
        if self.findings:
            lines.append("Findings (PDUs per rule):")
            for rule, count in sorted(self.findings.items()):
                lines.append(f"  {rule:<12} {count:>7}")
        else:
            lines.append("Findings: none")
        if self.notes:
            lines.append(
                "Stream events: " + ", ".join(f"{k} {v}" for k, v in sorted(self.notes.items()))
            )
        lines.append("=" * 72)
        return lines


# ======================================================================================
# Display filter
# ======================================================================================


class FilterError(IwarpError):
    """A display filter that does not parse."""


_TOKEN = re.compile(
    r"""\s*(?:
        (?P<num>0[xX][0-9a-fA-F]+|\d+)
      | (?P<str>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*')
      | (?P<op>==|!=|<=|>=|&&|\|\||[<>()!,])
      | (?P<word>[A-Za-z_][A-Za-z0-9_\-]*)
    )""",
    re.VERBOSE,
)

_MISSING = object()
Predicate = Callable[[dict[str, Any]], Any]


def _tokenize(text: str, field_prefixes: tuple[str, ...] = ()) -> list[tuple[str, Any]]:
    tokens: list[tuple[str, Any]] = []
    pos = 0
    text = text.rstrip()
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None or m.end() == pos:
            raise FilterError(f"unexpected character {text[pos:].strip()[:1]!r} at {pos}")
        pos = m.end()
        if m.group("num") is not None:
            tokens.append(("lit", int(m.group("num"), 0)))
        elif m.group("str") is not None:
            raw = m.group("str")[1:-1]
            tokens.append(("lit", re.sub(r"\\(.)", r"\1", raw)))
        elif m.group("op") is not None:
            tokens.append(("op", m.group("op")))
        else:
            word = m.group("word")
            low = word.lower()
            if low in ("and", "or", "not", "contains", "in"):
                tokens.append(("op", low))
            elif low in ("true", "false"):
                tokens.append(("lit", low == "true"))
            elif low in ("null", "none"):
                tokens.append(("lit", None))
            elif word in FIELDS or word.startswith(field_prefixes or ("\0",)):
                tokens.append(("field", word))
            else:
                raise FilterError(
                    f"unknown field {word!r} (fields are the --json keys; quote strings)"
                )
    return tokens


class _Parser:
    def __init__(self, tokens: list[tuple[str, Any]]) -> None:
        self.tokens = tokens
        self.i = 0

    def peek(self) -> tuple[str, Any] | None:
        return self.tokens[self.i] if self.i < len(self.tokens) else None

    def take(self) -> tuple[str, Any]:
        tok = self.peek()
        if tok is None:
            raise FilterError("unexpected end of filter")
        self.i += 1
        return tok

    def accept(self, *ops: str) -> str | None:
        tok = self.peek()
        if tok is not None and tok[0] == "op" and tok[1] in ops:
            self.i += 1
            return tok[1]
        return None

    def parse(self) -> Predicate:
        pred = self.or_expr()
        if self.peek() is not None:
            raise FilterError(f"unexpected {self.peek()[1]!r}")  # type: ignore[index]
        return pred

    def or_expr(self) -> Predicate:
        left = self.and_expr()
        while self.accept("or", "||"):
            right = self.and_expr()
            left = (lambda a, b: lambda r: a(r) or b(r))(left, right)
        return left

    def and_expr(self) -> Predicate:
        left = self.not_expr()
        while self.accept("and", "&&"):
            right = self.not_expr()
            left = (lambda a, b: lambda r: a(r) and b(r))(left, right)
        return left

    def not_expr(self) -> Predicate:
        if self.accept("not", "!"):
            inner = self.not_expr()
            return lambda r: not inner(r)
        return self.comparison()

    def operand(self) -> Callable[[dict[str, Any]], Any]:
        kind, value = self.take()
        if kind == "lit":
            return lambda r: value
        if kind == "field":
            return lambda r: r.get(value, _MISSING)
        raise FilterError(f"expected a field or a value, got {value!r}")

    def comparison(self) -> Predicate:
        if self.accept("("):
            inner = self.or_expr()
            if not self.accept(")"):
                raise FilterError("missing ')'")
            return inner
        left = self.operand()
        op = self.accept("==", "!=", "<", "<=", ">", ">=", "contains", "in")
        if op is None:
            return lambda r: _truthy(left(r))
        if op == "in":
            if not self.accept("("):
                raise FilterError("'in' needs a parenthesised list")
            options = []
            while True:
                kind, value = self.take()
                if kind != "lit":
                    raise FilterError("'in' lists hold values only")
                options.append(value)
                if self.accept(")"):
                    break
                if not self.accept(","):
                    raise FilterError("expected ',' or ')' in a list")
            return lambda r: any(_equal(left(r), v) for v in options)
        right = self.operand()
        return _compare(op, left, right)


def _truthy(value: Any) -> bool:
    return value is not _MISSING and bool(value)


def _equal(a: Any, b: Any) -> bool:
    if a is _MISSING:
        a = None
    if b is _MISSING:
        b = None
    if isinstance(a, bool) != isinstance(b, bool):
        return False
    return a == b


def _compare(op: str, left: Predicate, right: Predicate) -> Predicate:
    if op == "==":
        return lambda r: _equal(left(r), right(r))
    if op == "!=":
        return lambda r: not _equal(left(r), right(r))
    if op == "contains":

        def contains(r: dict[str, Any]) -> bool:
            a, b = left(r), right(r)
            if isinstance(a, list):
                return b in a
            if isinstance(a, str) and isinstance(b, str):
                return b.lower() in a.lower()
            return False

        return contains

    def ordered(r: dict[str, Any]) -> bool:
        a, b = left(r), right(r)
        if isinstance(a, bool) or isinstance(b, bool):
            return False
        if not (
            isinstance(a, int) and isinstance(b, int) or isinstance(a, str) and isinstance(b, str)
        ):
            return False
        if op == "<":
            return a < b
        if op == "<=":
            return a <= b
        if op == ">":
            return a > b
        return a >= b

    return ordered


def compile_filter(text: str, field_prefixes: tuple[str, ...] = ()) -> Predicate:
    """Compile a display filter over JSON records; raises :class:`FilterError`.

    ``field_prefixes``: also accept fields starting with these (keys an upper-layer
    decoder adds to the records, e.g. ``kbtp_``).
    """
    tokens = _tokenize(text, field_prefixes)
    if not tokens:
        raise FilterError("empty filter")
    return _Parser(tokens).parse()
