"""The pinned verdicts of ``iwarp conform`` against Linux siw: the expectation file.

``stack/interop/siw/conform_siw_expected.json`` holds, per run of
:mod:`stack.interop.conform_siw` and per case ID, ``"PASS"`` or ``"STATUS: reason"``: the
status the run gave and, for every non-PASS, one line saying why (a siw deviation, a
declined option, or why the case is excluded).  :data:`PIN_COMMAND` rewrites it from a
fresh run, keeping the reason of every verdict that did not change.
``python -m stack.interop.conform_pins`` prints the file as Markdown (docs/conform-siw.md).
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
    "allowed",
    "one_line",
    "results_markdown",
    "split_pin",
    "unexplained",
    "write_expected",
]

EXPECTED_FILE = Path(__file__).resolve().parent / "siw" / "conform_siw_expected.json"
PIN_COMMAND = "python -m stack.interop.conform_siw --pin"
"""The one command that regenerates :data:`EXPECTED_FILE` (boots the guest, runs the whole
catalog both ways: about seven minutes under TCG)."""
Pins = dict[str, dict[str, str]]
"""Pinned verdicts: run -> case ID -> ``"PASS"`` or ``"STATUS: reason"`` (one line)."""
EXCLUDED_STATUS = "EXCLUDED"


def allowed(status: str) -> frozenset[str]:
    """The statuses a pinned status admits: ``"PASS|FAIL"`` (a verdict siw does not give
    the same way every run: its reason says why) admits either."""
    return frozenset(status.split("|"))


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


RUN_TITLES = {
    "listens": "siw listens (`rping -s`, restarted per case)",
    "connects": "siw connects (`rping -c -C 1`, once per case)",
    "connects-p2p": "siw connects peer-to-peer (`peer_to_peer=Y`; the cases `connects` skips)",
}
"""What the guest runs in each run of :mod:`stack.interop.conform_siw`."""


def results_markdown(runs: Pins, titles: dict[str, str] | None = None) -> str:
    """The pinned verdicts as Markdown: a count per run and status, then every non-PASS
    verdict with its case title and reason, per run in catalog order.  ``titles`` maps case
    IDs to titles (default: the catalog's)."""
    if titles is None:
        from stack.conform import select

        titles = {c.id: c.title for c in select()}
    statuses = ("PASS", "FAIL", "WARN", "SKIP", "ERROR", EXCLUDED_STATUS, "varies")
    lines = [
        "# Linux siw against `iwarp conform`",
        "",
        "Generated from `stack/interop/siw/conform_siw_expected.json` by",
        "`python -m stack.interop.conform_pins`; the CI run compares a fresh run against siw",
        f"(Linux 6.1 in the QEMU guest) with that file.  Re-pin with `{PIN_COMMAND}`.",
        "",
        "| run | cases | " + " | ".join(statuses) + " |",
        "|---|---|" + "---|" * len(statuses),
    ]
    for name, cases in runs.items():
        kinds = [
            split_pin(e)[0] if "|" not in split_pin(e)[0] else "varies" for e in cases.values()
        ]
        counts = [kinds.count(st) for st in statuses]
        lines.append(f"| {name} | {len(cases)} | " + " | ".join(map(str, counts)) + " |")
    for name, cases in runs.items():
        lines += ["", f"## {RUN_TITLES.get(name, name)}", ""]
        lines += ["| case | title | verdict | why |", "|---|---|---|---|"]
        for cid, entry in cases.items():
            status, reason = split_pin(entry)
            if status == "PASS":
                continue
            title, why = (text.replace("|", "\\|") for text in (titles.get(cid, ""), reason))
            lines.append(f"| {cid} | {title} | {status} | {why} |")
        passed = [cid for cid, entry in cases.items() if split_pin(entry)[0] == "PASS"]
        lines += ["", f"PASS ({len(passed)}): " + (", ".join(passed) or "none") + "."]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(results_markdown(load_expected()), end="")
