"""``iwarp rping``'s interop options: -P, -I, -d, -w, --timeout and checked arguments."""

from __future__ import annotations

import argparse
import io
import socket
import subprocess
import sys
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pytest
import trio

from stack.cli import build_parser, rping
from stack.cli.iwarp import COMMANDS, main
from stack.cli.rping import run_client, run_server
from stack.rnic import Rnic


def _args(*argv: str) -> argparse.Namespace:
    return build_parser("iwarp", "", COMMANDS, only="rping").parse_args(["rping", *argv])


def _exit_code(argv: list[str]) -> tuple[int, str]:
    """Run ``iwarp ARGV`` in-process: (exit status, stderr)."""
    err = io.StringIO()
    with redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as exc:
            code = int(exc.code or 0)
    return code, err.getvalue()


BAD_RPING = [
    ["-s", "-p", "0"],
    ["-s", "-p", "65536"],
    ["-s", "-p", "-1"],
    ["-s", "-p", "x"],
    ["-s", "--timeout", "0"],
    ["-s", "--timeout", "-1"],
    ["-s", "--timeout", "nan"],
    ["-s", "--timeout", "x"],
    ["-c", "-a", "127.0.0.1", "-C", "-1"],
    ["-c", "-a", "127.0.0.1", "-C", "x"],
    ["-c", "-a", "127.0.0.1", "-S", "3"],
    ["-c", "-a", "127.0.0.1", "-S", str(1 << 25)],
    ["-c", "-a", "127.0.0.1", "-S", "x"],
    ["-c", "-a", "127.0.0.1", "--mpa-rev", "3"],
    ["-c", "-a", "127.0.0.1", "--emss", "10"],
    ["-c", "-a", "127.0.0.1", "--emss", "x"],
    ["-c", "-a", "127.0.0.1", "--p2p", "atomic"],
    ["-c", "-a", "127.0.0.1", "--private-data", "x" * 600],
    ["-c", "-a", "127.0.0.1", "--first-fpdu-delay", "-1"],
    ["-c", "-a", "127.0.0.1", "--bogus"],
    ["-c"],
    ["-s", "-c", "-a", "127.0.0.1"],
    [],
    ["-c", "-a", "127.0.0.1", "-P"],
    ["-s", "-I", "127.0.0.1"],
]


@pytest.mark.parametrize("argv", BAD_RPING, ids=" ".join)
def test_bad_rping_values_exit_2_with_one_line(argv: list[str]) -> None:
    code, err = _exit_code(["rping", *argv])
    assert code == 2
    assert err.startswith("iwarp rping: error: ")
    assert err.count("\n") == 1 and "Traceback" not in err


def test_help_shows_the_defaults() -> None:
    out = io.StringIO()
    with redirect_stdout(out), pytest.raises(SystemExit):
        main(["rping", "--help"])
    text = out.getvalue()
    for default in ("default 7174", "default 64", "default 30", "default 0.2", "default 2"):
        assert default in text


async def _serve_and_ping(
    server_argv: list[str], clients: list[list[str]], settle: float = 0.0
) -> tuple[list[int], argparse.Namespace]:
    """Start a server on a free port, run ``clients`` at once; their exit statuses."""
    async with trio.open_nursery() as nursery:
        listening = trio.Event()
        port_box: list[int] = []

        async def serve() -> None:
            # find a free port the way the server itself would: bind 0 is not allowed (-p 1..)
            with trio.socket.socket() as probe:
                await probe.bind(("127.0.0.1", 0))
                port_box.append(probe.getsockname()[1])
            listening.set()
            with trio.fail_after(20):
                await run_server(
                    _args("-s", "-a", "127.0.0.1", "-p", str(port_box[0]), *server_argv)
                )

        nursery.start_soon(serve)
        await listening.wait()
        await trio.sleep(0.3)
        port = str(port_box[0])
        codes = [0] * len(clients)

        async def one(i: int, extra: list[str]) -> None:
            codes[i] = await run_client(_args("-c", "-a", "127.0.0.1", "-p", port, *extra))

        async with trio.open_nursery() as inner:
            for i, extra in enumerate(clients):
                inner.start_soon(one, i, extra)
        await trio.sleep(settle)  # the server's side of the last client ends
        if "-P" in server_argv:
            nursery.cancel_scope.cancel()  # a persistent server runs until interrupted
    return codes, _args("-s")


