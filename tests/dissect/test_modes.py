"""The decoder's per-direction mode table (stack.dissect.decoder.modes)."""

from __future__ import annotations

import pytest

from stack.dissect.decoder.modes import TRANSITIONS, Cause, Mode, next_mode


def test_every_mode_is_reachable_from_start_and_dead_is_final() -> None:
    seen = {Mode.START}
    frontier = [Mode.START]
    while frontier:
        mode = frontier.pop()
        for (src, _cause), dst in TRANSITIONS.items():
            if src is mode and dst not in seen:
                seen.add(dst)
                frontier.append(dst)
    assert seen == set(Mode)
    assert {dst for (src, _), dst in TRANSITIONS.items() if src is Mode.DEAD} == {Mode.DEAD}


def test_a_change_the_table_does_not_list_is_refused() -> None:
    assert next_mode(Mode.START, Cause.REQUEST) is Mode.HOLD
    assert next_mode(Mode.SEARCH, Cause.SYNCED) is Mode.FPDU
    with pytest.raises(AssertionError, match="not a legal change"):
        next_mode(Mode.DEAD, Cause.SYNCED)
    with pytest.raises(AssertionError):
        next_mode(Mode.HOLD, Cause.REQUEST)  # a second Request from the same side
