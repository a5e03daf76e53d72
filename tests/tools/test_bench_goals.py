"""``iwarp bench goals``: the speed goals measured in one run, each with its verdict."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from stack.bench import goals
from stack.bench.goals import GOALS, Measurement, judge
from tests.installed import run_command

GOAL = {g.key: g for g in GOALS}


def _iwarp(*argv: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """``iwarp ...`` as the installed command runs it, outside the checkout."""
    return run_command("stack", *argv, timeout=timeout)


def _bw_doc(ratio: float, mib_s: float = 1000.0) -> dict[str, Any]:
    return {"results": [{"ratio": ratio, "bw_average_mib_per_s": mib_s}]}


def _kbtp_doc(mooncake: bool, floor: bool = False) -> dict[str, Any]:
    """A ``kbtp bench --json`` document: KBTP at half its raw baseline; ``floor``: the
    floor's figures too (``--floor``), at 0.75 of raw, 2.1 GB/s and 60 µs per op."""
    rows = []
    for size in (65536, 1 << 20):
        for op, gbps, cpu in (
            ("STORE", 0.7, 180.0),
            ("LOAD", 0.9, 140.0),
            ("ALLOC_STORE", 0.5, 236.0),
        ):
            row: dict[str, Any] = {
                "operation": op,
                "size_bytes": size,
                "gbyte_per_s": gbps,
                "cpu_us_per_op": cpu,
                "ratio": gbps / 2.0,
            }
            if mooncake and op != "ALLOC_STORE":
                row["mooncake"] = {"gbyte_per_s": 2.8, "cpu_us_per_op": 40.0}
            row["floor"] = {"gbyte_per_s": 2.1, "cpu_us_per_op": 60.0} if floor else None
            row["floor_ratio"] = 0.75 if floor else None
            rows.append(row)
    return {"results": rows}


def test_a_ratio_goal_is_met_at_its_target_and_not_below() -> None:
    goal = GOAL["write-64k"]
    assert judge(goal, {"write-64k": _bw_doc(0.8)}, {}, {}).met is True
    low = judge(goal, {"write-64k": _bw_doc(0.79)}, {}, {})
    assert low.met is False and low.verdict() == "no" and low.shown == "0.79"


def test_an_at_most_goal_is_met_at_or_below_its_target() -> None:
    goal = GOAL["read-lat"]
    assert judge(goal, {"read-lat": _bw_doc(1.5)}, {}, {}).met is True
    assert judge(goal, {"read-lat": _bw_doc(1.51)}, {}, {}).met is False


def test_markers_cost_is_the_loss_against_the_same_runs_plain_write() -> None:
    docs = {"write-1m": _bw_doc(0.7, 3000.0), "write-1m-markers": _bw_doc(0.5, 2400.0)}
    result = judge(GOAL["markers-1m"], docs, {}, {"markers": 0.31})
    assert result.measured == pytest.approx(0.2)
    assert result.met is False
    # The pure-Python floor itself loses 31 % to markers: the 15 % target lies beyond it.
    assert result.beyond_floor() and result.verdict() == "no: target beyond this host's floor"
    assert judge(GOAL["markers-1m"], docs, {}, {"markers": 0.1}).verdict() == "no"


def test_a_goal_whose_floor_reaches_the_target_is_not_called_beyond_it() -> None:
    result = judge(GOAL["write-1m"], {"write-1m": _bw_doc(0.66)}, {}, {"1M": 0.95})
    assert result.floor == 0.95 and not result.beyond_floor() and result.verdict() == "no"
    below = judge(GOAL["write-1m"], {"write-1m": _bw_doc(0.66)}, {}, {"1M": 0.67})
    assert below.beyond_floor()
    assert below.document()["beyond_floor"] is True


def test_kbtp_goals_against_mooncake_take_the_worse_of_store_and_load() -> None:
    docs = {"kbtp": _kbtp_doc(mooncake=True)}
    speed = judge(GOAL["kbtp-mc-64k"], docs, {}, {})
    assert speed.measured == pytest.approx(0.7 / 2.8) and speed.shown == "0.25 / 0.32"
    cpu = judge(GOAL["kbtp-cpu-1m"], docs, {}, {})
    assert cpu.measured == pytest.approx(180.0 / 40.0) and cpu.met is False
    alloc = judge(GOAL["kbtp-alloc-64k"], docs, {}, {})
    assert alloc.measured == pytest.approx(0.25) and alloc.met is False


