"""``iwarp dissect`` (stack/cli/dissect.py) and its presentation modules (stack.dissect)."""

from __future__ import annotations

import errno
import json
import os
import select
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from stack.cli.iwarp import main
from stack.constants import TERM_RDMAP_INVALID_STAG
from stack.dissect import FIELDS
from stack.pcap import iter_frames
from stack.wire.events import (
    AtomicRequest,
    AtomicResponse,
    ImmediateData,
    RdmaWrite,
    ReadRequest,
    ReadResponse,
    Send,
)
from stack.wire.terminate import build_terminate
from tests.dissect.synth import I2R, R2I, CaptureBuilder

CONTRACT_COMMON = {"stream", "frame", "direction", "src", "dst", "type", "findings"}
CONTRACT_MPA = {"rev", "marker_flag", "crc_flag", "rej_flag", "enhanced", "pd_len",
                "private_data"}  # fmt: skip
CONTRACT_ENHANCED = {"ird", "ord", "p2p", "rtr_send", "rtr_write", "rtr_read"}
CONTRACT_FPDU = {"ulpdu_len", "crc_ok", "markers", "marker_ptrs", "tagged", "last",
                 "ddp_version", "rdmap_version", "opcode", "opcode_name", "stag", "to", "qn",
                 "msn", "mo", "ddp_payload_len"}  # fmt: skip
PER_OPCODE = {
    4: {"inval_stag"},
    6: {"inval_stag"},
    1: {"read_sink_stag", "read_sink_to", "read_size", "read_src_stag", "read_src_to"},
    8: {"immediate_data"},
    9: {"immediate_data"},
    10: {"atomic_opcode", "atomic_req_id", "atomic_remote_stag", "atomic_remote_to",
         "atomic_add_swap_data", "atomic_add_swap_mask", "atomic_compare_data",
         "atomic_compare_mask"},
    11: {"atomic_orig_req_id", "atomic_orig_value"},
    7: {"term_layer", "term_etype", "term_errcode", "term_m", "term_d", "term_r",
        "term_ddp_seg_len", "term_ddp_hdr", "term_rdmap_hdr"},
}  # fmt: skip
ALL_PER_OPCODE = set().union(*PER_OPCODE.values())
REPO = Path(__file__).resolve().parents[2]
GUARD = 60.0
"""Seconds to wait for the child before giving up (a hang guard, not a speed check)."""


@pytest.fixture
def capture(tmp_path: Path) -> Path:
    b = CaptureBuilder()
    c = b.connection(markers_r2i=True)
    c.send(I2R, Send(b"Hello, iWARP!"))
    c.send(I2R, Send(b"inv", invalidate_stag=0xCAFE))
    c.send(I2R, RdmaWrite(0x00ABCDEF, 0x1000, bytes(range(1, 9))))
    (rr,) = c.send(I2R, ReadRequest(0x11223344, 0x2000, 0x400, 0x55667788, 0x3000))
    c.send(R2I, ReadResponse(0x11223344, 0x2000, bytes(0x400)))
    c.send(I2R, ImmediateData(bytes(range(1, 9))))
    c.send(I2R, AtomicRequest.fetch_add(0xDEADBEEF, 0x0A0B0C0D, 0x4000, 1))
    c.send(R2I, AtomicResponse(0xDEADBEEF, 0x29))
    c.send(R2I, build_terminate(TERM_RDMAP_INVALID_STAG, rr))
    c.close()
    path = tmp_path / "all.pcap"
    path.write_bytes(b.data())
    return path


def _json(capsys: pytest.CaptureFixture[str], *args: str) -> list[dict]:
    assert main(["dissect", *args, "--json"]) == 0
    return [json.loads(line) for line in capsys.readouterr().out.splitlines()]


