"""The field table of dissected PDUs: the ``--json`` record keys, which are the ``-Y`` names.

:func:`record_json` builds one record per PDU from the key groups below, in their order
and from nowhere else, and :data:`FIELDS` (the names a display filter accepts) is their
union, so the JSON keys and the filter fields cannot drift apart.

* Every record: :data:`COMMON_KEYS`, the keys of its kind, then :data:`TAIL_KEYS`.
* MPA Request or Reply (``type`` ``mpa_req``/``mpa_rep``, RFC 5044 §7.1.1):
  :data:`MPA_KEYS`; :data:`ENHANCED_KEYS` when it carries the RFC 6581 IRD/ORD word
  (ERC-03); then :data:`MPA_EXTRA_KEYS` (the ULP's private data after the word, the
  reserved flag bits).
* FPDU (``type`` ``fpdu``): :data:`FPDU_KEYS`, :data:`SEGMENT_KEYS` (DDP and RDMAP
  header fields, RFC 5041 §4 and RFC 5040 §4.1; ``null`` where they do not apply, e.g.
  ``stag`` on an untagged segment, or all of them when the ULPDU is undecodable), then
  :data:`OPCODE_KEYS` of the opcodes that carry more (Invalidate STag, Read Request,
  Immediate Data, Atomic Request/Response, Terminate; ``null`` when the header is missing).

Records hold numbers, which display filters compare.  Written out (``--json``,
:func:`json_object`), the STag and Tagged Offset fields (:data:`HEX_DIGITS`) become
fixed-width hex strings, ``"0x%08x"`` and ``"0x%016x"`` as tshark writes them; ``-T fields``
prints the same strings.

Names of PDU kinds (:data:`KIND_NAMES`) and opcodes (:func:`opcode_name`) are shared by
the records, the text output and the statistics.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from itertools import chain
from typing import TYPE_CHECKING, Any

from stack.constants import (
    DDP_TAGGED,
    MPA_RESERVED_MASK,
    OPCODE_NAMES,
    RDMAP_OPCODE_MASK,
    MpaFlag,
    Opcode,
    RtrType,
)
from stack.wire.events import (
    AtomicRequest,
    AtomicResponse,
    ImmediateData,
    ReadRequest,
    Terminate,
)

if TYPE_CHECKING:
    from stack.dissect.decoder import PduRecord, SegmentView

__all__ = [
    "ALIASES",
    "ATOMIC_REQ_KEYS",
    "AnyOf",
    "ATOMIC_RESP_KEYS",
    "COMMON_KEYS",
    "DERIVED_INFO",
    "ENHANCED_KEYS",
    "FIELDS",
    "FIELD_INFO",
    "FPDU_KEYS",
    "FieldContext",
    "HEX_DIGITS",
    "IMMEDIATE_KEYS",
    "INVAL_KEYS",
    "KIND_NAMES",
    "MPA_EXTRA_KEYS",
    "MPA_KEYS",
    "OPCODE_KEYS",
    "OPCODE_NAMES_BY_VALUE",
    "READ_KEYS",
    "SEGMENT_KEYS",
    "STAG_KEYS",
    "TAIL_KEYS",
    "TERM_KEYS",
    "TO_KEYS",
    "field_getter",
    "field_list",
    "hex_text",
    "json_line",
    "json_object",
    "opcode_name",
    "record_json",
]

COMMON_KEYS = ("stream", "frame", "direction", "src", "dst", "type")
MPA_KEYS = ("rev", "marker_flag", "crc_flag", "rej_flag", "enhanced", "pd_len", "private_data")
ENHANCED_KEYS = ("ird", "ord", "p2p", "rtr_send", "rtr_write", "rtr_read")
MPA_EXTRA_KEYS = ("ulp_private_data", "reserved")
FPDU_KEYS = ("ulpdu_len", "crc_ok", "markers", "marker_ptrs")
SEGMENT_KEYS = (
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
    "term_siw_layout",
)
TAIL_KEYS = ("findings", "timestamp", "wire_len", "offset", "finding_details")

STAG_KEYS = ("stag", "inval_stag", "read_sink_stag", "read_src_stag", "atomic_remote_stag")
"""The STag fields (32 bits: RFC 5041 §4.2, RFC 5040 §4.1 and §4.4, RFC 7306 §5.2.1)."""
TO_KEYS = ("to", "read_sink_to", "read_src_to", "atomic_remote_to")
"""The Tagged Offset fields (64 bits: RFC 5041 §4.2, RFC 5040 §4.4, RFC 7306 §5.2.1)."""
HEX_DIGITS: dict[str, int] = {**dict.fromkeys(STAG_KEYS, 8), **dict.fromkeys(TO_KEYS, 16)}
"""Fields written as hex strings of fixed width: key -> hex digits (two per octet)."""

KIND_NAMES: dict[str, str] = {"mpa_req": "MPA Request", "mpa_rep": "MPA Reply"}
"""Display names of the startup frames' ``type`` values (FPDUs are named by opcode)."""

