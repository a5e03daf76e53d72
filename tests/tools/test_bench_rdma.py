"""``iwarp bench write|read|send|atomic|server|idle-qps``: tiny runs end to end, no timing asserted.

The CLI runs in-process, with a spawned server process, and against a server started by
hand; the tables carry perftest's exact headers and every figure parses.  Helpers (sizes,
addresses, statistics, the peak window, the session request) are checked on known inputs.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys

import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st

from stack.bench import (
    BenchError,
    BenchOptions,
    BenchServer,
    Client,
    Progress,
    SessionSpec,
    latency_stats,
    measure_bw,
    parse_size,
    peak_rate,
)
from stack.bench.cli import parse_host_port
from stack.cli.iwarp import main
from stack.rnic import MemoryRegion, Rnic
from stack.transport.cm import ConnectionManager, ConnectRejected
from stack.wire.markers import mulpdu_for
from tests.tools.bench_helpers import bench_client

# perftest's strings, spelled out here independently of the module's constants.
DASHES = "-" * 87
BW_HEADER = " #bytes     #iterations    BW peak[MB/sec]    BW average[MB/sec]   MsgRate[Mpps]"
LAT_HEADER = (
    " #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]    "
    "t_stdev[usec]   99% percentile[usec]   99.9% percentile[usec] "
)
BW_BASELINE_HEADER = "  raw TCP[MB/sec]   ratio   blocking[MB/sec]   ratio_blk"
LAT_BASELINE_HEADER = "  raw t_typical[usec]   ratio   blocking t_typical[usec]   ratio_blk"


def run_cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["bench", *args, "--quiet"])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def table_rows(out: str, header: str) -> list[list[float]]:
    """The numeric rows under ``header`` (up to the closing dashed line).

    CPU columns (``client/server`` or ``total(both)``) are left out; see :func:`cpu_cells`.
    """
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(header))
    rows = []
    for line in lines[start + 1 :]:
        if line == DASHES:
            break
        rows.append([float(v) for v in line.split() if "/" not in v and "(" not in v])
    return rows


def cpu_cells(out: str, header: str) -> list[tuple[float, float | None]]:
    """The CPU cells of the first row: (client, server) or (total, None) per cell."""
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(header))
    cells: list[tuple[float, float | None]] = []
    for v in lines[start + 1].split():
        if v.endswith("(both)"):
            cells.append((float(v.removesuffix("(both)")), None))
        elif "/" in v:
            client, server = v.split("/")
            cells.append((float(client), float(server)))
    return cells


def header_value(out: str, name: str) -> str:
    match = re.search(rf"(?:^ |\s{{2,}}){re.escape(name)}\s*: (.*?)(?:\s{{2,}}|$)", out, re.M)
    assert match, f"no {name!r} in the header block"
    return match.group(1).strip()


# --------------------------------------------------------------------------- bandwidth


def test_write_bw_in_process_prints_perftest_table_and_baseline_ratio(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, _err = run_cli(capsys, "write", "-s", "1K", "-n", "40", "--in-process", "--baseline")
    assert code == 0
    lines = out.splitlines()
    assert lines[0] == DASHES and lines[-1] == DASHES
    assert lines[1].strip() == "RDMA_Write BW Test"
    assert BW_HEADER + BW_BASELINE_HEADER in lines
    assert "ratio_blk" in BW_BASELINE_HEADER and "iWARP / blocking sockets" in out
    assert header_value(out, "Connection type") == "RC"
    assert "Transport type : iWARP (userspace, TCP)" in out
    assert header_value(out, "CRC") == "ON"
    assert header_value(out, "TX depth") == "128"
    # perftest's 100, capped at half the tx depth (stack.bench.options.default_cq_mod)
    assert header_value(out, "CQ Moderation") == "64"
    # No --mtu: the EMSS is the connected socket's MSS, and the MULPDU follows it (MPA-13).
    mtu = re.fullmatch(
        r"(\d+)\[B\] at connect \(EMSS: the socket's MSS, followed\), MULPDU (\d+)\[B\]",
        header_value(out, "Mtu"),
    )
    assert mtu, header_value(out, "Mtu")
    emss, mulpdu = mtu.groups()
    assert int(mulpdu) == mulpdu_for(int(emss), markers=False)
    [row] = table_rows(out, BW_HEADER)
    size, iters, peak, avg, mpps, raw, ratio, blocking, ratio_blk = row
    assert (size, iters) == (1024, 40)
    assert peak >= avg > 0 and mpps > 0 and raw > 0 and blocking > 0
    assert ratio == pytest.approx(avg / raw, rel=0.02, abs=0.01)
    assert ratio_blk == pytest.approx(avg / blocking, rel=0.02, abs=0.01)
    assert mpps * 1e6 * 1024 / 2**20 == pytest.approx(avg, rel=0.01)


def test_cpu_columns_in_one_process_count_both_ends(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _err = run_cli(capsys, "send", "--lat", "-n", "20", "--in-process", "--cpu")
    assert code == 0
    assert LAT_HEADER + "   CPU cli/srv[usec/msg]" in out.splitlines()
    [row] = table_rows(out, LAT_HEADER)
    assert len(row) == 9
    [(total, server)] = cpu_cells(out, LAT_HEADER)
    assert total > 0 and server is None


@pytest.mark.parametrize(
    ("test", "args", "size"),
    [
        ("read", ["-s", "3000"], 3000),
        ("send", ["-s", "100"], 100),
        ("atomic", [], 8),
    ],
)
def test_bw_tests_in_process(
    capsys: pytest.CaptureFixture[str], test: str, args: list[str], size: int
) -> None:
    code, out, _err = run_cli(capsys, test, *args, "-n", "30", "-t", "8", "--in-process")
    assert code == 0
    assert BW_HEADER in out.splitlines()
    [row] = table_rows(out, BW_HEADER)
    assert row[:2] == [size, 30] and len(row) == 5
    assert all(v > 0 for v in row)
    if test in ("read", "atomic"):
        assert header_value(out, "Outstand reads") == "8"


def test_post_lists_cq_moderation_and_several_qps(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _err = run_cli(
        capsys,
        "write",
        "-s",
        "64",
        "-n",
        "50",
        "-q",
        "3",
        "-t",
        "16",
        "--post-list",
        "8",
        "--cq-mod",
        "4",
        "--in-process",
        "--baseline",
    )
    assert code == 0
    assert header_value(out, "Number of qps") == "3"
    assert header_value(out, "Post list") == "8"
    assert header_value(out, "CQ Moderation") == "4"
    [row] = table_rows(out, BW_HEADER)
    assert row[:2] == [64, 50]  # per QP, as perftest prints it
    assert row[-1] > 0


@pytest.mark.parametrize(
    ("tx_depth", "expected"), [(128, 64), (512, 100), (201, 100), (8, 4), (3, 1), (1, 1)]
)
def test_the_default_cq_moderation_is_perftests_at_most_half_the_window(
    capsys: pytest.CaptureFixture[str], tx_depth: int, expected: int
) -> None:
    code = main(["bench", "write", "-s", "64", "-n", "8", "-t", str(tx_depth), "--in-process"])
    out = capsys.readouterr().out
    assert code == 0
    [line] = [line for line in out.splitlines() if line.startswith(" CQ Moderation")]
    assert line.split(":")[1].strip() == str(expected)


def test_duration_mode_counts_what_it_did(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _err = run_cli(
        capsys, "send", "-s", "256", "-D", "0.3", "--cq-mod", "7", "--in-process"
    )
    assert code == 0
    [row] = table_rows(out, BW_HEADER)
    assert row[1] >= 1 and row[3] > 0


def test_crc_off_and_markers_show_in_the_header(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _err = run_cli(
        capsys,
        "write",
        "-s",
        "2K",
        "-n",
        "20",
        "--no-crc",
        "--markers",
        "--in-process",
        "-m",
        "1448",
    )
    assert code == 0
    assert header_value(out, "CRC") == "OFF"
    assert header_value(out, "Markers") == "ON (to server), ON (to client)"
    # Markers take 4 bytes per 512 of the EMSS (MPA-13).
    assert header_value(out, "Mtu") == "1448[B] (EMSS), MULPDU 1430[B]"


async def test_rdmap_13_write_bandwidth_ends_when_the_data_is_at_the_target() -> None:
    """Local Write completions come at hand-off; the closing zero-length Read (RDMAP-07)
    cannot pass the Writes (RDMAP-13), so when measure_bw returns the bytes are placed."""
    size, iters = 4 << 20, 1  # one Write, far bigger than a socket buffer
    opts = BenchOptions("write", (size,), iters=iters, tx_depth=1, cq_mod=1, progress=False)
    server = BenchServer()
    async with trio.open_nursery() as nursery:
        port, _raw = await nursery.start(server.run)
        async with ConnectionManager.open(Rnic("client")) as cm:
            client = Client(cm, "127.0.0.1", port)
            [c] = await client.connect_many(
                SessionSpec("write", size), opts.mpa_settings, 1, tx_depth=1, ord=1
            )
            assert c.local is not None
            c.local.buf[:] = bytes(range(256)) * (size // 256)
            target = server.rnic.table.lookup(c.advert.rkey)
            assert isinstance(target, MemoryRegion)
            start = c.advert.addr - target.base
            assert bytes(target.buf[start : start + size]) == bytes(size)
            result = await measure_bw([c], opts, size, Progress(None))
            assert bytes(target.buf[start : start + size]) == bytes(c.local.buf)
            assert result.messages == iters
            await client.close([c])
        nursery.cancel_scope.cancel()


# --------------------------------------------------------------------------- latency


@pytest.mark.parametrize(
    ("test", "title", "size"),
    [
        ("write", "RDMA_Write Latency Test", 64),
        ("read", "RDMA_Read Latency Test", 64),
        ("send", "Send Latency Test", 64),
        ("atomic", "Atomic FETCH_AND_ADD Latency Test", 8),
    ],
)
def test_latency_in_process_with_baseline(
    capsys: pytest.CaptureFixture[str], test: str, title: str, size: int
) -> None:
    args = [test, "--lat", "-n", "25", "--in-process", "--baseline"]
    if test != "atomic":
        args += ["-s", str(size)]
    code, out, _err = run_cli(capsys, *args)
    assert code == 0
    lines = out.splitlines()
    assert lines[1].strip() == title
    assert LAT_HEADER + LAT_BASELINE_HEADER in lines
    [row] = table_rows(out, LAT_HEADER)
    assert len(row) == 13
    b, n, t_min, t_max, typical, avg, stdev, p99, p999, raw, ratio, blocking, ratio_blk = row
    assert blocking > 0 and ratio_blk == pytest.approx(typical / blocking, rel=0.05, abs=0.01)
    assert (b, n) == (size, 25)
    assert 0 < t_min <= typical <= t_max and t_min <= avg <= t_max
    assert t_min <= p99 <= p999 <= t_max and stdev >= 0
    assert raw > 0 and ratio == pytest.approx(typical / raw, rel=0.05, abs=0.01)


# --------------------------------------------------------------------------- process layouts


def test_two_processes_by_default(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _err = run_cli(capsys, "read", "-s", "4K", "-n", "30", "--baseline", "--cpu")
    assert code == 0
    server = header_value(out, "Server")
    match = re.fullmatch(r"127\.0\.0\.1:\d+ \(process (\d+)\)", server)
    assert match and int(match.group(1)) != os.getpid()
    header = BW_HEADER + BW_BASELINE_HEADER + "   CPU cli/srv[usec/msg]"
    [row] = table_rows(out, header)
    assert row[:2] == [4096, 30] and row[-1] > 0
    # Both processes did measurable work per message, for iWARP and for raw TCP.
    cells = cpu_cells(out, header)
    assert len(cells) == 2 and all(c > 0 and s is not None and s > 0 for c, s in cells)


def test_server_and_client_run_by_hand(capsys: pytest.CaptureFixture[str]) -> None:
    server = subprocess.Popen(
        [sys.executable, "-m", "stack.cli.iwarp", "bench", "write", "--server", "-p", "0"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert server.stdout is not None
        words = server.stdout.readline().split()
        assert words[0] == "PORT"
        port = int(words[1])
        for test in ("send", "write"):
            code, out, _err = run_cli(
                capsys, test, "--connect", f"127.0.0.1:{port}", "-s", "100", "-n", "20"
            )
            assert code == 0
            assert header_value(out, "Server") == f"127.0.0.1:{port} (run by hand)"
            assert table_rows(out, BW_HEADER)[0][:2] == [100, 20]
    finally:
        server.terminate()
        server.wait(10)


def test_connect_to_nothing_is_one_error_line(capsys: pytest.CaptureFixture[str]) -> None:
    with trio_socket_port() as port:  # bound, not listening: refused
        code, out, err = run_cli(capsys, "write", "--connect", f"127.0.0.1:{port}", "-n", "1")
    assert code == 1
    assert err.count("\n") == 1 and err.startswith("iwarp bench write: error: cannot connect")


class trio_socket_port:  # noqa: N801 - a tiny context manager
    """A local port that refuses connections."""

    def __enter__(self) -> int:
        import socket

        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        return self.sock.getsockname()[1]

    def __exit__(self, *exc: object) -> None:
        self.sock.close()


# --------------------------------------------------------------------------- idle QPs


@pytest.mark.parametrize("layout", ["--in-process", None])
def test_idle_qps_reports_rss_per_qp(
    capsys: pytest.CaptureFixture[str], layout: str | None
) -> None:
    args = ["idle-qps", "-q", "6", "--parallel", "4"]
    code = main(["bench", *args, *([layout] if layout else [])])
    out = capsys.readouterr().out
    assert code == 0
    header = " #qps     server RSS before[KiB]   server RSS after[KiB]   per QP[KiB]"
    [row] = table_rows(out, header)
    qps, before, after, per_qp, _client = row
    assert qps == 6 and before > 0 and after > 0
    assert per_qp == pytest.approx((after - before) / 6, abs=0.5)
    assert ("both ends counted" in out) == (layout == "--in-process")


# --------------------------------------------------------------------------- bad arguments


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["write", "-s", "0"], "size must be 1"),
        (["write", "-s", "lots"], "invalid size"),
        (["write", "-s", "64", "-a"], "not allowed with argument"),
        (["write", "-n", "0"], "must be >= 1"),
        (["write", "-n", "5", "-D", "1"], "not allowed with argument"),
        (["write", "-D", "nan"], "invalid number of seconds"),
        (["read", "--lat", "-q", "2"], "-q must be 1"),
        (["read", "--lat", "--post-list", "4"], "--post-list applies"),
        (["write", "-t", "8", "--post-list", "16"], "exceeds the tx depth"),
        (["write", "-t", "8", "--cq-mod", "9"], "exceeds the tx depth"),
        (["write", "--rx-depth", "9"], "applies to the send test"),
        (["atomic", "-a"], "atomic operations are 8 bytes"),
        (["atomic", "-s", "16"], "atomic operations are 8 bytes"),
        (["write", "--connect", "host:http"], "invalid port"),
        (["write", "--connect", "h:1", "--in-process"], "not allowed with argument"),
        (["write", "-m", "10"], "EMSS must be"),
        (["write", "--bogus"], "unrecognized arguments: --bogus"),
        (["idle-qps", "-q", "-3"], "must be >= 1"),
        (["server", "-p", "70000"], "port must be"),
        (["read", "--blocking"], "--blocking applies to latency tests"),
        (["write", "--lat", "--blocking", "-w", "x.pcap"], "not with --blocking"),
    ],
)
def test_bad_arguments_give_one_error_line_and_status_2(
    capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    code: str | int | None
    try:
        code = main(["bench", *args])
    except SystemExit as exc:
        code = exc.code
    err = capsys.readouterr().err
    assert code == 2
    assert err.count("\n") == 1 and "error: " in err and message in err, err


# --------------------------------------------------------------------------- helpers


@pytest.mark.parametrize(
    ("text", "value"),
    [("64", 64), ("4K", 4096), ("1M", 1 << 20), ("1MiB", 1 << 20), ("2kb", 2048), ("1G", 1 << 30)],
)
def test_parse_size(text: str, value: int) -> None:
    assert parse_size(text) == value


def test_parse_host_port() -> None:
    assert parse_host_port("example") == ("example", 18515)
    assert parse_host_port("10.0.0.1:7000") == ("10.0.0.1", 7000)
    assert parse_host_port("[::1]:9") == ("::1", 9)
    assert parse_host_port("[::1]") == ("::1", 18515)
    with pytest.raises(argparse.ArgumentTypeError, match="1 to 65535 to connect to"):
        parse_host_port("10.0.0.1:0")


def test_latency_stats_follow_perftests_definitions() -> None:
    r = latency_stats(64, [i * 1e-6 for i in range(1000, 0, -1)])  # 1..1000 us, unsorted
    assert (r.iterations, r.t_min, r.t_max) == (1000, pytest.approx(1), pytest.approx(1000))
    assert r.t_typical == pytest.approx(500.5)
    assert r.t_avg == pytest.approx(500.5)
    assert r.p99 == pytest.approx(990) and r.p999 == pytest.approx(999)
    assert r.t_stdev == pytest.approx(288.67, abs=0.01)


def test_peak_rate_is_the_best_window_over_merged_qps() -> None:
    # QP 0 completes 10 messages per second, QP 1 is idle for 1 s then does 40 in 1 s.
    qp0 = [(t, 10 * t) for t in range(1, 5)]
    qp1 = [(2.0, 40)]
    # Aggregate points: (0,0) (1,10) (2,60) (3,70) (4,80); windows of >= 40 messages.
    assert peak_rate([qp0, qp1], 0.0, 40) == pytest.approx(50.0)  # 1 s -> 2 s
    assert peak_rate([qp0, qp1], 0.0, 1000) == 0.0


def test_session_spec_round_trip() -> None:
    spec = SessionSpec("write", 4096, True, 0, (0x1234, 0x7F0000001000, 4096))
    assert SessionSpec.decode(spec.encode()) == spec
    assert len(SessionSpec("send", 1 << 23, False, 20000).encode()) < 512  # MPA limit


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=64) | st.text(max_size=64).map(str.encode))
def test_malformed_session_requests_raise_bench_error_only(data: bytes) -> None:
    try:
        SessionSpec.decode(data)
    except BenchError:
        pass


async def test_server_rejects_a_malformed_session_request() -> None:
    async with bench_client() as client:
        rnic = client.rnic
        qp = rnic.create_qp(rnic.alloc_pd(), rnic.create_cq())
        with pytest.raises(ConnectRejected) as info:
            await client.cm.connect(
                client.host, client.port, qp, private_data=b'{"t": "fly", "s": 1}'
            )
        assert b"unknown test" in info.value.private_data


async def test_raw_port_survives_garbage_and_answers_stats() -> None:
    async with bench_client() as client:
        qps = await client.connect_many(
            SessionSpec("idle", 0),
            BenchOptions("write", (1,)).mpa_settings,
            2,
            tx_depth=1,
            ord=1,
        )
        junk = await trio.open_tcp_stream(client.host, client.raw_port)
        await junk.send_all(b"GET / HTTP/1.0\r\n\r\n")
        try:
            answer = await junk.receive_some(100)
        except trio.BrokenResourceError:  # reset: closed without lingering
            answer = b""
        assert answer == b""  # nothing served on a bad magic
        await junk.aclose()
        stats = await client.server_stats()
        assert stats["qps"] == 2 and stats["rss"] > 0
        await client.close(qps)
