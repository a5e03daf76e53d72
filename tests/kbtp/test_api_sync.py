"""The threads client over a real target and real TCP: tickets, numpy arenas, concurrent
submitters, closing with batches in flight (docs/kbtp.md §13.3, §13.5)."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from kbtp.arena import ArenaError
from kbtp.batch import BlockRef, BlockResult, build_stores
from kbtp.client_sync import BatchTicket, KbtpClient
from kbtp.constants import Status
from kbtp.initiator_errors import HelloRefused, SessionClosed
from kbtp.target_thread import TargetThread
from stack.transport.cm import ConnectFailed
from tests.kbtp.api_helpers import BLOCK, CREDITS, config, pattern
from tests.kbtp.targets import target_thread

WAIT = 60.0


@pytest.fixture
def target() -> Iterator[TargetThread]:
    with target_thread(config()) as served:
        yield served


@pytest.fixture
def client(target: TargetThread) -> Iterator[KbtpClient]:
    with KbtpClient("127.0.0.1", target.port, "a") as connected:
        yield connected


def refs(count: int, first_handle: int = 0, first_slot: int = 0) -> list[BlockRef]:
    return [BlockRef(first_handle + i, (first_slot + i) * BLOCK, BLOCK) for i in range(count)]


@pytest.mark.both_targets
def test_submit_poll_wait_result(target: TargetThread, client: KbtpClient) -> None:
    """A store and a load submitted without waiting; poll() shows per-block results as
    they come, wait()/result() block; the loaded bytes are the stored ones."""
    count = 4 * CREDITS
    source = bytearray(b"".join(pattern(i, BLOCK) for i in range(count)))
    src, dst = client.register(source), client.register(bytearray(count * BLOCK))
    assert client.block_size == BLOCK and client.request_credits == CREDITS
    ticket = client.submit_store(src, refs(count))
    assert isinstance(ticket, BatchTicket) and len(ticket) == count
    assert len(ticket.poll()) == count
    assert ticket.wait(WAIT) and ticket.done()
    stored = ticket.result(0)
    assert ticket.poll() == stored and "done" in repr(ticket)
    assert [r.status for r in stored] == [Status.SUCCESS] * count
    load = client.submit_load(dst, refs(count))
    loaded = load.result(WAIT)
    assert all(r.ok and r.data_length == BLOCK for r in loaded)
    assert [r.generation for r in loaded] == [r.generation for r in stored]
    assert bytes(dst.view) == bytes(source)
    for i, r in enumerate(stored):
        assert target.target.core.block_bytes(r.block_offset, BLOCK) == pattern(i, BLOCK)
    # The blocking forms, and FREE.
    assert all(r.ok for r in client.free(list(range(count)), timeout=WAIT))
    again = client.load(dst, refs(2), timeout=WAIT)
    assert [r.status for r in again] == [Status.NOT_VALID] * 2
    assert all(r.ok for r in client.store(src, refs(2), seal=False, timeout=WAIT))
    assert all(r.ok for r in client.load(dst, refs(2), allow_unsealed=True, timeout=WAIT))


@pytest.mark.both_targets
def test_no_registration_per_request(client: KbtpClient) -> None:
    """After the arena, batches register nothing: counted at the session's PD."""
    arena = client.register(bytearray(pattern(1, 2 * CREDITS * BLOCK)))
    pd = client.initiator.pd
    calls: list[str] = []
    reg_mr, alloc_mr = pd.reg_mr, pd.alloc_mr

    def counted_reg_mr(*args: Any, **kwargs: Any) -> Any:
        calls.append("reg_mr")
        return reg_mr(*args, **kwargs)

    def counted_alloc_mr(*args: Any, **kwargs: Any) -> Any:
        calls.append("alloc_mr")
        return alloc_mr(*args, **kwargs)

    pd.reg_mr = counted_reg_mr  # type: ignore[method-assign]
    pd.alloc_mr = counted_alloc_mr  # type: ignore[method-assign]
    blocks = refs(2 * CREDITS)
    for _ in range(3):
        assert all(r.ok for r in client.store(arena, blocks, timeout=WAIT))
        assert all(r.ok for r in client.load(arena, blocks, timeout=WAIT))
        assert all(r.ok for r in client.free([b.handle for b in blocks], timeout=WAIT))
    assert calls == []
    client.register(bytearray(16))
    assert calls == ["reg_mr"]  # the counter sees a registration


