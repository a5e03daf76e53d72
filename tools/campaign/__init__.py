"""Robustness campaign: decoder fuzzing, hostile peers, KBTP load and faults (docs/campaign.md).

Run it from the checkout: ``python -m tools.campaign [--full] [--seed N] [--json]
[--only NAME...]``.  The bounded default form is what ``tests/campaign`` runs in CI.
"""

from tools.campaign.fuzz import Finding, TargetFigures, run_fuzz
from tools.campaign.targets import Invariant, Target, all_targets

__all__ = ["Finding", "Invariant", "Target", "TargetFigures", "all_targets", "run_fuzz"]
