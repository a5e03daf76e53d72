"""Smoke tests of the siw guest and its harness: boot, device, knobs, agent, forwarding,
siw<->siw rping inside the guest, and captures that come out as valid pcaps."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from stack.constants import MPA_KEY_REP, MPA_KEY_REQ
from stack.interop.helpers import assert_clean_capture, listen_local
from stack.siwvm import (
    GUEST_ADDR,
    HOST_ADDR,
    SIW_DEFAULTS,
    BootError,
    CaptureError,
    GuestTimeout,
    SiwVM,
    SiwVmError,
)
from stack.siwvm.pcap import read_frames, stream_bytes, tcp_segments

pytestmark = pytest.mark.interop

REPO = Path(__file__).resolve().parents[3]  # where the stack package is importable


def test_guest_boots_with_siw_device(vm: SiwVM) -> None:
    link = vm.run("rdma link show", check=True).stdout
    assert "siw0" in link and "netdev eth0" in link and "ACTIVE" in link
    devices = vm.run("ibv_devices", check=True).stdout
    assert "siw0" in devices
    assert vm.run("uname -r", check=True).stdout.strip() == vm.artifacts.kver
    assert (vm.boot_seconds or 0) > 0


def test_guest_network_stays_on_slirp(vm: SiwVM) -> None:
    """The guest has no default route: only the QEMU user-network subnet is reachable."""
    addrs = vm.run("ip -4 -o addr show dev eth0", check=True).stdout
    assert f"{GUEST_ADDR}/24" in addrs
    assert "default" not in vm.run("ip route show", check=True).stdout
    off_subnet = vm.run("ip route get 192.0.2.1", timeout=10)
    assert not off_subnet.ok, off_subnet.output


def test_siw_knobs_set_read_back_and_reset(vm: SiwVM) -> None:
    assert vm.siw_params() == {**SIW_DEFAULTS, "zcopy_tx": "N"}
    previous = vm.set_siw(crc_required=True, crc_strict=True, p2p=True, mpa_version=1)
    assert previous == {
        "mpa_crc_required": "N",
        "mpa_crc_strict": "N",
        "peer_to_peer": "N",
        "mpa_version": "2",
    }
    vm.set_siw(try_gso="Y", tcp_nagle=1)
    params = vm.siw_params()
    for name in ("mpa_crc_required", "mpa_crc_strict", "peer_to_peer", "try_gso", "tcp_nagle"):
        assert params[name] == "Y", name
    assert params["mpa_version"] == "1"
    vm.reset_siw()
    assert vm.siw_params() == SIW_DEFAULTS
    with pytest.raises(SiwVmError):
        vm.set_siw(no_such_knob=True)
    with pytest.raises(SiwVmError):
        vm.set_siw(mpa_version="two")


def test_agent_foreground_timeout_kills_the_command(vm: SiwVM) -> None:
    result = vm.run("echo started; sleep 60", timeout=1.0)
    assert result.timed_out and result.rc is None
    assert "started" in result.stdout
    with pytest.raises(GuestTimeout):
        result.check()


def test_agent_background_deadline_and_output(vm: SiwVM) -> None:
    job = vm.run("echo out; echo err >&2; sleep 60", background=True, timeout=1.0)
    rc = job.wait(15)
    assert rc != 0 and job.timed_out
    assert "out" in job.output() and "err" in job.output()
    quick = vm.run("exit 7", background=True)
    assert quick.wait(15) == 7
    long = vm.run("sleep 60", background=True)
    assert long.poll() is None
    assert long.pid in vm.reap()


def test_guest_reaches_host_as_10_0_2_2(vm: SiwVM) -> None:
    srv, port = listen_local()
    received: list[bytes] = []

    def serve() -> None:
        with srv:
            conn, _ = srv.accept()
            with conn:
                conn.settimeout(20)
                received.append(conn.recv(100))

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    vm.run(f"echo -n hello-host | nc -q 1 -w 10 {HOST_ADDR} {port}", timeout=20, check=True)
    thread.join(25)
    assert received == [b"hello-host"]


def test_hostfwd_reaches_guest_listener(vm: SiwVM) -> None:
    guest_port = 7180
    host_port = vm.hostfwd(guest_port)
    assert vm.hostfwd(guest_port) == host_port  # idempotent
    listener = vm.run(f"nc -l -p {guest_port} -w 10", background=True, timeout=20)
    vm.wait_listen(guest_port)
    with socket.create_connection(("127.0.0.1", host_port), timeout=10) as sock:
        sock.sendall(b"hello-guest")
    assert listener.wait(15) == 0
    assert listener.output() == "hello-guest"


def test_netdev_capture_is_lossless_and_filtered(vm: SiwVM, case: str) -> None:
    """QEMU's dump of the guest NIC holds every byte of a 2 MB transfer (a tcpdump capture
    inside it, taken at the same time, is checked only to be consistent with it), and
    nothing but the chosen port."""
    guest_port = 7181
    host_port = vm.hostfwd(guest_port)
    payload = bytes(range(256)) * 8192
    sink = "/tmp/netdev-sink"
    with vm.capture(case, ports=(guest_port,)) as pcap:
        with vm.capture(case + "-tcpdump", ports=(guest_port,), via="tcpdump") as inner:
            listener = vm.run(f"nc -l -p {guest_port} -w 20 > {sink}", background=True, timeout=60)
            vm.wait_listen(guest_port)
            with socket.create_connection(("127.0.0.1", host_port), timeout=20) as sock:
                sock.sendall(payload)
            assert listener.wait(40) == 0, listener.output()
    assert vm.file_size(sink) == len(payload)
    segments = tcp_segments(pcap)
    assert segments and all(guest_port in (s.sport, s.dport) for s in segments)
    assert stream_bytes(segments, dport=guest_port) == payload
    # Both see the same TCP connection (the guest's side of slirp), so the same sequence
    # numbers: every segment tcpdump did catch carries the bytes at its offset.
    base = next(s.seq for s in segments if s.dport == guest_port and s.payload)
    caught = [s for s in tcp_segments(inner) if s.dport == guest_port and s.payload]
    assert caught
    for seg in caught:
        rel = (seg.seq - base) & 0xFFFFFFFF
        assert payload[rel : rel + len(seg.payload)] == seg.payload


def test_capture_arguments_are_checked(vm: SiwVM, case: str) -> None:
    for kwargs in ({"iface": "lo", "via": "netdev"}, {"bpf": "udp"}, {"via": "pcap"}):
        with pytest.raises(CaptureError), vm.capture(case, **kwargs):  # type: ignore[arg-type]
            pass


def test_guest_to_guest_rping_over_siw_with_capture(vm: SiwVM, case: str) -> None:
    with vm.capture(case, iface="lo", ports=(7174,)) as pcap:
        server = vm.run(f"rping -s -a {GUEST_ADDR} -p 7174 -C 3 -v", background=True, timeout=30)
        vm.wait_listen(7174)
        client = vm.run(f"rping -c -a {GUEST_ADDR} -p 7174 -C 3 -v", timeout=30)
        assert client.ok, client.output
        assert server.wait(20) == 0, server.output()
    assert client.stdout.count("ping data: rdma-ping-") == 3
    assert server.output().count("server ping data: rdma-ping-") == 3
    assert pcap.is_file()
    assert read_frames(pcap)
    segments = tcp_segments(pcap)
    assert stream_bytes(segments, dport=7174).startswith(MPA_KEY_REQ)
    assert stream_bytes(segments, sport=7174).startswith(MPA_KEY_REP)
    decode = assert_clean_capture(pcap)
    # rping -C 3: per ping the client Sends its buffer info, the server Reads and Writes.
    assert decode.opcodes().count(0x3) >= 6  # Sends both ways
    assert 0x1 in decode.opcodes()  # Read Request
    assert 0x2 in decode.opcodes()  # Read Response
    assert all(r.crc_ok is None for r in decode.fpdus())  # CRC off by default


def test_guest_to_guest_rping_with_crc_required(vm: SiwVM, case: str) -> None:
    vm.set_siw(crc_required=True)
    with vm.capture(case, iface="lo", ports=(7175,)) as pcap:
        server = vm.run(f"rping -s -a {GUEST_ADDR} -p 7175 -C 2 -v", background=True, timeout=30)
        vm.wait_listen(7175)
        client = vm.run(f"rping -c -a {GUEST_ADDR} -p 7175 -C 2 -v", timeout=30)
        assert client.ok, client.output
        assert server.wait(20) == 0, server.output()
    decode = assert_clean_capture(pcap)
    request = next(r for r in decode.records if r.kind == "mpa_req")
    assert request.mpa is not None and request.mpa.crc
    fpdus = decode.fpdus()
    assert fpdus and all(r.crc_ok is True for r in fpdus)


def _gone(pid: int, timeout: float) -> bool:
    """Whether process ``pid`` has exited (or is a zombie) within ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                    return True
        except FileNotFoundError:
            return True
        time.sleep(0.1)
    return False


