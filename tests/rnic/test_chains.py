"""Work-request chains (stack.rnic.chains): WAIT on a receive or a CQ count, ENABLE,
execution-time patches through the protection checks, fallback, failure and flush."""

from __future__ import annotations

import struct

import pytest
import trio

from stack.errors import LocalError
from stack.rnic import (
    Access,
    Branch,
    Chain,
    Check,
    Cmp,
    Guard,
    LocalAtomic,
    LocalWrite,
    Patch,
    PatchField,
    QpState,
    RecvWR,
    Ref,
    SendFlags,
    SendWR,
    Sge,
    WaitCq,
    WaitRecv,
    WcOpcode,
    WcStatus,
    WorkCompletion,
    WrOpcode,
)
from tests.e2e.helpers import tcp_pair
from tests.rnic.helpers import Pair, Side

RW = Access.LOCAL_WRITE | Access.REMOTE_WRITE
ENTRIES = 4
REPLY = b"OK" + bytes(6)  # octets 2-5 patched from the request
REQ = struct.Struct(">IIQI")  # index | rkey | remote addr | tag


class Server:
    """Side b serves 'index -> block' lookups by a chain: entry = length(4) | addr(8)."""

    def __init__(self, side: Side, *, entry_lkey: int | None = None) -> None:
        self.side = side
        self.pool = side.mr(bytes(range(256)) * 4)
        self.table = side.mr(16 * ENTRIES)
        self.inbox = side.mr(64 * 4)
        side.qp.post_recv([RecvWR(i, (side.sge(self.inbox, 64 * i, 64),)) for i in range(4)])
        self.entry_lkey = self.table.lkey if entry_lkey is None else entry_lkey

    def set_entry(self, i: int, length: int, offset: int) -> None:
        struct.pack_into(">IQ", self.table.buf, 16 * i, length, self.pool.base + offset)

    def entry(self, at: int, width: int) -> Ref:
        index = Ref.recv(0, 4)
        return Ref(self.entry_lkey, self.table.base + at, width, index=index, scale=16)

    def branch(self) -> Branch:
        write = SendWR(1, WrOpcode.RDMA_WRITE, (Sge(0, 0, self.pool.lkey),), SendFlags.NONE)
        reply = SendWR(2, WrOpcode.SEND, inline_data=REPLY, send_flags=SendFlags.NONE)
        return Branch(
            (write, reply),
            patches=(
                Patch(0, PatchField.RKEY, Ref.recv(4, 4)),
                Patch(0, PatchField.REMOTE_ADDR, Ref.recv(8, 8)),
                Patch(0, PatchField.SGE_ADDR, self.entry(4, 8)),
                Patch(0, PatchField.SGE_LENGTH, self.entry(0, 4)),
                Patch(1, PatchField.PAYLOAD, Ref.recv(16, 4), at=2),
            ),
            guards=(
                Guard(Ref.recv_len(), Cmp.EQ, REQ.size),
                Guard(Ref.recv(0, 4), Cmp.LT, ENTRIES),
            ),
        )

    def post(self, *, rearm: bool = True, **kw: object) -> None:
        chain = Chain(77, WaitRecv(), (self.branch(),), rearm=rearm, **kw)  # type: ignore[arg-type]
        self.side.qp.post_chain(chain)


class Client:
    def __init__(self, side: Side) -> None:
        self.side = side
        self.sink = side.mr(1024, RW | Access.REMOTE_READ)
        self.inbox = side.mr(64)

    def ask(self, index: int, tag: int, offset: int = 0, wr_id: int = 5) -> None:
        self.side.qp.post_recv(RecvWR(wr_id, (self.side.sge(self.inbox),)))
        request = REQ.pack(index, self.sink.rkey, self.sink.base + offset, tag)
        self.side.qp.post_send(SendWR(wr_id, WrOpcode.SEND, inline_data=request))


def _setup(**kw: object) -> tuple[Pair, Server, Client]:
    p = Pair()
    server = Server(p.b, **kw)  # type: ignore[arg-type]
    server.set_entry(1, 10, 20)
    server.set_entry(2, 5, 100)
    return p, server, Client(p.a)


