"""Crafting helpers: whole FPDUs in one call, every field overridable afterwards.

Each constructor stacks :class:`~stack.dissect.scapy.mpa.MPA_FPDU` (or the no-CRC variant
with ``crc=False``), the DDP header and the RDMAP layer of one message, with the payload
as ``Raw``; the result is an ordinary Scapy packet, so any field can then be set to a
wrong value on purpose (``pkt.crc = 0``, ``pkt[DDP_Untagged].msn = 7``).
:func:`terminate_fpdu` chooses the copied headers by RFC 5040 Fig. 10 through the wire
core (:func:`stack.wire.terminate.terminate_headers`), never a second copy of the table.
"""

from __future__ import annotations

from scapy.config import conf
from scapy.packet import Packet, Raw

from stack.constants import (
    ALL_ONES_64,
    DDP_TAGGED,
    DDP_TAGGED_HDR_LEN,
    DDP_UNTAGGED_HDR_LEN,
    MPA_LENGTH_LEN,
    RDMAP_OPCODE_MASK,
    READ_REQUEST_HDR_LEN,
    AtomicOpcode,
    Opcode,
    QueueNumber,
)
from stack.dissect.scapy.ddp_rdmap import (
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
from stack.dissect.scapy.mpa import _BE16, MPA_FPDU, MPA_FPDU_NoCRC
from stack.wire.terminate import terminate_headers

__all__ = [
    "atomic_cmp_swap_fpdu",
    "atomic_fetch_add_fpdu",
    "atomic_response_fpdu",
    "immediate_data_fpdu",
    "read_request_fpdu",
    "read_response_fpdu",
    "send_fpdu",
    "terminate_fpdu",
    "write_fpdu",
]


def _frame(crc: bool) -> Packet:
    return MPA_FPDU() if crc else MPA_FPDU_NoCRC()


def _with_data(pkt: Packet, data: bytes) -> Packet:
    return pkt / Raw(data) if data else pkt


def write_fpdu(
    stag: int, to: int, data: bytes = b"", *, last: bool = True, crc: bool = True
) -> Packet:
    """An RDMA Write segment, tagged (RFC 5040 §5.1, RDMAP-05)."""
    return _with_data(
        _frame(crc) / DDP_Tagged(stag=stag, to=to, last=int(last)) / RDMAP_Write(), data
    )


def read_response_fpdu(
    stag: int, to: int, data: bytes = b"", *, last: bool = True, crc: bool = True
) -> Packet:
    """An RDMA Read Response segment, tagged to the request's sink."""
    ddp = DDP_Tagged(stag=stag, to=to, last=int(last))
    return _with_data(_frame(crc) / ddp / RDMAP_ReadResponse(), data)


def read_request_fpdu(
    sink_stag: int,
    sink_to: int,
    size: int,
    src_stag: int,
    src_to: int,
    *,
    msn: int = 1,
    crc: bool = True,
) -> Packet:
    """An RDMA Read Request on QN 1 (RFC 5040 §4.4, RDMAP-04)."""
    hdr = RDMAP_ReadRequest(
        sink_stag=sink_stag, sink_to=sink_to, size=size, src_stag=src_stag, src_to=src_to
    )
    return _frame(crc) / DDP_Untagged(msn=msn) / hdr


def send_fpdu(
    data: bytes = b"",
    *,
    msn: int = 1,
    mo: int = 0,
    last: bool = True,
    solicited: bool = False,
    inval_stag: int | None = None,
    crc: bool = True,
) -> Packet:
    """A Send-family segment on QN 0 (RFC 5040 §5.3, RDMAP-08).

    ``inval_stag`` selects Send with Invalidate, the STag in RsvdULP (RDMAP-03).
    """
    if inval_stag is None:
        rdmap: Packet = RDMAP_SendSE() if solicited else RDMAP_Send()
        ddp = DDP_Untagged(msn=msn, mo=mo, last=int(last))
    else:
        rdmap = RDMAP_SendSEInvalidate() if solicited else RDMAP_SendInvalidate()
        ddp = DDP_Untagged(msn=msn, mo=mo, last=int(last), inval_stag=inval_stag)
    return _with_data(_frame(crc) / ddp / rdmap, data)


def immediate_data_fpdu(
    data: bytes, *, msn: int = 1, solicited: bool = False, crc: bool = True
) -> Packet:
    """Immediate Data (with SE) on QN 0 (RFC 7306 §6.3, EXT-09)."""
    layer = RDMAP_ImmediateDataSE if solicited else RDMAP_ImmediateData
    return _frame(crc) / DDP_Untagged(msn=msn) / layer(data=data)


def atomic_fetch_add_fpdu(
    req_id: int, stag: int, to: int, add: int, mask: int = 0, *, msn: int = 1, crc: bool = True
) -> Packet:
    """A FetchAdd Atomic Request on QN 1 (RFC 7306 §5.2.1, EXT-02)."""
    hdr = RDMAP_AtomicRequest(
        aopcode=AtomicOpcode.FETCH_ADD,
        req_id=req_id,
        remote_stag=stag,
        remote_to=to,
        add_swap_data=add,
        add_swap_mask=mask,
        compare_data=0,
        compare_mask=ALL_ONES_64,
    )
    return _frame(crc) / DDP_Untagged(msn=msn) / hdr


def atomic_cmp_swap_fpdu(
    req_id: int,
    stag: int,
    to: int,
    compare: int,
    swap: int,
    compare_mask: int = ALL_ONES_64,
    swap_mask: int = ALL_ONES_64,
    *,
    msn: int = 1,
    crc: bool = True,
) -> Packet:
    """A CmpSwap Atomic Request on QN 1."""
    hdr = RDMAP_AtomicRequest(
        aopcode=AtomicOpcode.CMP_SWAP,
        req_id=req_id,
        remote_stag=stag,
        remote_to=to,
        add_swap_data=swap,
        add_swap_mask=swap_mask,
        compare_data=compare,
        compare_mask=compare_mask,
    )
    return _frame(crc) / DDP_Untagged(msn=msn) / hdr


def atomic_response_fpdu(req_id: int, orig_value: int, *, msn: int = 1, crc: bool = True) -> Packet:
    """An Atomic Response on QN 3 (RFC 7306 §5.2.2, EXT-03)."""
    hdr = RDMAP_AtomicResponse(orig_req_id=req_id, orig_value=orig_value)
    return _frame(crc) / DDP_Untagged(msn=msn) / hdr


def terminate_fpdu(
    layer: int,
    etype: int,
    code: int,
    *,
    offending: bytes | Packet | None = None,
    m: bool | None = None,
    d: bool | None = None,
    r: bool | None = None,
    ddp_seg_len: int | None = None,
    crc: bool = True,
) -> Packet:
    """A Terminate on QN 2, MSN 1 (RFC 5040 §4.8, §5.4; RDMAP-10, RDMAP-12).

    ``offending`` is the FPDU that caused it (bytes or packet, no markers); its
    ULPDU_Length, DDP header and, for a Read Request, 28-byte RDMA header are copied.
    M/D/R default to RFC 5040 Fig. 10 (:func:`stack.wire.terminate.terminate_headers`): D = M
    = a DDP header is copied and the cause is neither LLP nor local catastrophic; R = a Read
    Request header was copied for an RDMAP remote protection error.  Explicit
    m/d/r/ddp_seg_len win.
    """
    hdr: Packet | None = None
    rdma: Packet | None = None
    seg_len = 0
    opcode: int | None = None
    if offending is not None:
        raw = bytes(offending)
        seg_len = _BE16.unpack_from(raw)[0] if len(raw) >= MPA_LENGTH_LEN else 0
        ulpdu = raw[MPA_LENGTH_LEN : MPA_LENGTH_LEN + seg_len]
        if ulpdu:
            tagged = bool(ulpdu[0] & DDP_TAGGED)
            n = DDP_TAGGED_HDR_LEN if tagged else DDP_UNTAGGED_HDR_LEN
            hdr = DDP(ulpdu[:n]) if len(ulpdu) >= n else conf.raw_layer(ulpdu)
            hdr.remove_payload()
            if not tagged and len(ulpdu) > 1:
                opcode = ulpdu[1] & RDMAP_OPCODE_MASK
            rr = ulpdu[n : n + READ_REQUEST_HDR_LEN]
            if not tagged and opcode == Opcode.RDMA_READ_REQUEST and rr:
                rdma = RDMAP_ReadRequest(rr) if len(rr) == READ_REQUEST_HDR_LEN else Raw(rr)
    want_ddp, want_rdma = terminate_headers(layer, etype, opcode)
    if d is None:
        d = hdr is not None and want_ddp
    if m is None:
        m = d
    if r is None:
        r = rdma is not None and want_rdma
    term = RDMAP_Terminate(
        layer=layer,
        etype=etype,
        code=code,
        m=int(m),
        d=int(d),
        r=int(r),
        ddp_seg_len=seg_len if ddp_seg_len is None else ddp_seg_len,
        ddp_hdr=hdr if d else None,
        rdma_hdr=rdma if r else None,
    )
    ddp = DDP_Untagged(qn=QueueNumber.TERMINATE, msn=1, mo=0)
    return _frame(crc) / ddp / term
