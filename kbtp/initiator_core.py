"""The KBTP initiator as sans-IO pieces (docs/kbtp.md §4, §6.6, §9.2).

* :class:`InitiatorCore` -- the session: HELLO, HELLO_ACK, request IDs, request credits
  (at most Request Credits requests outstanding; the rest wait in order), matching each
  COMPLETION to its request.  Feed it received Sends with :meth:`InitiatorCore.on_message`;
  send what :meth:`InitiatorCore.outgoing` returns.
* :class:`DirectLoad` and :class:`DirectAlloc` -- the one-sided procedures of draft §6.6 as
  step machines: ``next_op()`` names the next RDMA operation (:class:`ReadOp`,
  :class:`FetchAddOp`, :class:`WriteOp`), the caller performs it and ``feed()``s the result,
  one operation at a time (each issued after the previous one completed).

No sockets, no clocks: the binding to an RNIC (or a test) moves the bytes.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from enum import Enum

from kbtp.constants import (
    COUNTER_ALIGNMENT,
    DEFAULT_MAX_BLOCK_SIZE,
    RDMAP_BINDING_CAPABILITIES,
    REQUEST_OPCODES,
    RING_MAX_ORDER,
    RING_MIN_ORDER,
    SLOT_LEN,
    TABLE_ENTRY_LEN,
    TICKET_MASK,
    TICKET_MODULUS,
    Capability,
    CounterFormat,
    RequestFlag,
    Status,
    counter_operands,
    counter_ticket,
)
from kbtp.layout import Slot, TableEntry
from kbtp.messages import (
    Bind,
    Completion,
    Hello,
    HelloAck,
    KbtpError,
    Load,
    Request,
    decode_message,
    with_request_id,
)
from stack.errors import LocalError
from stack.fastinit import maker

# ======================================================================================
# Session
# ======================================================================================


@dataclass(frozen=True, slots=True)
class SessionReady:
    """HELLO_ACK with SUCCESS.  Fields: ack."""

    ack: HelloAck


@dataclass(frozen=True, slots=True)
class SessionRefused:
    """HELLO_ACK with an error status; the target closes the stream.  Fields: ack."""

    ack: HelloAck


@dataclass(frozen=True, slots=True)
class RequestCompleted:
    """The COMPLETION of one request.  Fields: request, completion."""

    request: Request
    completion: Completion

    @property
    def ok(self) -> bool:
        return self.completion.status == Status.SUCCESS


InitiatorEvent = SessionReady | SessionRefused | RequestCompleted
_completed = maker(RequestCompleted)

_SPACE = 1 << 64
"""Tagged Offsets are 64-bit: every advertised region must end within them."""


def _refuse(detail: str) -> KbtpError:
    return KbtpError(Status.MALFORMED, f"the target advertised {detail}", fatal=True)


def check_hello_ack(
    ack: HelloAck, requested: Capability, max_block_size: int = DEFAULT_MAX_BLOCK_SIZE
) -> None:
    """Refuse (fatal :class:`KbtpError`, MALFORMED) a successful HELLO_ACK whose session
    parameters no target could honour (docs/kbtp.md §4.2): the initiator would otherwise
    size buffers, compute addresses and run FetchAdds from them.

    Checked: capabilities granted ⊆ requested and offered on RDMAP; 1 ≤ Block Size ≤
    ``max_block_size``; Request Credits ≥ 1; quota ≤ Pool Size; the handle range within 64
    bits; with DIRECT_LOAD, the range's table entries within 64 bits and at or above Table
    Base Handle; with DIRECT_ALLOC, Ring Order within 1..28 (docs/kbtp.md §3.3) with N ≥
    quota ≥ 1, Partition Length = quota × Block Size, an 8-aligned Head, the slots and
    partition within 64 bits, and a Ticket Timeout of at least 1 ms; UNMASKED_COUNTER
    granted only with DIRECT_ALLOC, and with it whenever requested (docs/kbtp.md §4.3).
    """
    granted = Capability(ack.capabilities)
    if granted & ~(requested & RDMAP_BINDING_CAPABILITIES):
        raise _refuse(f"capabilities {granted!r}, asked for {requested!r}")
    if granted & Capability.UNMASKED_COUNTER and not granted & Capability.DIRECT_ALLOC:
        raise _refuse("UNMASKED_COUNTER without DIRECT_ALLOC")
    if granted & Capability.DIRECT_ALLOC and requested & Capability.UNMASKED_COUNTER:
        if not granted & Capability.UNMASKED_COUNTER:
            raise _refuse("DIRECT_ALLOC with the masked counter to a plain FetchAdd")
    if not 1 <= ack.block_size <= max_block_size:
        raise _refuse(f"a Block Size of {ack.block_size} (accepted: 1..{max_block_size})")
    if ack.request_credits < 1:
        raise _refuse("no Request Credits")
    if ack.quota > ack.pool_blocks:
        raise _refuse(f"a quota of {ack.quota} blocks in a pool of {ack.pool_blocks}")
    if ack.handle_base + ack.handle_count > _SPACE:
        raise _refuse("a handle range beyond 64 bits")
    if granted & Capability.DIRECT_LOAD:
        first = ack.handle_base - ack.table_base_handle
        end = ack.table_offset + TABLE_ENTRY_LEN * ack.table_entries
        if first < 0 or first + ack.handle_count > ack.table_entries or end > _SPACE:
            raise _refuse("a block table that does not hold the handle range")
    if granted & Capability.DIRECT_ALLOC:
        n = ack.ring_order
        if not RING_MIN_ORDER <= n <= RING_MAX_ORDER:
            raise _refuse(f"Ring Order {n} (allowed: {RING_MIN_ORDER}..{RING_MAX_ORDER})")
        if not 1 <= ack.quota <= 1 << n:
            raise _refuse(f"a ring of {1 << n} slots for a quota of {ack.quota}")
        if ack.partition_length != ack.quota * ack.block_size:
            raise _refuse(f"a Partition Length of {ack.partition_length} octets")
        if ack.head_offset % COUNTER_ALIGNMENT or ack.head_offset + 8 > _SPACE:
            raise _refuse(f"a Head at 0x{ack.head_offset:x}")
        if ack.ring_offset + SLOT_LEN * (1 << n) > _SPACE:
            raise _refuse("ring slots beyond 64 bits")
        if ack.partition_offset + ack.partition_length > _SPACE:
            raise _refuse("a partition beyond 64 bits")
        if ack.ticket_timeout_ms < 1:
            raise _refuse("a Ticket Timeout of 0 ms")


def check_completion(completion: Completion, request: Request, block_size: int) -> None:
    """Refuse (fatal :class:`KbtpError`) a COMPLETION that does not answer ``request``:
    Handle and Request Opcode echoed, and on SUCCESS a Data Length within the Block Size
    (and, for a LOAD, within the buffer the target wrote into)."""
    if completion.handle != request.handle or completion.request_opcode != request.opcode:
        raise _refuse(
            f"a COMPLETION of request {completion.request_id} for handle "
            f"0x{completion.handle:x} opcode 0x{completion.request_opcode:02x}, not "
            f"0x{request.handle:x} {request.opcode.name}"
        )
    if completion.status != Status.SUCCESS:
        return
    limit = block_size
    if isinstance(request, Load):
        limit = min(limit, request.descriptor.length)
    if completion.data_length > limit:
        raise _refuse(
            f"a Data Length of {completion.data_length} for {request.opcode.name} (at most {limit})"
        )


class InitiatorCore:
    """One KBTP session seen from the initiator (docs/kbtp.md §4.2, §9.2).

    Request IDs are assigned here (``submit`` replaces the one in the message), so a
    COMPLETION always finds its request.  Requests beyond the credits wait in submission
    order.  A COMPLETION for no outstanding request, or any message that is not HELLO_ACK
    or COMPLETION, raises :class:`KbtpError` (the binding should close the stream).
    """

    def __init__(
        self,
        identity: bytes,
        capabilities: Capability = Capability.NONE,
        *,
        max_block_size: int = DEFAULT_MAX_BLOCK_SIZE,
        max_credits: int | None = None,
    ) -> None:
        self.identity = identity
        self.capabilities = capabilities
        self.max_block_size = max_block_size
        self.max_credits = max_credits
        self.ack: HelloAck | None = None
        self._next_id = 1
        self._hello_id = 0
        self._waiting: deque[Request] = deque()
        self._outstanding: dict[int, Request] = {}

    def hello(self) -> bytes:
        """The HELLO to send first (after posting a receive for the HELLO_ACK)."""
        if self._hello_id:
            raise LocalError("HELLO already sent")
        self._hello_id = self._take_id()
        caps = self.capabilities
        if caps & Capability.DIRECT_ALLOC and not caps & Capability.UNMASKED_COUNTER:
            caps |= Capability.MASKED_FETCH_ADD  # this stack's RNIC issues it (RFC 7306)
        return Hello(self._hello_id, caps, self.identity).encode()

    def _take_id(self) -> int:
        rid = self._next_id
        self._next_id = (self._next_id + 1) % (1 << 64) or 1
        return rid

    @property
    def request_credits(self) -> int:
        """Requests this initiator keeps outstanding at most: the target's Request Credits,
        or ``max_credits`` if fewer (its own receives for COMPLETIONs); 0 before HELLO_ACK."""
        if self.ack is None:
            return 0
        if self.max_credits is None:
            return self.ack.request_credits
        return min(self.ack.request_credits, self.max_credits)

    @property
    def credits(self) -> int:
        """Requests that may be sent now (0 before HELLO_ACK)."""
        if self.ack is None:
            return 0
        return self.request_credits - len(self._outstanding)

    @property
    def outstanding(self) -> int:
        return len(self._outstanding)

    @property
    def queued(self) -> int:
        return len(self._waiting)

    def submit(self, request: Request) -> int:
        """Queue ``request`` with a fresh Request ID; returns that ID."""
        if request.opcode not in REQUEST_OPCODES:
            raise LocalError(f"{request.opcode.name} is not a request")
        rid = self._take_id()
        self._waiting.append(with_request_id(request, rid))
        return rid

    def outgoing(self) -> list[bytes]:
        """Encoded requests to send now, as many as the credits allow, in submission order."""
        out: list[bytes] = []
        waiting = self._waiting
        if not waiting:
            return out
        for _ in range(min(self.credits, len(waiting))):
            req = waiting.popleft()
            self._outstanding[req.request_id] = req
            out.append(req.encode())
        return out

    def on_message(self, data: bytes | bytearray | memoryview) -> list[InitiatorEvent]:
        """A Send from the target arrived."""
        msg = decode_message(data)
        if isinstance(msg, HelloAck):
            if self.ack is not None or msg.request_id != self._hello_id:
                raise KbtpError(Status.BAD_OPCODE, "unexpected HELLO_ACK", fatal=True)
            if msg.status != Status.SUCCESS:
                return [SessionRefused(msg)]
            check_hello_ack(msg, self.capabilities, self.max_block_size)
            self.ack = msg
            return [SessionReady(msg)]
        if isinstance(msg, Completion):
            req = self._outstanding.get(msg.request_id)
            if req is None:
                raise KbtpError(
                    Status.BAD_OPCODE,
                    f"COMPLETION for request {msg.request_id}, which is not outstanding",
                    fatal=True,
                )
            assert self.ack is not None  # requests go out only after HELLO_ACK
            check_completion(msg, req, self.ack.block_size)
            del self._outstanding[msg.request_id]
            return [_completed(req, msg)]
        raise KbtpError(Status.BAD_OPCODE, f"{msg.opcode.name} sent to an initiator", fatal=True)


# ======================================================================================
# Direct modes (draft §6.6)
# ======================================================================================


@dataclass(frozen=True, slots=True)
class ReadOp:
    """RDMA Read ``length`` octets at (stag, to) of the target."""

    stag: int
    to: int
    length: int


@dataclass(frozen=True, slots=True)
class FetchAddOp:
    """RFC 7306 FetchAdd at (stag, to); feed the original value (an int)."""

    stag: int
    to: int
    add: int
    mask: int


@dataclass(frozen=True, slots=True)
class CompareSwapOp:
    """RFC 7306 Compare and Swap at (stag, to); feed the original value.  No KBTP procedure
    uses it: it is here to probe what a target's STags allow (docs/kbtp.md §3.6)."""

    stag: int
    to: int
    compare: int
    swap: int


