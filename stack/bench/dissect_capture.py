"""The capture ``iwarp bench dissect`` times: one generated connection of many FPDUs.

One connection (MPA rev 2 with CRC) carrying a mix of Sends, RDMA Writes of varied sizes
(segmented at MULPDU into several FPDUs), Read Requests and Read Responses, recorded through
the capture-tap writer with an MSS of 1460 bytes.  The generator is seeded: the same
``fpdus`` and ``markers`` give the same file, which :func:`capture` reuses when a small
JSON note next to it says it holds that one.
"""

from __future__ import annotations

import json
import os
import random
from collections.abc import Callable

from stack.constants import MPA_MAX_PRIVATE_DATA
from stack.pcap import Direction, PcapWriter
from stack.wire.events import IrdOrd, MpaFrame, RdmaWrite, ReadRequest, ReadResponse, Send
from stack.wire.framing import FpduFramer, mulpdu_for
from stack.wire.mpa import encode_frame
from stack.wire.rdmap import encode_message

__all__ = ["PROGRESS_STEP", "capture", "generate"]

PROGRESS_STEP = 10_000
"""FPDUs between two calls of :func:`generate`'s ``progress``."""


def generate(
    path: str,
    fpdus: int,
    markers: bool = False,
    seed: int = 1,
    progress: Callable[[int], None] | None = None,
) -> int:
    """Write a capture with at least ``fpdus`` FPDUs; return the exact FPDU count.
    ``progress(n)`` is called with the FPDUs written since its last call, about every
    :data:`PROGRESS_STEP`."""
    rng = random.Random(seed)
    mss = 1460
    mulpdu = mulpdu_for(mss, markers)
    with PcapWriter(path) as writer:
        conn = writer.connection(("192.0.2.1", 40000), ("192.0.2.2", 4791), mss=mss)
        now = 0.0
        word = IrdOrd(16, 16)
        request = MpaFrame(reply=False, crc=True, markers=markers, rev=2, ird_ord=word)
        reply = MpaFrame(reply=True, crc=True, markers=markers, rev=2, ird_ord=word)
        conn.record(
            Direction.SENT, encode_frame(request, max_private_data=MPA_MAX_PRIVATE_DATA), now
        )
        conn.record(Direction.RECEIVED, encode_frame(reply), now)
        tx = FpduFramer(crc=True, markers=markers)
        rx = FpduFramer(crc=True, markers=markers)
        msn_send = msn_read = 1
        count = reported = 0
        to = 0
        while count < fpdus:
            if progress is not None and count - reported >= PROGRESS_STEP:
                progress(count - reported)
                reported = count
            now += 1e-5
            kind = rng.random()
            if kind < 0.45:
                msg = Send(bytes(rng.randrange(0, 256)))
                ulpdus = encode_message(msg, msn=msn_send, mulpdu=mulpdu)
                msn_send += 1
            elif kind < 0.85:
                size = rng.choice((64, 512, 1024, 4096, 8192))
                ulpdus = encode_message(RdmaWrite(0x100, to, bytes(size)), msn=None, mulpdu=mulpdu)
                to += size
            else:
                size = rng.choice((128, 2048))
                req = ReadRequest(0x200, 0x1000, size, 0x300, 0x2000)
                ulpdus = encode_message(req, msn=msn_read, mulpdu=mulpdu)
                msn_read += 1
                conn.record(Direction.SENT, b"".join(tx.frame(u) for u in ulpdus), now)
                count += len(ulpdus)
                resp = ReadResponse(0x200, 0x1000, bytes(size))
                ulpdus = encode_message(resp, msn=None, mulpdu=mulpdu)
                conn.record(Direction.RECEIVED, b"".join(rx.frame(u) for u in ulpdus), now)
                count += len(ulpdus)
                continue
            conn.record(Direction.SENT, b"".join(tx.frame(u) for u in ulpdus), now)
            count += len(ulpdus)
        conn.close(now)
    if progress is not None and count > reported:
        progress(count - reported)
    return count


def capture(
    path: str, fpdus: int, markers: bool, progress: Callable[[int], None] | None = None
) -> tuple[int, bool]:
    """Generate the capture at ``path`` (:func:`generate`), or reuse it when its note
    (``path + ".json"``) says it holds this one; (exact FPDU count, reused)."""
    note = path + ".json"
    wanted = {"fpdus": fpdus, "markers": markers, "seed": 1}
    if os.path.exists(path) and os.path.exists(note):
        with open(note, encoding="utf-8") as f:
            try:
                held = json.load(f)
            except ValueError:
                held = {}
        if not isinstance(held, dict):
            held = {}
        if {k: held.get(k) for k in wanted} == wanted and isinstance(held.get("count"), int):
            return held["count"], True
    count = generate(path, fpdus, markers, progress=progress)
    with open(note, "w", encoding="utf-8") as f:
        json.dump({**wanted, "count": count}, f)
    return count, False
