"""``iwarp interop``: case/direction from test ids, outcome merging and the matrix (no VM);
``--peer HOST:PORT`` runs the conformance runner (our own ``iwarp rping -s`` as the device)."""

from __future__ import annotations

import argparse
import json
import re
import socket
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from types import SimpleNamespace

import pytest

from stack.cli.endpoints import looks_like_endpoint
from stack.cli.interop import (
    CaseResult,
    _Recorder,
    conform_argv,
    failed,
    render_matrix,
    split_nodeid,
)
from stack.cli.iwarp import main

REPO = Path(__file__).resolve().parents[2]
RPING = "stack/interop/siw/test_rping_siw.py::"


@pytest.mark.parametrize(
    "nodeid, case, direction",
    [
        (RPING + "test_rping_mpa_20_rev1[siw-active]", "rping_mpa_20_rev1", "siw-active"),
        (RPING + "test_rping_erc_09_p2p_rtr[read-iwarp-active]", "rping_erc_09_p2p_rtr[read]",
         "iwarp-active"),
        (RPING + "test_rping_ddp_02_sizes[C3-S4000-siw-active]", "rping_ddp_02_sizes[C3-S4000]",
         "siw-active"),
        ("t.py::test_mpa_18_erc_03_siw_active_rev2_defaults", "mpa_18_erc_03_rev2_defaults",
         "siw-active"),
        ("t.py::test_mpa_22_erc_04_our_initiator_to_siw_passive_rev2_crc",
         "mpa_22_erc_04_our_initiator_rev2_crc", "iwarp-active"),
        ("t.py::test_mpa_11_our_responder_requests_crc_from_siw",
         "mpa_11_our_responder_requests_crc_from_siw", "siw-active"),
        ("t.py::test_perftest_siw_server_iwarp_client[read-64]", "perftest[read-64]",
         "iwarp-active"),
        ("t.py::test_guest_to_guest_rping_with_crc_required",
         "guest_to_guest_rping_with_crc_required", "siw-siw"),
        ("t.py::test_guest_boots_with_siw_device", "guest_boots_with_siw_device", "harness"),
    ],
)  # fmt: skip
def test_split_nodeid_case_and_direction(nodeid: str, case: str, direction: str) -> None:
    assert split_nodeid(nodeid) == (case, direction)


def _results() -> list[CaseResult]:
    return [
        CaseResult("a[siw-active]", "rping_mpa_20_rev1", "siw-active", "pass", 2.31),
        CaseResult("a[iwarp-active]", "rping_mpa_20_rev1", "iwarp-active", "fail", 3.0,
                   "AssertionError: post send error missing"),
        CaseResult("b[siw-active]", "rping_erc_09_siw_refuses_send_rtr[crc]", "siw-active",
                   "pass", 2.4),
        CaseResult("b[iwarp-active]", "rping_erc_09_siw_refuses_send_rtr[crc]", "iwarp-active",
                   "skip", 0.0, "Linux 6.1 iw_cm BUG()"),
        CaseResult("c", "guest_boots_with_siw_device", "harness", "xfail", 0.1, "known"),
    ]  # fmt: skip


def test_matrix_rows_columns_cells_reasons_totals() -> None:
    text = render_matrix(_results(), capture_dir="/tmp/caps", wall_seconds=61.4)
    lines = text.splitlines()
    assert lines[0].split() == ["case", "siw-active", "iwarp-active", "harness"]
    row = next(line for line in lines if line.startswith("rping_mpa_20_rev1 "))
    assert row.split() == ["rping_mpa_20_rev1", "pass", "2.3s", "FAIL", "3.0s", "-"]
    row = next(line for line in lines if line.startswith("rping_erc_09_siw_refuses_send_rtr"))
    assert row.split()[1:] == ["pass", "2.4s", "skip", "-"]
    row = next(line for line in lines if line.startswith("guest_boots"))
    assert row.split()[1:] == ["-", "-", "xfail"]
    assert "FAIL  rping_mpa_20_rev1 [iwarp-active]: AssertionError: post send error missing" in text
    assert "SKIP  rping_erc_09_siw_refuses_send_rtr[crc] [iwarp-active]: Linux 6.1" in text
    assert "totals: 2 pass, 1 fail, 1 xfail, 1 skip (5 tests) in 61 s" in text
    assert lines[-1] == "captures: /tmp/caps"
    assert failed(_results())
    assert not failed([r for r in _results() if r.outcome != "fail"])


