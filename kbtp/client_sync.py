"""A KBTP client for threads: batches submitted from any thread, polled or waited on
(docs/kbtp.md §13.3).

:class:`KbtpClient` runs a :class:`~kbtp.initiator.KbtpInitiator` on the RNIC thread of a
:class:`stack.verbs_sync.Context` (the synchronous verbs' background trio loop), so the
session progresses while the application computes.  Application threads hand it work with
the context's ``run_sync``: a submit checks its blocks in the caller's thread (a bad
argument raises :class:`~kbtp.arena.ArenaError` and nothing is sent), then starts the batch
on the RNIC thread and returns a :class:`BatchTicket` at once.  Any number of threads may
submit concurrently; the session pipelines every batch's requests up to its credits.

:meth:`KbtpClient.close` disconnects: blocks still in flight complete with a
:class:`~kbtp.initiator_errors.SessionClosed` ``error`` and every ticket finishes (nothing
hangs); later submits raise :class:`SessionClosed`.  The asyncio face of the same client is
:class:`~kbtp.client_async.AsyncKbtpClient`.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Generator, Sequence
from concurrent.futures import Future
from typing import Any

import trio

from kbtp.arena import Arena
from kbtp.batch import BlockRef, BlockResult, build_free, build_loads, build_stores, run_batch
from kbtp.constants import DEFAULT_HELLO_ACK_TIMEOUT, Capability
from kbtp.initiator import KbtpInitiator
from kbtp.initiator_errors import SessionClosed
from kbtp.messages import HelloAck, Request
from stack.verbs_sync import Closing, Context, RnicClosed
from stack.wire.events import MpaSettings

__all__ = ["CLOSE_TIMEOUT", "CONNECT_TIMEOUT", "BatchTicket", "KbtpClient"]

CONNECT_TIMEOUT = 30.0
"""Seconds :class:`KbtpClient` waits for TCP, MPA and the HELLO_ACK by default."""
CLOSE_TIMEOUT = 10.0
"""Seconds :meth:`KbtpClient.close` waits for the session to end."""


class BatchTicket:
    """A submitted batch, for callers that do not await (docs/kbtp.md §13.3).

    :meth:`done` and :meth:`poll` never block; :meth:`wait` and :meth:`result` block up to
    a timeout; asyncio code may ``await`` the ticket (the event loop does not block).  The
    result is one :class:`~kbtp.batch.BlockResult` per block, in submission order.
    """

    def __init__(self, count: int) -> None:
        self.count = count
        self._future: Future[list[BlockResult]] = Future()
        self._future.set_running_or_notify_cancel()  # a waiter's cancel cannot drop it
        self._partial: list[BlockResult | None] = [None] * count
        self._lock = threading.Lock()

    def done(self) -> bool:
        """True once every block has its result (or the batch failed)."""
        return self._future.done()

    def poll(self) -> list[BlockResult | None]:
        """The results so far, without blocking: None for a block still in flight."""
        with self._lock:
            return list(self._partial)

    def wait(self, timeout: float | None = None) -> bool:
        """Block until done or ``timeout`` seconds passed; returns :meth:`done`."""
        try:
            self._future.exception(timeout)
        except TimeoutError:
            return False
        return True

    def result(self, timeout: float | None = None) -> list[BlockResult]:
        """Every block's result; :class:`TimeoutError` if not done within ``timeout``."""
        return self._future.result(timeout)

    def __await__(self) -> Generator[Any, None, list[BlockResult]]:
        return asyncio.wrap_future(self._future).__await__()

    def __len__(self) -> int:
        return self.count

    # -- the RNIC thread's side ----------------------------------------------------------
    def _record(self, index: int, result: BlockResult) -> None:
        with self._lock:
            self._partial[index] = result

    def _finish(self, results: list[BlockResult]) -> None:
        self._future.set_result(results)

    def _fail(self, error: BaseException) -> None:
        if not self._future.done():
            self._future.set_exception(error)

    def __repr__(self) -> str:
        left = sum(r is None for r in self.poll())
        return f"<BatchTicket {self.count} blocks, {'done' if self.done() else f'{left} left'}>"


