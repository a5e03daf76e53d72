"""The ``kbtp demo`` scenario: shared state, the checks and each initiator's steps.

:class:`Demo` holds what was stored (data, generation, seal, owner) and counts the
byte-exact read-backs and the bad requests answered with the expected status (docs/kbtp.md
§7).  :func:`run_initiator` connects one initiator and runs its steps:
:func:`shared_scenario` (ALLOC_STORE, LOAD, STORE with SEAL, FREE and reuse, bad requests)
or :func:`trusted_scenario` (DIRECT_ALLOC + BIND next to ALLOC_STORE on the partition ring,
DIRECT_LOAD, frees, bad requests and, for the last one, an abandoned ticket: docs/kbtp.md
§6.6, §6.7).  Between their steps all initiators meet at two barriers and load each
other's blocks.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from functools import partial

import trio

from kbtp.constants import Capability, RequestFlag, Status, next_generation
from kbtp.initiator import KbtpInitiator, OpStats
from kbtp.initiator_errors import KbtpStatusError
from kbtp.messages import Bind, CompletionDescriptor, DataDescriptor, Load, Store
from kbtp.target import KbtpTarget
from stack.wire.events import MpaSettings

SIZES = (0, 1, 100, 4096, 4097, 20000, 65536)
"""Data lengths cycled through (clipped to the block size): empty, tiny, the INLINE limit
and one past it, several FPDUs, a full block."""


def payload(identity: str, handle: int, version: int, size: int) -> bytes:
    """Deterministic test data of one store."""
    return random.Random(f"{identity}/{handle}/{version}").randbytes(size)


class Barrier:
    """All scenarios meet here; one that failed ``leave``s so the others do not hang."""

    def __init__(self, parties: int) -> None:
        self.parties = parties
        self.arrived = 0
        self.event = trio.Event()

    async def wait(self) -> None:
        self.arrived += 1
        self._check()
        await self.event.wait()

    def leave(self) -> None:
        self.parties -= 1
        self._check()

    def _check(self) -> None:
        if self.arrived >= self.parties:
            self.event.set()


@dataclass
class Stored:
    """What the demo knows about a bound handle: its data, generation and seal."""

    data: bytes
    generation: int
    sealed: bool
    owner: str


@dataclass(frozen=True, slots=True)
class BadRequest:
    """A deliberately bad request: who sent it, what it was, the status expected and the
    one observed (``SUCCESS`` if it did not fail)."""

    who: str
    what: str
    expected: str
    observed: str

    @property
    def ok(self) -> bool:
        return self.expected == self.observed


@dataclass
class Demo:
    """Shared state of one demo run."""

    args: argparse.Namespace
    target: KbtpTarget
    port: int
    settings: MpaSettings
    started: float
    expected: dict[int, Stored] = field(default_factory=dict)
    checks: int = 0
    verified_octets: int = 0
    bad_ok: int = 0
    bad_requests: list[BadRequest] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    stats: dict[tuple[str, str], OpStats] = field(default_factory=dict)
    per_initiator: dict[str, dict[tuple[str, str], OpStats]] = field(default_factory=dict)
    barriers: list[Barrier] = field(default_factory=list)

    def progress(self, who: str, text: str) -> None:
        if not self.args.quiet:
            elapsed = time.perf_counter() - self.started
            print(f"[{elapsed:6.2f}s] {who:<10} {text}", file=sys.stderr, flush=True)

    def fail(self, who: str, text: str) -> None:
        self.failures.append(f"{who}: {text}")
        print(f"kbtp demo: MISMATCH {who}: {text}", file=sys.stderr, flush=True)

    def check(self, who: str, what: str, got: bytes, want: bytes) -> None:
        self.checks += 1
        if got == want:
            self.verified_octets += len(want)
        else:
            where = next((i for i, (a, b) in enumerate(zip(got, want, strict=False)) if a != b), 0)
            self.fail(
                who, f"{what}: {len(got)} octets read, {len(want)} expected, first diff at {where}"
            )

    async def expect_status(
        self, who: str, what: str, status: Status, call: Callable[[], Awaitable[object]]
    ) -> None:
        """Run a request that must fail with ``status``."""
        try:
            await call()
        except KbtpStatusError as exc:
            self.bad_request(who, what, status, exc.status)
            return
        self.bad_request(who, what, status, None)

    def bad_request(self, who: str, what: str, expected: Status, got: Status | None) -> None:
        """Record a deliberately bad request's outcome (``got`` None: it succeeded)."""
        observed = "SUCCESS" if got is None else got.name
        self.bad_requests.append(BadRequest(who, what, expected.name, observed))
        if got is expected:
            self.bad_ok += 1
        elif got is None:
            self.fail(who, f"{what}: succeeded, expected {expected.name}")
        else:
            self.fail(who, f"{what}: got {got.name}, expected {expected.name}")