def test_matrix_of_listed_cases_shows_no_totals() -> None:
    listed = [CaseResult(n, *split_nodeid(n), "listed") for n in (RPING + "test_x[siw-active]",)]
    text = render_matrix(listed)
    assert text.splitlines()[2].split() == ["x", "listed"]
    assert text.endswith("1 tests in 1 cases (not run)") and "totals" not in text


def _report(when: str, outcome: str, **extra: object) -> SimpleNamespace:
    return SimpleNamespace(
        nodeid="t.py::test_rping_mpa_20_rev1[iwarp-active]",
        when=when,
        duration=1.0,
        passed=outcome == "passed",
        failed=outcome == "failed",
        skipped=outcome == "skipped",
        longrepr=extra.pop("longrepr", None),
        **extra,
    )


def _merged(*reports: SimpleNamespace) -> CaseResult:
    recorder = _Recorder()
    for r in reports:
        recorder.pytest_runtest_logreport(r)
    [result] = recorder.results()
    return result


def test_recorder_merges_setup_call_teardown() -> None:
    ok = _merged(*(_report(when, "passed") for when in ("setup", "call", "teardown")))
    assert (ok.case, ok.direction, ok.outcome, ok.seconds) == (
        "rping_mpa_20_rev1", "iwarp-active", "pass", 3.0
    )  # fmt: skip
    crash = SimpleNamespace(reprcrash=SimpleNamespace(message="AssertionError: no ping\nmore"))
    bad = _merged(_report("setup", "passed"), _report("call", "failed", longrepr=crash))
    assert (bad.outcome, bad.reason) == ("fail", "AssertionError: no ping")
    oops = _merged(
        _report("call", "passed"), _report("teardown", "failed", longrepr="the guest oopsed")
    )
    assert (oops.outcome, oops.reason) == ("error", "the guest oopsed")
    skip = _merged(_report("setup", "skipped", longrepr=("f.py", 3, "Skipped: iw_cm BUG()")))
    assert (skip.outcome, skip.reason) == ("skip", "iw_cm BUG()")
    xfail = _merged(_report("call", "skipped", wasxfail="siw quirk"))
    assert (xfail.outcome, xfail.reason) == ("xfail", "siw quirk")


def test_interop_list_needs_no_vm() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "stack.cli.iwarp", "interop", "--list", "-k", "rdmacm"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    row = next(line for line in out.stdout.splitlines() if line.startswith("rdmacm_ucmatose["))
    assert row.split()[1:] == ["listed", "listed"]
    assert "(not run)" in out.stdout


def test_interop_unknown_peer_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["interop", "--peer", "chelsio"]) == 2
    assert "unknown peer 'chelsio'" in capsys.readouterr().err


