"""The free-block ring of draft §3.3 as the target runs it: allocation, free, deferred writes.

One :class:`FreeRing` manages one ring in target memory (slots, Head, Tail) plus the
target's bookkeeping about it:

* ``take`` -- a target-executed allocation: FetchAdd on Head (through the injected atomic
  engine) returning the ticket; the block is ready when its slot holds the ticket.
* ``consume`` -- mark a ticket's slot consumed and run the free that was deferred on that
  slot, if any (draft §3.3: a free MUST NOT overwrite an unconsumed slot).
* ``free`` -- FetchAdd on Tail, then write Block Offset and Sequence, or defer the write.
* ``observe`` -- read Head locally to learn about tickets that DIRECT_ALLOC initiators
  took with their own FetchAdd (draft §6.6); each is timestamped for the Ticket Timeout.

Nothing here sleeps or waits: methods that make tickets ready return them, and the target
core resumes whoever waits for them.  All state besides memory is plain containers, so
:meth:`FreeRing.clone` can copy it for state-space exploration.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum

from kbtp.constants import (
    SLOT_LEN,
    TICKET_MASK,
    TICKET_MODULUS,
    CounterFormat,
    counter_operands,
    counter_ticket,
)
from kbtp.layout import (
    ByteOrder,
    RingGeometry,
    Slot,
    consume_slot,
    init_ring,
    read_counter,
    read_slot,
    write_counter,
    write_slot,
)
from stack.errors import LocalError
from stack.wire.atomics import fetch_add as masked_fetch_add

FetchAdd = Callable[[memoryview, int, int, int], int]
"""The target's atomic engine: (memory, byte offset, Add Data, Add Mask) -> original value.

