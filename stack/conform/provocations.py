"""Building blocks of the data-phase cases: ULPDUs the stack's encoder builds for a session,
and the values a case aims at (RFC 5040 §4, RFC 5041 §4, RFC 7306 §4).

Every ULPDU comes from :func:`~stack.wire.rdmap.encode_message` through
:meth:`~stack.conform.session.Session.ulpdus` (so MSNs follow the runner's queues and the
runner's requests are matched with the DUT's responses), then edited with
:mod:`stack.conform.ulpdu` where a case needs a field the encoder would never send.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from stack.conform.apps import Region
from stack.conform.model import Verdict
from stack.conform.session import Item, Session
from stack.conform.ulpdu import MO_AT, set_u32, with_last
from stack.constants import DDP_UNTAGGED_HDR_LEN
from stack.rnic.memory import Access
from stack.wire.events import AtomicRequest, RdmapMessage, RdmaWrite, ReadRequest

__all__ = [
    "FAR",
    "SINK_STAG",
    "SINK_TO",
    "WRAP_TO",
    "Builder",
    "atomic",
    "bogus_stag",
    "fetch_add",
    "first",
    "needs",
    "read",
    "split_send",
    "zero_read",
    "zero_write",
]

SINK_STAG, SINK_TO = 0x1A2B3C50, 0x500000
"""The runner's sink for its Read Requests (the DUT writes nothing there but responses)."""
FAR = 1 << 32
"""How far past an advertised region a case aims: beyond any buffer an application
registers, so a region that is longer than advertised is still missed."""
WRAP_TO = (1 << 64) - 4
"""A Tagged Offset whose 8-octet access wraps 2^64 (TO wrap, RFC 5041 §7.2)."""
_REQ_ID = 0x52554E00
"""Request IDs of the runner's Atomic Requests (+1 each)."""


def bogus_stag(near: Region | None = None) -> int:
    """An STag the application never advertised: ``near``'s with its 8-bit key changed
    (siw-style STags put the key in the low octet; one key per index is valid at a time),
    or an arbitrary value when nothing is advertised."""
    if near is None:
        return 0x5A5A5A01
    return (near.stag & ~0xFF) | ((near.stag + 0x80) & 0xFF)


def first(s: Session, message: RdmapMessage) -> bytes:
    """The first (usually only) ULPDU of ``message`` as the session encodes it."""
    return s.ulpdus(message)[0]


def zero_write(s: Session, stag: int = 0xFFFFFFFF, to: int = (1 << 64) - 1) -> bytes:
    """A zero-length RDMA Write: no STag or TO check applies (DDP-07)."""
    return first(s, RdmaWrite(stag, to, b""))


def zero_read(s: Session, src_stag: int = 0x5A5A5A01, src_to: int = 0) -> bytes:
    """A zero-length RDMA Read Request: the source is not validated (RDMAP-07)."""
    return first(s, ReadRequest(SINK_STAG, SINK_TO, 0, src_stag, src_to))


def read(s: Session, stag: int, to: int, size: int, sink: int = 0) -> bytes:
    """An RDMA Read Request of ``size`` octets into the runner's sink number ``sink``."""
    return first(s, ReadRequest(SINK_STAG + sink, SINK_TO + (sink << 16), size, stag, to))


def fetch_add(s: Session, stag: int, to: int, add: int = 0, mask: int = 0) -> bytes:
    """An RFC 7306 FetchAdd (an add of 0 changes nothing and returns the value)."""
    n = len(s.atomic_values) + len(s.reads.atomics)
    return first(s, AtomicRequest.fetch_add(_REQ_ID + n, stag, to, add, mask))


def atomic(s: Session, request: AtomicRequest) -> bytes:
    """``request`` with the session's next Request ID."""
    n = len(s.atomic_values) + len(s.reads.atomics)
    req = AtomicRequest(
        request.atomic_opcode,
        _REQ_ID + n,
        request.stag,
        request.to,
        request.add_swap_data,
        request.add_swap_mask,
        request.compare_data,
        request.compare_mask,
    )
    return first(s, req)


def split_send(ulpdu: bytes, at: int, *, second_mo: int | None = None) -> list[bytes]:
    """An untagged single-segment ULPDU as two segments: payload octets ``[:at]`` (L=0,
    MO 0) and the rest (L as before, MO ``at`` or ``second_mo``) (RFC 5041 §5.2)."""
    head = ulpdu[:DDP_UNTAGGED_HDR_LEN]
    body = ulpdu[DDP_UNTAGGED_HDR_LEN:]
    one = with_last(head + body[:at], False)
    two = set_u32(head + body[at:], MO_AT, at if second_mo is None else second_mo)
    return [one, two]


Builder = Callable[[Session, Region], Sequence[Item] | Verdict]
"""Makes a case's items from the session and the region it aims at (or a SKIP verdict)."""


def needs(
    right: Access, *, scratch: bool = False, exact: bool = False
) -> Callable[[Builder], Callable[[Session], Sequence[Item] | Verdict]]:
    """Decorate an item builder that needs an advertised region with ``right``: the case
    does not apply (SKIP, with what was advertised) when there is none."""

    def wrap(build: Builder) -> Callable[[Session], Sequence[Item] | Verdict]:
        def made(s: Session) -> Sequence[Item] | Verdict:
            region = s.region(right, scratch=scratch, exact=exact)
            if region is None:
                return Verdict.not_applicable(s.no_region(right, scratch=scratch, exact=exact))
            return build(s, region)

        return made

    return wrap
