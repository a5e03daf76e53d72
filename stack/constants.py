"""Wire constants of MPA, DDP, RDMAP and the RFC 7306 extensions: the one source of truth.

Every value here is exact to RFC 5044, RFC 6581, RFC 5041, RFC 5040, RFC 7306 and the
RFC 6580 registries.  The stack, the dissector,
KBTP and the tests all import these names; none of them spell a wire constant themselves.
"""

from __future__ import annotations

from enum import IntEnum, IntFlag
from typing import NamedTuple

# --------------------------------------------------------------------------------------
# MPA (RFC 5044 §7.1.1, RFC 6581 §6, §9)
# --------------------------------------------------------------------------------------

MPA_KEY_REQ = b"MPA ID Req Frame"
"""Key of an MPA Request frame (MPA-18)."""
MPA_KEY_REP = b"MPA ID Rep Frame"
"""Key of an MPA Reply frame (MPA-18); differs from the Request key only in byte 9."""
MPA_KEY_LEN = 16
MPA_FRAME_HEADER_LEN = 20
"""Key (16) + flags (1) + Rev (1) + PD_Length (2)."""


class MpaFlag(IntFlag):
    """Flag byte (frame byte 16) of an MPA Request/Reply."""

    MARKERS = 0x80  # M: the sender of this frame wants markers in FPDUs sent *to* it
    CRC = 0x40  # C: CRC in both directions if set in either frame
    REJECT = 0x20  # R: Reply only
    ENHANCED = 0x10  # S (RFC 6581): private data starts with the IRD/ORD word
    SIW_GSO = 0x08  # siw's non-standard "peer may send FPDUs larger than the MSS"


MPA_RESERVED_MASK = 0x0F
"""Reserved flag bits (RFC 6581); sent as 0 and never checked (MPA-19)."""

MPA_REV_RDMAC = 0
MPA_REV_1 = 1
MPA_REV_2 = 2
MPA_MAX_PRIVATE_DATA = 512
"""PD_Length limit of RFC 5044 (MPA-21); siw uses 256."""
SIW_MAX_PRIVATE_DATA = 256

MPA_IRD_ORD_LEN = 4
"""Length of the RFC 6581 IRD/ORD word at the start of private data."""
MPA_V2_PEER_TO_PEER = 0x80000000  # A
MPA_V2_RTR_SEND = 0x40000000  # B: zero-length Send RTR
MPA_V2_IRD_MASK = 0x3FFF0000
MPA_V2_RTR_WRITE = 0x00008000  # C: zero-length RDMA Write RTR
MPA_V2_RTR_READ = 0x00004000  # D: zero-length RDMA Read RTR
MPA_V2_ORD_MASK = 0x00003FFF
MPA_V2_IRD_ORD_MAX = 0x3FFF
MPA_V2_NO_NEGOTIATION = 0x3FFF
"""IRD or ORD 0x3FFF: no automatic negotiation, the ULP decides (ERC-06)."""


class RtrType(IntFlag):
    """Ready-to-receive message kinds of RFC 6581 §9.2 (bit positions in the ORD/IRD word)."""

    NONE = 0
    SEND = 1  # B: zero-length Send
    WRITE = 2  # C: zero-length RDMA Write
    READ = 4  # D: zero-length RDMA Read


MPA_MARKER_INTERVAL = 512
MPA_MARKER_LEN = 4
MPA_FPDUPTR_MASK = 0xFFFC
"""Low two FPDUPTR bits are sent as 0 and treated as 0 (MPA-06)."""
MPA_CRC_LEN = 4
MPA_LENGTH_LEN = 2
MPA_MIN_FPDU = 8
MPA_CRC_RESIDUE = 0x48674BC7
"""CRC32c over (covered bytes || CRC field) of every valid FPDU."""

