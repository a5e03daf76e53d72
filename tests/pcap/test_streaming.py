"""The reader streams: pipes, stdin, FIFOs, bounded windows, corrupt lengths (stack.pcap)."""

from __future__ import annotations

import io
import os
import re
import struct
import sys
import threading
import tracemalloc
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stack.pcap import (
    CHUNK,
    CaptureError,
    CaptureReader,
    Frame,
    TruncatedCapture,
    copy_capture,
    iter_frames,
    read_tcp_segments,
)
from stack.pcap.format import MAX_RECORD_LEN
from tests.pcap.captures import ipv4_tcp, raw_frame_capture, tap_capture, to_pcapng

GUARD = 60.0
"""Seconds a helper thread waits for the reader before giving up (a hang guard only)."""


class Trickle(io.RawIOBase):
    """A stream handing out at most ``step`` bytes per read: a slow pipe, deterministic."""

    def __init__(self, data: bytes, step: int) -> None:
        self.data = data
        self.step = step
        self.pos = 0
        self.reads = 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        self.reads += 1
        count = min(self.step, len(buffer), len(self.data) - self.pos)
        buffer[:count] = self.data[self.pos : self.pos + count]
        self.pos += count
        return count


def _segments(source: Any) -> list[tuple[Any, ...]]:
    reader = source if isinstance(source, CaptureReader) else CaptureReader(source)
    return [
        (s.frame, s.timestamp, s.src, s.dst, s.sport, s.seq, s.flags, bytes(s.payload), s.missing)
        for s in reader
    ]


def _outcome(source: Any) -> tuple[list[tuple[Any, ...]], tuple[str, str] | None]:
    """(segments, (error class, message) or None): what reading ``source`` gives."""
    got: list[tuple[Any, ...]] = []
    try:
        for s in CaptureReader(source):
            got.append((s.frame, s.src, s.sport, s.seq, s.flags, bytes(s.payload), s.missing))
    except CaptureError as exc:
        return got, (type(exc).__name__, exc.message)
    return got, None


def _frame_offsets(raw: bytes) -> list[int]:
    """The file offset just past each record of a classic pcap."""
    ends, pos = [], 24
    for frame in iter_frames(raw):
        pos += 16 + len(frame.data)
        ends.append(pos)
    return ends


SAMPLES = {
    "pcap": tap_capture(mss=64),
    "pcapng": to_pcapng(tap_capture(mss=64)),
    "pcapng-be-ns": to_pcapng(tap_capture(mss=100), big_endian=True, nanos=True),
    "raw-ip": raw_frame_capture(101, [ipv4_tcp(bytes(n)) for n in (0, 5, 700, 1400)]),
}


@settings(max_examples=200, deadline=None)
@given(
    st.sampled_from(sorted(SAMPLES)),
    st.integers(min_value=1, max_value=400),
    st.integers(min_value=0, max_value=4000),
    st.binary(max_size=24),
)
def test_a_trickling_stream_reads_exactly_like_bytes(
    name: str, step: int, cut: int, noise: bytes
) -> None:
    """Records split across any read boundary, cut short or damaged anywhere: the same
    segments and the same error as reading the bytes in place."""
    raw = bytearray(SAMPLES[name])
    pos = cut % len(raw)
    if noise:
        raw[pos : pos + len(noise)] = noise
    else:
        del raw[pos:]
    data = bytes(raw)
    try:
        expected = _outcome(data)
    except CaptureError as exc:  # refused before the first record
        with pytest.raises(CaptureError) as info:
            CaptureReader(Trickle(data, step))
        assert (type(info.value), info.value.message) == (type(exc), exc.message)
        return
    assert _outcome(Trickle(data, step)) == expected


def test_the_first_segment_comes_out_before_the_pipe_is_closed() -> None:
    """A reader that slurped its input would wait for the writer, who waits for the reader."""
    raw = SAMPLES["pcap"]
    first_part = _frame_offsets(raw)[3]  # the handshake and the first data segment
    read_fd, write_fd = os.pipe()
    got_first = threading.Event()
    waited: list[bool] = []

    def writer() -> None:
        with open(write_fd, "wb", buffering=0) as pipe:
            pipe.write(raw[:first_part])
            waited.append(got_first.wait(GUARD))
            pipe.write(raw[first_part:])

    thread = threading.Thread(target=writer)
    thread.start()
    hooked: list[bool] = []
    with open(read_fd, "rb", buffering=0) as pipe:
        reader = CaptureReader(pipe, on_wait=lambda: hooked.append(got_first.is_set()))
        segments = iter(reader)
        first = next(segments)
        got_first.set()
        rest = list(segments)
    thread.join(GUARD)
    assert waited == [True], "the reader waited for the end of the input"
    assert [s.frame for s in [first, *rest]] == [s.frame for s in read_tcp_segments(raw)]
    assert False in hooked and True in hooked  # the hook ran before reads that could wait
    assert reader.max_buffer <= CHUNK + 2048


