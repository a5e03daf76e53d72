"""The ``kbtp target | demo | bench`` commands: tiny runs, a real target process, bad arguments."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio

from kbtp.cli import COMMANDS, main
from kbtp.cli.bench import bench_kbtp_size
from kbtp.cli.bench_mooncake import mooncake_available, mooncake_problem, run_mooncake
from kbtp.cli.bench_peer import peer_process, process_cpu_seconds
from kbtp.cli.target import mpa_settings
from kbtp.constants import Capability
from kbtp.initiator import KbtpInitiator
from stack.cli import CliError, build_parser
from stack.cli.iwarp import main as iwarp_main
from stack.wire.events import MpaSettings
from tests.kbtp.targets import target_argv


def _run(argv: list[str]) -> int:
    try:
        return main(argv)
    except SystemExit as exc:  # argparse errors exit from inside
        return int(exc.code or 0)


@pytest.mark.both_targets
def test_demo_tiny_run_checks_every_byte_and_writes_a_clean_capture(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pcap = tmp_path / "demo.pcap"
    argv = ["demo", "-n", "2", "--block-size", "4K", "--ticket-timeout", "1", "-w", str(pcap)]
    argv += target_argv()  # docs/kbtp.md §8.1: the offloaded target is indistinguishable
    code = _run([*argv, "--quiet"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "result: PASS" in out and ", 0 failures" in out
    rows = {tuple(line.split()[:2]) for line in out.splitlines() if line[:1].isupper()}
    for op in ("ALLOC_STORE", "STORE", "LOAD", "DIRECT_LOAD", "BIND", "FREE"):
        assert (op, "SUCCESS") in rows, op
    for bad in (("BIND", "TICKET_ABANDONED"), ("LOAD", "NOT_SEALED"), ("ALLOC_STORE", "NO_SPACE")):
        assert bad in rows, bad
    assert pcap.stat().st_size > 10_000
    # The iWARP layers are clean; the only KBTP findings are the demo's deliberately
    # malformed requests (flagged by the KBTP decoder inside Sends).
    assert iwarp_main(["dissect", str(pcap), "-q", "--ulp", "none", "--fail-on-findings"]) == 0
    capsys.readouterr()
    assert iwarp_main(["dissect", str(pcap), "--json", "-Y", "findings"]) == 0
    flagged = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert flagged and all(r["findings"] == ["KBTP-5.1"] for r in flagged)
    assert all(r["direction"] == "i2r" and r["opcode_name"] == "Send" for r in flagged)


@pytest.mark.parametrize("target", [[], ["--offload"]])
def test_demo_unmasked_counter_allocates_with_plain_fetch_adds_on_the_wire(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], target: list[str]
) -> None:
    """docs/kbtp.md §3.7: with UNMASKED_COUNTER granted, the trusted initiator's Head
    FetchAdds carry no mask and add one Ticket (2^32); without it they are masked."""
    heads = {}
    for counter in ("masked", "unmasked"):
        pcap = tmp_path / f"{counter}.pcap"
        argv = ["demo", "-n", "2", "--block-size", "4K", "--ticket-timeout", "1"]
        argv += ["-w", str(pcap), "--quiet", "--json", "-", *target]
        argv += ["--unmasked-counter"] * (counter == "unmasked")
        assert _run(argv) == 0
        report = json.loads(capsys.readouterr().out)
        assert report["verdict"] == "PASS" and report["parameters"]["counter_format"] == counter
        assert iwarp_main(["dissect", str(pcap), "--json", "-Y", "opcode == 10"]) == 0
        heads[counter] = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
        assert heads[counter], counter
    assert all(r["atomic_add_swap_mask"] == 0 for r in heads["unmasked"])
    assert {r["atomic_add_swap_data"] for r in heads["unmasked"]} == {1 << 32}
    assert all(r["atomic_add_swap_mask"] != 0 for r in heads["masked"])


def test_bench_offload_rows_count_zero_application_calls_for_the_offloaded_target(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out_json = tmp_path / "offload.json"
    code = _run(
        ["bench", "--offload", "-s", "4K", "-n", "8", "-t", "2", "--quiet", "--json", str(out_json)]
    )
    assert code == 0
    capsys.readouterr()
    rows = json.loads(out_json.read_text())["results"]
    kinds = [(r["operation"], r["target"], r["inflight"]) for r in rows]
    assert kinds == [
        (op, target, n)
        for n in (1, 2)
        for target in ("software", "offload")
        for op in ("STORE", "LOAD", "ALLOC_STORE", "FREE")
    ]
    for r in rows:
        offloaded = r["target"] == "offload"
        assert r["app_calls_per_op"] == (0 if offloaded else 1), r
        assert r["rnic_answers_per_op"] == (1 if offloaded else 0), r
        assert r["ops_per_s"] > 0 and r["latency_p99_us"] >= r["latency_p50_us"] > 0


@pytest.mark.parametrize("layout", [[], ["--in-process"]])
def test_bench_tiny_run_prints_kbtp_and_raw_rows(
    capsys: pytest.CaptureFixture[str], layout: list[str]
) -> None:
    code = _run(["bench", "-s", "4K,16K", "-n", "16", "-t", "4", "--quiet", *layout])
    out = capsys.readouterr().out
    assert code == 0, out
    rows = [line.split() for line in out.splitlines()[2:]]
    assert [(r[0], r[1]) for r in rows] == [
        (op, size) for size in ("4K", "16K") for op in ("STORE", "LOAD", "ALLOC_STORE")
    ]
    assert all(len(r) == 11 and float(r[4]) > 0 and float(r[8]) > 0 for r in rows), rows
    assert rows[0][2] == "inline" and rows[3][2] == "rdma"  # 4K <= Max Inline < 16K
    expected = "one process" if layout else "target in a second process"
    assert expected in out.splitlines()[0]


def test_bench_peer_is_another_process_and_its_cpu_is_counted() -> None:
    async def main() -> tuple[int, float | None, float | None, int | None]:
        async with peer_process(4096, 8, 4, 4096, ["--crc"]) as peer:
            before = peer.cpu()
            # The peer's CPU time is counted in clock ticks (10 ms), and a second round would
            # re-allocate the handles the first made valid (ALREADY_VALID): one round of STOREs
            # long enough to cost the peer several ticks.
            rows = await bench_kbtp_size(
                4096, ["store"], 1000, 4, MpaSettings(), None, port=peer.port, peer_cpu=peer.cpu
            )
            assert rows[0].iters == 1000
            after = peer.cpu()
            pid = peer.pid
        return pid, before, after, _exit_status(pid)

    pid, before, after, status = trio.run(main)
    assert pid != os.getpid()
    assert before is not None and after is not None and after > before  # it served the STOREs
    assert status is None  # gone once the block is left
    assert process_cpu_seconds(os.getpid()) == pytest.approx(time.process_time(), abs=0.05)


def _exit_status(pid: int) -> int | None:
    """None when ``pid`` no longer exists (reaped)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    return pid


