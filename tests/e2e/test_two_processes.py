"""Two endpoints in two processes, over loopback TCP."""

from __future__ import annotations

import struct
import subprocess
import sys

import trio

from stack.rnic import RecvWR, SendWR, WcStatus, WrOpcode
from stack.transport.cm import ConnectionManager
from tests.e2e.helpers import make_host
from tests.e2e.peer_process import ADVERT


async def test_operations_against_a_peer_process() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.e2e.peer_process"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = await trio.to_thread.run_sync(proc.stdout.readline)
        port = int(line.split()[1])
        host = make_host("client")
        async with ConnectionManager.open(host.rnic) as cm:
            conn = await cm.connect("127.0.0.1", port, host.qp)
            assert conn.negotiated is not None
            stag, to, length = ADVERT.unpack(conn.negotiated.peer_private_data)
            assert length == 65536
            data = bytes(range(256)) * 200
            src = host.mr(data)
            sink = host.mr(len(data))
            result = host.mr(8)
            reply = host.mr(64)
            host.qp.post_recv(RecvWR(100, (host.sge(reply),)))
            host.qp.post_send(
                [
                    SendWR(1, WrOpcode.RDMA_WRITE, (host.sge(src),), rkey=stag, remote_addr=to),
                    SendWR(2, WrOpcode.RDMA_READ, (host.sge(sink),), rkey=stag, remote_addr=to),
                    SendWR(
                        3,
                        WrOpcode.ATOMIC_FETCH_AND_ADD,
                        (host.sge(result),),
                        rkey=stag,
                        remote_addr=to + 40000,
                        compare_add=41,
                    ),
                    SendWR(4, WrOpcode.SEND, inline_data=b"ping"),
                ]
            )
            with trio.fail_after(20):
                wcs = await host.cq.wait_for(5)
            statuses = {wc.wr_id: wc.status for wc in wcs}
            assert statuses == {i: WcStatus.SUCCESS for i in (1, 2, 3, 4, 100)}
            assert bytes(sink.buf) == data
            assert struct.unpack("<Q", result.buf)[0] == struct.unpack_from("<Q", data, 40000)[0]
            assert bytes(reply.buf[:4]) == b"gnip"
            await conn.disconnect()
        assert await trio.to_thread.run_sync(proc.wait, 20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
