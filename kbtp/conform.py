"""Conformance cases for a KBTP target: each sends what one status rule of docs/kbtp.md §7
is about and checks the answer (``kbtp conform``, :mod:`kbtp.cli.conform`).

The target is reached as an initiator would reach it (:class:`~kbtp.initiator.KbtpInitiator`
on the normative binding), so any target that serves KBTP over iWARP can be checked: this
project's, or a second implementation coded against docs/kbtp.md.  Requests are built with
:mod:`kbtp.messages`' encoders; a case about a malformed request edits a valid one.

* A case PASSes when the target answers with the status docs/kbtp.md §7 gives.  For a
  status the table marks fatal, answered in a COMPLETION, the session must also end with
  the RDMAP Terminate 0/2/0xFF and a TCP close (§9.3, KBTP-9.3); a status it does not mark
  fatal must leave the session going.  A refusal answered in a HELLO_ACK (NO_SESSION,
  UNKNOWN_INITIATOR, SESSION_EXISTS) is judged by its status: the runner's initiator
  closes such a stream itself.  Any other answer FAILs, with what was observed.
* A case the target's grants rule out (a quota too large to fill quickly, a Max Inline that
  leaves no room for a longer INLINE store) is SKIPped, saying why.
* A case that could not get as far as its request (no session, a session that ended before
  the answer) is an ERROR.

The runner binds and frees handles of its own identity's range (from its Handle Base):
give it an identity no application uses.  Nothing is left bound when a case ends.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack, suppress

import trio

from kbtp.conform_runner import (
    FAIL,
    PASS,
    SKIP,
    Case,
    Outcome,
    Probe,
    SetupFailed,
    fatal_answer,
    judged,
    session_end,
)
from kbtp.constants import (
    Capability,
    MessageOpcode,
    RequestFlag,
    Status,
    next_generation,
    status_name,
)
from kbtp.initiator import KbtpInitiator
from kbtp.initiator_errors import HelloRefused, HelloTimeout, SessionClosed
from kbtp.messages import (
    AllocStore,
    Bind,
    CommonHeader,
    Completion,
    CompletionDescriptor,
    DataDescriptor,
    Free,
    Hello,
    HelloAck,
    Load,
    Store,
    inline_descriptor,
)
from stack.rnic import Access

__all__ = ["CASES"]

MAX_QUOTA_FILLED = 4096
"""Largest Allocation Quota the NO_SPACE case fills before its one ALLOC_STORE too many."""


# -- the cases -----------------------------------------------------------------------------

RAW_ID = 1 << 40
"""Request IDs of the runner's raw requests (the session's own count up from 1)."""


async def _round_trip(probe: Probe, case: Case) -> Outcome:
    data = bytes(range(256)) * 4
    async with probe.session() as ini:
        h = probe.handle(0)
        await ini.free(h, check=False)  # the runner's handle starts unbound
        stored = await probe.answer(ini.alloc_store(h, data, seal=True, check=False))
        try:
            if stored.status != Status.SUCCESS:
                return Outcome(FAIL, f"ALLOC_STORE answered {status_name(stored.status)}")
            back = bytearray(len(data))
            loaded = await probe.answer(ini.load_into(h, back, check=False))
            if loaded.status != Status.SUCCESS:
                return Outcome(FAIL, f"LOAD answered {status_name(loaded.status)}")
            if loaded.data_length != len(data) or bytes(back) != data:
                return Outcome(FAIL, f"LOAD returned {loaded.data_length} octets, not those stored")
            return Outcome(PASS, f"{len(data)} octets stored, sealed and loaded back")
        finally:
            await ini.free(h, check=False)


def _header(version: int = 1, opcode: int = MessageOpcode.LOAD, status: int = 0) -> bytes:
    """A LOAD's header with one field edited (the 24 octets of §5.1)."""
    return CommonHeader(opcode, 0, RAW_ID, 0, 0, status, version).encode()


async def _bad_version(probe: Probe, case: Case) -> Outcome:
    async def send(ini: KbtpInitiator) -> Completion | None:
        return await ini.send_raw(_header(version=2) + bytes(16), RAW_ID)

    return await fatal_answer(probe, case, send)


async def _unknown_opcode(probe: Probe, case: Case) -> Outcome:
    async def send(ini: KbtpInitiator) -> Completion | None:
        return await ini.send_raw(_header(opcode=0x7F) + bytes(16), RAW_ID)

    return await fatal_answer(probe, case, send)


