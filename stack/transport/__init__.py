"""The drivers (floor 3): an RDMA connection over a trio TCP stream and its connection
manager (listen, connect, accept, reject; RFC 5044 §7.1 startup over a real socket), the
blocking driver (one QP pumped by the thread that posts, no event loop) with its own
connect and listener, the scatter-gather send queue and the capture tap that records both
directions of a connection into a pcap."""

from stack.transport.blocking import BlockingConnection, ConnectionClosed
from stack.transport.blocking_cm import BlockingListener, BlockingRequest
from stack.transport.blocking_cm import connect as connect_blocking
from stack.transport.cm import (
    ConnectFailed,
    ConnectionManager,
    ConnectRejected,
    ConnectRequest,
    Listener,
)
from stack.transport.cm_events import CmEvent, CmEventType, EventChannel
from stack.transport.driver import RdmaConnection
from stack.transport.heap import keep_freed_memory
from stack.transport.pumping import EmssFollower, drain_halves
from stack.transport.sendq import SendQueue
from stack.transport.sockopts import limit_unsent
from stack.transport.tap import CaptureTap, pcap_tap_factory, socket_tap_factory

__all__ = [
    "BlockingConnection",
    "BlockingListener",
    "BlockingRequest",
    "CaptureTap",
    "CmEvent",
    "CmEventType",
    "ConnectFailed",
    "ConnectRejected",
    "ConnectRequest",
    "ConnectionClosed",
    "ConnectionManager",
    "EmssFollower",
    "EventChannel",
    "Listener",
    "RdmaConnection",
    "SendQueue",
    "connect_blocking",
    "drain_halves",
    "keep_freed_memory",
    "limit_unsent",
    "pcap_tap_factory",
    "socket_tap_factory",
]
