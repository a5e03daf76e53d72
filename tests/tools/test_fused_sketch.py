"""The fused sketch of the Read round trip (``python -m tools.fused_sketch``) makes the
engines' bytes and completion, and refuses what they refuse."""

from __future__ import annotations

import pytest

from tools.engine_rtt import EngineRoundTrip
from tools.fused_sketch import Sketch, check_against_engines, measure


def test_its_request_response_and_completion_are_the_engines() -> None:
    check_against_engines()  # raises ValueError on any difference


def _request(sketch: Sketch, ends: EngineRoundTrip) -> bytearray:
    out = bytearray()
    sketch.post(ends.wr, out)
    return out


def test_the_answer_refuses_a_bad_crc_a_repeated_msn_and_a_bad_stag() -> None:
    ends = EngineRoundTrip("read")
    sketch = Sketch(ends)
    request = _request(sketch, ends)
    broken = bytearray(request)
    broken[-1] ^= 1
    with pytest.raises(ValueError, match="CRC"):
        sketch.answer(memoryview(broken), bytearray())
    sketch.answer(memoryview(request), bytearray())
    with pytest.raises(ValueError, match="expected Read Request"):  # MSN 1 again
        sketch.answer(memoryview(request), bytearray())
    ends.server_qp.table.lookup(ends.wr.rkey).valid = False  # type: ignore[union-attr]
    with pytest.raises(ValueError, match="refuses the Read"):
        sketch.answer(memoryview(_request(sketch, ends)), bytearray())


def test_completion_needs_the_oldest_reads_response() -> None:
    ends = EngineRoundTrip("read")
    sketch = Sketch(ends)
    answer = bytearray()
    sketch.answer(memoryview(_request(sketch, ends)), answer)
    sketch._outstanding[0] = (0xBAD, *sketch._outstanding[0][1:])
    with pytest.raises(ValueError, match="oldest Read"):
        sketch.complete(memoryview(answer))
    assert ends.cq.poll(1) == []


def test_measure_compares_the_same_parts() -> None:
    figures = measure(50, 1)
    assert set(figures) == {"post", "answer", "complete", "total"}
    for row in figures.values():
        assert row["layered_us"] > 0 and row["sketch_us"] > 0
        assert row["ratio"] == pytest.approx(row["layered_us"] / row["sketch_us"])
    parts = ("post", "answer", "complete")
    assert figures["total"]["sketch_us"] == pytest.approx(
        sum(figures[p]["sketch_us"] for p in parts)
    )
