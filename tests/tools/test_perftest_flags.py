"""perftest -R peers: latency and atomic peers, --report_gbits, -D, --out_json, -w, and
perftest's device options; bad values are one-line errors."""

from __future__ import annotations

import io
import json
import socket
import subprocess
import sys
import time
from contextlib import redirect_stderr
from pathlib import Path
from typing import Any

import pytest
import trio

from stack.cli import build_parser
from stack.cli.iwarp import COMMANDS, main
from stack.interop.helpers import dissect
from stack.peers.perftest import (
    PerftestClient,
    PerftestOptions,
    PerftestServer,
    Step,
    message_sizes,
    options_from_args,
    script,
)
from stack.peers.perftest import latency as perftest_latency
from stack.peers.perftest.cli import device_notes
from stack.peers.perftest.options import SEND_FIRST_AFTER
from stack.peers.perftest.protocol import PerftestError
from stack.peers.perftest.side import PerftestSide, _pattern


async def _session(
    test: str, *, latency: bool = False, server: dict[str, Any] | None = None, **common: Any
) -> tuple[PerftestClient, PerftestServer]:
    """A server and a client with options ``common`` (the server's own: ``server``)."""
    common = {"timeout": 10.0, "port": 0, "latency": latency, **common}
    sopts = PerftestOptions.build(
        test, bind="127.0.0.1", crc=False, out=io.StringIO(), **{**common, **(server or {})}
    )
    side = PerftestServer(sopts)
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            port = await nursery.start(side.session)
            common["port"] = port
            copts = PerftestOptions.build(
                test, host="127.0.0.1", first_fpdu_delay=0.0, out=io.StringIO(), **common
            )
            client = PerftestClient(copts)
            await client.session()
    return client, side


def _out(side: PerftestClient | PerftestServer) -> str:
    assert isinstance(side.out, io.StringIO)
    return side.out.getvalue()


# --------------------------------------------------------------------------- scripts


def test_latency_scripts_follow_perftest_4_5() -> None:
    hello = [16, 4, 4, 2]
    assert message_sizes("write", latency=True) == hello + [56] * 6
    assert message_sizes("read", latency=True) == hello + [56] * 7
    assert message_sizes("send", latency=True) == hello + [56] * 7
    assert script("write", 1, latency=True)[-1] is Step.RUN  # no closing sync
    assert script("atomic", 1) == script("write", 1)


def _memory(side: PerftestSide) -> memoryview:
    """The buffer of ``side``'s first data QP."""
    region = side.data[0].buf
    assert region is not None
    return region.buf


# --------------------------------------------------------------------------- sessions


@pytest.mark.parametrize("test", ["write", "read", "send"])
def test_latency_peers_against_each_other(test: str) -> None:
    client, server = trio.run(lambda: _session(test, latency=True, iters=20, size=64))
    [result] = client.lat_results
    assert (result.size, result.iterations) == (64, 20)
    assert 0 < result.t_min <= result.t_typical <= result.t_max
    assert "t_typical[usec]" in _out(client) and " Latency Test" in _out(client)
    received = [data for ours, data in server.comm.transcript if not ours]
    assert [len(d) for d in received] == message_sizes(test, latency=True)
    if test == "read":
        assert not server.lat_results  # the server only waits
        assert bytes(_memory(client)[:64]) == bytes(_memory(server)[:64])
    else:
        assert server.lat_results[0].iterations == 20  # both ping-pong sides report
    if test == "write":  # the last byte of our region holds the peer's count
        length = len(_memory(client)) // 2
        assert _memory(client)[length + 63] == 20 == _memory(server)[length + 63]
    if test == "send":
        assert client.data[0].received == 20 == server.data[0].received


def test_atomic_bw_fetch_and_adds_at_the_server() -> None:
    client, server = trio.run(lambda: _session("atomic", iters=50))
    [result] = client.results
    assert (result.size, result.iterations) == (8, 50)
    before = int.from_bytes(_pattern(8, 0), "little")
    after = int.from_bytes(_memory(server)[:8], "little")
    assert after == (before + 50) & (2**64 - 1)
    assert server.peer_report is not None and server.peer_report.iters == 50
    assert client.data[0].qp.ord >= 1 and client.theirs[0].out_reads == server.mine[0].out_reads