async def _hello_twice(probe: Probe, case: Case) -> Outcome:
    async def send(ini: KbtpInitiator) -> Completion | HelloAck:
        hello = Hello(RAW_ID, Capability.NONE, ini.identity).encode()
        return await ini.send_raw_answer(hello, RAW_ID)  # answered in a HELLO_ACK

    return await fatal_answer(probe, case, send)


async def _with_handle(
    probe: Probe,
    case: Case,
    prepare: Callable[[KbtpInitiator, int], Awaitable[object]] | None,
    request: Callable[[KbtpInitiator, int], Awaitable[Completion | None]],
) -> Outcome:
    """A session; ``prepare`` the runner's first handle, send ``request`` about it, judge
    the answer; the handle is freed again whatever happened."""
    async with probe.session() as ini:
        h = probe.handle(0)
        await ini.free(h, check=False)  # the runner's handle starts unbound
        try:
            if prepare is not None:
                await probe.answer(prepare(ini, h))
            outcome = judged(case, await probe.answer(request(ini, h)))
            if outcome.verdict == PASS:
                try:  # a status §7 does not mark fatal leaves the session going
                    await probe.answer(ini.free(h, check=False))
                except SessionClosed:
                    return Outcome(
                        FAIL, f"answered {case.expect.name}, but the session ended: that "
                        "status does not end a session (§7)"
                    )  # fmt: skip
            return outcome
        finally:
            with suppress(SessionClosed):
                await ini.free(h, check=False)


def _free_raw(handle: int, *, status: int = 0, extra: bytes = b"") -> bytes:
    """A FREE of ``handle`` (24 octets, §5.5) with its Status field or its length edited."""
    return CommonHeader(MessageOpcode.FREE, 0, RAW_ID, handle, 0, status).encode() + extra


async def _raw_answer(probe: Probe, case: Case, data: Callable[[int], bytes]) -> Outcome:
    """``data(handle)`` about the runner's (unbound) first handle, sent raw; judged."""

    async def send(ini: KbtpInitiator, h: int) -> Completion | None:
        return await ini.send_raw(data(h), RAW_ID)

    return await _with_handle(probe, case, None, send)


async def _bad_flags(probe: Probe, case: Case) -> Outcome:
    payload = b"hi"

    async def send(ini: KbtpInitiator, h: int) -> Completion:
        flags = RequestFlag.INLINE | RequestFlag.INVALIDATE  # INVALIDATE with INLINE (§5.2)
        store = Store(0, h, inline_descriptor(payload), payload, flags=flags)
        return await ini.request(store, check=False)

    return await _with_handle(probe, case, _bound(b"x"), send)


def _bound(data: bytes, seal: bool = False) -> Callable[[KbtpInitiator, int], Awaitable[object]]:
    """A ``prepare`` that binds the handle with ``data`` (ALLOC_STORE)."""

    async def prepare(ini: KbtpInitiator, h: int) -> object:
        done = await ini.alloc_store(h, data, seal=seal, check=False)
        if done.status != Status.SUCCESS:
            raise SetupFailed(f"the ALLOC_STORE it needs answered {status_name(done.status)}")
        return done

    return prepare


async def _wrong_generation(probe: Probe, case: Case) -> Outcome:
    bound: list[int] = []

    async def prepare(ini: KbtpInitiator, h: int) -> object:
        done = await _bound(b"x")(ini, h)
        assert isinstance(done, Completion)
        bound.append(done.generation)
        return done

    async def send(ini: KbtpInitiator, h: int) -> Completion:
        return await ini.store(h, b"y", generation=next_generation(bound[0]), check=False)

    return await _with_handle(probe, case, prepare, send)


async def _inline_too_long(probe: Probe, case: Case) -> Outcome:
    assert probe.ack is not None
    longer = probe.ack.max_inline + 1
    if longer > probe.ack.block_size:
        return Outcome(SKIP, f"Max Inline {probe.ack.max_inline} is the whole block")

    async def send(ini: KbtpInitiator, h: int) -> Completion:
        return await ini.store(h, bytes(longer), inline=True, check=False)

    return await _with_handle(probe, case, _bound(b"x"), send)