def _recvs(side: Side) -> list[tuple[int, WcStatus, WcOpcode]]:
    return [(wc.wr_id, wc.status, wc.opcode) for wc in side.cq.poll(100)]


def test_a_chain_waits_on_a_receive_then_runs_with_fields_patched_at_execution_time() -> None:
    p, server, client = _setup()
    server.post()
    assert not server.side.qp._pending and not server.side.qp._inflight  # waiting, not posted
    server.set_entry(1, 10, 30)  # changed after posting: read when the chain runs
    client.ask(1, 0xA1B2C3D4)
    p.pump()
    assert bytes(client.sink.buf[:10]) == bytes(server.pool.buf[30:40])
    assert bytes(client.sink.buf[10:12]) == b"\0\0"
    assert bytes(client.inbox.buf[:8]) == b"OK" + bytes.fromhex("a1b2c3d4") + b"\0\0"
    assert _recvs(server.side) == []  # consumed by the chain: nothing for the application
    assert len(server.side.qp._rq) == 4  # the RNIC re-posted it
    client.side.cq.poll(100)
    client.ask(2, 7, offset=200)  # re-armed: the next request runs the same chain
    p.pump()
    assert bytes(client.sink.buf[200:205]) == bytes(server.pool.buf[100:105])
    assert _recvs(server.side) == []


def test_a_guard_that_fails_falls_back_and_stalls_the_queue_until_enable() -> None:
    p, server, client = _setup()
    server.post()
    client.ask(9, 1)  # index beyond the table: no branch holds
    p.pump()
    assert _recvs(server.side) == [(0, WcStatus.SUCCESS, WcOpcode.RECV)]  # software's turn
    client.ask(1, 2, wr_id=6)  # arrives while the queue is stalled: held, in order
    p.pump()
    assert _recvs(server.side) == [] and bytes(client.sink.buf[:10]) == bytes(10)
    server.side.qp.post_recv(RecvWR(0, (server.side.sge(server.inbox, 0, 64),)))
    server.side.qp.enable_chains()  # ENABLE: the held request runs now
    p.pump()
    assert bytes(client.sink.buf[:10]) == bytes(server.pool.buf[20:30])
    assert _recvs(server.side) == []


def test_a_held_chain_runs_only_after_enable_and_signals_its_branch() -> None:
    p, server, client = _setup()
    server.post(held=True, rearm=False, signaled=True)
    client.ask(1, 3)
    p.pump()
    assert bytes(client.sink.buf[:10]) == bytes(10)
    server.side.qp.enable_chains(1)
    p.pump()
    assert bytes(client.sink.buf[:10]) == bytes(server.pool.buf[20:30])
    (wc,) = server.side.cq.poll(100)
    assert (wc.wr_id, wc.status, wc.opcode, wc.extra["branch"]) == (
        77,
        WcStatus.SUCCESS,
        WcOpcode.CHAIN,
        0,
    )


def test_a_chain_waits_for_a_cq_count() -> None:
    p, server, client = _setup()
    client.side.qp.post_send(SendWR(1, WrOpcode.SEND, inline_data=b"hi"))  # the RTR
    p.pump()
    server.side.cq.poll(100)
    client.side.cq.poll(100)
    other = server.side.rnic.create_cq(16)
    note = server.side.mr(b"counted!")
    send = SendWR(3, WrOpcode.SEND, (server.side.sge(note),), SendFlags.NONE)
    server.side.qp.post_chain(Chain(8, WaitCq(other, 2), (Branch((send,)),)))
    client.side.qp.post_recv(RecvWR(9, (client.side.sge(client.inbox),)))
    other.push(_wc())
    p.pump()
    assert _recvs(client.side) == []
    other.push(_wc())
    p.pump()
    assert _recvs(client.side) == [(9, WcStatus.SUCCESS, WcOpcode.RECV)]
    assert bytes(client.inbox.buf[:8]) == b"counted!"


