"""The fused bulk path (lean segments, :func:`stack.dissect.decoder.bulk.ingest_lean`) gives
what the segment-by-segment path gives, on clean captures and on odd ones: reordered,
retransmitted, conflicting, lost, cut by the snapshot length, corrupted, mid-stream."""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterator
from itertools import islice
from pathlib import Path
from typing import Any

import pytest

from stack.bench.dissect_capture import generate
from stack.cli.iwarp import main
from stack.dissect import BriefLines, brief_line, summary_line, verbose_lines
from stack.dissect.decoder import Dissector, PduRecord
from stack.pcap import CaptureReader, LeanSegment, full_segment, lean_segment, read_tcp_segments
from stack.wire.events import ReadRequest, ReadResponse, Send
from tests.dissect.synth import I2R, R2I, CaptureBuilder
from tests.pcap.captures import to_pcapng

REFERENCE_PCAPS = sorted((Path(__file__).parents[2] / "pcaps").glob("*.pcap"))

Record = tuple[bytes, bytes]  # (16-byte record header, frame bytes)


def _records(data: bytes) -> list[Record]:
    out, pos = [], 24
    while pos < len(data):
        incl = struct.unpack_from("<I", data, pos + 8)[0]
        out.append((data[pos : pos + 16], data[pos + 16 : pos + 16 + incl]))
        pos += 16 + incl
    return out


def _pcap(data: bytes, records: list[Record]) -> bytes:
    return data[:24] + b"".join(header + frame for header, frame in records)


def _cut(record: Record, keep: int) -> Record:
    """The record with its frame cut to ``keep`` bytes (the original length kept)."""
    header, frame = record
    sec, usec, _, orig = struct.unpack("<IIII", header)
    return struct.pack("<IIII", sec, usec, keep, orig), frame[:keep]


def _flip(record: Record, at: int) -> Record:
    header, frame = record
    return header, frame[:at] + bytes([frame[at] ^ 0x5A]) + frame[at + 1 :]


def _fin(record: Record) -> Record:
    """The record with the FIN flag set in its TCP header (RFC 9293 §3.1)."""
    header, frame = record
    return header, frame[:47] + bytes([frame[47] | 0x01]) + frame[48:]


def _pure_ack(record: Record) -> Record:
    """The record's TCP segment without its payload (IP total length fixed up)."""
    header, frame = record
    sec, usec, _, _ = struct.unpack("<IIII", header)
    bare = bytearray(frame[:54])
    struct.pack_into(">H", bare, 16, 40)
    return struct.pack("<IIII", sec, usec, 54, 54), bytes(bare)


def _variants(data: bytes) -> dict[str, bytes]:
    recs = _records(data)
    swapped = recs[:99] + [recs[100], recs[99]] + recs[101:149] + recs[150:153] + [recs[149]]
    swapped += recs[153:]
    again = recs[:120] + [recs[119]] + recs[120:125] + [recs[119]] + recs[125:]
    conflict = recs[:130] + [_flip(recs[129], len(recs[129][1]) - 3)] + recs[130:]
    snapped = recs[:249] + [_cut(recs[249], 80)] + recs[250:259] + [_cut(recs[259], 40)]
    snapped += recs[260:300] + [_cut(_fin(recs[300]), 90)] + recs[301:]
    acks = []
    for i, rec in enumerate(recs):
        acks.append(rec)
        if i >= 10 and i % 3 == 0:
            acks.append(_pure_ack(recs[4]))  # the other direction, nothing new
    return {
        "whole": data,
        "reordered": _pcap(data, swapped),
        "retransmitted": _pcap(data, again),
        "conflict": _pcap(data, conflict),
        "gap": _pcap(data, recs[:199] + recs[201:]),
        "snaplen": _pcap(data, snapped),
        "corrupt": _pcap(data, [*recs[:299], _flip(recs[299], 70), *recs[300:]]),
        "mid-stream": _pcap(data, recs[39:]),
        "acks": _pcap(data, acks),
    }


def _shown(items: list[Any]) -> list[object]:
    """The summary lines of the items (a Read Request is a brief tuple on the fused path
    only), and the full tree of those that are records on both paths."""
    return [
        brief_line(i) if type(i) is tuple else summary_line(i) if type(i) is PduRecord else i
        for i in items
    ]


