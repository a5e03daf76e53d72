"""``iwarp conform``: a conformance runner for iWARP devices, built on the one set of rules.

Theory of operation
-------------------
A *case* (:class:`~stack.conform.model.Case`) provokes one catalogued rule (its ID is the
rule's, with a suffix ``.2``, ``.3`` ... for the rule's later cases) against a device under test
(DUT) reached over plain TCP, and says what a conforming DUT must do.  The runner
(:func:`~stack.conform.runner.run_cases`) gives each case a fresh connection and capture,
restarts the DUT if asked, and turns the case's :class:`~stack.conform.model.Verdict` into
PASS, FAIL, WARN (a SHOULD not met), SKIP (an optional capability declined) or ERROR.

The scripted peer is a sans-IO core (:mod:`stack.conform.peer_core`) with a thin trio driver
(:mod:`stack.conform.peer`); cases are written in steps (:mod:`stack.conform.script`):
send a Request or Reply, read the answer, play the application's client
(:mod:`stack.conform.apps`: also what each application advertises, :class:`Region`, and
keeps posted, :class:`Receives`), expect a Terminate, a close or silence.  Data-phase cases
(:mod:`stack.conform.session`) bring the application to a known state, send ULPDUs the
stack's encoder builds and :mod:`stack.conform.ulpdu` edits, and are judged
(:mod:`stack.conform.session_judge`) against the stack's own endpoint set up like the DUT
(:class:`~stack.conform.oracle.ModelDut`).  Every
judgement uses the stack's own rule code: the startup rule tables of
:mod:`stack.wire.mpa_rules`, frames of :mod:`stack.wire.mpa_frames`, the FPDU framer and
deframer of :mod:`stack.wire.framing`, lenient ULPDU decoding and ``build_terminate`` of
:mod:`stack.wire.rdmap`, the sequencing and request matching of :mod:`stack.wire.sequence`,
the RNIC's protection checks (through the model DUT), and the capture decoder for
evidence; expected outcomes are asked of the engines (:mod:`stack.conform.expected`,
:mod:`stack.conform.oracle`).  Reports: :mod:`stack.conform.report`.
:mod:`stack.conform.faults` breaks this project's own stack on purpose, to show each case
can fail.
"""

from stack.conform.apps import APPS, AppClient, AppProfile, Reaction, Receives, Region, profile
from stack.conform.context import CaseContext, RunOptions, SetupError
from stack.conform.model import (
    Case,
    CaseResult,
    DutRole,
    Outcome,
    Status,
    Verdict,
    case_id,
    exit_status,
    status_for,
)
from stack.conform.oracle import Expectation, ModelDut, ModelError
from stack.conform.registry import Registry, SelectionError, case, registry, select
from stack.conform.runner import CommandRestarter, NoRestart, Restarter, RunReport, run_cases
from stack.conform.session import Alternative, Session

__all__ = [
    "APPS",
    "Alternative",
    "AppClient",
    "AppProfile",
    "Case",
    "CaseContext",
    "CaseResult",
    "CommandRestarter",
    "DutRole",
    "Expectation",
    "ModelDut",
    "ModelError",
    "NoRestart",
    "Outcome",
    "Reaction",
    "Receives",
    "Region",
    "Registry",
    "Restarter",
    "RunOptions",
    "RunReport",
    "SelectionError",
    "Session",
    "SetupError",
    "Status",
    "Verdict",
    "case",
    "case_id",
    "exit_status",
    "profile",
    "registry",
    "run_cases",
    "select",
    "status_for",
]
