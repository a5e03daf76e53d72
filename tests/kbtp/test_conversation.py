"""KBTP session rules (KBTP-4.2) for the target and the dissector, from one table."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import trio

from kbtp.constants import KBTP_VERSION, MessageOpcode, Status
from kbtp.conversation import KbtpConversations, KbtpUndecodable
from kbtp.describe import KbtpSummary
from kbtp.messages import Completion, DataDescriptor, Hello, HelloAck, Load
from kbtp.session_rules import initiator_refusal, target_refusal
from stack.cli.iwarp import main as iwarp
from stack.pcap import PcapWriter
from stack.transport.tap import pcap_tap_factory
from tests.kbtp.targets import new_target
from tests.kbtp.test_binding_ops import config, connect

HELLO = Hello(1, identity=b"a").encode()
ACK = HelloAck(1, Status.SUCCESS).encode()
LOAD = Load(7, 3, DataDescriptor(1, 2, 3)).encode()
OVERSIZED_HELLO = Hello(1, identity=b"x" * 300).encode()


def test_kbtp_4_2_target_refusals_follow_the_session_state() -> None:
    assert target_refusal(MessageOpcode.HELLO, False) is None
    assert target_refusal(MessageOpcode.HELLO, True) == (Status.BAD_OPCODE, "second HELLO")
    assert target_refusal(MessageOpcode.LOAD, False) == (Status.NO_SESSION, "request before HELLO")
    refusal = target_refusal(MessageOpcode.COMPLETION, False)
    assert refusal is not None and refusal[0] is Status.NO_SESSION
    assert target_refusal(MessageOpcode.COMPLETION, True) == (
        Status.BAD_OPCODE,
        "COMPLETION sent to a target",
    )
    assert target_refusal(MessageOpcode.LOAD, True) is None
    assert initiator_refusal(MessageOpcode.LOAD, 0, True) == "LOAD sent by a target"
    assert initiator_refusal(MessageOpcode.HELLO_ACK, 1, False) is None
    assert initiator_refusal(MessageOpcode.HELLO_ACK, 0, True) == "HELLO_ACK answering no HELLO"
    assert initiator_refusal(MessageOpcode.COMPLETION, 0, False) == "COMPLETION before HELLO_ACK"
    assert initiator_refusal(MessageOpcode.COMPLETION, 0, True) is None


def _conversation(*sends: tuple[str, bytes]) -> list[KbtpSummary | KbtpUndecodable | None]:
    conv = KbtpConversations()
    return [conv.annotate(0, d, p, True) for d, p in sends]


def _details(result: KbtpSummary | KbtpUndecodable | None) -> list[str]:
    assert result is not None
    return [f"{f.rule} {f.detail}" for f in result.findings]


def test_a_clean_session_has_no_findings() -> None:
    done = Completion(7, 3, 1, Status.SUCCESS, request_opcode=MessageOpcode.LOAD).encode()
    results = _conversation(("i2r", HELLO), ("r2i", ACK), ("i2r", LOAD), ("r2i", done))
    assert all(r is not None and not r.findings for r in results)


@pytest.mark.parametrize(
    ("bad", "expected"),
    [
        (bytes([KBTP_VERSION + 1]) + LOAD[1:], "KBTP-5.1 BAD_VERSION: version 2, not 1"),
        (LOAD[:1] + b"\x7f" + LOAD[2:], "KBTP-5.1 BAD_OPCODE: unknown opcode 0x7f"),
        (LOAD[:16], "KBTP-5.1 MALFORMED"),
        (HELLO, "KBTP-4.2 BAD_OPCODE: second HELLO"),
        (
            Completion(9, 0, 0, Status.SUCCESS).encode(),
            "KBTP-4.2 BAD_OPCODE: COMPLETION sent to a target",
        ),
    ],
)
def test_what_a_target_refuses_is_a_finding_once_the_stream_is_kbtp(
    bad: bytes, expected: str
) -> None:
    *_, last = _conversation(("i2r", HELLO), ("r2i", ACK), ("i2r", bad))
    [detail] = _details(last)
    assert detail.startswith(expected), detail


def test_an_oversized_hello_opens_a_kbtp_stream_and_is_flagged() -> None:
    first, answer = _conversation(
        ("i2r", OVERSIZED_HELLO), ("r2i", HelloAck(1, Status.MALFORMED).encode())
    )
    assert first is not None and first.findings and first.error is Status.MALFORMED
    assert answer is not None and not answer.findings  # the right answer to it


def test_a_target_sending_requests_and_captures_from_mid_session() -> None:
    conv = KbtpConversations()
    conv.annotate(0, "i2r", HELLO, True)
    assert _details(conv.annotate(0, "r2i", LOAD, True)) == ["KBTP-4.2 LOAD sent by a target"]
    assert not _details(conv.annotate(1, "r2i", ACK, True))  # seen from its HELLO_ACK on
    assert _details(conv.annotate(1, "r2i", ACK, True)) == ["KBTP-4.2 HELLO_ACK answering no HELLO"]
    mid = KbtpConversations()  # a capture that starts mid-session: its HELLO went before
    assert not _details(mid.annotate(0, "i2r", LOAD, True))
    assert not _details(mid.annotate(0, "r2i", Completion(7, 3, 1, Status.SUCCESS).encode(), True))
    assert _details(mid.annotate(0, "i2r", HELLO, True)) == ["KBTP-4.2 BAD_OPCODE: second HELLO"]


def test_sends_of_other_protocols_are_left_alone() -> None:
    conv = KbtpConversations()
    assert conv.annotate(0, "i2r", b"GET / HTTP/1.1\r\n\r\n" * 2, True) is None
    assert conv.annotate(0, "i2r", LOAD[:16], True) is None
    assert conv.annotate(0, "i2r", HELLO, True) is None  # the stream is not KBTP


async def _bad_sessions(path: Path) -> list[int | None]:
    """One session per bad message against a real target, all captured to ``path``."""
    bad = [
        bytes([KBTP_VERSION + 1]) + LOAD[1:],
        LOAD[:1] + b"\x7f" + LOAD[2:],
        Completion(9, 0, 0, Status.SUCCESS).encode(),
        Hello(9, identity=b"b").encode(),
    ]
    statuses: list[int | None] = []
    with path.open("wb") as f:
        writer = PcapWriter(f)
        target = new_target(config(), tap_factory=pcap_tap_factory(writer))
        with trio.fail_after(60):
            async with target.running():
                for data in bad:
                    async with connect(target, "a") as a:
                        answer = await a.send_raw(data, int.from_bytes(data[4:12], "big"))
                        statuses.append(answer.status if answer is not None else None)
                        assert a.conn is not None
                        await a.conn.wait_closed()
    return statuses


@pytest.mark.both_targets
def test_kbtp_4_2_dissect_shows_every_fatal_refusal_of_a_real_target(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "bad.pcap"
    statuses = trio.run(_bad_sessions, path)
    assert statuses == [Status.BAD_VERSION, Status.BAD_OPCODE, Status.BAD_OPCODE, None]
    capsys.readouterr()
    assert iwarp(["dissect", str(path), "--json", "-Y", "findings"]) == 0
    records = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    found = sorted({(r["stream"], f) for r in records for f in r["findings"]})
    assert [f for _, f in found] == ["KBTP-5.1", "KBTP-5.1", "KBTP-4.2", "KBTP-4.2"], found
    assert all(r["direction"] == "i2r" for r in records)
