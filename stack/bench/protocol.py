"""What the benchmark's client and server say besides RDMA: MPA private data and raw TCP.

* The MPA Request's private data (:class:`SessionSpec`, JSON) says which test a QP runs;
  the Reply's (:class:`Advert`, JSON) advertises the target region and the raw-TCP port
  (private data is the ULP's, RFC 5044 §7.1).  The server registers at most
  :data:`MAX_SESSION_BYTES` for one QP and rejects a Request asking more (MPA-23); a
  Reject's private data is the reason, UTF-8 text (:func:`reject_data`), which the client
  prints (:func:`connect_error`).
* The server's second, raw-TCP port (and a third served by blocking sockets,
  :mod:`stack.bench.blocking`): a 16-byte header (:data:`RAW_HEADER`), then the
  mode's traffic.  ``RAW_SINK``: the client streams bytes and half-closes; the server
  answers with the byte count (u64).  ``RAW_REQRESP``: every ``request``-byte request is
  answered with ``size`` bytes.  ``RAW_STATS``: the server answers with a JSON object
  (rss, qps, pid, cpu_ns) and closes; ``size`` 1 asks it to collect garbage first.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass

import trio

from stack.bench.options import MAX_RX_DEPTH, MAX_SIZE, TESTS, BenchError
from stack.constants import ALL_ONES_32, ALL_ONES_64
from stack.errors import IwarpError
from stack.transport.cm import ConnectRejected
from stack.transport.sockopts import limit_unsent

MAX_SESSION_BYTES = 1 << 30
"""Registered memory the server gives one QP at most (:attr:`SessionSpec.memory`): a
~70-byte Request must not make it map gigabytes.  Every one-region test runs at the
client's largest size (``-s 1G``); Sends need two regions of ``size`` bytes and latency
one more (Send latency up to 341 MiB)."""
_PONG_FIELDS = (ALL_ONES_32, ALL_ONES_64, MAX_SIZE)
"""The largest rkey (an STag, 32 bits), tagged offset (64 bits, RFC 5040 §4) and length of a
pong region: a larger one would be refused at posting, in the middle of a session."""
MAX_REJECT_REASON = 200
"""Bytes of reason a Reject carries at most (private data is at most 512 bytes, MPA-21)."""


def reject_data(exc: BenchError) -> bytes:
    """The private data of the server's Reject of a Request (MPA-23): why, in UTF-8."""
    return str(exc).encode()[:MAX_REJECT_REASON]


def connect_error(where: str, exc: IwarpError) -> BenchError:
    """The client's error for a QP that did not connect to ``where``: for a Reject (MPA-24),
    the server's reason (its private data, :func:`reject_data`, shown printable)."""
    if isinstance(exc, ConnectRejected) and exc.private_data:
        text = bytes(exc.private_data).decode(errors="replace")
        reason = "".join(c if c.isprintable() else "\ufffd" for c in text)
        return BenchError(f"cannot connect to {where}: the server rejected the QP: {reason}")
    return BenchError(f"cannot connect to {where}: {exc}")


@dataclass(frozen=True, slots=True)
class SessionSpec:
    """What a client asks of the server for one QP (the MPA Request's private data, JSON).

    Fields: test (one of TESTS, or "idle": no memory at all); size; latency; rx_depth
    (receives to keep posted for Sends); pong (the client's region for Write-latency
    pongs: rkey, tagged offset, length).
    """

    test: str
    size: int
    latency: bool = False
    rx_depth: int = 0
    pong: tuple[int, int, int] | None = None

    def encode(self) -> bytes:
        obj: dict[str, object] = {"t": self.test, "s": self.size}
        if self.latency:
            obj["l"] = 1
        if self.rx_depth:
            obj["rx"] = self.rx_depth
        if self.pong is not None:
            obj["pong"] = list(self.pong)
        return json.dumps(obj, separators=(",", ":")).encode()

    @property
    def regions(self) -> tuple[str, ...]:
        """The server's regions for this QP, ``size`` bytes each: the advertised target, a
        source for latency answers (Write and Send), an inbox for Sends; none when idle."""
        if self.test == "idle":
            return ()
        source = ("source",) if self.latency and self.test in ("write", "send") else ()
        return ("target", *source, *(("inbox",) if self.test == "send" else ()))

    @property
    def memory(self) -> int:
        """Bytes of registered memory the server maps for this QP (at most MAX_SESSION_BYTES)."""
        return self.size * len(self.regions)

    @classmethod
    def decode(cls, data: bytes) -> SessionSpec:
        """Parse private data strictly: one JSON object, each field at most once, no field
        :meth:`encode` does not write, every value of its type and range (``l`` 0 or 1), a
        ``pong`` region given exactly for Write latency.
        Raises BenchError on anything else or on asking more memory than
        MAX_SESSION_BYTES (the server rejects the Request with it, MPA-23)."""
        try:
            obj = json.loads(data, object_pairs_hook=_unique_fields)
            if type(obj) is not dict:
                raise ValueError("not a JSON object")
            unknown = sorted(set(obj) - _SPEC_FIELDS)
            if unknown:
                raise ValueError(f"unknown field {unknown[0]!r}")
            missing = [key for key in ("t", "s") if key not in obj]
            if missing:
                raise ValueError(f"missing field {missing[0]!r}")
            test, size = obj["t"], obj["s"]
            latency = obj.get("l", 0)
            rx_depth = obj.get("rx", 0)
            pong = obj.get("pong")
            if type(test) is not str or test not in (*TESTS, "idle"):
                raise ValueError(f"unknown test {test!r}")
            if type(size) is not int or not 0 <= size <= MAX_SIZE:
                raise ValueError(f"bad size {size!r}")
            if type(latency) is not int or latency not in (0, 1):
                raise ValueError(f"bad latency flag {latency!r} (0 or 1)")
            if type(rx_depth) is not int or not 0 <= rx_depth <= MAX_RX_DEPTH:
                raise ValueError(f"bad rx depth {rx_depth!r}")
            if "pong" in obj:
                if (
                    type(pong) is not list
                    or len(pong) != 3
                    or not all(
                        type(v) is int and 0 <= v <= top
                        for v, top in zip(pong, _PONG_FIELDS, strict=True)
                    )
                ):
                    raise ValueError(f"bad pong region {pong!r}")
                pong = (pong[0], pong[1], pong[2])
            pongs = test == "write" and latency == 1
            if pongs != (pong is not None):
                raise ValueError(
                    "a Write-latency session needs its pong region"
                    if pongs
                    else f"a pong region for a {test} {'latency' if latency else 'bandwidth'}"
                    " session (only Write latency takes one)"
                )
        except (ValueError, TypeError, RecursionError) as exc:
            raise BenchError(f"bad session request: {exc}") from None
        spec = cls(test, size, bool(latency), rx_depth, pong)
        if spec.memory > MAX_SESSION_BYTES:
            raise BenchError(
                f"session request too large: {spec.memory} bytes of registered memory, "
                f"the server's limit is {MAX_SESSION_BYTES}"
            )
        return spec