def test_kbtp_goals_take_their_floor_from_kbtp_bench_floor() -> None:
    """``kbtp bench --floor`` in the same document: the raw goals take its floor/raw, the
    Mooncake goals the floor's figures over Mooncake's; without it, no floor."""
    docs = {"kbtp": _kbtp_doc(mooncake=True, floor=True)}
    store = judge(GOAL["kbtp-store-64k"], docs, {}, {})
    assert store.floor == 0.75 and store.beyond_floor()
    assert store.verdict() == "no: target beyond this host's floor"
    alloc = judge(GOAL["kbtp-alloc-64k"], docs, {}, {})
    assert alloc.floor == 0.75 and not alloc.beyond_floor()
    speed = judge(GOAL["kbtp-mc-64k"], docs, {}, {})
    assert speed.floor == pytest.approx(2.1 / 2.8) and speed.beyond_floor()
    cpu = judge(GOAL["kbtp-cpu-1m"], docs, {}, {})
    assert cpu.floor == pytest.approx(60.0 / 40.0) and cpu.beyond_floor()
    # With -r, the floor's median over its own runs (KBTP's median run is the one printed).
    docs["kbtp"]["results"][0]["repeats"] = {"floor_ratios": [0.9, 0.5, 0.6]}
    assert judge(GOAL["kbtp-store-64k"], docs, {}, {}).floor == 0.6
    plain = judge(GOAL["kbtp-store-64k"], {"kbtp": _kbtp_doc(mooncake=True)}, {}, {})
    assert plain.floor is None and plain.met is False
    assert "--floor" in goals.MEASUREMENTS["kbtp"].args


def test_without_mooncake_its_goals_say_why_and_the_others_stand() -> None:
    docs = {"kbtp": _kbtp_doc(mooncake=False)}
    docs["kbtp"]["mooncake_problem"] = "Mooncake needs mooncake-transfer-engine-non-cuda"
    result = judge(GOAL["kbtp-mc-64k"], docs, {}, {})
    assert result.met is None and result.verdict() == "not measured"
    assert "mooncake-transfer-engine-non-cuda" in result.note
    assert judge(GOAL["kbtp-load-64k"], docs, {}, {}).met is False


def test_a_failed_benchmark_leaves_its_goals_unmeasured_with_the_reason() -> None:
    result = judge(
        GOAL["markers-1m"], {"write-1m": _bw_doc(0.7)}, {"write-1m-markers": "exit 2"}, {}
    )
    assert result.met is None and result.note == "write-1m-markers: exit 2"


