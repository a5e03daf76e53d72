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
* ``kbtp`` (``kbtp target``; :mod:`kbtp.messages`): the initiator Sends HELLO (asking for
  the direct modes), the target answers HELLO_ACK, with the Table, Pool, Ring and Partition
  STags when it trusts the identity.
* ``bench`` (``iwarp bench server``; :mod:`stack.bench.protocol`): the MPA Request asks for
  a Send ping-pong; the Reply advertises a target region with every remote right; each Send
  is answered by a Send.

:class:`AppClient` is sans-IO: :meth:`~AppClient.opening` gives the first messages, and
:meth:`~AppClient.on_segment` turns each decoded DUT segment into a :class:`Reaction`: the
evidence of a delivery, the answer to send, whether the exchange is complete.  What the
DUT's application advertises is collected in :attr:`AppClient.regions` (:class:`Region`:
STag, Tagged Offset, length, rights, as the application registers them) and the client is
:attr:`~AppClient.ready` once the application waits with them advertised; the data-phase
cases aim at those regions.  The receives the application keeps posted are
:attr:`AppProfile.receives` (:class:`Receives`).  The rping client's own buffers (STags
chosen here) are served by the profile itself (RDMA Read Responses).  With the DUT
connecting, :attr:`AppProfile.server` plays the application's server side (rping's).
:class:`AppClient`, :class:`Reaction`, :class:`Region` and :class:`Receives` live in
:mod:`stack.conform.app_client`.
"""

from __future__ import annotations

import argparse
import mmap
from dataclasses import dataclass

from kbtp.constants import (
    COUNTER_LEN,
    DEFAULT_MAX_INLINE,
    DEFAULT_RECEIVE_MARGIN,
    DEFAULT_REQUEST_CREDITS,
    HELLO_FIXED_LEN,
    MAX_IDENTITY_LEN,
    MAX_REQUEST_FIXED_LEN,
    SLOT_LEN,
    Capability,
    Status,
)
from kbtp.messages import Hello, HelloAck, KbtpError, decode_message
from stack.bench.protocol import Advert, BenchError, SessionSpec
from stack.cli.rdmacm import MESSAGE_LEN
from stack.cli.rping import DEFAULT_SIZE, RDMA_INFO, ping_pattern, settings_from
from stack.conform.app_client import (
    READ_WRITE,
    AppClient,
    Reaction,
    Receives,
    Region,
    _describe,
    _is_send,
)
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
from stack.rnic.memory import Access
from stack.wire.events import (
    MpaSettings,
    RdmapMessage,
    RdmaWrite,
    ReadRequest,
    ReadResponse,
    Send,
)
from stack.wire.rdmap import Segment

__all__ = ["APPS", "AppClient", "AppProfile", "Reaction", "Receives", "Region", "profile"]


# -- rping --------------------------------------------------------------------------------

RPING_SIZE = DEFAULT_SIZE - 3
"""Bytes of the buffers the rping client advertises: odd, so the Read Response needs PAD
(the MPA-04 case), and within the server's default ``-S``."""
RPING_START_STAG, RPING_START_ADDR = 0x1A2B3C01, 0x10000
RPING_RDMA_STAG, RPING_RDMA_ADDR = 0x1A2B3C02, 0x20000


class _RpingClient(AppClient):
    """rping's client for one ping (see :mod:`stack.cli.rping`).  Ready once the server's
    RDMA Read of the start buffer arrives: its sink is the server's RDMA buffer, which rping
    registers with remote read and write access."""

    def __init__(self) -> None:
        super().__init__()
        self.stage = 0
        self.pattern = ping_pattern(0, RPING_SIZE)

    def opening(self) -> list[RdmapMessage]:
        return [Send(RDMA_INFO.pack(RPING_START_ADDR, RPING_START_STAG, RPING_SIZE))]

    def on_segment(self, seg: Segment) -> Reaction:
        if seg.opcode == Opcode.RDMA_READ_REQUEST and isinstance(seg.header, ReadRequest):
            req = seg.header
            if req.src_stag == RPING_START_STAG and self.stage == 0:
                self.stage = 1
                if req.size:
                    self.regions.append(
                        Region(
                            req.sink_stag,
                            req.sink_to,
                            req.size,
                            READ_WRITE,
                            "the rping server's RDMA buffer (sink of its RDMA Read)",
                            scratch=True,
                        )
                    )
                self.ready = True
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


