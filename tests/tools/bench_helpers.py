"""An in-process ``iwarp bench server`` and a client of it, for the bench tests."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from stack.bench import Client, server_for
from stack.rnic import Rnic
from stack.transport.cm import ConnectionManager


@asynccontextmanager
async def bench_client(name: str = "client") -> AsyncIterator[Client]:
    """A bench server in this process (CRC and markers off, the socket's EMSS) and a
    :class:`Client` of it, on an RNIC of its own named ``name`` (``client.cm``,
    ``client.rnic``, ``client.host``, ``client.port`` for raw connects)."""
    async with server_for("in-process", host="", port=0, crc=False, markers=False, emss=None) as (
        host,
        port,
        _layout,
    ):
        async with ConnectionManager.open(Rnic(name)) as cm:
            yield Client(cm, host, port)