def _wc() -> WorkCompletion:
    return WorkCompletion(0, WcStatus.SUCCESS, WcOpcode.SEND, 0)


def _assert_failed(p: Pair, server: Server, client: Client, status: WcStatus) -> None:
    wcs = {wc.opcode: wc for wc in server.side.cq.poll(100)}
    assert wcs[WcOpcode.CHAIN].status is status
    assert server.side.qp.state is QpState.TERMINATE
    assert bytes(client.sink.buf) == bytes(1024)  # nothing reached the requester's memory
    assert server.side.qp.error is not None and server.side.qp.error.rule == "RDMAP-12"


def test_a_patch_pointing_outside_its_mr_fails_the_chain_with_loc_prot_err() -> None:
    p, server, client = _setup()
    server.set_entry(1, 10, len(server.pool.buf) - 4)  # runs past the pool MR
    server.post()
    client.ask(1, 1)
    p.pump()
    _assert_failed(p, server, client, WcStatus.LOC_PROT_ERR)


def test_a_ref_under_a_wrong_stag_fails_the_chain_before_any_wr() -> None:
    p, server, client = _setup(entry_lkey=0x12345600)
    server.post()
    client.ask(1, 1)
    p.pump()
    _assert_failed(p, server, client, WcStatus.LOC_PROT_ERR)
    assert not any(wc.opcode is WcOpcode.RDMA_WRITE for wc in client.side.cq.poll(100))


def test_a_patched_read_sink_without_local_write_fails_and_leaves_memory_unchanged() -> None:
    p, server, client = _setup()
    readonly = server.side.mr(b"keep" * 4, Access(0))
    read = SendWR(4, WrOpcode.RDMA_READ, (Sge(0, 8, readonly.lkey),), SendFlags.NONE)
    branch = Branch(
        (read,),
        patches=(
            Patch(0, PatchField.SGE_ADDR, Ref.recv(0, 4), add=readonly.base),
            Patch(0, PatchField.RKEY, Ref.recv(4, 4)),
            Patch(0, PatchField.REMOTE_ADDR, Ref.recv(8, 8)),
        ),
    )
    server.side.qp.post_chain(Chain(77, WaitRecv(), (branch,)))
    client.ask(0, 1)
    p.pump()
    _assert_failed(p, server, client, WcStatus.LOC_PROT_ERR)
    assert bytes(readonly.buf) == b"keep" * 4


def test_a_receive_ref_past_the_message_is_loc_len_err() -> None:
    p, server, client = _setup()
    short = Branch((), guards=(Guard(Ref.recv(60, 4), Cmp.EQ, 0),))
    server.side.qp.post_chain(Chain(77, WaitRecv(), (short,)))
    client.ask(1, 1)
    p.pump()
    _assert_failed(p, server, client, WcStatus.LOC_LEN_ERR)


def test_a_chain_failing_half_way_completes_what_ran_and_flushes_the_rest() -> None:
    p, server, client = _setup()
    struct.pack_into(">Q", client.sink.buf, 0, 1 << 60)  # an address no MR holds
    scratch = server.side.mr(8)
    read = SendWR(10, WrOpcode.RDMA_READ, (server.side.sge(scratch),), SendFlags.SIGNALED)
    bad = SendWR(11, WrOpcode.SEND, (Sge(0, 8, server.pool.lkey),), SendFlags.FENCE)
    last = SendWR(12, WrOpcode.SEND, inline_data=b"never", send_flags=SendFlags.SIGNALED)
    branch = Branch(
        (read, bad, last),
        patches=(
            Patch(0, PatchField.RKEY, Ref.recv(4, 4)),
            Patch(0, PatchField.REMOTE_ADDR, Ref.recv(8, 8)),
            Patch(1, PatchField.SGE_ADDR, Ref(scratch.lkey, scratch.base, 8)),  # the Read's
        ),
    )
    server.side.qp.post_chain(Chain(77, WaitRecv(), (branch,)))
    client.ask(1, 1)
    p.pump()
    got = [(wc.wr_id, wc.status) for wc in server.side.cq.poll(100)]
    assert got[:3] == [
        (10, WcStatus.SUCCESS),  # ran: its data is in the scratch buffer
        (11, WcStatus.LOC_PROT_ERR),
        (12, WcStatus.WR_FLUSH_ERR),
    ]
    assert (77, WcStatus.LOC_PROT_ERR) in got
    assert bytes(scratch.buf) == struct.pack(">Q", 1 << 60)
    assert server.side.qp.state is QpState.TERMINATE