def test_target_emss_defaults_to_each_connection_mss(capsys: pytest.CaptureFixture[str]) -> None:
    """Without --emss the target leaves EMSS to the socket's MSS (MPA-13), and says so."""
    parser = build_parser("kbtp", "", COMMANDS, only="target")
    assert mpa_settings(parser.parse_args(["target"])).emss is None
    assert mpa_settings(parser.parse_args(["target", "--emss", "9000"])).emss == 9000
    assert _run(["target", "--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "derived from (default from the connection's TCP MSS;" in text, text


@pytest.mark.both_targets
def test_target_command_serves_initiators_until_interrupted(tmp_path: Path) -> None:
    pcap = tmp_path / "target.pcap"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "kbtp.cli",
            "target",
            "-p",
            "0",
            "--block-size",
            "4K",
            "-F",
            "8",
            "--initiator",
            "dec:handles=0x100+16,quota=4,direct=both",
            "--initiator",
            "pre:quota=4,domain=b",
            "--capture",
            str(pcap),
            *target_argv(),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline()
        assert "listening on 127.0.0.1:" in first, first
        port = int(first.rsplit(":", 1)[1])
        table = [proc.stdout.readline() for _ in range(4)]
        assert "dec" in table[2] and "0x100..0x10f" in table[2] and "load+alloc" in table[2]
        assert "pre" in table[3] and "0x110" in table[3]

        async def client() -> None:
            with trio.fail_after(30):
                caps = Capability.DIRECT_LOAD | Capability.DIRECT_ALLOC
                async with KbtpInitiator.connect(
                    "127.0.0.1", port, "dec", capabilities=caps
                ) as ini:
                    assert ini.granted == caps and ini.block_size == 4096
                    await ini.alloc_store(0x100, b"a" * 3000, seal=True)
                    assert await ini.load(0x100) == b"a" * 3000
                    await ini.direct_alloc(0x101, b"direct")
                    assert await ini.direct_load(0x101) == b"direct"

        trio.run(client)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, err
    assert "HELLO from 'dec' accepted" in out and "ended after" in out
    assert "stopped by SIGINT" in err
    assert pcap.stat().st_size > 1000


@pytest.mark.both_targets
def test_target_command_stops_in_order_on_sigterm_with_a_session_open() -> None:
    """SIGTERM while an initiator is connected: the session ends and says why, the
    initiator sees its session closed, the process exits with 128 + 15."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "kbtp.cli", "target", "-p", "0", "--block-size", "4K",
         "-F", "8", "--initiator", "only", *target_argv()],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline()
        assert "listening on 127.0.0.1:" in first, first
        port = int(first.rsplit(":", 1)[1])

        async def client() -> tuple[str, str]:
            with trio.fail_after(30):
                async with KbtpInitiator.connect("127.0.0.1", port, "only") as ini:
                    await ini.alloc_store(0, b"kept until the end", seal=True)
                    proc.send_signal(signal.SIGTERM)
                    out, err = await trio.to_thread.run_sync(proc.communicate)
                    assert ini.conn is not None
                    await ini.conn.wait_closed()
                    return out, err

        out, err = trio.run(client)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert "(only): ended after 2 messages: the target is stopping" in out, out
    assert "stopped by SIGTERM" in err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["target", "--block-size", "0"], "size must be"),
        (["target", "-p", "70000"], "port must be"),
        (["target", "--emss", "63"], "EMSS must be"),
        (["target", "--emss", "65536"], "EMSS must be"),
        (["target", "--initiator", "x:foo=1"], "unknown initiator option"),
        (["target", "--initiator", "x:handles=5"], "bad value"),
        (["target", "--initiator", "x:quota=5000"], "quotas add up"),
        (["target", "--initiator", "x", "--initiator", "x"], "distinct"),
        (["demo", "-n", "1"], "at least 2 initiators"),
        (["demo", "--ticket-timeout", "0"], "more than 0 seconds"),
        (["bench", "--sizes", "4Q"], "invalid size"),
        (["bench", "--ops", "nope"], "unknown operation"),
        (["bench", "-n", "5", "--bytes", "1M"], "not allowed with"),
        (["bench", "--bogus"], "unrecognized arguments: --bogus"),
    ],
)
def test_bad_arguments_give_one_line_and_status_2(
    capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    started = time.perf_counter()
    code = _run(argv)
    err = capsys.readouterr().err
    assert code == 2
    assert err.count("\n") == 1 and "error: " in err and message in err, err
    assert time.perf_counter() - started < 10  # refused up front, nothing served


@pytest.mark.skipif(mooncake_available(), reason="Mooncake is installed here")
def test_bench_vs_mooncake_without_the_package_is_one_clear_error(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert _run(["bench", "--vs", "mooncake", "-s", "4K", "-n", "16"]) == 2
    err = capsys.readouterr().err
    assert err.strip() == (
        "kbtp bench: error: --vs mooncake needs the mooncake-transfer-engine-non-cuda "
        "package, which is not installed"
    )


@pytest.fixture
def broken_mooncake(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A ``mooncake`` package whose engine fails to load as the real one does without
    libibverbs, ahead of any installed one, in this process and in children."""
    package = tmp_path / "mooncake"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "engine.py").write_text(
        "raise ImportError('libibverbs.so.1: cannot open shared object file')\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), *sys.path]))
    mooncake_problem.cache_clear()
    yield tmp_path
    mooncake_problem.cache_clear()


def test_bench_vs_mooncake_that_does_not_load_says_why(
    broken_mooncake: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    started = time.perf_counter()
    assert _run(["bench", "--vs", "mooncake", "-s", "4K", "-n", "16"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert err.startswith("kbtp bench: error: --vs mooncake needs Mooncake's engine, which")
    assert "does not load: ImportError: libibverbs.so.1" in err
    assert "Debian's libibverbs1" in err
    assert time.perf_counter() - started < 30  # refused before any benchmark ran


def test_mooncake_comparison_whose_server_fails_reports_the_server_error(
    broken_mooncake: Path,
) -> None:
    with pytest.raises(CliError, match="Mooncake server did not start: ImportError: libib"):
        run_mooncake(4096, 16, 16)


@pytest.mark.skipif(not mooncake_available(), reason="needs mooncake-transfer-engine-non-cuda")
def test_bench_vs_mooncake_moves_the_same_blocks(capsys: pytest.CaptureFixture[str]) -> None:
    figures = run_mooncake(65536, 32, 16)
    assert all(f.seconds > 0 and f.cpu > 0 for f in figures.values())
    argv = ["bench", "--vs", "mooncake", "-s", "64K", "-n", "32", "--ops", "store,load"]
    assert _run([*argv, "--quiet", "--json", "-"]) == 0
    doc = json.loads(capsys.readouterr().out)
    for row in doc["results"]:
        mc = row["mooncake"]
        assert mc["transfer"] == {"STORE": "write", "LOAD": "read"}[row["operation"]]
        assert row["vs_mooncake"] == pytest.approx(row["gbyte_per_s"] / mc["gbyte_per_s"])
