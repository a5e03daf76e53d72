"""Which well-formed KBTP message each side may send when (docs/kbtp.md §4.2, §5.1; KBTP-4.2).

One table for both users: the target answers what :func:`target_refusal` names (and closes
the session: every status here is fatal, §9.3), and ``iwarp dissect --ulp kbtp`` reports
the same as findings, together with :func:`initiator_refusal` for messages a target sent.
"""

from __future__ import annotations

from kbtp.constants import REQUEST_OPCODES, MessageOpcode, Status

RULE = "KBTP-4.2"
"""The rule ID of every verdict here."""

_ANSWERS = frozenset({MessageOpcode.HELLO_ACK, MessageOpcode.COMPLETION})


def target_refusal(opcode: MessageOpcode, hello_done: bool) -> tuple[Status, str] | None:
    """The status a target answers a decoded message from the initiator with, or None.

    ``hello_done``: the session already had its HELLO.  Before it, every other message is
    NO_SESSION (answered in a HELLO_ACK); after it, a second HELLO and a HELLO_ACK or
    COMPLETION sent to a target are BAD_OPCODE.
    """
    if opcode is MessageOpcode.HELLO:
        return (Status.BAD_OPCODE, "second HELLO") if hello_done else None
    if not hello_done:
        return Status.NO_SESSION, "request before HELLO"
    if opcode not in REQUEST_OPCODES:
        return Status.BAD_OPCODE, f"{opcode.name} sent to a target"
    return None


def initiator_refusal(opcode: MessageOpcode, unanswered: int, acked: bool) -> str | None:
    """Why a decoded message from the target breaks §4.2, or None.

    A target sends only HELLO_ACKs, one per HELLO (``unanswered``: HELLOs not yet answered),
    and COMPLETIONs after its first HELLO_ACK (``acked``).
    """
    if opcode not in _ANSWERS:
        return f"{opcode.name} sent by a target"
    if opcode is MessageOpcode.HELLO_ACK and unanswered <= 0:
        return "HELLO_ACK answering no HELLO"
    if opcode is MessageOpcode.COMPLETION and not acked:
        return "COMPLETION before HELLO_ACK"
    return None
