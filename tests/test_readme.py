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
    """The README's ```python blocks, dedented (the second sits in a list item)."""
    blocks = re.findall(r"^( *)```python\n(.*?)^ *```", README.read_text(), re.S | re.M)
    return [textwrap.dedent(code) if indent else code for indent, code in blocks]


def test_readme_python_example_runs(capsys: pytest.CaptureFixture[str]) -> None:
    code = _python_blocks()[0]
    exec(compile(code, "README.md", "exec"), {"__name__": "readme_example"})
    assert "status=<WcStatus.SUCCESS" in capsys.readouterr().out


def test_readme_memory_window_and_fast_registration_example_runs(
    capsys: pytest.CaptureFixture[str],
) -> None:
    blocks = _python_blocks()
    assert len(blocks) == 2
    namespace: dict[str, object] = {"__name__": "readme_example"}
    exec(compile(blocks[1], "README.md", "exec"), namespace)
    frmr = namespace["frmr"]
    out = capsys.readouterr().out
    assert f"advertise rkey 0x{frmr.rkey:08x} TO 0x{frmr.iova:x}" in out  # type: ignore[attr-defined]
