"""KBTP wire constants: the one source of truth for opcodes, flags, capabilities and status codes.

Values the draft fixes (flags of §5.1, table flags of §3.2, Add Data and Add Mask of §3.3,
Version 1) are spelled here exactly once; values the draft leaves open (opcode numbers,
capability bits, status codes, message lengths) are defined by ``docs/kbtp.md`` and only
here in code.  Every other KBTP module imports these names.
"""

from __future__ import annotations

from enum import Enum, IntEnum, IntFlag

from stack.constants import ALL_ONES_64
from stack.errors import LocalError

KBTP_VERSION = 1
"""Version of the common header (draft §5.1)."""


class MessageOpcode(IntEnum):
    """Opcode byte of the common header (docs/kbtp.md §5.1, the draft's missing Table 2)."""

    HELLO = 0x01
    HELLO_ACK = 0x02
    COMPLETION = 0x03
    LOAD = 0x10
    STORE = 0x11
    ALLOC_STORE = 0x12
    FREE = 0x13
    BIND = 0x14


REQUEST_OPCODES = frozenset(
    {
        MessageOpcode.LOAD,
        MessageOpcode.STORE,
        MessageOpcode.ALLOC_STORE,
        MessageOpcode.FREE,
        MessageOpcode.BIND,
    }
)
"""Opcodes that consume a request credit and are answered by a COMPLETION."""


class RequestFlag(IntFlag):
    """Flags of a request (draft §5.1)."""

    NONE = 0
    INLINE = 0x0001
    SEAL = 0x0002
    RECORD = 0x0004
    INVALIDATE = 0x0008
    ALLOW_UNSEALED = 0x0010


ALLOWED_FLAGS: dict[MessageOpcode, RequestFlag] = {
    MessageOpcode.HELLO: RequestFlag.NONE,
    MessageOpcode.HELLO_ACK: RequestFlag.NONE,
    MessageOpcode.COMPLETION: RequestFlag.NONE,
    MessageOpcode.LOAD: RequestFlag.RECORD | RequestFlag.INVALIDATE | RequestFlag.ALLOW_UNSEALED,
    MessageOpcode.STORE: RequestFlag.INLINE
    | RequestFlag.SEAL
    | RequestFlag.RECORD
    | RequestFlag.INVALIDATE,
    MessageOpcode.ALLOC_STORE: RequestFlag.INLINE
    | RequestFlag.SEAL
    | RequestFlag.RECORD
    | RequestFlag.INVALIDATE,
    MessageOpcode.FREE: RequestFlag.RECORD,
    MessageOpcode.BIND: RequestFlag.SEAL | RequestFlag.RECORD,
}
"""Flags each opcode may carry; any other set bit is BAD_FLAGS (docs/kbtp.md §5.2)."""


class Capability(IntFlag):
    """Capability bits of HELLO and HELLO_ACK (docs/kbtp.md §4.3)."""

    NONE = 0
    DIRECT_LOAD = 0x0001
    DIRECT_ALLOC = 0x0002
    RECORD_COMPLETION = 0x0004
    MASKED_FETCH_ADD = 0x0008
    """HELLO only: the initiator's RNIC issues RFC 7306 masked Fetch and Add, which
    DIRECT_ALLOC needs with the §3.3 counter format; never echoed in HELLO_ACK."""
    UNMASKED_COUNTER = 0x0010
    """HELLO: the initiator asks for its partition ring in the unmasked counter format of
    draft §9.2 (it issues only plain Fetch and Add); HELLO_ACK: granted with DIRECT_ALLOC,
    the partition's Head and Tail are in that format for the session (docs/kbtp.md §4.3)."""


DIRECT_CAPABILITIES = Capability.DIRECT_LOAD | Capability.DIRECT_ALLOC | Capability.UNMASKED_COUNTER
"""Capabilities whose use needs RDMA Reads or atomics of the initiator (docs/kbtp.md §4.1)."""

RDMAP_BINDING_CAPABILITIES = (
    Capability.DIRECT_LOAD | Capability.DIRECT_ALLOC | Capability.UNMASKED_COUNTER
)
"""What a target may grant on the RDMAP binding: never RECORD_COMPLETION (draft §6.5, §9.1)."""


class TableFlag(IntFlag):
    """Flags of a block table entry (draft §3.2)."""

    NONE = 0
    VALID = 0x0001
    SEALED = 0x0002


class Status(IntEnum):
    """Status of a COMPLETION or HELLO_ACK (docs/kbtp.md §7); 0 is success."""

    SUCCESS = 0
    BAD_VERSION = 1
    BAD_OPCODE = 2
    MALFORMED = 3
    BAD_FLAGS = 4
    NOT_OFFERED = 5
    NO_SESSION = 6
    UNKNOWN_INITIATOR = 7
    SESSION_EXISTS = 8
    HANDLE_OUT_OF_RANGE = 9
    WRONG_GENERATION = 10
    NOT_VALID = 11
    ALREADY_VALID = 12
    SEALED = 13
    NOT_SEALED = 14
    TOO_LONG_FOR_BLOCK = 15
    TOO_LONG_FOR_DESCRIPTOR = 16
    INLINE_TOO_LONG = 17
    NO_SPACE = 18
    TICKET_ABANDONED = 19
    BAD_BIND = 20
    CREDIT_EXCEEDED = 21
    REMOTE_ACCESS_ERROR = 22
    TARGET_FAILURE = 23
    IRD_ORD_TOO_LOW = 24


