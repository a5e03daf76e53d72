"""Fixtures of the interop suite against Linux siw in a QEMU guest .

Tests marked ``interop`` need the guest; the harness's own unit tests here do not.
One guest boots per test session (``siw_vm``); every test gets it through ``vm``, which
resets siw's knobs first (upstream defaults, with ``zcopy_tx=N`` so captures are complete)
and kills the test's leftover guest processes afterwards.  A guest that has died or stopped
answering is replaced by a freshly booted one (at most :data:`MAX_REBOOTS` times a session),
so one hung guest fails one test, not every test after it.  The suite runs unless
``IWARP_SKIP_INTEROP=1``; when the VM cannot be built or booted, the first test that needs
it FAILS with the reason and what to do (build as root, or set ``IWARP_SKIP_INTEROP=1``)
and the others skip, pointing at that failure.  Captures go to ``$IWARP_CAPTURE_DIR`` or to
``<pytest basetemp>/siw-captures``.
"""

from __future__ import annotations

import os
import re
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import NoReturn

import pytest

from stack.siwvm import Artifacts, SiwVM, SiwVmError, build

SKIP_ENV = "IWARP_SKIP_INTEROP"
MAX_REBOOTS = 2
"""Guests a session may boot to replace one that died or stopped answering."""


def _skip_requested() -> bool:
    return os.environ.get(SKIP_ENV) == "1"


def pytest_configure(config: pytest.Config) -> None:
    """The suite's markers, also when ``iwarp interop`` runs it outside the checkout."""
    config.addinivalue_line("markers", "interop: needs the Linux siw guest")
    config.addinivalue_line("markers", "slow: long-running (deselect with -m 'not slow')")
    config.addinivalue_line("markers", "tshark: cross-checks against Debian's tshark")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not _skip_requested():
        return
    skip = pytest.mark.skip(reason=f"{SKIP_ENV}=1: Linux siw interop tests skipped")
    for item in items:
        if item.get_closest_marker("interop") is not None:
            item.add_marker(skip)


class _Session:
    """The session's VM, or the reason there is none, and the test that reported it."""

    vm: SiwVM | None = None
    error: str | None = None
    reported_by: str | None = None
    build_seconds: float = 0.0
    reboots: int = 0
    captures: Path | None = None
    factory: pytest.TempPathFactory | None = None


def unavailable_message(what: str, detail: str) -> str:
    """Why interop cannot run, and what to do: build as root, or skip the suite."""
    hint = ""
    if os.geteuid() != 0:
        hint = (
            "Building it needs root: run `python -m pytest` (or `iwarp siwvm build`) as root; "
            "the build installs QEMU and debootstrap with apt-get and builds a Debian kernel "
            "and root file system into ~/.cache/siw-vm ($SIWVM_CACHE), minutes the first time.\n"
        )
    return (
        f"the siw VM {what}, so the interop tests cannot run:\n{detail}\n"
        f"{hint}Set {SKIP_ENV}=1 to skip them."
    )


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """After the one error saying why there is no VM, skip the rest as a marker would (so
    the summary folds them into one line per file)."""
    if _Session.reported_by and "siw_vm" in getattr(item, "fixturenames", ()):
        item.add_marker(pytest.mark.skip(reason=_skip_reason()))


def _skip_reason() -> str:
    return f"no siw VM: see the error of {_Session.reported_by}"


