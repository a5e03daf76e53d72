"""The persistent pool file: table, pool and rings in a memory-mapped file (docs/kbtp.md §12).

File format (version 1; every field big-endian)
-----------------------------------------------
::

    octets 0..63                    prefix
    octets 64..64+D-1               layout description (D octets, CRC-32 in the prefix)
    journal offset (64 KiB aligned) journal: table_entries x 16 octets
    layout offset (64 KiB aligned)  the target memory of docs/kbtp.md §3.6, byte for byte

Prefix:

=======  ======================================================================
Octets   Field
=======  ======================================================================
0-7      Magic ``KBTPPOOL``
8-11     Format version (1)
12-15    D, the description's length
16-19    CRC-32 (ISO-HDLC, as zlib) of the description
20-23    State: 0 FRESH (never initialized: initialize as a new pool), 1 TABLE (the
         table in the layout is authoritative), 2 JOURNAL (a recovery was interrupted:
         the journal is authoritative)
24-31    Base: the Tagged Offset of layout byte 0 that the stored Block Offsets use
32-35    Clean: 1 if the target flushed everything and stopped cleanly, else 0
36-63    Reserved (zero)
=======  ======================================================================

Description (what the file was made for; compared field by field with the configuration
on open): Block Size (4), Pool Size F (4), Table Base Handle (8), Table Entries (4),
counter byte order (1; 0 little, 1 big), reserved (1), initiator count (2); per initiator
in configuration order: identity length (2), DIRECT_ALLOC (1), reserved (1), handle base
(8), handle count (4), quota (4), partition ring order (1; 0: none), reserved (3), the
identity padded to 8 octets; then first shared block (4), shared blocks (4), shared ring
order (1; 0: none), reserved (3), layout size (8), journal offset (8), layout offset (8).
The file is exactly layout offset + layout size octets.

The journal holds the table a recovery decided on, its Block Offsets relative to layout
byte 0, written and flushed before the State becomes JOURNAL and the table is rewritten
for the new mapping; so a recovery interrupted at any point is resumed from it.

:class:`PoolFile` opens or creates a file for a configuration, refuses any mismatch with a
one-line :class:`PoolFileError`, holds an exclusive ``flock`` on it while a target uses it,
maps the layout (``mmap``, MAP_SHARED) and runs the recovery of
:mod:`kbtp.pool_recovery`.
"""

from __future__ import annotations

import fcntl
import mmap
import os
import stat
import struct
import zlib
from dataclasses import dataclass
from enum import IntEnum

from kbtp.constants import (
    POOL_FILE_ALIGN,
    POOL_FILE_MAGIC,
    POOL_FILE_PREFIX_LEN,
    POOL_FILE_VERSION,
    TABLE_ENTRY_LEN,
)
from kbtp.layout import TableEntry, TargetLayout, write_entry
from kbtp.pool_recovery import (
    RecoveryReport,
    apply_recovery,
    plan_recovery,
    read_ring_blocks,
    read_table,
)
from kbtp.target_config import TargetConfig, plan_target_layout
from stack.errors import LocalError

__all__ = ["PoolFile", "PoolFileError", "PoolState", "pool_file_size"]

_PREFIX = struct.Struct(">8sIIIIQI28x")
_DESC_HEAD = struct.Struct(">IIQIBxH")
_HEAD_FIELDS = 6
_DESC_INI = struct.Struct(">HBxQIIB3x")
_DESC_TAIL = struct.Struct(">IIB3xQQQ")
_MAX_DESCRIPTION = 1 << 20
_BYTEORDER = {"little": 0, "big": 1}


class PoolFileError(LocalError):
    """A pool file that cannot be used for this configuration (one line, naming the file)."""


class PoolState(IntEnum):
    """The State field of the prefix."""

    FRESH = 0
    TABLE = 1
    JOURNAL = 2


