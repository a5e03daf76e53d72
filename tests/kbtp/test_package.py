"""The package's public names (kbtp.__all__): each resolves to the object of its module, and
importing a light module (the messages) does not pull in the trio bindings."""

from __future__ import annotations

import subprocess
import sys

import pytest

import kbtp


@pytest.mark.parametrize("name", kbtp.__all__)
def test_every_public_name_resolves(name: str) -> None:
    value = getattr(kbtp, name)
    home = kbtp._HOME[name]
    assert value is getattr(sys.modules[home], name)
    assert name in dir(kbtp)


def test_all_lists_exactly_the_re_exported_names() -> None:
    assert sorted(kbtp.__all__) == sorted(kbtp._HOME)
    with pytest.raises(AttributeError):
        kbtp.NoSuchName  # noqa: B018


def test_importing_the_messages_does_not_import_the_bindings() -> None:
    code = "import sys, kbtp.messages; print('kbtp.target' in sys.modules, 'trio' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]
