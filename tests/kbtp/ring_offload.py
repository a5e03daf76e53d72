"""The offloaded target's own chains, run synchronously on a ring model's memory (§8.1).

:class:`ChainExecutor` holds an in-memory QP pair (:class:`tests.rnic.helpers.Pair`, real
MPA/DDP/RDMAP bytes, no sockets) whose responder QP has posted the session chain the
offloaded target posts for a DIRECT_ALLOC initiator on a masked partition ring
(:func:`kbtp.target_offload.session_chain` with the branches of
:mod:`kbtp.target_offload_alloc` and the credit count of :mod:`kbtp.target_offload_credits`)
over a zero-based MR whose Tagged Offsets are the core's memory offsets.
:meth:`ChainExecutor.offer` sends one request through it for a world of the exploration:
the world's memory is copied into the MR, the binding's ``publish`` calls are made as
the target makes them after every core call, and the pair is pumped until quiet.  Then
either the chain answered (memory copied back, the log's records handed to the core by
``offloaded_ring_ops``, as the binding does before its next core call) or the request
fell back (the receive completed to the application: memory is unchanged, and the caller
runs the core, as the target does).  The chain is the target's, not a copy.
"""

from __future__ import annotations

import mmap

from kbtp.messages import Completion, Message, decode_message
from kbtp.target_actions import Action
from kbtp.target_config import InitiatorConfig
from kbtp.target_core import TargetCore
from kbtp.target_offload import session_chain
from kbtp.target_offload_alloc import (
    AllocLog,
    alloc_store_branches,
    free_branches,
    partition_ring,
)
from kbtp.target_offload_credits import CreditCount
from stack.rnic import Access, QpState, RecvWR, SendFlags, SendWR, WcOpcode, WcStatus, WrOpcode
from tests.rnic.helpers import Pair

__all__ = ["ChainExecutor"]

_RECV = 256  # octets of each receive buffer, both sides
_RECVS = 4


class ChainExecutor:
    """The session chain of ``initiator`` (session ``session``) on a software RNIC."""

    def __init__(self, size: int, source: int) -> None:
        """``size``: octets of the core's memory; ``source``: octets of the initiator's
        readable buffer (the data of its ALLOC_STOREs by RDMA Read)."""
        self.pair = Pair(a_qp={"ird": 4, "ord": 4}, b_qp={"ird": 4, "ord": 4})
        a, b = self.pair.a, self.pair.b
        self._mapping = mmap.mmap(-1, size)  # page-aligned, as the target's pool mapping
        self.memory = b.pd.reg_mr(self._mapping, Access.LOCAL_WRITE | Access.ZERO_BASED)
        self.log = AllocLog(b.mr(AllocLog.SIZE))
        self.credits = CreditCount(b.mr(CreditCount.SIZE))
        self.source = a.mr(source, Access.LOCAL_WRITE | Access.REMOTE_READ)
        self._inbox = {"a": a.mr(_RECV * _RECVS), "b": b.mr(_RECV * _RECVS)}
        for name, side in (("a", a), ("b", b)):
            side.qp.post_recv([self._recv_wr(name, i) for i in range(_RECVS)])
        self.runs = 0
        """Requests the chain answered (RNIC runs)."""
        self.fallbacks = 0
        """Requests that fell back to the core."""
        self._posted = False

    def _recv_wr(self, side: str, slot: int) -> RecvWR:
        return RecvWR(slot, (self.pair.a.sge(self._inbox[side], _RECV * slot, _RECV),))

    def arm(self, core: TargetCore, initiator: InitiatorConfig) -> None:
        """Post the chain the offloaded target posts once ``initiator``'s HELLO is accepted
        (``KbtpTarget._chain``): LOAD, mapped STORE, ALLOC_STORE and FREE."""
        if self.memory.base != core.config.base_to:
            raise ValueError("the core's base_to must be 0 (the MR is zero-based)")
        ring = partition_ring(core, initiator)
        if ring is None:
            raise ValueError(f"{initiator.identity!r} has no masked partition ring")
        layout, lkey = core.layout, self.memory.lkey
        part = next(p for p in layout.partitions if p.ring == ring)
        more = alloc_store_branches(layout, lkey, initiator, ring, self.log)
        more += free_branches(layout, lkey, initiator, part, self.log)
        chain = session_chain(layout, lkey, initiator, True, more, self.credits)
        self.pair.b.qp.post_chain(chain)
        self._posted = True

    def offer(
        self, core: TargetCore, session: int, request: Message, data: bytes, now: float
    ) -> tuple[Completion | None, list[Action]]:
        """Send ``request`` to the chain with ``data`` at the start of the initiator's
        buffer.  Returns the COMPLETION the chain sent and the core's actions from its
        accounting of the chain's records, or (None, []) when the request fell back."""
        assert self._posted
        a, b = self.pair.a, self.pair.b
        mem = core.memory
        self._mapping[: len(mem)] = mem
        self.source.buf[: len(data)] = data
        ring = core.ring_of(core.session_identity(session))
        self.log.publish(len(ring.deferred), core.pending_ops())
        self.credits.publish(core.credits_left(session))
        a.qp.post_send(
            SendWR(1, WrOpcode.SEND, inline_data=request.encode(), send_flags=SendFlags.NONE)
        )
        self.pair.pump()
        if b.qp.state is not QpState.RTS:
            raise AssertionError(f"the chain failed: the target's QP is {b.qp.state.name}")
        fell = [wc for wc in b.cq.poll(16) if wc.opcode is WcOpcode.RECV]
        if fell:  # the receive completed to the application: the core takes the message
            assert len(fell) == 1 and fell[0].status is WcStatus.SUCCESS
            if self._mapping[: len(mem)] != bytes(mem):
                raise AssertionError("a request that fell back changed the target's memory")
            b.qp.post_recv(self._recv_wr("b", fell[0].wr_id))
            core.offloaded_requests(session, self.credits.take())  # before the core's call
            b.qp.enable_chains()
            self.fallbacks += 1
            return None, []
        (wc,) = a.cq.poll(16)
        assert wc.opcode is WcOpcode.RECV and wc.status is WcStatus.SUCCESS, wc
        start = _RECV * wc.wr_id
        answer = decode_message(bytes(self._inbox["a"].buf[start : start + wc.byte_len]))
        a.qp.post_recv(self._recv_wr("a", wc.wr_id))
        assert isinstance(answer, Completion), answer
        mem[:] = self._mapping[: len(mem)]
        self.runs += 1
        return answer, core.offloaded_ring_ops(session, self.log.take(), now)
