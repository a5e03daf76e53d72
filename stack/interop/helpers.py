"""Helpers of the siw interop tests: a blocking-socket driver for our sans-IO MPA engine,
rping's first messages, and the capture check through our dissector.

Everything runs on 127.0.0.1: the guest reaches a host listener as 10.0.2.2, and the host
reaches a guest listener through a QEMU hostfwd.
"""

from __future__ import annotations

import os
import re
import socket
import struct
import time
from dataclasses import dataclass, field
from pathlib import Path

from stack.constants import Opcode
from stack.dissect.decoder import DissectOptions, Dissector, Note, PduRecord
from stack.interop.tshark import TSHARK, check_against_tshark
from stack.pcap import CaptureReader
from stack.wire.events import (
    Established,
    MpaEvent,
    MpaSettings,
    NeedData,
    Negotiated,
    Role,
    Send,
    UlpduReceived,
)
from stack.wire.mpa import MpaConnection
from stack.wire.rdmap import Segment, decode_ulpdu, encode_message

SIW_PASSIVE_FIRST_FPDU_DELAY = 0.2
"""siw 6.1 can stall an FPDU that arrives right after its MPA Reply (its passive side races
the first FPDU against its QP setup)."""

RPING_INFO = struct.Struct(">QII")
"""rping's ``struct rping_rdma_info``: buf (be64), rkey (be32), size (be32)."""


class MpaTimeout(AssertionError):
    """The peer did not produce the expected MPA event in time."""


class MpaSocketPeer:
    """Drive an :class:`MpaConnection` over a connected blocking socket (one test, one peer).

    Time is the monotonic clock, passed to the engine; every wait has a deadline.
    """

    def __init__(self, sock: socket.socket, conn: MpaConnection) -> None:
        self.sock = sock
        self.conn = conn
        self.events: list[MpaEvent] = []
        self.segments: list[Segment] = []

    @classmethod
    def initiator(
        cls, sock: socket.socket, settings: MpaSettings, private_data: bytes = b""
    ) -> MpaSocketPeer:
        peer = cls(sock, MpaConnection(Role.INITIATOR, settings))
        peer.conn.initiate(time.monotonic(), private_data)
        peer.flush()
        return peer

    @classmethod
    def responder(cls, sock: socket.socket, settings: MpaSettings) -> MpaSocketPeer:
        peer = cls(sock, MpaConnection(Role.RESPONDER, settings))
        peer.conn.start(time.monotonic())
        return peer

    def flush(self) -> None:
        data = self.conn.data_to_send()
        if data:
            self.sock.sendall(data)

    def next_event(self, timeout: float = 15.0) -> MpaEvent:
        """The engine's next event, reading from the socket as needed."""
        deadline = time.monotonic() + timeout
        while True:
            event = self.conn.next_event()
            if not isinstance(event, NeedData):
                self.events.append(event)
                return event
            now = time.monotonic()
            self.conn.handle_timer(now)
            if now >= deadline:
                raise MpaTimeout(f"no MPA event within {timeout} s (state {self.conn.state})")
            self.sock.settimeout(min(0.5, max(0.01, deadline - now)))
            try:
                data = self.sock.recv(65536)
            except TimeoutError:
                continue
            except ConnectionResetError:
                data = b""
            self.conn.receive_data(data)
            self.flush()

    def expect(self, kind: type, timeout: float = 15.0) -> MpaEvent:
        """The next event, asserting its type (with the event in the message otherwise)."""
        event = self.next_event(timeout)
        assert isinstance(event, kind), f"expected {kind.__name__}, got {event!r}"
        return event

    def accept(self) -> Negotiated:
        """Responder: accept the Request just received; return the negotiated values."""
        self.conn.accept()
        self.flush()
        event = self.expect(Established)
        assert isinstance(event, Established)
        return event.negotiated

    def established(self, timeout: float = 15.0) -> Negotiated:
        event = self.expect(Established, timeout)
        assert isinstance(event, Established)
        return event.negotiated

    def send(self, *ulpdus: bytes) -> None:
        self.conn.send_ulpdus(ulpdus)
        self.flush()

    def receive_segment(self, timeout: float = 15.0) -> Segment:
        """The next ULPDU from the peer, decoded strictly (CRC already checked by MPA)."""
        event = self.expect(UlpduReceived, timeout)
        assert isinstance(event, UlpduReceived)
        return decode_ulpdu(bytes(event.ulpdu))


