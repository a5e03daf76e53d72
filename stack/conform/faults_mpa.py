"""The faults of MPA startup, negotiation and framing (RFC 5044, RFC 6581): part of
:data:`stack.conform.faults.FAULTS`.

The startup faults mostly change what the DUT's engine runs (its startup rule tables, its
settings) or what its startup frames look like on the wire, the framing faults its FPDU
framer and deframer; their implementations are in :mod:`stack.conform.faults_startup` and
:mod:`stack.conform.faults_engine`.
"""

from __future__ import annotations

from stack.conform.faults_engine import (
    crc_unchecked,
    crc_wrong_terminate,
    marker_bits_checked,
    markers_ignored,
    oversize_accepted,
    reply_trailing_fpdu,
    terminate_headers,
    unknown_rev_accepted,
    whole_segments,
    wrong_rtr,
)
from stack.conform.faults_model import Fault, turns
from stack.conform.faults_qp import swallow
from stack.conform.faults_startup import (
    crc_checked_when_off,
    crc_from_peer,
    crc_own_preference,
    early_fpdus_dropped,
    first_segment_is_request,
    key_prefix_only,
    marker_pointers_unchecked,
    mpa_settings,
    no_startup_timer,
    ord_not_lowered,
    p2p_ignored,
    pad_taken_as_zero,
    reject_ignored,
    reply_own_rev,
    request_gso_bit,
    rev2_needs_s,
    rtr_from_own_offer,
    rules_fatal,
    rules_without,
    s_without_room_ignored,
    three_fff_refused,
)
from stack.constants import MPA_MAX_PRIVATE_DATA, TERM_DDP_U_TOO_LONG
from stack.wire.events import Role

__all__ = ["MPA_FAULTS"]

