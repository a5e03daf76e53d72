"""CRC32c backends for the MPA CRC (RFC 5044 §4.4, MPA-12).

``crc32c`` (hardware-accelerated package) is used when it imports; ``crcmod``'s
``crc-32c`` is the fallback.  Both compute the same function; the tests check it.
"""

from __future__ import annotations

import struct
from collections.abc import Callable

import crcmod.predefined

from stack.buffers import Buffer

_crcmod_fn: Callable[[Buffer, int], int] = crcmod.predefined.mkPredefinedCrcFun("crc-32c")


def crc32c_crcmod(data: Buffer, value: int = 0) -> int:
    """CRC32c with crcmod; ``value`` continues a running CRC (a previous result)."""
    return _crcmod_fn(bytes(data) if isinstance(data, memoryview) else data, value)


try:
    import crc32c as _crc32c_mod

    crc32c_hw = _crc32c_mod.crc32c
    """CRC32c with the ``crc32c`` package (SSE4.2 / ARMv8 CRC when available), bound directly:
    the hot path calls it per FPDU, so no Python wrapper in between."""

    crc32c = crc32c_hw
    BACKEND = "crc32c"
except ImportError:  # pragma: no cover - exercised only where crc32c is absent
    crc32c_hw = None  # type: ignore[assignment]
    crc32c = crc32c_crcmod  # type: ignore[assignment]  # the same call shape
    BACKEND = "crcmod"

_LE32 = struct.Struct("<I")


def crc_field(data: Buffer) -> bytes:
    """The 4-byte MPA CRC field for ``data``: CRC32c sent least significant byte first."""
    return _LE32.pack(crc32c(data))


def crc_from_field(field: Buffer) -> int:
    """The CRC32c value carried in a 4-byte MPA CRC field."""
    value: int = _LE32.unpack(field)[0]
    return value
