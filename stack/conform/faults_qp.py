"""Faults of the RNIC a broken DUT has: the queue pair's protection checks, receives, IRD,
ordering and atomics, and the STag allocator (RFC 5040 §5-§7, RFC 5042 §6, RFC 7306 §5).

Each ``QpFault`` patches one queue pair of the DUT (with its engine, and a dict that lives as
long as the :func:`~stack.conform.faults.injected` block) at the points
:mod:`stack.conform.faults` documents: its ``handle_event``, ``fatal``, ``ird`` and
``_snapshot_reads``; :func:`sequential_register` replaces ``StagTable.register``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from stack.constants import (
    DDP_TAGGED,
    TERM_RDMAP_BASE_BOUNDS,
    TERM_RDMAP_CATASTROPHIC_STREAM,
    TERM_RDMAP_OP_CANNOT_INVALIDATE,
    AtomicOpcode,
    TermCode,
)
from stack.errors import ProtocolError, RdmapError
from stack.rnic.memory import (
    DDP_TAGGED_CODES,
    RDMAP_REMOTE_CODES,
    Access,
    StagTable,
    StagTarget,
    check_remote_access,
)
from stack.rnic.qp import QueuePair
from stack.wire.connection import IwarpConnection
from stack.wire.events import (
    AtomicRequestReceived,
    ReadRequest,
    ReadRequestReceived,
    ReadResponseSegment,
    SendSegment,
    WriteSegment,
)

__all__ = [
    "QpFault",
    "align",
    "always_swap",
    "atomic_edit",
    "atomics_dropped",
    "invalidate_field_checked",
    "invalidate_ignored",
    "ird_unenforced",
    "last_octet_refused",
    "no_add_mask",
    "partial_delivery",
    "pd_ignored",
    "read_responses_unchecked",
    "reads_not_snapshotted",
    "rights_ignored",
    "sequential_register",
    "streams_coupled",
    "swallow",
    "writes_dropped",
    "zero_reads_validated",
    "zero_writes_validated",
]

QpFault = Callable[[QueuePair, IwarpConnection, dict[str, Any]], None]
"""Patches one DUT queue pair (with its engine; ``shared`` lives as long as the ``with``)."""


def _handler(qp: QueuePair, around: Callable[[Callable[[Any], None], Any], None]) -> None:
    handle = qp.handle_event

    def hooked(event: Any) -> None:
        around(handle, event)

    qp.handle_event = hooked  # type: ignore[method-assign]


def swallow(*causes: TermCode) -> QpFault:
    """Inbound errors with these causes are dropped: nothing placed, nothing reported."""

    def apply(qp: QueuePair, engine: IwarpConnection, shared: dict[str, Any]) -> None:
        def around(handle: Callable[[Any], None], event: Any) -> None:
            try:
                handle(event)
            except ProtocolError as exc:
                if exc.term not in causes:
                    raise

        _handler(qp, around)

    return apply


def _stag_of(event: Any) -> int | None:
    if isinstance(event, WriteSegment):
        return event.stag
    if isinstance(event, ReadRequestReceived | AtomicRequestReceived):
        req = event.request
        return req.src_stag if isinstance(req, ReadRequest) else req.stag
    return None


def pd_ignored(qp: QueuePair, engine: IwarpConnection, shared: dict[str, Any]) -> None:
    """An STag of another protection domain is used as if it were this stream's."""

    def around(handle: Callable[[Any], None], event: Any) -> None:
        try:
            handle(event)
        except ProtocolError as exc:
            stag = _stag_of(event)
            mr = qp.table.lookup(stag) if stag is not None else None
            if exc.rule != "SEC-01" or mr is None:
                raise
            own, qp.pd = qp.pd, mr.pd
            try:
                handle(event)
            finally:
                qp.pd = own

    _handler(qp, around)


def rights_ignored(qp: QueuePair, engine: IwarpConnection, shared: dict[str, Any]) -> None:
    """Remote access rights are not checked."""

    def around(handle: Callable[[Any], None], event: Any) -> None:
        try:
            handle(event)
        except ProtocolError as exc:
            stag = _stag_of(event)
            mr: StagTarget | None = qp.table.lookup(stag) if stag is not None else None
            if exc.rule != "SEC-12" or mr is None:
                raise
            saved = mr.access_bits
            mr.access_bits = int(Access.REMOTE_READ | Access.REMOTE_WRITE | Access.REMOTE_ATOMIC)
            try:
                handle(event)
            finally:
                mr.access_bits = saved

    _handler(qp, around)


