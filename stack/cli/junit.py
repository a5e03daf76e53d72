"""JUnit XML reports of the conformance commands (``iwarp conform --junit``, ``kbtp conform
--junit``): one way to write suites and cases, so CI systems read both alike.

A verdict is ``"PASS"``, ``"FAIL"``, ``"WARN"``, ``"SKIP"`` or ``"ERROR"``: FAIL is a
``<failure>``, ERROR an ``<error>``, SKIP ``<skipped>``, each with what was observed; WARN
passes, with the warning in ``<system-out>``.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from collections import Counter
from collections.abc import Sequence

__all__ = ["document", "testcase", "testsuite"]


def testsuite(parent: ET.Element, name: str, verdicts: Sequence[str], seconds: float) -> ET.Element:
    """A ``<testsuite>`` under ``parent`` with the counts of ``verdicts``."""
    counts = Counter(verdicts)
    return ET.SubElement(
        parent,
        "testsuite",
        name=name,
        tests=str(len(verdicts)),
        failures=str(counts["FAIL"]),
        errors=str(counts["ERROR"]),
        skipped=str(counts["SKIP"]),
        time=f"{seconds:.3f}",
    )


def testcase(
    suite: ET.Element,
    classname: str,
    name: str,
    seconds: float,
    verdict: str,
    observed: str,
    detail: str = "",
    failure_type: str | None = None,
) -> ET.Element:
    """A ``<testcase>`` of ``verdict``; ``detail`` (default ``observed``) is the text of
    its failure or error, ``failure_type`` the failure's ``type``."""
    case = ET.SubElement(suite, "testcase", classname=classname, name=name, time=f"{seconds:.3f}")
    text = detail or observed
    if verdict == "FAIL":
        failure = ET.SubElement(case, "failure", message=observed)
        if failure_type is not None:
            failure.set("type", failure_type)
        failure.text = text
    elif verdict == "ERROR":
        ET.SubElement(case, "error", message=observed).text = text
    elif verdict == "SKIP":
        ET.SubElement(case, "skipped", message=observed)
    elif verdict == "WARN":
        ET.SubElement(case, "system-out").text = text
    return case


def document(root: ET.Element) -> str:
    """The ``<testsuites>`` ``root`` as an indented XML document."""
    ET.indent(root)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"