OPCODE_NAMES_BY_VALUE: dict[int, str] = {int(op): name for op, name in OPCODE_NAMES.items()}
"""The names of the defined opcodes, keyed by plain int (a fast lookup on hot paths)."""


def opcode_name(op: int) -> str:
    """The ``opcode_name`` of an RDMAP opcode (RFC 5040 §4.2, RFC 7306 §4.1)."""
    name = OPCODE_NAMES_BY_VALUE.get(op)
    return name if name is not None else f"Unknown (0x{op:X})"


# ======================================================================================
# Per-opcode fields: the keys and where their values come from
# ======================================================================================


def _invalidate(seg: SegmentView) -> tuple[Any, ...]:
    return (seg.inval_stag,)


def _read_request(seg: SegmentView) -> tuple[Any, ...] | None:
    h = seg.header
    if not isinstance(h, ReadRequest):
        return None
    return (h.sink_stag, h.sink_to, h.size, h.src_stag, h.src_to)


def _immediate(seg: SegmentView) -> tuple[Any, ...] | None:
    h = seg.header
    return (h.data.hex(),) if isinstance(h, ImmediateData) else None


def _atomic_request(seg: SegmentView) -> tuple[Any, ...] | None:
    a = seg.header
    if not isinstance(a, AtomicRequest):
        return None
    return (
        a.atomic_opcode,
        a.req_id,
        a.stag,
        a.to,
        a.add_swap_data,
        a.add_swap_mask,
        a.compare_data,
        a.compare_mask,
    )


def _atomic_response(seg: SegmentView) -> tuple[Any, ...] | None:
    r = seg.header
    return (r.req_id, r.orig_value) if isinstance(r, AtomicResponse) else None


def _terminate(seg: SegmentView) -> tuple[Any, ...] | None:
    t = seg.header
    if not isinstance(t, Terminate):
        return None
    return (
        t.layer,
        t.etype,
        t.code,
        t.m,
        t.d,
        t.r,
        t.ddp_seg_len if t.d else None,
        t.ddp_header.hex() if t.ddp_header else None,
        t.rdma_header.hex() if t.rdma_header else None,
        t.siw_swapped,
    )


_Values = Callable[["SegmentView"], "tuple[Any, ...] | None"]
_OPCODE_FIELDS: dict[int, tuple[tuple[str, ...], _Values]] = {
    int(Opcode.SEND_INVALIDATE): (INVAL_KEYS, _invalidate),
    int(Opcode.SEND_SE_INVALIDATE): (INVAL_KEYS, _invalidate),
    int(Opcode.RDMA_READ_REQUEST): (READ_KEYS, _read_request),
    int(Opcode.IMMEDIATE_DATA): (IMMEDIATE_KEYS, _immediate),
    int(Opcode.IMMEDIATE_DATA_SE): (IMMEDIATE_KEYS, _immediate),
    int(Opcode.ATOMIC_REQUEST): (ATOMIC_REQ_KEYS, _atomic_request),
    int(Opcode.ATOMIC_RESPONSE): (ATOMIC_RESP_KEYS, _atomic_response),
    int(Opcode.TERMINATE): (TERM_KEYS, _terminate),
}
"""Opcode -> (keys, values of a segment or None when its header is missing)."""

OPCODE_KEYS: dict[int, tuple[str, ...]] = {op: keys for op, (keys, _) in _OPCODE_FIELDS.items()}
"""The extra keys of each opcode that has some; other opcodes have none."""

