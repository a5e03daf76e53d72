"""Every package of the installed distribution re-exports its public names with __all__."""

from __future__ import annotations

import importlib
import importlib.util
import pkgutil

import pytest

import kbtp
import stack

PACKAGES = sorted(
    info.name
    for root in (stack, kbtp)
    for info in pkgutil.walk_packages(root.__path__, root.__name__ + ".")
    if info.ispkg
) + ["stack", "kbtp"]


@pytest.mark.parametrize("name", PACKAGES)
def test_package_declares_and_exports_all(name: str) -> None:
    module = importlib.import_module(name)
    exported = getattr(module, "__all__", None)
    assert exported is not None, f"{name}/__init__.py has no __all__"
    for item in exported:
        assert hasattr(module, item) or importlib.util.find_spec(f"{name}.{item}"), (name, item)
    assert len(set(exported)) == len(exported), f"{name}.__all__ repeats names"
