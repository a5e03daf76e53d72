"""``iwarp dissect -i IFACE``: live decode, as ``tshark -i``, of real rping exchanges on lo.

The capture tests need CAP_NET_RAW (the suite runs as root here) and are skipped with the
reason otherwise; the command-line errors are checked everywhere.
"""

from __future__ import annotations

import json
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from stack.cli.iwarp import main
from stack.pcap import can_capture

REPO = Path(__file__).resolve().parents[2]
IWARP = [sys.executable, "-m", "stack.cli.iwarp"]
GUARD = 60.0
"""Seconds to wait for a child before giving up (a hang guard, not a speed check)."""
live = pytest.mark.skipif(
    not can_capture(), reason="live capture needs CAP_NET_RAW (AF_PACKET sockets, Linux)"
)
PDU_KEYS = ("type", "direction", "opcode_name", "stag", "to", "qn", "msn", "mo",
            "ddp_payload_len", "findings")  # fmt: skip
PING_PDUS = 7
"""PDUs of one rping iteration: two Sends each way, a Read Request and Response, a Write."""


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _listening(port: int) -> bool:
    """Whether a socket listens on ``port`` (read from /proc: no packet is sent)."""
    with open("/proc/net/tcp") as f:
        rows = [line.split() for line in f.readlines()[1:]]
    return any(int(r[1].split(":")[1], 16) == port and r[3] == "0A" for r in rows)


