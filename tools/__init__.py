"""Developer tools (not installed): reference-capture regeneration, benchmark scripts.

Run them from the checkout, e.g. ``python -m tools.make_pcaps``; every user-facing command
lives in ``stack`` or ``kbtp``.
"""