def test_boot_timeout_leaves_no_qemu(siw_vm: SiwVM) -> None:
    """A boot that fails (here: too short a timeout) kills its QEMU before raising."""
    vm = SiwVM(siw_vm.artifacts, boot_timeout=0.5)
    with pytest.raises(BootError, match="no agent"):
        vm.start()
    assert vm.proc is not None and vm.proc.poll() is not None
    vm.stop()


def test_qemu_dies_with_the_process_that_started_it(siw_vm: SiwVM) -> None:
    """No orphan QEMU even when the test process is SIGKILLed (PR_SET_PDEATHSIG)."""
    script = (
        "import threading, time\n"
        "from stack.siwvm import SiwVM\n"
        "vm = SiwVM(boot_timeout=120)\n"
        "threading.Thread(target=vm.start, daemon=True).start()\n"
        "while vm.proc is None: time.sleep(0.05)\n"
        "print(vm.proc.pid, flush=True)\n"
        "time.sleep(120)\n"
    )
    child = subprocess.Popen(
        [sys.executable, "-c", script],
        cwd=REPO,
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        assert child.stdout is not None
        qemu_pid = int(child.stdout.readline())
        assert not _gone(qemu_pid, 0.5)
        os.kill(child.pid, signal.SIGKILL)
        child.wait(10)
        assert _gone(qemu_pid, 10), f"QEMU {qemu_pid} outlived its parent"
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        if child.stdout:
            child.stdout.close()


def test_a_hung_guest_is_replaced(vm: SiwVM, request: pytest.FixtureRequest) -> None:
    """A hung guest (here its QEMU stopped by SIGSTOP) costs the test that finds it a
    reboot, not every later test a timeout: a freshly booted guest takes its place, for
    this test and the session's next ones."""
    from stack.interop.siw import conftest

    old = vm
    assert old.proc is not None
    os.kill(old.proc.pid, signal.SIGSTOP)
    try:
        new = conftest.ready_guest(old, request.node.nodeid)
    finally:
        if old.proc.poll() is None:
            os.kill(old.proc.pid, signal.SIGCONT)
    conftest._Session.reboots -= 1  # the test's own reboot: not taken from the session's
    assert new is not old and new.running and not old.running
    assert conftest._Session.vm is new
    assert new.siw_params()["zcopy_tx"] == "N"  # reset as the fixture resets a guest
    assert new.run("echo up", check=True).stdout.strip() == "up"
