"""BlockingListener.serve over loopback: each MPA startup in a thread of its own, within the
trio listener's startup bounds (StartupSlots, MPA-23), so silent connections hold no port
and a flood from one address is bounded (the project rule on hostile peers)."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TypedDict, Unpack

from stack.transport.blocking_cm import BlockingListener, BlockingRequest, connect
from stack.transport.startup_slots import STARTUP_STALE_AFTER
from tests.e2e.helpers import make_host

SILENT = 8
"""Silent connections ahead of a good client: the old single-thread loop gave each the
5 s startup timeout, one after another."""


class _Bounds(TypedDict, total=False):
    max_startups: int
    max_startups_per_peer: int


@contextmanager
def serving(**bounds: Unpack[_Bounds]) -> Iterator[BlockingListener]:
    """A listener serving in a thread; every request is accepted with a fresh QP."""

    def handle(request: BlockingRequest) -> None:
        request.accept(make_host("s").qp).abort()

    listener = BlockingListener("127.0.0.1", 0, **bounds)
    thread = threading.Thread(target=listener.serve, args=(handle,), daemon=True)
    thread.start()
    try:
        yield listener
    finally:
        listener.close()
        thread.join(5)
        assert not thread.is_alive()


def _connect_quickly(port: int) -> float:
    """Seconds a good client's connect took (its timeout, 3 s, fails the test)."""
    start = time.monotonic()
    connect("127.0.0.1", port, make_host("c").qp, timeout=3.0).abort()
    return time.monotonic() - start


def _closed_by_server(sock: socket.socket, within: float) -> bool:
    sock.settimeout(within)
    try:
        return sock.recv(1) == b""
    except TimeoutError:
        return False
    except OSError:
        return True


def test_silent_connections_do_not_delay_a_good_client() -> None:
    with serving() as listener:
        silent = [socket.create_connection(("127.0.0.1", listener.port)) for _ in range(SILENT)]
        try:
            assert _connect_quickly(listener.port) < 1.0
            assert _connect_quickly(listener.port) < 1.0
        finally:
            for sock in silent:
                sock.close()


def test_one_address_is_bounded_and_its_stale_slots_go_to_new_connections() -> None:
    with serving(max_startups_per_peer=4) as listener:
        silent = [socket.create_connection(("127.0.0.1", listener.port)) for _ in range(4)]
        try:
            extra = socket.create_connection(("127.0.0.1", listener.port))
            with extra:
                assert _closed_by_server(extra, 2.0)  # at the bound, no slot is stale yet
            assert listener.refused == 1
            time.sleep(STARTUP_STALE_AFTER + 0.1)
            assert _connect_quickly(listener.port) < 1.0  # takes the oldest silent slot
            assert _closed_by_server(silent[0], 2.0)
            assert listener.slots.evicted_stale == 1
            assert len(listener.slots) == 3
        finally:
            for sock in silent:
                sock.close()


def test_close_ends_serve() -> None:
    with serving() as listener:
        assert _connect_quickly(listener.port) < 1.0
    assert listener.accept_errors == 0


def test_serve_on_a_listener_closed_before_it_started_returns_at_once() -> None:
    """The thread meant to serve may start after the listener was closed (a bench that
    ended at once): it returns instead of dying on the closed socket."""
    listener = BlockingListener("127.0.0.1", 0)
    listener.close()
    listener.serve(lambda request: None)  # returns, raises nothing
