"""``kbtp bench --vs mooncake``: the same blocks over Mooncake Transfer Engine's TCP transport.

What an inference-server user would pick instead of KBTP, measured in the same run when the
``mooncake-transfer-engine-non-cuda`` package is installed (it is not a dependency): two
processes, each a ``TransferEngine`` initialised with ``P2PHANDSHAKE`` and the ``tcp``
protocol; the client writes (the STORE row's comparison) and reads (LOAD's) batches of
``inflight`` blocks of the row's size with ``batch_transfer_sync_write``/``_read``, the
same number of blocks as the KBTP row.  Figures: seconds, and CPU seconds of both
processes (the server's from ``/proc``).

``python -m kbtp.cli.bench_mooncake client SIZE BLOCKS BATCH [CPU]`` prints them as one
JSON object (CPU: the server's, ``kbtp bench --cpus``; the client runs where it is
started); :func:`run_mooncake` runs it and parses it.
"""

from __future__ import annotations

import ctypes
import functools
import importlib.util
import json
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Any

from kbtp.cli.bench_cpu import BothEndsCpu, process_cpu_seconds
from stack.bench.process import pin_to
from stack.cli import CliError

PACKAGE = "mooncake-transfer-engine-non-cuda"
TIMEOUT = 600.0
"""Seconds one comparison may take."""


LOAD_TIMEOUT = 60.0
"""Seconds the check that Mooncake's engine loads may take."""


@functools.cache
def mooncake_problem() -> str | None:
    """Why ``--vs mooncake`` cannot run here, or None when Mooncake's engine loads.

    The package can be installed and still fail to load (its engine links libibverbs,
    Debian's ``libibverbs1``), so the module is imported for real, in a child process
    (what it loads stays out of this one)."""
    try:
        if importlib.util.find_spec("mooncake.engine") is None:
            raise ModuleNotFoundError
    except ModuleNotFoundError:
        return f"needs the {PACKAGE} package, which is not installed"
    argv = [sys.executable, "-c", "import mooncake.engine"]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=LOAD_TIMEOUT)
    except subprocess.TimeoutExpired:
        return f"needs Mooncake's engine, which did not load within {LOAD_TIMEOUT:.0f} s"
    if done.returncode == 0:
        return None
    reason = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]
    hint = " (Debian's libibverbs1 provides it)" if "libibverbs" in reason else ""
    return f"needs Mooncake's engine, which is installed but does not load: {reason}{hint}"


def mooncake_available() -> bool:
    """Whether Mooncake's Python engine loads (:func:`mooncake_problem` has nothing)."""
    return mooncake_problem() is None


@dataclass(frozen=True, slots=True)
class MooncakeFigures:
    """One direction of one size: wall-clock seconds and CPU seconds of both ends."""

    seconds: float
    cpu: float


def run_mooncake(
    size: int, blocks: int, batch: int, server_cpu: int | None = None
) -> dict[str, MooncakeFigures]:
    """Write and read figures (keys ``write``, ``read``) of ``blocks`` blocks of ``size``;
    the server on ``server_cpu`` only, if given."""
    argv = [sys.executable, "-m", "kbtp.cli.bench_mooncake", "client", str(size)]
    argv += [str(blocks), str(batch), *([] if server_cpu is None else [str(server_cpu)])]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        raise CliError(f"the Mooncake comparison took more than {TIMEOUT:.0f} s") from None
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise CliError(f"the Mooncake comparison failed: {tail}")
    doc = json.loads(lines[-1])
    return {op: MooncakeFigures(doc[op]["seconds"], doc[op]["cpu"]) for op in ("write", "read")}


def _engine() -> Any:
    engine: Any = importlib.import_module("mooncake.engine").TransferEngine()
    if engine.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") != 0:
        raise RuntimeError("TransferEngine.initialize failed")
    return engine


def _region(engine: Any, length: int) -> tuple[ctypes.Array[ctypes.c_char], int]:
    buf = ctypes.create_string_buffer(length)
    addr = ctypes.addressof(buf)
    if engine.register_memory(addr, length) != 0:
        raise RuntimeError("TransferEngine.register_memory failed")
    return buf, addr


def _server(length: int, cpu: int | None) -> None:
    if cpu is not None:
        pin_to(cpu)
    engine = _engine()
    _buf, addr = _region(engine, length)
    print(engine.get_rpc_port(), addr, flush=True)
    sys.stdin.read()


def _client(
    size: int, blocks: int, batch: int, server_cpu: int | None = None
) -> dict[str, dict[str, float]]:
    length = size * batch
    argv = [sys.executable, "-m", "kbtp.cli.bench_mooncake", "server", str(length)]
    argv += [] if server_cpu is None else [str(server_cpu)]
    log = tempfile.TemporaryFile("w+")  # a file, not a pipe: its logging cannot block it
    server = subprocess.Popen(
        argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, text=True
    )
    try:
        assert server.stdout is not None
        words = server.stdout.readline().split()
        if len(words) != 2:  # it failed before serving: say why, not what was missing
            server.kill()
            server.wait()
            log.seek(0)
            reason = (log.read().strip().splitlines() or ["no output"])[-1]
            raise RuntimeError(f"the Mooncake server did not start: {reason}")
        port, remote = (int(w) for w in words)
        engine = _engine()
        buf, addr = _region(engine, length)
        ctypes.memset(addr, 0x5A, length)
        peer = f"127.0.0.1:{port}"
        sources = [addr + i * size for i in range(batch)]
        targets = [remote + i * size for i in range(batch)]
        figures = {}
        for op in ("write", "read"):
            if op == "read":
                ctypes.memset(addr, 0, length)  # what the reads bring back is checked
            call = (
                engine.batch_transfer_sync_write
                if op == "write"
                else (engine.batch_transfer_sync_read)
            )
            if call(peer, sources, targets, [size] * batch) != 0:  # warm-up and handshake
                raise RuntimeError(f"batch {op} failed")
            cpu = BothEndsCpu(lambda: process_cpu_seconds(server.pid))
            start = time.perf_counter()
            left = blocks
            while left:
                n = min(batch, left)
                if call(peer, sources[:n], targets[:n], [size] * n) != 0:
                    raise RuntimeError(f"batch {op} failed")
                left -= n
            figures[op] = {"seconds": time.perf_counter() - start, "cpu": cpu.seconds()}
        if buf.raw != b"\x5a" * length:
            raise RuntimeError("the blocks read back differ from the blocks written")
        return figures
    finally:
        if server.stdin is not None:
            server.stdin.close()
        server.wait(10)
        log.close()


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    numbers = [int(a) for a in args[1:] if a.isdigit()]
    if len(numbers) != len(args) - 1:
        pass  # not numbers: the usage below
    elif args[:1] == ["server"] and len(args) in (2, 3):
        _server(numbers[0], numbers[1] if len(numbers) > 1 else None)
        return 0
    elif args[:1] == ["client"] and len(args) in (4, 5):
        print(json.dumps(_client(*numbers)), flush=True)
        return 0
    print(
        "usage: python -m kbtp.cli.bench_mooncake client SIZE BLOCKS BATCH [SERVER_CPU]",
        file=sys.stderr,
    )
    return 2


if __name__ == "__main__":
    sys.exit(main())
