"""docs/kbtp.md §8: the offloaded target answers LOADs by pre-posted RNIC chains, with zero
calls into the target application per LOAD; what needs a decision falls back to it."""

from __future__ import annotations

import functools
import struct
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any

import pytest
import trio

from kbtp.constants import Status
from kbtp.initiator import KbtpInitiator
from kbtp.initiator_errors import SessionClosed
from kbtp.layout import read_entry
from kbtp.target import KbtpTarget
from kbtp.target_config import InitiatorConfig, TargetConfig
from kbtp.target_offload import chain_runs
from stack.rnic import QpState
from stack.wire.events import ReadRequest

BLOCK = 4096
A = InitiatorConfig(b"a", 0, 32, 8, "red")


class Counted:
    """Counts the calls into the target application's request handler."""

    def __init__(self, target: KbtpTarget) -> None:
        self.calls = 0
        core = target.core
        original: Callable[..., Any] = core.handle_message

        def handle_message(*args: Any) -> Any:
            self.calls += 1
            return original(*args)

        core.handle_message = handle_message  # type: ignore[method-assign,assignment]


@asynccontextmanager
async def serving(offload: bool = True) -> AsyncIterator[tuple[KbtpTarget, Counted]]:
    cfg = TargetConfig(block_size=BLOCK, pool_blocks=16, initiators=(A,), request_credits=8)
    target = KbtpTarget(cfg, offload=offload)
    async with target.running() as running:
        yield running, Counted(running)


def data(tag: int, size: int) -> bytes:
    return bytes((tag * 13 + i * 5) & 0xFF for i in range(size))


def connect(target: KbtpTarget) -> AbstractAsyncContextManager[KbtpInitiator]:
    return KbtpInitiator.connect("127.0.0.1", target.port, "a")


async def load_status(a: KbtpInitiator, handle: int, **kw: Any) -> Any:
    """The COMPLETION of a LOAD, whatever its status."""
    return await a.load_into(handle, bytearray(BLOCK), check=False, **kw)


def runs(target: KbtpTarget) -> int:
    return sum(chain_runs(s.qp) for s in target.sessions.values())


@pytest.mark.parametrize("offload", [True, False])
async def test_s8_loads_make_zero_application_calls_when_offloaded(offload: bool) -> None:
    with trio.fail_after(30):
        async with serving(offload) as (target, counted), connect(target) as a:
            for h in range(4):
                assert (await a.alloc_store(h, data(h, 1000 * (h + 1)), seal=True)).ok
            before = counted.calls
            for _ in range(3):
                for h in range(4):
                    assert await a.load(h) == data(h, 1000 * (h + 1))
            loads = counted.calls - before
            assert loads == (0 if offload else 12)
            assert runs(target) == (12 if offload else 0)
            # Pipelined: 8 LOADs in flight at once, still none for the application.
            got = await trio_gather([functools.partial(a.load, h % 4) for h in range(8)])
            assert got == [data(h % 4, 1000 * (h % 4 + 1)) for h in range(8)]
            assert counted.calls - before == (0 if offload else 20)


@pytest.mark.parametrize("offload", [True, False])
async def test_s8_mapped_stores_make_zero_application_calls_when_offloaded(
    offload: bool,
) -> None:
    with trio.fail_after(30):
        async with serving(offload) as (target, counted), connect(target) as a:
            for h in range(3):
                assert (await a.alloc_store(h, data(h, 10))).ok  # unsealed
            before = counted.calls
            for h in range(3):
                done = await a.store(h, bytearray(data(h + 5, 2000 + h)), inline=False)
                assert done.ok and done.data_length == 2000 + h
                entry = target.core.entry(h)
                assert (entry.data_length, entry.sealed) == (2000 + h, False)
                assert done.generation == entry.generation
                assert done.block_offset == entry.block_offset
            sealed = await a.store(0, bytearray(data(9, 3000)), inline=False, seal=True)
            assert sealed.ok and target.core.entry(0).sealed
            assert await a.load(0) == data(9, 3000)  # offloaded too, after the seal
            assert target.core.block_bytes(sealed.block_offset, 3000) == data(9, 3000)
            assert counted.calls - before == (0 if offload else 5)
            refused = await a.store(0, bytearray(10), inline=False, check=False)
            assert refused.status == Status.SEALED  # a decision: the application's
            assert counted.calls - before == (1 if offload else 6)


