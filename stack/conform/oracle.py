"""What a conforming DUT does in Full Operation: this stack's own endpoint, set up like it.

No data-phase case states its own "this input -> that Terminate" table.  :class:`ModelDut`
is the stack's :class:`~stack.rnic.endpoint.QpEndpoint` (the wire engine
:class:`~stack.wire.connection.IwarpConnection` and a :class:`~stack.rnic.qp.QueuePair`)
in the DUT's role, after the same MPA startup (the runner's Request and the DUT's Reply, or
the DUT's Request and the runner's Reply), with memory like the DUT's: every region the
DUT's application advertised is registered under the DUT's own STag, Tagged Offset,
length and rights (:class:`MirrorTable`), the regions of the DUT's other connections in
protection domains of their own, and the receives the application keeps posted.  The
case's connection is replayed into it from the peer's log: every FPDU the runner sent,
byte for byte (broken CRCs and markers included), and every RDMA Read Request the DUT
issued (the model issues it too, so the runner's Read Responses are matched, RDMAP-04).
The first error the model's engine or QP raises is what the DUT must report: its
Terminate cause and the ULPDU whose headers the Terminate copies
(:func:`~stack.wire.terminate.build_terminate`, RFC 5040 Fig. 10).

Between writes the model settles like an application that keeps up: it sends its queued
responses (freeing IRD slots) and reposts consumed receives (when the application does);
the FPDUs of one write (a burst, :meth:`~stack.conform.peer.Peer.send_fpdus`) arrive
together, with no settling between them.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from stack.conform.apps import Receives, Region
from stack.conform.peer import Out
from stack.conform.peer_core import PduSeen
from stack.constants import MPA_V2_NO_NEGOTIATION, TermCode
from stack.errors import IwarpError, ProtocolError
from stack.rnic.cq import CompletionQueue
from stack.rnic.endpoint import QpEndpoint
from stack.rnic.memory import Access, MemoryRegion, ProtectionDomain, StagTable, StagTarget
from stack.rnic.qp import QpState, QueuePair
from stack.rnic.verbs import RecvWR, SendWR, Sge, WcOpcode, WcStatus, WrOpcode
from stack.wire.connection import IwarpConnection
from stack.wire.events import (
    CrcPolicy,
    Established,
    MpaFrame,
    MpaSettings,
    ReadRequest,
    RequestReceived,
    Role,
)

__all__ = ["Expectation", "MirrorTable", "ModelDut", "ModelError"]

_LOCAL_STAGS = 0x7F5A0001
"""First STag of the model's own buffers (receives, Read sinks), skipped when the DUT uses it."""


class ModelError(Exception):
    """The model cannot be set up like the DUT (its startup does not reach Full Operation
    with the DUT's CRC and markers): the case cannot say what the DUT must do."""


class MirrorTable(StagTable):
    """An STag table whose STags are the DUT's: a region is registered under the STag the
    DUT advertised (:meth:`register_as`); the model's own buffers get unused ones."""

    def __init__(self) -> None:
        super().__init__()
        self._mirror: dict[int, StagTarget] = {}
        self._wanted: int | None = None
        self._next_local = _LOCAL_STAGS
        self.reserved: set[int] = set()
        """STags the case uses (advertised or bogus): never given to the model's buffers."""

    def register_as(self, stag: int) -> None:
        """The next registration gets ``stag``."""
        self._wanted = stag

    def register(self, mr: StagTarget) -> int:
        stag = self._wanted
        self._wanted = None
        if stag is None:
            while self._next_local in self._mirror or self._next_local in self.reserved:
                self._next_local += 1
            stag = self._next_local
        self._mirror[stag] = mr
        return stag

    def unregister(self, mr: StagTarget) -> None:
        self._mirror.pop(mr.stag, None)

    def lookup(self, stag: int) -> StagTarget | None:
        return self._mirror.get(stag)

    def __len__(self) -> int:
        return len(self._mirror)


