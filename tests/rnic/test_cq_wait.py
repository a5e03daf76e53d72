"""CompletionQueue.next: the tasks it wakes, and a wait cancelled before a push."""

import pytest
import trio
import trio.testing

from stack.rnic.cq import CompletionQueue
from stack.rnic.verbs import WcOpcode, WcStatus, WorkCompletion


def _wc(wr_id: int) -> WorkCompletion:
    return WorkCompletion(wr_id, WcStatus.SUCCESS, WcOpcode.RDMA_READ, 1, 64)


def test_cancelled_wait_leaves_the_completion() -> None:
    async def main() -> None:
        cq = CompletionQueue()
        with trio.move_on_after(0.01):
            await cq.next()
        cq.push(_wc(1))  # nobody waits any more: nothing to wake
        assert len(cq) == 1
        assert (await cq.next()).wr_id == 1

    trio.run(main)


@pytest.mark.parametrize("settle", [False, True], ids=["both-pushed", "one-then-one"])
def test_two_waiters_take_one_completion_each(settle: bool) -> None:
    """Two pushes wake both waiters; with the second push later, both wake at the first,
    one takes it and the other waits again."""

    async def main() -> None:
        cq = CompletionQueue()
        got: list[int] = []

        async def wait() -> None:
            got.append((await cq.next()).wr_id)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(wait)
            nursery.start_soon(wait)
            await trio.testing.wait_all_tasks_blocked()
            cq.push(_wc(1))
            if settle:
                await trio.testing.wait_all_tasks_blocked()
                assert got == [1]
            cq.push(_wc(2))
        assert sorted(got) == [1, 2]

    trio.run(main)
