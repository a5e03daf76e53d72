"""The display-filter language (stack.dissect.filters): operators, literals, fields, errors."""

from __future__ import annotations

import pytest

from stack.dissect import FilterError, compile_filter

RECORD = {"opcode": 3, "opcode_name": "Send", "findings": ["MPA-12", "DDP-05"], "stag": None,
          "crc_ok": False, "src": "10.0.0.1:5", "tagged": False, "msn": 0x10}  # fmt: skip


@pytest.mark.parametrize(
    "expr, expected",
    [
        ("opcode == 3", True),
        ("opcode != 3", False),
        ("msn == 0x10 and msn >= 16 and msn < 17", True),
        ('opcode_name == "Send" && !tagged', True),
        ("not (opcode == 3 or opcode == 4)", False),
        ("opcode == 4 or opcode == 3 and crc_ok == false", True),
        ('findings contains "DDP-05"', True),
        ('src contains "10.0.0"', True),
        ("stag == null and stag != 0", True),
        ("to == null", True),
        ("to > 0", False),
        ("opcode in (1, 3, 5)", True),
        ("crc_ok", False),
        ("findings", True),
        ("stag", False),
        ('opcode_name > "A"', True),
        ("tagged == 0", False),
    ],
)
def test_filter_language(expr: str, expected: bool) -> None:
    assert bool(compile_filter(expr)(RECORD)) is expected


@pytest.mark.parametrize(
    "expr", ["", "opcode ==", "(opcode == 1", "opcode = 1", "bogus == 1", "opcode in 1", "1 2"]
)
def test_filter_errors(expr: str) -> None:
    with pytest.raises(FilterError):
        compile_filter(expr)


def test_upper_layer_prefixes_widen_the_field_names() -> None:
    with pytest.raises(FilterError, match="unknown field 'kbtp_opcode'"):
        compile_filter("kbtp_opcode == 16")
    pred = compile_filter("kbtp_opcode == 16 and opcode == 3", field_prefixes=("kbtp_",))
    assert pred({**RECORD, "kbtp_opcode": 16}) and not pred(RECORD)


@pytest.mark.parametrize(
    "text",
    [
        "opcode == " + "1" * 4301,  # past Python's integer digit limit
        "(" * 300 + "opcode" + ")" * 300,  # nesting the parser recursed into
        "(" * 250,  # unbalanced, within the token limit
        "(" * 65 + "opcode" + ")" * 65,  # one level past MAX_FILTER_DEPTH
        "!" * 1000 + "opcode",
        " or ".join(["opcode == 1"] * 1000),  # a chain the predicate recursed into
        " and ".join(["opcode"] * 1000),
    ],
)
def test_hostile_filters_are_filter_errors_not_crashes(text: str) -> None:
    with pytest.raises(FilterError):
        compile_filter(text)


def test_a_filter_nested_to_the_limit_still_compiles() -> None:
    predicate = compile_filter("(" * 32 + "!" * 32 + "opcode == 1" + ")" * 32)  # 64 levels
    assert predicate({"opcode": 1}) and not predicate({"opcode": 2})


def test_a_long_filter_within_the_limit_still_compiles() -> None:
    predicate = compile_filter(" or ".join(["opcode == 1"] * 60))  # 239 tokens
    assert predicate({"opcode": 1}) and not predicate({"opcode": 2})
