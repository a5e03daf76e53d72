"""The byte buffers the stack reads and writes, named once for every module that takes them."""

from __future__ import annotations

Buffer = bytes | bytearray | memoryview
"""``bytes``, a ``bytearray`` or a ``memoryview`` of bytes: what the codecs, the framer and
deframer, the CRC and the send queue accept (a view is read in place, not copied)."""

__all__ = ["Buffer"]
