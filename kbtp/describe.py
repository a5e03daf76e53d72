"""Describe the KBTP message in a Send payload: summary line, JSON fields, ``-V`` tree.

For the capture decoder and ``iwarp dissect``; pure and fast (no Scapy, no I/O).  The
fields, their octets and labels are those of the format table :mod:`kbtp.formats`.
:func:`describe_payload` returns None for bytes that do not look like KBTP
(:func:`looks_like_kbtp`: at least the 24-octet common header, Version 1, a known opcode,
docs/kbtp.md §5.1) and otherwise a :class:`KbtpSummary`.  Fields are read leniently, as
far as the bytes go, so a malformed message is still shown; the verdict comes from
:func:`kbtp.messages.decode_message`, whose error becomes a finding.  Nothing here raises.

Call it for the payload of a Send-type message's first segment (DDP MO 0).  When that
segment is not the last (DDP L clear), pass ``complete=False``: a message continuing in
later segments is then not reported as too short.

The summary line is built at once; the JSON fields and the tree only when asked for
(:meth:`KbtpSummary.json_fields`, :meth:`KbtpSummary.tree_lines`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kbtp.constants import (
    COMMON_HEADER_LEN,
    KBTP_VERSION,
    NO_BLOCK_OFFSET,
    REQUEST_OPCODES,
    Capability,
    MessageOpcode,
    RequestFlag,
    Status,
)
from kbtp.formats import COMPLETION_DESCRIPTOR, FORMATS, HEADER, Display, Part, Tail
from kbtp.messages import KbtpError, Message, decode_message
from stack.buffers import Buffer
from stack.wire.checker import Finding

__all__ = ["JSON_HEX_DIGITS", "KbtpSummary", "describe_payload", "looks_like_kbtp"]


_OPCODES = {int(o): o for o in MessageOpcode}
_STATUS_NAMES = {int(s): s.name for s in Status}
_FLAG_NAMES = tuple((int(f), str(f.name)) for f in RequestFlag if f.value)
_CAP_NAMES = tuple((int(c), str(c.name)) for c in Capability if c.value)
_RECORD = int(RequestFlag.RECORD)
_INLINE = int(RequestFlag.INLINE)
_DIRECT_ALLOC = int(Capability.DIRECT_ALLOC)
_HELLO, _HELLO_ACK, _COMPLETION = (
    MessageOpcode.HELLO,
    MessageOpcode.HELLO_ACK,
    MessageOpcode.COMPLETION,
)
_LOAD, _BIND = MessageOpcode.LOAD, MessageOpcode.BIND
_STORES = frozenset({MessageOpcode.STORE, MessageOpcode.ALLOC_STORE})
_MAX_PAD = 1 << 20
"""Largest missing tail (complete=False) still validated by zero-padding the message."""
_HEXDUMP_LIMIT = 64
_HEX_DISPLAYS = frozenset({Display.HEX, Display.STAG, Display.TAGGED_OFFSET})

_HEADER = HEADER.full
_BODIES: dict[MessageOpcode, Part] = {op: f.body for op, f in FORMATS.items()}
"""Body of each opcode (docs/kbtp.md §5.2-5.8); keys of the values are the parts' keys."""
_BYTES_FIELDS = {
    part: any(f.code.endswith("s") for f in part.fields)
    for part in (*_BODIES.values(), COMPLETION_DESCRIPTOR)
}
"""Per part: whether a field of odd size (3 octets) is unpacked as bytes, to convert."""
JSON_HEX_DIGITS: dict[str, int] = {
    "kbtp_" + key: 2 * f.size
    for part in (HEADER, *_BODIES.values(), COMPLETION_DESCRIPTOR)
    for key, f in zip(part.keys, part.fields, strict=True)
    if f.stag_or_to
}
"""The JSON keys of the STags and Tagged Offsets (:attr:`kbtp.formats.Field.stag_or_to`) and
their hex digits: ``iwarp dissect --json`` writes them as fixed-width hex strings."""


def looks_like_kbtp(payload: Buffer) -> bool:
    """Whether ``payload`` starts like a KBTP message: >= 24 octets, Version 1, known opcode."""
    return (
        len(payload) >= COMMON_HEADER_LEN and payload[0] == KBTP_VERSION and payload[1] in _OPCODES
    )


# ======================================================================================
# Formatting helpers
# ======================================================================================


