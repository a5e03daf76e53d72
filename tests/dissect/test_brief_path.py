"""The summary's brief path (``Dissector(brief=True)``, BriefFpdu tuples) prints exactly
what the reference path (a PduRecord per FPDU, :func:`summary_line`) prints."""

from __future__ import annotations

import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kbtp.cli import main as kbtp
from stack.bench.dissect_capture import generate
from stack.cli.iwarp import main
from stack.dissect import BriefLines, brief_line, summary_line, verbose_lines
from stack.dissect.decoder import BriefFpdu, BriefOutput, Dissector, PduRecord
from stack.pcap import TcpSegment, read_tcp_segments
from stack.wire.events import ReadRequest, Send
from tests.dissect.synth import I2R, R2I, CaptureBuilder, rewrite

REFERENCE_PCAPS = sorted((Path(__file__).parents[2] / "pcaps").glob("*.pcap"))


def _brief_fpdu(item: BriefOutput) -> BriefFpdu:
    """``item``, asserted a BriefFpdu tuple (not a (frame, line) BriefText)."""
    assert type(item) is tuple and len(item) != 2
    return item


def _text(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    capsys.readouterr()
    status = main(["dissect", *args])
    got = capsys.readouterr()
    return status, got.out, got.err


def _both(
    path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    args: tuple[str, ...] = (),
) -> tuple[tuple[int, str, str], tuple[int, str, str]]:
    """(brief path output, reference path output) of ``iwarp dissect path *args``."""
    brief = _text([str(path), *args], capsys)
    with monkeypatch.context() as m:
        m.setattr("stack.cli.dissect.Dissector", lambda options, brief=False: Dissector(options))
        reference = _text([str(path), *args], capsys)
    return brief, reference


def _brief_items(path: Path) -> int:
    d = Dissector(None, brief=True)
    items = [i for s in read_tcp_segments(path.read_bytes()) for i in d.feed(s)] + d.finish()
    return sum(type(i) is tuple for i in items)


@pytest.mark.parametrize("capture", REFERENCE_PCAPS, ids=lambda p: p.stem)
def test_reference_pcaps_print_the_same_text(
    capture: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    brief, reference = _both(capture, monkeypatch, capsys)
    assert brief == reference
    assert brief[1].count("\n") >= 2


def test_reference_pcaps_take_the_brief_path() -> None:
    assert len(REFERENCE_PCAPS) >= 10
    assert sum(_brief_items(p) for p in REFERENCE_PCAPS) >= 20
    assert _brief_items(REFERENCE_PCAPS[0]) > 0


def _cut(data: bytes, drop: set[int] | int) -> bytes:
    """``data`` without the frames in ``drop`` (or before frame ``drop``)."""
    if isinstance(drop, int):
        return rewrite(data, lambda n, f: f if n >= drop else None)
    return rewrite(data, lambda n, f: None if n in drop else f)


@pytest.mark.parametrize("markers", [False, True], ids=["plain", "markers"])
def test_bench_captures_print_the_same_text(
    markers: bool,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    whole = tmp_path / "whole.pcap"
    generate(str(whole), 600, markers)
    data = whole.read_bytes()
    variants = {
        "whole": data,
        "mid-stream": _cut(data, 40),  # found by search: output held, then sorted
        "gap": _cut(data, {200, 201}),  # TCP-GAP finding, resynchronisation
    }
    for name, content in variants.items():
        path = tmp_path / f"{name}.pcap"
        path.write_bytes(content)
        brief, reference = _both(path, monkeypatch, capsys)
        assert brief == reference, name
        assert _brief_items(path) > (300 if name != "mid-stream" else 50), name
    assert "TCP-GAP" in brief[1]


def test_findings_and_every_send_kind_print_the_same_text(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    b = CaptureBuilder()
    c = b.connection(mss=300)
    c.send(I2R, Send(b"one"))
    c.send(I2R, Send(b"inv", invalidate_stag=0xABCD))
    c.send(I2R, Send(b"se", solicited=True))
    c.send(I2R, Send(b"seinv", solicited=True, invalidate_stag=0x77))
    c.send(I2R, Send(bytes(1000)))  # an FPDU in four TCP segments
    c.send(I2R, ReadRequest(0x11, 0x2000, 300, 0x22, 0x3000))
    bad = struct.pack(">BBIIII", 0x41, 0x43, 0, 0, 9, 0) + b"abc"  # a Send, MSN 9: DDP-05
    c.raw(I2R, c.wire(I2R, bad))
    c.send(R2I, Send(b"other way"))
    path = tmp_path / "sends.pcap"
    path.write_bytes(b.data())
    brief, reference = _both(path, monkeypatch, capsys)
    assert brief == reference
    assert "InvSTag=0x0000abcd" in brief[1] and "[DDP-05]" in brief[1]
    assert brief[1].count("\n") == 2 + 8


def test_kbtp_sends_print_the_same_text(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "demo.pcap"
    assert kbtp(["demo", "--quiet", "--ticket-timeout", "1", "-w", str(path)]) == 0
    brief, reference = _both(path, monkeypatch, capsys)
    assert brief == reference
    assert "| KBTP HELLO " in brief[1]


def test_brief_line_is_the_summary_line_of_the_same_fpdu(tmp_path: Path) -> None:
    path = tmp_path / "bench.pcap"
    generate(str(path), 300, True)
    segments = read_tcp_segments(path.read_bytes())
    lean = Dissector(None, brief=True)
    full = Dissector()
    briefs = [i for s in segments for i in lean.feed(s)] + lean.finish()
    records = [i for s in segments for i in full.feed(s)] + full.finish()
    assert len(briefs) == len(records)
    pairs = [(b, r) for b, r in zip(briefs, records, strict=True) if type(b) is tuple]
    assert len(pairs) > 250
    for brief, rec in pairs:
        item = _brief_fpdu(brief)
        assert isinstance(rec, PduRecord)
        assert (item[0], item[1]) == (rec.frame, rec.timestamp)
        assert brief_line(item, 1.5) == summary_line(rec, 1.5)
        assert brief_line(item) == summary_line(rec)
    assert [repr(s) for s in lean.streams()] == [repr(s) for s in full.streams()]


def test_brief_lines_reuse_the_time_text_and_keep_percent_signs(tmp_path: Path) -> None:
    path = tmp_path / "bench.pcap"
    generate(str(path), 300, False)
    segments = read_tcp_segments(path.read_bytes())
    lean = Dissector(None, brief=True)
    items = [_brief_fpdu(i) for s in segments for i in lean.feed(s) if type(i) is tuple]
    t0 = segments[0].timestamp
    lines = BriefLines(t0)
    assert len({i[1] for i in items}) < len(items)  # segments with several FPDUs
    assert [lines.line(i) for i in items] == [brief_line(i, i[1] - t0) for i in items]
    # any text of the route is kept as it is, "%" included (a template never sees it raw)
    odd = (7, "i2r", "fe80::1%eth0.40000", "100%:1")
    for item in items[:40]:
        moved = (*item[:2], odd, *item[3:])
        assert " fe80::1%eth0.40000 \u2192 100%:1 MPA/DDP/RDMAP " in brief_line(moved, 2.0)
        assert brief_line(moved).endswith(brief_line(item).split("MPA/DDP/RDMAP", 1)[1])


QUIET = [("-q", "-z", "io,stat,0.0005"), ("-q", "--fail-on-findings"), ("-q", "--ulp", "none")]


@pytest.mark.parametrize("args", QUIET, ids=lambda a: " ".join(a))
def test_quiet_counts_are_the_same_on_the_brief_path(
    args: tuple[str, ...],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    whole = tmp_path / "whole.pcap"
    generate(str(whole), 600, True)
    gap = tmp_path / "gap.pcap"
    gap.write_bytes(_cut(whole.read_bytes(), {200, 201}))
    demo = tmp_path / "demo.pcap"
    assert kbtp(["demo", "--quiet", "--ticket-timeout", "1", "-w", str(demo)]) == 0
    statuses = set()
    for path in [whole, gap, demo, *REFERENCE_PCAPS]:
        brief, reference = _both(path, monkeypatch, capsys, args)
        assert brief == reference, path.name
        statuses.add(brief[0])
        if "io,stat,0.0005" in args:
            assert "IO Statistics" in brief[1]
        else:
            assert brief[1] == ""
    if "--fail-on-findings" in args:
        assert statuses == {0, 3}


def test_ingest_many_is_ingest_of_each_segment(tmp_path: Path) -> None:
    path = tmp_path / "bench.pcap"
    generate(str(path), 300, True)
    data = _cut(path.read_bytes(), {120, 121})  # a gap: the general path in the middle
    segments = read_tcp_segments(data)
    one = Dissector(None, brief=True)
    each = []
    for start in range(0, len(segments), 37):  # the same takes, segment by segment
        for segment in segments[start : start + 37]:
            one.ingest(segment)
        each += one.take()
    each += one.finish()
    many = Dissector(None, brief=True)
    seen: list[int] = []
    got = []
    for start in range(0, len(segments), 37):
        batch = iter(segments[start : start + 37])
        assert many.ingest_many(batch, lambda s: seen.append(s.frame)) == min(
            37, len(segments) - start
        )
        got += many.take()
    assert many.ingest_many(iter(())) == 0
    got += many.finish()

    def shown(items: list[Any]) -> list[object]:
        return [
            brief_line(i) if type(i) is tuple else verbose_lines(i) if type(i) is PduRecord else i
            for i in items
        ]

    assert len(got) == len(each) > 300
    assert shown(got) == shown(each)
    assert seen == []  # nothing was cut by a snapshot length
    assert (many.last_frame, many.last_ts) == (one.last_frame, one.last_ts)
    assert [repr(s) for s in many.streams()] == [repr(s) for s in one.streams()]


def test_ingest_many_shows_cut_segments_and_stays_consistent_when_reading_fails() -> None:
    raw = (Path(__file__).parents[2] / "pcaps" / "term-read-bounds.pcap").read_bytes()
    header = bytearray(raw[:24])
    struct.pack_into("<I", header, 16, 96)
    out, pos = [bytes(header)], 24
    while pos < len(raw):
        sec, usec, incl, orig = struct.unpack_from("<IIII", raw, pos)
        body = raw[pos + 16 : pos + 16 + incl][:96]
        out.append(struct.pack("<IIII", sec, usec, len(body), orig) + body)
        pos += 16 + incl
    segments = read_tcp_segments(b"".join(out))
    cut = [s.frame for s in segments if s.missing]
    assert cut
    seen: list[int] = []
    d = Dissector(None, brief=True)

    def failing() -> Iterator[TcpSegment]:
        yield from segments[:-1]
        raise ValueError("the reader failed")

    with pytest.raises(ValueError, match="reader failed"):
        d.ingest_many(failing(), lambda s: seen.append(s.frame))
    assert (d.last_frame, d.last_ts) == (segments[-2].frame, segments[-2].timestamp)
    assert seen == [f for f in cut if f != segments[-1].frame]
    assert d.ingest_many(segments[-1:], lambda s: seen.append(s.frame)) == 1
    assert seen == cut