def test_persistent_server_serves_clients_concurrently_and_one_after_another() -> None:
    out = io.StringIO()
    with redirect_stdout(out):
        codes, _ = trio.run(
            _serve_and_ping, ["-P", "-v"], [["-C", "3", "-V"], ["-C", "2", "-V"], ["-C", "1"]]
        )
    assert codes == [0, 0, 0]
    assert out.getvalue().count("server ping data: rdma-ping-0") == 3
    assert out.getvalue().count("server ping data: rdma-ping-") == 6


def test_persistent_server_gives_back_each_clients_qp_and_memory(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A hostile-peer run found every client's QP and four MRs (two of ``-S`` octets) kept
    for ever by ``rping -s -P``: 8 MB per client at ``-S 4000000``."""
    made: list[Rnic] = []

    class Recorded(Rnic):
        def __init__(self, name: str) -> None:
            super().__init__(name)
            made.append(self)

    monkeypatch.setattr(rping, "Rnic", Recorded)
    with redirect_stdout(io.StringIO()):
        codes, _ = trio.run(
            _serve_and_ping, ["-P", "-S", "100000"], [["-C", "2", "-S", "100000"]] * 3, 0.5
        )
    assert codes == [0, 0, 0]
    server = made[0]  # made first, before any client's
    assert server.qps == {}
    assert server.table._regions == {}


def test_debug_prints_the_negotiated_mpa_and_the_source_address() -> None:
    err = io.StringIO()
    with redirect_stderr(err):
        codes, _ = trio.run(
            _serve_and_ping,
            ["-d", "--private-data", "hello", "--no-crc", "--p2p", "write"],
            [["-C", "1", "-d", "-I", "127.0.0.1", "--no-crc", "--p2p", "write"]],
        )
    text = err.getvalue()
    assert codes == [0]
    assert "MPA rev 2, CRC off" in text and "RTR WRITE" in text
    assert "MPA peer private data (5 bytes): b'hello'" in text
    assert "RDMA_CM_EVENT_CONNECT_REQUEST from 127.0.0.1" in text
    assert "server posted rdma read req" in text and "rdma_connect successful" in text


def test_debug_reports_the_terminate_received() -> None:
    err = io.StringIO()
    with redirect_stderr(err):
        codes, _ = trio.run(
            _serve_and_ping, ["-d", "--p2p", "write"], [["-C", "1", "-d", "--p2p", "send"]]
        )
    assert codes == [1]
    assert "Terminate received:" in err.getvalue() or "Terminate sent:" in err.getvalue()


def test_server_timeout_waiting_for_a_client() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = str(probe.getsockname()[1])
    err = io.StringIO()
    with redirect_stderr(err):
        code = trio.run(run_server, _args("-s", "-a", "127.0.0.1", "-p", port, "--timeout", "0.3"))
    assert code == 1
    assert "no client connected within 0.3 s" in err.getvalue()


def test_client_capture_decodes_with_zero_findings(tmp_path: Path) -> None:
    pcap = tmp_path / "rping.pcap"
    codes, _ = trio.run(_serve_and_ping, [], [["-C", "2", "-V", "-w", str(pcap)]])
    assert codes == [0]
    done = subprocess.run(
        [sys.executable, "-m", "stack.cli.iwarp", "dissect", "--fail-on-findings", str(pcap)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    assert "MPA Request" in out and "MPA Reply" in out
    assert out.count("RDMA Read Request") == 2 and out.count("RDMA Write") == 2
    assert out.count(" Send ") == 8  # two infos and two go-aheads per ping