def test_a_waiting_chain_and_its_held_receives_are_flushed_when_the_qp_fails() -> None:
    p, server, client = _setup()
    server.post()
    blocked = Chain(88, WaitRecv(), (server.branch(),))
    client.ask(9, 1)  # falls back: the queue stalls
    p.pump()
    server.side.qp.post_chain(blocked)
    client.ask(1, 2, wr_id=6)  # held for the chains
    p.pump()
    server.side.cq.poll(100)
    p.close_streams()
    got = {(wc.wr_id, wc.opcode): wc.status for wc in server.side.cq.poll(100)}
    assert got[(77, WcOpcode.CHAIN)] is WcStatus.WR_FLUSH_ERR
    assert got[(88, WcOpcode.CHAIN)] is WcStatus.WR_FLUSH_ERR
    assert got[(1, WcOpcode.RECV)] is WcStatus.WR_FLUSH_ERR  # the held receive
    with pytest.raises(LocalError):
        server.side.qp.post_chain(blocked)


@pytest.mark.parametrize(
    "patch",
    [
        Patch(0, PatchField.COMPARE_ADD, Ref.recv(0, 8)),  # not an atomic
        Patch(1, PatchField.PAYLOAD, Ref.recv(0, 8), at=4),  # past the inline data
        Patch(0, PatchField.SGE_ADDR, Ref.recv(0, 8), at=1),  # no such SGE
        Patch(2, PatchField.RKEY, Ref.recv(0, 4)),  # no such WR
        Patch(0, PatchField.RKEY, Ref.recv(0, 16)),  # a value of more than 8 octets
    ],
)
def test_patches_outside_the_checked_set_are_refused_when_posted(patch: Patch) -> None:
    p, server, _client = _setup()
    base = server.branch()
    branch = Branch(base.wrs, (patch,))
    with pytest.raises(LocalError):
        server.side.qp.post_chain(Chain(1, WaitRecv(), (branch,)))
    with pytest.raises(LocalError):  # a receive Ref with nothing received to read
        server.side.qp.post_chain(Chain(1, WaitCq(server.side.cq, 1), (base,)))


async def test_a_chain_serves_requests_over_real_tcp() -> None:
    with trio.fail_after(30):
        async with tcp_pair() as (client, server):
            pool = server.mr(bytes(range(200)))
            table = server.mr(16 * ENTRIES)
            struct.pack_into(">IQ", table.buf, 16, 50, pool.base + 100)
            inbox = server.mr(64)
            server.qp.post_recv(RecvWR(0, (server.sge(inbox),)))
            index = Ref.recv(0, 4)
            write = SendWR(1, WrOpcode.RDMA_WRITE, (Sge(0, 0, pool.lkey),), SendFlags.NONE)
            reply = SendWR(2, WrOpcode.SEND, inline_data=REPLY, send_flags=SendFlags.NONE)
            branch = Branch(
                (write, reply),
                patches=(
                    Patch(0, PatchField.RKEY, Ref.recv(4, 4)),
                    Patch(0, PatchField.REMOTE_ADDR, Ref.recv(8, 8)),
                    Patch(
                        0,
                        PatchField.SGE_ADDR,
                        Ref(table.lkey, table.base + 4, 8, index=index, scale=16),
                    ),
                    Patch(
                        0,
                        PatchField.SGE_LENGTH,
                        Ref(table.lkey, table.base, 4, index=index, scale=16),
                    ),
                    Patch(1, PatchField.PAYLOAD, Ref.recv(16, 4), at=2),
                ),
                guards=(Guard(index, Cmp.LT, ENTRIES),),
            )
            server.qp.post_chain(Chain(1, WaitRecv(), (branch,), rearm=True))
            sink = client.mr(256, RW)
            answer = client.mr(64)
            for tag in (1, 2, 3):
                client.qp.post_recv(RecvWR(tag, (client.sge(answer),)))
                request = REQ.pack(1, sink.rkey, sink.base + tag, tag)
                client.qp.post_send(SendWR(tag, WrOpcode.SEND, inline_data=request))
                wcs = [await client.cq.next(), await client.cq.next()]
                recv = next(wc for wc in wcs if wc.opcode is WcOpcode.RECV)
                assert recv.status is WcStatus.SUCCESS
                assert bytes(answer.buf[2:6]) == tag.to_bytes(4, "big")
                assert bytes(sink.buf[tag : tag + 50]) == bytes(pool.buf[100:150])
            assert server.cq.poll(100) == []  # the server application was never called