MPA_FAULTS: tuple[Fault, ...] = (
    # -- MPA startup and framing ---------------------------------------------------------
    Fault(
        "crc-wrong-terminate",
        "a CRC error is reported with Terminate 2/0/0x04 instead of 2/0/0x02",
        turns(
            "MPA-12",
            "MPA-12.2",
            "MPA-12.3",
            "MPA-12.4",
            "MPA-12.5",
            "MPA-12.6",
            "MPA-28",
            "MPA-12.7",
        ),
        crc_wrong_terminate,
        scope=("MPA-16", "MPA-08"),
    ),
    Fault(
        "crc-unchecked",
        "received FPDUs are delivered without checking their CRC",
        turns(
            "MPA-12",
            "MPA-12.2",
            "MPA-12.3",
            "MPA-12.4",
            "MPA-12.5",
            "MPA-12.6",
            "MPA-28",
            "MPA-12.7",
        ),
        crc_unchecked,
        scope=("MPA-11", "MPA-04"),
    ),
    Fault(
        "reply-trailing-fpdu",
        "the MPA Reply is followed at once by an FPDU (a zero-length RDMA Write), before "
        "the initiator's first FPDU",
        {"MPA-25": "FAIL"},
        reply_trailing_fpdu,
        scope=("MPA-17", "MPA-19"),
    ),
    Fault(
        "markers-ignored",
        "the peer's M bit is read as 0: no markers in FPDUs to a peer that asked for them",
        turns("MPA-09", "MPA-09.2"),
        markers_ignored,
        scope=("MPA-11",),
    ),
    Fault(
        "unknown-rev-accepted",
        "a Request with an undefined MPA revision is accepted instead of refused",
        turns("MPA-20.2", "MPA-20.3", "MPA-20.4"),
        unknown_rev_accepted,
        scope=("MPA-20", "ERC-01"),
    ),
    Fault(
        "terminate-headers",
        "LLP (MPA) Terminates carry a copied DDP header (Fig. 10 of RFC 5040: none)",
        turns(
            "MPA-12",
            "MPA-16",
            "MPA-02",
            "MPA-12.2",
            "MPA-12.3",
            "MPA-12.4",
            "MPA-12.5",
            "MPA-12.6",
            "MPA-28",
            "MPA-12.7",
            status="WARN",
        ),
        terminate_headers,
        scope=("MPA-01", "DDP-03.2"),
    ),
    Fault(
        "wrong-rtr",
        "a peer-to-peer initiator sends a Send RTR whatever RTR kind was negotiated",
        {"ERC-09": "FAIL"},
        wrong_rtr,
        app="rping-client-p2p",
        scope=("ERC-08", "MPA-19.3"),
    ),
    Fault(
        "oversize-accepted",
        "FPDUs up to ULPDU_Length 65535 are taken and Sends longer than their receive are "
        "cut silently",
        {**turns("MPA-02", "MPA-02.2"), **turns("RDMAP-08", status="WARN")},
        oversize_accepted,
        swallow(TERM_DDP_U_TOO_LONG),
        scope=("MPA-16", "RDMAP-08.2"),
    ),
    Fault(
        "segments-must-be-whole",
        "bytes arriving in a TCP segment of fewer than 12 octets are dropped (MPA-15: "
        "FPDUs are reassembled whatever the segmentation)",
        turns("MPA-15", "MPA-15.2", "MPA-15.3", "MPA-15.4", "MPA-15.6"),
        whole_segments,
        scope=("MPA-15",),
    ),
    Fault(
        "marker-bits-checked",
        "markers with their RESERVED half or FPDUPTR's low two bits set are taken as mismatches",
        turns("MPA-06", "MPA-06.2"),
        marker_bits_checked,
        app="rping-markers",
        scope=("MPA-08", "MPA-09"),
    ),
    Fault(
        "crc-own-preference",
        "a DUT that wants no CRC sends and checks none, even when the peer's C bit asks for it",
        turns("MPA-11", "MPA-11.3"),
        crc_own_preference,
        scope=("MPA-11",),
    ),
    Fault(
        "crc-from-peer",
        "CRC is used only when the peer's frame asked for it: the DUT's own C bit is forgotten",
        turns("MPA-11.2"),
        crc_from_peer,
        scope=("MPA-11",),
    ),
    Fault(
        "crc-checked-when-off",
        "the CRC field is checked even when CRC is off both ways",
        turns("MPA-05", "MPA-11.2"),
        crc_checked_when_off,
        app="bench",
        scope=("MPA-11",),
    ),
    Fault(
        "pad-taken-as-zero",
        "the CRC is computed over zero PAD instead of the PAD received (a non-zero PAD is a "
        "CRC error)",
        turns("MPA-04"),
        pad_taken_as_zero,
        scope=("MPA-15",),
    ),
    Fault(
        "marker-pointers-unchecked",
        "markers are removed where they sit, their FPDUPTR never compared",
        turns("MPA-08"),
        marker_pointers_unchecked,
        app="rping-markers",
        scope=("MPA-09", "MPA-06"),
    ),
    # -- the startup frames (RFC 5044 §7.1) ----------------------------------------------------
    Fault(
        "key-prefix-only",
        "only the first 15 octets of the MPA key are compared",
        turns("MPA-18", "MPA-18.3"),
        key_prefix_only,
        scope=("MPA-18",),
    ),
    Fault(
        "key-role-unchecked",
        "a frame with the other side's key is taken (a Reply key in a Request, a Request key "
        "in a Reply)",
        turns("MPA-18.2", "MPA-26.2"),
        rules_without("MPA-18", "MPA-26"),
        scope=("MPA-18",),
    ),
    Fault(
        "startup-reserved-refused",
        "reserved startup flag bits, and R in a Request, close the connection",
        {**turns("MPA-19", "MPA-19.2", status="WARN"), **turns("MPA-19.4")},
        rules_fatal("MPA-19"),
        scope=("MPA-19",),
    ),
    Fault(
        "request-gso-bit",
        "the DUT's Request sets reserved flag 0x08 (as siw does for GSO)",
        turns("MPA-19.3"),
        request_gso_bit,
        scope=("MPA-19",),
    ),
    Fault(
        "reply-own-rev",
        "the Reply carries the DUT's own revision (2), whatever the Request's",
        turns("MPA-20", "ERC-01", "ERC-01.2"),
        reply_own_rev,
        scope=("MPA-20", "MPA-21"),
    ),
    Fault(
        "rev2-needs-s",
        "a Rev 2 frame without the IRD/ORD word (S=0) is refused",
        turns("MPA-21", status="WARN"),
        rev2_needs_s,
        scope=("ERC-01", "MPA-21.2"),
    ),
    Fault(
        "pd-limit-unchecked",
        "PD_Length is not checked against the limit of 512 octets",
        turns("MPA-21.4", "MPA-21.5", "MPA-21.7"),
        mpa_settings(max_private_data=0xFFFF),
        scope=("MPA-21",),
    ),
    Fault(
        "pd-512-refused",
        "private data of 512 octets is refused (the PD_Length limit off by one)",
        turns("MPA-21.3"),
        mpa_settings(max_private_data=MPA_MAX_PRIVATE_DATA - 1),
        scope=("MPA-21",),
    ),
    Fault(
        "pd-256-refused",
        "private data over 255 octets is refused (a one-octet length)",
        {**turns("MPA-21.2", status="WARN"), **turns("MPA-21.3")},
        mpa_settings(max_private_data=0xFF),
        scope=("MPA-21",),
    ),
    Fault(
        "reply-before-request",
        "the first TCP segment is taken for the whole Request and answered at once",
        turns("MPA-22", "MPA-21.6", "MPA-27"),
        first_segment_is_request,
        scope=("MPA-21",),
    ),
    Fault(
        "early-fpdus-dropped",
        "FPDUs that arrive after the Request, before the DUT's Reply, are discarded",
        turns("MPA-17"),
        early_fpdus_dropped,
        scope=("MPA-25",),
    ),
    Fault(
        "reject-ignored",
        "a rejecting Reply (R=1) is taken as accepting: the initiator goes on to send FPDUs",
        turns("MPA-24"),
        reject_ignored,
        scope=("MPA-19.4",),
    ),
    Fault(
        "request-timer-missing",
        "no startup timer on the responder: it waits for a Request for ever",
        turns("MPA-26", "MPA-27", status="WARN"),
        no_startup_timer(Role.RESPONDER),
        scope=("MPA-22",),
    ),
    Fault(
        "reply-timer-missing",
        "no startup timer on the initiator: it waits for a Reply for ever (the application's "
        "own timeout is 30 s)",
        turns("MPA-27.2", status="WARN"),
        no_startup_timer(Role.INITIATOR),
        app="rping-client-patient",
    ),
    # -- RFC 6581 ----------------------------------------------------------------------------
    Fault(
        "s-rev1-refused",
        "an S bit in a Rev 1 Request (reserved there) closes the connection",
        turns("ERC-01.2", status="WARN"),
        rules_fatal("ERC-01"),
        scope=("ERC-01",),
    ),
    Fault(
        "s-without-room-ignored",
        "an S bit without room for the IRD/ORD word is ignored instead of refused",
        turns("ERC-02"),
        s_without_room_ignored,
        scope=("MPA-21", "ERC-01"),
    ),
    Fault(
        "ord-not-lowered",
        "the Reply's ORD is the DUT's own, not lowered to the initiator's IRD",
        turns("ERC-04"),
        ord_not_lowered,
        scope=("ERC-06", "ERC-08"),
    ),
    Fault(
        "ord-above-ird-accepted",
        "a Reply whose ORD exceeds the initiator's IRD is accepted",
        turns("ERC-04.2"),
        rules_without("ERC-04"),
        scope=("ERC-04",),
    ),
    Fault(
        "no-negotiation-refused",
        "IRD or ORD 0x3FFF (no negotiation) is refused as out of range",
        turns("ERC-06", status="WARN"),
        three_fff_refused,
        scope=("ERC-04",),
    ),
    Fault(
        "p2p-ignored",
        "a peer-to-peer Request is answered as a client-server one (Reply A=0, no RTR)",
        turns("ERC-08", "ERC-08.2", "ERC-08.3"),
        p2p_ignored,
        scope=("ERC-04",),
    ),
    Fault(
        "p2p-reply-unchecked",
        "a Reply that does not echo the A bit, or flags no RTR, is accepted",
        turns("ERC-08.4"),
        rules_without("ERC-08"),
        app="rping-client-p2p",
        scope=("ERC-09",),
    ),
    Fault(
        "rtr-from-own-offer",
        "the initiator takes the RTR kinds it offered as flagged by the Reply too",
        turns("ERC-09.2"),
        rtr_from_own_offer,
        app="rping-client-p2p",
        scope=("ERC-09", "ERC-08.4"),
    ),
)
"""The MPA and RFC 6581 faults, in the order of the docs' fault table."""