async def trio_gather(calls: list[Callable[[], Any]]) -> list[Any]:
    results: list[Any] = [None] * len(calls)

    async def one(i: int) -> None:
        results[i] = await calls[i]()

    async with trio.open_nursery() as nursery:
        for i in range(len(calls)):
            nursery.start_soon(one, i)
    return results


async def test_s8_what_needs_a_decision_falls_back_and_keeps_the_order() -> None:
    """Every error status, ALLOW_UNSEALED, an empty block: the application answers; a LOAD
    behind a STORE, FREE or ALLOC_STORE of its handle sees what they did (§6.0)."""
    with trio.fail_after(30):
        async with serving() as (target, counted), connect(target) as a:
            before = counted.calls
            miss = await load_status(a, 1)
            assert miss.status == Status.NOT_VALID and counted.calls == before + 1
            assert (await a.alloc_store(1, data(1, 500))).ok  # not sealed
            assert (await load_status(a, 1)).status == Status.NOT_SEALED
            assert await a.load(1, allow_unsealed=True) == data(1, 500)
            stored = await a.store(1, bytearray(data(2, 700)), seal=True)
            assert await a.load(1) == data(2, 700)  # offloaded, after the STORE
            assert (await load_status(a, 1, generation=stored.generation + 5)).status == (
                Status.WRONG_GENERATION
            )
            assert (await load_status(a, 999)).status == Status.HANDLE_OUT_OF_RANGE
            assert (await a.alloc_store(2, b"", seal=True)).ok
            assert await a.load(2) == b""  # no Write: the application's
            offloaded = runs(target)
            assert offloaded == 1
            async with trio.open_nursery() as nursery:  # FREE then LOAD, not waiting
                results: list[Any] = []

                async def free() -> None:
                    results.append(await a.free(1))

                async def load() -> None:
                    await trio.sleep(0)
                    results.append(await load_status(a, 1))

                nursery.start_soon(free)
                nursery.start_soon(load)
            assert {r.status for r in results} == {Status.SUCCESS, Status.NOT_VALID}


async def test_s8_a_bad_descriptor_stag_ends_the_session_as_in_software() -> None:
    with trio.fail_after(30):
        async with serving() as (target, _counted), connect(target) as a:
            assert (await a.alloc_store(3, data(3, 900), seal=True)).ok
            memory = bytes(target.core.memory)
            from kbtp.messages import DataDescriptor, Load

            bad = Load(77, 3, DataDescriptor(0x0BAD0BAD, 0, BLOCK)).encode()
            with pytest.raises(SessionClosed):
                await a.send_raw(bad, 77)
                await a.load(3)
            while target.sessions:
                await trio.sleep(0.01)
            assert bytes(target.core.memory) == memory


async def test_s8_an_entry_outside_the_pool_fails_the_chain_memory_unchanged() -> None:
    """A table entry naming memory outside the session's MR: the RNIC's SGE check fails the
    chain (LOC_PROT_ERR), the session is Terminated, nothing is written."""
    with trio.fail_after(30):
        async with serving() as (target, _counted), connect(target) as a:
            assert (await a.alloc_store(4, data(4, 100), seal=True)).ok
            at = target.core.layout.entry_offset(4)
            entry = read_entry(target.core.memory, at)
            struct.pack_into(">Q", target.core.memory, at + 8, target.local_mr.base + (1 << 40))
            memory = bytes(target.core.memory)
            (sess,) = target.sessions.values()
            with pytest.raises(SessionClosed):
                await a.load(4)
            assert sess.qp.state in (QpState.TERMINATE, QpState.ERROR)
            assert bytes(target.core.memory) == memory
            assert entry.valid


D = InitiatorConfig(b"d", 32, 32, 6, "blue", direct_alloc=True)


@asynccontextmanager
async def partitioned(offload: bool = True) -> AsyncIterator[tuple[KbtpTarget, Counted]]:
    """A target whose initiator ``d`` has a DIRECT_ALLOC partition of 6 blocks."""
    cfg = TargetConfig(block_size=BLOCK, pool_blocks=16, initiators=(A, D), request_credits=8)
    target = KbtpTarget(cfg, offload=offload)
    async with target.running() as running:
        yield running, Counted(running)


