"""The rule catalog: every rule ID the stack, the dissector and KBTP report, as data.

Findings, :class:`~stack.errors.ProtocolError` messages and Terminates name rules by ID
(``MPA-12``, ``DDP-05``, ``SEC-03``, ...).  This module says what each ID means: the layer,
the document and section(s) it comes from, the requirement level, a one-line paraphrase,
and the Terminate causes (:class:`~stack.constants.TermCode`) a violation is reported with.

Families: ``MPA`` (RFC 5044), ``ERC`` (enhanced connection setup, MPA revision 2, RFC 6581),
``DDP`` (RFC 5041), ``RDMAP`` (RFC 5040), ``EXT`` (RFC 7306 atomics and immediate data),
``SEC`` (RFC 5042 and the security sections of RFC 5040 and RFC 5041), ``KBTP``
(docs/kbtp.md) and the pseudo rule ``TCP-GAP`` (a fact about a capture, not a requirement).
``iwarp rules`` prints the catalog; docs/rules.md is its ``--markdown`` output.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from stack.constants import (
    TERM_DDP_CATASTROPHIC,
    TERM_DDP_T_BASE_BOUNDS,
    TERM_DDP_T_INVALID_STAG,
    TERM_DDP_T_INVALID_VERSION,
    TERM_DDP_T_STAG_NOT_ASSOCIATED,
    TERM_DDP_T_TO_WRAP,
    TERM_DDP_U_INVALID_MO,
    TERM_DDP_U_INVALID_QN,
    TERM_DDP_U_INVALID_VERSION,
    TERM_DDP_U_MSN_RANGE,
    TERM_DDP_U_NO_BUFFER,
    TERM_DDP_U_TOO_LONG,
    TERM_LLP_CONNECTION_LOST,
    TERM_LLP_CRC_ERROR,
    TERM_LLP_INSUFFICIENT_IRD,
    TERM_LLP_INVALID_STARTUP,
    TERM_LLP_LOCAL_CATASTROPHIC,
    TERM_LLP_MARKER_MISMATCH,
    TERM_LLP_NO_MATCHING_RTR,
    TERM_RDMAP_ACCESS_RIGHTS,
    TERM_RDMAP_BASE_BOUNDS,
    TERM_RDMAP_CATASTROPHIC,
    TERM_RDMAP_CATASTROPHIC_STREAM,
    TERM_RDMAP_INVALID_STAG,
    TERM_RDMAP_INVALID_VERSION,
    TERM_RDMAP_OP_CANNOT_INVALIDATE,
    TERM_RDMAP_OP_UNSPECIFIED,
    TERM_RDMAP_PROT_CANNOT_INVALIDATE,
    TERM_RDMAP_STAG_NOT_ASSOCIATED,
    TERM_RDMAP_TO_WRAP,
    TERM_RDMAP_UNEXPECTED_OPCODE,
    TermCode,
    term_name,
)

__all__ = [
    "section_key",
    "FAMILIES",
    "LEVELS",
    "Family",
    "Ref",
    "Rule",
    "UnknownRule",
    "all_rules",
    "by_prefix",
    "by_section",
    "groups",
    "normalize",
    "rule",
    "select",
]

LEVELS = ("MUST", "SHOULD", "MAY")
"""Requirement keywords; a rule's level is one of them or two joined by ``/`` (MPA-23's
"SHOULD/MUST": the first part SHOULD, the second MUST).  Pseudo rules have level ``NOTE``."""


@dataclass(frozen=True, slots=True)
class Family:
    """A rule family: ID prefix, the document its rules come from, and a title."""

    prefix: str
    doc: str
    title: str


FAMILIES: tuple[Family, ...] = (
    Family("MPA", "RFC 5044", "MPA: Marker PDU Aligned framing"),
    Family("ERC", "RFC 6581", "MPA revision 2: enhanced connection establishment"),
    Family("DDP", "RFC 5041", "DDP: Direct Data Placement"),
    Family("RDMAP", "RFC 5040", "RDMAP: the Remote Direct Memory Access Protocol"),
    Family("EXT", "RFC 7306", "RDMAP extensions: atomic operations and immediate data"),
    Family("SEC", "RFC 5042", "Security of DDP and RDMAP"),
    Family("KBTP", "docs/kbtp.md", "KBTP over iWARP"),
    Family("TCP", "RFC 9293", "Capture facts: pseudo rules, not requirements"),
)
"""Every family, in catalog order."""

_FAMILY = {f.prefix: f for f in FAMILIES}


@dataclass(frozen=True, slots=True)
class Ref:
    """A section of a document: ``Ref("RFC 5044", "7.1.2(5)")``."""

    doc: str
    section: str

    @property
    def rfc(self) -> int | None:
        """The RFC number, or None for a document that is not an RFC."""
        return int(self.doc[4:]) if self.doc.startswith("RFC ") else None

    def __str__(self) -> str:
        return f"{self.doc} §{self.section}"


@dataclass(frozen=True, slots=True)
class Rule:
    """One rule of the catalog.

    Fields: ``id``; ``layer`` (the family prefix: MPA, ERC, DDP, RDMAP, EXT, SEC, KBTP,
    TCP); ``level`` (:data:`LEVELS`, ``SHOULD/MUST``-style mixtures, or ``NOTE``);
    ``text`` (one line); ``refs`` (the document sections cited, in citation order);
    ``terminates`` (the Terminate causes a violation is reported with; empty when none is
    sent); ``ulp`` (a requirement on the ULP rather than the stack); ``pseudo`` (a fact,
    not a requirement).
    """

    id: str
    layer: str
    level: str
    text: str
    refs: tuple[Ref, ...]
    terminates: tuple[TermCode, ...] = ()
    ulp: bool = False
    pseudo: bool = False

    @property
    def doc(self) -> str:
        """The document of the first reference (the family's, or for some SEC rules
        RFC 5040 or RFC 5041)."""
        return self.refs[0].doc

    @property
    def rfc(self) -> int | None:
        """The RFC number of the first reference, or None (KBTP rules)."""
        return self.refs[0].rfc

    @property
    def sections(self) -> tuple[str, ...]:
        """The sections cited in the first reference's document."""
        return tuple(r.section for r in self.refs if r.doc == self.doc)

    def where(self, doc: str | None = None) -> str:
        """``§4.4`` or ``§6.1.1; RFC 5040 §8.1.1(1)``: sections of ``doc`` (default: the
        first reference's document) bare, those of other documents with the document."""
        bare = self.doc if doc is None else doc
        parts: list[str] = []
        docs = dict.fromkeys(r.doc for r in self.refs)
        for name in sorted(docs, key=lambda d: d != bare):  # ``doc``'s sections first
            sections = ", ".join(f"§{r.section}" for r in self.refs if r.doc == name)
            parts.append(sections if name == bare else f"{name} {sections}")
        return "; ".join(parts)

    def summary(self) -> str:
        """``MPA-12 (MUST, RFC 5044 §4.4): <text>``."""
        return f"{self.id} ({self.level}, {self.doc} {self.where()}): {self.text}"

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (``iwarp rules --json``)."""
        return {
            "id": self.id,
            "layer": self.layer,
            "level": self.level,
            "doc": self.doc,
            "rfc": self.rfc,
            "sections": list(self.sections),
            "refs": [{"doc": r.doc, "rfc": r.rfc, "section": r.section} for r in self.refs],
            "text": self.text,
            "terminates": [
                {"layer": t.layer, "etype": t.etype, "code": t.code, "name": term_name(t)}
                for t in self.terminates
            ],
            "ulp": self.ulp,
            "pseudo": self.pseudo,
        }


class UnknownRule(KeyError):
    """A rule ID or prefix that is not in the catalog (its message is one clear line)."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "unknown rule"


