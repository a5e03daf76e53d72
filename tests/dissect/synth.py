"""Synthetic iWARP captures for the dissector tests: our encoders + the capture-tap writer.

``CaptureBuilder().connection(...)`` records the TCP handshake and the MPA Request/Reply;
``conn.send(direction, message)`` encodes an RDMAP message (``stack.wire.rdmap``), frames
it (``stack.wire.framing``: CRC, markers from SeqStart) and records it, returning the
ULPDUs so tests can assert the decode field by field.  ``conn.wire(...)`` returns framed
bytes without recording them, for hand-made segmentation.
"""

from __future__ import annotations

import io
import struct
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field

from stack.constants import RtrType
from stack.pcap import ConnectionRecorder, Direction, PcapWriter, read_tcp_segments
from stack.wire.events import IrdOrd, MpaFrame, RdmapMessage
from stack.wire.framing import FpduFramer
from stack.wire.mpa import encode_frame
from stack.wire.rdmap import encode_message, message_qn

I2R = Direction.SENT
R2I = Direction.RECEIVED
INITIATOR = ("10.1.0.1", 50000)
RESPONDER = ("10.1.0.2", 35287)  # no Wireshark dissector owns this port


@dataclass
class Conn:
    """One recorded connection; ``framers`` hold each direction's marker/CRC state."""

    rec: ConnectionRecorder
    framers: dict[Direction, FpduFramer]
    mulpdu: int = 1400
    msn: dict[tuple[Direction, int], int] = field(default_factory=lambda: defaultdict(lambda: 1))
    clock: float = 1.0

    def tick(self) -> float:
        self.clock += 0.001
        return self.clock

    def ulpdus(
        self, direction: Direction, msg: RdmapMessage, msn: int | None = None
    ) -> list[bytes]:
        qn = message_qn(msg)
        if qn is not None and msn is None:
            msn = self.msn[(direction, qn)]
            self.msn[(direction, qn)] = msn + 1
        return [bytes(u) for u in encode_message(msg, msn=msn, mulpdu=self.mulpdu)]

    def wire(self, direction: Direction, ulpdu: bytes) -> bytes:
        return bytes(self.framers[direction].frame(ulpdu))

    def send(
        self,
        direction: Direction,
        msg: RdmapMessage,
        msn: int | None = None,
        together: bool = False,
    ) -> list[bytes]:
        """Encode, frame and record ``msg``; one record per FPDU unless ``together``."""
        ulpdus = self.ulpdus(direction, msg, msn)
        chunks = [self.wire(direction, u) for u in ulpdus]
        if together:
            self.rec.record(direction, b"".join(chunks), self.tick())
        else:
            for chunk in chunks:
                self.rec.record(direction, chunk, self.tick())
        return ulpdus

    def raw(self, direction: Direction, data: bytes) -> None:
        self.rec.record(direction, data, self.tick())

    def close(self) -> None:
        self.rec.close(self.tick())


class CaptureBuilder:
    """Builds a pcap in memory; ``data()`` returns its bytes."""

    def __init__(self) -> None:
        self.out = io.BytesIO()
        self.writer = PcapWriter(self.out)
        self.port = INITIATOR[1]

    def connection(
        self,
        *,
        rev: int = 2,
        crc: bool = True,
        reply_crc: bool | None = None,
        markers_i2r: bool = False,
        markers_r2i: bool = False,
        enhanced: bool | None = None,
        p2p: bool = False,
        rtr_offer: RtrType = RtrType.NONE,
        rtr_reply: RtrType = RtrType.NONE,
        ird: int = 16,
        ord_: int = 16,
        req_pd: bytes = b"",
        rep_pd: bytes = b"",
        reject: bool = False,
        mss: int = 1460,
        isn: tuple[int, int] = (0xFFFFFFFF, 0xFFFFFFFF),
        reply_with: bytes | bytearray = b"",
        startup: bool = True,
        handshake: bool = True,
    ) -> Conn:
        """Record a connection's start.  ``reply_with``: wire bytes sent in the Reply's segment."""
        self.port += 1
        rec = self.writer.connection(
            (INITIATOR[0], self.port), RESPONDER, mss=mss, isn=isn, handshake=handshake
        )
        enh = rev >= 2 if enhanced is None else enhanced
        req = MpaFrame(
            reply=False,
            markers=markers_r2i,
            crc=crc,
            rev=rev,
            ird_ord=IrdOrd(ird, ord_, p2p, rtr_offer) if enh else None,
            private_data=req_pd,
        )
        rep = MpaFrame(
            reply=True,
            markers=markers_i2r,
            crc=crc if reply_crc is None else reply_crc,
            reject=reject,
            rev=rev,
            ird_ord=IrdOrd(ird, ord_, p2p, rtr_reply) if enh else None,
            private_data=rep_pd,
        )
        negotiated_crc = req.crc or rep.crc
        conn = Conn(
            rec,
            {
                I2R: FpduFramer(crc=negotiated_crc, markers=markers_i2r),
                R2I: FpduFramer(crc=negotiated_crc, markers=markers_r2i),
            },
        )
        if startup:
            rec.record(I2R, encode_frame(req), conn.tick())
            rec.record(R2I, encode_frame(rep) + reply_with, conn.tick())
        return conn

    def data(self) -> bytes:
        self.writer.flush()
        return self.out.getvalue()


def rewrite(data: bytes, keep: Callable[[int, bytes], bytes | None]) -> bytes:
    """Re-emit a pcap, passing each (1-based frame number, frame bytes) through ``keep``."""
    out = bytearray(data[:24])
    pos = 24
    number = 0
    while pos < len(data):
        sec, usec, incl, _orig = struct.unpack_from("<IIII", data, pos)
        frame = data[pos + 16 : pos + 16 + incl]
        pos += 16 + incl
        number += 1
        new = keep(number, frame)
        if new is not None:
            out += struct.pack("<IIII", sec, usec, len(new), len(new)) + new
    return bytes(out)


def frames_with_payload(data: bytes) -> list[int]:
    return [s.frame for s in read_tcp_segments(data) if len(s.payload)]
