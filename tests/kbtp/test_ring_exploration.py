"""Exhaustive interleaving exploration of the free-block ring and the target (draft §3.3, §3.4).

Three initiators share one target: A (target-executed ALLOC_STORE, inline data) and B
(ALLOC_STORE through RDMA Read) in different trust domains on the shared ring, and C with
DIRECT_ALLOC on its own partition ring (FetchAdd, slot reads, RDMA Write, BIND) that also
uses target-executed ALLOC_STORE, frees, and may stall until its tickets are abandoned;
C's ring in the masked counter format (draft §3.3) or the unmasked one (§9.2), tickets
from 0 or from just before the 32-bit wrap.
See :mod:`tests.kbtp.ring_model` for the transitions and the invariants checked in every
reachable state.  The offload variants send C's ALLOC_STOREs (by RDMA Read) and FREEs to the
offloaded target's own chain first, run by the software RNIC on the model's memory
(:mod:`tests.kbtp.ring_offload`, docs/kbtp.md §8.1), with the same invariants.  The
state counts are printed (run with ``-s``) for the report.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

import kbtp.ring as ring_mod
import kbtp.target_core as tc
from kbtp.constants import TICKET_MODULUS, CounterFormat, counter_operands
from kbtp.layout import RingGeometry, TargetLayout, write_slot
from kbtp.messages import AllocStore
from kbtp.target_actions import Action
from kbtp.target_config import InitiatorConfig
from kbtp.target_offload_alloc import AllocLog
from kbtp.target_state import SessionState
from stack.rnic import Branch, Check, LocalWrite
from tests.kbtp import ring_offload
from tests.kbtp.ring_model import ModelConfig, ModelViolation, explore

SHARED_RING_CONFIG = ModelConfig(budgets=(2, 2, 2))
"""A and B allocate, free and reallocate across trust domains; C allocates directly."""
DIRECT_CONFIG = ModelConfig(budgets=(1, 1, 4))
"""C mixes direct and target-executed allocations until frees defer and allocations wait."""


def _report(name: str, mc: ModelConfig) -> dict[str, int]:
    stats = explore(mc)
    print(
        f"\n{name}: {stats.states} states, {stats.transitions} transitions, "
        f"{stats.terminal} terminal; coverage {dict(sorted(stats.coverage.items()))}"
    )
    assert stats.states > 100
    return dict(stats.coverage)


def test_s3_3_s3_4_exploration_shared_ring_across_trust_domains() -> None:
    coverage = _report("shared ring", SHARED_RING_CONFIG)
    for event in ("ALLOC_STORE:SUCCESS", "ALLOC_STORE:NO_SPACE", "FREE:SUCCESS", "BIND:SUCCESS"):
        assert coverage.get(event, 0) > 0, event
    assert coverage.get("BIND:TICKET_ABANDONED", 0) > 0
    assert coverage.get("direct:write-after-invalidate", 0) > 0


def test_s3_3_s3_4_exploration_direct_and_target_allocation_deferred_frees() -> None:
    coverage = _report("partition ring", DIRECT_CONFIG)
    for event in (
        "state:deferred",  # a free found its slot unconsumed and deferred the write
        "state:alloc-wait",  # a target-executed allocation waited for that write
        "state:abandoned",  # tickets timed out and were reclaimed
        "invalidated",  # ... after the Partition/Ring STag invalidation completed
        "BIND:SUCCESS",
        "BIND:TICKET_ABANDONED",
        "direct:write-after-invalidate",
        "direct:stale-stag",  # reading the slot through the invalidated Ring STag fails
    ):
        assert coverage.get(event, 0) > 0, event


@pytest.mark.parametrize(
    ("name", "mc"), [("shared ring", SHARED_RING_CONFIG), ("partition ring", DIRECT_CONFIG)]
)
def test_s8_1_exploration_with_the_offloaded_targets_chains(name: str, mc: ModelConfig) -> None:
    """C's ALLOC_STOREs and FREEs run by the chains where the offloaded target runs them,
    by the core where they fall back (a deferred free, an operation in flight, §8.1)."""
    coverage = _report(f"{name}, offloaded", replace(mc, offload=True))
    for event in ("offloaded", "fallback", "ALLOC_STORE:SUCCESS", "FREE:SUCCESS", "BIND:SUCCESS"):
        assert coverage.get(event, 0) > 0, event
    if mc is DIRECT_CONFIG:
        for event in ("state:deferred", "state:alloc-wait", "state:abandoned"):
            assert coverage.get(event, 0) > 0, event


UNMASKED_WRAP_CONFIG = ModelConfig(
    budgets=(1, 1, 4), counter_format=CounterFormat.UNMASKED, first_ticket=TICKET_MODULUS - 3
)
"""DIRECT_CONFIG with C's partition ring in the unmasked format of draft §9.2 (plain
FetchAdds), every ring's tickets starting 3 before the 32-bit wrap."""


def test_s9_2_exploration_unmasked_counter_across_the_ticket_wrap() -> None:
    coverage = _report("unmasked partition ring across the wrap", UNMASKED_WRAP_CONFIG)
    for event in (
        "state:wrapped",
        "state:deferred",
        "state:alloc-wait",
        "state:abandoned",
        "BIND:SUCCESS",
        "BIND:TICKET_ABANDONED",
        "direct:write-after-invalidate",
    ):
        assert coverage.get(event, 0) > 0, event


