"""Every RDMA operation between two software RNICs, through the real wire bytes."""

from __future__ import annotations

import struct

import trio

from stack.constants import Opcode
from stack.rnic import (
    Access,
    QpState,
    RecvWR,
    SendFlags,
    SendWR,
    WcFlags,
    WcOpcode,
    WcStatus,
    WrOpcode,
)
from stack.wire.atomics import fetch_add
from stack.wire.events import MpaSettings
from tests.rnic.helpers import Pair

RW = Access.LOCAL_WRITE | Access.REMOTE_WRITE
RR = Access.LOCAL_WRITE | Access.REMOTE_READ
RA = Access.LOCAL_WRITE | Access.REMOTE_ATOMIC


def test_rdmap_08_send_lands_in_posted_receive() -> None:
    p = Pair()
    src = p.a.mr(b"hello, iwarp")
    dst = p.b.mr(64)
    p.b.qp.post_recv(RecvWR(7, (p.b.sge(dst),)))
    p.a.qp.post_send(SendWR(1, WrOpcode.SEND, (p.a.sge(src),)))
    p.pump()
    (rwc,) = p.b.cq.poll()
    assert (rwc.wr_id, rwc.status, rwc.opcode, rwc.byte_len) == (
        7,
        WcStatus.SUCCESS,
        WcOpcode.RECV,
        12,
    )
    assert bytes(dst.buf[:12]) == b"hello, iwarp"
    (swc,) = p.a.cq.poll()
    assert (swc.wr_id, swc.status, swc.opcode) == (1, WcStatus.SUCCESS, WcOpcode.SEND)


def test_send_scatter_gather_multi_sge_and_segmentation() -> None:
    p = Pair()
    payload = bytes(range(256)) * 40  # 10240 bytes: several FPDUs at MULPDU ~1442
    src = p.a.mr(payload)
    dst1, dst2 = p.b.mr(4000), p.b.mr(8000)
    p.b.qp.post_recv(RecvWR(1, (p.b.sge(dst1), p.b.sge(dst2))))
    p.a.qp.post_send(SendWR(2, WrOpcode.SEND, (p.a.sge(src, 0, 5000), p.a.sge(src, 5000, 5240))))
    p.pump()
    (rwc,) = p.b.cq.poll()
    assert rwc.byte_len == len(payload)
    assert bytes(dst1.buf) + bytes(dst2.buf[:6240]) == payload
    assert len(p.a.sent[0]) > len(payload)  # framed in several FPDUs
    # DDP-02: several untagged Send segments, L set on the last one only.
    assert p.a.sent[0].count(b"\x01\x43") >= 6
    assert p.a.sent[0].count(b"\x41\x43") == 1


def test_send_with_solicited_event_raises_notification() -> None:
    p = Pair()
    dst = p.b.mr(16)
    p.b.qp.post_recv([RecvWR(1, (p.b.sge(dst),)), RecvWR(2, (p.b.sge(dst),))])
    p.b.cq.req_notify(solicited_only=True)
    p.a.qp.post_send(SendWR(1, WrOpcode.SEND, inline_data=b"plain"))
    p.pump()
    assert p.b.cq._events == 0
    p.a.qp.post_send(
        SendWR(
            2,
            WrOpcode.SEND,
            inline_data=b"urgent",
            send_flags=SendFlags.SIGNALED | SendFlags.SOLICITED,
        )
    )
    p.pump()
    assert p.b.cq._events == 1
    wcs = p.b.cq.poll()
    assert [bool(wc.wc_flags & WcFlags.SOLICITED) for wc in wcs] == [False, True]


