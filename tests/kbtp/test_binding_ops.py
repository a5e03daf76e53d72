"""KBTP end to end over real loopback TCP: the trio target and initiator on the software RNIC.

Every operation of draft §6 with its data checked byte for byte, sessions (§4), request
credits and pipelining (§9.2), concurrent initiators, bad requests that must get their
status and change nothing (§6.0), and the errors that close a session (§9.3).
"""

from __future__ import annotations

import struct
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from functools import partial
from typing import TypedDict, Unpack

import pytest
import trio

from kbtp.constants import (
    COMMON_HEADER_LEN,
    KBTP_VERSION,
    Capability,
    MessageOpcode,
    RequestFlag,
    Status,
    next_generation,
)
from kbtp.initiator import KbtpInitiator
from kbtp.initiator_errors import HelloRefused, KbtpStatusError, SessionClosed
from kbtp.messages import (
    Bind,
    CompletionDescriptor,
    DataDescriptor,
    Load,
    Store,
    inline_descriptor,
)
from kbtp.target import KbtpTarget, receive_buffer_size
from kbtp.target_config import InitiatorConfig, TargetConfig
from stack.constants import TERM_RDMAP_OP_UNSPECIFIED
from stack.rnic import QpState, Rnic
from stack.transport.cm import TapFactory
from stack.wire.events import MpaSettings
from tests.kbtp.targets import new_target

pytestmark = pytest.mark.both_targets  # docs/kbtp.md §8.1: the initiator cannot tell

BLOCK = 8192
MAX_INLINE = 512
A = InitiatorConfig(b"a", 0, 64, 8, "red")
B = InitiatorConfig(b"b", 64, 64, 8, "blue")
C = InitiatorConfig(b"c", 128, 64, 4, "green", direct_load=True, direct_alloc=True)
DIRECT = Capability.DIRECT_LOAD | Capability.DIRECT_ALLOC


def config(**overrides: object) -> TargetConfig:
    base: dict[str, object] = dict(
        block_size=BLOCK,
        pool_blocks=24,
        initiators=(A, B, C),
        request_credits=4,
        max_inline=MAX_INLINE,
        ticket_timeout=0.5,
    )
    base.update(overrides)
    return TargetConfig(**base)  # type: ignore[arg-type]


@asynccontextmanager
async def serving(**overrides: object) -> AsyncIterator[KbtpTarget]:
    """A target on 127.0.0.1 (MPA defaults: EMSS 1448, so blocks span several FPDUs)."""
    target = new_target(config(**overrides))
    async with target.running() as running:
        yield running


class ConnectOptions(TypedDict, total=False):
    """The keyword arguments of :meth:`KbtpInitiator.connect` a test may pass through."""

    settings: MpaSettings | None
    rnic: Rnic | None
    tap_factory: TapFactory | None
    hello_timeout: float
    max_block_size: int


def connect(
    target: KbtpTarget, identity: str, caps: Capability = DIRECT, **kw: Unpack[ConnectOptions]
) -> AbstractAsyncContextManager[KbtpInitiator]:
    return KbtpInitiator.connect("127.0.0.1", target.port, identity, capabilities=caps, **kw)


def data(tag: int, size: int) -> bytes:
    return bytes((tag * 31 + i * 7) & 0xFF for i in range(size))


def snapshot(target: KbtpTarget) -> tuple[object, ...]:
    """Everything a request could change: memory, ring bookkeeping, usage (§6.0)."""
    core = target.core
    rings = tuple(r.state_key(0.0, 1.0) for _, r in sorted(core.rings.items()))
    usage = tuple(core.usage(i.identity) for i in core.config.initiators)
    return bytes(core.memory), rings, usage


# ======================================================================================
# operations (draft §6)
# ======================================================================================


