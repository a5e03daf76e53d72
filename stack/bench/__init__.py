"""Benchmarks of the stack, with raw-TCP baselines in the same run (``iwarp bench``)."""
