"""FpduDeframer.release_tail: a partial FPDU at the end of a borrowed buffer is handed back
(not copied) and fed again in front of what completes it, as the trio driver does with its
receive buffer (MPA-16: whole FPDUs only; markers and CRC checked as ever)."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from stack.wire.framing import FpduDeframer, FpduFramer

BUFFER = 4096


def _stream(sizes: list[int], markers: bool) -> tuple[bytes, list[bytes]]:
    framer = FpduFramer(crc=True, markers=markers)
    ulpdus = [random.Random(k).randbytes(n) for k, n in enumerate(sizes)]
    return b"".join(bytes(framer.frame(u)) for u in ulpdus), ulpdus


def _driver_loop(wire: bytes, reads: list[int], markers: bool) -> tuple[list[bytes], int]:
    """Read ``wire`` into one reused buffer the way the driver does: the tail the deframer
    hands back moves to the front, the next read lands after it.  Returns the ULPDUs (copied
    as they come, as a placement would) and how many tails were handed back."""
    deframer = FpduDeframer(crc=True, markers=markers)
    rx = memoryview(bytearray(BUFFER))
    got: list[bytes] = []
    pos = end = tail = handed_back = 0
    sizes = iter(reads)
    while pos < len(wire):
        if tail:
            rx[:tail] = rx[end - tail : end]
        room = BUFFER - tail
        n = min(next(sizes, room) or 1, room, len(wire) - pos)
        rx[tail : tail + n] = wire[pos : pos + n]
        pos += n
        end = tail + n
        deframer.feed(rx[:end], borrow=True)
        got += [bytes(u) for u in deframer]
        tail = deframer.release_tail()
        handed_back += tail > 0
        rx[: end - tail] = bytes(end - tail)  # consumed: the deframer must not look again
    assert deframer.pending == tail
    return got, handed_back


@settings(max_examples=150, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 1500), min_size=1, max_size=12),
    reads=st.lists(st.integers(1, BUFFER), max_size=40),
    markers=st.booleans(),
)
def test_handed_back_tails_deliver_every_ulpdu_intact(
    sizes: list[int], reads: list[int], markers: bool
) -> None:
    wire, ulpdus = _stream(sizes, markers)
    got, _ = _driver_loop(wire, reads, markers)
    assert got == ulpdus


def test_a_tail_is_handed_back_without_a_copy_and_the_offset_stays() -> None:
    wire, ulpdus = _stream([1000, 1000, 1000], markers=True)
    deframer = FpduDeframer(crc=True, markers=True)
    cut = len(wire) // 2
    deframer.feed(memoryview(bytearray(wire[:cut])), borrow=True)
    assert [bytes(u) for u in deframer] == ulpdus[:1]
    offset = deframer.offset
    tail = deframer.release_tail()
    assert tail == cut - offset and deframer.pending == 0 and deframer.offset == offset
    deframer.feed(memoryview(bytearray(wire[offset:])), borrow=True)
    assert [bytes(u) for u in deframer] == ulpdus[1:]
    assert deframer.release_tail() == 0 and deframer.offset == len(wire)


def test_unread_bytes_in_two_chunks_are_settled_not_handed_back() -> None:
    wire, ulpdus = _stream([3000], markers=False)
    deframer = FpduDeframer(crc=True)
    deframer.feed(memoryview(bytearray(wire[:100])), borrow=True)
    assert deframer.release_tail() == 100
    deframer.feed(wire[:100])  # fed again, as bytes (owned)
    deframer.feed(memoryview(bytearray(wire[100:200])), borrow=True)
    assert deframer.next_ulpdu() is None
    assert deframer.release_tail() == 0  # two chunks: copied, kept
    assert deframer.pending == 200
    deframer.feed(wire[200:])
    assert [bytes(u) for u in deframer] == ulpdus
