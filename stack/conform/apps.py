"""What the DUT's application does with valid traffic: the ``--app`` profiles.

A conformance case often needs to see that the DUT *delivered* something (a valid FPDU
after a bad PAD) or did *not* (an FPDU with a bad CRC).  iWARP delivery is visible from
the wire only through what the application does next, so each profile plays the client
side of one standard application, with the protocol knowledge of this project's peers:

* ``rping`` (``rping -s``; :mod:`stack.cli.rping`): the client Sends its start buffer's
  ``rping_rdma_info``; the server RDMA-Reads it, Sends a go-ahead; the client Sends its RDMA
  buffer's info; the server RDMA-Writes the ping data there and Sends again.
* ``perftest`` (a perftest server with ``-R``; :mod:`stack.peers.perftest`): on the exchange
  connection (IRD = ORD = 0) the client Sends the HELLO parts (version, cycle buffer, cache
  line, MTU) and the server answers each with its own.
* ``rdma_server`` (librdmacm's example; :mod:`stack.cli.rdmacm`): the client Sends 16 bytes,
  the server Sends 16 bytes back.
* ``kbtp`` (``kbtp target``; :mod:`kbtp.messages`): the initiator Sends HELLO, the target
  answers HELLO_ACK.

:class:`AppClient` is sans-IO: :meth:`~AppClient.opening` gives the first messages, and
:meth:`~AppClient.on_segment` turns each decoded DUT segment into a :class:`Reaction`: the
evidence of a delivery, the answer to send, whether the exchange is complete.  The DUT
advertises no STags to the client in any of these applications; the rping client's
buffers (STags chosen here) are served by the profile itself (RDMA Read Responses).
"""

from __future__ import annotations

import argparse
import mmap
from dataclasses import dataclass, field

from kbtp.messages import Hello, HelloAck, KbtpError, decode_message
from stack.cli.rdmacm import MESSAGE_LEN
from stack.cli.rping import DEFAULT_SIZE, RDMA_INFO, ping_pattern, settings_from
from stack.constants import Opcode
from stack.peers.perftest.channel import COMM_SLOT_LEN
from stack.peers.perftest.options import PerftestOptions
from stack.peers.perftest.protocol import (
    HELLO_SIZES,
    encode_mtu,
    encode_sys_int,
    encode_version,
)
from stack.peers.perftest.side import CACHE_LINE
from stack.wire.events import (
    MpaSettings,
    RdmapMessage,
    ReadRequest,
    ReadResponse,
    Send,
)
from stack.wire.rdmap import Segment

__all__ = ["APPS", "AppClient", "AppProfile", "Reaction", "profile"]


@dataclass(frozen=True, slots=True)
class Reaction:
    """What the runner makes of one DUT segment.

    Fields: delivered (evidence that the DUT delivered the runner's last message: one line,
    or None); replies (messages to send back); done (the exchange is complete); unexpected
    (the segment is not part of the application's protocol: one line, or None).
    """

    delivered: str | None = None
    replies: tuple[RdmapMessage, ...] = ()
    done: bool = False
    unexpected: str | None = None


class AppClient:
    """The client side of one application on one connection (sans-IO)."""

    def opening(self) -> list[RdmapMessage]:
        """The messages the client sends first, in Full Operation."""
        raise NotImplementedError

    def on_segment(self, seg: Segment) -> Reaction:
        """React to one segment the DUT sent."""
        raise NotImplementedError


def _is_send(seg: Segment) -> bool:
    return seg.opcode in (Opcode.SEND, Opcode.SEND_SE, Opcode.SEND_INVALIDATE,
                          Opcode.SEND_SE_INVALIDATE)  # fmt: skip


def _describe(seg: Segment) -> str:
    size = len(seg.payload)
    return f"{seg.opcode_name} ({size} bytes)"


# -- rping --------------------------------------------------------------------------------

RPING_SIZE = DEFAULT_SIZE - 3
"""Bytes of the buffers the rping client advertises: odd, so the Read Response needs PAD
(the MPA-04 case), and within the server's default ``-S``."""
RPING_START_STAG, RPING_START_ADDR = 0x1A2B3C01, 0x10000
RPING_RDMA_STAG, RPING_RDMA_ADDR = 0x1A2B3C02, 0x20000


@dataclass
class _RpingClient(AppClient):
    """rping's client for one ping (see :mod:`stack.cli.rping`)."""

    stage: int = 0
    pattern: bytes = field(default_factory=lambda: ping_pattern(0, RPING_SIZE))

    def opening(self) -> list[RdmapMessage]:
        return [Send(RDMA_INFO.pack(RPING_START_ADDR, RPING_START_STAG, RPING_SIZE))]

    def on_segment(self, seg: Segment) -> Reaction:
        if seg.opcode == Opcode.RDMA_READ_REQUEST and isinstance(seg.header, ReadRequest):
            req = seg.header
            if req.src_stag == RPING_START_STAG and self.stage == 0:
                self.stage = 1
                n = max(0, min(req.size, RPING_SIZE - (req.src_to - RPING_START_ADDR)))
                start = req.src_to - RPING_START_ADDR
                data = self.pattern[start : start + n]
                return Reaction(
                    delivered=f"it RDMA-Read the {req.size} bytes our start-buffer Send named",
                    replies=(ReadResponse(req.sink_stag, req.sink_to, data),),
                )
        if _is_send(seg) and len(seg.payload) == RDMA_INFO.size:
            if self.stage == 1:
                self.stage = 2
                info = RDMA_INFO.pack(RPING_RDMA_ADDR, RPING_RDMA_STAG, RPING_SIZE)
                return Reaction(
                    delivered="it Sent the go-ahead after our Read Response",
                    replies=(Send(info),),
                )
            if self.stage == 3:
                return Reaction(delivered="it Sent the go-ahead after its RDMA Write", done=True)
        if seg.opcode == Opcode.RDMA_WRITE and seg.stag == RPING_RDMA_STAG and self.stage == 2:
            if seg.last:
                self.stage = 3
            return Reaction(delivered=f"it RDMA-Wrote {len(seg.payload)} bytes of ping data")
        return Reaction(unexpected=f"unexpected {_describe(seg)} from the rping server")