@pytest.mark.parametrize("offload", [True, False])
async def test_s8_alloc_stores_on_a_partition_make_zero_application_calls(offload: bool) -> None:
    """§6.3 run by the RNIC: masked FetchAdd on the partition's Head, slot checked and
    consumed, RDMA Read, entry 4-15 then 0-3, COMPLETION; the core's usage stays exact."""
    with trio.fail_after(30):
        async with partitioned(offload) as (target, counted), connect_as(target, "d") as a:
            before = counted.calls
            done = []
            for i in range(4):
                got = await a.alloc_store(32 + i, data(i, 1500 + i), seal=i % 2 == 1, inline=False)
                assert got.ok and got.data_length == 1500 + i
                done.append(got)
            assert counted.calls - before == (0 if offload else 4)
            ring = target.core.ring_of(b"d")
            assert ring.head()[0] == 4
            for i, got in enumerate(done):
                entry = target.core.entry(32 + i)
                assert (entry.valid, entry.sealed) == (True, i % 2 == 1)
                assert (entry.generation, entry.block_offset) == (got.generation, got.block_offset)
                assert target.core.block_bytes(got.block_offset, 1500 + i) == data(i, 1500 + i)
                slot = ring.slot(i)
                assert slot.consumed  # §3.3: consumed by the target
            assert len({g.block_offset for g in done}) == 4
            assert await a.load(33) == data(1, 1501)
            # The core's accounting is exact: two more fit the quota of 6, the seventh not.
            for i in (4, 5):
                assert (await a.alloc_store(32 + i, data(i, 100), inline=False)).ok
            over = await a.alloc_store(38, data(9, 100), inline=False, check=False)
            assert over.status == Status.NO_SPACE  # the core looked at the log first
            assert target.core.usage(b"d") == 6
            assert (await a.free(32)).ok
            again = await a.alloc_store(38, data(8, 700), inline=False)
            assert again.ok and again.block_offset == done[0].block_offset  # round the ring
            assert target.core.block_bytes(again.block_offset, 700) == data(8, 700)
            over = await a.alloc_store(39, data(9, 100), inline=False, check=False)
            assert over.status == Status.NO_SPACE and target.core.usage(b"d") == 6
            if offload:  # only the two NO_SPACEs were the application's
                assert counted.calls - before == 2
            assert sorted(target.core.held_blocks()) == []
            assert target.core.pending_ops() == 0


def connect_as(target: KbtpTarget, who: str) -> AbstractAsyncContextManager[KbtpInitiator]:
    return KbtpInitiator.connect("127.0.0.1", target.port, who)


@pytest.mark.parametrize("offload", [True, False])
async def test_s8_frees_on_a_partition_make_zero_application_calls(offload: bool) -> None:
    """§6.4 run by the RNIC: entry 0-3 (Flags cleared, next Generation), FetchAdd on Tail,
    the block into its consumed slot (Block Offset, then Sequence), COMPLETION; the blocks
    go round the ring and the core's usage stays exact."""
    with trio.fail_after(30):
        async with partitioned(offload) as (target, counted), connect_as(target, "d") as a:
            before = counted.calls
            for round_ in range(3):  # 3 x 4 allocations on a ring of 8 slots: it wraps
                stored = []
                for i in range(4):
                    payload = data(round_ * 4 + i, 900 + i)
                    got = await a.alloc_store(40 + i, payload, seal=True, inline=False)
                    assert got.ok
                    stored.append(got)
                for i, got in enumerate(stored):
                    freed = await a.free(40 + i)
                    assert freed.ok and freed.block_offset == got.block_offset
                    entry = target.core.entry(40 + i)
                    assert not entry.valid and entry.generation == freed.generation
                    assert freed.generation == got.generation % 0xFFFF + 1
            assert counted.calls - before == (0 if offload else 24)
            ring = target.core.ring_of(b"d")
            assert ring.head()[0] == ring.tail()[0] - 6 == 12  # every block back in the ring
            assert sorted(ring.available_blocks()) == sorted(
                target.core._partition_blocks(target.core.layout.partitions[0])
            )
            missing = await a.free(40, check=False)  # a decision: NOT_VALID, software
            assert missing.status == Status.NOT_VALID
            assert target.core.usage(b"d") == 0
            assert counted.calls - before == (1 if offload else 25)


