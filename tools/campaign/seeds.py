"""Seed inputs for the decoder fuzzing, built with the project's own encoders.

Every seed is a valid encoding produced by the sending side (MPA initiator/responder
engines, :class:`~stack.wire.framing.FpduFramer`, :func:`~stack.wire.rdmap.encode_message`,
the KBTP message encoders, the capture-tap pcap writer) so that mutations start from
bytes the receiving side accepts and reach deep into it.  A stream-engine input starts
with one configuration octet (index into :data:`ENGINE_SETTINGS` or the framer options)
so that every corpus file is self-contained.
"""

from __future__ import annotations

import io
import struct
from pathlib import Path

from kbtp.constants import Capability, MessageOpcode, RequestFlag, Status
from kbtp.messages import (
    AllocStore,
    Bind,
    Completion,
    CompletionDescriptor,
    DataDescriptor,
    Free,
    Hello,
    HelloAck,
    Load,
    Message,
    Store,
    inline_descriptor,
)
from stack.constants import RtrType
from stack.pcap import Direction, PcapWriter
from stack.wire.connection import IwarpConnection
from stack.wire.events import (
    AtomicRequest,
    AtomicResponse,
    CrcPolicy,
    ImmediateData,
    MpaSettings,
    NeedData,
    RdmapMessage,
    RdmaWrite,
    ReadRequest,
    ReadResponse,
    RequestReceived,
    Role,
    Send,
    Terminate,
)
from stack.wire.framing import FpduFramer
from stack.wire.rdmap import encode_message
from stack.wire.terminate import build_terminate

ENGINE_SETTINGS: tuple[MpaSettings, ...] = (
    MpaSettings(),
    MpaSettings(rev=1),
    MpaSettings(crc=CrcPolicy.OFF),
    MpaSettings(want_markers=True),
    MpaSettings(want_markers=True, crc=CrcPolicy.REQUIRE),
    MpaSettings(p2p=True, rtr=RtrType.SEND),
    MpaSettings(p2p=True, rtr=RtrType.WRITE),
    MpaSettings(p2p=True, rtr=RtrType.READ),
    MpaSettings(mulpdu=128),
)
"""MPA settings a stream-engine input selects with its first octet (modulo the count)."""

FRAMER_OPTIONS: tuple[tuple[bool, bool, int], ...] = tuple(
    (crc, markers, offset)
    for crc in (True, False)
    for markers in (False, True)
    for offset in (0, 8, 508)
)
"""(crc, markers, offset) a deframer input selects with its first octet."""

INITIATOR_MESSAGES: tuple[RdmapMessage, ...] = (
    Send(b"hello, target", False, None),
    Send(b"x" * 300, True, 5),
    RdmaWrite(3, 1 << 20, b"w" * 700),
    ReadRequest(1, 0, 8, 2, 0),
    AtomicRequest.cmp_swap(1, 2, 8, 3, 4),
    ImmediateData(b"12345678", True),
)
RESPONDER_MESSAGES: tuple[RdmapMessage, ...] = (
    Send(b"hello, initiator", False, None),
    ReadResponse(1, 0, b"r" * 8),
    AtomicResponse(1, 2),
    RdmaWrite(9, 0, b"v" * 200),
    Send(b"", False, None),
)


def _drain(conn: IwarpConnection) -> None:
    while True:
        try:
            event = conn.next_event()
        except Exception:  # seeds only: a rejected message ends this side's reading
            return
        if isinstance(event, NeedData):
            return
        if isinstance(event, RequestReceived):
            conn.accept(b"reply")


def engine_pair_streams(settings: MpaSettings) -> tuple[bytes, bytes]:
    """(initiator->responder, responder->initiator) byte streams of one whole session."""
    ini = IwarpConnection(Role.INITIATOR, settings)
    resp = IwarpConnection(Role.RESPONDER, settings)
    resp.start(0.0)
    ini.initiate(0.0, b"private")
    i2r, r2i = bytearray(), bytearray()
    sent_i = sent_r = False

    def pump() -> None:
        while True:
            a, b = ini.data_to_send(), resp.data_to_send()
            if not a and not b:
                return
            i2r.extend(a)
            r2i.extend(b)
            if a:
                resp.receive_data(bytes(a))
            if b:
                ini.receive_data(bytes(b))
            _drain(ini)
            _drain(resp)

    pump()
    if ini.stream is not None and not sent_i:
        for msg in INITIATOR_MESSAGES:
            ini.send_message(msg)
        sent_i = True
        pump()
    if resp.stream is not None and not sent_r:
        for msg in RESPONDER_MESSAGES:
            resp.send_message(msg)
        pump()
    return bytes(i2r), bytes(r2i)


def engine_seeds(role: Role) -> list[bytes]:
    """Inputs for the engine of ``role``: config octet + the stream its peer sent."""
    out = []
    for index, settings in enumerate(ENGINE_SETTINGS):
        i2r, r2i = engine_pair_streams(settings)
        stream = i2r if role is Role.RESPONDER else r2i
        out.append(bytes([index]) + stream)
    return out


