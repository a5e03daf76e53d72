"""The capture decoder: MPA tracking, FPDU walk with marker removal, validation findings.

Theory of operation
-------------------
:class:`Dissector` takes TCP segments in capture order (from :mod:`stack.pcap`),
reassembles each direction (:mod:`stack.dissect.tcp`) and hands the in-order bytes to a
:class:`~.walker.DirectionDecoder` per direction, which runs one of these modes:

``start``   expects an MPA Request or Reply at stream offset 0 (RFC 5044 §7.1).
``hold``    the initiator's bytes after its Request wait until the Reply tells whether the
            responder wants markers in them (M is chosen by the receiver, §7.1.1).
``fpdu``    Full Operation: FPDUs are walked from ULPDU_Length; with markers, SeqStart is
            the first byte after the direction's Request/Reply and a 4-byte marker sits at
            every offset ``(off - SeqStart) % 512 == 0`` (MPA-07), including before an FPDU
            (FPDUPTR 0), between PAD and CRC, and right after an FPDU that ends on a 512
            boundary.  The CRC covers the contiguous wire bytes from the leading marker (or
            the length field) to the CRC field, markers included (MPA-12), so it is one
            CRC32c call; markers are then cut out of the ULPDU.
``search``  the capture started mid-stream or a TCP gap lost the framing: candidate FPDU
            starts are tried until a chain of FPDUs is consistent (length, CRC when on,
            markers' FPDUPTRs when on, DDP/RDMAP header sanity).  CRC and marker settings
            are detected unless stated in :class:`DissectOptions`; the marker phase is
            found from the markers themselves.  After a gap the settings and the 4-byte
            alignment are known and only the phase-consistent starts are tried.
``dead``    not iWARP, rejected, or no FPDU chain found: bytes are counted, not decoded.

Each ULPDU is decoded by :func:`stack.wire.rdmap.decode_ulpdu` in lenient mode (stateless
checks: versions, reserved bits, opcode, T bit, QN/opcode pairing, header lengths,
Terminate form including siw's swapped nibbles), then :class:`~.checks.DirectionChecks`
adds the stateful checks of the wire engines' :mod:`stack.wire.sequence`, run leniently:
MSN sequence per queue and MO continuity (DDP-05, DDP-06), L on message boundaries
(DDP-02), constant opcode/RsvdULP/STag within a message (DDP-04), Read Responses and Atomic
Responses matching the other direction's requests (RDMAP-04, EXT-03); plus nothing after a
Terminate (RDMAP-10) and Terminate header inclusion (RDMAP-12).  Startup frames are judged
by the MPA engine's rule tables (:mod:`stack.wire.mpa_rules`: MPA-18..26, ERC-01/04/07/08/
11), and the first FPDU of each direction by MPA-25 and ERC-09.

Every PDU becomes a :class:`PduRecord` (emitted when the frame that completes it is fed);
events that are not PDUs (gaps, resynchronisation, non-iWARP connections) become
:class:`Note`.  ``Dissector(brief=True)`` (the one-line summary) yields the clean FPDUs of
the bulk walk as :data:`BriefFpdu` tuples instead: the fields the summary shows, no objects
(or, given the printer's templates, the fused path's lines themselves: :data:`BriefText`).
Findings carry rule IDs of the catalog (:mod:`stack.rules`,
``iwarp rules``); TCP-level facts use the pseudo rule ``TCP-GAP``.

Modules: :mod:`~stack.dissect.decoder.records` (what comes out),
:mod:`~stack.dissect.decoder.checks` (the wire engines' stateful checks run leniently),
:mod:`~stack.dissect.decoder.walker` (one direction's modes),
:mod:`~stack.dissect.decoder.fpdu_walk` (its FPDU walk in Full Operation),
:mod:`~stack.dissect.decoder.resync` (finding FPDUs mid-stream),
:mod:`~stack.dissect.decoder.connection` (one TCP connection, startup frames, records) and
:mod:`~stack.dissect.decoder.dissector` (TCP segments in, records out).
"""

from stack.dissect.decoder.dissector import BriefOutput, Dissector, Output, dissect
from stack.dissect.decoder.records import (
    BriefFpdu,
    BriefText,
    DirectionInfo,
    DissectOptions,
    Note,
    PduRecord,
    Route,
    SegmentView,
    StreamInfo,
    rule_ids,
)
from stack.wire.checker import Finding
from stack.wire.framing import fpdu_layout

__all__ = [
    "DirectionInfo",
    "BriefFpdu",
    "BriefOutput",
    "BriefText",
    "DissectOptions",
    "Dissector",
    "Finding",
    "Note",
    "Output",
    "PduRecord",
    "Route",
    "SegmentView",
    "StreamInfo",
    "dissect",
    "rule_ids",
    "fpdu_layout",
]
