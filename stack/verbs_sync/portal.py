"""The RNIC thread: a background trio loop that runs the engine and the TCP drivers.

A hardware RNIC progresses on its own while the application computes or busy-polls; this
thread is that RNIC for the synchronous API.  It runs ``trio.run`` with a
:class:`~stack.transport.cm.ConnectionManager`; application threads hand it work with
:meth:`RnicThread.run_sync` (a plain function, e.g. ``post_send``) and :meth:`RnicThread.run`
(a trio coroutine, e.g. an accept), each with a timeout.  Work reaches the loop through
``TrioToken.run_sync_soon``, in submission order.  An exception of the work is raised in
the caller.  If the loop itself fails (an exception escapes the manager's nursery), every
pending and later call raises :class:`RnicFailed` with that failure as its cause, and the
hooks registered with :meth:`RnicThread.on_stop` close every mailbox, so nothing hangs.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Awaitable, Callable
from concurrent.futures import CancelledError, Future
from typing import Any, TypeVar

import trio

from stack.rnic.device import Rnic
from stack.transport.cm import ConnectionManager, TapFactory
from stack.verbs_sync.mailbox import RnicClosed

log = logging.getLogger(__name__)

T = TypeVar("T")

CALL_TIMEOUT = 10.0
"""Seconds a quick call (post, register, create) waits for the RNIC thread by default."""
START_TIMEOUT = 10.0
"""Seconds :class:`RnicThread` waits for its loop to start."""
STOP_TIMEOUT = 10.0
"""Seconds :meth:`RnicThread.stop` waits for the loop to finish its shutdown."""
GRACE = 5.0
"""Seconds a timed trio call waits beyond its own deadline for the loop to report back."""


class RnicFailed(RnicClosed):
    """The RNIC thread's loop failed; ``__cause__`` is the exception that stopped it."""