async def test_s6_every_operation_round_trips_its_bytes() -> None:
    """§6.1-§6.4: ALLOC_STORE (inline and RDMA Read), LOAD, STORE, SEAL, FREE, reuse."""
    with trio.fail_after(30):
        async with serving() as target, connect(target, "a") as a:
            assert a.ack is not None and a.ack.request_credits == 4
            small, big = data(1, 100), data(2, BLOCK)
            c1 = await a.alloc_store(1, small, seal=True)  # INLINE
            c2 = await a.alloc_store(2, big)  # RDMA Read of the initiator's buffer
            assert c1.ok and c1.data_length == 100 and c1.generation == 2
            assert c2.data_length == BLOCK and c1.block_offset != c2.block_offset
            assert await a.load(1) == small
            assert await a.load(2, allow_unsealed=True) == big
            entry = target.core.entry(2)
            assert entry.valid and not entry.sealed and entry.data_length == BLOCK
            # §6.2 mapped STORE (RDMA Read), then SEAL; Generation and block unchanged.
            newer = data(3, 5000)
            c3 = await a.store(2, bytearray(newer), seal=True, generation=c2.generation)
            assert (c3.generation, c3.block_offset, c3.data_length) == (
                c2.generation,
                c2.block_offset,
                5000,
            )
            assert await a.load(2) == newer
            assert target.core.block_bytes(c2.block_offset, 5000) == newer
            # §6.4 FREE: next generation; the block returns to the ring and is reused.
            c4 = await a.free(2, generation=c3.generation)
            assert c4.generation == next_generation(c3.generation)
            assert c4.block_offset == c2.block_offset
            assert not target.core.entry(2).valid
            assert target.core.usage(b"a") == 1
            # Zero-length block: no RDMA Write for its LOAD (§6.1 step 2).
            c5 = await a.alloc_store(3, b"", seal=True)
            assert c5.ok and await a.load(3) == b""
            counts = {op: s.count for (op, st), s in a.stats.items() if st == "SUCCESS"}
            assert counts == {"ALLOC_STORE": 3, "LOAD": 4, "STORE": 1, "FREE": 1}


async def test_s6_0_invalidate_completes_with_send_with_invalidate() -> None:
    """INVALIDATE: the COMPLETION is a Send with Invalidate of the Data Descriptor's STag."""
    with trio.fail_after(30):
        async with serving() as target, connect(target, "a") as a:
            await a.alloc_store(5, data(5, 3000), seal=True, invalidate=True)
            assert a.invalidations == 1
            assert await a.load(5, invalidate=True) == data(5, 3000)
            assert a.invalidations == 2
            assert target.core.entry(5).sealed


async def test_s4_2_block_state_outlives_the_session() -> None:
    """Handles, quota and bound blocks belong to the identity (docs/kbtp.md §4.2)."""
    with trio.fail_after(30):
        async with serving() as target:
            async with connect(target, "b") as b:
                await b.alloc_store(70, data(7, 4000), seal=True)
            async with connect(target, "b") as b:
                assert await b.load(70) == data(7, 4000)
                assert target.core.usage(b"b") == 1


async def test_s4_2_unknown_identity_and_second_session_are_refused() -> None:
    with trio.fail_after(30):
        async with serving() as target:
            with pytest.raises(HelloRefused) as info:
                async with connect(target, "stranger"):
                    pass
            assert info.value.status is Status.UNKNOWN_INITIATOR
            async with connect(target, "a") as a:
                with pytest.raises(HelloRefused) as info:
                    async with connect(target, "a"):
                        pass
                assert info.value.status is Status.SESSION_EXISTS
                assert (await a.alloc_store(9, b"still fine")).ok


async def test_s4_3_capabilities_granted_only_as_configured() -> None:
    with trio.fail_after(30):
        async with serving() as target:
            async with connect(target, "a") as a, connect(target, "c") as c:
                assert a.granted == Capability.NONE and a.ack is not None
                assert a.ack.table_stag == 0 and a.ack.ring_stag == 0
                assert c.granted == DIRECT and c.ack is not None
                assert target.stag_valid(c.ack.table_stag)
                assert target.stag_valid(c.ack.partition_stag)
            # Ring and Partition STags are per session: gone with it.
            assert c.ack is not None and not target.stag_valid(c.ack.partition_stag)


# ======================================================================================
# credits, pipelining, concurrency (§9.2)
# ======================================================================================


async def test_s9_2_requests_beyond_the_credits_wait_and_all_complete() -> None:
    with trio.fail_after(30):
        async with serving() as target, connect(target, "a") as a:
            seen: list[int] = []
            outgoing = a.core.outgoing

            def spy() -> list[bytes]:
                out = outgoing()
                seen.append(a.core.outstanding)
                return out

            a.core.outgoing = spy  # type: ignore[method-assign]
            payloads = {h: data(h, 600 + 500 * h) for h in range(8)}
            async with trio.open_nursery() as nursery:
                for h, d in payloads.items():
                    nursery.start_soon(partial(a.alloc_store, h, d, seal=True))
            assert max(seen) == 4  # never more than the Request Credits outstanding
            results: dict[int, bytes] = {}

            async def load(h: int) -> None:
                results[h] = await a.load(h)

            async with trio.open_nursery() as nursery:
                for h in list(payloads) * 2:
                    nursery.start_soon(load, h)
            assert results == payloads


