"""How ``iwarp dissect`` shows the decoded records: text, ``-V``, JSON, ``-T fields``.

:class:`Printer` formats records as the decoder yields them (the display filter, ``-c``,
the statistics asked for, the frames ``-w`` copies; the brief tuples of the default
output); :func:`ulp_annotator` adds the
upper-layer protocol of ``--ulp`` and :func:`ulp_hex_digits` the fields it writes in hex.
"""

from __future__ import annotations

import argparse
import json
from typing import Any, TextIO

from stack.cli import CliError
from stack.constants import SEND_OPCODES
from stack.dissect import (
    HEX_DIGITS,
    BriefLines,
    FieldContext,
    FieldsError,
    FieldsFormat,
    FilterError,
    IoStatistics,
    SnapTracker,
    Statistics,
    TcpConversations,
    compile_filter,
    json_object,
    note_line,
    record_json,
    summary_line,
    verbose_lines,
)
from stack.dissect.decoder import BriefFpdu, BriefOutput, Note, PduRecord, StreamInfo, rule_ids

__all__ = ["Printer", "UlpAnnotator", "ulp_annotator", "ulp_hex_digits"]

_SEND_OPCODES = frozenset(int(op) for op in SEND_OPCODES)


class UlpAnnotator:
    """The upper-layer protocol carried in Sends (``--ulp``): KBTP messages (docs/kbtp.md)
    in the first segment of Send-family messages, with the session rules, by
    :class:`kbtp.conversation.KbtpConversations` (which streams carry KBTP: those whose
    first Send is a KBTP message or a HELLO; Sends of other protocols are left alone, so
    their bytes never produce KBTP findings).  The stream decoder stays ULP-agnostic
    (floors 0-1); this tool layer adds the ULP.

    Called with a record: its reading, the findings added to the record; :meth:`send`
    reads the DDP payload of a Send's first segment given its stream and direction.
    """

    def __init__(self) -> None:
        from kbtp.conversation import KbtpConversations

        self.conversations = KbtpConversations()
        self._not_kbtp: set[int] = set()  # streams judged by their first Send: never asked again

    def send(self, stream: int, direction: str, payload: bytes | memoryview, last: bool) -> Any:
        """The reading of the first segment of a Send without findings, or None (the
        stream does not carry KBTP)."""
        if stream in self._not_kbtp:
            return None
        summary = self.conversations.annotate(stream, direction, bytes(payload), last)
        if summary is None:
            self._not_kbtp.add(stream)
        return summary

    @property
    def not_carrying(self) -> set[int]:
        """The streams judged not to carry the protocol: :meth:`send` is None for them."""
        return self._not_kbtp

    def __call__(self, rec: PduRecord) -> Any:
        seg = rec.segment
        if seg is None or seg.opcode not in _SEND_OPCODES or seg.mo != 0 or seg.findings:
            return None
        summary = self.send(rec.stream, rec.direction, seg.payload, seg.last)
        if summary is not None and summary.findings:
            rec.findings.extend(summary.findings)
        return summary


def ulp_annotator(name: str) -> UlpAnnotator | None:
    """The decoder of the upper-layer protocol ``--ulp`` carried in Sends, or None."""
    if name == "none":
        return None
    return UlpAnnotator()


def ulp_hex_digits(name: str) -> dict[str, int]:
    """The fields written in hex (``--json``, ``-T fields``) and their widths: the iWARP
    STags and Tagged Offsets, and those of the upper-layer protocol ``name``."""
    if name == "none":
        return HEX_DIGITS
    from kbtp.describe import JSON_HEX_DIGITS

    return {**HEX_DIGITS, **JSON_HEX_DIGITS}


def _ascii_fallback(out: TextIO) -> bool:
    """True when ``out`` cannot encode the arrow of the summary lines (it then writes
    "->", and any other character it cannot encode as "?")."""
    encoding = getattr(out, "encoding", None) or "utf-8"
    try:
        "\u2192".encode(encoding)
    except (UnicodeEncodeError, LookupError):
        reconfigure = getattr(out, "reconfigure", None)
        if reconfigure is not None:
            reconfigure(errors="replace")
        return True
    return False


