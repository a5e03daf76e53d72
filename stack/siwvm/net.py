"""The guest's network as QEMU user networking sets it up: addresses, ports, the netdev.

The guest is 10.0.2.15/24 with no default route; it reaches the host's 127.0.0.1 as
10.0.2.2; the host reaches the guest through forwards bound to 127.0.0.1.
"""

from __future__ import annotations

import socket

__all__ = ["AGENT_GUEST_PORT", "GUEST_ADDR", "HOST_ADDR", "NETDEV_ID", "free_port"]

GUEST_ADDR = "10.0.2.15"
"""The guest's address on QEMU user networking (eth0; siw0 sits on it)."""
HOST_ADDR = "10.0.2.2"
"""The host's 127.0.0.1 as the guest sees it."""
AGENT_GUEST_PORT = 7000
"""Guest port of the agent: tests must not use it (the agent owns it)."""
NETDEV_ID = "n0"
"""QEMU's id of the guest NIC's user-network backend (hostfwds and captures name it)."""


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
