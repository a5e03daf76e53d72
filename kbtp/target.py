"""The KBTP target on the software RNIC over trio TCP (draft §9.1, docs/kbtp.md §3.6, §4, §9).

Theory of operation
-------------------
:class:`KbtpTarget` binds the sans-IO :class:`~kbtp.target_core.TargetCore` to one
:class:`~stack.rnic.Rnic`:

* **Memory.**  One mapping holds the table, the pool and the rings: anonymous, or with
  ``pool_file`` the layout of a :class:`~kbtp.pool_file.PoolFile` (MAP_SHARED), recovered
  before the core adopts it and flushed at a clean stop (docs/kbtp.md §12).  Tagged
  Offsets are virtual addresses (VA-based STags), so the core's ``base_to`` is the
  mapping's address and Tagged Offset = ``base_to`` + byte offset.  The core's
  ``RegisterMemory`` actions register sub-ranges of the mapping in the session's protection
  domain with the access of docs/kbtp.md §3.6 (Table, Pool and Ring remote read, Head
  remote atomic, Partition remote write) when a HELLO grants a direct mode, and its
  ``DeregisterMemory`` actions drop them when the connection is gone.  A local-only MR
  over the whole mapping is the source and sink of the target's own RDMA Writes and Reads.
* **Atomics.**  The core's ``fetch_add`` runs in that MR's atomic engine
  (``MemoryRegion.atomic``), the code inbound Atomic Requests run, so the target's Head and
  Tail FetchAdds are atomic with respect to the initiators' FetchAdds on the wire (RFC 7306
  §5.3, EXT-07).
* **Sessions.**  Every accepted connection gets a QP and a CQ of its own and a task that
  feeds the core: each received Send goes to ``handle_message`` (its receive buffer is
  reposted first, so Request Credits + the receive margin receives stay posted, docs/kbtp.md
  §9.2; the core learns which messages arrived together), each RDMA
  Write/Read/LOCAL_INV completion to ``rdma_completed`` (or ``rdma_failed``).  The actions
  the core returns are posted as work requests on the QP of the session they name (one
  session's request can release another session's request queued on the same handle).
  Within one drain of the CQ the work requests and the reposted receives are queued per
  session and posted at the drain's end, the receives first, then the work as one post
  list: the answers to a burst of requests leave together (§9.2), in the order the core
  gave them.
* **Order.**  A LOAD's COMPLETION is posted only once its RDMA Write is complete for the
  core, that is, once the block's octets have been taken (copied at posting for Writes up
  to ``write_copy_limit``, read by the transport for longer ones): the core may reuse the
  block as soon as the Write is reported.  The COMPLETION follows the Write on the same
  stream, so the data is placed before the COMPLETION is delivered (RFC 5040 §5.5).
* **Closing.**  ``CloseSession``: a local-only LOCAL_INV marker is posted behind the Sends
  (the error COMPLETION or HELLO_ACK); when it completes they have been handed to the
  transport, and the QP sends a Terminate with the action's cause and closes (docs/kbtp.md
  §9.3).  When a connection ends for any reason the core's ``close_session`` runs and the
  session's MRs are deregistered.
* **Offload.**  With ``offload``, the chain side of the binding
  (:mod:`kbtp.target_offload_binding`) arms each session's chain and holds an
  ALLOW_UNSEALED LOAD behind another session's offloaded STORE (docs/kbtp.md §8.1).
* **Time.**  A ticker task calls ``tick`` at the core's ``next_deadline`` and at least every
  Ticket Timeout / 2 (draft §3.4, docs/kbtp.md §6.7).

Listening, each session's set-up and teardown and the ticker are mixed in from
:class:`~kbtp.target_serving.TargetServing`.
"""

from __future__ import annotations

import itertools
import logging
import mmap
import os
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import replace

import trio

