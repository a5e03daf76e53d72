#!/usr/bin/env python3
"""siwvm guest agent: runs commands for the host (installed in the guest as /sbin/siwvm-agent).

Protocol: one JSON object per line over TCP, one JSON reply per line (the host reaches the
agent through a QEMU hostfwd).  Every reply has ``ok``; failures carry ``error``.

  {"op": "ping"}                                   -> {}
  {"op": "run", "cmd": C, "timeout": S}            -> {"rc", "stdout", "stderr", "timed_out"}
  {"op": "spawn", "cmd": C, "timeout": S, "log": P} -> {"pid"}   (killed when S runs out)
  {"op": "wait", "pid": N, "timeout": S}           -> {"rc": int or null, "timed_out"}
  {"op": "signal", "pid": N, "sig": K}             -> {}        (to the process group)
  {"op": "reap"}                                   -> {"killed": [pids]}  (every spawned job)
  {"op": "read", "path": P, "offset": O, "limit": N} -> {"data": base64, "size"}
  {"op": "write", "path": P, "data": base64}       -> {}
  {"op": "poweroff"}                               -> {}, then the guest powers off

Commands run with ``sh -c`` in their own session, so a timeout kills the whole group.
The agent is standard-library Python only (the guest has python3 and nothing else).
"""

from __future__ import annotations

import base64
import json
import os
import signal
import socketserver
import subprocess
import sys
import threading
import time
from typing import Any

KILL_GRACE = 2.0  # seconds between SIGTERM and SIGKILL when a deadline runs out


class Job:
    """A spawned background command with a deadline."""

    def __init__(self, cmd: str, timeout: float, log: str) -> None:
        os.makedirs(os.path.dirname(log) or "/", exist_ok=True)
        with open(log, "wb") as out:
            self.proc = subprocess.Popen(
                cmd,
                shell=True,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.timed_out = False
        self.timer = threading.Timer(timeout, self.expire)
        self.timer.daemon = True
        self.timer.start()

    def expire(self) -> None:
        if self.proc.poll() is None:
            self.timed_out = True
            kill_group(self.proc, signal.SIGTERM)
            try:
                self.proc.wait(KILL_GRACE)
            except subprocess.TimeoutExpired:
                kill_group(self.proc, signal.SIGKILL)


JOBS: dict[int, Job] = {}
JOBS_LOCK = threading.Lock()


def kill_group(proc: subprocess.Popen[bytes], sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def op_run(req: dict[str, Any]) -> dict[str, Any]:
    proc = subprocess.Popen(
        req["cmd"],
        shell=True,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    timed_out = False
    try:
        out, err = proc.communicate(timeout=float(req.get("timeout", 60)))
    except subprocess.TimeoutExpired:
        timed_out = True
        kill_group(proc, signal.SIGKILL)
        out, err = proc.communicate()
    return {
        "rc": None if timed_out else proc.returncode,
        "stdout": out.decode(errors="replace"),
        "stderr": err.decode(errors="replace"),
        "timed_out": timed_out,
    }


def op_spawn(req: dict[str, Any]) -> dict[str, Any]:
    job = Job(req["cmd"], float(req.get("timeout", 60)), req.get("log", "/dev/null"))
    with JOBS_LOCK:
        JOBS[job.proc.pid] = job
    return {"pid": job.proc.pid}


def op_wait(req: dict[str, Any]) -> dict[str, Any]:
    job = JOBS[int(req["pid"])]
    try:
        rc = job.proc.wait(float(req.get("timeout", 10)))
    except subprocess.TimeoutExpired:
        rc = None
    return {"rc": rc, "timed_out": job.timed_out}


def op_signal(req: dict[str, Any]) -> dict[str, Any]:
    job = JOBS[int(req["pid"])]
    kill_group(job.proc, int(req.get("sig", signal.SIGTERM)))
    return {}


def op_reap(req: dict[str, Any]) -> dict[str, Any]:
    killed = []
    with JOBS_LOCK:
        jobs = list(JOBS.items())
        JOBS.clear()
    for pid, job in jobs:
        job.timer.cancel()
        if job.proc.poll() is None:
            killed.append(pid)
            kill_group(job.proc, signal.SIGKILL)
            job.proc.wait()
    return {"killed": killed}


def op_read(req: dict[str, Any]) -> dict[str, Any]:
    with open(req["path"], "rb") as f:
        size = os.fstat(f.fileno()).st_size
        f.seek(int(req.get("offset", 0)))
        data = f.read(int(req.get("limit", 1 << 20)))
    return {"data": base64.b64encode(data).decode(), "size": size}


def op_write(req: dict[str, Any]) -> dict[str, Any]:
    with open(req["path"], "wb") as f:
        f.write(base64.b64decode(req["data"]))
    os.chmod(req["path"], int(req.get("mode", 0o644)))
    return {}


def op_ping(req: dict[str, Any]) -> dict[str, Any]:
    return {}


def op_poweroff(req: dict[str, Any]) -> dict[str, Any]:
    def later() -> None:
        time.sleep(0.2)
        os.sync()
        with open("/proc/sysrq-trigger", "w") as f:
            f.write("o")

    threading.Thread(target=later, daemon=True).start()
    return {}


OPS = {
    "ping": op_ping,
    "run": op_run,
    "spawn": op_spawn,
    "wait": op_wait,
    "signal": op_signal,
    "reap": op_reap,
    "read": op_read,
    "write": op_write,
    "poweroff": op_poweroff,
}


def dispatch(line: bytes) -> dict[str, Any]:
    try:
        req = json.loads(line)
        reply = OPS[req["op"]](req)
    except Exception as exc:  # any failure goes back to the host; the agent keeps serving
        return {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
    reply["ok"] = True
    return reply


class Handler(socketserver.StreamRequestHandler):
    def handle(self) -> None:
        for line in self.rfile:
            self.wfile.write(json.dumps(dispatch(line)).encode() + b"\n")
            self.wfile.flush()


class Server(socketserver.ThreadingTCPServer):
    allow_reuse_address = True
    daemon_threads = True


def main() -> None:
    """``siwvm-agent [PORT [ADDRESS]]``: the guest serves on 0.0.0.0:7000 (its only network
    is QEMU's user network); host-side tests run it on 127.0.0.1."""
    port = int(sys.argv[1]) if len(sys.argv) > 1 else 7000
    address = sys.argv[2] if len(sys.argv) > 2 else "0.0.0.0"
    server = Server((address, port), Handler)
    print(f"SIWVM AGENT listening on {port}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
