"""The bench server's blocking iWARP port against silent and greedy clients (MPA-23; the
project rule on hostile peers)."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator

import pytest

from stack.bench import SessionSpec, session
from stack.bench.blocking_iwarp import BlockingIwarpServer
from stack.bench.options import MAX_SIZE, mpa_settings
from stack.bench.protocol import Advert
from stack.rnic import Rnic
from stack.transport.blocking_cm import connect
from stack.transport.cm import ConnectRejected


@pytest.fixture
def server() -> Iterator[BlockingIwarpServer]:
    srv = BlockingIwarpServer("127.0.0.1", mpa_settings(False, False, None), lambda: (1, 2, 3))
    try:
        yield srv
    finally:
        srv.close()


def _connect(port: int, spec: SessionSpec) -> Advert:
    """A QP asking ``spec`` of the blocking port (3 s at most); the server's Advert."""
    rnic = Rnic("client")
    qp = rnic.create_qp(rnic.alloc_pd(), rnic.create_cq())
    conn = connect("127.0.0.1", port, qp, private_data=spec.encode(), timeout=3.0)
    conn.abort()
    return Advert.decode(conn.negotiated.peer_private_data)


def test_silent_connections_do_not_hold_the_blocking_port(server: BlockingIwarpServer) -> None:
    silent = [socket.create_connection(("127.0.0.1", server.port)) for _ in range(6)]
    try:
        start = time.monotonic()
        assert _connect(server.port, SessionSpec("read", 4096)).raw_port == 1
        assert time.monotonic() - start < 1.0  # was 6 x 5 s: the client's MPA timer ran out
    finally:
        for sock in silent:
            sock.close()


def test_the_blocking_port_rejects_with_the_reason_and_serves_on(
    server: BlockingIwarpServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    def refused(size: int) -> bytearray:
        raise OSError(12, "Cannot allocate memory")

    monkeypatch.setattr(session, "zeroed", refused)
    with pytest.raises(ConnectRejected) as info:
        _connect(server.port, SessionSpec("write", 4096))
    assert b"Cannot allocate memory" in info.value.private_data
    monkeypatch.undo()
    with pytest.raises(ConnectRejected) as info:
        _connect(server.port, SessionSpec("send", MAX_SIZE, latency=True))
    assert b"too large" in info.value.private_data
    assert _connect(server.port, SessionSpec("write", 4096)).length == 4096