It must be atomic with respect to the FetchAdds that initiators send over the wire
(RFC 7306 §5.3: atomicity is guaranteed among atomics of the same RNIC), so a binding to a
real RNIC routes it through that RNIC's atomic engine.
"""


def make_local_fetch_add(byteorder: ByteOrder = "little") -> FetchAdd:
    """A pure FetchAdd on memory with the masked-add semantics of RFC 7306 §5.1."""

    def fetch_add(mem: memoryview, offset: int, add: int, mask: int) -> int:
        original = read_counter(mem, offset, byteorder)
        write_counter(mem, offset, masked_fetch_add(original, add, mask), byteorder)
        return original

    return fetch_add


class CounterCorrupt(LocalError):
    """A ring counter holds a value no FetchAdd of its counter format (draft §3.3, §9.2)
    can produce.

    Only a DIRECT_ALLOC initiator's own atomics on its Head can cause it (its Head STag is
    remote atomic, docs/kbtp.md §3.6); the core closes that session (docs/kbtp.md §6.7).
    """


def ticket_distance(later: int, earlier: int) -> int:
    """``later - earlier`` in 32-bit ticket arithmetic (tickets wrap modulo 2**32)."""
    return (later - earlier) % TICKET_MODULUS


class TicketOwner(Enum):
    """Who took a ticket: the target itself (ALLOC_STORE) or an initiator (DIRECT_ALLOC)."""

    TARGET = "target"
    DIRECT = "direct"


@dataclass(slots=True)
class Outstanding:
    """A ticket taken and not yet consumed.  Fields: owner, seen (time first known), abandoned."""

    owner: TicketOwner
    seen: float
    abandoned: bool = False


@dataclass(frozen=True, slots=True)
class FreeOutcome:
    """Result of :meth:`FreeRing.free`.  Fields: ticket (u), deferred, ready (tickets now ready)."""

    ticket: int
    deferred: bool
    ready: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class RingRecord:
    """One request a target's RNIC ran on a ring (docs/kbtp.md §8.1): an ALLOC_STORE
    (``freed`` False: ticket of Head, the block it took, the handle bound) or a FREE
    (ticket of Tail, the block returned, the handle unbound)."""

    freed: bool
    ticket: int
    block: int
    handle: int


class FreeRing:
    """One free-block ring in target memory (draft §3.3) and the target's view of its tickets.

    Fields: ``geometry``; ``clear_on_free`` (blocks freed into this ring may next go to
    another trust domain, so the core clears them, draft §6.4); ``outstanding`` (ticket ->
    :class:`Outstanding`); ``abandoned`` (tickets declared abandoned, for TICKET_ABANDONED);
    ``deferred`` (slot number -> [(ticket, block offset)] writes waiting for the slot to be
    consumed); ``observed_head`` (the next ticket the target has not accounted for);
    ``counter_format`` (how Head and Tail encode tickets, set by :meth:`initialize`).
    """

    def __init__(
        self,
        mem: memoryview,
        geometry: RingGeometry,
        fetch_add: FetchAdd,
        *,
        clear_on_free: bool = False,
    ) -> None:
        self.mem = mem
        self.geometry = geometry
        self.fetch_add = fetch_add
        self.clear_on_free = clear_on_free
        self.outstanding: dict[int, Outstanding] = {}
        self.abandoned: set[int] = set()
        self.deferred: dict[int, list[tuple[int, int]]] = {}
        self.observed_head = 0
        self.counter_format = CounterFormat.MASKED

    # -- memory -------------------------------------------------------------------------
    def initialize(
        self,
        blocks: list[int],
        counter_format: CounterFormat | None = None,
        first_ticket: int = 0,
    ) -> None:
        """Write the initial slots and counters (draft §3.3) in ``counter_format`` (None:
        the ring's current one) from ``first_ticket`` on, and forget all bookkeeping."""
        if counter_format is not None:
            self.counter_format = counter_format
        init_ring(self.mem, self.geometry, blocks, self.counter_format, first_ticket)
        self.outstanding.clear()
        self.abandoned.clear()
        self.deferred.clear()
        self.observed_head = first_ticket & TICKET_MASK

    def _unpack(self, value: int) -> tuple[int, int]:
        """(Ticket, Slot Offset) a counter value names, in the ring's format, unchecked."""
        ticket, slot_offset = self.geometry.unpack_counter(value)
        if self.counter_format is CounterFormat.UNMASKED:
            slot_offset = self.geometry.slot_offset(ticket)
        return ticket, slot_offset

    def head(self) -> tuple[int, int]:
        """(Ticket, Slot Offset) of Head, read locally (no FetchAdd)."""
        g = self.geometry
        return self._unpack(read_counter(self.mem, g.head_offset, g.byteorder))

    def tail(self) -> tuple[int, int]:
        g = self.geometry
        return self._unpack(read_counter(self.mem, g.tail_offset, g.byteorder))

    def slot_byte_offset(self, ticket: int) -> int:
        return self.geometry.slots_offset + self.geometry.slot_offset(ticket)

    def slot(self, ticket: int) -> Slot:
        """The slot that ``ticket`` reads."""
        return read_slot(self.mem, self.slot_byte_offset(ticket))

    def ready_block(self, ticket: int) -> int | None:
        """Block Offset for ``ticket`` if its slot holds it (Sequence = ticket, not consumed)."""
        slot = self.slot(ticket)
        return slot.block_offset if slot.holds(ticket) else None

    def _checked(self, name: str, value: int) -> tuple[int, int]:
        """(Ticket, Slot Offset) of a counter value; :class:`CounterCorrupt` unless the value
        is one the FetchAdds of the ring's format make (masked, §3.3: Slot Offset = 16 *
        (Ticket mod N), other bits zero; unmasked, §9.2: the low 32 bits zero)."""
        g = self.geometry
        ticket = counter_ticket(value, g.order, self.counter_format)
        if ticket is None:
            raise CounterCorrupt(
                f"{name} corrupt: 0x{value:016x} is no counter of a ring of {g.slots} slots "
                f"({self.counter_format.value} format)"
            )
        return ticket, g.slot_offset(ticket)

    def _fetch_add(self, counter_offset: int) -> tuple[int, int]:
        g = self.geometry
        add, mask = counter_operands(self.counter_format, g.order)
        original = self.fetch_add(self.mem, counter_offset, add, mask)
        name = "Head" if counter_offset == g.head_offset else "Tail"
        return self._checked(name, original)

    # -- allocation ---------------------------------------------------------------------
    def observe(self, now: float, limit: int | None = None) -> int:
        """Account for tickets taken by DIRECT_ALLOC FetchAdds since the last look at Head.

        Returns how many new tickets were found.  When that exceeds ``limit`` (default N:
        no more tickets can be outstanding, N >= F) the tickets are not recorded one by one
        (the caller closes the session and reinitializes); a Head moved backwards counts as
        nearly 2**32 new tickets.  Raises :class:`CounterCorrupt` if Head holds no counter.
        """
        g = self.geometry
        head, _ = self._checked("Head", read_counter(self.mem, g.head_offset, g.byteorder))
        count = ticket_distance(head, self.observed_head)
        if count > (g.slots if limit is None else limit):
            return count
        t = self.observed_head
        for _ in range(count):
            if t not in self.outstanding:
                self.outstanding[t] = Outstanding(TicketOwner.DIRECT, now)
            t = (t + 1) & TICKET_MASK
        self.observed_head = head
        return count

    def take(self, now: float, limit: int | None = None) -> int:
        """Target-executed allocation step 1: FetchAdd on Head; returns the ticket (§3.3).

        Tickets an initiator took since the last look at Head are recorded as direct ones;
        more than ``limit`` (default N) of them, a Head moved backwards, or a Head that
        holds no counter value raises :class:`CounterCorrupt`.
        """
        limit = self.geometry.slots if limit is None else limit
        if self.observe(now, limit) > limit:
            raise CounterCorrupt(f"Head moved by more than {limit} tickets")
        ticket, _ = self._fetch_add(self.geometry.head_offset)
        # Tickets an initiator took between observe() and this FetchAdd are direct ones.
        raced = ticket_distance(ticket, self.observed_head)
        if raced > limit:
            raise CounterCorrupt(f"Head moved by {raced} tickets during an allocation")
        t = self.observed_head
        for _ in range(raced):
            self.outstanding.setdefault(t, Outstanding(TicketOwner.DIRECT, now))
            t = (t + 1) & TICKET_MASK
        self.outstanding[ticket] = Outstanding(TicketOwner.TARGET, now)
        self.observed_head = (ticket + 1) & TICKET_MASK
        return ticket

    def consume(self, ticket: int) -> tuple[int, tuple[int, ...]]:
        """Mark ``ticket``'s slot consumed; returns (its block, tickets made ready).

        A free deferred on this slot is written now (Block Offset, then Sequence), which
        makes that free's ticket ready.
        """
        block = self.ready_block(ticket)
        if block is None:
            raise LocalError(f"ticket {ticket} consumed before its slot holds it")
        consume_slot(self.mem, self.slot_byte_offset(ticket))
        return block, self._consumed(ticket)

    def consumed_by_rnic(self, ticket: int, now: float) -> tuple[int, ...]:
        """``ticket`` was taken and its slot consumed by the target's RNIC, an offloaded
        allocation (docs/kbtp.md §8.1); returns the tickets made ready.

        Tickets before it not yet accounted for are direct ones; a free deferred on its
        slot is written now, as :meth:`consume` does.
        """
        t = self.observed_head
        if ticket_distance(ticket, t) < self.geometry.slots:
            while t != ticket:
                self.outstanding.setdefault(t, Outstanding(TicketOwner.DIRECT, now))
                t = (t + 1) & TICKET_MASK
            self.observed_head = (ticket + 1) & TICKET_MASK
        return self._consumed(ticket)

    def _consumed(self, ticket: int) -> tuple[int, ...]:
        at = self.slot_byte_offset(ticket)
        self.outstanding.pop(ticket, None)
        ready: tuple[int, ...] = ()
        index = ticket % self.geometry.slots
        queue = self.deferred.get(index)
        if queue:
            later, later_block = queue.pop(0)
            if not queue:
                del self.deferred[index]
            write_slot(self.mem, at, later, later_block)
            ready = (later,)
        return ready

    # -- free ---------------------------------------------------------------------------
    def free(self, block_offset: int) -> FreeOutcome:
        """Return a block (draft §3.3 "Free"): FetchAdd on Tail, then write or defer.

        The caller has already made the table entry update visible (draft §6.4 step 3).
        """
        ticket, slot_offset = self._fetch_add(self.geometry.tail_offset)
        at = self.geometry.slots_offset + slot_offset
        index = slot_offset // SLOT_LEN
        if read_slot(self.mem, at).consumed and index not in self.deferred:
            write_slot(self.mem, at, ticket, block_offset)
            return FreeOutcome(ticket, False, (ticket,))
        self.deferred.setdefault(index, []).append((ticket, block_offset))
        return FreeOutcome(ticket, True, ())

    # -- Ticket Timeout -----------------------------------------------------------------
    def direct_outstanding(self) -> int:
        """Tickets taken by the initiator and not yet bound or reclaimed (its usage share)."""
        return sum(1 for o in self.outstanding.values() if o.owner is TicketOwner.DIRECT)

    def expired(self, now: float, timeout: float) -> list[int]:
        """Direct tickets not yet abandoned whose Ticket Timeout has run out."""
        return sorted(
            t
            for t, o in self.outstanding.items()
            if o.owner is TicketOwner.DIRECT and not o.abandoned and now - o.seen > timeout
        )

    def abandon(self, ticket: int) -> None:
        """Declare ``ticket`` abandoned: a later BIND for it gets TICKET_ABANDONED (§3.4)."""
        self.outstanding[ticket].abandoned = True
        self.abandoned.add(ticket)

    def next_expiry(self, timeout: float) -> float | None:
        times = [
            o.seen + timeout
            for o in self.outstanding.values()
            if o.owner is TicketOwner.DIRECT and not o.abandoned
        ]
        return min(times) if times else None

    # -- inspection ---------------------------------------------------------------------
    def available_blocks(self) -> list[int]:
        """Block Offsets in unconsumed slots plus deferred writes (the ring's free blocks)."""
        blocks = []
        for s in range(self.geometry.slots):
            slot = read_slot(self.mem, self.geometry.slots_offset + s * SLOT_LEN)
            if not slot.consumed:
                blocks.append(slot.block_offset)
        for queue in self.deferred.values():
            blocks.extend(block for _, block in queue)
        return blocks

    def clone(self, mem: memoryview) -> FreeRing:
        """A copy of this ring's bookkeeping bound to ``mem`` (a copy of the memory)."""
        new = FreeRing(mem, self.geometry, self.fetch_add, clear_on_free=self.clear_on_free)
        new.outstanding = {
            t: Outstanding(o.owner, o.seen, o.abandoned) for t, o in self.outstanding.items()
        }
        new.abandoned = set(self.abandoned)
        new.deferred = {k: list(v) for k, v in self.deferred.items()}
        new.observed_head = self.observed_head
        new.counter_format = self.counter_format
        return new

    def state_key(self, now: float, timeout: float) -> tuple[object, ...]:
        """Hashable summary of the bookkeeping; times reduced to "expired or not"."""
        return (
            self.counter_format.value,
            self.observed_head,
            tuple(
                sorted(
                    (t, o.owner.value, o.abandoned, now - o.seen > timeout)
                    for t, o in self.outstanding.items()
                )
            ),
            tuple(sorted(self.abandoned)),
            tuple(sorted((k, tuple(v)) for k, v in self.deferred.items())),
        )