def test_duration_mode_counts_what_ran() -> None:
    client, server = trio.run(lambda: _session("write", duration=0.5, size=1024))
    [result] = client.results
    assert result.iterations >= 1
    assert server.peer_report is not None and server.peer_report.iters == result.iterations


def test_duration_mode_send_server_counts_until_the_client_stops() -> None:
    client, server = trio.run(lambda: _session("send", duration=0.5, size=256))
    assert client.results[0].iterations == server.data[0].received


def test_read_lat_duration_prints_the_average_and_tps() -> None:
    client, _server = trio.run(lambda: _session("read", latency=True, duration=0.3, size=64))
    assert "t_avg[usec]    tps average" in _out(client)
    assert client.lat_results[0].iterations >= 1


def test_report_gbits_and_out_json(tmp_path: Path) -> None:
    path = tmp_path / "out.json"
    client, _ = trio.run(
        lambda: _session("write", iters=20, size=4096, report_gbits=True, out_json=str(path))
    )
    assert "BW peak[Gb/sec]" in _out(client) and "MB/sec" not in _out(client)
    data = json.loads(path.read_text())
    assert data["test_info"]["test"] == "RDMA_Write_BW_Test"
    assert data["test_info"]["rdma_cm_QPs"] == "ON"
    results = data["results"]
    assert set(results) == {"MsgSize", "n_iterations", "BW_peak", "BW_average", "MsgRate"}
    assert results["MsgSize"] == 4096 and results["n_iterations"] == 20
    mb = client.results[0].bw_average
    assert results["BW_average"] == pytest.approx(mb * (1 << 20) / 125e6, rel=1e-3, abs=1e-6)


def test_latency_out_json_keys(tmp_path: Path) -> None:
    path = tmp_path / "lat.json"
    trio.run(lambda: _session("send", latency=True, iters=10, out_json=str(path)))
    data = json.loads(path.read_text())
    assert data["test_info"]["test"] == "Send_Latency_Test"
    assert {"t_typical", "percentile_99", "percentile_99.9", "t_stdev"} <= set(data["results"])