class _MirrorRegion(MemoryRegion):
    """A region with the DUT's Tagged Offset, length and rights, without its memory: the
    stack's checks see the same numbers; placed data goes to a scratch buffer."""

    def __init__(self, pd: ProtectionDomain, region: Region, access: Access) -> None:
        # No super().__init__: nothing is pinned; the fields the checks read are set here.
        self.pd = pd
        self.stream = None  # every stream of the PD (DDP-12 / SEC-02 scoping not mirrored)
        self.access = access
        self.access_bits = int(access)
        self.length = region.length
        self.addr = self.base = region.to
        self.valid = True
        self.max_len = None
        self.remote_invalidate = True  # as siw: any region of the stream's PD (RDMAP-09)
        self.buf = memoryview(bytearray(0))
        assert isinstance(pd.table, MirrorTable)
        pd.table.register_as(region.stag)
        self.stag = pd.table.register(self)

    def view(self, to: int, length: int) -> memoryview:
        return memoryview(bytearray(length))


@dataclass(frozen=True, slots=True)
class Expectation:
    """What the model did with the replayed connection.

    Fields: error (the first error it reported, None when it accepted everything); term
    (its Terminate cause, None when it sends none); offending (the ULPDU whose headers the
    Terminate copies, None for none); index (which runner FPDU raised it, counting from 0;
    None when no FPDU did).
    """

    error: ProtocolError | None
    term: TermCode | None
    offending: bytes | None
    index: int | None

    @property
    def accepts(self) -> bool:
        return self.error is None

    def line(self) -> str:
        if self.error is None:
            return "expected (the stack's endpoint, set up like the DUT): accept"
        term = f"Terminate {self.term}" if self.term is not None else "no Terminate"
        return f"expected (the stack's endpoint, set up like the DUT): {term}, {self.error}"


def _responder_settings(reply: MpaFrame) -> MpaSettings:
    """Responder choices that answer with ``reply``'s C, M, revision and IRD/ORD word."""
    s = MpaSettings(
        rev=reply.rev if reply.rev in (1, 2) else 2,
        crc=CrcPolicy.REQUEST if reply.crc else CrcPolicy.OFF,
        want_markers=reply.markers,
    )
    w = reply.ird_ord
    if w is None:
        return MpaSettings(rev=1, crc=s.crc, want_markers=s.want_markers)
    kwargs: dict[str, Any] = {"ird": w.ird, "ord": w.ord, "p2p": w.p2p}
    if w.p2p and w.rtr:
        kwargs["rtr"] = w.rtr
    return MpaSettings(rev=2, crc=s.crc, want_markers=s.want_markers, **kwargs)


