"""Streaming pcap / pcapng reader: frames and TCP segments as the bytes arrive.

Theory of operation: a capture is read through a window (a chunk of 1 MiB plus the start
of the record it cut, or one record when that is longer) that refills from the source
(:mod:`stack.pcap.source`), so a file, a pipe or standard input (``-``) of any size is
decoded in bounded memory and the first records come out before the input ends.  Each
record is walked with ``struct.unpack_from`` and becomes a
:class:`~stack.pcap.packet.Frame` (the link-layer bytes as a zero-copy ``memoryview`` of
the window; a window is never reused, so every view stays valid), or, for
:class:`CaptureReader`'s iteration, directly a :class:`~stack.pcap.packet.TcpSegment`
(the common Ethernet/IPv4/TCP case is parsed inline, every other frame goes through
:func:`~stack.pcap.packet.parse_tcp`), or, for :meth:`CaptureReader.lean`, the same as a
plain :data:`~stack.pcap.packet.LeanSegment` tuple (the decoder's bulk path).  Bytes,
bytearray and memoryview inputs are read in place.

Errors: an unreadable or unknown file raises :class:`CaptureError` before anything is
yielded; a file cut short raises :class:`TruncatedCapture` *after* every complete record
has been yielded, so callers can report what was decoded and then the one-line error.
A length field larger than :data:`~stack.pcap.format.MAX_RECORD_LEN` is corruption,
never a reason to buffer more.  Every error names the file (``source``) when it has one.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Callable, Iterator
from typing import Literal, NamedTuple, overload

from stack.pcap.errors import CaptureError, TruncatedCapture
from stack.pcap.format import (
    IPPROTO_TCP,
    LINKTYPE_ETHERNET,
    LINKTYPE_MASK,
    MAX_RECORD_LEN,
    MAXIMUM_SNAPLEN,
    PCAP_FILE_HEADER_LEN,
    PCAP_MAGIC_NS,
    PCAP_MAGIC_US,
    PCAP_RECORD_HEADER_LEN,
    PCAPNG_BLOCK_MIN_LEN,
    PCAPNG_EPB,
    PCAPNG_IDB,
    PCAPNG_OPT_END,
    PCAPNG_OPT_TSRESOL,
    PCAPNG_PB,
    PCAPNG_SHB,
    PCAPNG_SPB,
    SUPPORTED_LINKTYPES,
)
from stack.pcap.packet import (
    ETH_IPV4_HEAD,
    ETH_IPV4_TCP,
    ETH_IPV4_TCP_OFFSET,
    IPV4_FRAGMENT_PROTO_MASK,
    CaptureStats,
    Frame,
    LeanSegment,
    SegmentKey,
    TcpSegment,
    address,
    lean_segment,
    parse_tcp,
)
from stack.pcap.source import CaptureInput, Source, open_capture


def capture_format(head: bytes | bytearray | memoryview) -> str:
    """'pcap' or 'pcapng' from the first bytes; :class:`CaptureError` otherwise."""
    if len(head) < 4:
        raise CaptureError("not a pcap or pcapng file (too short)")
    magic = bytes(head[:4])
    if int.from_bytes(magic, "little") == PCAPNG_SHB:
        return "pcapng"
    if int.from_bytes(magic, "big") in (PCAP_MAGIC_US, PCAP_MAGIC_NS) or int.from_bytes(
        magic, "little"
    ) in (PCAP_MAGIC_US, PCAP_MAGIC_NS):
        return "pcap"
    if magic[:2] == b"\x1f\x8b":
        raise CaptureError("compressed (gzip) capture: decompress it first")
    raise CaptureError("not a pcap or pcapng file (unknown magic number)")


def _pcap_header(buf: memoryview) -> tuple[struct.Struct, float, int, int]:
    """(record header Struct, timestamp scale, link type, record size limit) of a pcap."""
    if len(buf) < PCAP_FILE_HEADER_LEN:
        raise CaptureError("pcap file header is truncated")
    magic_be = int.from_bytes(buf[:4], "big")
    endian = ">" if magic_be in (PCAP_MAGIC_US, PCAP_MAGIC_NS) else "<"
    magic = magic_be if endian == ">" else int.from_bytes(buf[:4], "little")
    scale = 1e-9 if magic == PCAP_MAGIC_NS else 1e-6
    major, _minor, _zone, _sigfigs, snaplen, network = struct.unpack_from(endian + "HHiIII", buf, 4)
    if major != 2:
        raise CaptureError(f"unsupported pcap version {major}")
    linktype = network & LINKTYPE_MASK
    if linktype not in SUPPORTED_LINKTYPES:
        raise CaptureError(f"unsupported link-layer type {linktype}")
    limit = min(max(snaplen, MAXIMUM_SNAPLEN), MAX_RECORD_LEN)
    return struct.Struct(endian + "IIII"), scale, linktype, limit


Form = Literal["frames", "segments", "lean"]
"""What a walk yields: every Frame, or the TcpSegments in them, or LeanSegment tuples."""


@overload
def _walk_pcap(
    inp: CaptureInput, stats: CaptureStats, form: Literal["frames"], records: bool = False
) -> Iterator[Frame]: ...
@overload
def _walk_pcap(
    inp: CaptureInput, stats: CaptureStats, form: Literal["segments"], records: bool = False
) -> Iterator[TcpSegment]: ...
@overload
def _walk_pcap(
    inp: CaptureInput, stats: CaptureStats, form: Literal["lean"], records: bool = False
) -> Iterator[LeanSegment]: ...
def _walk_pcap(
    inp: CaptureInput, stats: CaptureStats, form: Form, records: bool = False
) -> Iterator[Frame | TcpSegment | LeanSegment]:
    """The records of a pcap: Frames, or the TCP segments in them (``form``).

    Segments of Ethernet/IPv4 (no options)/TCP frames are parsed inline, every other
    frame goes through :func:`parse_tcp` (the tests compare both paths).  ``records``
    fills each Frame's ``record``.  Closes ``inp`` at the end.
    """
    refill = inp.refill
    number = tcp_count = 0
    frames = form == "frames"
    lean = form == "lean"
    try:
        buf = inp.window
        if len(buf) < PCAP_FILE_HEADER_LEN:
            buf = refill(buf, 0, PCAP_FILE_HEADER_LEN)
        record, scale, linktype, limit = _pcap_header(buf)
        read_record = record.unpack_from
        unpack = ETH_IPV4_TCP.unpack_from
        need = ETH_IPV4_TCP.size
        inline = linktype == LINKTYPE_ETHERNET and not frames
        keys: dict[tuple[int, int, int, int], SegmentKey] = {}
        last_src = last_dst = last_sport = last_dport = -1  # those of key
        key: SegmentKey = ("", 0, "", 0)
        stats.linktypes.add(linktype)
        size = len(buf)
        offset = PCAP_FILE_HEADER_LEN
        while True:
            if offset + 16 > size:
                buf = refill(buf, offset, PCAP_RECORD_HEADER_LEN)
                offset = 0
                size = len(buf)
                if size < 16:
                    if size:
                        raise TruncatedCapture(
                            f"file is cut short in the record header of frame {number + 1} "
                            f"({size} of 16 bytes present)"
                        )
                    return
            ts_sec, ts_frac, incl_len, orig_len = read_record(buf, offset)
            data_at = offset + 16
            end_at = data_at + incl_len
            if incl_len > limit:
                raise CaptureError(
                    f"corrupt record for frame {number + 1}: captured length {incl_len} "
                    f"exceeds the limit {limit}"
                )
            if end_at > size:
                buf = refill(buf, offset, PCAP_RECORD_HEADER_LEN + incl_len)
                offset = 0
                size = len(buf)
                data_at = 16
                end_at = data_at + incl_len
                if end_at > size:
                    raise TruncatedCapture(
                        f"file is cut short in the middle of frame {number + 1} "
                        f"({size - data_at} of {incl_len} bytes present)"
                    )
            number += 1
            offset = end_at
            if inline and incl_len >= need:
                (head, total, fragproto, src, dst, sport, dport, seq, ack, off,
                 flags) = unpack(buf, data_at)  # fmt: skip
                if (
                    head >> 8 == ETH_IPV4_HEAD
                    and fragproto & IPV4_FRAGMENT_PROTO_MASK == IPPROTO_TCP
                    and total >= 40
                ):
                    hlen = (off >> 4) * 4
                    ip_end = 14 + total
                    start = ETH_IPV4_TCP_OFFSET + hlen
                    end = ip_end if ip_end <= incl_len else incl_len
                    if hlen >= 20 and start <= end:
                        tcp_count += 1
                        if (
                            sport != last_sport
                            or dport != last_dport
                            or src != last_src
                            or dst != last_dst
                        ):  # mostly the direction of the frame before: the same key object
                            key = _key(keys, src, sport, dst, dport)
                            last_src, last_sport, last_dst, last_dport = src, sport, dst, dport
                        if lean:
                            yield (number, ts_sec + ts_frac * scale, key, seq, ack, flags,
                                   buf[data_at + start : data_at + end], ip_end - end)  # fmt: skip
                            continue
                        yield TcpSegment(
                            number,
                            ts_sec + ts_frac * scale,
                            key[0],
                            key[2],
                            sport,
                            dport,
                            seq,
                            ack,
                            flags,
                            buf[data_at + start : data_at + end],
                            ip_end - end,
                        )
                        continue
            frame = Frame(
                number,
                ts_sec + ts_frac * scale,
                linktype,
                buf[data_at:end_at],
                max(orig_len, incl_len),
            )
            if frames:
                if records:
                    frame.record = buf[data_at - PCAP_RECORD_HEADER_LEN : end_at]
                yield frame
                continue
            segment = parse_tcp(frame, stats)
            if segment is not None:
                yield lean_segment(segment) if lean else segment
    except CaptureError as exc:
        raise exc.named(inp.name) from None
    finally:
        stats.frames += number
        stats.tcp += tcp_count
        inp.close()


def _key(
    keys: dict[tuple[int, int, int, int], SegmentKey], src: int, sport: int, dst: int, dport: int
) -> SegmentKey:
    """The :data:`SegmentKey` of IPv4 addresses and ports, one object per direction."""
    key = keys.get((src, sport, dst, dport))
    if key is None:
        if len(keys) >= 65536:
            keys.clear()
        key = (address(src.to_bytes(4, "big")), sport, address(dst.to_bytes(4, "big")), dport)
        keys[(src, sport, dst, dport)] = key
    return key


class _Layout(NamedTuple):
    """The Structs of one pcapng section's byte order."""

    u32: struct.Struct
    idb: struct.Struct  # linktype, reserved, snaplen
    epb: struct.Struct  # interface, timestamp high, low, captured length, original length
    pb: struct.Struct  # interface, drops, timestamp high, low, captured, original length
    option: struct.Struct  # code, length


