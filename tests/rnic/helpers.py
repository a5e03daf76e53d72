"""Two RNIC endpoints wired back to back in memory (no sockets), for QP-level tests.

The bytes between them are the real wire bytes (MPA + DDP + RDMAP), produced and consumed
by the same :class:`~stack.rnic.endpoint.QpEndpoint` the trio driver uses.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from stack.rnic import Access, CompletionQueue, QueuePair, Rnic, Sge, reg_mr_wr
from stack.rnic.endpoint import QpEndpoint
from stack.rnic.memory import MemoryRegion, ProtectionDomain
from stack.wire.connection import ConnectionEvent, IwarpConnection
from stack.wire.events import (
    Established,
    MpaSettings,
    NeedData,
    RdmapMessage,
    RequestReceived,
    Role,
)
from stack.wire.framing import FpduDeframer
from stack.wire.rdmap import decode_ulpdu


@dataclass
class Side:
    """One host: its RNIC, PD, CQ, QP and endpoint."""

    rnic: Rnic
    pd: ProtectionDomain
    cq: CompletionQueue
    qp: QueuePair
    engine: IwarpConnection
    endpoint: QpEndpoint | None = None
    sent: list[bytes] = field(default_factory=list)

    def mr(self, size_or_data: int | bytes, access: Access = Access.LOCAL_WRITE) -> MemoryRegion:
        buf = bytearray(size_or_data)
        return self.pd.reg_mr(buf, access)

    def fast_mr(
        self,
        size_or_data: int | bytes,
        access: Access = Access.LOCAL_WRITE,
        *,
        scoped: bool = False,
    ) -> MemoryRegion:
        """A fast-registered MR: ``alloc_mr`` (``scoped``: associated with this QP's stream
        only), then an unsignalled ``REG_MR`` on this QP."""
        buf = bytearray(size_or_data)
        mr = self.pd.alloc_mr(len(buf), qp=self.qp if scoped else None)
        self.qp.post_send(reg_mr_wr(mr, buf, access))
        assert mr.valid, "REG_MR did not run (QP not in RTS?)"
        return mr

    def sge(self, mr: MemoryRegion, offset: int = 0, length: int | None = None) -> Sge:
        n = mr.length - offset if length is None else length
        return Sge(mr.base + offset, n, mr.lkey)


def _drain(engine: IwarpConnection) -> list[ConnectionEvent]:
    events: list[ConnectionEvent] = []
    while not isinstance(ev := engine.next_event(), NeedData):
        events.append(ev)
    return events


class Pair:
    """Side ``a`` is the MPA initiator, side ``b`` the responder."""

    def __init__(
        self,
        a_settings: MpaSettings | None = None,
        b_settings: MpaSettings | None = None,
        *,
        a_qp: dict | None = None,
        b_qp: dict | None = None,
        cq_capacity: int = 4096,
        private_data: bytes = b"",
    ) -> None:
        self.a = self._side("a", Role.INITIATOR, a_settings, a_qp or {}, cq_capacity)
        self.b = self._side("b", Role.RESPONDER, b_settings, b_qp or {}, cq_capacity)
        self.a.engine.initiate(0.0, private_data)
        self.b.engine.start(0.0)
        self.b.engine.receive_data(self.a.engine.data_to_send())
        events = _drain(self.b.engine)
        assert isinstance(events[0], RequestReceived), events
        self.request = events[0]
        self.b.engine.accept()
        reply = self.b.engine.data_to_send()
        assert isinstance(_drain(self.b.engine)[0], Established)
        self.a.engine.receive_data(reply)
        a_events = _drain(self.a.engine)
        assert any(isinstance(e, Established) for e in a_events), a_events
        for side in (self.a, self.b):
            side.endpoint = QpEndpoint(side.engine, side.qp)
            side.qp.set_rts()

    @staticmethod
    def _side(
        name: str, role: Role, settings: MpaSettings | None, qp_kw: dict, cq_capacity: int
    ) -> Side:
        rnic = Rnic(name)
        pd = rnic.alloc_pd()
        cq = rnic.create_cq(cq_capacity)
        qp = rnic.create_qp(pd, cq, **qp_kw)
        return Side(rnic, pd, cq, qp, IwarpConnection(role, settings or MpaSettings()))

    def step(self, src: Side, dst: Side) -> int:
        """Move what ``src`` has to send into ``dst``; returns the byte count."""
        assert src.endpoint is not None and dst.endpoint is not None
        data = bytes(src.endpoint.produce())
        if data:
            src.sent.append(data)
            dst.endpoint.feed(data)
        return len(data)

    def close_streams(self) -> None:
        """Both TCP halves are gone (what the driver reports when a connection ends): each
        QP leaves TERMINATE or CLOSING for ERROR."""
        for side in (self.a, self.b):
            assert side.endpoint is not None
            side.endpoint.stream_closed()

    def pump(self, rounds: int = 10_000) -> None:
        """Exchange bytes until both sides are quiet."""
        for _ in range(rounds):
            if not (self.step(self.a, self.b) + self.step(self.b, self.a)):
                return
        raise AssertionError("pair did not quiesce")


class SharedResponder(Pair):
    """A :class:`Pair` whose responder ``b`` is a new QP of an existing RNIC and PD: a second
    stream into the same RNIC."""

    def __init__(self, rnic: Rnic, pd: ProtectionDomain, **kw: object) -> None:
        self._shared = (rnic, pd)
        super().__init__(**kw)  # type: ignore[arg-type]

    def _side(  # type: ignore[override]
        self,
        name: str,
        role: Role,
        settings: MpaSettings | None,
        qp_kw: dict,
        cq_capacity: int,
    ) -> Side:
        if name != "b":
            return Pair._side(name, role, settings, qp_kw, cq_capacity)
        rnic, pd = self._shared
        cq: CompletionQueue = rnic.create_cq(cq_capacity)
        qp = rnic.create_qp(pd, cq, **qp_kw)
        return Side(rnic, pd, cq, qp, IwarpConnection(role, settings or MpaSettings()))


def opcodes(wire: bytes) -> list[int]:
    """The RDMAP opcodes of the FPDUs in ``wire`` (CRC on, no markers: the pair default)."""
    deframer = FpduDeframer(crc=True, markers=False)
    deframer.feed(wire)
    return [decode_ulpdu(u).opcode for u in deframer]


def record_sent_messages(engine: IwarpConnection) -> list[RdmapMessage]:
    """Install a ``send_message`` hook on ``engine`` (as a conformance fault does) that
    records each message it sends; returns the list it appends to."""
    seen: list[RdmapMessage] = []
    send_message = engine.send_message

    def hooked(message: RdmapMessage) -> None:
        seen.append(message)
        send_message(message)

    engine.send_message = hooked  # type: ignore[method-assign]
    return seen
