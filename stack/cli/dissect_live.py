"""``iwarp dissect -i IFACE``: live decode of an interface, as ``tshark -i`` does.

The capture (:class:`stack.pcap.LiveCapture`, an AF_PACKET socket; CAP_NET_RAW) yields
the same TCP segments as a capture file, so ``iwarp dissect`` feeds them to the same
decoder loop.  ``-f`` is the capture filter (:mod:`stack.pcap.capfilter`), ``-w OUT``
saves every kept frame (the capture itself, to decode again with ``-r``), ``-D`` lists the
interfaces.  SIGINT (Ctrl-C) and SIGTERM end the capture: what was decoded is finished and
the statistics asked for are printed.
"""

from __future__ import annotations

import argparse
import contextlib
import signal
import socket
import sys
import threading
from collections.abc import Callable, Iterator
from typing import TextIO

from stack.cli import CliError
from stack.errors import LocalError
from stack.pcap import (
    CaptureError,
    CaptureFilterError,
    CapturePermissionError,
    LiveCapture,
    PcapWriter,
    compile_capture_filter,
    interfaces,
)

__all__ = [
    "announce",
    "capture_summary",
    "list_interfaces",
    "open_live",
    "permission_hint",
    "stop_on_signals",
]


def list_interfaces(out: TextIO) -> None:
    """``-D``: the interfaces, numbered as ``-i`` accepts them (``1. eth0``)."""
    for number, (name, description) in enumerate(interfaces(), 1):
        print(f"{number}. {name}" + (f" ({description})" if description else ""), file=out)


def permission_hint(interface: str) -> str:
    """The error of a capture without CAP_NET_RAW, with the tcpdump alternative."""
    return (
        f"capturing on {interface} needs CAP_NET_RAW (run as root or grant the capability), "
        f"or pipe tcpdump: tcpdump -U -i {interface} -w - | iwarp dissect -"
    )


def open_live(
    args: argparse.Namespace, on_wait: Callable[[], object]
) -> tuple[LiveCapture, PcapWriter | None]:
    """The capture ``-i``/``-f`` ask for and the ``-w`` writer (or None); :class:`CliError`
    for a bad filter, an unknown interface, a missing privilege or an unwritable file."""
    keep = None
    if args.capture_filter is not None:
        try:
            keep = compile_capture_filter(args.capture_filter)
        except CaptureFilterError as exc:
            raise CliError(f"bad capture filter: {exc}") from None
    try:
        capture = LiveCapture(args.interface, keep=keep, on_wait=on_wait)
    except CapturePermissionError:
        raise CliError(permission_hint(args.interface)) from None
    except CaptureError as exc:
        hint = " (list: iwarp dissect -D)" if "no such interface" in exc.message else ""
        raise CliError(f"{exc}{hint}") from None
    if not args.write:
        return capture, None
    try:
        writer = PcapWriter(args.write, linktype=capture.linktype, flush_each=True)
    except (OSError, LocalError) as exc:
        capture.close()
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
        raise CliError(f"-w {args.write}: {reason}") from None
    capture.on_frame = writer.write_frame
    return capture, writer


@contextlib.contextmanager
def stop_on_signals() -> Iterator[int | None]:
    """SIGINT and SIGTERM raise KeyboardInterrupt while the block runs.

    SIGINT explicitly too: a capture started in the background by a non-interactive shell
    (nohup, a CI runner) inherits SIGINT ignored, and Python would keep ignoring it, so the
    only way to end the capture cleanly, with its statistics, would be lost.  Yields the
    read end of a wake-up pipe (:func:`signal.set_wakeup_fd`) for the capture to wait on
    (:attr:`LiveCapture.wake_fd`): Python runs a signal's handler only between bytecodes,
    so a signal landing just before the capture's ``select`` would otherwise be handled
    only when the next packet came (never, on a quiet interface).  None off the main
    thread, where signals cannot be handled.
    """
    if threading.current_thread() is not threading.main_thread():
        yield None
        return
    stops = (signal.SIGINT, signal.SIGTERM)
    wake_read, wake_write = socket.socketpair()
    wake_read.setblocking(False)
    wake_write.setblocking(False)
    previous_wake = signal.set_wakeup_fd(wake_write.fileno(), warn_on_full_buffer=False)
    previous = [signal.signal(signum, signal.default_int_handler) for signum in stops]
    try:
        yield wake_read.fileno()
    finally:
        for signum, handler in zip(stops, previous, strict=True):
            signal.signal(signum, handler)
        signal.set_wakeup_fd(previous_wake)
        wake_read.close()
        wake_write.close()


def capture_summary(capture: LiveCapture) -> str:
    """The closing line on standard error: ``12 packets captured`` (and the kernel's drops)."""
    line = f"{capture.stats.frames} packets captured"
    if capture.dropped:
        line += f", {capture.dropped} dropped by the kernel (decoding fell behind)"
    return line


def announce(capture: LiveCapture) -> None:
    """``Capturing on 'lo'`` on standard error, once the socket is open (as tshark says)."""
    print(f"Capturing on '{capture.name}'", file=sys.stderr, flush=True)
