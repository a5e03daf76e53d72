"""The errors of the KBTP initiator: error statuses, refused or silent HELLOs, ended sessions.

A COMPLETION with a status other than SUCCESS is a :class:`KbtpStatusError` (docs/kbtp.md
§7); a HELLO_ACK with one a :class:`HelloRefused` (§4.2).  When the connection ends, every
outstanding and later call raises :class:`SessionClosed` (§9.3); no HELLO_ACK in time is
:class:`HelloTimeout` (§4.2).
"""

from __future__ import annotations

from kbtp.constants import Status
from kbtp.messages import Completion, HelloAck, Request
from stack.errors import IwarpError

__all__ = ["HelloRefused", "HelloTimeout", "KbtpStatusError", "SessionClosed"]


class KbtpStatusError(IwarpError):
    """A KBTP request completed with an error status (docs/kbtp.md §7).

    Fields: ``status`` (:class:`Status`), ``completion`` (the COMPLETION, None for errors
    found locally), ``request``.
    """

    def __init__(
        self,
        status: Status,
        detail: str,
        *,
        completion: Completion | None = None,
        request: Request | None = None,
    ) -> None:
        self.status = Status(status)
        self.completion = completion
        self.request = request
        super().__init__(f"{self.status.name} ({int(self.status)}): {detail}")


class HelloRefused(KbtpStatusError):
    """HELLO_ACK carried an error status (UNKNOWN_INITIATOR, SESSION_EXISTS, ...)."""

    def __init__(self, ack: HelloAck) -> None:
        super().__init__(Status(ack.status), "the target refused the session")
        self.ack = ack


class SessionClosed(IwarpError):
    """The connection to the target has ended.  Fields: ``terminate`` (the target's
    Terminate, if it sent one), ``cause`` (the transport's error, if any)."""

    def __init__(self, reason: str, terminate: object = None, cause: object = None) -> None:
        self.terminate = terminate
        self.cause = cause
        super().__init__(reason)


class HelloTimeout(SessionClosed):
    """No HELLO_ACK arrived within the ``hello_timeout`` of :meth:`KbtpInitiator.connect`;
    the connection is closed (docs/kbtp.md §4.2)."""