async def _no_space(probe: Probe, case: Case) -> Outcome:
    assert probe.ack is not None
    quota, count = probe.ack.quota, probe.ack.handle_count
    if quota > MAX_QUOTA_FILLED or quota >= count:
        return Outcome(SKIP, f"a quota of {quota} blocks in {count} handles: not filled here")
    async with probe.session() as ini:
        handles = [probe.handle(k) for k in range(quota + 1)]
        try:
            for h in handles[:-1]:
                await ini.free(h, check=False)
                done = await probe.answer(ini.alloc_store(h, b"q", check=False))
                if done.status != Status.SUCCESS:
                    return Outcome(
                        FAIL, f"ALLOC_STORE {h - handles[0] + 1} of {quota} answered "
                        f"{status_name(done.status)}"
                    )  # fmt: skip
            return judged(case, await probe.answer(ini.alloc_store(handles[-1], b"!", check=False)))
        finally:
            for h in handles:
                await ini.free(h, check=False)


async def _refused_hello(
    probe: Probe,
    case: Case,
    identity: str,
    hold: bool,
    instead: Callable[[int], bytes] | None = None,
) -> Outcome:
    """A HELLO as ``identity`` (``hold``: while the runner's own session is open;
    ``instead``: another first message in its place), answered in a HELLO_ACK."""
    async with AsyncExitStack() as stack:
        if hold:
            await stack.enter_async_context(probe.session())
        try:
            async with probe.session(identity, wait_for_identity=False, instead_of_hello=instead):
                pass
        except HelloTimeout:
            return Outcome(FAIL, f"no HELLO_ACK within {probe.timeout:g} s")
        except SessionClosed as exc:
            return Outcome(FAIL, f"no HELLO_ACK: {exc}")
        except HelloRefused as exc:
            if exc.status is case.expect:
                return Outcome(PASS, f"HELLO_ACK answered {case.expect.name}")
            return Outcome(FAIL, f"HELLO_ACK answered {exc.status.name}, not {case.expect.name}")
    return Outcome(FAIL, "HELLO_ACK with SUCCESS: a session was granted")


async def _unknown_initiator(probe: Probe, case: Case) -> Outcome:
    return await _refused_hello(probe, case, f"kbtp-conform-unknown-{time.time_ns():x}", False)


async def _no_session(probe: Probe, case: Case) -> Outcome:
    def free_first(request_id: int) -> bytes:
        return Free(request_id, probe.handle(0)).encode()

    return await _refused_hello(probe, case, probe.identity, False, free_first)


async def _session_exists(probe: Probe, case: Case) -> Outcome:
    return await _refused_hello(probe, case, probe.identity, True)


async def _credit_exceeded(probe: Probe, case: Case) -> Outcome:
    """Request Credits + 1 requests at once: an ALLOC_STORE whose data the target must
    RDMA-read first, then FREEs of that handle and the next, queued behind it.  Whatever
    the verdict, what the burst bound is freed in a new session (the burst's own may have
    ended)."""
    try:
        return await _credit_burst(probe, case)
    finally:
        async with probe.session() as ini:
            for k in (0, 1):
                await ini.free(probe.handle(k), check=False)


async def _credit_burst(probe: Probe, case: Case) -> Outcome:
    async with probe.session() as ini:
        assert ini.ack is not None
        credits = ini.ack.request_credits
        h = probe.handle(0)
        source = ini.pd.reg_mr(bytearray(3000), Access.REMOTE_READ)
        first = AllocStore(RAW_ID, h, DataDescriptor(source.rkey, source.base, 3000))
        requests: list[AllocStore | Free] = [first]
        requests += [Free(RAW_ID + k, h + k % 2) for k in range(1, credits + 1)]
        burst = [(m.encode(), m.request_id) for m in requests]
        try:
            answers = await probe.answer(ini.send_raw_burst(burst))
            outcome = judged(case, answers[credits])
            if outcome.verdict != PASS:
                return outcome
            problem = await session_end(ini, probe.timeout)
        except SessionClosed:
            return Outcome(FAIL, "the session ended without answering the request over credit")
    if problem is not None:
        return Outcome(FAIL, f"answered {case.expect.name}, but {problem}")
    return Outcome(PASS, f"request {credits + 1} answered CREDIT_EXCEEDED, then Terminate")


PIPELINED_ROUNDS = 4
"""How many times Request Credits STOREs the pipelined case sends."""


