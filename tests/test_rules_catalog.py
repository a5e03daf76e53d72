"""The rule catalog (stack.rules, ``iwarp rules``, docs/rules.md) is complete and cannot drift.

* It holds exactly MPA-01..28, ERC-01..13, DDP-01..13, RDMAP-01..16, EXT-01..11 and
  SEC-01..16, plus the KBTP and pseudo rules the code reports.
* Every rule ID written anywhere in stack/, kbtp/ or the docs is in it (a typo fails here).
* Every entry has a level, a document and a section; Terminate causes are the TermCode
  constants, and every (rule, Terminate) pair the code raises is listed.
* Every rule is named by a test (test name or docstring), apart from an explicit list.
"""

from __future__ import annotations

import ast
import dataclasses
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

import stack.constants as constants
from stack import rules
from stack.cli.iwarp import main as iwarp_main
from stack.constants import TERM_CODE_NAMES, TermCode
from stack.errors import ProtocolError
from stack.rules import LEVELS, Rule, UnknownRule, all_rules, by_prefix, by_section, rule, select

REPO = Path(__file__).resolve().parents[1]
SOURCES = sorted((REPO / "stack").rglob("*.py")) + sorted((REPO / "kbtp").rglob("*.py"))
CATALOG = REPO / "stack" / "rules.py"
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
RULES_MD = REPO / "docs" / "rules.md"
RANGES = {"MPA": 28, "ERC": 13, "DDP": 13, "RDMAP": 16, "EXT": 11, "SEC": 16}
"""The RFC rule families and their last number: the whole ID space of the RFC rules."""
FAMILY_RFC = {"MPA": 5044, "ERC": 6581, "DDP": 5041, "RDMAP": 5040, "EXT": 7306}
SEC_RFCS = {5040, 5041, 5042}

MENTION = re.compile(r"\b(?:MPA|ERC|DDP|RDMAP|EXT|SEC|KBTP)-\d+(?:\.\d+)?\b|\bTCP-GAP\b")
"""A rule ID of a known family anywhere in a text (comments and docstrings included)."""
ID_LITERAL = re.compile(r"[A-Z][A-Z0-9]*-[0-9]+(?:\.[0-9]+)?")
"""A string literal shaped like a rule ID, whatever its family."""

NOT_NAMED_BY_A_TEST = {
    "SEC-14": "IPsec: the stack runs over plain TCP and has no IPsec of its own; protecting "
    "the network path is the host's configuration, which no userspace test can exhibit",
    "SEC-16": "firmware: a userspace software RNIC loads no firmware",
    "TCP-GAP": "a pseudo rule (a capture fact, not a requirement); "
    "tests/dissect/test_stream.py::test_gap_is_reported_and_decoding_resumes asserts it",
}
"""Catalog rules no test names, each with the reason."""


def _expected_rfc_ids() -> set[str]:
    return {f"{family}-{n:02d}" for family, last in RANGES.items() for n in range(1, last + 1)}


def _trees() -> list[tuple[Path, ast.Module]]:
    return [(path, ast.parse(path.read_text(), str(path))) for path in SOURCES]


def _rule_first_errors() -> set[str]:
    """ProtocolError classes whose first constructor argument is the rule ID."""
    import inspect

    import kbtp.messages  # noqa: F401 - registers KbtpError as a subclass

    found: set[str] = set()
    todo = [ProtocolError]
    while todo:
        cls = todo.pop()
        todo.extend(cls.__subclasses__())
        params = list(inspect.signature(cls.__init__).parameters)
        if params[1:2] == ["rule"]:
            found.add(cls.__name__)
    return found


def _call_name(node: ast.Call) -> str:
    f = node.func
    return f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""


# -- completeness ----------------------------------------------------------------------


def test_the_catalog_holds_exactly_the_rfc_rule_ranges_plus_kbtp_and_pseudo_rules() -> None:
    ids = [r.id for r in all_rules()]
    assert len(ids) == len(set(ids)), "duplicate IDs"
    rfc = {i for i in ids if i.split("-")[0] in RANGES}
    assert rfc == _expected_rfc_ids()
    others = {r.id for r in all_rules() if r.layer not in RANGES}
    assert {r.layer for r in all_rules() if r.id in others} == {"KBTP", "TCP"}
    assert {r.id for r in all_rules() if r.pseudo} == {"TCP-GAP"}
    # The non-RFC entries are exactly the ones the code reports.
    used = {m for path in SOURCES if path != CATALOG for m in MENTION.findall(path.read_text())}
    assert others == {i for i in used if i.split("-")[0] in ("KBTP", "TCP")}