FIELDS = frozenset(
    chain(
        COMMON_KEYS,
        MPA_KEYS,
        ENHANCED_KEYS,
        MPA_EXTRA_KEYS,
        FPDU_KEYS,
        SEGMENT_KEYS,
        *OPCODE_KEYS.values(),
        TAIL_KEYS,
    )
)
"""Every key a JSON record can have (and so every name a display filter may use)."""

_DDP = "iwarp_ddp."
_RDMA = "iwarp_rdma."
_MPA = "iwarp_mpa."
_ATOMIC = "iwarp_rdma.atomic."

FIELD_INFO: dict[str, tuple[str, tuple[str, ...]]] = {
    # COMMON_KEYS
    "stream": ("TCP connection index, in order of first appearance", ("tcp.stream",)),
    "frame": ("number of the frame that completed the PDU (1-based)", ("frame.number",)),
    "direction": ("i2r (from the MPA initiator) or r2i", ()),
    "src": ("sender address:port", ()),
    "dst": ("receiver address:port", ()),
    "type": ("PDU kind: mpa_req, mpa_rep or fpdu", ()),
    # MPA_KEYS (RFC 5044 section 7.1.1)
    "rev": ("MPA Revision (1 or 2)", (_MPA + "rev",)),
    "marker_flag": ("MPA M flag: markers wanted", (_MPA + "marker_flag",)),
    "crc_flag": ("MPA C flag: CRC wanted", (_MPA + "crc_flag",)),
    "rej_flag": ("MPA R flag: connection rejected", (_MPA + "rej_flag",)),
    "enhanced": ("RFC 6581 S flag: the IRD/ORD word is present", ()),
    "pd_len": ("MPA PD_Length", (_MPA + "pdlength",)),
    "private_data": ("private data (hex), IRD/ORD word included", (_MPA + "privatedata",)),
    # ENHANCED_KEYS (RFC 6581 section 9)
    "ird": ("RFC 6581 IRD", ()),
    "ord": ("RFC 6581 ORD", ()),
    "p2p": ("RFC 6581 peer-to-peer flag", ()),
    "rtr_send": ("RFC 6581 RTR type: zero-length Send", ()),
    "rtr_write": ("RFC 6581 RTR type: zero-length Write", ()),
    "rtr_read": ("RFC 6581 RTR type: zero-length Read", ()),
    # MPA_EXTRA_KEYS
    "ulp_private_data": ("the ULP's private data after the IRD/ORD word (hex)", ()),
    "reserved": ("reserved MPA flag bits that are set", (_MPA + "res",)),
    # FPDU_KEYS (RFC 5044 section 4)
    "ulpdu_len": ("MPA ULPDU_Length", (_MPA + "ulpdulength",)),
    "crc_ok": ("CRC verdict: true, false, or null when CRCs are off", ()),
    "markers": ("number of markers in the FPDU", ()),
    "marker_ptrs": ("FPDUPTR of each marker", (_MPA + "marker_fpduptr",)),
    # SEGMENT_KEYS (RFC 5041 section 4, RFC 5040 section 4.1)
    "tagged": ("DDP T flag: tagged buffer model", (_DDP + "tagged_flag",)),
    "last": ("DDP L flag: last segment of the message", (_DDP + "last_flag",)),
    "ddp_version": ("DDP version (DV)", (_DDP + "dv",)),
    "rdmap_version": ("RDMAP version (RV)", (_RDMA + "version",)),
    "opcode": ("RDMAP opcode", (_RDMA + "opcode",)),
    "opcode_name": ("name of the RDMAP opcode", ()),
    "stag": ("DDP tagged STag (null when untagged)", (_DDP + "stag",)),
    "to": ("DDP tagged offset TO (null when untagged)", (_DDP + "tagged_offset",)),
    "qn": ("DDP untagged queue number QN", (_DDP + "qn",)),
    "msn": ("DDP untagged message sequence number MSN", (_DDP + "msn",)),
    "mo": ("DDP untagged message offset MO", (_DDP + "mo",)),
    "ddp_payload_len": ("DDP payload length (ULPDU minus DDP/RDMAP headers)", ()),
    # OPCODE_KEYS
    "inval_stag": ("Send with Invalidate: the STag to invalidate", (_RDMA + "inval_stag",)),
    "read_sink_stag": ("Read Request: Data Sink STag", (_RDMA + "sinkstag",)),
    "read_sink_to": ("Read Request: Data Sink Tagged Offset", (_RDMA + "sinkto",)),
    "read_size": ("Read Request: RDMA Read Message Size", (_RDMA + "rdmardsz",)),
    "read_src_stag": ("Read Request: Data Source STag", (_RDMA + "srcstag",)),
    "read_src_to": ("Read Request: Data Source Tagged Offset", (_RDMA + "srcto",)),
    "immediate_data": ("Immediate Data: the 8 octets (hex)", ()),
    "atomic_opcode": ("Atomic Request: AOpCode", (_ATOMIC + "opcode",)),
    "atomic_req_id": ("Atomic Request: Request Identifier", (_ATOMIC + "request_identifier",)),
    "atomic_remote_stag": ("Atomic Request: Remote STag", (_ATOMIC + "remote_stag",)),
    "atomic_remote_to": ("Atomic Request: Remote Tagged Offset",
                         (_ATOMIC + "remote_tagged_offset",)),
    "atomic_add_swap_data": ("Atomic Request: Add or Swap Data",
                             (_ATOMIC + "add_data", _ATOMIC + "swap_data")),
    "atomic_add_swap_mask": ("Atomic Request: Add or Swap Mask",
                             (_ATOMIC + "add_mask", _ATOMIC + "swap_mask")),
    "atomic_compare_data": ("Atomic Request: Compare Data", (_ATOMIC + "compare_data",)),
    "atomic_compare_mask": ("Atomic Request: Compare Mask", (_ATOMIC + "compare_mask",)),
    "atomic_orig_req_id": ("Atomic Response: Original Request Identifier",
                           (_ATOMIC + "original_request_identifier",)),
    "atomic_orig_value": ("Atomic Response: Original Remote Data Value",
                          (_ATOMIC + "original_remote_data_value",)),
    "term_layer": ("Terminate: Layer", (_RDMA + "term_layer",)),
    "term_etype": ("Terminate: Error Type", (_RDMA + "term_etype",)),
    "term_errcode": ("Terminate: Error Code", (_RDMA + "term_errcode",)),
    "term_m": ("Terminate: M bit (DDP header included)", (_RDMA + "term_hdrct_m",)),
    "term_d": ("Terminate: D bit (DDP Segment Length valid)", (_RDMA + "hdrct_d",)),
    "term_r": ("Terminate: R bit (RDMAP header included)", (_RDMA + "hdrct_r",)),
    "term_ddp_seg_len": ("Terminate: DDP Segment Length", (_RDMA + "term_ddp_seg_len",)),
    "term_ddp_hdr": ("Terminate: terminated DDP header (hex)", (_RDMA + "term_ddp_h",)),
    "term_rdmap_hdr": ("Terminate: terminated RDMAP header (hex)", (_RDMA + "term_rdma_h",)),
    "term_siw_layout": ("Terminate control word read in siw's swapped layout", ()),
    # TAIL_KEYS
    "findings": ("rule IDs of the findings (MPA-12, DDP-05...)", ()),
    "timestamp": ("capture time of the frame, seconds since the epoch", ("frame.time_epoch",)),
    "wire_len": ("bytes of the PDU on the wire (markers, pad and CRC included)", ()),
    "offset": ("stream offset of the PDU's first byte", ()),
    "finding_details": ("each finding as 'RULE: detail'", ()),
}  # fmt: skip
"""Every JSON key: (description, the Wireshark display-filter names it answers to)."""

