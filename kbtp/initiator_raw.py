"""The initiator's postings outside the request pipeline: one-sided RDMA operations and
raw Sends (draft §6.6, docs/kbtp.md §9.2).

:class:`InitiatorRaw` is the part of :class:`~kbtp.initiator.KbtpInitiator` that posts one
work request and awaits its own :class:`~kbtp.initiator_waiters.Waiter`, past the core's
Request IDs and credits: ``one_sided`` performs one RDMA Read, FetchAdd, Compare and Swap or
RDMA Write (a step of the direct modes, or a conformance probe); ``send_raw`` and its kin
send arbitrary octets as requests (malformed on purpose, for conformance tests) and await
the answers.  The session's completion pump settles the waiters.
"""

from __future__ import annotations

import itertools
import struct
from typing import TYPE_CHECKING, overload

from kbtp.initiator_core import CompareSwapOp, DirectOp, FetchAddOp, ReadOp, WriteOp
from kbtp.initiator_errors import SessionClosed
from kbtp.initiator_waiters import Waiter
from kbtp.messages import Completion, HelloAck
from stack.rnic import (
    Access,
    MemoryRegion,
    ProtectionDomain,
    QueuePair,
    SendFlags,
    SendWR,
    Sge,
    WrOpcode,
)

__all__ = ["InitiatorRaw"]

_LE64 = struct.Struct("<Q")


class InitiatorRaw:
    """One-sided operations and raw Sends (see the module docstring); mixed into
    :class:`~kbtp.initiator.KbtpInitiator`, which provides the session they run on."""

    pd: ProtectionDomain
    qp: QueuePair
    _raw: dict[int, Waiter]
    _ops: dict[int, Waiter]
    _wr_ids: itertools.count[int]

    if TYPE_CHECKING:

        def _check_open(self) -> None: ...

    # ----------------------------------------------------------------------------------
    # raw Sends, for conformance tests
    # ----------------------------------------------------------------------------------
    async def send_raw(self, data: bytes, request_id: int) -> Completion | None:
        """Send ``data`` as one Send, bypassing request IDs and credits, and await the
        COMPLETION (or HELLO_ACK: None) carrying ``request_id``.

        For conformance tests: ``data`` may be malformed on purpose.  ``request_id`` must
        not collide with the session's own (they count up from 1).  The Send does not
        count against the credits the session tracks, so keep other requests below them.
        """
        return (await self._raw_answer(data, request_id)).completion

    async def send_raw_answer(self, data: bytes, request_id: int) -> Completion | HelloAck:
        """:meth:`send_raw`, returning the answer whatever it is: the COMPLETION, or the
        HELLO_ACK a target answers a HELLO with (a second HELLO's BAD_OPCODE, §4.2)."""
        answer = (await self._raw_answer(data, request_id)).answer
        if not isinstance(answer, Completion | HelloAck):
            raise SessionClosed(f"the target answered with {type(answer).__name__}")
        return answer

    async def _raw_answer(self, data: bytes, request_id: int) -> Waiter:
        """Send ``data`` raw and await the answer carrying ``request_id``."""
        self._check_open()
        waiter = Waiter()
        self._raw[request_id] = waiter
        self.qp.post_send(
            SendWR(0, WrOpcode.SEND, inline_data=bytes(data), send_flags=SendFlags.NONE)
        )
        await waiter.wait()
        return waiter

    async def send_raw_burst(self, messages: list[tuple[bytes, int]]) -> list[Completion | None]:
        """Send every ``(data, request_id)`` at once (one post, so they leave together),
        bypassing credits, and await the answers: each COMPLETION, or None where the
        session ended first.  For conformance tests of the target's credit accounting."""
        self._check_open()
        waiters = []
        for _, rid in messages:
            waiter = Waiter()
            self._raw[rid] = waiter
            waiters.append(waiter)
        self.qp.post_send(
            [
                SendWR(0, WrOpcode.SEND, inline_data=bytes(d), send_flags=SendFlags.NONE)
                for d, _ in messages
            ]
        )
        answers: list[Completion | None] = []
        for waiter in waiters:
            try:
                await waiter.wait()
            except SessionClosed:
                answers.append(None)
            else:
                answers.append(waiter.completion)
        return answers

    # ----------------------------------------------------------------------------------
    # one-sided operations, the steps of the direct modes (draft §6.6)
    # ----------------------------------------------------------------------------------
    @overload
    async def one_sided(self, op: ReadOp | WriteOp) -> bytes: ...

    @overload
    async def one_sided(self, op: FetchAddOp | CompareSwapOp) -> int: ...

    @overload
    async def one_sided(self, op: DirectOp) -> int | bytes: ...

    async def one_sided(self, op: DirectOp) -> int | bytes:
        """Perform one RDMA Read, FetchAdd, Compare and Swap or RDMA Write at the target and
        await it.

        Returns the octets read, the atomic's original value, or ``b""`` for a Write.
        """
        self._check_open()
        wr_id = next(self._wr_ids)
        mr: MemoryRegion | None = None
        if isinstance(op, ReadOp):
            mr = self.pd.reg_mr(bytearray(op.length), Access.LOCAL_WRITE)
            wr = SendWR(
                wr_id,
                WrOpcode.RDMA_READ,
                (Sge(mr.base, op.length, mr.lkey),),
                rkey=op.stag,
                remote_addr=op.to,
            )
        elif isinstance(op, FetchAddOp):
            mr = self.pd.reg_mr(bytearray(8), Access.LOCAL_WRITE)
            wr = SendWR(
                wr_id,
                WrOpcode.ATOMIC_FETCH_AND_ADD,
                (Sge(mr.base, 8, mr.lkey),),
                rkey=op.stag,
                remote_addr=op.to,
                compare_add=op.add,
                compare_add_mask=op.mask,
            )
        elif isinstance(op, CompareSwapOp):
            mr = self.pd.reg_mr(bytearray(8), Access.LOCAL_WRITE)
            wr = SendWR(
                wr_id,
                WrOpcode.ATOMIC_CMP_AND_SWP,
                (Sge(mr.base, 8, mr.lkey),),
                rkey=op.stag,
                remote_addr=op.to,
                compare_add=op.compare,
                swap=op.swap,
            )
        else:
            wr = SendWR(
                wr_id, WrOpcode.RDMA_WRITE, inline_data=op.data, rkey=op.stag, remote_addr=op.to
            )
        waiter = Waiter()
        self._ops[wr_id] = waiter
        try:
            self.qp.post_send(wr)
            await waiter.wait()
            if isinstance(op, ReadOp):
                assert mr is not None
                return bytes(mr.buf)
            if isinstance(op, FetchAddOp | CompareSwapOp):
                assert mr is not None
                value: int = _LE64.unpack(mr.buf)[0]
                return value
            return b""
        finally:
            self._ops.pop(wr_id, None)
            if mr is not None:
                mr.dereg()
