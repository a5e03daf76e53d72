"""A queued asynchronous event keeps no frames or receive buffers of its connection.

A server that never reads its RNIC's async event queue keeps the last 1024 events; each
QP that failed on a peer's bad FPDU posts one whose error carried the traceback of the
driver's reader (and so the driver and its 256 KiB receive buffer) and a view of that
buffer: 275 KB kept per failed connection, found by a hostile-peer run.
"""

from __future__ import annotations

import gc
import weakref

from stack.errors import MpaError, ProtocolError
from stack.rnic.events import AsyncEvent, AsyncEventQueue, AsyncEventType


class _Driver:
    """Stands for the connection driver whose frame is on the error's traceback."""

    def __init__(self) -> None:
        self.rx = bytearray(256 * 1024)


def _fail_in(driver: _Driver) -> ProtocolError:
    view = memoryview(driver.rx)
    try:
        raise KeyError("cause")
    except KeyError as exc:
        cause = exc  # the cause: an error of its own, with its own traceback
    try:
        try:
            raise ValueError("inner")
        except ValueError:  # the context: what was being handled
            error = MpaError("MPA-12", "CRC mismatch")
            error.ulpdu = view[16:64]
            raise error from cause
    except ProtocolError as exc:
        return exc


def test_a_posted_event_lets_the_driver_and_its_buffer_go() -> None:
    driver = _Driver()
    alive = weakref.ref(driver)
    error = _fail_in(driver)
    assert error.__traceback__ is not None
    assert isinstance(error.__cause__, KeyError) and isinstance(error.__context__, ValueError)
    queue = AsyncEventQueue()
    queue.post(AsyncEvent(AsyncEventType.QP_FATAL, error=error))
    del driver
    gc.collect()
    assert alive() is None  # no frame of the failure keeps it
    kept = queue.poll()
    assert kept is not None and kept.error is error
    assert error.__traceback__ is None and error.__cause__.__traceback__ is None
    assert error.__context__ is not None and error.__context__.__traceback__ is None
    assert error.ulpdu is not None and len(error.ulpdu.obj) == 48  # its own copy
    assert bytes(error.ulpdu) == bytes(48)
    assert str(error) == "MPA-12: CRC mismatch"


def test_an_event_without_an_error_is_kept_as_it_is() -> None:
    queue = AsyncEventQueue()
    event = AsyncEvent(AsyncEventType.QP_FATAL, detail="peer closed")
    queue.post(event)
    assert queue.poll() is event
