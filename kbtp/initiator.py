"""The KBTP initiator on the software RNIC over trio TCP (docs/kbtp.md §4, §6, §9.2).

Theory of operation
-------------------
:class:`KbtpInitiator` wraps the sans-IO :class:`~kbtp.initiator_core.InitiatorCore` around
one QP:

* **Session.**  ``KbtpInitiator.connect(host, port, identity)`` is an async context
  manager: TCP + MPA (the initiator is the MPA Initiator, RFC 6581 enhanced startup), one
  receive posted for HELLO_ACK, HELLO sent, HELLO_ACK awaited (a refusal raises
  :class:`HelloRefused`); then Request Credits receives stay posted for COMPLETIONs.
* **Requests.**  ``load``, ``store``, ``alloc_store``, ``free``, ``bind`` (and the general
  ``request``) may be awaited from many tasks at once: the core assigns Request IDs and
  keeps at most Request Credits requests outstanding; the rest wait in order and go out as
  COMPLETIONs return credits (pipelining).  A request submitted while the session is idle
  goes out at once; those submitted while others are outstanding leave together, as one
  post list, from the sender task (the tasks a drain of COMPLETIONs woke submit theirs in
  one scheduler pass); a drain's receives are reposted as one list.  Each data buffer of
  ``load_into``, ``store`` and ``alloc_store`` is registered for the one request
  (REMOTE_WRITE for a LOAD's destination, REMOTE_READ for a store's source) and
  deregistered when it completes (an :class:`~kbtp.arena.Arena` is registered once);
  ``invalidate=True`` asks the target to invalidate it with the COMPLETION (Send with
  Invalidate).
* **Direct modes.**  ``direct_load`` and ``direct_alloc`` run the
  :class:`~kbtp.initiator_core.DirectLoad` / :class:`~kbtp.initiator_core.DirectAlloc`
  step machines: each named RDMA Read, FetchAdd or RDMA Write is posted, awaited, and fed
  back (draft §6.6).  Slot reads back off while the slot is not yet filled.
* **Errors.**  A COMPLETION with a status other than SUCCESS raises
  :class:`KbtpStatusError` (``.status``, ``.completion``) unless ``check=False``.  When the
  connection ends (FIN, a Terminate, a protection error), everything outstanding and every
  later call raises :class:`SessionClosed`.
* **Statistics.**  ``stats`` counts operations and octets per (operation, status).
* **Conformance.**  ``send_raw`` sends arbitrary octets as a request (malformed on
  purpose) and awaits the answer; ``one_sided`` performs a single RDMA operation.

This module holds the session: connection, HELLO, the completion pump and requests.  The
operations built on them are mixed in from :class:`~kbtp.initiator_ops.InitiatorOps`, the
one-sided operations and raw Sends from :class:`~kbtp.initiator_raw.InitiatorRaw`; the
errors live in :mod:`kbtp.initiator_errors` (re-exported here).
"""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass

import trio

from kbtp.constants import (
    DEFAULT_HELLO_ACK_TIMEOUT,
    DEFAULT_MAX_BLOCK_SIZE,
    HELLO_ACK_LEN,
    Capability,
    MessageOpcode,
    Status,
    status_name,
)
from kbtp.initiator_core import InitiatorCore, RequestCompleted, SessionReady, SessionRefused
from kbtp.initiator_errors import HelloRefused, HelloTimeout, KbtpStatusError, SessionClosed
from kbtp.initiator_ops import DIRECT_LOAD_ATTEMPTS, InitiatorOps
from kbtp.initiator_raw import InitiatorRaw
from kbtp.initiator_waiters import CallbackWaiter, OnDone, Waiter
from kbtp.messages import (
    AllocStore,
    Bind,
    Completion,
    HelloAck,
    KbtpError,
    Load,
    Request,
    Store,
    decode_message,
    peek_header,
)
from stack.constants import TERM_RDMAP_OP_UNSPECIFIED
from stack.errors import LocalError, RdmapError, single_exception
from stack.fastinit import wr_maker
from stack.rnic import (
    Access,
    MemoryRegion,
    QpCap,
    QpState,
    RecvWR,
    Rnic,
    SendFlags,
    SendWR,
    Sge,
    WcOpcode,
    WcStatus,
    WorkCompletion,
    WrOpcode,
)
from stack.transport.cm import ConnectionManager, TapFactory
from stack.transport.driver import RdmaConnection
from stack.transport.pumping import drain_halves
from stack.wire.events import MpaSettings

