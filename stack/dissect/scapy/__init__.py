"""Scapy layers for iWARP: MPA (RFC 5044, RFC 6581), DDP (RFC 5041), RDMAP (RFC 5040, RFC 7306).

For dissecting, crafting and fuzzing; never the data path (the sans-IO core in
:mod:`stack.wire` is).  One import gives every layer and helper::

    from stack.dissect.scapy import *

Layer stack of one FPDU (RFC 5044 §4.1, RFC 5041 §4, RFC 5040 §4)::

    MPA_FPDU / DDP_Tagged   / RDMAP_Write | RDMAP_ReadResponse / Raw(payload)
    MPA_FPDU / DDP_Untagged / RDMAP_Send | RDMAP_SendInvalidate | RDMAP_SendSE |
                              RDMAP_SendSEInvalidate | RDMAP_ReadRequest | RDMAP_Terminate |
                              RDMAP_ImmediateData(SE) | RDMAP_AtomicRequest |
                              RDMAP_AtomicResponse [/ Raw]

Modules: :mod:`~stack.dissect.scapy.mpa` (MPA Request/Reply, marker, FPDU with its PAD and
CRC), :mod:`~stack.dissect.scapy.ddp_rdmap` (DDP headers, RDMAP headers and the opcode
bindings), :mod:`~stack.dissect.scapy.crafting` (whole FPDUs in one call:
:func:`write_fpdu`, :func:`send_fpdu`, :func:`terminate_fpdu`...),
:mod:`~stack.dissect.scapy.streams` (back-to-back FPDUs and markers:
:func:`split_fpdus`, :class:`FpduSplitter` across segments, :func:`insert_markers`,
:func:`strip_markers`, :func:`split_marked_fpdus`), :mod:`~stack.dissect.scapy.session`
(:func:`bind_iwarp` to a TCP port, :class:`MPA` with ``tcp_reassemble`` for Scapy's
``TCPSession``) and :mod:`~stack.dissect.scapy.records` (the capture decoder's records as
packets: :func:`records_to_packets`, :func:`to_scapy`).  Automatic fields are computed
only while ``None``: any explicit value, however wrong, is emitted as given.  Bytes a
layer cannot dissect stay as :class:`IWARP_Undecoded` with the verdict
(``pkt.iwarp_error``, rule ID first); ``Layer.strict(data)`` raises
:class:`~stack.errors.DecodeError` instead.

Example: a deliberately broken FPDU (its CRC is wrong, MPA-12) through a pcap file and
back.  Without :func:`bind_iwarp` TCP has no binding to MPA (iWARP has no well-known
port), so here the TCP payload is dissected explicitly::

    from scapy.layers.inet import IP, TCP
    from scapy.utils import rdpcap, wrpcap
    from stack.dissect.scapy import *

    bad = write_fpdu(stag=0xABCDEF, to=0x1000, data=b"payload")
    bad.crc = 0xDEADBEEF  # forced: sent as given
    wrpcap("bad.pcap", [IP() / TCP(sport=40000, dport=5000) / bad])
    fpdu = MPA_FPDU(bytes(rdpcap("bad.pcap")[0][TCP].payload))
    print(fpdu.crc_ok(), hex(fpdu[DDP_Tagged].stag), fpdu.load)
    # False 0xabcdef b'payload'
"""

from stack.dissect.scapy.base import IWARP_Undecoded
from stack.dissect.scapy.crafting import (
    atomic_cmp_swap_fpdu,
    atomic_fetch_add_fpdu,
    atomic_response_fpdu,
    immediate_data_fpdu,
    read_request_fpdu,
    read_response_fpdu,
    send_fpdu,
    terminate_fpdu,
    write_fpdu,
)
from stack.dissect.scapy.ddp_rdmap import (
    ATOMIC_OPCODE_DISPLAY,
    DDP,
    DDP_Tagged,
    DDP_Untagged,
    RDMAP_AtomicRequest,
    RDMAP_AtomicResponse,
    RDMAP_ImmediateData,
    RDMAP_ImmediateDataSE,
    RDMAP_ReadRequest,
    RDMAP_ReadResponse,
    RDMAP_Send,
    RDMAP_SendInvalidate,
    RDMAP_SendSE,
    RDMAP_SendSEInvalidate,
    RDMAP_Terminate,
    RDMAP_Write,
)
from stack.dissect.scapy.mpa import (
    MPA_FPDU,
    MPA_FPDU_NoCRC,
    MPA_Frame,
    MPA_Marker,
    MPA_Reply,
    MPA_Request,
)
from stack.dissect.scapy.records import records_to_packets, to_scapy
from stack.dissect.scapy.session import MPA, bind_iwarp, unbind_iwarp
from stack.dissect.scapy.streams import (
    FpduSplitter,
    MarkedFpdu,
    insert_markers,
    split_fpdus,
    split_marked_fpdus,
    strip_markers,
    take_fpdu,
)

__all__ = [
    "ATOMIC_OPCODE_DISPLAY",
    "DDP",
    "DDP_Tagged",
    "DDP_Untagged",
    "FpduSplitter",
    "IWARP_Undecoded",
    "MPA",
    "MPA_FPDU",
    "MPA_FPDU_NoCRC",
    "MPA_Frame",
    "MPA_Marker",
    "MPA_Reply",
    "MPA_Request",
    "MarkedFpdu",
    "RDMAP_AtomicRequest",
    "RDMAP_AtomicResponse",
    "RDMAP_ImmediateData",
    "RDMAP_ImmediateDataSE",
    "RDMAP_ReadRequest",
    "RDMAP_ReadResponse",
    "RDMAP_Send",
    "RDMAP_SendInvalidate",
    "RDMAP_SendSE",
    "RDMAP_SendSEInvalidate",
    "RDMAP_Terminate",
    "RDMAP_Write",
    "atomic_cmp_swap_fpdu",
    "atomic_fetch_add_fpdu",
    "atomic_response_fpdu",
    "bind_iwarp",
    "immediate_data_fpdu",
    "insert_markers",
    "read_request_fpdu",
    "read_response_fpdu",
    "records_to_packets",
    "send_fpdu",
    "split_fpdus",
    "split_marked_fpdus",
    "strip_markers",
    "take_fpdu",
    "terminate_fpdu",
    "to_scapy",
    "unbind_iwarp",
    "write_fpdu",
]