def test_rdmap_09_send_with_invalidate_invalidates_the_stag() -> None:
    p = Pair()
    exposed = p.b.fast_mr(32, RW)  # remotely invalidatable: fast-registered
    dst = p.b.mr(16)
    p.b.qp.post_recv(RecvWR(1, (p.b.sge(dst),)))
    p.a.qp.post_send(
        SendWR(1, WrOpcode.SEND_WITH_INV, inline_data=b"done", invalidate_rkey=exposed.rkey)
    )
    p.pump()
    (wc,) = p.b.cq.poll()
    assert wc.wc_flags & WcFlags.WITH_INV and wc.invalidated_rkey == exposed.rkey
    assert not exposed.valid
    # SEC-06: after revocation no packet can modify the buffer.
    p.a.qp.post_send(
        SendWR(
            2, WrOpcode.RDMA_WRITE, inline_data=b"late", rkey=exposed.rkey, remote_addr=exposed.base
        )
    )
    p.pump()
    assert bytes(exposed.buf) == bytes(32)
    assert p.a.qp.peer_terminate is not None
    assert p.a.qp.peer_terminate.cause == (1, 1, 0)


def test_rdmap_09_send_with_invalidate_of_foreign_stag_terminates() -> None:
    p = Pair()
    other_pd = p.b.rnic.alloc_pd()
    foreign = other_pd.reg_mr(bytearray(8), RW)
    dst = p.b.mr(16)
    p.b.qp.post_recv(RecvWR(1, (p.b.sge(dst),)))
    p.a.qp.post_send(
        SendWR(1, WrOpcode.SEND_WITH_INV, inline_data=b"x", invalidate_rkey=foreign.rkey)
    )
    p.pump()
    assert foreign.valid
    term = p.a.qp.peer_terminate
    assert term is not None and term.cause == (0, 1, 0x09)
    assert p.b.qp.state is QpState.TERMINATE and p.a.qp.state is QpState.TERMINATE
    p.close_streams()  # RFC 5040 §6.2.1: ERROR once the stream has closed
    assert p.b.qp.state is QpState.ERROR and p.a.qp.state is QpState.ERROR


def test_rdmap_05_rdma_write_places_without_completion_at_target() -> None:
    p = Pair()
    target = p.b.mr(4096, RW)
    src = p.a.mr(bytes(range(200)))
    p.a.qp.post_send(
        SendWR(
            5, WrOpcode.RDMA_WRITE, (p.a.sge(src),), rkey=target.rkey, remote_addr=target.base + 100
        )
    )
    p.pump()
    assert bytes(target.buf[100:300]) == bytes(range(200))
    assert p.b.cq.poll() == []
    (wc,) = p.a.cq.poll()
    assert (wc.opcode, wc.byte_len) == (WcOpcode.RDMA_WRITE, 200)


def test_ext_09_write_with_immediate_completes_after_placement() -> None:
    p = Pair()
    target = p.b.mr(64, RW)
    p.b.qp.post_recv(RecvWR(9, ()))
    p.a.qp.post_send(
        SendWR(
            1,
            WrOpcode.RDMA_WRITE_WITH_IMM,
            inline_data=b"block",
            rkey=target.rkey,
            remote_addr=target.base,
            imm_data=0x0102030405060708,
        )
    )
    p.pump()
    (wc,) = p.b.cq.poll()
    assert wc.opcode is WcOpcode.RECV_RDMA_WITH_IMM and wc.imm_data == bytes(range(1, 9))
    assert bytes(target.buf[:5]) == b"block"


def test_rdmap_06_read_returns_remote_bytes() -> None:
    p = Pair()
    source = p.b.mr(bytes(range(256)) * 16, RR)
    sink = p.a.mr(1000)
    p.a.qp.post_send(
        SendWR(
            3, WrOpcode.RDMA_READ, (p.a.sge(sink),), rkey=source.rkey, remote_addr=source.base + 24
        )
    )
    p.pump()
    (wc,) = p.a.cq.poll()
    assert (wc.status, wc.opcode, wc.byte_len) == (WcStatus.SUCCESS, WcOpcode.RDMA_READ, 1000)
    assert bytes(sink.buf) == bytes(source.buf[24:1024])