MULPDU_MIN = 128
MULPDU_MAX = 64768
"""DDP never posts a ULPDU larger than this (MPA-02)."""
DEFAULT_EMSS = 1448
IOV_MIN_PAYLOAD = 2048
"""Payloads this large are sent by reference (scatter-gather), smaller ones are copied."""
IOV_MAX = 1024
"""Buffers one ``sendmsg`` takes at most (Linux UIO_MAXIOV)."""
HEAP_MMAP_THRESHOLD = 8 << 20
"""glibc ``M_MMAP_THRESHOLD`` the data path sets: buffers below this come from the heap."""
HEAP_TRIM_THRESHOLD = 32 << 20
"""glibc ``M_TRIM_THRESHOLD`` the data path sets: free heap kept for reuse, not returned."""
TCP_NOTSENT_LOWAT_BULK = 1 << 20
"""``TCP_NOTSENT_LOWAT`` of the data path's sockets: a whole send pass (1 MiB) per
``sendmsg``, and no more queued unsent, so the bytes in flight stay warm in the caches of
the receiving side (with the kernel's default, no limit, a receiver that falls behind
reads cold memory: Send 1 MiB cost the receiver ~830 instead of ~520 us/MiB).  trio sets
16 KiB, which ends every ``sendmsg`` of a bulk stream after 16 KiB of unsent data and one
segment: about 7 system calls and writable waits per MiB."""

RAW_RECEIVE_SIZE = 128 * 1024
"""Bytes per ``receive_some`` of the raw trio TCP baselines of the benchmarks (``iwarp
bench --baseline``, ``kbtp bench``): the fastest size measured for them on loopback, so
that a ratio is taken against the fastest honest raw exchange.  A 1 MiB stream, one
``send_all`` per MiB: 6.0-6.9 GB/s at 128 KiB, 4.9 at 64 KiB, 5.7-6.4 at 160-192 KiB and
3.6-4.3 at 256 KiB to 1 MiB (``recv_into`` a preallocated buffer behaves alike); ``iwarp
bench floor --raw-sizes`` measures it again."""
RAW_RECEIVE_SIZES = (RAW_RECEIVE_SIZE, 256 * 1024)
"""Receive sizes ``kbtp bench``'s pipelined raw baseline runs with, keeping the faster run:
neither is the faster at every block size (measured: 256 KiB by 8-12 % at 64 KiB blocks,
128 KiB by 5-15 % at 1 MiB)."""

MPA_REPLY_TIMEOUT = 10.0
"""Seconds an initiator waits for the Reply (siw's value; RFC 5044 gives none)."""
MPA_REQUEST_TIMEOUT = 5.0
"""Seconds a responder waits for the Request (siw's value)."""

# --------------------------------------------------------------------------------------
# DDP (RFC 5041 §4)
# --------------------------------------------------------------------------------------

DDP_TAGGED = 0x80
DDP_LAST = 0x40
DDP_RSVD_MASK = 0x3C
DDP_DV_MASK = 0x03
DDP_VERSION = 1
DDP_TAGGED_HDR_LEN = 14
DDP_UNTAGGED_HDR_LEN = 18

# --------------------------------------------------------------------------------------
# RDMAP (RFC 5040 §4, RFC 7306 §4)
# --------------------------------------------------------------------------------------

RDMAP_RV_MASK = 0xC0
RDMAP_RSVD_MASK = 0x30
RDMAP_OPCODE_MASK = 0x0F
RDMAP_VERSION = 1
RDMAP_VERSION_RDMAC = 0


class Opcode(IntEnum):
    """RDMAP opcodes (RFC 5040 §4.2, RFC 7306 §4.1, RFC 6580 registry)."""

    RDMA_WRITE = 0x0
    RDMA_READ_REQUEST = 0x1
    RDMA_READ_RESPONSE = 0x2
    SEND = 0x3
    SEND_INVALIDATE = 0x4
    SEND_SE = 0x5
    SEND_SE_INVALIDATE = 0x6
    TERMINATE = 0x7
    IMMEDIATE_DATA = 0x8
    IMMEDIATE_DATA_SE = 0x9
    ATOMIC_REQUEST = 0xA
    ATOMIC_RESPONSE = 0xB


