"""`iwarp dissect` decodes KBTP inside Sends (``--ulp kbtp``, the default)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kbtp.cli import main as kbtp
from stack.cli.iwarp import main as iwarp


@pytest.fixture(scope="module")
def demo_capture(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("kbtp") / "demo.pcap"
    assert kbtp(["demo", "--quiet", "--ticket-timeout", "1", "-w", str(path)]) == 0
    return path


def test_summary_lines_carry_kbtp(demo_capture: Path, capsys: pytest.CaptureFixture[str]) -> None:
    capsys.readouterr()
    assert iwarp(["dissect", str(demo_capture)]) == 0
    out = capsys.readouterr().out
    for op in ("HELLO", "HELLO_ACK", "LOAD", "STORE", "ALLOC_STORE", "FREE", "BIND", "COMPLETION"):
        assert f"| KBTP {op} " in out, op


def test_json_and_filter_on_kbtp_fields(demo_capture: Path, capsys) -> None:  # noqa: ANN001
    capsys.readouterr()
    assert iwarp(["dissect", str(demo_capture), "--json", "-Y", 'kbtp_opcode_name == "BIND"']) == 0
    records = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert records and all(r["kbtp_opcode_name"] == "BIND" for r in records)
    assert all(r["opcode_name"] == "Send" for r in records)


def test_ulp_none_leaves_sends_undecoded(demo_capture: Path, capsys) -> None:  # noqa: ANN001
    capsys.readouterr()
    assert iwarp(["dissect", str(demo_capture), "--ulp", "none", "-c", "40"]) == 0
    assert "KBTP" not in capsys.readouterr().out