def _read_then_record(server: Server, record_lkey: int, record_addr: int) -> Branch:
    """Read the requester's 8 octets into the pool, then record the request's tag."""
    read = SendWR(4, WrOpcode.RDMA_READ, (Sge(server.pool.base, 8, server.pool.lkey),))
    note = LocalWrite(Ref(record_lkey, record_addr, 4), Ref.recv(16, 4))
    reply = SendWR(5, WrOpcode.SEND, inline_data=REPLY, send_flags=SendFlags.NONE)
    return Branch(
        (read, note, reply),
        patches=(
            Patch(0, PatchField.RKEY, Ref.recv(4, 4)),
            Patch(0, PatchField.REMOTE_ADDR, Ref.recv(8, 8)),
            Patch(2, PatchField.PAYLOAD, Ref(record_lkey, record_addr, 4), at=2),
        ),
    )


def test_a_local_write_runs_after_the_read_before_it_and_before_the_wrs_after_it() -> None:
    p, server, client = _setup()
    struct.pack_into(">Q", client.sink.buf, 0, 0x1122334455667788)
    record = server.side.mr(8)
    branch = _read_then_record(server, record.lkey, record.base + 2)
    server.side.qp.post_chain(Chain(77, WaitRecv(), (branch,)))
    client.ask(1, 0xCAFEF00D)
    p.pump()
    assert bytes(server.pool.buf[:8]) == bytes.fromhex("1122334455667788")  # the Read
    assert bytes(record.buf[2:6]) == bytes.fromhex("cafef00d")  # then the LocalWrite
    assert bytes(client.inbox.buf[2:6]) == bytes.fromhex("cafef00d")  # then the Send
    assert [wc.wr_id for wc in server.side.cq.poll(100)] == [4]


def test_a_local_write_into_memory_without_local_write_fails_the_chain() -> None:
    p, server, client = _setup()
    readonly = server.side.mr(8, Access(0))
    branch = _read_then_record(server, readonly.lkey, readonly.base)
    server.side.qp.post_chain(Chain(77, WaitRecv(), (branch,)))
    client.ask(1, 0xCAFEF00D)
    p.pump()
    _assert_failed(p, server, client, WcStatus.LOC_PROT_ERR)
    assert bytes(readonly.buf) == bytes(8)
    with pytest.raises(LocalError):  # widths must agree
        bad = LocalWrite(Ref(readonly.lkey, readonly.base, 4), b"12345")
        server.side.qp.post_chain(Chain(1, WaitRecv(), (Branch((bad,)),)))


# -- LocalAtomic and Check: a ring allocation run by the RNIC ----------------------------
SLOTS = 4  # 2^n slots of 16 octets: Sequence (4) | reserved (4) | value (8), big-endian
TICKET_ADD = 0x0000_0001_0000_0010
TICKET_MASK = (1 << 63) | (1 << 31) | (1 << 5)  # the carries dropped at bit 63, 31 and n+3


