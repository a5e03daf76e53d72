"""The pinned verdicts of ``iwarp conform`` against Linux siw: the expectation file.

``stack/interop/siw/conform_siw_expected.json`` holds, per run of
:mod:`stack.interop.conform_siw` and per case ID, ``"PASS"`` or ``"STATUS: reason"``: the
status the run gave and, for every non-PASS, one line saying why (a siw deviation, a
declined option, or why the case is excluded).  :data:`PIN_COMMAND` rewrites it from a
fresh run, keeping the reason of every verdict that did not change.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

__all__ = [
    "EXCLUDED_STATUS",
    "EXPECTED_FILE",
    "PIN_COMMAND",
    "Pins",
    "differences_message",
    "load_expected",
    "one_line",
    "split_pin",
    "unexplained",
    "write_expected",
]

EXPECTED_FILE = Path(__file__).resolve().parent / "siw" / "conform_siw_expected.json"
PIN_COMMAND = "python -m stack.interop.conform_siw --pin"
"""The one command that regenerates :data:`EXPECTED_FILE` (boots the guest, runs the whole
catalog both ways: about two minutes under TCG)."""
Pins = dict[str, dict[str, str]]
"""Pinned verdicts: run -> case ID -> ``"PASS"`` or ``"STATUS: reason"`` (one line)."""
EXCLUDED_STATUS = "EXCLUDED"


def split_pin(pinned: str) -> tuple[str, str]:
    """``"FAIL: why"`` -> ``("FAIL", "why")``; ``"PASS"`` -> ``("PASS", "")``."""
    status, _, reason = pinned.partition(": ")
    return status, reason


def load_expected(path: Path = EXPECTED_FILE) -> Pins:
    """The pinned verdicts of ``path`` (none when it does not exist)."""
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    return {name: dict(cases) for name, cases in data.get("runs", {}).items()}


def write_expected(runs: Pins, path: Path = EXPECTED_FILE) -> None:
    """Write ``runs`` to ``path`` (one line per case, so a re-pin is a readable diff)."""
    data = {
        "about": "Pinned `iwarp conform` verdicts against Linux siw (--app rping), per run "
        "and case: PASS, or STATUS: reason. Regenerate with: " + PIN_COMMAND,
        "runs": runs,
    }
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n")


def unexplained(runs: Pins) -> list[str]:
    """Pinned non-PASS verdicts that carry only the runner's observation as reason."""
    return [
        f"{name} {cid}: {split_pin(entry)[0]}"
        for name, cases in runs.items()
        for cid, entry in cases.items()
        if split_pin(entry)[1].startswith("observed: ")
    ]


def differences_message(problems: Sequence[str], path: Path = EXPECTED_FILE) -> str:
    """The failure message for ``problems`` (from :func:`compare`): each, then how to re-pin."""
    return "\n".join(
        [
            f"{len(problems)} differences from the pinned siw verdicts ({path.name}):",
            *(f"  {line}" for line in problems),
            f"If the change is meant (cases added or changed, the runner or siw fixed), re-pin "
            f"with `{PIN_COMMAND}` (it keeps the reason of every verdict that did not change) "
            f"and give each new non-PASS a one-line reason in {path}.",
        ]
    )


def one_line(text: str, width: int = 200) -> str:
    line = " ".join(text.split())
    return line if len(line) <= width else line[: width - 3] + "..."