OPCODE_NAMES: dict[int, str] = {
    Opcode.RDMA_WRITE: "RDMA Write",
    Opcode.RDMA_READ_REQUEST: "RDMA Read Request",
    Opcode.RDMA_READ_RESPONSE: "RDMA Read Response",
    Opcode.SEND: "Send",
    Opcode.SEND_INVALIDATE: "Send with Invalidate",
    Opcode.SEND_SE: "Send with SE",
    Opcode.SEND_SE_INVALIDATE: "Send with SE and Invalidate",
    Opcode.TERMINATE: "Terminate",
    Opcode.IMMEDIATE_DATA: "Immediate Data",
    Opcode.IMMEDIATE_DATA_SE: "Immediate Data with SE",
    Opcode.ATOMIC_REQUEST: "Atomic Request",
    Opcode.ATOMIC_RESPONSE: "Atomic Response",
}
"""Display names (the names ``iwarp dissect --json`` reports as ``opcode_name``)."""


class QueueNumber(IntEnum):
    """Untagged DDP queues of RDMAP (RFC 5040 §3.1, RFC 7306 §10)."""

    SEND = 0
    READ_REQUEST = 1
    TERMINATE = 2
    ATOMIC_RESPONSE = 3


TAGGED_OPCODES = frozenset({Opcode.RDMA_WRITE, Opcode.RDMA_READ_RESPONSE})
SEND_OPCODES = frozenset(
    {Opcode.SEND, Opcode.SEND_INVALIDATE, Opcode.SEND_SE, Opcode.SEND_SE_INVALIDATE}
)
INVALIDATE_OPCODES = frozenset({Opcode.SEND_INVALIDATE, Opcode.SEND_SE_INVALIDATE})
SOLICITED_OPCODES = frozenset({Opcode.SEND_SE, Opcode.SEND_SE_INVALIDATE, Opcode.IMMEDIATE_DATA_SE})
RFC7306_OPCODES = frozenset(
    {Opcode.IMMEDIATE_DATA, Opcode.IMMEDIATE_DATA_SE, Opcode.ATOMIC_REQUEST, Opcode.ATOMIC_RESPONSE}
)

OPCODE_QN: dict[int, int] = {
    Opcode.RDMA_READ_REQUEST: QueueNumber.READ_REQUEST,
    Opcode.SEND: QueueNumber.SEND,
    Opcode.SEND_INVALIDATE: QueueNumber.SEND,
    Opcode.SEND_SE: QueueNumber.SEND,
    Opcode.SEND_SE_INVALIDATE: QueueNumber.SEND,
    Opcode.TERMINATE: QueueNumber.TERMINATE,
    Opcode.IMMEDIATE_DATA: QueueNumber.SEND,
    Opcode.IMMEDIATE_DATA_SE: QueueNumber.SEND,
    Opcode.ATOMIC_REQUEST: QueueNumber.READ_REQUEST,
    Opcode.ATOMIC_RESPONSE: QueueNumber.ATOMIC_RESPONSE,
}
"""The QN each untagged opcode travels on (RDMAP-01, EXT-01..03)."""

READ_REQUEST_HDR_LEN = 28
ATOMIC_REQUEST_HDR_LEN = 52
ATOMIC_RESPONSE_HDR_LEN = 12
IMMEDIATE_DATA_LEN = 8
TERMINATE_CTRL_LEN = 4
TERMINATE_SEG_LEN_LEN = 2


class AtomicOpcode(IntEnum):
    """AOpCode of an Atomic Request (RFC 7306 §5.2.1); 1 is reserved."""

    FETCH_ADD = 0x0
    CMP_SWAP = 0x2


ATOMIC_OPCODE_MASK = 0x0000000F
ALL_ONES_32 = 0xFFFFFFFF  # a 32-bit field (STag, MSN, MO, QN) at its largest
ALL_ONES_64 = 0xFFFFFFFFFFFFFFFF
ATOMIC_ALIGNMENT = 8

# --------------------------------------------------------------------------------------
# Terminate (RFC 5040 §4.8, RFC 5041 §7.2, RFC 5044 §8, RFC 6581 §11, RFC 6580)
# --------------------------------------------------------------------------------------

TERM_LAYER_MASK = 0xF0000000
TERM_ETYPE_MASK = 0x0F000000
TERM_CODE_MASK = 0x00FF0000
TERM_FLAG_M = 0x00008000
TERM_FLAG_D = 0x00004000
TERM_FLAG_R = 0x00002000
TERM_RSVD_MASK = 0x00001FFF