__all__ = [
    "DIRECT_LOAD_ATTEMPTS",
    "MAX_CREDITS",
    "RECEIVE_SIZE",
    "HelloRefused",
    "HelloTimeout",
    "KbtpInitiator",
    "KbtpStatusError",
    "OpStats",
    "SessionClosed",
]

_HELLO_SLOT = -1
_send_wr = wr_maker(
    SendWR, ("inline_data",), wr_id=0, opcode=WrOpcode.SEND, send_flags=SendFlags.NONE
)
"""An unsignalled Send of ``inline_data`` (a request)."""
RECEIVE_SIZE = HELLO_ACK_LEN
"""Initiator receive buffers hold a HELLO_ACK (144 octets) or a COMPLETION (40)."""
MAX_CREDITS = 1024
"""Receives this initiator can post for COMPLETIONs: it keeps at most this many requests
outstanding, whatever Request Credits the target grants (docs/kbtp.md §9.2)."""


@dataclass(slots=True)
class OpStats:
    """Operations and octets of one (operation, status) pair."""

    count: int = 0
    octets: int = 0


class KbtpInitiator(InitiatorOps, InitiatorRaw):
    """One KBTP session with a target (see the module docstring).

    Attributes once connected: ``ack`` (the HELLO_ACK: block size, quota, handle range,
    credits, STags), ``granted`` (capabilities), ``qp``, ``conn``, ``stats``.
    """

    def __init__(
        self,
        identity: bytes,
        capabilities: Capability = Capability.NONE,
        *,
        rnic: Rnic | None = None,
        ird: int = 16,
        ord: int = 16,
        max_block_size: int = DEFAULT_MAX_BLOCK_SIZE,
    ) -> None:
        self.identity = identity
        self.core = InitiatorCore(
            identity, capabilities, max_block_size=max_block_size, max_credits=MAX_CREDITS
        )
        self.rnic = rnic or Rnic("kbtp-initiator")
        self.pd = self.rnic.alloc_pd()
        self.cq = self.rnic.create_cq(8192)
        self.qp = self.rnic.create_qp(
            self.pd,
            self.cq,
            cap=QpCap(max_send_wr=1024, max_recv_wr=MAX_CREDITS),
            ird=ird,
            ord=ord,
        )
        self.conn: RdmaConnection | None = None
        self.ack: HelloAck | None = None
        self.stats: dict[tuple[str, str], OpStats] = {}
        self.direct_alloc_disabled = False
        self.invalidations = 0
        """COMPLETIONs that arrived as Send with Invalidate of the request's own STag."""
        self._hello: Waiter | None = None
        self._instead_of_hello: Callable[[int], bytes] | None = None  # conformance: connect()
        self._requests: dict[int, Waiter] = {}
        self._raw: dict[int, Waiter] = {}
        self._ops: dict[int, Waiter] = {}
        self._wr_ids = itertools.count(1)
        self._recv_mr: MemoryRegion | None = None
        self._hello_mr: MemoryRegion | None = None
        self._closed: SessionClosed | None = None
        self.hello_timeout = DEFAULT_HELLO_ACK_TIMEOUT
        self._reposts: list[RecvWR] = []
        self._pumping = False  # inside a drain: requests submitted now leave after it
        self._recv_wrs: list[RecvWR] = []  # one per COMPLETION slot, built once
        self._send_wake = trio.Event()
        self._settle_result = self._settle  # one bound method for every submit

    # ----------------------------------------------------------------------------------
    # session
    # ----------------------------------------------------------------------------------
    @classmethod
    @asynccontextmanager
    async def connect(
        cls,
        host: str,
        port: int,
        identity: bytes | str,
        *,
        capabilities: Capability = Capability.DIRECT_LOAD | Capability.DIRECT_ALLOC,
        settings: MpaSettings | None = None,
        rnic: Rnic | None = None,
        tap_factory: TapFactory | None = None,
        hello_timeout: float = DEFAULT_HELLO_ACK_TIMEOUT,
        max_block_size: int = DEFAULT_MAX_BLOCK_SIZE,
        instead_of_hello: Callable[[int], bytes] | None = None,
    ) -> AsyncIterator[KbtpInitiator]:
        """Connect, say HELLO and yield the ready session; leaving the block disconnects.

        Raises :class:`HelloTimeout` if no HELLO_ACK arrives within ``hello_timeout``
        seconds of the HELLO, :class:`HelloRefused` for a refusal, and
        :class:`SessionClosed` naming the field for a HELLO_ACK whose parameters no target
        could honour (a Block Size above ``max_block_size``, a Ring Order outside 1..28,
        ...: docs/kbtp.md §4.2).

        For conformance tests, ``instead_of_hello`` makes the first message from the
        HELLO's Request ID, sent in the HELLO's place (a request before HELLO, which a
        target answers in a HELLO_ACK with NO_SESSION: :class:`HelloRefused`).
        """
        if isinstance(identity, str):
            identity = identity.encode()
        settings = settings or MpaSettings()
        self = cls(
            identity,
            capabilities,
            rnic=rnic,
            ird=settings.ird,
            ord=settings.ord,
            max_block_size=max_block_size,
        )
        self.hello_timeout = hello_timeout
        self._instead_of_hello = instead_of_hello
        with single_exception():
            async with self._session(host, port, settings, tap_factory):
                yield self

    @asynccontextmanager
    async def _session(
        self, host: str, port: int, settings: MpaSettings, tap_factory: TapFactory | None
    ) -> AsyncIterator[None]:
        async with ConnectionManager.open(self.rnic, tap_factory=tap_factory) as cm:
            hello_mr = self.pd.reg_mr(bytearray(RECEIVE_SIZE), Access.LOCAL_WRITE)
            self._hello_mr = hello_mr
            hello_sge = Sge(hello_mr.base, RECEIVE_SIZE, hello_mr.lkey)
            self.qp.post_recv(RecvWR(_HELLO_SLOT, (hello_sge,)))
            self.conn = await cm.connect(host, port, self.qp, settings=settings)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._pump)
                nursery.start_soon(self._sender)
                nursery.start_soon(self._watch, self.conn)
                try:
                    await self._say_hello()
                    hello_mr.dereg()
                    yield
                finally:
                    with trio.CancelScope(shield=True):
                        await self.aclose()
                    nursery.cancel_scope.cancel()

    async def _say_hello(self) -> None:
        self._hello = Waiter()
        hello = self.core.hello()
        if self._instead_of_hello is not None:
            header = peek_header(hello)
            assert header is not None  # the core's own HELLO
            hello = self._instead_of_hello(header.request_id)
        self.qp.post_send(SendWR(0, WrOpcode.SEND, inline_data=hello, send_flags=SendFlags.NONE))
        with trio.move_on_after(self.hello_timeout):
            await self._hello.wait()
        if not self._hello.event.is_set():
            timeout = HelloTimeout(f"no HELLO_ACK within {self.hello_timeout:g} s")
            self._closed = timeout
            raise timeout
        ack = self.ack
        assert ack is not None
        if ack.status != Status.SUCCESS:
            raise HelloRefused(ack)
        credits = self.core.request_credits
        self._recv_mr = self.pd.reg_mr(bytearray(credits * RECEIVE_SIZE), Access.LOCAL_WRITE)
        self._recv_wrs = [self._recv_wr(slot) for slot in range(credits)]
        self.qp.post_recv(list(self._recv_wrs))

    async def aclose(self) -> None:
        """Disconnect gracefully (outstanding requests then fail with SessionClosed)."""
        if self.conn is not None:
            with trio.move_on_after(5):
                await self.conn.disconnect()
        self._lost("the initiator closed the session")

    @property
    def granted(self) -> Capability:
        return Capability(self.ack.capabilities) if self.ack else Capability.NONE

    @property
    def block_size(self) -> int:
        return self.ack.block_size if self.ack else 0

    @property
    def closed(self) -> bool:
        return self._closed is not None

    def _recv_wr(self, slot: int) -> RecvWR:
        mr = self._recv_mr
        assert mr is not None
        return RecvWR(slot, (Sge(mr.base + slot * RECEIVE_SIZE, RECEIVE_SIZE, mr.lkey),))

    # ----------------------------------------------------------------------------------
    # the completion pump
    # ----------------------------------------------------------------------------------
    async def _pump(self) -> None:
        """Handle every completion of a drain of the CQ, then repost the drain's receives
        (one post list) and send the requests the returned credits allow; a drain in two
        halves (:func:`~stack.transport.pumping.drain_halves`), the first half's requests
        sent before the second half is handled."""
        while True:
            drained = [await self.cq.next(), *self.cq.poll(256)]
            for part, wcs in enumerate(drain_halves(drained)):
                if part and self.conn is not None:
                    self.conn.uncork()  # the first half's requests are out: these go too
                self._pumping = True
                try:
                    for wc in wcs:
                        self._on_wc(wc)
                finally:
                    self._pumping = False
                if self._reposts:
                    reposts, self._reposts = self._reposts, []
                    self.qp.post_recv(reposts)
                self._flush()

    async def _sender(self) -> None:
        """Send the requests submitted while others were outstanding, together: the tasks
        a drain of COMPLETIONs woke submit theirs in one scheduler pass, and they leave as
        one post list (docs/kbtp.md §9.2 pipelining)."""
        while True:
            await self._send_wake.wait()
            self._send_wake = trio.Event()
            self._flush()

    async def _watch(self, conn: RdmaConnection) -> None:
        await conn.wait_closed()
        self._lost("connection closed")

    def _on_wc(self, wc: WorkCompletion) -> None:
        if wc.opcode in (WcOpcode.RECV, WcOpcode.RECV_RDMA_WITH_IMM):
            if wc.status is not WcStatus.SUCCESS:
                self._lost(f"receive failed: {wc.status.text}")
                return
            if wc.wr_id == _HELLO_SLOT:
                assert self._hello_mr is not None
                data = bytes(self._hello_mr.buf[: wc.byte_len])
            else:
                assert self._recv_mr is not None
                start = wc.wr_id * RECEIVE_SIZE
                data = bytes(self._recv_mr.buf[start : start + wc.byte_len])
                self._reposts.append(self._recv_wrs[wc.wr_id])  # posted after the drain
            self._on_message(data, wc.invalidated_rkey)
            return
        waiter = self._ops.pop(wc.wr_id, None)
        if waiter is not None:
            waiter.wc = wc
            if wc.status is not WcStatus.SUCCESS:
                waiter.error = self._closed_error(f"{wc.opcode.name} failed: {wc.status.text}")
            waiter.event.set()
        elif wc.status is not WcStatus.SUCCESS:
            self._lost(f"{wc.opcode.name} failed: {wc.status.text}")

    def _on_message(self, data: bytes, invalidated: int | None) -> None:
        if self._raw:
            header = peek_header(data)
            raw = self._raw.pop(header.request_id, None) if header is not None else None
            if raw is not None:
                try:
                    message = decode_message(data)
                except KbtpError as exc:
                    raw.error = exc
                else:
                    raw.completion = message if isinstance(message, Completion) else None
                    raw.answer = message
                raw.event.set()
                return
        try:
            events = self.core.on_message(data)
        except KbtpError as exc:
            self._lost(f"protocol error from the target: {exc}")
            if self.conn is not None:
                error = RdmapError(exc.rule, exc.detail, TERM_RDMAP_OP_UNSPECIFIED)
                self.conn.endpoint.fail(error, offending=False)
                if self.qp.on_output is not None:
                    self.qp.on_output()
            return
        for event in events:
            if type(event) is RequestCompleted:
                waiter = self._requests.pop(event.request.request_id, None)
                if waiter is not None:
                    waiter.completion = event.completion
                    waiter.invalidated = invalidated
                    waiter.done()
            elif isinstance(event, SessionReady | SessionRefused):
                self.ack = event.ack
                if self._hello is not None:
                    self._hello.event.set()

    def _flush(self) -> None:
        """Send the requests the credits allow (docs/kbtp.md §9.2)."""
        if self._closed is not None or self.qp.state is not QpState.RTS:
            return
        out = self.core.outgoing()
        if out:
            self.qp.post_send([_send_wr(d) for d in out])

    def _closed_error(self, reason: str) -> SessionClosed:
        return SessionClosed(
            f"KBTP session with the target ended: {reason}",
            terminate=self.qp.peer_terminate,
            cause=self.conn.error if self.conn is not None else None,
        )

    def _lost(self, reason: str) -> None:
        if self._closed is None:
            self._closed = self._closed_error(reason)
        waiters = [*self._requests.values(), *self._ops.values(), *self._raw.values()]
        self._requests.clear()
        self._ops.clear()
        self._raw.clear()
        for waiter in waiters:
            waiter.error = self._closed
            waiter.done()
        if self._hello is not None and not self._hello.event.is_set():
            self._hello.error = self._closed
            self._hello.event.set()

    def _check_open(self) -> None:
        if self._closed is not None:
            raise self._closed
        if self.ack is None:
            raise LocalError("no session: HELLO_ACK not received")

    # ----------------------------------------------------------------------------------
    # requests
    # ----------------------------------------------------------------------------------
    async def request(self, request: Request, *, check: bool = True) -> Completion:
        """Send ``request`` (its Request ID is assigned here) and await its COMPLETION."""
        self._check_open()
        waiter = Waiter()
        self._enqueue(request, waiter)
        await waiter.event.wait()
        completion = self._settle(request, waiter)
        if check and completion.status != Status.SUCCESS:
            raise KbtpStatusError(
                Status(completion.status) if completion.status in _STATUSES else Status.MALFORMED,
                f"{request.opcode.name} of handle 0x{request.handle:x}",
                completion=completion,
                request=request,
            )
        return completion

    def submit(self, request: Request, on_done: OnDone) -> int:
        """Send ``request`` without awaiting it; returns its Request ID.

        ``on_done(completion, None)`` is called when its COMPLETION arrives, whatever the
        status (no :class:`KbtpStatusError`), or ``on_done(None, SessionClosed)`` when the
        session ends first; it runs in the session's completion task, so it must not block
        (it may submit more requests: they leave together after the drain).  An exception
        it raises ends the session and leaves the ``connect`` block.
        """
        self._check_open()
        return self._enqueue(request, CallbackWaiter(request, on_done, self._settle_result))

    def _enqueue(self, request: Request, waiter: Waiter) -> int:
        """Hand ``request`` to the core and send it now, or with the requests of this pass
        when others are in flight (docs/kbtp.md §9.2)."""
        busy = self.core.outstanding
        rid = self.core.submit(request)
        self._requests[rid] = waiter
        if self._pumping:
            pass  # the drain's end sends it with the others
        elif busy:
            self._send_wake.set()  # others are in flight: leave with the requests of this pass
        else:
            self._flush()  # the pipeline is idle: no reason to wait
        return rid

    def _settle(self, request: Request, waiter: Waiter) -> Completion:
        """Account a request's result: statistics, invalidations, an abandoned ticket;
        raises the :class:`SessionClosed` that ended it first."""
        if waiter.error is not None:
            self._count(request.opcode.name, "SESSION_CLOSED", 0)
            raise waiter.error
        completion = waiter.completion
        assert completion is not None
        if waiter.invalidated is not None and isinstance(request, Load | Store | AllocStore):
            if waiter.invalidated == request.descriptor.stag:
                self.invalidations += 1
        status = status_name(completion.status)
        self._count(_OPCODE_NAMES[request.opcode], status, _octets(request, completion))
        if completion.status == Status.TICKET_ABANDONED:
            self.direct_alloc_disabled = True  # docs/kbtp.md §4.4: its STags are invalid
        return completion

    def _count(self, op: str, status: str, octets: int) -> None:
        entry = self.stats.get((op, status))
        if entry is None:
            entry = self.stats[op, status] = OpStats()
        entry.count += 1
        entry.octets += octets


_STATUSES = frozenset(int(s) for s in Status)


_OPCODE_NAMES = {o: o.name for o in MessageOpcode}


def _octets(request: Request, completion: Completion) -> int:
    """Octets of block data an operation moved (for the statistics)."""
    if completion.status != Status.SUCCESS:
        return 0
    if request.opcode is MessageOpcode.LOAD:
        return completion.data_length
    if isinstance(request, Store | AllocStore):
        return request.descriptor.length
    if isinstance(request, Bind):
        return request.data_length
    return 0