@dataclass(frozen=True, slots=True)
class WriteOp:
    """RDMA Write ``data`` at (stag, to) of the target; feed ``b""`` when it completed."""

    stag: int
    to: int
    data: bytes


DirectOp = ReadOp | FetchAddOp | CompareSwapOp | WriteOp


class DirectLoad:
    """DIRECT_LOAD of one handle: entry, block, entry again (draft §6.6).

    After the last feed, ``data`` holds the block's Data Length octets if both entry reads
    showed the same Generation with VALID and SEALED, else None (``reason`` says why;
    the caller may retry or fall back to LOAD).
    """

    def __init__(self, ack: HelloAck, handle: int, max_length: int | None = None) -> None:
        if not ack.capabilities & Capability.DIRECT_LOAD:
            raise LocalError("DIRECT_LOAD was not granted")
        self.ack = ack
        self.handle = handle
        self.max_length = max_length
        self.first: TableEntry | None = None
        self.block: bytes | None = None
        self.data: bytes | None = None
        self.reason = ""
        self.done = False

    def next_op(self) -> ReadOp | None:
        if not self.done and not self.ack.serves(self.handle):
            # A read outside the table would end the stream; LOAD answers HANDLE_OUT_OF_RANGE.
            self._finish("handle not in the table (HANDLE_OUT_OF_RANGE)")
        if self.done:
            return None
        if self.first is None or self.block is not None:
            return ReadOp(self.ack.table_stag, self.ack.entry_to(self.handle), TABLE_ENTRY_LEN)
        return ReadOp(self.ack.pool_stag, self.first.block_offset, self.first.data_length)

    def feed(self, data: bytes) -> None:
        if self.done:
            raise LocalError("direct load already finished")
        if self.first is None:
            entry = TableEntry.unpack(data)
            if entry.valid and entry.data_length > self.ack.block_size:
                # Never size a read from the target's memory beyond what a block can hold.
                raise _refuse(
                    f"a table entry of handle 0x{self.handle:x} with Data Length "
                    f"{entry.data_length} in blocks of {self.ack.block_size} octets"
                )
            if not (entry.valid and entry.sealed):
                self._finish("entry is not VALID and SEALED")
            elif self.max_length is not None and entry.data_length > self.max_length:
                self._finish("block longer than the buffer")
            elif entry.data_length == 0:
                self.block = b""  # nothing to read between the two entry reads
            self.first = entry
        elif self.block is None:
            self.block = bytes(data)
        else:
            second = TableEntry.unpack(data)
            if second != self.first:
                self._finish("entry changed while reading (freed or rebound)")
            else:
                self.data = self.block
                self._finish("")

    def _finish(self, reason: str) -> None:
        self.reason = reason
        self.done = True


