"""``-w FILE`` of the tools that talk to a peer: our side's capture, one rule for all.

:func:`capturing_manager` opens the connection manager of a command with every connection
recorded to ``path`` (a pcap, both directions byte for byte, :mod:`stack.transport.tap`),
or without a capture when ``path`` is None.  A file that cannot be written, when opened
or when closed, is the command's one-line error (:func:`~stack.cli.json_report.output_error`),
naming the file.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from stack.cli.json_report import output_error
from stack.pcap import PcapWriter
from stack.rnic import Rnic
from stack.transport.cm import ConnectionManager
from stack.transport.tap import pcap_tap_factory

CAPTURE_HELP = "write our side's capture of every connection to FILE (pcap)"
"""The help text of every ``-w FILE``."""


@asynccontextmanager
async def capturing_manager(rnic: Rnic, path: str | None) -> AsyncIterator[ConnectionManager]:
    """``ConnectionManager.open(rnic)``, recording every connection to ``path`` if given."""
    if path is None:
        async with ConnectionManager.open(rnic) as cm:
            yield cm
        return
    try:
        writer = PcapWriter(path)
    except OSError as exc:
        raise output_error("-w", path, exc) from None
    try:
        async with ConnectionManager.open(rnic, tap_factory=pcap_tap_factory(writer)) as cm:
            yield cm
    finally:
        try:
            writer.close()
        except OSError as exc:  # the last records did not fit (a full disk)
            raise output_error("-w", path, exc) from None
