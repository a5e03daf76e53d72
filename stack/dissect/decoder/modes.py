"""The modes of one direction of a decoded connection, and every legal change between them.

A :class:`~stack.dissect.decoder.walker.DirectionDecoder` is in one :class:`Mode`; it moves
only through :data:`TRANSITIONS` (``(mode, cause) -> next mode``), so what can happen to a
direction is read from one table, and a change the table does not list is a bug that
raises at once.
"""

from __future__ import annotations

import enum

__all__ = ["Cause", "Mode", "TRANSITIONS", "next_mode"]


class Mode(enum.Enum):
    """What the bytes of a direction are read as (RFC 5044 §7.1 startup, then FPDUs)."""

    START = "start"  # an MPA Request or Reply is expected at stream offset 0
    HOLD = "hold"  # the initiator's bytes after its Request wait for the Reply's M bit
    FPDU = "fpdu"  # Full Operation: FPDUs walked from ULPDU_Length
    SEARCH = "search"  # framing unknown (mid-stream start, gap, lost sync): find a chain
    DEAD = "dead"  # not iWARP, rejected, or no chain found: bytes counted, not decoded


class Cause(enum.Enum):
    """Why a direction changes mode."""

    REQUEST = "sent its MPA Request"
    FULL_OPERATION = "the MPA Reply accepted: Full Operation begins"
    MIDSTREAM = "no startup frame in view"
    GAP = "a TCP gap lost the framing"
    NO_REPLY = "no MPA Reply before the held bytes reached their limit"
    LOST_SYNC = "an FPDU boundary did not hold"
    SYNCED = "a consistent FPDU chain was found"
    ENDED = "not iWARP, rejected, or given up"


_M = Mode
_C = Cause
TRANSITIONS: dict[tuple[Mode, Cause], Mode] = {
    (_M.START, _C.REQUEST): _M.HOLD,
    (_M.START, _C.FULL_OPERATION): _M.FPDU,
    (_M.HOLD, _C.FULL_OPERATION): _M.FPDU,
    (_M.START, _C.MIDSTREAM): _M.SEARCH,
    (_M.START, _C.GAP): _M.SEARCH,
    (_M.HOLD, _C.GAP): _M.SEARCH,
    (_M.HOLD, _C.NO_REPLY): _M.SEARCH,
    (_M.SEARCH, _C.FULL_OPERATION): _M.FPDU,  # a late Reply: the held bytes from SeqStart
    (_M.FPDU, _C.GAP): _M.SEARCH,
    (_M.SEARCH, _C.GAP): _M.SEARCH,
    (_M.FPDU, _C.LOST_SYNC): _M.SEARCH,
    (_M.SEARCH, _C.LOST_SYNC): _M.SEARCH,
    (_M.SEARCH, _C.SYNCED): _M.FPDU,
    **{(mode, _C.ENDED): _M.DEAD for mode in Mode},
}
"""Every legal (mode, cause) -> next mode of a direction."""


def next_mode(mode: Mode, cause: Cause) -> Mode:
    """The mode after ``cause`` in ``mode`` (:data:`TRANSITIONS`); anything else is a bug."""
    try:
        return TRANSITIONS[mode, cause]
    except KeyError:
        raise AssertionError(
            f"decoder mode {mode.value}: {cause.value} is not a legal change"
        ) from None
