"""The sans-IO wire engines: MPA, FPDU framing, DDP, RDMAP and RFC 7306 (floor 1).

Bytes and time in, events and bytes out; nothing here does I/O or reads a clock.  The one
implementation of every rule: the endpoint runs it strictly, the capture decoder and the
conformance runner leniently (:class:`Checker`).

* :mod:`~stack.wire.mpa_frames`, :mod:`~stack.wire.mpa_rules`, :mod:`~stack.wire.mpa_startup`,
  :mod:`~stack.wire.mpa`:
  startup frames, the startup rule tables, the startup negotiation (RFC 6581), the MPA engine;
* :mod:`~stack.wire.framing`: FPDUs, CRC32c and the marker geometry;
* :mod:`~stack.wire.ddp`, :mod:`~stack.wire.rdmap`, :mod:`~stack.wire.atomics`: segments,
  messages, Terminates (Fig. 10), atomic arithmetic;
* :mod:`~stack.wire.sequence`: MSN/MO sequencing and request/response matching;
* :mod:`~stack.wire.stream`, :mod:`~stack.wire.connection`: one RDMAP stream, one whole
  iWARP connection;
* :mod:`~stack.wire.events`: the message and event vocabulary.
"""

from stack.wire.checker import Checker, Finding
from stack.wire.connection import ConnectionEvent, IwarpConnection
from stack.wire.events import (
    RDMAP_EVENT_TYPES,
    AtomicRequest,
    AtomicRequestReceived,
    AtomicResponse,
    AtomicResponseReceived,
    ConnectionFailed,
    CrcPolicy,
    Established,
    ImmediateData,
    ImmediateDataReceived,
    IrdOrd,
    MessageEvent,
    MpaEvent,
    MpaFrame,
    MpaSettings,
    NeedData,
    Negotiated,
    PeerClosed,
    RdmapEvent,
    RdmapMessage,
    RdmaWrite,
    ReadRequest,
    ReadRequestReceived,
    ReadResponse,
    ReadResponseSegment,
    Rejected,
    RequestReceived,
    RevPolicy,
    Role,
    Send,
    SendSegment,
    Terminate,
    TerminateReceived,
    UlpduReceived,
    WriteSegment,
)
from stack.wire.framing import FpduDeframer, FpduFramer, fpdu_layout, mulpdu_for
from stack.wire.mpa import MpaConnection, MpaState
from stack.wire.mpa_frames import decode_frame, encode_frame
from stack.wire.mpa_rules import FRAME_RULES, REPLY_RULES, check_startup_frame
from stack.wire.mpa_startup import MpaStartup
from stack.wire.rdmap import Segment, decode_ulpdu, encode_message
from stack.wire.sequence import MessageSequencer, RequestTracker
from stack.wire.stream import RdmapStream
from stack.wire.terminate import (
    build_terminate,
    check_terminate_headers,
    decode_terminate,
    terminate_headers,
)

__all__ = [
    "FRAME_RULES",
    "RDMAP_EVENT_TYPES",
    "REPLY_RULES",
    "AtomicRequest",
    "AtomicRequestReceived",
    "AtomicResponse",
    "AtomicResponseReceived",
    "Checker",
    "ConnectionEvent",
    "ConnectionFailed",
    "CrcPolicy",
    "Established",
    "Finding",
    "FpduDeframer",
    "FpduFramer",
    "ImmediateData",
    "ImmediateDataReceived",
    "IrdOrd",
    "IwarpConnection",
    "MessageSequencer",
    "MpaConnection",
    "MessageEvent",
    "MpaEvent",
    "MpaFrame",
    "MpaSettings",
    "MpaStartup",
    "MpaState",
    "NeedData",
    "Negotiated",
    "PeerClosed",
    "RdmaWrite",
    "RdmapEvent",
    "RdmapMessage",
    "RdmapStream",
    "ReadRequest",
    "ReadRequestReceived",
    "ReadResponse",
    "ReadResponseSegment",
    "Rejected",
    "RequestReceived",
    "RequestTracker",
    "RevPolicy",
    "Role",
    "Segment",
    "Send",
    "SendSegment",
    "Terminate",
    "TerminateReceived",
    "UlpduReceived",
    "WriteSegment",
    "build_terminate",
    "check_startup_frame",
    "check_terminate_headers",
    "decode_frame",
    "decode_terminate",
    "decode_ulpdu",
    "encode_frame",
    "encode_message",
    "fpdu_layout",
    "mulpdu_for",
    "terminate_headers",
]
