"""Unit tests of the siw VM harness that need no VM: the guest agent (run on the host, on
127.0.0.1), the agent client, siw knob parsing, the pcap check, the QEMU command line and
the build wrapper's failure paths."""

from __future__ import annotations

import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import stack.siwvm.image as build_mod
from stack.siwvm.agent import AgentClient
from stack.siwvm.errors import AgentError, BuildError, CaptureError, SiwVmError
from stack.siwvm.image import Artifacts, find_artifacts
from stack.siwvm.knobs import SIW_DEFAULTS, normalize, param_name, parse_kv
from stack.siwvm.net import AGENT_GUEST_PORT, free_port
from stack.siwvm.pcap import (
    check_capture,
    filter_tcp_ports,
    read_frames,
    stream_bytes,
    tcp_segments,
)
from stack.siwvm.vm import SiwVM

AGENT = Path(build_mod.FILES_DIR) / "guest-agent.py"


@pytest.fixture(scope="module")
def agent() -> Iterator[AgentClient]:
    """The guest agent running on the host, bound to 127.0.0.1 only."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, str(AGENT), str(port), "127.0.0.1"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    client = AgentClient(port)
    try:
        client.connect(timeout=15)
        yield client
    finally:
        client.close()
        proc.kill()
        proc.wait(10)
        assert proc.stdout is not None
        proc.stdout.close()


def test_agent_run_reports_rc_stdout_stderr(agent: AgentClient) -> None:
    reply = agent.request("run", cmd="echo out; echo err >&2; exit 3", timeout=10)
    assert (reply["rc"], reply["stdout"], reply["stderr"]) == (3, "out\n", "err\n")
    assert reply["timed_out"] is False


def test_agent_run_timeout_kills_the_process_group(agent: AgentClient) -> None:
    t0 = time.monotonic()
    reply = agent.request("run", cmd="echo a; sleep 30 & sleep 30", timeout=0.5)
    assert reply["timed_out"] is True and reply["rc"] is None and reply["stdout"] == "a\n"
    assert time.monotonic() - t0 < 30  # a hang guard, not a speed check


def test_agent_spawn_wait_signal_reap(agent: AgentClient, tmp_path: Path) -> None:
    log = str(tmp_path / "sub" / "job.log")
    pid = agent.request("spawn", cmd="echo hi; exit 5", timeout=10, log=log)["pid"]
    assert agent.request("wait", pid=pid, timeout=10) == {"rc": 5, "timed_out": False}
    assert Path(log).read_text() == "hi\n"
    pid = agent.request("spawn", cmd="sleep 30", timeout=30)["pid"]
    assert agent.request("wait", pid=pid, timeout=0.1)["rc"] is None
    agent.request("signal", pid=pid, sig=15)
    assert agent.request("wait", pid=pid, timeout=10)["rc"] == -15
    pid = agent.request("spawn", cmd="sleep 30", timeout=0.3)["pid"]
    reply = agent.request("wait", pid=pid, timeout=10)
    assert reply["timed_out"] is True and reply["rc"] is not None
    pid = agent.request("spawn", cmd="sleep 30", timeout=30)["pid"]
    assert pid in agent.request("reap")["killed"]


def test_agent_read_write_with_offset(agent: AgentClient, tmp_path: Path) -> None:
    import base64

    path = str(tmp_path / "f.bin")
    data = bytes(range(256)) * 4
    agent.request("write", path=path, data=base64.b64encode(data).decode())
    reply = agent.request("read", path=path, offset=1000, limit=100)
    assert base64.b64decode(reply["data"]) == data[1000:] and reply["size"] == len(data)
    assert agent.request("read", path=path, limit=0)["size"] == 1024


def test_agent_errors_come_back_and_it_keeps_serving(agent: AgentClient) -> None:
    with pytest.raises(AgentError, match="KeyError"):
        agent.request("no-such-op")
    with pytest.raises(AgentError, match="FileNotFoundError"):
        agent.request("read", path="/nonexistent/file")
    with pytest.raises(AgentError):
        agent.request("wait", pid=999999, timeout=1)
    assert agent.request("ping") == {}


def test_agent_client_serves_threads_in_parallel(agent: AgentClient, tmp_path: Path) -> None:
    """A long wait on one connection does not block another request (connection pool):
    the waited-for job ends only when a second request, sent meanwhile, releases it."""
    flag = tmp_path / "release"
    pid = agent.request("spawn", cmd=f"while [ ! -e {flag} ]; do sleep 0.05; done", timeout=30)[
        "pid"
    ]
    waited: list[dict[str, object]] = []
    thread = threading.Thread(
        target=lambda: waited.append(agent.request("wait", pid=pid, timeout=20))
    )
    thread.start()
    time.sleep(0.2)
    assert agent.request("run", cmd=f"touch {flag}", timeout=10)["rc"] == 0
    thread.join(40)
    assert waited == [{"rc": 0, "timed_out": False}]


def test_agent_client_unreachable_is_an_agent_error() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # bound, not listening: connect is refused
        with pytest.raises(AgentError):
            AgentClient(port).request("ping", reply_timeout=2)


def test_knob_names_aliases_and_values() -> None:
    assert param_name("crc_strict") == "mpa_crc_strict"
    assert param_name("p2p") == "peer_to_peer"
    assert normalize({"crc_required": True, "version": 1, "gso": "on", "nagle": 0}) == {
        "mpa_crc_required": "Y",
        "mpa_version": "1",
        "try_gso": "Y",
        "tcp_nagle": "N",
    }
    assert set(normalize(dict(SIW_DEFAULTS))) == set(SIW_DEFAULTS)
    for bad in ({"mpa_version": True}, {"mpa_version": "x"}, {"zcopy_tx": "maybe"}, {"x": 1}):
        with pytest.raises(SiwVmError):
            normalize(bad)  # type: ignore[arg-type]
    assert parse_kv(["crc_strict=Y", " p2p = 1"]) == {"crc_strict": "Y", "p2p": "1"}
    with pytest.raises(SiwVmError):
        parse_kv(["crc_strict"])


def _pcap(records: list[bytes], linktype: int = 1) -> bytes:
    out = struct.pack("<IHHiIII", 0xA1B2C3D4, 2, 4, 0, 0, 65535, linktype)
    for i, rec in enumerate(records):
        out += struct.pack("<IIII", i, 0, len(rec), len(rec)) + rec
    return out


def _tcp_frame(sport: int, dport: int, seq: int, payload: bytes) -> bytes:
    tcp = struct.pack(">HHIIBBHHH", sport, dport, seq, 0, 5 << 4, 0x18, 65535, 0, 0) + payload
    ip = struct.pack(">BBHHHBBH4s4s", 0x45, 0, 20 + len(tcp), 0, 0, 64, 6, 0,
                     bytes([10, 0, 2, 2]), bytes([10, 0, 2, 15]))  # fmt: skip
    return b"\0" * 12 + b"\x08\x00" + ip + tcp


def test_pcap_reader_and_stream_reassembly(tmp_path: Path) -> None:
    frames = [
        _tcp_frame(4000, 7174, 100, b"MPA ID "),
        _tcp_frame(4000, 7174, 107, b"Req Frame"),
        _tcp_frame(4000, 7174, 100, b"MPA ID "),  # retransmission
        _tcp_frame(7174, 4000, 900, b"reply"),
    ]
    path = tmp_path / "ok.pcap"
    path.write_bytes(_pcap(frames))
    read = read_frames(path)
    assert [f.linktype for f in read] == [1] * 4 and check_capture(path) == 4
    segments = tcp_segments(path)
    assert [s.dport for s in segments] == [7174, 7174, 7174, 4000]
    assert stream_bytes(segments, dport=7174) == b"MPA ID Req Frame"
    assert stream_bytes(segments, sport=7174) == b"reply"


def test_pcap_port_filter_keeps_what_tcp_port_would(tmp_path: Path) -> None:
    """QEMU's netdev dump has no capture filter: the harness keeps the frames tcpdump's
    ``tcp port P`` would have, and never the agent's."""
    arp = b"\xff" * 6 + b"\0" * 6 + b"\x08\x06" + b"\0" * 28
    frames = [
        _tcp_frame(4000, 7174, 1, b"wanted-1"),
        _tcp_frame(51000, AGENT_GUEST_PORT, 1, b"agent"),
        arp,
        _tcp_frame(7174, 4000, 9, b"wanted-2"),
        _tcp_frame(4001, 9999, 1, b"other"),
    ]
    src, dst = tmp_path / "raw.pcap", tmp_path / "kept.pcap"
    src.write_bytes(_pcap(frames))
    assert filter_tcp_ports(src, dst, ports=(7174,), exclude=(AGENT_GUEST_PORT,)) == 2
    kept = read_frames(dst)
    assert [bytes(r.data) for r in kept] == [frames[0], frames[3]]
    assert [r.timestamp for r in kept] == [0.0, 3.0]  # record headers kept as they were
    assert dst.read_bytes()[:24] == src.read_bytes()[:24]
    assert filter_tcp_ports(src, dst, exclude=(AGENT_GUEST_PORT,)) == 4  # ARP too
    assert [bytes(r.data) for r in read_frames(dst)] == [frames[0], arp, frames[3], frames[4]]
    src.write_bytes(_pcap(frames)[:-3])
    with pytest.raises(CaptureError, match="raw.pcap: file is cut short"):
        filter_tcp_ports(src, dst, ports=(7174,))
    assert not dst.exists()  # no half-written copy left behind