async def _within_credits(probe: Probe, case: Case) -> Outcome:
    """§9.2: an initiator within its credits is never refused.  Request Credits STOREs by
    RDMA Read stay in flight, alternating two handles, each sent as a COMPLETION returns a
    credit (the initiator's own pipelining), until :data:`PIPELINED_ROUNDS` times the
    credits have been answered: every one must be SUCCESS and the session must go on.  A
    target that counts an answer the initiator has already seen as still outstanding
    refuses one of them CREDIT_EXCEEDED."""
    async with probe.session() as ini:
        assert ini.ack is not None
        credits = ini.ack.request_credits
        handles = (probe.handle(0), probe.handle(1))
        total = PIPELINED_ROUNDS * credits
        answers: list[str] = []
        try:
            for h in handles:
                await ini.free(h, check=False)
                await _bound(b"x")(ini, h)
            data = bytearray(3000)  # read by the target in place: an RDMA Read each

            async def one(k: int) -> None:
                try:
                    done = await ini.store(handles[k % 2], data, inline=False, check=False)
                    answers.append(status_name(done.status))
                except SessionClosed:
                    answers.append("the session ended")

            with trio.fail_after(probe.timeout * PIPELINED_ROUNDS):
                async with trio.open_nursery() as nursery:
                    for k in range(total):
                        nursery.start_soon(one, k)
            refused = Counter(a for a in answers if a != Status.SUCCESS.name)
            if refused:
                what = ", ".join(f"{n} {a}" for a, n in refused.most_common())
                return Outcome(
                    FAIL, f"of {total} STOREs within the credits ({credits}): {what} (§9.2)"
                )  # fmt: skip
            return Outcome(PASS, f"{total} STOREs, {credits} in flight: all {case.expect.name}")
        finally:
            with suppress(SessionClosed):
                for h in handles:
                    await ini.free(h, check=False)


async def _record(probe: Probe, case: Case) -> Outcome:
    """A LOAD asking for a completion record: no target on this binding offers RECORD
    (§6.5)."""

    async def send(ini: KbtpInitiator, h: int) -> Completion:
        mr = ini.pd.reg_mr(bytearray(64), Access.LOCAL_WRITE | Access.REMOTE_WRITE)
        try:
            load = Load(
                0,
                h,
                DataDescriptor(mr.rkey, mr.base, 64),
                flags=RequestFlag.RECORD,
                completion=CompletionDescriptor(mr.rkey, mr.base),
            )
            return await ini.request(load, check=False)
        finally:
            mr.dereg()

    return await _with_handle(probe, case, _bound(b"x", seal=True), send)


async def _record_not_advertised(probe: Probe, case: Case) -> Outcome:
    """A HELLO asking for RECORD_COMPLETION: granted, the session must not have it (§6.5)."""
    asked = Capability.DIRECT_LOAD | Capability.DIRECT_ALLOC | Capability.RECORD_COMPLETION
    async with probe.session(capabilities=asked) as ini:
        if ini.granted & Capability.RECORD_COMPLETION:
            return Outcome(FAIL, "HELLO_ACK advertises RECORD_COMPLETION (§6.5: MUST NOT)")
    return Outcome(PASS, "HELLO_ACK with SUCCESS, without RECORD_COMPLETION")


async def _bind_not_granted(probe: Probe, case: Case) -> Outcome:
    assert probe.ack is not None
    if probe.ack.capabilities & Capability.DIRECT_ALLOC:
        return Outcome(SKIP, f"{probe.identity!r} is granted DIRECT_ALLOC")

    async def send(ini: KbtpInitiator, h: int) -> Completion:
        return await ini.request(Bind(0, h, 0, 1, 0), check=False)

    return await _with_handle(probe, case, None, send)


def _simple(
    prepare: Callable[[KbtpInitiator, int], Awaitable[object]] | None,
    request: Callable[[KbtpInitiator, int], Awaitable[Completion | None]],
) -> Callable[[Probe, Case], Awaitable[Outcome]]:
    async def check(probe: Probe, case: Case) -> Outcome:
        return await _with_handle(probe, case, prepare, request)

    return check


async def _too_long_for_block(ini: KbtpInitiator, h: int) -> Completion:
    assert ini.ack is not None
    return await ini.store(h, bytearray(ini.ack.block_size + 1), inline=False, check=False)