@pytest.mark.slow
def test_s3_3_exploration_masked_counter_across_the_ticket_wrap() -> None:
    mc = ModelConfig(budgets=(2, 2, 2), first_ticket=TICKET_MODULUS - 1)
    coverage = _report("masked rings across the wrap", mc)
    assert coverage.get("state:wrapped", 0) > 0 and coverage.get("BIND:SUCCESS", 0) > 0


@pytest.mark.slow
def test_s3_3_s3_4_exploration_larger_budgets() -> None:
    coverage = _report("larger budgets", ModelConfig(budgets=(2, 2, 4)))
    assert coverage.get("state:deferred", 0) > 0


@pytest.mark.slow
def test_s3_3_s3_4_exploration_ring_larger_than_pool() -> None:
    """N = 4 > F = 3 on the partition ring and N = 4 > F = 2 on the shared ring."""
    mc = ModelConfig(budgets=(1, 1, 4), shared_order=2, direct_quota=3)
    coverage = _report("N > F", mc)
    assert coverage.get("BIND:SUCCESS", 0) > 0


# --------------------------------------------------------------------------------------
# The exploration finds seeded bugs (so its passing means something)
# --------------------------------------------------------------------------------------


def _expect_violation(mc: ModelConfig, match: str) -> None:
    with pytest.raises(ModelViolation, match=match):
        explore(mc)


def test_s8_1_exploration_catches_a_chain_that_does_not_consume_its_slot(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The offloaded ALLOC_STORE's chain without its write of all ones to slot octets
    8-15 (§3.3): the block it hands out stays in the ring too."""
    original = ring_offload.alloc_store_branches

    def careless(
        layout: TargetLayout,
        lkey: int,
        initiator: InitiatorConfig,
        ring: RingGeometry,
        log: AllocLog,
    ) -> list[Branch]:
        out: list[Branch] = []
        for branch in original(layout, lkey, initiator, ring, log):
            wrs = tuple(
                Check(()) if isinstance(i, LocalWrite) and i.src == b"\xff" * 8 else i
                for i in branch.wrs
            )
            out.append(replace(branch, wrs=wrs))
        return out

    monkeypatch.setattr(ring_offload, "alloc_store_branches", careless)
    _expect_violation(replace(DIRECT_CONFIG, offload=True), "blocks")


def test_s3_3_exploration_catches_free_overwriting_an_unconsumed_slot(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def careless_free(self: ring_mod.FreeRing, block_offset: int) -> ring_mod.FreeOutcome:
        ticket, slot_offset = self._fetch_add(self.geometry.tail_offset)
        write_slot(self.mem, self.geometry.slots_offset + slot_offset, ticket, block_offset)
        return ring_mod.FreeOutcome(ticket, False, (ticket,))

    monkeypatch.setattr(ring_mod.FreeRing, "free", careless_free)
    _expect_violation(DIRECT_CONFIG, "blocks")


def test_s9_2_exploration_catches_the_masked_operands_on_an_unmasked_ring(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The target's own FetchAdds with the §3.3 operands on C's unmasked ring corrupt it."""
    masked = CounterFormat.MASKED
    monkeypatch.setattr(ring_mod, "counter_operands", lambda fmt, n: counter_operands(masked, n))
    _expect_violation(UNMASKED_WRAP_CONFIG, "corrupt")


def test_s3_4_exploration_catches_reclaim_before_invalidation(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    original = tc.TargetCore._check_tickets

    def hasty(
        self: tc.TargetCore, session: int, sess: SessionState, now: float, out: list[Action]
    ) -> None:
        original(self, session, sess, now, out)
        sess.invalidating.clear()
        self._reclaim_abandoned(self._initiators[b"C"], out, now)

    monkeypatch.setattr(tc.TargetCore, "_check_tickets", hasty)
    _expect_violation(SHARED_RING_CONFIG, "no longer holds")


def test_s6_4_exploration_catches_missing_clearing(monkeypatch: pytest.MonkeyPatch) -> None:
    original = tc.TargetCore.__init__

    def init(self: tc.TargetCore, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        for ring in self._rings.values():
            ring.clear_on_free = False

    monkeypatch.setattr(tc.TargetCore, "__init__", init)
    _expect_violation(SHARED_RING_CONFIG, "not cleared")


def test_s3_4_exploration_catches_ignored_quota(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tc.TargetCore, "usage", lambda self, identity: 0)
    _expect_violation(SHARED_RING_CONFIG, "quota")


def test_s6_3_exploration_catches_entry_written_before_data(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def eager(self: tc.TargetCore, op_id: int, now: float, out: list[Action]) -> bool:
        op = self._ops.pop(op_id)
        assert isinstance(op.request, AllocStore)  # as the real _alloc_got_block asserts
        block, ready = self._rings[op.ring].consume(op.ticket)
        self._wake(op.ring, ready, out, now)
        self._finish_alloc(op.session, op.request, block, out)
        return True

    monkeypatch.setattr(tc.TargetCore, "_alloc_got_block", eager)
    _expect_violation(SHARED_RING_CONFIG, "lost its data")