@pytest.mark.parametrize("cut", [3, 30, 50])
def test_pcap_reader_rejects_garbage_and_truncation(tmp_path: Path, cut: int) -> None:
    whole = _pcap([_tcp_frame(1, 2, 0, b"x" * 40)])
    path = tmp_path / "bad.pcap"
    path.write_bytes(whole[:cut])
    with pytest.raises(CaptureError, match="bad.pcap"):
        check_capture(path)
    path.write_bytes(b"not a pcap at all, just text....")
    with pytest.raises(CaptureError, match="bad.pcap: not a pcap"):
        read_frames(path)


def _fake_artifacts(tmp_path: Path) -> Artifacts:
    return Artifacts(
        kver="6.1.0-0-amd64",
        kernel=tmp_path / "vmlinuz",
        initrd=tmp_path / "initrd.gz",
        rootfs=tmp_path / "rootfs.ext4",
        siw_ko=tmp_path / "siw.ko",
        cache=tmp_path,
    )


def test_qemu_command_line_stays_on_loopback(tmp_path: Path) -> None:
    vm = SiwVM(
        _fake_artifacts(tmp_path),
        forwards=[(17000, 7174)],
        workdir=tmp_path / "w",
        accel="tcg",
        append="siw.mpa_crc_required=1",
    )
    argv = vm.qemu_argv()
    netdev = argv[argv.index("-netdev") + 1]
    rules = [part for part in netdev.split(",") if part.startswith("hostfwd=")]
    assert rules == [
        f"hostfwd=tcp:127.0.0.1:{vm.agent_port}-:{AGENT_GUEST_PORT}",
        "hostfwd=tcp:127.0.0.1:17000-:7174",
    ]
    assert netdev.startswith("user,")
    assert argv.count("-netdev") == 1 and "-net" not in argv
    drive = argv[argv.index("-drive") + 1]
    assert "snapshot=on" in drive and str(tmp_path / "rootfs.ext4") in drive
    cmdline = argv[argv.index("-append") + 1]
    assert "siwvm.agent=7000" in cmdline and "siw.mpa_crc_required=1" in cmdline
    assert argv[argv.index("-accel") + 1] == "tcg"
    with pytest.raises(SiwVmError, match="agent"):
        vm.hostfwd(AGENT_GUEST_PORT)
    vm.stop()  # never started: a no-op


def test_find_artifacts_without_a_build(tmp_path: Path) -> None:
    with pytest.raises(BuildError, match="iwarp siwvm build"):
        find_artifacts(tmp_path)
    (tmp_path / "current.env").write_text("KVER=6.1.0-0-amd64\n")
    with pytest.raises(BuildError, match="incomplete"):
        find_artifacts(tmp_path)


def test_build_failure_and_timeout_are_build_errors(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    script = tmp_path / "build.sh"
    script.write_text("echo step one; echo boom >&2; exit 4\n")
    monkeypatch.setattr(build_mod, "BUILD_SCRIPT", script)
    with pytest.raises(BuildError, match=r"(?s)exit status 4.*step one.*boom"):
        build_mod.build(tmp_path)
    script.write_text("echo started; sleep 60\n")
    t0 = time.monotonic()
    with pytest.raises(BuildError, match="timed out"):
        build_mod.build(tmp_path, timeout=1.0)
    assert time.monotonic() - t0 < 30  # a hang guard, not a speed check
