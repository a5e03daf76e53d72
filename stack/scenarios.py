"""The reference scenarios: the iWARP exchanges behind ``pcaps/`` and ``iwarp selfcheck``.

Every scenario runs two real endpoints over loopback TCP; the initiator's connection manager
has a capture tap, so each capture holds exactly the bytes that crossed the socket, both
directions, MPA startup included.  ``SCENARIOS`` also states what each capture must decode to
(``expect``: the PDU sequence per direction, and the Terminate if any); the tests decode
every file and compare.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

import trio

from stack.constants import RtrType
from stack.pcap import PcapWriter
from stack.rnic import Access, RecvWR, Rnic, SendFlags, SendWR, Sge, WrOpcode, reg_mr_wr
from stack.rnic.memory import MemoryRegion
from stack.rnic.qp import QueuePair
from stack.transport.cm import ConnectionManager, ConnectRejected
from stack.transport.tap import pcap_tap_factory
from stack.wire.events import CrcPolicy, MpaSettings

ALL = Access.LOCAL_WRITE | Access.REMOTE_WRITE | Access.REMOTE_READ | Access.REMOTE_ATOMIC

# Expected PDU kinds in the decode: "mpa_req", "mpa_rep", or an RDMAP opcode name.
I2R, R2I = "i2r", "r2i"


@dataclass
class Peer:
    rnic: Rnic
    qp: QueuePair
    regions: dict[str, MemoryRegion] = field(default_factory=dict)

    def mr(self, name: str, size_or_data: int | bytes, access: Access = ALL) -> MemoryRegion:
        mr = self.qp.pd.reg_mr(bytearray(size_or_data), access)
        self.regions[name] = mr
        return mr

    def fast_mr(self, name: str, size: int, access: Access = ALL) -> MemoryRegion:
        """A fast-registered MR (``alloc_mr`` + ``REG_MR``): remotely invalidatable."""
        buf = bytearray(size)
        mr = self.qp.pd.alloc_mr(size)
        self.qp.post_send(reg_mr_wr(mr, buf, access))
        self.regions[name] = mr
        return mr

    def sge(self, name: str, offset: int = 0, length: int | None = None) -> Sge:
        mr = self.regions[name]
        return Sge(mr.base + offset, mr.length - offset if length is None else length, mr.lkey)


Action = Callable[[Peer, Peer], Awaitable[None]]


@dataclass(frozen=True)
class Scenario:
    """One reference capture: how to produce it and what it must decode to."""

    name: str
    description: str
    action: Action
    client: MpaSettings = MpaSettings()
    server: MpaSettings = MpaSettings()
    expect: tuple[tuple[str, str], ...] = ()
    terminate: tuple[int, int, int] | None = None
    reject: bool = False


def _peer(name: str) -> Peer:
    rnic = Rnic(name)
    pd = rnic.alloc_pd()
    cq = rnic.create_cq()
    return Peer(rnic, rnic.create_qp(pd, cq))


async def _settle(*peers: Peer, count: int = 0) -> None:
    for peer in peers:
        if count:
            with trio.fail_after(10):
                await peer.qp.send_cq.wait_for(count)
    await trio.sleep(0.05)


# ----------------------------------------------------------------------------- actions
async def every_operation(c: Peer, s: Peer) -> None:
    s.mr("target", 8192)
    s.mr("inbox", 4096, Access.LOCAL_WRITE)
    exposed = s.fast_mr("exposed", 16)  # a Send with Invalidate names it
    s.qp.post_recv([RecvWR(i, (s.sge("inbox"),)) for i in range(8)])
    c.mr("src", bytes(range(256)) * 12)
    c.mr("sink", 3000, Access.LOCAL_WRITE)
    c.mr("result", 8, Access.LOCAL_WRITE)
    t = s.regions["target"]
    c.qp.post_send(
        [
            SendWR(1, WrOpcode.SEND, inline_data=b"Send"),
            SendWR(
                2,
                WrOpcode.SEND,
                inline_data=b"Send SE",
                send_flags=SendFlags.SIGNALED | SendFlags.SOLICITED,
            ),
            SendWR(3, WrOpcode.RDMA_WRITE, (c.sge("src"),), rkey=t.rkey, remote_addr=t.base),
            SendWR(4, WrOpcode.RDMA_READ, (c.sge("sink"),), rkey=t.rkey, remote_addr=t.base + 8),
            SendWR(
                5,
                WrOpcode.ATOMIC_FETCH_AND_ADD,
                (c.sge("result"),),
                rkey=t.rkey,
                remote_addr=t.base + 4096,
                compare_add=0x0000000100000010,
                compare_add_mask=(1 << 63) | (1 << 31) | (1 << 7),
            ),
            SendWR(
                6,
                WrOpcode.ATOMIC_CMP_AND_SWP,
                (c.sge("result"),),
                rkey=t.rkey,
                remote_addr=t.base + 4104,
                compare_add=0,
                swap=0xFEEDFACECAFEBEEF,
            ),
            SendWR(
                7,
                WrOpcode.RDMA_WRITE_WITH_IMM,
                inline_data=b"imm",
                rkey=t.rkey,
                remote_addr=t.base + 5000,
                imm_data=0x0102030405060708,
            ),
            SendWR(
                8,
                WrOpcode.SEND_IMM,
                imm_data=b"solicit!",
                send_flags=SendFlags.SIGNALED | SendFlags.SOLICITED,
            ),
            SendWR(
                9, WrOpcode.SEND_WITH_INV, inline_data=b"Send Inv", invalidate_rkey=exposed.rkey
            ),
        ]
    )
    await _settle(c, count=9)


EVERY_OPERATION_EXPECT = (
    (I2R, "mpa_req"),
    (R2I, "mpa_rep"),
    (I2R, "Send"),
    (I2R, "Send with SE"),
    (I2R, "RDMA Write"),
    (I2R, "RDMA Write"),
    (I2R, "RDMA Write"),
    (I2R, "RDMA Read Request"),
    (I2R, "Atomic Request"),
    (I2R, "Atomic Request"),
    (I2R, "RDMA Write"),
    (I2R, "Immediate Data"),
    (I2R, "Immediate Data with SE"),
    (I2R, "Send with Invalidate"),
    (R2I, "RDMA Read Response"),
    (R2I, "RDMA Read Response"),
    (R2I, "RDMA Read Response"),
    (R2I, "Atomic Response"),
    (R2I, "Atomic Response"),
)


async def simple_traffic(c: Peer, s: Peer) -> None:
    """A Send, a Write, a Read: enough to show a negotiation variant."""
    s.mr("target", 4096)
    s.mr("inbox", 1024, Access.LOCAL_WRITE)
    s.qp.post_recv(RecvWR(1, (s.sge("inbox"),)))
    c.mr("src", bytes(range(256)) * 8)
    c.mr("sink", 1500, Access.LOCAL_WRITE)
    t = s.regions["target"]
    c.qp.post_send(
        [
            SendWR(1, WrOpcode.SEND, inline_data=b"hello"),
            SendWR(2, WrOpcode.RDMA_WRITE, (c.sge("src"),), rkey=t.rkey, remote_addr=t.base),
            SendWR(3, WrOpcode.RDMA_READ, (c.sge("sink"),), rkey=t.rkey, remote_addr=t.base),
        ]
    )
    await _settle(c, count=3)


def _simple_expect(rtr: str | None = None, rtr_reply: str | None = None) -> tuple:
    head: list[tuple[str, str]] = [(I2R, "mpa_req"), (R2I, "mpa_rep")]
    if rtr:
        head.append((I2R, rtr))
    if rtr_reply:
        head.append((R2I, rtr_reply))
    return (
        *head,
        (I2R, "Send"),
        (I2R, "RDMA Write"),
        (I2R, "RDMA Write"),
        (I2R, "RDMA Read Request"),
        (R2I, "RDMA Read Response"),
        (R2I, "RDMA Read Response"),
    )


async def write_bad_stag(c: Peer, s: Peer) -> None:
    t = s.mr("target", 64)
    c.qp.post_send(
        SendWR(
            1, WrOpcode.RDMA_WRITE, inline_data=b"x" * 16, rkey=t.rkey ^ 0xFF00, remote_addr=t.base
        )
    )
    await _settle(c, count=1)
    with trio.fail_after(10):
        while c.qp.peer_terminate is None:
            await trio.sleep(0.01)


async def read_out_of_bounds(c: Peer, s: Peer) -> None:
    t = s.mr("target", 64)
    c.mr("sink", 128, Access.LOCAL_WRITE)
    c.qp.post_send(SendWR(1, WrOpcode.RDMA_READ, (c.sge("sink"),), rkey=t.rkey, remote_addr=t.base))
    await _settle(c, count=1)


async def send_without_receive(c: Peer, s: Peer) -> None:
    c.qp.post_send(SendWR(1, WrOpcode.SEND, inline_data=b"nobody is listening"))
    await _settle(c, count=1)
    with trio.fail_after(10):
        while c.qp.peer_terminate is None:
            await trio.sleep(0.01)


async def atomic_misaligned(c: Peer, s: Peer) -> None:
    t = s.mr("target", 64)
    c.mr("result", 8, Access.LOCAL_WRITE)
    c.qp.post_send(
        SendWR(
            1,
            WrOpcode.ATOMIC_FETCH_AND_ADD,
            (c.sge("result"),),
            rkey=t.rkey,
            remote_addr=t.base + 3,
            compare_add=1,
        )
    )
    await _settle(c, count=1)


async def send_too_long(c: Peer, s: Peer) -> None:
    s.mr("inbox", 8, Access.LOCAL_WRITE)
    s.qp.post_recv(RecvWR(1, (s.sge("inbox"),)))
    c.qp.post_send(SendWR(1, WrOpcode.SEND, inline_data=b"longer than eight bytes"))
    await _wait_terminate(c)


async def invalidate_foreign(c: Peer, s: Peer) -> None:
    foreign = s.rnic.alloc_pd().reg_mr(bytearray(8), ALL)
    s.mr("inbox", 64, Access.LOCAL_WRITE)
    s.qp.post_recv(RecvWR(1, (s.sge("inbox"),)))
    c.qp.post_send(
        SendWR(1, WrOpcode.SEND_WITH_INV, inline_data=b"inv", invalidate_rkey=foreign.rkey)
    )
    await _wait_terminate(c)


async def read_without_right(c: Peer, s: Peer) -> None:
    t = s.mr("target", 64, Access.LOCAL_WRITE | Access.REMOTE_WRITE)
    c.mr("sink", 64, Access.LOCAL_WRITE)
    c.qp.post_send(SendWR(1, WrOpcode.RDMA_READ, (c.sge("sink"),), rkey=t.rkey, remote_addr=t.base))
    await _settle(c, count=1)


async def write_other_pd(c: Peer, s: Peer) -> None:
    t = s.rnic.alloc_pd().reg_mr(bytearray(64), ALL)
    c.qp.post_send(
        SendWR(1, WrOpcode.RDMA_WRITE, inline_data=b"x" * 8, rkey=t.rkey, remote_addr=t.base)
    )
    await _wait_terminate(c)


async def _wait_terminate(c: Peer) -> None:
    with trio.fail_after(10):
        while c.qp.peer_terminate is None:
            await trio.sleep(0.01)


async def nothing(c: Peer, s: Peer) -> None:
    await trio.sleep(0.05)


def _term_expect(opcode: str) -> tuple:
    return ((I2R, "mpa_req"), (R2I, "mpa_rep"), (I2R, opcode), (R2I, "Terminate"))


SCENARIOS: tuple[Scenario, ...] = (
    Scenario(
        "ops-rev2-crc",
        "every RDMAP opcode, MPA rev 2, CRC",
        every_operation,
        expect=EVERY_OPERATION_EXPECT,
    ),
    Scenario(
        "rev1-crc",
        "MPA rev 1 with CRC",
        simple_traffic,
        MpaSettings(rev=1),
        MpaSettings(rev=1),
        expect=_simple_expect(),
    ),
    Scenario(
        "rev2-nocrc",
        "MPA rev 2, CRC off on both sides",
        simple_traffic,
        MpaSettings(crc=CrcPolicy.OFF),
        MpaSettings(crc=CrcPolicy.OFF),
        expect=_simple_expect(),
    ),
    Scenario(
        "markers-both",
        "markers in both directions",
        simple_traffic,
        MpaSettings(want_markers=True),
        MpaSettings(want_markers=True),
        expect=_simple_expect(),
    ),
    Scenario(
        "markers-r2i",
        "markers only in FPDUs sent to the initiator",
        simple_traffic,
        MpaSettings(want_markers=True),
        MpaSettings(),
        expect=_simple_expect(),
    ),
    Scenario(
        "markers-i2r",
        "markers only in FPDUs sent to the responder",
        simple_traffic,
        MpaSettings(),
        MpaSettings(want_markers=True),
        expect=_simple_expect(),
    ),
    Scenario(
        "p2p-send-rtr",
        "peer-to-peer, zero-length Send RTR",
        simple_traffic,
        MpaSettings(p2p=True, rtr=RtrType.SEND),
        MpaSettings(p2p=True),
        expect=_simple_expect("Send"),
    ),
    Scenario(
        "p2p-write-rtr",
        "peer-to-peer, zero-length Write RTR",
        simple_traffic,
        MpaSettings(p2p=True, rtr=RtrType.WRITE),
        MpaSettings(p2p=True),
        expect=_simple_expect("RDMA Write"),
    ),
    Scenario(
        "p2p-read-rtr",
        "peer-to-peer, zero-length Read RTR",
        simple_traffic,
        MpaSettings(p2p=True, rtr=RtrType.READ),
        MpaSettings(p2p=True),
        expect=_simple_expect("RDMA Read Request", "RDMA Read Response"),
    ),
    Scenario(
        "reject",
        "responder rejects with private data",
        nothing,
        expect=((I2R, "mpa_req"), (R2I, "mpa_rep")),
        reject=True,
    ),
    Scenario(
        "term-write-invalid-stag",
        "Write to an invalid STag: Terminate 1/1/0",
        write_bad_stag,
        expect=_term_expect("RDMA Write"),
        terminate=(1, 1, 0x00),
    ),
    Scenario(
        "term-read-bounds",
        "Read beyond the source: Terminate 0/1/1",
        read_out_of_bounds,
        expect=_term_expect("RDMA Read Request"),
        terminate=(0, 1, 0x01),
    ),
    Scenario(
        "term-send-no-buffer",
        "Send with no receive posted: Terminate 1/2/2",
        send_without_receive,
        expect=_term_expect("Send"),
        terminate=(1, 2, 0x02),
    ),
    Scenario(
        "term-send-too-long",
        "Send longer than the receive: Terminate 1/2/5",
        send_too_long,
        expect=_term_expect("Send"),
        terminate=(1, 2, 0x05),
    ),
    Scenario(
        "term-send-inv-foreign",
        "Send with Invalidate of a foreign STag: Terminate 0/1/9",
        invalidate_foreign,
        expect=_term_expect("Send with Invalidate"),
        terminate=(0, 1, 0x09),
    ),
    Scenario(
        "term-read-rights",
        "Read without REMOTE_READ: Terminate 0/1/2",
        read_without_right,
        expect=_term_expect("RDMA Read Request"),
        terminate=(0, 1, 0x02),
    ),
    Scenario(
        "term-write-other-pd",
        "Write to another PD's STag: Terminate 1/1/2",
        write_other_pd,
        expect=_term_expect("RDMA Write"),
        terminate=(1, 1, 0x02),
    ),
    Scenario(
        "term-atomic-misaligned",
        "misaligned atomic: Terminate 0/2/7",
        atomic_misaligned,
        expect=_term_expect("Atomic Request"),
        terminate=(0, 2, 0x07),
    ),
)


CAPTURE_EMSS = 1448
"""EMSS used for the captures: an Ethernet path, so larger messages show DDP segmentation."""


async def run_scenario(scenario: Scenario, path: Path) -> None:
    """Run one scenario over loopback TCP, capturing at the initiator."""
    client, server = _peer("initiator"), _peer("responder")
    client_settings = replace(scenario.client, emss=scenario.client.emss or CAPTURE_EMSS)
    server_settings = replace(scenario.server, emss=scenario.server.emss or CAPTURE_EMSS)
    with PcapWriter(path) as writer:
        async with (
            ConnectionManager.open(server.rnic) as scm,
            ConnectionManager.open(client.rnic, tap_factory=pcap_tap_factory(writer)) as ccm,
        ):
            listener = await scm.listen("127.0.0.1", 0, settings=server_settings)
            accepted: list = []

            async def serve() -> None:
                request = await listener.get_request()
                if scenario.reject:
                    await request.reject(b"not today")
                else:
                    accepted.append(await request.accept(server.qp, b"welcome"))

            scm.nursery.start_soon(serve)
            try:
                conn = await ccm.connect(
                    "127.0.0.1",
                    listener.port,
                    client.qp,
                    private_data=b"hello",
                    settings=client_settings,
                )
            except ConnectRejected:
                await trio.sleep(0.05)
                return
            await scenario.action(client, server)
            await conn.disconnect()
            with trio.fail_after(10):
                await accepted[0].wait_closed()