def _layout(endian: str) -> _Layout:
    return _Layout(*(struct.Struct(endian + f) for f in ("I", "HHI", "IIIII", "HHIIII", "HH")))


_LITTLE, _BIG = _layout("<"), _layout(">")


def _walk_pcapng(inp: CaptureInput, records: bool = False) -> Iterator[Frame]:
    """Every packet of a pcapng capture (EPB, SPB, obsolete PB); closes ``inp`` at the end."""
    refill = inp.refill
    buf = inp.window
    size = len(buf)
    offset = 0
    number = 0
    layout = _LITTLE
    interfaces: list[tuple[int, float]] = []  # (linktype, seconds per timestamp unit)
    try:
        while True:
            if offset + PCAPNG_BLOCK_MIN_LEN > size:
                buf = refill(buf, offset, PCAPNG_BLOCK_MIN_LEN)
                offset = 0
                size = len(buf)
                if size < PCAPNG_BLOCK_MIN_LEN:
                    if size:
                        raise TruncatedCapture(
                            f"file is cut short in a block header at byte {inp.base}"
                        )
                    return
            block_type = int.from_bytes(buf[offset : offset + 4], "little")
            if block_type == PCAPNG_SHB:
                bom = bytes(buf[offset + 8 : offset + 12])
                if bom == b"\x4d\x3c\x2b\x1a":
                    layout = _LITTLE
                elif bom == b"\x1a\x2b\x3c\x4d":
                    layout = _BIG
                else:
                    raise CaptureError(f"corrupt pcapng section header at byte {inp.base + offset}")
                interfaces = []
            else:
                (block_type,) = layout.u32.unpack_from(buf, offset)
            (block_len,) = layout.u32.unpack_from(buf, offset + 4)
            if block_len < PCAPNG_BLOCK_MIN_LEN or block_len % 4:
                raise CaptureError(
                    f"corrupt pcapng block at byte {inp.base + offset} (length {block_len})"
                )
            if block_len > MAX_RECORD_LEN:
                raise CaptureError(
                    f"corrupt pcapng block at byte {inp.base + offset}: length {block_len} "
                    f"exceeds the limit {MAX_RECORD_LEN}"
                )
            end = offset + block_len
            if end > size:
                buf = refill(buf, offset, block_len)
                offset = 0
                size = len(buf)
                end = block_len
                if end > size:
                    raise TruncatedCapture(
                        f"file is cut short in a block at byte {inp.base} "
                        f"({size} of {block_len} bytes present)"
                    )
            body = offset + 8
            body_end = end - 4
            if block_type == PCAPNG_IDB:
                if body + 8 > body_end:
                    raise CaptureError(
                        f"corrupt pcapng interface block at byte {inp.base + offset}"
                    )
                linktype, _reserved, _snaplen = layout.idb.unpack_from(buf, body)
                interfaces.append((linktype, _tsresol(buf, body + 8, body_end, layout)))
            elif block_type in (PCAPNG_EPB, PCAPNG_PB, PCAPNG_SPB):
                number += 1
                frame = _packet(buf, block_type, body, body_end, layout, interfaces, number)
                if records:
                    frame.record = buf[offset:end]
                yield frame
            offset = end
    except CaptureError as exc:
        raise exc.named(inp.name) from None
    finally:
        inp.close()