def _align(value: int) -> int:
    return -(-value // POOL_FILE_ALIGN) * POOL_FILE_ALIGN


@dataclass(frozen=True, slots=True)
class _Geometry:
    description: bytes
    fields: list[tuple[str, object]]
    journal_offset: int
    journal_length: int
    layout_offset: int
    layout_size: int

    @property
    def file_size(self) -> int:
        return self.layout_offset + self.layout_size


def _labels(initiators: int) -> list[str]:
    """The description's field names, in file order (the three trailer fields last)."""
    names = [
        "block size", "pool blocks", "table base handle", "table entries",
        "counter byte order", "initiator count",
    ]  # fmt: skip
    for n in range(initiators):
        name = f"initiator {n + 1}"
        names += [
            f"{name} identity", f"{name} DIRECT_ALLOC", f"{name} handle base",
            f"{name} handle count", f"{name} quota", f"{name} partition ring order",
        ]  # fmt: skip
    shared = ["first shared block", "shared blocks", "shared ring order"]
    return [*names, *shared, "layout size", "journal offset", "layout offset"]


def _values(config: TargetConfig, layout: TargetLayout) -> list[object]:
    """The description's values for ``config``, in file order, up to the shared ring."""
    out: list[object] = [
        layout.block_size,
        layout.pool_blocks,
        layout.table_base_handle,
        layout.table_entries,
        _BYTEORDER[config.counter_byteorder],
        len(config.initiators),
    ]
    parts = iter(layout.partitions)
    for ini in config.initiators:
        order = next(parts).ring.order if ini.direct_alloc else 0
        out += [
            ini.identity,
            int(ini.direct_alloc),
            ini.handle_base,
            ini.handle_count,
            ini.quota,
            order,
        ]
    ring = layout.shared_ring
    return [*out, layout.shared_first_block, layout.shared_blocks, ring.order if ring else 0]


def _encode(values: list[object], tail: tuple[int, int, int]) -> bytes:
    out = bytearray(_DESC_HEAD.pack(*values[:_HEAD_FIELDS]))
    rest = values[_HEAD_FIELDS:-3]
    for i in range(0, len(rest), 6):
        ident, direct, base, count, quota, order = rest[i : i + 6]
        assert isinstance(ident, bytes)
        out += _DESC_INI.pack(len(ident), direct, base, count, quota, order)
        out += ident + bytes(-len(ident) % 8)
    return bytes(out + _DESC_TAIL.pack(*values[-3:], *tail))


def _decode(data: bytes) -> list[tuple[str, object]] | None:
    """The (label, value) fields of a stored description, trailer included, or None if it
    does not parse."""
    try:
        head = _DESC_HEAD.unpack_from(data, 0)
        values: list[object] = list(head)
        at = _DESC_HEAD.size
        for _ in range(head[-1]):
            length, direct, base, count, quota, order = _DESC_INI.unpack_from(data, at)
            at += _DESC_INI.size
            ident = bytes(data[at : at + length])
            if len(ident) != length:
                return None
            at += length + (-length % 8)
            values += [ident, direct, base, count, quota, order]
        values += list(_DESC_TAIL.unpack_from(data, at))
        if at + _DESC_TAIL.size != len(data):
            return None
    except struct.error:
        return None
    return list(zip(_labels(head[-1]), values, strict=True))


def _geometry(config: TargetConfig) -> _Geometry:
    layout = plan_target_layout(config)
    values = _values(config, layout)
    journal_offset = _align(POOL_FILE_PREFIX_LEN + len(_encode(values, (0, 0, 0))))
    journal_length = layout.table_entries * TABLE_ENTRY_LEN
    layout_offset = _align(journal_offset + journal_length)
    tail = (layout.size, journal_offset, layout_offset)
    fields = list(zip(_labels(len(config.initiators)), [*values, *tail], strict=True))
    return _Geometry(
        _encode(values, tail), fields, journal_offset, journal_length, layout_offset, layout.size
    )


def pool_file_size(config: TargetConfig) -> int:
    """Octets of the pool file of ``config``."""
    return _geometry(config).file_size


def _shown(value: object) -> str:
    if isinstance(value, bytes):
        return repr(value.decode(errors="replace"))
    return str(value)


class PoolFile:
    """A pool file opened for one configuration (see the module docstring).

    Attributes: ``path``, ``created`` (the file was new), ``was_clean`` (the last target
    stopped cleanly), ``state`` (:class:`PoolState` when opened), ``mapping`` (the layout,
    mapped MAP_SHARED: register it as the target memory), ``view`` (a memoryview of it).
    """

    def __init__(self, path: str | os.PathLike[str], config: TargetConfig) -> None:
        self.path = os.fspath(path)
        self._geo = _geometry(config)
        self._fd = -1
        self._locked = False
        try:
            self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise self._error(f"cannot open: {exc.strerror or exc}") from None
        try:
            self._open()
        except BaseException:
            self.close()
            raise

    def _error(self, text: str) -> PoolFileError:
        return PoolFileError(f"pool file {self.path}: {text}")

    def _open(self) -> None:
        geo = self._geo
        self.lock()
        info = os.fstat(self._fd)
        if not stat.S_ISREG(info.st_mode):
            raise self._error("not a regular file")
        self.created = info.st_size == 0
        self.base_to = 0
        self.was_clean = True
        if self.created:
            try:
                os.ftruncate(self._fd, geo.file_size)
            except OSError as exc:
                raise self._error(f"cannot size it: {exc.strerror or exc}") from None
            self.state = PoolState.FRESH
        else:
            self._check(info.st_size)
        try:
            self._meta = mmap.mmap(self._fd, geo.layout_offset, offset=0)
            self.mapping = mmap.mmap(self._fd, geo.layout_size, offset=geo.layout_offset)
        except (OSError, ValueError) as exc:
            raise self._error(f"cannot map it: {exc}") from None
        self.view = memoryview(self.mapping)
        if self.created:
            self._meta[POOL_FILE_PREFIX_LEN : POOL_FILE_PREFIX_LEN + len(geo.description)] = (
                geo.description
            )
            self._set(PoolState.FRESH, 0, False)

    def _check(self, size: int) -> None:
        """Refuse a file whose header is not ours, corrupt, or made for another
        configuration, or whose size is not the configuration's."""
        geo = self._geo
        if size < POOL_FILE_PREFIX_LEN:
            raise self._error(f"not a KBTP pool file ({size} octets, shorter than the header)")
        prefix = os.pread(self._fd, POOL_FILE_PREFIX_LEN, 0)
        magic, version, length, crc, state, base, clean = _PREFIX.unpack(prefix)
        if magic != POOL_FILE_MAGIC:
            raise self._error("not a KBTP pool file (bad magic)")
        if version != POOL_FILE_VERSION:
            raise self._error(f"format version {version}, this target reads {POOL_FILE_VERSION}")
        if length > _MAX_DESCRIPTION or POOL_FILE_PREFIX_LEN + length > size:
            raise self._error(f"header corrupt (a description of {length} octets)")
        description = os.pread(self._fd, length, POOL_FILE_PREFIX_LEN)
        if zlib.crc32(description) != crc:
            raise self._error("header corrupt (checksum mismatch)")
        if state not in {s.value for s in PoolState} or clean not in (0, 1):
            raise self._error(f"header corrupt (state {state}, clean {clean})")
        stored = _decode(description)
        if stored is None:
            raise self._error("header corrupt (the description does not parse)")
        for (label, have), (_, want) in zip(stored, geo.fields, strict=False):
            if have != want:
                raise self._error(
                    f"made for {label} {_shown(have)}, the configuration has {_shown(want)}"
                )
        if size != geo.file_size:
            raise self._error(
                f"{size} octets, the configuration needs {geo.file_size} (truncated or damaged)"
            )
        self.state = PoolState(state)
        self.base_to = base
        self.was_clean = bool(clean)

    # -- the prefix ---------------------------------------------------------------------
    def _set(self, state: PoolState, base_to: int, clean: bool) -> None:
        """Write the prefix and flush it (the description is not rewritten)."""
        geo = self._geo
        crc = zlib.crc32(geo.description)
        self._meta[:POOL_FILE_PREFIX_LEN] = _PREFIX.pack(
            POOL_FILE_MAGIC, POOL_FILE_VERSION, len(geo.description), crc, state, base_to, clean
        )
        self._meta.flush()
        self.state, self.base_to = state, base_to

    # -- recovery (docs/kbtp.md §12.3) --------------------------------------------------
    def recover(self, config: TargetConfig) -> RecoveryReport | None:
        """Bring the mapped layout to a consistent state for ``config`` (whose ``base_to``
        is the mapping's Tagged Offset); None for a file never initialized (initialize it
        as a new pool, then :meth:`commit`).  Crash-safe at every step: the journal is
        flushed before the table is rewritten."""
        if self.state is PoolState.FRESH:
            return None
        layout = plan_target_layout(config)
        mem = self.view
        if self.state is PoolState.TABLE:
            rings = read_ring_blocks(mem, layout)
            plan = plan_recovery(config, layout, read_table(mem, layout), self.base_to, rings)
            self._write_journal(plan.entries)
            self._set(PoolState.JOURNAL, self.base_to, False)
        else:  # an interrupted recovery: its journal is already a repaired table
            plan = plan_recovery(config, layout, self._read_journal(), 0, None)
        apply_recovery(mem, layout, plan)
        self.mapping.flush()
        self._set(PoolState.TABLE, layout.base_to, False)
        return plan.report

    def _write_journal(self, entries: list[TableEntry]) -> None:
        view = memoryview(self._meta)
        start = self._geo.journal_offset
        for i, entry in enumerate(entries):
            write_entry(view, start + i * TABLE_ENTRY_LEN, entry)
        view.release()
        self._meta.flush()

    def _read_journal(self) -> list[TableEntry]:
        start, length = self._geo.journal_offset, self._geo.journal_length
        raw = self._meta[start : start + length]
        return [
            TableEntry.unpack(raw[i : i + TABLE_ENTRY_LEN])
            for i in range(0, length, TABLE_ENTRY_LEN)
        ]

    def commit(self, base_to: int) -> None:
        """A new pool was initialized in the mapping at ``base_to``: flush it and mark the
        table authoritative."""
        self.mapping.flush()
        self._set(PoolState.TABLE, base_to, False)

    # -- durability (docs/kbtp.md §12.4) ------------------------------------------------
    def persist(self, offset: int, length: int) -> None:
        """Flush layout octets [offset, offset + length) to the file (msync)."""
        start = offset - offset % mmap.PAGESIZE
        end = min(offset + length, len(self.mapping))
        if end > start:
            self.mapping.flush(start, end - start)

    def start(self) -> None:
        """A target starts serving: hold the lock, mark the file not cleanly stopped."""
        self.lock()
        self._set(self.state, self.base_to, False)

    def stop(self) -> None:
        """A clean stop: flush the whole layout, mark the file clean, release the lock."""
        self.mapping.flush()
        self._set(self.state, self.base_to, True)
        self.unlock()

    # -- the lock -------------------------------------------------------------------------
    def lock(self) -> None:
        """An exclusive ``flock``: one target per pool file."""
        if self._locked:
            return
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise self._error("in use by another target") from None
        except OSError as exc:
            raise self._error(f"cannot lock: {exc.strerror or exc}") from None
        self._locked = True

    def unlock(self) -> None:
        if self._locked:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            self._locked = False

    def close(self) -> None:
        """Release the lock and the descriptor (the mappings live while registered)."""
        if self._fd >= 0:
            self.unlock()
            os.close(self._fd)
            self._fd = -1
