"""A closed connection's memory goes when its last reference does, without waiting for the
cyclic garbage collector (no reference cycle survives the close)."""

from __future__ import annotations

import gc
import weakref

import trio

from stack.rnic import Rnic
from stack.transport import ConnectionManager


async def _one_connection(refs: dict[str, weakref.ref[object]]) -> None:
    srnic, crnic = Rnic("s"), Rnic("c")
    async with ConnectionManager.open(srnic) as scm, ConnectionManager.open(crnic) as ccm:
        listener = await scm.listen("127.0.0.1", 0)
        sqp = srnic.create_qp(srnic.alloc_pd(), srnic.create_cq())
        cqp = crnic.create_qp(crnic.alloc_pd(), crnic.create_cq())
        accepted = []

        async def serve() -> None:
            request = await listener.get_request()
            accepted.append(await request.accept(sqp))

        scm.nursery.start_soon(serve)
        conn = await ccm.connect("127.0.0.1", listener.port, cqp)
        with trio.fail_after(5):
            while not accepted:
                await trio.sleep(0.01)
        for name, obj in (
            ("client connection", conn),
            ("server connection", accepted[0]),
            ("client engine", conn.engine),
            ("server engine", accepted[0].engine),
            ("client MPA buffers", conn.engine.mpa),
        ):
            refs[name] = weakref.ref(obj)
        await conn.disconnect()
        await accepted[0].wait_closed()


def test_a_closed_connection_is_freed_by_reference_counting() -> None:
    refs: dict[str, weakref.ref[object]] = {}
    gc.collect()
    gc.disable()
    try:
        trio.run(_one_connection, refs)
        alive = [name for name, ref in refs.items() if ref() is not None]
    finally:
        gc.enable()
    assert refs and not alive, f"kept alive by a reference cycle: {alive}"
