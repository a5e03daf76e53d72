"""``iwarp dissect`` with tshark's habits: -r, -T/-e/-E, -G, Wireshark field names, -z, -w."""

from __future__ import annotations

import json
import math
import os
import select
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from stack.cli.iwarp import main
from stack.dissect import (
    ALIASES,
    DERIVED_INFO,
    FIELD_INFO,
    FIELDS,
    IoStatistics,
    StatError,
    parse_stat,
)
from stack.dissect.stats import MIN_IO_INTERVAL
from stack.pcap import iter_frames
from stack.wire.events import RdmaWrite, ReadRequest, ReadResponse, Send
from tests.dissect.synth import I2R, R2I, CaptureBuilder

REPO = Path(__file__).resolve().parents[2]
PCAPS = REPO / "pcaps"
GUARD = 60.0
"""Seconds to wait for a child before giving up (a hang guard, not a speed check)."""


@pytest.fixture
def capture(tmp_path: Path) -> Path:
    b = CaptureBuilder()
    c = b.connection()
    c.send(I2R, Send(b"Hello, iWARP!"))
    c.send(I2R, RdmaWrite(0x00ABCDEF, 0x1000, bytes(range(1, 9))))
    c.send(I2R, ReadRequest(0x11223344, 0x2000, 0x40, 0x55667788, 0x3000))
    c.send(R2I, ReadResponse(0x11223344, 0x2000, bytes(0x40)))
    c.close()
    path = tmp_path / "ops.pcap"
    path.write_bytes(b.data())
    return path


def _out(capsys: pytest.CaptureFixture[str], *args: str, status: int = 0) -> str:
    assert main(["dissect", *args]) == status
    return capsys.readouterr().out