_SPLIT_SECTIONS = re.compile(r",\s*(?![^()]*\))")  # commas outside parentheses
_RFC_PREFIX = re.compile(r"(\d{4}) (.*)")


def _refs(family: Family, spec: str) -> tuple[Ref, ...]:
    """``"3, 4.1"`` (sections of the family's document) or ``"5042 6.1.1; 5040 8.1.1(1)"``."""
    refs: list[Ref] = []
    for part in spec.split(";"):
        doc, sections = family.doc, part.strip()
        m = _RFC_PREFIX.fullmatch(sections)
        if m is not None:
            doc, sections = f"RFC {m[1]}", m[2]
        refs.extend(Ref(doc, s) for s in _SPLIT_SECTIONS.split(sections))
    return tuple(refs)


def _rule(rid: str, level: str, where: str, terms: tuple[TermCode, ...], text: str) -> Rule:
    """One catalog row: ID, level, sections (see :func:`_refs`), Terminates, text.

    A ``(ULP)`` suffix of the level marks a requirement on the ULP.
    """
    family = _FAMILY[rid.split("-")[0]]
    ulp = level.endswith(" (ULP)")
    level = level.removesuffix(" (ULP)")
    refs = _refs(family, where)
    return Rule(rid, family.prefix, level, text, refs, terms, ulp=ulp, pseudo=level == "NOTE")


