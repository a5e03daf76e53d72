"""Capture dissection: decode pcap/pcapng captures of iWARP traffic and present the PDUs.

Floors 0-1 only (:mod:`stack.constants`, :mod:`stack.wire`).  Reading captures:
:mod:`stack.pcap` and :mod:`stack.dissect.tcp`; decoding and checking every
MPA/DDP/RDMAP PDU (RFC 5044, RFC 6581, RFC 5041, RFC 5040, RFC 7306):
:mod:`stack.dissect.decoder`.  Presenting the records, re-exported here:
:mod:`~stack.dissect.fields` (the field table and JSON records), :mod:`~stack.dissect.text`
(summary lines and ``-V`` trees), :mod:`~stack.dissect.stats` (``-z`` statistics),
:mod:`~stack.dissect.filters` (the ``-Y`` display-filter language),
:mod:`~stack.dissect.columns` (``-T fields`` rows) and :mod:`~stack.dissect.partial`
(what snapshot-length-cut frames still show).

The Scapy layers live in :mod:`stack.dissect.scapy` (``from stack.dissect.scapy import *``),
not imported here: Scapy is slow to import and the decoder does not need it.
"""

from stack.dissect.columns import FieldsError, FieldsFormat
from stack.dissect.fields import (
    ALIASES,
    DERIVED_INFO,
    FIELD_INFO,
    FIELDS,
    HEX_DIGITS,
    KIND_NAMES,
    STAG_KEYS,
    TO_KEYS,
    AnyOf,
    FieldContext,
    field_getter,
    field_list,
    hex_text,
    json_line,
    json_object,
    opcode_name,
    record_json,
)
from stack.dissect.filters import FilterError, Predicate, compile_filter
from stack.dissect.partial import SnapTracker, partial_fields
from stack.dissect.stats import (
    IoStatistics,
    StatError,
    Statistics,
    TcpConversations,
    parse_stat,
)
from stack.dissect.text import (
    BriefLines,
    brief_line,
    head_text,
    note_line,
    rtr_text,
    summary_line,
    verbose_lines,
)

__all__ = [
    "ALIASES",
    "DERIVED_INFO",
    "FIELDS",
    "FIELD_INFO",
    "HEX_DIGITS",
    "KIND_NAMES",
    "AnyOf",
    "BriefLines",
    "brief_line",
    "FieldContext",
    "FieldsError",
    "FieldsFormat",
    "FilterError",
    "IoStatistics",
    "Predicate",
    "STAG_KEYS",
    "SnapTracker",
    "StatError",
    "Statistics",
    "TO_KEYS",
    "TcpConversations",
    "compile_filter",
    "field_getter",
    "head_text",
    "field_list",
    "hex_text",
    "json_line",
    "json_object",
    "note_line",
    "opcode_name",
    "parse_stat",
    "partial_fields",
    "record_json",
    "rtr_text",
    "summary_line",
    "verbose_lines",
]
