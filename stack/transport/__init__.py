"""The trio drivers (floor 3): an RDMA connection over a TCP stream, the connection manager
(listen, connect, accept, reject; RFC 5044 §7.1 startup over a real socket), the
scatter-gather send queue and the capture tap that records both directions of a connection
into a pcap."""

from stack.transport.cm import (
    ConnectFailed,
    ConnectionManager,
    ConnectRejected,
    ConnectRequest,
    Listener,
)
from stack.transport.cm_events import CmEvent, CmEventType, EventChannel
from stack.transport.driver import RdmaConnection, drain_halves
from stack.transport.heap import keep_freed_memory
from stack.transport.sendq import SendQueue
from stack.transport.sockopts import limit_unsent
from stack.transport.tap import CaptureTap, pcap_tap_factory

__all__ = [
    "CaptureTap",
    "CmEvent",
    "CmEventType",
    "ConnectFailed",
    "ConnectRejected",
    "ConnectRequest",
    "ConnectionManager",
    "EventChannel",
    "Listener",
    "RdmaConnection",
    "SendQueue",
    "drain_halves",
    "keep_freed_memory",
    "limit_unsent",
    "pcap_tap_factory",
]