async def test_s6_0_concurrent_initiators_pipelined_over_tcp() -> None:
    """Three initiators at once, each with more requests than credits in flight."""
    with trio.fail_after(60):
        async with serving() as target:
            written: dict[int, bytes] = {}
            read: list[tuple[int, bytes]] = []

            async def run(identity: str, base: int, count: int) -> None:
                async with connect(target, identity) as ini:

                    async def store(h: int) -> None:
                        d = data(h, 1000 + 997 * (h % 8))
                        await ini.alloc_store(h, d, seal=True)
                        written[h] = d

                    async with trio.open_nursery() as nursery:
                        for h in range(base, base + count):
                            nursery.start_soon(store, h)
                    await ready.wait()

                    async def load(h: int) -> None:
                        read.append((h, await ini.load(h)))

                    async with trio.open_nursery() as nursery:
                        for h in sorted(written):  # everyone's blocks (LOAD needs "served")
                            nursery.start_soon(load, h)

            ready = trio.Event()
            async with trio.open_nursery() as nursery:
                nursery.start_soon(run, "a", 0, 8)
                nursery.start_soon(run, "b", 64, 8)
                nursery.start_soon(run, "c", 128, 4)
                while len(written) < 20:
                    await trio.sleep(0.01)
                ready.set()
            assert len(read) == 3 * 20
            assert all(written[h] == got for h, got in read)
            assert len({target.core.entry(h).block_offset for h in written}) == 20


# ======================================================================================
# bad requests change nothing (§6.0, §7)
# ======================================================================================


async def test_s6_0_every_bad_request_gets_its_status_and_changes_nothing() -> None:
    with trio.fail_after(60):
        async with serving() as target, connect(target, "a") as a, connect(target, "c") as c:
            sealed = await a.alloc_store(1, data(1, 700), seal=True)
            await a.alloc_store(2, data(2, 300))  # unsealed
            await b_block(target)
            await c.direct_alloc(131, b"bound directly")
            wrong = next_generation(sealed.generation)
            for k in range(3, 3 + A.quota - 3):  # fill A's quota but one
                await a.alloc_store(k, b"q")
            await a.alloc_store(20, b"last")  # quota reached
            d = DataDescriptor(1, 0, 16)
            assert c.ack is not None
            part = c.ack.partition_offset
            cases = [
                (Status.HANDLE_OUT_OF_RANGE, lambda: a.load(10_000)),
                (Status.HANDLE_OUT_OF_RANGE, lambda: a.store(64, b"x")),
                (Status.HANDLE_OUT_OF_RANGE, lambda: a.alloc_store(65, b"x")),
                (Status.HANDLE_OUT_OF_RANGE, lambda: a.free(64)),
                (Status.WRONG_GENERATION, lambda: a.load(1, generation=wrong)),
                (Status.WRONG_GENERATION, lambda: a.store(2, b"x", generation=wrong)),
                (Status.WRONG_GENERATION, lambda: a.free(1, generation=wrong)),
                (Status.NOT_VALID, lambda: a.load(30)),
                (Status.NOT_VALID, lambda: a.store(30, b"x")),
                (Status.NOT_VALID, lambda: a.free(30)),
                (Status.ALREADY_VALID, lambda: a.alloc_store(1, b"x")),
                (Status.SEALED, lambda: a.store(1, b"x")),
                (Status.NOT_SEALED, lambda: a.load(2)),
                (Status.TOO_LONG_FOR_BLOCK, lambda: a.store(2, bytearray(BLOCK + 1))),
                (Status.TOO_LONG_FOR_BLOCK, lambda: a.alloc_store(31, bytearray(BLOCK + 1))),
                (Status.TOO_LONG_FOR_DESCRIPTOR, lambda: a.load(1, max_length=699)),
                (Status.INLINE_TOO_LONG, lambda: a.store(2, bytes(MAX_INLINE + 1), inline=True)),
                (Status.NO_SPACE, lambda: a.alloc_store(32, b"over quota")),
                (Status.NOT_OFFERED, lambda: a.request(Bind(0, 33, 0, 1, 0))),
                (
                    Status.NOT_OFFERED,
                    lambda: a.request(
                        Load(
                            0, 1, d, flags=RequestFlag.RECORD, completion=CompletionDescriptor(1, 0)
                        )
                    ),
                ),
                (
                    Status.BAD_FLAGS,
                    lambda: a.request(
                        Store(
                            0,
                            2,
                            inline_descriptor(b"hi"),
                            b"hi",
                            flags=RequestFlag.INLINE | RequestFlag.INVALIDATE,
                        )
                    ),
                ),
                (Status.BAD_BIND, lambda: c.request(Bind(0, 130, 77, 10, part))),
                (Status.ALREADY_VALID, lambda: c.request(Bind(0, 131, 0, 10, part))),
                (Status.TOO_LONG_FOR_BLOCK, lambda: c.request(Bind(0, 132, 0, BLOCK + 1, 0))),
                (Status.HANDLE_OUT_OF_RANGE, lambda: c.request(Bind(0, 1, 0, 1, 0))),
            ]
            assert receive_buffer_size(target.config) >= COMMON_HEADER_LEN + 16 + MAX_INLINE + 1
            for status, call in cases:
                before = snapshot(target)
                with pytest.raises(KbtpStatusError) as info:
                    await call()
                assert info.value.status is status, (status, info.value)
                assert info.value.completion is not None
                assert info.value.completion.status == status
                assert snapshot(target) == before, status
            # The session is still usable and the blocks are intact.
            assert await a.load(1) == data(1, 700)
            assert await a.load(2, allow_unsealed=True) == data(2, 300)