def test_json_keys_are_exactly_the_contract(capture: Path, capsys) -> None:
    records = _json(capsys, str(capture))
    assert [r["type"] for r in records[:2]] == ["mpa_req", "mpa_rep"]
    extras = {"timestamp", "wire_len", "offset", "finding_details"}
    for r in records:
        keys = set(r)
        assert CONTRACT_COMMON <= keys
        if r["type"] == "fpdu":
            assert CONTRACT_FPDU <= keys
            assert keys - CONTRACT_COMMON - CONTRACT_FPDU - extras - {"term_siw_layout"} == (
                PER_OPCODE.get(r["opcode"], set())
            )
            assert not keys & (CONTRACT_MPA | CONTRACT_ENHANCED)
        else:
            assert CONTRACT_MPA | CONTRACT_ENHANCED <= keys
            assert not keys & (CONTRACT_FPDU | ALL_PER_OPCODE)
    assert all(set(r) <= FIELDS for r in records)


def test_json_values_field_by_field(capture: Path, capsys) -> None:
    req, rep, send, inv, write, rr, resp, imm, atom, aresp, term = _json(capsys, str(capture))
    assert req["direction"] == "i2r" and req["src"] == "10.1.0.1:50001"
    assert req["dst"] == "10.1.0.2:35287" and req["stream"] == 0
    assert (req["rev"], req["crc_flag"], req["marker_flag"], req["enhanced"]) == (
        2,
        True,
        True,
        True,
    )
    assert (req["pd_len"], req["private_data"], req["ird"], req["ord"]) == (4, "00100010", 16, 16)
    assert (rep["rej_flag"], rep["marker_flag"], rep["p2p"]) == (False, False, False)
    # reference FPDU E1: Send QN0 MSN1 "Hello, iWARP!"
    assert send["ulpdu_len"] == 31 and send["crc_ok"] is True and send["markers"] == 0
    assert (send["tagged"], send["last"], send["ddp_version"], send["rdmap_version"]) == (
        False, True, 1, 1)  # fmt: skip
    assert (send["opcode"], send["opcode_name"], send["qn"], send["msn"], send["mo"]) == (
        3, "Send", 0, 1, 0)  # fmt: skip
    assert send["stag"] is None and send["to"] is None and send["ddp_payload_len"] == 13
    assert inv["opcode_name"] == "Send with Invalidate" and inv["inval_stag"] == "0x0000cafe"
    # reference FPDU E2: RDMA Write STag 0x00ABCDEF TO 0x1000, 8 bytes; STags and TOs are
    # written as fixed-width hex strings, as tshark writes them
    assert (write["ulpdu_len"], write["stag"], write["to"], write["qn"]) == (
        22, "0x00abcdef", "0x0000000000001000", None)  # fmt: skip
    assert write["ddp_payload_len"] == 8
    assert (rr["read_sink_stag"], rr["read_sink_to"], rr["read_size"]) == (
        "0x11223344", "0x0000000000002000", 0x400)  # fmt: skip
    assert (rr["read_src_stag"], rr["read_src_to"], rr["ddp_payload_len"]) == (
        "0x55667788", "0x0000000000003000", 28)  # fmt: skip
    assert resp["direction"] == "r2i" and resp["markers"] >= 2 and resp["marker_ptrs"][0] == 0
    assert imm["immediate_data"] == "0102030405060708" and imm["opcode_name"] == "Immediate Data"
    assert (atom["atomic_opcode"], atom["atomic_req_id"], atom["atomic_remote_stag"]) == (
        0, 0xDEADBEEF, "0x0a0b0c0d")  # fmt: skip
    assert (atom["atomic_remote_to"], atom["atomic_add_swap_data"]) == ("0x0000000000004000", 1)
    assert (atom["atomic_add_swap_mask"], atom["atomic_compare_data"]) == (0, 0)
    assert atom["atomic_compare_mask"] == 2**64 - 1
    assert (aresp["atomic_orig_req_id"], aresp["atomic_orig_value"]) == (0xDEADBEEF, 0x29)
    assert (term["term_layer"], term["term_etype"], term["term_errcode"]) == (0, 1, 0)
    assert (term["term_m"], term["term_d"], term["term_r"]) == (True, True, True)
    assert term["term_ddp_seg_len"] == 46 and term["term_ddp_hdr"].startswith("4141")
    assert len(term["term_rdmap_hdr"]) == 56 and term["term_rdmap_hdr"].startswith("11223344")
    assert all(r["findings"] == [] for r in (req, rep, send, write, rr, resp, imm, atom, term))