def _bit_names(value: int, names: tuple[tuple[int, str], ...]) -> list[str]:
    out = [name for bit, name in names if value & bit]
    rest = value
    for bit, _ in names:
        rest &= ~bit
    if rest:
        out.append(f"0x{rest:x}")
    return out


def _joined(value: int | None, names: tuple[tuple[int, str], ...]) -> str:
    if value is None:
        return "?"
    return "|".join(_bit_names(value, names)) or "none"


def _status_name(value: int) -> str:
    return _STATUS_NAMES.get(value, f"unknown ({value})")


def _opcode_name(value: int | None) -> str | None:
    if value is None:
        return None
    op = _OPCODES.get(value)
    return op.name if op is not None else f"0x{value:02x}"


def _hex(value: int | None) -> str:
    return "?" if value is None else f"0x{value:x}"


def _dec(value: int | None) -> str:
    return "?" if value is None else str(value)


def _block(value: int | None) -> str:
    return "none" if value == NO_BLOCK_OFFSET else _hex(value)


def _hexdump(data: bytes) -> str:
    text = data[:_HEXDUMP_LIMIT].hex(" ")
    return text + (" ..." if len(data) > _HEXDUMP_LIMIT else "")


def _quoted(identity: bytes) -> str:
    if identity.isascii() and identity.decode("ascii").isprintable():
        return '"' + identity.decode("ascii") + '"'
    return "0x" + identity.hex()


def _show(display: Display, value: int | None, size: int) -> str:
    """A field's value as the ``-V`` tree shows it."""
    if display is Display.DEC:
        return _dec(value)
    if display in _HEX_DISPLAYS:
        return _hex(value)
    if display is Display.BLOCK:
        return _block(value)
    if display is Display.CAPABILITIES:
        return f"{_hex(value)} ({_joined(value, _CAP_NAMES)})"
    if display is Display.REQUEST_OPCODE:
        return f"{_hex(value)} ({_opcode_name(value) or '?'})"
    if value is None:
        return "?"
    if display is Display.OPCODE:
        return f"0x{value:02x} ({_opcode_name(value)})"
    if display is Display.FLAGS:
        return f"0x{value:0{2 * size}x} ({_joined(value, _FLAG_NAMES)})"
    if display is Display.STATUS:
        return f"{value} ({_status_name(value)})"
    return f"{value} (0x{value:x})"  # DEC_HEX


def _take(data: Buffer, at: int, part: Part, out: dict[str, Any]) -> int:
    """Read ``part`` from ``data[at:]`` into ``out``; fields past the end are None."""
    st = part.full
    if at + st.size <= len(data):
        values = st.unpack_from(data, at)
        if _BYTES_FIELDS[part]:
            values = tuple(int.from_bytes(x, "big") if type(x) is bytes else x for x in values)
        out.update(zip(part.keys, values, strict=True))
        return at + st.size
    end = len(data)
    for key, f in zip(part.keys, part.fields, strict=True):
        out[key] = int.from_bytes(data[at : at + f.size], "big") if at + f.size <= end else None
        at += f.size
    return at


# ======================================================================================
# The summary
# ======================================================================================