class ModelDut:
    """The stack's endpoint in the DUT's role and state (see the module docstring).

    ``dut_listens``: the DUT answered ``request_raw`` (the runner's Request bytes) with
    ``reply`` (its Reply frame); otherwise the DUT sent ``request`` (its Request frame) and
    the runner answered ``reply_raw``.  ``regions``: what the DUT's application advertised
    on this connection; ``foreign``: regions of its other connections, with their own
    protection domain each when ``own_pd`` (else the same one); ``receives``: what the
    application keeps posted.
    """

    def __init__(
        self,
        *,
        dut_listens: bool,
        request_raw: bytes = b"",
        reply: MpaFrame | None = None,
        request: MpaFrame | None = None,
        reply_raw: bytes = b"",
        regions: Iterable[Region] = (),
        foreign: Iterable[Iterable[Region]] = (),
        own_pd: bool = True,
        receives: Receives | None = None,
        reserved: Iterable[int] = (),
    ) -> None:
        self.table = MirrorTable()
        self.table.reserved.update(reserved)
        self.pd = ProtectionDomain(self.table)
        self.engine = self._engine(dut_listens, request_raw, reply, request, reply_raw)
        neg = self.engine.negotiated
        assert neg is not None
        self.negotiated = neg
        self.cq = CompletionQueue(1 << 16)
        self.qp = QueuePair(self.pd, self.cq, ird=128, ord=128)
        if neg.ird != MPA_V2_NO_NEGOTIATION:
            self.qp.ird = neg.ird
        self.endpoint = QpEndpoint(self.engine, self.qp)
        self.receives = receives = receives or Receives(1, 16)
        self.failure: tuple[ProtocolError, bytes | None] | None = None
        self._index = 0
        self._failed_at: int | None = None
        self._hook_terminate()
        for region in regions:
            _MirrorRegion(self.pd, region, region.access | Access.LOCAL_WRITE)
        for others in foreign:
            pd = ProtectionDomain(self.table) if own_pd else self.pd
            for region in others:
                if self.table.lookup(region.stag) is None:
                    _MirrorRegion(pd, region, region.access | Access.LOCAL_WRITE)
        self._recv_mr = self.pd.reg_mr(bytearray(max(1, receives.size)), Access.LOCAL_WRITE)
        self.qp.set_rts()
        self._post_receives(receives.count)

    # -- setup ---------------------------------------------------------------------------

    @staticmethod
    def _engine(
        dut_listens: bool,
        request_raw: bytes,
        reply: MpaFrame | None,
        request: MpaFrame | None,
        reply_raw: bytes,
    ) -> IwarpConnection:
        from stack.conform.expected import settings_like

        try:
            if dut_listens:
                assert reply is not None
                engine = IwarpConnection(Role.RESPONDER, _responder_settings(reply))
                engine.start(0.0)
                engine.receive_data(request_raw)
                event = engine.next_event()
                if not isinstance(event, RequestReceived):
                    raise ModelError(f"the model refuses the runner's Request: {event}")
                engine.accept(reply.private_data)
            else:
                assert request is not None
                engine = IwarpConnection(Role.INITIATOR, settings_like(request))
                engine.initiate(0.0, request.private_data)
                engine.receive_data(reply_raw)
            event = engine.next_event()
        except IwarpError as exc:
            raise ModelError(f"the model cannot mirror the startup: {exc}") from None
        if not isinstance(event, Established):
            raise ModelError(f"the model's startup ended with {event}")
        engine.data_to_send()  # its Reply (and RTR): the DUT has sent its own
        return engine

    def _hook_terminate(self) -> None:
        send_terminate = self.engine.send_terminate

        def record(error: ProtocolError, offending: memoryview | None) -> None:
            if self.failure is None:
                self.failure = (error, None if offending is None else bytes(offending))
                self._failed_at = self._index
            send_terminate(error, offending)

        self.engine.send_terminate = record  # type: ignore[method-assign,assignment]

    def _post_receives(self, n: int) -> None:
        mr = self._recv_mr
        wr = RecvWR(0, (Sge(mr.base, self.receives.size, mr.lkey),))
        for _ in range(n):
            self.qp.post_recv(wr)

    # -- replay --------------------------------------------------------------------------

    def replay(self, log: Iterable[Out | PduSeen]) -> Expectation:
        """Feed the connection as the peer logged it; returns the model's expectation."""
        for entry in log:
            if self.failure is not None or self.endpoint.reading_done:
                break
            if isinstance(entry, Out):
                for sent in entry.sent:
                    self.endpoint.feed(sent.data)
                    self._index += 1
                    if self.endpoint.reading_done:
                        break
                self.settle()
            else:
                seg = entry.segment
                if seg is not None and isinstance(seg.header, ReadRequest):
                    self.dut_read(seg.header)
        return self.expectation()

    def expectation(self) -> Expectation:
        error = self.endpoint.error
        if self.failure is not None:
            err, offending = self.failure
            return Expectation(err, err.term, offending, self._failed_at)
        if isinstance(error, ProtocolError):  # an error that sends no Terminate
            return Expectation(error, None, None, self._index)
        return Expectation(None, None, None, None)

    def settle(self) -> None:
        """Send what is queued (responses free their IRD slots) and repost the receives
        the application took."""
        self.endpoint.produce()
        self.engine.data_to_send()
        taken = 0
        for wc in self.cq.poll(len(self.cq)):
            if wc.opcode is WcOpcode.RECV and wc.status is WcStatus.SUCCESS:
                taken += 1
        if taken and self.receives.reposts and self.qp.state is QpState.RTS:
            self._post_receives(taken)

    def dut_read(self, req: ReadRequest) -> None:
        """The DUT issued ``req``: issue it from the model too, into a sink like the DUT's,
        so the runner's Read Response is matched as the DUT must match it."""
        if self.qp.state is not QpState.RTS:
            return
        if self.table.lookup(req.sink_stag) is None:
            sink = Region(req.sink_stag, req.sink_to, max(req.size, 1), Access.LOCAL_WRITE, "")
            _MirrorRegion(self.pd, sink, Access.LOCAL_WRITE | Access.REMOTE_WRITE)
        sge = Sge(req.sink_to, req.size, req.sink_stag)
        wr = SendWR(0, WrOpcode.RDMA_READ, (sge,), rkey=req.src_stag, remote_addr=req.src_to)
        self.qp.post_send(wr)
        self.endpoint.produce()
        self.engine.data_to_send()
