"""What users read cites RFC sections and rule IDs, never documents they do not have.

Help texts, docstrings and comments of the installed packages and the developer tools may
not point at the project's internal notes ("digest §...", shared/specs, issue numbers,
numbered pitfalls): the rule catalog (``iwarp rules``) and the RFCs are the references.
"""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
FORBIDDEN = re.compile(r"digest|shared/specs|issue #\d|pitfall \d", re.IGNORECASE)


def test_no_source_points_at_internal_documents() -> None:
    hits = [
        f"{path.relative_to(REPO)}:{n}: {line.strip()}"
        for root in ("stack", "kbtp", "tools", "docs")
        for path in sorted((REPO / root).rglob("*"))
        if path.suffix in (".py", ".sh", ".md") and path.is_file()
        for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1)
        if FORBIDDEN.search(line)
    ]
    assert not hits, "\n".join(hits)
