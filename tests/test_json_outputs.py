"""``--json FILE`` of ``iwarp bench``, ``kbtp bench``, ``kbtp demo`` and ``iwarp selfcheck``.

Each document is parsed and checked against the same run's text report (printed to stderr
when the JSON takes stdout); tiny runs, no timing asserted.
"""

from __future__ import annotations

import errno
import json
import os
import re
from pathlib import Path
from typing import Any

import pytest

from kbtp.cli import main as kbtp_main
from stack.cli.iwarp import main as iwarp_main

DASHES = "-" * 87


def _run(main: Any, argv: list[str]) -> int:
    try:
        return int(main(argv))
    except SystemExit as exc:  # argparse errors exit from inside
        return int(exc.code or 0)


def _json_stdout(
    capsys: pytest.CaptureFixture[str], main: Any, argv: list[str]
) -> tuple[int, dict[str, Any], str]:
    """Run with ``--json -``: stdout must be exactly one JSON document."""
    code = _run(main, [*argv, "--json", "-"])
    captured = capsys.readouterr()
    return code, json.loads(captured.out), captured.err


def _rows_after(text: str, header_start: str) -> list[list[str]]:
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(header_start))
    rows = []
    for line in lines[start + 1 :]:
        if not line.strip() or line == DASHES:
            break
        rows.append(line.split())
    return rows