async def b_block(target: KbtpTarget) -> None:
    """Give B one block (so handle 64 is served and bound by someone else)."""
    async with connect(target, "b") as b:
        await b.alloc_store(64, b"b's")


async def test_s7_bad_requests_sent_raw_keep_the_session_or_close_it() -> None:
    """MALFORMED (readable header) is answered and the session stays; BAD_VERSION is fatal:
    COMPLETION, then Terminate 0/2/0xFF and close (docs/kbtp.md §9.3)."""
    with trio.fail_after(30):
        async with serving() as target, connect(target, "a") as a:
            load = Load(1000, 1, DataDescriptor(1, 0, 16)).encode()
            answer = await a.send_raw(load + b"extra", 1000)
            assert answer is not None and answer.status == Status.MALFORMED
            assert (await a.alloc_store(1, b"alive", seal=True)).ok
            bad = bytearray(load)
            bad[0] = KBTP_VERSION + 1
            struct.pack_into(">Q", bad, 4, 1001)
            answer = await a.send_raw(bytes(bad), 1001)
            assert answer is not None and answer.status == Status.BAD_VERSION
            assert answer.request_opcode == MessageOpcode.LOAD
            with pytest.raises(SessionClosed):
                await a.load(1)
            assert a.conn is not None
            await a.conn.wait_closed()
            assert a.qp.state is QpState.ERROR
            term = a.qp.peer_terminate
            assert term is not None and term.cause == TERM_RDMAP_OP_UNSPECIFIED
            while target.sessions:
                await trio.sleep(0.01)
            assert target.core.usage(b"a") == 1  # the bound block stays the identity's


async def test_s9_2_a_send_beyond_the_target_receive_buffer_terminates() -> None:
    """An INLINE store longer than the receive buffers finds no room: DDP terminates."""
    with trio.fail_after(30):
        async with serving() as target, connect(target, "a") as a:
            size = receive_buffer_size(target.config)
            with pytest.raises(SessionClosed):
                await a.alloc_store(1, bytes(size), inline=True)
            assert a.qp.peer_terminate is not None
            assert a.qp.peer_terminate.layer == 1  # DDP
            assert target.core.usage(b"a") == 0


async def test_s4_1_mpa_variants_carry_kbtp() -> None:
    """MPA markers towards the initiator (RFC 5044 §4.3): the same operations work."""
    settings = MpaSettings(want_markers=True)
    with trio.fail_after(30):
        async with serving() as target, connect(target, "b", settings=settings) as b:
            await b.alloc_store(80, data(8, BLOCK), seal=True)
            assert await b.load(80) == data(8, BLOCK)
            assert b.conn is not None and b.conn.negotiated is not None
            assert b.conn.negotiated.markers_rx


@pytest.mark.parametrize("copy_limit", [0, BLOCK], ids=["zero-copy-write", "copied-write"])
async def test_s6_0_load_then_free_then_alloc_on_one_handle_keep_their_order(
    copy_limit: int,
) -> None:
    """Requests on one handle run one at a time in arrival order (docs/kbtp.md §6.0): a
    FREE and a new ALLOC_STORE pipelined behind a LOAD cannot change what the LOAD
    returns, whether the Write reads the pool when transmitted or carries a copy."""
    with trio.fail_after(30):
        async with serving() as target, connect(target, "a") as a:
            target.write_copy_limit = copy_limit
            old, new = data(1, BLOCK), data(2, BLOCK)
            await a.alloc_store(7, old, seal=True)
            got: dict[str, object] = {}

            async def submit_in_order(name: str, call: Callable[[], Awaitable[object]]) -> None:
                before = a.core.outstanding + a.core.queued
                nursery.start_soon(lambda: _keep(got, name, call))
                while a.core.outstanding + a.core.queued == before:
                    await trio.sleep(0)

            async with trio.open_nursery() as nursery:
                await submit_in_order("load", lambda: a.load(7))
                await submit_in_order("free", lambda: a.free(7))
                await submit_in_order("alloc", lambda: a.alloc_store(7, new, seal=True))
            assert got["load"] == old
            assert await a.load(7) == new


async def _keep(
    results: dict[str, object], name: str, call: Callable[[], Awaitable[object]]
) -> None:
    results[name] = await call()
