"""A KBTP client for asyncio: the threads' client, awaited (docs/kbtp.md §13.4).

:class:`AsyncKbtpClient` wraps a :class:`~kbtp.client_sync.KbtpClient`, whose session runs
on the RNIC thread of a :class:`stack.verbs_sync.Context`: a batch is handed to that thread
(a short call) and awaited through its :class:`~kbtp.client_sync.BatchTicket`, which the RNIC
thread completes with ``call_soon_threadsafe``, so the event loop never blocks.  Connecting
and closing, which wait for the network, run in a worker thread.  Cancelling a task that
awaits a batch stops the waiting only; the batch itself runs to its end.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from types import TracebackType
from typing import Any, Self

from kbtp.arena import Arena
from kbtp.batch import BlockRef, BlockResult
from kbtp.client_sync import CLOSE_TIMEOUT, BatchTicket, KbtpClient
from kbtp.messages import HelloAck

__all__ = ["AsyncKbtpClient"]


class AsyncKbtpClient:
    """One KBTP session for asyncio code; build it with ``await AsyncKbtpClient.connect``."""

    def __init__(self, client: KbtpClient) -> None:
        self.client = client

    @classmethod
    async def connect(
        cls, host: str, port: int, identity: bytes | str, **options: Any
    ) -> AsyncKbtpClient:
        """Connect as :class:`~kbtp.client_sync.KbtpClient` does (same ``options``)."""
        return cls(await asyncio.to_thread(KbtpClient, host, port, identity, **options))

    @property
    def ack(self) -> HelloAck:
        return self.client.ack

    @property
    def block_size(self) -> int:
        return self.client.block_size

    @property
    def closed(self) -> bool:
        return self.client.closed

    async def register(self, buffer: Any) -> Arena:
        """Register ``buffer`` once as an arena of this session."""
        return self.client.register(buffer)

    async def release(self, arena: Arena) -> None:
        """Deregister ``arena``."""
        self.client.release(arena)

    def submit_store(self, arena: Arena, blocks: Sequence[BlockRef], **options: Any) -> BatchTicket:
        """Start a store batch (:meth:`KbtpClient.submit_store`); ``await`` the ticket."""
        return self.client.submit_store(arena, blocks, **options)

    def submit_load(self, arena: Arena, blocks: Sequence[BlockRef], **options: Any) -> BatchTicket:
        """Start a load batch (:meth:`KbtpClient.submit_load`); ``await`` the ticket."""
        return self.client.submit_load(arena, blocks, **options)

    async def store(
        self, arena: Arena, blocks: Sequence[BlockRef], **options: Any
    ) -> list[BlockResult]:
        """Store ``blocks`` from ``arena`` and return each block's result."""
        return await self.client.submit_store(arena, blocks, **options)

    async def load(
        self, arena: Arena, blocks: Sequence[BlockRef], **options: Any
    ) -> list[BlockResult]:
        """Load ``blocks`` into ``arena`` and return each block's result."""
        return await self.client.submit_load(arena, blocks, **options)

    async def free(self, handles: Sequence[int | tuple[int, int]]) -> list[BlockResult]:
        """FREE ``handles`` and return each one's result."""
        return await self.client.submit_free(handles)

    async def aclose(self, timeout: float = CLOSE_TIMEOUT) -> None:
        """Disconnect (:meth:`KbtpClient.close`) without blocking the event loop."""
        await asyncio.to_thread(self.client.close, timeout)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()
