"""``kbtp conform``: the status rules of docs/kbtp.md §7 checked against a target over the
binding, passing on this project's targets and failing, with what was observed, on one
that breaks a rule."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from pathlib import Path
from xml.etree import ElementTree

import pytest
import trio

from kbtp.conform import CASES
from kbtp.conform_runner import ERROR, FAIL, PASS, SKIP, CaseResult, Probe, run_cases
from kbtp.constants import Status
from kbtp.target_core import TargetCore
from kbtp.target_state import SessionState
from stack.wire.events import MpaSettings
from tests.installed import run_command, started_target
from tests.kbtp.test_binding_ops import serving

TIMEOUT = 2.0


async def conform(
    port: int, names: tuple[str, ...] = (), identity: str = "a"
) -> dict[str, CaseResult]:
    cases = tuple(c for c in CASES if c.name in names) if names else CASES
    probe = Probe("127.0.0.1", port, identity, MpaSettings(), TIMEOUT)
    results = await run_cases(probe, cases, lambda result: None)
    return {r.case.name: r for r in results}


def test_every_status_of_the_table_that_a_case_checks_has_one() -> None:
    names = [case.name for case in CASES]
    assert len(names) == len(set(names))
    statuses = {case.expect for case in CASES}
    # What no case reaches from an ordinary identity over the binding (BIND and RECORD need
    # the direct modes, the rest a broken initiator buffer or target, or a stream the
    # binding refuses to open): named here so a new status gets a case or a reason.
    unchecked = {
        Status.TICKET_ABANDONED, Status.BAD_BIND,
        Status.REMOTE_ACCESS_ERROR, Status.TARGET_FAILURE, Status.IRD_ORD_TOO_LOW,
    }  # fmt: skip
    assert statuses | unchecked == set(Status)


@pytest.mark.both_targets
@pytest.mark.parametrize("identity", ["a", "c"])  # c: granted both direct modes
async def test_this_projects_targets_pass_every_case(identity: str) -> None:
    expected = {case.name: PASS for case in CASES}
    if identity == "c":  # granted DIRECT_ALLOC: no BIND of its is refused as not offered
        expected["NOT_OFFERED.bind"] = SKIP
    with trio.fail_after(60):
        async with serving() as target:
            results = await conform(target.port, identity=identity)
            verdicts = {name: r.verdict for name, r in results.items()}
            assert verdicts == expected, {
                name: r.observed for name, r in results.items() if r.verdict != PASS
            }
            # The runner left nothing bound: its identity's usage is back to none.
            assert target.core.usage(identity.encode()) == 0


async def test_a_target_that_counts_answers_already_seen_fails_the_pipelined_case(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A target counting one request too many (an answer the initiator has seen still
    counted as outstanding, §9.2) refuses an initiator within its credits: SUCCESS.pipelined
    FAILs saying so, while a case one request at a time still PASSes."""

    def over_credit(self: TargetCore, sess: SessionState) -> bool:
        counted = sess.inflight + sess.uncredited + sess.offloaded + 1
        return counted >= self.config.request_credits

    monkeypatch.setattr(TargetCore, "_over_credit", over_credit)
    with trio.fail_after(60):
        async with serving() as target:
            results = await conform(target.port, ("SUCCESS.pipelined", "SUCCESS"))
    pipelined = results["SUCCESS.pipelined"]
    assert pipelined.verdict == FAIL and "CREDIT_EXCEEDED" in pipelined.observed
    assert "within the credits (4)" in pipelined.observed, pipelined.observed
    assert results["SUCCESS"].verdict == PASS


