"""README's example code and commands stay true."""

from __future__ import annotations

import re
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


def _python_examples() -> list[str]:
    """The runnable examples: blocks tagged exactly ``python`` (the pyverbs one for
    comparison is tagged ``python pyverbs`` and is not run)."""
    return re.findall(r"```python\n(.*?)```", README.read_text(), re.S)


def _run(code: str) -> None:
    exec(compile(code, "README.md", "exec"), {"__name__": "readme_example"})


def test_readme_python_example_runs(capsys: pytest.CaptureFixture[str]) -> None:
    code, _sync = _python_examples()
    _run(code)
    assert "status=<WcStatus.SUCCESS" in capsys.readouterr().out


def test_readme_coming_from_pyverbs_example_runs(capsys: pytest.CaptureFixture[str]) -> None:
    _trio, code = _python_examples()
    assert "```python pyverbs\n" in README.read_text()
    _run(code)
    assert capsys.readouterr().out.splitlines() == ["success", "RECV b'ping'"]