_R = _rule
_CRC, _MARKER, _STARTUP = TERM_LLP_CRC_ERROR, TERM_LLP_MARKER_MISMATCH, TERM_LLP_INVALID_STARTUP
_UNSPEC, _OPCODE = TERM_RDMAP_OP_UNSPECIFIED, TERM_RDMAP_UNEXPECTED_OPCODE
_STREAM = TERM_RDMAP_CATASTROPHIC_STREAM
_ONE_SEGMENT = (_UNSPEC, TERM_DDP_U_INVALID_MO, TERM_DDP_U_TOO_LONG)  # fixed-size headers
_DDP_TAGGED = (
    TERM_DDP_T_INVALID_STAG,
    TERM_DDP_T_BASE_BOUNDS,
    TERM_DDP_T_STAG_NOT_ASSOCIATED,
    TERM_DDP_T_TO_WRAP,
)
_DDP_UNTAGGED = (
    TERM_DDP_U_INVALID_QN,
    TERM_DDP_U_NO_BUFFER,
    TERM_DDP_U_MSN_RANGE,
    TERM_DDP_U_INVALID_MO,
    TERM_DDP_U_TOO_LONG,
)
_DDP_VERSION = (TERM_DDP_T_INVALID_VERSION, TERM_DDP_U_INVALID_VERSION)
_DDP_ALL = (TERM_DDP_CATASTROPHIC, *_DDP_TAGGED, *_DDP_UNTAGGED, *_DDP_VERSION)
_REMOTE = (  # RDMAP remote protection: Read sources and atomic targets
    TERM_RDMAP_INVALID_STAG,
    TERM_RDMAP_BASE_BOUNDS,
    TERM_RDMAP_ACCESS_RIGHTS,
    TERM_RDMAP_STAG_NOT_ASSOCIATED,
    TERM_RDMAP_TO_WRAP,
)
_MPA_ERRORS = (TERM_LLP_CONNECTION_LOST, _CRC, _MARKER, _STARTUP)
_NOT_ASSOCIATED = (TERM_DDP_T_STAG_NOT_ASSOCIATED, TERM_RDMAP_STAG_NOT_ASSOCIATED)
_INVALID_STAG = (TERM_DDP_T_INVALID_STAG, TERM_RDMAP_INVALID_STAG)
_INVALIDATE = (TERM_RDMAP_PROT_CANNOT_INVALIDATE, TERM_RDMAP_OP_CANNOT_INVALIDATE)
_BOUNDS = (TERM_DDP_T_BASE_BOUNDS, TERM_RDMAP_BASE_BOUNDS)
_RIGHTS = (TERM_RDMAP_ACCESS_RIGHTS, TERM_DDP_T_INVALID_STAG)  # DDP has no rights code
_READ_RESPONSE = (TERM_DDP_T_INVALID_STAG, TERM_DDP_T_BASE_BOUNDS)  # not matching the Read