@pytest.mark.both_targets
def test_numpy_arena_loads_in_place(client: KbtpClient) -> None:
    np = pytest.importorskip("numpy")
    values = np.arange(4 * BLOCK // 2, dtype=np.float16).reshape(4, -1)
    source = client.register(values)
    cache = np.zeros((4, BLOCK // 2), dtype=np.float16)
    dest = client.register(cache)
    assert all(r.ok for r in client.store(source, refs(4), timeout=WAIT))
    assert all(r.ok for r in client.load(dest, refs(4)[::-1], timeout=WAIT))
    assert np.array_equal(cache, values)
    assert cache.tobytes() == values.tobytes()


@pytest.mark.both_targets
def test_bad_arguments_raise_in_the_callers_thread(client: KbtpClient) -> None:
    arena = client.register(bytearray(2 * BLOCK))
    with pytest.raises(ArenaError, match="outside the arena"):
        client.submit_load(arena, [BlockRef(0, BLOCK + 1, BLOCK)])
    with pytest.raises(ArenaError, match="Block Size"):
        client.submit_store(arena, [BlockRef(0, 0, BLOCK + 1)])
    with pytest.raises(ArenaError, match="handle"):
        client.submit_free([-3])
    assert client.initiator.stats == {}
    # A release while a batch uses the arena.  The batch is started and the release tried
    # in one call on the RNIC thread, so no completion can come in between (a fast target
    # answers a STORE before a second call from this thread could reach the RNIC thread).
    ticket = BatchTicket(1)
    requests = build_stores(arena, refs(1), client.block_size, client.ack.max_inline)

    def start_then_release() -> None:
        client._start(requests, arena, ticket)  # noqa: SLF001 - what submit_store runs
        arena.close()

    with pytest.raises(ArenaError, match="in use"):
        client._thread.run_sync(start_then_release)  # noqa: SLF001
    assert ticket.result(WAIT)[0].status is Status.SUCCESS
    client.release(arena)
    with pytest.raises(ArenaError, match="closed"):
        client.submit_load(arena, refs(1))


@pytest.mark.both_targets
def test_threads_submit_concurrently(target: TargetThread, client: KbtpClient) -> None:
    """Eight threads share one session and one arena: each stores and loads its own
    blocks, several batches at once; every byte comes back to its thread's span."""
    threads, per = 8, 6
    source = bytearray(b"".join(pattern(i, BLOCK) for i in range(threads * per)))
    src = client.register(source)
    dst = client.register(bytearray(len(source)))
    errors: list[BaseException] = []
    start = threading.Barrier(threads)

    def worker(n: int) -> None:
        try:
            mine = refs(per, first_handle=n * per, first_slot=n * per)
            start.wait()
            stored = client.submit_store(src, mine)
            results = stored.result(WAIT)
            assert [r.status for r in results] == [Status.SUCCESS] * per
            halves = [client.submit_load(dst, mine[:3]), client.submit_load(dst, mine[3:])]
            assert all(r.ok for t in halves for r in t.result(WAIT))
            span = slice(n * per * BLOCK, (n + 1) * per * BLOCK)
            assert bytes(dst.view[span]) == bytes(source[span])
        except BaseException as exc:  # reported to the main thread
            errors.append(exc)

    workers = [threading.Thread(target=worker, args=(n,)) for n in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(2 * WAIT)
    assert not any(w.is_alive() for w in workers)
    assert errors == []
    assert target.target.core.usage(b"a") == threads * per


@pytest.mark.both_targets
def test_close_with_batches_in_flight_fails_them_cleanly(target: TargetThread) -> None:
    """close() while batches run: each ticket finishes, every block either succeeded or
    carries SessionClosed; later submits raise SessionClosed; nothing hangs."""
    client = KbtpClient("127.0.0.1", target.port, "a")
    count = 96
    arena = client.register(bytearray(pattern(9, count * BLOCK)))
    tickets = [
        client.submit_store(arena, refs(48, first_handle=48 * i, first_slot=48 * i))
        for i in range(2)
    ]
    client.close()
    client.close()  # idempotent
    assert client.closed and "closed" in repr(client)
    outcomes: list[BlockResult] = []
    for ticket in tickets:
        assert ticket.wait(WAIT)
        outcomes += ticket.result(0)
    assert len(outcomes) == count
    for r in outcomes:
        assert r.ok or (r.status is None and isinstance(r.error, SessionClosed))
    assert any(r.error is not None for r in outcomes)
    with pytest.raises(SessionClosed):
        client.submit_store(arena, refs(1))
    assert client.context.closed


@pytest.mark.both_targets
def test_target_gone_then_submit(target: TargetThread) -> None:
    """The target stops under an open client: a submit is refused with SessionClosed (or
    its blocks fail with it); closing the client still works."""
    with KbtpClient("127.0.0.1", target.port, "b") as client:
        arena = client.register(bytearray(BLOCK))
        assert client.store(arena, [BlockRef(128, 0, BLOCK)], timeout=WAIT)[0].ok
        target.close()
        try:
            results = client.load(arena, [BlockRef(128, 0, BLOCK)], timeout=WAIT)
        except SessionClosed:
            pass
        else:
            assert results[0].ok or isinstance(results[0].error, SessionClosed)


@pytest.mark.both_targets
def test_connect_errors(target: TargetThread) -> None:
    with pytest.raises(HelloRefused):
        KbtpClient("127.0.0.1", target.port, "nobody")
    with KbtpClient("127.0.0.1", target.port, "a"):
        with pytest.raises(HelloRefused, match="SESSION_EXISTS"):
            KbtpClient("127.0.0.1", target.port, "a")
    port = target.port
    target.close()
    with pytest.raises(ConnectFailed, match="TCP connect"):
        KbtpClient("127.0.0.1", port, "a", connect_timeout=WAIT)


def test_connect_timeout_against_a_silent_peer() -> None:
    """A TCP peer that never answers the MPA Request: TimeoutError after connect_timeout,
    and the client's RNIC thread is stopped (nothing left running)."""
    with socket.create_server(("127.0.0.1", 0)) as silent:
        port = silent.getsockname()[1]
        before = {t.name for t in threading.enumerate()}
        with pytest.raises(TimeoutError):
            KbtpClient("127.0.0.1", port, "a", connect_timeout=0.5)
        assert {t.name for t in threading.enumerate()} - before == set()
