"""Manual progress: ``RdmaConnection.next_completion`` drives the connection's input from the
task that waits for a completion, the reader task standing down meanwhile, and hands the
input back to the reader when it returns."""

from __future__ import annotations

import trio

from stack.rnic import Access, SendFlags, SendWR, WcStatus, WrOpcode
from stack.rnic.memory import MemoryRegion
from stack.rnic.verbs import RecvWR
from tests.e2e.helpers import Host, make_host, tcp_pair

RR = Access.LOCAL_WRITE | Access.REMOTE_READ
RA = Access.LOCAL_WRITE | Access.REMOTE_ATOMIC


def _driven(conn: object) -> list[bool]:
    """Wrap ``conn``'s ``_apply``: records whether each read was applied by the task that
    waits for a completion (True) or by the reader (False)."""
    seen: list[bool] = []
    apply = conn._apply  # type: ignore[attr-defined]

    async def recording(data: object) -> bool:
        seen.append(conn._driver is trio.lowlevel.current_task())  # type: ignore[attr-defined]
        return bool(await apply(data))

    conn._apply = recording  # type: ignore[attr-defined]
    return seen


def _post_read(
    requester: Host, target: Host, wr_id: int = 1, size: int = 64
) -> tuple[MemoryRegion, MemoryRegion]:
    """``requester`` posts a Read (``wr_id``) of ``size`` octets of ``target``'s memory:
    (the source, the sink)."""
    source = target.mr(bytes(range(size)), RR)
    sink = requester.mr(size)
    requester.qp.post_send(
        SendWR(wr_id, WrOpcode.RDMA_READ, (requester.sge(sink),), rkey=source.rkey,
               remote_addr=source.base)
    )  # fmt: skip
    return source, sink


async def test_reads_and_atomics_complete_driven_by_the_waiting_task() -> None:
    with trio.fail_after(20):
        async with tcp_pair() as (client, server):
            assert client.conn is not None
            source = server.mr(bytes(range(256)) * 4, RR | Access.REMOTE_ATOMIC)
            sink = client.mr(1024)
            applied = _driven(client.conn)
            for i in range(50):
                size = (i * 37) % 1024 or 1
                client.qp.post_send(
                    SendWR(
                        i,
                        WrOpcode.RDMA_READ,
                        (client.sge(sink, 0, size),),
                        rkey=source.rkey,
                        remote_addr=source.base + 1024 - size,
                    )
                )
                wc = await client.conn.next_completion(client.cq)
                assert (wc.wr_id, wc.status, wc.byte_len) == (i, WcStatus.SUCCESS, size)
                assert bytes(sink.buf[:size]) == bytes(source.buf[1024 - size :])
                client.qp.post_send(
                    SendWR(
                        100 + i,
                        WrOpcode.ATOMIC_FETCH_AND_ADD,
                        (client.sge(sink, 0, 8),),
                        rkey=source.rkey,
                        remote_addr=source.base,
                        compare_add=1,
                    )
                )
                wc = await client.conn.next_completion(client.cq)
                assert (wc.wr_id, wc.status) == (100 + i, WcStatus.SUCCESS)
                assert (
                    int.from_bytes(sink.buf[:8], "little")
                    == int.from_bytes(bytes(range(8)), "little") + i
                )
            # Most answers were applied by the waiting task itself, not handed over.
            assert applied.count(True) >= 90, applied


async def test_the_reader_takes_over_again_for_what_comes_unasked() -> None:
    """After next_completion returns, a Send that nobody waits for is still received (by
    the reader), and a Read the peer posts is still answered."""
    with trio.fail_after(20):
        async with tcp_pair() as (client, server):
            assert client.conn is not None and server.conn is not None
            _post_read(client, server)
            assert (await client.conn.next_completion(client.cq)).status is WcStatus.SUCCESS
            inbox = client.mr(16)
            client.qp.post_recv(RecvWR(7, (client.sge(inbox),)))
            message = server.mr(b"unasked message!")
            server.qp.post_send(SendWR(8, WrOpcode.SEND, (server.sge(message),)))
            _ours, theirs = _post_read(server, client, 9, 32)
            # Nobody on the client waits: its reader applies both.
            assert {wc.wr_id for wc in await server.cq.wait_for(2)} == {8, 9}
            assert bytes(theirs.buf) == bytes(range(32))
            assert (await client.cq.next()).wr_id == 7 and bytes(inbox.buf) == b"unasked message!"


async def test_a_cancelled_wait_hands_the_input_back() -> None:
    with trio.fail_after(20):
        async with tcp_pair() as (client, server):
            assert client.conn is not None
            with trio.move_on_after(0.2) as scope:
                await client.conn.next_completion(client.cq)  # nothing posted: it waits
            assert scope.cancelled_caught and client.conn._driver is None
            _post_read(client, server)
            assert (await client.cq.next()).status is WcStatus.SUCCESS  # the reader's work


async def test_a_shared_cq_is_waited_for_as_cq_next() -> None:
    """A CQ that takes completions of another QP too: the input is not driven (that
    QP's completion would never wake the task), the wait is cq.next()'s."""
    with trio.fail_after(20):
        async with tcp_pair() as (client, server):
            assert client.conn is not None
            other = client.rnic.create_qp(client.pd, client.cq)
            assert client.cq.queue_pairs == 2
            applied = _driven(client.conn)
            _post_read(client, server)
            assert (await client.conn.next_completion(client.cq)).wr_id == 1
            assert True not in applied
            client.rnic.destroy_qp(other)
            assert client.cq.queue_pairs == 1


