"""librdmacm example peers (rdma_server/rdma_client, ucmatose) talk to each other."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time

import pytest

from stack.cli.iwarp import main


def _free_port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return str(s.getsockname()[1])


def _run_pair(server_args: list[str], client_args: list[str], capsys) -> tuple[str, str]:  # noqa: ANN001
    server = subprocess.Popen(
        [sys.executable, "-m", "stack.cli.iwarp", *server_args], stdout=subprocess.PIPE, text=True
    )
    try:
        for _ in range(50):
            rc = main(client_args)
            out = capsys.readouterr().out
            if rc == 0 or "starting server" in out:
                break
            time.sleep(0.1)
        assert rc == 0, out
        server_out, _ = server.communicate(timeout=30)
        assert server.returncode == 0
        return out, server_out
    finally:
        if server.poll() is None:
            server.kill()


def test_rdma_server_and_client(capsys: pytest.CaptureFixture[str]) -> None:
    port = _free_port()
    client_out, server_out = _run_pair(
        ["rdma-server", "-s", "127.0.0.1", "-p", port],
        ["rdma-client", "-s", "127.0.0.1", "-p", port],
        capsys,
    )
    assert client_out.splitlines()[-1] == "rdma_client: end 0"
    assert server_out.splitlines() == ["rdma_server: start", "rdma_server: end 0"]


def test_cmatose_two_connections(capsys: pytest.CaptureFixture[str]) -> None:
    port = _free_port()
    args = ["-p", port, "-c", "2", "-C", "5", "-S", "300"]
    client_out, server_out = _run_pair(
        ["cmatose", "-b", "127.0.0.1", *args], ["cmatose", "-s", "127.0.0.1", *args], capsys
    )
    for out in (client_out, server_out):
        assert "data transfers complete" in out and out.rstrip().endswith("return status 0")
    assert "cmatose: disconnecting" in server_out


def test_rdma_client_without_server_fails_cleanly(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["rdma-client", "-s", "127.0.0.1", "-p", _free_port()]) == 1
    assert "rdma_client: end -1" in capsys.readouterr().out


def test_rdma_server_that_cannot_listen_says_so_in_one_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A busy port or an address not this host's: one error line, no traceback, status 1."""
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = str(busy.getsockname()[1])
        for where in (["-s", "127.0.0.1", "-p", port], ["-s", "203.0.113.9", "-p", port]):
            assert main(["rdma-server", *where]) == 1
            out, err = capsys.readouterr()
            assert out.splitlines()[-1] == "rdma_server: end -1"
            assert err.startswith(f"rdma_listen: {where[1]}:{port}: ")
            assert len(err.splitlines()) == 1 and "Traceback" not in err


def test_rdma_server_timeout_is_reported_as_timed_out() -> None:
    """A client that connects (MPA rev 2, no CRC) and never sends: the server gives up
    after --timeout and says so (the timeout error has no text of its own)."""
    from stack.interop.helpers import MpaSocketPeer, connect_local
    from stack.wire.events import CrcPolicy, MpaSettings

    port = _free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "stack.cli.iwarp", "rdma-server", "-s", "127.0.0.1", "-p", port,
         "--timeout", "0.5"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        for _ in range(100):
            try:
                sock = connect_local(int(port))
                break
            except OSError:
                time.sleep(0.1)
        with sock:
            peer = MpaSocketPeer.initiator(sock, MpaSettings(crc=CrcPolicy.OFF, ird=1, ord=1))
            peer.established()
            out, err = server.communicate(timeout=30)
        assert server.returncode == 1
        assert "rdma_server: timed out" in err and "rdma_server: end -1" in out
    finally:
        if server.poll() is None:
            server.kill()


def test_every_peer_tool_writes_our_sides_capture(
    tmp_path,
    capsys: pytest.CaptureFixture[str],  # noqa: ANN001
) -> None:
    """``-w FILE`` on rdma-server/rdma-client, cmatose and bench: each side's own pcap,
    decoded with zero findings."""
    port = _free_port()
    server_cap, client_cap = tmp_path / "s.pcap", tmp_path / "c.pcap"
    _run_pair(
        ["rdma-server", "-s", "127.0.0.1", "-p", port, "-w", str(server_cap)],
        ["rdma-client", "-s", "127.0.0.1", "-p", port, "-w", str(client_cap)],
        capsys,
    )
    port = _free_port()
    tose = tmp_path / "tose.pcap"
    args = ["-p", port, "-C", "3"]
    _run_pair(
        ["cmatose", "-b", "127.0.0.1", *args],
        ["cmatose", "-s", "127.0.0.1", *args, "-w", str(tose)],
        capsys,
    )
    bench = tmp_path / "bench.pcap"
    assert (
        main(["bench", "write", "-s", "4K", "-n", "8", "--in-process", "--quiet", "-w", str(bench)])
        == 0
    )
    for path, sends in ((server_cap, 2), (client_cap, 2), (tose, 6), (bench, 0)):
        capsys.readouterr()
        assert main(["dissect", str(path), "--json", "--fail-on-findings"]) == 0, path
        records = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
        assert sum(r.get("opcode_name") == "Send" for r in records) >= sends, path
        assert records, path


@pytest.mark.parametrize(
    "argv",
    [["rdma-server", "-s", "127.0.0.1"], ["rdma-client", "-s", "127.0.0.1"], ["cmatose"]],
    ids=" ".join,
)
def test_an_unusable_capture_is_refused_before_the_run(
    argv: list[str],
    tmp_path,  # noqa: ANN001
    capsys: pytest.CaptureFixture[str],
) -> None:
    """-w FILE is checked up front (check_outputs), as every command's outputs: no
    'rdma_server: start', no listening, no connection tried; one error line, status 2."""
    missing = tmp_path / "missing" / "x.pcap"
    assert main([*argv, "-p", _free_port(), "-w", str(missing)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == (
        f"iwarp {argv[0]}: error: -w {missing}: no such directory {missing.parent}\n"
    )


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full (Linux)")
def test_a_capture_that_cannot_be_written_is_one_error_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """-w FILE whose last records do not fit (a full disk): the client's exchange is done,
    then one error line naming the file and status 2, no traceback."""
    port = _free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "stack.cli.iwarp", "cmatose", "-b", "127.0.0.1", "-p", port],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        for _ in range(50):
            rc = main(["cmatose", "-s", "127.0.0.1", "-p", port, "-C", "2", "-w", "/dev/full"])
            captured = capsys.readouterr()
            if "data transfers complete" in captured.out:
                break
            time.sleep(0.1)
        assert rc == 2
        assert captured.err == (
            "iwarp cmatose: error: -w /dev/full: cannot write (No space left on device)\n"
        )
        server.communicate(timeout=30)
    finally:
        if server.poll() is None:
            server.kill()