from kbtp.constants import Status
from kbtp.messages import Completion
from kbtp.pool_file import PoolFile
from kbtp.pool_recovery import RecoveryReport
from kbtp.target_actions import (
    Action,
    CloseSession,
    DeregisterMemory,
    InvalidateStag,
    ReadFromInitiator,
    RegionKind,
    RegisterMemory,
    SendMessage,
    WriteToInitiator,
)
from kbtp.target_config import TargetConfig
from kbtp.target_core import TargetCore
from kbtp.target_offload_binding import OffloadBinding
from kbtp.target_serving import TargetServing
from kbtp.target_session import TargetSession, layout_size
from kbtp.target_session import receive_buffer_size as receive_buffer_size
from stack.constants import TERM_RDMAP_OP_UNSPECIFIED
from stack.errors import LocalError, RdmapError, single_exception
from stack.fastinit import maker, wr_maker
from stack.rnic import (
    Access,
    MemoryRegion,
    QpState,
    Rnic,
    SendFlags,
    SendWR,
    Sge,
    WcOpcode,
    WcStatus,
    WorkCompletion,
    WrOpcode,
)
from stack.transport.cm import TapFactory
from stack.transport.pumping import drain_halves
from stack.wire.events import AtomicRequest, MpaSettings

log = logging.getLogger(__name__)

REGION_ACCESS: dict[RegionKind, Access] = {
    RegionKind.TABLE: Access.REMOTE_READ,
    RegionKind.POOL: Access.REMOTE_READ,
    RegionKind.RING: Access.REMOTE_READ,
    RegionKind.HEAD: Access.REMOTE_ATOMIC,
    RegionKind.PARTITION: Access.REMOTE_WRITE,
}
"""Access rights of each region the core registers (docs/kbtp.md §3.6)."""

_UNSIGNALLED = 0
"""wr_id of Sends nobody waits for (the core's op ids start at 1)."""
_CLOSE_MARKER = (1 << 64) - 1
"""wr_id of the marker behind a CloseSession's Sends: when it completes, the Terminate."""


_send_wr = wr_maker(
    SendWR, ("inline_data",), wr_id=_UNSIGNALLED, opcode=WrOpcode.SEND, send_flags=SendFlags.NONE
)
"""An unsignalled Send of ``inline_data`` (an answer)."""
_write_wr = wr_maker(
    SendWR,
    ("inline_data", "rkey", "remote_addr"),
    wr_id=_UNSIGNALLED,
    opcode=WrOpcode.RDMA_WRITE,
    send_flags=SendFlags.NONE,
)
"""An unsignalled RDMA Write of ``inline_data`` (a copy of the block)."""
_rdma_wr = wr_maker(SendWR, ("wr_id", "opcode", "sg_list", "rkey", "remote_addr"))
"""A signalled RDMA Write or Read between the target buffer and the initiator's."""
_sge = maker(Sge)

WRITE_COPY_LIMIT = 256 * 1024
"""RDMA Writes up to this length carry a copy of the block (see ``KbtpTarget._apply``)."""


