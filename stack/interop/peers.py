"""Run a guest tool against one of our ``iwarp`` peers, captured, in either direction.

Directions are named after who opens the connection (the MPA initiator):

* ``siw-active``: the guest's tool (rping -c, rdma_client, ucmatose -s) connects to our
  server listening on the host's 127.0.0.1 (10.0.2.2 in the guest);
* ``iwarp-active``: our client connects through a hostfwd to the guest's server tool.

Both return a :class:`PeerRun` with both sides' exit status and output and the capture
of the guest's NIC (QEMU's lossless netdev dump).  :func:`check_decode` decodes the capture
with our dissector and fails on findings the case does not expect, TCP gaps included.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from stack.interop.helpers import Decode, assert_clean_capture
from stack.siwvm import HOST_ADDR, SiwVM, free_port

REPO = Path(__file__).resolve().parents[2]  # where the stack package is importable
SIW_ACTIVE = "siw-active"
IWARP_ACTIVE = "iwarp-active"
DIRECTIONS = (SIW_ACTIVE, IWARP_ACTIVE)
GUEST_MSS = 1460
"""TCP MSS of the guest's eth0 (MTU 1500): siw sizes its FPDUs to it."""
TCP_ACK = 0x10
OOPS = re.compile(r"cut here|kernel BUG|BUG: |Oops|WARNING: CPU")


@dataclass
class PeerRun:
    """One captured exchange.  Fields: ours_rc, ours (our tool's stdout+stderr), siw_rc
    (None: still running when stopped), siw (the guest tool's output), pcap."""

    ours_rc: int
    ours: str
    siw_rc: int | None
    siw: str
    pcap: Path

    def describe(self) -> str:
        """Both outputs, long lines cut (rping -v prints whole buffers)."""
        ours, siw = _cut(self.ours), _cut(self.siw)
        return f"iwarp (rc {self.ours_rc}):\n{ours}\nsiw (rc {self.siw_rc}):\n{siw}"


def _cut(text: str, width: int = 160, lines: int = 40) -> str:
    kept = [line if len(line) <= width else line[:width] + "..." for line in text.splitlines()]
    return "\n".join(kept[-lines:])


class HostTool:
    """``iwarp <args>`` running on the host, its output going to a file (a pipe would fill
    up and stall the tool: rping -v prints whole buffers)."""

    def __init__(self, *args: str) -> None:
        self.out = tempfile.TemporaryFile(mode="w+", encoding="utf-8", errors="replace")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "stack.cli.iwarp", *args],
            cwd=REPO,
            stdin=subprocess.DEVNULL,
            stdout=self.out,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )

    def poll(self) -> int | None:
        return self.proc.poll()

    def finish(self, timeout: float = 60.0) -> tuple[int, str]:
        """Exit status and output (killed after ``timeout``: status -9)."""
        try:
            rc = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
            rc = -9
        self.out.seek(0)
        text = self.out.read()
        self.out.close()
        return rc, text + (f"\n(killed after {timeout} s)" if rc == -9 else "")


def host_listening(port: int) -> bool:
    """Whether a TCP socket listens on the host's ``port`` (from /proc/net/tcp{,6})."""
    needle = f":{port:04X} "
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            for line in f.read().splitlines()[1:]:
                fields = line.split()
                if (fields[1] + " ").endswith(needle) and fields[3] == "0A":
                    return True
    return False


def wait_host_listen(port: int, tool: HostTool, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not host_listening(port):
        if tool.poll() is not None:
            raise AssertionError(f"our server exited before listening:\n{tool.finish()[1]}")
        if time.monotonic() > deadline:
            tool.finish(0)
            raise AssertionError(f"our server did not listen on {port} within {timeout} s")
        time.sleep(0.05)


def siw_active(
    vm: SiwVM,
    case: str,
    ours: Callable[[int], list[str]],
    guest: Callable[[str, int], str],
    *,
    timeout: float = 40.0,
) -> PeerRun:
    """Our server (``iwarp`` + ``ours(port)``) on 127.0.0.1; the guest runs
    ``guest(HOST_ADDR, port)`` in the foreground; both are waited for."""
    port = free_port()
    with vm.capture(case, ports=(port,)) as pcap:
        server = HostTool(*ours(port))
        wait_host_listen(port, server)
        client = vm.run(guest(HOST_ADDR, port), timeout=timeout)
        rc, out = server.finish(20.0)
    return PeerRun(rc, out, None if client.timed_out else client.rc, client.output, pcap)


def iwarp_active(
    vm: SiwVM,
    case: str,
    guest: Callable[[int], str],
    ours: Callable[[int], list[str]],
    *,
    guest_port: int,
    timeout: float = 40.0,
    guest_exit: float = 20.0,
) -> PeerRun:
    """The guest runs ``guest(guest_port)`` in the background; once it listens, our client
    (``iwarp`` + ``ours(host_port)``) connects through a hostfwd.  The guest tool gets
    ``guest_exit`` seconds to finish after ours succeeded (1.5 s after ours failed), then
    it is stopped (a rejected rping -s on siw never exits)."""
    host_port = vm.hostfwd(guest_port)
    with vm.capture(case, ports=(guest_port,)) as pcap:
        server = vm.run(guest(guest_port), background=True, timeout=timeout + guest_exit)
        vm.wait_listen(guest_port)
        rc, out = HostTool(*ours(host_port)).finish(timeout)
        siw_rc: int | None = None
        deadline = time.monotonic() + (guest_exit if rc == 0 else 1.5)
        while server.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        if server.poll() is None:
            server.stop()
        else:
            siw_rc = server.rc
        siw_out = server.output()
    return PeerRun(rc, out, siw_rc, siw_out, pcap)


def kernel_oopses(vm: SiwVM) -> list[str]:
    """Lines of the guest's kernel log that report a BUG, oops or WARN."""
    log = vm.run("dmesg", timeout=20, check=True).stdout
    return [line for line in log.splitlines() if OOPS.search(line)]


@pytest.fixture
def no_guest_oops(vm: SiwVM) -> Iterator[None]:
    """The case leaves the guest kernel without a new BUG/oops/WARN (import it into a test
    module and use it autouse, or with ``usefixtures``)."""
    before = len(kernel_oopses(vm))
    yield
    new = kernel_oopses(vm)[before:]
    assert not new, "the guest kernel oopsed:\n" + "\n".join(new[:20])


def check_decode(
    pcap: Path,
    *,
    expect_kinds: tuple[str, ...] = ("mpa_req", "mpa_rep"),
    allowed_rules: tuple[str, ...] = (),
    allowed_notes: tuple[str, ...] = (),
    **options: object,
) -> Decode:
    """:func:`assert_clean_capture` with the end of the capture always allowed as a note.

    The captures come from QEMU's dump of the guest NIC (:meth:`SiwVM.capture`), which
    misses nothing, so a TCP gap is a finding like any other.
    """
    return assert_clean_capture(
        pcap,
        expect_kinds=expect_kinds,
        allowed_rules=allowed_rules,
        allowed_notes=("trailing", *allowed_notes),
        **options,
    )
