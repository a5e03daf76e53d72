"""The sans-IO base of the ``--app`` profiles (:mod:`stack.conform.apps`).

:class:`AppClient` plays the client side of one application on one connection:
:meth:`~AppClient.opening` gives the first messages, :meth:`~AppClient.on_segment` turns
each DUT segment into a :class:`Reaction`.  What the DUT's application advertises is a
:class:`Region`; the receives it keeps posted are :class:`Receives`.
"""

from __future__ import annotations

from dataclasses import dataclass

from stack.constants import Opcode
from stack.rnic.memory import Access
from stack.wire.events import RdmapMessage
from stack.wire.rdmap import Segment

__all__ = ["READ_WRITE", "AppClient", "Reaction", "Receives", "Region"]

READ_WRITE = Access.REMOTE_READ | Access.REMOTE_WRITE


@dataclass(frozen=True, slots=True)
class Region:
    """A buffer the DUT's application advertises to the runner.

    Fields: stag, to (Tagged Offset of its first octet), length (octets the runner may
    count on), access (remote rights, :class:`~stack.rnic.memory.Access`), what (one line:
    whose buffer, how it was learned), exact (the registration ends exactly at ``to +
    length``; otherwise it may be longer), scratch (the runner may change its contents
    without disturbing the application).
    """

    stag: int
    to: int
    length: int
    access: Access
    what: str
    exact: bool = False
    scratch: bool = False

    def allows(self, right: Access) -> bool:
        """Whether the region has every right in ``right``."""
        return self.access & right == right

    def line(self) -> str:
        rights = (
            "+".join(
                n
                for a, n in (
                    (Access.REMOTE_READ, "read"),
                    (Access.REMOTE_WRITE, "write"),
                    (Access.REMOTE_ATOMIC, "atomic"),
                )
                if self.access & a
            )
            or "none"
        )
        return (
            f"{self.what}: STag 0x{self.stag:08X}, TO 0x{self.to:X}, {self.length} octets, "
            f"remote {rights}"
        )


@dataclass(frozen=True, slots=True)
class Receives:
    """The receives the DUT's application keeps posted for Sends (RFC 5040 §5.3).

    Fields: count (posted when the connection starts), size (octets each), reposts (each
    consumed receive is posted again once the application has taken its message).
    """

    count: int
    size: int
    reposts: bool = True


@dataclass(frozen=True, slots=True)
class Reaction:
    """What the runner makes of one DUT segment.

    Fields: delivered (evidence that the DUT delivered the runner's last message: one line,
    or None); replies (messages to send back); done (the exchange is complete); unexpected
    (the segment is not part of the application's protocol: one line, or None).
    """

    delivered: str | None = None
    replies: tuple[RdmapMessage, ...] = ()
    done: bool = False
    unexpected: str | None = None


class AppClient:
    """The client side of one application on one connection (sans-IO).

    Fields: regions (what the DUT's application advertised so far), ready (it waits, with
    everything it advertises known), receives (the DUT's posted receives, when the
    application says more than its profile).
    """

    regions: list[Region]
    ready: bool = False
    receives: Receives | None = None

    def __init__(self) -> None:
        self.regions = []

    def on_reply(self, private_data: bytes) -> None:
        """The DUT's MPA Reply (or, connecting, its Request) private data."""

    def opening(self) -> list[RdmapMessage]:
        """The messages the client sends first, in Full Operation."""
        raise NotImplementedError

    def on_segment(self, seg: Segment) -> Reaction:
        """React to one segment the DUT sent."""
        raise NotImplementedError


def _is_send(seg: Segment) -> bool:
    return seg.opcode in (Opcode.SEND, Opcode.SEND_SE, Opcode.SEND_INVALIDATE,
                          Opcode.SEND_SE_INVALIDATE)  # fmt: skip


def _describe(seg: Segment) -> str:
    size = len(seg.payload)
    return f"{seg.opcode_name} ({size} bytes)"