def _is_case_id(text: str, known: set[str]) -> bool:
    """A conformance case ID (``iwarp conform``): a catalogued RFC rule plus ``.N``, the
    N-th case of that rule (KBTP rule IDs have dots of their own and are not cases)."""
    base, dot, number = text.rpartition(".")
    return bool(dot) and number.isdigit() and base in known and base.split("-")[0] in RANGES


def test_every_rule_id_written_in_the_sources_and_docs_is_catalogued() -> None:
    """Mentions in code, comments, docstrings and the docs; a typo such as DDP-14 fails.
    Conformance case IDs (``MPA-12.2``) count when their rule is catalogued."""
    known = {r.id for r in all_rules()}
    unknown = {
        f"{path.relative_to(REPO)}: {m}"
        for path in [*SOURCES, *DOCS]
        if path not in (CATALOG, RULES_MD)
        for m in MENTION.findall(path.read_text())
        if m not in known and not _is_case_id(m, known)
    }
    assert not unknown, sorted(unknown)


def test_every_rule_shaped_literal_and_rule_argument_in_the_code_is_catalogued() -> None:
    """String literals shaped like an ID, and the rule argument of every ProtocolError,
    Finding, ``Checker.note`` and ``rule=`` keyword or default, whatever their family."""
    known = {r.id for r in all_rules()}
    errors = _rule_first_errors() | {"Finding", "note"}
    bad: list[str] = []
    for path, tree in _trees():
        if path == CATALOG:
            continue
        where = path.relative_to(REPO)
        for node in ast.walk(tree):
            values: list[ast.expr] = []
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                if ID_LITERAL.fullmatch(node.value):
                    values.append(node)
            elif isinstance(node, ast.Call):
                if _call_name(node) in errors and node.args:
                    values.append(node.args[0])
                values += [k.value for k in node.keywords if k.arg == "rule"]
            elif isinstance(node, ast.arguments):
                positional = [*node.posonlyargs, *node.args]
                names = [a.arg for a in positional[len(positional) - len(node.defaults) :]]
                values += [d for n, d in zip(names, node.defaults, strict=True) if n == "rule"]
                values += [
                    d
                    for a, d in zip(node.kwonlyargs, node.kw_defaults, strict=True)
                    if a.arg == "rule" and d
                ]
            for value in values:
                if isinstance(value, ast.Constant) and isinstance(value.value, str):
                    conform = where.parts[:2] in (("stack", "conform"), ("stack", "interop"))
                    if value.value not in known and not (
                        conform and _is_case_id(value.value, known)
                    ):
                        bad.append(f"{where}:{value.lineno}: {value.value!r}")
    assert not bad, bad


# -- entries ---------------------------------------------------------------------------


def test_every_entry_has_a_level_a_document_and_sections() -> None:
    level = re.compile(rf"(?:{'|'.join(LEVELS)})(?:/(?:{'|'.join(LEVELS)}))?")
    kbtp_doc = (REPO / "docs" / "kbtp.md").read_text()
    for r in all_rules():
        assert r.pseudo or level.fullmatch(r.level), r.id
        assert not r.pseudo or r.level == "NOTE", r.id
        assert r.refs and all(ref.section for ref in r.refs), r.id
        assert r.text and "\n" not in r.text and len(r.text) <= 90, r.id
        assert r.layer == r.id.split("-")[0]
        if r.layer in FAMILY_RFC:
            assert r.rfc == FAMILY_RFC[r.layer], r.id
        elif r.layer == "SEC":
            assert {ref.rfc for ref in r.refs} & SEC_RFCS and r.rfc in SEC_RFCS, r.id
        elif r.layer == "KBTP":
            assert r.doc == "docs/kbtp.md" and r.rfc is None
            (section,) = r.sections
            assert re.search(rf"^#+ {re.escape(section)}\.? ", kbtp_doc, re.M), r.id
        for ref in r.refs:
            assert ref.doc == "docs/kbtp.md" or re.fullmatch(r"RFC \d{4}", ref.doc), r.id
            assert re.fullmatch(r"[0-9A-Z][0-9A-Za-z.]*(\(\d+\))?", ref.section), (r.id, ref)


def test_entries_are_frozen() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        rule("MPA-12").text = "changed"  # type: ignore[misc]


