"""README's example code and commands stay true."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"


def test_readme_starts_with_exactly_two_commands() -> None:
    text = README.read_text()
    first_block = re.search(r"```sh\n(.*?)```", text, re.S)
    assert first_block is not None
    commands = [line for line in first_block.group(1).splitlines() if line.strip()]
    assert len(commands) == 2
    assert commands[1] == "python -m pytest"


def _python_blocks() -> list[str]:
    """The README's runnable examples: blocks tagged exactly ``python``, dedented (one sits
    in a list item); the pyverbs one, shown for comparison, is tagged ``python pyverbs``."""
    blocks = re.findall(r"^( *)```python\n(.*?)^ *```", README.read_text(), re.S | re.M)
    return [textwrap.dedent(code) if indent else code for indent, code in blocks]


def _block(marker: str) -> str:
    [code] = [b for b in _python_blocks() if marker in b]
    return code


def _run(code: str) -> dict[str, object]:
    namespace: dict[str, object] = {"__name__": "readme_example"}
    exec(compile(code, "README.md", "exec"), namespace)
    return namespace


def test_readme_python_example_runs(capsys: pytest.CaptureFixture[str]) -> None:
    _run(_python_blocks()[0])
    assert "status=<WcStatus.SUCCESS" in capsys.readouterr().out


def test_readme_blocking_driver_example_runs(capsys: pytest.CaptureFixture[str]) -> None:
    _run(_block("blocking_cm"))
    assert capsys.readouterr().out.splitlines() == ["SUCCESS b'read me, blocking'"]


def test_readme_coming_from_pyverbs_example_runs(capsys: pytest.CaptureFixture[str]) -> None:
    assert "```python pyverbs\n" in README.read_text()
    _run(_block("verbs_sync"))
    assert capsys.readouterr().out.splitlines() == ["success", "RECV b'ping'"]


def test_readme_memory_window_and_fast_registration_example_runs(
    capsys: pytest.CaptureFixture[str],
) -> None:
    namespace = _run(_block("frmr"))
    frmr = namespace["frmr"]
    out = capsys.readouterr().out
    assert f"advertise rkey 0x{frmr.rkey:08x} TO 0x{frmr.iova:x}" in out  # type: ignore[attr-defined]