# ---------------------------------------------------------------------- --peer HOST:PORT


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_peer_host_port_runs_the_conformance_runner_and_passes_its_options(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Our own ``iwarp rping -s`` (restarted per case by --restart-cmd) as the device."""
    port = _free_port()
    restart = (
        f"cd {REPO} && exec {sys.executable} -m stack.cli.iwarp rping -s -a 127.0.0.1 -p {{port}}"
    )
    argv = ["interop", "--peer", f"127.0.0.1:{port}", "MPA-12.2", "MPA-18.2", "--quick",
            "--app", "rping", "--restart-cmd", restart, "--json", str(tmp_path / "r.json"),
            "--junit", str(tmp_path / "r.xml"), "--pcap-dir", str(tmp_path / "pcaps")]  # fmt: skip
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"iwarp conform: DUT listening at 127.0.0.1:{port}, app rping\n")
    assert re.search(r"PASS +MPA-12.2 +FPDU with one bit of its CRC flipped", out)
    assert re.search(r"PASS +MPA-18.2 +Reply key in a Request", out)
    assert "2 cases: 2 passed, 0 failed" in out
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["summary"]["PASS"] == 2 and report["dut_role"] == "listens"
    assert [c["id"] for c in report["cases"]] == ["MPA-12.2", "MPA-18.2"]
    junit = ET.parse(tmp_path / "r.xml").getroot()
    assert sorted(tc.get("name", "").split()[0] for tc in junit.iter("testcase")) == [
        "MPA-12.2", "MPA-18.2"
    ]  # fmt: skip
    assert sorted(p.name for p in (tmp_path / "pcaps").iterdir()) == [
        "MPA-12.2.pcap",
        "MPA-18.2.pcap",
    ]


def test_conform_argv_passes_through_only_what_was_given() -> None:
    args = argparse.Namespace(peer="192.0.2.7:7174", cases=["MPA"], app="perftest",
                           restart_cmd="ssh dut x", junit=None, json="-", pcap_dir="p",
                           quick=True, list=False)  # fmt: skip
    assert conform_argv(args) == [
        "192.0.2.7:7174", "MPA", "--app", "perftest", "--restart-cmd", "ssh dut x",
        "--json", "-", "--pcap-dir", "p", "--quick",
    ]  # fmt: skip
    assert looks_like_endpoint("[::1]:7174") and looks_like_endpoint("dut:1")
    assert not looks_like_endpoint("siw-vm") and not looks_like_endpoint(":7174")
    assert not looks_like_endpoint("dut:port")


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--peer", "127.0.0.1:7174", "-k", "rping"], "-k"),
        (["--peer", "127.0.0.1:7174", "--capture-dir", "x"], "--capture-dir"),
        (["--peer", "siw-vm", "--app", "rping"], "--app: only with --peer HOST:PORT"),
        (["--peer", "siw-vm", "MPA-12"], "CASE: only with --peer HOST:PORT"),
        (["--peer", "127.0.0.1:7174", "--app", "nope"], "unknown --app 'nope'"),
    ],
)  # fmt: skip
def test_options_of_the_other_kind_of_peer_are_usage_errors(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["interop", *argv]) == 2
    assert message in capsys.readouterr().err


def test_siw_suite_writes_json_and_junit_reports(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--peer siw-vm --json - --junit FILE`` on a stand-in suite (no VM): stdout is the
    JSON document alone, the matrix goes to stderr, JUnit has one testcase per test."""
    from stack.cli import interop

    suite = tmp_path / "suite"
    suite.mkdir()
    (suite / "conftest.py").write_text(
        "def pytest_configure(config):\n"
        "    config.addinivalue_line('markers', 'interop: needs the guest')\n"
    )
    (suite / "test_fake_siw.py").write_text(
        "import pytest\n"
        "pytestmark = pytest.mark.interop\n"
        "@pytest.mark.parametrize('d', ['siw-active', 'iwarp-active'])\n"
        "def test_rping_ok(d):\n    pass\n"
        "def test_mpa_broken():\n    assert False, 'siw said no'\n"
    )
    monkeypatch.setattr(interop, "SUITE", suite)
    xml = tmp_path / "siw.xml"
    code = main(["interop", "--json", "-", "--junit", str(xml), "--capture-dir", str(tmp_path)])
    captured = capsys.readouterr()
    document = json.loads(captured.out)
    assert code == 1 and document["failed"] is True
    assert document["counts"]["pass"] == 2 and document["counts"]["fail"] == 1
    outcomes = {(c["case"], c["direction"]): c["outcome"] for c in document["cases"]}
    assert outcomes[("rping_ok", "siw-active")] == "pass"
    assert "interop with Linux siw" in captured.err
    names = [tc.get("name") for tc in ET.parse(xml).getroot().iter("testcase")]
    assert len(names) == 3 and "test_mpa_broken" in names
