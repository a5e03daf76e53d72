"""``iwarp bench floor``: the pure-Python floor, the raw receive-size sweep, ``--batch`` and
the Read exchanges (``--exchange read|rtt``)."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import trio

from stack.bench.floor import VARIANTS, _marked_wire, _MarkedFramer, measure
from stack.bench.floor_exchange import (
    FLOOR_RESPONDER,
    REQUEST_WIRE,
    _reads,
    measure_exchange,
    read_requests,
)
from stack.bench.floor_wire import (
    TaggedFramer,
    connect,
    fpdu_payload,
    fpdu_wire,
    place,
    result,
    sink_process,
)
from stack.bench.options import MAX_DEPTH
from stack.constants import (
    DDP_TAGGED_HDR_LEN,
    MPA_CRC_RESIDUE,
    MPA_MARKER_INTERVAL,
    RAW_RECEIVE_SIZE,
    RAW_RECEIVE_SIZES,
    Opcode,
    QueueNumber,
)
from stack.crc import crc32c
from stack.wire.events import ReadRequest
from stack.wire.rdmap import decode_ulpdu


def _floor(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``iwarp bench floor ARGS`` of the installed package, run outside the checkout."""
    argv = [sys.executable, "-m", "stack.cli.iwarp", "bench", "floor", *args]
    return subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, timeout=120)


def test_the_sweep_adds_a_raw_row_per_receive_size_with_ratios_to_raw(tmp_path: Path) -> None:
    done = _floor(
        tmp_path, "-s", "64K", "-D", "0.3", "--repeat", "1", "--raw-sizes", "64K,1M", "--json", "-"
    )
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert doc["schema"] == "iwarp-bench-floor/1" and doc["exit_status"] == 0
    rows = doc["rows"]
    names = [r["variant"] for r in rows]
    assert names == ["raw", "raw@64K", "raw@1M", "raw-some", "crc", "floor", "markers"]
    raw = rows[0]
    assert raw["ratio"] == 1.0 and raw["MBps"] > 0
    for row in rows[1:]:
        assert row["ratio"] == pytest.approx(row["MBps"] / raw["MBps"], rel=1e-9)
    assert RAW_RECEIVE_SIZE == 128 * 1024  # what ``raw`` reads per recv_into
    table = done.stderr.splitlines()  # --json -: the table on stderr, after the progress
    assert table[-len(rows) - 1].split()[:2] == ["size", "variant"]
    assert [line.split()[1] for line in table[-len(rows) :]] == names


@pytest.mark.parametrize("bad", ["0", "12Q", "2G"])
def test_bad_raw_sizes_are_one_usage_error(tmp_path: Path, bad: str) -> None:
    done = _floor(tmp_path, "--raw-sizes", bad)
    assert done.returncode == 2
    assert "--raw-sizes" in done.stderr and "Traceback" not in done.stderr


@pytest.mark.parametrize(
    ("args", "option"),
    [
        pytest.param(args, option, id=" ".join(args))
        for args, option in [
            (["--repeat", "0"], "--repeat"),
            (["-s", "nonsense"], "--sizes"),
            (["-s", "32"], "--sizes"),
            (["-D", "0"], "--duration"),
            (["--emss", "10"], "--emss"),
            (["--json", "no-such-dir/out.json"], "--json"),
        ]
    ],
)
def test_a_bad_argument_is_one_error_line_and_status_2(
    tmp_path: Path, args: list[str], option: str
) -> None:
    done = _floor(tmp_path, *args)
    assert done.returncode == 2 and done.stdout == ""
    assert len(done.stderr.splitlines()) == 1, done.stderr
    assert done.stderr.startswith("iwarp bench floor: error: ") and option in done.stderr


def test_the_read_size_caps_every_recv_into_and_is_recorded(tmp_path: Path) -> None:
    # An odd cap smaller than an FPDU: each FPDU arrives over many reads, a partial one at
    # the end of most of them, and the receivers still check every CRC and count every octet.
    done = _floor(
        tmp_path, "-s", "64K", "-D", "0.3", "--repeat", "1", "--read-size", "1000", "--json", "-"
    )
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert doc["read_size"] == 1000
    names = [r["variant"] for r in doc["rows"]]
    assert names == ["raw", "raw-some", "crc", "floor", "markers"]
    assert all(r["MBps"] > 0 for r in doc["rows"])


def test_the_read_size_defaults_to_what_raw_reads(tmp_path: Path) -> None:
    done = _floor(tmp_path, "-s", "64K", "-D", "0.2", "--repeat", "1", "--json", "-")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["read_size"] == RAW_RECEIVE_SIZE


@pytest.mark.parametrize("bad", ["0", "x", "2M"])
def test_bad_read_sizes_are_one_usage_error(tmp_path: Path, bad: str) -> None:
    done = _floor(tmp_path, "--read-size", bad)
    assert done.returncode == 2
    assert "--read-size" in done.stderr and "Traceback" not in done.stderr


