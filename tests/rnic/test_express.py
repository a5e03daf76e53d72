"""The express path of one-segment messages: the same bytes and outcomes as the layers.

With :attr:`QpEndpoint.bulk` a Read or atomic Request is framed as it is posted, and the
answer to a request that came alone in its feed is framed as the request is applied; a
chunk that is one whole FPDU is deframed in one step.  Each test runs the same exchange
with the express path and with the reference path (``bulk=False``, every message queued
and taken by the transport in its turn) and compares what crossed the wire and what
completed.
"""

from __future__ import annotations

import random
import struct

import pytest

from stack.constants import IOV_MIN_PAYLOAD, TERM_RDMAP_CATASTROPHIC_STREAM
from stack.crc import crc32c
from stack.errors import LocalError, ProtocolError
from stack.rnic import Access, SendWR, WrOpcode, memory
from stack.rnic.express import ExpressReceiver
from stack.rnic.memory import MemoryRegion
from stack.wire.events import AtomicRequest, AtomicResponse, ReadRequest
from stack.wire.framing import FpduDeframer, FpduFramer
from stack.wire.rdmap import encode_message_parts, encode_request_parts
from tests.rnic.helpers import Pair, Side, opcodes

RR = Access.LOCAL_WRITE | Access.REMOTE_READ
RA = Access.LOCAL_WRITE | Access.REMOTE_ATOMIC
_MASK64 = (1 << 64) - 1


def _joined(parts: list[tuple[bytes, memoryview]]) -> bytes:
    return b"".join(bytes(h) + bytes(p) for h, p in parts)


@pytest.mark.parametrize("seed", range(20))
def test_one_record_encoder_is_the_general_encoder(seed: int) -> None:
    rng = random.Random(seed)
    u32, u64 = (lambda: rng.getrandbits(32)), (lambda: rng.getrandbits(64))
    msn = u32()
    for message in (
        ReadRequest(u32(), u64(), u32(), u32(), u64()),
        AtomicRequest(rng.randrange(16), u32(), u32(), u64(), u64(), u64(), u64(), u64()),
        AtomicResponse(u32(), u64()),
    ):
        general = encode_message_parts(message, msn=msn, mulpdu=1024)
        assert _joined(encode_request_parts(message, msn)) == _joined(general)


def test_one_record_encoder_refuses_what_the_general_encoder_refuses() -> None:
    for message in (
        ReadRequest(1 << 32, 0, 8, 1, 0),
        AtomicRequest(16, 1, 1, 0, 0, 0, 0, 0),
        AtomicResponse(1, 1 << 64),
    ):
        with pytest.raises(LocalError):
            encode_message_parts(message, msn=1, mulpdu=1024)
        with pytest.raises(LocalError):
            encode_request_parts(message, 1)


class _Exchange:
    """A pair whose bytes move as views (the drivers' receive buffer), one side's output
    at a time, recorded per direction."""

    def __init__(self, *, express: bool, **pair: object) -> None:
        self.pair = Pair(**pair)  # type: ignore[arg-type]
        for side in (self.pair.a, self.pair.b):
            assert side.endpoint is not None
            side.endpoint.bulk = express
            side.endpoint.engine.mpa.keep_tail = True
        self.wire: list[tuple[str, bytes]] = []

    def step(self, src: Side, dst: Side) -> int:
        assert src.endpoint is not None and dst.endpoint is not None
        data = b"".join(bytes(p) for p in src.endpoint.produce_iov())
        if data:
            self.wire.append((src.engine.role.value, data))
            dst.endpoint.feed(memoryview(bytearray(data)))
        return len(data)

    def pump(self) -> None:
        for _ in range(1000):
            if not (self.step(self.pair.a, self.pair.b) + self.step(self.pair.b, self.pair.a)):
                return
        raise AssertionError("did not quiesce")