async def test_the_peer_closing_while_a_task_drives_ends_the_connection() -> None:
    with trio.fail_after(20):
        async with tcp_pair() as (client, server):
            assert client.conn is not None and server.conn is not None

            async def close_soon() -> None:
                await trio.sleep(0.1)
                await server.conn.disconnect()  # type: ignore[union-attr]

            async with trio.open_nursery() as nursery:
                nursery.start_soon(close_soon)
                inbox = client.mr(8)
                client.qp.post_recv(RecvWR(3, (client.sge(inbox),)))
                wc = await client.conn.next_completion(client.cq)  # the FIN flushes it
                assert wc.wr_id == 3 and wc.status is WcStatus.WR_FLUSH_ERR
            await client.conn.wait_closed()


def test_queue_pairs_counts_each_cq_once() -> None:
    host = make_host("h")
    assert host.cq.queue_pairs == 1
    recv_cq = host.rnic.create_cq()
    qp = host.rnic.create_qp(host.pd, host.cq, recv_cq)
    assert (host.cq.queue_pairs, recv_cq.queue_pairs) == (2, 1)
    host.rnic.destroy_qp(qp)
    host.rnic.destroy_qp(qp)  # a second destroy changes nothing
    assert (host.cq.queue_pairs, recv_cq.queue_pairs) == (1, 0)


async def test_a_completion_that_comes_another_way_ends_the_wait() -> None:
    """Writes completing as the writer task sends them (the second post of a task step is
    corked: the writer sends it once the task waits): no input comes for them, and the
    waiting task still gets each completion."""
    with trio.fail_after(10):
        async with tcp_pair() as (client, server):
            assert client.conn is not None
            target = server.mr(64, Access.LOCAL_WRITE | Access.REMOTE_WRITE)
            data = client.mr(b"w" * 64)
            applied = _driven(client.conn)
            for round_ in range(5):
                for i in range(3):  # one task step: the first leaves at once, the rest corked
                    client.qp.post_send(
                        SendWR(10 * round_ + i, WrOpcode.RDMA_WRITE, (client.sge(data),),
                               rkey=target.rkey, remote_addr=target.base)
                    )  # fmt: skip
                got = [(await client.conn.next_completion(client.cq)).wr_id for _ in range(3)]
                assert got == [10 * round_ + i for i in range(3)]
            assert True not in applied  # nothing came in: each wait ended by the push
            assert bytes(target.buf) == b"w" * 64


async def test_a_wake_up_while_the_writer_waits_for_room_leaves_the_connection_whole() -> None:
    """A completion pushed by another task while one task drives the input and the writer
    waits for room to send (the peer reads nothing): the wake-up (``notify_closing`` on
    the socket) ends both waits; the driving task returns the completion, the writer waits
    again, and what it held goes out once the peer reads."""
    from stack.rnic.verbs import WcOpcode, WorkCompletion
    from tests.e2e.test_answers_early import _HeldSocket

    with trio.fail_after(30):
        async with tcp_pair() as (client, server):
            assert client.conn is not None and server.conn is not None
            _post_read(client, server)  # both drivers have started (their sockets)
            assert (await client.conn.next_completion(client.cq)).status is WcStatus.SUCCESS
            held = _HeldSocket(server.conn._sock)
            server.conn._sock = held  # type: ignore[assignment]
            held.hold = True  # the server reads nothing: the client's sends back up
            target = server.mr(1 << 20, Access.LOCAL_WRITE | Access.REMOTE_WRITE)
            data = client.mr(bytes(range(256)) * 4096)
            sendq = client.conn._sendq
            assert sendq is not None
            for _ in range(64):  # unsignalled Writes until the socket takes no more
                client.qp.post_send(
                    SendWR(0, WrOpcode.RDMA_WRITE, (client.sge(data),), SendFlags.NONE,
                           rkey=target.rkey, remote_addr=target.base)
                )  # fmt: skip
                await trio.sleep(0)
                if sendq.has_backlog:
                    break
            assert sendq.has_backlog
            inbox = client.mr(8)
            client.qp.post_recv(RecvWR(7, (client.sge(inbox),)))  # what the task waits for
            got: list[int] = []

            async def drive() -> None:
                got.append((await client.conn.next_completion(client.cq)).wr_id)  # type: ignore[union-attr]

            async with trio.open_nursery() as nursery:
                nursery.start_soon(drive)
                await trio.sleep(0.05)  # it waits for input; the writer waits for room
                assert client.conn._driver_waiting and sendq.has_backlog
                # A completion from this task (as a local WR's, or a flush's).
                client.cq.push(WorkCompletion(5, WcStatus.SUCCESS, WcOpcode.LOCAL_INV, 1, 0))
            assert got == [5]
            await trio.sleep(0.05)
            held.hold = False
            server.qp.post_send(SendWR(8, WrOpcode.SEND, inline_data=b"8 octets"))
            assert (await client.conn.next_completion(client.cq)).wr_id == 7
            assert bytes(inbox.buf) == b"8 octets"
            _post_read(client, server, 2)  # behind the Writes (RFC 5040 §5.5)
            assert (await client.conn.next_completion(client.cq)).wr_id == 2
            assert bytes(target.buf) == bytes(data.buf)  # every Write the writer held landed
            assert client.conn.error is None and sendq.sent > 0
