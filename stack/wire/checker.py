"""Strict or lenient checking through one object: every rule of the wire core reports here.

A rule's code calls :meth:`Checker.fail` for a violation and :meth:`Checker.note` for a
deviation that needs no action.  The endpoint runs the rules with a strict checker (the
first violation is raised as the :class:`~stack.errors.ProtocolError` carrying its rule ID
and Terminate cause); the capture decoder and the conformance runner run the same code with
a lenient one, which records every :class:`Finding` and lets decoding go on.
"""

from __future__ import annotations

from dataclasses import dataclass

from stack.constants import TermCode
from stack.errors import ProtocolError

__all__ = ["Checker", "Finding"]


@dataclass(frozen=True, slots=True)
class Finding:
    """A rule violation or deviation seen while decoding.

    Fields: rule (rule ID, :mod:`stack.rules`), detail, term (the Terminate cause it maps to,
    None for deviations that need none), fatal (True: strict decoding raises it; False: noted only).
    """

    rule: str
    detail: str
    term: TermCode | None = None
    fatal: bool = True

    @classmethod
    def of(cls, error: ProtocolError) -> Finding:
        return cls(error.rule, error.detail, error.term, True)


class Checker:
    """Collects findings; in strict mode a fatal one is raised at once.

    Fields: strict, findings (list of :class:`Finding`).
    """

    __slots__ = ("strict", "findings")

    def __init__(self, strict: bool = True) -> None:
        self.strict = strict
        self.findings: list[Finding] = []

    def fail(self, error: ProtocolError) -> None:
        """A fatal violation: raise it (strict) or record it (lenient)."""
        if self.strict:
            raise error
        self.findings.append(Finding.of(error))

    def note(self, rule: str, detail: str) -> None:
        """A non-fatal deviation: always recorded, never raised."""
        self.findings.append(Finding(rule, detail, None, False))
