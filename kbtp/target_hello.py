"""The target's HELLO: session setup, the per-session regions and the HELLO_ACK
(docs/kbtp.md §3.6, §4.2, §4.4, §5.4).

Part of :class:`~kbtp.target_core.TargetCore` (see :mod:`kbtp.target_state`).  A HELLO from
a known identity with no session is granted its capabilities; a direct mode asks for the
session's regions to be registered (SEC-03), and the HELLO_ACK, carrying their STags, goes
out once the binding has reported every one (:meth:`HelloOps.memory_registered`).  Messages
arriving meanwhile wait and are processed after it.
"""

from __future__ import annotations

from collections import deque
from typing import Any

from kbtp.constants import MIN_TARGET_ORD, Capability, CounterFormat, Status
from kbtp.messages import Hello, HelloAck
from kbtp.target_actions import Action, DeregisterMemory, RegionKind, RegisterMemory
from kbtp.target_config import granted_capabilities
from kbtp.target_state import CoreState, OpKind, PendingOp, SessionState
from stack.errors import LocalError

_STAG_OF: dict[RegionKind, str] = {
    RegionKind.TABLE: "table_stag",
    RegionKind.POOL: "pool_stag",
    RegionKind.RING: "ring_stag",
    RegionKind.HEAD: "head_stag",
    RegionKind.PARTITION: "partition_stag",
}
"""The SessionState and HelloAck field carrying each region's STag."""


class HelloOps(CoreState):
    """HELLO, the registration of its session's regions, HELLO_ACK (docs/kbtp.md §4.2)."""

    # ----------------------------------------------------------------------------------
    # feedback from the binding: a region of a HELLO is registered
    # ----------------------------------------------------------------------------------
    def memory_registered(self, op_id: int, stag: int, now: float) -> list[Action]:
        """The region a :class:`RegisterMemory` asked for is registered under ``stag``.

        The last registration of a HELLO sends its HELLO_ACK.  A registration whose
        session has meanwhile closed is deregistered at once.  Raises LocalError for an
        ``op_id`` that is no pending registration.
        """
        out: list[Action] = []
        orphaned = self._orphans.pop(op_id, None)
        if orphaned is not None:
            out.append(DeregisterMemory(orphaned, stag))
            return out
        op = self._ops.get(op_id)
        if op is None or op.kind is not OpKind.REGISTER or op.region is None:
            raise LocalError(f"op {op_id} is not a pending registration")
        del self._ops[op_id]
        sess = self._sessions[op.session]  # closing a session orphans its registrations
        self._registered.setdefault(op.session, []).append(stag)
        setattr(sess, _STAG_OF[op.region], stag)
        sess.registering.discard(op_id)
        if not sess.registering:
            self._send_hello_ack(op.session, sess, now, out)
        return out

    # ==================================================================================
    # internals: HELLO (docs/kbtp.md §4.2, §4.4)
    # ==================================================================================
    def _hello(
        self, session: int, sess: SessionState, hello: Hello, now: float, out: list[Action]
    ) -> None:
        def refuse(status: Status, reason: str) -> None:
            self._send(out, session, HelloAck(hello.request_id, status))
            self._close(session, now, status, reason, out)

        ini = self._initiators.get(hello.identity)
        if ini is None:
            refuse(Status.UNKNOWN_INITIATOR, f"unknown identity {hello.identity!r}")
            return
        if ini.session is not None:
            refuse(Status.SESSION_EXISTS, f"identity {hello.identity!r} already has a session")
            return
        if sess.ord is not None and sess.ord < MIN_TARGET_ORD:
            refuse(
                Status.IRD_ORD_TOO_LOW,
                f"target ORD {sess.ord} on this stream: the initiator's IRD allows no RDMA "
                "Read for STORE and ALLOC_STORE (docs/kbtp.md §4.1)",
            )
            return
        cfg = ini.config
        granted = granted_capabilities(cfg, Capability(hello.capabilities), sess.ird)
        sess.identity = hello.identity
        sess.capabilities = granted
        ini.session = session
        lay = self.layout
        ack: dict[str, Any] = dict(
            request_id=hello.request_id,
            status=Status.SUCCESS,
            capabilities=granted,
            block_size=self.config.block_size,
            pool_blocks=self.config.pool_blocks,
            quota=cfg.quota,
            handle_base=cfg.handle_base,
            handle_count=cfg.handle_count,
            ticket_timeout_ms=round(self.config.ticket_timeout * 1000),
            request_credits=self.config.request_credits,
            max_inline=self.config.max_inline,
        )
        # Regions are registered per session, like every STag this target exposes
        # (docs/kbtp.md §3.6, SEC-03); the HELLO_ACK waits for their STags.
        regions: list[tuple[RegionKind, int, int]] = []
        if granted & Capability.DIRECT_LOAD:
            regions.append((RegionKind.TABLE, *lay.table_region))
            regions.append((RegionKind.POOL, *lay.pool_region))
            ack.update(
                table_offset=lay.to(lay.table_offset),
                table_base_handle=lay.table_base_handle,
                table_entries=lay.table_entries,
                pool_offset=lay.to(lay.pool_offset),
            )
        if granted & Capability.DIRECT_ALLOC:
            part = lay.partitions[ini.ring]
            p_off, p_len = lay.partition_region(part)
            regions.append((RegionKind.RING, *lay.ring_region(part.ring)))
            regions.append((RegionKind.HEAD, *lay.head_region(part.ring)))
            regions.append((RegionKind.PARTITION, p_off, p_len))
            fmt = CounterFormat.MASKED
            if granted & Capability.UNMASKED_COUNTER:
                fmt = CounterFormat.UNMASKED
            ring = self._rings[ini.ring]
            if self._direct_violation(ini, now) is not None or ring.counter_format is not fmt:
                # A late atomic of the identity's previous stream, or the other counter
                # format: start the ring afresh (no session of the identity can reach it).
                self._reset_partition(ini, fmt)
            ack.update(
                ring_order=part.ring.order,
                ring_offset=lay.to(part.ring.slots_offset),
                head_offset=lay.to(part.ring.head_offset),
                partition_offset=lay.to(p_off),
                partition_length=p_len,
            )
        sess.hello_ack = ack
        if not regions:
            self._send_hello_ack(session, sess, now, out)
            return
        for kind, offset, length in regions:
            op_id = self._new_op(PendingOp(OpKind.REGISTER, session, None, region=kind))
            sess.registering.add(op_id)
            out.append(RegisterMemory(op_id, session, kind, offset, length))

    def _send_hello_ack(
        self, session: int, sess: SessionState, now: float, out: list[Action]
    ) -> None:
        """Every region of the HELLO is registered: send the HELLO_ACK (docs/kbtp.md §5.4),
        then process the messages that arrived meanwhile."""
        ack = sess.hello_ack
        assert ack is not None
        sess.hello_ack = None
        ack.update({name: getattr(sess, name) for name in _STAG_OF.values()})
        sess.direct_alloc = bool(sess.capabilities & Capability.DIRECT_ALLOC)
        self._send(out, session, HelloAck(**ack))
        early, sess.early = sess.early, deque()
        for item in early:
            if isinstance(item, bytes):
                out.extend(self.handle_message(session, item, now))
            else:
                out.extend(self.handle_request(session, item, now))