class Ring:
    """Side b hands out ring values: a masked FetchAdd on Head, a Check of the slot's
    Sequence against the ticket, the slot consumed, the value sent back."""

    def __init__(self, side: Side, *, head_addr: int = 0, head_access: Access | None = None):
        self.side = side
        self.head = side.mr(16, Access.LOCAL_WRITE if head_access is None else head_access)
        self.head_addr = self.head.base + head_addr
        self.slots = side.mr(16 * SLOTS)
        self.scratch = side.mr(8)
        self.inbox = side.mr(64 * 2)
        side.qp.post_recv([RecvWR(i, (side.sge(self.inbox, 64 * i, 64),)) for i in range(2)])
        for s in range(SLOTS):
            self.fill(s, s, 0x1000 + s)

    def fill(self, slot: int, sequence: int, value: int) -> None:
        struct.pack_into(">IIQ", self.slots.buf, 16 * slot, sequence, 0, value)

    def slot(self, at: int, width: int) -> Ref:
        offset = Ref(self.scratch.lkey, self.scratch.base + 4, 4)  # low half of the result
        return Ref(self.slots.lkey, self.slots.base + at, width, index=offset)

    def chain(self, **kw: object) -> Chain:
        ticket = Ref(self.scratch.lkey, self.scratch.base, 4)  # high half of the result
        take = LocalAtomic(
            Ref(self.head.lkey, self.head_addr, 8, "little"),
            Ref(self.scratch.lkey, self.scratch.base, 8),
            TICKET_ADD,
            TICKET_MASK,
        )
        check = Check((Guard(self.slot(0, 4), Cmp.EQ, ticket),))
        consume = LocalWrite(self.slot(8, 8), bytes([0xFF]) * 8)
        reply = SendWR(6, WrOpcode.SEND, inline_data=bytes(16), send_flags=SendFlags.NONE)
        branch = Branch(
            (take, check, reply, consume),
            patches=(
                Patch(2, PatchField.PAYLOAD, Ref(self.scratch.lkey, self.scratch.base, 8)),
                Patch(2, PatchField.PAYLOAD, self.slot(8, 8), at=8),
            ),
        )
        return Chain(40, WaitRecv(), (branch,), **kw)  # type: ignore[arg-type]

    def head_value(self) -> int:
        return int.from_bytes(self.head.buf[self.head_addr - self.head.base :][:8], "little")


def _ask(client: Client, wr_id: int = 5) -> None:
    client.side.qp.post_recv(RecvWR(wr_id, (client.side.sge(client.inbox),)))
    client.side.qp.post_send(SendWR(wr_id, WrOpcode.SEND, inline_data=b"take"))


def test_a_local_fetch_add_feeds_a_check_and_the_addresses_after_it() -> None:
    p = Pair()
    ring, client = Ring(p.b), Client(p.a)
    p.b.qp.post_chain(ring.chain(rearm=True))
    answers = []
    for _ in range(SLOTS + 1):
        _ask(client)
        p.pump()
        answers.append(struct.unpack(">IIQ", client.inbox.buf[:16]))
        client.side.cq.poll(100)
        if len(answers) == 2:
            ring.fill(0, SLOTS, 0x2000)  # slot 0 refilled for ticket N
    assert answers[:SLOTS] == [(t, 16 * t, 0x1000 + t) for t in range(SLOTS)]
    assert answers[SLOTS] == (SLOTS, 0, 0x2000)  # the Slot Offset wrapped, the Ticket did not
    assert ring.head_value() == ((SLOTS + 1) << 32) | 16  # masked: no carry into bit 32
    assert struct.unpack_from(">Q", ring.slots.buf, 8)[0] == (1 << 64) - 1  # consumed
    assert _recvs(p.b) == []  # all answered by the RNIC