def test_bench_write_json_on_stdout_matches_the_table_on_stderr(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = ["bench", "write", "-s", "4K", "-n", "16", "--in-process", "--baseline", "--quiet"]
    code, doc, err = _json_stdout(capsys, iwarp_main, argv)
    assert code == 0 and doc["exit_status"] == 0 and doc["verdict"] == "ok"
    assert doc["schema"] == "iwarp-bench-write/1"
    assert doc["parameters"]["sizes_bytes"] == [4096] and doc["parameters"]["iters"] == 16
    assert doc["baseline"]["name"] == "raw trio TCP" and doc["connection"]["crc"] is True
    [row] = doc["results"]
    assert row["size_bytes"] == 4096 and row["iterations_per_qp"] == 16
    [text] = _rows_after(err, " #bytes")
    assert int(text[0]) == 4096 and int(text[1]) == 16
    assert text[3] == f"{row['bw_average_mib_per_s']:.2f}"
    assert text[5] == f"{row['baseline']['bw_average_mib_per_s']:.2f}"
    assert row["ratio"] == pytest.approx(
        row["bw_average_mib_per_s"] / row["baseline"]["bw_average_mib_per_s"]
    )
    assert row["gbit_per_s"] == pytest.approx(row["bw_average_mib_per_s"] * 2**20 * 8 / 1e9)
    assert row["msg_per_s"] == pytest.approx(float(text[4]) * 1e6, rel=1e-3, abs=1)
    assert row["baseline"]["msg_per_s"] == pytest.approx(
        row["baseline"]["bw_average_mib_per_s"] * 2**20 / 4096
    )
    assert doc["baseline"]["second"]["name"] == "blocking sockets"
    assert text[7] == f"{row['blocking']['bw_average_mib_per_s']:.2f}"
    assert row["ratio_blocking"] == pytest.approx(
        row["bw_average_mib_per_s"] / row["blocking"]["bw_average_mib_per_s"]
    )
    assert "ratio_blk" in err and "iWARP / blocking sockets" in err


def test_bench_read_lat_json_file_has_the_latency_figures(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "lat.json"
    argv = ["bench", "read", "--lat", "-s", "64", "-n", "16", "--in-process", "--baseline"]
    assert _run(iwarp_main, [*argv, "--quiet", "--json", str(out)]) == 0
    text = capsys.readouterr().out  # the table stays on stdout with a --json file
    doc = json.loads(out.read_text())
    assert doc["kind"] == "latency" and doc["parameters"]["sizes_bytes"] == [64]
    [row] = doc["results"]
    [cells] = _rows_after(text, " #bytes")
    assert [f"{row[k]:.2f}" for k in ("us_min", "us_max", "us_p50")] == cells[2:5]
    assert f"{row['baseline']['us_p50']:.2f}" == cells[9]
    assert row["us_min"] <= row["us_p50"] <= row["us_max"]


def test_bench_atomic_and_idle_qps_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, doc, _ = _json_stdout(
        capsys, iwarp_main, ["bench", "atomic", "-n", "16", "--in-process", "--quiet"]
    )
    assert code == 0 and doc["parameters"]["sizes_bytes"] == [8] and doc["baseline"] is None
    assert [r["size_bytes"] for r in doc["results"]] == [8] and "ratio" not in doc["results"][0]
    code, doc, err = _json_stdout(
        capsys, iwarp_main, ["bench", "idle-qps", "-q", "4", "--in-process", "--quiet"]
    )
    assert code == 0 and doc["schema"] == "iwarp-bench-idle-qps/1"
    result = doc["result"]
    assert result["qps"] == 4 and result["shared_process"] is True
    assert result["per_qp_bytes"] == pytest.approx(
        (result["server_rss_after_bytes"] - result["server_rss_before_bytes"]) / 4
    )
    [cells] = _rows_after(err, " #qps")
    assert int(cells[1]) == result["server_rss_before_bytes"] // 1024


def test_bench_failure_still_writes_the_verdict(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import socket

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = tmp_path / "fail.json"
    argv = ["bench", "send", "--connect", f"127.0.0.1:{port}", "-n", "4", "--quiet"]
    assert _run(iwarp_main, [*argv, "--json", str(out)]) == 1
    doc = json.loads(out.read_text())
    assert doc["exit_status"] == 1 and doc["verdict"] == "error" and doc["error"]
    assert doc["results"] == [] and doc["connection"] is None
    assert "error" in capsys.readouterr().err


def test_json_into_a_missing_folder_is_refused_before_running(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = str(tmp_path / "no" / "such.json")
    for main, argv in (
        (iwarp_main, ["bench", "write", "-n", "4", "--in-process"]),
        (kbtp_main, ["bench", "-s", "4K", "-n", "4"]),
        (iwarp_main, ["selfcheck"]),
    ):
        assert _run(main, [*argv, "--json", missing]) == 2
        captured = capsys.readouterr()
        assert "no such directory" in captured.err and captured.out == ""


def test_bench_codec_json(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["bench", "codec", "--size", "4096", "--mib", "1", "--repeat", "1"]
    code, doc, err = _json_stdout(capsys, iwarp_main, argv)
    assert code == 0 and doc["baseline"]["name"] == "crc32c + copy"
    assert [(r["size_bytes"], r["markers"]) for r in doc["results"]] == [
        (4096, False),
        (4096, True),
    ]
    for row, cells in zip(doc["results"], _rows_after(err, "size"), strict=True):
        assert row["ratio"] == pytest.approx(
            min(row["encode_mb_per_s"], row["decode_mb_per_s"]) / row["baseline"]["mb_per_s"]
        )
        assert cells[5] == f"{row['ratio']:.2f}"


def test_selfcheck_json_counts_equal_the_text_summary(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, doc, err = _json_stdout(capsys, iwarp_main, ["selfcheck"])
    assert code == 0 and doc["verdict"] == "PASS" and doc["exit_status"] == 0
    summary = re.search(r"^(\d+) passed, (\d+) failed$", err, re.M)
    assert summary is not None
    assert (doc["passed"], doc["failed"]) == (int(summary[1]), int(summary[2]))
    checks = doc["codec"] + doc["scenarios"]
    assert len(checks) == doc["passed"] + doc["failed"] and all(c["ok"] for c in checks)
    text_rows = {r[0]: r for r in _rows_after(err, "scenario")}
    for s in doc["scenarios"]:
        assert int(text_rows[s["scenario"]][1]) == s["pdus"] and s["findings"] == 0


def test_kbtp_bench_json_rows_match_the_table(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["bench", "-s", "4K,16K", "-n", "16", "-t", "4", "--quiet"]
    code, doc, err = _json_stdout(capsys, kbtp_main, argv)
    assert code == 0 and doc["schema"] == "kbtp-bench/1"
    assert doc["parameters"]["sizes_bytes"] == [4096, 16384]
    assert doc["parameters"]["processes"] == 2 and "pipelined" in doc["baseline"]["name"]
    rows = doc["results"]
    text = [line.split() for line in err.splitlines()[2:]]
    assert [(r["operation"], r["size_bytes"]) for r in rows] == [
        (op, size) for size in (4096, 16384) for op in ("STORE", "LOAD", "ALLOC_STORE")
    ]
    for row, cells in zip(rows, text, strict=True):
        assert cells[2] == row["path"] and int(cells[3]) == row["iterations"] == 16
        assert cells[4] == f"{row['ops_per_s']:.0f}"
        assert cells[8] == f"{row['ratio']:.2f}"
        assert row["ratio"] == pytest.approx(row["gbyte_per_s"] / row["baseline"]["gbyte_per_s"])


def test_kbtp_demo_json_counts_bytes_and_bad_requests(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pcap = tmp_path / "demo.pcap"
    out = tmp_path / "demo.json"
    argv = ["demo", "-n", "2", "--block-size", "4K", "--ticket-timeout", "1", "-w", str(pcap)]
    assert _run(kbtp_main, [*argv, "--quiet", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    doc = json.loads(out.read_text())
    assert doc["verdict"] == "PASS" and doc["exit_status"] == 0
    assert doc["capture"]["path"] == str(pcap) and pcap.stat().st_size > 10_000
    assert f"findings (KBTP-5.1) in {pcap}" in text
    checks = doc["checks"]
    assert checks["bytes_verified"] > 0 and checks["failures"] == 0
    assert f"checks: {checks['read_backs']} byte-exact read-backs" in text
    bad = doc["bad_requests"]
    assert len(bad) == checks["bad_requests_as_expected"] > 0
    assert all(b["ok"] and b["expected_status"] == b["observed_status"] for b in bad)
    by_request = {b["request"]: b["observed_status"] for b in bad}
    assert by_request["BIND after the Ticket Timeout"] == "TICKET_ABANDONED"
    assert by_request["ALLOC_STORE beyond the quota"] == "NO_SPACE"
    assert {i["identity"] for i in doc["initiators"]} == {"shared-0", "trusted-0"}
    # the per-initiator counts add up to the totals, which the table prints
    totals: dict[tuple[str, str], int] = {}
    for initiator in doc["initiators"]:
        for op in initiator["operations"]:
            key = (op["operation"], op["status"])
            totals[key] = totals.get(key, 0) + op["count"]
    assert totals == {(t["operation"], t["status"]): t["count"] for t in doc["totals"]}
    total_line = next(line for line in text.splitlines() if line.startswith("total "))
    assert int(total_line.split()[1]) == sum(totals.values())
    # every failed status of the table is a deliberately bad request's
    failed = {status for (_, status) in totals if status != "SUCCESS"}
    assert failed and failed <= {b["observed_status"] for b in bad}


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full (Linux)")
def test_a_json_file_that_cannot_be_written_is_one_error_line_after_the_table(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The path passed the check before the run, the write fails all the same (a full disk):
    the table is printed, then one error line and status 2, no traceback."""
    argv = ["bench", "write", "-s", "4K", "-n", "4", "--in-process", "--quiet"]
    assert _run(iwarp_main, [*argv, "--json", "/dev/full"]) == 2
    captured = capsys.readouterr()
    assert _rows_after(captured.out, " #bytes")
    assert captured.err == (
        "iwarp bench write: error: --json /dev/full: cannot write (No space left on device)\n"
    )


def test_a_plot_that_cannot_be_written_keeps_the_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("matplotlib")
    from matplotlib.figure import Figure

    def disk_full(*_args: object, **_kwargs: object) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(Figure, "savefig", disk_full)
    out, png = tmp_path / "run.json", tmp_path / "run.png"
    argv = ["bench", "write", "-s", "4K", "-n", "4", "--in-process", "--quiet"]
    assert _run(iwarp_main, [*argv, "--plot", str(png), "--json", str(out)]) == 2
    assert json.loads(out.read_text())["verdict"] == "ok"
    assert capsys.readouterr().err == (
        f"iwarp bench write: error: --plot {png}: cannot write (No space left on device)\n"
    )