async def test_a_target_that_takes_a_second_hello_fails_that_case(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The session rule broken (a second HELLO handled as a first one): BAD_OPCODE.hello
    FAILs with what the target answered instead; the other cases still PASS."""
    import kbtp.target_core as target_core

    real = target_core.target_refusal
    monkeypatch.setattr(
        target_core, "target_refusal", lambda op, done: None if op == 0x01 else real(op, done)
    )
    with trio.fail_after(60):
        async with serving() as target:
            results = await conform(target.port, ("BAD_OPCODE.hello", "SUCCESS", "NOT_VALID"))
    hello = results["BAD_OPCODE.hello"]
    assert hello.verdict == FAIL and "not BAD_OPCODE" in hello.observed, hello.observed
    assert results["SUCCESS"].verdict == results["NOT_VALID"].verdict == PASS


async def test_a_target_that_keeps_a_session_after_a_fatal_status_fails_kbtp_9_3(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Answered, but not closed (KBTP-9.3): the fatal cases FAIL saying so, within the
    runner's timeout; a status that is not fatal still PASSes."""
    monkeypatch.setattr(TargetCore, "_close", lambda *args: None)
    with trio.fail_after(60):
        async with serving() as target:
            results = await conform(target.port, ("BAD_VERSION", "MALFORMED.status"))
    version = results["BAD_VERSION"]
    assert version.verdict == FAIL
    assert "did not end within 2 s (KBTP-9.3)" in version.observed, version.observed
    assert results["MALFORMED.status"].verdict == PASS


async def test_no_session_is_an_error_for_every_case_at_once() -> None:
    with socket.socket() as unlistened:
        unlistened.bind(("127.0.0.1", 0))
        port = unlistened.getsockname()[1]
        with trio.fail_after(30):
            results = await conform(port)
    assert {r.verdict for r in results.values()} == {ERROR}
    assert all(r.observed.startswith("not run: no session") for r in results.values())


def test_case_names_are_what_list_shows() -> None:
    listed = run_command("kbtp", "conform", "--list", "--json", "-")
    assert listed.returncode == 0, listed.stderr
    doc = json.loads(listed.stdout)
    assert [c["name"] for c in doc["cases"]] == [case.name for case in CASES]
    assert [c["fatal"] for c in doc["cases"]] == [case.fatal for case in CASES]


@pytest.fixture(scope="module")
def target_process() -> Iterator[int]:
    with started_target("--block-size", "16K", "--quiet") as port:
        yield port


def test_the_command_reports_every_case_and_exits_0(target_process: int, tmp_path: Path) -> None:
    junit = tmp_path / "kbtp-conform.xml"
    result = run_command(
        "kbtp", "conform", "--identity", "init-1", "--json", "-", f"127.0.0.1:{target_process}",
        "--junit", str(junit),
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    (suite,) = ElementTree.parse(junit).getroot()  # one suite: this target, this identity
    assert suite.get("tests") == str(len(CASES)) and suite.get("failures") == "0"
    assert [case.get("name", "").split()[0] for case in suite] == [c.name for c in CASES]
    doc = json.loads(result.stdout)
    assert doc["exit_status"] == 0 and doc["target"]["block_size_bytes"] == 16 << 10
    assert [r["verdict"] for r in doc["results"]] == [PASS] * len(CASES)
    assert (
        f"{len(CASES)} cases: {len(CASES)} passed" in result.stderr
    )  # the text report moves to stderr


@pytest.mark.parametrize(
    ("argv", "status", "message"),
    [
        (["NO_SUCH_CASE"], 2, "unknown case 'NO_SUCH_CASE'"),
        (["--identity", "nobody", "SUCCESS"], 3, "not run: no session with the target"),
        (["--timeout", "0", "SUCCESS"], 2, "must be more than 0 seconds"),
        (["--identity", "", "SUCCESS"], 2, "an identity is at least one octet"),
        (["--identity", "x" * 257, "SUCCESS"], 2, "identity longer than 256 octets"),
        (["--json", "-", "--junit", "-", "SUCCESS"], 2, "cannot both go to stdout"),
    ],
)
def test_command_errors(target_process: int, argv: list[str], status: int, message: str) -> None:
    *options, case = argv  # options between the target and the case
    result = run_command("kbtp", "conform", f"127.0.0.1:{target_process}", *options, case)
    assert result.returncode == status, result.stdout + result.stderr
    assert message in result.stdout + result.stderr
    assert "Traceback" not in result.stderr


def test_a_target_is_needed_unless_listing() -> None:
    result = run_command("kbtp", "conform")
    assert result.returncode == 2 and "give the target's HOST[:PORT]" in result.stderr
    nowhere = run_command("kbtp", "conform", "127.0.0.1:0")  # port 0: nothing to connect to
    assert nowhere.returncode == 2 and "port must be 1 to 65535 to connect to" in nowhere.stderr