def _same(got: list[Any], want: list[Any]) -> None:
    assert _shown(got) == _shown(want)
    trees = [(verbose_lines(g), verbose_lines(w)) for g, w in zip(got, want, strict=True)
             if type(g) is PduRecord and type(w) is PduRecord]  # fmt: skip
    assert [g for g, _ in trees] == [w for _, w in trees]


def _by_batches(
    d: Dissector[Any], ingest: Callable[[Iterator[Any]], int], segments: Iterator[Any]
) -> list[Any]:
    out: list[Any] = []
    while True:
        count = ingest(islice(segments, 37))
        out += d.take()
        if count < 37:
            return out + d.finish()


def _compare(data: bytes, brief: bool, printed: bool = False) -> int:
    """Both paths on ``data``; the number of brief tuples of the fused one (``printed``:
    most of them are lines when the fused path is given the templates)."""
    lean = Dissector(None, brief=brief)
    cut_lean: list[int] = []
    got = _by_batches(
        lean,
        lambda batch: lean.ingest_lean(batch, lambda s: cut_lean.append(s.frame)),
        CaptureReader(data).lean(),
    )
    each = Dissector(None, brief=brief)
    cut_each: list[int] = []
    want = _by_batches(
        each,
        lambda batch: each.ingest_many(batch, lambda s: cut_each.append(s.frame)),
        iter(CaptureReader(data)),
    )
    _same(got, want)
    assert cut_lean == cut_each
    assert (lean.last_frame, lean.last_ts) == (each.last_frame, each.last_ts)
    assert [repr(s) for s in lean.streams()] == [repr(s) for s in each.streams()]
    if brief:  # the lines the fused path prints itself are the printer's lines
        t0 = next(iter(CaptureReader(data))).timestamp
        for plain in (None, set(), {0}):
            lines = Dissector(None, brief=True)
            lines.text = BriefLines(t0, plain)
            out = _by_batches(lines, lines.ingest_lean, CaptureReader(data).lean())
            assert _texts(out, t0) == _texts(got, t0)
            assert [repr(s) for s in lines.streams()] == [repr(s) for s in each.streams()]
            if plain is None and printed:
                assert sum(type(i) is tuple and len(i) == 2 for i in out) > len(got) // 2
    return sum(type(i) is tuple for i in got)


def _texts(items: list[Any], t0: float) -> list[object]:
    """The summary lines of the items, as the printer writes them."""
    lines = BriefLines(t0)
    return [
        (i[1] if len(i) == 2 else lines.line(i))
        if type(i) is tuple
        else summary_line(i, i.timestamp - t0)
        if type(i) is PduRecord
        else i
        for i in items
    ]


@pytest.mark.parametrize("markers", [False, True], ids=["plain", "markers"])
def test_fused_path_is_the_segment_path_on_odd_captures(markers: bool, tmp_path: Path) -> None:
    whole = tmp_path / "whole.pcap"
    generate(str(whole), 600, markers)
    seen: set[str] = set()
    for name, data in _variants(whole.read_bytes()).items():
        tuples = _compare(data, True, not markers and name != "mid-stream")
        assert tuples > (50 if name == "mid-stream" or markers else 300), name
        _compare(data, False)
        seen.update(type(i).__name__ for i in _fused_items(data))
    assert {"tuple", "PduRecord", "Note"} <= seen


def _fused_items(data: bytes) -> list[Any]:
    d = Dissector(None, brief=True)
    return _by_batches(d, d.ingest_lean, CaptureReader(data).lean())


@pytest.mark.parametrize("capture", REFERENCE_PCAPS, ids=lambda p: p.stem)
def test_fused_path_is_the_segment_path_on_the_reference_pcaps(capture: Path) -> None:
    _compare(capture.read_bytes(), True)


def test_lean_segments_are_the_segments(tmp_path: Path) -> None:
    path = tmp_path / "bench.pcap"
    generate(str(path), 400, False)
    data = _variants(path.read_bytes())["snaplen"]
    segments = read_tcp_segments(data)
    leans: list[LeanSegment] = list(CaptureReader(data).lean())
    assert [full_segment(s) for s in leans] == segments
    assert [lean_segment(s) for s in segments] == leans
    keys = {id(s[2]) for s in leans}
    assert len(keys) == 2  # one key object per direction


