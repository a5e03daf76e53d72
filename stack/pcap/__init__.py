"""Capture files: one streaming pcap/pcapng reader and the capture-tap pcap writer.

Floor 0: imports nothing of the stack but :mod:`stack.errors`.  :mod:`stack.pcap.format`
holds the format numbers; :mod:`stack.pcap.reader` reads a path, ``-`` (stdin), a pipe,
an open file or bytes in bounded memory; :mod:`stack.pcap.live` captures on a Linux
interface, filtered by :mod:`stack.pcap.capfilter`; :mod:`stack.pcap.writer` synthesizes
Ethernet/IP/TCP packets around recorded byte streams and copies captured frames.
"""

from stack.pcap.capfilter import CaptureFilterError, SegmentFilter, compile_capture_filter
from stack.pcap.errors import CaptureError, TruncatedCapture
from stack.pcap.format import TCP_ACK, TCP_FIN, TCP_PSH, TCP_RST, TCP_SYN
from stack.pcap.live import (
    ANY_INTERFACE,
    CapturePermissionError,
    LiveCapture,
    can_capture,
    interface_name,
    interfaces,
)
from stack.pcap.packet import (
    CaptureStats,
    Frame,
    LeanSegment,
    SegmentKey,
    TcpSegment,
    full_segment,
    lean_segment,
    parse_tcp,
)
from stack.pcap.reader import (
    CaptureReader,
    capture_format,
    copy_capture,
    iter_frames,
    read_tcp_segments,
)
from stack.pcap.source import CHUNK, CaptureInput, Source, open_capture
from stack.pcap.writer import ConnectionRecorder, Direction, PcapWriter, internet_checksum

__all__ = [
    "ANY_INTERFACE",
    "CHUNK",
    "TCP_ACK",
    "TCP_FIN",
    "TCP_PSH",
    "TCP_RST",
    "TCP_SYN",
    "CaptureError",
    "CaptureFilterError",
    "CaptureInput",
    "CapturePermissionError",
    "CaptureReader",
    "CaptureStats",
    "ConnectionRecorder",
    "Direction",
    "Frame",
    "LeanSegment",
    "LiveCapture",
    "PcapWriter",
    "SegmentFilter",
    "SegmentKey",
    "Source",
    "TcpSegment",
    "TruncatedCapture",
    "can_capture",
    "capture_format",
    "compile_capture_filter",
    "copy_capture",
    "full_segment",
    "interface_name",
    "interfaces",
    "internet_checksum",
    "iter_frames",
    "lean_segment",
    "open_capture",
    "parse_tcp",
    "read_tcp_segments",
]