class TermLayer(IntEnum):
    """Layer nibble of a Terminate."""

    RDMAP = 0x0
    DDP = 0x1
    LLP = 0x2


class RdmapEType(IntEnum):
    LOCAL_CATASTROPHIC = 0x0
    REMOTE_PROTECTION = 0x1
    REMOTE_OPERATION = 0x2


class DdpEType(IntEnum):
    LOCAL_CATASTROPHIC = 0x0
    TAGGED_BUFFER = 0x1
    UNTAGGED_BUFFER = 0x2
    RSVD_LLP = 0x3


class LlpEType(IntEnum):
    MPA = 0x0


class TermCode(NamedTuple):
    """A Terminate cause: (layer, error type, error code)."""

    layer: int
    etype: int
    code: int

    def __str__(self) -> str:
        return f"{self.layer}/{self.etype}/0x{self.code:02X} {term_name(self)}"


# RDMAP layer (RFC 5040 §7.2, RFC 7306 §8)
TERM_RDMAP_CATASTROPHIC = TermCode(0, 0, 0x00)
TERM_RDMAP_INVALID_STAG = TermCode(0, 1, 0x00)
TERM_RDMAP_BASE_BOUNDS = TermCode(0, 1, 0x01)
TERM_RDMAP_ACCESS_RIGHTS = TermCode(0, 1, 0x02)
TERM_RDMAP_STAG_NOT_ASSOCIATED = TermCode(0, 1, 0x03)
TERM_RDMAP_TO_WRAP = TermCode(0, 1, 0x04)
TERM_RDMAP_PROT_CANNOT_INVALIDATE = TermCode(0, 1, 0x09)
TERM_RDMAP_PROT_UNSPECIFIED = TermCode(0, 1, 0xFF)
TERM_RDMAP_INVALID_VERSION = TermCode(0, 2, 0x05)
TERM_RDMAP_UNEXPECTED_OPCODE = TermCode(0, 2, 0x06)
TERM_RDMAP_CATASTROPHIC_STREAM = TermCode(0, 2, 0x07)
TERM_RDMAP_CATASTROPHIC_GLOBAL = TermCode(0, 2, 0x08)
TERM_RDMAP_OP_CANNOT_INVALIDATE = TermCode(0, 2, 0x09)
TERM_RDMAP_OP_UNSPECIFIED = TermCode(0, 2, 0xFF)
# DDP layer (RFC 5041 §7.2)
TERM_DDP_CATASTROPHIC = TermCode(1, 0, 0x00)
TERM_DDP_T_INVALID_STAG = TermCode(1, 1, 0x00)
TERM_DDP_T_BASE_BOUNDS = TermCode(1, 1, 0x01)
TERM_DDP_T_STAG_NOT_ASSOCIATED = TermCode(1, 1, 0x02)
TERM_DDP_T_TO_WRAP = TermCode(1, 1, 0x03)
TERM_DDP_T_INVALID_VERSION = TermCode(1, 1, 0x04)
TERM_DDP_U_INVALID_QN = TermCode(1, 2, 0x01)
TERM_DDP_U_NO_BUFFER = TermCode(1, 2, 0x02)
TERM_DDP_U_MSN_RANGE = TermCode(1, 2, 0x03)
TERM_DDP_U_INVALID_MO = TermCode(1, 2, 0x04)
TERM_DDP_U_TOO_LONG = TermCode(1, 2, 0x05)
TERM_DDP_U_INVALID_VERSION = TermCode(1, 2, 0x06)
# LLP layer, MPA (RFC 5044 §8, RFC 6581 §11)
TERM_LLP_CONNECTION_LOST = TermCode(2, 0, 0x01)
TERM_LLP_CRC_ERROR = TermCode(2, 0, 0x02)
TERM_LLP_MARKER_MISMATCH = TermCode(2, 0, 0x03)
TERM_LLP_INVALID_STARTUP = TermCode(2, 0, 0x04)
TERM_LLP_LOCAL_CATASTROPHIC = TermCode(2, 0, 0x05)
TERM_LLP_INSUFFICIENT_IRD = TermCode(2, 0, 0x06)
TERM_LLP_NO_MATCHING_RTR = TermCode(2, 0, 0x07)

