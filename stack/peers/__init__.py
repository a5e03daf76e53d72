"""Interop peers that speak third-party tools' out-of-band protocols (perftest)."""

__all__ = ["perftest"]