@dataclass(frozen=True, slots=True)
class KbtpSummary:
    """What :func:`describe_payload` found in a Send payload.

    Fields: opcode; line (one-line summary, e.g. ``KBTP LOAD id=7 handle=42 gen=3
    flags=ALLOW_UNSEALED dst=0x1234/0x10000+4096``); values (every field read, by its JSON
    key without ``kbtp_``, None where the bytes ended); data (identity of HELLO, inline
    data of a store, else empty); length (octets given) and expected_length (what the
    header and body announce); complete (as passed); findings (at most one: the
    :class:`~kbtp.messages.KbtpError` of ``decode_message`` as a
    :class:`~stack.wire.checker.Finding`); error (its Status, what a target would answer;
    None when well-formed); message (the decoded message; None when malformed or
    incomplete).
    """

    opcode: MessageOpcode
    line: str
    values: dict[str, int | None] = field(hash=False, repr=False)
    data: bytes
    length: int
    expected_length: int
    complete: bool = True
    findings: tuple[Finding, ...] = ()
    error: Status | None = None
    message: Message | None = None

    @property
    def ok(self) -> bool:
        """True when the message decoded without a finding."""
        return self.error is None

    def json_fields(self) -> dict[str, Any]:
        """JSON fields, all keyed ``kbtp_...``.

        Always: version, opcode, opcode_name, flags, flag_names, request_id, handle,
        generation, status, status_name, length, error (status name or None),
        error_detail.  Per opcode: the body fields (``desc_*`` for the Data Descriptor,
        ``record_stag``/``record_to`` for the Completion Descriptor, None without RECORD),
        ``capability_names``, ``request_opcode_name``, ``identity`` (text) and
        ``identity_hex`` (HELLO), ``inline_length`` (stores); ``trailing_length`` when
        octets follow the message.  Reserved fields are left out.
        """
        v = self.values
        op = self.opcode
        error = self.findings[0].detail if self.findings else None
        out: dict[str, Any] = {
            "kbtp_version": v["version"],
            "kbtp_opcode": int(op),
            "kbtp_opcode_name": op.name,
            "kbtp_flags": v["flags"],
            "kbtp_flag_names": _bit_names(v["flags"] or 0, _FLAG_NAMES),
            "kbtp_request_id": v["request_id"],
            "kbtp_handle": v["handle"],
            "kbtp_generation": v["generation"],
            "kbtp_status": v["status"],
            "kbtp_status_name": _status_name(v["status"] or 0),
            "kbtp_length": self.length,
            "kbtp_error": self.error.name if self.error is not None else None,
            "kbtp_error_detail": error,
        }
        body = _BODIES[op]
        for key, f in zip(body.keys, body.fields, strict=True):
            if not f.reserved:
                out["kbtp_" + key] = v[key]
        if op in (_HELLO, _HELLO_ACK):
            caps = v["capabilities"]
            out["kbtp_capability_names"] = None if caps is None else _bit_names(caps, _CAP_NAMES)
        if op == _HELLO:
            known = v["identity_length"] is not None
            out["kbtp_identity"] = self.data.decode("utf-8", "backslashreplace") if known else None
            out["kbtp_identity_hex"] = self.data.hex() if known else None
        elif op == _COMPLETION:
            out["kbtp_request_opcode_name"] = _opcode_name(v["request_opcode"])
        elif op in REQUEST_OPCODES:
            if op in _STORES:
                out["kbtp_inline_length"] = len(self.data)
            record = "record_stag" in v
            out["kbtp_record_stag"] = v["record_stag"] if record else None
            out["kbtp_record_to"] = v["record_to"] if record else None
        trailing = self.length - self.expected_length
        if trailing > 0:
            out["kbtp_trailing_length"] = trailing
        return out

    def tree_lines(self) -> list[str]:
        """``-V`` lines: ``  KBTP <NAME>`` then four-space-indented fields, as
        ``stack.dissect.text.verbose_lines`` indents its layers."""
        v = self.values
        op = self.opcode
        flags = v["flags"] or 0
        lines = [f"  KBTP {op.name}"]
        parts = (HEADER, _BODIES[op]) + ((COMPLETION_DESCRIPTOR,) if "record_stag" in v else ())
        for part in parts:
            for key, fld in zip(part.keys, part.fields, strict=True):
                value = v[key]
                if fld.reserved:
                    if value:
                        lines.append(f"    Reserved ({key}): 0x{value:x}, not zero (ignored)")
                    continue
                lines.append(f"    {fld.label}: {_show(fld.display, value, fld.size)}")
        if op == _HELLO and v["identity_length"] is not None:
            lines.append(f"    Identity: {_quoted(self.data)}")
        elif op in _STORES and flags & _INLINE:
            dump = _hexdump(self.data) or "(none)"
            lines.append(f"    Inline data ({len(self.data)} octets): {dump}")
        if self.length > self.expected_length:
            lines.append(f"    Trailing octets: {self.length - self.expected_length}")
        elif self.length < self.expected_length:
            got = f"{self.length} of {self.expected_length} octets"
            if self.complete:
                lines.append(f"    Truncated: {got}")
            else:
                lines.append(f"    Continues in later segments: {got} here")
                if not self.findings and self.expected_length - self.length > _MAX_PAD:
                    lines.append("    Not validated (too long to check from one segment)")
        for f in self.findings:
            lines.append(f"    Finding {f.rule}: {f.detail}")
        return lines


# ======================================================================================
# describe_payload
# ======================================================================================


