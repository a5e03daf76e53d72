"""Heap tuning (stack.transport.heap): bursts of large buffers reuse freed heap."""

from __future__ import annotations

import subprocess
import sys

import pytest

from stack.transport.heap import glibc

_BURSTS = """
import resource, sys
{setup}
pieces = [memoryview(bytearray(508))] * 127
def faults():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
start = faults()
for _ in range(200):
    live = [b"\\0\\0\\0\\0".join(pieces) for _ in range(17)]  # one pass of marked FPDUs
    del live
print((faults() - start) / (200 * 17))
"""


def _faults_per_buffer(setup: str) -> float:
    code = _BURSTS.format(setup=setup)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return float(done.stdout)


@pytest.mark.skipif(glibc() is None, reason="glibc's mallopt")
def test_a_burst_of_fpdu_sized_buffers_reuses_the_heap_once_tuned() -> None:
    """17 buffers of 64 KiB alive at once, then freed, 200 times: glibc's defaults give
    the memory back and fault it in again each pass (a dozen faults per buffer); tuned,
    the heap is reused (about none)."""
    untuned = _faults_per_buffer("")
    tuned = _faults_per_buffer(
        "from stack.transport.heap import keep_freed_memory\nassert keep_freed_memory()"
    )
    assert untuned > 5
    assert tuned < 1


async def test_a_connection_tunes_the_heap_when_it_starts() -> None:
    from stack.transport import heap
    from tests.e2e.helpers import tcp_pair

    async with tcp_pair():
        pass
    assert heap._done is (glibc() is not None)  # noqa: SLF001