def test_a_benchmark_that_fails_for_real_is_reported_not_raised(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A real ``iwarp bench`` process that refuses its arguments: the goal says so, the run
    goes on with the other goals and reports the failure."""
    broken = Measurement("write-64k", "iwarp", ("write", "-s", "0"))
    monkeypatch.setitem(goals.MEASUREMENTS, "write-64k", broken)
    run = goals.run_goals(["write-64k", "read-lat"], 0.2, 1, with_floor=False, progress=None)
    bad, good = run.results
    assert bad.goal.key == "write-64k" and bad.met is None
    assert "exit 2" in run.failures["write-64k"] and "exit 2" in bad.note
    assert good.goal.key == "read-lat" and good.measured is not None and good.measured > 0
    assert good.met == (good.measured <= 1.5)
    document = goals.goals_document(run, 0.2, 1)
    assert document["verdict"] == "failed" and "write-64k" in document["failed_measurements"]


def test_round_trip_goals_say_which_driver_measured_them() -> None:
    """The blocking driver's rows take only a document of the blocking driver, the trio
    driver's only one of trio (a document without the field is of trio)."""
    blocking = {"parameters": {"driver": "blocking"}, **_bw_doc(1.3)}
    assert judge(GOAL["read-lat-blk"], {"read-lat-blk": blocking}, {}, {}).met is True
    wrong = judge(GOAL["read-lat-blk"], {"read-lat-blk": _bw_doc(1.3)}, {}, {})
    assert wrong.met is None and "trio driver, not the blocking" in wrong.note
    trio_row = judge(GOAL["read-lat"], {"read-lat": blocking}, {}, {})
    assert trio_row.met is None and "blocking driver, not the trio" in trio_row.note
    assert "--blocking" in goals.MEASUREMENTS["atomic-lat-blk"].args


def test_the_blocking_driver_goal_is_measured_on_the_blocking_driver() -> None:
    """A real ``iwarp bench atomic --lat --blocking`` run behind the row: it gives a figure,
    which the driver check above only accepts from the blocking driver."""
    run = goals.run_goals(["atomic-lat-blk"], 0.3, 1, with_floor=False, progress=None)
    (result,) = run.results
    assert not run.failures and result.measured is not None and result.measured > 0, result.note


@pytest.mark.slow
def test_goals_run_the_benchmarks_and_the_floor_from_the_installed_command(tmp_path: Path) -> None:
    out, png = tmp_path / "goals.json", tmp_path / "goals.png"
    done = _iwarp(
        "bench",
        "goals",
        "--only",
        "write-64k,markers-1m",
        "-D",
        "0.3",
        "--json",
        str(out),
        "--plot",
        str(png),
    )
    assert done.returncode == 0, done.stderr
    assert png.read_bytes().startswith(b"\x89PNG\r\n\x1a\n")  # the run, drawn
    doc = json.loads(out.read_text())
    assert doc["schema"] == "iwarp-bench-goals/1" and doc["verdict"] == "ok"
    assert 0.05 < doc["host"]["python_loop_s"] < 60
    floor = doc["floor"]
    assert set(floor) == {"64K", "1M", "markers"} and 0 < floor["64K"] < 3
    by_key = {g["key"]: g for g in doc["goals"]}
    assert list(by_key) == ["write-64k", "markers-1m"]
    write, markers = by_key["write-64k"], by_key["markers-1m"]
    assert 0 < write["measured"] < 3 and write["met"] == (write["measured"] >= 0.8)
    assert write["floor"] == floor["64K"]
    assert write["beyond_floor"] == (floor["64K"] < 0.8)
    assert markers["measured"] < 1 and markers["met"] == (markers["measured"] <= 0.15)
    assert markers["floor"] == floor["markers"]
    assert markers["measured_by"] == [
        "iwarp bench write -s 1M --baseline --cpu",
        "iwarp bench write -s 1M --markers --baseline --cpu",
    ]
    # The table: a row per goal, the count of goals met.
    assert "write-64k" in done.stdout and f"{doc['met']} of 2 goals met" in done.stdout
    assert "[4/4] iwarp bench floor" in done.stderr


def test_each_goal_is_bounded_by_the_floor_of_its_own_exchange(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Only the floor runs the goals selected need are run, each once, and each goal takes
    its own exchange's floor; a floor run that fails is reported, not raised."""
    asked: list[str] = []

    def fake_floor(run: goals.FloorRun, seconds: float, repeat: int) -> dict[str, float]:
        asked.append(run.key)
        assert repeat == 2  # the goals' -r
        if run.key == "read":
            raise RuntimeError("the sink did not start")
        return dict.fromkeys(run.gives, 0.2)

    monkeypatch.setattr(goals, "_floor", fake_floor)
    docs = {"write-64-lists": _bw_doc(0.03), "read-lat": _bw_doc(1.7), "read-64k": _bw_doc(0.5)}
    monkeypatch.setattr(goals, "_run_measurement", lambda m, *a, **k: docs[m.key])
    run = goals.run_goals(["write-64-lists", "read-64k", "read-lat"], 0.2, 2, progress=None)
    assert asked == ["small", "read", "rtt"]
    by_key = {r.goal.key: r for r in run.results}
    assert by_key["write-64-lists"].floor == 0.2 and by_key["write-64-lists"].beyond_floor()
    assert by_key["read-lat"].floor == 0.2 and not by_key["read-lat"].beyond_floor()
    assert by_key["read-64k"].floor is None and by_key["read-64k"].verdict() == "no"
    assert run.failures == {"floor read": "the sink did not start"}


def test_the_small_message_floor_batches_as_the_goal_s_raw_baseline() -> None:
    """The 64 B goal's floor is a real ``iwarp bench floor -s 64 --batch 128`` run: 128
    messages per send, the bench's default tx depth, which its raw baseline sends at once."""
    run = goals.run_goals(["write-64-lists"], 0.2, 1, progress=None)
    (result,) = run.results
    assert set(run.floor) == {"small"} and 0 < run.floor["small"] < 2
    assert result.floor == run.floor["small"]
    assert "--batch 128" in goals.FLOOR_RUNS["small"].command()


def test_an_older_before_tree_that_refuses_newer_arguments_runs_without_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``--before`` an older tree whose ``kbtp bench`` has no ``--floor`` (exit 2): the
    benchmark runs there again without it; this tree's run keeps it.  A refusal of another
    kind, or by a measurement with no newer arguments, stays a failure."""
    calls: list[tuple[tuple[str, ...], str | None]] = []

    def fake(m: Measurement, seconds: float, repeat: int, workdir: str, tree: str | None = None):
        calls.append((m.args, tree))
        if tree and "--floor" in m.args:
            raise RuntimeError("exit 2: kbtp bench: error: unrecognized arguments: --floor")
        return {"results": []}

    monkeypatch.setattr(goals, "_run_measurement", fake)
    monkeypatch.setattr(goals, "_mooncake_problem", lambda: None)
    run = goals.run_goals(["kbtp-load-64k"], 0.2, 1, with_floor=False, progress=None, before="old")
    assert not run.before_failures and not run.failures
    (first, _), (second, tree), (mine, here) = calls
    assert "--floor" in first and "--floor" not in second and tree == "old"
    assert second == tuple(a for a in first if a != "--floor")
    assert "--floor" in mine and here is None
    calls.clear()
    run = goals.run_goals(["read-lat"], 0.2, 1, with_floor=False, progress=None, before="old")
    assert len(calls) == 2 and not run.before_failures  # read-lat has nothing newer to drop


def test_before_measures_another_tree_right_before_this_one(tmp_path: Path) -> None:
    """``--before DIR``: each goal's figure in that tree too (here the checkout itself, so
    both columns are real measurements of the same code)."""
    repo = Path(__file__).resolve().parents[2]
    out = tmp_path / "goals.json"
    done = _iwarp(
        "bench",
        "goals",
        "--only",
        "read-lat",
        "-D",
        "0.2",
        "--no-floor",
        "--before",
        str(repo),
        "--json",
        str(out),
    )
    assert done.returncode == 0, done.stderr
    doc = json.loads(out.read_text())
    assert doc["parameters"]["before_tree"] == str(repo) and doc["failed_before"] == {}
    (goal,) = doc["goals"]
    before = goal["before"]
    assert 0.5 < before["measured"] < 20 and before["met"] == (before["measured"] <= 1.5)
    assert 0.5 < goal["measured"] < 20
    header = next(ln for ln in done.stdout.splitlines() if ln.startswith("goal"))
    assert header.index("before") < header.index("measured")
    row = next(ln for ln in done.stdout.splitlines() if ln.startswith("read-lat"))
    assert before["shown"] in row and goal["shown"] in row


def test_a_checkout_in_the_working_directory_does_not_shadow_the_trees_measured(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``python -m`` puts the working directory first on the path: run from another
    checkout, the benchmarks would measure that tree, for this one and for ``--before``."""
    for package in ("stack", "kbtp"):
        (tmp_path / package).mkdir()
        (tmp_path / package / "__init__.py").write_text("")
        (tmp_path / package / "__main__.py").write_text("raise SystemExit('the wrong tree')\n")
    monkeypatch.chdir(tmp_path)
    repo = str(Path(__file__).resolve().parents[2])
    run = goals.run_goals(["read-lat"], 0.2, 1, with_floor=False, progress=None, before=repo)
    (result,) = run.results
    assert run.failures == {} and run.before_failures == {}
    assert result.measured is not None and result.before is not None
    assert result.before.measured is not None


@pytest.mark.parametrize(
    "argv, says",
    [
        (["--only", "nope"], "unknown goal 'nope'"),
        (["--only", "a,read-lat,b"], "unknown goals 'a', 'b';"),
        (["--only", ","], "no goal in ','"),
        (["-D", "0"], "-D"),
        (["--json", "/nonexistent-dir/g.json"], "--json"),
        (["--before", "/nonexistent-dir"], "not a source tree"),
    ],
)
def test_bad_arguments_are_one_error_line(argv: list[str], says: str) -> None:
    done = _iwarp("bench", "goals", *argv, timeout=60)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and says in lines[0] and "Traceback" not in done.stderr


def test_list_names_every_goal_with_its_target() -> None:
    done = _iwarp("bench", "goals", "--list", timeout=60)
    assert done.returncode == 0
    lines = done.stdout.strip().splitlines()
    assert [ln.split()[0] for ln in lines] == [g.key for g in GOALS]
    assert lines[GOALS.index(GOAL["markers-1m"])].endswith("<= 15%")


def _dissect_doc(ours: float, tshark: float | None, problem: str | None = None) -> dict[str, Any]:
    """An ``iwarp bench dissect --modes summary --json`` document (tshark None: not run)."""
    row = {"mode": "summary", "ours_wall_s": ours, "tshark_wall_s": tshark}
    return {"rows": [row], "tshark_problem": problem, "verdict": "ok"}


def test_the_dissect_goal_is_tshark_s_time_over_ours() -> None:
    goal = GOAL["dissect-summary"]
    met = judge(goal, {"dissect": _dissect_doc(4.0, 9.2)}, {}, {})
    assert met.measured == pytest.approx(2.3) and met.met is True and met.verdict() == "yes"
    assert met.shown == "2.30 (9.2 / 4.0 s)" and met.floor is None
    low = judge(goal, {"dissect": _dissect_doc(5.0, 7.0)}, {}, {})
    assert low.measured == pytest.approx(1.4) and low.met is False and low.verdict() == "no"
    assert judge(goal, {"dissect": _dissect_doc(2.0, 3.0)}, {}, {}).met is True  # 1.5 exactly
    assert goals.MEASUREMENTS["dissect"].command() == (
        "iwarp bench dissect --modes summary --fpdus 1000000 --rss-fpdus 0"
    )


def test_without_tshark_the_dissect_goal_is_not_measured_with_the_reason() -> None:
    doc = _dissect_doc(4.0, None, "tshark not found on the PATH")
    result = judge(GOAL["dissect-summary"], {"dissect": doc}, {}, {})
    assert result.met is None and result.verdict() == "not measured"
    assert "tshark not found on the PATH" in result.note


def test_without_tshark_goals_skip_the_dissect_benchmark(monkeypatch: pytest.MonkeyPatch) -> None:
    """No tshark here: the 1M-FPDU benchmark is not run at all, the goal says why, and the
    run is not a failure."""
    monkeypatch.setattr(goals, "_tshark_problem", lambda: "tshark not found on the PATH")

    def not_run(*_args: object, **_kwargs: object) -> dict[str, Any]:
        raise AssertionError("the dissect benchmark ran")

    monkeypatch.setattr(goals, "_run_measurement", not_run)
    run = goals.run_goals(["dissect-summary"], 0.2, 1, progress=None)
    (result,) = run.results
    assert result.verdict() == "not measured" and result.note.startswith("dissect: tshark not")
    document = goals.goals_document(run, 0.2, 1)
    assert document["verdict"] == "ok" and document["failed_measurements"] == {}
    assert document["skipped_measurements"] == {"dissect": "tshark not found on the PATH"}


def test_the_dissect_goal_runs_the_real_benchmark(monkeypatch: pytest.MonkeyPatch) -> None:
    """The measurement's command line (with the common ``-r``, ``--quiet``, ``--json``) is
    one ``iwarp bench dissect`` takes; on a small capture here, to take seconds."""
    assert not goals.MEASUREMENTS["dissect"].timed
    args = ("dissect", "--modes", "summary", "--fpdus", "2000")
    monkeypatch.setitem(goals.MEASUREMENTS, "dissect", Measurement("dissect", "iwarp", args, False))
    run = goals.run_goals(["dissect-summary"], 0.2, 1, progress=None)
    (result,) = run.results
    assert run.failures == {}
    if goals._tshark_problem():
        assert result.met is None and "tshark" in result.note
    else:
        assert result.measured is not None and result.measured > 0, result.note
        assert result.met == (result.measured >= 1.5)


def test_the_tree_put_on_a_benchmark_s_path_is_the_one_holding_stack_and_kbtp() -> None:
    """A benchmark process runs with ``python -P`` and PROJECT_ROOT first on PYTHONPATH: it
    must be the directory holding the packages (it was the ``stack`` package itself, so
    only an installed copy made the benchmarks find this code, and the package's own
    modules stood first on the path as top-level names)."""
    from stack.bench.process import PROJECT_ROOT

    for package in ("stack", "kbtp"):
        assert Path(PROJECT_ROOT, package, "__init__.py").is_file()
    done = subprocess.run(
        [sys.executable, "-P", "-c", "import stack, kbtp; print(stack.__file__)"],
        capture_output=True,
        text=True,
        cwd="/",
        env={"PYTHONPATH": PROJECT_ROOT, "PATH": "/usr/bin:/bin", "PYTHONNOUSERSITE": "1"},
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().startswith(PROJECT_ROOT)
