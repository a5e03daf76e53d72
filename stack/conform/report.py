"""Report writers of ``iwarp conform``: text (h2spec style), JUnit XML, JSON; the case list.

The text report groups results by document and section, one line per case with its status
and time, the expectation and the observation under each case that did not pass, one line
per reason for the cases not run, and a summary with counts.  The case list (``--list``)
is text, JSON or the Markdown table of docs/conform.md.
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any

from stack.cli import junit
from stack.conform.model import CASE_ID, Case, CaseResult, DutRole, Status
from stack.conform.runner import RunReport
from stack.rules import FAMILIES

__all__ = [
    "case_list_json",
    "case_list_markdown",
    "case_list_text",
    "junit_xml",
    "report_json",
    "report_text",
    "summary_line",
]

_DOC_TITLES = {f.doc: f.title for f in FAMILIES}
_ORDER = (Status.PASS, Status.FAIL, Status.WARN, Status.SKIP, Status.ERROR)
_WORDS = {
    Status.PASS: "passed",
    Status.FAIL: "failed",
    Status.WARN: "warnings",
    Status.SKIP: "skipped",
    Status.ERROR: "errors",
}
_DUT_WORDS = {DutRole.LISTENS: "DUT listens", DutRole.CONNECTS: "DUT connects"}


def _groups(cases: Iterable[Case]) -> list[tuple[str, str, list[Case]]]:
    """(doc, section, cases) in the order the cases come (the registry's catalog order)."""
    out: list[tuple[str, str, list[Case]]] = []
    index: dict[tuple[str, str], list[Case]] = {}
    for c in cases:
        key = (c.doc, c.where)
        if key not in index:
            index[key] = []
            out.append((c.doc, c.where, index[key]))
        index[key].append(c)
    return out


def summary_line(results: Sequence[CaseResult], seconds: float | None = None) -> str:
    """``41 cases: 35 passed, 1 failed, 2 warnings, 3 skipped, 0 errors (12.3 s)``."""
    counts = Counter(r.status for r in results)
    parts = ", ".join(f"{counts.get(s, 0)} {_WORDS[s]}" for s in _ORDER)
    tail = f" ({seconds:.1f} s)" if seconds is not None else ""
    return f"{len(results)} cases: {parts}{tail}"


NOT_RUN = "not run: "
"""How the runner's result for a case it did not start begins (preflight failed, the DUT
is gone): ``not run: <why>``."""
NOT_RUN_IDS = 6
"""Case IDs a text report's not-run line names, at most (the first ones and the last)."""


def report_text(report: RunReport, *, verbose: bool = False) -> str:
    """The h2spec-style text report (``verbose``: evidence of passing cases too).

    Cases the run did not start are not listed one by one: one line per reason says how
    many and which (the JSON and JUnit reports keep a result per case)."""
    by_id = {r.case.id: r for r in report.results}
    not_run: dict[str, list[str]] = {}
    for r in report.results:
        if r.verdict.observed.startswith(NOT_RUN):
            not_run.setdefault(r.verdict.observed.removeprefix(NOT_RUN), []).append(r.case.id)
    skipped = {cid for ids in not_run.values() for cid in ids}
    lines = [
        f"iwarp conform: {report.dut}, app {report.app}"
        + (" (strict: SHOULDs count as failures)" if report.options.strict else ""),
        "",
    ]
    doc = None
    shown = (r.case for r in report.results if r.case.id not in skipped)
    for group_doc, section, cases in _groups(shown):
        if group_doc != doc:
            doc = group_doc
            if len(lines) > 2:
                lines.append("")
            lines.append(f"{doc}  {_DOC_TITLES.get(doc, '')}".rstrip())
        lines.append(f"  §{section}")
        for c in cases:
            r = by_id[c.id]
            lines.append(f"    {r.status.value:<5} {c.id:<9} {c.title}  ({r.seconds:.2f} s)")
            if r.status is not Status.PASS or verbose:
                lines.extend(_detail(r))
    if not_run and len(lines) > 2:
        lines.append("")
    for why, ids in not_run.items():
        count = f"{len(ids)} case{'s' if len(ids) > 1 else ''}"
        lines.append(f"{count} not run ({_id_list(ids)}): {why}")
    lines += ["", summary_line(report.results, report.seconds)]
    failed = [r for r in report.results if r.status is Status.FAIL]
    if failed:
        lines.append("failed: " + ", ".join(_failed(r) for r in failed))
    return "\n".join(lines) + "\n"


def _id_list(ids: Sequence[str]) -> str:
    """``MPA-18, MPA-19, ERC-04``: all up to :data:`NOT_RUN_IDS` IDs, else the first ones
    and the last: ``MPA-18, MPA-19, MPA-20, MPA-21, MPA-22 ... ERC-11``."""
    if len(ids) <= NOT_RUN_IDS:
        return ", ".join(ids)
    return f"{', '.join(ids[: NOT_RUN_IDS - 1])} ... {ids[-1]}"


def _failed(r: CaseResult) -> str:
    """``MPA-12 (MUST)``, or with the rule when it is not the case's: ``MPA-12 (RDMAP-12
    SHOULD)``."""
    rule = "" if r.rule_not_met == r.case.rules[0] else f"{r.rule_not_met} "
    return f"{r.case.id} ({rule}{r.level})"


def _detail(r: CaseResult) -> list[str]:
    v = r.verdict
    pad = " " * 16
    out = []
    if r.status in (Status.FAIL, Status.WARN):
        what = f"{r.rule_not_met} ({r.level})"
        if r.status is Status.FAIL and r.strict and r.level != "MUST":
            what += ", a SHOULD counted as failure by --strict"
        out.append(f"{pad}rule not met: {what}")
        out.append(f"{pad}expected: {r.case.expects}")
    out.append(f"{pad}observed: {v.observed}")
    if v.frame is not None:
        where = f" of {r.pcap}" if r.pcap else " of the case's capture (--pcap-dir keeps it)"
        out.append(f"{pad}offending PDU: frame {v.frame}{where}")
    out.extend(f"{pad}  {line}" for line in v.evidence)
    return out


# ======================================================================================
# JUnit XML and JSON
# ======================================================================================


def junit_xml(report: RunReport) -> str:
    """One ``<testsuite>`` per document section, one ``<testcase>`` per case
    (:mod:`stack.cli.junit`): FAIL is a ``<failure>`` typed by the case's level, ERROR an
    ``<error>``, SKIP ``<skipped>``; WARN passes with the warning in ``<system-out>`` (with
    ``--strict`` it is a FAIL)."""
    root = ET.Element("testsuites", name="iwarp conform", time=f"{report.seconds:.3f}")
    by_id = {r.case.id: r for r in report.results}
    for doc, section, cases in _groups(r.case for r in report.results):
        rs = [by_id[c.id] for c in cases]
        where = f"{doc} §{section}"
        seconds = sum(r.seconds for r in rs)
        suite = junit.testsuite(root, where, [r.status.value for r in rs], seconds)
        for r in rs:
            text = "\n".join(_detail(r)).replace(" " * 16, "")
            if r.status is Status.WARN:
                text = f"WARN ({r.level} not met)\n{text}"
            name = f"{r.case.id} {r.case.title}"
            observed = r.verdict.observed
            junit.testcase(suite, where, name, r.seconds, r.status.value, observed, text, r.level)
    return junit.document(root)


def report_json(report: RunReport) -> str:
    """The report as JSON: the run, a summary with counts, and every case's result."""
    counts = Counter(r.status for r in report.results)
    out: dict[str, Any] = {
        "dut": report.dut,
        "app": report.app,
        "dut_role": report.role.value,
        "strict": report.options.strict,
        "options": {
            "timeout": report.options.timeout,
            "silence": report.options.silence,
            "startup_timeout": report.options.startup_timeout,
            "wait": report.options.wait,
        },
        "seconds": round(report.seconds, 3),
        "summary": {s.value: counts.get(s, 0) for s in _ORDER} | {"total": len(report.results)},
        "cases": [r.to_dict() for r in report.results],
    }
    return json.dumps(out, indent=2) + "\n"


# ======================================================================================
# The case list (--list)
# ======================================================================================


def case_list_text(cases: Sequence[Case]) -> str:
    """``--list``: grouped like the report; ID, level, what the DUT does, title."""
    lines: list[str] = []
    doc = None
    for group_doc, section, members in _groups(cases):
        if group_doc != doc:
            doc = group_doc
            if lines:
                lines.append("")
            lines.append(f"{doc}  {_DOC_TITLES.get(doc, '')}".rstrip())
        lines.append(f"  §{section}")
        for c in members:
            level = c.level if c.level == c.rule.level else f"{c.level} ({c.rule.level})"
            rules = f" [{', '.join(c.rules[1:])}]" if len(c.rules) > 1 else ""
            lines.append(f"    {c.id:<9} {level:<20} {_DUT_WORDS[c.role]:<13} {c.title}{rules}")
    lines += ["", f"{len(cases)} cases"]
    return "\n".join(lines) + "\n"


def case_list_json(cases: Sequence[Case]) -> str:
    return json.dumps([c.to_dict() for c in cases], indent=2) + "\n"


MARKDOWN_INTRO = """\
<!-- The case list below is generated by `iwarp conform --list --markdown`. -->

A case's ID is its rule's ID for the rule's first case (# 1) and the rule's ID with `.N`
for case N: `iwarp conform --list` prints them whole, and either form selects.
"""


def case_list_markdown(cases: Sequence[Case]) -> str:
    """The case tables of docs/conform.md: one table per document, rule and case number in
    separate columns."""
    out = [MARKDOWN_INTRO]
    for doc, members in _by_doc(cases):
        out.append(f"\n### {_DOC_TITLES.get(doc, doc)} ({doc})\n\n")
        out.append(
            "| Rule | # | Level | Section | DUT | Title | The runner sends | A conforming DUT |\n"
        )
        out.append("|---|---|---|---|---|---|---|---|\n")
        for c in members:
            m = CASE_ID.fullmatch(c.id)
            assert m is not None
            rules = f" (also {', '.join(c.rules[1:])})" if len(c.rules) > 1 else ""
            cells = (
                c.rules[0],
                m["n"] or "1",
                c.level,
                f"§{c.where}",
                c.role.value + (", slow" if c.slow else ""),
                c.title + rules,
                c.sends,
                c.expects,
            )
            out.append("| " + " | ".join(x.replace("|", "\\|") for x in cells) + " |\n")
    out.append(f"\n{len(cases)} cases.\n")
    return "".join(out)


def _by_doc(cases: Sequence[Case]) -> list[tuple[str, list[Case]]]:
    out: dict[str, list[Case]] = {}
    for c in cases:
        out.setdefault(c.doc, []).append(c)
    return list(out.items())