class _PerftestClient(AppClient):
    """perftest's HELLO on the exchange connection (:mod:`stack.peers.perftest.protocol`).
    Nothing is advertised on that connection (the buffers belong to the data QPs)."""

    ready = True

    def __init__(self) -> None:
        super().__init__()
        self.parts = (
            encode_version(),
            encode_sys_int(mmap.PAGESIZE),
            encode_sys_int(CACHE_LINE),
            encode_mtu(),
        )
        self.index = 0

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

    ready = True

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
KBTP_IDENTITIES = (KBTP_IDENTITY, b"init-1", b"init-2", b"init-3")
"""Identities of the runner's simultaneous sessions (``kbtp target`` generates four)."""


def kbtp_receive_size(max_inline: int = DEFAULT_MAX_INLINE) -> int:
    """Octets of a KBTP target's receive: the longest request or HELLO (docs/kbtp.md §4.1)."""
    return max(MAX_REQUEST_FIXED_LEN + max_inline, HELLO_FIXED_LEN + MAX_IDENTITY_LEN)


class _KbtpClient(AppClient):
    """A KBTP initiator's session setup: HELLO asking for the direct modes, then HELLO_ACK
    (docs/kbtp.md §4.2).  A successful HELLO_ACK advertises the regions the target grants
    this identity (docs/kbtp.md §3.6: Table, Pool and Ring remote read, the Head's 8 octets
    remote atomic, Partition remote write; each registered exactly, in the session's own PD)."""

    def __init__(self, index: int = 0) -> None:
        super().__init__()
        self.identity = KBTP_IDENTITIES[index % len(KBTP_IDENTITIES)]
        self.ack: HelloAck | None = None

    def opening(self) -> list[RdmapMessage]:
        caps = Capability.DIRECT_LOAD | Capability.DIRECT_ALLOC | Capability.MASKED_FETCH_ADD
        return [Send(Hello(request_id=1, capabilities=caps, identity=self.identity).encode())]

    def on_segment(self, seg: Segment) -> Reaction:
        if _is_send(seg):
            try:
                msg = decode_message(bytes(seg.payload))
            except KbtpError:
                msg = None
            if isinstance(msg, HelloAck):
                self._advertised(msg)
                return Reaction(delivered=f"it answered HELLO_ACK (status {msg.status})", done=True)
        return Reaction(unexpected=f"unexpected {_describe(seg)} from the KBTP target")

    def _advertised(self, ack: HelloAck) -> None:
        self.ack = ack
        self.ready = True
        if ack.status != Status.SUCCESS:
            return
        # kbtp target posts R + M receives (docs/kbtp.md §9.2): over-credit requests are
        # answered CREDIT_EXCEEDED; only a burst beyond R + M finds no receive.
        self.receives = Receives(
            ack.request_credits + DEFAULT_RECEIVE_MARGIN, kbtp_receive_size(ack.max_inline)
        )
        who = self.identity.decode(errors="replace")
        if ack.capabilities & Capability.DIRECT_LOAD:
            pool = ack.block_size * ack.pool_blocks
            self.regions.append(
                Region(
                    ack.pool_stag,
                    ack.pool_offset,
                    pool,
                    Access.REMOTE_READ,
                    f"the KBTP Pool of {who} (HELLO_ACK)",
                    exact=True,
                )
            )
            table = 16 * (ack.handle_base + ack.handle_count - ack.table_base_handle)
            self.regions.append(
                Region(
                    ack.table_stag,
                    ack.table_offset,
                    table,
                    Access.REMOTE_READ,
                    f"the KBTP Table of {who} (HELLO_ACK)",
                )
            )
        if ack.capabilities & Capability.DIRECT_ALLOC:
            ring = SLOT_LEN << ack.ring_order
            self.regions.append(
                Region(
                    ack.ring_stag,
                    ack.ring_offset,
                    ring,
                    Access.REMOTE_READ,
                    f"the KBTP Ring of {who} (HELLO_ACK)",
                    exact=True,
                )
            )
            self.regions.append(
                Region(
                    ack.head_stag,
                    ack.head_offset,
                    COUNTER_LEN,
                    Access.REMOTE_ATOMIC,
                    f"the KBTP Head of {who} (HELLO_ACK)",
                    exact=True,
                )
            )
            self.regions.append(
                Region(
                    ack.partition_stag,
                    ack.partition_offset,
                    ack.partition_length,
                    Access.REMOTE_WRITE,
                    f"the KBTP Partition of {who} (HELLO_ACK)",
                    exact=True,
                )
            )


