"""The bounds of the ``kbtp`` commands' numbers, in one place, and their argparse types.

Each count, size and time a ``kbtp`` subcommand takes is checked at argument parsing by
a type here; the target configuration the arguments add up to is checked as a whole by
:func:`check_target_config` before any memory is mapped (docs/kbtp.md §11).  A bound is
what the wire can carry where that is the tighter one (Request Credits and the Ticket
Timeout of HELLO_ACK, §5.4; the Block Size an initiator accepts, §4.2), otherwise what
this target serves in bounded memory and start-up time: its table, rings and receive
buffers are initialized in Python, one entry or slot at a time.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

from kbtp.constants import DEFAULT_MAX_BLOCK_SIZE, MAX_REQUEST_CREDITS
from kbtp.target_config import (
    TargetConfig,
    check_config,
    check_handle_ranges,
    plan_target_layout,
)
from kbtp.target_session import receive_buffer_size
from stack.cli import CliError, binary_size, bounded_int, positive_seconds
from stack.errors import LocalError

__all__ = [
    "MAX_BLOCK_SIZE",
    "MAX_DEMO_INITIATORS",
    "MAX_INITIATORS",
    "MAX_POOL_BLOCKS",
    "MAX_POOL_OCTETS",
    "MAX_ROW_BYTES",
    "MAX_SESSION_RECEIVE_OCTETS",
    "MAX_TABLE_ENTRIES",
    "block_size",
    "check_target_config",
    "demo_initiators",
    "handles",
    "inflight",
    "initiators",
    "iterations",
    "max_inline",
    "pool_blocks",
    "request_credits",
    "row_bytes",
    "ticket_timeout",
]

MAX_BLOCK_SIZE = DEFAULT_MAX_BLOCK_SIZE
"""64 MiB: the largest Block Size an initiator accepts from HELLO_ACK (docs/kbtp.md §4.2);
also the most an INLINE store carries (``--max-inline``)."""
MAX_POOL_BLOCKS = 1 << 20
"""Blocks in a pool (F): far below the 2**28 slots of a ring (RING_MAX_ORDER), and its
shared ring starts in about a second."""
MAX_TABLE_ENTRIES = 1 << 22
"""Block table entries (the highest handle served + 1): 64 MiB of table, four handles for
each of :data:`MAX_POOL_BLOCKS` blocks (the default grant)."""
MAX_POOL_OCTETS = 1 << 32
"""Octets of the pool, block size x blocks (4 GiB); ``kbtp bench`` holds up to twice as
much again in its buffers."""
MAX_SESSION_RECEIVE_OCTETS = 1 << 30
"""Octets of the receive buffers a session posts on connecting, (Request Credits + receive
margin) x (56 + Max Inline) (docs/kbtp.md §9.2): what one connection makes the target
allocate."""
MAX_INITIATORS = 1024
"""Identities ``kbtp target --initiators`` generates."""
MAX_DEMO_INITIATORS = 64
"""Initiators ``kbtp demo -n`` runs at once, each with its own session and blocks."""
MAX_ROW_BYTES = 1 << 30
"""Octets a ``kbtp bench --bytes`` row moves (the row is 64 to 8192 operations anyway)."""


def _counted(maximum: int) -> Callable[[str], int]:
    """argparse type: an integer of 1 to ``maximum`` (``0x`` prefixes accepted)."""
    return lambda text: bounded_int(text, maximum)


pool_blocks = _counted(MAX_POOL_BLOCKS)
handles = _counted(MAX_TABLE_ENTRIES)
request_credits = _counted(MAX_REQUEST_CREDITS)
inflight = request_credits
"""``kbtp bench -t``: each request in flight is a Request Credit of the bench's target."""
iterations = pool_blocks
"""``kbtp bench -n``: an ALLOC_STORE row takes one block of the pool per operation."""
initiators = _counted(MAX_INITIATORS)
demo_initiators = _counted(MAX_DEMO_INITIATORS)


def block_size(text: str) -> int:
    """``65536``, ``64K``, ``1M``, ``0x10000`` -> octets, 1 to :data:`MAX_BLOCK_SIZE`."""
    return binary_size(text, MAX_BLOCK_SIZE, base=0)


def max_inline(text: str) -> int:
    """``--max-inline``: octets, 1 to :data:`MAX_BLOCK_SIZE` (K/M suffixes allowed)."""
    return block_size(text)


def row_bytes(text: str) -> int:
    """``kbtp bench --bytes``: octets, 1 to :data:`MAX_ROW_BYTES`."""
    return binary_size(text, MAX_ROW_BYTES, base=0)


def ticket_timeout(text: str) -> float:
    """``--ticket-timeout``: seconds, at least a millisecond (HELLO_ACK carries
    milliseconds, docs/kbtp.md §5.4), bounded as every time (:func:`positive_seconds`)."""
    value = positive_seconds(text)
    if value < 0.001:
        raise argparse.ArgumentTypeError(f"must be at least 0.001 seconds, got {text}")
    return value


def check_target_config(config: TargetConfig) -> None:
    """Refuse, as a :class:`CliError`, a configuration no target serves (``check_config``,
    its layout and handle ranges, docs/kbtp.md §3.6, §4.2) or one beyond the bounds here:
    the pool, the table, or the receive buffers of one session."""
    try:
        check_config(config)
        layout = plan_target_layout(config)
        check_handle_ranges(config, layout)
    except (LocalError, ValueError) as exc:
        raise CliError(str(exc)) from None
    pool = config.block_size * config.pool_blocks
    if config.block_size > MAX_BLOCK_SIZE or config.pool_blocks > MAX_POOL_BLOCKS:
        raise CliError(
            f"a pool of {config.pool_blocks} blocks of {config.block_size} octets: at most "
            f"{MAX_POOL_BLOCKS} blocks of at most {MAX_BLOCK_SIZE} octets"
        )
    if pool > MAX_POOL_OCTETS:
        raise CliError(
            f"a pool of {config.pool_blocks} blocks of {config.block_size} octets is {pool} "
            f"octets, more than {MAX_POOL_OCTETS} (4 GiB)"
        )
    if layout.table_entries > MAX_TABLE_ENTRIES:
        raise CliError(
            f"a block table of {layout.table_entries} entries (handles up to the highest "
            f"granted), more than {MAX_TABLE_ENTRIES}"
        )
    receives = (config.request_credits + config.receive_margin) * receive_buffer_size(config)
    if receives > MAX_SESSION_RECEIVE_OCTETS:
        raise CliError(
            f"{config.request_credits} credits (+{config.receive_margin} margin) of "
            f"{receive_buffer_size(config)}-octet receives (Max Inline {config.max_inline}) "
            f"are {receives} octets per session, more than {MAX_SESSION_RECEIVE_OCTETS} "
            "(1 GiB): fewer credits or a smaller Max Inline"
        )