def test_terminates_are_termcode_constants() -> None:
    constant_values = {
        v for k, v in vars(constants).items() if k.startswith("TERM_") and isinstance(v, TermCode)
    }
    assert constant_values == set(TERM_CODE_NAMES)
    for r in all_rules():
        assert len(set(r.terminates)) == len(r.terminates), r.id
        for t in r.terminates:
            assert type(t) is TermCode and t in constant_values, (r.id, t)
        names = [t["name"] for t in r.to_dict()["terminates"]]
        assert names == [TERM_CODE_NAMES[t] for t in r.terminates]


def test_every_terminate_the_code_raises_for_a_rule_is_in_its_entry() -> None:
    """``RdmapError("EXT-05", ..., TERM_RDMAP_CATASTROPHIC_STREAM)`` and the like: the
    Terminate (a TERM_* constant, or a module-level alias of one) is listed for the rule."""
    errors = _rule_first_errors() | {"Finding"}
    missing: list[str] = []
    pairs = 0
    for path, tree in _trees():
        aliases = {
            t.id: node.value.id
            for node in tree.body
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Name)
            for t in node.targets
            if isinstance(t, ast.Name)
        }
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Call) and _call_name(node) in errors and node.args):
                continue
            first = node.args[0]
            if not (isinstance(first, ast.Constant) and isinstance(first.value, str)):
                continue
            for arg in [*node.args[1:], *(k.value for k in node.keywords)]:
                if not isinstance(arg, ast.Name):
                    continue
                term = getattr(constants, aliases.get(arg.id, arg.id), None)
                if isinstance(term, TermCode):
                    pairs += 1
                    if term not in rule(first.value).terminates:
                        where = f"{path.relative_to(REPO)}:{node.lineno}"
                        missing.append(f"{where}: {first.value} raises {term}")
    assert pairs > 30  # the scan sees the code's errors
    assert not missing, missing


# -- lookup ----------------------------------------------------------------------------


def test_lookup_by_id_prefix_and_section() -> None:
    r = rule("MPA-12")
    assert isinstance(r, Rule) and r.rfc == 5044 and r.sections == ("4.4",)
    assert r.level == "MUST" and constants.TERM_LLP_CRC_ERROR in r.terminates
    assert rule("mpa_12") is r and rule(" Mpa-12 ") is r
    assert rule("MPA-23").level == "SHOULD/MUST"
    assert rule("SEC-12").ulp and not rule("SEC-01").ulp
    assert [x.id for x in by_prefix("DDP")] == [f"DDP-{n:02d}" for n in range(1, 14)]
    assert [x.id for x in by_prefix("rdmap-1")] == [f"RDMAP-{n}" for n in range(10, 17)]
    assert by_prefix("XYZ") == () and by_prefix("") == ()
    in_7_1 = {x.id for x in by_section(5044, "7.1")}
    assert {"MPA-17", "MPA-18", "MPA-26"} <= in_7_1 and "MPA-15" not in in_7_1
    assert {x.id for x in by_section("RFC 5040", "8.1.1")} >= {"SEC-01", "SEC-16"}
    assert {x.id for x in by_section("rfc5042", "§6.1.1")} >= {"SEC-01", "SEC-02", "SEC-03"}
    assert [x.id for x in by_section("docs/kbtp.md", "5")] == ["KBTP-5", "KBTP-5.1", "KBTP-5.2"]
    assert select([]) == all_rules()
    assert [x.id for x in select(["SEC-03", "MPA-12", "mpa-12"])] == ["MPA-12", "SEC-03"]
    assert [x.id for x in select(["KBTP-5"])] == ["KBTP-5"]  # an exact ID is not a prefix


def test_unknown_ids_are_a_key_error_with_one_clear_line() -> None:
    with pytest.raises(KeyError) as info:
        rule("DDP-14")
    assert isinstance(info.value, UnknownRule)
    message = str(info.value)
    assert message.startswith("unknown rule 'DDP-14'") and "\n" not in message
    assert "MPA, ERC, DDP, RDMAP, EXT, SEC" in message
    with pytest.raises(UnknownRule):
        select(["MPA-12", "nosuch"])


def test_groups_follow_the_documents_and_their_sections() -> None:
    grouped = rules.groups()
    assert [f.prefix for f, _ in grouped] == [f.prefix for f in rules.FAMILIES]
    assert sum(len(members) for _, members in grouped) == len(all_rules())
    rdmap = next(members for f, members in grouped if f.prefix == "RDMAP")
    order = [x.id for x in rdmap]
    assert order.index("RDMAP-11") < order.index("RDMAP-05")  # §4.8 before §5.1