async def test_s8_a_free_that_must_be_deferred_falls_back_and_stays_exact() -> None:
    """§3.3: a FREE whose slot a direct allocation has not consumed yet must wait; the
    chain cannot defer, so that FREE is the application's, and the ones after it too
    until the deferred write is done (the BIND consumes the slot)."""
    with trio.fail_after(30):
        async with partitioned() as (target, counted), connect_as(target, "d") as a:
            reserved = await a.reserve(data(7, 500))  # ticket 0, its slot not consumed
            assert reserved.ticket == 0
            for i in range(1, 6):
                assert (await a.alloc_store(40 + i, data(i, 300), inline=False)).ok
            before = counted.calls
            for i in (1, 2):  # Tail tickets 6 and 7: slots 6 and 7, consumed
                assert (await a.free(40 + i)).ok
            assert counted.calls == before
            assert (await a.free(43)).ok  # Tail ticket 8 = slot 0, ticket 0's: deferred
            ring = target.core.ring_of(b"d")
            assert counted.calls == before + 1 and len(ring.deferred) == 1
            assert (await a.free(44)).ok  # the core holds a free back: software too
            assert counted.calls == before + 2
            bound = await a.bind(reserved, 40, seal=True)  # consumes slot 0: written now
            assert bound.ok and not ring.deferred
            assert await a.load(40) == data(7, 500)
            assert (await a.free(45)).ok  # offloaded again
            assert counted.calls == before + 3  # the two FREEs and the BIND; LOAD is not
            again = await a.free(45, check=False)  # NOT_VALID: the core looks at the log
            assert again.status == Status.NOT_VALID and target.core.usage(b"d") == 1
            blocks = sorted(ring.available_blocks())
            assert len(blocks) == 5 and len(set(blocks)) == 5
            assert ring.tail()[0] == 11


@pytest.mark.parametrize("offload", [True, False])
async def test_s6_0_an_unsealed_load_from_another_session_waits_behind_a_store_mid_read(
    offload: bool,
) -> None:
    """docs/kbtp.md §6.0: requests naming one handle take effect one at a time, whichever
    session sends them.  An ALLOW_UNSEALED LOAD from B that arrives while A's STORE of the
    block waits for its Read Response (held back at A) is answered only after the STORE,
    with its Data Length and data, on both targets; B's requests of other handles are
    answered meanwhile."""
    b_ini = InitiatorConfig(b"b", 32, 8, 8, "red")
    cfg = TargetConfig(block_size=BLOCK, pool_blocks=16, initiators=(A, b_ini), request_credits=8)
    new = data(7, 2000)
    with trio.fail_after(30):
        async with (
            KbtpTarget(cfg, offload=offload).running() as target,
            connect(target) as a,
            KbtpInitiator.connect("127.0.0.1", target.port, "b") as b,
        ):
            assert (await a.alloc_store(0, data(1, 10))).ok  # unsealed, 10 octets
            assert (await a.alloc_store(1, data(2, 300), seal=True)).ok
            held: list[ReadRequest] = []
            answer = a.qp._on_read_request

            def hold(req: ReadRequest) -> None:
                held.append(req)

            a.qp._on_read_request = hold  # type: ignore[method-assign]  # hold A's Read Requests
            got: dict[str, Any] = {}
            sink = bytearray(BLOCK)

            async def store() -> None:
                got["store"] = await a.store(0, bytearray(new), inline=False)

            async def unsealed_load() -> None:
                got["load"] = await b.load_into(0, sink, allow_unsealed=True, check=False)

            async with trio.open_nursery() as nursery:
                nursery.start_soon(store)
                while not held:
                    await trio.sleep(0.005)
                nursery.start_soon(unsealed_load)
                await trio.sleep(0.3)
                assert "load" not in got  # behind the STORE, not answered with 10 octets
                with trio.fail_after(5):  # only that handle waits: B's other requests go on
                    assert await b.load(1) == data(2, 300)
                assert "load" not in got
                a.qp._on_read_request = answer  # type: ignore[method-assign]
                answer(held.pop())
            assert got["store"].ok and got["load"].ok
            assert got["load"].data_length == 2000 and bytes(sink[:2000]) == new