@pytest.fixture(scope="session")
def _siw_session(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Build and boot the guest once; on failure, record why in :class:`_Session`."""
    t0 = time.monotonic()
    try:
        artifacts = build(progress=lambda line: print(line, file=sys.stderr))
    except SiwVmError as exc:
        _Session.error = unavailable_message("could not be built", str(exc))
        yield
        return
    _Session.build_seconds = time.monotonic() - t0
    captures = Path(
        os.environ.get("IWARP_CAPTURE_DIR") or tmp_path_factory.getbasetemp() / "siw-captures"
    )
    _Session.captures, _Session.factory = captures, tmp_path_factory
    try:
        vm = _boot(artifacts)
    except SiwVmError as exc:
        _Session.error = unavailable_message("did not boot", str(exc))
        yield
        return
    _Session.vm = vm
    print(
        f"\nsiw VM: build check {_Session.build_seconds:.1f} s, boot {vm.boot_seconds:.1f} s "
        f"(accel {vm.accel}), captures in {captures}",
        file=sys.stderr,
    )
    try:
        yield
    finally:
        if _Session.vm is not None:
            _Session.vm.stop()
        _Session.vm = None


def _boot(artifacts: Artifacts) -> SiwVM:
    """A guest of ``artifacts`` booted in a fresh work directory of the session, its
    captures in the session's directory (SiwVmError, nothing left running, if it fails)."""
    assert _Session.factory is not None
    vm = SiwVM(artifacts, capture_dir=_Session.captures, workdir=_Session.factory.mktemp("siwvm"))
    try:
        return vm.start()
    except SiwVmError:
        vm.stop()
        raise


@pytest.fixture
def siw_vm(_siw_session: None, request: pytest.FixtureRequest) -> SiwVM:
    """The booted siw guest, shared by the whole session.

    Without one, the first test that asks for it errors with the reason and what to do;
    the others skip, pointing at that error (one error, not one per test).
    """
    if _Session.vm is not None:
        return _Session.vm
    error = _Session.error or "the siw VM is not running"
    if _Session.reported_by is None:
        _Session.reported_by = request.node.nodeid
        pytest.fail(error, pytrace=False)
    pytest.skip(_skip_reason())


@pytest.fixture
def vm(siw_vm: SiwVM, request: pytest.FixtureRequest) -> Iterator[SiwVM]:
    """The session's guest with siw's knobs at their defaults (``zcopy_tx=N``): see
    :func:`ready_guest`."""
    guest = ready_guest(siw_vm, request.node.nodeid)
    yield guest
    if guest.running:
        guest.reap()


def ready_guest(guest: SiwVM, test: str) -> SiwVM:
    """``guest`` with siw's knobs reset, or, if it died or does not answer the reset, a
    freshly booted guest in its place (:func:`_reboot`, on behalf of ``test``)."""
    try:
        if not guest.running:
            raise SiwVmError("the guest died")
        guest.reset_siw(zcopy_tx=False)
    except SiwVmError as exc:
        guest = _reboot(guest, str(exc), test)
        guest.reset_siw(zcopy_tx=False)
    return guest


def _reboot(old: SiwVM, reason: str, test: str) -> SiwVM:
    """Replace the session's guest, which died or stopped answering (``reason``), by a
    freshly booted one; fail ``test`` when the session has used up :data:`MAX_REBOOTS` or
    the new guest does not boot (the tests after it then skip, pointing at that)."""
    tail = old.console_tail(30)
    old.kill()  # no polite quit: a guest that does not answer may not take one
    old.stop()  # its work directory
    _Session.vm = None
    if _Session.reboots >= MAX_REBOOTS:
        _fail_session(
            f"the siw VM stopped answering ({reason}) after {MAX_REBOOTS} reboots this "
            f"session; its console's last lines:\n{tail}",
            test,
        )
    _Session.reboots += 1
    print(
        f"\nsiw VM: {reason}; booting a new guest ({_Session.reboots} of {MAX_REBOOTS}); "
        f"the old console's last lines:\n{tail}",
        file=sys.stderr,
    )
    try:
        new = _boot(old.artifacts)
    except SiwVmError as exc:
        _fail_session(unavailable_message("did not boot again", str(exc)), test)
    _Session.vm = new
    return new


def _fail_session(error: str, test: str) -> NoReturn:
    """Fail ``test`` with ``error``, the session's reason for having no guest from now on
    (the tests after it skip, pointing at ``test``)."""
    _Session.error = error
    _Session.reported_by = test
    pytest.fail(error, pytrace=False)


@pytest.fixture
def case(request: pytest.FixtureRequest) -> str:
    """A capture name for this test case (its node name, made file-safe)."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", request.node.name).strip("_")
