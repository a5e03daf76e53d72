"""KBTP conversations in a capture: which streams carry KBTP, and what each side may send.

``iwarp dissect --ulp kbtp`` hands every first segment of a Send-family message here
(:meth:`KbtpConversations.annotate`).  A stream carries KBTP when its first Send is a KBTP
message, or a HELLO even if malformed (an oversized identity is still the HELLO a target
answers MALFORMED).  On such a stream every Send is KBTP, so what the decoder cannot
read (a short message, Version 2, an unknown opcode) is shown with the strict decoder's
verdict (:class:`KbtpUndecodable`) rather than skipped, and the session rules of
:mod:`kbtp.session_rules` (a second HELLO, a request before HELLO, a COMPLETION sent by the
initiator...) are findings too.  A stream whose first KBTP message is neither HELLO nor
HELLO_ACK is taken as captured mid-session (its HELLO went before), so a request before
HELLO is the target's to see, not the capture's.  Sends of streams that are not KBTP are
left alone.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from kbtp.constants import COMMON_HEADER_LEN, KBTP_VERSION, MessageOpcode, Status
from kbtp.describe import KbtpSummary, describe_payload
from kbtp.messages import KbtpError, decode_message
from kbtp.session_rules import RULE, initiator_refusal, target_refusal
from stack.wire.checker import Finding

FROM_INITIATOR = "i2r"
"""The KBTP initiator is the MPA Initiator (docs/kbtp.md §4.1)."""


@dataclass(frozen=True, slots=True)
class KbtpUndecodable:
    """A Send of a KBTP stream that is no readable KBTP message: the strict verdict."""

    length: int
    header: bytes
    error: Status
    findings: tuple[Finding, ...]
    line: str = field(init=False)

    def __post_init__(self) -> None:
        detail = self.findings[0].detail
        object.__setattr__(self, "line", f"KBTP ? ({self.length} octets) [{detail}]")

    @property
    def ok(self) -> bool:
        return False

    def json_fields(self) -> dict[str, Any]:
        """The ``kbtp_`` fields that can be read, and the verdict."""
        h = self.header
        return {
            "kbtp_version": h[0] if len(h) > 0 else None,
            "kbtp_opcode": h[1] if len(h) > 1 else None,
            "kbtp_opcode_name": None,
            "kbtp_length": self.length,
            "kbtp_error": self.error.name,
            "kbtp_error_detail": self.findings[0].detail,
        }

    def tree_lines(self) -> list[str]:
        lines = [f"  KBTP (not readable, {self.length} octets)"]
        if self.header:
            lines.append(f"    First octets: {self.header[:8].hex(' ')}")
        lines += [f"    Finding {f.rule}: {f.detail}" for f in self.findings]
        return lines


def _undecodable(payload: bytes) -> KbtpUndecodable:
    try:
        decode_message(payload)
    except KbtpError as exc:
        finding = Finding(exc.rule, exc.detail)
        return KbtpUndecodable(len(payload), payload[:COMMON_HEADER_LEN], exc.status, (finding,))
    raise AssertionError("a payload describe_payload refused decoded")  # pragma: no cover


def _starts_hello(payload: bytes) -> bool:
    return (
        len(payload) >= COMMON_HEADER_LEN
        and payload[0] == KBTP_VERSION
        and payload[1] == MessageOpcode.HELLO
    )


@dataclass(slots=True)
class _Stream:
    kbtp: bool
    hellos: int = 0
    acks: int = 0


class KbtpConversations:
    """Per TCP stream of a capture: whether it carries KBTP, and its session state."""

    def __init__(self) -> None:
        self._streams: dict[int, _Stream] = {}

    def annotate(
        self, stream: int, direction: str, payload: bytes, complete: bool
    ) -> KbtpSummary | KbtpUndecodable | None:
        """The KBTP reading of one Send's first segment, findings included; None: not KBTP."""
        state = self._streams.get(stream)
        if state is not None and not state.kbtp:
            return None
        summary = describe_payload(payload, complete=complete)
        if state is None:
            is_kbtp = summary is not None and (not summary.findings or _starts_hello(payload))
            state = self._streams[stream] = _Stream(is_kbtp)
            if not is_kbtp:
                return None
            assert summary is not None
            if summary.opcode is MessageOpcode.HELLO_ACK:
                state.hellos = 1  # the capture began between HELLO and HELLO_ACK
            elif summary.opcode is not MessageOpcode.HELLO:
                # The capture began mid-session: its HELLO and HELLO_ACK went before.
                state.hellos = state.acks = 1
        if summary is None:
            return _undecodable(payload)
        return self._session(state, direction, summary)

    @staticmethod
    def _session(state: _Stream, direction: str, summary: KbtpSummary) -> KbtpSummary:
        op = summary.opcode
        detail: str | None = None
        if direction == FROM_INITIATOR:
            refusal = target_refusal(op, state.hellos > 0)
            if refusal is not None:
                detail = f"{refusal[0].name}: {refusal[1]}"
            if op is MessageOpcode.HELLO:
                state.hellos += 1
        else:
            detail = initiator_refusal(op, state.hellos - state.acks, state.acks > 0)
            if op is MessageOpcode.HELLO_ACK:
                state.acks += 1
        if detail is None:
            return summary
        return replace(
            summary,
            line=f"{summary.line} [{detail}]",
            findings=(*summary.findings, Finding(RULE, detail)),
        )
