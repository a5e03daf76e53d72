"""``QpEndpoint.feed(data, budget)``: at most ``budget`` events applied per call.

A read holding many Read Requests is applied a budget at a time, so the driver can send the
first answers before the rest are applied (:data:`stack.transport.pumping.FEED_BUDGET`).
The budget changes when bytes are produced, never which: the responder's answers and the
requester's results are the same as with one unbounded feed.
"""

from __future__ import annotations

import pytest

from stack.rnic import Access, SendWR, WcStatus, WrOpcode
from stack.wire.events import MpaSettings
from tests.rnic.helpers import Pair

_READS = 10
_SIZE = 64
_SETTINGS = MpaSettings(ird=32, ord=32)
_DATA = (bytes(range(256)) * 3)[: _READS * _SIZE]


def _pair_with_reads() -> tuple[Pair, bytes, memoryview]:
    """A pair whose initiator has posted ``_READS`` Reads of the responder's ``_SIZE``-byte
    slices; returns it, the requests' wire bytes (not yet fed) and the sink buffer."""
    pair = Pair(_SETTINGS, _SETTINGS, a_qp={"ord": 32}, b_qp={"ird": 32})
    source = pair.b.mr(_DATA, Access.REMOTE_READ)
    sink = pair.a.mr(_READS * _SIZE)
    pair.a.qp.post_send(
        [
            SendWR(
                k,
                WrOpcode.RDMA_READ,
                (pair.a.sge(sink, k * _SIZE, _SIZE),),
                rkey=source.rkey,
                remote_addr=source.base + k * _SIZE,
            )
            for k in range(_READS)
        ]
    )
    assert pair.a.endpoint is not None
    return pair, bytes(pair.a.endpoint.produce()), sink.buf


def test_a_budget_applies_that_many_requests_per_call_and_the_rest_on_demand() -> None:
    pair, requests, _sink = _pair_with_reads()
    b = pair.b.endpoint
    assert b is not None
    assert b.feed(requests, budget=3) and b.events_pending
    answers = [bytes(b.produce())]  # what the first 3 requests produced, sent at once
    calls = 1
    while b.events_pending:
        assert b.feed(None, budget=3)
        answers.append(bytes(b.produce()))
        calls += 1
    assert calls == 4  # 3 + 3 + 3 + 1, then NeedData
    assert [len(a) for a in answers] == [len(answers[0])] * 3 + [len(answers[0]) // 3]


def _payloads(wire: bytes) -> list[bytes]:
    """The Read Responses' payloads, in order (each a whole FPDU: length, 14-octet tagged
    header, payload, CRC; STags and TOs differ from pair to pair, payloads do not)."""
    fpdu = 2 + 14 + _SIZE + 4
    assert len(wire) == _READS * fpdu
    return [wire[k * fpdu + 16 : k * fpdu + 16 + _SIZE] for k in range(_READS)]


@pytest.mark.parametrize("budget", [1, 3, _READS, 64])
def test_the_answers_and_the_results_are_those_of_one_unbounded_feed(budget: int) -> None:
    reference, requests, reference_sink = _pair_with_reads()
    assert reference.b.endpoint is not None and reference.a.endpoint is not None
    reference.b.endpoint.feed(requests)
    assert not reference.b.endpoint.events_pending
    expected = bytes(reference.b.endpoint.produce())
    reference.a.endpoint.feed(expected)

    pair, requests_again, sink = _pair_with_reads()
    b, a = pair.b.endpoint, pair.a.endpoint
    assert b is not None and a is not None
    out = b""
    feeds = 0
    while not feeds or b.events_pending:
        assert b.feed(requests_again if not feeds else None, budget=budget)
        out += bytes(b.produce())
        feeds += 1
    assert feeds == _READS // budget + 1  # the last call finds NeedData
    assert (
        _payloads(out)
        == _payloads(expected)
        == [_DATA[k * _SIZE : (k + 1) * _SIZE] for k in range(_READS)]
    )
    a.feed(out)
    wcs = pair.a.cq.poll(64)
    assert [wc.wr_id for wc in wcs] == list(range(_READS))
    assert all(wc.status is WcStatus.SUCCESS for wc in wcs)
    assert bytes(sink) == bytes(reference_sink) == _DATA


def test_no_budget_applies_everything() -> None:
    pair, requests, _sink = _pair_with_reads()
    b = pair.b.endpoint
    assert b is not None
    assert b.feed(requests) and not b.events_pending
    assert b.feed(None) and not b.events_pending


def _pair_with_fetch_adds() -> tuple[Pair, bytes]:
    """A pair whose initiator has posted ``_READS`` FetchAdds on the responder's counters;
    returns it and the requests' wire bytes (not yet fed)."""
    pair = Pair(_SETTINGS, _SETTINGS, a_qp={"ord": 32}, b_qp={"ird": 32})
    counters = pair.b.mr(8 * _READS, Access.REMOTE_ATOMIC | Access.LOCAL_WRITE)
    results = pair.a.mr(8 * _READS)
    pair.a.qp.post_send(
        [
            SendWR(
                k,
                WrOpcode.ATOMIC_FETCH_AND_ADD,
                (pair.a.sge(results, 8 * k, 8),),
                rkey=counters.rkey,
                remote_addr=counters.base + 8 * k,
                compare_add=k + 1,
            )
            for k in range(_READS)
        ]
    )
    assert pair.a.endpoint is not None
    return pair, bytes(pair.a.endpoint.produce())


def test_requests_on_the_bulk_path_count_against_the_budget() -> None:
    """Atomic Requests are applied as they are deframed (no event each, nothing queued
    views memory), yet a read of them still stops after ``budget`` and the rest follow."""
    pair, requests = _pair_with_fetch_adds()
    b = pair.b.endpoint
    assert b is not None and b.bulk
    assert b.feed(requests, budget=3) and b.events_pending
    answers = [bytes(b.produce())]
    while b.events_pending:
        assert b.feed(None, budget=3)
        answers.append(bytes(b.produce()))
    assert [len(a) // len(answers[-1]) for a in answers] == [3, 3, 3, 1]
    reference, again = _pair_with_fetch_adds()
    assert reference.b.endpoint is not None
    reference.b.endpoint.bulk = False  # every request an event
    assert reference.b.endpoint.feed(again) and not reference.b.endpoint.events_pending
    assert b"".join(answers) == bytes(reference.b.endpoint.produce())
