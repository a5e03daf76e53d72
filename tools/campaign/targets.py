"""The decoders under fuzzing: how each one is run, and which errors it documents.

A :class:`Target` runs one input to an *outcome* (a plain, comparable value: the events or
records it produced and the error it stopped with).  ``allowed`` are the documented error
types (:class:`~stack.errors.ProtocolError` and its subclasses such as ``DecodeError``,
``MpaError``, :class:`~kbtp.messages.KbtpError`; :class:`~stack.pcap.CaptureError` for the
capture reader); anything else escaping is a crash.  A target with ``chunked`` set takes
its input as a byte stream: it runs again with the stream cut at random points and the
outcome must be the same (the engines are deterministic).
"""

from __future__ import annotations

import dataclasses
import enum
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from kbtp.describe import describe_payload
from kbtp.messages import KbtpError, decode_message
from kbtp.scapy_layers import KBTP
from stack.dissect.decoder import DissectOptions, dissect
from stack.dissect.scapy import MPA_FPDU
from stack.errors import DecodeError, ProtocolError
from stack.pcap import CaptureError, CaptureReader
from stack.wire import ddp
from stack.wire.connection import IwarpConnection
from stack.wire.events import ConnectionFailed, NeedData, RequestReceived, Role
from stack.wire.framing import FpduDeframer
from stack.wire.rdmap import decode_ulpdu
from stack.wire.stream import RdmapStream
from stack.wire.terminate import decode_terminate
from tools.campaign import seeds

Chunks = Sequence[bytes]


class Invariant(AssertionError):
    """A decoder broke one of its own promises (not an exception type it documents)."""


def plain(value: Any) -> Any:
    """A comparable, printable form of an event, record or error."""
    if isinstance(value, memoryview | bytearray):
        return bytes(value)
    if isinstance(value, ProtocolError):
        return (type(value).__name__, value.rule, value.term)  # the detail text may quote
    if isinstance(value, BaseException):  # what has arrived so far; the rule may not
        return (type(value).__name__, str(value))
    if isinstance(value, enum.Enum):
        return value
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return (type(value).__name__,) + tuple(
            plain(getattr(value, f.name)) for f in dataclasses.fields(value)
        )
    if isinstance(value, list | tuple):
        return tuple(plain(v) for v in value)
    return value


def split(data: bytes, cuts: Sequence[int]) -> list[bytes]:
    """``data`` cut at the sorted positions ``cuts`` (empty pieces dropped)."""
    out, last = [], 0
    for cut in cuts:
        if last < cut < len(data):
            out.append(data[last:cut])
            last = cut
    out.append(data[last:])
    return [c for c in out if c]


# -- stream engines ----------------------------------------------------------------------


def _run_engine(role: Role, data: bytes, chunks: Chunks) -> Any:
    settings = seeds.ENGINE_SETTINGS[data[0] % len(seeds.ENGINE_SETTINGS)] if data else None
    conn = IwarpConnection(role, settings)
    if role is Role.RESPONDER:
        conn.start(0.0)
    else:
        conn.initiate(0.0, b"private")
    conn.data_to_send()
    events: list[Any] = []

    def drain() -> bool:
        """Events so far; False once the connection is over (the driver would close)."""
        while True:
            try:
                event = conn.next_event()
            except ProtocolError as exc:
                events.append(plain(exc))
                return False
            if isinstance(event, NeedData):
                return True
            events.append(plain(event))
            if isinstance(event, RequestReceived):
                conn.accept(b"reply")
            elif isinstance(event, ConnectionFailed) and event.close:
                return False

    going = True
    for chunk in chunks:
        conn.receive_data(chunk)
        conn.data_to_send()
        if not (going := drain()):
            break
    if going:
        conn.receive_data(b"")
        drain()
    return tuple(events)


def run_responder(data: bytes, chunks: Chunks) -> Any:
    return _run_engine(Role.RESPONDER, data, chunks)