def _capture(*args: str) -> subprocess.Popen[bytes]:
    """``iwarp dissect ARGS`` once it says it is capturing."""
    proc = subprocess.Popen(
        [*IWARP, "dissect", *args], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    assert proc.stderr is not None
    ready, _, _ = select.select([proc.stderr], [], [], GUARD)
    line = proc.stderr.readline() if ready else b""
    if line != b"Capturing on 'lo'\n":
        proc.kill()
        out, err = proc.communicate()
        pytest.fail(f"no capture started: {(line + err).decode()}")
    return proc


def _rping(port: int, count: int, client_capture: Path) -> None:
    """A real rping exchange over loopback TCP: server and client processes."""
    where = ["-a", "127.0.0.1", "-p", str(port), "-C", str(count)]
    server = subprocess.Popen([*IWARP, "rping", "-s", *where], cwd=REPO)
    try:
        deadline = time.monotonic() + GUARD
        while not _listening(port):
            assert server.poll() is None and time.monotonic() < deadline, "rping -s did not listen"
            time.sleep(0.05)
        client = subprocess.run([*IWARP, "rping", "-c", *where, "-V", "-w", str(client_capture)],
                                cwd=REPO, timeout=GUARD, capture_output=True)  # fmt: skip
        assert client.returncode == 0, client.stderr.decode()
        assert server.wait(GUARD) == 0
    finally:
        server.kill()
        server.wait()


def _records(capsys: pytest.CaptureFixture[str], path: Path) -> list[dict[str, Any]]:
    assert main(["dissect", str(path), "--json"]) == 0
    return [json.loads(line) for line in capsys.readouterr().out.splitlines()]


def _by_direction(records: list[dict[str, Any]]) -> dict[str, list[tuple[Any, ...]]]:
    """Each direction's PDUs in order (the two directions interleave differently in the
    client's own capture and on the wire)."""
    out: dict[str, list[tuple[Any, ...]]] = {}
    for r in records:
        out.setdefault(r["direction"], []).append(tuple(r.get(k) for k in PDU_KEYS))
    return out


@live
def test_c_stops_after_n_pdus_decoded_as_the_client_recorded_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    port = _free_port()
    count = 2 + 2 * PING_PDUS  # MPA Request and Reply, two pings
    saved = tmp_path / "live.pcap"
    proc = _capture("-i", "lo", "-f", f"tcp port {port}", "-c", str(count), "--json",
                    "-w", str(saved))  # fmt: skip
    try:
        _rping(port, 2, tmp_path / "client.pcap")
        out, err = proc.communicate(timeout=GUARD)
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == 0, err.decode()
    records = [json.loads(line) for line in out.decode().splitlines()]
    assert len(records) == count and all(r["findings"] == [] for r in records)
    names = [r.get("opcode_name") for r in records]
    assert names.count("RDMA Read Request") == 2 and names.count("RDMA Write") == 2
    assert names.count("Send") == 8 and [r["type"] for r in records[:2]] == ["mpa_req", "mpa_rep"]
    assert all(isinstance(r["stag"], str) for r in records if r.get("tagged"))
    assert _by_direction(records) == _by_direction(_records(capsys, tmp_path / "client.pcap"))
    assert "packets captured" in err.decode() and b"Traceback" not in err
    # -w saved the capture itself: read back, it decodes to the same PDUs (microsecond
    # timestamps in the file)
    again = _records(capsys, saved)[:count]
    for live_rec, file_rec in zip(records, again, strict=True):
        assert abs(live_rec.pop("timestamp") - file_rec.pop("timestamp")) < 1e-6
        assert live_rec == file_rec


@live
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_ends_the_capture_with_the_statistics(tmp_path: Path, signum: int) -> None:
    port = _free_port()
    proc = _capture("-i", "lo", "-f", f"port {port}", "--json", "-z", "iwarp")
    assert proc.stdout is not None
    lines: list[bytes] = []
    try:
        _rping(port, 1, tmp_path / "client.pcap")
        while len(lines) < 2 + PING_PDUS:
            ready, _, _ = select.select([proc.stdout], [], [], GUARD)
            assert ready, f"only {len(lines)} PDUs decoded"
            lines.append(proc.stdout.readline())
        proc.send_signal(signum)
        out, err = proc.communicate(timeout=GUARD)
    finally:
        proc.kill()
        proc.wait()
    text = err.decode()
    assert proc.returncode == 0, text
    assert out == b"" and all(json.loads(line)["findings"] == [] for line in lines)
    assert "iWARP statistics" in text and f"PDUs shown: {2 + PING_PDUS}," in text
    assert "Findings: none" in text and "packets captured" in text
    assert "Traceback" not in text and "interrupted" not in text


def _error(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    try:
        status = main(["dissect", *args])
    except SystemExit as exc:
        status = int(exc.code or 0)
    assert status == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "Traceback" not in err
    return err


def test_command_line_errors_of_live_capture(capsys: pytest.CaptureFixture[str]) -> None:
    assert _error(capsys, "-i", "nosuch0") == (
        "iwarp dissect: error: no such interface 'nosuch0' (list: iwarp dissect -D)"
    )
    assert "give one source" in _error(capsys, "-i", "lo", str(REPO / "pcaps" / "reject.pcap"))
    assert "-f is the capture filter of -i" in _error(capsys, "-f", "port 1", "x.pcap")
    assert "bad capture filter: unsupported" in _error(capsys, "-i", "lo", "-f", "udp port 53")


def test_d_lists_the_interfaces(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["dissect", "-D"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "lo (Loopback)" in [line.split(". ", 1)[1] for line in lines]
    assert lines[-1].endswith(". any (Pseudo-device that captures on all interfaces)")
    assert [int(line.split(".")[0]) for line in lines] == list(range(1, len(lines) + 1))


def test_without_cap_net_raw_the_error_says_what_to_do() -> None:
    command = [*IWARP, "dissect", "-i", "lo"]
    if os.geteuid() == 0:  # root: run it with CAP_NET_RAW dropped
        setpriv = shutil.which("setpriv")
        if setpriv is None:
            pytest.skip("setpriv (util-linux) is needed to drop CAP_NET_RAW as root")
        command = [setpriv, "--bounding-set=-net_raw", "--inh-caps=-net_raw", "--", *command]
    elif can_capture():
        pytest.skip("this user has CAP_NET_RAW: no permission error to see")
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=GUARD)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr == (
        "iwarp dissect: error: capturing on lo needs CAP_NET_RAW (run as root or grant the "
        "capability), or pipe tcpdump: tcpdump -U -i lo -w - | iwarp dissect -\n"
    )


def _ignore_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)


@live
def test_sigint_ends_a_capture_started_with_sigint_ignored() -> None:
    """A background job of a non-interactive shell (nohup, CI) starts with SIGINT ignored;
    the capture still ends on it, with its statistics."""
    proc = subprocess.Popen(
        [*IWARP, "dissect", "-i", "lo", "-f", f"port {_free_port()}", "-z", "iwarp"],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        preexec_fn=_ignore_sigint,
    )
    try:
        assert proc.stderr is not None
        ready, _, _ = select.select([proc.stderr], [], [], GUARD)
        assert ready and proc.stderr.readline() == b"Capturing on 'lo'\n"
        proc.send_signal(signal.SIGINT)
        _out, err = proc.communicate(timeout=GUARD)
    finally:
        proc.kill()
        proc.wait()
    assert b"0 packets captured" in err and b"Traceback" not in err
