"""End to end: our own stack as the DUT over loopback, every applicable case, each app.

Every case PASSes against our stack except where it legitimately does not apply, with the
reason checked in the observation: our DUTs ask for CRC (MPA-05) and, unless told, not for
markers (MPA-06, MPA-08); the DUT-connecting rping client is not peer-to-peer (ERC-08.4,
ERC-09); each application advertises only some regions (rping: one buffer with remote read
and write; KBTP: a Pool and a Table to read, a Ring for atomics, a Partition to write, each
exact; bench: one region with every right, but not of exact length; perftest's exchange
connection: nothing, and IRD 0), serves one connection (rping, perftest) or shares one
protection domain across its connections (bench).  The sweeps run once per session
(:mod:`tests.conform.conftest`).
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
from tests.conform.conftest import Baselines
from tests.conform.helpers import (
    QUICK,
    SHORT_TIMERS,
    free_port,
    kbtp_target,
    run_against_rping_server,
    statuses,
)

REPO = Path(__file__).resolve().parents[2]


def _reasons(**groups: tuple[str, ...]) -> dict[str, str]:
    """``reason=(case IDs)`` -> case ID -> the reason's words (``_`` for a space)."""
    return {cid: reason.replace("_", " ") for reason, cids in groups.items() for cid in cids}


_MARKERS = ("MPA-06", "MPA-06.2", "MPA-08")
_ONE = ("DDP-12", "SEC-01", "SEC-01.2", "SEC-02", "SEC-06.2", "SEC-09", "SEC-09.2")
_ATOMIC = ("EXT-03", "EXT-04", "EXT-05", "EXT-06", "EXT-06.2", "EXT-06.3", "EXT-06.4",
           "EXT-08", "EXT-10", "EXT-11.3", "EXT-11.4")  # fmt: skip
_EXACT = ("SEC-04", "SEC-04.2", "SEC-04.3")
SKIPS: dict[str, dict[str, str]] = {
    "rping": _reasons(
        asks_for_CRC=("MPA-05",),
        does_not_ask_for_markers=_MARKERS,
        no_region_without_remote_write=("DDP-10.7",),
        no_region_without_remote_read=("RDMAP-16.10",),
        serves_one_connection=_ONE,
        IRD_is_1=("RDMAP-06.2", "RDMAP-13.2"),
        of_2048_octets=("RDMAP-06.3",),
        atomic_access=_ATOMIC,
        exact_length=_EXACT,
        too_few=("SEC-08",),
    ),
    "rping-client": {c: "not peer-to-peer" for c in ("ERC-08.4", "ERC-09", "ERC-09.2")},
    "rping-markers": _reasons(asks_for_CRC=("MPA-05",), asks_for_markers=("MPA-17", "MPA-02")),
    "rping-client-p2p": {},
    "rping-client-patient": {},
    "kbtp": _reasons(
        asks_for_CRC=("MPA-05",),
        does_not_ask_for_markers=_MARKERS,
        remote_read_and_write_access_the_runner_may_change=("RDMAP-05", "RDMAP-13", "RDMAP-13.2"),
        and_atomic_access_the_runner_may_change=(
            "EXT-06",
            "EXT-06.2",
            "EXT-06.3",
            "EXT-06.4",
            "EXT-08",
        ),
    ),  # fmt: skip
    "bench": _reasons(
        does_not_ask_for_markers=_MARKERS,
        no_region_without_remote_write=("DDP-10.7",),
        no_region_without_remote_read=("RDMAP-16.10",),
        no_region_without_remote_atomic=("EXT-11.2",),
        shares_one_protection_domain=("DDP-12", "SEC-01", "SEC-01.2"),
        shares_one_PD=("SEC-02",),
        of_2048_octets=("RDMAP-06.3",),
        exact_length=_EXACT,
    ),
    "perftest": _reasons(
        advertises_no_STag=(
            "DDP-10.3",
            "DDP-10.4",
            "DDP-10.5",
            "DDP-10.6",
            "RDMAP-05",
            "RDMAP-06",
            "RDMAP-06.2",
            "RDMAP-13",
            "RDMAP-13.2",
            "RDMAP-16.6",
            "RDMAP-16.7",
            "RDMAP-16.8",
            "RDMAP-16.9",
        ),
        no_region_without=("DDP-10.7", "RDMAP-16.10"),
        serves_one_connection=("DDP-12",),
        IRD_0=("RDMAP-03.2", "RDMAP-07", "RDMAP-07.2"),
        IRD_is_0=("RDMAP-14.2",),
        of_2048_octets=("RDMAP-06.3",),
        a_receive_for_every_Send=("RDMAP-08.2",),
    ),  # fmt: skip
}
"""Per in-process DUT: the cases that SKIP against our stack, and why."""