def _cli(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    capsys.readouterr()
    status = main(["dissect", *args])
    got = capsys.readouterr()
    return status, got.out, got.err


@pytest.mark.parametrize("args", [(), ("--json",), ("-q", "-z", "io,stat,0.001")])
def test_cli_fused_path_prints_what_the_segment_path_prints(
    args: tuple[str, ...],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    whole = tmp_path / "whole.pcap"
    generate(str(whole), 400, False)
    import stack.cli.dissect as cli

    for name, data in _variants(whole.read_bytes()).items():
        path = tmp_path / f"{name}.pcap"
        path.write_bytes(data)
        fused = _cli([str(path), *args], capsys)
        with monkeypatch.context() as m:
            m.setattr(
                cli,
                "_decode_lean",
                lambda segs, d, p: cli._decode(map(full_segment, segs), d, p),
            )
            each = _cli([str(path), *args], capsys)
        assert fused == each, name


def test_fused_path_on_flagged_and_odd_read_requests_and_sends(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    b = CaptureBuilder()
    c = b.connection(mss=300)
    c.send(I2R, Send(b"first"))  # the first FPDU of each direction: the general path
    c.send(R2I, Send(b"back"))
    c.send(I2R, ReadRequest(0x11, 0x2000, 300, 0x22, 0x3000))  # brief
    c.send(R2I, ReadResponse(0x11, 0x2000, bytes(300)))
    c.send(I2R, ReadRequest(0x12, 0x0, 8, 0x23, 0x0), msn=7)  # DDP-05: a record
    c.send(I2R, ReadRequest(0x13, 0x40, 16, 0x24, 0x80))  # brief again
    rr = c.ulpdus(I2R, ReadRequest(0x14, 0x0, 4, 0x25, 0x0))[0]
    c.raw(I2R, c.wire(I2R, rr[:2] + b"\0\0\0\x09" + rr[6:]))  # RsvdULP set: RDMAP-03
    c.raw(I2R, c.wire(I2R, rr[:14] + b"\0\0\0\x01" + rr[18:]))  # MO 1
    c.send(I2R, Send(b"late"), msn=9)  # DDP-05 on a Send
    together = c.ulpdus(I2R, Send(b"x" * 40)) + c.ulpdus(I2R, ReadRequest(1, 2, 3, 4, 5))
    c.raw(I2R, b"".join(c.wire(I2R, u) for u in together))  # several FPDUs in one segment
    c.send(R2I, ReadResponse(0x12, 0x0, bytes(8)))
    c.send(R2I, ReadResponse(0x99, 0x0, bytes(8)))  # RDMAP-04
    data = b.data()
    _compare(data, True)
    briefs = [i for i in _fused_items(data) if type(i) is tuple and i[3] == 1]
    assert len(briefs) >= 2
    path = tmp_path / "reads.pcap"
    path.write_bytes(data)
    fused = _cli([str(path)], capsys)
    with monkeypatch.context() as m:
        m.setattr("stack.cli.dissect.Dissector", lambda options, brief=False: Dissector(options))
        reference = _cli([str(path)], capsys)
    assert fused == reference
    for rule in ("DDP-05", "RDMAP-03", "RDMAP-04"):
        assert f"[{rule}" in fused[1] or f" {rule}" in fused[1], rule
    assert " MO=0 sink=0x00000011/0x2000 size=300 src=0x00000022/0x3000 CRC ok\n" in fused[1]
    assert (
        " MO=1 sink=0x00000014/0x0 size=4 src=0x00000025/0x0 CRC ok [RDMAP-04 DDP-05]" in fused[1]
    )


def test_fused_path_on_pcapng_captures(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """pcapng (whose segments go through parse_tcp) takes the fused path as well."""
    whole = tmp_path / "whole.pcap"
    generate(str(whole), 300, False)
    import stack.cli.dissect as cli

    for name in ("whole", "gap", "snaplen"):
        data = to_pcapng(_variants(whole.read_bytes())[name])
        assert _compare(data, True, True) > 100, name
        path = tmp_path / f"{name}.pcapng"
        path.write_bytes(data)
        fused = _cli([str(path)], capsys)
        with monkeypatch.context() as m:
            m.setattr(cli, "_decode_lean", lambda s, d, p: cli._decode(map(full_segment, s), d, p))
            each = _cli([str(path)], capsys)
        assert fused == each and fused[1].count("\n") > 250, name