# ======================================================================================
# scenarios
# ======================================================================================


async def _load_and_check(
    demo: Demo, ini: KbtpInitiator, who: str, handle: int, *, direct: bool = False
) -> None:
    stored = demo.expected[handle]
    if direct:
        got = await ini.direct_load(handle)
    else:
        got = await ini.load(handle, allow_unsealed=not stored.sealed, invalidate=handle % 3 == 0)
    kind = "DIRECT_LOAD" if direct else "LOAD"
    demo.check(who, f"{kind} of 0x{handle:x} ({stored.owner}'s)", got, stored.data)


async def _gather(calls: Iterable[Callable[[], Awaitable[object]]]) -> None:
    """Run ``calls`` concurrently (pipelined on the session)."""
    async with trio.open_nursery() as nursery:
        for call in calls:
            nursery.start_soon(call)


def _size(demo: Demo, k: int) -> int:
    return min(SIZES[k % len(SIZES)], demo.args.block_size)


async def shared_scenario(demo: Demo, ini: KbtpInitiator, who: str) -> None:
    ack = ini.ack
    assert ack is not None
    base = ack.handle_base
    mine: list[int] = []

    async def alloc(k: int, version: int, seal: bool) -> None:
        handle = base + k
        data = payload(who, handle, version, _size(demo, k))
        c = await ini.alloc_store(handle, data, seal=seal)
        demo.expected[handle] = Stored(data, c.generation, seal, who)
        mine.append(handle)

    # ALLOC_STORE: more requests than credits, INLINE and by RDMA Read, even ones sealed.
    await _gather([partial(alloc, k, 0, k % 2 == 0) for k in range(20)])
    demo.progress(who, "ALLOC_STORE x20 (inline and RDMA Read, 0..64K octets)")
    await _gather([partial(_load_and_check, demo, ini, who, h) for h in sorted(mine)])
    demo.progress(who, "LOAD x20 checked (ALLOW_UNSEALED, INVALIDATE)")

    # Mapped STORE into the unsealed blocks, sealing all but the last.
    async def restore(handle: int, seal: bool) -> None:
        data = payload(who, handle, 1, _size(demo, handle + 3))
        c = await ini.store(handle, data, seal=seal, invalidate=len(data) > ack.max_inline)
        demo.expected[handle] = Stored(data, c.generation, seal, who)

    unsealed = [h for h in sorted(mine) if not demo.expected[h].sealed]
    await _gather([partial(restore, h, h != unsealed[-1]) for h in unsealed])
    await _gather([partial(_load_and_check, demo, ini, who, h) for h in unsealed])
    demo.progress(who, f"STORE x{len(unsealed)} (+SEAL) checked")
    await _cross(demo, ini, who, direct=False)

    # FREE half, then ALLOC_STORE into new handles: blocks are reused (and were cleared).
    freed = sorted(mine)[:10]
    for handle in freed:
        await ini.free(handle, generation=demo.expected[handle].generation)
        del demo.expected[handle]
        mine.remove(handle)
    await _gather([partial(alloc, k, 2, True) for k in range(20, 30)])
    await _gather(
        [partial(_load_and_check, demo, ini, who, h) for h in range(base + 20, base + 30)]
    )
    demo.progress(who, "FREE x10, ALLOC_STORE x10 into reused blocks, checked")
    await shared_bad_requests(demo, ini, who, freed[0], mine)


