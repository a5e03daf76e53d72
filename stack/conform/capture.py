"""One case's capture, and the single import point of the capture writer and decoder.

Every pcap write and capture decode of ``iwarp conform`` goes through this module (the
writer and reader of :mod:`stack.pcap`, the decoder of :mod:`stack.dissect.decoder`).

:class:`CaseCapture` records the two byte streams of a case's connection exactly as they
crossed the socket (the writer synthesizes Ethernet/IPv4/TCP, each byte's sequence number
being its stream offset), remembers which frame holds which stream bytes, so a verdict can
name the frame of the offending PDU, and decodes the finished capture with the capture
decoder for evidence (its findings on the DUT's PDUs).
"""

from __future__ import annotations

import io
import time
from bisect import bisect_right
from dataclasses import dataclass, field
from pathlib import Path

from stack.dissect.decoder import Note, PduRecord, dissect
from stack.pcap import Direction, PcapWriter, read_tcp_segments
from stack.pcap.writer import DEFAULT_MSS

__all__ = ["CaseCapture", "DutFinding"]


@dataclass(frozen=True, slots=True)
class DutFinding:
    """A capture decoder finding on a PDU the DUT sent: frame, rule, detail."""

    frame: int
    rule: str
    detail: str

    def __str__(self) -> str:
        return f"frame {self.frame}: {self.rule} {self.detail} (capture decoder)"


@dataclass
class _Chunks:
    """Recorded chunks of one direction: stream start offsets and their first frames."""

    starts: list[int] = field(default_factory=list)
    frames: list[int] = field(default_factory=list)


class CaseCapture:
    """The capture of one case's TCP connection (in memory; :meth:`save` writes it).

    ``runner``/``dut``: (ip, port) of each end; ``runner_connects``: the runner sent the SYN
    (the DUT listens).  Record with :meth:`record`, close with :meth:`close`.
    """

    def __init__(
        self,
        runner: tuple[str, int],
        dut: tuple[str, int],
        *,
        runner_connects: bool,
        mss: int = DEFAULT_MSS,
    ) -> None:
        self._file = io.BytesIO()
        self._writer = PcapWriter(self._file)
        self.runner_connects = runner_connects
        src, dst = (runner, dut) if runner_connects else (dut, runner)
        self._recorder = self._writer.connection(src, dst, timestamp=time.time(), mss=mss)
        self._mss = mss
        self._chunks = {True: _Chunks(), False: _Chunks()}

    def _direction(self, outbound: bool) -> Direction:
        return Direction.SENT if outbound == self.runner_connects else Direction.RECEIVED

    def record(self, outbound: bool, data: bytes | bytearray | memoryview) -> None:
        """Record bytes the runner sent (``outbound``) or received."""
        if not data or self._recorder.closed:
            return
        direction = self._direction(outbound)
        chunks = self._chunks[outbound]
        chunks.starts.append(self._recorder.offset(direction))
        chunks.frames.append(self._writer.packets + 1)
        self._recorder.record(direction, data, time.time())

    def frame_of(self, outbound: bool, offset: int) -> int | None:
        """The frame holding stream byte ``offset`` of one direction (None if not recorded)."""
        chunks = self._chunks[outbound]
        i = bisect_right(chunks.starts, offset) - 1
        if i < 0:
            return None
        end = (
            chunks.starts[i + 1]
            if i + 1 < len(chunks.starts)
            else self._recorder.offset(self._direction(outbound))
        )
        if offset >= end:
            return None
        return chunks.frames[i] + (offset - chunks.starts[i]) // self._mss

    @property
    def packets(self) -> int:
        return self._writer.packets

    def close(self, *, reset: bool = False, dut_first: bool = False) -> None:
        """End the recorded connection: a FIN exchange (``dut_first``: the DUT closed first)
        or an RST; idempotent."""
        if self._recorder.closed:
            return
        dut_dir = self._direction(False)
        runner_dir = self._direction(True)
        if reset:
            self._recorder.reset(time.time(), dut_dir if dut_first else runner_dir)
        else:
            self._recorder.close(time.time(), dut_dir if dut_first else runner_dir)

    def data(self) -> bytes:
        """The pcap file's bytes so far."""
        self._writer.flush()
        return self._file.getvalue()

    def save(self, path: str | Path) -> str:
        """Write the capture to ``path``; returns the path as a string."""
        Path(path).write_bytes(self.data())
        return str(path)

    def decode(self) -> list[PduRecord | Note]:
        """Every record and note of the capture decoder for this capture."""
        return list(dissect(read_tcp_segments(self.data())))

    def dut_findings(self) -> list[DutFinding]:
        """The capture decoder's findings on the PDUs the DUT sent, in frame order."""
        dut_direction = "r2i" if self.runner_connects else "i2r"
        out: list[DutFinding] = []
        for item in self.decode():
            if isinstance(item, PduRecord) and item.direction == dut_direction:
                out.extend(DutFinding(item.frame, f.rule, f.detail) for f in item.findings)
        return out
