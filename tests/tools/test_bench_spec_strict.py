"""A session spec is parsed strictly, in one place (:meth:`SessionSpec.decode`): a flag with
a value other than 0 or 1, a field given twice, an unknown field or a value of the wrong
type makes the server Reject the MPA Request with the reason (MPA-23), on the trio and the
blocking iWARP port alike, and the client's error says it."""

from __future__ import annotations

import pytest
import trio

from stack.bench import BenchError, SessionSpec
from stack.bench.protocol import Advert, connect_error
from stack.rnic import Rnic
from stack.transport.blocking_cm import connect
from stack.transport.cm import ConnectRejected
from tests.tools.bench_helpers import bench_client

BAD_SPECS = {
    "latency-2": (b'{"t":"read","s":64,"l":2}', "bad latency flag 2"),
    "latency-true": (b'{"t":"read","s":64,"l":true}', "bad latency flag True"),
    "latency-text": (b'{"t":"read","s":64,"l":"yes"}', "bad latency flag 'yes'"),
    "latency-float": (b'{"t":"read","s":64,"l":1.0}', "bad latency flag 1.0"),
    "latency-twice": (b'{"t":"read","s":64,"l":1,"l":1}', "field 'l' given twice"),
    "size-twice": (b'{"t":"read","s":64,"s":1073741824}', "field 's' given twice"),
    "unknown-field": (b'{"t":"read","s":64,"lat":1}', "unknown field 'lat'"),
    "size-bool": (b'{"t":"read","s":true}', "bad size True"),
    "rx-bool": (b'{"t":"send","s":64,"rx":true}', "bad rx depth True"),
    "pong-null": (b'{"t":"write","s":64,"l":1,"pong":null}', "bad pong region None"),
    "pong-text": (b'{"t":"write","s":64,"l":1,"pong":"abc"}', "bad pong region 'abc'"),
    "pong-for-read": (
        b'{"t":"read","s":64,"l":1,"pong":[1,0,64]}',
        "a pong region for a read latency session (only Write latency takes one)",
    ),
    "pong-for-write-bw": (
        b'{"t":"write","s":64,"pong":[1,0,64]}',
        "a pong region for a write bandwidth session (only Write latency takes one)",
    ),
    "write-lat-no-pong": (
        b'{"t":"write","s":64,"l":1}',
        "a Write-latency session needs its pong region",
    ),
    "missing-size": (b'{"t":"read"}', "missing field 's'"),
    "not-an-object": (b'["read",64]', "not a JSON object"),
}


@pytest.mark.parametrize(("data", "reason"), BAD_SPECS.values(), ids=BAD_SPECS.keys())
def test_a_malformed_spec_is_refused_with_its_reason(data: bytes, reason: str) -> None:
    with pytest.raises(BenchError, match="bad session request: ") as info:
        SessionSpec.decode(data)
    assert reason in str(info.value)


def test_the_flags_the_client_writes_are_accepted() -> None:
    assert SessionSpec.decode(b'{"t":"read","s":64,"l":1}').latency is True
    assert SessionSpec.decode(b'{"t":"read","s":64,"l":0}').latency is False
    assert SessionSpec.decode(b'{"t":"read","s":64}').latency is False
    for spec in (SessionSpec("read", 64, True), SessionSpec("send", 64, False, 8)):
        assert SessionSpec.decode(spec.encode()) == spec


async def test_both_ports_reject_a_malformed_spec_with_the_reason_and_serve_on() -> None:
    """Hand-made Requests: each bad spec gets a Reject whose reason the client prints; a
    good Request is accepted afterwards on both ports."""
    with trio.fail_after(60):
        async with bench_client() as client:
            rnic = client.rnic
            pd = rnic.alloc_pd()
            for data, reason in BAD_SPECS.values():
                qp = rnic.create_qp(pd, rnic.create_cq())
                with pytest.raises(ConnectRejected) as info:
                    await client.cm.connect(client.host, client.port, qp, private_data=data)
                shown = str(connect_error("the server", info.value))
                assert f"rejected the QP: bad session request: {reason}" in shown
            good = SessionSpec("read", 64, True).encode()
            conn = await client.cm.connect(
                client.host, client.port, rnic.create_qp(pd, rnic.create_cq()), private_data=good
            )
            assert conn.negotiated is not None
            port = Advert.decode(conn.negotiated.peer_private_data).iwarp_blocking_port
            await conn.disconnect(timeout=5.0)
            other = Rnic("blocking")  # an RNIC is not thread-safe: one for the worker thread
            other_pd = other.alloc_pd()

            def blocking(data: bytes) -> bytes:
                qp = other.create_qp(other_pd, other.create_cq())
                try:
                    c = connect(client.host, port, qp, private_data=data, timeout=5.0)
                except ConnectRejected as exc:
                    return bytes(exc.private_data)
                c.abort()
                return b""

            for data, reason in BAD_SPECS.values():
                answer = await trio.to_thread.run_sync(blocking, data)
                assert f"bad session request: {reason}".encode() in answer
            assert await trio.to_thread.run_sync(blocking, good) == b""