# One rule per two lines: ID, level, sections, Terminates; then the text (own words).
# fmt: off
_RULES: tuple[Rule, ...] = (
    # -- RFC 5044 ----------------------------------------------------------------------
    _R("MPA-01", "MUST", "3, 4.1", (),
       "An FPDU holds exactly one ULPDU: length, ULPDU, pad, CRC"),
    _R("MPA-02", "MUST", "3", (),
       "MPA reports a MULPDU of 128 to 64768 octets; no ULPDU handed down exceeds 64768"),
    _R("MPA-03", "MUST", "3", (),
       "Each valid ULPDU goes up with its length; DDP learns the negotiated revision"),
    _R("MPA-04", "MUST", "4.1", (),
       "Pad octets are sent as zero and ignored on receipt, though the CRC covers them"),
    _R("MPA-05", "MUST", "4.1, 7.1.1", (),
       "The CRC field is always present, and is not verified when CRC is off"),
    _R("MPA-06", "MUST", "4.2", (),
       "Marker: reserved half zero; FPDUPTR's low two bits sent as 0 and read as 0"),
    _R("MPA-07", "MUST", "4.3, 7.1.2(7)", (),
       "Markers every 512 octets from SeqStart, the first one just before the first FPDU"),
    _R("MPA-08", "MUST", "4.3", (_MARKER,),
       "FPDUPTR points back to the FPDU's start (0: between FPDUs), modulo sequence wrap"),
    _R("MPA-09", "MUST", "4.3", (),
       "Markers go into every direction whose receiver asked for them"),
    _R("MPA-10", "MUST", "4.3", (),
       "DDP gets only the ULPDU and its length: markers, header, pad and CRC are removed"),
    _R("MPA-11", "MUST", "4.4", (),
       "CRC is implemented and asked for by default; once either peer asks, both use it"),
    _R("MPA-12", "MUST", "4.4", (_CRC,),
       "CRC32c over the FPDU and its markers, sent low byte first; a mismatch voids the FPDU"),
    _R("MPA-13", "MUST", "4.5", (),
       "MULPDU follows from the EMSS, less room for markers when on, and is at least 128"),
    _R("MPA-14", "SHOULD", "5.1, A.1", (),
       "Senders start TCP segments on FPDU boundaries and fill them with whole FPDUs"),
    _R("MPA-15", "MUST", "5.2, 6, A", (),
       "Receivers never rely on alignment; they walk from FPDU to FPDU by ULPDU_Length"),
    _R("MPA-16", "MUST", "6", (_CRC,),
       "An FPDU goes up only when complete, with its start and CRC verified"),
    _R("MPA-17", "MUST", "7.1", (),
       "Both ends turn MPA on at the same octet of the TCP stream"),
    _R("MPA-18", "MUST", "7.1.1, 7.1.2(5)", (_STARTUP,),
       "Request and Reply keys are exact; a wrong key closes TCP and is reported locally"),
    _R("MPA-19", "MUST", "7.1.1", (),
       "Reserved flags are sent as 0, never checked; R is 0 in a Request, unchecked there"),
    _R("MPA-20", "MUST", "7.1.1", (_STARTUP,),
       "Rev is checked; a revision the receiver cannot work with closes the connection"),
    _R("MPA-21", "MUST", "7.1.1, 7.1.2(9)", (_STARTUP,),
       "PD_Length is at most 512 and matches the data present, else malformed: close TCP"),
    _R("MPA-22", "MUST", "7.1.2(2)", (),
       "The responder validates the Request before it enters Full Operation"),
    _R("MPA-23", "SHOULD/MUST", "7.1.2(2), 7.1.2(3)", (),
       "Reject by a Reply with R set (SHOULD), then leave MPA with TCP open (MUST)"),
    _R("MPA-24", "MUST", "7.1.2(3)", (),
       "The initiator validates the Reply and leaves MPA when R is set"),
    _R("MPA-25", "MUST", "7.1.2(4)", (),
       "The responder sends no FPDU before one valid FPDU has come from the initiator"),
    _R("MPA-26", "MUST/SHOULD", "7.1.2(8)", (_STARTUP,),
       "Two initiators are caught by the keys (MUST); two responders by a timeout (SHOULD)"),
    _R("MPA-27", "SHOULD", "7.1.2(10)", (),
       "Waiting for a startup frame is bounded by a timer"),
    _R("MPA-28", "MUST", "8", _MPA_ERRORS,
       "Errors 1-4: no delivery after one; CRC/marker errors keep TCP, bad startup closes it"),
    # -- RFC 6581 ----------------------------------------------------------------------
    _R("ERC-01", "MUST", "6", (),
       "Enhanced features need Rev 2 or later; responders still accept Rev 1 Requests"),
    _R("ERC-02", "MUST", "6, 7, 9", (_STARTUP,),
       "With S set the PD starts with the IRD/ORD word; PD_Length counts it, 512 in all"),
    _R("ERC-03", "MUST", "9", (_STARTUP,),
       "The IRD/ORD word is big-endian, with 14-bit unsigned IRD and ORD values"),
    _R("ERC-04", "MUST", "9.1", (TERM_LLP_INSUFFICIENT_IRD,),
       "Responder ORD <= initiator IRD; the initiator fits the Reply or sends Terminate 2/0/6"),
    _R("ERC-05", "MUST", "9.1", (),
       "The peer's IRD and ORD are given to the ULP, on acceptance and on rejection"),
    _R("ERC-06", "MUST", "9.1", (),
       "IRD or ORD 0x3FFF: no automatic negotiation of that value; the ULP decides"),
    _R("ERC-07", "MUST", "9.2", (),
       "A set: B/C/D flag every RTR type the sender can use; A clear: zero and ignored"),
    _R("ERC-08", "MUST", "9.2", (TERM_LLP_NO_MATCHING_RTR,),
       "The responder echoes A and flags at least one RTR type it supports"),
    _R("ERC-09", "MUST", "5, 9.2", (TERM_LLP_NO_MATCHING_RTR,),
       "The first FPDU is one RTR of a type both flagged; none in common: Terminate 2/0/7"),
    _R("ERC-10", "MUST", "9.3", (TERM_LLP_LOCAL_CATASTROPHIC,),
       "Other local failures of enhanced setup send Terminate 2/0/5 before the reset"),
    _R("ERC-11", "MUST", "10", (_STARTUP,),
       "A Reply is enhanced iff its Request was; a Rev-1-only responder closes on S=1"),
    _R("ERC-12", "MUST", "10", (),
       "The enhanced format is used only when some enhanced feature is wanted"),
    _R("ERC-13", "SHOULD", "12", (),
       "Receivers sanity-check the IRD, ORD and flag values they are offered"),
    # -- RFC 5041 ----------------------------------------------------------------------
    _R("DDP-01", "MUST", "4.1", (TERM_DDP_CATASTROPHIC,),
       "The T bit selects the tagged or the untagged buffer model"),
    _R("DDP-02", "MUST", "4.1", (TERM_DDP_U_MSN_RANGE, TERM_DDP_T_INVALID_STAG),
       "L marks a message's last segment only, which is sent last and has the highest MO"),
    _R("DDP-03", "MUST", "4.1", _DDP_VERSION,
       "Reserved bits are sent as 0 and not checked; DV is 1 and constant on a stream"),
    _R("DDP-04", "MUST", "4.2, 4.3", (_UNSPEC, _OPCODE),
       "RsvdULP, STag and QN are the ULP's and the same in every segment of a message"),
    _R("DDP-05", "MUST", "4.3", (TERM_DDP_U_MSN_RANGE, TERM_DDP_U_INVALID_MO),
       "MSN starts at 1 per queue, +1 per message, wrapping; a message's first MO is 0"),
    _R("DDP-06", "MUST", "5.2", (TERM_DDP_U_INVALID_MO, TERM_DDP_T_BASE_BOUNDS),
       "Segments fit the MULPDU, carry all data at their MO/TO; messages are < 2^32 octets"),
    _R("DDP-07", "MUST", "5.2", (),
       "A zero-length message is one segment; its STag and TO (if tagged) are not checked"),
    _R("DDP-08", "MUST", "5.3, 5.4", (),
       "Messages are sent in order and delivered at most once, in order, when fully placed"),
    _R("DDP-09", "MUST", "5.4", (),
       "Untagged delivery reports the message length; every delivery reports RsvdULP"),
    _R("DDP-10", "MUST", "7.1", (*_DDP_TAGGED, *_DDP_UNTAGGED),
       "Each segment is checked before placement; on failure stop, report, drop the rest"),
    _R("DDP-11", "MUST", "7.2", _DDP_ALL,
       "Errors are reported with the DDP error types and codes of RFC 5041"),
    _R("DDP-12", "MUST", "8.2", (TERM_DDP_T_STAG_NOT_ASSOCIATED,),
       "STags bind to a PD or to one stream; on a mismatch nothing is placed: local error"),
    _R("DDP-13", "MUST", "6.2", (),
       "Teardown: ULP close or abort; data after FIN is an error; fatal errors allow a Terminate"),
    # -- RFC 5040 ----------------------------------------------------------------------
    _R("RDMAP-01", "MUST", "3.1", (TERM_DDP_U_INVALID_QN,),
       "QN 0 Sends, QN 1 Read Requests, QN 2 Terminates; one RDMA message per DDP message"),
    _R("RDMAP-02", "MUST", "4.1", (TERM_RDMAP_INVALID_VERSION, _OPCODE),
       "Control byte: RV 01, reserved bits 0; T, QN and STag/TO as the opcode requires"),
    _R("RDMAP-03", "MUST", "4.1", (),
       "Only Send with Invalidate carries an Invalidate STag; others send 0 and ignore it"),
    _R("RDMAP-04", "MUST", "4.4, 5.2", (*_READ_RESPONSE, *_ONE_SEGMENT),
       "Read Request layout; the Read Response lands at the sink STag and TO it named"),
    _R("RDMAP-05", "MUST", "5.1, 5.2", (TERM_DDP_T_INVALID_STAG,),
       "Writes and Read Responses are tagged; Writes are placed, not delivered; one buffer"),
    _R("RDMAP-06", "MUST", "5.2.1, 5.2.2", (),
       "Read Requests: QN 1, one buffer each, served in order, each valid one answered"),
    _R("RDMAP-07", "MUST", "5.2.1", (),
       "A zero-length Read skips source validation and gets a zero-length Read Response"),
    _R("RDMAP-08", "MUST", "5.3", (TERM_DDP_U_NO_BUFFER, TERM_DDP_U_TOO_LONG, _STREAM),
       "A Send takes one QN-0 receive buffer and must fit it; Sends are delivered in order"),
    _R("RDMAP-09", "MUST", "5.3", _INVALIDATE,
       "Send with Invalidate checks the STag belongs to the stream, invalidates it, or ends"),
    _R("RDMAP-10", "MUST", "5.4", (),
       "A Terminate: QN 2, at most one per stream, always delivered, nothing sent after it"),
    _R("RDMAP-11", "MUST", "4.8", (_UNSPEC,),
       "Terminate layout and the meaning of M, D and R; reserved bits are zero"),
    _R("RDMAP-12", "SHOULD/MUST", "4.8, 7.1", (TERM_RDMAP_CATASTROPHIC,),
       "Header copies per Fig. 10 (SHOULD); Terminate in the 7.1 cases, first error (MUST)"),
    _R("RDMAP-13", "MUST", "5.5", (),
       "Ordering and completion rules 10-20: delivery, processing and completion order"),
    _R("RDMAP-14", "MUST", "6.1", (_STREAM,),
       "Reads never exceed ORD out or IRD in; only RDMA messages are sent in RDMA mode"),
    _R("RDMAP-15", "SHOULD", "6.2.1", (),
       "An error ends the stream with a Terminate, then a graceful close of the LLP"),
    _R("RDMAP-16", "MUST", "7.2", (*_REMOTE, _OPCODE),
       "Inbound validation: opcode, version, and the Read source's STag, rights and bounds"),
    # -- RFC 7306 ----------------------------------------------------------------------
    _R("EXT-01", "MUST", "4.1", (_OPCODE,),
       "Opcodes 0x8-0xB are defined, with RV 01 and a zero Invalidate STag"),
    _R("EXT-02", "MUST", "5.2.1", _ONE_SEGMENT,
       "Atomic Request: untagged, QN 1, one buffer; run by RDMAP, never shown to the ULP"),
    _R("EXT-03", "MUST", "5.2.2", (_STREAM, *_ONE_SEGMENT),
       "Atomic Response: untagged, QN 3, one buffer, delivered, in request order"),
    _R("EXT-04", "MUST", "5, 5.2.1", (_OPCODE,),
       "FetchAdd and CmpSwap are both implemented; another AOpCode is reported as an error"),
    _R("EXT-05", "MUST", "5.1, 8.2", (_STREAM,),
       "An atomic not aligned to 8 octets changes nothing and ends with Terminate 0/2/0x07"),
    _R("EXT-06", "MUST", "5.1", (),
       "FetchAdd and CmpSwap compute as specified, masks included; the old value returns"),
    _R("EXT-07", "MUST", "5.3", (),
       "An atomic is indivisible with respect to every other atomic on the same RNIC"),
    _R("EXT-08", "MUST", "5.4", (),
       "Atomic ordering rules 1-8: run after delivery, in order; done when answered"),
    _R("EXT-09", "MUST", "6.3", (_UNSPEC, TERM_DDP_U_INVALID_MO),
       "Immediate Data: QN 0, exactly 8 octets (checked), one buffer, delivered in order"),
    _R("EXT-10", "MUST", "5.2.2", (_STREAM,),
       "QN-1 buffers for Reads plus atomics at the responder; QN-3 buffers at the requester"),
    _R("EXT-11", "MUST", "8", _REMOTE,
       "Errors of the new messages per section 8; atomic targets are checked like Read sources"),
    # -- RFC 5042, RFC 5040 §8, RFC 5041 §8 --------------------------------------------
    _R("SEC-01", "MUST", "5042 6.1.1; 5040 8.1.1(1); 5041 8.3.1", _NOT_ASSOCIATED,
       "A stream in one protection domain can never use an STag of another"),
    _R("SEC-02", "MUST", "5042 6.1.1; 5040 8.1.1(2)", _NOT_ASSOCIATED,
       "An STag scoped to one stream cannot be used on any other stream"),
    _R("SEC-03", "MUST", "5042 6.1.1", (),
       "Streams that share no STags get a protection domain each, or stream-scoped STags"),
    _R("SEC-04", "MUST", "5042 6.2.1; 5040 8.1.1(3)", _BOUNDS,
       "Base and bounds are checked to the octet before data is placed or read"),
    _R("SEC-05", "MUST", "5040 8.1.1(4), 8.1.1(5); 5041 8.3", (),
       "An STag can be bound to a buffer, a TO range and access rights, and unbound"),
    _R("SEC-06", "MUST", "5042 6.2.2; 5040 8.1.1(6)", _INVALID_STAG,
       "Once an STag is revoked, no inbound packet can change its buffer"),
    _R("SEC-07", "MUST", "5040 8.1.1(7); 5042 6.4.5", (TERM_RDMAP_PROT_CANNOT_INVALIDATE,),
       "STags shared by streams are not remotely invalidatable, and need trusting streams"),
    _R("SEC-08", "MUST/SHOULD", "5040 8.1.1(8); 5042 6.1.1", (),
       "STags are hard to guess, spread over the STag space, and reused slowly"),
    _R("SEC-09", "MUST", "5040 8.1.1(9), 8.1.1(10); 5042 6.4.6, 7.1", (_STREAM,),
       "Untrusting ULPs never share a CQ; a CQ overflow leaves other streams unharmed"),
    _R("SEC-10", "SHOULD", "5040 8.1.1(11); 5042 6.4.3.3", (_STREAM,),
       "Inbound Read Requests are capped at the IRD"),
    _R("SEC-11", "MUST", "5040 8.1.2; 5041 8.3.2; 5042 3, 6.4, 7.3", (),
       "A privileged resource manager allots CQs and IRD, checks buffer owners, trusts no one"),
    _R("SEC-12", "MUST (ULP)", "5042 6.3.5, 6.3.6", _RIGHTS,
       "Write-only buffers are registered write-only; no write access via several STags"),
    _R("SEC-13", "SHOULD (ULP)", "5042 6.3.2, 6.3.3, 6.3.4", (),
       "Stale data is scrubbed, read access granted only briefly, exposed bounds exact"),
    _R("SEC-14", "MUST", "5042 5.4.2, 5.4.5; 5044 9.4", (),
       "IPsec (RFC 3723, RFC 7146) is implemented; an IKE phase-2 delete keeps the stream"),
    _R("SEC-15", "MUST", "5041 8.3; 5042 6.1.1", _INVALID_STAG,
       "Use of an invalid STag is reported to the ULP and ends the stream"),
    _R("SEC-16", "MUST", "5040 8.1.1(12); 5041 8.3.1(7)", (),
       "No firmware from unauthenticated peers; updates only over a secure protocol"),
    # -- docs/kbtp.md ------------------------------------------------------------------
    _R("KBTP-4.2", "MUST", "4.2", (_UNSPEC,),
       "HELLO first and once, answered by one HELLO_ACK; requests only after it"),
    _R("KBTP-5", "MUST", "5", (),
       "A KBTP message is one Send-type message: common header, then its opcode's format"),
    _R("KBTP-5.1", "MUST", "5.1", (),
       "Header checks in order: length, Version 1, known opcode, flags, zero request Status"),
    _R("KBTP-5.2", "MUST", "5.2", (),
       "Each opcode allows only its flags and carries the descriptors they call for"),
    _R("KBTP-9.3", "MUST", "9.3", (_UNSPEC,),
       "A session-ending error is answered, then Terminate 0/2/0xFF and a TCP close"),
    # -- pseudo rules ------------------------------------------------------------------
    _R("TCP-GAP", "NOTE", "3.4; 5044 4.3, 6", (),
       "Not a rule: TCP bytes missing from a capture; decoding resumes at the next FPDU"),
)
# fmt: on

