"""Batches of block loads and stores between an arena and a KBTP session (docs/kbtp.md §13.2).

One call moves a list of blocks: :func:`store_batch` (ALLOC_STORE or STORE, docs/kbtp.md
§6.2, §6.3) and :func:`load_batch` (LOAD, §6.1) build every request first, refusing a bad
argument with :class:`~kbtp.arena.ArenaError` before anything is sent, then submit them all
at once: the session keeps Request Credits of them outstanding and sends the rest as
COMPLETIONs return credits (§9.2), so the batch is pipelined up to the credits; results
are taken in the session's completion task, no task per block.  Every
Data Descriptor names the arena's one STag, so no memory is registered per request.  Each
block gets its own :class:`BlockResult` (status, generation, block offset, data length): a
block that fails does not fail the others, and blocks whose session ends before their
COMPLETION get the :class:`~kbtp.initiator_errors.SessionClosed` as their ``error``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial

import trio

from kbtp.arena import Arena, ArenaError
from kbtp.constants import GENERATION_MAX, RequestFlag, Status
from kbtp.initiator import KbtpInitiator
from kbtp.initiator_errors import SessionClosed
from kbtp.messages import (
    AllocStore,
    Completion,
    Free,
    HelloAck,
    Load,
    Request,
    Store,
    inline_descriptor,
)
from stack.errors import LocalError

__all__ = [
    "BlockRef",
    "BlockResult",
    "OnResult",
    "build_free",
    "build_loads",
    "build_stores",
    "free_batch",
    "load_batch",
    "run_batch",
    "store_batch",
]

_HANDLE_LIMIT = 1 << 64


@dataclass(frozen=True, slots=True)
class BlockRef:
    """One block of a batch: its KBTP ``handle`` and its ``length`` octets at ``offset`` in
    the arena; ``generation`` 0 accepts any (docs/kbtp.md §6.0)."""

    handle: int
    offset: int
    length: int
    generation: int = 0


@dataclass(frozen=True, slots=True)
class BlockResult:
    """The outcome of one block of a batch.

    ``status`` is the COMPLETION's (a :class:`~kbtp.constants.Status`, or the number of one
    this stack does not know), or None when no COMPLETION came (then ``error`` says why:
    the session ended).  ``generation``, ``block_offset`` and ``data_length`` are the
    COMPLETION's (a LOAD placed ``data_length`` octets at its offset in the arena).
    """

    handle: int
    status: Status | int | None
    generation: int = 0
    block_offset: int = 0
    data_length: int = 0
    error: Exception | None = None

    @property
    def ok(self) -> bool:
        return self.status == Status.SUCCESS

    @classmethod
    def of(cls, handle: int, completion: Completion) -> BlockResult:
        known = completion.status in _STATUSES
        return cls(
            handle,
            Status(completion.status) if known else completion.status,
            completion.generation,
            completion.block_offset,
            completion.data_length,
        )


_STATUSES = frozenset(int(s) for s in Status)

OnResult = Callable[[int, BlockResult], None]
"""Called with (index in the batch, result) as each block completes."""


# --------------------------------------------------------------------------------------
# building the requests (every check before anything is sent)
# --------------------------------------------------------------------------------------
def _check_ref(ref: object, index: int) -> BlockRef:
    if not isinstance(ref, BlockRef):
        raise ArenaError(f"block {index}: a BlockRef, not {type(ref).__name__}")
    for name, value, limit in (
        ("handle", ref.handle, _HANDLE_LIMIT),
        ("generation", ref.generation, GENERATION_MAX + 1),
    ):
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < limit:
            raise ArenaError(f"block {index}: {name} {value!r} is not in 0..{limit - 1}")
    return ref


def _check_handle(handle: object, index: int) -> int:
    if isinstance(handle, bool) or not isinstance(handle, int):
        raise ArenaError(f"block {index}: handle {handle!r} is not an integer")
    if not 0 <= handle < _HANDLE_LIMIT:
        raise ArenaError(f"block {index}: handle {handle} is not in 0..{_HANDLE_LIMIT - 1}")
    return handle


def build_loads(
    arena: Arena,
    blocks: Sequence[BlockRef],
    block_size: int,
    *,
    allow_unsealed: bool = False,
) -> list[Request]:
    """The LOADs of ``blocks`` into ``arena``: each may place up to ``length`` octets.

    Raises :class:`ArenaError` for a span outside the arena or over ``block_size``, and
    for two loads into overlapping spans (they would overwrite each other).
    """
    flags = RequestFlag.ALLOW_UNSEALED if allow_unsealed else RequestFlag.NONE
    requests: list[Request] = []
    for index, raw in enumerate(blocks):
        ref = _check_ref(raw, index)
        arena.check(ref.offset, ref.length, block_size, f"block {index}")
        descriptor = arena.descriptor(ref.offset, ref.length)
        requests.append(Load(0, ref.handle, descriptor, ref.generation, flags))
    spans = sorted((ref.offset, ref.offset + ref.length, i) for i, ref in enumerate(blocks))
    for (_, end, first), (start, _, second) in zip(spans, spans[1:], strict=False):
        if start < end:
            raise ArenaError(f"blocks {first} and {second}: their spans in the arena overlap")
    return requests


def build_stores(
    arena: Arena,
    blocks: Sequence[BlockRef],
    block_size: int,
    max_inline: int,
    *,
    alloc: bool = True,
    seal: bool = True,
    inline: bool | None = None,
) -> list[Request]:
    """The ALLOC_STOREs (``alloc``: unbound handles, docs/kbtp.md §6.3) or STOREs (bound
    handles, §6.2) of ``blocks`` from ``arena``.

    ``inline`` None: a block of at most ``max_inline`` octets travels in the request (a
    copy, no RDMA Read); False: every block is read from the arena by the target.
    """
    cls = AllocStore if alloc else Store
    flags = RequestFlag.SEAL if seal else RequestFlag.NONE
    requests: list[Request] = []
    for index, raw in enumerate(blocks):
        ref = _check_ref(raw, index)
        arena.check(ref.offset, ref.length, block_size, f"block {index}")
        if inline is True and ref.length > max_inline:
            raise ArenaError(f"block {index}: {ref.length} octets exceed Max Inline {max_inline}")
        if inline is not False and ref.length <= max_inline:
            payload = bytes(arena.span(ref.offset, ref.length))
            requests.append(
                cls(
                    0,
                    ref.handle,
                    inline_descriptor(payload),
                    payload,
                    ref.generation,
                    flags | RequestFlag.INLINE,
                )
            )
        else:
            descriptor = arena.descriptor(ref.offset, ref.length)
            requests.append(cls(0, ref.handle, descriptor, b"", ref.generation, flags))
    return requests


def build_free(handles: Sequence[int | tuple[int, int]]) -> list[Request]:
    """The FREEs (docs/kbtp.md §6.4) of ``handles``: each a handle or (handle, generation)."""
    requests: list[Request] = []
    for index, item in enumerate(handles):
        handle, generation = item if isinstance(item, tuple) else (item, 0)
        ref = _check_ref(BlockRef(_check_handle(handle, index), 0, 0, generation), index)
        requests.append(Free(0, ref.handle, ref.generation))
    return requests


# --------------------------------------------------------------------------------------
# running them
# --------------------------------------------------------------------------------------
async def run_batch(
    initiator: KbtpInitiator,
    requests: Sequence[Request],
    on_result: OnResult | None = None,
) -> list[BlockResult]:
    """Submit every request at once and return one result per request, in order.

    The session pipelines them up to its Request Credits (docs/kbtp.md §9.2); each result
    is taken from the session's completion task (:meth:`KbtpInitiator.submit`, no task per
    request), and ``on_result`` is called there as each block completes, until the call
    returns (an exception it raises is raised by the call).  An error status is that
    block's result; a session that ends fails the blocks still waiting (``error``:
    :class:`SessionClosed`), never the call.
    """
    results: list[BlockResult | None] = [None] * len(requests)
    left = len(requests)
    all_done = trio.Event()
    raised: list[Exception] = []
    live = True

    def finish(index: int, request: Request, c: Completion | None, e: SessionClosed | None) -> None:
        nonlocal left
        if c is None:
            result = BlockResult(request.handle, None, error=e)
        else:
            result = BlockResult.of(request.handle, c)
        results[index] = result
        left -= 1
        if on_result is not None and live and not raised:
            try:
                on_result(index, result)
            except Exception as exc:  # raised by the call, not in the completion task
                raised.append(exc)
        if left == 0 or raised:
            all_done.set()

    try:
        for index, request in enumerate(requests):
            try:
                initiator.submit(request, partial(finish, index, request))
            except SessionClosed as exc:
                finish(index, request, None, exc)
        if requests:
            await all_done.wait()
    finally:
        live = False
    if raised:
        raise raised[0]
    return [r for r in results if r is not None]


async def store_batch(
    initiator: KbtpInitiator,
    arena: Arena,
    blocks: Sequence[BlockRef],
    *,
    alloc: bool = True,
    seal: bool = True,
    inline: bool | None = None,
    on_result: OnResult | None = None,
) -> list[BlockResult]:
    """Store ``blocks`` from ``arena`` in one call (:func:`build_stores`, :func:`run_batch`)."""
    ack = _ack(initiator)
    requests = build_stores(
        arena, blocks, ack.block_size, ack.max_inline, alloc=alloc, seal=seal, inline=inline
    )
    return await _in_arena(initiator, arena, requests, on_result)


async def load_batch(
    initiator: KbtpInitiator,
    arena: Arena,
    blocks: Sequence[BlockRef],
    *,
    allow_unsealed: bool = False,
    on_result: OnResult | None = None,
) -> list[BlockResult]:
    """Load ``blocks`` into ``arena`` in one call (:func:`build_loads`, :func:`run_batch`)."""
    requests = build_loads(arena, blocks, _ack(initiator).block_size, allow_unsealed=allow_unsealed)
    return await _in_arena(initiator, arena, requests, on_result)


async def free_batch(
    initiator: KbtpInitiator,
    handles: Sequence[int | tuple[int, int]],
    *,
    on_result: OnResult | None = None,
) -> list[BlockResult]:
    """FREE ``handles`` in one call (:func:`build_free`, :func:`run_batch`)."""
    return await run_batch(initiator, build_free(handles), on_result)


async def _in_arena(
    initiator: KbtpInitiator,
    arena: Arena,
    requests: list[Request],
    on_result: OnResult | None,
) -> list[BlockResult]:
    arena.busy += 1
    try:
        return await run_batch(initiator, requests, on_result)
    finally:
        arena.busy -= 1


def _ack(initiator: KbtpInitiator) -> HelloAck:
    """The session's parameters (a block size to check the blocks against)."""
    if initiator.ack is None:
        raise LocalError("no session: HELLO_ACK not received")
    return initiator.ack
