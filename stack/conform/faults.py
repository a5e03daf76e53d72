"""Deliberately broken DUTs: named faults injected into this project's own stack.

A conformance case is only worth something if it can fail.  Each :class:`Fault` breaks one
behaviour of our stack the way a faulty implementation would, and names the cases that
must then FAIL (or WARN); the tests run the stack as the DUT in-process with the fault
applied and check that exactly those cases change while the rest still pass.

Where faults are applied (the documented points; nothing else is touched):

* :data:`ENGINE_FACTORY` -- ``stack.transport.cm.IwarpConnection``, the engine class the
  connection manager creates for every connection it listens for or opens.  The runner
  never uses the connection manager (its peer is :mod:`stack.conform.peer`), so patching
  that one name breaks the DUT only, even with runner and DUT in one process.
* on each engine the DUT creates (:class:`~stack.wire.connection.IwarpConnection`): its
  public methods ``receive_data``, ``next_event``, ``send_message`` and ``send_terminate``,
  its ``settings`` and those of its MPA engine, and two attributes of
  :class:`~stack.wire.mpa.MpaConnection` the wire core has no public switch for: the FPDU
  deframer ``_deframer`` (its ``crc`` flag) and the responder's hold buffer ``_held``
  (MPA-25).

:func:`injected` applies faults (and optional settings changes, e.g. short startup timers)
for the duration of a ``with`` block.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any

from stack.conform.model import case_id
from stack.constants import MPA_FRAME_HEADER_LEN, TERM_LLP_INVALID_STARTUP, MpaFlag, RtrType
from stack.errors import MpaError, ProtocolError
from stack.wire.connection import ConnectionEvent, IwarpConnection
from stack.wire.events import (
    Established,
    RdmapMessage,
    RdmaWrite,
    ReadRequest,
    RevPolicy,
    Role,
    Send,
    Terminate,
)
from stack.wire.mpa import MpaState

__all__ = ["ENGINE_FACTORY", "FAULTS", "Fault", "injected"]

ENGINE_FACTORY = ("stack.transport.cm", "IwarpConnection")
"""(module, name) of the engine class the connection manager instantiates."""


@dataclass(frozen=True)
class Fault:
    """One way to break the stack.  Fields: name, description, fails (the case IDs that must
    not pass with it, with the status they get: ``{"MPA-12": "FAIL"}``), apply (patches one
    new engine of the DUT)."""

    name: str
    description: str
    fails: dict[str, str]
    apply: Callable[[IwarpConnection], None]


# -- the faults ---------------------------------------------------------------------------


def _crc_wrong_terminate(engine: IwarpConnection) -> None:
    send_terminate = engine.send_terminate

    def wrong(error: ProtocolError, offending_ulpdu: memoryview | None) -> None:
        if error.rule == "MPA-12":  # a CRC error reported as an invalid startup frame
            error = MpaError(error.rule, error.detail, TERM_LLP_INVALID_STARTUP)
        send_terminate(error, offending_ulpdu)

    engine.send_terminate = wrong  # type: ignore[method-assign]


def _after_established(engine: IwarpConnection, action: Callable[[], None]) -> None:
    """Run ``action`` once, when the engine reports Full Operation."""
    next_event = engine.next_event
    done = False

    def hooked() -> ConnectionEvent:
        nonlocal done
        event = next_event()
        if isinstance(event, Established) and not done:
            done = True
            action()
        return event

    engine.next_event = hooked  # type: ignore[method-assign]


def _crc_unchecked(engine: IwarpConnection) -> None:
    def off() -> None:
        deframer = engine.mpa._deframer  # noqa: SLF001 - documented fault point
        if deframer is not None:
            deframer.crc = False

    _after_established(engine, off)


def _reply_trailing_fpdu(engine: IwarpConnection) -> None:
    def early() -> None:
        if engine.role is Role.RESPONDER:
            engine.mpa._held = None  # noqa: SLF001 - documented fault point (MPA-25 hold)
            engine.send_message(RdmaWrite(1, 0, b""))

    _after_established(engine, early)


def _markers_ignored(engine: IwarpConnection) -> None:
    """Reads the peer's M bit as 0: no markers towards a peer that asked for them."""
    receive_data = engine.receive_data
    seen = 0

    def hooked(data: Any) -> None:
        nonlocal seen
        flags_at = MPA_FRAME_HEADER_LEN - 4  # frame byte 16: the flags
        waiting = engine.mpa.state in (MpaState.AWAIT_REQUEST, MpaState.AWAIT_REPLY)
        if waiting and seen <= flags_at < seen + len(data):
            buf = bytearray(data)
            buf[flags_at - seen] &= ~MpaFlag.MARKERS & 0xFF
            data = bytes(buf)
        seen += len(data)
        receive_data(data)

    engine.receive_data = hooked  # type: ignore[method-assign]


