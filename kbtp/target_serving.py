"""The target's life on its RNIC: listening, each session from accept to teardown, and the
ticker (docs/kbtp.md §4.1, §4.2, §6.7, §9.2).

:class:`TargetServing` is the part of :class:`~kbtp.target.KbtpTarget` that accepts each
connection into a session of its own (a protection domain, QP, CQ and receive buffers,
receives posted before the MPA Reply), runs it until the connection ends, then has the core
release it and deregisters its memory; a ticker task calls the core's ``tick`` at its
deadlines.  The completions of each session are fed to the core by the binding's pump.
"""

from __future__ import annotations

import itertools
import logging
import mmap
from collections.abc import Callable
from typing import TYPE_CHECKING

import trio

from kbtp.pool_file import PoolFile
from kbtp.target_config import TargetConfig
from kbtp.target_core import TargetCore
from kbtp.target_offload import chain_runs
from kbtp.target_session import TargetSession, receive_buffer_size
from stack.rnic import Access, MemoryRegion, QpCap, Rnic
from stack.transport.cm import ConnectFailed, ConnectionManager, ConnectRequest, TapFactory
from stack.wire.events import MpaSettings

if TYPE_CHECKING:
    from kbtp.target_actions import Action

__all__ = ["TargetServing"]

log = logging.getLogger("kbtp.target")
"""The target's logger (its session events are logged under the target's name)."""


class TargetServing:
    """Serving and the sessions' life (see the module docstring); mixed into
    :class:`~kbtp.target.KbtpTarget`, which provides the attributes and the methods
    declared here."""

    config: TargetConfig
    core: TargetCore
    rnic: Rnic
    settings: MpaSettings
    tap_factory: TapFactory | None
    on_event: Callable[[str], None] | None
    pool: PoolFile | None
    regions: dict[int, MemoryRegion]
    sessions: dict[int, TargetSession]
    sessions_served: int
    port: int
    host: str
    _mapping: mmap.mmap
    _sids: itertools.count[int]
    _tick_wake: trio.Event
    _nursery: trio.Nursery | None

    if TYPE_CHECKING:

        async def _pump(self, sess: TargetSession) -> None: ...

        def _apply(self, actions: list[Action]) -> None: ...

        def _guarded(
            self, sess: TargetSession, call: Callable[..., list[Action]], *args: object
        ) -> list[Action]: ...

        def _offloaded(self, sess: TargetSession, now: float) -> None: ...

    async def serve(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Listen on (host, port) and serve until cancelled; reports the bound port.

        With a pool file, the end of serving is its clean stop: once every session has
        ended, the file is flushed, marked clean and unlocked (docs/kbtp.md §12.4)."""
        if self.pool is not None:
            self.pool.start()
        try:
            async with ConnectionManager.open(self.rnic, tap_factory=self.tap_factory) as cm:
                listener = await cm.listen(host, port, settings=self.settings)
                self.host, self.port = listener.host, listener.port
                async with trio.open_nursery() as nursery:
                    self._nursery = nursery
                    nursery.start_soon(self._ticker)
                    task_status.started(self.port)
                    async for request in listener:
                        nursery.start_soon(self._run_session, request)
        finally:
            if self.pool is not None:
                self.pool.stop()

    def _event(self, text: str) -> None:
        log.info("%s", text)
        if self.on_event is not None:
            self.on_event(text)

    async def _run_session(self, request: ConnectRequest) -> None:
        sid = next(self._sids)
        credits = self.config.request_credits
        receives = credits + self.config.receive_margin  # docs/kbtp.md §9.2
        size = receive_buffer_size(self.config)
        cq = self.rnic.create_cq(max(256, 8 * credits + receives + 64))
        cap = QpCap(max_send_wr=4 * credits + 64, max_recv_wr=receives)
        # A protection domain per session (RFC 5042 §6.1.1, SEC-03): no stream can use an
        # STag given to another (SEC-01), and no STag is shared across streams (SEC-07).
        pd = self.rnic.alloc_pd()
        local_mr = pd.reg_mr(self._mapping, Access.LOCAL_WRITE)
        qp = self.rnic.create_qp(pd, cq, cap=cap, ird=self.settings.ird, ord=self.settings.ord)
        recv_mr = pd.reg_mr(bytearray(receives * size), Access.LOCAL_WRITE)
        marker_mr = pd.reg_mr(bytearray(1), Access.LOCAL_WRITE)
        sess = TargetSession(sid, pd, local_mr, qp, cq, request.remote, recv_mr, size, marker_mr)
        sess.regions += [local_mr, recv_mr, marker_mr]
        # docs/kbtp.md §4.1: receives are posted before the MPA Reply goes out.
        qp.post_recv([sess.recv_wr(slot) for slot in range(receives)])
        self.sessions[sid] = sess
        self.sessions_served += 1
        try:
            try:
                sess.conn = await request.accept(qp)
            except ConnectFailed as exc:
                sess.reason = str(exc)
                return
            # The HELLO deadline runs from here (docs/kbtp.md §4.2); wake the ticker for it.
            # The QP carries the IRD/ORD negotiated in MPA (RFC 6581), checked at HELLO (§4.1).
            self.core.open_session(sid, trio.current_time(), ird=qp.ird, ord=qp.ord)
            self._tick_wake.set()
            self._event(f"session {sid}: connected from {request.remote[0]}:{request.remote[1]}")
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._pump, sess)
                await sess.conn.wait_closed()
                nursery.cancel_scope.cancel()
            if not sess.reason:
                error = sess.conn.error
                sess.reason = f"connection ended ({error})" if error else "closed by the initiator"
        finally:
            del self.sessions[sid]
            if not sess.reason:
                sess.reason = "the target is stopping"
            with trio.CancelScope(shield=True):
                self._offloaded(sess, trio.current_time())
                self._apply(self._guarded(sess, self.core.close_session, sid, trio.current_time()))
                for mr in sess.regions:
                    self.regions.pop(mr.stag, None)
                    mr.dereg()
                self.rnic.destroy_qp(qp)
            who = sess.identity.decode(errors="replace") if sess.identity else "?"
            count = sess.messages + chain_runs(qp)
            self._event(f"session {sid} ({who}): ended after {count} messages: {sess.reason}")

    async def _ticker(self) -> None:
        """Call ``tick`` at the core's deadlines, at least every Ticket Timeout / 2 (§6.7),
        each session under its own guard."""
        half = self.config.ticket_timeout / 2
        while True:
            now = trio.current_time()
            deadline = self.core.next_deadline(now)
            wake_at = now + half if deadline is None else min(deadline, now + half)
            with trio.move_on_at(wake_at):
                await self._tick_wake.wait()
            self._tick_wake = trio.Event()
            now = trio.current_time()
            for sid, sess in list(self.sessions.items()):
                runs = chain_runs(sess.qp)
                if runs != sess.chain_runs:  # answered by the RNIC: not idle
                    sess.chain_runs = runs
                    self.core.note_activity(sid, now)
                self._offloaded(sess, now)
                self._apply(self._guarded(sess, self.core.tick, now, sid))
