"""The offloaded target's credit count around each chain branch (kbtp.target_offload_credits,
docs/kbtp.md §8.1): where the +1 and the deferred -1 go."""

from __future__ import annotations

from kbtp.target_offload_credits import CreditCount
from stack.constants import ALL_ONES_64
from stack.rnic import (
    Access,
    Branch,
    Check,
    Cmp,
    Guard,
    LocalAtomic,
    LocalWrite,
    Patch,
    PatchField,
    Ref,
    Rnic,
    SendFlags,
    SendWR,
    WrOpcode,
)


def _count() -> tuple[CreditCount, int]:
    mr = Rnic().alloc_pd().reg_mr(bytearray(CreditCount.SIZE), Access.LOCAL_WRITE)
    return CreditCount(mr), mr.lkey


def _is_start(item: object, lkey: int) -> bool:
    return isinstance(item, LocalAtomic) and item.dst.lkey == lkey and item.add == 1


def test_the_count_starts_after_the_leading_checks_so_a_stopped_run_counts_nothing() -> None:
    """A branch that takes a ticket and checks it (ALLOC_STORE's shape) is counted only
    once its Check has passed: a Check that stops the run leaves no +1 without its -1."""
    count, lkey = _count()
    ticket = LocalAtomic(Ref(lkey, 16, 8, "little"), Ref.run(0), 5)
    check = Check((Guard(Ref.run(0), Cmp.LT, 100),))
    write = LocalWrite(Ref.run(8, 8), bytes(8))
    send = SendWR(1, WrOpcode.SEND, inline_data=bytes(16), send_flags=SendFlags.NONE)
    patch = Patch(3, PatchField.PAYLOAD, Ref.run(0), at=0)
    wrapped = count.wrap(Branch((ticket, check, write, send), (patch,)))
    starts = [i for i, item in enumerate(wrapped.wrs) if _is_start(item, lkey)]
    assert starts == [2] and len(wrapped.wrs) == 6
    assert wrapped.wrs[4] is send and wrapped.patches == (Patch(4, PatchField.PAYLOAD, Ref.run(0)),)
    end = wrapped.wrs[-1]
    assert isinstance(end, LocalAtomic) and end.deferred and end.add == ALL_ONES_64
    assert wrapped.guards[-1].cmp is Cmp.LT  # only with room


def test_a_branch_without_checks_is_counted_from_its_start() -> None:
    count, lkey = _count()
    send = SendWR(1, WrOpcode.SEND, inline_data=bytes(16), send_flags=SendFlags.NONE)
    check_after_send = Check((Guard(Ref.run(0), Cmp.LT, 100),))
    wrapped = count.wrap(Branch((send, check_after_send)))
    assert _is_start(wrapped.wrs[0], lkey) and wrapped.wrs[1] is send
