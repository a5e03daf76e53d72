"""A peer in its own process for the two-process tests: ``python -m tests.e2e.peer_process``.

It listens on 127.0.0.1 (port printed on stdout as ``PORT <n>``), accepts one connection,
advertises a 64 KiB memory region in its accept private data (STag, TO, length as three
big-endian u32/u64/u32), echoes every Send back as a Send, and exits when the peer
disconnects.
"""

from __future__ import annotations

import struct
import sys

import trio

from stack.rnic import Access, RecvWR, Rnic, SendWR, Sge, WcOpcode, WcStatus, WrOpcode
from stack.transport.cm import ConnectionManager

ADVERT = struct.Struct(">IQI")


async def main() -> None:
    rnic = Rnic("peer")
    pd = rnic.alloc_pd()
    cq = rnic.create_cq()
    qp = rnic.create_qp(pd, cq)
    region = pd.reg_mr(
        bytearray(65536),
        Access.LOCAL_WRITE | Access.REMOTE_WRITE | Access.REMOTE_READ | Access.REMOTE_ATOMIC,
    )
    inbox = pd.reg_mr(bytearray(4096), Access.LOCAL_WRITE)
    qp.post_recv([RecvWR(i, (Sge(inbox.base, 4096, inbox.lkey),)) for i in range(1)])
    async with ConnectionManager.open(rnic) as cm:
        listener = await cm.listen("127.0.0.1", 0)
        print(f"PORT {listener.port}", flush=True)
        request = await listener.get_request()
        conn = await request.accept(qp, ADVERT.pack(region.rkey, region.base, region.length))
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_echo, qp, cq, inbox)
            await conn.wait_closed()
            nursery.cancel_scope.cancel()
    sys.exit(0)


async def _echo(qp, cq, inbox) -> None:
    while True:
        wc = await cq.next()
        if wc.opcode is WcOpcode.RECV and wc.status is WcStatus.SUCCESS:
            data = bytes(inbox.buf[: wc.byte_len])
            qp.post_recv(RecvWR(wc.wr_id + 1, (Sge(inbox.base, 4096, inbox.lkey),)))
            qp.post_send(SendWR(wc.wr_id, WrOpcode.SEND, inline_data=data[::-1]))


if __name__ == "__main__":
    trio.run(main)