def test_rdmap_07_zero_length_read_needs_no_valid_stag() -> None:
    p = Pair()
    sink = p.a.mr(8)
    p.a.qp.post_send(
        SendWR(1, WrOpcode.RDMA_READ, (p.a.sge(sink, 0, 0),), rkey=0xDEAD, remote_addr=0)
    )
    p.pump()
    (wc,) = p.a.cq.poll()
    assert wc.status is WcStatus.SUCCESS and wc.byte_len == 0


def test_rdmap_14_reads_beyond_ord_wait_their_turn() -> None:
    p = Pair(a_qp={"ord": 2})
    source = p.b.mr(bytes(range(64)), RR)
    sinks = [p.a.mr(8) for _ in range(5)]
    p.a.qp.post_send(
        [
            SendWR(
                i,
                WrOpcode.RDMA_READ,
                (p.a.sge(s),),
                rkey=source.rkey,
                remote_addr=source.base + 8 * i,
            )
            for i, s in enumerate(sinks)
        ]
    )
    assert p.a.qp.outstanding_remote == 2
    p.step(p.a, p.b)
    assert p.b.qp._inbound_pending == 2  # only two requests crossed the wire
    p.pump()
    assert [wc.wr_id for wc in p.a.cq.poll()] == [0, 1, 2, 3, 4]
    assert [bytes(s.buf) for s in sinks] == [bytes(range(8 * i, 8 * i + 8)) for i in range(5)]


def test_sec_10_ird_overflow_terminates() -> None:
    p = Pair(a_qp={"ord": 8}, b_qp={"ird": 2})
    source = p.b.mr(64, RR)
    sink = p.a.mr(8)
    p.a.qp.post_send(
        [
            SendWR(
                i, WrOpcode.RDMA_READ, (p.a.sge(sink),), rkey=source.rkey, remote_addr=source.base
            )
            for i in range(3)
        ]
    )
    p.pump()
    term = p.a.qp.peer_terminate
    assert term is not None and term.cause == (0, 2, 0x07)
    statuses = [wc.status for wc in p.a.cq.poll()]
    assert statuses[0] is WcStatus.REM_OP_ERR
    assert set(statuses[1:]) == {WcStatus.WR_FLUSH_ERR}


def test_ext_06_fetch_add_and_cmp_swap_with_masks() -> None:
    p = Pair()
    word = p.b.mr(16, RA)
    struct.pack_into("<Q", word.buf, 0, 0x00000000FFFFFFFF)
    result = p.a.mr(8)
    p.a.qp.post_send(
        SendWR(
            1,
            WrOpcode.ATOMIC_FETCH_AND_ADD,
            (p.a.sge(result),),
            rkey=word.rkey,
            remote_addr=word.base,
            compare_add=0x0000000100000001,
            compare_add_mask=0x8000000080000000,
        )
    )
    p.pump()
    assert struct.unpack("<Q", result.buf)[0] == 0x00000000FFFFFFFF
    assert struct.unpack_from("<Q", word.buf)[0] == 0x0000000100000000
    p.a.qp.post_send(
        SendWR(
            2,
            WrOpcode.ATOMIC_CMP_AND_SWP,
            (p.a.sge(result),),
            rkey=word.rkey,
            remote_addr=word.base,
            compare_add=0x0000000100000000,
            swap=0xAAAA,
        )
    )
    p.pump()
    assert struct.unpack_from("<Q", word.buf)[0] == 0xAAAA
    assert [wc.opcode for wc in p.a.cq.poll()] == [WcOpcode.FETCH_ADD, WcOpcode.COMP_SWAP]