_BY_ID = {r.id: r for r in _RULES}


def normalize(rule_id: str) -> str:
    """``ddp_05`` -> ``DDP-05``: upper case, ``_`` read as ``-``, surrounding blanks dropped."""
    return rule_id.strip().upper().replace("_", "-")


def rule(rule_id: str) -> Rule:
    """The catalog entry of ``rule_id`` (case-insensitive, ``_`` for ``-``).

    Raises :class:`UnknownRule` (a :class:`KeyError`) naming the known families.
    """
    found = _BY_ID.get(normalize(rule_id))
    if found is None:
        families = ", ".join(f.prefix for f in FAMILIES)
        raise UnknownRule(f"unknown rule {rule_id!r} (IDs look like MPA-12; families: {families})")
    return found


def all_rules() -> tuple[Rule, ...]:
    """Every rule, in catalog order (family, then number)."""
    return _RULES


def by_prefix(prefix: str) -> tuple[Rule, ...]:
    """The rules whose ID starts with ``prefix``; a bare family (``DDP``) means ``DDP-``."""
    p = normalize(prefix)
    if p in _FAMILY:
        p += "-"
    if not p:
        return ()
    return tuple(r for r in _RULES if r.id.startswith(p))


def by_section(doc: str | int, section: str) -> tuple[Rule, ...]:
    """The rules citing ``section`` of ``doc`` (``5040``, ``"RFC 5040"`` or
    ``"docs/kbtp.md"``), subsections included: ``by_section(5044, "7.1")`` has ``7.1.1``
    and ``7.1.2(5)`` but not ``7.10``."""
    name = f"RFC {doc}" if isinstance(doc, int) or str(doc).isdigit() else str(doc).strip()
    name = re.sub(r"(?i)^rfc\s*", "RFC ", name)
    want = section.strip().lstrip("§")

    def cites(ref: Ref) -> bool:
        s = ref.section
        return ref.doc == name and (s == want or s.startswith((want + ".", want + "(")))

    return tuple(r for r in _RULES if any(cites(ref) for ref in r.refs))


