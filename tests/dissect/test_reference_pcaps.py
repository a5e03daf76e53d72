"""The reference captures in pcaps/ decode to exactly what their scenarios did.

The captures are produced by the live stack through its capture tap
(``python -m tools.make_pcaps``); each scenario states its expected decode.  The same checks
run on a freshly regenerated capture, so the regeneration command stays working.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from stack.dissect.decoder import PduRecord, dissect
from stack.pcap import read_tcp_segments
from stack.scenarios import SCENARIOS, Scenario, run_scenario
from stack.wire.events import Terminate

PCAPS = Path(__file__).resolve().parents[2] / "pcaps"


def decode(path: Path) -> list[PduRecord]:
    return [r for r in dissect(read_tcp_segments(path)) if isinstance(r, PduRecord)]


def kind(rec: PduRecord) -> str:
    if rec.kind != "fpdu":
        return rec.kind
    assert rec.segment is not None
    return rec.segment.opcode_name


def check(scenario: Scenario, records: list[PduRecord]) -> None:
    assert all(not r.findings for r in records), [(kind(r), r.rules) for r in records if r.findings]
    for direction in ("i2r", "r2i"):
        got = [kind(r) for r in records if r.direction == direction]
        want = [k for d, k in scenario.expect if d == direction]
        assert got == want, direction
    fpdus = [r for r in records if r.kind == "fpdu"]
    crc = scenario.client.crc.value != "off" or scenario.server.crc.value != "off"
    assert all(r.crc_ok is (True if crc else None) for r in fpdus)
    terms = [r.segment.header for r in fpdus if r.segment and r.segment.opcode == 7]
    if scenario.terminate is None:
        assert not terms
    else:
        (term,) = terms
        assert isinstance(term, Terminate)
        assert term.cause == scenario.terminate
    for direction, wants in (
        ("i2r", scenario.server.want_markers),
        ("r2i", scenario.client.want_markers),
    ):
        marked = [bool(r.marker_offsets) for r in fpdus if r.direction == direction]
        if marked:
            assert marked[0] is wants  # the first FPDU of a marked direction opens with a marker
    if scenario.reject:
        (rep,) = [r for r in records if r.kind == "mpa_rep"]
        assert rep.mpa is not None and rep.mpa.reject and rep.mpa.private_data == b"not today"


@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda s: s.name)
def test_reference_capture_decodes_as_expected(scenario: Scenario) -> None:
    check(scenario, decode(PCAPS / f"{scenario.name}.pcap"))


@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda s: s.name)
def test_regenerated_capture_decodes_as_expected(scenario: Scenario, tmp_path: Path) -> None:
    path = tmp_path / f"{scenario.name}.pcap"
    trio.run(run_scenario, scenario, path)
    check(scenario, decode(path))
