"""The Scapy entry point ``from stack.dissect.scapy import *``: complete, and its example runs."""

from __future__ import annotations

import contextlib
import importlib
import io
import textwrap
from pathlib import Path

import pytest

import stack.dissect.scapy as package

MODULES = ("base", "mpa", "ddp_rdmap", "crafting", "streams", "session", "records")


def test_star_import_gives_every_public_name_of_every_module() -> None:
    namespace: dict[str, object] = {}
    exec("from stack.dissect.scapy import *", namespace)
    namespace.pop("__builtins__")
    expected: dict[str, object] = {}
    for name in MODULES:
        module = importlib.import_module(f"stack.dissect.scapy.{name}")
        public = {n for n, v in vars(module).items() if not n.startswith("_") and
                  getattr(v, "__module__", None) == module.__name__}  # fmt: skip
        assert public <= set(module.__all__), (name, public - set(module.__all__))
        expected.update({n: getattr(module, n) for n in module.__all__})
    assert namespace == expected
    assert sorted(package.__all__) == sorted(expected)


def _example() -> str:
    doc = package.__doc__
    assert doc is not None
    code = textwrap.dedent(doc.split("dissected explicitly::", 1)[1])
    assert len(code.strip().splitlines()) == 10
    return code


def test_docstring_example_writes_reads_and_flags_the_broken_fpdu(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    code = _example()
    expected = code.strip().splitlines()[-1].removeprefix("# ")
    monkeypatch.chdir(tmp_path)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, "stack.dissect.scapy example", "exec"), {})
    assert out.getvalue().strip() == expected == "False 0xabcdef b'payload'"
    assert (tmp_path / "bad.pcap").stat().st_size > 0