def test_summary_one_line_per_pdu(capture: Path, capsys) -> None:
    assert main(["dissect", str(capture)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 11
    assert "MPA Request rev=2 flags=MC PD=4" in lines[0]
    assert "Send QN=0 MSN=1 MO=0 len=13 L CRC ok" in lines[2]
    assert "i2r 10.1.0.1:50001 \u2192 10.1.0.2:35287" in lines[2]
    assert "RDMA Read Response STag=0x11223344 TO=0x2000 len=1024 L CRC ok markers=" in lines[6]
    assert "0/1/0x00 Invalid STag [MDR]" in lines[10]


def test_verbose_tree(capture: Path, capsys) -> None:
    assert main(["dissect", str(capture), "-V", "-c", "3"]) == 0
    out = capsys.readouterr().out
    assert "IRD/ORD word: IRD=16 ORD=16 P2P=0 RTR=none" in out
    assert "ULPDU_Length: 31" in out and "[good]" in out
    assert "Payload (13 bytes): 48 65 6c 6c 6f" in out


def test_display_filter_and_count(capture: Path, capsys) -> None:
    rows = _json(capsys, str(capture), "-Y", 'opcode in (1, 2) or opcode_name == "Terminate"')
    assert [r["opcode"] for r in rows] == [1, 2, 7]
    rows = _json(capsys, str(capture), "-Y", "direction == 'r2i' && markers > 0", "-c", "1")
    assert len(rows) == 1 and rows[0]["opcode"] == 2


def test_statistics(capture: Path, capsys) -> None:
    assert main(["dissect", str(capture), "-q", "--stats"]) == 0  # bare -z now takes STAT
    out = capsys.readouterr().out
    assert "TCP connections: 1, iWARP: 1, PDUs shown: 11, bad CRC: 0" in out
    assert "i2r 10.1.0.1:50001 -> 10.1.0.2:35287: CRC on, markers off; 7 PDUs (6 FPDUs)" in out
    assert "r2i 10.1.0.2:35287 -> 10.1.0.1:50001: CRC on, markers on; 4 PDUs (3 FPDUs)" in out
    assert "  RDMA Read Request" in out and "Findings: none" in out


def test_findings_shown_and_fail_on_findings(tmp_path: Path, capsys) -> None:
    b = CaptureBuilder()
    c = b.connection()
    wire = bytearray(c.wire(I2R, c.ulpdus(I2R, Send(b"data"))[0]))
    wire[-1] ^= 1
    c.raw(I2R, bytes(wire))
    path = tmp_path / "bad.pcap"
    path.write_bytes(b.data())
    assert main(["dissect", str(path), "-Y", 'findings contains "MPA-12"']) == 0
    line = capsys.readouterr().out.strip()
    assert line.endswith("CRC BAD [MPA-12]")
    assert main(["dissect", str(path), "--fail-on-findings", "-q"]) == 3
    rows = _json(capsys, str(path), "-Y", "crc_ok == false")
    assert rows[0]["finding_details"][0].startswith("MPA-12: CRC 0x")


def test_mid_stream_options(tmp_path: Path, capsys) -> None:
    b = CaptureBuilder()
    c = b.connection(crc=False, markers_i2r=True, startup=False, handshake=False)
    c.framers[I2R].markers = True
    for i in range(12):
        c.send(I2R, Send(bytes([i]) * 300))
    path = tmp_path / "mid.pcap"
    path.write_bytes(b.data())
    rows = _json(capsys, str(path), "--crc", "off", "--markers", "i2r",
                 "--initiator", "10.1.0.1:50001")  # fmt: skip
    assert len(rows) == 12 and all(r["crc_ok"] is None and r["findings"] == [] for r in rows)
    assert [r["msn"] for r in rows] == list(range(1, 13))


@pytest.mark.parametrize(
    "content, status, message",
    [
        (b"garbage that is no capture", 2, "not a pcap or pcapng file"),
        (struct.pack("<IHHiIII", 0xA1B2C3D4, 2, 4, 0, 0, 65535, 1), 1, "no iWARP"),
    ],
)
def test_bad_files_give_one_line(tmp_path: Path, capsys, content: bytes, status: int,
                                 message: str) -> None:  # fmt: skip
    path = tmp_path / "x.pcap"
    path.write_bytes(content)
    assert main(["dissect", str(path)]) == status
    err = capsys.readouterr().err.strip()
    assert message in err and "\n" not in err and "Traceback" not in err


def test_truncated_capture_prints_what_it_decoded(capture: Path, tmp_path: Path, capsys) -> None:
    cut = tmp_path / "cut.pcap"
    cut.write_bytes(capture.read_bytes()[:-30])
    assert main(["dissect", str(cut)]) == 2
    captured = capsys.readouterr()
    assert len(captured.out.splitlines()) >= 10
    assert "truncated capture" in captured.err and "\n" not in captured.err.strip()


def test_missing_file_and_bad_filter(capsys) -> None:
    assert main(["dissect", "/nonexistent.pcap"]) == 2
    assert "no such file" in capsys.readouterr().err
    assert main(["dissect", "/nonexistent.pcap", "-Y", "opcode =="]) == 2
    assert "bad display filter" in capsys.readouterr().err
    assert main(["dissect", "/x.pcap", "--initiator", "nonsense"]) == 2


def _no_permission(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Make ``path`` unreadable; root reads through mode bits, so it then gets the error
    the kernel gives other users."""
    path.chmod(0)
    if os.geteuid() == 0:
        real_open = open

        def refuse(name: object, *args: object, **kwargs: object) -> object:
            if name == str(path):
                raise PermissionError(errno.EACCES, "Permission denied", str(path))
            return real_open(name, *args, **kwargs)  # type: ignore[call-overload]

        monkeypatch.setattr("stack.pcap.source.open", refuse, raising=False)


@pytest.mark.parametrize(
    "case, message",
    [
        ("missing", "no such file"),
        ("missing, with -w", "no such file"),
        ("directory, with -w", "is a directory"),
        ("directory", "is a directory"),
        ("unreadable", "cannot read (Permission denied)"),
        ("not a capture", "not a pcap or pcapng file"),
        ("corrupt record", "corrupt capture: corrupt record for frame 5"),
        ("truncated", "truncated capture: file is cut short"),
        ("unwritable -w", "no such directory"),
    ],
)
def test_every_file_error_names_the_file(
    case: str, message: str, capture: Path, tmp_path: Path, capsys, monkeypatch
) -> None:
    path = tmp_path / "x.pcap"
    args = [str(path)]
    raw = capture.read_bytes()
    ends = [24]
    for frame in iter_frames(raw):
        ends.append(ends[-1] + 16 + len(frame.data))
    if case.endswith(", with -w"):
        (tmp_path / "out.pcap").write_bytes(b"")  # an existing output is no reason to crash
        args += ["-w", str(tmp_path / "out.pcap")]
    if case.startswith("directory"):
        path.mkdir()
    elif case == "unreadable":
        path.write_bytes(raw)
        _no_permission(path, monkeypatch)
    elif case == "not a capture":
        path.write_bytes(b"GET / HTTP/1.1\r\n\r\n")
    elif case == "corrupt record":
        bad = bytearray(raw)
        struct.pack_into("<I", bad, ends[4] + 8, 0x7FFFFFFF)  # frame 5's captured length
        path.write_bytes(bytes(bad))
    elif case == "truncated":
        path.write_bytes(raw[:-30])
    elif case == "unwritable -w":
        path.write_bytes(raw)
        out = tmp_path / "no" / "such" / "dir.pcap"
        args += ["-w", str(out)]
        path = out
    try:
        status = main(["dissect", *args, "-q"])
    except SystemExit as exc:
        status = int(exc.code or 0)
    assert status == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("iwarp dissect: ") and "\n" not in err and "Traceback" not in err
    assert f"{path}: " in err and message in err


def test_non_iwarp_tcp(tmp_path: Path, capsys) -> None:
    b = CaptureBuilder()
    c = b.connection(startup=False)
    c.raw(I2R, b"SSH-2.0-OpenSSH_9.2\r\n" * 20)
    path = tmp_path / "ssh.pcap"
    path.write_bytes(b.data())
    assert main(["dissect", str(path)]) == 1
    captured = capsys.readouterr()
    assert "not iWARP" in captured.out and "no iWARP (MPA) traffic" in captured.err


@pytest.mark.parametrize("name", ["-", "/dev/stdin"])
def test_a_pipe_is_decoded_as_it_arrives(capture: Path, capsys, name: str) -> None:
    """The first PDUs are printed while the writer still holds back the rest of the capture;
    the whole output is the same as for the file."""
    raw = capture.read_bytes()
    assert main(["dissect", str(capture)]) == 0
    expected = capsys.readouterr().out
    ends = [24]
    for frame in iter_frames(raw):
        ends.append(ends[-1] + 16 + len(frame.data))
    half = ends[len(ends) // 2]
    proc = subprocess.Popen(
        [sys.executable, "-m", "stack.cli.iwarp", "dissect", name],
        cwd=REPO,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdin is not None and proc.stdout is not None
    try:
        proc.stdin.write(raw[:half])
        proc.stdin.flush()
        ready, _, _ = select.select([proc.stdout], [], [], GUARD)
        assert ready, "nothing was printed before the input ended"
        first = proc.stdout.readline()
        proc.stdin.write(raw[half:])
        proc.stdin.close()
        rest = proc.stdout.read()
        assert proc.wait(GUARD) == 0
    finally:
        proc.kill()
        proc.wait()
    assert first and (first + rest).decode() == expected


def test_a_truncated_pipe_prints_what_it_decoded(capture: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "stack.cli.iwarp", "dissect", "-", "--json"],
        cwd=REPO,
        input=capture.read_bytes()[:-30],
        capture_output=True,
        timeout=GUARD,
    )
    assert done.returncode == 2
    assert len(done.stdout.splitlines()) >= 10
    err = done.stderr.decode().strip()
    assert err.startswith("iwarp dissect: <stdin>: truncated capture: file is cut short")
    assert "\n" not in err


def test_mid_stream_flag_searches_connections_that_start_without_mpa(
    tmp_path: Path, capsys
) -> None:
    b = CaptureBuilder()
    c = b.connection(startup=False)  # SYN captured, MPA startup not (e.g. a filter dropped it)
    for i in range(8):
        c.send(I2R, Send(bytes([i]) * 200))
    path = tmp_path / "nompa.pcap"
    path.write_bytes(b.data())
    assert main(["dissect", str(path), "-q"]) == 1
    capsys.readouterr()
    rows = _json(capsys, str(path), "--mid-stream")
    assert [r["msn"] for r in rows] == list(range(1, 9))
    assert all(r["crc_ok"] is True and r["findings"] == [] for r in rows)


def test_summary_fast_lines_match_the_general_form(capture: Path) -> None:
    from stack.dissect.decoder import PduRecord, dissect
    from stack.dissect.text import _fields, summary_line
    from stack.pcap import read_tcp_segments

    recs = [r for r in dissect(read_tcp_segments(capture.read_bytes()))
            if isinstance(r, PduRecord) and r.kind == "fpdu"]  # fmt: skip
    checked = 0
    for r in recs:
        crc = " CRC ok" if r.crc_ok else "" if r.crc_ok is None else " CRC BAD"
        marks = f" markers={len(r.marker_ptrs)}" if r.marker_ptrs else ""
        general = (
            f"{r.frame:>6} {r.stream:>3} {r.direction} {r.src} \u2192 {r.dst} "
            f"MPA/DDP/RDMAP {_fields(r)}{crc}{marks}"
        )
        if not r.findings:
            assert summary_line(r) == general
            checked += 1
    assert checked >= 8


def test_filter_fields_are_exactly_the_json_keys_of_the_contract_and_additions() -> None:
    contract = CONTRACT_COMMON | CONTRACT_MPA | CONTRACT_ENHANCED | CONTRACT_FPDU | ALL_PER_OPCODE
    additions = {"timestamp", "wire_len", "offset", "finding_details", "ulp_private_data",
                 "reserved", "term_siw_layout"}  # fmt: skip
    assert FIELDS == contract | additions
