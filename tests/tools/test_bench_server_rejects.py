"""The bench server's blocking iWARP port against silent and greedy clients, and the reason of
a Reject reaching the client's error (MPA-23, MPA-24; the project rule on hostile peers).

The client tests lower MAX_SESSION_BYTES in-process: sizes the server refuses then stay
small (and below any up-front check of the client's options, which they bypass)."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator

import pytest

from stack.bench import BenchError, BenchOptions, SessionSpec, protocol, session
from stack.bench.blocking_iwarp import BlockingIwarpServer, blocking_latency_run
from stack.bench.options import MAX_SIZE, mpa_settings
from stack.bench.protocol import Advert, connect_error
from stack.rnic import Rnic
from stack.transport.blocking_cm import connect
from stack.transport.cm import ConnectRejected
from stack.wire.events import MpaFrame
from tests.tools.bench_helpers import bench_client

LIMIT = 8192
"""The lowered MAX_SESSION_BYTES of the client tests."""


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
    def refused(size: int, *, sent: bool = False) -> bytearray:
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


def test_the_blocking_client_says_the_servers_reason(
    server: BlockingIwarpServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(protocol, "MAX_SESSION_BYTES", LIMIT)
    with pytest.raises(BenchError, match=f"rejected the QP: session request too large.*{LIMIT}"):
        blocking_latency_run(
            "127.0.0.1",
            server.port,
            mpa_settings(False, False, None),
            BenchOptions("read", (2 * LIMIT,), latency=True),
            2 * LIMIT,
            1,
            lambda _n: None,
        )


async def test_the_trio_client_says_the_servers_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(protocol, "MAX_SESSION_BYTES", LIMIT)
    async with bench_client() as client:
        settings = BenchOptions("write", (LIMIT,)).mpa_settings
        with pytest.raises(BenchError) as info:
            await client.connect(SessionSpec("write", 2 * LIMIT), settings, tx_depth=1, ord=1)
        assert f"the server's limit is {LIMIT}" in str(info.value)
        qp = await client.connect(SessionSpec("write", LIMIT), settings, tx_depth=1, ord=1)
        await client.close([qp])


def test_a_reason_is_shown_printable() -> None:
    reject = ConnectRejected(MpaFrame(True, reject=True, private_data=b"no\x1b[2J way \xff"))
    error = connect_error("h:1", reject)
    assert str(error) == "cannot connect to h:1: the server rejected the QP: no\ufffd[2J way \ufffd"
    assert "connection rejected by peer" in str(
        connect_error("h:1", ConnectRejected(MpaFrame(True)))
    )
