"""Protection domains, memory regions and the STag table (RFC 5040 §8, RFC 5042 §6).

A :class:`MemoryRegion` registers any writable Python buffer (bytearray, memoryview,
mmap, numpy array).  Registration pins the buffer the way the kernel pins pages: the
region holds an exported view, so a bytearray cannot be resized while registered.

An STag names a :class:`StagTarget`: a memory region, or a memory window
(:mod:`stack.rnic.windows`).  ``reg_mr`` regions are valid at once and not remotely
invalidatable; ``alloc_mr`` regions start invalid and are made valid by a ``REG_MR`` work
request (fast registration, SEC-05), invalidated by ``LOCAL_INV``, a Send with Invalidate
(RDMAP-09) or a Read with Invalidate, and registered again with a new key.

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
from typing import TYPE_CHECKING, Any

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
    TERM_RDMAP_PROT_CANNOT_INVALIDATE,
    TERM_RDMAP_STAG_NOT_ASSOCIATED,
    TERM_RDMAP_TO_WRAP,
    TermCode,
)
from stack.errors import DdpError, LocalError, ProtocolError, RdmapError
from stack.rnic.verbs import WcStatus
from stack.wire.atomics import apply_atomic
from stack.wire.events import AtomicRequest

if TYPE_CHECKING:
    from stack.rnic.windows import MemoryWindow

U64 = 1 << 64
_INDEX_SPACE = 1 << 24  # STag indices are 24 bits (RFC 5040 §8.1.1(8) asks for them unguessable)
_LE64 = struct.Struct("<Q")


class Access(IntFlag):
    """Memory-region access flags (names as in ``ibv_access_flags``)."""

    LOCAL_WRITE = 0x1
    REMOTE_WRITE = 0x2
    REMOTE_READ = 0x4
    REMOTE_ATOMIC = 0x8
    MW_BIND = 0x10
    ZERO_BASED = 0x20


REMOTE_ACCESS = Access.REMOTE_WRITE | Access.REMOTE_READ | Access.REMOTE_ATOMIC
"""The rights an inbound tagged access needs (the ones a memory window can grant)."""


class MemoryOpError(LocalError):
    """A memory-management work request failed (bind, fast registration, invalidation);
    ``status`` is its completion status (``MW_BIND_ERR``: "memory management operation
    error", or ``LOC_PROT_ERR`` for an STag the QP's PD does not have)."""

    def __init__(self, status: WcStatus, message: str) -> None:
        super().__init__(message)
        self.status = status


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

    def alloc_mr(self, max_len: int, *, qp: object | None = None) -> MemoryRegion:
        """Allocate a fast-registration MR (the kernel's ``ib_alloc_mr``): an STag reserved in
        the invalid state for up to ``max_len`` octets; a ``REG_MR`` work request gives it a
        buffer, rights and a new key (SEC-05).  Such an MR is remotely invalidatable."""
        if isinstance(max_len, bool) or not isinstance(max_len, int) or max_len < 0:
            raise LocalError(f"alloc_mr: max_len must be a non-negative integer, not {max_len!r}")
        return MemoryRegion(self, None, Access(0), stream=qp, max_len=max_len)

    def alloc_mw(self, type: int = 1) -> MemoryWindow:  # noqa: A002 - verbs' name
        """Allocate a memory window (``ibv_alloc_mw``) of ``type`` 1 or 2, unbound (invalid)."""
        from stack.rnic.windows import MemoryWindow

        return MemoryWindow(self, type)

    def __repr__(self) -> str:
        return f"<ProtectionDomain {self.handle}>"


def _registrable(buffer: Any) -> memoryview:
    """A flat byte view of a writable, contiguous buffer (pinned while the view lives)."""
    try:
        view = memoryview(buffer)
    except TypeError as exc:
        raise LocalError(f"cannot register {type(buffer).__name__}: not a buffer") from exc
    if view.readonly:
        raise LocalError("cannot register a read-only buffer")
    if not view.c_contiguous:
        raise LocalError("cannot register a non-contiguous buffer")
    return view.cast("B") if view.format != "B" or view.ndim != 1 else view


def _buffer_address(view: memoryview) -> int:
    """The buffer's real virtual address, so VA-based TOs look like real verbs addresses."""
    try:
        return ctypes.addressof(ctypes.c_char.from_buffer(view))
    except (TypeError, ValueError):  # pragma: no cover - exotic buffers
        return 0x10000000


class StagTarget:
    """What an STag names (RFC 5040 §2.1): a memory region or a memory window.

    The inbound checks (:func:`check_remote_access`) read ``pd``, ``stream`` (the one
    stream the STag is associated with, or None: every stream of the PD), ``valid``,
    ``access_bits``, ``base`` and ``length`` (the TO range); ``remote_invalidate`` says
    whether a Send with Invalidate may invalidate it (RDMAP-09), ``local_invalidate``
    whether ``LOCAL_INV`` may.  ``posted_rkey`` is the STag a posted, not yet executed bind
    or ``REG_MR`` gives it: as in verbs, ``rkey`` shows the new key from the moment the
    request is built.
    """

    kind = "STag"
    pd: ProtectionDomain
    stream: object | None
    valid: bool
    access_bits: int
    base: int
    length: int
    stag: int
    remote_invalidate = False
    local_invalidate = True
    posted_rkey: int | None = None

    @property
    def rkey(self) -> int:
        return self.stag if self.posted_rkey is None else self.posted_rkey

    def invalidate(self) -> None:
        """The STag stops working; what it names stays allocated (SEC-06)."""
        self.valid = False

    def view(self, to: int, length: int) -> memoryview:
        """The bytes at tagged offset ``to`` (caller has validated the range)."""
        raise NotImplementedError

    def atomic(self, req: AtomicRequest) -> int:
        """Execute an RFC 7306 atomic at ``req.to``; returns the original value."""
        raise NotImplementedError


class MemoryRegion(StagTarget):
    """A registered buffer with an STag (``lkey`` == ``rkey``; iWARP has one STag per MR).

    ``addr`` is the buffer's virtual address; tagged offsets are VA-based (TO = addr +
    offset) unless registered with :attr:`Access.ZERO_BASED` (TO = offset).  With
    ``max_len`` (``pd.alloc_mr``) the region is a fast-registration one: no buffer and
    invalid until a ``REG_MR`` work request (:meth:`fast_register`).
    """

    kind = "memory region"

    def __init__(
        self,
        pd: ProtectionDomain,
        buffer: Any,
        access: Access,
        *,
        stream: object | None = None,
        max_len: int | None = None,
    ) -> None:
        self.pd = pd
        self.stream = stream
        """The one stream (QP) the STag is associated with, or None: every stream of the PD."""
        self.max_len = max_len
        """Fast registration: the most octets a ``REG_MR`` may give it; None for ``reg_mr``."""
        self.posted_base: int | None = None
        self.remote_invalidate = max_len is not None
        self._attach(_registrable(buffer if max_len is None else bytearray(0)), access)
        self.valid = max_len is None
        self.stag = pd.table.register(self)

    def _attach(self, view: memoryview, access: Access) -> None:
        self.buf = view
        self.access = Access(access)
        self.access_bits = int(access)  # plain int for the per-segment checks
        self.length = len(self.buf)
        self.addr = _buffer_address(self.buf) if self.length else 0
        self.base = 0 if self.access & Access.ZERO_BASED else self.addr

    @property
    def lkey(self) -> int:
        return self.rkey

    @property
    def iova(self) -> int:
        """The TO of the region's first octet (the kernel's ``ib_mr.iova``): ``base``, or
        for a ``REG_MR`` built and not yet run, the ``base`` it gives (advertise this)."""
        return self.base if self.posted_base is None else self.posted_base

    def plan(self, buffer: Any, access: Access, key: int) -> None:
        """Note a ``REG_MR`` being built (the kernel's ``ib_map_mr_sg`` and
        ``ib_update_fast_reg_key``): ``rkey`` and ``iova`` show what it gives from now on."""
        try:
            view = _registrable(buffer)
        except LocalError:
            return  # the REG_MR itself will be refused
        with view:
            addr = _buffer_address(view) if len(view) else 0
        self.posted_rkey = key
        self.posted_base = 0 if Access(access) & Access.ZERO_BASED else addr

    @property
    def fast_reg(self) -> bool:
        """Allocated with ``alloc_mr``: registered by ``REG_MR`` work requests."""
        return self.max_len is not None

    def fast_register(self, buffer: Any, access: Access, key: int) -> None:
        """Execute a ``REG_MR`` work request (SEC-05): the invalid fast-registration region
        gets ``buffer``, ``access`` and the STag ``key`` (same index, a new key, so the old
        STag stays refused: SEC-06).  Raises :class:`MemoryOpError` (``MW_BIND_ERR``)."""
        if self.max_len is None:
            raise MemoryOpError(
                WcStatus.MW_BIND_ERR, f"REG_MR of STag 0x{self.stag:08x}: not from alloc_mr"
            )
        if self.valid:
            raise MemoryOpError(
                WcStatus.MW_BIND_ERR,
                f"REG_MR of STag 0x{self.stag:08x}: still valid (invalidate it first)",
            )
        check_new_key(self, key, "REG_MR")
        try:
            view = _registrable(buffer)
        except LocalError as exc:
            raise MemoryOpError(WcStatus.MW_BIND_ERR, f"REG_MR: {exc}") from None
        if len(view) > self.max_len:
            size = len(view)
            view.release()
            raise MemoryOpError(
                WcStatus.MW_BIND_ERR,
                f"REG_MR: {size} octets exceed the region's max_len {self.max_len}",
            )
        self._release()
        self._attach(view, Access(access))
        self.pd.table.rekey(self, key)
        if self.posted_base == self.base:
            self.posted_base = None
        self.valid = True

    def _release(self) -> None:
        try:
            self.buf.release()
        except BufferError:  # a queued message still views it; the GC will unpin it
            pass

    def dereg(self) -> None:
        """Deregister (``ibv_dereg_mr``): the STag is gone and the buffer is released.

        Refused while a memory window is bound over the region (``EBUSY`` in verbs): the
        window would keep naming memory the application believes released (SEC-06)."""
        bound = self.pd.table.windows_bound_over(self)
        if bound:
            raise LocalError(
                f"MR 0x{self.stag:08x} has {bound} bound memory window(s): "
                "invalidate, unbind or deallocate them first"
            )
        self.valid = False
        self.pd.table.unregister(self)
        self._release()

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
        state = "" if self.valid else " invalid"
        stag, length, access = self.stag, self.length, self.access
        return f"<MemoryRegion stag=0x{stag:08x} len={length} access={access!r}{state}>"


def check_new_key(target: StagTarget, stag: int, what: str) -> None:
    """A bind or fast registration names the target's STag index with a new key (SEC-08:
    the consumer's key, as verbs' ``ibv_inc_rkey``), so the STag it had stops working."""
    if not 0 <= stag <= 0xFFFFFFFF or stag >> 8 != target.stag >> 8:
        raise MemoryOpError(
            WcStatus.MW_BIND_ERR,
            f"{what}: STag 0x{stag:08x} does not keep the index of 0x{target.stag:08x}",
        )
    if stag == target.stag:
        raise MemoryOpError(
            WcStatus.MW_BIND_ERR, f"{what}: STag 0x{stag:08x} needs a new key (inc_rkey)"
        )


class StagTable:
    """STag allocation and lookup for one RNIC (lookups are one dict access)."""

    def __init__(self) -> None:
        self._keys: dict[int, int] = {}  # index -> the key it was last handed out with
        self._regions: dict[int, StagTarget] = {}
        self._in_use: set[int] = set()

    def register(self, mr: StagTarget) -> int:
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

    def unregister(self, mr: StagTarget) -> None:
        if self._regions.pop(mr.stag, None) is not None:
            self._in_use.discard(mr.stag >> 8)

    def windows_bound_over(self, mr: MemoryRegion) -> int:
        """How many valid memory windows name a range of ``mr``."""
        return sum(1 for t in self._regions.values() if getattr(t, "mr", None) is mr and t.valid)

    def rekey(self, target: StagTarget, stag: int) -> None:
        """Name ``target`` by ``stag`` (its index, a new key): the old STag names nothing."""
        if self._regions.get(target.stag) is target:
            del self._regions[target.stag]
        self._keys[stag >> 8] = stag & 0xFF
        self._regions[stag] = target
        target.stag = stag
        if target.posted_rkey == stag:
            target.posted_rkey = None

    def lookup(self, stag: int) -> StagTarget | None:
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


def remote_invalidate(
    table: StagTable, pd: ProtectionDomain, stag: int, stream: object | None
) -> StagTarget:
    """Invalidate ``stag`` for a Send with Invalidate that arrived on ``stream`` (RFC 5040
    §5.3, RDMAP-09), or refuse it with Terminate 0/1/0x09 (STag cannot be invalidated).

    Refused: an STag several streams of the PD can use (SEC-07); one that is unknown,
    already invalid, of another PD or another stream (RDMAP-09); and one that is not
    remotely invalidatable (RDMAP-09): a ``reg_mr`` region or a type 1 window.  A
    fast-registered region (``alloc_mr``) and a type 2 window are.
    """
    target = table.lookup(stag)
    if target is not None and target.stream is None and len(pd.streams) > 1:
        raise RdmapError(
            "SEC-07",
            f"Send with Invalidate of STag 0x{stag:08x}, which other streams of its PD can use",
            TERM_RDMAP_PROT_CANNOT_INVALIDATE,
        )
    if (
        target is None
        or not target.valid
        or target.pd is not pd
        or target.stream not in (None, stream)
    ):
        raise RdmapError(
            "RDMAP-09",
            f"Send with Invalidate of STag 0x{stag:08x} not associated",
            TERM_RDMAP_PROT_CANNOT_INVALIDATE,
        )
    if not target.remote_invalidate:
        raise RdmapError(
            "RDMAP-09",
            f"Send with Invalidate of STag 0x{stag:08x}: a {target.kind} that is not remotely "
            "invalidatable",
            TERM_RDMAP_PROT_CANNOT_INVALIDATE,
        )
    target.invalidate()
    return target


def local_invalidate(table: StagTable, pd: ProtectionDomain, stag: int) -> StagTarget:
    """Execute a ``LOCAL_INV`` work request (SEC-06): the STag of this PD stops working.

    Raises :class:`MemoryOpError`: ``LOC_PROT_ERR`` for an STag the PD does not have,
    ``MW_BIND_ERR`` for a type 1 window (unbound by a zero-length bind, not invalidated).
    """
    target = table.lookup(stag)
    if target is None or target.pd is not pd:
        raise MemoryOpError(WcStatus.LOC_PROT_ERR, "LOCAL_INV of an unknown STag")
    if not target.local_invalidate:
        raise MemoryOpError(
            WcStatus.MW_BIND_ERR, f"LOCAL_INV of STag 0x{stag:08x}: a {target.kind}"
        )
    target.invalidate()
    return target
