"""Exception hierarchy of the stack: every protocol failure carries its rule ID and Terminate.

Design: one base class (:class:`IwarpError`); protocol violations by a peer are
:class:`ProtocolError` with the rule ID (``MPA-18``, ``DDP-10``, ...; catalog in
:mod:`stack.rules`) and the
Terminate cause (:class:`~stack.constants.TermCode`) the RFCs map them to, or ``None``
where no Terminate can be sent (e.g. before Full Operation).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from stack.constants import TermCode


class IwarpError(Exception):
    """Base class of every error raised by the stack."""


class ProtocolError(IwarpError):
    """The peer (or a capture) broke a protocol rule.

    Fields: ``rule`` (rule ID, :mod:`stack.rules`), ``term`` (Terminate cause or None),
    ``detail``, ``ulpdu`` (the offending ULPDU the Terminate copies headers from, RFC 5040
    §4.8 Fig. 10; set by the layer that knows it, None before Full Operation or for local
    errors).
    """

    def __init__(self, rule: str, detail: str, term: TermCode | None = None) -> None:
        self.rule = rule
        self.term = term
        self.detail = detail
        self.ulpdu: memoryview | None = None
        suffix = f" [Terminate {term}]" if term is not None else ""
        super().__init__(f"{rule}: {detail}{suffix}")


class DecodeError(ProtocolError):
    """Bytes that cannot be decoded as the expected PDU (too short, bad field values)."""


class MpaError(ProtocolError):
    """MPA startup or framing failure (RFC 5044 §8, RFC 6581)."""


class DdpError(ProtocolError):
    """DDP header or placement failure (RFC 5041 §7)."""


class RdmapError(ProtocolError):
    """RDMAP failure (RFC 5040 §7, RFC 7306 §8)."""


class LocalError(IwarpError):
    """Misuse of the local API (bad arguments, wrong state); never caused by the peer."""


class ConnectionTimeout(IwarpError):
    """A startup timer ran out (MPA-27)."""


# -- trio's exception groups --------------------------------------------------------------


def leaf_exceptions(exc: BaseException) -> list[BaseException]:
    """The exceptions inside (nested) exception groups, in order, or ``[exc]``."""
    if not isinstance(exc, BaseExceptionGroup):
        return [exc]
    return [leaf for inner in exc.exceptions for leaf in leaf_exceptions(inner)]


def lone_exception(exc: BaseException) -> BaseException:
    """The single exception inside nested exception groups (trio nurseries), else ``exc``."""
    leaves = leaf_exceptions(exc)
    return leaves[0] if len(leaves) == 1 else exc


@contextmanager
def single_exception() -> Iterator[None]:
    """Re-raise a lone exception out of the groups trio's nurseries wrap it in.

    Code that runs the caller's block inside nurseries (async context managers, ``trio.run``)
    then lets an error raised there come out as itself, not as a group, when it is the only
    one; several errors stay a group.
    """
    try:
        yield
    except BaseExceptionGroup as group:
        inner = lone_exception(group)
        if inner is group:
            raise
        raise inner from None