def test_ext_06_kbtp_ring_counter_advances_ticket_and_slot() -> None:
    n = 3
    p = Pair()
    head = p.b.mr(8, RA)
    result = p.a.mr(8)
    mask = (1 << 63) | (1 << 31) | (1 << (n + 3))
    seen = []
    for i in range(10):
        p.a.qp.post_send(
            SendWR(
                i,
                WrOpcode.ATOMIC_FETCH_AND_ADD,
                (p.a.sge(result),),
                rkey=head.rkey,
                remote_addr=head.base,
                compare_add=0x0000000100000010,
                compare_add_mask=mask,
            )
        )
        p.pump()
        seen.append(struct.unpack("<Q", result.buf)[0])
    assert [(v >> 32, v & 0xFFFFFFFF) for v in seen] == [(i, 16 * (i % 8)) for i in range(10)]
    assert struct.unpack("<Q", head.buf)[0] == fetch_add(seen[-1], 0x0000000100000010, mask)


def test_ext_05_misaligned_atomic_terminates_and_leaves_memory() -> None:
    p = Pair()
    word = p.b.mr(bytes(range(16)), RA)
    result = p.a.mr(8)
    p.a.qp.post_send(
        SendWR(
            1,
            WrOpcode.ATOMIC_FETCH_AND_ADD,
            (p.a.sge(result),),
            rkey=word.rkey,
            remote_addr=word.base + 4,
            compare_add=1,
        )
    )
    p.pump()
    assert bytes(word.buf) == bytes(range(16))
    assert p.a.qp.peer_terminate is not None and p.a.qp.peer_terminate.cause == (0, 2, 0x07)
    (wc,) = p.a.cq.poll()
    assert wc.status is WcStatus.REM_OP_ERR


def test_rdmap_08_send_without_posted_receive_terminates() -> None:
    p = Pair()
    p.a.qp.post_send(SendWR(1, WrOpcode.SEND, inline_data=b"nobody listens"))
    p.pump()
    term = p.a.qp.peer_terminate
    assert term is not None and term.cause == (1, 2, 0x02)
    assert term.m and term.d and not term.r
    assert term.ddp_header[:2] == bytes([0x41, Opcode.SEND | 0x40])


def test_rdmap_08_send_longer_than_receive_terminates() -> None:
    p = Pair()
    dst = p.b.mr(4)
    p.b.qp.post_recv(RecvWR(1, (p.b.sge(dst),)))
    p.a.qp.post_send(SendWR(1, WrOpcode.SEND, inline_data=b"too long for four"))
    p.pump()
    assert p.a.qp.peer_terminate is not None and p.a.qp.peer_terminate.cause == (1, 2, 0x05)
    assert bytes(dst.buf) == bytes(4)
    (rwc,) = p.b.cq.poll()
    assert rwc.status is WcStatus.WR_FLUSH_ERR


def test_rdmap_13_completions_in_submit_order_with_selective_signalling() -> None:
    p = Pair()
    source = p.b.mr(64, RR)
    dst = p.b.mr(64)
    sink = p.a.mr(64)
    p.b.qp.post_recv([RecvWR(i, (p.b.sge(dst),)) for i in range(3)])
    p.a.qp.post_send(
        [
            SendWR(
                1, WrOpcode.RDMA_READ, (p.a.sge(sink),), rkey=source.rkey, remote_addr=source.base
            ),
            SendWR(2, WrOpcode.SEND, inline_data=b"a", send_flags=SendFlags.NONE),
            SendWR(3, WrOpcode.SEND, inline_data=b"b"),
        ]
    )
    p.step(p.a, p.b)  # the Read Request and both Sends are on the wire; no response yet
    assert p.a.cq.poll() == []  # the Sends may not complete before the earlier Read
    p.pump()
    assert [wc.wr_id for wc in p.a.cq.poll()] == [1, 3]