async def shared_bad_requests(
    demo: Demo, ini: KbtpInitiator, who: str, freed: int, mine: list[int]
) -> None:
    ack = ini.ack
    assert ack is not None
    sealed = next(h for h in mine if demo.expected[h].sealed and demo.expected[h].data)
    unsealed = next(h for h in mine if not demo.expected[h].sealed)
    other = next((h for h, s in demo.expected.items() if s.owner != who), None)
    gen = demo.expected[sealed].generation
    x = demo.expect_status
    await x(
        who, "LOAD of a handle not served", Status.HANDLE_OUT_OF_RANGE, lambda: ini.load(1 << 40)
    )
    if other is not None:
        await x(
            who,
            "STORE into another initiator's handle",
            Status.HANDLE_OUT_OF_RANGE,
            lambda: ini.store(other, b"intruder"),
        )
    await x(
        who,
        "LOAD with a wrong generation",
        Status.WRONG_GENERATION,
        lambda: ini.load(sealed, generation=next_generation(gen)),
    )
    await x(who, "STORE into a sealed block", Status.SEALED, lambda: ini.store(sealed, b"late"))
    await x(who, "LOAD of an unsealed block", Status.NOT_SEALED, lambda: ini.load(unsealed))
    await x(who, "LOAD of a freed handle", Status.NOT_VALID, lambda: ini.load(freed))
    await x(
        who,
        "ALLOC_STORE to a bound handle",
        Status.ALREADY_VALID,
        lambda: ini.alloc_store(sealed, b"x"),
    )
    await x(
        who,
        "STORE longer than the block",
        Status.TOO_LONG_FOR_BLOCK,
        lambda: ini.store(unsealed, bytearray(ack.block_size + 1)),
    )
    await x(
        who,
        "LOAD into a buffer shorter than the data",
        Status.TOO_LONG_FOR_DESCRIPTOR,
        lambda: ini.load(sealed, max_length=len(demo.expected[sealed].data) - 1),
    )
    # Fill the quota, then one more: NO_SPACE; the extra blocks are freed again.
    extra = []
    for k in range(40, 40 + ack.quota):
        try:
            await ini.alloc_store(ack.handle_base + k, b"filler")
        except KbtpStatusError as exc:
            if exc.status is not Status.NO_SPACE:
                demo.fail(who, f"filling the quota: {exc}")
            else:
                demo.bad_request(who, "ALLOC_STORE beyond the quota", Status.NO_SPACE, exc.status)
            break
        extra.append(ack.handle_base + k)
    else:
        demo.bad_request(who, "ALLOC_STORE beyond the quota", Status.NO_SPACE, None)
    for handle in extra:
        await ini.free(handle)
    await x(
        who,
        "BIND without DIRECT_ALLOC",
        Status.NOT_OFFERED,
        lambda: ini.request(Bind(0, ack.handle_base + 60, 0, 1, 0)),
    )
    await x(
        who,
        "LOAD asking for a completion record (RECORD)",
        Status.NOT_OFFERED,
        lambda: ini.request(
            Load(
                0,
                sealed,
                DataDescriptor(1, 0, 16),
                flags=RequestFlag.RECORD,
                completion=CompletionDescriptor(1, 0),
            )
        ),
    )
    await x(
        who,
        "STORE with INLINE and INVALIDATE",
        Status.BAD_FLAGS,
        lambda: ini.request(
            Store(
                0,
                unsealed,
                DataDescriptor(0, 0, 2),
                b"hi",
                flags=RequestFlag.INLINE | RequestFlag.INVALIDATE,
            )
        ),
    )
    # Nothing above changed the blocks: load them all again.
    await _gather([partial(_load_and_check, demo, ini, who, h) for h in sorted(mine)])
    demo.progress(who, "bad requests: every status as expected, blocks unchanged")


async def trusted_scenario(demo: Demo, ini: KbtpInitiator, who: str, abandon: bool) -> None:
    ack = ini.ack
    assert ack is not None
    if ini.granted != trusted_capabilities(demo):
        demo.fail(who, f"granted {ini.granted!r}, asked for {trusted_capabilities(demo)!r}")
        return
    base = ack.handle_base

    async def direct(k: int, version: int) -> None:
        handle = base + k
        data = payload(who, handle, version, _size(demo, k))
        c = await ini.direct_alloc(handle, data, seal=True)
        demo.expected[handle] = Stored(data, c.generation, True, who)

    async def alloc(k: int, seal: bool) -> None:
        handle = base + k
        data = payload(who, handle, 0, _size(demo, k + 2))
        c = await ini.alloc_store(handle, data, seal=seal)
        demo.expected[handle] = Stored(data, c.generation, seal, who)

    # One-sided allocations next to target-executed ones on the same partition ring.
    calls = [partial(direct, k, 0) for k in range(8)]
    calls += [partial(alloc, k, k != 11) for k in range(8, 12)]
    await _gather(calls)
    demo.progress(who, "DIRECT_ALLOC+BIND x8 and ALLOC_STORE x4 on the partition ring")
    handles = list(range(base, base + 12))
    await _gather([partial(_load_and_check, demo, ini, who, h) for h in handles])
    sealed = [h for h in handles if demo.expected[h].sealed]
    await _gather([partial(_load_and_check, demo, ini, who, h, direct=True) for h in sealed])
    demo.progress(who, f"LOAD x{len(handles)} and DIRECT_LOAD x{len(sealed)} checked")
    await _cross(demo, ini, who, direct=True)

    # FREE direct blocks, allocate again: the partition ring hands them out anew.
    for handle in handles[:4]:
        await ini.free(handle, generation=demo.expected[handle].generation)
        del demo.expected[handle]
    await _gather([partial(direct, k, 1) for k in range(4)])
    await _gather([partial(_load_and_check, demo, ini, who, h, direct=True) for h in handles[:4]])
    demo.progress(who, "FREE x4, DIRECT_ALLOC x4 into reused blocks, checked")

    x = demo.expect_status
    await x(
        who,
        "BIND of a ticket never taken",
        Status.BAD_BIND,
        lambda: ini.request(Bind(0, base + 50, 0xBAD, 1, ack.partition_offset)),
    )
    await x(
        who,
        "DIRECT_LOAD of an unsealed block",
        Status.NOT_SEALED,
        lambda: ini.direct_load(base + 11),
    )
    await x(
        who,
        "DIRECT_LOAD of an unbound handle",
        Status.NOT_VALID,
        lambda: ini.direct_load(base + 40),
    )
    demo.progress(who, "bad requests: every status as expected")
    if abandon:
        await abandon_ticket(demo, ini, who)


