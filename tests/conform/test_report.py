"""Report writers (text, JUnit XML, JSON), the case list, and docs/conform.md being current."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

from stack.conform import CaseResult, DutRole, RunOptions, RunReport, Status, Verdict, registry
from stack.conform.report import (
    case_list_json,
    case_list_markdown,
    case_list_text,
    junit_xml,
    report_json,
    report_text,
    summary_line,
)

DOC = Path(__file__).resolve().parents[2] / "docs" / "conform.md"


def _report(strict: bool = False) -> RunReport:
    reg = registry()
    rows = [
        ("MPA-11", Status.PASS, Verdict.met("CRC both ways")),
        (
            "MPA-12",
            Status.FAIL,
            Verdict.not_met("Terminate 2/0/0x04", "expected: 2/0/0x02", frame=7),
        ),  # fmt: skip
        ("MPA-27", Status.FAIL if strict else Status.WARN, Verdict.not_met("still waiting")),
        ("MPA-05", Status.SKIP, Verdict.declined("asks for CRC")),
        ("ERC-04", Status.ERROR, Verdict.broken("cannot connect")),
    ]
    results = [
        CaseResult(
            reg.by_id(cid), status, v, 0.5, "out/MPA-12.pcap" if cid == "MPA-12" else None, strict
        )  # fmt: skip
        for cid, status, v in rows
    ]
    return RunReport(results, "rping", "DUT listening at 127.0.0.1:7174", DutRole.LISTENS,
                     RunOptions(strict=strict), seconds=2.5)  # fmt: skip


def test_text_report_groups_by_document_and_section_and_explains_failures() -> None:
    text = report_text(_report())
    lines = text.splitlines()
    assert lines[0] == "iwarp conform: DUT listening at 127.0.0.1:7174, app rping"
    assert lines.index("RFC 5044  MPA: Marker PDU Aligned framing") < lines.index(
        "RFC 6581  MPA revision 2: enhanced connection establishment"
    )
    assert "  §4.4" in lines and "  §7.1.2(10)" in lines
    fail = next(i for i, line in enumerate(lines) if line.strip().startswith("FAIL  MPA-12"))
    block = "\n".join(lines[fail : fail + 6])
    assert "rule not met: MPA-12 (MUST)" in block
    assert "observed: Terminate 2/0/0x04" in block
    assert "offending PDU: frame 7 of out/MPA-12.pcap" in block
    assert "rule not met: MPA-27 (SHOULD)" in text
    assert text.splitlines()[-2] == (
        "5 cases: 1 passed, 1 failed, 1 warnings, 1 skipped, 1 errors (2.5 s)"
    )
    assert text.splitlines()[-1] == "failed: MPA-12 (MUST)"


def test_strict_reports_the_should_as_a_failure() -> None:
    text = report_text(_report(strict=True))
    assert "a SHOULD counted as failure by --strict" in text
    assert "2 failed" in summary_line(_report(strict=True).results)


def test_junit_xml() -> None:
    root = ET.fromstring(junit_xml(_report()))
    suites = root.findall("testsuite")
    assert {s.get("name") for s in suites} >= {"RFC 5044 §4.4", "RFC 6581 §9.1"}
    cases = root.findall("testsuite/testcase")
    assert len(cases) == 5
    by_name = {c.get("name", "").split()[0]: c for c in cases}
    assert by_name["MPA-12"].find("failure") is not None
    assert by_name["ERC-04"].find("error") is not None
    assert by_name["MPA-05"].find("skipped") is not None
    warn = by_name["MPA-27"].find("system-out")
    assert warn is not None and (warn.text or "").startswith("WARN")
    suite = next(s for s in suites if s.get("name") == "RFC 5044 §4.4")
    assert (suite.get("tests"), suite.get("failures")) == ("2", "1")


def test_json_report() -> None:
    data = json.loads(report_json(_report()))
    assert data["summary"] == {"PASS": 1, "FAIL": 1, "WARN": 1, "SKIP": 1, "ERROR": 1, "total": 5}
    mpa12 = next(c for c in data["cases"] if c["id"] == "MPA-12")
    assert mpa12["status"] == "FAIL" and mpa12["frame"] == 7 and mpa12["section"] == "4.4"
    assert mpa12["rule_not_met"] == "MPA-12" and mpa12["doc"] == "RFC 5044"


def test_case_lists_show_the_catalog_level_and_section() -> None:
    cases = registry().cases
    text = case_list_text(cases)
    assert "MPA-26    SHOULD (MUST/SHOULD) DUT listens" in text
    assert text.rstrip().endswith(f"{len(cases)} cases")
    listed = json.loads(case_list_json(cases))
    assert [c["id"] for c in listed] == [c.id for c in cases]
    assert all(c["rule_level"] and c["section"] for c in listed)


def test_docs_case_list_is_current() -> None:
    """docs/conform.md ends with ``iwarp conform --list --markdown``'s output."""
    generated = case_list_markdown(registry().cases)
    assert DOC.read_text().endswith(generated), (
        "docs/conform.md is stale: regenerate its case list with `iwarp conform --list --markdown`"
    )
