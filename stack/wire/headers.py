"""Byte layouts of the RDMAP headers (RFC 5040 §4.4, §4.8; RFC 7306 §5.2, §6.2)."""

from __future__ import annotations

import struct

from stack.constants import (
    ATOMIC_REQUEST_HDR_LEN,
    ATOMIC_RESPONSE_HDR_LEN,
    DDP_UNTAGGED_HDR_LEN,
    READ_REQUEST_HDR_LEN,
    TERMINATE_CTRL_LEN,
    TERMINATE_SEG_LEN_LEN,
)

__all__ = [
    "ATOMIC_REQUEST",
    "ATOMIC_RESPONSE",
    "READ_REQUEST",
    "TERMINATE_CTRL",
    "TERMINATE_MAX_BODY",
    "TERMINATE_SEG_LEN",
]

READ_REQUEST = struct.Struct(">IQIIQ")
"""Sink STag, Sink TO, Read Message Size, Source STag, Source TO (RFC 5040 §4.4)."""
ATOMIC_REQUEST = struct.Struct(">IIIQQQQQ")
"""AOpCode word, Request ID, STag, TO, Add/Swap Data, Add/Swap Mask, Compare Data, Compare
Mask (RFC 7306 §5.2.1)."""
ATOMIC_RESPONSE = struct.Struct(">IQ")
"""Original Request ID, Original Remote Data Value (RFC 7306 §5.2.2)."""
TERMINATE_CTRL = struct.Struct(">I")
TERMINATE_SEG_LEN = struct.Struct(">H")

assert READ_REQUEST.size == READ_REQUEST_HDR_LEN
assert ATOMIC_REQUEST.size == ATOMIC_REQUEST_HDR_LEN
assert ATOMIC_RESPONSE.size == ATOMIC_RESPONSE_HDR_LEN

TERMINATE_MAX_BODY = (
    TERMINATE_CTRL_LEN + TERMINATE_SEG_LEN_LEN + DDP_UNTAGGED_HDR_LEN + READ_REQUEST_HDR_LEN
)
"""Longest Terminate RDMAP body: control, segment length, 18-byte DDP and 28-byte RDMA header."""
