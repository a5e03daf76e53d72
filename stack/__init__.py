"""A userspace iWARP stack (MPA, DDP, RDMAP, RFC 7306) over plain TCP.

Floors (a lower floor never imports a higher one):
0 ``stack.constants``, ``stack.crc``, ``stack.errors``, ``stack.pcap`` (capture files);
1 ``stack.wire`` (sans-IO MPA, FPDU framing, DDP, RDMAP);
2 ``stack.rnic`` (verbs: PD, MR, QP, CQ, placement, atomics);
3 ``stack.transport`` (trio drivers, connection manager, capture tap);
4 ``stack.verbs_sync`` (synchronous, pyverbs-shaped verbs on an RNIC thread);
side ``stack.dissect`` (Scapy layers and the capture decoder; floors 0-1 only);
side ``stack.rules`` (the rule catalog behind every rule ID the tools print);
5 ``stack.cli`` (the ``iwarp`` command), with ``stack.bench``, ``stack.peers``,
``stack.siwvm`` and ``stack.interop`` behind its subcommands.

The subpackages are imported on demand (``import stack.wire``), so a tool loads only what it
uses; each re-exports its public names with ``__all__``.
"""

from importlib import metadata as _metadata

try:
    __version__ = _metadata.version("iwarp-kbtp")
except _metadata.PackageNotFoundError:  # pragma: no cover - a bare checkout
    __version__ = "0.0.0+unknown"

__all__ = ["__version__"]