# -- bench --------------------------------------------------------------------------------

BENCH_SIZE = 62
"""Octets of the bench session: the target region, each receive and each ping."""
BENCH_RX_DEPTH = 4
BENCH_SPEC = SessionSpec("send", BENCH_SIZE, latency=True, rx_depth=BENCH_RX_DEPTH)
"""What the runner's MPA Request asks ``iwarp bench server`` for: a Send ping-pong with
BENCH_RX_DEPTH receives of BENCH_SIZE octets, and a target region."""


class _BenchClient(AppClient):
    """``iwarp bench`` Send latency: each ping is answered with a Send
    (:mod:`stack.bench.server`).  The Reply's private data advertises the target region
    with every remote right (RFC 7306 atomics included); it is the benchmark's scratch."""

    def __init__(self) -> None:
        super().__init__()
        self.advert: Advert | None = None

    def on_reply(self, private_data: bytes) -> None:
        try:
            advert = Advert.decode(private_data)
        except BenchError:
            return
        self.advert = advert
        self.ready = True
        if advert.rkey:
            rights = READ_WRITE | Access.REMOTE_ATOMIC
            self.regions.append(
                Region(
                    advert.rkey,
                    advert.addr,
                    advert.length,
                    rights,
                    "the bench server's target region (MPA Reply)",
                    scratch=True,
                )
            )

    def opening(self) -> list[RdmapMessage]:
        return [Send(bytes(range(BENCH_SIZE)))]

    def on_segment(self, seg: Segment) -> Reaction:
        if _is_send(seg) and len(seg.payload) == BENCH_SIZE:
            return Reaction(delivered=f"it echoed the {BENCH_SIZE}-byte ping", done=True)
        return Reaction(unexpected=f"unexpected {_describe(seg)} from the bench server")


# -- rping, server side (the DUT connects) ----------------------------------------------------

RPING_SERVER_STAG, RPING_SERVER_ADDR = 0x5E4D3C01, 0x40000


class _RpingServer(AppClient):
    """rping's server for one ping, played by the runner when the DUT's ``rping -c``
    connects: the client's first Send advertises its start buffer (remote read and write,
    rping's registration): the runner is ready then.  Resumed, it RDMA-Reads the buffer,
    Sends the go-ahead, RDMA-Writes the ping back into the RDMA buffer the client
    advertises next, and Sends again."""

    def __init__(self) -> None:
        super().__init__()
        self.stage = 0
        self.data = b""

    def opening(self) -> list[RdmapMessage]:
        return []

    def on_segment(self, seg: Segment) -> Reaction:
        if _is_send(seg) and len(seg.payload) == RDMA_INFO.size:
            addr, stag, size = RDMA_INFO.unpack(bytes(seg.payload))
            if self.stage == 0:
                self.stage = 1
                self.ready = True
                self.regions.append(
                    Region(
                        stag,
                        addr,
                        size,
                        READ_WRITE,
                        "the rping client's start buffer (its first Send)",
                        scratch=True,
                    )
                )
                read = ReadRequest(RPING_SERVER_STAG, RPING_SERVER_ADDR, size, stag, addr)
                return Reaction(delivered="it Sent its start buffer", replies=(read,))
            if self.stage == 2:
                self.stage = 3
                return Reaction(
                    delivered="it Sent its RDMA buffer after the go-ahead",
                    replies=(RdmaWrite(stag, addr, self.data[:size]), Send(bytes(RDMA_INFO.size))),
                    done=True,
                )
        if seg.opcode == Opcode.RDMA_READ_RESPONSE and self.stage == 1:
            self.data += bytes(seg.payload)
            if seg.last:
                self.stage = 2
                return Reaction(delivered=f"it answered the RDMA Read ({len(self.data)} bytes)",
                                replies=(Send(bytes(RDMA_INFO.size)),))  # fmt: skip
            return Reaction()
        return Reaction(unexpected=f"unexpected {_describe(seg)} from the rping client")