def test_measure_sends_its_progress_where_asked(capsys: pytest.CaptureFixture[str]) -> None:
    # What another module calls: the rows of the table, a progress line per run to the
    # stream given, and none anywhere with None.
    out = io.StringIO()
    rows = measure([65536], 0.1, 1, 65483, progress=out)
    assert [r["variant"] for r in rows] == list(VARIANTS)
    keys = {"size", "variant", "MBps", "msgps", "cpu_send_us", "cpu_recv_us", "ratio"}
    assert all(set(r) == keys and r["size"] == 65536 for r in rows)
    assert len(out.getvalue().splitlines()) == len(VARIANTS)
    assert len(measure([65536], 0.1, 1, 65483, progress=None)) == len(VARIANTS)
    assert capsys.readouterr() == ("", "")


@pytest.mark.parametrize("length", [64, 490, 491, 508, 4000, 64752])
def test_the_markers_variant_frames_on_the_marker_grid(length: int) -> None:
    # A marker every 512 octets from the FPDU's start, 508 octets of the FPDU between them,
    # and a CRC over it all: the work the stack's marker framing has to do, no less.
    framer = _MarkedFramer(64752)
    payload = bytes(range(256)) * (length // 256 + 1)
    fpdu = framer.frame(0x1234, memoryview(payload[:length]))
    assert len(fpdu) == _marked_wire(DDP_TAGGED_HDR_LEN + length) and len(fpdu) % 4 == 0
    assert crc32c(fpdu) == MPA_CRC_RESIDUE
    markers = range(0, len(fpdu), MPA_MARKER_INTERVAL)
    assert all(fpdu[k : k + 4] == bytes(4) for k in markers)
    body = b"".join(fpdu[k + 4 : k + MPA_MARKER_INTERVAL] for k in markers)
    assert int.from_bytes(body[:2], "big") == DDP_TAGGED_HDR_LEN + length
    assert int.from_bytes(body[12:16], "big") == 0x1234  # the TO
    assert body[16 : 16 + length] == payload[:length]
    assert len(body) - 16 - length - 4 == -(2 + DDP_TAGGED_HDR_LEN + length) % 4  # the PAD


# ------------------------------------------------------------------------ --batch
def test_batch_sets_the_messages_per_send_of_every_variant(tmp_path: Path) -> None:
    # -s 64 --batch 16: 64 B Writes in post lists of 16, each message its own FPDU; every
    # variant runs, and the sender checked the receiver's count of every octet.
    done = _floor(
        tmp_path, "-s", "64", "--batch", "16", "-D", "0.2", "--repeat", "1", "--json", "-"
    )
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert doc["batch"] == 16 and "exchange" not in doc
    assert [r["variant"] for r in doc["rows"]] == list(VARIANTS)
    assert all(r["size"] == 64 and r["MBps"] > 0 for r in doc["rows"])


def test_without_batch_the_document_is_as_before(tmp_path: Path) -> None:
    done = _floor(tmp_path, "-s", "64K", "-D", "0.1", "--repeat", "1", "--json", "-")
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert list(doc) == ["schema", "command", "emss", "read_size", "rows", "exit_status"]


@pytest.mark.parametrize(
    "args",
    [
        ["--batch", "0"],
        ["--batch", "x"],
        ["--batch", str(MAX_DEPTH + 1)],
        ["--batch", "16", "--exchange", "read"],
        ["--raw-sizes", "64K", "--exchange", "rtt"],
        ["--exchange", "write"],
    ],
    ids=" ".join,
)
def test_bad_batch_or_exchange_is_one_usage_error(tmp_path: Path, args: list[str]) -> None:
    done = _floor(tmp_path, *args)
    assert done.returncode == 2 and done.stdout == ""
    assert len(done.stderr.splitlines()) == 1, done.stderr
    assert done.stderr.startswith("iwarp bench floor: error: ") and args[0] in done.stderr


@pytest.mark.parametrize(
    ("sizes", "payload"),
    [([64] * 16, 64752), ([65, 66, 67], 64752), ([2047, 2048, 5000], 1000), ([70000], 64752)],
)
def test_the_framer_makes_fpdus_the_receiver_checks_and_places(
    sizes: list[int], payload: int
) -> None:
    # Each message its own FPDUs (small ones copied into one buffer, large ones by
    # reference), each a valid tagged DDP segment with the Last flag on its last; the
    # receiver's check and placement give the source back.
    source = memoryview(bytes(range(256)) * 300)
    framer = TaggedFramer(source, payload, Opcode.RDMA_READ_RESPONSE)
    tos = [sum(sizes[:k]) for k in range(len(sizes))]
    messages = [(k, size, 7, to) for k, (size, to) in enumerate(zip(sizes, tos, strict=True))]
    wire = bytearray(b"".join(bytes(p) for p in framer.frame(messages)))
    pos, last = 0, []
    while pos < len(wire):
        length = int.from_bytes(wire[pos : pos + 2], "big")
        segment = decode_ulpdu(wire[pos + 2 : pos + 2 + length])
        assert segment.tagged and segment.opcode == Opcode.RDMA_READ_RESPONSE
        assert segment.stag == 7 and len(segment.payload) <= payload
        last.append(segment.last)
        pos += fpdu_wire(length)
    assert pos == len(wire) and sum(last) == len(sizes) and last[-1]
    target = memoryview(bytearray(sum(sizes)))
    assert place(memoryview(wire), 0, len(wire), target) == (len(wire), sum(sizes))
    for k, (size, to) in enumerate(zip(sizes, tos, strict=True)):
        assert target[to : to + size] == source[k : k + size]


def test_a_bad_crc_is_refused_where_the_fpdu_lies() -> None:
    source = memoryview(bytearray(b"\x5a" * 64))
    wire = bytearray(TaggedFramer(source, 64752, Opcode.RDMA_WRITE).frame([(0, 64, 1, 0)])[0])
    target = memoryview(bytearray(64))
    assert place(memoryview(wire), 0, len(wire), target) == (len(wire), 64)
    wire[20] ^= 1
    with pytest.raises(RuntimeError, match="CRC mismatch"):
        place(memoryview(wire), 0, len(wire), target)


# ------------------------------------------------------------------ --exchange read|rtt
def test_the_read_exchange_has_a_raw_and_a_floor_row(tmp_path: Path) -> None:
    done = _floor(
        tmp_path, "--exchange", "read", "-s", "64K", "-D", "0.2", "--repeat", "1", "--json", "-"
    )
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert doc["exchange"] == "read" and doc["exit_status"] == 0
    raw, floor = doc["rows"]
    assert (raw["variant"], floor["variant"]) == ("raw", "floor")
    assert raw["ratio"] == 1.0 and raw["MBps"] > 0 and floor["MBps"] > 0
    assert floor["ratio"] == pytest.approx(floor["MBps"] / raw["MBps"], rel=1e-9)
    assert raw["receive"] in RAW_RECEIVE_SIZES and floor["receive"] in RAW_RECEIVE_SIZES
    table = done.stderr.splitlines()
    assert table[-3].split()[:3] == ["size", "variant", "MB/s"]


def test_the_rtt_exchange_reports_median_round_trips(tmp_path: Path) -> None:
    done = _floor(tmp_path, "--exchange", "rtt", "-D", "0.2", "--repeat", "1", "--json", "-")
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    raw, floor = doc["rows"]
    assert raw["size"] == floor["size"] == 64  # the default size of rtt
    assert raw["us"] > 0 and floor["us"] > 0 and raw["round_trips"] > 0
    assert floor["ratio"] == pytest.approx(floor["us"] / raw["us"], rel=1e-9)


def test_measure_exchange_returns_rows_with_ratios() -> None:
    rows = measure_exchange("rtt", [256], 0.1, 1, 65483, progress=None)
    assert [(r["size"], r["variant"]) for r in rows] == [(256, "raw"), (256, "floor")]
    keys = {"size", "variant", "us", "round_trips", "cpu_requester_us", "cpu_responder_us"}
    assert all(set(r) == keys | {"ratio"} for r in rows)
    with pytest.raises(ValueError, match="unknown exchange"):
        measure_exchange("stream", [64], 0.1, 1, 65483, progress=None)


def test_read_requests_are_valid_rdma_read_requests() -> None:
    wire = read_requests(65536, 5, 3)
    assert len(wire) == 3 * REQUEST_WIRE
    for k in range(3):
        fpdu = wire[k * REQUEST_WIRE : (k + 1) * REQUEST_WIRE]
        assert crc32c(fpdu) == MPA_CRC_RESIDUE
        segment = decode_ulpdu(fpdu[2:-4])
        assert segment.opcode == Opcode.RDMA_READ_REQUEST and segment.msn == 5 + k
        assert isinstance(segment.header, ReadRequest)
        assert segment.qn == QueueNumber.READ_REQUEST and segment.header.size == 65536


async def _bad_then_good(port: int, payload: int) -> tuple[str, dict[str, Any]]:
    """A client that sends a Read Request with a bad CRC (the responder must end the
    connection, the requester see it), one that goes in the middle of a request, then a
    good run against the same sink."""
    stream = await connect(port, FLOOR_RESPONDER, 4096, payload, RAW_RECEIVE_SIZE)
    bad = read_requests(4096, 1, 1)
    bad[-1] ^= 1
    await stream.send_all(bad)
    try:
        await result(stream)
        seen = "no error"
    except RuntimeError as exc:
        seen = str(exc)
    early = await connect(port, FLOOR_RESPONDER, 4096, payload, RAW_RECEIVE_SIZE)
    await early.send_all(read_requests(4096, 1, 2)[:70])
    await early.aclose()
    return seen, await _reads(port, "floor", 4096, payload, 0.1, RAW_RECEIVE_SIZE)


def test_the_responder_refuses_a_bad_crc_and_the_sink_survives_early_clients(
    capfd: pytest.CaptureFixture[str],
) -> None:
    with sink_process() as port:
        seen, good = trio.run(_bad_then_good, port, fpdu_payload(65483))
    assert "without its count" in seen
    assert good["MBps"] > 0
    assert "CRC mismatch" in capfd.readouterr().err  # the sink's one line