def ird_unenforced(qp: QueuePair, engine: IwarpConnection, shared: dict[str, Any]) -> None:
    qp.ird = 1 << 14


def invalidate_ignored(qp: QueuePair, engine: IwarpConnection, shared: dict[str, Any]) -> None:
    """Send with Invalidate taken as a plain Send: nothing invalidated, nothing checked."""

    def around(handle: Callable[[Any], None], event: Any) -> None:
        if isinstance(event, SendSegment) and event.invalidate_stag is not None:
            event = replace(event, invalidate_stag=None)
        handle(event)

    _handler(qp, around)


def read_responses_unchecked(
    qp: QueuePair, engine: IwarpConnection, shared: dict[str, Any]
) -> None:
    """Read Responses that match no outstanding Read (RDMAP-04) are dropped silently."""

    def around(handle: Callable[[Any], None], event: Any) -> None:
        try:
            handle(event)
        except ProtocolError as exc:
            if not (isinstance(event, ReadResponseSegment) and exc.rule == "RDMAP-04"):
                raise

    _handler(qp, around)


def zero_reads_validated(qp: QueuePair, engine: IwarpConnection, shared: dict[str, Any]) -> None:
    """A zero-length Read's source is validated as if it were one octet (RDMAP-07 broken)."""

    def around(handle: Callable[[Any], None], event: Any) -> None:
        if isinstance(event, ReadRequestReceived) and event.request.size == 0:
            req = event.request
            check_remote_access(
                qp.table,
                qp.pd,
                req.src_stag,
                req.src_to,
                1,
                int(Access.REMOTE_READ),
                RDMAP_REMOTE_CODES,
            )
        handle(event)

    _handler(qp, around)


def atomic_edit(edit: Callable[[Any], Any]) -> QpFault:
    def apply(qp: QueuePair, engine: IwarpConnection, shared: dict[str, Any]) -> None:
        def around(handle: Callable[[Any], None], event: Any) -> None:
            if isinstance(event, AtomicRequestReceived):
                event = replace(event, request=edit(event.request))
            handle(event)

        _handler(qp, around)

    return apply


def align(req: Any) -> Any:
    return replace(req, to=req.to & ~7)


def no_add_mask(req: Any) -> Any:
    if req.atomic_opcode == AtomicOpcode.FETCH_ADD:
        return replace(req, add_swap_mask=0)
    return req


def always_swap(req: Any) -> Any:
    if req.atomic_opcode == AtomicOpcode.CMP_SWAP:
        return replace(req, compare_mask=0)
    return req


def atomics_dropped(qp: QueuePair, engine: IwarpConnection, shared: dict[str, Any]) -> None:
    """Atomic Requests are taken and never run or answered."""

    def around(handle: Callable[[Any], None], event: Any) -> None:
        if not isinstance(event, AtomicRequestReceived):
            handle(event)

    _handler(qp, around)


def zero_writes_validated(qp: QueuePair, engine: IwarpConnection, shared: dict[str, Any]) -> None:
    """A zero-length Write's STag is validated as if it were one octet (DDP-07 broken)."""

    def around(handle: Callable[[Any], None], event: Any) -> None:
        if isinstance(event, WriteSegment) and not len(event.data):
            check_remote_access(
                qp.table, qp.pd, event.stag, event.to, 1, int(Access.REMOTE_WRITE), DDP_TAGGED_CODES
            )
        handle(event)

    _handler(qp, around)


def invalidate_field_checked(
    qp: QueuePair, engine: IwarpConnection, shared: dict[str, Any]
) -> None:
    """The Invalidate STag field of every untagged message is read (RDMAP-03 broken): a Send
    invalidates it, anything else with it set ends the stream."""

    def around(handle: Callable[[Any], None], event: Any) -> None:
        raw = event.ulpdu
        field_value = (
            int.from_bytes(bytes(raw[2:6]), "big")
            if raw is not None and len(raw) >= 6 and not raw[0] & DDP_TAGGED
            else 0
        )
        if field_value and isinstance(event, SendSegment) and event.invalidate_stag is None:
            event = replace(event, invalidate_stag=field_value)
        elif field_value and isinstance(event, ReadRequestReceived):
            raise RdmapError(
                "RDMAP-09", "a Read Request cannot invalidate", TERM_RDMAP_OP_CANNOT_INVALIDATE
            )
        handle(event)

    _handler(qp, around)