# -- profiles -----------------------------------------------------------------------------


@dataclass(frozen=True)
class AppProfile:
    """One ``--app``.  Fields: name, description (what the DUT runs), settings (the MPA
    choices of the application's client: revision, CRC, IRD/ORD), dut_command (how the DUT
    is started, for messages: ``{host}``/``{port}`` filled in), client (the client class;
    called with the index of the connection when the application has sessions of their
    own), connect_command (the DUT-connecting form, None if not documented), private_data
    (of the runner's MPA Request), receives (what the DUT keeps posted), phases (the case
    phases that apply: ``startup`` cases send private data of their own, which an
    application that parses it refuses), sessions (connections the DUT serves at once,
    each with its own protection domain when ``own_pd``), server (the application's server
    side when the DUT connects).
    """

    name: str
    description: str
    settings: MpaSettings
    dut_command: str
    client: type[AppClient]
    connect_command: str | None = None
    private_data: bytes = b""
    receives: Receives = Receives(1, 16)
    phases: frozenset[str] = frozenset({"startup", "data"})
    sessions: int = 1
    own_pd: bool = False
    server: type[AppClient] | None = None

    def new_client(self, index: int = 0) -> AppClient:
        if self.client is _KbtpClient:
            return _KbtpClient(index)
        return self.client()

    def new_server(self) -> AppClient | None:
        return self.server() if self.server is not None else None


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
        receives=Receives(1, RDMA_INFO.size),
        server=_RpingServer,
    ),
    "perftest": AppProfile(
        "perftest",
        "a perftest server with -R (ib_write_bw -R): the exchange connection's HELLO",
        PerftestOptions("write").settings(0),
        "ib_write_bw -R -p {port}",
        _PerftestClient,
        "ib_write_bw -R {host} -p {port}",
        receives=Receives(1, COMM_SLOT_LEN),
    ),
    "rdma_server": AppProfile(
        "rdma_server",
        "librdmacm's rdma_server: a 16-byte Send answered by a 16-byte Send",
        MpaSettings(ird=1, ord=1),
        "rdma_server -p {port}",
        _RdmaServerClient,
        "rdma_client -s {host} -p {port}",
        receives=Receives(1, MESSAGE_LEN, reposts=False),
    ),
    "kbtp": AppProfile(
        "kbtp",
        "kbtp target: HELLO answered by HELLO_ACK",
        MpaSettings(),
        "kbtp target --host {host} -p {port} --trusted",
        _KbtpClient,
        None,
        receives=Receives(DEFAULT_REQUEST_CREDITS + DEFAULT_RECEIVE_MARGIN, kbtp_receive_size()),
        sessions=len(KBTP_IDENTITIES),
        own_pd=True,
    ),
    "bench": AppProfile(
        "bench",
        "iwarp bench server: a Send ping-pong and a target region with every remote right",
        MpaSettings(),
        "iwarp bench server --host {host} -p {port}",
        _BenchClient,
        None,
        private_data=BENCH_SPEC.encode(),
        receives=Receives(BENCH_RX_DEPTH, BENCH_SIZE),
        phases=frozenset({"data"}),
        sessions=8,
    ),
}
"""Every ``--app``, by name."""


def profile(name: str) -> AppProfile:
    """The profile of ``--app NAME``; KeyError with the known names."""
    try:
        return APPS[name]
    except KeyError:
        raise KeyError(f"unknown app {name!r} (one of {', '.join(APPS)})") from None
