"""MPA over TCP for Scapy: port bindings and ``TCPSession`` reassembly (RFC 5044 §4, §7.1).

iWARP has no well-known port (siw and rping setups often use 7174 or 18515), so nothing
ties these layers to TCP until :func:`bind_iwarp` binds a chosen port, both directions;
:func:`unbind_iwarp` undoes it.  A bound TCP payload is dissected by :class:`MPA`, which
picks the layer from the bytes alone: MPA Request/Reply by key, else an FPDU (a leading
``00 00 00 00`` as the FPDUPTR-0 marker).  One segment knows nothing of the negotiation,
so for whole PDUs with the CRC and markers the stream negotiated, read with Scapy's
``TCPSession``::

    bind_iwarp(port=7174)
    packets = sniff(offline="capture.pcap", session=TCPSession)

:meth:`MPA.tcp_reassemble` then follows each direction: the startup frame first (MPA-17),
then FPDUs framed by :func:`~stack.dissect.scapy.streams.take_fpdu` with CRC on if either
frame set C and markers in the FPDUs to a side whose frame set M
(:func:`stack.wire.mpa_rules.framing_of`, MPA-09, MPA-11), SeqStart right after that
direction's frame (MPA-07).  A rejected connection and a stream not seen from its start
stay ``Raw`` (for mid-stream captures use
:func:`~stack.dissect.scapy.records.records_to_packets`, whose decoder searches for FPDUs).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from scapy.config import conf
from scapy.layers.inet import TCP
from scapy.packet import Packet, bind_bottom_up, split_bottom_up

from stack.constants import (
    MPA_FRAME_HEADER_LEN,
    MPA_KEY_LEN,
    MPA_KEY_REP,
    MPA_KEY_REQ,
    MPA_MARKER_LEN,
)
from stack.dissect.scapy.base import _IwarpPacket
from stack.dissect.scapy.mpa import _BE16, MPA_FPDU, MPA_Frame, MPA_Marker
from stack.dissect.scapy.streams import take_fpdu
from stack.wire.events import MpaFrame
from stack.wire.mpa_rules import framing_of

__all__ = ["MPA", "bind_iwarp", "unbind_iwarp"]

_ZERO_MARKER = bytes(MPA_MARKER_LEN)
_STATE_KEY = "stack.dissect.scapy"


def bind_iwarp(port: int) -> None:
    """Dissect TCP payloads to or from ``port`` as :class:`MPA` (both directions)."""
    bind_bottom_up(TCP, MPA, sport=port)
    bind_bottom_up(TCP, MPA, dport=port)


def unbind_iwarp(port: int) -> None:
    """Undo :func:`bind_iwarp` for ``port``."""
    split_bottom_up(TCP, MPA, sport=port)
    split_bottom_up(TCP, MPA, dport=port)


@dataclass(slots=True)
class _Direction:
    """One direction's progress: 'start' (startup frame next), 'hold' (the initiator's
    FPDUs wait for the Reply, which says whether they carry markers), 'fpdu', 'raw'."""

    phase: str = "start"
    crc: bool = True
    markers: bool = False
    offset: int = 0  # stream position after SeqStart of the next byte (MPA-07)


@dataclass(slots=True)
class _Connection:
    """Both directions of one TCP connection, keyed by TCPSession's direction ident."""

    directions: dict[Any, _Direction] = field(default_factory=dict)
    request: MpaFrame | None = None
    current: Any = None


def _wire_frame(frame: Packet) -> MpaFrame:
    """The flags of a dissected Request/Reply, as the wire core's frame (for framing_of)."""
    return MpaFrame(
        reply=bytes(frame.key) == MPA_KEY_REP,
        markers=bool(frame.markers),
        crc=bool(frame.crc),
        reject=bool(frame.reject),
        rev=int(frame.rev),
    )