TERM_LAYER_NAMES = {0: "RDMAP", 1: "DDP", 2: "LLP"}
TERM_ETYPE_NAMES: dict[tuple[int, int], str] = {
    (0, 0): "Local Catastrophic",
    (0, 1): "Remote Protection Error",
    (0, 2): "Remote Operation Error",
    (1, 0): "Local Catastrophic",
    (1, 1): "Tagged Buffer Error",
    (1, 2): "Untagged Buffer Error",
    (1, 3): "Reserved for LLP",
    (2, 0): "MPA Error",
}
TERM_CODE_NAMES: dict[TermCode, str] = {
    TERM_RDMAP_CATASTROPHIC: "Local catastrophic",
    TERM_RDMAP_INVALID_STAG: "Invalid STag",
    TERM_RDMAP_BASE_BOUNDS: "Base or bounds violation",
    TERM_RDMAP_ACCESS_RIGHTS: "Access rights violation",
    TERM_RDMAP_STAG_NOT_ASSOCIATED: "STag not associated with RDMAP Stream",
    TERM_RDMAP_TO_WRAP: "TO wrap",
    TERM_RDMAP_PROT_CANNOT_INVALIDATE: "STag cannot be invalidated",
    TERM_RDMAP_PROT_UNSPECIFIED: "Unspecified error",
    TERM_RDMAP_INVALID_VERSION: "Invalid RDMAP version",
    TERM_RDMAP_UNEXPECTED_OPCODE: "Unexpected OpCode",
    TERM_RDMAP_CATASTROPHIC_STREAM: "Catastrophic error, localized to RDMAP Stream",
    TERM_RDMAP_CATASTROPHIC_GLOBAL: "Catastrophic error, global",
    TERM_RDMAP_OP_CANNOT_INVALIDATE: "STag cannot be invalidated",
    TERM_RDMAP_OP_UNSPECIFIED: "Unspecified error",
    TERM_DDP_CATASTROPHIC: "Local catastrophic",
    TERM_DDP_T_INVALID_STAG: "Invalid STag",
    TERM_DDP_T_BASE_BOUNDS: "Base or bounds violation",
    TERM_DDP_T_STAG_NOT_ASSOCIATED: "STag not associated with DDP Stream",
    TERM_DDP_T_TO_WRAP: "TO wrap",
    TERM_DDP_T_INVALID_VERSION: "Invalid DDP version",
    TERM_DDP_U_INVALID_QN: "Invalid QN",
    TERM_DDP_U_NO_BUFFER: "Invalid MSN - no buffer available",
    TERM_DDP_U_MSN_RANGE: "Invalid MSN - MSN range is not valid",
    TERM_DDP_U_INVALID_MO: "Invalid MO",
    TERM_DDP_U_TOO_LONG: "DDP Message too long for available buffer",
    TERM_DDP_U_INVALID_VERSION: "Invalid DDP version",
    TERM_LLP_CONNECTION_LOST: "TCP connection closed, reset, timed out or FIN",
    TERM_LLP_CRC_ERROR: "MPA CRC error",
    TERM_LLP_MARKER_MISMATCH: "MPA marker and ULPDU length mismatch",
    TERM_LLP_INVALID_STARTUP: "Invalid MPA Request or Reply",
    TERM_LLP_LOCAL_CATASTROPHIC: "Local catastrophic error",
    TERM_LLP_INSUFFICIENT_IRD: "Insufficient IRD resources",
    TERM_LLP_NO_MATCHING_RTR: "No matching RTR model",
}


def term_name(code: TermCode | tuple[int, int, int]) -> str:
    """Human name of a Terminate cause; unknown combinations are named generically."""
    code = TermCode(*code)
    if code in TERM_CODE_NAMES:
        return TERM_CODE_NAMES[code]
    if code.layer == TermLayer.RDMAP and code.etype == RdmapEType.LOCAL_CATASTROPHIC:
        return "Local catastrophic"
    layer = TERM_LAYER_NAMES.get(code.layer, f"layer {code.layer}")
    etype = TERM_ETYPE_NAMES.get((code.layer, code.etype), f"etype {code.etype}")
    return f"{layer} {etype} code 0x{code.code:02X}"