def _tsresol(buf: memoryview, pos: int, end: int, layout: _Layout) -> float:
    """Seconds per timestamp unit of an interface (its if_tsresol option; default 1 us)."""
    scale = 1e-6
    while pos + 4 <= end:
        code, length = layout.option.unpack_from(buf, pos)
        pos += 4
        if code == PCAPNG_OPT_END:
            break
        if code == PCAPNG_OPT_TSRESOL and length >= 1 and pos < end:
            value = buf[pos]
            scale = 2.0 ** -(value & 0x7F) if value & 0x80 else 10.0 ** -(value & 0x7F)
        pos += (length + 3) & ~3
    return scale


def _packet(
    buf: memoryview,
    block_type: int,
    body: int,
    body_end: int,
    layout: _Layout,
    interfaces: list[tuple[int, float]],
    number: int,
) -> Frame:
    if block_type == PCAPNG_SPB:
        if not interfaces or body + 4 > body_end:
            raise CaptureError(f"corrupt simple packet block (frame {number})")
        (orig_len,) = layout.u32.unpack_from(buf, body)
        data = buf[body + 4 : min(body + 4 + orig_len, body_end)]
        return Frame(number, 0.0, interfaces[0][0], data, orig_len)
    if body + 20 > body_end:
        raise CaptureError(f"corrupt packet block (frame {number})")
    if block_type == PCAPNG_EPB:
        iface, ts_hi, ts_lo, cap_len, orig_len = layout.epb.unpack_from(buf, body)
    else:
        iface, _drops, ts_hi, ts_lo, cap_len, orig_len = layout.pb.unpack_from(buf, body)
    start = body + 20
    if iface >= len(interfaces):
        raise CaptureError(f"frame {number} refers to undefined interface {iface}")
    if start + cap_len > body_end:
        raise CaptureError(f"corrupt packet block (frame {number}): data exceeds the block")
    linktype, scale = interfaces[iface]
    return Frame(
        number,
        ((ts_hi << 32) | ts_lo) * scale,
        linktype,
        buf[start : start + cap_len],
        max(orig_len, cap_len),
    )