class RnicThread:
    """One RNIC (``rnic``) progressed by a trio loop on a daemon thread."""

    def __init__(
        self,
        rnic: Rnic,
        *,
        tap_factory: TapFactory | None = None,
        start_timeout: float = START_TIMEOUT,
    ) -> None:
        self.rnic = rnic
        self.tap_factory = tap_factory
        self.failure: BaseException | None = None
        """What stopped the loop, if it failed (None while running or after a clean stop)."""
        self._token: trio.lowlevel.TrioToken | None = None
        self._cm: ConnectionManager | None = None
        self._stop: trio.Event | None = None
        self._started = threading.Event()
        self._lock = threading.Lock()
        self._pending: set[Future[Any]] = set()
        self._stop_hooks: list[Callable[[BaseException], None]] = []
        self._stopped = False
        self._thread = threading.Thread(target=self._main, name=f"rnic-{rnic.name}", daemon=True)
        self._thread.start()
        if not self._started.wait(start_timeout):
            raise TimeoutError(f"RNIC thread {rnic.name} did not start in {start_timeout} s")
        if self.failure is not None:
            raise RnicFailed(f"RNIC thread {rnic.name} failed to start") from self.failure

    # ------------------------------------------------------------------ the loop
    def _main(self) -> None:
        reason: BaseException = RnicClosed(f"RNIC {self.rnic.name} closed")
        try:
            trio.run(self._serve)
        except BaseException as exc:  # the loop failed: report it to every caller
            log.error("RNIC thread %s failed: %r", self.rnic.name, exc)
            self.failure = exc
            reason = exc
        finally:
            with self._lock:
                self._stopped = True
                pending, self._pending = self._pending, set()
                hooks, self._stop_hooks = self._stop_hooks, []
            for future in pending:
                if not future.done():
                    future.set_exception(self._closed_error())
            for hook in hooks:
                hook(reason)
            self._started.set()

    async def _serve(self) -> None:
        async with ConnectionManager.open(self.rnic, tap_factory=self.tap_factory) as cm:
            self._cm = cm
            self._stop = trio.Event()
            self._token = trio.lowlevel.current_trio_token()
            self._started.set()
            await self._stop.wait()

    @property
    def cm(self) -> ConnectionManager:
        """The connection manager (use it on the RNIC thread only)."""
        assert self._cm is not None
        return self._cm

    @property
    def running(self) -> bool:
        return not self._stopped and self._thread.is_alive()

    def _closed_error(self) -> RnicClosed:
        if self.failure is not None:
            error = RnicFailed(f"RNIC thread {self.rnic.name} failed: {self.failure!r}")
            error.__cause__ = self.failure
            return error
        return RnicClosed(f"RNIC {self.rnic.name} is closed")

    def on_stop(self, hook: Callable[[BaseException], None]) -> None:
        """Call ``hook(reason)`` once the loop has ended (at once if it has)."""
        with self._lock:
            if not self._stopped:
                self._stop_hooks.append(hook)
                return
        hook(self.failure or RnicClosed(f"RNIC {self.rnic.name} closed"))

    # ------------------------------------------------------------------ calls
    def _submit(self, job: Callable[[], None], future: Future[Any]) -> None:
        if threading.current_thread() is self._thread:
            raise RuntimeError("a blocking verbs call on the RNIC thread would deadlock")
        with self._lock:
            if self._stopped or self._token is None:
                raise self._closed_error()
            self._pending.add(future)
            future.add_done_callback(self._pending.discard)
            try:
                self._token.run_sync_soon(job)
            except trio.RunFinishedError:
                self._pending.discard(future)
                raise self._closed_error() from None

    def _wait(self, future: Future[T], timeout: float | None, what: str) -> T:
        try:
            return future.result(timeout)
        except TimeoutError:
            future.cancel()
            raise TimeoutError(f"RNIC thread did not complete {what} in {timeout} s") from None
        except CancelledError:
            raise self._closed_error() from None

    def run_sync(self, fn: Callable[..., T], *args: Any, timeout: float | None = CALL_TIMEOUT) -> T:
        """Run ``fn(*args)`` on the RNIC thread and return its result (or raise its error)."""
        future: Future[T] = Future()

        def job() -> None:
            if not future.set_running_or_notify_cancel():
                return
            try:
                future.set_result(fn(*args))
            except BaseException as exc:  # handed to the caller, never to trio
                future.set_exception(exc)

        self._submit(job, future)
        return self._wait(future, timeout, getattr(fn, "__qualname__", "a call"))

    def run(
        self,
        fn: Callable[..., Awaitable[T]],
        *args: Any,
        timeout: float | None = CALL_TIMEOUT,
    ) -> T:
        """Run the trio coroutine ``fn(*args)`` on the RNIC thread, cancelled after
        ``timeout`` seconds (then :class:`TimeoutError`)."""
        future: Future[T] = Future()
        what = getattr(fn, "__qualname__", "a call")

        async def task() -> None:
            if not future.set_running_or_notify_cancel():
                return
            try:
                with trio.fail_after(float("inf") if timeout is None else timeout):
                    result = await fn(*args)
            except trio.TooSlowError:
                future.set_exception(TimeoutError(f"{what} did not complete in {timeout} s"))
            except trio.Cancelled:
                future.set_exception(self._closed_error())
                raise
            except BaseException as exc:
                future.set_exception(exc)
            else:
                future.set_result(result)

        def job() -> None:
            try:
                self.cm.nursery.start_soon(task)
            except RuntimeError:  # the nursery is closing: the context is shutting down
                if future.set_running_or_notify_cancel():
                    future.set_exception(self._closed_error())

        self._submit(job, future)
        return self._wait(future, None if timeout is None else timeout + GRACE, what)

    def spawn(self, fn: Callable[[], Awaitable[object]]) -> None:
        """Start a background task on the RNIC thread from the RNIC thread; like the
        drivers, an exception it lets escape stops the whole RNIC (:class:`RnicFailed`)."""
        self.cm.nursery.start_soon(fn)

    # ------------------------------------------------------------------ lifetime
    def stop(self, timeout: float = STOP_TIMEOUT, *, wait: bool = True) -> None:
        """Stop the loop: every connection is torn down (its QP goes to ERROR and flushes
        its work requests) and the thread ends; ``wait``: until it has.  Idempotent."""
        with self._lock:
            token, stop = self._token, self._stop
            live = not self._stopped
        if live and token is not None and stop is not None:
            try:
                token.run_sync_soon(stop.set)
            except trio.RunFinishedError:
                pass
        if wait and threading.current_thread() is not self._thread:
            self._thread.join(timeout)
            if self._thread.is_alive():
                raise TimeoutError(f"RNIC thread {self.rnic.name} did not stop in {timeout} s")
