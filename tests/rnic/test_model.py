"""Property: random sequences of operations leave memory exactly as a simple model predicts."""

from __future__ import annotations

import struct

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stack.rnic import Access, MemoryRegion, RecvWR, SendWR, WcStatus, WrOpcode
from stack.wire.atomics import cmp_swap, fetch_add
from tests.rnic.helpers import Pair

SIZE = 4096
ALL = Access.LOCAL_WRITE | Access.REMOTE_WRITE | Access.REMOTE_READ | Access.REMOTE_ATOMIC
MASKS = st.sampled_from([0, (1 << 63) | (1 << 31), 0xFFFFFFFFFFFFFFFF, 0x8080808080808080])
U64 = st.integers(0, (1 << 64) - 1)

write_op = st.tuples(
    st.just("write"), st.integers(0, SIZE - 1), st.binary(min_size=0, max_size=3000)
)
read_op = st.tuples(st.just("read"), st.integers(0, SIZE - 1), st.integers(0, 3000))
fadd_op = st.tuples(st.just("fadd"), st.integers(0, SIZE // 8 - 1), U64, MASKS)
cas_op = st.tuples(st.just("cas"), st.integers(0, SIZE // 8 - 1), U64, U64, st.booleans())
send_op = st.tuples(st.just("send"), st.binary(max_size=2000))
ops = st.lists(st.one_of(write_op, read_op, fadd_op, cas_op, send_op), min_size=1, max_size=25)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops, st.integers(1, 8), st.booleans())
def test_rdmap_13_random_operations_match_the_model(operations, ord_, pump_each) -> None:
    p = Pair(a_qp={"ord": ord_})
    target = p.b.mr(SIZE, ALL)
    model = bytearray(SIZE)
    inbox = p.b.mr(2048)
    expected_reads: list[tuple[MemoryRegion, bytes]] = []
    expected_sends: list[bytes] = []
    wr_id = 0
    for op in operations:
        wr_id += 1
        kind = op[0]
        if kind == "write":
            off, data = op[1], op[2][: SIZE - op[1]]
            p.a.qp.post_send(
                SendWR(
                    wr_id,
                    WrOpcode.RDMA_WRITE,
                    inline_data=data,
                    rkey=target.rkey,
                    remote_addr=target.base + off,
                )
            )
            model[off : off + len(data)] = data
        elif kind == "read":
            off, n = op[1], min(op[2], SIZE - op[1])
            sink = p.a.mr(max(n, 1))
            p.a.qp.post_send(
                SendWR(
                    wr_id,
                    WrOpcode.RDMA_READ,
                    (p.a.sge(sink, 0, n),),
                    rkey=target.rkey,
                    remote_addr=target.base + off,
                )
            )
            expected_reads.append((sink, bytes(model[off : off + n])))
        elif kind == "fadd":
            off, add, mask = 8 * op[1], op[2], op[3]
            result = p.a.mr(8)
            p.a.qp.post_send(
                SendWR(
                    wr_id,
                    WrOpcode.ATOMIC_FETCH_AND_ADD,
                    (p.a.sge(result),),
                    rkey=target.rkey,
                    remote_addr=target.base + off,
                    compare_add=add,
                    compare_add_mask=mask,
                )
            )
            old = struct.unpack_from("<Q", model, off)[0]
            struct.pack_into("<Q", model, off, fetch_add(old, add, mask))
            expected_reads.append((result, struct.pack("<Q", old)))
        elif kind == "cas":
            off, swap, other, hit = 8 * op[1], op[2], op[3], op[4]
            old = struct.unpack_from("<Q", model, off)[0]
            compare = old if hit else other
            result = p.a.mr(8)
            p.a.qp.post_send(
                SendWR(
                    wr_id,
                    WrOpcode.ATOMIC_CMP_AND_SWP,
                    (p.a.sge(result),),
                    rkey=target.rkey,
                    remote_addr=target.base + off,
                    compare_add=compare,
                    swap=swap,
                )
            )
            new = cmp_swap(old, compare, (1 << 64) - 1, swap, (1 << 64) - 1)
            struct.pack_into("<Q", model, off, new)
            expected_reads.append((result, struct.pack("<Q", old)))
        else:
            p.b.qp.post_recv(RecvWR(wr_id, (p.b.sge(inbox),)))
            p.a.qp.post_send(SendWR(wr_id, WrOpcode.SEND, inline_data=op[1]))
            expected_sends.append(op[1])
        if pump_each:
            p.pump()
    p.pump()
    assert bytes(target.buf) == bytes(model)
    for mr, data in expected_reads:
        assert bytes(mr.buf[: len(data)]) == data
    wcs = p.a.cq.poll(1000)
    assert [wc.wr_id for wc in wcs] == list(range(1, wr_id + 1))
    assert all(wc.status is WcStatus.SUCCESS for wc in wcs)
    assert [wc.byte_len for wc in p.b.cq.poll(1000)] == [len(s) for s in expected_sends]
