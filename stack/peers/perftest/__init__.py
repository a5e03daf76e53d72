"""perftest ``-R`` peers (``iwarp bench ib_write_bw|ib_read_bw|ib_send_bw``) on our stack.

Either side of perftest's bandwidth tests over rdma_cm, so the other side can be the real
perftest, for example on Linux siw.  :mod:`~stack.peers.perftest.protocol` holds the
exchange messages and their order, :mod:`~stack.peers.perftest.options` the options,
:mod:`~stack.peers.perftest.channel` the exchange connection,
:mod:`~stack.peers.perftest.side` what both sides share,
:mod:`~stack.peers.perftest.client` and :mod:`~stack.peers.perftest.server` the two sides
and :mod:`~stack.peers.perftest.cli` the commands.
"""

from stack.peers.perftest.channel import ByteMeter, Comm
from stack.peers.perftest.cli import options_from_args, register_bench
from stack.peers.perftest.client import PerftestClient, run_client
from stack.peers.perftest.options import DEFAULT_PORT, PerftestOptions, default_rx_depth
from stack.peers.perftest.protocol import (
    CREDIT,
    DEST,
    PERFTEST_VERSION,
    TESTS,
    ZERO_DEST,
    BwReport,
    PerftestError,
    PingpongDest,
    Step,
    check_peer_version,
    decode_credit,
    decode_mtu,
    decode_sys_int,
    decode_version,
    encode_credit,
    encode_mtu,
    encode_sys_int,
    encode_version,
    message_sizes,
    script,
)
from stack.peers.perftest.server import PerftestServer
from stack.peers.perftest.side import DataQp, PerftestSide

__all__ = [
    "CREDIT",
    "DEFAULT_PORT",
    "DEST",
    "PERFTEST_VERSION",
    "TESTS",
    "ZERO_DEST",
    "BwReport",
    "ByteMeter",
    "Comm",
    "DataQp",
    "PerftestClient",
    "PerftestError",
    "PerftestOptions",
    "PerftestServer",
    "PerftestSide",
    "PingpongDest",
    "Step",
    "check_peer_version",
    "decode_credit",
    "decode_mtu",
    "decode_sys_int",
    "decode_version",
    "default_rx_depth",
    "encode_credit",
    "encode_mtu",
    "encode_sys_int",
    "encode_version",
    "message_sizes",
    "options_from_args",
    "register_bench",
    "run_client",
    "script",
]
