"""Host side of the guest agent protocol (``files/guest-agent.py``) and a tiny QMP client.

The agent speaks newline-delimited JSON over TCP, reached through a QEMU hostfwd on
127.0.0.1.  Requests may come from several host threads: each takes an idle connection from a
small pool (or opens one), so a long ``wait`` never blocks another request.  Every socket
operation has a timeout.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from typing import Any

from stack.siwvm.errors import AgentError, BootError

REPLY_SLACK = 10.0
"""Seconds a reply may take beyond the guest-side timeout of the request (TCG is slow)."""


class AgentClient:
    """JSON-lines client of the guest agent at ``127.0.0.1:port``."""

    def __init__(self, port: int, host: str = "127.0.0.1") -> None:
        self.host = host
        self.port = port
        self._idle: list[socket.socket] = []
        self._lock = threading.Lock()
        self._closed = False

    def connect(self, timeout: float) -> None:
        """Wait until the agent answers a ping.

        slirp accepts a forwarded connection before anything listens in the guest and then
        closes it, so a successful ``connect()`` proves nothing: retry
        until a ping comes back.
        """
        deadline = time.monotonic() + timeout
        last: Exception | None = None
        while time.monotonic() < deadline:
            try:
                self.request("ping", reply_timeout=2.0)
                return
            except (AgentError, OSError) as exc:
                last = exc
                time.sleep(0.2)
        raise BootError(f"guest agent on 127.0.0.1:{self.port} did not answer: {last}")

    def request(
        self, op: str, *, reply_timeout: float | None = None, **args: Any
    ) -> dict[str, Any]:
        """Send one request; return the reply (without ``ok``); AgentError on failure.

        ``reply_timeout`` bounds the host's wait for the reply; by default it is the
        request's own ``timeout`` argument (the guest-side limit) plus :data:`REPLY_SLACK`.
        """
        if reply_timeout is None:
            reply_timeout = float(args.get("timeout", 20.0)) + REPLY_SLACK
        if self._closed:
            raise AgentError("agent client is closed")
        sock = self._take()
        try:
            sock.settimeout(reply_timeout)
            sock.sendall(json.dumps({"op": op, **args}).encode() + b"\n")
            line = _readline(sock)
        except (OSError, ValueError) as exc:
            sock.close()
            raise AgentError(f"agent {op}: {exc}") from exc
        self._give(sock)
        try:
            reply = json.loads(line)
        except ValueError as exc:
            raise AgentError(f"agent {op}: bad reply {line[:200]!r}") from exc
        if not reply.pop("ok", False):
            raise AgentError(f"agent {op}: {reply.get('error', 'failed')}")
        return reply

    def close(self) -> None:
        self._closed = True
        with self._lock:
            idle, self._idle = self._idle, []
        for sock in idle:
            sock.close()

    def _take(self) -> socket.socket:
        with self._lock:
            if self._idle:
                return self._idle.pop()
        try:
            return socket.create_connection((self.host, self.port), timeout=5.0)
        except OSError as exc:
            where = f"{self.host}:{self.port}"
            raise AgentError(f"cannot connect to the agent on {where}: {exc}") from exc

    def _give(self, sock: socket.socket) -> None:
        with self._lock:
            if self._closed:
                sock.close()
            else:
                self._idle.append(sock)


def _readline(sock: socket.socket, limit: int = 64 << 20) -> bytes:
    """Read one newline-terminated reply (replies are small JSON; file reads are base64)."""
    chunks: list[bytes] = []
    size = 0
    while True:
        chunk = sock.recv(65536)
        if not chunk:
            raise OSError("agent closed the connection")
        chunks.append(chunk)
        size += len(chunk)
        if chunk.endswith(b"\n"):
            return b"".join(chunks)
        if size > limit:
            raise OSError("agent reply too long")


class QmpClient:
    """Minimal QEMU Machine Protocol client on a unix socket (one command at a time)."""

    def __init__(self, path: str, timeout: float = 10.0) -> None:
        self.path = path
        self.timeout = timeout
        self._lock = threading.Lock()

    def execute(self, command: str, **arguments: Any) -> Any:
        """Run one QMP command on a fresh connection; return its ``return`` value."""
        with self._lock, socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(self.timeout)
            try:
                sock.connect(self.path)
                reader = sock.makefile("rb")
                _qmp_read(reader)  # greeting
                sock.sendall(b'{"execute": "qmp_capabilities"}\n')
                _qmp_read(reader)
                msg: dict[str, Any] = {"execute": command}
                if arguments:
                    msg["arguments"] = arguments
                sock.sendall(json.dumps(msg).encode() + b"\n")
                reply = _qmp_read(reader)
            except (OSError, ValueError) as exc:
                raise BootError(f"QMP {command}: {exc}") from exc
        if "error" in reply:
            raise BootError(f"QMP {command}: {reply['error'].get('desc', reply['error'])}")
        return reply.get("return")

    def hmp(self, command_line: str) -> str:
        """Run a human-monitor command (e.g. ``hostfwd_add``); return its text output."""
        return str(self.execute("human-monitor-command", **{"command-line": command_line}))


def _qmp_read(reader: Any) -> dict[str, Any]:
    """Next non-event message from QMP."""
    while True:
        line = reader.readline()
        if not line:
            raise OSError("QMP connection closed")
        msg = json.loads(line)
        if "event" not in msg:
            return msg