def describe_payload(payload: Buffer, *, complete: bool = True) -> KbtpSummary | None:
    """Summarize the KBTP message in ``payload`` (one Send's data), or None if not KBTP.

    ``complete=False``: ``payload`` is the first segment of a longer Send message (DDP L
    clear), so missing octets at its end are expected and not reported.
    """
    if not looks_like_kbtp(payload):
        return None
    v: dict[str, Any] = dict(zip(HEADER.keys, _HEADER.unpack_from(payload), strict=True))
    opcode = _OPCODES[v["opcode"]]
    flags, request_id, handle = v["flags"], v["request_id"], v["handle"]
    generation, status = v["generation"], v["status"]
    form = FORMATS[opcode]
    at = _take(payload, COMMON_HEADER_LEN, form.body, v)
    if form.request and flags & _RECORD:
        at = _take(payload, at, COMPLETION_DESCRIPTOR, v)
    variable = 0
    if form.tail is Tail.IDENTITY:
        variable = v["identity_length"] or 0
    elif form.tail is Tail.INLINE and flags & _INLINE:
        variable = v["desc_length"] or 0
    expected = at + variable
    length = len(payload)

    # The verdict (docs/kbtp.md §5.1 order) is the strict decoder's.
    error: KbtpError | None = None
    message: Message | None = None
    candidate: Buffer | None = payload
    if not complete and length < expected:
        gap = expected - length
        candidate = bytes(payload) + bytes(gap) if gap <= _MAX_PAD else None
    if candidate is not None:
        try:
            decoded = decode_message(candidate)
        except KbtpError as exc:
            error = exc
        else:
            message = decoded if candidate is payload else None

    data = bytes(payload[at:expected])
    parts = [f"KBTP {opcode.name} id={request_id}"]
    if handle or opcode not in (_HELLO, _HELLO_ACK):
        parts.append(f"handle={handle} gen={generation}")
    if flags:
        parts.append("flags=" + "|".join(_bit_names(flags, _FLAG_NAMES)))
    if status or opcode in (_HELLO_ACK, _COMPLETION):
        parts.append(f"status={_STATUS_NAMES.get(status, status)}")
    body = _body_line(opcode, v, data)
    if body:
        parts.append(body)
    if not complete and length < expected:
        parts.append(f"(first {length} of {expected} octets)")
    findings: tuple[Finding, ...] = ()
    if error is not None:
        parts.append(f"[{error.detail}]")
        findings = (Finding(error.rule, error.detail),)
    return KbtpSummary(
        opcode=opcode,
        line=" ".join(parts),
        values=v,
        data=data,
        length=length,
        expected_length=expected,
        complete=complete,
        findings=findings,
        error=error.status if error is not None else None,
        message=message,
    )


def _body_line(opcode: MessageOpcode, v: dict[str, Any], data: bytes) -> str:
    """The opcode's part of the summary line."""
    if opcode == _HELLO:
        ident = _quoted(data) if v["identity_length"] is not None else "?"
        return f"caps={_joined(v['capabilities'], _CAP_NAMES)} identity={ident}"
    if opcode == _HELLO_ACK:
        caps = v["capabilities"]
        text = (
            f"caps={_joined(caps, _CAP_NAMES)} block_size={_dec(v['block_size'])} "
            f"pool={_dec(v['pool_blocks'])} quota={_dec(v['quota'])} "
            f"handles={_hex(v['handle_base'])}+{_dec(v['handle_count'])} "
            f"credits={_dec(v['request_credits'])} max_inline={_dec(v['max_inline'])}"
        )
        if caps and caps & _DIRECT_ALLOC:
            text += f" ring_order={_dec(v['ring_order'])}"
        return text
    if opcode == _COMPLETION:
        return (
            f"req={_opcode_name(v['request_opcode']) or '?'} len={_dec(v['data_length'])} "
            f"block={_block(v['block_offset'])}"
        )
    if opcode == _BIND:
        text = (
            f"ticket={_dec(v['ticket'])} len={_dec(v['data_length'])} "
            f"block={_hex(v['block_offset'])}"
        )
    elif opcode == _LOAD:
        text = f"dst={_hex(v['desc_stag'])}/{_hex(v['desc_to'])}+{_dec(v['desc_length'])}"
    elif opcode in _STORES:
        if v["flags"] & _INLINE:
            text = f"inline={_dec(v['desc_length'])}"
        else:
            text = f"src={_hex(v['desc_stag'])}/{_hex(v['desc_to'])}+{_dec(v['desc_length'])}"
    else:
        text = ""
    if "record_stag" in v:
        text += f" record={_hex(v['record_stag'])}/{_hex(v['record_to'])}"
    return text.strip()
