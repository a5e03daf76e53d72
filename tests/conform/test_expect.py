"""Judging the DUT's Terminate: the cause (MUST), the header copies (SHOULD) and siw's
swapped layout (RDMAP-11), read either way as only the expectation can tell."""

from __future__ import annotations

from dataclasses import replace

from stack.conform.expect import judge_terminate, siw_reading
from stack.conform.model import Outcome
from stack.constants import TERM_LLP_CRC_ERROR, TermCode
from stack.wire.events import Terminate


def test_a_control_word_without_mdr_reads_as_siw_writes_it_when_only_that_matches() -> None:
    sent = Terminate(0, 2, 0x02)  # siw's bytes for 2/0/0x02: 00 02 00 00
    read = siw_reading(sent, TermCode(*TERM_LLP_CRC_ERROR))
    assert read.cause == TERM_LLP_CRC_ERROR and read.siw_swapped
    assert siw_reading(sent, TermCode(0, 2, 0x06)) is sent  # the swap would not match either
    right = Terminate(*TERM_LLP_CRC_ERROR)
    assert siw_reading(right, TermCode(*TERM_LLP_CRC_ERROR)) is right
    with_bits = Terminate(0, 2, 0x02, m=True)
    assert siw_reading(with_bits, TermCode(*TERM_LLP_CRC_ERROR)) is with_bits


def test_right_cause_in_siws_layout_is_rdmap_11_not_met() -> None:
    verdict = judge_terminate(Terminate(0, 2, 0x02), TermCode(*TERM_LLP_CRC_ERROR), None, 7)
    assert verdict.outcome is Outcome.NOT_MET
    assert (verdict.rule, verdict.level) == ("RDMAP-11", "MUST")
    assert "siw's swapped layout" in verdict.observed and "(frame 7)" in verdict.observed
    assert "the header copies are right" in verdict.evidence
    detected = replace(Terminate(*TERM_LLP_CRC_ERROR), siw_swapped=True)  # decoder saw siw's bits
    assert judge_terminate(detected, TermCode(*TERM_LLP_CRC_ERROR), None, 3).rule == "RDMAP-11"


def test_the_rfc_layout_with_the_right_cause_is_met_and_a_wrong_cause_is_not() -> None:
    assert judge_terminate(
        Terminate(*TERM_LLP_CRC_ERROR), TermCode(*TERM_LLP_CRC_ERROR), None, 1
    ).outcome is (Outcome.MET)
    wrong = judge_terminate(Terminate(2, 0, 0x04), TermCode(*TERM_LLP_CRC_ERROR), None, 1)
    assert wrong.outcome is Outcome.NOT_MET and wrong.rule is None