# -- perftest -----------------------------------------------------------------------------


@dataclass
class _PerftestClient(AppClient):
    """perftest's HELLO on the exchange connection (:mod:`stack.peers.perftest.protocol`)."""

    parts: tuple[bytes, ...] = field(
        default_factory=lambda: (
            encode_version(),
            encode_sys_int(mmap.PAGESIZE),
            encode_sys_int(CACHE_LINE),
            encode_mtu(),
        )
    )
    index: int = 0

    def opening(self) -> list[RdmapMessage]:
        return [Send(self.parts[0])]

    def on_segment(self, seg: Segment) -> Reaction:
        if _is_send(seg) and len(seg.payload) <= COMM_SLOT_LEN and self.index < len(self.parts):
            want = HELLO_SIZES[self.index]
            if len(seg.payload) == want:
                self.index += 1
                what = f"it answered HELLO part {self.index} of {len(self.parts)}"
                if self.index == len(self.parts):
                    return Reaction(delivered=what, done=True)
                return Reaction(delivered=what, replies=(Send(self.parts[self.index]),))
        return Reaction(unexpected=f"unexpected {_describe(seg)} from the perftest server")


# -- rdma_server ----------------------------------------------------------------------------


class _RdmaServerClient(AppClient):
    """librdmacm's ``rdma_client``: one 16-byte Send, one 16-byte Send back."""

    def opening(self) -> list[RdmapMessage]:
        return [Send(bytes(MESSAGE_LEN))]

    def on_segment(self, seg: Segment) -> Reaction:
        if _is_send(seg) and len(seg.payload) == MESSAGE_LEN:
            return Reaction(delivered=f"it Sent its {MESSAGE_LEN}-byte answer", done=True)
        return Reaction(unexpected=f"unexpected {_describe(seg)} from rdma_server")


# -- kbtp ---------------------------------------------------------------------------------

KBTP_IDENTITY = b"init-0"
"""The identity in HELLO: the first one ``kbtp target`` generates.  Any HELLO_ACK, even a
refusal, shows that HELLO was delivered."""


class _KbtpClient(AppClient):
    """A KBTP initiator's session setup: HELLO, then HELLO_ACK (docs/kbtp.md §4.2)."""

    def opening(self) -> list[RdmapMessage]:
        return [Send(Hello(request_id=1, identity=KBTP_IDENTITY).encode())]

    def on_segment(self, seg: Segment) -> Reaction:
        if _is_send(seg):
            try:
                msg = decode_message(bytes(seg.payload))
            except KbtpError:
                msg = None
            if isinstance(msg, HelloAck):
                return Reaction(delivered=f"it answered HELLO_ACK (status {msg.status})", done=True)
        return Reaction(unexpected=f"unexpected {_describe(seg)} from the KBTP target")


# -- profiles -----------------------------------------------------------------------------


@dataclass(frozen=True)
class AppProfile:
    """One ``--app``.  Fields: name, description (what the DUT runs), settings (the MPA
    choices of the application's client: revision, CRC, IRD/ORD), dut_command (how the DUT
    is started, for messages: ``{host}``/``{port}`` filled in), client (the client class),
    connect_command (the DUT-connecting form, None if not documented)."""

    name: str
    description: str
    settings: MpaSettings
    dut_command: str
    client: type[AppClient]
    connect_command: str | None = None

    def new_client(self) -> AppClient:
        return self.client()


def _rping_settings() -> MpaSettings:
    defaults = argparse.Namespace(mpa_rev=2, crc=True, markers=False, emss=None, p2p=None)
    return settings_from(defaults)


APPS: dict[str, AppProfile] = {
    "rping": AppProfile(
        "rping",
        "rping -s: RDMA-Reads the client's buffer, then RDMA-Writes into its second one",
        _rping_settings(),
        "rping -s -a {host} -p {port}",
        _RpingClient,
        "rping -c -a {host} -p {port} -C 1",
    ),
    "perftest": AppProfile(
        "perftest",
        "a perftest server with -R (ib_write_bw -R): the exchange connection's HELLO",
        PerftestOptions("write").settings(0),
        "ib_write_bw -R -p {port}",
        _PerftestClient,
        "ib_write_bw -R {host} -p {port}",
    ),
    "rdma_server": AppProfile(
        "rdma_server",
        "librdmacm's rdma_server: a 16-byte Send answered by a 16-byte Send",
        MpaSettings(ird=1, ord=1),
        "rdma_server -p {port}",
        _RdmaServerClient,
        "rdma_client -s {host} -p {port}",
    ),
    "kbtp": AppProfile(
        "kbtp",
        "kbtp target: HELLO answered by HELLO_ACK",
        MpaSettings(),
        "kbtp target --host {host} -p {port}",
        _KbtpClient,
        None,
    ),
}
"""Every ``--app``, by name."""


def profile(name: str) -> AppProfile:
    """The profile of ``--app NAME``; KeyError with the known names."""
    try:
        return APPS[name]
    except KeyError:
        raise KeyError(f"unknown app {name!r} (one of {', '.join(APPS)})") from None