def _error(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    """The one-line error of a rejected command line (exit status 2)."""
    try:
        status = main(["dissect", *args])
    except SystemExit as exc:
        status = int(exc.code or 0)
    assert status == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "Traceback" not in err and err
    return err


def test_r_reads_the_capture_like_the_positional_file(capture: Path, capsys) -> None:
    assert _out(capsys, "-r", str(capture)) == _out(capsys, str(capture))
    assert "not both" in _error(capsys, str(capture), "-r", str(capture))
    assert "no capture given" in _error(capsys)


def test_t_fields_with_wireshark_names_header_and_separator(capture: Path, capsys) -> None:
    out = _out(capsys, "-r", str(capture), "-T", "fields", "-E", "header=y",
               "-e", "frame.number", "-e", "iwarp_rdma.opcode", "-e", "iwarp_ddp.stag",
               "-e", "iwarp_ddp.tagged_offset", "-e", "iwarp_ddp.msn", "-e", "tcp.port",
               "-e", "iwarp_mpa.crc_flag", "-e", "opcode_name")  # fmt: skip
    header, req, rep, send, write, rr, resp = (line.split("\t") for line in out.splitlines())
    assert header[:3] == ["frame.number", "iwarp_rdma.opcode", "iwarp_ddp.stag"]
    assert req[1:4] == ["", "", ""] and req[6] == "1" and req[5] == "50001,35287"
    assert send[1:5] == ["3", "", "", "1"] and send[7] == "Send"
    assert write[1:4] == ["0", "0x00abcdef", "0x0000000000001000"]
    assert resp[5] == "35287,50001" and resp[7] == "RDMA Read Response"
    csv = _out(capsys, str(capture), "-e", "iwarp_ddp.stag", "-e", "ip.src", "-E", "separator=,",
               "-Y", "iwarp_rdma.opcode == 0")  # fmt: skip
    assert csv == "0x00abcdef,10.1.0.1\n"


def test_t_json_is_json(capture: Path, capsys) -> None:
    assert _out(capsys, str(capture), "-T", "json") == _out(capsys, str(capture), "--json")
    assert "needs -T fields" in _error(capsys, str(capture), "--json", "-e", "frame")
    assert "unknown field" in _error(capsys, str(capture), "-e", "iwarp_ddp.nosuch")


def test_g_fields_lists_every_field_with_its_wireshark_names(capsys) -> None:
    assert set(FIELD_INFO) == FIELDS  # one description per JSON key
    lines = _out(capsys, "-G", "fields").splitlines()
    table = {line.split("\t")[0]: line.split("\t") for line in lines}
    assert set(table) == FIELDS | set(DERIVED_INFO)
    assert all(len(row) == 3 and row[2] for row in table.values())
    assert table["stag"][1] == "iwarp_ddp.stag" and table["to"][1] == "iwarp_ddp.tagged_offset"
    assert table["frame"][1] == "frame.number" and "tcp.port" in table
    for alias, key in ALIASES.items():
        assert alias in table[key][1].split(",")


def test_wireshark_names_are_tsharks() -> None:
    tshark = shutil.which("tshark")
    if tshark is None:
        pytest.skip("tshark not installed")
    listing = subprocess.run([tshark, "-G", "fields"], capture_output=True, text=True,
                             timeout=GUARD, check=True).stdout  # fmt: skip
    known = {row.split("\t")[2] for row in listing.splitlines() if row.startswith("F\t")}
    assert set(ALIASES) - known == set()
    assert set(DERIVED_INFO) - known == set()


def test_display_filters_take_wireshark_names(capture: Path, capsys) -> None:
    def frames(expr: str) -> list[int]:
        rows = _out(capsys, str(capture), "--json", "-Y", expr).splitlines()
        return [json.loads(r)["frame"] for r in rows]

    assert frames("iwarp_ddp.stag == 0x00ABCDEF") == frames("stag == 0x00abcdef") != []
    assert frames("iwarp_rdma.opcode == 1 && iwarp_ddp.qn == 1") == frames("opcode == 1")
    everything = frames("frame.number > 0")
    assert len(everything) == 6
    assert frames("tcp.port == 35287") == everything and frames("tcp.port != 35287") == []
    assert frames("tcp.srcport == 35287") == frames("direction == 'r2i'") != []
    assert frames('ip.addr == "10.1.0.2"') == everything and frames("ipv6.addr") == []
    assert frames("iwarp_mpa.rev == 2 and iwarp_mpa.crc_flag") == everything[:2]
    assert frames("iwarp_mpa.ulpdulength == 31") == frames("ulpdu_len == 31") != []
    assert frames("frame.time_relative >= 0.0") == everything
    assert "unknown field" in _error(capsys, str(capture), "-Y", "iwarp_ddp.nosuch == 1")


def test_json_stags_and_tos_are_fixed_width_hex_and_filters_compare_numbers(
    capture: Path, capsys
) -> None:
    keys = ("stag", "to", "read_sink_stag", "read_sink_to", "read_src_stag", "read_src_to")
    rows = [json.loads(r) for r in _out(capsys, str(capture), "--json").splitlines()]
    write, rr = rows[3], rows[4]
    assert (write["stag"], write["to"]) == ("0x00abcdef", "0x0000000000001000")
    assert [rr[k] for k in keys[2:]] == ["0x11223344", "0x0000000000002000", "0x55667788",
                                          "0x0000000000003000"]  # fmt: skip
    assert rows[2]["stag"] is None and rows[2]["to"] is None  # untagged: null, as before
    # -T fields prints the very same strings
    table = _out(capsys, str(capture), "-T", "fields", *(a for k in keys for a in ("-e", k)))
    for line, rec in zip(table.splitlines(), rows, strict=True):
        assert line.split("\t") == [rec.get(k) or "" for k in keys]

    def frames(expr: str) -> list[int]:
        return [json.loads(r)["frame"] for r in _out(capsys, str(capture), "--json", "-Y", expr)
                .splitlines()]  # fmt: skip

    tagged = [write["frame"], rows[5]["frame"]]
    assert frames("stag == 0x00abcdef") == frames("iwarp_ddp.stag == 11259375") == tagged[:1]
    assert frames("stag >= 0x00abcdef") == tagged and frames("to < 0x1001") == tagged[:1]
    assert frames("read_src_to == 12288") == frames("iwarp_rdma.srcto == 0x3000") == [rr["frame"]]


def test_z_takes_tshark_arguments_and_leaves_the_file_alone(capture: Path, capsys) -> None:
    out = _out(capsys, "-q", "-z", "conv,tcp", str(capture))
    assert "TCP Conversations" in out and "10.1.0.1:50001 <-> 10.1.0.2:35287" in out
    out = _out(capsys, "-q", "-z", "io,stat,1", "-z", "iwarp", str(capture))
    assert "IO Statistics (interval 1 s" in out and "PDUs shown: 6" in out
    assert "0 <> 1" in out.split("IO Statistics")[1]
    assert "iWARP statistics" in _out(capsys, "-q", "-z", "iwarp,stat", str(capture))
    assert "unknown statistics" in _error(capsys, "-z", str(capture))
    assert "positive interval" in _error(capsys, "-z", "io,stat,0", str(capture))


@pytest.mark.parametrize(
    "interval",
    ["1e-320", "5e-324", "1e-7", "0", "-1", "-0.5", "nan", "inf", "-inf", "1e400", "", "0x10",
     "1_0", "one"],
)  # fmt: skip
def test_io_stat_rejects_a_degenerate_interval_in_one_line(
    capture: Path, capsys: pytest.CaptureFixture[str], interval: str
) -> None:
    """Found by fuzzing: a denormal interval overflowed int() on the first PDU (a traceback);
    an infinite one printed 'nan <> inf'.  Each is a bad option (exit status 2)."""
    err = _error(capsys, "-q", "-z", f"io,stat,{interval}", str(capture))
    assert "positive interval in seconds, at least 1e-06" in err and repr(interval) in err


@pytest.mark.parametrize("arg", ["io,stat", "io,stat,1,frame", "io,stat,1,"])
def test_io_stat_takes_one_interval_and_no_filter(
    capture: Path, capsys: pytest.CaptureFixture[str], arg: str
) -> None:
    assert "takes one argument" in _error(capsys, "-q", "-z", arg, str(capture))


def test_io_stat_at_a_microsecond_and_beyond_a_lifetime(
    capture: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The smallest interval (MIN_IO_INTERVAL) shows bounds that tell adjacent rows apart;
    a huge finite interval holds every PDU in one row."""
    out = _out(capsys, "-q", "-z", f"io,stat,{MIN_IO_INTERVAL}", str(capture))
    rows = [line.split("<>") for line in out.split("IO Statistics")[1].splitlines() if "<>" in line]
    assert len(rows) > 1 and len({start for start, _ in rows}) == len(rows)
    assert all(len(start.strip().split(".")[1]) == 6 for start, _ in rows)
    out = _out(capsys, "-q", "-z", "io,stat,1e308", "-z", "iwarp", str(capture))
    lines = [line for line in out.split("IO Statistics")[1].splitlines() if "<>" in line]
    assert len(lines) == 1 and lines[0].startswith("0 <> 1e+308")
    assert int(lines[0].split()[-2]) == 6  # "PDUs shown: 6"


def test_io_statistics_refuse_an_interval_built_in_code() -> None:
    assert parse_stat("io,stat, 0.5") == ("io", 0.5)
    for bad in (0.0, -1.0, 1e-320, math.inf, math.nan):
        with pytest.raises(StatError):
            IoStatistics(bad)


def _retimed(data: bytes, first: int) -> bytes:
    """The capture with record k stamped at ``first + k`` seconds (pcap record headers)."""
    out, pos, k = bytearray(data[:24]), 24, 0
    while pos < len(data):
        incl = struct.unpack_from("<I", data, pos + 8)[0]
        out += struct.pack("<II", first + k, 0) + data[pos + 8 : pos + 16 + incl]
        pos, k = pos + 16 + incl, k + 1
    return bytes(out)


def test_io_stat_intervals_count_from_the_first_packet_even_at_time_zero(
    capture: Path, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """``-z io,stat`` bins by time since the first packet, as tshark does: a capture that
    starts at the epoch (0.0) bins exactly like the same capture five seconds later."""
    tables = []
    for first in (0, 5):
        path = tmp_path / f"at{first}.pcap"
        path.write_bytes(_retimed(capture.read_bytes(), first))
        out = _out(capsys, "-q", "-z", "io,stat,1", str(path))
        tables.append(out.split("IO Statistics")[1])
    assert tables[0] == tables[1]
    rows = [line for line in tables[0].splitlines() if "<>" in line]
    assert sum(int(line.split()[-2]) > 0 for line in rows) > 1, tables[0]


def test_json_with_statistics_keeps_stdout_json(capture: Path, capsys) -> None:
    assert main(["dissect", str(capture), "--json", "-z", "iwarp"]) == 0
    captured = capsys.readouterr()
    rows = [json.loads(line) for line in captured.out.splitlines()]
    assert len(rows) == 6 and "iWARP statistics" in captured.err


@pytest.mark.parametrize("fmt", [["--json"], ["-T", "json"], ["-T", "fields", "-e", "frame"]])
def test_every_statistic_goes_to_stderr_when_stdout_is_machine_readable(
    capture: Path, capsys, fmt: list[str]
) -> None:
    stats = ["-z", "iwarp", "-z", "conv,tcp", "-z", "io,stat,1", "--stats"]
    assert main(["dissect", str(capture), *fmt, *stats]) == 0
    captured = capsys.readouterr()
    lines = captured.out.splitlines()
    assert len(lines) == 6
    if fmt[-1] == "frame":
        assert all(line.isdigit() for line in lines)
    else:
        assert all(isinstance(json.loads(line), dict) for line in lines)
    for title in ("iWARP statistics", "TCP Conversations", "IO Statistics"):
        assert title in captured.err and title not in captured.out


def test_time_columns(capture: Path, capsys) -> None:
    records = [json.loads(r) for r in _out(capsys, str(capture), "--json").splitlines()]
    first = min(f.timestamp for f in iter_frames(capture))
    lines = _out(capsys, str(capture)).splitlines()
    for line, rec in zip(lines, records, strict=True):
        frame, rel = line.split()[:2]
        assert int(frame) == rec["frame"]
        assert abs(float(rel) - (rec["timestamp"] - first)) < 1e-6
    tree = _out(capsys, str(capture), "-V", "-c", "1")
    assert "  Frame time: " in tree and " UTC (" in tree and "s since the first segment" in tree


def test_w_writes_the_frames_of_the_shown_pdus(capture: Path, tmp_path: Path, capsys) -> None:
    out = tmp_path / "reads.pcap"
    shown = _out(capsys, str(capture), "-Y", "opcode in (1, 2)", "-w", str(out))
    wanted = [int(line.split()[0]) for line in shown.splitlines()]
    assert len(wanted) == 2
    originals = {f.number: bytes(f.data) for f in iter_frames(capture)}
    written = [bytes(f.data) for f in iter_frames(out)]
    assert written == [originals[n] for n in wanted]
    assert "not a pipe" in _error(capsys, "-", "-w", str(tmp_path / "x.pcap"))
    assert "overwrite" in _error(capsys, str(capture), "-w", str(capture))


def test_help_has_the_filter_grammar_exit_codes_and_live_decode(capsys) -> None:
    with pytest.raises(SystemExit):
        main(["dissect", "--help"])
    text = capsys.readouterr().out
    assert "display filter (-Y)" in text and "contains" in text and "tcp.port" in text
    assert "exit status: 0" in text and "--fail-on-findings" in text
    assert "tcpdump -U -i IFACE -w -" in text and "-z" in text
    assert "-i IFACE" in text and "CAP_NET_RAW" in text and "-D lists the interfaces" in text
    assert "[tcp] [src|dst] port N" in text and "saves every captured frame" in text
    assert "JSON (--json, -T json)" in text and '"0x%08x"' in text and '"0x%016x"' in text


@pytest.mark.parametrize("extra", [[], ["-V"], ["-z", "iwarp"]])
def test_an_ascii_terminal_gets_no_traceback(extra: list[str]) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "stack.cli.iwarp", "dissect", str(PCAPS / "rev1-crc.pcap"), *extra],
        cwd=REPO,
        env={**os.environ, "PYTHONIOENCODING": "ascii"},
        capture_output=True,
        timeout=GUARD,
    )
    assert done.returncode == 0, done.stderr.decode()
    text = done.stdout.decode("ascii")
    assert "->" in text and "\u2192" not in text and b"Traceback" not in done.stderr


@pytest.mark.parametrize(
    "args, message",
    [
        (["-c", "0"], "must be >= 1"),
        (["-c", "-1"], "must be >= 1"),
        (["--max-private-data", "-1"], "must be >= 0"),
        (["-T", "fields", "-V"], "disagree"),
    ],
)
def test_bad_numbers_are_argparse_errors(capture: Path, capsys, args, message) -> None:
    assert message in _error(capsys, str(capture), *args)


def _snap(data: bytes, snaplen: int) -> bytes:
    """A classic little-endian pcap rewritten as if captured with ``snaplen``."""
    header = bytearray(data[:24])
    struct.pack_into("<I", header, 16, snaplen)
    out = [bytes(header)]
    pos = 24
    while pos < len(data):
        sec, usec, incl, orig = struct.unpack_from("<IIII", data, pos)
        body = data[pos + 16 : pos + 16 + incl][:snaplen]
        out.append(struct.pack("<IIII", sec, usec, len(body), orig) + body)
        pos += 16 + incl
    return b"".join(out)


def test_a_snaplen_cut_capture_shows_the_partial_headers(tmp_path: Path, capsys) -> None:
    cut = tmp_path / "snap.pcap"
    cut.write_bytes(_snap((PCAPS / "term-read-bounds.pcap").read_bytes(), 96))
    out = _out(capsys, str(cut))
    assert "MPA Request rev=2" in out  # short frames are whole
    lines = [line for line in out.splitlines() if "snapshot length" in line]
    assert len(lines) == 2
    assert "frame 6 was cut by the capture's snapshot length (42 of 52" in lines[0]
    assert "partial FPDU ULPDU_Length=46 DDP untagged L=1" in lines[0]
    assert "RDMA Read Request QN=1 MSN=1 MO=0" in lines[0]
    assert "Terminate QN=2 MSN=1 MO=0" in lines[1]
    assert "partial FPDU ULPDU_Length=70" in _out(capsys, str(cut), "-V")


def test_r_dash_decodes_standard_input_as_it_arrives(capture: Path) -> None:
    raw = capture.read_bytes()
    half = 24 + sum(16 + len(f.data) for f in list(iter_frames(raw))[:5])
    proc = subprocess.Popen(
        [sys.executable, "-m", "stack.cli.iwarp", "dissect", "-r", "-"],
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
    assert b"MPA Request" in first and len((first + rest).splitlines()) == 6