@contextmanager
def _fifo(tmp_path: Path, data: bytes, step: int = 1000) -> Iterator[Path]:
    """A named pipe that a thread fills with ``data``, ``step`` bytes per write."""
    path = tmp_path / "live.pcap"
    os.mkfifo(path)

    def writer() -> None:
        with open(path, "wb", buffering=0) as pipe:
            for pos in range(0, len(data), step):
                pipe.write(data[pos : pos + step])

    thread = threading.Thread(target=writer, daemon=True)
    thread.start()
    try:
        yield path
    finally:
        if thread.is_alive():  # the reader never opened it, or stopped early: release the writer
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
            os.close(fd)
        thread.join(GUARD)


def test_pcapng_from_a_named_pipe(tmp_path: Path) -> None:
    raw = SAMPLES["pcapng-be-ns"]
    with _fifo(tmp_path, raw, step=37) as path:
        reader = CaptureReader(path)
        assert reader.format == "pcapng" and reader.name == str(path)
        assert _segments(reader) == _segments(raw)


def test_truncated_capture_from_a_pipe_names_it(tmp_path: Path) -> None:
    raw = SAMPLES["pcap"][:-7]
    expected, error = _outcome(raw)
    assert error is not None and error[0] == "TruncatedCapture"
    with _fifo(tmp_path, raw, step=100) as path:
        got = []
        with pytest.raises(TruncatedCapture) as info:
            for s in CaptureReader(path):
                got.append((s.frame, s.src, s.sport, s.seq, s.flags, bytes(s.payload), s.missing))
    assert got == expected
    assert str(info.value) == f"{path}: {error[1]}"
    assert error[1].startswith("file is cut short in the middle of frame")


def test_stdin_dash(monkeypatch: pytest.MonkeyPatch) -> None:
    raw = to_pcapng(tap_capture())
    read_fd, write_fd = os.pipe()

    def writer() -> None:
        with open(write_fd, "wb") as pipe:
            pipe.write(raw)

    thread = threading.Thread(target=writer)
    thread.start()
    with open(read_fd) as stdin:  # a text stream, as sys.stdin is
        monkeypatch.setattr(sys, "stdin", stdin)
        reader = CaptureReader("-")
        assert reader.name == "<stdin>" and reader.format == "pcapng"
        assert _segments(reader) == _segments(raw)
        with pytest.raises(CaptureError, match="<stdin>: a stream can be read only once"):
            iter(reader)
    thread.join(GUARD)


def test_paths_and_bytes_can_be_read_again(tmp_path: Path) -> None:
    raw = SAMPLES["pcap"]
    path = tmp_path / "x.pcap"
    path.write_bytes(raw)
    for source in (raw, path):
        reader = CaptureReader(source)
        once = [bytes(s.payload) for s in reader]
        assert [bytes(s.payload) for s in reader] == once
        assert [f.number for f in reader.frames()] == list(range(1, len(_frame_offsets(raw)) + 1))
    assert reader.max_buffer == CHUNK  # one window: the whole small file


