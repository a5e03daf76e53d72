"""A userspace iWARP stack (MPA, DDP, RDMAP, RFC 7306) over plain TCP.

Floors (a lower floor never imports a higher one):
0 ``stack.constants``, ``stack.crc``, ``stack.errors``, ``stack.pcap`` (capture files);
1 ``stack.wire`` (sans-IO MPA, FPDU framing, DDP, RDMAP);
2 ``stack.rnic`` (verbs: PD, MR, QP, CQ, placement, atomics);
3 ``stack.transport`` (trio drivers, connection manager, capture tap);
side ``stack.dissect`` (Scapy layers and the capture decoder; floors 0-1 only).
"""

__version__ = "0.1.0"
