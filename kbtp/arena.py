"""An arena: application memory registered once, in which KBTP blocks are named by
(offset, length) (docs/kbtp.md §13.1).

A per-request registration (what :meth:`~kbtp.initiator.KbtpInitiator.load_into` does) costs
a registration and a deregistration per block; an inference server instead registers its
KV-cache memory once and moves blocks in and out of it.  :class:`Arena` is that memory: any
writable, contiguous buffer (a ``bytearray``, a ``memoryview``, an ``mmap``, a numpy array:
anything with the buffer protocol) registered in place with the session's protection domain
for local writes, remote writes (a LOAD's RDMA Write lands in it) and remote reads (a STORE's
RDMA Read takes from it).  Requests name a span of it with a Data Descriptor: the arena's
STag and the span's Tagged Offset (docs/kbtp.md §5.2).
"""

from __future__ import annotations

from typing import Any

from kbtp.messages import DataDescriptor
from stack.errors import LocalError
from stack.rnic import Access, MemoryRegion, ProtectionDomain

__all__ = ["ARENA_ACCESS", "Arena", "ArenaError"]

ARENA_ACCESS = Access.LOCAL_WRITE | Access.REMOTE_WRITE | Access.REMOTE_READ
"""An arena's rights: LOADs write into it, STOREs read from it (docs/kbtp.md §6.1, §6.2)."""


class ArenaError(LocalError, ValueError):
    """A block does not fit its arena or the session (raised before anything is sent)."""


class Arena:
    """A buffer registered once (one memory region) for the loads and stores of a session.

    ``size`` is its length in octets, ``mr`` its memory region, ``view`` a flat byte view of
    the application's buffer (the same memory: what a LOAD places is visible in the caller's
    array).  Build one with :meth:`register` (or a client's ``register``); :meth:`close`
    deregisters it once no batch uses it.
    """

    def __init__(self, mr: MemoryRegion) -> None:
        self.mr = mr
        self.view: memoryview = mr.buf
        self.size = len(mr.buf)
        self.busy = 0
        """Batches in flight that name this arena (it refuses to close while any is)."""

    @classmethod
    def register(cls, pd: ProtectionDomain, buffer: Any) -> Arena:
        """Register ``buffer`` with ``pd`` (the session's protection domain) as an arena.

        Raises :class:`~stack.errors.LocalError` for a read-only, non-contiguous or
        non-buffer object, :class:`ArenaError` for an empty one.
        """
        try:
            size = memoryview(buffer).nbytes
        except TypeError as exc:
            raise ArenaError(f"an arena needs a buffer, not {type(buffer).__name__}") from exc
        if size == 0:
            raise ArenaError("an arena needs at least one octet")
        return cls(pd.reg_mr(buffer, ARENA_ACCESS))

    @property
    def closed(self) -> bool:
        return not self.mr.valid

    def check(self, offset: int, length: int, block_size: int, what: str) -> None:
        """Refuse a span that is not inside the arena or is longer than a block."""
        if self.closed:
            raise ArenaError(f"{what}: the arena is closed")
        for name, value in (("offset", offset), ("length", length)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ArenaError(f"{what}: {name} must be a non-negative integer, not {value!r}")
        if offset + length > self.size:
            raise ArenaError(
                f"{what}: octets {offset}..{offset + length} are outside the arena "
                f"of {self.size} octets"
            )
        if length > block_size:
            raise ArenaError(f"{what}: {length} octets exceed the Block Size of {block_size}")

    def descriptor(self, offset: int, length: int) -> DataDescriptor:
        """The Data Descriptor of ``length`` octets at ``offset`` (checked by :meth:`check`)."""
        return DataDescriptor(self.mr.rkey, self.mr.iova + offset, length)

    def span(self, offset: int, length: int) -> memoryview:
        """The arena's ``length`` octets at ``offset``, in place."""
        return self.view[offset : offset + length]

    def close(self) -> None:
        """Deregister (idempotent); :class:`ArenaError` while a batch still uses the arena."""
        if self.busy:
            raise ArenaError(f"the arena is in use by {self.busy} batch(es) in flight")
        if not self.closed:
            self.mr.dereg()

    def __len__(self) -> int:
        return self.size

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"STag 0x{self.mr.rkey:08x}"
        return f"<Arena {self.size} octets, {state}>"