class MPA(_IwarpPacket):
    """MPA over TCP: ``MPA(raw)`` dispatches to MPA_Request, MPA_Reply, MPA_Marker or
    MPA_FPDU by the bytes; :meth:`tcp_reassemble` is the ``TCPSession`` entry."""

    name = "MPA"
    fields_desc = []

    @classmethod
    def dispatch_hook(cls, _pkt: bytes | None = None, *args: Any, **kargs: Any) -> type[Packet]:
        if cls is not MPA or not _pkt:
            return cls
        if _pkt[:MPA_KEY_LEN] in (MPA_KEY_REQ, MPA_KEY_REP):
            return MPA_Frame.dispatch_hook(_pkt)
        return MPA_Marker if _pkt[:MPA_MARKER_LEN] == _ZERO_MARKER else MPA_FPDU

    @classmethod
    def tcp_reassemble(
        cls, data: bytes, metadata: dict[str, Any], session: dict[str, Any]
    ) -> Packet | None:
        """Every whole PDU at the start of ``data``, stacked, the rest as Padding; or None.

        Scapy's ``TCPSession`` contract: ``data`` is the direction's bytes not yet
        returned, ``metadata`` the direction's reassembly state (cleared after each
        return), ``session`` the connection's dict, where the negotiation is kept.  All
        whole PDUs come in one packet (``TCPSession`` re-feeds the Padding, and miscounts
        the stream position when it does so more than once per segment).
        """
        conn = session.get(_STATE_KEY)
        if not isinstance(conn, _Connection):
            conn = session[_STATE_KEY] = _Connection()
        if "ident" in metadata:  # absent when TCPSession re-feeds the rest of a segment
            conn.current = metadata["ident"]
        first: Packet | None = None
        at = 0
        while at < len(data):
            got = _next(conn, data[at:])
            if got is None:
                break
            pkt, used = got
            if first is None:
                first = pkt
            else:
                first.add_payload(pkt)
            at += used
        if first is not None and at < len(data):
            first.add_payload(conf.padding_layer(data[at:]))
        return first


def _next(conn: _Connection, data: bytes) -> tuple[Packet, int] | None:
    """The next whole PDU of the current direction and the bytes it took, or None."""
    half = conn.directions.setdefault(conn.current, _Direction())
    if half.phase == "start":
        return _startup(conn, conn.current, half, data)
    if half.phase == "fpdu":
        got = take_fpdu(data, half.offset, crc=half.crc, markers=half.markers)
        if got is not None:
            half.offset += got[1]
        return got
    if half.phase == "hold":
        return None
    return conf.raw_layer(data), len(data)


def _startup(
    conn: _Connection, ident: Any, half: _Direction, data: bytes
) -> tuple[Packet, int] | None:
    """The direction's first PDU: its MPA Request or Reply (RFC 5044 §7.1.1)."""
    key = data[:MPA_KEY_LEN]
    if key not in (MPA_KEY_REQ, MPA_KEY_REP):
        if MPA_KEY_REQ.startswith(key) or MPA_KEY_REP.startswith(key):
            return None  # a key still arriving
        half.phase = "raw"  # not seen from its start, or not MPA
        return conf.raw_layer(data), len(data)
    if len(data) < MPA_FRAME_HEADER_LEN:
        return None
    size = MPA_FRAME_HEADER_LEN + _BE16.unpack_from(data, MPA_FRAME_HEADER_LEN - 2)[0]
    if len(data) < size:
        return None
    frame = MPA_Frame(data[:size])
    wire = _wire_frame(frame)
    if not wire.reply:
        conn.request = wire
        half.phase = "hold"
    elif wire.reject:
        for other in (*conn.directions.values(), half):
            other.phase = "raw"
    else:
        request = conn.request or MpaFrame(reply=False, markers=False, crc=wire.crc)
        crc, to_responder, to_initiator = framing_of(request, wire)
        half.phase, half.crc, half.markers = "fpdu", crc, to_initiator
        for other_ident, other in conn.directions.items():
            if other_ident != ident and other.phase == "hold":
                other.phase, other.crc, other.markers = "fpdu", crc, to_responder
        if conn.request is None:
            conn.request = request  # the initiator's frame was not captured
    return frame, size
