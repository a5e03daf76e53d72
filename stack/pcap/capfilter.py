"""Capture filters (``iwarp dissect -i IFACE -f EXPR``): a subset of pcap-filter(7) on TCP.

Applied in Python to each captured frame's TCP segment (no BPF is compiled): a frame
without a TCP segment never matches a filter.  Primitives: ``tcp``, ``ip``, ``ip6``,
``[tcp] [src|dst] port N``, ``[tcp] [src|dst] portrange N-M``, ``[src|dst] host ADDR``
(an IPv4 or IPv6 address, or a name resolved once, when the filter is compiled); combined
with ``and``/``or``/``not`` (``&&``, ``||``, ``!``) and parentheses, ``not`` binding
tightest, then ``and``.  ``port 7174 or 7175`` is not shorthand here: write
``port 7174 or port 7175``.  A filter that does not parse raises :class:`CaptureFilterError`.
"""

from __future__ import annotations

import re
import socket
from collections.abc import Callable

from stack.errors import IwarpError
from stack.pcap.packet import TcpSegment, address

__all__ = ["CaptureFilterError", "SegmentFilter", "compile_capture_filter"]

SegmentFilter = Callable[[TcpSegment], bool]
"""A compiled capture filter: True for the segments to keep."""


class CaptureFilterError(IwarpError):
    """A capture filter that does not parse, or names an unknown host."""


_TOKEN = re.compile(r"\s*(&&|\|\||!|\(|\)|[^\s()!&|]+)")
_PRIMITIVES = "tcp, ip, ip6, [src|dst] host ADDR, [tcp] [src|dst] port N, portrange N-M"


def _tokens(text: str) -> list[str]:
    out: list[str] = []
    pos = 0
    text = text.strip()
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None:
            raise CaptureFilterError(f"unexpected {text[pos:].strip()[:1]!r} at {pos}")
        out.append(m.group(1))
        pos = m.end()
    return out


def _port(text: str | None) -> int:
    if text is None or not text.isdigit() or int(text) > 0xFFFF:
        raise CaptureFilterError(f"port wants a number 0-65535, got {text!r}")
    return int(text)


def _addresses(text: str | None) -> frozenset[str]:
    """The addresses of a host, in the text form of :func:`stack.pcap.packet.address`."""
    if text is None:
        raise CaptureFilterError("host wants an address or a name")
    for family in (socket.AF_INET, socket.AF_INET6):
        try:
            return frozenset({address(socket.inet_pton(family, text))})
        except OSError:
            continue
    try:
        infos = socket.getaddrinfo(text, None, proto=socket.IPPROTO_TCP)
    except (OSError, UnicodeError):
        raise CaptureFilterError(f"unknown host {text!r}") from None
    return frozenset(
        address(socket.inet_pton(family, str(sockaddr[0])))
        for family, _, _, _, sockaddr in infos
        if family in (socket.AF_INET, socket.AF_INET6)
    )


class _Parser:
    def __init__(self, tokens: list[str]) -> None:
        self.tokens = tokens
        self.i = 0

    def peek(self) -> str | None:
        return self.tokens[self.i].lower() if self.i < len(self.tokens) else None

    def take(self) -> str | None:
        tok = self.tokens[self.i] if self.i < len(self.tokens) else None
        self.i += tok is not None
        return tok

    def accept(self, *words: str) -> bool:
        if self.peek() in words:
            self.i += 1
            return True
        return False

    def parse(self) -> SegmentFilter:
        pred = self.or_expr()
        if self.peek() is not None:
            raise CaptureFilterError(f"unexpected {self.tokens[self.i]!r}")
        return pred

    def or_expr(self) -> SegmentFilter:
        left = self.and_expr()
        while self.accept("or", "||"):
            right = self.and_expr()
            left = (lambda a, b: lambda s: a(s) or b(s))(left, right)
        return left

    def and_expr(self) -> SegmentFilter:
        left = self.not_expr()
        while self.accept("and", "&&"):
            right = self.not_expr()
            left = (lambda a, b: lambda s: a(s) and b(s))(left, right)
        return left

    def not_expr(self) -> SegmentFilter:
        if self.accept("not", "!"):
            inner = self.not_expr()
            return lambda s: not inner(s)
        if self.accept("("):
            inner = self.or_expr()
            if not self.accept(")"):
                raise CaptureFilterError("missing ')'")
            return inner
        return self.primitive()

    def primitive(self) -> SegmentFilter:
        if self.accept("ip"):
            return lambda s: ":" not in s.src
        if self.accept("ip6"):
            return lambda s: ":" in s.src
        tcp = self.accept("tcp")
        side = self.peek() if self.peek() in ("src", "dst") else None
        if side is not None:
            self.i += 1
        word = self.take()
        kind = word.lower() if word is not None else None
        if kind == "port":
            port = _port(self.take())
            low, high = port, port
        elif kind == "portrange":
            text = self.take() or ""
            first, dash, last = text.partition("-")
            low, high = _port(first), _port(last if dash else None)
            if low > high:
                raise CaptureFilterError(f"portrange {text}: the first port is above the last")
        elif kind == "host" and not tcp:
            hosts = _addresses(self.take())
            if side == "src":
                return lambda s: s.src in hosts
            if side == "dst":
                return lambda s: s.dst in hosts
            return lambda s: s.src in hosts or s.dst in hosts
        elif tcp and side is None:
            if word is not None:
                self.i -= 1  # not ours: "tcp" alone, then whatever follows
            return lambda s: True
        else:
            where = f"at {word!r}" if word is not None else "at its end"
            raise CaptureFilterError(
                f"unsupported capture filter {where} (supported: {_PRIMITIVES}; "
                "and, or, not, parentheses)"
            )
        if side == "src":
            return lambda s: low <= s.sport <= high
        if side == "dst":
            return lambda s: low <= s.dport <= high
        return lambda s: low <= s.sport <= high or low <= s.dport <= high


def compile_capture_filter(text: str) -> SegmentFilter:
    """Compile a capture filter over TCP segments; raises :class:`CaptureFilterError`."""
    tokens = _tokens(text)
    if not tokens:
        raise CaptureFilterError("empty capture filter")
    return _Parser(tokens).parse()
