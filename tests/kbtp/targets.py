"""Which KBTP target the tests start: the software one or the offloaded one (docs/kbtp.md §8.1).

Tests that start a real target build it here (:func:`new_target`, :func:`target_thread`,
:func:`target_argv` for the ``kbtp target`` command); the ``target_mode`` fixture of
``tests/kbtp/conftest.py`` selects the mode, and runs every test marked ``both_targets``
once per mode, since the initiator cannot tell the two apart (§8.1).
"""

from __future__ import annotations

from typing import Any

from kbtp.target import KbtpTarget
from kbtp.target_config import TargetConfig
from kbtp.target_thread import TargetThread

__all__ = ["MODES", "new_target", "offloading", "select", "target_argv", "target_thread"]

MODES = ("software", "offload")
_mode = {"offload": False}


def select(mode: str) -> None:
    """The mode targets are started in from now on (one of :data:`MODES`)."""
    if mode not in MODES:
        raise ValueError(f"target mode must be one of {MODES}, not {mode!r}")
    _mode["offload"] = mode == "offload"


def offloading() -> bool:
    """Whether targets are started with ``offload=True``."""
    return _mode["offload"]


def new_target(config: TargetConfig, **options: Any) -> KbtpTarget:
    """A :class:`KbtpTarget` of ``config`` in the selected mode."""
    return KbtpTarget(config, offload=offloading(), **options)


def target_thread(config: TargetConfig, **options: Any) -> TargetThread:
    """A :class:`TargetThread` of ``config`` in the selected mode."""
    return TargetThread(config, offload=offloading(), **options)


def target_argv() -> list[str]:
    """The ``kbtp target`` (and ``kbtp demo``) arguments of the selected mode."""
    return ["--offload"] if offloading() else []
