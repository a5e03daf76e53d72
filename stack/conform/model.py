"""The case and result model of ``iwarp conform``: cases, verdicts, results, the status rules.

A :class:`Case` provokes one rule of the catalog (:mod:`stack.rules`) and says what a
conforming device under test (DUT) must do; its body returns a :class:`Verdict` (was the
requirement met, what was observed, the evidence).  The :class:`Status` of the result
follows from the verdict and the requirement level (:func:`status_for`): a MUST not met
FAILs, a SHOULD not met WARNs (FAILs with ``--strict``), a capability the DUT declined
correctly is a SKIP, a case the runner could not set up an ERROR.  :func:`exit_status`
turns a run into the command's exit status.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from stack.rules import Rule, rule

if TYPE_CHECKING:
    from stack.conform.context import CaseContext

__all__ = [
    "CASE_ID",
    "Case",
    "CaseResult",
    "DutRole",
    "Outcome",
    "Status",
    "Verdict",
    "case_id",
    "exit_status",
    "level_parts",
    "status_for",
]

CASE_ID = re.compile(r"(?P<rule>[A-Z]+-\d+)(?:\.(?P<n>[2-9]|[1-9]\d+))?")
"""A case ID (:func:`case_id`): a catalogued rule ID, then ``.N`` (N >= 2) for the rule's
N-th case.  Rule IDs with a dot of their own (the KBTP section rules) would make the suffix
ambiguous, so cases are built only on rules without one (the pattern has no room for it).
"""


def case_id(rule_id: str, n: int = 1) -> str:
    """The ID of case ``n`` of rule ``rule_id``: the rule ID itself for the first case, the
    rule ID and ``.n`` for the others."""
    if n < 1:
        raise ValueError(f"case numbers start at 1, got {n}")
    return rule_id if n == 1 else f"{rule_id}.{n}"


class DutRole(enum.Enum):
    """What the DUT does in a case: listens (the runner connects, MPA Initiator) or
    connects (the runner listens, MPA Responder)."""

    LISTENS = "listens"
    CONNECTS = "connects"


class Outcome(enum.Enum):
    """What a case body concluded."""

    MET = "met"  # the DUT did what the rule requires
    NOT_MET = "not met"  # it did not
    DECLINED = "declined"  # it declined an optional capability correctly (SKIP)
    NOT_APPLICABLE = "not applicable"  # the case cannot apply to this DUT or app (SKIP)
    BROKEN = "broken"  # the runner could not set the case up (ERROR)


class Status(enum.Enum):
    """The result of one case, as reported."""

    PASS = "PASS"
    FAIL = "FAIL"
    WARN = "WARN"
    SKIP = "SKIP"
    ERROR = "ERROR"


def level_parts(level: str) -> tuple[str, ...]:
    """``"SHOULD/MUST"`` -> ``("SHOULD", "MUST")``; ``"MUST"`` -> ``("MUST",)``."""
    return tuple(level.split("/"))


@dataclass(frozen=True, slots=True)
class Verdict:
    """What a case body concluded about the DUT.

    Fields: outcome; observed (one line: what the DUT did); evidence (further lines: frames,
    findings of the capture decoder, the DUT's startup frame...); rule and level (the rule
    not met when it is not the case's primary one, e.g. a SHOULD on Terminate header copies,
    RDMAP-12, in a case about a MUST); frame (frame number of the offending PDU in the
    case's capture); stream_offset (its offset in the DUT's byte stream, for the frame).
    """

    outcome: Outcome
    observed: str
    evidence: tuple[str, ...] = ()
    rule: str | None = None
    level: str | None = None
    frame: int | None = None
    stream_offset: int | None = None

    @classmethod
    def met(cls, observed: str, *evidence: str) -> Verdict:
        return cls(Outcome.MET, observed, evidence)

    @classmethod
    def not_met(
        cls,
        observed: str,
        *evidence: str,
        rule: str | None = None,
        level: str | None = None,
        frame: int | None = None,
        stream_offset: int | None = None,
    ) -> Verdict:
        return cls(Outcome.NOT_MET, observed, evidence, rule, level, frame, stream_offset)

    @classmethod
    def declined(cls, observed: str, *evidence: str) -> Verdict:
        return cls(Outcome.DECLINED, observed, evidence)

    @classmethod
    def not_applicable(cls, observed: str, *evidence: str) -> Verdict:
        return cls(Outcome.NOT_APPLICABLE, observed, evidence)

    @classmethod
    def broken(cls, observed: str, *evidence: str) -> Verdict:
        return cls(Outcome.BROKEN, observed, evidence)

    def with_evidence(self, *lines: str) -> Verdict:
        """The same verdict with more evidence lines appended."""
        return Verdict(
            self.outcome,
            self.observed,
            self.evidence + tuple(lines),
            self.rule,
            self.level,
            self.frame,
            self.stream_offset,
        )


CaseBody = Callable[["CaseContext"], Awaitable[Verdict]]


@dataclass(frozen=True)
class Case:
    """One conformance case.

    Fields: id (built on the primary rule: :func:`case_id`, :data:`CASE_ID`);
    title; rules (catalogued rule IDs, the primary first); level (the part of the primary
    rule's level this case tests: ``MUST`` of a ``SHOULD/MUST`` rule); role (what the DUT
    does, :class:`DutRole`); sends (what the runner sends); expects (what a conforming DUT
    must do); body (the coroutine that runs it); section (the RFC section, default the
    primary rule's first); apps (the ``--app`` values it applies to; empty: all); slow (it
    waits for the DUT's startup timer); phase (``startup`` or ``data``: MPA startup, or Full
    Operation after a valid startup).
    """

    id: str
    title: str
    rules: tuple[str, ...]
    level: str
    role: DutRole
    sends: str
    expects: str
    body: CaseBody = field(repr=False, compare=False)
    section: str | None = None
    apps: frozenset[str] = frozenset()
    slow: bool = False
    phase: str = "startup"

    @property
    def rule(self) -> Rule:
        """The primary rule's catalog entry."""
        return rule(self.rules[0])

    @property
    def doc(self) -> str:
        return self.rule.doc

    @property
    def where(self) -> str:
        """The section this case is filed under (``7.1.2(2)``)."""
        return self.section or self.rule.sections[0]

    def applies_to(self, app: str) -> bool:
        return not self.apps or app in self.apps

    def to_dict(self) -> dict[str, Any]:
        r = self.rule
        return {
            "id": self.id,
            "title": self.title,
            "rules": list(self.rules),
            "level": self.level,
            "rule_level": r.level,
            "doc": self.doc,
            "section": self.where,
            "dut": self.role.value,
            "sends": self.sends,
            "expects": self.expects,
            "apps": sorted(self.apps),
            "slow": self.slow,
            "phase": self.phase,
        }


