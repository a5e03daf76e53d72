"""Robustness campaign: decoder fuzzing, hostile peers, KBTP load and faults (docs/campaign.md).

Run it from the checkout: ``python -m tools.campaign [--full] [--seed N] [--json]
[--only NAME...]``.  The bounded default form is what ``tests/campaign`` runs in CI.
"""

from tools.campaign.campaign import DEFAULT_INPUTS, FULL_INPUTS, PARTS, run
from tools.campaign.fuzz import Finding, Runner, TargetFigures, run_fuzz
from tools.campaign.report import PartSummary
from tools.campaign.targets import Invariant, Target, all_targets

__all__ = [
    "DEFAULT_INPUTS",
    "FULL_INPUTS",
    "PARTS",
    "Finding",
    "Invariant",
    "PartSummary",
    "Runner",
    "Target",
    "TargetFigures",
    "all_targets",
    "run",
    "run_fuzz",
]