class AllocState(Enum):
    FETCH = "fetch-add"
    READ = "read-slot"
    CONFIRM = "confirm-slot"
    WRITE = "write-block"
    BIND = "bind"
    ABANDONED = "abandoned"


class DirectAlloc:
    """DIRECT_ALLOC of one block (draft §6.6): FetchAdd, slot reads, RDMA Write, then BIND.

    ``next_op()`` returns the next one-sided operation until the state is BIND; then
    :meth:`bind` builds the BIND request to submit.  If the slot shows a later Sequence
    (or this ticket's slot consumed), the ticket was abandoned and reclaimed: the state
    becomes ABANDONED.  ``polls`` counts slot reads; the caller gives up after the
    Ticket Timeout.
    """

    def __init__(self, ack: HelloAck, data: bytes) -> None:
        if not ack.capabilities & Capability.DIRECT_ALLOC:
            raise LocalError("DIRECT_ALLOC was not granted")
        if len(data) > ack.block_size:
            raise LocalError(f"{len(data)} octets do not fit a {ack.block_size}-octet block")
        self.ack = ack
        self.data = data
        self.state = AllocState.FETCH
        self.ticket = 0
        self.slot_offset = 0
        self.block_offset = 0
        self.polls = 0
        self._seen: Slot | None = None

    @property
    def counter_format(self) -> CounterFormat:
        """The partition counter's format for the session (docs/kbtp.md §4.3)."""
        if self.ack.capabilities & Capability.UNMASKED_COUNTER:
            return CounterFormat.UNMASKED
        return CounterFormat.MASKED

    def next_op(self) -> DirectOp | None:
        ack = self.ack
        if self.state is AllocState.FETCH:
            add, mask = counter_operands(self.counter_format, ack.ring_order)
            return FetchAddOp(ack.head_stag, ack.head_offset, add, mask)
        if self.state in (AllocState.READ, AllocState.CONFIRM):
            return ReadOp(ack.ring_stag, ack.ring_offset + self.slot_offset, SLOT_LEN)
        if self.state is AllocState.WRITE:
            return WriteOp(ack.partition_stag, self.block_offset, self.data)
        return None

    def feed(self, result: int | bytes) -> None:
        if self.state is AllocState.FETCH:
            assert isinstance(result, int)
            n = self.ack.ring_order
            ticket = counter_ticket(result, n, self.counter_format)
            if ticket is None:
                fmt = self.counter_format.value
                raise _refuse(f"a Head of 0x{result:016x}, no counter of its ring ({fmt} format)")
            self.ticket, self.slot_offset = ticket, SLOT_LEN * (ticket % (1 << n))
            self.state = AllocState.READ
        elif self.state in (AllocState.READ, AllocState.CONFIRM):
            assert not isinstance(result, int)
            self.polls += 1
            slot = Slot.unpack(result)
            ahead = (slot.sequence - self.ticket) % TICKET_MODULUS
            if 0 < ahead < TICKET_MODULUS // 2 or (ahead == 0 and slot.consumed):
                self.state = AllocState.ABANDONED
            elif not slot.holds(self.ticket):
                self.state = AllocState.READ  # not filled yet: read again
            elif self.state is AllocState.READ:
                self._seen = slot
                self.state = AllocState.CONFIRM
            elif slot == self._seen:
                self._check_block(slot.block_offset)
                self.block_offset = slot.block_offset
                self.state = AllocState.WRITE
            else:
                self._seen = slot  # a torn first read: confirm again
        elif self.state is AllocState.WRITE:
            self.state = AllocState.BIND
        else:
            raise LocalError(f"nothing to feed in state {self.state.value}")

    def _check_block(self, block_offset: int) -> None:
        """The slot's block must be one of the partition's: never write anywhere else."""
        ack = self.ack
        rel = block_offset - ack.partition_offset
        if rel < 0 or rel >= ack.partition_length or rel % ack.block_size:
            raise _refuse(f"a slot naming 0x{block_offset:x}, no block of the partition")

    def bind(self, handle: int, *, seal: bool = False, generation: int = 0) -> Bind:
        """The BIND for this allocation (its Request ID is assigned by ``submit``)."""
        if self.state is not AllocState.BIND:
            raise LocalError(f"cannot BIND in state {self.state.value}")
        flags = RequestFlag.SEAL if seal else RequestFlag.NONE
        return Bind(
            0,
            handle,
            self.ticket & TICKET_MASK,
            len(self.data),
            self.block_offset,
            generation,
            flags,
        )