class KbtpClient(Closing):
    """One KBTP session usable from any thread (see the module docstring).

    ``context``: the :class:`~stack.verbs_sync.Context` whose RNIC thread runs the session
    (shared by several clients if given; otherwise the client makes one and closes it with
    itself).  Connecting raises what :meth:`KbtpInitiator.connect` raises
    (:class:`~kbtp.initiator_errors.HelloRefused`, :class:`~stack.transport.cm.ConnectFailed`,
    ...) or :class:`TimeoutError` after ``connect_timeout`` seconds.
    """

    def __init__(
        self,
        host: str,
        port: int,
        identity: bytes | str,
        *,
        capabilities: Capability = Capability.NONE,
        context: Context | None = None,
        settings: MpaSettings | None = None,
        connect_timeout: float = CONNECT_TIMEOUT,
        hello_timeout: float = DEFAULT_HELLO_ACK_TIMEOUT,
    ) -> None:
        name = identity.decode(errors="replace") if isinstance(identity, bytes) else identity
        self.context = context or Context(f"kbtp-{name}")
        self._own_context = context is None
        self._thread = self.context.thread
        self._connect_args = (host, port, identity, capabilities, settings, hello_timeout)
        self._ready: Future[KbtpInitiator] = Future()
        self._ended: Future[None] = Future()
        self._stop: trio.Event | None = None
        self._nursery: trio.Nursery | None = None
        self._closed = False
        self._lock = threading.Lock()
        self.failure: BaseException | None = None
        """What ended the session other than :meth:`close`, if anything did."""
        try:
            self._thread.run_sync(self._thread.spawn, self._session)
            self.initiator = self._ready.result(connect_timeout)
            """The session (use it on the RNIC thread only: ``context.thread.run_sync``)."""
        except BaseException:
            self._closed = True
            self._shutdown(0.0)
            raise

    # -- the session on the RNIC thread --------------------------------------------------
    async def _session(self) -> None:
        host, port, identity, capabilities, settings, hello_timeout = self._connect_args
        try:
            async with (
                KbtpInitiator.connect(
                    host,
                    port,
                    identity,
                    capabilities=capabilities,
                    settings=settings,
                    rnic=self.context.rnic,
                    hello_timeout=hello_timeout,
                ) as initiator,
                trio.open_nursery() as nursery,
            ):
                self._stop = trio.Event()
                self._nursery = nursery
                self._ready.set_result(initiator)
                await self._stop.wait()
                self._nursery = None
                await initiator.aclose()  # in-flight blocks fail with SessionClosed
        except Exception as exc:  # reported to the caller, never to the RNIC thread
            self.failure = exc
            if not self._ready.done():
                self._ready.set_exception(exc)
        finally:
            self._nursery = None
            if not self._ready.done():
                self._ready.set_exception(RnicClosed("the RNIC stopped before the session began"))
            self._ended.set_result(None)

    def _start(self, requests: list[Request], arena: Arena | None, ticket: BatchTicket) -> None:
        nursery = self._nursery
        if nursery is None:
            raise SessionClosed("the KBTP client is closed")
        if self.initiator.closed:
            raise SessionClosed("the KBTP session with the target has ended")
        if arena is not None:
            arena.busy += 1
        nursery.start_soon(self._run, requests, arena, ticket)

    async def _run(self, requests: list[Request], arena: Arena | None, ticket: BatchTicket) -> None:
        try:
            results = await run_batch(self.initiator, requests, ticket._record)
        except BaseException as exc:  # handed to the ticket's waiters, never to trio
            ticket._fail(exc if isinstance(exc, Exception) else SessionClosed("cancelled"))
            if not isinstance(exc, Exception):
                raise
        else:
            ticket._finish(results)
        finally:
            if arena is not None:
                arena.busy -= 1

    # -- the application's side ----------------------------------------------------------
    @property
    def ack(self) -> HelloAck:
        """The target's HELLO_ACK: block size, credits, handle range, ... (§4.2)."""
        ack = self.initiator.ack
        assert ack is not None
        return ack

    @property
    def block_size(self) -> int:
        return self.ack.block_size

    @property
    def request_credits(self) -> int:
        return self.ack.request_credits

    @property
    def closed(self) -> bool:
        return self._closed or self._ended.done()

    def register(self, buffer: Any) -> Arena:
        """Register ``buffer`` once as an :class:`~kbtp.arena.Arena` of this session."""
        return self._thread.run_sync(Arena.register, self.initiator.pd, buffer)

    def release(self, arena: Arena) -> None:
        """Deregister ``arena`` (:class:`~kbtp.arena.ArenaError` while a batch uses it)."""
        self._thread.run_sync(arena.close)

    def _submit(self, requests: list[Request], arena: Arena | None) -> BatchTicket:
        if self._closed:
            raise SessionClosed("the KBTP client is closed")
        ticket = BatchTicket(len(requests))
        try:
            self._thread.run_sync(self._start, requests, arena, ticket)
        except RnicClosed as exc:
            raise SessionClosed("the KBTP client's RNIC has stopped") from exc
        return ticket

    def submit_store(
        self,
        arena: Arena,
        blocks: Sequence[BlockRef],
        *,
        alloc: bool = True,
        seal: bool = True,
        inline: bool | None = None,
    ) -> BatchTicket:
        """Start storing ``blocks`` from ``arena`` (ALLOC_STORE, or STORE with ``alloc``
        False; see :func:`kbtp.batch.build_stores`) and return its ticket."""
        ack = self.ack
        requests = build_stores(
            arena, blocks, ack.block_size, ack.max_inline, alloc=alloc, seal=seal, inline=inline
        )
        return self._submit(requests, arena)

    def submit_load(
        self, arena: Arena, blocks: Sequence[BlockRef], *, allow_unsealed: bool = False
    ) -> BatchTicket:
        """Start loading ``blocks`` into ``arena`` (:func:`kbtp.batch.build_loads`)."""
        requests = build_loads(arena, blocks, self.block_size, allow_unsealed=allow_unsealed)
        return self._submit(requests, arena)

    def submit_free(self, handles: Sequence[int | tuple[int, int]]) -> BatchTicket:
        """Start FREEing ``handles`` (each a handle or (handle, generation))."""
        return self._submit(build_free(handles), None)

    def store(
        self,
        arena: Arena,
        blocks: Sequence[BlockRef],
        *,
        alloc: bool = True,
        seal: bool = True,
        inline: bool | None = None,
        timeout: float | None = None,
    ) -> list[BlockResult]:
        """:meth:`submit_store` and wait for its results."""
        ticket = self.submit_store(arena, blocks, alloc=alloc, seal=seal, inline=inline)
        return ticket.result(timeout)

    def load(
        self,
        arena: Arena,
        blocks: Sequence[BlockRef],
        *,
        allow_unsealed: bool = False,
        timeout: float | None = None,
    ) -> list[BlockResult]:
        """:meth:`submit_load` and wait for its results."""
        return self.submit_load(arena, blocks, allow_unsealed=allow_unsealed).result(timeout)

    def free(
        self, handles: Sequence[int | tuple[int, int]], *, timeout: float | None = None
    ) -> list[BlockResult]:
        """:meth:`submit_free` and wait for its results."""
        return self.submit_free(handles).result(timeout)

    # -- lifetime ------------------------------------------------------------------------
    def close(self, timeout: float = CLOSE_TIMEOUT) -> None:
        """Disconnect (idempotent): batches in flight finish with their unfinished blocks
        failed (:class:`SessionClosed`); then the client's own context stops."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._shutdown(timeout)

    def _shutdown(self, timeout: float) -> None:
        try:
            stop = self._stop
            if stop is not None:
                self._thread.run_sync(stop.set)
                self._ended.result(timeout)
        except (RnicClosed, TimeoutError):
            pass  # the context's stop below tears the connection down
        finally:
            if self._own_context:
                self.context.close()

    def __repr__(self) -> str:
        return f"<KbtpClient {self.context.name} {'closed' if self.closed else 'open'}>"