def test_a_failing_check_stops_the_chain_there_and_falls_back() -> None:
    p = Pair()
    ring, client = Ring(p.b), Client(p.a)
    ring.fill(0, 2**32 - SLOTS, (1 << 64) - 1)  # ticket 0's slot not yet filled
    p.b.qp.post_chain(ring.chain(rearm=True, signaled=True))
    _ask(client)
    p.pump()
    wcs = {wc.opcode: wc for wc in p.b.cq.poll(100)}
    assert wcs[WcOpcode.RECV].status is WcStatus.SUCCESS  # the application's turn
    assert (wcs[WcOpcode.CHAIN].extra["branch"], wcs[WcOpcode.CHAIN].extra["stopped"]) == (0, 1)
    assert ring.head_value() == (1 << 32) | 16  # the FetchAdd before the Check stays done
    assert int.from_bytes(ring.scratch.buf, "big") == 0  # the ticket it took: 0
    assert WcOpcode.RECV not in {wc.opcode for wc in client.side.cq.poll(100)}  # no reply
    _ask(client, wr_id=6)  # stalled until ENABLE
    p.pump()
    assert ring.head_value() == (1 << 32) | 16
    p.b.qp.post_recv(RecvWR(0, (p.b.sge(ring.inbox, 0, 64),)))
    p.b.qp.enable_chains()
    p.pump()
    assert struct.unpack(">IIQ", client.inbox.buf[:16]) == (1, 16, 0x1001)


def test_a_local_atomic_without_local_write_or_misaligned_fails_and_changes_nothing() -> None:
    for ring_kw in ({"head_access": Access(0)}, {"head_addr": 4}):
        p = Pair()
        ring, client = Ring(p.b, **ring_kw), Client(p.a)
        p.b.qp.post_chain(ring.chain())
        _ask(client)
        p.pump()
        wcs = {wc.opcode: wc for wc in p.b.cq.poll(100)}
        assert wcs[WcOpcode.CHAIN].status is WcStatus.LOC_PROT_ERR
        assert p.b.qp.state is QpState.TERMINATE
        assert bytes(ring.head.buf) == bytes(16) and bytes(ring.scratch.buf) == bytes(8)


def test_local_atomics_outside_the_checked_set_are_refused_when_posted() -> None:
    p = Pair()
    ring = Ring(p.b)
    head = Ref(ring.head.lkey, ring.head.base, 8)
    for bad in (
        LocalAtomic(Ref(ring.head.lkey, ring.head.base, 4), head, 1),
        LocalAtomic(head, Ref.recv(0, 8), 1),
        LocalAtomic(Ref.recv(0, 8), head, 1),
    ):
        with pytest.raises(LocalError):
            p.b.qp.post_chain(Chain(1, WaitRecv(), (Branch((bad,)),)))
    with pytest.raises(LocalError):  # a Check's Refs are checked like a guard's
        check = Check((Guard(Ref.recv(0, 4), Cmp.EQ, 0),))
        p.b.qp.post_chain(Chain(1, WaitCq(p.b.cq, 1), (Branch((check,)),)))


def test_a_local_write_with_add_writes_the_value_plus_add_in_the_refs_byte_order() -> None:
    p, server, client = _setup()
    counter = server.side.mr(bytes.fromhex("00fffffe"))
    at = Ref(counter.lkey, counter.base + 2, 2)
    bump = LocalWrite(at, at, add=3)  # 0xfffe + 3 wraps to 0x0001 in two octets
    reply = SendWR(5, WrOpcode.SEND, inline_data=REPLY, send_flags=SendFlags.NONE)
    branch = Branch((bump, reply), patches=(Patch(1, PatchField.PAYLOAD, at, at=2),))
    server.side.qp.post_chain(Chain(3, WaitRecv(), (branch,)))
    client.ask(1, 0)
    p.pump()
    assert bytes(counter.buf) == bytes.fromhex("00ff0001")
    assert bytes(client.inbox.buf[2:4]) == bytes.fromhex("0001")  # patched after the write
    with pytest.raises(LocalError):  # constant bytes take no add
        bad = LocalWrite(at, b"12", add=1)
        server.side.qp.post_chain(Chain(1, WaitRecv(), (Branch((bad,)),)))