CASES: tuple[Case, ...] = (
    Case("SUCCESS", "§6.3, §6.1", "ALLOC_STORE with SEAL, then LOAD returns the octets stored",
         Status.SUCCESS, _round_trip),
    Case("BAD_VERSION", "§5.1", "a request with Version 2", Status.BAD_VERSION,
         lambda p, c: _bad_version(p, c)),
    Case("BAD_OPCODE", "§5.1", "a request with an unassigned opcode (0x7F)", Status.BAD_OPCODE,
         lambda p, c: _unknown_opcode(p, c)),
    Case("BAD_OPCODE.hello", "§4.2", "HELLO again in a session", Status.BAD_OPCODE,
         lambda p, c: _hello_twice(p, c)),
    Case("MALFORMED.length", "§5.1", "a FREE 8 octets longer than its format", Status.MALFORMED,
         lambda p, c: _raw_answer(p, c, lambda h: _free_raw(h, extra=bytes(8)))),
    Case("MALFORMED.status", "§5.1", "a FREE whose Status field is not 0", Status.MALFORMED,
         lambda p, c: _raw_answer(p, c, lambda h: _free_raw(h, status=1))),
    Case("BAD_FLAGS", "§5.2", "an INLINE STORE with INVALIDATE", Status.BAD_FLAGS, _bad_flags),
    Case("SUCCESS.no-record", "§6.5", "HELLO asking for RECORD_COMPLETION: not advertised",
         Status.SUCCESS, _record_not_advertised),
    Case("NOT_OFFERED.record", "§6.5", "a LOAD with RECORD and a Completion Descriptor",
         Status.NOT_OFFERED, _record),
    Case("NOT_OFFERED.bind", "§6.6", "a BIND from an identity without DIRECT_ALLOC",
         Status.NOT_OFFERED, _bind_not_granted),
    Case("HANDLE_OUT_OF_RANGE", "§6.4.1", "a FREE of the handle after the initiator's range",
         Status.HANDLE_OUT_OF_RANGE, lambda p, c: _raw_answer(
             p, c, lambda h: _free_raw(p.handle(0) + (p.ack.handle_count if p.ack else 0)))),
    Case("NOT_VALID", "§6.1.1", "a LOAD of an unbound handle", Status.NOT_VALID,
         _simple(None, lambda ini, h: ini.load_into(h, bytearray(64), check=False))),
    Case("ALREADY_VALID", "§6.3.1", "an ALLOC_STORE of a bound handle", Status.ALREADY_VALID,
         _simple(_bound(b"x"), lambda ini, h: ini.alloc_store(h, b"y", check=False))),
    Case("SEALED", "§6.2.1", "a STORE to a sealed block", Status.SEALED,
         _simple(_bound(b"x", seal=True), lambda ini, h: ini.store(h, b"y", check=False))),
    Case("NOT_SEALED", "§6.1.1", "a LOAD of an unsealed block", Status.NOT_SEALED,
         _simple(_bound(b"x"), lambda ini, h: ini.load_into(h, bytearray(64), check=False))),
    Case("WRONG_GENERATION", "§5.1", "a STORE naming the next Generation", Status.WRONG_GENERATION,
         _wrong_generation),
    Case("TOO_LONG_FOR_BLOCK", "§6.2.1", "a STORE of the block size + 1 octets",
         Status.TOO_LONG_FOR_BLOCK, _simple(_bound(b"x"), _too_long_for_block)),
    Case("TOO_LONG_FOR_DESCRIPTOR", "§6.1.2", "a LOAD of 700 octets into a 699-octet buffer",
         Status.TOO_LONG_FOR_DESCRIPTOR,
         _simple(_bound(bytes(700), seal=True),
                 lambda ini, h: ini.load_into(h, bytearray(699), check=False))),
    Case("INLINE_TOO_LONG", "§6.2", "an INLINE STORE of Max Inline + 1 octets",
         Status.INLINE_TOO_LONG, _inline_too_long),
    Case("NO_SPACE", "§3.4", "an ALLOC_STORE beyond the Allocation Quota", Status.NO_SPACE,
         _no_space),
    Case("NO_SESSION", "§4.2", "a FREE as the first message, before HELLO", Status.NO_SESSION,
         _no_session),
    Case("UNKNOWN_INITIATOR", "§4.2", "HELLO with an identity the target does not know",
         Status.UNKNOWN_INITIATOR, _unknown_initiator),
    Case("SESSION_EXISTS", "§4.2", "HELLO as an identity that has a session",
         Status.SESSION_EXISTS, _session_exists),
    Case("SUCCESS.pipelined", "§9.2", "Request Credits STOREs in flight, refilled as answered",
         Status.SUCCESS, _within_credits),
    Case("CREDIT_EXCEEDED", "§9.2", "Request Credits + 1 requests at once",
         Status.CREDIT_EXCEEDED, _credit_exceeded),
)  # fmt: skip
"""Every case, in the order they run."""
