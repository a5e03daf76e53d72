"""The case model, the registry and its selection, the status rules and the exit status."""

from __future__ import annotations

import pytest

from stack.conform import (
    Case,
    CaseResult,
    DutRole,
    Outcome,
    Registry,
    SelectionError,
    Status,
    Verdict,
    exit_status,
    registry,
    select,
    status_for,
)
from stack.conform.model import CASE_ID, level_parts
from stack.rules import rule


async def _body(ctx: object) -> Verdict:
    return Verdict.met("ok")


def _case(case_id: str, level: str = "MUST", *rules: str, role: DutRole = DutRole.LISTENS) -> Case:
    base = CASE_ID.fullmatch(case_id)
    primary = base["rule"] if base is not None else case_id
    return Case(case_id, "t", (primary, *rules), level, role, "s", "e", _body)


# -- the catalog of cases ---------------------------------------------------------------


def test_every_case_names_catalogued_rules_and_a_part_of_its_level() -> None:
    cases = registry().cases
    assert len(cases) >= 40
    for c in cases:
        for rid in c.rules:
            rule(rid)  # raises for anything not catalogued
        assert c.level in level_parts(c.rule.level), c.id
        assert c.where in c.rule.sections, c.id
        assert c.sends and c.expects and c.title, c.id


def test_case_ids_are_rule_ids_numbered_without_gaps() -> None:
    cases = registry().cases
    ids = [c.id for c in cases]
    assert len(ids) == len(set(ids))
    by_rule: dict[str, list[int]] = {}
    for c in cases:
        m = CASE_ID.fullmatch(c.id)
        assert m is not None and m["rule"] == c.rules[0]
        by_rule.setdefault(m["rule"], []).append(int(m["n"] or 1))
    for numbers in by_rule.values():
        assert sorted(numbers) == list(range(1, len(numbers) + 1))


def test_both_dut_roles_have_mpa_startup_cases() -> None:
    for role in DutRole:
        chosen = select(["MPA"], role=role)
        assert {c.rule.sections[0][:3] for c in chosen} >= {"7.1"}
        assert all(c.role is role for c in chosen)


def test_registry_refuses_bad_cases() -> None:
    reg = Registry([])
    reg.add(_case("MPA-12"))
    with pytest.raises(ValueError, match="twice"):
        reg.add(_case("MPA-12"))
    with pytest.raises(ValueError, match="RULE or RULE.N"):
        reg.add(_case("mpa 12"))
    with pytest.raises(ValueError, match="not a part"):
        reg.add(_case("MPA-12.2", "SHOULD"))
    with pytest.raises(KeyError):
        reg.add(_case("MPA-99"))
    reg.add(_case("MPA-12.3"))
    with pytest.raises(ValueError, match="numbered"):
        reg.check_numbering()


def test_mixed_level_rules_need_the_part_named() -> None:
    from stack.conform.registry import case

    with pytest.raises(ValueError, match="which part"):
        case("MPA-23", "x", sends="s", expects="e")


# -- selection ------------------------------------------------------------------------------


def _ids(patterns: list[str], **kw: object) -> list[str]:
    return [c.id for c in select(patterns, **kw)]  # type: ignore[arg-type]


def test_select_by_case_rule_family_and_section() -> None:
    assert _ids(["MPA-12"]) == ["MPA-12", *(f"MPA-12.{n}" for n in range(2, 8))]
    assert _ids(["mpa_12.1"]) == ["MPA-12"]
    assert _ids(["MPA-20"]) == ["MPA-20", "MPA-20.2", "MPA-20.3", "MPA-20.4"]
    assert _ids(["MPA-20.3"]) == ["MPA-20.3"]
    assert set(_ids(["ERC"])) == {c.id for c in registry().cases if c.id.startswith("ERC-")}
    section = _ids(["5044/7.1.2"])
    assert "MPA-22" in section and "MPA-27" in section and "MPA-18" not in section
    assert _ids(["RFC6581/9.1"]) == ["ERC-04", "ERC-04.2", "ERC-06"]
    mpa_44 = ["MPA-11", "MPA-11.2", "MPA-11.3", "MPA-12", *(f"MPA-12.{n}" for n in range(2, 8))]
    assert _ids(["5044/4.4"]) == mpa_44
    bare = _ids(["§4.4"])  # §4.4 of each case's own document: RFC 5040 §4.4 too
    assert bare[: len(mpa_44)] == mpa_44 and "RDMAP-04" in bare and "DDP-06" not in bare


def test_select_restricts_by_role_and_keeps_catalog_order() -> None:
    listening = _ids(["MPA-20", "MPA-18"], role=DutRole.LISTENS)
    assert listening == ["MPA-18", "MPA-18.2", "MPA-20", "MPA-20.2", "MPA-20.3"]
    assert _ids(["MPA-20"], role=DutRole.CONNECTS) == ["MPA-20.4"]


@pytest.mark.parametrize("pattern", ["MPA-99", "XYZ", "5044/99", "MPA-12.9"])
def test_select_names_the_pattern_that_matches_nothing(pattern: str) -> None:
    with pytest.raises(SelectionError, match="names no case"):
        select([pattern])


# -- status and exit status -------------------------------------------------------------


@pytest.mark.parametrize(
    ("level", "outcome", "strict", "status"),
    [
        ("MUST", Outcome.MET, False, Status.PASS),
        ("MUST", Outcome.NOT_MET, False, Status.FAIL),
        ("SHOULD", Outcome.NOT_MET, False, Status.WARN),
        ("SHOULD", Outcome.NOT_MET, True, Status.FAIL),
        ("MAY", Outcome.NOT_MET, False, Status.WARN),
        ("SHOULD", Outcome.MET, True, Status.PASS),
        ("MUST", Outcome.DECLINED, True, Status.SKIP),
        ("MUST", Outcome.NOT_APPLICABLE, False, Status.SKIP),
        ("MUST", Outcome.BROKEN, False, Status.ERROR),
    ],
)
def test_status_rules(level: str, outcome: Outcome, strict: bool, status: Status) -> None:
    assert status_for(level, outcome, strict=strict) is status


def _result(status: Status) -> CaseResult:
    return CaseResult(_case("MPA-12"), status, Verdict.met("x"), 0.1)


@pytest.mark.parametrize(
    ("statuses", "code"),
    [
        ([], 0),
        ([Status.PASS, Status.SKIP, Status.WARN], 0),
        ([Status.PASS, Status.ERROR], 3),
        ([Status.ERROR, Status.FAIL], 1),
        ([Status.FAIL], 1),
    ],
)
def test_exit_status(statuses: list[Status], code: int) -> None:
    assert exit_status([_result(s) for s in statuses]) == code


def test_a_verdict_can_name_the_should_it_missed() -> None:
    v = Verdict.not_met("headers", rule="RDMAP-12", level="SHOULD", frame=7)
    r = CaseResult(_case("MPA-12", "MUST", "RDMAP-12"), Status.WARN, v, 0.0)
    assert (r.rule_not_met, r.level) == ("RDMAP-12", "SHOULD")
    d = r.to_dict()
    assert d["rule_not_met"] == "RDMAP-12" and d["frame"] == 7 and d["level"] == "MUST"
