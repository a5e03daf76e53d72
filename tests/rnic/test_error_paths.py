"""Error and pressure paths of the QP: read-response amplification is bounded; completions
keep submit order when the stream fails.

Read-response amplification (QueuePair.must_wait, QpEndpoint.stalled):

A peer that asks for many large Reads and then sends a Write, without reading its socket,
used to make the responder copy every queued response (the snapshot that keeps a later
Write from showing through an earlier Read, RFC 5040 §5.5): 16 Reads of 6 MiB meant 96 MiB
held for one connection.  Now the Write waits until the responses have gone out, the
responder holds no copies, and the Reads still return the bytes from before the Write.
"""

from __future__ import annotations

import pytest

from stack.errors import LocalError
from stack.rnic import Access, MemoryRegion, SendWR, WcStatus, WrOpcode
from stack.rnic.endpoint import QpEndpoint
from stack.rnic.qp import MAX_SNAPSHOT_BYTES, QueuePair
from stack.rnic.qp_base import _OutItem
from stack.wire.events import ReadResponse
from tests.rnic.helpers import Pair

SIZE = 6 << 20
READS = 16


def _copied_bytes(qp: QueuePair) -> int:
    """Bytes of queued Read Responses that are copies (not views of registered memory)."""
    return sum(
        len(item.message.data)
        for item in qp._out
        if isinstance(item, _OutItem)
        and isinstance(item.message, ReadResponse)
        and isinstance(item.message.data, bytes)
    )


def _post_read(p: Pair, wr_id: int, sink: MemoryRegion, region: MemoryRegion) -> None:
    """An RDMA Read of ``region``'s start into all of ``sink``, posted at ``p.a``."""
    read = SendWR(wr_id, WrOpcode.RDMA_READ, (p.a.sge(sink),), rkey=region.rkey,
                  remote_addr=region.base)  # fmt: skip
    p.a.qp.post_send(read)


def test_many_large_reads_then_a_write_hold_no_copies_and_keep_read_semantics() -> None:
    p = Pair(a_qp={"ord": READS}, b_qp={"ird": READS})
    region = p.b.mr(
        bytes([7]) * SIZE, Access.LOCAL_WRITE | Access.REMOTE_READ | Access.REMOTE_WRITE
    )
    sinks = [p.a.mr(SIZE) for _ in range(READS)]
    for i, sink in enumerate(sinks):
        _post_read(p, i, sink, region)
    p.a.qp.post_send(
        SendWR(
            99, WrOpcode.RDMA_WRITE, inline_data=b"\x01" * 64, rkey=region.rkey,
            remote_addr=region.base,
        )
    )  # fmt: skip
    # The requester's bytes reach the responder; the responder's never go out yet.
    a_out = bytes(p.a.endpoint.produce())  # type: ignore[union-attr]
    b_endpoint: QpEndpoint = p.b.endpoint  # type: ignore[assignment]
    b_endpoint.feed(a_out)
    assert b_endpoint.stalled is not None  # the Write waits for the responses
    assert _copied_bytes(p.b.qp) == 0
    assert bytes(region.buf[:64]) == bytes([7]) * 64  # not placed yet
    p.pump()
    assert b_endpoint.stalled is None
    assert all(bytes(s.buf) == bytes([7]) * SIZE for s in sinks)  # the Reads saw before
    assert bytes(region.buf[:64]) == b"\x01" * 64  # ...and the Write landed after


def test_rdmap_13_completions_keep_submit_order_when_the_stream_fails() -> None:
    """A Send posted after an unanswered Read is already on the wire when the stream fails:
    its completion was queued behind the Read's, so it is flushed too, never SUCCESS after
    the Read's error (RFC 5040 §5.5)."""
    from stack.rnic import SendFlags, WcStatus

    p = Pair()
    region = p.b.mr(64, Access.LOCAL_WRITE | Access.REMOTE_READ)
    sink = p.a.mr(64)
    p.a.qp.post_send(
        SendWR(1, WrOpcode.RDMA_READ, (p.a.sge(sink),), send_flags=SendFlags.SIGNALED,
               rkey=region.rkey, remote_addr=region.base)
    )  # fmt: skip
    p.a.qp.post_send(
        SendWR(
            2, WrOpcode.SEND, inline_data=b"after", send_flags=SendFlags.SIGNALED | SendFlags.INLINE
        )
    )
    p.a.endpoint.produce()  # type: ignore[union-attr]  # both are on the wire; no answer comes
    p.a.qp.fatal(None, send_terminate=False)  # the connection is lost
    wcs = p.a.cq.poll(8)
    assert [w.wr_id for w in wcs] == [1, 2]
    assert [w.status for w in wcs] == [WcStatus.WR_FLUSH_ERR, WcStatus.WR_FLUSH_ERR]


