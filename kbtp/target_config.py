"""A KBTP target's configuration: its initiators, pool, table and policy (docs/kbtp.md §3, §4.2).

:class:`TargetConfig` and :class:`InitiatorConfig` are what an application writes;
:func:`check_config` refuses inconsistent ones with :class:`~stack.errors.LocalError`, and
:func:`plan_target_layout` places the table, pool and rings of a configuration in memory
(:func:`kbtp.layout.plan_layout`, docs/kbtp.md §3.6).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from kbtp.constants import (
    DEFAULT_HELLO_TIMEOUT,
    DEFAULT_IDLE_TIMEOUT,
    DEFAULT_MAX_INLINE,
    DEFAULT_RECEIVE_MARGIN,
    DEFAULT_REQUEST_CREDITS,
    DEFAULT_TICKET_TIMEOUT,
    DIRECT_CAPABILITIES,
    MAX_REQUEST_CREDITS,
    MAX_TICKET_TIMEOUT_MS,
    MIN_TARGET_IRD_DIRECT,
    RDMAP_BINDING_CAPABILITIES,
    Capability,
)
from kbtp.layout import ByteOrder, TargetLayout, plan_layout
from stack.errors import LocalError

__all__ = [
    "InitiatorConfig",
    "TargetConfig",
    "check_config",
    "check_handle_ranges",
    "granted_capabilities",
    "plan_target_layout",
]


@dataclass(frozen=True, slots=True)
class InitiatorConfig:
    """What the target grants one initiator identity (docs/kbtp.md §4.2).

    Fields: identity (the HELLO identity), handle_base, handle_count (its range),
    quota (Allocation Quota), trust_domain (blocks are cleared when they move between
    domains), direct_load, direct_alloc (offer the direct modes; only to trusted
    initiators, draft §6.6; direct_alloc gives it a partition of ``quota`` blocks).
    """

    identity: bytes
    handle_base: int
    handle_count: int
    quota: int
    trust_domain: str = "default"
    direct_load: bool = False
    direct_alloc: bool = False

    def owns(self, handle: int) -> bool:
        return 0 <= handle - self.handle_base < self.handle_count


@dataclass(frozen=True, slots=True)
class TargetConfig:
    """A target's pool, table and policy.

    Fields: block_size, pool_blocks (F), initiators, table_base_handle, table_entries
    (None: up to the highest configured handle), request_credits, max_inline,
    ticket_timeout (seconds), base_to (Tagged Offset of memory byte 0),
    counter_byteorder, shared_ring_order (None: smallest N >= shared blocks),
    receive_margin (receives posted beyond the credits, docs/kbtp.md §9.2), hello_timeout
    (seconds from connection to HELLO), idle_timeout (seconds of silence after which a
    session is closed; None: never), both docs/kbtp.md §4.2.
    """

    block_size: int
    pool_blocks: int
    initiators: tuple[InitiatorConfig, ...]
    table_base_handle: int = 0
    table_entries: int | None = None
    request_credits: int = DEFAULT_REQUEST_CREDITS
    max_inline: int = DEFAULT_MAX_INLINE
    ticket_timeout: float = DEFAULT_TICKET_TIMEOUT
    base_to: int = 0
    counter_byteorder: ByteOrder = "little"
    shared_ring_order: int | None = None
    receive_margin: int = DEFAULT_RECEIVE_MARGIN
    hello_timeout: float = DEFAULT_HELLO_TIMEOUT
    idle_timeout: float | None = DEFAULT_IDLE_TIMEOUT


def check_config(config: TargetConfig) -> None:
    """Refuse a configuration no target can serve (LocalError): no initiator, identities
    not distinct, quotas over F (draft §3.4), credits outside 1..65535, a Ticket Timeout
    HELLO_ACK cannot carry (1 ms to 2**32 - 1 ms, docs/kbtp.md §5.4; not infinite, not NaN),
    a HELLO or idle timeout that is not positive and finite, a receive margin below 1, a
    negative quota or range, a DIRECT_ALLOC partition of no block."""
    c = config
    if not c.initiators:
        raise LocalError("a target needs at least one initiator identity")
    if len({i.identity for i in c.initiators}) != len(c.initiators):
        raise LocalError("initiator identities must be distinct")
    if sum(i.quota for i in c.initiators) > c.pool_blocks:
        raise LocalError("the sum of Allocation Quotas exceeds the pool size F (draft §3.4)")
    if not 1 <= c.request_credits <= MAX_REQUEST_CREDITS:
        raise LocalError(f"request credits must be 1..{MAX_REQUEST_CREDITS}")
    if not 1 <= c.ticket_timeout * 1000 <= MAX_TICKET_TIMEOUT_MS:  # NaN and inf too
        raise LocalError(
            f"the Ticket Timeout must be 0.001 to {MAX_TICKET_TIMEOUT_MS / 1000:g} s "
            f"(HELLO_ACK carries 32 bits of milliseconds), got {c.ticket_timeout:g}"
        )
    if c.receive_margin < 1:
        raise LocalError("the receive margin must be at least 1 (docs/kbtp.md §9.2)")
    idle = c.hello_timeout if c.idle_timeout is None else c.idle_timeout
    if not (0 < c.hello_timeout < math.inf and 0 < idle < math.inf):  # NaN too
        raise LocalError("the HELLO and idle timeouts must be positive and finite")
    for i in c.initiators:
        if i.quota < 0 or i.handle_count < 0 or (i.direct_alloc and i.quota < 1):
            raise LocalError(f"bad quota or handle range for {i.identity!r}")


def granted_capabilities(
    initiator: InitiatorConfig, requested: Capability, ird: int | None = None
) -> Capability:
    """What a HELLO asking for ``requested`` is granted (docs/kbtp.md §4.3): requested and
    allowed by the configuration and offered on the RDMAP binding; DIRECT_ALLOC only with a
    counter format the initiator's FetchAdd can advance (MASKED_FETCH_ADD or
    UNMASKED_COUNTER), UNMASKED_COUNTER only with DIRECT_ALLOC; no direct mode on a stream
    whose target IRD (``ird``, None: unknown) is below the minimum of §4.1 item 2."""
    allowed = Capability.NONE
    if initiator.direct_load:
        allowed |= Capability.DIRECT_LOAD
    if initiator.direct_alloc and requested & (
        Capability.MASKED_FETCH_ADD | Capability.UNMASKED_COUNTER
    ):
        allowed |= Capability.DIRECT_ALLOC | Capability.UNMASKED_COUNTER
    if ird is not None and ird < MIN_TARGET_IRD_DIRECT:
        allowed &= ~DIRECT_CAPABILITIES  # no Read or atomic of the initiator can arrive
    granted = requested & allowed & RDMAP_BINDING_CAPABILITIES
    if not granted & Capability.DIRECT_ALLOC:
        granted &= ~Capability.UNMASKED_COUNTER
    return granted


def plan_target_layout(config: TargetConfig) -> TargetLayout:
    """The memory layout of ``config`` (docs/kbtp.md §3.6): table, pool with one partition
    per DIRECT_ALLOC initiator in configuration order, rings; at ``config.base_to``."""
    if not config.initiators:
        raise LocalError("a target needs at least one initiator identity")
    entries = config.table_entries
    if entries is None:
        entries = max(
            i.handle_base + i.handle_count - config.table_base_handle for i in config.initiators
        )
    return plan_layout(
        block_size=config.block_size,
        pool_blocks=config.pool_blocks,
        partition_sizes=[i.quota for i in config.initiators if i.direct_alloc],
        table_entries=entries,
        table_base_handle=config.table_base_handle,
        shared_ring_order=config.shared_ring_order,
        base_to=config.base_to,
        byteorder=config.counter_byteorder,
    )


def check_handle_ranges(config: TargetConfig, layout: TargetLayout) -> None:
    """Refuse initiator handle ranges that overlap or lie outside the table (LocalError)."""
    spans = sorted((i.handle_base, i.handle_base + i.handle_count) for i in config.initiators)
    for (_, end), (start, _) in zip(spans, spans[1:], strict=False):
        if start < end:
            raise LocalError("initiator handle ranges overlap")
    for start, end in spans:
        if end > start and not (layout.serves(start) and layout.serves(end - 1)):
            raise LocalError("an initiator handle range lies outside the table")
