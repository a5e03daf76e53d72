"""Fixtures shared by the test packages."""

from __future__ import annotations

import importlib.util

import pytest


@pytest.fixture
def no_matplotlib(monkeypatch: pytest.MonkeyPatch) -> None:
    """While the test runs, ``importlib.util.find_spec`` finds no matplotlib: a machine
    without the optional ``plot`` extra, as ``--plot`` checks for it."""
    real = importlib.util.find_spec

    def find_spec(name: str, *args: object, **kwargs: object) -> object:
        return None if name == "matplotlib" else real(name, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