def run_initiator(data: bytes, chunks: Chunks) -> Any:
    return _run_engine(Role.INITIATOR, data, chunks)


def run_deframer(data: bytes, chunks: Chunks) -> Any:
    crc, markers, offset = (
        seeds.FRAMER_OPTIONS[data[0] % len(seeds.FRAMER_OPTIONS)] if data else (True, False, 0)
    )
    rx = FpduDeframer(crc=crc, markers=markers, offset=offset)
    got: list[Any] = []
    for chunk in chunks:
        rx.feed(chunk)
        try:
            for ulpdu in rx:
                got.append(bytes(ulpdu))
        except ProtocolError as exc:
            got.append(plain(exc))
            break
    return tuple(got), rx.offset if rx.error is None else None


# -- message decoders --------------------------------------------------------------------


def run_ulpdu(data: bytes, chunks: Chunks) -> Any:
    """Every DDP/RDMAP decoder over one ULPDU: strict and lenient, both layouts."""
    out: list[Any] = []
    for rfc7306 in (True, False):
        for siw in (None, True, False):
            try:
                seg = decode_ulpdu(data, rfc7306=rfc7306, siw_layout=siw)
                if seg.ulpdu_len != len(data):
                    raise Invariant("strict decode_ulpdu: ulpdu_len differs from the input")
                out.append(type(seg.header).__name__)
            except ProtocolError as exc:
                out.append(exc.rule)
            try:
                lenient = decode_ulpdu(data, strict=False, rfc7306=rfc7306, siw_layout=siw)
            except DecodeError:
                continue
            if lenient.payload.nbytes > len(data):
                raise Invariant("lenient decode_ulpdu: payload longer than the input")
            try:
                decode_terminate(data, siw_layout=siw)
            except DecodeError:
                pass
    try:
        ddp.parse_header(data)
    except DecodeError:
        pass
    return tuple(out)


def run_rdmap_stream(data: bytes, chunks: Chunks) -> Any:
    """A receiving RdmapStream over length-prefixed ULPDUs; each error gets its Terminate."""
    rx = RdmapStream(1442, rfc7306=bool(data[:1]) and data[0] & 1 == 0)
    pos = 0
    out: list[Any] = []
    while pos + 2 <= len(data):
        (n,) = struct.unpack_from(">H", data, pos)
        ulpdu = data[pos + 2 : pos + 2 + n]
        pos += 2 + n
        try:
            out.append(len(rx.receive_ulpdu(ulpdu)))
        except ProtocolError as exc:
            out.append(exc.rule)
            term = rx.terminate_message(exc, ulpdu)
            RdmapStream(128).send(term)
    return tuple(out)


def run_kbtp(data: bytes, chunks: Chunks) -> Any:
    """decode_message (KbtpError only); a decoded message re-encodes to one that decodes
    the same; describe_payload never raises (kbtp.describe)."""
    summary = describe_payload(data)
    if summary is not None:
        summary.json_fields()
        summary.tree_lines()
    try:
        message = decode_message(data)
    except KbtpError as exc:
        return exc.rule, exc.status
    if decode_message(message.encode()) != message:
        raise Invariant("KBTP message does not survive encode/decode")
    return type(message).__name__


# -- captures -----------------------------------------------------------------------------


class _Trickle:
    """A binary stream handing out the capture in the given pieces (one per read)."""

    def __init__(self, chunks: Chunks) -> None:
        self._chunks = list(chunks)
        self._i = 0
        self._pos = 0

    def readinto(self, view: memoryview) -> int:
        if self._i >= len(self._chunks):
            return 0
        chunk = self._chunks[self._i]
        n = min(len(view), len(chunk) - self._pos)
        view[:n] = chunk[self._pos : self._pos + n]
        self._pos += n
        if self._pos == len(chunk):
            self._i += 1
            self._pos = 0
        return n


