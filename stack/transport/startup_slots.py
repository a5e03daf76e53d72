"""The MPA startup slots of a listener, shared fairly between peer addresses (MPA-23).

A listener holds at most ``total`` connections in MPA startup at once, and at most
``per_peer`` from one address.  When every slot is taken, a connection from an address
that holds fewer slots than the busiest one takes the busiest address's oldest slot that is
still in startup (its connection is closed): a silent half-open flood from a few addresses
then delays good clients from other addresses by nothing, instead of locking them out for
the startup timeout.  The busiest address itself is refused, so a flood cannot churn its own
slots.  An address at its own bound (``per_peer``) is refused too, unless its oldest slot
still without a Request is stale: that one goes to the new connection (an initiator sends
its Request at once, MPA-23), so a client behind the same address as silent leftovers waits
``stale_after`` at most, not the startup timeout.  Pure accounting, no I/O: the listener
closes whatever :meth:`StartupSlots.admit` evicts.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["STARTUP_STALE_AFTER", "StartupSlot", "StartupSlots"]

STARTUP_STALE_AFTER = 1.0
"""Seconds after which a connection without a complete MPA Request may lose its slot to a
new one when every slot is taken (MPA-23: the initiator sends the Request at once)."""


@dataclass(eq=False, slots=True)
class StartupSlot:
    """One connection's slot: ``evict`` ends its startup; ``evictable`` until the MPA
    request has arrived (a complete request waits for the ULP and is never taken)."""

    host: str
    evict: Callable[[], None]
    since: float = 0.0
    evictable: bool = True
    released: bool = False


class StartupSlots:
    """Admission and release of startup slots by peer address."""

    def __init__(self, total: int, per_peer: int, stale_after: float = STARTUP_STALE_AFTER) -> None:
        self.total = total
        self.per_peer = per_peer
        self.stale_after = stale_after
        self._by_host: dict[str, deque[StartupSlot]] = {}
        self._count = 0
        self.evicted = 0
        """Slots taken from the busiest address for another one."""
        self.evicted_stale = 0
        """Slots taken because they were stale: every address holding about as many, or the
        new connection's address at its bound."""

    def __len__(self) -> int:
        return self._count

    def counts(self) -> dict[str, int]:
        """Slots held per address."""
        return {host: len(slots) for host, slots in self._by_host.items()}

    def admit(self, host: str, evict: Callable[[], None], now: float = 0.0) -> StartupSlot | None:
        """A slot for a new connection from ``host`` at time ``now``, or None (refused).
        When the slots are all taken, the busiest address's oldest evictable slot is
        released and its ``evict`` called, if that address holds at least two more slots
        than ``host``; failing that, the oldest evictable slot at least ``stale_after``
        seconds old, if ``host`` is not the busiest address.  A ``host`` at ``per_peer``
        slots gets its own oldest evictable slot if that one is stale."""
        held = len(self._by_host.get(host, ()))
        if held >= self.per_peer and not self._evict_own_stale(host, now):
            return None
        if self._count >= self.total and not (
            self._evict_for(held) or self._evict_stale(held, now)
        ):
            return None
        slot = StartupSlot(host, evict, now)
        self._by_host.setdefault(host, deque()).append(slot)
        self._count += 1
        return slot

    def release(self, slot: StartupSlot) -> None:
        """The connection's startup ended (or it was evicted); a second release is a no-op."""
        if slot.released:
            return
        slot.released = True
        slots = self._by_host[slot.host]
        slots.remove(slot)
        if not slots:
            del self._by_host[slot.host]
        self._count -= 1

    def _evict_for(self, held: int) -> bool:
        busiest = max(self._by_host.values(), key=len, default=None)
        if busiest is None or len(busiest) < held + 2:
            return False
        victim = next((slot for slot in busiest if slot.evictable), None)
        if victim is None:
            return False
        self.evicted += 1
        self._take(victim)
        return True

    def _evict_stale(self, held: int, now: float) -> bool:
        if held and held >= max(len(slots) for slots in self._by_host.values()):
            return False  # the busiest address does not churn its own slots
        cutoff = now - self.stale_after
        oldest = min(
            (slot for slots in self._by_host.values() for slot in slots if slot.evictable),
            key=lambda slot: slot.since,
            default=None,
        )
        if oldest is None or oldest.since > cutoff:
            return False
        self.evicted_stale += 1
        self._take(oldest)
        return True

    def _evict_own_stale(self, host: str, now: float) -> bool:
        """``host``'s oldest evictable slot (its deque is in admission order), if stale."""
        oldest = next((slot for slot in self._by_host.get(host, ()) if slot.evictable), None)
        if oldest is None or oldest.since > now - self.stale_after:
            return False
        self.evicted_stale += 1
        self._take(oldest)
        return True

    def _take(self, slot: StartupSlot) -> None:
        """Release ``slot`` for another connection and end its startup."""
        self.release(slot)
        slot.evict()