def select(patterns: list[str] | tuple[str, ...]) -> tuple[Rule, ...]:
    """The rules named by ``patterns`` (IDs or prefixes), in catalog order; none: all.

    Raises :class:`UnknownRule` for the first pattern that matches nothing.
    """
    if not patterns:
        return _RULES
    chosen: set[str] = set()
    for pattern in patterns:
        exact = _BY_ID.get(normalize(pattern))
        matches = (exact,) if exact is not None else by_prefix(pattern)
        if not matches:
            rule(pattern)  # raises with the standard message
        chosen.update(r.id for r in matches)
    return tuple(r for r in _RULES if r.id in chosen)


def section_key(section: str) -> tuple[tuple[int, str], ...]:
    """``"7.1.2(5)"`` sorts after ``"7.1.1"`` and before ``"7.10"``; ``"A.1"`` after digits."""
    parts = re.findall(r"\d+|[A-Za-z]+", section)
    return tuple((int(p), "") if p.isdigit() else (1 << 30, p) for p in parts)


def groups(rules: tuple[Rule, ...] | None = None) -> list[tuple[Family, list[Rule]]]:
    """``rules`` (default: all) grouped by family, each group in the order of the sections
    it cites in the family's document (then by ID)."""
    picked = _RULES if rules is None else rules
    order = {r.id: i for i, r in enumerate(_RULES)}
    out: list[tuple[Family, list[Rule]]] = []
    for family in FAMILIES:
        members = [r for r in picked if r.layer == family.prefix]
        if members:
            members.sort(key=lambda r: (_first_section(r, family.doc), order[r.id]))
            out.append((family, members))
    return out


def _first_section(r: Rule, doc: str) -> tuple[tuple[int, str], ...]:
    """Sort key: the rule's first section in ``doc``; rules citing none of it go last."""
    for ref in r.refs:
        if ref.doc == doc:
            return section_key(ref.section)
    return ((1 << 31, ""),)
