"""Completion queues: poll them, or await them from trio.

A CQ overflow is fatal for the QPs that complete into it and for nothing else (SEC-09):
:meth:`CompletionQueue.push` raises :class:`CqOverflow`, the QP that hit it sends a Terminate
and moves to TERMINATE (ERROR once its stream closes), and its RNIC raises ``CQ_ERR``.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

import trio

from stack.errors import IwarpError
from stack.rnic.verbs import WcFlags, WorkCompletion

_current_task = trio.lowlevel.current_task
_reschedule = trio.lowlevel.reschedule
_wait_task_rescheduled = trio.lowlevel.wait_task_rescheduled
_ABORT_SUCCEEDED = trio.lowlevel.Abort.SUCCEEDED


class CqOverflow(IwarpError):
    """The completion queue is full."""


class CompletionQueue:
    """A completion queue of bounded ``capacity``.

    * :meth:`poll` takes up to ``n`` completions without blocking (``ibv_poll_cq``).
    * ``await cq.next()`` waits for one completion (trio).
    * :meth:`req_notify` arms a one-shot notification, optionally for solicited
      completions only; ``await cq.wait_event()`` waits for it (``ibv_get_cq_event``).
    """

    def __init__(self, capacity: int = 4096) -> None:
        if capacity < 1:
            raise ValueError("CQ capacity must be >= 1")
        self.capacity = capacity
        self._entries: deque[WorkCompletion] = deque()
        self._waiters: list[trio.lowlevel.Task] = []  # tasks in next(), woken by push()
        self._armed: bool | None = None  # None: not armed; True: solicited only
        self._event_lot = trio.lowlevel.ParkingLot()
        self._events = 0
        self.on_event: Callable[[CompletionQueue], None] | None = None
        """Called with the CQ each time an armed event fires (a completion channel's
        wake-up, ``ibv_get_cq_event``), on the thread that pushed the completion."""
        self.total = 0
        """Completions pushed so far (what a chain's ``WaitCq`` counts)."""
        self.watchers: list[Callable[[], None]] = []
        """Called after every push (chain queues waiting on this CQ)."""
        self.queue_pairs = 0
        """How many queue pairs report to this CQ (their send or receive completions): a
        task that drives one connection's input while it waits sees every completion
        only when that connection's QP is the only one."""

    def __len__(self) -> int:
        return len(self._entries)

    def push(self, wc: WorkCompletion) -> None:
        """Add a completion (called by QPs)."""
        if len(self._entries) >= self.capacity:
            raise CqOverflow(f"CQ overflow (capacity {self.capacity})")
        self._entries.append(wc)
        if self._armed is not None and (not self._armed or wc.wc_flags & WcFlags.SOLICITED):
            self._armed = None
            self._events += 1
            self._event_lot.unpark_all()
            if self.on_event is not None:
                self.on_event(self)
        waiters = self._waiters
        if waiters:  # tasks await next(): wake them (nothing to do for a poller)
            self._waiters = []
            for task in waiters:
                _reschedule(task)
        self.total += 1
        for watcher in self.watchers:
            watcher()

    def poll(self, n: int = 16) -> list[WorkCompletion]:
        """Take up to ``n`` completions, oldest first."""
        out: list[WorkCompletion] = []
        while self._entries and len(out) < n:
            out.append(self._entries.popleft())
        return out

    async def next(self) -> WorkCompletion:
        """Wait for and take the next completion."""
        entries = self._entries
        while not entries:
            # A parking lot's park/unpark_all, without its bookkeeping (one wait per round
            # trip of a small request): push() reschedules the tasks listed here.
            task = _current_task()
            waiters = self._waiters
            waiters.append(task)

            def abort(
                _: object,
                waiters: list[trio.lowlevel.Task] = waiters,
                task: trio.lowlevel.Task = task,
            ) -> trio.lowlevel.Abort:
                waiters.remove(task)  # cancelled before push() took it
                return _ABORT_SUCCEEDED

            await _wait_task_rescheduled(abort)
        return entries.popleft()

    async def wait_for(self, count: int) -> list[WorkCompletion]:
        """Wait until ``count`` completions have been taken, and return them."""
        out: list[WorkCompletion] = []
        while len(out) < count:
            out.append(await self.next())
        return out

    def req_notify(self, solicited_only: bool = False) -> None:
        """Arm a one-shot completion event (``ibv_req_notify_cq``)."""
        self._armed = solicited_only

    async def wait_event(self) -> None:
        """Wait for an armed completion event (``ibv_get_cq_event``)."""
        while self._events == 0:
            await self._event_lot.park()
        self._events -= 1