def partial_delivery(qp: QueuePair, engine: IwarpConnection, shared: dict[str, Any]) -> None:
    """Each Send segment completes its receive (messages delivered before their Last
    segment, DDP-08 broken); Read Response segments without L are dropped."""

    def around(handle: Callable[[Any], None], event: Any) -> None:
        if isinstance(event, SendSegment) and not event.last:
            event = replace(event, last=True)
        elif isinstance(event, ReadResponseSegment) and not event.last:
            return
        handle(event)

    _handler(qp, around)


def last_octet_refused(qp: QueuePair, engine: IwarpConnection, shared: dict[str, Any]) -> None:
    """Accesses that reach the last octet of a region are refused (SEC-04 off by one)."""

    def around(handle: Callable[[Any], None], event: Any) -> None:
        if isinstance(event, ReadRequestReceived) and event.request.size:
            req = event.request
            mr = qp.table.lookup(req.src_stag)
            if mr is not None and req.src_to + req.size == mr.base + mr.length:
                raise RdmapError("SEC-04", "last octet", TERM_RDMAP_BASE_BOUNDS)
        handle(event)

    _handler(qp, around)


def reads_not_snapshotted(qp: QueuePair, engine: IwarpConnection, shared: dict[str, Any]) -> None:
    """Queued Read Responses read memory when sent, after later Writes (RFC 5040 §5.5):
    neither copied before a Write is placed nor waited for (a QP whose
    ``max_snapshot_bytes`` is 0, as the bench server's, waits instead of copying)."""
    qp._snapshot_reads = lambda: None  # type: ignore[method-assign]  # noqa: SLF001
    qp.must_wait = lambda event: False  # type: ignore[method-assign]


def writes_dropped(qp: QueuePair, engine: IwarpConnection, shared: dict[str, Any]) -> None:
    """Inbound RDMA Writes are accepted and never placed."""

    def around(handle: Callable[[Any], None], event: Any) -> None:
        if isinstance(event, WriteSegment) and len(event.data):
            return
        handle(event)

    _handler(qp, around)


def streams_coupled(qp: QueuePair, engine: IwarpConnection, shared: dict[str, Any]) -> None:
    """When one connection fails or closes, every other connection of the DUT is ended
    with a Terminate (SEC-09 broken)."""
    qps: list[QueuePair] = shared.setdefault("qps", [])
    qps.append(qp)
    fatal = qp.fatal
    stream_closed = qp.stream_closed

    def kill_others() -> None:
        if shared.get("killing"):
            return
        shared["killing"] = True
        try:
            for other in qps:
                if other is not qp and other.state.value not in ("terminate", "error"):
                    err = RdmapError(
                        "SEC-09", "another stream failed", TERM_RDMAP_CATASTROPHIC_STREAM
                    )
                    other.fatal(err, send_terminate=True)
                    if other.on_output is not None:
                        other.on_output()
        finally:
            shared["killing"] = False

    def hooked(error: ProtocolError | None, *, send_terminate: bool, **kw: Any) -> None:
        first = qp.state.value not in ("terminate", "error")
        fatal(error, send_terminate=send_terminate, **kw)
        if first:
            kill_others()

    def hooked_close(error: Exception | None = None) -> None:
        first = qp.state.value != "error"
        stream_closed(error)
        if first:
            kill_others()

    qp.fatal = hooked  # type: ignore[method-assign]
    qp.stream_closed = hooked_close  # type: ignore[method-assign]


def sequential_register(self: StagTable, mr: StagTarget) -> int:
    """STags handed out one index after the other, key 0 (SEC-08 broken)."""
    index = getattr(self, "_fault_next", 0x100)
    while index in self._in_use:  # noqa: SLF001 - documented fault point
        index += 1
    self._fault_next = index + 1  # type: ignore[attr-defined]
    self._in_use.add(index)  # noqa: SLF001
    stag = index << 8
    self._regions[stag] = mr  # noqa: SLF001
    return stag
