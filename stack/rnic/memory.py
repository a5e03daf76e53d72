"""Protection domains, memory regions and the STag table (RFC 5040 §8, RFC 5042 §6).

A :class:`MemoryRegion` registers any writable Python buffer (bytearray, memoryview,
mmap, numpy array).  Registration pins the buffer the way the kernel pins pages: the
region holds an exported view, so a bytearray cannot be resized while registered.

STags follow Linux siw's shape: a 24-bit index shifted left by 8, OR an 8-bit key.  Both
parts are unpredictable (SEC-08): the index is a free one drawn at random from the whole
space by a cryptographic RNG, and an index that comes back gets a key different from its
last one, so a just-freed STag is never handed out again as it was.
"""

from __future__ import annotations

import ctypes
import secrets
import struct
import weakref
from dataclasses import dataclass
from enum import IntFlag
from typing import Any

from stack.constants import (
    ATOMIC_ALIGNMENT,
    TERM_DDP_T_BASE_BOUNDS,
    TERM_DDP_T_INVALID_STAG,
    TERM_DDP_T_STAG_NOT_ASSOCIATED,
    TERM_DDP_T_TO_WRAP,
    TERM_RDMAP_ACCESS_RIGHTS,
    TERM_RDMAP_BASE_BOUNDS,
    TERM_RDMAP_CATASTROPHIC_STREAM,
    TERM_RDMAP_INVALID_STAG,
    TERM_RDMAP_STAG_NOT_ASSOCIATED,
    TERM_RDMAP_TO_WRAP,
    TermCode,
)
from stack.errors import DdpError, LocalError, ProtocolError, RdmapError
from stack.wire.atomics import apply_atomic
from stack.wire.events import AtomicRequest

U64 = 1 << 64
_INDEX_SPACE = 1 << 24  # STag indices are 24 bits (RFC 5040 §8.1.1(8) asks for them unguessable)
_LE64 = struct.Struct("<Q")


class Access(IntFlag):
    """Memory-region access flags (names as in ``ibv_access_flags``)."""

    LOCAL_WRITE = 0x1
    REMOTE_WRITE = 0x2
    REMOTE_READ = 0x4
    REMOTE_ATOMIC = 0x8
    ZERO_BASED = 0x20


class ProtectionDomain:
    """A protection domain: QPs use only STags of their own PD (SEC-01)."""

    _next_handle = 1

    def __init__(self, table: StagTable) -> None:
        self.table = table
        self.handle = ProtectionDomain._next_handle
        ProtectionDomain._next_handle += 1
        self.streams: weakref.WeakSet[object] = weakref.WeakSet()
        """The QPs (streams) of this PD: an STag of a PD shared by several streams may not be
        invalidated remotely (SEC-07)."""

    def reg_mr(
        self, buffer: Any, access: Access = Access.LOCAL_WRITE, *, qp: object | None = None
    ) -> MemoryRegion:
        """Register ``buffer`` (``ibv_reg_mr``).

        ``qp``: associate the STag with that one stream instead of the whole PD (RFC 5041
        §8.2 stream-based association, DDP-12): any other stream of the PD, and any other
        PD, meets "STag not associated" (SEC-02).
        """
        return MemoryRegion(self, buffer, access, stream=qp)

    def __repr__(self) -> str:
        return f"<ProtectionDomain {self.handle}>"


def _buffer_address(view: memoryview) -> int:
    """The buffer's real virtual address, so VA-based TOs look like real verbs addresses."""
    try:
        return ctypes.addressof(ctypes.c_char.from_buffer(view))
    except (TypeError, ValueError):  # pragma: no cover - exotic buffers
        return 0x10000000


