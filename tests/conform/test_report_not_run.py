"""The text report folds the cases a run did not start into one line per reason; the JSON
and JUnit reports keep a result per case."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET

from stack.conform import CaseResult, DutRole, RunOptions, RunReport, Status, Verdict, registry
from stack.conform.report import junit_xml, report_json, report_text
from stack.conform.runner import _not_run

PREFLIGHT = "the DUT closed the connection after a valid MPA Request"
GONE = "the DUT is gone (no connection within 60 s, 2 cases in a row)"


def _run(results: list[CaseResult]) -> RunReport:
    return RunReport(results, "rping", "DUT listening at 127.0.0.1:7174", DutRole.LISTENS,
                     RunOptions(), seconds=1.0)  # fmt: skip


def test_preflight_failure_is_one_line_not_one_per_case() -> None:
    cases = registry().cases
    report = _run([_not_run(c, PREFLIGHT, RunOptions()) for c in cases])
    lines = report_text(report).splitlines()
    ids = [c.id for c in cases]
    head = ", ".join(ids[:5])
    assert lines == [
        "iwarp conform: DUT listening at 127.0.0.1:7174, app rping",
        "",
        f"{len(cases)} cases not run ({head} ... {ids[-1]}): {PREFLIGHT}",
        "",
        f"{len(cases)} cases: 0 passed, 0 failed, 0 warnings, 0 skipped, {len(cases)} errors"
        " (1.0 s)",
    ]
    # Machine-readable reports keep every case.
    data = json.loads(report_json(report))
    assert [c["id"] for c in data["cases"]] == ids
    assert {c["observed"] for c in data["cases"]} == {f"not run: {PREFLIGHT}"}
    assert len(ET.fromstring(junit_xml(report)).findall("testsuite/testcase")) == len(cases)


def test_dut_gone_lists_the_cases_run_then_one_line_per_reason() -> None:
    reg = registry()
    ran = [
        CaseResult(reg.by_id("MPA-11"), Status.PASS, Verdict.met("CRC both ways"), 0.5, None),
        CaseResult(reg.by_id("MPA-12"), Status.ERROR, Verdict.broken("no connection"), 60.0, None),
    ]
    left = [_not_run(reg.by_id(cid), GONE, RunOptions()) for cid in ("MPA-27", "ERC-04")]
    odd = [_not_run(reg.by_id("ERC-06"), PREFLIGHT, RunOptions())]
    report = _run(ran + left + odd)
    text = report_text(report)
    lines = text.splitlines()
    assert any(line.strip().startswith("PASS  MPA-11") for line in lines)
    assert any(line.strip().startswith("ERROR MPA-12") for line in lines)
    assert "observed: no connection" in text
    for cid in ("MPA-27", "ERC-04", "ERC-06"):  # no per-case line of its own
        assert not any(line.strip().startswith(f"ERROR {cid}") for line in lines)
    assert "RFC 6581" not in text  # its cases were all not run: no empty heading
    assert lines[-4:] == [
        f"2 cases not run (MPA-27, ERC-04): {GONE}",
        f"1 case not run (ERC-06): {PREFLIGHT}",
        "",
        "5 cases: 1 passed, 0 failed, 0 warnings, 0 skipped, 4 errors (1.0 s)",
    ]
    assert text.count("not run") == 2
    data = json.loads(report_json(report))
    assert [c["id"] for c in data["cases"]] == ["MPA-11", "MPA-12", "MPA-27", "ERC-04", "ERC-06"]
