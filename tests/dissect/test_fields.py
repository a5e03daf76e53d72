"""The field table (stack.dissect.fields): JSON keys in table order, no dead filter names."""

from __future__ import annotations

import json

import pytest

from stack.constants import TERM_RDMAP_INVALID_STAG
from stack.dissect import (
    FIELD_INFO,
    FIELDS,
    HEX_DIGITS,
    KIND_NAMES,
    compile_filter,
    json_line,
    json_object,
    record_json,
)
from stack.dissect.decoder import PduRecord, dissect
from stack.dissect.fields import (
    COMMON_KEYS,
    ENHANCED_KEYS,
    FPDU_KEYS,
    MPA_EXTRA_KEYS,
    MPA_KEYS,
    OPCODE_KEYS,
    SEGMENT_KEYS,
    TAIL_KEYS,
)
from stack.pcap import read_tcp_segments
from stack.wire.events import (
    AtomicRequest,
    AtomicResponse,
    ImmediateData,
    RdmaWrite,
    ReadRequest,
    ReadResponse,
    Send,
)
from stack.wire.terminate import build_terminate
from tests.dissect.synth import I2R, R2I, CaptureBuilder


def _records() -> list[PduRecord]:
    """Every record shape: enhanced and Rev 1 frames, every opcode, an undecodable ULPDU."""
    b = CaptureBuilder()
    c = b.connection(markers_r2i=True)
    c.send(I2R, Send(b"Hello, iWARP!"))
    c.send(I2R, Send(b"inv", invalidate_stag=0xCAFE))
    c.send(I2R, Send(b"inv", solicited=True, invalidate_stag=0xBEEF))
    c.send(I2R, RdmaWrite(0x00ABCDEF, 0x1000, bytes(range(1, 9))))
    (rr,) = c.send(I2R, ReadRequest(0x11223344, 0x2000, 0x400, 0x55667788, 0x3000))
    c.send(R2I, ReadResponse(0x11223344, 0x2000, bytes(0x400)))
    c.send(I2R, ImmediateData(bytes(range(1, 9))))
    c.send(I2R, ImmediateData(bytes(8), solicited=True))
    c.send(I2R, AtomicRequest.fetch_add(0xDEADBEEF, 0x0A0B0C0D, 0x4000, 1))
    c.send(R2I, AtomicResponse(0xDEADBEEF, 0x29))
    c.send(R2I, build_terminate(TERM_RDMAP_INVALID_STAG, rr))
    c.close()
    old = b.connection(rev=1)
    old.send(I2R, Send(b"rev 1"))
    old.raw(I2R, old.wire(I2R, bytes.fromhex("414300")))  # shorter than any DDP header
    old.close()
    recs = [r for r in dissect(read_tcp_segments(b.data())) if isinstance(r, PduRecord)]
    assert len(recs) == 17
    return recs


RECORDS = _records()


def _expected_keys(rec: PduRecord) -> tuple[str, ...]:
    if rec.kind != "fpdu":
        assert rec.mpa is not None
        word = ENHANCED_KEYS if rec.mpa.ird_ord is not None else ()
        return COMMON_KEYS + MPA_KEYS + word + MPA_EXTRA_KEYS + TAIL_KEYS
    extra = OPCODE_KEYS.get(rec.segment.opcode, ()) if rec.segment is not None else ()
    return COMMON_KEYS + FPDU_KEYS + SEGMENT_KEYS + extra + TAIL_KEYS


@pytest.mark.parametrize("index", range(len(RECORDS)))
def test_record_keys_are_the_table_groups_in_order(index: int) -> None:
    rec = RECORDS[index]
    assert tuple(record_json(rec)) == _expected_keys(rec)


def test_every_filter_field_occurs_in_some_record_and_no_record_has_another() -> None:
    seen = {key for rec in RECORDS for key in record_json(rec)}
    assert seen == FIELDS
    shapes = {
        ("fpdu", r.segment is not None) if r.mpa is None else (r.kind, r.mpa.ird_ord is not None)
        for r in RECORDS
    }
    both = (True, False)  # with and without the IRD/ORD word; decodable or not
    assert shapes == {(kind, x) for kind in ("mpa_req", "mpa_rep", "fpdu") for x in both}
    assert {rec.segment.opcode for rec in RECORDS if rec.segment is not None} >= set(OPCODE_KEYS)


def test_undecodable_ulpdu_names_what_its_first_bytes_say() -> None:
    (bad,) = [r for r in RECORDS if r.kind == "fpdu" and r.segment is None]
    got = record_json(bad)
    assert (got["tagged"], got["opcode"], got["opcode_name"]) == (False, 3, "Send")
    assert got["stag"] is None and got["msn"] is None and got["findings"]


def test_every_field_is_a_filter_name_that_selects_its_records() -> None:
    rows = [record_json(r) for r in RECORDS]
    for key in sorted(FIELDS):
        present = compile_filter(f"not {key} == null")
        assert [present(r) for r in rows] == [r.get(key) is not None for r in rows], key


def test_kind_names_match_the_json_types() -> None:
    kinds = {record_json(r)["type"] for r in RECORDS}
    assert kinds == {*KIND_NAMES, "fpdu"}


def test_hex_fields_are_exactly_the_stags_and_tagged_offsets() -> None:
    described = {key for key, (text, _) in FIELD_INFO.items()
                 if "stag" in text.lower() or "tagged offset" in text.lower()}  # fmt: skip
    assert set(HEX_DIGITS) == described
    assert {HEX_DIGITS[k] for k in described if "to" in k.split("_")} == {16}
    assert {HEX_DIGITS[k] for k in described if k.endswith("stag")} == {8}


def test_json_object_writes_stags_and_tos_in_hex_and_leaves_the_record_alone() -> None:
    for rec in RECORDS:
        record = record_json(rec)
        written = json_object(record)
        assert list(written) == list(record)
        assert json.loads(json_line(rec)) == written
        for key, value in record.items():
            if key in HEX_DIGITS and value is not None:
                assert isinstance(value, int)  # filters compare the numbers
                assert written[key] == f"0x{value:0{HEX_DIGITS[key]}x}"
            else:
                assert written[key] == value
    write = next(record_json(r) for r in RECORDS if r.segment and r.segment.opcode == 0)
    assert json_object(write)["stag"] == "0x00abcdef" and write["stag"] == 0x00ABCDEF
    assert json_object(write)["to"] == "0x0000000000001000"
    assert json_object(write, {"stag": 4})["stag"] == "0xabcdef"  # only the given keys
    assert json_object(write, {"stag": 4})["to"] == 0x1000