class MemoryRegion:
    """A registered buffer with an STag (``lkey`` == ``rkey``; iWARP has one STag per MR).

    ``addr`` is the buffer's virtual address; tagged offsets are VA-based (TO = addr +
    offset) unless registered with :attr:`Access.ZERO_BASED` (TO = offset).
    """

    def __init__(
        self, pd: ProtectionDomain, buffer: Any, access: Access, *, stream: object | None = None
    ) -> None:
        try:
            view = memoryview(buffer)
        except TypeError as exc:
            raise LocalError(f"cannot register {type(buffer).__name__}: not a buffer") from exc
        if view.readonly:
            raise LocalError("cannot register a read-only buffer")
        if not view.c_contiguous:
            raise LocalError("cannot register a non-contiguous buffer")
        self.buf = view.cast("B") if view.format != "B" or view.ndim != 1 else view
        self.pd = pd
        self.stream = stream
        """The one stream (QP) the STag is associated with, or None: every stream of the PD."""
        self.access = Access(access)
        self.access_bits = int(access)  # plain int for the per-segment checks
        self.length = len(self.buf)
        self.addr = _buffer_address(self.buf) if self.length else 0
        self.base = 0 if self.access & Access.ZERO_BASED else self.addr
        self.valid = True
        self.stag = pd.table.register(self)

    @property
    def lkey(self) -> int:
        return self.stag

    @property
    def rkey(self) -> int:
        return self.stag

    def invalidate(self) -> None:
        """Local invalidation: the STag stops working, the registration stays (SEC-06)."""
        self.valid = False

    def dereg(self) -> None:
        """Deregister (``ibv_dereg_mr``): the STag is gone and the buffer is released."""
        self.valid = False
        self.pd.table.unregister(self)
        try:
            self.buf.release()
        except BufferError:  # a queued message still views it; the GC will unpin it
            pass

    def atomic(self, req: AtomicRequest) -> int:
        """Execute an RFC 7306 atomic on the 8 bytes at ``req.to``; returns the original value.

        The caller has validated STag, rights and bounds.  The word is in the target's memory
        byte order (little-endian here, RFC 7306 §5.1).  Every atomic of an RNIC, remote or
        local, runs through this single-threaded code, so atomics are atomic with respect to
        each other (EXT-07).  A misaligned address is refused before anything changes (EXT-05).
        """
        if (self.addr + req.to - self.base) % ATOMIC_ALIGNMENT:
            raise RdmapError(
                "EXT-05",
                f"atomic target TO 0x{req.to:x} is not 8-byte aligned",
                TERM_RDMAP_CATASTROPHIC_STREAM,
            )
        view = self.view(req.to, 8)
        original: int = _LE64.unpack(view)[0]
        view[:] = _LE64.pack(apply_atomic(req, original))
        return original

    def view(self, to: int, length: int) -> memoryview:
        """The bytes at tagged offset ``to`` (caller has validated the range)."""
        start = to - self.base
        return self.buf[start : start + length]

    def __repr__(self) -> str:
        return f"<MemoryRegion stag=0x{self.stag:08x} len={self.length} access={self.access!r}>"


class StagTable:
    """STag allocation and lookup for one RNIC (lookups are one dict access)."""

    def __init__(self) -> None:
        self._keys: dict[int, int] = {}  # index -> the key it was last handed out with
        self._regions: dict[int, MemoryRegion] = {}
        self._in_use: set[int] = set()

    def register(self, mr: MemoryRegion) -> int:
        """Give ``mr`` a fresh STag (SEC-08): a random free index and a random key, one that
        differs from the key the index last had."""
        index = self._random_free_index()
        last = self._keys.get(index)
        key = secrets.randbelow(256) if last is None else (last + 1 + secrets.randbelow(255)) & 0xFF
        self._keys[index] = key
        self._in_use.add(index)
        stag = (index << 8) | key
        self._regions[stag] = mr
        return stag

    def _random_free_index(self) -> int:
        """A uniformly drawn index in 1..2^24-1 not in use (index 0 is never handed out)."""
        for _ in range(64):  # a table at most half full misses 64 times in 2^-64 of draws
            index = 1 + secrets.randbelow(_INDEX_SPACE - 1)
            if index not in self._in_use:
                return index
        free = _INDEX_SPACE - 1 - len(self._in_use)
        if free <= 0:
            raise LocalError("STag space exhausted")
        nth = secrets.randbelow(free)  # a crowded table: the nth free index, still uniform
        for index in range(1, _INDEX_SPACE):
            if index not in self._in_use:
                if nth == 0:
                    return index
                nth -= 1
        raise LocalError("STag space exhausted")  # pragma: no cover - counted above

    def unregister(self, mr: MemoryRegion) -> None:
        if self._regions.pop(mr.stag, None) is not None:
            self._in_use.discard(mr.stag >> 8)

    def lookup(self, stag: int) -> MemoryRegion | None:
        return self._regions.get(stag)

    def __len__(self) -> int:
        return len(self._regions)