class Printer:
    """Formats records as they come; counts what was shown."""

    def __init__(self, args: argparse.Namespace, out: TextIO, mode: str) -> None:
        self.args = args
        self.mode = mode
        self.out = out
        self.ascii = _ascii_fallback(out)
        self.context = FieldContext()
        prefixes = ("kbtp_",) if args.ulp == "kbtp" else ()
        self.hex_digits = ulp_hex_digits(args.ulp)
        self.predicate = None
        if args.filter:
            try:
                self.predicate = compile_filter(args.filter, prefixes, self.context)
            except FilterError as exc:
                raise CliError(f"bad display filter: {exc}") from None
        self.columns: FieldsFormat | None = None
        if mode == "fields":
            try:
                self.columns = FieldsFormat(
                    args.fields or (),
                    args.field_options or (),
                    self.context,
                    prefixes,
                    self.hex_digits,
                )
            except FieldsError as exc:
                raise CliError(str(exc)) from None
        specs = list(args.stat_specs or ())
        if args.stats:
            specs.append(("iwarp", None))
        kinds = {kind for kind, _ in specs}
        self.stats = Statistics() if "iwarp" in kinds else None
        self.conversations = TcpConversations() if "conv" in kinds else None
        self.io = [IoStatistics(interval) for kind, interval in specs if kind == "io" and interval]
        self.frames: set[int] | None = set() if args.write else None
        self.snap = SnapTracker()
        self.shown = 0
        self.with_findings = 0
        self.pdus = 0
        self.limit = args.count
        self.lines: list[str] = []
        if self.columns is not None and self.columns.show_header:
            self.lines.append(self.columns.header())
        self.ulp = ulp_annotator(args.ulp)
        self._brief: BriefLines | None = None
        self.plain = mode == "text" and not (
            args.filter
            or self.stats is not None
            or args.count
            or args.write
            or (self.io and not args.quiet)
        )
        """The bulk path: BriefFpdu tuples, the default text or (``-q``) counts only."""

    def brief_text(self) -> BriefLines | None:
        """The line maker the decoder's fused path may print with (the plain mode's text,
        :attr:`Dissector.text <stack.dissect.decoder.Dissector.text>`), or None."""
        if not self.plain or self.args.quiet:
            return None
        t0 = self.context.t0 or 0.0
        brief = self._brief
        if brief is None or brief.t0 != t0:
            brief = self._brief = BriefLines(t0)
        brief.plain_sends = None if self.ulp is None else self.ulp.not_carrying
        return brief

    @property
    def done(self) -> bool:
        return self.limit is not None and self.shown >= self.limit

    def _note(self, note: Note, time_column: bool) -> None:
        why = self.snap.explain(note) if self.snap.cut else None
        if why is not None:
            hint = Note(note.stream, note.frame, note.direction, "snaplen", why, note.offset)
            self.lines.append(note_line(hint, time_column))
        self.lines.append(note_line(note, time_column))

    def emit(self, items: list[BriefOutput]) -> None:
        """Format ``items``; BriefFpdu tuples come only in the plain mode (:attr:`plain`)."""
        args = self.args
        lines = self.lines
        t0 = self.context.t0 or 0.0
        if self.plain and args.quiet:
            self._tally(items)
            return
        if self.plain:  # default output, nothing to filter or count: the bulk path
            append = lines.append
            pdus = flagged = 0
            ulp = self.ulp
            brief = self._brief
            if brief is None or brief.t0 != t0:
                brief = self._brief = BriefLines(t0)
            brief_line = brief.line
            for item in items:
                if type(item) is tuple:  # a BriefFpdu: a clean FPDU of the decoder's bulk path
                    if len(item) == 2:  # a BriefText: its line, printed by the fused path
                        append(item[1])
                        pdus += 1
                        continue
                    line = brief_line(item)
                    payload = item[13]
                    if payload is not None and ulp is not None and item[7] == 0:
                        info = ulp.send(item[2][0], item[2][1], payload, item[10])
                        if info is not None:
                            if info.findings:
                                line += " [" + " ".join(rule_ids(info.findings)) + "]"
                                flagged += 1
                            line = f"{line} | {info.line}"
                    append(line)
                    pdus += 1
                elif type(item) is PduRecord:
                    info = ulp(item) if ulp is not None else None
                    line = summary_line(item, item.timestamp - t0)
                    append(line if info is None else f"{line} | {info.line}")
                    pdus += 1
                    if item.findings:
                        flagged += 1
                elif not args.no_notes:
                    self._note(item, True)  # type: ignore[arg-type]
            self.pdus += pdus
            self.with_findings += flagged
            self.shown = self.pdus
            if len(lines) > 512:
                self.flush()
            return
        mode = self.mode
        for item in items:
            if self.done:
                return
            if type(item) is Note:
                if self.stats is not None:
                    self.stats.add_note(item)
                if mode in ("text", "verbose") and not (
                    args.quiet or args.no_notes or self.predicate
                ):
                    self._note(item, mode == "text")
                continue
            assert isinstance(item, PduRecord)
            self.pdus += 1
            ulp_info = self.ulp(item) if self.ulp is not None else None
            record = None
            if self.predicate is not None:
                record = self._json(item, ulp_info)
                if not self.predicate(record):
                    continue
            self.shown += 1
            if item.findings:
                self.with_findings += 1
            if self.stats is not None:
                self.stats.add(item)
            for io in self.io:
                io.add(item, self.context.t0)
            if self.frames is not None:
                self.frames.add(item.frame)
            if args.quiet:
                continue
            if mode == "json":
                record = json_object(record or self._json(item, ulp_info), self.hex_digits)
                lines.append(json.dumps(record, separators=(", ", ": ")))
            elif mode == "fields":
                assert self.columns is not None
                lines.append(self.columns.row(record or self._json(item, ulp_info)))
            elif mode == "verbose":
                lines.extend(verbose_lines(item, item.timestamp - t0))
                if ulp_info is not None:
                    lines.extend(ulp_info.tree_lines())
                lines.append("")
            elif ulp_info is not None:
                lines.append(f"{summary_line(item, item.timestamp - t0)} | {ulp_info.line}")
            else:
                lines.append(summary_line(item, item.timestamp - t0))
        if len(lines) > 512:
            self.flush()

    def _tally(self, items: list[BriefOutput]) -> None:
        """The plain mode with ``-q``: count the PDUs, their findings and their ``-z
        io,stat`` intervals, as the general path of :meth:`emit` does, without text."""
        t0 = self.context.t0
        ulp = self.ulp
        io = self.io
        pdus = flagged = 0
        for item in items:
            if type(item) is tuple:  # a BriefFpdu (no BriefText: -q prints no lines)
                fpdu: BriefFpdu = item  # type: ignore[assignment]
                payload = fpdu[13]
                if payload is not None and ulp is not None and fpdu[7] == 0:
                    info = ulp.send(fpdu[2][0], fpdu[2][1], payload, fpdu[10])
                    if info is not None and info.findings:
                        flagged += 1
                for stat in io:
                    stat.add_at(fpdu[1], fpdu[14], t0)
                pdus += 1
            elif type(item) is PduRecord:
                if ulp is not None:
                    ulp(item)
                if item.findings:
                    flagged += 1
                for stat in io:
                    stat.add(item, t0)
                pdus += 1
        self.pdus += pdus
        self.with_findings += flagged
        self.shown = self.pdus

    @staticmethod
    def _json(item: PduRecord, ulp_info: Any) -> dict[str, Any]:
        record = record_json(item)
        if ulp_info is not None:
            record.update(ulp_info.json_fields())
        return record

    def statistics(self, streams: list[StreamInfo]) -> list[str]:
        lines: list[str] = []
        if self.stats is not None:
            lines.extend(self.stats.render(streams))
        if self.conversations is not None:
            lines.extend(self.conversations.render(self.context.t0))
        for io in self.io:
            lines.extend(io.render())
        return lines

    def flush(self) -> None:
        if self.lines:
            self.lines.append("")
            text = "\n".join(self.lines)
            self.out.write(text.replace("\u2192", "->") if self.ascii else text)
            self.lines = []
