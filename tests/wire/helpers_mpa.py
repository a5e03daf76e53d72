"""Two MPA engines wired back to back, no sockets (h11's ConnectionPair idea)."""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Any

from stack.crc import crc_field
from stack.wire.events import (
    MpaEvent,
    MpaSettings,
    NeedData,
    Role,
)
from stack.wire.mpa import MpaConnection

DEFAULT = MpaSettings()


def drain(conn: MpaConnection) -> list[MpaEvent]:
    """All events currently available from ``conn``."""
    events: list[MpaEvent] = []
    while not isinstance(event := conn.next_event(), NeedData):
        events.append(event)
    return events


def of_type(events: list[MpaEvent], kind: type) -> list:
    return [e for e in events if isinstance(e, kind)]


@dataclass
class ConnectionPair:
    """An initiator and a responder; :meth:`pump` moves bytes until both are quiet."""

    initiator_settings: MpaSettings = DEFAULT
    responder_settings: MpaSettings = DEFAULT
    initiator: MpaConnection = field(init=False)
    responder: MpaConnection = field(init=False)
    wire_i2r: bytearray = field(default_factory=bytearray)
    wire_r2i: bytearray = field(default_factory=bytearray)

    def __post_init__(self) -> None:
        self.initiator = MpaConnection(Role.INITIATOR, self.initiator_settings)
        self.responder = MpaConnection(Role.RESPONDER, self.responder_settings)

    def pump(self) -> tuple[list[MpaEvent], list[MpaEvent]]:
        """Deliver queued bytes both ways until nothing moves; return (initiator, responder)
        events seen meanwhile."""
        ev_i: list[MpaEvent] = []
        ev_r: list[MpaEvent] = []
        while True:
            a = self.initiator.data_to_send()
            b = self.responder.data_to_send()
            if not a and not b:
                break
            self.wire_i2r += a
            self.wire_r2i += b
            if a:
                self.responder.receive_data(bytes(a))
            if b:
                self.initiator.receive_data(bytes(b))
            ev_i += drain(self.initiator)
            ev_r += drain(self.responder)
        ev_i += drain(self.initiator)
        ev_r += drain(self.responder)
        return ev_i, ev_r

    def start(
        self, private_data: bytes = b"", now: float = 0.0
    ) -> tuple[list[MpaEvent], list[MpaEvent]]:
        """Responder listens, initiator sends its Request; events of both."""
        self.responder.start(now)
        self.initiator.initiate(now, private_data)
        return self.pump()

    def handshake(
        self, private_data: bytes = b"", reply_data: bytes = b"", **accept_kwargs: Any
    ) -> tuple[list[MpaEvent], list[MpaEvent]]:
        """Full startup with an accept; returns all events of both sides."""
        ev_i, ev_r = self.start(private_data)
        self.responder.accept(reply_data, **accept_kwargs)
        more_i, more_r = self.pump()
        return ev_i + more_i, ev_r + more_r


def reference_fpdu(ulpdu: bytes) -> bytes:
    """An FPDU without markers built the slow, obvious way (RFC 5044 §4.3 and Appendix A)."""
    body = struct.pack(">H", len(ulpdu)) + ulpdu
    body += bytes(-len(body) & 3)
    return body + crc_field(body)


def reference_marker_stream(ulpdus: list[bytes], offset: int = 0, crc: bool = True) -> bytes:
    """A marker stream built byte by byte (RFC 5044 §4.3 and Appendix A), starting ``offset`` bytes
    after SeqStart."""
    out = bytearray(offset)

    def at_marker() -> bool:
        return len(out) % 512 == 0

    for ulpdu in ulpdus:
        body = struct.pack(">H", len(ulpdu)) + ulpdu
        body += bytes(-len(body) & 3)
        covered = bytearray()
        if at_marker():
            out += bytes(4)
            covered += bytes(4)
        start = len(out)
        for byte in body:
            if at_marker():
                marker = struct.pack(">HH", 0, len(out) - start)
                out += marker
                covered += marker
            out.append(byte)
            covered.append(byte)
        if at_marker():
            marker = struct.pack(">HH", 0, len(out) - start)
            out += marker
            covered += marker
        out += crc_field(bytes(covered)) if crc else bytes(4)
    return bytes(out[offset:])