@pytest.mark.parametrize(("test", "latency"), [("write", True), ("atomic", False)])
def test_capture_decodes_with_zero_findings(tmp_path: Path, test: str, latency: bool) -> None:
    pcap = tmp_path / "side.pcap"
    # One side only: two writers on one file overwrite each other's records.
    trio.run(
        lambda: _session(
            test, latency=latency, iters=5, capture=str(pcap), server={"capture": None}
        )
    )
    done = subprocess.run(
        [sys.executable, "-m", "stack.cli.iwarp", "dissect", "--fail-on-findings", str(pcap)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    assert out.count("MPA Request") == 2  # the exchange and the data connection
    if test == "atomic":
        assert out.count("FetchAdd") + out.count("Fetch") >= 5
    else:
        assert out.count("RDMA Write") >= 5


async def _sends_nothing_first(*_args: object) -> None:
    """perftest's ``ib_write_lat`` client: nothing on the data connection before the server's
    first Write (no RFC 6581 peer-to-peer mode either)."""


WROTE_FIRST = "writing first, as Linux siw does (MPA-25 waived)"


def test_write_lat_server_waits_for_our_client_first_fpdu(tmp_path: Path) -> None:
    """Our client Writes zero bytes first: the server keeps MPA-25 (no waiver, no finding)."""
    pcap = tmp_path / "server.pcap"
    server_opts = {"capture": str(pcap), "send_first_after": 5.0}
    _client, server = trio.run(
        lambda: _session("write", latency=True, iters=5, size=64, server=server_opts)
    )
    assert WROTE_FIRST not in _out(server)
    assert dissect(pcap).findings() == []


def test_write_lat_server_writes_first_for_a_client_that_sends_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """perftest's client without P2P waits for the server's first Write: after
    ``send_first_after`` the server waives MPA-25, says so, and the run completes; the
    capture flags exactly that: our first Write, before anything from the client."""
    monkeypatch.setattr(perftest_latency, "_open_write", _sends_nothing_first)
    pcap = tmp_path / "server.pcap"
    server_opts = {"capture": str(pcap), "send_first_after": 0.2}
    client, server = trio.run(
        lambda: _session("write", latency=True, iters=5, size=64, server=server_opts)
    )
    note = f"no FPDU from the client within 0.2 s and no RFC 6581 peer-to-peer mode: {WROTE_FIRST}"
    assert note in _out(server)
    assert client.lat_results[0].iterations == 5 == server.lat_results[0].iterations
    decode = dissect(pcap)
    [record] = [r for r in decode.records if r.findings]
    assert [f.rule for f in record.findings] == ["MPA-25"]
    data_stream = max(r.stream for r in decode.records)
    firsts = [r for r in decode.fpdus() if r.stream == data_stream]
    assert firsts[0] is record and record.direction == "r2i"
    assert record.segment is not None and len(record.segment.payload) == 64


def test_write_lat_server_keeping_mpa_25_explains_the_wait(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``send_first_after=None``: nothing of ours goes first; both sides time out and the
    server's error says why."""
    monkeypatch.setattr(perftest_latency, "_open_write", _sends_nothing_first)
    errors: dict[str, str] = {}
    common: dict[str, Any] = {"latency": True, "iters": 3, "size": 64, "timeout": 1.0}
    server = PerftestServer(
        PerftestOptions.build(
            "write",
            bind="127.0.0.1",
            port=0,
            crc=False,
            send_first_after=None,
            out=io.StringIO(),
            **common,
        )
    )

    async def serve(task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
        try:
            await server.session(task_status=task_status)
        except PerftestError as exc:
            errors["server"] = str(exc)

    async def main() -> None:
        with trio.fail_after(60):
            async with trio.open_nursery() as nursery:
                port = await nursery.start(serve)
                client = PerftestClient(
                    PerftestOptions.build(
                        "write",
                        host="127.0.0.1",
                        port=port,
                        first_fpdu_delay=0.0,
                        out=io.StringIO(),
                        **common,
                    )
                )
                try:
                    await client.session()
                except PerftestError as exc:
                    errors["client"] = str(exc)

    trio.run(main)
    assert "did not negotiate RFC 6581 peer-to-peer mode" in errors["server"]
    assert "MPA-25 holds our first Write" in errors["server"]
    assert errors["client"].startswith("no RDMA Write from the peer within 1.0 s")
    assert "peer-to-peer" not in errors["client"]  # our client sent nothing held


def test_perftest_subprocess_pair_over_tcp() -> None:
    """``iwarp bench ib_send_lat`` server and client as two processes."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = str(probe.getsockname()[1])
    cmd = [sys.executable, "-m", "stack.cli.iwarp", "bench", "ib_send_lat", "-n", "10", "-p", port]
    server = subprocess.Popen([*cmd, "--bind", "127.0.0.1"], stdout=subprocess.PIPE, text=True)
    try:
        time.sleep(0.5)
        client = subprocess.run(
            [*cmd, "-d", "mlx5_0", "-x", "3", "127.0.0.1"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert client.returncode == 0, client.stderr
        assert "note: -d mlx5_0 does not apply" in client.stderr
        assert "note: -x 3 does not apply" in client.stderr
        out, _ = server.communicate(timeout=30)
        assert server.returncode == 0
        assert " 2      10 " in out and " 2      10 " in client.stdout
    finally:
        if server.poll() is None:
            server.kill()


# --------------------------------------------------------------------------- arguments


def _parse(*argv: str) -> Any:
    return build_parser("iwarp", "", COMMANDS, only="bench").parse_args(["bench", *argv])


def test_send_first_after_option() -> None:
    """ib_write_lat only; seconds, or never (None: MPA-25 kept); default 1 s."""
    default = options_from_args(_parse("ib_write_lat"), "write", latency=True)
    assert default.send_first_after == SEND_FIRST_AFTER == 1.0
    never = _parse("ib_write_lat", "--send-first-after", "never")
    assert options_from_args(never, "write", latency=True).send_first_after is None
    soon = _parse("ib_write_lat", "--send-first-after", "0.5")
    assert options_from_args(soon, "write", latency=True).send_first_after == 0.5


def test_device_options_are_accepted_not_taken_as_the_address() -> None:
    args = _parse("ib_write_bw", "-d", "siw0", "-i", "1", "-F", "-x", "3", "-R")
    assert args.server is None
    assert device_notes(args) == [
        "note: -d siw0 does not apply (no RDMA device: iWARP over TCP sockets)",
        "note: -i 1 does not apply (no RDMA device: iWARP over TCP sockets)",
        "note: -F does not apply (no RDMA device: iWARP over TCP sockets)",
        "note: -x 3 does not apply (no RDMA device: iWARP over TCP sockets)",
    ]
    opts = options_from_args(_parse("ib_write_bw", "-d", "siw0", "10.0.0.1"), "write")
    assert opts.host == "10.0.0.1"


def test_out_json_forms() -> None:
    assert _parse("ib_read_bw", "--out_json").out_json == "perftest_out.json"
    assert _parse("ib_read_bw", "--out_json=r.json").out_json == "r.json"
    args = _parse("ib_read_bw", "--out_json", "--out_json_file", "f.json", "10.0.0.1")
    opts = options_from_args(args, "read")
    assert (opts.out_json, opts.host) == ("f.json", "10.0.0.1")


BAD = [
    ["ib_write_bw", "-p", "65536"],
    ["ib_write_bw", "-p", "x"],
    ["ib_write_bw", "-n", "0"],
    ["ib_write_bw", "-n", "x"],
    ["ib_write_bw", "-s", "0"],
    ["ib_write_bw", "-s", "16M"],
    ["ib_write_bw", "-s", "x"],
    ["ib_write_bw", "-q", "0"],
    ["ib_write_bw", "-t", "0"],
    ["ib_write_bw", "-Q", "-1"],
    ["ib_write_bw", "-D", "0"],
    ["ib_write_bw", "-D", "-1"],
    ["ib_write_bw", "-D", "x"],
    ["ib_write_bw", "-D", "1", "-a"],
    ["ib_write_bw", "-D", "1", "-n", "5"],
    ["ib_write_bw", "--timeout", "0"],
    ["ib_write_bw", "--timeout", "-1"],
    ["ib_write_bw", "--first-fpdu-delay", "-1"],
    ["ib_write_bw", "--emss", "10"],
    ["ib_write_bw", "--out_json", "10.0.0.1"],
    ["ib_write_bw", "--out_json_file", ""],
    ["ib_write_bw", "-d"],
    ["ib_write_bw", "--bogus"],
    ["ib_write_bw", "a", "b"],
    ["ib_write_bw", " "],
    ["ib_send_bw", "-r", "0"],
    ["ib_read_bw", "-o", "0"],
    ["ib_atomic_bw", "-s", "64"],
    ["ib_atomic_bw", "-a"],
    ["ib_write_lat", "-D", "1"],
    ["ib_send_lat", "-q", "2"],
    ["ib_read_lat", "-n", "-3"],
    ["ib_read_lat", "--report_gbits"],
    ["ib_write_lat", "--send-first-after", "soon"],
    ["ib_write_lat", "--send-first-after", "-1"],
    ["ib_send_lat", "--send-first-after", "1"],
]


@pytest.mark.parametrize("argv", BAD, ids=" ".join)
def test_bad_values_exit_2_with_one_line(argv: list[str]) -> None:
    err = io.StringIO()
    with redirect_stderr(err):
        try:
            code = main(["bench", *argv])
        except SystemExit as exc:
            code = int(exc.code or 0)
    text = err.getvalue()
    assert code == 2, text
    assert text.startswith(f"iwarp bench {argv[0]}: error: "), text
    assert text.count("\n") == 1 and "Traceback" not in text