# -- the command -----------------------------------------------------------------------


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = iwarp_main(["rules", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def _rule_lines(out: str) -> list[str]:
    return [line.split()[0] for line in out.splitlines() if line.startswith("  ")]


def test_command_lists_by_prefix_and_by_id(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(["DDP"], capsys)
    assert code == 0 and out.startswith("RFC 5041  DDP: Direct Data Placement\n")
    assert sorted(_rule_lines(out)) == [f"DDP-{n:02d}" for n in range(1, 14)]
    code, out, _ = _run(["MPA-12", "sec_03"], capsys)
    assert code == 0 and _rule_lines(out) == ["MPA-12", "SEC-03"]
    line = next(ln for ln in out.splitlines() if ln.startswith("  MPA-12"))
    assert line.split()[1:3] == ["MUST", "§4.4"] and line.endswith(rule("MPA-12").text)
    code, out, _ = _run(["-v", "MPA-12"], capsys)
    assert "Terminate: 2/0/0x02 MPA CRC error" in out
    code, out, _ = _run([], capsys)
    assert len(_rule_lines(out)) == len(all_rules())


def test_command_json(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(["--json", "EXT-05", "KBTP"], capsys)
    assert code == 0
    data = json.loads(out)
    assert [d["id"] for d in data] == [
        "EXT-05",
        "KBTP-4.2",
        "KBTP-5",
        "KBTP-5.1",
        "KBTP-5.2",
        "KBTP-9.3",
    ]
    ext = data[0]
    assert (ext["rfc"], ext["sections"], ext["level"]) == (7306, ["5.1", "8.2"], "MUST")
    assert ext["terminates"] == [
        {"layer": 0, "etype": 2, "code": 7, "name": "Catastrophic error, localized to RDMAP Stream"}
    ]
    assert data[1]["rfc"] is None and data[1]["doc"] == "docs/kbtp.md"


def test_command_unknown_id_is_exit_2_and_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _run(["MPA-12", "DDP-99"], capsys)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("iwarp rules: error: unknown rule 'DDP-99'")


def test_command_starts_without_trio_or_the_stack() -> None:
    """``iwarp rules`` imports only the catalog, the constants and the CLI helpers."""
    code = (
        "import sys\n"
        "from stack.cli.iwarp import main\n"
        "rc = main(['rules', 'MPA-12'])\n"
        "print('MODULES', ' '.join(sorted(sys.modules)), file=sys.stderr)\n"
        "raise SystemExit(rc)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    line = next(ln for ln in done.stderr.splitlines() if ln.startswith("MODULES "))
    loaded = set(line.split()[1:])
    assert {"stack.cli.rules", "stack.rules"} <= loaded
    heavy = {"trio", "scapy", "stack.wire", "stack.rnic", "stack.dissect", "stack.cli.dissect"}
    assert not heavy & loaded


def test_docs_rules_md_is_the_generated_markdown(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(["--markdown"], capsys)
    assert code == 0
    assert RULES_MD.read_text() == out, (
        "docs/rules.md is out of date; regenerate it with "
        "`PYTHONPATH=. python -m stack.cli.iwarp rules --markdown > docs/rules.md`"
    )


# -- every rule is named by a test -----------------------------------------------------


def _named_by_tests() -> set[str]:
    """Rule IDs named by a test's name or docstring (``test_ext_07_...``, "EXT-07"); IDs and
    texts compared in lower case with ``-`` and ``.`` read as ``_``."""
    test_files = [
        *(REPO / "tests").rglob("test_*.py"),
        *(REPO / "stack" / "interop").rglob("test_*.py"),
    ]
    texts: list[str] = []
    for path in test_files:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name.startswith(
                "test"
            ):
                texts.append(node.name + " " + (ast.get_docstring(node) or ""))
    corpus = re.sub(r"[-.]", "_", "\n".join(texts).lower())
    named = set()
    for r in all_rules():
        key = re.sub(r"[-.]", "_", r.id.lower())
        if re.search(rf"(?<![a-z0-9]){re.escape(key)}(?!_?\d)", corpus):
            named.add(r.id)
    return named


def test_every_rule_is_named_by_a_test_except_the_listed_ones() -> None:
    named = _named_by_tests()
    unnamed = {r.id for r in all_rules()} - named
    assert unnamed == set(NOT_NAMED_BY_A_TEST), (
        f"not named by any test: {sorted(unnamed - set(NOT_NAMED_BY_A_TEST))}; "
        f"listed as untestable but now named: {sorted(set(NOT_NAMED_BY_A_TEST) & named)}"
    )
