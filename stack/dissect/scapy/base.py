"""The base of every iWARP Scapy layer: lenient dissection with a verdict, or strict (MPA-16).

Scapy's habit is to decode what it can: a header too short or malformed to dissect is kept
as an :class:`IWARP_Undecoded` layer (a ``Raw`` that also carries the verdict, shown by
``show()`` and ``summary()``), and ``pkt.iwarp_error`` gives the first such verdict of the
packet (None when everything decoded).  ``Layer.strict(data)`` dissects the same way and
raises :class:`~stack.errors.DecodeError` instead (also for a truncated FPDU, MPA-16).
Extra ``__slots__`` of a layer survive :meth:`Packet.copy`.
"""

from __future__ import annotations

import struct
from typing import Any, Self

from scapy.config import conf
from scapy.fields import Field
from scapy.packet import Packet, Raw

from stack.errors import DecodeError

__all__ = ["IWARP_Undecoded"]


def _width(mask: int) -> int:
    """Bit width of a contiguous field mask from :mod:`stack.constants`."""
    return bin(mask).count("1")


class _NoWireField(Field[Any, Any]):
    """A field that occupies no bytes on the wire: a decoder's verdict, shown by show()."""

    def addfield(self, pkt: Packet, s: bytes, val: Any) -> bytes:
        return s

    def getfield(self, pkt: Packet, s: bytes) -> tuple[bytes, Any]:
        return s, self.default

    def i2repr(self, pkt: Packet | None, x: Any) -> str:
        return str(x)


class IWARP_Undecoded(Raw):
    """Bytes an iWARP layer could not dissect, with the verdict (``iwarp_error``, rule first).

    A ``Raw`` (``pkt[Raw].load`` finds it from an iWARP layer); ``iwarp_error`` takes no
    wire bytes, so ``bytes(pkt)`` is still exactly what was dissected.
    """

    name = "iWARP undecoded"
    fields_desc = [_NoWireField("iwarp_error", ""), *Raw.fields_desc]

    def mysummary(self) -> str:
        return f"iWARP undecoded ({len(self.load)} bytes): {self.iwarp_error}"


def _verdict(exc: DecodeError) -> str:
    return str(exc)


class _IwarpPacket(Packet):
    """Base of every layer here: lenient dissection with a verdict; extra slots are copied."""

    decode_rule = "MPA-16"
    """Rule ID reported when this layer's header is truncated."""
    starts_pdu = False
    """True for layers that begin an MPA PDU on the stream (frames, marker, FPDU): where
    one follows another (``TCPSession`` stacks a segment's PDUs), each PDU ends."""
    match_subclass = True  # pkt[MPA_FPDU] also finds MPA_FPDU_NoCRC, pkt[DDP] both DDPs

    def do_dissect(self, s: bytes) -> bytes:
        try:
            return super().do_dissect(s)
        except (struct.error, IndexError) as exc:
            raise DecodeError(
                self.decode_rule, f"{self.name}: header truncated ({len(s)} bytes)"
            ) from exc

    def dissect(self, s: bytes) -> None:
        if self.underlayer is not None:
            super().dissect(s)  # the layer below keeps what this one cannot dissect
            return
        try:
            super().dissect(s)
        except DecodeError as exc:
            # Top layer: nothing of it decoded; keep every byte with the verdict.
            self.fields = {}
            self.raw_packet_cache = b""
            self.raw_packet_cache_fields = {}
            self.remove_payload()
            self.add_payload(IWARP_Undecoded(iwarp_error=_verdict(exc), load=s))

    def do_dissect_payload(self, s: bytes) -> None:
        if not s:
            return
        cls = self.guess_payload_class(s)
        try:
            payload = cls(
                s,
                stop_dissection_after=self.stop_dissection_after,
                _internal=1,
                _underlayer=self,
            )
        except DecodeError as exc:
            payload = IWARP_Undecoded(iwarp_error=_verdict(exc), load=s)
        except Exception:  # what Scapy does for any other layer that fails
            if conf.debug_dissector:
                raise
            payload = conf.raw_layer(s, _internal=1, _underlayer=self)
        self.add_payload(payload)

    @property
    def iwarp_error(self) -> str | None:
        """The first verdict of a layer that could not be dissected, or a truncated FPDU
        (``"MPA-16: ..."``); None when every iWARP layer decoded."""
        layer: Packet | None = self
        while layer is not None and not isinstance(layer, conf.padding_layer):
            if layer is not self and getattr(layer, "starts_pdu", False):
                break  # the next PDU's verdicts are its own
            if isinstance(layer, IWARP_Undecoded):
                return str(layer.iwarp_error)
            verdict = layer.own_error() if isinstance(layer, _IwarpPacket) else None
            if verdict is not None:
                return verdict
            layer = layer.payload if layer.payload else None
        return None

    def own_error(self) -> str | None:
        """This layer's own verdict beyond undecodable bytes (e.g. truncation); None here."""
        return None

    def _do_summary(self) -> tuple[int, str, list[Any]]:
        if self.own_error() is None:
            return super()._do_summary()
        # A layer with a verdict is always in the summary, whatever lies above it.
        _, above, needed = self.payload._do_summary()
        mine = str(self.mysummary())
        return 1, f"{mine} / {above}" if above else mine, needed

    def next_pdu(self) -> Packet | None:
        """The next MPA PDU stacked after this one's layers (``TCPSession`` output), if any."""
        layer = self.payload
        while layer:
            if getattr(layer, "starts_pdu", False):
                return layer
            layer = layer.payload
        return None

    @classmethod
    def strict(cls, data: bytes) -> Self:
        """Dissect ``data`` as this layer; raise :class:`DecodeError` unless every iWARP
        layer decoded and no FPDU is truncated (MPA-16, DDP-10)."""
        pkt = cls(data)
        verdict = pkt.iwarp_error
        if verdict is not None:
            rule, _, detail = verdict.partition(": ")
            raise DecodeError(rule, detail)
        return pkt

    def copy(self) -> Any:
        clone = super().copy()
        for attr in type(self).__all_slots__ - set(Packet.__slots__):
            if hasattr(self, attr):
                object.__setattr__(clone, attr, getattr(self, attr))
        return clone
