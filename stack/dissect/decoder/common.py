"""Constants and helpers shared by the capture decoder's modules."""

from __future__ import annotations

import struct

from stack.constants import (
    DDP_LAST,
    DDP_TAGGED,
    DDP_TAGGED_HDR_LEN,
    DDP_VERSION,
    INVALIDATE_OPCODES,
    MPA_V2_RTR_READ,
    MPA_V2_RTR_SEND,
    MPA_V2_RTR_WRITE,
    RDMAP_VERSION,
    SEND_OPCODES,
    Opcode,
    RtrType,
)
from stack.pcap import TCP_FIN, TCP_RST, TCP_SYN
from stack.wire import ddp

_SEQ_MOD = 1 << 32
_TCP_SPECIAL = TCP_SYN | TCP_FIN | TCP_RST
_LE32 = struct.Struct("<I")
_U32 = struct.Struct(">I")
_MPA_HDR = struct.Struct(">16sBBH")
_MIN_ULPDU = DDP_TAGGED_HDR_LEN
_SEARCH_SPAN = 1040
"""A mid-stream chain must cover this many bytes (two marker intervals) when data allows."""
_SEARCH_MIN_FPDUS = 3
_SEARCH_GIVE_UP = 256 * 1024
"""Bytes of a direction searched without finding a chain before it is declared not iWARP."""
_SEARCH_TRIES = _SEARCH_GIVE_UP // 4
"""Candidate FPDU starts one search of one setting examines by its marker phases at most:
one pass over the most bytes searched, at the 4-byte steps of a marker phase."""
_MAX_ULPDU = 0xFFFF
_HOLD_LIMIT = 64 * 1024
"""Bytes of the initiator held for the MPA Reply's settings; beyond them its FPDUs are
searched for (CRC and markers detected) instead."""

_OP_WRITE = int(Opcode.RDMA_WRITE)
_OP_READ_REQUEST = int(Opcode.RDMA_READ_REQUEST)
_OP_READ_RESPONSE = int(Opcode.RDMA_READ_RESPONSE)
_OP_SEND = int(Opcode.SEND)
_OP_TERMINATE = int(Opcode.TERMINATE)
_OP_ATOMIC_REQUEST = int(Opcode.ATOMIC_REQUEST)
_OP_ATOMIC_RESPONSE = int(Opcode.ATOMIC_RESPONSE)

_RTR_BITS = ((MPA_V2_RTR_SEND, RtrType.SEND), (MPA_V2_RTR_WRITE, RtrType.WRITE),
             (MPA_V2_RTR_READ, RtrType.READ))  # fmt: skip

_CTRL_TAGGED_LAST = DDP_TAGGED | DDP_LAST | DDP_VERSION
_CTRL_UNTAGGED_LAST = DDP_LAST | DDP_VERSION
_FAST_TAGGED = frozenset({DDP_TAGGED | DDP_VERSION, _CTRL_TAGGED_LAST})
_FAST_UNTAGGED = frozenset({DDP_VERSION, _CTRL_UNTAGGED_LAST})
_RV = RDMAP_VERSION << 6
_FAST_TAGGED_OPS = frozenset({_RV | Opcode.RDMA_WRITE, _RV | Opcode.RDMA_READ_RESPONSE})
_FAST_SEND_OPS = frozenset(_RV | op for op in SEND_OPCODES)
_FAST_INVALIDATE_OPS = frozenset(_RV | op for op in INVALIDATE_OPCODES)
_MARKER_UNPACK = struct.Struct(">HH").unpack_from
_ZEROS = tuple((0,) * k for k in range(64))
_LAYOUTS: dict[tuple[int, int], tuple[int, int, tuple[int, ...]]] = {}
"""fpdu_layout results by (offset from SeqStart mod 512, ULPDU_Length); never mutated."""
_TAGGED_UNPACK = ddp.TAGGED_HDR.unpack_from
_UNTAGGED_UNPACK = ddp.UNTAGGED_HDR.unpack_from


def _endpoint(ip: str, port: int) -> str:
    return f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}"