async def abandon_ticket(demo: Demo, ini: KbtpInitiator, who: str) -> None:
    """Ticket Timeout -> Partition STag invalidated -> reclaim -> TICKET_ABANDONED (§6.7)."""
    ack = ini.ack
    assert ack is not None
    handle = ack.handle_base + 20
    data = payload(who, handle, 9, min(1000, ack.block_size))
    alloc = await ini.reserve(data)
    wait = 1.6 * ack.ticket_timeout_ms / 1000 + 0.2
    demo.progress(who, f"took ticket {alloc.ticket} and wrote its block; waiting {wait:.1f}s")
    await trio.sleep(wait)
    stags = (ack.partition_stag, ack.head_stag, ack.ring_stag)
    if any(demo.target.stag_valid(stag) for stag in stags):
        demo.fail(who, "Partition/Head/Ring STag still valid after the Ticket Timeout")
    await demo.expect_status(
        who,
        "BIND after the Ticket Timeout",
        Status.TICKET_ABANDONED,
        lambda: ini.bind(alloc, handle),
    )
    await demo.expect_status(
        who,
        "DIRECT_ALLOC after an abandoned ticket",
        Status.TICKET_ABANDONED,
        lambda: ini.direct_alloc(handle, data),
    )
    # Target-executed allocation still works (the reclaimed block went back to the ring).
    c = await ini.alloc_store(handle, data, seal=True)
    demo.expected[handle] = Stored(data, c.generation, True, who)
    await _load_and_check(demo, ini, who, handle)
    demo.progress(who, "late BIND got TICKET_ABANDONED; block reclaimed and reallocated")


async def _cross(demo: Demo, ini: KbtpInitiator, who: str, direct: bool) -> None:
    """Meet the others, load their sealed blocks (LOAD needs only a served handle)."""
    first, second = demo.barriers
    await first.wait()
    theirs = [h for h, s in sorted(demo.expected.items()) if s.owner != who and s.sealed]
    picks = theirs[:: max(1, len(theirs) // 12)]
    calls = [partial(_load_and_check, demo, ini, who, h) for h in picks]
    if direct:
        calls += [partial(_load_and_check, demo, ini, who, h, direct=True) for h in picks]
    await _gather(calls)
    demo.progress(who, f"loaded {len(picks)} blocks of other initiators{' (+direct)' * direct}")
    await second.wait()


BOTH_DIRECT_MODES = Capability.DIRECT_LOAD | Capability.DIRECT_ALLOC
"""What every demo initiator asks for; the target grants a shared-ring one neither."""


def trusted_capabilities(demo: Demo) -> Capability:
    """What a trusted initiator asks for: both direct modes, the partition ring in the
    unmasked counter format with ``--unmasked-counter`` (docs/kbtp.md §3.7)."""
    caps = BOTH_DIRECT_MODES
    if demo.args.unmasked_counter:
        caps |= Capability.UNMASKED_COUNTER
    return caps


async def run_initiator(demo: Demo, identity: str, trusted: bool, abandon: bool) -> None:
    passed = 0
    caps = trusted_capabilities(demo) if trusted else BOTH_DIRECT_MODES
    try:
        async with KbtpInitiator.connect(
            "127.0.0.1", demo.port, identity, capabilities=caps, settings=demo.settings
        ) as ini:
            try:
                if trusted:
                    await trusted_scenario(demo, ini, identity, abandon)
                else:
                    await shared_scenario(demo, ini, identity)
            finally:
                mine = demo.per_initiator.setdefault(identity, {})
                for key, entry in ini.stats.items():
                    mine[key] = OpStats(entry.count, entry.octets)
                    total = demo.stats.setdefault(key, OpStats())
                    total.count += entry.count
                    total.octets += entry.octets
                passed = sum(b.event.is_set() for b in demo.barriers)
    except Exception as exc:  # noqa: BLE001 - reported, the other initiators go on
        demo.fail(identity, f"{type(exc).__name__}: {exc}")
    finally:
        for barrier in demo.barriers[passed:]:
            if not barrier.event.is_set():
                barrier.leave()