class KbtpTarget(TargetServing, OffloadBinding):
    """A KBTP target serving ``config`` over loopback or any TCP address.

    Use ``async with target.running(host, port):`` (or ``await nursery.start(target.serve,
    host, port)``); ``port`` is the bound port once started.  ``core`` is the
    :class:`TargetCore` (tests inspect its table and rings), ``rnic`` the software RNIC,
    ``sessions`` the live sessions by id.  ``on_event`` receives one line per session
    event (the ``kbtp target`` command prints them).
    """

    def __init__(
        self,
        config: TargetConfig,
        *,
        rnic: Rnic | None = None,
        settings: MpaSettings | None = None,
        tap_factory: TapFactory | None = None,
        on_event: Callable[[str], None] | None = None,
        pool_file: str | os.PathLike[str] | None = None,
        pool_sync: bool = False,
        offload: bool = False,
    ) -> None:
        """``pool_file``: keep the table, pool and rings in that file (created if absent or
        empty, else checked against ``config`` and recovered: PoolFileError); ``pool_sync``:
        flush every seal and free to it before the COMPLETION (docs/kbtp.md §12.4);
        ``offload``: the RNIC answers LOADs, mapped STOREs and, on a DIRECT_ALLOC
        partition, ALLOC_STOREs and FREEs by pre-posted chains (docs/kbtp.md §8.1)."""
        self.offload = offload
        self.rnic = rnic or Rnic("kbtp-target")
        self.pd = self.rnic.alloc_pd()  # the core's own view; sessions have their own PDs
        self.settings = settings or MpaSettings()
        self.tap_factory = tap_factory
        self.on_event = on_event
        self.pool: PoolFile | None = None
        self.recovery: RecoveryReport | None = None
        """What the recovery of ``pool_file`` found (None: no file, or a new one)."""
        if pool_file is None:
            self._mapping = mmap.mmap(-1, layout_size(config))
        else:
            self.pool = PoolFile(pool_file, config)
            self._mapping = self.pool.mapping
        self.local_mr = self.pd.reg_mr(self._mapping, Access.LOCAL_WRITE)
        self.config = replace(config, base_to=self.local_mr.base)
        self.regions: dict[int, MemoryRegion] = {}  # the core's RegisterMemory MRs by STag
        try:
            self.core = self._make_core(pool_sync)
        except BaseException:
            if self.pool is not None:
                self.pool.close()  # a target that never came up holds no lock
            raise
        self.sessions: dict[int, TargetSession] = {}
        self.port = 0
        self.host = ""
        self._sids = itertools.count(1)
        self._tick_wake = trio.Event()
        self.sessions_served = 0
        self.write_copy_limit = WRITE_COPY_LIMIT
        self._nursery: trio.Nursery | None = None
        """The serving nursery: tasks that outlive a session (:meth:`_release_after_store`)."""
        self._draining: list[TargetSession] | None = None
        """While a drain is applied: the sessions with work in their outbox (else None)."""

    def _make_core(self, pool_sync: bool) -> TargetCore:
        """The core over the mapping: a new pool initialized, or a pool file recovered
        first (docs/kbtp.md §12.3) and adopted."""
        pool = self.pool
        persist = None
        if pool is not None:
            self.recovery = pool.recover(self.config)
            persist = pool.persist if pool_sync else None
            if self.recovery is not None:
                level = logging.WARNING if self.recovery.repaired else logging.INFO
                log.log(level, "pool file %s recovered: %s", pool.path, self.recovery.line())
        core = TargetCore(
            self.config,
            self.local_mr.buf,
            fetch_add=self._fetch_add,
            recovered=self.recovery is not None,
            persist=persist,
        )
        if pool is not None and self.recovery is None:
            pool.commit(self.config.base_to)
        return core

    # ----------------------------------------------------------------------------------
    # the core's injected services
    # ----------------------------------------------------------------------------------
    def _fetch_add(self, mem: memoryview, offset: int, add: int, mask: int) -> int:
        """The core's FetchAdd, executed by the RNIC's atomic engine (RFC 7306 §5.3).

        ``mem`` is the core's view of the memory ``local_mr`` registers; the engine works
        on the MR so that it serializes with inbound Atomic Requests (EXT-07).
        """
        del mem
        mr = self.local_mr
        return mr.atomic(AtomicRequest.fetch_add(0, mr.stag, mr.base + offset, add, mask))

    def _register(self, sess: TargetSession, action: RegisterMemory) -> list[Action]:
        """RegisterMemory: an MR over the action's range whose TOs are the core's TOs, in
        the protection domain of the session (SEC-03); the STag goes back to the core."""
        now = trio.current_time()
        start, end = action.offset, action.offset + action.length
        try:
            mr = sess.pd.reg_mr(self.local_mr.buf[start:end], REGION_ACCESS[action.kind])
        except LocalError as exc:
            return self.core.rdma_failed(action.op_id, now, f"cannot register: {exc}")
        self.regions[mr.stag] = mr
        if mr.base != self.config.base_to + start:  # pragma: no cover - VA arithmetic
            failed = self.core.rdma_failed(action.op_id, now, "region not at its Tagged Offset")
            return [DeregisterMemory(sess.sid, mr.stag), *failed]
        return self.core.memory_registered(action.op_id, mr.stag, now)

    # ----------------------------------------------------------------------------------
    # serving
    # ----------------------------------------------------------------------------------
    @asynccontextmanager
    async def running(self, host: str = "127.0.0.1", port: int = 0) -> AsyncIterator[KbtpTarget]:
        """Serve in the background while the block runs; leaving it stops the target."""
        with single_exception():
            async with trio.open_nursery() as nursery:
                await nursery.start(self.serve, host, port)
                try:
                    yield self
                finally:
                    nursery.cancel_scope.cancel()

    async def _pump(self, sess: TargetSession) -> None:
        """Feed the core every completion of the session, a whole drain of the CQ at a time:
        the messages of one drain all arrived before any answer to them was sent, which is
        what the core's credit accounting needs to know (``receive_batch``, §9.2).  The
        drain is answered in two halves (:func:`~stack.transport.pumping.drain_halves`):
        the first half's answers leave before the second half is worked on."""
        cq = sess.cq
        while True:
            batch = [await cq.next()]
            while more := cq.poll(256):
                batch.extend(more)
            self.core.receive_batch(sess.sid)
            for part, wcs in enumerate(drain_halves(batch)):
                if part and sess.conn is not None:
                    sess.conn.uncork()  # the first half's answers are out: these go too
                self._draining = []
                now = trio.current_time()  # one clock reading per half: it is handled at once
                try:
                    for wc in wcs:
                        self._on_wc(sess, wc, now)
                finally:
                    self._post_drain()

    def _post_drain(self) -> None:
        """End of a drain: every session's receives are reposted, then its answers go out
        as one post list (one hand-off to the transport, not one per work request)."""
        touched, self._draining = self._draining or [], None
        for sess in touched:
            self._post_queued(sess)

    def _post_queued(self, sess: TargetSession) -> None:
        """Post what the drain queued for ``sess``: its receives first, then its work."""
        reposts, sess.reposts = sess.reposts, []
        outbox, sess.outbox = sess.outbox, []
        if reposts:
            sess.qp.post_recv(reposts)
        if outbox:
            self._post_now(sess, outbox if len(outbox) > 1 else outbox[0])

    # ----------------------------------------------------------------------------------
    # the last resort (docs/kbtp.md §9.3)
    # ----------------------------------------------------------------------------------
    def _guarded(
        self, sess: TargetSession, call: Callable[..., list[Action]], *args: object
    ) -> list[Action]:
        """``call(*args)``, a core call on behalf of ``sess``; if it raises, whatever the
        peer did, the exception ends that session only: a log line with the traceback, the
        core releases what the session held, and the stream is Terminated (0/2/0xFF)."""
        try:
            return call(*args)
        except Exception as exc:  # the boundary no peer may cross
            log.exception("session %d: the target core failed", sess.sid)
            return self._core_failed(sess, exc)

    def _core_failed(self, sess: TargetSession, exc: Exception) -> list[Action]:
        reason = f"{type(exc).__name__}: {exc}"
        self._event(f"session {sess.sid}: target failure: {reason}")
        actions: list[Action] = []
        try:
            actions = self.core.close_session(sess.sid, trio.current_time())
        except Exception:  # still only this session's business
            log.exception("session %d: releasing it failed too", sess.sid)
        sess.close = CloseSession(sess.sid, Status.TARGET_FAILURE, reason)
        sess.reason = f"closed by the target: TARGET_FAILURE: {reason}"
        self._terminate(sess)
        return actions

    # ----------------------------------------------------------------------------------
    # completions in, actions out
    # ----------------------------------------------------------------------------------
    def _on_wc(self, sess: TargetSession, wc: WorkCompletion, now: float | None = None) -> None:
        """Feed one completion of ``sess`` to the core (``now``: the time, if already read)."""
        if now is None:
            now = trio.current_time()
        if sess.alloc_log is not None:  # offloaded: what its chain ran (§8.1)
            self._offloaded(sess, now)
        if wc.opcode is WcOpcode.RECV:
            if wc.status is not WcStatus.SUCCESS:
                return  # flushed: the connection is ending
            slot = wc.wr_id
            start = slot * sess.recv_size
            data = bytes(sess.recv_mr.buf[start : start + wc.byte_len])
            wrs = sess.recv_wrs  # built when the session's receives were first posted
            recv = wrs[slot] if slot < len(wrs) else sess.recv_wr(slot)
            if self._draining is None:
                sess.qp.post_recv(recv)
            else:
                sess.reposts.append(recv)
                self._touch(sess)
            sess.messages += 1
            fresh = sess.identity is None
            if sess.credits is not None:  # it fell back: what the session has out counts (§8.1)
                self.core.offloaded_requests(sess.sid, sess.credits.take())
            if self.offload:
                self._hold_behind_store(sess, data)
            actions = self._guarded(sess, self.core.handle_message, sess.sid, data, now)
            if fresh:
                sess.identity = self.core.session_identity(sess.sid)
                if sess.identity is not None:
                    name = sess.identity.decode(errors="replace")
                    self._event(f"session {sess.sid}: HELLO from {name!r} accepted")
                    self._tick_wake.set()
            self._apply(actions)
            if self.offload and sess.identity is not None and sess.qp.state is QpState.RTS:
                if self._draining is not None:  # the chain goes behind what is queued
                    self._post_drain()
                    self._draining = []
                self._arm(sess)
            return
        if wc.wr_id == _CLOSE_MARKER:
            self._terminate(sess)
            return
        if wc.opcode is WcOpcode.CHAIN:  # an offload chain failed: the QP is Terminated
            sess.reason = sess.reason or f"offloaded request failed: {wc.status.text}"
            return
        if wc.wr_id == _UNSIGNALLED or wc.status is WcStatus.WR_FLUSH_ERR:
            return  # a flushed WR: the session ends and the core drops its operations
        if wc.status is WcStatus.SUCCESS:
            self._apply(self._guarded(sess, self.core.rdma_completed, wc.wr_id, now))
        else:
            reason = f"{wc.opcode.name} failed: {wc.status.text}"
            self._apply(self._guarded(sess, self.core.rdma_failed, wc.wr_id, now, reason))

    def _apply(self, actions: list[Action]) -> None:
        """Carry out the core's actions as work requests on the QPs of their sessions.

        An RDMA Write of up to ``write_copy_limit`` octets takes a copy of the block when
        posted, so it is complete for the core at once: the COMPLETION is posted right
        behind it and both leave in one socket write (the Write is still placed first,
        RFC 5040 §5.5).  Longer Writes read the pool when transmitted and are reported
        when they have been handed to the transport.
        """
        work = actions  # extended (a copy) by what a registration or a Write's completion adds
        i = 0
        while i < len(work):
            action = work[i]
            i += 1
            kind = type(action)
            if kind is DeregisterMemory:
                assert isinstance(action, DeregisterMemory)
                mr = self.regions.pop(action.stag, None)
                if mr is not None:
                    mr.dereg()
                continue
            sess = self.sessions.get(action.session)
            if sess is None:
                continue  # the session has gone; the core has dropped its operations
            if kind is SendMessage:
                assert isinstance(action, SendMessage)
                data = action.message.encode()
                if action.invalidate_stag is None:
                    wr = _send_wr(data)
                else:
                    wr = SendWR(
                        _UNSIGNALLED,
                        WrOpcode.SEND_WITH_INV,
                        inline_data=data,
                        invalidate_rkey=action.invalidate_stag,
                        send_flags=SendFlags.NONE,
                    )
                self._post(sess, wr)
                if sess.credits is not None and isinstance(action.message, Completion):
                    sess.credits.answered(sess.qp)  # counted as the chain's are (§8.1)
            elif kind is ReadFromInitiator:
                assert isinstance(action, ReadFromInitiator)
                self._post_rdma(sess, action, WrOpcode.RDMA_READ)
            elif kind is WriteToInitiator:
                assert isinstance(action, WriteToInitiator)
                if action.length <= self.write_copy_limit:
                    start = action.local_to - self.local_mr.base
                    data = bytes(self.local_mr.buf[start : start + action.length])
                    wr = _write_wr(data, action.remote_stag, action.remote_to)
                    if self._post(sess, wr):
                        now = trio.current_time()
                        done = self._guarded(sess, self.core.rdma_completed, action.op_id, now)
                        work = [*work, *done] if work is actions else work + done
                    continue
                self._post_rdma(sess, action, WrOpcode.RDMA_WRITE)
            elif kind is RegisterMemory:
                assert isinstance(action, RegisterMemory)
                work = [*work, *self._guarded(sess, self._register, sess, action)]
            elif kind is InvalidateStag:
                assert isinstance(action, InvalidateStag)
                self._post(
                    sess, SendWR(action.op_id, WrOpcode.LOCAL_INV, invalidate_rkey=action.stag)
                )
            else:
                assert isinstance(action, CloseSession)
                # A local-only marker behind the Sends already posted: it completes once
                # they have all been handed to the transport; then the Terminate goes out.
                sess.reason = f"closed by the target: {action.status.name}: {action.reason}"
                sess.close = action
                marker = SendWR(
                    _CLOSE_MARKER, WrOpcode.LOCAL_INV, invalidate_rkey=sess.marker_mr.stag
                )
                if not self._post(sess, marker):
                    self._terminate(sess)
        if not self.offload:
            return
        for sess in self.sessions.values():  # what the FREE chains must know (§8.1)
            if sess.alloc_log is not None and sess.identity is not None:
                deferred = len(self.core.ring_of(sess.identity).deferred)
                sess.alloc_log.publish(deferred, self.core.pending_ops())
            if sess.credits is not None:
                sess.credits.publish(self.core.credits_left(sess.sid))

    def _post_rdma(
        self, sess: TargetSession, action: WriteToInitiator | ReadFromInitiator, opcode: WrOpcode
    ) -> None:
        """A signalled RDMA Write or Read between the target buffer and the initiator's."""
        sge = _sge(action.local_to, action.length, sess.local_mr.lkey)
        self._post(
            sess, _rdma_wr(action.op_id, opcode, (sge,), action.remote_stag, action.remote_to)
        )

    def _touch(self, sess: TargetSession) -> None:
        """Note that ``sess`` has work queued for the end of the drain."""
        if self._draining is not None and sess not in self._draining:
            self._draining.append(sess)

    def _post(self, sess: TargetSession, wr: SendWR) -> bool:
        """Post ``wr`` on the session's QP (during a drain: queue it for the drain's post
        list, in order); False if the QP no longer takes work."""
        if sess.qp.state is not QpState.RTS:
            return False  # closing or in error: the core learns from the session's end
        if self._draining is not None:
            self._touch(sess)
            sess.outbox.append(wr)
            return True
        return self._post_now(sess, wr)

    def _post_now(self, sess: TargetSession, wr: SendWR | list[SendWR]) -> bool:
        """Post ``wr`` (one or a post list) now; False if the QP no longer takes work."""
        qp = sess.qp
        if qp.state is not QpState.RTS:
            return False  # closing or in error: the core learns from the session's end
        try:
            qp.post_send(wr)
        except LocalError as exc:
            first = wr[0] if isinstance(wr, list) else wr
            log.warning("session %d: cannot post %s: %s", sess.sid, first.opcode.value, exc)
            sess.reason = f"target failure: {exc}"
            self._terminate(sess)
            return False
        return True

    def _terminate(self, sess: TargetSession) -> None:
        """Terminate the stream with the pending CloseSession's cause and close (§9.3)."""
        conn = sess.conn
        if conn is None or sess.qp.state in (QpState.TERMINATE, QpState.ERROR):
            return
        self._post_queued(sess)  # what was answered before goes out before the Terminate
        if sess.qp.state in (QpState.TERMINATE, QpState.ERROR):
            return
        action = sess.close
        if action is None:
            error = RdmapError("KBTP-9.3", sess.reason, TERM_RDMAP_OP_UNSPECIFIED)
        else:
            detail = f"KBTP session closed: {action.status.name}: {action.reason}"
            error = RdmapError("KBTP-9.3", detail, action.term)
        conn.endpoint.fail(error, offending=False)
        if sess.qp.on_output is not None:
            sess.qp.on_output()

    # ----------------------------------------------------------------------------------
    # inspection
    # ----------------------------------------------------------------------------------
    def region(self, stag: int) -> MemoryRegion | None:
        """The MR registered for the core under ``stag`` (None once its session ended)."""
        return self.regions.get(stag)

    def stag_valid(self, stag: int) -> bool:
        """True if ``stag`` is registered on this RNIC and not invalidated."""
        mr = self.rnic.table.lookup(stag)
        return mr is not None and mr.valid
