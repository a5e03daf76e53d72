"""``iwarp rping`` client and server talk the rping protocol to each other."""

from __future__ import annotations

import socket
import subprocess
import sys
import time

import pytest

from stack.cli.iwarp import main
from stack.cli.rping import ping_pattern


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_ping_pattern_matches_rping() -> None:
    assert ping_pattern(0, 24) == b"rdma-ping-0: ABCDEFGHIJ\0"
    assert ping_pattern(1, 20)[13:18] == b"BCDEF"
    assert ping_pattern(58, 20)[14] == ord("A")  # the start letter wraps after 'z'


@pytest.mark.parametrize(
    "extra",
    [[], ["--mpa-rev", "1"], ["--no-crc"], ["--markers"], ["--p2p", "read"], ["-S", "5000"]],
)
def test_rping_client_and_server(extra: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    port = str(_free_port())
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "stack.cli.iwarp",
            "rping",
            "-s",
            "-a",
            "127.0.0.1",
            "-p",
            port,
            "-v",
            *extra,
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        rc = 1
        for _attempt in range(50):  # wait for the server to listen
            rc = main(["rping", "-c", "-a", "127.0.0.1", "-p", port, "-C", "3", "-v", "-V", *extra])
            if rc == 0 or "connect error" not in capsys.readouterr().err:
                break
            time.sleep(0.1)
        assert rc == 0
        out, _ = server.communicate(timeout=20)
        assert server.returncode == 0
        assert out.count("server ping data: rdma-ping-") == 3
    finally:
        if server.poll() is None:
            server.kill()


def test_rping_bad_arguments_are_one_line_errors(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["rping", "-c"]) == 2
    assert "needs -a" in capsys.readouterr().err
    assert main(["rping", "-s", "-c", "-a", "x"]) == 2
    assert main(["rping", "-c", "-a", "127.0.0.1", "-S", "3"]) == 2


def test_erc_09_server_reports_the_peer_terminate(capsys: pytest.CaptureFixture[str]) -> None:
    """Client offers only a Send RTR, server only Write: the client's Terminate 2/0/7 makes
    the server exit 1 with the Terminate on stderr (not a silent 0)."""
    port = str(_free_port())
    server = subprocess.Popen(
        [sys.executable, "-m", "stack.cli.iwarp", "rping", "-s", "-a", "127.0.0.1", "-p", port,
         "--p2p", "write", "--timeout", "10"],
        stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        for _attempt in range(50):  # wait for the server to listen
            rc = main(["rping", "-c", "-a", "127.0.0.1", "-p", port, "-C", "1", "--p2p", "send"])
            err = capsys.readouterr().err
            if "TCP connect" not in err:
                break
            time.sleep(0.1)
        assert rc == 1 and "ERC-09" in err
        _, server_err = server.communicate(timeout=20)
        assert server.returncode == 1
        assert "peer sent Terminate" in server_err and "code=7" in server_err
    finally:
        if server.poll() is None:
            server.kill()


def test_rping_server_reports_a_connection_reset_mid_transfer() -> None:
    """A client that resets the connection after the MPA startup is an error (exit 1), not
    a normal end of the ping loop."""
    import struct

    from stack.wire.connection import IwarpConnection
    from stack.wire.events import Established, NeedData, Role

    port = _free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "stack.cli.iwarp", "rping", "-s", "-a", "127.0.0.1",
         "-p", str(port)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        for _attempt in range(100):
            try:
                sock = socket.create_connection(("127.0.0.1", port), timeout=5)
                break
            except OSError:
                time.sleep(0.05)
        engine = IwarpConnection(Role.INITIATOR)
        engine.initiate(0.0)
        sock.sendall(engine.data_to_send())
        established = False
        while not established:
            engine.receive_data(sock.recv(65536))
            while not isinstance(event := engine.next_event(), NeedData):
                established = established or isinstance(event, Established)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        sock.close()  # RST
        _out, err = server.communicate(timeout=20)
        assert server.returncode == 1, err
        assert err.startswith("rping: ")
    finally:
        server.kill()
        server.wait()