@dataclass(frozen=True, slots=True)
class CaseResult:
    """One case's result.  Fields: case, status, verdict, seconds, pcap (its capture file,
    when kept), strict (the run counted SHOULDs as failures)."""

    case: Case
    status: Status
    verdict: Verdict
    seconds: float
    pcap: str | None = None
    strict: bool = False

    @property
    def level(self) -> str:
        return self.verdict.level or self.case.level

    @property
    def rule_not_met(self) -> str:
        return self.verdict.rule or self.case.rules[0]

    def to_dict(self) -> dict[str, Any]:
        v = self.verdict
        out = self.case.to_dict()
        out.update(
            status=self.status.value,
            seconds=round(self.seconds, 3),
            observed=v.observed,
            evidence=list(v.evidence),
            rule_not_met=self.rule_not_met if v.outcome is Outcome.NOT_MET else None,
            level_not_met=self.level if v.outcome is Outcome.NOT_MET else None,
            frame=v.frame,
            pcap=self.pcap,
        )
        return out


def status_for(level: str, outcome: Outcome, *, strict: bool = False) -> Status:
    """The status of a verdict: MET passes; NOT_MET FAILs for a MUST and WARNs for a SHOULD
    or MAY (FAIL with ``strict``); DECLINED and NOT_APPLICABLE SKIP; BROKEN is an ERROR."""
    if outcome is Outcome.MET:
        return Status.PASS
    if outcome in (Outcome.DECLINED, Outcome.NOT_APPLICABLE):
        return Status.SKIP
    if outcome is Outcome.BROKEN:
        return Status.ERROR
    if level == "MUST" or strict:
        return Status.FAIL
    return Status.WARN


def exit_status(results: Iterable[CaseResult]) -> int:
    """0 when nothing failed; 1 when a case FAILed (a MUST, or a SHOULD with ``--strict``);
    3 when no case failed but some could not be run (ERROR)."""
    statuses = {r.status for r in results}
    if Status.FAIL in statuses:
        return 1
    if Status.ERROR in statuses:
        return 3
    return 0