# -- keyed chains: runs of other keys in flight at once; the run's own scratch ------------
def _keyed(server: Server, record: Side, key: Ref) -> Chain:
    """Index 1: Read, then a LocalWrite, then the reply; any other index: the reply."""
    log = record.mr(8)
    slow = _read_then_record(server, log.lkey, log.base)
    slow = Branch(slow.wrs, slow.patches, (Guard(Ref.recv(0, 4), Cmp.EQ, 1),))
    reply = SendWR(6, WrOpcode.SEND, inline_data=REPLY, send_flags=SendFlags.NONE)
    fast = Branch((reply,), (Patch(0, PatchField.PAYLOAD, Ref.recv(16, 4), at=2),))
    return Chain(9, WaitRecv(), (slow, fast), rearm=True, key=key)


@pytest.mark.parametrize(("key_at", "order"), [(16, [0xBBBB, 0xAAAA]), (4, [0xAAAA, 0xBBBB])])
def test_a_keyed_chain_triggers_while_a_run_of_another_key_waits_on_its_read(
    key_at: int, order: list[int]
) -> None:
    """Key = the tag (different): the second request's reply overtakes the first one's,
    which waits on its Read; key = the rkey (the same): they run one at a time."""
    p, server, client = _setup()
    server.side.qp.post_chain(_keyed(server, server.side, Ref.recv(key_at, 4)))
    for index, tag, wr_id in ((1, 0xAAAA, 5), (2, 0xBBBB, 6)):
        client.side.qp.post_recv(RecvWR(wr_id, (client.side.sge(client.inbox, 8 * wr_id, 8),)))
        request = REQ.pack(index, client.sink.rkey, client.sink.base, tag)
        client.side.qp.post_send(SendWR(wr_id, WrOpcode.SEND, inline_data=request))
    p.pump()
    arrived = [int.from_bytes(client.inbox.buf[at + 2 : at + 6], "big") for at in (40, 48)]
    assert arrived == order  # replies land in the receives in arrival order
    assert WcOpcode.RECV not in {wc.opcode for wc in server.side.cq.poll(100)}  # consumed
    assert server.side.qp.chains is not None and not server.side.qp.chains.flight
    assert len(server.side.qp._rq) == 4  # both receives re-posted


def test_a_run_scratch_is_private_to_each_run() -> None:
    """Two runs in flight at once each keep their own scratch octets (Ref.run)."""
    p, server, client = _setup()
    keep = LocalWrite(Ref.run(0, 4), Ref.recv(16, 4))  # the tag, before the Read
    read = SendWR(4, WrOpcode.RDMA_READ, (Sge(server.pool.base, 8, server.pool.lkey),))
    reply = SendWR(5, WrOpcode.SEND, inline_data=REPLY, send_flags=SendFlags.NONE)
    branch = Branch(
        (keep, read, reply),
        patches=(
            Patch(1, PatchField.RKEY, Ref.recv(4, 4)),
            Patch(1, PatchField.REMOTE_ADDR, Ref.recv(8, 8)),
            Patch(2, PatchField.PAYLOAD, Ref.run(0, 4), at=2),  # read after the Read
        ),
    )
    server.side.qp.post_chain(Chain(9, WaitRecv(), (branch,), rearm=True, key=Ref.recv(16, 4)))
    for tag, wr_id in ((0x11111111, 5), (0x22222222, 6)):
        client.side.qp.post_recv(RecvWR(wr_id, (client.side.sge(client.inbox, 8 * wr_id, 8),)))
        request = REQ.pack(1, client.sink.rkey, client.sink.base, tag)
        client.side.qp.post_send(SendWR(wr_id, WrOpcode.SEND, inline_data=request))
    p.pump()
    assert bytes(client.inbox.buf[42:46]) == bytes.fromhex("11111111")
    assert bytes(client.inbox.buf[50:54]) == bytes.fromhex("22222222")
    with pytest.raises(LocalError):
        server.side.qp.post_chain(
            Chain(1, WaitRecv(), (Branch((LocalWrite(Ref.run(62, 4), b"1234"),)),))
        )
