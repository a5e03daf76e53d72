"""Capture dissection: the Scapy layers (stack.dissect.layers), the capture decoder
(stack.dissect.decoder) and its report (stack.dissect.report)."""

__all__: list[str] = []