def _run_reads_and_atomics(
    express: bool, seed: int, monkeypatch: pytest.MonkeyPatch
) -> tuple[list, list, bytes, bytes]:
    """A random mix of Reads (sizes around the copy limit) and atomics, posted alone or
    in post lists, pumped: the wire, the completions and both memories.  STags are drawn
    from a seeded generator, so both runs have the same."""
    rng = random.Random(seed)
    draws = random.Random(seed)
    monkeypatch.setattr(memory.secrets, "randbelow", draws.randrange)
    ex = _Exchange(express=express, a_qp={"ord": 4}, b_qp={"ird": 4})
    a, b = ex.pair.a, ex.pair.b
    # Zero-based (TO 0 at the start): the same TOs on the wire in both runs.
    zero = Access.ZERO_BASED
    source = b.mr(bytes(rng.randrange(256) for _ in range(8192)), RR | RA | zero)
    sink = a.mr(8192, Access.LOCAL_WRITE | zero)
    wr_id = 0
    for _ in range(12):
        wrs = []
        for _ in range(rng.choice((1, 1, 2, 5))):
            wr_id += 1
            if rng.random() < 0.5:
                size = rng.choice((0, 1, 64, IOV_MIN_PAYLOAD - 1, IOV_MIN_PAYLOAD, 3000))
                at = rng.randrange(0, 8192 - size + 1)
                wrs.append(
                    SendWR(
                        wr_id,
                        WrOpcode.RDMA_READ,
                        (a.sge(sink, at, size),),
                        rkey=source.rkey,
                        remote_addr=source.base + at,
                    )
                )
            else:
                at = 8 * rng.randrange(1024)
                wrs.append(
                    SendWR(
                        wr_id,
                        WrOpcode.ATOMIC_FETCH_AND_ADD,
                        (a.sge(sink, at, 8),),
                        rkey=source.rkey,
                        remote_addr=source.base + at,
                        compare_add=rng.getrandbits(64),
                    )
                )
        a.qp.post_send(wrs)
        ex.pump()
    done = [(wc.wr_id, wc.status, wc.opcode, wc.byte_len) for wc in a.cq.poll()]
    return ex.wire, done, bytes(sink.buf), bytes(source.buf)


