"""Wake-ups from the RNIC thread to application threads and asyncio tasks.

:class:`Signal` is a lock plus the two ways to wait on state the RNIC thread changes: a
blocking wait with a timeout (a ``threading.Condition``) and an ``await`` for asyncio (the
RNIC thread wakes the task with ``call_soon_threadsafe``, so the event loop never blocks).
:class:`Mailbox` is a :class:`Signal` over a queue of events (CQ events of a completion
channel, connection events of a CM event channel).  When the RNIC stops (its context closed,
or its thread failed) the signal is closed with that reason: a waiter that cannot be
satisfied any more gets :class:`RnicClosed` instead of waiting for ever.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Generic, TypeVar

from stack.errors import IwarpError

T = TypeVar("T")


class RnicClosed(IwarpError):
    """The RNIC behind this object has stopped: its context was closed or its thread failed
    (then ``__cause__`` is the failure)."""


class Signal:
    """A lock, and waiters woken by :meth:`notify` (call it with :attr:`lock` held)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.lock = threading.Lock()
        self._cond = threading.Condition(self.lock)
        self._async_waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = []
        self._closed: BaseException | None = None

    @property
    def closed(self) -> bool:
        return self._closed is not None

    def notify(self) -> None:
        """Wake every waiter to re-check its condition (the caller holds :attr:`lock`)."""
        self._cond.notify_all()
        waiters, self._async_waiters = self._async_waiters, []
        for loop, future in waiters:
            try:
                loop.call_soon_threadsafe(_resolve, future)
            except RuntimeError:  # that event loop is closed: nobody waits there any more
                pass

    def close(self, reason: BaseException) -> None:
        """The RNIC stopped: waiters still unsatisfied get :class:`RnicClosed`."""
        with self.lock:
            if self._closed is None:
                self._closed = reason
                self.notify()

    def _check(self, take: Callable[[], T | None]) -> T | None:
        """Under the lock: ``take()``'s result, or the closing error once nothing comes."""
        item = take()
        if item is None and self._closed is not None:
            cause = None if isinstance(self._closed, RnicClosed) else self._closed
            raise RnicClosed(f"{self.name}: the RNIC has stopped") from cause
        return item

    def wait_until(self, take: Callable[[], T | None], timeout: float | None) -> T:
        """Call ``take()`` (under the lock) until it returns something, waiting up to
        ``timeout`` seconds (None: until then or the RNIC stops); :class:`TimeoutError`."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self.lock:
            while True:
                item = self._check(take)
                if item is not None:
                    return item
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise TimeoutError(f"{self.name}: nothing within {timeout} s")
                self._cond.wait(left)

    async def await_until(self, take: Callable[[], T | None], timeout: float | None) -> T:
        """:meth:`wait_until` for asyncio."""
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        while True:
            with self.lock:
                item = self._check(take)
                if item is not None:
                    return item
                future: asyncio.Future[None] = loop.create_future()
                self._async_waiters.append((loop, future))
            left = None if deadline is None else deadline - loop.time()
            try:
                if left is not None and left <= 0:
                    raise TimeoutError
                await asyncio.wait_for(future, left)
            except TimeoutError:
                self._forget(future)
                raise TimeoutError(f"{self.name}: nothing within {timeout} s") from None
            except asyncio.CancelledError:
                self._forget(future)
                raise

    def _forget(self, future: asyncio.Future[None]) -> None:
        with self.lock:
            self._async_waiters = [w for w in self._async_waiters if w[1] is not future]


class Mailbox(Signal, Generic[T]):
    """Events in arrival order, at most ``capacity`` (when full, the oldest is dropped)."""

    def __init__(self, name: str, capacity: int = 4096) -> None:
        if capacity < 1:
            raise ValueError("mailbox capacity must be >= 1")
        super().__init__(name)
        self.capacity = capacity
        self._items: deque[T] = deque()
        self.dropped = 0
        """Events dropped because nobody took them while the mailbox was full."""

    def __len__(self) -> int:
        return len(self._items)

    def put(self, item: T) -> None:
        """Add an event (on the RNIC thread) and wake the waiters."""
        with self.lock:
            if self._closed is not None:
                return
            if len(self._items) >= self.capacity:
                self._items.popleft()
                self.dropped += 1
            self._items.append(item)
            self.notify()

    def _take(self) -> T | None:
        return self._items.popleft() if self._items else None

    def get_nowait(self) -> T | None:
        """The oldest event, or None at once if there is none."""
        with self.lock:
            return self._check(self._take)

    def get(self, timeout: float | None = None) -> T:
        """The oldest event, waiting up to ``timeout`` seconds."""
        return self.wait_until(self._take, timeout)

    async def aget(self, timeout: float | None = None) -> T:
        """The oldest event, for asyncio."""
        return await self.await_until(self._take, timeout)


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)