class CaptureReader:
    """Iterate the TCP segments of a capture: a path (``-``: stdin), a binary file, bytes.

    Attributes: name (the file's, None for bytes), format ('pcap' or 'pcapng'), stats
    (:class:`CaptureStats`, filled while iterating), max_buffer (the largest window read
    so far, bytes).  Iterating raises :class:`TruncatedCapture` at a cut-short end and
    :class:`CaptureError` at a corrupt record, after every good segment before it.  A path
    or bytes can be iterated again; a stream (pipe, stdin, file object) once.  ``on_wait``
    runs before each read that may block (pipes), e.g. to flush output decoded so far.
    """

    def __init__(self, source: Source, *, on_wait: Callable[[], object] | None = None) -> None:
        self._source = source
        self._on_wait = on_wait
        self._input: CaptureInput | None = None
        self._inputs: list[CaptureInput] = []  # the passes not yet closed
        self._peak = 0  # max_buffer of the passes already closed
        self.stats = CaptureStats()
        self.name: str | None = None
        self.format = self._open()

    def _open(self) -> str:
        inp = open_capture(self._source, self._on_wait)
        self.name = inp.name
        try:
            form = capture_format(inp.window)
        except CaptureError as exc:
            inp.close()
            raise exc.named(inp.name) from None
        self._input = inp
        self._peak = self.max_buffer
        self._inputs = [i for i in self._inputs if not i.closed] + [inp]
        return form

    def _take(self) -> CaptureInput:
        """The opened input, or the source opened again for another pass."""
        if self._input is None:
            source = self._source
            again = isinstance(source, bytes | bytearray | memoryview) or (
                isinstance(source, str | os.PathLike) and os.fspath(source) != "-"
            )
            if not again:
                raise CaptureError("a stream can be read only once", self.name)
            self.format = self._open()
        inp = self._input
        assert inp is not None
        self._input = None
        return inp

    @property
    def max_buffer(self) -> int:
        """The largest window any pass allocated so far (bytes; 0 for in-memory input)."""
        return max([self._peak, *(inp.peak for inp in self._inputs)])

    def frames(self) -> Iterator[Frame]:
        """Every record, TCP or not."""
        return _frames(self._take(), self.format)

    def __iter__(self) -> Iterator[TcpSegment]:
        inp = self._take()
        if self.format == "pcap":
            return _walk_pcap(inp, self.stats, "segments")
        return self._segments(inp)

    def lean(self) -> Iterator[LeanSegment]:
        """The TCP segments as :data:`~stack.pcap.packet.LeanSegment` tuples (as iterating)."""
        inp = self._take()
        if self.format == "pcap":
            return _walk_pcap(inp, self.stats, "lean")
        return self._lean(inp)

    def _segments(self, inp: CaptureInput) -> Iterator[TcpSegment]:
        stats = self.stats
        for frame in _walk_pcapng(inp):
            stats.frames += 1
            stats.linktypes.add(frame.linktype)
            segment = parse_tcp(frame, stats)
            if segment is not None:
                yield segment

    def _lean(self, inp: CaptureInput) -> Iterator[LeanSegment]:
        keys: dict[SegmentKey, SegmentKey] = {}  # one key object per direction
        for seg in self._segments(inp):
            key = (seg.src, seg.sport, seg.dst, seg.dport)
            same = keys.get(key)
            if same is None:
                if len(keys) >= 65536:
                    keys.clear()
                same = keys[key] = key
            yield lean_segment(seg, same)

    def close(self) -> None:
        """Close the file (a file object passed in is left open); iteration then stops."""
        for inp in self._inputs:
            inp.close()

    def __enter__(self) -> CaptureReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        inp = getattr(self, "_input", None)
        if inp is not None:  # opened, never iterated; running iterations close their own
            inp.close()


