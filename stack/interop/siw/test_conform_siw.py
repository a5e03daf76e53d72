"""``iwarp conform`` against Linux siw, both roles: every verdict as pinned.

The interop test runs the whole catalog (:mod:`stack.interop.conform_siw`: siw listening
with the guest's ``rping -s``, siw connecting with ``rping -c``, and peer-to-peer) and
compares each case's status with ``conform_siw_expected.json``; a case added to the
catalog, a verdict that flips, a pinned case that no longer runs or a guest kernel oops
fails it, with the re-pin command in the message.  The reports (text and JSON, per run)
and one capture per case go to ``$IWARP_CAPTURE_DIR/conform-siw`` (or pytest's temporary
directory).  The other tests check the comparison and the pinning without the guest.
"""

from __future__ import annotations

import json
import os
from functools import partial
from pathlib import Path

import pytest
import trio

from stack.conform import (
    CaseResult,
    DutRole,
    RunOptions,
    RunReport,
    Status,
    Verdict,
    select,
)
from stack.interop import conform_pins as cp
from stack.interop import conform_siw as cs
from stack.interop.peers import (
    IWARP_ACTIVE,
    SIW_ACTIVE,
    no_guest_oops,  # noqa: F401 - fixture
)
from stack.siwvm import SiwVM

ROLES = {IWARP_ACTIVE: DutRole.LISTENS, SIW_ACTIVE: DutRole.CONNECTS}
"""iwarp-active: siw listens (the runner connects); siw-active: siw connects (and the
peer-to-peer run)."""


@pytest.mark.interop
@pytest.mark.slow
@pytest.mark.usefixtures("no_guest_oops")
@pytest.mark.parametrize("direction", list(ROLES))
def test_conform_siw_verdicts_as_pinned(
    vm: SiwVM, tmp_path_factory: pytest.TempPathFactory, direction: str
) -> None:
    root = os.environ.get("IWARP_CAPTURE_DIR")
    out = Path(root) / "conform-siw" if root else tmp_path_factory.mktemp("conform-siw")
    results = trio.run(partial(cs.run_all, vm, role=ROLES[direction], pcap_dir=out / "pcaps"))
    cs.write_reports(results, out)
    print(f"\n{cs.summary(results)}\nreports in {out}")
    problems = cs.compare(results, cp.load_expected())
    assert not problems, cp.differences_message(problems)


# ---------------------------------------------------------------------- without the guest


def _results(
    *entries: tuple[str, str, Status], left_out: tuple[str, str] | None = None
) -> cs.SiwResults:
    """SiwResults with one result per (run, case ID, status)."""
    out = cs.SiwResults()
    catalog = {c.id: c for c in select()}
    for name, cid, status in entries:
        role = DutRole.LISTENS if name == "listens" else DutRole.CONNECTS
        report = out.reports.setdefault(name, RunReport([], "rping", "siw", role, RunOptions()))
        verdict = Verdict.met("ok") if status is Status.PASS else Verdict.not_met("it closed")
        report.results.append(CaseResult(catalog[cid], status, verdict, 0.1))
    if left_out:
        out.left_out.add(left_out)
    out.runs = [run.name for run in cs.RUNS]
    return out


def _pins(**runs: dict[str, str]) -> cp.Pins:
    """Pins of ``runs`` (``connects_p2p`` for connects-p2p), with the excluded cases."""
    out: cp.Pins = {}
    for (name, cid), why in cs.EXCLUDED.items():
        out.setdefault(name, {})[cid] = f"{cp.EXCLUDED_STATUS}: {why}"
    for name, cases in runs.items():
        out.setdefault(name.replace("_", "-"), {}).update(cases)
    return out


def test_compare_agrees_with_matching_pins() -> None:
    results = _results(("listens", "MPA-12", Status.FAIL), ("connects", "MPA-24", Status.PASS))
    pins = _pins(listens={"MPA-12": "FAIL: siw's layout"}, connects={"MPA-24": "PASS"})
    assert cs.compare(results, pins) == []


def test_compare_reports_new_cases_flips_and_stale_pins_with_the_re_pin_command() -> None:
    results = _results(("listens", "MPA-12", Status.PASS), ("listens", "MPA-18", Status.FAIL))
    pins = _pins(listens={"MPA-12": "FAIL: siw's layout", "MPA-22": "PASS"})
    problems = cs.compare(results, pins)
    assert problems == [
        "listens MPA-12: PASS, pinned FAIL (siw's layout); observed: ok",
        "listens MPA-18: FAIL, not pinned (a new case)",
        "listens MPA-22: pinned PASS but did not run",
    ]
    message = cp.differences_message(problems)
    assert "3 differences" in message and cp.PIN_COMMAND in message
    # a selection (CASE ...) does not ask for the rest of the catalog, nor a role for the
    # other role's runs
    assert len(cs.compare(results, pins, complete=False)) == 2
    results.runs = ["connects", "connects-p2p"]
    assert len(cs.compare(results, pins)) == 2