@pytest.mark.parametrize("dut", sorted(SKIPS))
def test_our_stack_passes_every_case(dut: str, baselines: Baselines) -> None:
    """Every case the DUT runs PASSes, or SKIPs for the reason listed."""
    report = baselines.report(dut)
    skips = SKIPS[dut]
    assert len(report.results) >= (100 if dut in ("rping", "kbtp", "bench") else 5)
    wrong = {
        r.case.id: f"{r.status.value}: {r.verdict.observed}"
        for r in report.results
        if r.status is not (Status.SKIP if r.case.id in skips else Status.PASS)
    }
    assert not wrong, wrong
    for r in report.results:
        if r.case.id in skips:
            assert skips[r.case.id] in r.verdict.observed, (r.case.id, r.verdict.observed)
    assert set(skips) <= {r.case.id for r in report.results}


def test_the_sweeps_cover_at_least_150_cases_and_every_data_family(baselines: Baselines) -> None:
    ran = {r.case.id for dut in SKIPS for r in baselines.report(dut).results}
    assert len(select()) >= 150 and ran == {c.id for c in select()}
    passed = {r.case.id for dut in SKIPS for r in baselines.report(dut).results
              if r.status is Status.PASS}  # fmt: skip
    every = {c.id for c in select()}
    assert every - passed <= {"MPA-05"}, sorted(every - passed)


def test_evidence_of_the_data_phase(baselines: Baselines) -> None:
    """A few verdicts spelled out: what was delivered, which Terminate came with which
    header copies, what the model DUT expected."""
    by_id = {r.case.id: r for r in baselines.report("rping").results}
    assert any("RDMA-Read the 61 bytes" in line for line in by_id["MPA-04"].verdict.evidence)
    read = by_id["RDMAP-16.6"].verdict
    assert read.observed.startswith("Terminate 0/1/0x00 Invalid STag, M=1 D=1 R=1")
    assert any("expected (the stack's endpoint" in line for line in read.evidence)
    kbtp = {r.case.id: r for r in baselines.report("kbtp").results}
    assert "STag not associated" in kbtp["SEC-01"].verdict.observed
    assert "20 STags" in kbtp["SEC-08"].verdict.observed
    bench = {r.case.id: r for r in baselines.report("bench").results}
    assert "0x123456789ABCDEF" in bench["EXT-06"].verdict.observed


@pytest.mark.parametrize(
    ("argv", "skips"),
    [
        (("--no-crc",), _reasons(does_not_ask_for_markers=_MARKERS)),
        (("--markers",), _reasons(asks_for_CRC=("MPA-05",), asks_for_markers=("MPA-17",))),
        (("--no-crc", "--offload"), _reasons(does_not_ask_for_markers=_MARKERS)),  # §8.1
    ],
)
async def test_kbtp_target_variants(argv: tuple[str, ...], skips: dict[str, str]) -> None:
    some = ["MPA-04", "MPA-05", "MPA-06", "MPA-08", "MPA-12.1", "MPA-17"]
    cases = select(some, role=DutRole.LISTENS, app="kbtp")
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
    got = statuses(report)
    want = {cid: Status.SKIP if cid in skips else Status.PASS for cid in got}
    assert got == want, {r.case.id: r.verdict.observed for r in report.results}
    for r in report.results:
        if r.case.id in skips:
            assert skips[r.case.id] in r.verdict.observed


async def test_a_fail_names_the_frame_of_the_offending_pdu(tmp_path: Path) -> None:
    """With a DUT that reports a CRC error as 2/0/0x04, MPA-12 FAILs naming the frame of
    that Terminate in the capture ``--pcap-dir`` keeps; the capture decoder agrees."""
    with injected("crc-wrong-terminate"):
        report = await run_against_rping_server(select(["MPA-12.1"]), pcap_dir=tmp_path)
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
        "MPA-18.1", "MPA-12.1", "MPA-04", "--restart-cmd", restart, "--timeout", "5",
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
        (["conform", "127.0.0.1:99999"], "port must be 0 to 65535, got 99999"),
        (["conform", "127.0.0.1:0"], "must be 1 to 65535 to connect to"),
    ]:
        assert iwarp_main(argv) == 2
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1, err
    with pytest.raises(SystemExit) as parsed:  # an unknown option between the cases
        iwarp_main(["conform", "127.0.0.1:1", "MPA-01", "--bogus", "MPA-02"])
    err = capsys.readouterr().err
    assert parsed.value.code == 2 and "unrecognized arguments: --bogus MPA-02" in err, err


def test_cli_unreachable_dut_is_an_error_per_case(capsys: pytest.CaptureFixture[str]) -> None:
    port = free_port()
    # options may come between the DUT and the cases
    code = iwarp_main(["conform", f"127.0.0.1:{port}", "--wait", "0.3", "MPA-18", "-q"])
    assert code == 3
    out = capsys.readouterr().out
    # The text report folds the cases not run into one line per reason; each still counts.
    assert "2 cases not run (MPA-18, MPA-18.2)" in out and "did not listen within 0.3 s" in out
    # -q drops the progress lines, not what to do about it: the report says it.
    assert f"restart it: rping -s -a 127.0.0.1 -p {port}" in out, out
    assert "2 errors" in out
