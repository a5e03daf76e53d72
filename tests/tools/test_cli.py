"""The command-line front end shared by ``iwarp`` and ``kbtp`` (stack/cli/__init__.py)."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pytest

from stack.cli import build_parser
from stack.cli.iwarp import COMMANDS

REPO = Path(__file__).resolve().parents[2]
PCAP = REPO / "pcaps" / "ops-rev2-crc.pcap"


def _modules_after(argv: list[str]) -> set[str]:
    """Run ``iwarp <argv>`` in a fresh interpreter; the modules it had imported at exit."""
    code = (
        "import sys, atexit\n"
        "def report():\n"
        "    print('MODULES', ' '.join(sorted(sys.modules)), file=sys.stderr)\n"
        "atexit.register(report)\n"
        "from stack.cli.iwarp import main\n"
        f"sys.argv = ['iwarp', *{argv!r}]\n"
        "raise SystemExit(main())\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    line = next(ln for ln in done.stderr.splitlines() if ln.startswith("MODULES "))
    return set(line.split()[1:])


def test_a_subcommand_imports_only_its_own_module() -> None:
    """``iwarp dissect`` starts without trio, the RNIC or the other tools' modules."""
    assert PCAP.is_file()
    loaded = _modules_after(["dissect", str(PCAP)])
    assert "stack.cli.dissect" in loaded
    assert not {"trio", "stack.transport.driver", "stack.bench.run", "stack.cli.siwvm"} & loaded


@pytest.mark.parametrize(
    "argv", [["--help"], ["rdma-server", "--help"], ["bench", "--help"], ["cmatose", "--help"]]
)
def test_help_and_commands_named_unlike_their_module(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    """Commands registered by a module of another name (rdma-server, cmatose: in
    iwarp_rdmacm_examples) and the top-level help still find every subcommand."""
    from stack.cli import run

    with pytest.raises(SystemExit) as info:
        run("iwarp", "test", COMMANDS, argv)
    assert info.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: iwarp {argv[0] if argv[0] != '--help' else ''}".rstrip())
    if argv == ["--help"]:
        for name in ("bench", "dissect", "interop", "rdma-server", "rping", "siwvm"):
            assert name in out


def _commands(parser: argparse.ArgumentParser) -> set[str]:
    sub = next(a for a in parser._actions if a.dest == "command")
    return set(sub.choices or ())


def test_only_falls_back_to_every_subcommand() -> None:
    every = _commands(build_parser("iwarp", "test", COMMANDS))
    assert {"dissect", "rdma-client", "bench"} <= every
    assert _commands(build_parser("iwarp", "test", COMMANDS, only="dissect")) == {"dissect"}
    rdmacm = {"rdma-client", "rdma-server", "cmatose"}  # one module registers all three
    assert _commands(build_parser("iwarp", "test", COMMANDS, only="rdma-client")) == rdmacm
    for only in ("no-such-thing", "cli"):
        assert _commands(build_parser("iwarp", "test", COMMANDS, only=only)) == every


@pytest.mark.parametrize(("prog", "table"), [("iwarp", "stack.cli.iwarp"), ("kbtp", "kbtp.cli")])
def test_the_command_table_names_what_each_module_registers(prog: str, table: str) -> None:
    """Every subcommand of the table is registered by the module it names, and nothing else
    is registered (the table is the only list of subcommands)."""
    import importlib

    commands = importlib.import_module(table).COMMANDS
    assert _commands(build_parser(prog, "test", commands)) == set(commands)
    for name, module in commands.items():
        parser = argparse.ArgumentParser()
        sub = parser.add_subparsers(dest="command")
        importlib.import_module(module).register(sub)
        assert name in sub.choices, (name, module)


@pytest.mark.parametrize("main", ["stack.cli.iwarp", "kbtp.cli"])
def test_version(main: str, capsys: pytest.CaptureFixture[str]) -> None:
    import importlib

    with pytest.raises(SystemExit) as info:
        importlib.import_module(main).main(["--version"])
    assert info.value.code == 0
    out = capsys.readouterr().out.split()
    assert out[0] in ("iwarp", "kbtp") and out[1][0].isdigit()


def test_unknown_command_is_one_clear_error(capsys: pytest.CaptureFixture[str]) -> None:
    from stack.cli import run

    with pytest.raises(SystemExit) as info:
        run("iwarp", "test", COMMANDS, ["nosuch"])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "invalid choice: 'nosuch'" in err and "dissect" in err