@dataclass(frozen=True, slots=True)
class _Codes:
    invalid: TermCode
    not_associated: TermCode
    rights: TermCode
    bounds: TermCode
    wrap: TermCode
    error: type[ProtocolError]
    rule: str


DDP_TAGGED_CODES = _Codes(
    TERM_DDP_T_INVALID_STAG,
    TERM_DDP_T_STAG_NOT_ASSOCIATED,
    TERM_DDP_T_INVALID_STAG,  # DDP has no access-rights code; siw uses invalid STag
    TERM_DDP_T_BASE_BOUNDS,
    TERM_DDP_T_TO_WRAP,
    DdpError,
    "DDP-10",
)
RDMAP_REMOTE_CODES = _Codes(
    TERM_RDMAP_INVALID_STAG,
    TERM_RDMAP_STAG_NOT_ASSOCIATED,
    TERM_RDMAP_ACCESS_RIGHTS,
    TERM_RDMAP_BASE_BOUNDS,
    TERM_RDMAP_TO_WRAP,
    RdmapError,
    "RDMAP-16",
)


def check_remote_access(
    table: StagTable,
    pd: ProtectionDomain,
    stag: int,
    to: int,
    length: int,
    right: int,
    codes: _Codes,
    stream: object | None = None,
) -> memoryview:
    """Validate an inbound tagged access in the order of RFC 5042 §6 and RFC 5040 §7.2 (valid,
    PD, rights, wrap, bounds) and return the bytes.

    Order: STag valid and key matches; bound to this stream's PD (SEC-01) and, for a
    stream-scoped STag, to this stream (``stream``, DDP-12, SEC-02); access right;
    64-bit TO wrap (checked before bounds so the specific code is reachable with Python's
    unbounded integers); base and bounds, byte granular (SEC-04).  Raises the
    :class:`ProtocolError` with the Terminate cause for the failing check.
    """
    mr = table.lookup(stag)
    if mr is None or not mr.valid:
        raise codes.error(codes.rule, f"STag 0x{stag:08x} is not valid", codes.invalid)
    if mr.pd is not pd:
        raise codes.error(
            "SEC-01", f"STag 0x{stag:08x} belongs to another PD", codes.not_associated
        )
    if mr.stream is not None and mr.stream is not stream:
        raise codes.error(
            "SEC-02", f"STag 0x{stag:08x} is bound to another stream", codes.not_associated
        )
    if not mr.access_bits & right:
        name = Access(right).name
        raise codes.error("SEC-12", f"STag 0x{stag:08x} lacks {name} access", codes.rights)
    if to + length > U64:
        raise codes.error(codes.rule, f"TO 0x{to:x} + {length} wraps 64 bits", codes.wrap)
    if to < mr.base or to + length > mr.base + mr.length:
        raise codes.error(
            "SEC-04",
            f"TO 0x{to:x}+{length} outside STag 0x{stag:08x} "
            f"[0x{mr.base:x}, 0x{mr.base + mr.length:x})",
            codes.bounds,
        )
    return mr.view(to, length)