SESSION_FATAL_STATUSES = frozenset(
    {
        Status.BAD_VERSION,
        Status.BAD_OPCODE,
        Status.NO_SESSION,
        Status.UNKNOWN_INITIATOR,
        Status.SESSION_EXISTS,
        Status.CREDIT_EXCEEDED,
        Status.REMOTE_ACCESS_ERROR,
        Status.TARGET_FAILURE,
        Status.IRD_ORD_TOO_LOW,
    }
)
"""Statuses after which the target closes the session (docs/kbtp.md §9.3).

MALFORMED is fatal only when the common header itself cannot be read; NO_SPACE closes the
session only when a direct-allocation over-quota is observed (draft §3.4 "MAY terminate").
"""

_STATUS_NAMES = {int(s): s.name for s in Status}


def status_name(status: int) -> str:
    """A Status field's name, ``STATUS_n`` for a value no status has."""
    return _STATUS_NAMES.get(status) or f"STATUS_{status}"


# --------------------------------------------------------------------------------------
# Lengths (docs/kbtp.md §5)
# --------------------------------------------------------------------------------------

COMMON_HEADER_LEN = 24
DATA_DESCRIPTOR_LEN = 16
COMPLETION_DESCRIPTOR_LEN = 16
COMPLETION_RECORD_LEN = 24
HELLO_FIXED_LEN = COMMON_HEADER_LEN + 8
HELLO_ACK_LEN = COMMON_HEADER_LEN + 120
COMPLETION_LEN = COMMON_HEADER_LEN + 16
BIND_LEN = COMMON_HEADER_LEN + 16
MAX_REQUEST_FIXED_LEN = COMMON_HEADER_LEN + DATA_DESCRIPTOR_LEN + COMPLETION_DESCRIPTOR_LEN
"""Longest request without inline data; a target's receive buffers hold this + Max Inline."""
MAX_IDENTITY_LEN = 256

TABLE_ENTRY_LEN = 16
SLOT_LEN = 16
COUNTER_LEN = 8
COUNTER_ALIGNMENT = 8

# --------------------------------------------------------------------------------------
# Block table and free-block ring (draft §3.2, §3.3)
# --------------------------------------------------------------------------------------

GENERATION_ANY = 0
"""A request Generation of zero matches any generation (draft §5.1)."""
GENERATION_MAX = 0xFFFF
INITIAL_GENERATION = 1
EMPTY_BLOCK_OFFSET = ALL_ONES_64
"""A slot whose Block Offset is all ones is consumed (draft §3.3)."""
NO_BLOCK_OFFSET = ALL_ONES_64
"""Block Offset of a COMPLETION that names no block (errors, FREE)."""

TICKET_BITS = 32
TICKET_MODULUS = 1 << TICKET_BITS
TICKET_MASK = TICKET_MODULUS - 1
RING_ADD_DATA = 0x0000000100000010
"""Add Data of every Head/Tail FetchAdd: Ticket + 1, Slot Offset + 16 (draft §3.3)."""
RING_ADD_DATA_UNMASKED = 0x0000000100000000
"""Add Data of the unmasked counter format (draft §9.2): Ticket + 1, low 32 bits zero."""
RING_MIN_ORDER = 1
"""n >= 1: with n = 0 the +16 of Add Data would land in the zero field (docs/kbtp.md §3.3)."""
RING_MAX_ORDER = 28
"""n + 4 <= 32: the Slot Offset field must fit below the Ticket."""


def next_generation(generation: int) -> int:
    """The generation after ``generation``: incremented by one, skipping zero (draft §6.3, §6.4)."""
    return generation % GENERATION_MAX + 1


def ring_add_mask(order: int) -> int:
    """Add Mask of a ring with N = 2**order slots: bit 63 | bit 31 | bit (n+3) (draft §3.3)."""
    if not RING_MIN_ORDER <= order <= RING_MAX_ORDER:
        raise LocalError(f"ring order {order} outside {RING_MIN_ORDER}..{RING_MAX_ORDER}")
    return (1 << 63) | (1 << 31) | (1 << (order + 3))


def ring_order_for(blocks: int) -> int:
    """Smallest ring order n with 2**n >= blocks (and n >= RING_MIN_ORDER)."""
    order = RING_MIN_ORDER
    while (1 << order) < blocks:
        order += 1
    return order


def pack_counter(ticket: int, slot_offset: int) -> int:
    """A Head/Tail counter value: Ticket in bits 63-32, Slot Offset in the low bits (§3.3)."""
    return ((ticket & TICKET_MASK) << 32) | slot_offset