def run_pcap(data: bytes, chunks: Chunks) -> Any:
    got: list[Any] = []
    source: Any = data if len(chunks) <= 1 else _Trickle(chunks)
    try:
        for s in CaptureReader(source):
            got.append((s.frame, s.src, s.sport, s.seq, s.flags, bytes(s.payload), s.missing))
    except CaptureError as exc:
        got.append((type(exc).__name__, exc.message))
    return tuple(got)


def run_dissect(data: bytes, chunks: Chunks) -> Any:
    """The capture decoder over whatever TCP segments the (mutated) capture holds."""
    segments = []
    try:
        segments = list(CaptureReader(data))
    except CaptureError:
        pass
    count = 0
    for options in (DissectOptions(), DissectOptions(mid_stream=True, crc=False)):
        for _ in dissect(segments, options):
            count += 1
    return count


def run_scapy(data: bytes, chunks: Chunks) -> Any:
    """The Scapy layers dissect leniently (DecodeError only from ``strict``)."""
    pkt = MPA_FPDU(data)
    pkt.summary()
    try:
        MPA_FPDU.strict(data)
    except DecodeError:
        pass
    return bytes(pkt) == data


def run_kbtp_scapy(data: bytes, chunks: Chunks) -> Any:
    """The KBTP Scapy layers: a truncated layer raises KbtpError (kbtp.scapy_layers); what
    dissects rebuilds to the same octets."""
    pkt = KBTP(data)
    pkt.summary()
    if data and bytes(pkt) != data:
        raise Invariant("KBTP layer does not rebuild the octets it dissected")
    return pkt.summary()


@dataclass
class Target:
    """One decoder: its runner, seed builder, documented errors and weight in the budget."""

    name: str
    run: Callable[[bytes, Chunks], Any]
    make_seeds: Callable[[], list[bytes]]
    allowed: tuple[type[BaseException], ...]
    chunked: bool = False
    config_octet: bool = False
    weight: float = 1.0
    max_len: int = 4096
    seeds: list[bytes] = field(default_factory=list)


def all_targets() -> list[Target]:
    """Every decoder of the campaign, in run order."""
    from pathlib import Path

    pcaps = Path(__file__).resolve().parents[2] / "pcaps"
    return [
        Target(
            "mpa-responder",
            run_responder,
            lambda: seeds.engine_seeds(Role.RESPONDER),
            (ProtocolError,),
            chunked=True,
            config_octet=True,
            weight=2.0,
        ),
        Target(
            "mpa-initiator",
            run_initiator,
            lambda: seeds.engine_seeds(Role.INITIATOR),
            (ProtocolError,),
            chunked=True,
            config_octet=True,
            weight=1.5,
        ),
        Target(
            "fpdu-deframer",
            run_deframer,
            seeds.framer_seeds,
            (ProtocolError,),
            chunked=True,
            config_octet=True,
            weight=2.0,
        ),
        Target(
            "ddp-rdmap", run_ulpdu, seeds.ulpdu_seeds, (ProtocolError,), weight=2.0, max_len=512
        ),
        Target(
            "rdmap-stream",
            run_rdmap_stream,
            seeds.ulpdu_sequence_seeds,
            (ProtocolError,),
            weight=1.0,
        ),
        Target("kbtp-messages", run_kbtp, seeds.kbtp_seeds, (KbtpError,), weight=2.0, max_len=512),
        Target(
            "pcap-reader",
            run_pcap,
            lambda: seeds.pcap_seeds(pcaps),
            (CaptureError,),
            chunked=True,
            weight=0.6,
            max_len=16384,
        ),
        Target(
            "dissect", run_dissect, lambda: seeds.pcap_seeds(pcaps), (), weight=0.06, max_len=16384
        ),
        Target("scapy-fpdu", run_scapy, seeds.ulpdu_framed_seeds, (), weight=0.06, max_len=2048),
        Target(
            "kbtp-scapy", run_kbtp_scapy, seeds.kbtp_seeds, (KbtpError,), weight=0.08, max_len=512
        ),
    ]