ALIASES: dict[str, str] = {alias: key for key, (_, names) in FIELD_INFO.items() for alias in names}
"""Wireshark field name -> JSON key (``-e`` and ``-Y`` accept both)."""


class AnyOf(tuple[Any, ...]):
    """The values of a field that matches on either endpoint (``tcp.port``, ``ip.addr``)."""

    __slots__ = ()


def _host_port(text: Any) -> tuple[str, int] | None:
    if not isinstance(text, str):
        return None
    host, _, port = text.rpartition(":")
    return host.strip("[]"), int(port)


def _port(key: str) -> Callable[[dict[str, Any]], Any]:
    def get(record: dict[str, Any]) -> Any:
        hp = _host_port(record.get(key))
        return None if hp is None else hp[1]

    return get


def _host(key: str, v6: bool) -> Callable[[dict[str, Any]], Any]:
    def get(record: dict[str, Any]) -> Any:
        hp = _host_port(record.get(key))
        return None if hp is None or (":" in hp[0]) != v6 else hp[0]

    return get


def _either(
    a: Callable[[dict[str, Any]], Any], b: Callable[[dict[str, Any]], Any]
) -> Callable[[dict[str, Any]], Any]:
    def get(record: dict[str, Any]) -> Any:
        values = [v for v in (a(record), b(record)) if v is not None]
        return AnyOf(values) if values else None

    return get