def test_a_large_capture_is_read_through_a_bounded_window(tmp_path: Path) -> None:
    """A capture 24 times the window: the window never grows past a chunk and a record,
    and (discarding the segments) the reader never holds much more than one window."""
    frame = next(iter_frames(tap_capture(mss=1460))).data.tobytes()  # the SYN
    data_frame = [f for f in iter_frames(tap_capture(mss=1460)) if len(f.data) > 700][0]
    frames = [data_frame.data.tobytes()] * (25 * CHUNK // (16 + len(data_frame.data)))
    path = tmp_path / "big.pcap"
    path.write_bytes(raw_frame_capture(1, [frame, *frames]))
    assert path.stat().st_size > 24 * CHUNK
    reader = CaptureReader(path)
    tracemalloc.start()
    try:
        count = sum(len(s.payload) for s in reader)
        _current, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert count == len(frames) * len(bytes(data_frame.data)[54:])
    assert reader.stats.frames == len(frames) + 1 and reader.stats.tcp == len(frames) + 1
    assert CHUNK <= reader.max_buffer <= CHUNK + 16 + len(data_frame.data)
    assert peak < 4 * CHUNK


def test_a_record_longer_than_a_chunk_grows_the_window_once() -> None:
    big = b"\xff" * 12 + b"\x88\xb5" + bytes(range(256)) * (2 * CHUNK // 256)
    raw = bytearray(raw_frame_capture(1, [b"\x00" * 60, big, b"\x01" * 60]))
    struct.pack_into("<I", raw, 16, 4 * CHUNK)  # snaplen
    stream = Trickle(bytes(raw), 300_000)
    reader = CaptureReader(stream)
    frames = list(reader.frames())
    assert [len(f.data) for f in frames] == [60, len(big), 60]
    assert bytes(frames[1].data) == big
    assert len(big) + 16 <= reader.max_buffer < len(big) + 16 + CHUNK
    with pytest.raises(CaptureError, match="a stream can be read only once"):
        reader.frames()


def _pcap_with_record(incl_len: int, snaplen: int = 0xFFFFFFFF, data: bytes = b"x" * 100) -> bytes:
    head = struct.pack("<IHHiIII", 0xA1B2C3D4, 2, 4, 0, 0, snaplen, 1)
    return head + struct.pack("<IIII", 0, 0, incl_len, incl_len) + data


def _pcapng_with_block(block_len: int) -> bytes:
    shb = struct.pack("<IIIHHq", 0x0A0D0D0A, 28, 0x1A2B3C4D, 1, 0, -1) + struct.pack("<I", 28)
    idb = struct.pack("<IIHHII", 1, 20, 1, 0, 65535, 20)
    return shb + idb + struct.pack("<II", 6, block_len) + b"\x00" * 200


@pytest.mark.parametrize(
    "content, error, message",
    [
        (_pcap_with_record(0xFFFFFFFF), CaptureError,
         "corrupt record for frame 1: captured length 4294967295 exceeds the limit 67108864"),
        (_pcap_with_record(MAX_RECORD_LEN), TruncatedCapture,
         "file is cut short in the middle of frame 1 (100 of 67108864 bytes present)"),
        (_pcap_with_record(0x7FFFFFFF, snaplen=65535), CaptureError,
         "corrupt record for frame 1: captured length 2147483647 exceeds the limit 262144"),
        (_pcapng_with_block(0xFFFFFFFC), CaptureError,
         "corrupt pcapng block at byte 48: length 4294967292 exceeds the limit 67108864"),
        (_pcapng_with_block(MAX_RECORD_LEN), TruncatedCapture,
         "file is cut short in a block at byte 48 (208 of 67108864 bytes present)"),
        (_pcapng_with_block(13), CaptureError, "corrupt pcapng block at byte 48 (length 13)"),
        (b"\x0a\x0d\x0d\x0a" + b"\x00" * 4, TruncatedCapture,
         "file is cut short in a block header at byte 0"),
        (b"\xd4\xc3\xb2\xa1" + b"\x00" * 10, CaptureError, "pcap file header is truncated"),
        (b"GET / HTTP/1.1\r\n", CaptureError, "not a pcap or pcapng file (unknown magic number)"),
        (b"\x1f\x8b", CaptureError, "not a pcap or pcapng file (too short)"),
    ],
)  # fmt: skip
def test_corrupt_files_give_one_error_naming_them_and_allocate_little(
    tmp_path: Path, content: bytes, error: type[CaptureError], message: str
) -> None:
    """Absurd lengths are refused or found cut short; nothing near them is allocated."""
    path = tmp_path / "bad.pcap"
    path.write_bytes(content)
    tracemalloc.start()
    try:
        with pytest.raises(CaptureError) as info:
            list(CaptureReader(path))
        _current, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert type(info.value) is error
    assert str(info.value) == f"{path}: {message}" and info.value.source == str(path)
    assert peak < 4 * CHUNK


def test_unreadable_sources(tmp_path: Path) -> None:
    with pytest.raises(CaptureError, match=f"^{re.escape(str(tmp_path))}: is a directory$"):
        CaptureReader(tmp_path)
    with pytest.raises(CaptureError, match="text stream"):
        CaptureReader(io.StringIO("pcap?"))  # type: ignore[arg-type]
    with pytest.raises(CaptureError, match="not a binary file"):
        CaptureReader(object())  # type: ignore[arg-type]


def test_copy_capture_keeps_chosen_records_byte_for_byte(tmp_path: Path) -> None:
    nanos = bytearray(SAMPLES["pcap"])
    struct.pack_into("<I", nanos, 0, 0xA1B23C4D)  # nanosecond timestamps: copied, not rebuilt
    raw = bytes(nanos)
    ends = _frame_offsets(raw)
    starts = [24, *ends[:-1]]
    dst = tmp_path / "odd.pcap"
    kept: list[Frame] = []

    def keep(frame: Frame) -> bool:
        kept.append(frame)
        return frame.number % 2 == 1

    assert copy_capture(raw, dst, keep) == (len(ends) + 1) // 2
    assert all(f.record is not None for f in kept)
    odd = b"".join(
        raw[a:b] for i, (a, b) in enumerate(zip(starts, ends, strict=True)) if i % 2 == 0
    )
    assert dst.read_bytes() == raw[:24] + odd
    with pytest.raises(CaptureError, match="only classic pcap"):
        copy_capture(to_pcapng(raw), dst, keep)
    with pytest.raises(TruncatedCapture):
        copy_capture(raw[:-3], dst, keep)
    assert not dst.exists()