def perftest_uncalibrated(output: str) -> bool:
    """Whether the guest's perftest failed its clock calibration (it compares its cycle
    counter with gettimeofday and needs r^2 >= 0.9, which TCG's timing sometimes misses):
    the transfer ran, but perftest printed no report, or a row of infinite figures after
    its r^2 warning.  The siw perftest tests run such a case once more."""
    if "Can't produce a report" in output:
        return True
    return "Correlation coefficient r^2" in output and re.search(r"\binf\b", output) is not None


def rping_info_send(buf: int, rkey: int, size: int, mulpdu: int) -> bytes:
    """rping's first message as one ULPDU: an RDMA Send of its rping_rdma_info (MSN 1)."""
    [ulpdu] = encode_message(Send(RPING_INFO.pack(buf, rkey, size)), msn=1, mulpdu=mulpdu)
    return ulpdu


def listen_local() -> tuple[socket.socket, int]:
    """A listening socket on 127.0.0.1 (reached from the guest as 10.0.2.2) and its port."""
    srv = socket.create_server(("127.0.0.1", 0))
    srv.settimeout(30.0)
    return srv, srv.getsockname()[1]


def connect_local(port: int, timeout: float = 10.0) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


@dataclass
class Decode:
    """What our dissector made of a capture.  Fields: records, notes."""

    records: list[PduRecord] = field(default_factory=list)
    notes: list[Note] = field(default_factory=list)

    def kinds(self) -> list[str]:
        return [r.kind for r in self.records]

    def findings(self) -> list[tuple[str, str]]:
        return [(f.rule, f.detail) for r in self.records for f in r.findings]

    def fpdus(self) -> list[PduRecord]:
        return [r for r in self.records if r.kind == "fpdu"]

    def opcodes(self) -> list[int]:
        return [r.segment.opcode for r in self.fpdus() if r.segment is not None]


def dissect(pcap: Path, **options: object) -> Decode:
    """Decode a capture with our dissector (``iwarp dissect``'s engine)."""
    opts = DissectOptions(max_private_data=256, **options)  # type: ignore[arg-type]
    dissector = Dissector(opts)
    out = Decode()
    for segment in CaptureReader(str(pcap)):
        _collect(out, dissector.feed(segment))
    _collect(out, dissector.finish())
    return out


def tshark_cross_check(pcap: Path) -> int:
    """Our decode of a real capture equals Debian tshark's, field by field, wherever
    tshark is reliable (:mod:`stack.interop.tshark`): an independent decoder agrees on
    third-party traffic.  Returns the PDUs compared (0: a capture tshark misdecodes, e.g.
    markers).  Without tshark: a failure in CI (CI=true), nothing on a developer machine."""
    if TSHARK is None:
        if os.environ.get("CI", "").lower() == "true":
            raise AssertionError("tshark is missing in CI: .ci/setup.d/tshark.sh installs it")
        return 0
    return check_against_tshark(TSHARK, pcap)


def _collect(out: Decode, items: list[PduRecord | Note]) -> None:
    for item in items:
        if isinstance(item, PduRecord):
            out.records.append(item)
        else:
            out.notes.append(item)


def assert_clean_capture(
    pcap: Path,
    *,
    expect_kinds: tuple[str, ...] = ("mpa_req", "mpa_rep"),
    allowed_rules: tuple[str, ...] = (),
    allowed_notes: tuple[str, ...] = ("trailing",),
    **options: object,
) -> Decode:
    """The capture decodes (``options``: decoding hints), holds the expected PDU kinds and
    has no finding outside ``allowed_rules`` and no stream note outside ``allowed_notes``."""
    decode = dissect(pcap, **options)
    kinds = decode.kinds()
    for kind in expect_kinds:
        assert kind in kinds, f"{pcap.name}: no {kind} in the decode (kinds {kinds[:12]})"
    unexpected = [
        (record.frame, f.rule, f.detail)
        for record in decode.records
        for f in record.findings
        if f.rule not in allowed_rules
    ]
    assert not unexpected, f"{pcap.name}: unexpected findings {unexpected[:6]}"
    bad_notes = [n for n in decode.notes if n.kind not in allowed_notes]
    assert not bad_notes, f"{pcap.name}: unexpected stream notes {bad_notes[:6]}"
    return decode


def is_send(segment: Segment) -> bool:
    return segment.opcode == Opcode.SEND