def _unknown_rev_accepted(engine: IwarpConnection) -> None:
    engine.mpa.settings = replace(engine.mpa.settings, rev_policy=RevPolicy.ACCEPT)


def _terminate_headers(engine: IwarpConnection) -> None:
    """LLP Terminates copy a DDP header (RFC 5040 Fig. 10 says none: RDMAP-12, SHOULD)."""
    send_message = engine.send_message

    def hooked(message: RdmapMessage) -> None:
        if isinstance(message, Terminate) and message.layer == 2 and not message.d:
            header = bytes([0x41, 0x43]) + bytes(16)  # an untagged Send's DDP header
            message = replace(message, m=True, d=True, ddp_seg_len=len(header), ddp_header=header)
        send_message(message)

    engine.send_message = hooked  # type: ignore[method-assign]


def _wrong_rtr(engine: IwarpConnection) -> None:
    """A peer-to-peer initiator that always sends a Send RTR, whatever was negotiated."""
    send_message = engine.send_message
    first = True

    def hooked(message: RdmapMessage) -> None:
        nonlocal first
        neg = engine.negotiated
        if first and neg is not None and neg.p2p and neg.rtr and neg.rtr is not RtrType.SEND:
            first = False
            if isinstance(message, RdmaWrite | ReadRequest) and engine.role is Role.INITIATOR:
                message = Send(b"")
        send_message(message)

    engine.send_message = hooked  # type: ignore[method-assign]


FAULTS: dict[str, Fault] = {
    f.name: f
    for f in (
        Fault(
            "crc-wrong-terminate",
            "a CRC error is reported with Terminate 2/0/0x04 instead of 2/0/0x02",
            {"MPA-12": "FAIL"},
            _crc_wrong_terminate,
        ),
        Fault(
            "crc-unchecked",
            "received FPDUs are delivered without checking their CRC",
            {"MPA-12": "FAIL"},
            _crc_unchecked,
        ),
        Fault(
            "reply-trailing-fpdu",
            "the MPA Reply is followed at once by an FPDU (a zero-length RDMA Write), before "
            "the initiator's first FPDU",
            {"MPA-25": "FAIL"},
            _reply_trailing_fpdu,
        ),
        Fault(
            "markers-ignored",
            "the peer's M bit is read as 0: no markers in FPDUs to a peer that asked for them",
            {"MPA-09": "FAIL", case_id("MPA-09", 2): "FAIL"},
            _markers_ignored,
        ),
        Fault(
            "unknown-rev-accepted",
            "a Request with an undefined MPA revision is accepted instead of refused",
            {case_id("MPA-20", 2): "FAIL", case_id("MPA-20", 3): "FAIL"},
            _unknown_rev_accepted,
        ),
        Fault(
            "terminate-headers",
            "LLP (MPA) Terminates carry a copied DDP header (Fig. 10 of RFC 5040: none)",
            {"MPA-12": "WARN", "MPA-16": "WARN"},
            _terminate_headers,
        ),
        Fault(
            "wrong-rtr",
            "a peer-to-peer initiator sends a Send RTR whatever RTR kind was negotiated",
            {"ERC-09": "FAIL"},
            _wrong_rtr,
        ),
    )
}
"""Every fault, by name."""


@contextmanager
def injected(*names: str, **settings: Any) -> Iterator[None]:
    """Apply the faults ``names`` (and :class:`~stack.wire.events.MpaSettings` changes
    ``settings``, e.g. ``request_timeout=1.0``) to every engine the connection manager
    creates inside the block; KeyError for an unknown fault."""
    faults = [FAULTS[n] for n in names]
    module = importlib.import_module(ENGINE_FACTORY[0])
    original = getattr(module, ENGINE_FACTORY[1])

    def factory(role: Role, engine_settings: Any = None, **kwargs: Any) -> IwarpConnection:
        if settings and engine_settings is not None:
            engine_settings = replace(engine_settings, **settings)
        engine = original(role, engine_settings, **kwargs)
        for fault in faults:
            fault.apply(engine)
        return engine

    setattr(module, ENGINE_FACTORY[1], factory)
    try:
        yield
    finally:
        setattr(module, ENGINE_FACTORY[1], original)
