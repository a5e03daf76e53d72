"""How the initiator hands a result back: to an awaiting task or to a function (§9.2).

:class:`Waiter` is one awaited result (a COMPLETION, a one-sided operation's work
completion, or the error that ended the session first); :class:`CallbackWaiter` hands a
request's result to an :data:`OnDone` function instead, from the session's completion task,
so no task is woken per request (:meth:`~kbtp.initiator.KbtpInitiator.submit`).
"""

from __future__ import annotations

from collections.abc import Callable

import trio

from kbtp.initiator_errors import SessionClosed
from kbtp.messages import Completion, Request
from stack.rnic import WorkCompletion

__all__ = ["CallbackWaiter", "OnDone", "Waiter"]

OnDone = Callable[[Completion | None, SessionClosed | None], None]
"""What :meth:`~kbtp.initiator.KbtpInitiator.submit` calls: (COMPLETION, None), or
(None, the :class:`SessionClosed` that ended the session first)."""

Settle = Callable[[Request, "Waiter"], Completion]
"""The session's accounting of a result (raises the SessionClosed that ended it)."""


class Waiter:
    """One awaited result: a COMPLETION, a one-sided operation's WC, or an error."""

    __slots__ = ("event", "completion", "answer", "wc", "error", "invalidated")

    def __init__(self) -> None:
        self.event = trio.Event()
        self.completion: Completion | None = None
        self.answer: object = None  # a raw request's answer, whatever its type
        self.wc: WorkCompletion | None = None
        self.error: Exception | None = None
        self.invalidated: int | None = None

    async def wait(self) -> None:
        await self.event.wait()
        if self.error is not None:
            raise self.error

    def done(self) -> None:
        """The result is in: wake the task awaiting it."""
        self.event.set()


class CallbackWaiter(Waiter):
    """One request's result handed to ``on_done`` after ``settle`` (no task to wake)."""

    __slots__ = ("request", "on_done", "settle")

    def __init__(self, request: Request, on_done: OnDone, settle: Settle) -> None:
        # No Event: nothing awaits it.
        self.request, self.on_done, self.settle = request, on_done, settle
        self.completion = None
        self.wc = None
        self.error = None
        self.invalidated = None

    def done(self) -> None:
        try:
            completion = self.settle(self.request, self)
        except SessionClosed as exc:
            self.on_done(None, exc)
        else:
            self.on_done(completion, None)
