"""From the capture decoder's records to Scapy packets (one layered packet per PDU).

The capture decoder (:mod:`stack.dissect.decoder`) reassembles TCP, follows the MPA
negotiation, finds FPDUs mid-stream and removes markers; :func:`to_scapy` turns one of its
:class:`~stack.dissect.decoder.PduRecord` into the packet of that PDU (``MPA_Request`` /
``MPA_Reply``, or ``MPA_FPDU`` / DDP / RDMAP, ``MPA_FPDU_NoCRC`` when CRC is off), and
:func:`records_to_packets` does so for every PDU of a capture file.  A marked FPDU comes
back marker-free with its markers and wire CRC input recorded (``wire_markers``,
``crc_ok()`` judges the CRC as sent, MPA-12).
"""

from __future__ import annotations

import struct
from pathlib import Path

from scapy.packet import Packet

from stack.constants import MPA_CRC_LEN, MPA_KEY_REP, MPA_KEY_REQ
from stack.dissect.decoder import DissectOptions, PduRecord, dissect
from stack.dissect.scapy.mpa import _BE16, _LE32, MPA_FPDU, MPA_FPDU_NoCRC, MPA_Frame, MPA_Marker
from stack.pcap import read_tcp_segments

__all__ = ["records_to_packets", "to_scapy"]

_MARKER = struct.Struct(">HH")


def to_scapy(record: PduRecord) -> Packet:
    """The Scapy packet of one decoded PDU (an MPA Request/Reply or an FPDU)."""
    if record.kind in ("mpa_req", "mpa_rep"):
        key = MPA_KEY_REQ if record.kind == "mpa_req" else MPA_KEY_REP
        head = key + bytes((record.mpa_flags, record.rev)) + _BE16.pack(record.pd_len)
        return MPA_Frame(head + record.private_data)
    if record.kind != "fpdu":
        raise ValueError(f"not a PDU record: kind {record.kind!r}")
    ulpdu = bytes(record.ulpdu)
    clean = _BE16.pack(record.ulpdu_len) + ulpdu + record.pad + _LE32.pack(record.crc_field)
    cls = MPA_FPDU_NoCRC if record.crc_ok is None else MPA_FPDU
    pkt = cls(clean)
    if record.marker_offsets:
        wire = bytearray(clean)
        held = []
        marks = zip(record.marker_offsets, record.marker_reserved, record.marker_ptrs, strict=True)
        for offset, reserved, ptr in sorted(marks):
            at = offset - record.offset  # wire position: earlier insertions already counted
            raw = _MARKER.pack(reserved, ptr)
            wire[at:at] = raw
            held.append((at, MPA_Marker(raw)))
        pkt.set_wire(bytes(wire[:-MPA_CRC_LEN]), tuple(held))
    return pkt


def records_to_packets(capture: str | Path, options: DissectOptions | None = None) -> list[Packet]:
    """Decode a capture file and give the Scapy packet of every PDU, in capture order."""
    records = dissect(read_tcp_segments(capture), options)
    return [to_scapy(r) for r in records if isinstance(r, PduRecord)]
