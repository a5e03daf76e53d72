"""The bench server against a client asking for too much: MAX_SESSION_BYTES per QP, checked
before anything is mapped, and regions mapped lazily, so one ~70-byte MPA Request neither
fills the server's memory nor stops its event loop (the project rule on hostile peers)."""

from __future__ import annotations

import pytest

from stack.bench import BenchError, BenchOptions, SessionSpec
from stack.bench.memory import zeroed
from stack.bench.options import MAX_SIZE
from stack.bench.process import rss_bytes
from stack.bench.protocol import MAX_SESSION_BYTES
from stack.bench.session import Session
from stack.rnic import Rnic
from stack.transport.cm import ConnectRejected
from tests.tools.bench_helpers import bench_client
from tests.tools.resident import resident_bytes

GIB = 1 << 30
RSS_SLACK = 128 << 20
"""Resident growth allowed where the old server zeroed a gigabyte or more at once."""


def test_the_limit_counts_every_region_the_server_maps() -> None:
    assert SessionSpec("idle", MAX_SIZE).memory == 0
    assert SessionSpec("write", MAX_SIZE).memory == MAX_SESSION_BYTES  # one region: served
    assert SessionSpec("send", 4096, latency=True).regions == ("target", "source", "inbox")
    assert SessionSpec.decode(SessionSpec("read", MAX_SIZE).encode()).size == MAX_SIZE
    for spec in (
        SessionSpec("send", MAX_SIZE),
        SessionSpec("write", MAX_SIZE // 2 + 1, True, 0, (1, 0, 64)),
    ):
        with pytest.raises(BenchError, match="too large"):
            SessionSpec.decode(spec.encode())


def test_a_gigabyte_session_costs_no_resident_memory_until_data_lands() -> None:
    rnic = Rnic("server")
    before = rss_bytes()
    session = Session.open(rnic, rnic.alloc_pd(), SessionSpec("write", GIB), (0, 0, 0))
    try:
        assert session.target is not None and session.target.length >= GIB
        assert rss_bytes() - before < RSS_SLACK
        session.target.buf[GIB // 2] = 7  # placement writes it like any buffer
        assert session.target.buf[GIB // 2] == 7 and session.target.buf[GIB - 1] == 0
    finally:
        session.close()


async def test_a_huge_session_request_is_rejected_and_the_server_serves_on() -> None:
    before = rss_bytes()
    async with bench_client("hostile") as client:
        rnic = client.rnic
        qp = rnic.create_qp(rnic.alloc_pd(), rnic.create_cq())
        greedy = SessionSpec("send", MAX_SIZE, latency=True)  # 3 GiB asked in ~50 bytes
        with pytest.raises(ConnectRejected) as info:
            await client.cm.connect(client.host, client.port, qp, private_data=greedy.encode())
        assert b"too large" in info.value.private_data
        assert rss_bytes() - before < RSS_SLACK
        opts = BenchOptions("write", (4096,))
        qps = await client.connect_many(
            SessionSpec("write", 4096), opts.mpa_settings, 1, tx_depth=1, ord=1
        )
        assert (await client.server_stats())["qps"] == 1
        await client.close(qps)


def test_regions_sent_from_are_real_memory_and_the_others_lazy() -> None:
    """The untouched pages of a lazy region are the kernel's one zero page: a Write source
    or a Read target read from it would be 4 KiB of cache, not memory as the baselines read
    (memory.zeroed).  Sinks stay lazy."""
    size = 64 << 20
    lazy, sent = zeroed(size), zeroed(size, sent=True)
    assert resident_bytes(lazy) < size // 16 and resident_bytes(sent) >= size
    rnic = Rnic("server")
    pd = rnic.alloc_pd()
    for test, populated in (("read", True), ("write", False), ("send", False)):
        s = Session.open(rnic, pd, SessionSpec(test, size, latency=test == "send"), (0, 0, 0))
        try:
            assert s.target is not None
            assert (resident_bytes(s.target.buf) >= size) is populated, test
            if s.source is not None:  # the Sends' source (latency echo)
                assert resident_bytes(s.source.buf) >= size
        finally:
            s.close()


async def test_the_clients_regions_are_real_memory_only_where_sent_from() -> None:
    """``-q 4 -s 256M`` of Reads: the client's sinks are mapped lazily (it zeroed 1 GiB up
    front); a Write's source is real memory."""
    async with bench_client() as client:
        size = 256 << 20
        for test, populated in (("read", False), ("write", True)):
            opts = BenchOptions(test, (size,))
            qps = await client.connect_many(
                SessionSpec(test, size), opts.mpa_settings, 2, tx_depth=1, ord=1
            )
            for qp in qps:
                assert qp.local is not None
                assert (resident_bytes(qp.local.buf) >= size) is populated, test
            await client.close(qps)
