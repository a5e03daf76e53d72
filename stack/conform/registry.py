"""The case registry: every case by ID, checked against the rule catalog, and selection.

:func:`case` is the decorator the case modules use; it checks that the ID is built on a
catalogued rule (:func:`~stack.conform.model.case_id`: the rule's ID for its first case,
then a suffix ``.2``, ``.3`` ...; the numbers of a rule's cases run 1..n), that every
rule the case names is catalogued, and that its level is a part of the primary rule's
level (``SHOULD/MUST`` -> ``SHOULD`` or ``MUST``).
:func:`select` picks cases by case ID, rule ID, family (``MPA``, ``ERC``) or section
(``5044/7.1``: RFC 5044 §7.1 and its subsections), h2spec style.  Cases are kept in
catalog order (family, section, rule, case number), whatever order the modules load in.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from stack.conform.model import CASE_ID, Case, CaseBody, DutRole, case_id, level_parts
from stack.rules import FAMILIES, UnknownRule, normalize, rule, section_key

__all__ = ["Registry", "SelectionError", "case", "registry", "select"]

_SECTION = re.compile(r"(?i)^(?:rfc\s*)?(\d{4})\s*[/:]\s*§?(\S+)$|^§(\S+)$")


class SelectionError(ValueError):
    """A selection pattern that names no case (its message is one clear line)."""


@dataclass
class Registry:
    """Every case, in registration order (the modules register by section)."""

    cases: list[Case]

    def add(self, c: Case) -> None:
        m = CASE_ID.fullmatch(c.id)
        if m is None:
            raise ValueError(f"case ID {c.id!r} is not RULE or RULE.N")
        base = m["rule"]
        if c.rules[0] != base:
            raise ValueError(f"case {c.id}: the primary rule must be {base}")
        for rid in c.rules:
            rule(rid)  # UnknownRule for anything not catalogued
        parts = level_parts(rule(base).level)
        if c.level not in parts:
            raise ValueError(f"case {c.id}: level {c.level} is not a part of {base}'s {parts}")
        if c.section is not None and c.section not in rule(base).sections:
            raise ValueError(f"case {c.id}: {base} does not cite section {c.section}")
        if any(x.id == c.id for x in self.cases):
            raise ValueError(f"case {c.id} is registered twice")
        self.cases.append(c)
        self.cases.sort(key=_order)

    def check_numbering(self) -> None:
        """Every rule's cases are numbered 1 (the bare rule ID), 2, 3... without gaps."""
        numbers: dict[str, list[int]] = {}
        for c in self.cases:
            m = CASE_ID.fullmatch(c.id)
            assert m is not None
            numbers.setdefault(m["rule"], []).append(int(m["n"] or 1))
        for base, got in numbers.items():
            if sorted(got) != list(range(1, len(got) + 1)):
                raise ValueError(f"the cases of {base} are numbered {sorted(got)}, not 1..n")

    def by_id(self, case_id: str) -> Case:
        key = normalize(case_id).removesuffix(".1")
        for c in self.cases:
            if c.id == key:
                return c
        raise SelectionError(f"unknown case {case_id!r}")

    def select(
        self,
        patterns: Iterable[str] = (),
        *,
        role: DutRole | None = None,
        app: str | None = None,
    ) -> list[Case]:
        """The cases named by ``patterns`` (case IDs, rule IDs, families, ``RFC/section``;
        none: all), in registry order, restricted to ``role`` and ``app`` when given.

        Raises :class:`SelectionError` for a pattern that matches no case at all.
        """
        phases = _phases(app)
        pool = [
            c
            for c in self.cases
            if (role is None or c.role is role)
            and (app is None or (c.applies_to(app) and c.phase in phases))
        ]
        patterns = list(patterns)
        if not patterns:
            return pool
        chosen: set[str] = set()
        for pattern in patterns:
            matched = [c.id for c in self.cases if _matches(c, pattern)]
            if not matched:
                raise SelectionError(
                    f"{pattern!r} names no case (use a case ID, a rule ID like MPA-12 "
                    "(all its cases), a family like ERC, or a section like 5044/7.1.2)"
                )
            chosen.update(matched)
        return [c for c in pool if c.id in chosen]


_FAMILY_ORDER = {f.prefix: i for i, f in enumerate(FAMILIES)}


def _phases(app: str | None) -> frozenset[str]:
    """The case phases ``--app`` takes (all for an app without a profile)."""
    from stack.conform.apps import APPS

    known = APPS.get(app) if app is not None else None
    return known.phases if known is not None else frozenset({"startup", "data"})


def _order(c: Case) -> tuple[object, ...]:
    """Catalog order: family, section (as :func:`stack.rules.groups` sorts), rule, case."""
    m = CASE_ID.fullmatch(c.id)
    assert m is not None
    family = c.rules[0].split("-")[0]
    number = int(m["rule"].split("-")[1].split(".")[0])
    return (_FAMILY_ORDER.get(family, 99), section_key(c.where), number, int(m["n"] or 1))


def _matches(c: Case, pattern: str) -> bool:
    text = pattern.strip()
    m = _SECTION.match(text)
    if m is not None:
        doc = f"RFC {m[1]}" if m[1] else c.doc
        section = m[2] or m[3]
        return c.doc == doc and (
            c.where == section or c.where.startswith((section + ".", section + "("))
        )
    key = normalize(text)
    if key in {f.prefix for f in FAMILIES}:
        return c.rules[0].startswith(key + "-")
    if key.endswith(".1") and key.removesuffix(".1") == c.id:
        return True
    return c.id == key or c.rules[0] == key


_REGISTRY = Registry([])


def registry() -> Registry:
    """The registry with every case module loaded."""
    from stack.conform import (  # noqa: F401
        cases_connect,
        cases_ddp,
        cases_ext,
        cases_fpdu,
        cases_framing,
        cases_listen,
        cases_rdmap,
        cases_read,
        cases_sec,
        cases_startup,
    )

    _REGISTRY.check_numbering()
    return _REGISTRY


def select(
    patterns: Iterable[str] = (), *, role: DutRole | None = None, app: str | None = None
) -> list[Case]:
    """:meth:`Registry.select` on the full registry."""
    return registry().select(patterns, role=role, app=app)


def case(
    rule_id: str,
    title: str,
    *,
    n: int = 1,
    rules: tuple[str, ...] = (),
    level: str | None = None,
    dut: DutRole = DutRole.LISTENS,
    sends: str,
    expects: str,
    section: str | None = None,
    apps: Iterable[str] = (),
    slow: bool = False,
    phase: str = "startup",
) -> Callable[[CaseBody], CaseBody]:
    """Register the decorated coroutine as case ``n`` of rule ``rule_id`` (its ID:
    :func:`~stack.conform.model.case_id`; see :class:`~stack.conform.model.Case`).

    ``rules``: further rules beyond the primary one; ``level``: default the primary rule's
    level when it has one part.
    """
    case_name = case_id(rule_id, n)
    try:
        parts = level_parts(rule(rule_id).level)
    except UnknownRule as exc:
        raise ValueError(f"case {case_name}: {exc}") from None
    if level is None:
        if len(parts) != 1:
            raise ValueError(f"case {case_name}: say which part of {'/'.join(parts)} it tests")
        level = parts[0]

    def register(body: CaseBody) -> CaseBody:
        _REGISTRY.add(
            Case(
                id=case_name,
                title=title,
                rules=(rule_id, *rules),
                level=level,
                role=dut,
                sends=sends,
                expects=expects,
                body=body,
                section=section,
                apps=frozenset(apps),
                slow=slow,
                phase=phase,
            )
        )
        return body

    return register