def framer_seeds() -> list[bytes]:
    """Inputs for the deframer: config octet + FPDUs framed with those options."""
    ulpdus = [b"a" * 5, b"b" * 600, b"", b"c" * 1500, bytes(range(256))]
    out = []
    for index, (crc, markers, offset) in enumerate(FRAMER_OPTIONS):
        framer = FpduFramer(crc=crc, markers=markers, offset=offset)
        out.append(bytes([index]) + b"".join(bytes(framer.frame(u)) for u in ulpdus))
    return out


def ulpdu_seeds() -> list[bytes]:
    """Single ULPDUs (DDP header onwards) of every RDMAP message kind."""
    out: list[bytes] = []
    term_of = build_terminate(
        (0, 1, 0), encode_message(Send(b"z" * 20, False, None), msn=1, mulpdu=128)[0]
    )
    for msg in (*INITIATOR_MESSAGES, *RESPONDER_MESSAGES, term_of):
        out += [bytes(u) for u in encode_message(msg, msn=1, mulpdu=128)]
    out.append(
        bytes(
            encode_message(
                Terminate(1, 1, 3, m=True, d=True, ddp_seg_len=22, ddp_header=out[0][:14]),
                msn=1,
                mulpdu=128,
            )[0]
        )
    )
    return out


def ulpdu_sequence_seeds() -> list[bytes]:
    """Sequences of ULPDUs, each prefixed with its 16-bit length (the FPDU boundaries)."""
    out = []
    for group in (INITIATOR_MESSAGES, RESPONDER_MESSAGES[:1] + INITIATOR_MESSAGES[:3]):
        seq = bytearray()
        msn = 1
        for msg in group:
            for u in encode_message(msg, msn=msn, mulpdu=256):
                seq += struct.pack(">H", len(u)) + bytes(u)
            if isinstance(msg, Send | ImmediateData):
                msn += 1
        out.append(bytes(seq))
    return out


def kbtp_seeds() -> list[bytes]:
    """One encoding of every KBTP message kind (docs/kbtp.md §5)."""
    comp = CompletionDescriptor(0x11, 0x22)
    data = b"inline block data"
    msgs: list[Message] = [
        Hello(1, Capability.DIRECT_LOAD | Capability.DIRECT_ALLOC, b"decode-7"),
        HelloAck(
            1,
            Status.SUCCESS,
            Capability.DIRECT_LOAD,
            0x10000,
            1024,
            64,
            0x1000,
            256,
            2000,
            16,
            6,
            4096,
            0x1100,
            0x1200,
            0x10000000,
            0x1000,
            0x10010000,
            0x1300,
            0x1400,
            0x14000000,
            0x14000400,
            0x10010000,
            0x400000,
            0x1500,
        ),
        Load(0x2A, 0x1005, DataDescriptor(0xABCD01, 0x10000, 0x10000), 4),
        Load(0x2B, 7, DataDescriptor(1, 2, 3), 0, RequestFlag.RECORD, comp),
        Store(0x2C, 9, inline_descriptor(data), data, 1, RequestFlag.INLINE | RequestFlag.SEAL),
        AllocStore(0x2D, 10, DataDescriptor(5, 0, 4096), b"", 0, RequestFlag.RECORD, comp),
        Free(0x2E, 11, 3),
        Bind(0x2F, 12, 7, 100, 0x10020000, 0, RequestFlag.SEAL),
        Completion(0x2A, 0x1005, 4, Status.SUCCESS, 0x10000, 0x10030000, MessageOpcode.LOAD),
    ]
    return [m.encode() for m in msgs]


def pcap_seeds(reference: Path | None = None) -> list[bytes]:
    """Small captures: the tap writer around a real session, and the reference pcaps."""
    out = []
    for settings in ENGINE_SETTINGS[:4]:
        i2r, r2i = engine_pair_streams(settings)
        buf = io.BytesIO()
        with PcapWriter(buf) as writer:
            conn = writer.connection(("10.0.0.1", 40000), ("10.0.0.2", 4791), mss=512)
            conn.record(Direction.SENT, i2r[:300], 1.0)
            conn.record(Direction.RECEIVED, r2i, 1.1)
            conn.record(Direction.SENT, i2r[300:], 1.2)
            conn.close(2.0)
        out.append(buf.getvalue())
    if reference is not None and reference.is_dir():
        out += [p.read_bytes() for p in sorted(reference.glob("*.pcap")) if p.stat().st_size < 8192]
    return out


def ulpdu_framed_seeds() -> list[bytes]:
    """Whole FPDUs (no markers) around every seed ULPDU, for the Scapy FPDU layer."""
    framer = FpduFramer()
    return [bytes(framer.frame(u)) for u in ulpdu_seeds()] + [b"\x00"]
