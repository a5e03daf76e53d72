"""How much of a buffer the kernel has made: the tests of regions mapped lazily or not."""

from __future__ import annotations

import ctypes
import mmap


def resident_bytes(buf: object) -> int:
    """Bytes of ``buf``'s pages the kernel has made (``mincore``)."""
    view = memoryview(buf)  # type: ignore[arg-type]
    address = ctypes.addressof(ctypes.c_char.from_buffer(buf))  # type: ignore[arg-type]
    page = mmap.PAGESIZE
    start = address - address % page
    pages = -(-(address + view.nbytes - start) // page)
    vec = (ctypes.c_ubyte * pages)()
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mincore.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p)
    if libc.mincore(start, pages * page, vec) != 0:
        raise OSError(ctypes.get_errno(), "mincore")
    return sum(b & 1 for b in vec) * page
