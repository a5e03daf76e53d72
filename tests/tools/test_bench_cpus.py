"""``--cpus``: where the two ends of a benchmark run (``iwarp bench``, its server half,
``iwarp bench floor`` and its sink), and the placement ``iwarp bench goals`` gives the round
trips.  Every run that pins is a process of its own: pinning this one would pin the tests."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from stack.bench import goal_catalog
from stack.bench.goal_catalog import MEASUREMENTS, ROUND_TRIPS, placed, split_cpus
from tests.installed import TWO_CPUS, run_command
from tests.installed import needs_two_cpus as needs_two
from tests.installed import two_cpus as _cpus


def _iwarp(*argv: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """``iwarp ...`` as the installed command runs it, outside the checkout."""
    return run_command("stack", *argv, timeout=timeout)


@needs_two
def test_the_client_and_the_server_it_spawns_run_where_asked(tmp_path: Path) -> None:
    client, server = _cpus()
    out = tmp_path / "lat.json"
    done = _iwarp(
        "bench", "read", "--lat", "-s", "64", "-n", "200", "--cpus", f"{client},{server}",
        "--json", str(out),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    doc = json.loads(out.read_text())
    assert doc["parameters"]["cpus"] == {"client": client, "server": server}
    assert f"CPUs            : client {client}, server {server} (--cpus)" in done.stdout
    assert "(process " in done.stdout and f", CPU {server})" in done.stdout


@needs_two
def test_a_server_half_pins_itself_though_spawned_from_a_pinned_client() -> None:
    """The spawned server inherits the client's one CPU and still moves to its own."""
    client, server = _cpus()
    cmd = [sys.executable, "-m", "stack", "bench", "server", "--port", "0"]
    cmd += ["--cpus", str(server), "--exit-on-stdin-eof"]
    proc = subprocess.Popen(
        cmd,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd="/",
        preexec_fn=lambda: os.sched_setaffinity(0, {client}),  # noqa: PLW1509
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().startswith("PORT ")
        assert os.sched_getaffinity(proc.pid) == {server}
    finally:
        assert proc.stdin is not None
        proc.stdin.close()
        assert proc.wait(timeout=30) == 0


def test_without_cpus_nothing_is_pinned_and_the_document_says_so(tmp_path: Path) -> None:
    out = tmp_path / "lat.json"
    done = _iwarp("bench", "atomic", "--lat", "-n", "100", "--json", str(out))
    assert done.returncode == 0, done.stderr
    assert json.loads(out.read_text())["parameters"]["cpus"] is None
    assert "CPUs" not in done.stdout and ", CPU " not in done.stdout


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["bench", "read", "--lat", "--cpus", "0,1", "--in-process"], "give one CPU"),
        (["bench", "read", "--lat", "--cpus", "0,1", "--connect", "127.0.0.1:1"], "give one CPU"),
        (["bench", "read", "--cpus", "0,1,0"], "expected CPU or CLIENT,SERVER"),
        (["bench", "read", "--cpus", "x"], "expected CPU or CLIENT,SERVER"),
        (["bench", "read", "--cpus", "-1"], "expected CPU or CLIENT,SERVER"),
        (["bench", "read", "--cpus", str(os.cpu_count() or 1)], "this machine has CPUs 0 to"),
        (["bench", "server", "--cpus", "0,1"], "a server runs on one CPU"),
        (["bench", "floor", "--cpus", "0,0,0"], "expected CPU or CLIENT,SERVER"),
    ],
)
def test_a_bad_placement_is_one_error_line_before_any_run(argv: list[str], says: str) -> None:
    done = _iwarp(*argv, timeout=60)
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert not done.stdout and len(done.stderr.splitlines()) == 1, done.stderr
    assert says in done.stderr


def test_a_cpu_outside_the_process_s_cpuset_is_one_clear_error(tmp_path: Path) -> None:
    """A CPU the machine has but this process may not use (its affinity cannot include it):
    refused when the client pins itself, before any run."""
    if not hasattr(os, "sched_setaffinity"):
        pytest.skip("no sched_setaffinity")
    code = (
        "import os, sys; from stack.bench.process import pin_to\n"
        "try:\n    pin_to(os.cpu_count() + 7)\nexcept OSError as exc:\n    print(exc)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd="/", timeout=60
    )
    assert done.returncode == 0 and done.stdout.startswith("cannot run on CPU"), done


@needs_two
def test_the_floor_places_its_sink_as_asked(tmp_path: Path) -> None:
    client, sink = _cpus()
    done = _iwarp(
        "bench", "floor", "--exchange", "rtt", "-D", "0.2", "--repeat", "1",
        "--cpus", f"{client},{sink}", "--json", "-",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert doc["cpus"] == {"client": client, "sink": sink}
    assert [r["variant"] for r in doc["rows"]] == ["raw", "floor"]


def test_the_goals_place_every_round_trip_and_its_floor_apart(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(goal_catalog, "usable_cpus", lambda: [3, 5, 6])
    assert split_cpus() == ("--cpus", "3,5")
    monkeypatch.setattr(goal_catalog, "usable_cpus", lambda: [2])
    assert split_cpus() == ()  # one CPU: nothing to place apart
    default = goal_catalog.ROUND_TRIP_CPUS  # this host's, made at import
    assert default == (("--cpus", "{},{}".format(*_cpus())) if TWO_CPUS else ())
    for cpus in (("--cpus", "0,1"), ("--cpus", "0"), ()):
        measurements, floors = placed(cpus)
        for key in ROUND_TRIPS:
            m = measurements[key]
            assert m.args == (*MEASUREMENTS[key].args, *cpus)
            assert "--cpus" not in m.without_newer().args  # an older tree runs them unplaced
        others = [m for k, m in measurements.items() if k not in ROUND_TRIPS]
        assert all("--cpus" not in m.args for m in others)
        assert floors["rtt"].args == ("--exchange", "rtt", *cpus)
        assert all("--cpus" not in f.args for k, f in floors.items() if k != "rtt")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--round-trip-cpus", "x"], "argument --round-trip-cpus: expected CPU or CLIENT,SERVER"),
        (["--round-trip-cpus", "4096"], "argument --round-trip-cpus: CPU 4096: this machine"),
    ],
)
def test_a_round_trip_placement_that_cannot_be_is_a_usage_error(
    argv: list[str], message: str
) -> None:
    done = _iwarp("bench", "goals", "--only", "read-lat", *argv, timeout=60)
    assert done.returncode == 2 and message in done.stderr, done.stderr


@needs_two
@pytest.mark.parametrize(
    ("option", "expected", "words"),
    [
        ("0", "0", "the client and the server on one CPU (--cpus 0): no cross-CPU"),
        ("kernel", None, "where the kernel put the client and the server"),
    ],
)
def test_the_goals_measure_the_round_trips_where_asked(
    option: str, expected: str | None, words: str
) -> None:
    done = _iwarp(
        "bench", "goals", "--only", "read-lat-blk", "-D", "0.2", "--round-trip-cpus", option,
        "--json", "-", "--quiet", timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert doc["parameters"]["round_trip_cpus"] == expected
    (goal,) = doc["goals"]
    placement = [] if expected is None else ["--cpus", expected]
    assert goal["measured_by"] == [
        " ".join(["iwarp bench read -s 64 --lat --blocking --baseline --cpu", *placement])
    ]
    assert goal["measured"] > 0 and goal["floor"] > 0
    assert f"round trips, their baselines and their floor: {words}" in done.stderr