def unpack_counter(value: int, order: int) -> tuple[int, int]:
    """(Ticket, Slot Offset) of a counter value of a ring of order ``order`` (§3.3)."""
    return (value >> 32) & TICKET_MASK, value & ((1 << (order + 4)) - 1)


class CounterFormat(Enum):
    """How a ring's Head and Tail encode the Ticket (docs/kbtp.md §3.3, §4.3).

    MASKED: draft §3.3, Ticket in bits 63-32 and Slot Offset below, advanced by the masked
    FetchAdd of RFC 7306.  UNMASKED: draft §9.2, Ticket in bits 63-32 and zero below,
    advanced by a plain Fetch and Add; the slot is 16 x (Ticket mod N).
    """

    MASKED = "masked"
    UNMASKED = "unmasked"


def counter_value(fmt: CounterFormat, ticket: int, order: int) -> int:
    """The counter value holding ``ticket`` in format ``fmt`` on a ring of order ``order``."""
    ticket &= TICKET_MASK
    if fmt is CounterFormat.UNMASKED:
        return ticket << 32
    return pack_counter(ticket, SLOT_LEN * (ticket % (1 << order)))


def counter_operands(fmt: CounterFormat, order: int) -> tuple[int, int]:
    """(Add Data, Add Mask) of the FetchAdd that takes a ticket in format ``fmt``; an Add
    Mask of 0 is the plain Fetch and Add (RFC 7306 §5.1)."""
    if fmt is CounterFormat.UNMASKED:
        return RING_ADD_DATA_UNMASKED, 0
    return RING_ADD_DATA, ring_add_mask(order)


def counter_ticket(value: int, order: int, fmt: CounterFormat) -> int | None:
    """The Ticket of a counter value, or None if no sequence of the format's FetchAdds
    from an initialized ring can produce ``value`` (a corrupted counter, docs/kbtp.md §6.7)."""
    ticket = (value >> 32) & TICKET_MASK
    return ticket if value == counter_value(fmt, ticket, order) else None


# --------------------------------------------------------------------------------------
# Defaults of this implementation (advertised in HELLO_ACK, docs/kbtp.md §5.4)
# --------------------------------------------------------------------------------------

MIN_TARGET_ORD = 1
"""A target's ORD on a stream is at least 1: STORE and ALLOC_STORE need its RDMA Reads, which
the initiator's IRD bounds (docs/kbtp.md §4.1 item 2); below it HELLO gets IRD_ORD_TOO_LOW."""
MIN_TARGET_IRD_DIRECT = 1
"""A target's IRD is at least 1 for the direct modes, whose RDMA Reads and atomics the
initiator's ORD bounds (docs/kbtp.md §4.1 item 2); below it they are not granted."""
DEFAULT_REQUEST_CREDITS = 16
MAX_REQUEST_CREDITS = 0xFFFF
"""Request Credits is a 16-bit field of HELLO_ACK (docs/kbtp.md §5.4)."""
DEFAULT_MAX_INLINE = 4096
DEFAULT_TICKET_TIMEOUT = 2.0
"""Seconds (HELLO_ACK carries milliseconds)."""
MAX_TICKET_TIMEOUT_MS = 0xFFFF_FFFF
"""The Ticket Timeout is a 32-bit field of milliseconds in HELLO_ACK (docs/kbtp.md §5.4),
and an initiator refuses one below 1 ms (§4.2): a target's is 1 ms to about 49.7 days."""
DEFAULT_RECEIVE_MARGIN = 64
"""Receives a target posts beyond the Request Credits, so that requests sent beyond the
credits are received and answered CREDIT_EXCEEDED (docs/kbtp.md §9.2)."""
DEFAULT_HELLO_TIMEOUT = 5.0
"""Seconds a target waits for HELLO after the connection is up (docs/kbtp.md §4.2)."""
DEFAULT_IDLE_TIMEOUT = 600.0
"""Seconds of silence after which a target closes a session (docs/kbtp.md §4.2)."""
DEFAULT_HELLO_ACK_TIMEOUT = 10.0
"""Seconds an initiator waits for HELLO_ACK after sending HELLO (docs/kbtp.md §4.2)."""
DEFAULT_MAX_BLOCK_SIZE = 1 << 26
"""Largest Block Size an initiator accepts from a HELLO_ACK, 64 MiB (docs/kbtp.md §4.2)."""


# --------------------------------------------------------------------------------------
# Persistent pool file (docs/kbtp.md §12)
# --------------------------------------------------------------------------------------

POOL_FILE_MAGIC = b"KBTPPOOL"
"""The first 8 octets of a pool file."""
POOL_FILE_VERSION = 1
"""Format version of the pool file header; a file of another version is refused."""
POOL_FILE_PREFIX_LEN = 64
"""Octets of the fixed header prefix; the layout description follows it."""
POOL_FILE_ALIGN = 64 * 1024
"""File offsets of the journal and the layout are multiples of this (a multiple of every
common page size, so both can be mapped on any host)."""
