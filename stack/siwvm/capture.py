"""Captures of guest traffic: QEMU's dump of the guest NIC, or tcpdump in the guest.

:class:`CaptureMixin` gives :class:`~stack.siwvm.vm.SiwVM` its ``capture`` context manager
(see its docstring for the two methods and their trade-offs); the VM provides the agent,
QMP and guest commands it runs on.  Each pcap is cut to the wanted TCP ports, the agent's
port left out, and checked to be well formed.
"""

from __future__ import annotations

import re
import shlex
import signal
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from stack.siwvm.errors import CaptureError, SiwVmError
from stack.siwvm.net import AGENT_GUEST_PORT, NETDEV_ID
from stack.siwvm.pcap import check_capture, filter_tcp_ports
from stack.siwvm.process import GuestProcess

if TYPE_CHECKING:
    from stack.siwvm.agent import QmpClient

__all__ = ["CAPTURE_DIR_GUEST", "CaptureMixin", "CaptureVia"]

CaptureVia = Literal["netdev", "tcpdump"]
"""How :meth:`SiwVM.capture` captures: QEMU's dump of the guest NIC, or tcpdump in the guest."""
CAPTURE_DIR_GUEST = "/tmp/siwvm-cap"


class CaptureMixin:
    """The captures of a :class:`~stack.siwvm.vm.SiwVM` (see the module docstring)."""

    workdir: Path
    capture_dir: Path
    qmp: QmpClient
    _dumps: int

    if TYPE_CHECKING:

        def run(
            self,
            cmd: str,
            *,
            timeout: float = ...,
            check: bool = ...,
            background: Literal[True],
            log: str | None = ...,
        ) -> GuestProcess: ...

        def file_size(self, path: str) -> int: ...

        def copy_out(self, guest_path: str, host_path: Path | str, chunk: int = ...) -> Path: ...

        def _require_running(self) -> None: ...

    @contextmanager
    def capture(
        self,
        name: str,
        *,
        iface: str = "eth0",
        ports: Iterable[int] = (),
        bpf: str | None = None,
        via: CaptureVia | None = None,
        dest: Path | str | None = None,
        start_timeout: float = 15.0,
    ) -> Iterator[Path]:
        """Capture guest traffic for the ``with`` block; yield the host pcap path.

        ``via``: ``"netdev"`` (the default for ``eth0``) dumps every frame that crosses the
        guest's NIC from inside QEMU (a ``filter-dump`` object added and removed over QMP):
        the host<->guest wire, lossless, since QEMU writes each frame before delivering it.
        ``"tcpdump"`` (the default for ``lo``, siw<->siw inside the guest) runs tcpdump in
        the guest to its tmpfs and copies the pcap out; under TCG tcpdump can miss segments
        of long bursts without counting them as drops, so the interop suite uses netdev.
        The agent's own port is always left out; ``ports`` keeps only TCP segments with one
        of these ports (both methods); ``bpf`` adds a tcpdump filter expression (tcpdump
        only).  The pcap is checked to be well formed when the block ends without error.
        """
        self._require_running()
        method = via or ("netdev" if iface == "eth0" else "tcpdump")
        if method not in ("netdev", "tcpdump"):
            raise CaptureError(f"unknown capture method {method!r} (netdev or tcpdump)")
        if method == "netdev" and iface != "eth0":
            raise CaptureError(f"netdev captures see eth0 only, not {iface!r}: use via='tcpdump'")
        if method == "netdev" and bpf:
            raise CaptureError("netdev captures take ports=, not a bpf expression")
        safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", name).strip("_") or "capture"
        host_path = Path(dest) if dest else self.capture_dir / f"{safe}.pcap"
        host_path.parent.mkdir(parents=True, exist_ok=True)
        wanted = tuple(ports)
        if method == "netdev":
            with self._netdev_dump(safe, host_path, wanted):
                yield host_path
            return
        port_expr = " or ".join(f"tcp port {p}" for p in wanted)
        expr = " and ".join(
            [f"not tcp port {AGENT_GUEST_PORT}", *(f"({e})" for e in (port_expr, bpf) if e)]
        )
        gpcap = f"{CAPTURE_DIR_GUEST}/{safe}.pcap"
        glog = f"{CAPTURE_DIR_GUEST}/{safe}.tcpdump.log"
        tcpdump = self.run(
            f"exec tcpdump -i {shlex.quote(iface)} -s 0 -U --immediate-mode -Z root"
            f" -w {gpcap} {shlex.quote(expr)}",
            background=True,
            timeout=3600,
            log=glog,
        )
        self._wait_tcpdump(tcpdump, start_timeout)
        failed = True
        try:
            yield host_path
            failed = False
        finally:
            self._finish_capture(tcpdump, gpcap, host_path, check=not failed)

    @contextmanager
    def _netdev_dump(self, safe: str, host_path: Path, ports: tuple[int, ...]) -> Iterator[None]:
        """QEMU's filter-dump on the guest NIC for the block, then keep ``ports``' frames."""
        self._dumps += 1
        dump_id = f"cap{self._dumps}"
        raw = self.workdir / f"{safe}.{dump_id}.netdev.pcap"
        try:
            self.qmp.execute(
                "object-add",
                **{"qom-type": "filter-dump", "id": dump_id, "netdev": NETDEV_ID, "file": str(raw)},
            )
        except SiwVmError as exc:
            raise CaptureError(f"QEMU filter-dump did not start: {exc}") from exc
        failed = True
        try:
            yield
            failed = False
        finally:
            self._finish_netdev_dump(dump_id, raw, host_path, ports, check=not failed)

    def _finish_netdev_dump(
        self, dump_id: str, raw: Path, host_path: Path, ports: tuple[int, ...], check: bool
    ) -> None:
        # The peers have exited; let their last segments (FIN, final ACKs) cross the NIC.
        last, deadline = -1, time.monotonic() + 5.0
        while time.monotonic() < deadline:
            size = raw.stat().st_size if raw.exists() else 0
            if size == last:
                break
            last = size
            time.sleep(0.3)
        try:
            self.qmp.execute("object-del", id=dump_id)
            filter_tcp_ports(raw, host_path, ports=ports, exclude=(AGENT_GUEST_PORT,))
        except (SiwVmError, OSError) as exc:
            if check:
                raise CaptureError(f"capture {host_path.name} did not come out: {exc}") from exc
        finally:
            raw.unlink(missing_ok=True)

    def _wait_tcpdump(self, tcpdump: GuestProcess, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while True:
            text = tcpdump.output()
            if "listening on" in text:
                return
            if tcpdump.poll() is not None:
                raise CaptureError(f"tcpdump exited (rc {tcpdump.rc}): {text.strip()[-500:]}")
            if time.monotonic() > deadline:
                tcpdump.stop()
                raise CaptureError(f"tcpdump did not start within {timeout} s: {text[-500:]}")
            time.sleep(0.1)

    def _finish_capture(
        self, tcpdump: GuestProcess, gpcap: str, host_path: Path, check: bool
    ) -> None:
        # tcpdump drops packets it has not yet written when interrupted:
        # wait until the file stops growing, then SIGINT, then copy from tmpfs.
        try:
            last, deadline = -1, time.monotonic() + 10.0
            while time.monotonic() < deadline:
                size = self.file_size(gpcap)
                if size == last:
                    break
                last = size
                time.sleep(0.2)
            tcpdump.kill(signal.SIGINT)
            if tcpdump._wait(10.0) is None:
                tcpdump.stop(2.0)
            self.copy_out(gpcap, host_path)
        except SiwVmError as exc:
            if check:
                raise CaptureError(f"capture {host_path.name} did not come out: {exc}") from exc
            return
        if check:
            check_capture(host_path)