@pytest.mark.parametrize(
    ("opcode", "field", "value"),
    [
        (WrOpcode.RDMA_WRITE, "rkey", 1 << 32),
        (WrOpcode.RDMA_WRITE, "remote_addr", -1),
        (WrOpcode.RDMA_READ, "remote_addr", 1 << 64),
        (WrOpcode.ATOMIC_FETCH_AND_ADD, "compare_add", 1 << 64),
        (WrOpcode.ATOMIC_CMP_AND_SWP, "swap", -1),
        (WrOpcode.ATOMIC_CMP_AND_SWP, "swap_mask", 1 << 64),
        (WrOpcode.ATOMIC_CMP_AND_SWP, "compare_add", -1),
        (WrOpcode.ATOMIC_FETCH_AND_ADD, "compare_add_mask", 1 << 64),
        (WrOpcode.SEND_WITH_INV, "invalidate_rkey", 1 << 32),
    ],
)
def test_a_wr_whose_fields_do_not_fit_the_wire_is_refused_at_posting(
    opcode: WrOpcode, field: str, value: int
) -> None:
    """A post list with such a WR raises LocalError naming the field and queues none of it
    (as ``ibv_post_send`` refuses a bad WR); the connection carries on with the next post.
    These used to pass posting and fail inside the transport's send pass."""
    p = Pair()
    length = 8 if opcode.name.startswith("ATOMIC") else 64
    target = p.b.mr(64, Access.LOCAL_WRITE | Access.REMOTE_WRITE | Access.REMOTE_ATOMIC)
    src = p.a.mr(bytes(range(64)))
    good = SendWR(
        1, WrOpcode.RDMA_WRITE, (p.a.sge(src),), rkey=target.rkey, remote_addr=target.base
    )
    bad = SendWR(2, opcode, (p.a.sge(src, 0, length),), **{field: value})  # type: ignore[arg-type]
    with pytest.raises(LocalError, match=f"WR 2: {field} .* does not fit"):
        p.a.qp.post_send([good, bad])
    p.pump()
    assert p.a.cq.poll(4) == [] and bytes(target.view(target.base, 64)) == bytes(64)
    p.a.qp.post_send(good)
    p.pump()
    assert [wc.status for wc in p.a.cq.poll(4)] == [WcStatus.SUCCESS]
    assert bytes(target.view(target.base, 64)) == bytes(range(64))


def _reads_each_followed_by_a_write(
    size: int, pairs: int, hard: int | None = None
) -> tuple[Pair, MemoryRegion, list[MemoryRegion], QpEndpoint]:
    """``pairs`` Reads of ``size`` bytes of one region of ``b``, each followed by a 64-byte
    Write to its start, all fed to ``b`` (whose ``max_stalled_snapshot_bytes`` is ``hard``
    when given) until an event waits or all are applied: (pair, region, sinks, b's end)."""
    p = Pair(a_qp={"ord": pairs}, b_qp={"ird": pairs})
    if hard is not None:
        p.b.qp.max_stalled_snapshot_bytes = hard
    region = p.b.mr(bytes(size), Access.LOCAL_WRITE | Access.REMOTE_READ | Access.REMOTE_WRITE)
    sinks = [p.a.mr(size) for _ in range(pairs)]
    for i, sink in enumerate(sinks):
        _post_read(p, i, sink, region)
        p.a.qp.post_send(
            SendWR(
                100 + i, WrOpcode.RDMA_WRITE, inline_data=bytes([i + 1]) * 64,
                rkey=region.rkey, remote_addr=region.base,
            )
        )  # fmt: skip
    b_endpoint: QpEndpoint = p.b.endpoint  # type: ignore[assignment]
    b_endpoint.feed(bytes(p.a.endpoint.produce()))  # type: ignore[union-attr]
    while b_endpoint.events_pending and b_endpoint.stalled is None:
        b_endpoint.feed(None)
    return p, region, sinks, b_endpoint


def test_snapshot_copies_are_bounded_in_total_not_per_snapshot() -> None:
    """Reads each below the snapshot bound, each followed by a Write, from a peer that
    reads nothing: every Write snapshotted the one response before it, so the copies grew
    by a Read's size per pair (8 x 3 MiB = 24 MiB held).  Copies not yet sent count toward
    the bound now; the Writes wait instead, and each Read still returns the bytes from
    before the Write that follows it (RFC 5040 §5.5)."""
    p, region, sinks, b_endpoint = _reads_each_followed_by_a_write(3 << 20, 8)
    pairs = len(sinks)
    assert _copied_bytes(p.b.qp) <= MAX_SNAPSHOT_BYTES
    assert b_endpoint.stalled is not None  # a Write waits for the responses to go out
    p.pump()
    assert b_endpoint.stalled is None
    for i, sink in enumerate(sinks):  # Read i saw Write i-1's bytes, not Write i's
        assert bytes(sink.buf[:64]) == (bytes([i]) * 64 if i else bytes(64))
    assert bytes(region.buf[:64]) == bytes([pairs]) * 64


@pytest.mark.parametrize("hard", [64 << 20, 0])
def test_a_stall_released_copies_up_to_the_stalled_bound(hard: int) -> None:
    """Fed None in stall_released (as the drivers do once a stall has lasted with none of
    the output moving): the Writes are applied and the responses copied, within
    max_stalled_snapshot_bytes; each Read still returns the bytes from before the Write
    after it.  With that bound 0 nothing more is copied and the Write keeps waiting."""
    p, region, sinks, b_endpoint = _reads_each_followed_by_a_write(3 << 20, 8, hard)
    pairs = len(sinks)
    assert b_endpoint.stalled is not None
    with b_endpoint.stall_released():
        b_endpoint.feed(None)
    if not hard:
        assert b_endpoint.stalled is not None and _copied_bytes(p.b.qp) <= MAX_SNAPSHOT_BYTES
        return
    assert b_endpoint.stalled is None
    assert bytes(region.buf[:64]) == bytes([pairs]) * 64  # every Write applied
    assert MAX_SNAPSHOT_BYTES < _copied_bytes(p.b.qp) <= hard
    assert p.b.qp.max_snapshot_bytes == MAX_SNAPSHOT_BYTES  # the soft bound is back
    p.pump()
    for i, sink in enumerate(sinks):  # Read i saw Write i-1's bytes, not Write i's
        assert bytes(sink.buf[:64]) == (bytes([i]) * 64 if i else bytes(64))