_SPEC_FIELDS = frozenset(("t", "s", "l", "rx", "pong"))
"""The fields of a :class:`SessionSpec` on the wire (:meth:`SessionSpec.encode`)."""


def _unique_fields(pairs: list[tuple[str, object]]) -> dict[str, object]:
    """A JSON object's fields, refusing one given twice (``json`` keeps the last)."""
    obj: dict[str, object] = {}
    for key, value in pairs:
        if key in obj:
            raise ValueError(f"field {key!r} given twice")
        obj[key] = value
    return obj


@dataclass(frozen=True, slots=True)
class Advert:
    """The server's Reply private data: target region (rkey, TO, length) and baseline ports.

    ``raw_port`` serves the trio baseline, ``blocking_port`` (0: none) the blocking one,
    ``iwarp_blocking_port`` (0: none) iWARP sessions on the blocking driver (``--blocking``).
    """

    rkey: int
    addr: int
    length: int
    raw_port: int
    blocking_port: int = 0
    iwarp_blocking_port: int = 0

    def encode(self) -> bytes:
        obj = {"rkey": self.rkey, "addr": self.addr, "len": self.length, "raw": self.raw_port}
        if self.blocking_port:
            obj["blk"] = self.blocking_port
        if self.iwarp_blocking_port:
            obj["biw"] = self.iwarp_blocking_port
        return json.dumps(obj, separators=(",", ":")).encode()

    @classmethod
    def decode(cls, data: bytes) -> Advert:
        try:
            obj = json.loads(data)
            return cls(
                int(obj["rkey"]),
                int(obj["addr"]),
                int(obj["len"]),
                int(obj["raw"]),
                int(obj.get("blk", 0)),
                int(obj.get("biw", 0)),
            )
        except (ValueError, KeyError, TypeError) as exc:
            raise BenchError(f"server sent a malformed advertisement: {exc}") from None


RAW_HEADER = struct.Struct(">4sBxxxII")
"""magic, mode, 3 pad bytes, size, request."""
RAW_MAGIC = b"IWBR"
RAW_SINK, RAW_REQRESP, RAW_STATS = 1, 2, 3
RAW_COUNT = struct.Struct(">Q")
"""The sink's answer: bytes received (u64)."""
RAW_REQUEST = 16
"""Bytes of a raw-TCP baseline request (an RDMA Read Request FPDU is 52: the length field, the
18-octet untagged DDP header, 28 octets of RDMAP and the CRC)."""


async def receive_exactly(stream: trio.abc.ReceiveStream, count: int) -> bytearray:
    """``count`` bytes from ``stream``; BenchError when it ends first."""
    buf = bytearray()
    while len(buf) < count:
        data = await stream.receive_some(count - len(buf))
        if not data:
            raise BenchError("raw TCP peer closed early")
        buf += data
    return buf


async def open_raw(
    host: str, port: int, mode: int, size: int = 0, request: int = 0
) -> trio.SocketStream:
    """Connect to the server's raw-TCP port and send the header of ``mode``."""
    try:
        stream = await trio.open_tcp_stream(host, port)
    except OSError as exc:
        raise BenchError(f"cannot reach the raw-TCP port {host}:{port}: {exc}") from None
    limit_unsent(stream)  # as the iWARP driver does with its sockets
    await stream.send_all(RAW_HEADER.pack(RAW_MAGIC, mode, size, request))
    return stream