def test_fence_waits_for_earlier_reads() -> None:
    p = Pair()
    source = p.b.mr(8, RR)
    sink = p.a.mr(8)
    target = p.b.mr(8, RW)
    p.a.qp.post_send(
        [
            SendWR(
                1, WrOpcode.RDMA_READ, (p.a.sge(sink),), rkey=source.rkey, remote_addr=source.base
            ),
            SendWR(
                2,
                WrOpcode.RDMA_WRITE,
                inline_data=b"fenced!!",
                rkey=target.rkey,
                remote_addr=target.base,
                send_flags=SendFlags.SIGNALED | SendFlags.FENCE,
            ),
        ]
    )
    assert len(p.a.qp._pending) == 1  # the fenced Write waits for the Read
    p.pump()
    assert bytes(target.buf) == b"fenced!!"
    assert [wc.wr_id for wc in p.a.cq.poll()] == [1, 2]


def test_local_invalidate_work_request() -> None:
    p = Pair()
    mr = p.a.mr(8, RW)
    p.a.qp.post_send(SendWR(1, WrOpcode.LOCAL_INV, invalidate_rkey=mr.rkey))
    p.pump()
    (wc,) = p.a.cq.poll()
    assert wc.opcode is WcOpcode.LOCAL_INV and not mr.valid


def test_zero_based_memory_region() -> None:
    p = Pair()
    target = p.b.mr(32, RW | Access.ZERO_BASED)
    p.a.qp.post_send(
        SendWR(1, WrOpcode.RDMA_WRITE, inline_data=b"zb", rkey=target.rkey, remote_addr=10)
    )
    p.pump()
    assert bytes(target.buf[10:12]) == b"zb"


def test_shared_receive_queue_feeds_the_qp() -> None:
    p = Pair()
    srq = p.b.rnic.create_srq(p.b.pd)
    p.b.qp.srq = srq
    dst = p.b.mr(8)
    srq.post_recv(RecvWR(42, (p.b.sge(dst),)))
    p.a.qp.post_send(SendWR(1, WrOpcode.SEND, inline_data=b"srq"))
    p.pump()
    (wc,) = p.b.cq.poll()
    assert wc.wr_id == 42 and bytes(dst.buf[:3]) == b"srq"


def test_sec_09_cq_overflow_errors_only_that_qp() -> None:
    p = Pair(cq_capacity=2)
    dst = p.b.mr(8)
    p.b.qp.post_recv([RecvWR(i, (p.b.sge(dst),)) for i in range(3)])
    for i in range(3):
        p.a.qp.post_send(SendWR(i, WrOpcode.SEND, inline_data=b"x", send_flags=SendFlags.NONE))
    p.pump()
    assert p.b.qp.state is QpState.TERMINATE
    assert p.a.qp.peer_terminate is not None
    p.close_streams()
    assert p.b.qp.state is QpState.ERROR


def test_post_send_after_error_flushes() -> None:
    p = Pair()
    p.a.qp.fatal(None, send_terminate=False)
    p.a.qp.post_send(SendWR(9, WrOpcode.SEND, inline_data=b"x"))
    (wc,) = p.a.cq.poll()
    assert wc.status is WcStatus.WR_FLUSH_ERR


def test_local_protection_error_on_bad_lkey() -> None:
    from stack.rnic import Sge

    p = Pair()
    p.a.qp.post_send(SendWR(1, WrOpcode.SEND, (Sge(0, 4, 0x12345678),)))
    p.pump()
    (wc,) = p.a.cq.poll()
    assert wc.status is WcStatus.LOC_PROT_ERR
    assert p.a.qp.state is QpState.TERMINATE
    p.close_streams()
    assert p.a.qp.state is QpState.ERROR


async def test_cq_next_waits_for_a_completion() -> None:
    p = Pair()
    dst = p.b.mr(8)
    p.b.qp.post_recv(RecvWR(1, (p.b.sge(dst),)))

    async def later() -> None:
        await trio.sleep(0.01)
        p.a.qp.post_send(SendWR(1, WrOpcode.SEND, inline_data=b"x"))
        p.pump()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(later)
        wc = await p.b.cq.next()
    assert wc.wr_id == 1