def test_compare_accepts_what_quick_left_out_and_wants_excluded_cases_pinned() -> None:
    results = _results(("listens", "MPA-12", Status.PASS), left_out=("listens", "MPA-27"))
    pins = _pins(listens={"MPA-12": "PASS", "MPA-27": "PASS"})
    assert cs.compare(results, pins) == []
    name, cid = next(iter(cs.EXCLUDED))
    del pins[name][cid]
    assert cs.compare(results, pins) == [f"{name} {cid}: excluded but not pinned as EXCLUDED"]


def test_an_oops_is_a_difference() -> None:
    results = _results(("connects", "MPA-24", Status.PASS))
    results.oopses["connects"] = {"MPA-24": ["BUG: kernel NULL pointer dereference"]}
    [problem] = cs.compare(results, _pins(connects={"MPA-24": "PASS"}))
    assert problem.startswith("connects MPA-24: the guest kernel oopsed (BUG: kernel NULL")
    assert "EXCLUDED" in problem


def test_pin_keeps_reasons_of_unchanged_verdicts_in_catalog_order() -> None:
    results = _results(
        ("listens", "MPA-18", Status.FAIL),
        ("listens", "MPA-12", Status.FAIL),
        ("listens", "MPA-11", Status.SKIP),
        ("listens", "MPA-04", Status.PASS),
    )
    old = _pins(listens={"MPA-12": "FAIL: siw's layout", "MPA-11": "FAIL: was a fail"})
    runs = cs.pin(results, old)
    listens = runs["listens"]
    assert listens["MPA-12"] == "FAIL: siw's layout"
    assert listens["MPA-11"] == "SKIP: observed: it closed"
    assert listens["MPA-18"] == "FAIL: observed: it closed"
    assert listens["MPA-04"] == "PASS"
    order = [c.id for c in select()]
    assert list(listens) == sorted(listens, key=order.index)
    for (name, cid), why in cs.EXCLUDED.items():
        assert runs[name][cid] == f"EXCLUDED: {why}"
    assert cp.unexplained(runs) == ["listens MPA-11: SKIP", "listens MPA-18: FAIL"]
    assert cs.compare(results, runs) == []


def test_pinned_file_has_a_reason_for_every_non_pass_and_only_catalogued_cases(
    tmp_path: Path,
) -> None:
    pins = cp.load_expected()
    assert set(pins) == {run.name for run in cs.RUNS}
    catalog = {c.id for c in select()}
    statuses = {s.value for s in Status} | {cp.EXCLUDED_STATUS}
    for name, cases in pins.items():
        for cid, entry in cases.items():
            status, reason = cp.split_pin(entry)
            assert cid in catalog, f"{name} {cid} is no case of the catalog: {cp.PIN_COMMAND}"
            assert cp.allowed(status) <= statuses, (name, cid, entry)
            assert (status == "PASS") == (not reason), (name, cid, entry)
    assert cp.unexplained(pins) == []
    # the file is exactly what write_expected makes of it (re-pinning is a clean diff)
    cp.write_expected(pins, tmp_path / "again.json")
    assert (tmp_path / "again.json").read_text() == cp.EXPECTED_FILE.read_text()
    assert json.loads(cp.EXPECTED_FILE.read_text())["about"].endswith(cp.PIN_COMMAND)


def test_docs_conform_siw_md_is_the_generated_table() -> None:
    """docs/conform-siw.md is what ``python -m stack.interop.conform_pins`` makes of the pins
    (skipped outside a checkout: the wheel ships no docs)."""
    doc = Path(cp.__file__).resolve().parents[2] / "docs" / "conform-siw.md"
    if not doc.exists():
        pytest.skip("no docs/ here (installed wheel)")
    assert doc.read_text() == cp.results_markdown(cp.load_expected()), (
        "docs/conform-siw.md is out of date; regenerate it with "
        "`PYTHONPATH=. python -m stack.interop.conform_pins > docs/conform-siw.md`"
    )
    counts = cp.results_markdown(
        {"r": {"MPA-04": "PASS", "MPA-05": "FAIL: why | not"}}, {"MPA-05": "t"}
    )
    assert "| r | 2 | 1 | 1 | 0 | 0 | 0 | 0 | 0 |" in counts
    assert "| MPA-05 | t | FAIL | why \\| not |" in counts


def test_a_varying_verdict_admits_each_status_it_names_and_stays_pinned() -> None:
    entry = "PASS|FAIL: siw answers a zero-length Read with data in some runs"
    assert cp.allowed("PASS|FAIL") == {"PASS", "FAIL"}
    for status, differs in ((Status.PASS, False), (Status.FAIL, False), (Status.SKIP, True)):
        results = _results(("listens", "RDMAP-07", status))
        pins = _pins(listens={"RDMAP-07": entry})
        assert bool(cs.compare(results, pins, complete=False)) is differs
        if not differs:
            assert cs.pin(results, pins)["listens"]["RDMAP-07"] == entry