@pytest.mark.parametrize("seed", range(6))
def test_express_and_reference_paths_put_the_same_bytes_on_the_wire(
    seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    express = _run_reads_and_atomics(True, seed, monkeypatch)
    reference = _run_reads_and_atomics(False, seed, monkeypatch)
    assert express[1] and all(status == 0 for _, status, _, _ in express[1])
    assert express == reference


def test_a_posted_read_is_framed_at_once_when_nothing_is_queued_ahead() -> None:
    ex = _Exchange(express=True)
    a, b = ex.pair.a, ex.pair.b
    source, sink = b.mr(64, RR), a.mr(64)
    assert a.endpoint is not None
    read = SendWR(1, WrOpcode.RDMA_READ, (a.sge(sink),), rkey=source.rkey, remote_addr=source.base)
    a.qp.post_send(read)
    assert not a.qp.has_outgoing and a.endpoint.has_output  # framed, in the engine
    # Behind a queued Write, the Read waits its turn on the QP's queue.
    write = SendWR(2, WrOpcode.RDMA_WRITE, (a.sge(sink),), rkey=0, remote_addr=0)
    a.qp.post_send([write, read])
    assert a.qp.has_outgoing


def test_an_answer_is_framed_as_its_lone_request_is_applied_and_holds_its_ird_slot() -> None:
    ex = _Exchange(express=True, b_qp={"ird": 1})
    a, b = ex.pair.a, ex.pair.b
    source, sink = b.mr(bytes(range(64)), RR), a.mr(64)
    assert a.endpoint is not None and b.endpoint is not None
    for wr_id in (1, 2):
        a.qp.post_send(
            SendWR(
                wr_id, WrOpcode.RDMA_READ, (a.sge(sink),), rkey=source.rkey, remote_addr=source.base
            )
        )
        request = b"".join(bytes(p) for p in a.endpoint.produce_iov())
        assert opcodes(request) == [1]
        b.endpoint.feed(memoryview(bytearray(request)))
        if wr_id == 1:  # answered at once, its slot held until the output is drained
            assert not b.qp.has_outgoing and b.endpoint.has_output
    # The second request came before the first answer was drained: beyond IRD 1 (SEC-10),
    # as with the answer queued on the QP.
    assert b.qp.error is not None and b.qp.error.term == TERM_RDMAP_CATASTROPHIC_STREAM


def test_after_draining_the_slot_is_free() -> None:
    ex = _Exchange(express=True, b_qp={"ird": 1})
    a, b = ex.pair.a, ex.pair.b
    source, sink = b.mr(bytes(range(64)), RR), a.mr(64)
    for wr_id in range(1, 6):
        a.qp.post_send(
            SendWR(
                wr_id, WrOpcode.RDMA_READ, (a.sge(sink),), rkey=source.rkey, remote_addr=source.base
            )
        )
        ex.pump()
    assert [wc.wr_id for wc in a.cq.poll() if wc.status == 0] == [1, 2, 3, 4, 5]
    assert bytes(sink.buf) == bytes(range(64)) and b.qp.error is None


def test_requests_in_one_chunk_are_answered_in_their_turn() -> None:
    """Two Requests in one feed: the answers wait on the QP's queue (a later message of
    the feed could still fail the stream) and leave together."""
    ex = _Exchange(express=True)
    a, b = ex.pair.a, ex.pair.b
    source, sink = b.mr(bytes(range(64)), RR), a.mr(64)
    assert a.endpoint is not None and b.endpoint is not None
    reads = [
        SendWR(
            i,
            WrOpcode.RDMA_READ,
            (a.sge(sink, 32 * i, 32),),
            rkey=source.rkey,
            remote_addr=source.base + 32 * i,
        )
        for i in range(2)
    ]
    a.qp.post_send(reads)
    both = b"".join(bytes(p) for p in a.endpoint.produce_iov())
    assert opcodes(both) == [1, 1]
    b.endpoint.feed(memoryview(bytearray(both)))
    assert b.qp.has_outgoing
    ex.pump()
    assert bytes(sink.buf) == bytes(range(64))


def test_the_responder_holds_until_the_initiators_first_fpdu() -> None:
    """MPA-25: a Read the responder posts first stays on its QP's queue."""
    ex = _Exchange(express=True)
    a, b = ex.pair.a, ex.pair.b
    source, sink = a.mr(64, RR), b.mr(64)
    assert b.endpoint is not None and b.endpoint.holding
    b.qp.post_send(
        SendWR(1, WrOpcode.RDMA_READ, (b.sge(sink),), rkey=source.rkey, remote_addr=source.base)
    )
    assert b.qp.has_outgoing and not b.engine.mpa.has_output


def test_a_send_message_hook_sees_every_message() -> None:
    from tests.rnic.helpers import record_sent_messages

    ex = _Exchange(express=True)
    a, b = ex.pair.a, ex.pair.b
    seen = record_sent_messages(a.engine)
    source, sink = b.mr(64, RR), a.mr(64)
    a.qp.post_send(
        SendWR(1, WrOpcode.RDMA_READ, (a.sge(sink),), rkey=source.rkey, remote_addr=source.base)
    )
    ex.pump()
    assert [type(m) for m in seen] == [ReadRequest]


# -- one whole FPDU, deframed in one step ---------------------------------------------


def _fpdu(payload: bytes) -> bytes:
    out = bytearray()
    FpduFramer().frame_into(out, payload)
    return bytes(out)


def test_take_whole_takes_exactly_one_fpdu() -> None:
    fpdu = _fpdu(b"x" * 37)
    deframer = FpduDeframer()
    assert bytes(deframer.take_whole(memoryview(fpdu)) or b"") == b"x" * 37
    assert deframer.offset == len(fpdu) and deframer.fpdu_wire_length == len(fpdu)
    # The general path sees the same: a second FPDU follows at the same stream offset.
    deframer.feed(_fpdu(b"y" * 5))
    assert bytes(deframer.next_ulpdu() or b"") == b"y" * 5


@pytest.mark.parametrize(
    "case",
    ["two FPDUs", "partial", "bad CRC", "length too long", "pending bytes", "markers"],
)
def test_take_whole_declines_and_changes_nothing(case: str) -> None:
    fpdu = bytearray(_fpdu(b"z" * 20))
    deframer = FpduDeframer(markers=case == "markers")
    view = memoryview(fpdu)
    if case == "two FPDUs":
        view = memoryview(fpdu + fpdu)
    elif case == "partial":
        view = view[:-1]
    elif case == "bad CRC":
        fpdu[5] ^= 1
    elif case == "length too long":
        struct.pack_into(">H", fpdu, 0, 0xFFFF)
    elif case == "pending bytes":
        deframer.feed(fpdu[:3])
    assert deframer.take_whole(view) is None
    assert deframer.offset == 0 and deframer.error is None
    if case == "bad CRC":  # the general path reports it
        deframer.feed(bytes(view))
        with pytest.raises(Exception, match="CRC"):
            deframer.next_ulpdu()
        assert crc32c(bytes(view)) != 0


# -- hostile lone requests: the express path hands them to the layers ----------------

_FIELDS = {  # READ_REQUEST_RECORD / ATOMIC_REQUEST_RECORD field index, after the length
    "ddp control": 0,
    "rdmap control": 1,
    "invalidate stag": 2,
    "qn": 3,
    "msn": 4,
    "mo": 5,
}


def _primed(
    kind: str, express: bool, seed: int, monkeypatch: pytest.MonkeyPatch
) -> tuple[_Exchange, MemoryRegion, MemoryRegion]:
    """A pair after one exchange (the responder no longer holds its output, MPA-25), with
    a lone Read or FetchAdd posted by ``a``: (the exchange, ``b``'s source, ``a``'s sink).
    STags are drawn from a generator seeded with ``seed``, so both paths have the same."""
    draws = random.Random(seed)
    monkeypatch.setattr(memory.secrets, "randbelow", draws.randrange)
    ex = _Exchange(express=express)
    a, b = ex.pair.a, ex.pair.b
    zero = Access.ZERO_BASED
    source = b.mr(bytes(range(128)), RR | RA | zero)
    sink = a.mr(64, Access.LOCAL_WRITE | zero)
    warm = SendWR(9, WrOpcode.RDMA_READ, (a.sge(sink, 0, 8),), rkey=source.rkey, remote_addr=0)
    a.qp.post_send(warm)
    ex.pump()
    a.cq.poll()
    opcode = WrOpcode.RDMA_READ if kind == "read" else WrOpcode.ATOMIC_FETCH_AND_ADD
    sge = a.sge(sink) if kind == "read" else a.sge(sink, 0, 8)
    a.qp.post_send(SendWR(1, opcode, (sge,), rkey=source.rkey, remote_addr=8, compare_add=5))
    return ex, source, sink


def _lone_request(kind: str, express: bool, mutate: str, monkeypatch: pytest.MonkeyPatch):
    """A lone Read or FetchAdd Request, changed as ``mutate`` says (its CRC made good
    again unless the change is the CRC), fed to the responder as one chunk: what the
    responder sends back, its QP's state and error."""
    from stack.rnic.express import _ATOMIC_FPDU, _READ_FPDU

    ex, source, _sink = _primed(kind, express, 7, monkeypatch)
    a, b = ex.pair.a, ex.pair.b
    assert a.endpoint is not None and b.endpoint is not None
    fpdu = bytearray(b"".join(bytes(p) for p in a.endpoint.produce_iov()))
    record = _READ_FPDU if kind == "read" else _ATOMIC_FPDU
    fields = list(record.unpack_from(fpdu))
    if mutate == "crc":
        fpdu[-1] ^= 0x40
    elif mutate != "none":
        name, _, value = mutate.partition("=")
        if name in _FIELDS:
            fields[1 + _FIELDS[name]] = int(value, 0)
        elif name == "stag":
            at = 10 if kind == "read" else 9
            fields[at] ^= 0x100
        elif name == "to":
            fields[11 if kind == "read" else 10] = int(value, 0)
        elif name == "size" and kind == "read":
            fields[9] = int(value, 0)
        elif name == "aopcode" and kind == "atomic":
            fields[7] = int(value, 0)
        record.pack_into(fpdu, 0, *fields)
        struct.pack_into("<I", fpdu, len(fpdu) - 4, crc32c(bytes(fpdu[:-4])))
    taken: list[object] = []
    take = ExpressReceiver.take

    def recording(self: ExpressReceiver, view: memoryview) -> bool:
        try:
            taken.append(take(self, view))
        except ProtocolError as exc:
            taken.append(exc.rule)
            raise
        return bool(taken[-1])

    monkeypatch.setattr(ExpressReceiver, "take", recording)
    b.endpoint.feed(memoryview(fpdu))
    assert taken == ([] if not express else [EXPRESS_TAKES.get((kind, mutate), False)])
    answer = b"".join(bytes(p) for p in b.endpoint.produce_iov())
    error = b.qp.error
    return (
        answer,
        b.qp.state,
        None if error is None else (error.rule, error.term),
        bytes(source.buf),
    )


EXPRESS_TAKES = {
    ("read", "none"): True,
    ("atomic", "none"): True,
    ("read", "to=0x4"): True,  # in bounds: a good Read
    ("read", "size=65"): True,
    ("atomic", "to=0x4"): "EXT-05",  # refused by the target word, as the layers refuse it
}
"""What the express path does with each case (else it hands the chunk to the layers)."""


_MUTATIONS = (
    "none",
    "crc",
    "ddp control=0x42",
    "rdmap control=0x40",
    "invalidate stag=1",
    "qn=0",
    "msn=7",
    "mo=4",
    "stag",
    "to=0x7c",  # past the end (a Read), misaligned and past the end (an atomic)
    "to=0x4",  # a good Read; a misaligned atomic (EXT-05)
    "to=0x80",  # past the end
)


@pytest.mark.parametrize(
    ("kind", "mutate"),
    [(kind, m) for kind in ("read", "atomic") for m in _MUTATIONS]
    + [("read", "size=65"), ("atomic", "aopcode=0x20")],  # reserved AOpCode bits (EXT-02)
)
def test_a_hostile_lone_request_gets_what_the_layers_give_it(
    kind: str, mutate: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    express = _lone_request(kind, True, mutate, monkeypatch)
    reference = _lone_request(kind, False, mutate, monkeypatch)
    assert express == reference
    if mutate == "none":
        assert express[1].value == "rts" and express[0]  # answered


def _lone_answer(kind: str, express: bool, mutate: str, monkeypatch: pytest.MonkeyPatch):
    """The answer to a lone Read or FetchAdd, changed as ``mutate`` says (CRC made good
    again), fed to the requester as one chunk: what it sends, its state, error,
    completions and sink."""
    ex, _source, sink = _primed(kind, express, 11, monkeypatch)
    a, b = ex.pair.a, ex.pair.b
    assert a.endpoint is not None and b.endpoint is not None
    ex.step(a, b)
    fpdu = bytearray(b"".join(bytes(p) for p in b.endpoint.produce_iov()))
    if mutate == "crc":
        fpdu[-1] ^= 0x40
    elif mutate != "none":
        at, _, value = mutate.partition("=")
        fpdu[int(at)] = int(value, 0)  # an octet of the FPDU (2: DDP control, 3: RDMAP ...)
        struct.pack_into("<I", fpdu, len(fpdu) - 4, crc32c(bytes(fpdu[:-4])))
    a.endpoint.feed(memoryview(fpdu))
    sent = b"".join(bytes(p) for p in a.endpoint.produce_iov())
    error = None if a.qp.error is None else (a.qp.error.rule, a.qp.error.term)
    done = [(wc.wr_id, wc.status, wc.byte_len) for wc in a.cq.poll()]
    return sent, a.qp.state, error, done, bytes(sink.buf)


@pytest.mark.parametrize(
    ("kind", "mutate"),
    [
        (kind, m)
        for kind in ("read", "atomic")
        for m in ("none", "crc", "2=0x40", "3=0x44", "4=0x7f", "9=0x99", "13=0x77", "16=0x01")
    ],
)
def test_a_hostile_lone_answer_gets_what_the_layers_give_it(
    kind: str, mutate: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Octets 4-7 are a Read Response's Sink STag (the QN of an Atomic Response), 8-15 its
    TO (the MSN, MO), 16 on its data (the Request ID)."""
    express = _lone_answer(kind, True, mutate, monkeypatch)
    assert express == _lone_answer(kind, False, mutate, monkeypatch)
    if mutate == "none":
        assert express[1].value == "rts" and express[3] == [(1, 0, 64 if kind == "read" else 8)]


def test_a_qp_with_chains_keeps_the_layers_order() -> None:
    """Chains run deferred items when a feed's input is applied and patch WRs as they
    execute: their QP's messages and answers take the layers' queue, in its order."""
    from stack.rnic.chains import ChainQueue

    ex = _Exchange(express=True)
    a, b = ex.pair.a, ex.pair.b
    source, sink = b.mr(bytes(range(64)), RR), a.mr(64)
    assert a.endpoint is not None
    a.qp.chains = ChainQueue(a.qp)
    read = SendWR(1, WrOpcode.RDMA_READ, (a.sge(sink),), rkey=source.rkey, remote_addr=source.base)
    a.qp.post_send(read)
    assert a.qp.has_outgoing and not a.engine.mpa.has_output
    ex.pump()
    assert bytes(sink.buf) == bytes(range(64))
