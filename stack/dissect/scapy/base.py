"""The base of every iWARP Scapy layer: truncated headers raise DecodeError (MPA-16, DDP-10).

A header too short to dissect raises :class:`~stack.errors.DecodeError` with the layer's
:attr:`~_IwarpPacket.decode_rule` when it is the top layer; inside a packet Scapy turns
it into ``Raw`` as usual.  Extra ``__slots__`` of a layer survive :meth:`Packet.copy`.
"""

from __future__ import annotations

import struct
from typing import Any

from scapy.packet import Packet

from stack.errors import DecodeError

__all__: list[str] = []  # package-private: the layers are exported by their modules


def _width(mask: int) -> int:
    """Bit width of a contiguous field mask from :mod:`stack.constants`."""
    return bin(mask).count("1")


class _IwarpPacket(Packet):
    """Base of every layer here: truncated headers raise DecodeError; extra slots are copied."""

    decode_rule = "MPA-16"
    """Rule ID reported when this layer's header is truncated."""
    match_subclass = True  # pkt[MPA_FPDU] also finds MPA_FPDU_NoCRC, pkt[DDP] both DDPs

    def do_dissect(self, s: bytes) -> bytes:
        try:
            return super().do_dissect(s)
        except (struct.error, IndexError) as exc:
            raise DecodeError(
                self.decode_rule, f"{self.name}: header truncated ({len(s)} bytes)"
            ) from exc

    def copy(self) -> Any:
        clone = super().copy()
        for attr in type(self).__all_slots__ - set(Packet.__slots__):
            if hasattr(self, attr):
                object.__setattr__(clone, attr, getattr(self, attr))
        return clone