class FieldContext:
    """What derived fields need beyond a record: ``t0``, the capture's first timestamp."""

    __slots__ = ("t0",)

    def __init__(self) -> None:
        self.t0: float | None = None

    def relative(self, record: dict[str, Any]) -> Any:
        ts = record.get("timestamp")
        return None if ts is None or self.t0 is None else round(ts - self.t0, 6)


_IP_SRC, _IP_DST = _host("src", False), _host("dst", False)
_IP6_SRC, _IP6_DST = _host("src", True), _host("dst", True)
_SPORT, _DPORT = _port("src"), _port("dst")
DERIVED_INFO: dict[str, tuple[str, Callable[[dict[str, Any]], Any] | None]] = {
    "frame.time_relative": ("seconds since the capture's first TCP segment", None),
    "tcp.srcport": ("TCP source port", _SPORT),
    "tcp.dstport": ("TCP destination port", _DPORT),
    "tcp.port": ("TCP source or destination port", _either(_SPORT, _DPORT)),
    "ip.src": ("IPv4 source address", _IP_SRC),
    "ip.dst": ("IPv4 destination address", _IP_DST),
    "ip.addr": ("IPv4 source or destination address", _either(_IP_SRC, _IP_DST)),
    "ipv6.src": ("IPv6 source address", _IP6_SRC),
    "ipv6.dst": ("IPv6 destination address", _IP6_DST),
    "ipv6.addr": ("IPv6 source or destination address", _either(_IP6_SRC, _IP6_DST)),
}
"""Wireshark fields computed from a record (``frame.time_relative`` from its context)."""


def field_getter(
    name: str, context: FieldContext | None = None
) -> Callable[[dict[str, Any]], Any] | None:
    """The value of field ``name`` (JSON key, Wireshark name or derived) in a record, or None
    when no field has that name.  A missing value is None (AnyOf for either-end fields)."""
    key = ALIASES.get(name, name)
    if key in FIELDS:
        return lambda record: record.get(key)
    if name == "frame.time_relative":
        return (context or FieldContext()).relative
    derived = DERIVED_INFO.get(name)
    return derived[1] if derived is not None else None


def field_list() -> list[str]:
    """``-G fields``: one line per field, ``NAME<TAB>WIRESHARK NAMES<TAB>DESCRIPTION``."""
    lines = [
        f"{key}\t{','.join(names) or '-'}\t{text}" for key, (text, names) in FIELD_INFO.items()
    ]
    lines += [f"{name}\t{name}\t{text}" for name, (text, _) in DERIVED_INFO.items()]
    return lines


_NULL_SEGMENT = dict.fromkeys(SEGMENT_KEYS)
_MPA_HEAD = COMMON_KEYS + MPA_KEYS
_FPDU_BASE = COMMON_KEYS + FPDU_KEYS
_FPDU_HEAD = _FPDU_BASE + SEGMENT_KEYS
_FPDU_RECORD = _FPDU_HEAD + TAIL_KEYS  # the bulk of a capture: an FPDU with no extra keys
_ENHANCED_RESERVED = MPA_RESERVED_MASK  # with S set, 4 reserved bits (RFC 6581 §6)
_LEGACY_RESERVED = int(MPA_RESERVED_MASK | MpaFlag.ENHANCED)  # without S, S is reserved too


# ======================================================================================
# JSON records
# ======================================================================================


