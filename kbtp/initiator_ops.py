"""The KBTP operations of the initiator: LOAD, STORE, ALLOC_STORE, FREE, the direct modes.

:class:`InitiatorOps` is the part of :class:`~kbtp.initiator.KbtpInitiator` that turns each
operation into requests and one-sided RDMA operations; the session underneath sends them
(``request``: a request and its COMPLETION; ``one_sided``: one RDMA Read, atomic or Write).
Each data buffer is registered for the one request (REMOTE_WRITE for a LOAD's destination,
REMOTE_READ for a store's source) and deregistered when it completes (docs/kbtp.md §6.1 -
§6.4).  ``direct_load`` and ``reserve`` run the :class:`~kbtp.initiator_core.DirectLoad` /
:class:`~kbtp.initiator_core.DirectAlloc` step machines: each named RDMA Read, FetchAdd or
RDMA Write is posted, awaited and fed back (§6.6); slot reads back off while the slot is
not yet filled.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, overload

import trio

from kbtp.constants import Capability, RequestFlag, Status
from kbtp.initiator_core import (
    AllocState,
    CompareSwapOp,
    DirectAlloc,
    DirectLoad,
    DirectOp,
    FetchAddOp,
    ReadOp,
    WriteOp,
)
from kbtp.initiator_errors import KbtpStatusError
from kbtp.messages import (
    AllocStore,
    Completion,
    DataDescriptor,
    Free,
    HelloAck,
    Load,
    Request,
    Store,
    inline_descriptor,
)
from stack.errors import LocalError
from stack.rnic import Access, MemoryRegion, ProtectionDomain, QueuePair, reg_mr_wr

__all__ = ["DIRECT_LOAD_ATTEMPTS", "InitiatorOps"]

DIRECT_LOAD_ATTEMPTS = 3
"""DIRECT_LOAD retries when the entry changed between its two reads (a concurrent free)."""


def _registrable(data: Any) -> memoryview:
    """A writable, contiguous byte view of ``data`` (copied if it is read-only)."""
    view = memoryview(data)
    if view.readonly or not view.c_contiguous:
        return memoryview(bytearray(view.tobytes()))
    return view.cast("B") if view.format != "B" or view.ndim != 1 else view


class InitiatorOps:
    """The operations of a KBTP session (see the module docstring); mixed into
    :class:`~kbtp.initiator.KbtpInitiator`, which provides the session they run on."""

    pd: ProtectionDomain
    qp: QueuePair
    ack: HelloAck | None
    direct_alloc_disabled: bool

    if TYPE_CHECKING:

        @property
        def granted(self) -> Capability: ...

        @property
        def block_size(self) -> int: ...

        def _check_open(self) -> None: ...

        def _count(self, op: str, status: str, octets: int) -> None: ...

        async def request(self, request: Request, *, check: bool = True) -> Completion: ...

        @overload
        async def one_sided(self, op: ReadOp | WriteOp) -> bytes: ...

        @overload
        async def one_sided(self, op: FetchAddOp | CompareSwapOp) -> int: ...

        @overload
        async def one_sided(self, op: DirectOp) -> int | bytes: ...

        async def one_sided(self, op: DirectOp) -> int | bytes: ...

    # ----------------------------------------------------------------------------------
    # requests (docs/kbtp.md §6.1 - §6.4)
    # ----------------------------------------------------------------------------------
    def _register(self, view: memoryview, access: Access, invalidate: bool) -> MemoryRegion:
        """Register one request's buffer.  With INVALIDATE the target ends the request with
        a Send with Invalidate of its STag, so the buffer is fast-registered (``alloc_mr`` +
        ``REG_MR``, ahead of the request on the send queue): the kind of STag a peer may
        invalidate (RDMAP-09).  Its ``rkey`` and ``iova`` are the REG_MR's at once, even
        while the REG_MR waits behind Reads on the send queue."""
        if not invalidate:
            return self.pd.reg_mr(view, access)
        mr = self.pd.alloc_mr(len(view))
        self.qp.post_send(reg_mr_wr(mr, view, access))
        return mr

    async def _with_buffer(
        self, request: Request, mr: MemoryRegion | None, check: bool
    ) -> Completion:
        try:
            return await self.request(request, check=check)
        finally:
            if mr is not None:
                mr.dereg()

    async def load_into(
        self,
        handle: int,
        buffer: Any,
        *,
        generation: int = 0,
        allow_unsealed: bool = False,
        invalidate: bool = False,
        check: bool = True,
    ) -> Completion:
        """LOAD ``handle`` into ``buffer`` (draft §6.1); Data Length is in the COMPLETION."""
        self._check_open()
        view = memoryview(buffer)
        if view.readonly or not view.c_contiguous:
            raise LocalError("a LOAD needs a writable, contiguous buffer")
        view = view.cast("B") if view.format != "B" or view.ndim != 1 else view
        mr = self._register(view, Access.LOCAL_WRITE | Access.REMOTE_WRITE, invalidate)
        flags = RequestFlag.NONE
        if allow_unsealed:
            flags |= RequestFlag.ALLOW_UNSEALED
        if invalidate:
            flags |= RequestFlag.INVALIDATE
        req = Load(0, handle, DataDescriptor(mr.rkey, mr.iova, len(view)), generation, flags)
        return await self._with_buffer(req, mr, check)

    async def load(
        self,
        handle: int,
        *,
        generation: int = 0,
        allow_unsealed: bool = False,
        max_length: int | None = None,
        invalidate: bool = False,
    ) -> bytes:
        """LOAD ``handle`` (draft §6.1) and return its Data Length octets."""
        self._check_open()
        buffer = bytearray(self.block_size if max_length is None else max_length)
        completion = await self.load_into(
            handle,
            buffer,
            generation=generation,
            allow_unsealed=allow_unsealed,
            invalidate=invalidate,
        )
        return bytes(buffer[: completion.data_length])

    def _store_request(
        self,
        cls: type[Store] | type[AllocStore],
        handle: int,
        data: Any,
        generation: int,
        seal: bool,
        inline: bool | None,
        invalidate: bool,
    ) -> tuple[Store | AllocStore, MemoryRegion | None]:
        assert self.ack is not None
        size = memoryview(data).nbytes
        if inline is None:
            inline = size <= self.ack.max_inline and not invalidate
        flags = RequestFlag.SEAL if seal else RequestFlag.NONE
        if invalidate:
            flags |= RequestFlag.INVALIDATE
        if inline:
            payload = bytes(data)
            descriptor = inline_descriptor(payload)
            return cls(0, handle, descriptor, payload, generation, flags | RequestFlag.INLINE), None
        view = _registrable(data)
        mr = self._register(view, Access.REMOTE_READ, invalidate)
        descriptor = DataDescriptor(mr.rkey, mr.iova, len(view))
        return cls(0, handle, descriptor, b"", generation, flags), mr

    async def store(
        self,
        handle: int,
        data: Any,
        *,
        generation: int = 0,
        seal: bool = False,
        inline: bool | None = None,
        invalidate: bool = False,
        check: bool = True,
    ) -> Completion:
        """STORE ``data`` into bound ``handle`` (draft §6.2).

        ``inline`` None: inline when the data fits Max Inline (no RDMA Read round trip).
        A writable buffer is read by the target in place; bytes are copied once.
        """
        self._check_open()
        req, mr = self._store_request(Store, handle, data, generation, seal, inline, invalidate)
        return await self._with_buffer(req, mr, check)

    async def alloc_store(
        self,
        handle: int,
        data: Any,
        *,
        generation: int = 0,
        seal: bool = False,
        inline: bool | None = None,
        invalidate: bool = False,
        check: bool = True,
    ) -> Completion:
        """ALLOC_STORE ``data`` into unbound ``handle`` (draft §6.3); see :meth:`store`."""
        self._check_open()
        req, mr = self._store_request(
            AllocStore, handle, data, generation, seal, inline, invalidate
        )
        return await self._with_buffer(req, mr, check)

    async def free(self, handle: int, *, generation: int = 0, check: bool = True) -> Completion:
        """FREE ``handle`` (draft §6.4)."""
        return await self.request(Free(0, handle, generation), check=check)

    # ----------------------------------------------------------------------------------
    # direct modes (draft §6.6)
    # ----------------------------------------------------------------------------------
    async def direct_load(
        self, handle: int, *, max_length: int | None = None, attempts: int = DIRECT_LOAD_ATTEMPTS
    ) -> bytes:
        """DIRECT_LOAD (draft §6.6): entry, block, entry by RDMA Read; no target CPU.

        Retries when the entry changed between its reads; raises :class:`KbtpStatusError`
        (NOT_VALID, NOT_SEALED, TOO_LONG_FOR_DESCRIPTOR, or NOT_OFFERED) when the block
        cannot be loaded this way.
        """
        self._check_open()
        assert self.ack is not None
        if not self.granted & Capability.DIRECT_LOAD:
            raise KbtpStatusError(Status.NOT_OFFERED, "DIRECT_LOAD was not granted")
        if not 0 <= handle - self.ack.table_base_handle:
            raise KbtpStatusError(Status.HANDLE_OUT_OF_RANGE, f"handle 0x{handle:x}")
        reason = ""
        for _ in range(max(1, attempts)):
            load = DirectLoad(self.ack, handle, max_length)
            while (op := load.next_op()) is not None:
                load.feed(await self.one_sided(op))
            if load.data is not None:
                self._count("DIRECT_LOAD", "SUCCESS", len(load.data))
                return load.data
            reason = load.reason
            first = load.first
            status = Status.SUCCESS
            if first is not None and not first.valid:
                status = Status.NOT_VALID
            elif first is not None and not first.sealed:
                status = Status.NOT_SEALED
            elif "longer" in reason:
                status = Status.TOO_LONG_FOR_DESCRIPTOR
            if status is not Status.SUCCESS:
                self._count("DIRECT_LOAD", status.name, 0)
                raise KbtpStatusError(status, f"DIRECT_LOAD of handle 0x{handle:x}: {reason}")
        self._count("DIRECT_LOAD", "RETRIES_EXHAUSTED", 0)
        raise KbtpStatusError(Status.NOT_VALID, f"DIRECT_LOAD of handle 0x{handle:x}: {reason}")

    async def reserve(self, data: Any) -> DirectAlloc:
        """DIRECT_ALLOC steps 1-3 (draft §6.6): FetchAdd Head, read the slot until it holds
        the ticket (confirmed by a second read), RDMA Write the data into the block.

        Returns the step machine in state BIND; :meth:`bind` completes it.  Raises
        :class:`KbtpStatusError` TICKET_ABANDONED if the ticket was reclaimed, or if the
        slot was not filled within the Ticket Timeout.
        """
        self._check_open()
        assert self.ack is not None
        if not self.granted & Capability.DIRECT_ALLOC:
            raise KbtpStatusError(Status.NOT_OFFERED, "DIRECT_ALLOC was not granted")
        if self.direct_alloc_disabled:
            raise KbtpStatusError(
                Status.TICKET_ABANDONED, "direct allocation ended for this session (§6.7)"
            )
        payload = bytes(data)
        if len(payload) > self.ack.block_size:
            raise KbtpStatusError(
                Status.TOO_LONG_FOR_BLOCK, f"{len(payload)} octets, blocks have {self.block_size}"
            )
        alloc = DirectAlloc(self.ack, payload)
        give_up = trio.current_time() + self.ack.ticket_timeout_ms / 1000
        delay = 0.0
        while (op := alloc.next_op()) is not None:
            if isinstance(op, ReadOp) and alloc.state is AllocState.READ and alloc.polls:
                if trio.current_time() > give_up:
                    raise KbtpStatusError(
                        Status.TICKET_ABANDONED,
                        f"slot of ticket {alloc.ticket} not filled within the Ticket Timeout",
                    )
                delay = min(0.01, delay * 2 or 0.0002)
                await trio.sleep(delay)
            alloc.feed(await self.one_sided(op))
            if alloc.state is AllocState.ABANDONED:
                self.direct_alloc_disabled = True
                raise KbtpStatusError(
                    Status.TICKET_ABANDONED, f"ticket {alloc.ticket} was reclaimed by the target"
                )
        return alloc

    async def bind(
        self,
        alloc: DirectAlloc,
        handle: int,
        *,
        seal: bool = False,
        generation: int = 0,
        check: bool = True,
    ) -> Completion:
        """BIND a block allocated with :meth:`reserve` to ``handle`` (draft §6.6 step 4)."""
        return await self.request(alloc.bind(handle, seal=seal, generation=generation), check=check)

    async def direct_alloc(
        self, handle: int, data: Any, *, seal: bool = True, generation: int = 0
    ) -> Completion:
        """DIRECT_ALLOC ``data`` and BIND it to ``handle``: :meth:`reserve` + :meth:`bind`."""
        alloc = await self.reserve(data)
        return await self.bind(alloc, handle, seal=seal, generation=generation)
