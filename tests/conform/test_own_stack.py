"""End to end: our own stack as the DUT over loopback, both roles, every applicable case.

Expected verdicts for our stack: every case PASSes except where our stack legitimately
declines, with the evidence checked: MPA-05 (our DUTs ask for CRC, so CRC is never off
both ways), MPA-08 (a DUT that does not ask for markers cannot get a wrong marker), MPA-17
(an early FPDU without markers to a DUT that asks for them), and the peer-to-peer cases
of the DUT-connecting role when the DUT's Request is not peer-to-peer.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from stack.cli.iwarp import main as iwarp_main
from stack.conform import DutRole, NoRestart, Status, profile, run_cases, select
from stack.conform.capture import read_tcp_segments
from stack.conform.faults import injected
from stack.constants import TERM_LLP_INVALID_STARTUP
from stack.dissect.decoder import PduRecord, dissect
from stack.wire.events import Terminate
from tests.conform.helpers import (
    QUICK,
    SHORT_TIMERS,
    connects,
    free_port,
    kbtp_target,
    listens,
    run_against_rping_client,
    run_against_rping_server,
    statuses,
)

REPO = Path(__file__).resolve().parents[2]

LISTENING_SKIPS = {
    "MPA-05": "asks for CRC",
    "MPA-08": "does not ask for markers",
}
"""DUT-listening cases our stack declines, and the evidence in the observation."""
NOT_P2P = {c: "not peer-to-peer" for c in ("ERC-08.4", "ERC-09", "ERC-09.2")}


def _check(report: object, skips: dict[str, str]) -> None:
    got = statuses(report)  # type: ignore[arg-type]
    want = {cid: Status.SKIP if cid in skips else Status.PASS for cid in got}
    details = {
        r.case.id: r.verdict.observed
        for r in report.results  # type: ignore[attr-defined]
        if got[r.case.id] is not want[r.case.id]
    }
    assert got == want, details
    for r in report.results:  # type: ignore[attr-defined]
        if r.case.id in skips:
            assert skips[r.case.id] in r.verdict.observed


async def test_rping_server_passes_every_case() -> None:
    with injected(**SHORT_TIMERS):
        report = await run_against_rping_server(listens())
    assert len(report.results) == len(listens()) >= 30
    _check(report, LISTENING_SKIPS)
    delivered = next(r for r in report.results if r.case.id == "MPA-04").verdict.evidence
    assert any("RDMA-Read the 61 bytes" in line for line in delivered)


async def test_rping_server_with_markers() -> None:
    cases = select(["MPA-04", "MPA-08", "MPA-09", "MPA-12", "MPA-17"], role=DutRole.LISTENS)
    report = await run_against_rping_server(cases, "--markers")
    _check(report, {"MPA-17": "asks for markers"})


async def test_rping_client_connecting() -> None:
    with injected(**SHORT_TIMERS):
        report = await run_against_rping_client(connects())
    assert len(report.results) == len(connects()) >= 12
    _check(report, NOT_P2P)


async def test_rping_client_peer_to_peer() -> None:
    cases = select(["ERC", "MPA-19.3"], role=DutRole.CONNECTS)
    report = await run_against_rping_client(cases, "--p2p", "read")
    _check(report, {})
    rtr = next(r for r in report.results if r.case.id == "ERC-09")
    assert "RDMA Read Request, 0 bytes" in rtr.verdict.observed


@pytest.mark.parametrize(
    ("argv", "skips"),
    [
        ((), LISTENING_SKIPS),
        (("--no-crc",), {"MPA-08": "does not ask for markers"}),
        (("--markers",), {"MPA-05": "asks for CRC", "MPA-17": "asks for markers"}),
    ],
)
async def test_kbtp_target(argv: tuple[str, ...], skips: dict[str, str]) -> None:
    full = not argv
    some = ["MPA-04", "MPA-05", "MPA-08", "MPA-12", "MPA-17"]
    cases = listens("kbtp") if full else select(some, role=DutRole.LISTENS, app="kbtp")
    with injected(**SHORT_TIMERS):
        async with kbtp_target(*argv) as port:
            report = await run_cases(
                cases,
                profile("kbtp"),
                QUICK,
                target=("127.0.0.1", port),
                restarter=NoRestart(settle=0),
                progress=lambda line: None,
            )
    _check(report, {k: v for k, v in skips.items() if k in statuses(report)})


async def test_a_fail_names_the_frame_of_the_offending_pdu(tmp_path: Path) -> None:
    """With a DUT that reports a CRC error as 2/0/0x04, MPA-12 FAILs naming the frame of
    that Terminate in the capture ``--pcap-dir`` keeps; the capture decoder agrees."""
    with injected("crc-wrong-terminate"):
        report = await run_against_rping_server(select(["MPA-12"]), pcap_dir=tmp_path)
    (r,) = report.results
    assert r.status is Status.FAIL and r.verdict.frame is not None
    assert r.pcap == str(tmp_path / "MPA-12.pcap")
    records = [x for x in dissect(read_tcp_segments(Path(r.pcap).read_bytes()))
               if isinstance(x, PduRecord)]  # fmt: skip
    offending = next(x for x in records if x.frame == r.verdict.frame)
    assert offending.direction == "r2i" and offending.segment is not None
    assert isinstance(offending.segment.header, Terminate)
    assert offending.segment.header.cause == TERM_LLP_INVALID_STARTUP
    assert "2/0/0x02" in " ".join(r.verdict.evidence)  # what was expected


# -- the command line ---------------------------------------------------------------------


def test_cli_against_a_restarted_rping_server(tmp_path: Path) -> None:
    """``iwarp conform`` as a user runs it: ``--restart-cmd`` starts ``iwarp rping -s`` for
    every case; JSON, JUnit and one capture per case are written."""
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    restart = f"{sys.executable} -m stack.cli.iwarp rping -s -a {{host}} -p {{port}}"
    out = tmp_path / "out"
    cmd = [
        sys.executable, "-m", "stack.cli.iwarp", "conform", f"127.0.0.1:{port}",
        "MPA-18.1", "MPA-12", "MPA-04", "--restart-cmd", restart, "--timeout", "5",
        "--json", str(out / "r.json"), "--junit", str(out / "r.xml"),
        "--pcap-dir", str(out / "pcaps"),
    ]  # fmt: skip
    out.mkdir()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "3 cases: 3 passed, 0 failed" in proc.stdout
    assert "restart: " in proc.stderr and "[3/3] MPA-18: PASS" in proc.stderr
    data = json.loads((out / "r.json").read_text())
    assert [c["status"] for c in data["cases"]] == ["PASS"] * 3
    assert ET.parse(out / "r.xml").getroot().tag == "testsuites"
    assert sorted(p.name for p in (out / "pcaps").iterdir()) == [
        "MPA-04.pcap",
        "MPA-12.pcap",
        "MPA-18.pcap",
    ]


def test_cli_list_and_errors(capsys: pytest.CaptureFixture[str]) -> None:
    assert iwarp_main(["conform", "--list"]) == 0
    text = capsys.readouterr().out
    assert "MPA-12    MUST" in text and "DUT connects" in text
    assert iwarp_main(["conform", "--list", "--json", "-", "ERC-09"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert [c["id"] for c in listed] == ["ERC-09", "ERC-09.2"]
    assert listed[0]["doc"] == "RFC 6581" and listed[0]["dut"] == "connects"
    assert iwarp_main(["conform", "--list", "--listen", "7000"]) == 0
    assert "DUT listens" not in capsys.readouterr().out
    for argv, message in [
        (["conform"], "HOST:PORT"),
        (["conform", "--list", "MPA-99"], "names no case"),
        (["conform", "127.0.0.1:1", "--app", "nope"], "unknown --app"),
        (["conform", "127.0.0.1:99999"], "port out of range"),
    ]:
        assert iwarp_main(argv) == 2
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1, err


def test_cli_unreachable_dut_is_an_error_per_case(capsys: pytest.CaptureFixture[str]) -> None:
    port = free_port()
    code = iwarp_main(["conform", f"127.0.0.1:{port}", "MPA-18", "--wait", "0.3", "-q"])
    assert code == 3
    out = capsys.readouterr().out
    assert "ERROR MPA-18" in out and "did not listen within 0.3 s" in out