def record_json(rec: PduRecord) -> dict[str, Any]:
    """The JSON object of one PDU: the keys of the table above, in its order."""
    kind = rec.kind
    findings = rec.findings
    tail = (
        rec.rules if findings else [],
        rec.timestamp,
        rec.wire_len,
        rec.offset,
        [f"{f.rule}: {f.detail}" for f in findings],
    )
    if kind == "fpdu":
        seg = rec.segment
        ptrs = rec.marker_ptrs
        if seg is not None:
            op = seg.opcode
            values: tuple[Any, ...] = (
                rec.stream, rec.frame, rec.direction, rec.src, rec.dst, kind,  # COMMON_KEYS
                rec.ulpdu_len, rec.crc_ok, len(ptrs), list(ptrs),  # FPDU_KEYS
                seg.tagged, seg.last, seg.ddp_version, seg.rdmap_version, op, opcode_name(op),
                seg.stag, seg.to, seg.qn, seg.msn, seg.mo, seg.ulpdu_len - seg.ddp_header_len,
            )  # fmt: skip
            extra = _OPCODE_FIELDS.get(op)
            if extra is None:
                return dict(zip(_FPDU_RECORD, values + tail, strict=True))
            keys, get = extra
            got = get(seg)
            out = dict(zip(_FPDU_HEAD, values, strict=True))
            out.update(dict.fromkeys(keys) if got is None else zip(keys, got, strict=True))
        else:
            values = (rec.stream, rec.frame, rec.direction, rec.src, rec.dst, kind,
                      rec.ulpdu_len, rec.crc_ok, len(ptrs), list(ptrs))  # fmt: skip
            out = dict(zip(_FPDU_BASE, values, strict=True))
            out.update(_NULL_SEGMENT)  # undecodable: only what its first two bytes say
            if len(rec.ulpdu) >= 2:
                ctrl, uctrl = rec.ulpdu[0], rec.ulpdu[1]
                out["tagged"] = bool(ctrl & DDP_TAGGED)
                out["opcode"] = uctrl & RDMAP_OPCODE_MASK
                out["opcode_name"] = opcode_name(uctrl & RDMAP_OPCODE_MASK)
    else:
        mpa = rec.mpa
        assert mpa is not None
        values = (rec.stream, rec.frame, rec.direction, rec.src, rec.dst, kind, rec.rev,
                  mpa.markers, mpa.crc, mpa.reject, mpa.enhanced, rec.pd_len,
                  rec.private_data.hex())  # fmt: skip
        out = dict(zip(_MPA_HEAD, values, strict=True))
        io = mpa.ird_ord
        if io is not None:
            rtr = io.rtr
            word = (io.ird, io.ord, io.p2p, bool(rtr & RtrType.SEND), bool(rtr & RtrType.WRITE),
                    bool(rtr & RtrType.READ))  # fmt: skip
            out.update(zip(ENHANCED_KEYS, word, strict=True))
        reserved = rec.mpa_flags & (_ENHANCED_RESERVED if mpa.enhanced else _LEGACY_RESERVED)
        out.update(zip(MPA_EXTRA_KEYS, (bytes(mpa.private_data).hex(), reserved), strict=True))
    out.update(zip(TAIL_KEYS, tail, strict=True))
    return out


def hex_text(value: int, digits: int) -> str:
    """``value`` as ``0x`` and ``digits`` lower-case hex digits (``0x0ca63ebe``)."""
    return f"0x{value:0{digits}x}"


def json_object(record: dict[str, Any], digits: dict[str, int] | None = None) -> dict[str, Any]:
    """A copy of ``record`` as written out: every integer field of ``digits`` (default
    :data:`HEX_DIGITS`; an upper-layer decoder adds its own) as a fixed-width hex string."""
    out = dict(record)
    for key, width in (HEX_DIGITS if digits is None else digits).items():
        value = out.get(key)
        if type(value) is int:
            out[key] = hex_text(value, width)
    return out


def json_line(rec: PduRecord) -> str:
    """One JSON line for ``rec`` (compact, keys in the documented order, STags and TOs in
    hex: :func:`json_object`)."""
    return json.dumps(json_object(record_json(rec)), separators=(",", ":"))
