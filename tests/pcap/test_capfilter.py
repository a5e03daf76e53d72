"""Capture filters of ``iwarp dissect -i IFACE -f EXPR`` (stack.pcap.capfilter)."""

from __future__ import annotations

import pytest

from stack.pcap import CaptureFilterError, TcpSegment, compile_capture_filter

A = TcpSegment(1, 0.0, "10.0.0.1", "10.0.0.2", 40000, 7174, 0, 0, 0, memoryview(b""))
B = TcpSegment(2, 0.0, "10.0.0.2", "10.0.0.1", 7174, 40000, 0, 0, 0, memoryview(b""))
C = TcpSegment(3, 0.0, "fe80::1", "fe80::2", 22, 50000, 0, 0, 0, memoryview(b""))
ALL = (A, B, C)


def _kept(expr: str) -> list[int]:
    keep = compile_capture_filter(expr)
    return [s.frame for s in ALL if keep(s)]


@pytest.mark.parametrize(
    "expr, frames",
    [
        ("tcp port 7174", [1, 2]),
        ("port 7174", [1, 2]),
        ("tcp dst port 7174", [1]),
        ("src port 7174", [2]),
        ("portrange 7000-8000", [1, 2]),
        ("tcp src portrange 20-30", [3]),
        ("host 10.0.0.1", [1, 2]),
        ("src host 10.0.0.1", [1]),
        ("dst host 10.0.0.1", [2]),
        ("host fe80:0:0::2", [3]),  # any spelling of the address
        ("tcp", [1, 2, 3]),
        ("ip", [1, 2]),
        ("ip6", [3]),
        ("tcp and port 22", [3]),
        ("port 22 or dst port 7174", [1, 3]),
        ("not port 7174", [3]),
        ("! (port 7174 && src host 10.0.0.2)", [1, 3]),
        ("PORT 7174 AND NOT dst HOST 10.0.0.2", [2]),
        ("host localhost", []),
    ],
)
def test_primitives_and_combinations(expr: str, frames: list[int]) -> None:
    assert _kept(expr) == frames


def test_a_host_name_resolves_when_compiled() -> None:
    local = TcpSegment(4, 0.0, "127.0.0.1", "127.0.0.1", 1, 2, 0, 0, 0, memoryview(b""))
    assert compile_capture_filter("host localhost")(local)


@pytest.mark.parametrize(
    "expr, message",
    [
        ("", "empty capture filter"),
        ("udp port 53", "unsupported capture filter at 'udp'"),
        ("port", "port wants a number"),
        ("port 70000", "port wants a number 0-65535, got '70000'"),
        ("portrange 9-3", "above the last"),
        ("portrange 9", "port wants a number"),
        ("src", "unsupported capture filter at its end"),
        ("(port 1", "missing ')'"),
        ("port 1 port 2", "unexpected 'port'"),
        ("host no-such-host.invalid", "unknown host 'no-such-host.invalid'"),
        ("port 1 & port 2", "unexpected '&'"),
    ],
)
def test_bad_filters_are_clear_errors(expr: str, message: str) -> None:
    with pytest.raises(CaptureFilterError, match=message.replace("(", r"\(").replace(")", r"\)")):
        compile_capture_filter(expr)
