"""The socket calls of the raw baselines and the floors: the stack's driver's own.

The trio driver (:mod:`stack.transport.driver`) sends with ``send``/``sendmsg`` on a plain
non-blocking socket straight from the calling task, reads with ``recv_into`` a
preallocated buffer, and enters trio's scheduler only to wait: ``wait_readable`` when the
socket has nothing, ``wait_writable`` when it is full.  A trio stream's ``send_all`` and
``receive_some`` add a checkpoint on each side of every call (a scheduler pass each), and
``receive_some`` a new object per read: a 64 B ping-pong through trio streams took 2.8x the
time of the same ping-pong with these calls (71 against 25 µs, both ends, 2026-12-07).  So
the raw baselines, "the fastest honest way to do the same exchange in Python with trio",
use these calls, as the floors (:mod:`stack.bench.floor_wire`) and the driver do.

A loop whose reads need not wait (a bulk receiver) calls ``trio.lowlevel.checkpoint()``
once per batch, as the driver does after a read that did not empty the socket, so one busy
connection does not starve the others of its process.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import trio

from stack.constants import IOV_MAX
from stack.transport.driver import _raw_socket

__all__ = [
    "count_received",
    "plain",
    "recv",
    "recv_exactly",
    "send_pieces",
    "send_plain",
    "socket_of",
]


def plain(stream: trio.SocketStream) -> socket.socket:
    """The stream's descriptor as a non-blocking standard socket, made as the stack's driver
    makes it (:func:`stack.transport.driver._raw_socket`; release it with ``detach``)."""
    sock = _raw_socket(stream)
    if sock is None:
        raise RuntimeError("not a TCP socket stream")
    return sock


@contextmanager
def socket_of(stream: trio.SocketStream) -> Iterator[socket.socket]:
    """:func:`plain` for the ``with`` block, detached when it ends (the stream keeps the
    descriptor and closes it)."""
    sock = plain(stream)
    try:
        yield sock
    finally:
        sock.detach()


async def recv(sock: socket.socket, room: memoryview) -> int:
    """``recv_into`` ``room``, waiting while the socket has nothing (0: end of stream)."""
    while True:
        try:
            return sock.recv_into(room)
        except BlockingIOError:
            await trio.lowlevel.wait_readable(sock)


async def recv_exactly(sock: socket.socket, room: memoryview) -> bool:
    """Fill ``room`` (:func:`recv`); False when the stream ends first."""
    got = 0
    end = len(room)
    while got < end:
        n = await recv(sock, room[got:])
        if not n:
            return False
        got += n
    return True


async def send_plain(sock: socket.socket, data: bytes | bytearray | memoryview) -> None:
    """Send all of ``data`` with ``send``, waiting only while the socket is full."""
    view = memoryview(data)
    while view:
        try:
            sent = sock.send(view)
        except BlockingIOError:
            await trio.lowlevel.wait_writable(sock)
            continue
        view = view[sent:]


async def send_pieces(sock: socket.socket, pieces: list[Any]) -> None:
    """Send ``pieces`` in order by scatter-gather ``sendmsg`` (IOV_MAX per call, no joined
    copy), waiting only while the socket is full.  The list is the caller's no more: a
    piece the socket took part of is replaced by a view of its rest."""
    start = 0
    while start < len(pieces):
        stop = min(len(pieces), start + IOV_MAX)
        try:
            sent = sock.sendmsg(pieces[start:stop])
        except BlockingIOError:
            sent = 0
        while start < stop and sent >= len(pieces[start]):
            sent -= len(pieces[start])
            start += 1
        if start < stop:  # the socket is full
            pieces[start] = memoryview(pieces[start])[sent:]
            await trio.lowlevel.wait_writable(sock)


async def count_received(sock: socket.socket, read: int) -> int:
    """Octets received until the peer's FIN, read with ``recv_into`` a preallocated buffer
    of ``read`` octets (the raw stream's sink; a checkpoint after a read that filled it)."""
    room = memoryview(bytearray(read))
    got = 0
    while n := await recv(sock, room):
        got += n
        if n == read:  # the socket may have more: let the process's other tasks run
            await trio.lowlevel.checkpoint()
    return got