def _frames(inp: CaptureInput, form: str, records: bool = False) -> Iterator[Frame]:
    if form == "pcap":
        return _walk_pcap(inp, CaptureStats(), "frames", records=records)
    return _walk_pcapng(inp, records)


def iter_frames(source: Source) -> Iterator[Frame]:
    """Every record of a pcap or pcapng capture (:class:`CaptureError` first if it is none)."""
    return CaptureReader(source).frames()


def read_tcp_segments(source: Source) -> list[TcpSegment]:
    """All TCP segments of a capture (convenience for tests and small files)."""
    with CaptureReader(source) as reader:
        return list(reader)


def copy_capture(
    source: Source, target: str | os.PathLike[str], keep: Callable[[Frame], bool]
) -> int:
    """Copy the file header and the records ``keep`` accepts of a classic pcap, byte for byte.

    ``keep`` sees each Frame with its ``record``.  Returns the number of records kept;
    when anything fails (a :class:`CaptureError`, ``keep`` raising) the partial ``target``
    is removed.
    """
    reader = CaptureReader(source)
    inp = reader._take()
    if reader.format != "pcap":
        inp.close()
        raise CaptureError("only classic pcap captures can be copied", reader.name)
    kept = 0
    try:
        with open(target, "wb") as out:
            if len(inp.window) < PCAP_FILE_HEADER_LEN:
                inp.window = inp.refill(inp.window, 0, PCAP_FILE_HEADER_LEN)
            out.write(inp.window[:PCAP_FILE_HEADER_LEN])
            for frame in _frames(inp, "pcap", records=True):
                if keep(frame):
                    assert frame.record is not None
                    out.write(frame.record)
                    kept += 1
    except BaseException:
        os.unlink(target)
        raise
    return kept