def test_ext_06_compare_mask_zero_swaps_unconditionally() -> None:
    """RFC 7306 §5.1: a Compare Mask of 0 compares nothing, so the swap always happens;
    leaving the mask out is the plain verbs CmpSwap (all ones)."""
    p = Pair()
    word = p.b.mr(struct.pack("<Q", 5), Access.LOCAL_WRITE | Access.REMOTE_ATOMIC)
    result = p.a.mr(8)
    for wr_id, mask, expect in ((1, None, 5), (2, 0, 9)):
        p.a.qp.post_send(
            SendWR(wr_id, WrOpcode.ATOMIC_CMP_AND_SWP, (p.a.sge(result),), rkey=word.rkey,
                   remote_addr=word.base, compare_add=123, swap=9, compare_add_mask=mask)
        )  # fmt: skip
        p.pump()
        assert struct.unpack("<Q", word.buf)[0] == expect, mask


def test_rdmap_14_the_read_rtr_counts_against_ord() -> None:
    """RFC 6581 §9.2: the initiator's zero-length Read RTR is a Read; with ORD 1 the first
    real Read waits until the RTR is answered (RDMAP-14: ORD never exceeded)."""
    from stack.constants import Opcode, RtrType
    from stack.wire.events import MpaSettings
    from stack.wire.framing import FpduDeframer
    from stack.wire.rdmap import decode_ulpdu

    settings = MpaSettings(p2p=True, rtr=RtrType.READ, ird=1, ord=1)
    p = Pair(settings, MpaSettings(rtr=RtrType.READ, ird=1, ord=1), a_qp={"ord": 1})
    region = p.b.mr(16, Access.LOCAL_WRITE | Access.REMOTE_READ)
    sink = p.a.mr(16)
    p.a.qp.post_send(
        SendWR(1, WrOpcode.RDMA_READ, (p.a.sge(sink),), rkey=region.rkey, remote_addr=region.base)
    )
    first = bytes(p.a.endpoint.produce())  # type: ignore[union-attr]
    deframer = FpduDeframer(crc=p.a.engine.negotiated.crc)  # type: ignore[union-attr]
    deframer.feed(first)
    reads = [u for u in deframer if decode_ulpdu(u).opcode == Opcode.RDMA_READ_REQUEST]
    assert len(reads) == 1  # only the RTR is outstanding
    p.b.endpoint.feed(first)  # type: ignore[union-attr]
    p.pump()
    assert p.a.qp.ord_reserved == 0
    assert [wc.status for wc in p.a.cq.poll(4)] == [WcStatus.SUCCESS]


def test_on_remote_write_fires_once_per_placed_write_segment_with_the_data_in_place() -> None:
    """RFC 5040 §5.1: a Write completes nothing at its target; the software RNIC's
    ``on_remote_write`` hook reports each placed segment (a Send does not call it)."""
    p = Pair(MpaSettings(mulpdu=512), MpaSettings(mulpdu=512))
    target = p.b.mr(4096, Access.LOCAL_WRITE | Access.REMOTE_WRITE)
    seen: list[bytes] = []
    p.b.qp.on_remote_write = lambda: seen.append(bytes(target.buf[:1500]))
    p.b.qp.post_recv(RecvWR(1, (p.b.sge(p.b.mr(64, Access.LOCAL_WRITE)),)))
    data = bytes(range(256)) * 6  # 1536 octets: several tagged segments at MULPDU 512
    src = p.a.mr(data)
    p.a.qp.post_send(SendWR(1, WrOpcode.SEND, (p.a.sge(src, 0, 16),)))
    p.pump()
    assert seen == []
    p.a.qp.post_send(
        SendWR(2, WrOpcode.RDMA_WRITE, (p.a.sge(src),), rkey=target.rkey, remote_addr=target.base)
    )
    p.pump()
    assert len(seen) > 2 and bytes(target.buf[:1536]) == data
    assert seen[-1] == data[:1500]  # the last call comes after the last octets landed
    assert all(a != b for a, b in zip(seen, seen[1:], strict=False))  # each placed more
