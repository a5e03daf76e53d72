"""`iwarp dissect` decodes KBTP inside Sends (``--ulp kbtp``, the default)."""

from __future__ import annotations

import json
import re
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


def test_kbtp_stags_and_tagged_offsets_are_hex_like_the_iwarp_ones(
    demo_capture: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    capsys.readouterr()
    expr = 'kbtp_opcode_name in ("LOAD", "HELLO_ACK")'
    assert iwarp(["dissect", str(demo_capture), "--json", "-Y", expr]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    ack = next(r for r in rows if r["kbtp_opcode_name"] == "HELLO_ACK")
    load = next(r for r in rows if r["kbtp_opcode_name"] == "LOAD")
    stags = ("table_stag", "pool_stag", "ring_stag", "partition_stag", "head_stag")
    for key in stags:
        assert re.fullmatch(r"0x[0-9a-f]{8}", ack["kbtp_" + key]), key
    for key in ("table_offset", "pool_offset", "ring_offset", "head_offset", "partition_offset"):
        assert re.fullmatch(r"0x[0-9a-f]{16}", ack["kbtp_" + key]), key
    assert isinstance(ack["kbtp_handle_base"], int)  # a handle, neither STag nor offset
    assert re.fullmatch(r"0x[0-9a-f]{8}", load["kbtp_desc_stag"])
    assert re.fullmatch(r"0x[0-9a-f]{16}", load["kbtp_desc_to"])
    assert isinstance(load["kbtp_desc_length"], int)
    # filters compare the numbers; -T fields prints the JSON's strings
    stag = int(load["kbtp_desc_stag"], 16)
    assert iwarp(["dissect", str(demo_capture), "-Y", f"kbtp_desc_stag == {stag}",
                  "-T", "fields", "-e", "kbtp_desc_stag", "-e", "kbtp_desc_to"]) == 0  # fmt: skip
    table = [line.split("\t") for line in capsys.readouterr().out.splitlines()]
    assert table and all(row[0] == load["kbtp_desc_stag"] for row in table)
    assert [load["kbtp_desc_stag"], load["kbtp_desc_to"]] in table
